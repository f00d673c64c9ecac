//! The provision function's warm path for a 100-pod batch, without network:
//! solve against the built-in catalog, turn the plan into NodeClaims and
//! encode them as DynamoDB items (what the fenced write sends).

use criterion::{Criterion, black_box, criterion_main};
use k8s_openapi::api::core::v1::Pod;
use nodesmith::apis::NodePool;
use nodesmith::catalog;
use nodesmith::scheduling::{SolveInput, SolveOptions, solve};
use nodesmith::state;

fn pool() -> NodePool {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"},
        "spec": {"template": {"spec": {
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
            "requirements": [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot", "on-demand"]}]
        }}}
    }))
    .expect("valid pool")
}

fn pods(n: usize) -> Vec<Pod> {
    let cpus = ["100m", "250m", "500m", "1", "1500m"];
    let mems = ["128Mi", "256Mi", "512Mi", "1Gi", "2Gi"];
    (0..n)
        .map(|i| {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("app-{i}"), "namespace": "default", "labels": {"app": format!("app-{}", i % 4)}},
                "spec": {"containers": [{"name": "c", "image": "app",
                    "resources": {"requests": {"cpu": cpus[i % cpus.len()], "memory": mems[(i / 5) % mems.len()]}}}]}
            }))
            .expect("valid pod")
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let catalog = catalog::builtin().expect("built-in catalog");
    let pending = pods(100);
    let pools = vec![pool()];
    let mut input = SolveInput::new(catalog);
    input.pods = &pending;
    input.node_pools = &pools;
    let now = jiff::Timestamp::UNIX_EPOCH;
    c.bench_function("provision warm path, 100 pods (solve + NodeClaim items)", |b| {
        b.iter(|| {
            let plan = solve(black_box(&input), &SolveOptions::default());
            let items: Vec<_> = plan
                .node_claims
                .iter()
                .map(|nc| state::node_claim_item(&nc.to_node_claim(now), 1))
                .collect();
            black_box(items.len())
        })
    });
}

// `criterion_group!` defines a `pub fn`; a private module keeps it out of missing_docs.
mod group {
    criterion::criterion_group!(benches, super::bench);
}
criterion_main!(group::benches);
