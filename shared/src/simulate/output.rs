//! The simulate output: JSON (the stable contract) and a table for humans.

use serde_json::{Value, json};

use super::{DisruptionReport, Report};
use crate::scheduling::NewNodeClaim;

/// A planned node as the contract prints it (new nodes and replacements alike).
fn claim_json(c: &NewNodeClaim) -> Value {
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
}

/// Rounds a price sum so float noise never shows (1e-6 $/h).
fn money(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

/// The JSON document of `docs/simulate-format.md`.
pub fn to_json(r: &Report) -> Value {
    let claims: Vec<Value> = r.plan.node_claims.iter().map(claim_json).collect();
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
        "stats": {
            "pendingPods": r.pending_pods,
            "solveMillis": (r.solve_millis * 100.0).round() / 100.0,
            "lowerBoundPerHour": money(r.lower_bound),
            "costToBound": r.cost_to_bound().map(|x| (x * 1e4).round() / 1e4),
        },
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
    let mut out = crate::text_table::columns(&rows);
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
        "{} new node(s), ${:.4}/hour{}; {} pending pod(s): {} placed, {} unschedulable; solved in {:.2} ms\n",
        r.plan.node_claims.len(),
        money(r.plan.total_price()),
        r.cost_to_bound()
            .map(|x| format!(" ({x:.3}× the lower bound)"))
            .unwrap_or_default(),
        r.pending_pods,
        placed,
        r.plan.unschedulable.len(),
        r.solve_millis
    ));
    out
}

/// The JSON document of the disruption contract in `docs/simulate-format.md`.
pub fn disruption_to_json(r: &DisruptionReport) -> Value {
    let d = &r.decisions;
    let decisions: Vec<Value> = d
        .decisions
        .iter()
        .map(|x| {
            json!({
                "reason": x.reason.as_str(),
                "nodes": x.nodes,
                "replacements": x.replacements.iter().map(claim_json).collect::<Vec<_>>(),
                "moves": x.moves.iter().map(|m| json!({"pod": m.pod.to_string(), "to": m.to})).collect::<Vec<_>>(),
                "savingsPerHour": money(x.savings_per_hour),
            })
        })
        .collect();
    let blocked: Vec<Value> = d
        .blocked
        .iter()
        .map(|b| json!({"node": b.node, "reason": b.rule.to_string()}))
        .collect();
    json!({
        "decisions": decisions,
        "blocked": blocked,
        "pricePerHourBefore": money(d.price_before),
        "pricePerHourAfter": money(d.price_after),
        "stats": {"nodes": r.nodes, "pods": r.pods, "decideMillis": (r.decide_millis * 100.0).round() / 100.0},
    })
}

/// A human-readable summary of a disruption pass: one line per decision,
/// its moves, the blocked nodes and the price change.
pub fn disruption_to_table(r: &DisruptionReport) -> String {
    let d = &r.decisions;
    let mut out = String::new();
    for x in &d.decisions {
        out.push_str(&format!(
            "{}: {} ({} replacement(s), {} move(s), saves ${:.4}/hour)\n",
            x.reason,
            x.nodes.join(", "),
            x.replacements.len(),
            x.moves.len(),
            money(x.savings_per_hour)
        ));
        for c in &x.replacements {
            out.push_str(&format!(
                "  new {} {} {} {} ${:.4}/hour\n",
                c.name, c.instance_type, c.zone, c.capacity_type, c.price
            ));
        }
        for m in &x.moves {
            out.push_str(&format!("  {} -> {}\n", m.pod, m.to));
        }
    }
    if !d.blocked.is_empty() {
        out.push_str("blocked:\n");
        for b in &d.blocked {
            out.push_str(&format!("  {}: {}\n", b.node, b.rule));
        }
    }
    out.push_str(&format!(
        "{} decision(s); ${:.4}/hour before, ${:.4}/hour after; {} node(s), {} pod(s); decided in {:.2} ms\n",
        d.decisions.len(),
        money(d.price_before),
        money(d.price_after),
        r.nodes,
        r.pods,
        r.decide_millis
    ));
    out
}
