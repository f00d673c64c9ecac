//! Consolidation at scale, on the built-in us-east-1 catalog, two NodePools
//! (`default`: spot and on-demand over c/m/r; `team`: on-demand m only):
//!
//! 1. One decision pass over 1,000 underused nodes / 30,000 pods (m5.xlarge
//!    and m5.2xlarge nodes, pods of 25–200m, a zonal spread and a per-host
//!    anti-affinity app among them), budgets at 100 % so every node is
//!    searched; printed with the process's peak RSS, then timed by criterion.
//! 2. The same at 5,000 nodes / 150,000 pods, one pass, printed.
//! 3. Burst then scale-down: a fresh plan for 20,000 pods becomes the cluster,
//!    90 % of the pods go, and passes (default 10 % budgets, five minutes
//!    apart, replacements launched as planned) run until nothing is decided;
//!    prints the fleet's $/h after each pass against a fresh plan for the
//!    2,000 pods left.
//!
//! `NODESMITH_BENCH_CONSOLIDATION=quick` skips 2 and 3.

#[path = "fixtures/mod.rs"]
mod fixtures;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use criterion::{Criterion, criterion_main};
use k8s_openapi::api::core::v1::{Node, Pod};
use nodesmith::apis::NodePool;
use nodesmith::disruption::consolidation::ReplacementLimits;
use nodesmith::disruption::{DecideOptions, Decisions, decide};
use nodesmith::scheduling::{ExistingNode, NewNodeClaim, PodRef, SolveOptions};
use nodesmith::snapshot::Snapshot;
use serde_json::{Value, json};

/// The process's peak resident memory in MB since the last reset (Linux's
/// `VmHWM`; writing 5 to `clear_refs` resets it), if the kernel says.
fn peak_rss_mb(reset: bool) -> Option<f64> {
    if reset {
        std::fs::write("/proc/self/clear_refs", "5").ok()?;
    }
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

const NOW: &str = "2026-03-01T12:00:00Z";

/// Both pools, in the nodes' three zones (as a class's subnets would select
/// them: zones without nodes would be empty spread domains).
fn pools(budget: &str) -> Vec<NodePool> {
    let zones = json!({"key": "topology.kubernetes.io/zone", "operator": "In", "values": fixtures::ZONES});
    let mut default = fixtures::pool(&["spot", "on-demand"]);
    if let Some(r) = default["spec"]["template"]["spec"]["requirements"].as_array_mut() {
        r.push(zones.clone());
    }
    default["spec"]["disruption"] = json!({"budgets": [{"nodes": budget}]});
    let mut team = fixtures::pool(&["on-demand"]);
    team["metadata"]["name"] = json!("team");
    team["spec"]["template"]["spec"]["requirements"][1]["values"] = json!(["m"]);
    if let Some(r) = team["spec"]["template"]["spec"]["requirements"].as_array_mut() {
        r.push(zones);
    }
    team["spec"]["disruption"] = json!({"budgets": [{"nodes": budget}]});
    [default, team]
        .into_iter()
        .map(|v| serde_json::from_value(v).expect("pool"))
        .collect()
}

fn pod(name: &str, node: &str, app: &str, cpu: &str, created: &str, constraint: Value) -> Pod {
    let mut v = fixtures::pod(name, node, app, cpu, "256Mi");
    v["metadata"]["creationTimestamp"] = json!(created);
    if let (Some(spec), Some(extra)) = (v["spec"].as_object_mut(), constraint.as_object()) {
        spec.extend(extra.clone());
    }
    serde_json::from_value(v).expect("pod")
}

/// The scheduling constraint of app `j`: a zonal spread, a per-host anti-affinity, or none.
fn constraint(app: &str) -> Value {
    let sel = json!({"matchLabels": {"app": app}});
    match app {
        "spread" => json!({"topologySpreadConstraints": [{"maxSkew": 2, "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "DoNotSchedule", "labelSelector": sel}]}),
        "solo" => json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "kubernetes.io/hostname", "labelSelector": sel}]}}}),
        _ => json!({}),
    }
}

