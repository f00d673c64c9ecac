//! Golden tests: `nodesmith simulate --disruption` on the fixture cluster in
//! `tests/fixtures/disruption/` with the built-in catalog, at two moments:
//! outside and inside the pool's weekday drift freeze. Each pass is checked
//! against its meaning and against the committed golden JSON. Regenerate
//! goldens with `NODESMITH_BLESS=1 cargo test -p nodesmith --test simulate_disruption`.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn nodesmith(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nodesmith"))
        .args(args)
        .output()
        .unwrap()
}

fn simulate(now: &str) -> Value {
    simulate_in("disruption", now)
}

/// The pass over `tests/fixtures/<fixture>` at `now` (the other disruption
/// contract tests use it too).
pub(crate) fn simulate_in(fixture: &str, now: &str) -> Value {
    let dir = root().join("tests/fixtures").join(fixture);
    let out = nodesmith(&[
        "simulate",
        "--disruption",
        "--now",
        now,
        "--output",
        "json",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut v: Value = serde_json::from_slice(&out.stdout).unwrap();
    // Wall time is the only non-deterministic field.
    v["stats"].as_object_mut().unwrap().remove("decideMillis");
    v
}

fn golden(name: &str, v: &Value) {
    let path = root().join("tests/golden/disruption").join(format!("{name}.json"));
    let text = serde_json::to_string_pretty(v).unwrap() + "\n";
    if std::env::var_os("NODESMITH_BLESS").is_some() {
        std::fs::write(&path, &text).unwrap();
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (bless with NODESMITH_BLESS=1)", path.display()));
    assert_eq!(text, want, "pass for {name} changed; review and bless");
}

/// (reason, node) of every decision.
fn decided(v: &Value) -> Vec<(String, String)> {
    v["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|d| {
            d["nodes"].as_array().unwrap().iter().map(|n| {
                (
                    d["reason"].as_str().unwrap().to_string(),
                    n.as_str().unwrap().to_string(),
                )
            })
        })
        .collect()
}

fn blocked(v: &Value, node: &str) -> String {
    v["blocked"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["node"] == node)
        .map(|b| b["reason"].as_str().unwrap().to_string())
        .unwrap_or_default()
}

/// What holds for every pass: moves land on nodes that stay or on
/// replacements, each pod once; prices add up.
fn common(v: &Value) {
    moves_and_prices(v);
    assert_eq!(v["stats"]["nodes"], 10);
}

fn moves_and_prices(v: &Value) {
    let removed: BTreeSet<String> = decided(v).into_iter().map(|(_, n)| n).collect();
    let mut pods = BTreeSet::new();
    let mut savings = 0.0;
    for d in v["decisions"].as_array().unwrap() {
        let replacements: BTreeSet<&str> = d["replacements"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        for m in d["moves"].as_array().unwrap() {
            let to = m["to"].as_str().unwrap();
            assert!(!removed.contains(to), "{m} lands on a removed node");
            assert!(
                replacements.contains(to) || !to.is_empty(),
                "{m} lands on a replacement or a node that stays"
            );
            assert!(pods.insert(m["pod"].as_str().unwrap().to_string()), "{m} twice");
        }
        savings += d["savingsPerHour"].as_f64().unwrap();
    }
    let before = v["pricePerHourBefore"].as_f64().unwrap();
    let after = v["pricePerHourAfter"].as_f64().unwrap();
    assert!((before - savings - after).abs() < 1e-6);
}

#[test]
fn disruption_outside_the_drift_freeze() {
    let v = simulate("2026-01-15T00:00:00Z");
    common(&v);
    assert_eq!(
        decided(&v),
        [
            ("Expired".to_string(), "expired-a".to_string()),
            ("Drifted".to_string(), "drifted-a".to_string()),
            ("Empty".to_string(), "empty-a".to_string()),
        ]
    );
    assert!(blocked(&v, "drifted-b").contains("PodDisruptionBudget default/db"));
    assert!(blocked(&v, "drifted-guarded").contains("do-not-disrupt"));
    assert!(blocked(&v, "drifted-bare").contains("no controller"));
    assert!(blocked(&v, "empty-recent").contains("consolidateAfter"));
    assert!(!decided(&v).iter().any(|(_, n)| n == "leaving"), "already disrupting");
    golden("outside-freeze", &v);
}

#[test]
fn disruption_inside_the_drift_freeze() {
    // Thursday 10:00 UTC: the `0 9 * * 1-5` + 8h budget allows no drift.
    let v = simulate("2026-01-15T10:00:00Z");
    common(&v);
    assert!(!decided(&v).iter().any(|(r, _)| r == "Drifted"));
    assert!(blocked(&v, "drifted-a").contains("budget"));
    assert!(decided(&v).contains(&("Expired".to_string(), "expired-a".to_string())));
    golden("inside-freeze", &v);
}

#[test]
fn underused_nodes_are_consolidated_into_one_cheaper_node() {
    let v = simulate_in("consolidation", "2026-01-15T00:00:00Z");
    moves_and_prices(&v);
    let web = |i: usize| ("Underutilized".to_string(), format!("web-{i}"));
    assert_eq!(decided(&v), [web(0), web(1), web(2)]);
    let d = &v["decisions"][0];
    assert_eq!(d["replacements"].as_array().unwrap().len(), 1, "{d}");
    let replacement = &d["replacements"][0];
    assert_ne!(replacement["instanceType"], "m5.xlarge");
    assert!(d["savingsPerHour"].as_f64().unwrap() > 0.0);
    assert_eq!(d["moves"].as_array().unwrap().len(), 3);
    assert!(blocked(&v, "pinned").contains("do-not-disrupt"), "{}", v["blocked"]);
    assert!(
        blocked(&v, "guarded").contains("PodDisruptionBudget default/api"),
        "{}",
        v["blocked"]
    );
    golden("consolidation", &v);
    // Within consolidateAfter (1h) of the pods' creation nothing is consolidated.
    let early = simulate_in("consolidation", "2026-01-14T20:30:00Z");
    assert!(decided(&early).is_empty(), "{early}");
    assert!(blocked(&early, "web-0").contains("consolidateAfter"));
}

#[test]
fn disruption_output_is_deterministic() {
    assert_eq!(simulate("2026-01-15T00:00:00Z"), simulate("2026-01-15T00:00:00Z"));
}

#[test]
fn disruption_bad_input_exits_2() {
    let bad = root().join("tests/fixtures/bad-quantity.yaml");
    let out = nodesmith(&["simulate", "--disruption", "--output", "json", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("error: "));
}

#[test]
fn disruption_table_output() {
    let dir = root().join("tests/fixtures/disruption");
    let out = nodesmith(&[
        "simulate",
        "--disruption",
        "--now",
        "2026-01-15T00:00:00Z",
        "--output",
        "table",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("Expired: expired-a"), "{text}");
    assert!(text.contains("blocked:\n"), "{text}");
}
