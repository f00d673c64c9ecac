//! Small hand-made catalogs, pools and pods for tests and benchmarks.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};

use crate::apis::NodePool;
use crate::catalog::{Catalog, InstanceTypeInfo, Offering};
use crate::labels;
use crate::quantity::Quantity;
use crate::resources::Resources;

/// The zones of the test catalogs.
pub const ZONES: [&str; 3] = ["test-zone-a", "test-zone-b", "test-zone-c"];

/// An instance type with allocatable equal to capacity, offered on demand in
/// every zone at `od` and as spot at `spot` (when given).
pub fn instance(
    name: &str,
    arch: &str,
    cpu: i64,
    mem_gib: i64,
    pods: i64,
    od: f64,
    spot: Option<f64>,
) -> InstanceTypeInfo {
    let family = name.split('.').next().unwrap_or(name).to_string();
    let mut lbls = BTreeMap::new();
    lbls.insert(labels::ARCH.to_string(), arch.to_string());
    lbls.insert(labels::OS.to_string(), "linux".to_string());
    lbls.insert(labels::aws::FAMILY.to_string(), family.clone());
    lbls.insert(
        labels::aws::CATEGORY.to_string(),
        family.chars().next().map(String::from).unwrap_or_default(),
    );
    lbls.insert(labels::aws::CPU.to_string(), cpu.to_string());
    lbls.insert(labels::aws::MEMORY.to_string(), (mem_gib * 1024).to_string());
    let capacity = Resources::from_pairs([
        ("cpu", Quantity::from_units(cpu)),
        ("memory", Quantity::from_mib(mem_gib * 1024)),
        ("pods", Quantity::from_units(pods)),
    ]);
    let mut offerings = Vec::new();
    for z in ZONES {
        offerings.push(Offering {
            zone: z.into(),
            capacity_type: "on-demand".into(),
            price: od,
            available: true,
            reservation: None,
        });
        if let Some(s) = spot {
            offerings.push(Offering {
                zone: z.into(),
                capacity_type: "spot".into(),
                price: s,
                available: true,
                reservation: None,
            });
        }
    }
    InstanceTypeInfo {
        name: name.into(),
        labels: lbls,
        allocatable: Some(capacity.clone()),
        capacity,
        vcpus: cpu,
        eni_max_pods: pods,
        offerings,
    }
}

/// A small catalog: general, compute, memory, arm and GPU types.
pub fn catalog() -> Catalog {
    let mut gpu = instance("g.xlarge", "amd64", 4, 16, 50, 1.0, Some(0.4));
    gpu.capacity.set("nvidia.com/gpu", Quantity::from_units(1));
    gpu.allocatable = Some(gpu.capacity.clone());
    gpu.labels.insert(labels::aws::GPU_COUNT.into(), "1".into());
    gpu.labels.insert(labels::aws::GPU_NAME.into(), "t4".into());
    Catalog {
        region: "test-region".into(),
        instance_types: vec![
            instance("c.large", "amd64", 2, 4, 20, 0.08, Some(0.03)),
            instance("c.xlarge", "amd64", 4, 8, 40, 0.16, Some(0.06)),
            instance("m.large", "amd64", 2, 8, 20, 0.10, Some(0.04)),
            instance("m.xlarge", "amd64", 4, 16, 40, 0.20, Some(0.08)),
            instance("m.4xlarge", "amd64", 16, 64, 110, 0.80, Some(0.32)),
            instance("r.large", "amd64", 2, 16, 20, 0.13, Some(0.05)),
            instance("a.large", "arm64", 2, 8, 20, 0.085, Some(0.035)),
            gpu,
        ],
    }
}

/// A NodePool from YAML text (the spec part), named `name`.
pub fn pool(name: &str, spec_yaml: &str) -> NodePool {
    let text = format!(
        "apiVersion: karpenter.sh/v1\nkind: NodePool\nmetadata:\n  name: {name}\nspec:\n{}",
        spec_yaml
            .lines()
            .map(|l| format!("  {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("bad pool fixture: {e}\n{text}"))
}

/// The default pool: any capacity type, the default node class.
pub fn default_pool() -> NodePool {
    pool(
        "default",
        "template:\n  spec:\n    nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}\n    requirements:\n      - {key: karpenter.sh/capacity-type, operator: In, values: [spot, on-demand]}",
    )
}

/// A pod `default/<name>` with one container requesting cpu and memory,
/// with `extra` merged into the whole object (JSON merge).
pub fn pod(name: &str, cpu: &str, memory: &str, extra: Value) -> Pod {
    let mut v = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {}},
        "spec": {"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}
    });
    merge(&mut v, extra);
    serde_json::from_value(v).unwrap_or_else(|e| panic!("bad pod fixture: {e}"))
}

/// A managed node of the default pool: 4 cpu, 16Gi, an on-demand m.xlarge
/// in zone a.
pub fn managed_node(name: &str) -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "topology.kubernetes.io/zone": "test-zone-a",
            "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux",
            "node.kubernetes.io/instance-type": "m.xlarge", "karpenter.sh/nodepool": "default",
            "karpenter.sh/capacity-type": "on-demand"}},
        "status": {"allocatable": {"cpu": "4", "memory": "16Gi", "pods": "40"},
                   "capacity": {"cpu": "4", "memory": "16Gi", "pods": "40"}}
    }))
    .unwrap()
}

/// JSON merge: objects merge recursively, everything else replaces.
pub fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

/// A planned claim with every field empty; set what a test needs.
#[cfg(test)]
pub fn new_claim() -> super::NewNodeClaim {
    super::NewNodeClaim {
        name: "claim".into(),
        node_pool: "default".into(),
        node_class: "default".into(),
        requirements: crate::requirements::Requirements::new(),
        instance_type_options: Vec::new(),
        instance_type: String::new(),
        zone: String::new(),
        capacity_type: String::new(),
        price: 0.0,
        allocatable: Resources::new(),
        labels: BTreeMap::new(),
        template_labels: BTreeMap::new(),
        taints: Vec::new(),
        startup_taints: Vec::new(),
        pods: Vec::new(),
        requests: Resources::new(),
    }
}
