//! One disruption pass at scale: 1,000 m5.xlarge nodes of one NodePool with
//! 30 pods each (29 ReplicaSet pods and one DaemonSet pod: 30,000 pods), on
//! the built-in us-east-1 catalog. Every 20th node is past its expireAfter,
//! every 20th (offset) is drifted, every 50th is empty; the default budget
//! (10%) holds the rest. Prints one pass's result before timing `decide`.

#[path = "fixtures/mod.rs"]
mod fixtures;

use std::sync::Arc;
use std::time::Instant;

use criterion::{Criterion, criterion_main};
use k8s_openapi::api::core::v1::{Node, Pod};
use nodesmith::apis::NodePool;
use nodesmith::disruption::{DecideOptions, decide};
use nodesmith::scheduling::ExistingNode;
use nodesmith::snapshot::Snapshot;
use serde_json::json;

const NODES: usize = 1_000;
const PODS_PER_NODE: usize = 29;
const NOW: &str = "2026-03-01T12:00:00Z";

fn pool() -> NodePool {
    serde_json::from_value(fixtures::pool(&["on-demand"])).expect("pool")
}

fn node(i: usize) -> Node {
    let name = format!("node-{i:04}");
    let created = if i.is_multiple_of(20) {
        "2025-12-01T00:00:00Z"
    } else {
        "2026-02-20T00:00:00Z"
    };
    let annotations = if i % 20 == 10 {
        json!({"karpenter.sh/nodepool-hash": "0000000000000000", "karpenter.sh/nodepool-hash-version": "nodesmith-v1"})
    } else {
        json!({})
    };
    let mut v = fixtures::node(&name, i, "on-demand");
    v["metadata"]["creationTimestamp"] = json!(created);
    v["metadata"]["annotations"] = annotations;
    v["metadata"]["labels"]["karpenter.k8s.aws/instance-category"] = json!("m");
    serde_json::from_value(v).expect("node")
}

fn pod(name: String, node: &str, owner: &str, cpu: &str) -> Pod {
    let mut v = fixtures::pod(&name, node, owner, cpu, "256Mi");
    v["metadata"]["creationTimestamp"] = json!("2026-02-20T00:05:00Z");
    serde_json::from_value(v).expect("pod")
}

fn snapshot() -> Snapshot {
    let catalog = nodesmith::catalog::builtin().expect("built-in catalog").clone();
    let mut s = Snapshot::new(Arc::new(catalog), NOW.parse().expect("now"));
    s.node_pools = vec![pool()];
    s.nodes = (0..NODES)
        .map(|i| {
            let n = node(i);
            let name = n.metadata.name.clone().unwrap_or_default();
            let cpu = ["50m", "75m", "100m", "60m"][i % 4];
            let mut pods: Vec<Pod> = if i % 50 == 25 {
                Vec::new()
            } else {
                (0..PODS_PER_NODE)
                    .map(|j| pod(format!("web-{i}-{j}"), &name, &format!("web-{}", j % 7), cpu))
                    .collect()
            };
            pods.push(pod(format!("agent-{i}"), &name, "agent", "100m"));
            ExistingNode { node: n, pods }
        })
        .collect();
    s
}

fn bench(c: &mut Criterion) {
    let s = snapshot();
    let options = DecideOptions::default();
    let t = Instant::now();
    let d = decide(&s, &options);
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    let pods: usize = s.nodes.iter().map(|n| n.pods.len()).sum();
    eprintln!(
        "one pass on {NODES} nodes / {pods} pods: {ms:.1} ms; {} decision(s) over {} node(s), {} blocked",
        d.decisions.len(),
        d.decisions.iter().map(|x| x.nodes.len()).sum::<usize>(),
        d.blocked.len()
    );
    let mut group = c.benchmark_group("disruption");
    group.sample_size(10);
    group.bench_function("decide, 1000 nodes / 30000 pods", |b| b.iter(|| decide(&s, &options)));
    group.finish();
}

// `criterion_group!` defines a `pub fn`; a private module keeps it out of missing_docs.
mod group {
    criterion::criterion_group!(benches, super::bench);
}
criterion_main!(group::benches);
