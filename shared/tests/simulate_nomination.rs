//! The nomination rows of the disruption contract, through the built
//! `nodesmith simulate --disruption`: a pending pod's node is nominated (kept,
//! in `blocked`, the reason naming the nomination), a pending pod that fits on
//! no node nominates nothing and keeps nothing, and pending pods are not moves.

use serde_json::Value;

/// The pass over `tests/fixtures/nomination` at `now`.
fn simulate(now: &str) -> Value {
    crate::simulate_disruption::simulate_in("nomination", now)
}

#[test]
fn a_pending_pod_s_node_is_nominated_and_a_pod_that_fits_nowhere_keeps_nothing() {
    let v = simulate("2026-01-15T00:00:00Z");
    let decisions = v["decisions"].as_array().unwrap();
    assert_eq!(decisions.len(), 1, "{v}");
    assert_eq!(decisions[0]["reason"], "Empty");
    assert_eq!(decisions[0]["nodes"], serde_json::json!(["idle-b", "idle-c"]), "{v}");
    assert_eq!(
        decisions[0]["moves"],
        serde_json::json!([]),
        "pending pods are not moves"
    );
    let blocked = v["blocked"].as_array().unwrap();
    assert_eq!(blocked.len(), 1, "{v}");
    assert_eq!(blocked[0]["node"], "idle-a");
    let reason = blocked[0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("nominated") && reason.contains("default/web-new"),
        "{reason}"
    );
    assert!(!v.to_string().contains("default/huge"), "{v}");
    // The price after counts only the nodes that stay.
    let before = v["pricePerHourBefore"].as_f64().unwrap();
    let after = v["pricePerHourAfter"].as_f64().unwrap();
    assert!((after - before / 3.0).abs() < 1e-6, "{before} → {after}");
}