/// `nodes` underused nodes with 30 pods each on average.
fn cluster(nodes: usize, budget: &str) -> Snapshot {
    let catalog = nodesmith::catalog::builtin().expect("built-in catalog").clone();
    let mut s = Snapshot::new(Arc::new(catalog), NOW.parse().expect("now"));
    s.node_pools = pools(budget);
    s.nodes = (0..nodes)
        .map(|i| {
            let name = format!("node-{i:05}");
            let team = i % 4 == 3;
            let ct = if !team && i % 2 == 0 { "spot" } else { "on-demand" };
            let mut v = fixtures::node(&name, i, ct);
            v["metadata"]["creationTimestamp"] = json!("2026-02-20T00:00:00Z");
            v["metadata"]["labels"]["karpenter.k8s.aws/instance-category"] = json!("m");
            if team {
                v["metadata"]["labels"]["karpenter.sh/nodepool"] = json!("team");
            }
            let big = i % 3 == 0;
            if big {
                v["metadata"]["labels"]["node.kubernetes.io/instance-type"] = json!("m5.2xlarge");
                v["status"]["allocatable"] = json!({"cpu": "7910m", "memory": "29317Mi", "pods": "58"});
            }
            let node: Node = serde_json::from_value(v).expect("node");
            let count = if big { 40 } else { 20 + i % 19 };
            let mut pods: Vec<Pod> = (0..count)
                .map(|j| {
                    let app = match j {
                        0 if i % 10 == 0 => "solo".to_string(),
                        _ if j % 9 == 1 => "spread".to_string(),
                        _ => format!("web-{}", j % 7),
                    };
                    let cpu = ["25m", "50m", "100m", "200m"][(i * 7 + j) % 4];
                    pod(
                        &format!("p-{i}-{j}"),
                        &name,
                        &app,
                        cpu,
                        "2026-02-20T00:05:00Z",
                        constraint(&app),
                    )
                })
                .collect();
            pods.push(pod(
                &format!("agent-{i}"),
                &name,
                "agent",
                "100m",
                "2026-02-20T00:01:00Z",
                json!({}),
            ));
            ExistingNode { node, pods }
        })
        .collect();
    s
}

fn summary(d: &Decisions) -> String {
    let nodes: usize = d.decisions.iter().map(|x| x.nodes.len()).sum();
    let replacements: usize = d.decisions.iter().map(|x| x.replacements.len()).sum();
    let mut why: BTreeMap<String, usize> = BTreeMap::new();
    for b in &d.blocked {
        let rule = b.rule.to_string();
        let kind = rule.chars().take(60).collect::<String>();
        *why.entry(kind).or_default() += 1;
    }
    format!(
        "{nodes} node(s) removed, {replacements} replacement(s), $/h {:.2} -> {:.2}, {} held {why:?}",
        d.price_before,
        d.price_after,
        d.blocked.len()
    )
}

/// One pass, timed, with the peak heap it added.
fn one_pass(s: &Snapshot) -> Decisions {
    let before = peak_rss_mb(true).unwrap_or(f64::NAN);
    let t = Instant::now();
    let d = decide(s, &DecideOptions::default());
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    let peak = peak_rss_mb(false).unwrap_or(f64::NAN);
    let pods: usize = s.nodes.iter().map(|n| n.pods.len()).sum();
    eprintln!(
        "consolidation pass, {} nodes / {pods} pods: {ms:.0} ms, peak RSS {peak:.0} MB (with the snapshot; {before:.0} MB before); {}",
        s.nodes.len(),
        summary(&d)
    );
    d
}

/// A planned claim as the Node it becomes.
fn node_of(c: &NewNodeClaim, created: &str, replacement: bool) -> Node {
    let mut labels = c.labels.clone();
    labels.insert("kubernetes.io/hostname".into(), c.name.clone());
    let mut annotations = BTreeMap::new();
    if replacement {
        annotations.insert(
            "nodesmith/disruption-replacement".to_string(),
            "Underutilized".to_string(),
        );
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": c.name, "labels": labels, "annotations": annotations, "creationTimestamp": created},
        "status": {"allocatable": c.allocatable.to_k8s_strings(), "capacity": c.allocatable.to_k8s_strings()}
    }))
    .expect("node")
}

/// Binds a pod to `node`, created at `at` (a moved pod is a new pod).
fn bound(p: &Pod, node: &str, at: &str) -> Pod {
    let mut p = p.clone();
    if let Some(spec) = p.spec.as_mut() {
        spec.node_name = Some(node.to_string());
    }
    p.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        at.parse().expect("time"),
    ));
    p
}

/// The fleet's $/h: what replacing every node would have to beat.
fn fleet_price(s: &Snapshot) -> f64 {
    let all: BTreeSet<String> = s.nodes.iter().filter_map(|n| n.node.metadata.name.clone()).collect();
    ReplacementLimits::of(s, &all).price_below
}

/// Carries a pass's decisions out at once: replacements join, pods move, nodes go.
fn apply(s: &mut Snapshot, d: &Decisions) {
    let at = s.now.to_string();
    let removed: BTreeSet<&str> = d
        .decisions
        .iter()
        .flat_map(|x| x.nodes.iter().map(String::as_str))
        .collect();
    let moves: BTreeMap<&PodRef, &str> = d
        .decisions
        .iter()
        .flat_map(|x| x.moves.iter().map(|m| (&m.pod, m.to.as_str())))
        .collect();
    let mut moved: BTreeMap<String, Vec<Pod>> = BTreeMap::new();
    for n in s
        .nodes
        .iter()
        .filter(|n| removed.contains(n.node.metadata.name.as_deref().unwrap_or("")))
    {
        for p in &n.pods {
            if let Some(to) = moves.get(&PodRef::of(p)) {
                moved.entry(to.to_string()).or_default().push(bound(p, to, &at));
            }
        }
    }
    s.nodes
        .retain(|n| !removed.contains(n.node.metadata.name.as_deref().unwrap_or("")));
    for r in d.decisions.iter().flat_map(|x| x.replacements.iter()) {
        s.nodes.push(ExistingNode {
            node: node_of(r, &at, true),
            pods: Vec::new(),
        });
    }
    for n in &mut s.nodes {
        if let Some(ps) = moved.remove(n.node.metadata.name.as_deref().unwrap_or("")) {
            n.pods.extend(ps);
        }
    }
}

