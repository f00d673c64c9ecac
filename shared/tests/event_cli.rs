//! The `nodesmith event` command line (`docs/interruption-format.md`): one JSON
//! array in input order, exit 0 for anything it could classify (garbage
//! included), exit 2 only when a file cannot be read.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/interruption")
        .join(format!("{name}.json"))
        .to_string_lossy()
        .into_owned()
}

fn event(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_nodesmith"))
        .arg("event")
        .args(args)
        .env_remove("NODESMITH_REBALANCE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    child.wait_with_output().unwrap()
}

fn json(o: &Output) -> Vec<Value> {
    assert_eq!(
        o.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice::<Vec<Value>>(&o.stdout).unwrap()
}

#[test]
fn every_kind_in_input_order() {
    let names = [
        "spot-interruption",
        "rebalance-recommendation",
        "scheduled-change",
        "state-change-stopped",
        "capacity-reservation-interruption",
        "capacity-reservation-interruption-alt",
        "unknown-detail-type",
    ];
    let files: Vec<String> = names.iter().map(|n| fixture(n)).collect();
    let args: Vec<&str> = files.iter().map(String::as_str).collect();
    let out = json(&event(&args, None));
    let kinds: Vec<&str> = out.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "SpotInterruption",
            "RebalanceRecommendation",
            "ScheduledChange",
            "StateChange",
            "CapacityReservationInterruption",
            "CapacityReservationInterruption",
            "Unknown"
        ]
    );
    assert_eq!(out[0]["deadline"], "2026-03-02T14:22:05Z");
    assert_eq!(out[0]["source"], "aws.ec2");
    assert_eq!(out[0]["id"], "7f1c2a4e-5b3d-4c8e-9a21-0d6e4b2f8c13");
    assert_eq!(out[2]["deadline"], "2026-03-05T22:00:00Z");
    assert_eq!(out[2]["instanceIds"].as_array().unwrap().len(), 2);
    assert_eq!(out[3]["state"], "stopped");
    assert!(out[3]["deadline"].is_null());
    assert!(out[6]["error"].as_str().unwrap().contains("EC2 AMI State Change"));
    assert!(out.iter().all(|e| e["action"].is_string()));
}

#[test]
fn stdin_arrays_sqs_bodies_and_garbage_exit_0() {
    let spot = std::fs::read_to_string(fixture("spot-interruption")).unwrap();
    let body = serde_json::to_string(&spot).unwrap();
    let input = format!(r#"[{spot}, {{"MessageId": "m-1", "Body": {body}}}, 42, {{"source": "aws.ec2"}}]"#);
    let out = json(&event(&["-"], Some(&input)));
    let kinds: Vec<&str> = out.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["SpotInterruption", "SpotInterruption", "Unknown", "Unknown"]);
    assert!(out[3]["error"].as_str().unwrap().contains("detail-type"));

    let garbage = json(&event(&["-"], Some("this is not json")));
    assert_eq!(garbage.len(), 1);
    assert!(garbage[0]["error"].as_str().unwrap().starts_with("not JSON"));
}

#[test]
fn rebalance_mode_shapes_the_action() {
    let f = fixture("rebalance-recommendation");
    let ignore = json(&event(&["--rebalance", "ignore", &f], None));
    assert!(ignore[0]["action"].as_str().unwrap().starts_with("none"));
    // Without --rebalance (nor NODESMITH_REBALANCE): Karpenter's default, nothing.
    let default = json(&event(&[&f], None));
    assert!(
        default[0]["action"].as_str().unwrap().starts_with("none"),
        "{default:?}"
    );
    let replace = json(&event(&["--rebalance", "replace", &f], None));
    assert!(replace[0]["action"].as_str().unwrap().starts_with("taint"));
    let bad = event(&["--rebalance", "sometimes", &f], None);
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn unreadable_file_exits_2() {
    let o = event(&[&fixture("spot-interruption"), "/nonexistent/event.json"], None);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot read"));
    assert!(o.stdout.is_empty());
}

/// AWS's documented sample events (EC2 User Guide, AWS Health), verbatim:
/// each classifies as the kind it is, though the EC2 samples' `time` is a
/// placeholder and the Health sample's `startTime` is an RFC 1123 date.
#[test]
fn aws_documented_samples_are_acted_on() {
    let names = [
        "aws-doc-spot-interruption",
        "aws-doc-rebalance-recommendation",
        "aws-doc-state-change",
        "aws-doc-health-scheduled-change",
    ];
    let files: Vec<String> = names.iter().map(|n| fixture(n)).collect();
    let args: Vec<&str> = files.iter().map(String::as_str).collect();
    let out = json(&event(&args, None));
    let got: Vec<(&str, &Value, &Value)> = out
        .iter()
        .map(|e| (e["kind"].as_str().unwrap(), &e["instanceIds"], &e["deadline"]))
        .collect();
    assert_eq!(
        got,
        vec![
            (
                "SpotInterruption",
                &serde_json::json!(["i-1234567890abcdef0"]),
                &Value::Null
            ),
            (
                "RebalanceRecommendation",
                &serde_json::json!(["i-1234567890abcdef0"]),
                &Value::Null
            ),
            ("StateChange", &serde_json::json!(["i-abcd1111"]), &Value::Null),
            (
                "ScheduledChange",
                &serde_json::json!(["i-12345678"]),
                &serde_json::json!("2016-06-05T15:10:09Z")
            ),
        ],
        "{out:#?}"
    );
}
