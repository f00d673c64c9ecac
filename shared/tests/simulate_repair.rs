//! The node repair rows of the disruption contract, through the built
//! `nodesmith simulate --disruption`: a node whose `Ready` condition has been
//! `Unknown` for 45 minutes is `Unhealthy` and replaced past do-not-disrupt,
//! a PDB and a zero budget; one NotReady for 10 minutes stays; in a pool
//! where more than 20% of the nodes are unhealthy none is repaired and the
//! unhealthy nodes are `blocked`, the reason naming the cap.

use serde_json::{Value, json};

/// The pass over `tests/fixtures/repair` at `now`.
fn simulate(now: &str) -> Value {
    crate::simulate_disruption::simulate_in("repair", now)
}

#[test]
fn an_unhealthy_node_is_repaired_forcefully_and_the_cap_blocks_a_sick_pool() {
    let v = simulate("2026-01-15T12:00:00Z");
    let decisions = v["decisions"].as_array().unwrap();
    assert_eq!(decisions.len(), 1, "{v:#}");
    assert_eq!(decisions[0]["reason"], "Unhealthy", "{v:#}");
    assert_eq!(decisions[0]["nodes"], json!(["web-sick"]), "{v:#}");
    let blocked: Vec<(&str, &str)> = v["blocked"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b["node"].as_str().unwrap(), b["reason"].as_str().unwrap()))
        .collect();
    for sick in ["batch-sick-0", "batch-sick-1"] {
        let (_, why) = blocked
            .iter()
            .find(|(n, _)| *n == sick)
            .unwrap_or_else(|| panic!("{sick} not blocked: {v:#}"));
        assert!(
            why.contains("2 of 4 nodes of NodePool batch are unhealthy") && why.contains("20%"),
            "{why}"
        );
    }
    assert!(!v.to_string().contains("\"web-slow\""), "within its toleration: {v:#}");
    // Half an hour later web-slow is due too; two of six is still within the cap (two).
    let later = simulate("2026-01-15T12:25:00Z");
    assert_eq!(later["decisions"][0]["reason"], "Unhealthy", "{later:#}");
    assert_eq!(
        later["decisions"][0]["nodes"],
        json!(["web-sick", "web-slow"]),
        "{later:#}"
    );
}
