//! The simulate output: JSON (the stable contract) and a table for humans.

use serde_json::{Value, json};

use super::Report;

/// Rounds a price sum so float noise never shows (1e-6 $/h).
fn money(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

/// The JSON document of `docs/simulate-format.md`.
pub fn to_json(r: &Report) -> Value {
    let claims: Vec<Value> = r
        .plan
        .node_claims
        .iter()
        .map(|c| {
            json!({
                "name": c.name,
                "nodePool": c.node_pool,
                "instanceType": c.instance_type,
                "instanceTypeOptions": c.instance_type_options,
                "zone": c.zone,
                "capacityType": c.capacity_type,
                "pricePerHour": c.price,
                "allocatable": c.allocatable.to_k8s_strings(),
                "labels": c.labels,
                "taints": c.taints,
                "pods": c.pods.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
            })
        })
        .collect();
    let existing: Vec<Value> = r
        .plan
        .existing
        .iter()
        .map(|e| json!({"name": e.name, "pods": e.pods.iter().map(|p| p.to_string()).collect::<Vec<_>>()}))
        .collect();
    let unschedulable: Vec<Value> = r
        .plan
        .unschedulable
        .iter()
        .map(|u| json!({"pod": u.pod.to_string(), "reason": u.reason}))
        .collect();
    json!({
        "nodeClaims": claims,
        "existingNodes": existing,
        "unschedulable": unschedulable,
        "totalPricePerHour": money(r.plan.total_price()),
        "stats": {"pendingPods": r.pending_pods, "solveMillis": (r.solve_millis * 100.0).round() / 100.0},
    })
}

/// A human-readable summary: one line per new node, then placements on
/// existing nodes, unschedulable pods and the total.
pub fn to_table(r: &Report) -> String {
    let mut rows: Vec<[String; 7]> = vec![
        [
            "NODECLAIM",
            "NODEPOOL",
            "INSTANCE TYPE",
            "ZONE",
            "CAPACITY",
            "$/HOUR",
            "PODS",
        ]
        .map(String::from),
    ];
    for c in &r.plan.node_claims {
        rows.push([
            c.name.clone(),
            c.node_pool.clone(),
            c.instance_type.clone(),
            c.zone.clone(),
            c.capacity_type.clone(),
            format!("{:.4}", c.price),
            c.pods.len().to_string(),
        ]);
    }
    let widths: Vec<usize> = (0..7)
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let line: Vec<String> = row.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    for e in &r.plan.existing {
        out.push_str(&format!("existing {}: {} pod(s)\n", e.name, e.pods.len()));
    }
    if !r.plan.unschedulable.is_empty() {
        out.push_str("unschedulable:\n");
        for u in &r.plan.unschedulable {
            out.push_str(&format!("  {}: {}\n", u.pod, u.reason));
        }
    }
    let placed: usize = r.plan.node_claims.iter().map(|c| c.pods.len()).sum::<usize>()
        + r.plan.existing.iter().map(|e| e.pods.len()).sum::<usize>();
    out.push_str(&format!(
        "{} new node(s), ${:.4}/hour; {} pending pod(s): {} placed, {} unschedulable; solved in {:.2} ms\n",
        r.plan.node_claims.len(),
        money(r.plan.total_price()),
        r.pending_pods,
        placed,
        r.plan.unschedulable.len(),
        r.solve_millis
    ));
    out
}
