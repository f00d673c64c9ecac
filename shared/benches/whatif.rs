//! The what-if seam at consolidation scale: a 1,000-node cluster (m5.xlarge
//! nodes of one NodePool, 8 ReplicaSet pods and one DaemonSet pod each, on the
//! built-in us-east-1 catalog) is compiled once, then asked "if these three
//! nodes were gone, where would their pods go?" with and without new capacity.
//! Prints the compile time and one what-if's result before timing both.

use std::time::Instant;

use criterion::{Criterion, criterion_main};
use k8s_openapi::api::core::v1::{Node, Pod};
use nodesmith::apis::NodePool;
use nodesmith::scheduling::{Compiled, ExistingNode, SolveInput, SolveOptions};
use serde_json::json;

const NODES: usize = 1_000;
const ZONES: [&str; 3] = ["us-east-1a", "us-east-1b", "us-east-1c"];

fn pool() -> NodePool {
    serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"},
        "spec": {"template": {"spec": {
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
            "requirements": [
                {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                {"key": "karpenter.k8s.aws/instance-category", "operator": "In", "values": ["c", "m", "r"]}
            ]}}}
    }))
    .expect("pool")
}

fn node(i: usize) -> Node {
    let name = format!("node-{i:04}");
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "topology.kubernetes.io/zone": ZONES[i % 3],
            "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux",
            "node.kubernetes.io/instance-type": "m5.xlarge", "karpenter.sh/nodepool": "default",
            "karpenter.sh/capacity-type": "on-demand"}},
        "status": {"allocatable": {"cpu": "3920m", "memory": "14162Mi", "pods": "58"},
                   "capacity": {"cpu": "4", "memory": "16Gi", "pods": "58"}}
    }))
    .expect("node")
}

fn pod(name: String, node: &str, owner: &str, cpu: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": owner},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": if owner == "agent" { "DaemonSet" } else { "ReplicaSet" },
                "name": owner, "uid": owner, "controller": true}]},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i",
            "resources": {"requests": {"cpu": cpu, "memory": "512Mi"}}}]}
    }))
    .expect("pod")
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
