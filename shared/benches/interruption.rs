//! The `interrupt` function's pure path on a 100-node cluster (m5.xlarge nodes
//! of one NodePool, 8 ReplicaSet pods and one DaemonSet pod each, built-in
//! us-east-1 catalog): a spot interruption warning as EventBridge delivers it
//! → parsed → decided for the instance's NodeClaim (taint, replace, drain,
//! mark unavailable) → the replacement planned by a what-if solve with the
//! node removed. What the shell adds is I/O: the taint patch, the claim
//! writes, the SQS send.

#[path = "fixtures/mod.rs"]
mod fixtures;

use std::sync::Arc;

use criterion::{Criterion, black_box, criterion_main};
use k8s_openapi::api::core::v1::{Node, Pod};
use nodesmith::apis::NodePool;
use nodesmith::capacity::{Pending, plan_replacements};
use nodesmith::interruption::decide::{Reaction, RebalanceMode, decide};
use nodesmith::nodeclaim::{NodeClaim, Phase};
use nodesmith::scheduling::ExistingNode;
use nodesmith::snapshot::Snapshot;
use serde_json::json;

const NODES: usize = 100;
const VICTIM: usize = 42;

fn instance(i: usize) -> String {
    format!("i-0{i:016x}")
}

fn node(i: usize) -> Node {
    let mut v = fixtures::node(&format!("node-{i:03}"), i, "spot");
    v["spec"] = json!({"providerID": format!("aws:///{}/{}", fixtures::ZONES[i % 3], instance(i))});
    serde_json::from_value(v).expect("node")
}

fn pod(name: String, node: &str, owner: &str, cpu: &str) -> Pod {
    serde_json::from_value(fixtures::pod(&name, node, owner, cpu, "512Mi")).expect("pod")
}

fn snapshot() -> Snapshot {
    let catalog = nodesmith::catalog::builtin().expect("built-in catalog").clone();
    let mut s = Snapshot::new(Arc::new(catalog), jiff::Timestamp::now());
    s.node_pools = vec![serde_json::from_value::<NodePool>(fixtures::pool(&["spot", "on-demand"])).expect("pool")];
    s.nodes = (0..NODES)
        .map(|i| {
            let n = node(i);
            let name = n.metadata.name.clone().unwrap_or_default();
            // Nodes are fairly full, so the victim's pods need new capacity.
            let cpu = ["460m", "470m", "465m", "475m"][i % 4];
            let mut pods: Vec<Pod> = (0..8)
                .map(|j| pod(format!("web-{i}-{j}"), &name, &format!("web-{}", j % 3), cpu))
                .collect();
            pods.push(pod(format!("agent-{i}"), &name, "agent", "100m"));
            ExistingNode { node: n, pods }
        })
        .collect();
    s
}

fn claims() -> Vec<NodeClaim> {
    (0..NODES)
        .map(|i| NodeClaim {
            phase: Phase::Initialized,
            instance_id: Some(instance(i)),
            node_name: Some(format!("node-{i:03}")),
            instance_type: Some("m5.xlarge".into()),
            zone: Some(fixtures::ZONES[i % 3].into()),
            capacity_type: Some("spot".into()),
            ..NodeClaim::pending(format!("default-{i:05}"), "default", "default")
        })
        .collect()
}

fn warning() -> String {
    json!({"version": "0", "id": "1e5527d7-bb36-4607-3370-4164db56a40e",
        "detail-type": "EC2 Spot Instance Interruption Warning", "source": "aws.ec2",
        "account": "123456789012", "time": "2026-03-02T14:20:06Z", "region": "us-east-1",
        "resources": [format!("arn:aws:ec2:us-east-1b:instance/{}", instance(VICTIM))],
        "detail": {"instance-id": instance(VICTIM), "instance-action": "terminate"}})
    .to_string()
}

/// Event text → the decision and, when it says replace, the replacement's claims.
fn react(body: &str, claims: &[NodeClaim], snapshot: &Snapshot, now: jiff::Timestamp) -> usize {
    let event = nodesmith::interruption::parse(body);
    let mut replacements = 0;
    for id in &event.instance_ids {
        let claim = claims.iter().find(|c| c.instance_id.as_deref() == Some(id.as_str()));
        if let Reaction::Act(steps) = decide(&event, claim, RebalanceMode::Replace, now)
            && steps.replace
            && let Some(node) = steps.node
        {
            let options = nodesmith::scheduling::SolveOptions::without([node.clone()]);
            replacements += plan_replacements(snapshot, &[node], &options, Pending::Ignore, "bench", |_| {})
                .new
                .len();
        }
    }
    replacements
}

fn bench(c: &mut Criterion) {
    let snapshot = snapshot();
    let claims = claims();
    let body = warning();
    let now: jiff::Timestamp = "2026-03-02T14:20:07Z".parse().expect("time");
    let made = react(&body, &claims, &snapshot, now);
    eprintln!("spot warning on a {NODES}-node cluster: {made} replacement claim(s) planned");
    assert!(made > 0, "the victim's pods need new capacity");

    let mut group = c.benchmark_group("interruption");
    group.sample_size(20);
    group.bench_function("parse + decide", |b| {
        b.iter(|| {
            let event = nodesmith::interruption::parse(black_box(&body));
            let claim = claims
                .iter()
                .find(|c| c.instance_id == event.instance_ids.first().cloned());
            decide(&event, claim, RebalanceMode::Replace, now)
        })
    });
    group.bench_function("event → decision → replacement (100 nodes)", |b| {
        b.iter(|| react(black_box(&body), &claims, &snapshot, now))
    });
    group.finish();
}

// `criterion_group!` defines a `pub fn`; a private module keeps it out of missing_docs.
mod group {
    criterion::criterion_group!(benches, super::bench);
}
criterion_main!(group::benches);