/// 20,000 pods planned from scratch, 2,000 left, consolidated pass by pass.
fn burst() {
    let catalog = Arc::new(nodesmith::catalog::builtin().expect("built-in catalog").clone());
    let start: jiff::Timestamp = NOW.parse().expect("now");
    let pending = |n: usize| -> Vec<Pod> {
        (0..n)
            .map(|i| {
                let app = if i % 9 == 1 {
                    "spread".to_string()
                } else {
                    format!("web-{}", i % 7)
                };
                let cpu = ["100m", "250m", "500m", "1000m"][i % 4];
                let mut p = pod(
                    &format!("p-{i}"),
                    "",
                    &app,
                    cpu,
                    "2026-03-01T10:00:00Z",
                    constraint(&app),
                );
                if let Some(spec) = p.spec.as_mut() {
                    spec.node_name = None;
                }
                p
            })
            .collect()
    };
    let mut s = Snapshot::new(catalog.clone(), start);
    s.node_pools = pools("10%");
    s.pods = pending(20_000);
    let plan = s.compile().solve(&SolveOptions::default());
    let created = (start - jiff::SignedDuration::from_hours(2)).to_string();
    let names: BTreeMap<&PodRef, &str> = plan
        .node_claims
        .iter()
        .flat_map(|c| c.pods.iter().map(move |p| (p, c.name.as_str())))
        .collect();
    s.nodes = plan
        .node_claims
        .iter()
        .map(|c| ExistingNode {
            node: node_of(c, &created, false),
            pods: Vec::new(),
        })
        .collect();
    // The scale-down: every tenth pod stays.
    let kept: Vec<Pod> = s.pods.iter().step_by(10).cloned().collect();
    let mut by_node: BTreeMap<&str, Vec<Pod>> = BTreeMap::new();
    for p in &kept {
        if let Some(n) = names.get(&PodRef::of(p)) {
            by_node.entry(n).or_default().push(bound(p, n, "2026-03-01T10:30:00Z"));
        }
    }
    for n in &mut s.nodes {
        n.pods = by_node
            .remove(n.node.metadata.name.as_deref().unwrap_or(""))
            .unwrap_or_default();
    }
    s.pods = Vec::new();
    let mut fresh = Snapshot::new(catalog, start);
    fresh.node_pools = pools("10%");
    fresh.pods = pending(20_000).into_iter().step_by(10).collect();
    let target = fresh.compile().solve(&SolveOptions::default()).total_price();
    eprintln!(
        "burst: 20,000 pods on {} nodes ${:.2}/h; 2,000 left; a fresh plan for them costs ${target:.2}/h",
        s.nodes.len(),
        fleet_price(&s)
    );
    for pass in 1..=60 {
        let t = Instant::now();
        let d = decide(&s, &DecideOptions::default());
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        if d.decisions.is_empty() {
            eprintln!("burst: pass {pass} decides nothing; done");
            break;
        }
        apply(&mut s, &d);
        let price = fleet_price(&s);
        eprintln!(
            "burst: pass {pass} ({ms:.0} ms, {}): {} nodes, ${price:.2}/h = {:.2} x the fresh plan",
            d.decisions
                .iter()
                .map(|x| format!("{} {}", x.reason, x.nodes.len()))
                .collect::<Vec<_>>()
                .join(", "),
            s.nodes.len(),
            price / target
        );
        s.now += jiff::SignedDuration::from_mins(5);
    }
}

fn bench(c: &mut Criterion) {
    let quick = std::env::var("NODESMITH_BENCH_CONSOLIDATION").is_ok_and(|v| v == "quick");
    let s = cluster(1_000, "100%");
    one_pass(&s);
    one_pass(&cluster(1_000, "10%"));
    if !quick {
        one_pass(&cluster(5_000, "100%"));
        burst();
    }
    let mut group = c.benchmark_group("consolidation");
    group.sample_size(10);
    group.bench_function("decide, 1000 underused nodes / ~30000 pods, 100% budgets", |b| {
        b.iter(|| decide(&s, &DecideOptions::default()))
    });
    group.finish();
}

// `criterion_group!` defines a `pub fn`; a private module keeps it out of missing_docs.
mod group {
    criterion::criterion_group!(benches, super::bench);
}
criterion_main!(group::benches);
