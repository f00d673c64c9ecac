//! The `nodesmith simulate` command line: exit status 2 with a one-line error
//! naming file, document and field for bad input.

use std::path::PathBuf;
use std::process::{Command, Output};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn simulate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nodesmith"))
        .arg("simulate")
        .args(args)
        .output()
        .unwrap()
}

fn one_line_error(o: &Output) -> String {
    assert_eq!(
        o.status.code(),
        Some(2),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(o.stdout.is_empty());
    err
}

#[test]
fn bad_pod_field_exits_2_naming_file_document_and_field() {
    let f = fixtures().join("bad-requirement.yaml");
    let err = one_line_error(&simulate(&[f.to_str().unwrap()]));
    assert!(
        err.contains("bad-requirement.yaml: document 1: spec.template.spec.tolerations[0].operator"),
        "{err}"
    );
}

#[test]
fn bad_quantity_exits_2() {
    let f = fixtures().join("bad-quantity.yaml");
    let err = one_line_error(&simulate(&[f.to_str().unwrap()]));
    assert!(
        err.contains("bad-quantity.yaml: document 0: spec.containers[0].resources.requests.memory"),
        "{err}"
    );
}

#[test]
fn missing_file_exits_2() {
    let err = one_line_error(&simulate(&["/nonexistent/nodesmith.yaml"]));
    assert!(
        err.contains("/nonexistent/nodesmith.yaml") && err.contains("cannot read"),
        "{err}"
    );
}

#[test]
fn unreadable_catalog_exits_2() {
    let f = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/01-inflate.yaml");
    let err = one_line_error(&simulate(&[
        "--catalog",
        "/nonexistent/catalog.json",
        f.to_str().unwrap(),
    ]));
    assert!(err.contains("/nonexistent/catalog.json"), "{err}");
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(simulate(&[]).status.code(), Some(2));
    assert_eq!(simulate(&["--output", "xml", "x.yaml"]).status.code(), Some(2));
}

#[test]
fn catalog_file_is_used_and_json_follows_the_contract() {
    let out = simulate(&[
        "--catalog",
        fixtures().join("catalog.json").to_str().unwrap(),
        "--output",
        "json",
        fixtures().join("small.yaml").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("warning:") && err.contains("ConfigMap"),
        "unknown kinds are warned about: {err}"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let claims = v["nodeClaims"].as_array().unwrap();
    // The 3-cpu pod needs an m5.xlarge (spot only in zone b); 1 cpu does not
    // fit beside it (3920m allocatable), so the small pod gets an m5.large,
    // spot in zone a (its zone-b spot offering is unavailable).
    assert_eq!(claims.len(), 2, "{v:#}");
    let big = &claims[0];
    assert_eq!(big["pods"], serde_json::json!(["batch/big"]));
    assert_eq!(big["instanceType"], "m5.xlarge");
    assert_eq!(
        (
            big["zone"].as_str(),
            big["capacityType"].as_str(),
            big["pricePerHour"].as_f64()
        ),
        (Some("test-zone-b"), Some("spot"), Some(0.07))
    );
    for (k, q) in [("cpu", "3920m"), ("memory", "14162Mi"), ("pods", "58")] {
        assert_eq!(big["allocatable"][k], q);
    }
    assert_eq!(big["labels"]["topology.kubernetes.io/region"], "test-region");
    let small = &claims[1];
    assert_eq!(small["pods"], serde_json::json!(["default/small"]));
    assert_eq!(
        small["instanceTypeOptions"],
        serde_json::json!(["m5.large", "m5.xlarge"])
    );
    assert_eq!(
        (
            small["zone"].as_str(),
            small["capacityType"].as_str(),
            small["pricePerHour"].as_f64()
        ),
        (Some("test-zone-a"), Some("spot"), Some(0.035))
    );
    assert_eq!(
        v["unschedulable"],
        serde_json::json!([{"pod": "default/huge", "reason": "no instance type in NodePool default fits 16 cpu"}])
    );
    assert_eq!(v["totalPricePerHour"], 0.105);
    assert_eq!(v["stats"]["pendingPods"], 3);
    assert!(v["stats"]["solveMillis"].is_number());
}

#[test]
fn table_output_for_humans() {
    let out = simulate(&[
        "--catalog",
        fixtures().join("catalog.json").to_str().unwrap(),
        "--output",
        "table",
        fixtures().join("small.yaml").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.lines().next().unwrap().starts_with("NODECLAIM"), "{text}");
    assert!(
        text.contains("m5.xlarge")
            && text.contains("test-zone-b")
            && text.contains("0.0700")
            && text.contains("0.1050/hour"),
        "{text}"
    );
    assert!(
        text.contains("default/huge: no instance type in NodePool default fits 16 cpu"),
        "{text}"
    );
}

#[test]
fn invalid_catalog_exits_2() {
    let err = one_line_error(&simulate(&[
        "--catalog",
        fixtures().join("bad-catalog.json").to_str().unwrap(),
        fixtures().join("small.yaml").to_str().unwrap(),
    ]));
    assert!(err.contains("bad-catalog.json"), "{err}");
}

#[test]
fn now_is_a_moment_in_rfc3339_and_a_bad_one_is_refused() {
    let f = fixtures().join("small.yaml");
    let f = f.to_str().unwrap();
    let plain = simulate(&["--output", "json", f]);
    let at = simulate(&["--output", "json", "--now", "2026-01-01T00:00:00Z", f]);
    assert_eq!(at.status.code(), Some(0), "{}", String::from_utf8_lossy(&at.stderr));
    let strip = |o: &Output| {
        let mut v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["stats"].as_object_mut().unwrap().remove("solveMillis");
        v
    };
    // Provisioning takes no time-based decision: the plan is the same at any moment.
    assert_eq!(strip(&plain), strip(&at));
    let bad = simulate(&["--now", "yesterday", f]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--now"));
}
