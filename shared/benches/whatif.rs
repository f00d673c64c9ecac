//! The what-if seam at consolidation scale: a 1,000-node cluster (m5.xlarge
//! nodes of one NodePool, 8 ReplicaSet pods and one DaemonSet pod each, on the
//! built-in us-east-1 catalog) is compiled once, then asked "if these three
//! nodes were gone, where would their pods go?" with and without new capacity.
//! Prints the compile time and one what-if's result before timing both.

#[path = "fixtures/mod.rs"]
mod fixtures;

use std::time::Instant;

use criterion::{Criterion, criterion_main};
use k8s_openapi::api::core::v1::{Node, Pod};
use nodesmith::apis::NodePool;
use nodesmith::scheduling::{Compiled, ExistingNode, SolveInput, SolveOptions};

const NODES: usize = 1_000;

fn pool() -> NodePool {
    serde_json::from_value(fixtures::pool(&["on-demand"])).expect("pool")
}

fn node(i: usize) -> Node {
    serde_json::from_value(fixtures::node(&format!("node-{i:04}"), i, "on-demand")).expect("node")
}

fn pod(name: String, node: &str, owner: &str, cpu: &str) -> Pod {
    serde_json::from_value(fixtures::pod(&name, node, owner, cpu, "512Mi")).expect("pod")
}

fn cluster() -> Vec<ExistingNode> {
    (0..NODES)
        .map(|i| {
            let n = node(i);
            let name = n.metadata.name.clone().unwrap_or_default();
            // Load varies from node to node so that some have room and some do not.
            let cpu = ["250m", "300m", "400m", "200m"][i % 4];
            let mut pods: Vec<Pod> = (0..8)
                .map(|j| pod(format!("web-{i}-{j}"), &name, &format!("web-{}", j % 3), cpu))
                .collect();
            pods.push(pod(format!("agent-{i}"), &name, "agent", "100m"));
            ExistingNode { node: n, pods }
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let catalog = nodesmith::catalog::builtin().expect("built-in catalog");
    let nodes = cluster();
    let pools = vec![pool()];
    let mut input = SolveInput::new(catalog);
    input.nodes = &nodes;
    input.node_pools = &pools;
    let removed = ["node-0001", "node-0500", "node-0999"];
    let existing_only = SolveOptions {
        new_claims: false,
        ..SolveOptions::without(removed)
    };
    let with_new = SolveOptions::without(removed);

    let t = Instant::now();
    let compiled = Compiled::new(&input);
    let compile_ms = t.elapsed().as_secs_f64() * 1000.0;
    let t = Instant::now();
    let plan = compiled.solve(&existing_only);
    let what_if_ms = t.elapsed().as_secs_f64() * 1000.0;
    eprintln!(
        "what-if on {NODES} nodes: compile {compile_ms:.1} ms; remove 3 nodes, existing capacity only: {what_if_ms:.1} ms, \
         {} pods placed on {} nodes, {} unschedulable",
        plan.existing.iter().map(|e| e.pods.len()).sum::<usize>(),
        plan.existing.len(),
        plan.unschedulable.len()
    );

    let mut group = c.benchmark_group("what-if");
    group.sample_size(10);
    group.bench_function("compile 1000 nodes", |b| b.iter(|| Compiled::new(&input)));
    group.bench_function("remove 3 nodes, existing capacity only", |b| {
        b.iter(|| compiled.solve(&existing_only))
    });
    group.bench_function("remove 3 nodes, new capacity allowed", |b| {
        b.iter(|| compiled.solve(&with_new))
    });
    group.finish();
}

// `criterion_group!` defines a `pub fn`; a private module keeps it out of missing_docs.
mod group {
    criterion::criterion_group!(benches, super::bench);
}
criterion_main!(group::benches);
