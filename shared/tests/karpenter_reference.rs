//! nodesmith's plans against Karpenter's (the reference in `reference/`):
//! over generated clusters with mixed capacity types, spot in only some
//! zones, spreads, affinities, DaemonSets, taints, limits, existing nodes
//! and several pools, every plan keeps every rule, and nodesmith's never
//! schedules fewer pods or costs more.

use crate::reference;

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use nodesmith::apis::NodePool;
use nodesmith::catalog::{Catalog, InstanceTypeInfo, Offering};
use nodesmith::quantity::Quantity;
use nodesmith::resources::Resources;
use nodesmith::scheduling::{ExistingNode, SolveInput, SolveOptions, solve};
use proptest::prelude::*;
use reference::checks::validate;
use reference::karpenter::{Outcome, schedule};
use serde_json::{Value, json};

const ZONES: [&str; 3] = ["zone-a", "zone-b", "zone-c"];
/// Family, GiB per vCPU, on-demand price per vCPU-hour.
const FAMILIES: [(&str, i64, f64); 3] = [("c", 2, 0.0425), ("m", 4, 0.048), ("r", 8, 0.063)];

/// Three families × five sizes; on-demand in every zone, spot only in the
/// first two, at a discount that varies by type.
fn catalog() -> Catalog {
    let mut instance_types = Vec::new();
    for (fi, (family, gib, per_cpu)) in FAMILIES.iter().enumerate() {
        for (si, cpu) in [1i64, 2, 4, 8, 16].into_iter().enumerate() {
            let od = per_cpu * cpu as f64;
            let discount = 0.3 + 0.1 * ((fi * 5 + si) * 7 % 5) as f64;
            let mut offerings = Vec::new();
            for (zi, z) in ZONES.iter().enumerate() {
                offerings.push(Offering::new(z, "on-demand", od));
                if zi < 2 {
                    offerings.push(Offering::new(z, "spot", od * discount));
                }
            }
            let capacity = Resources::from_pairs([
                ("cpu", Quantity::from_units(cpu)),
                ("memory", Quantity::from_mib(cpu * gib * 1024)),
                ("pods", Quantity::from_units(8 * cpu + 2)),
            ]);
            let allocatable = Resources::from_pairs([
                ("cpu", Quantity::from_milli(cpu * 1000 - 80)),
                ("memory", Quantity::from_mib(cpu * gib * 1024 - 400)),
                ("pods", Quantity::from_units(8 * cpu + 2)),
            ]);
            let labels: BTreeMap<String, String> = [
                ("kubernetes.io/arch", "amd64".to_string()),
                ("kubernetes.io/os", "linux".to_string()),
                ("karpenter.k8s.aws/instance-family", family.to_string()),
                ("karpenter.k8s.aws/instance-cpu", cpu.to_string()),
                ("node.kubernetes.io/instance-type", format!("{family}.{cpu}x")),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
            instance_types.push(InstanceTypeInfo {
                name: format!("{family}.{cpu}x"),
                labels,
                capacity,
                allocatable: Some(allocatable),
                vcpus: cpu,
                eni_max_pods: 8 * cpu + 2,
                offerings,
            });
        }
    }
    instance_types.sort_by(|a, b| a.name.cmp(&b.name));
    Catalog {
        region: "test".into(),
        instance_types,
    }
}

/// A pool: weight, capacity types, families, zones, tainted, cpu limit.
#[derive(Debug, Clone)]
struct PoolSpec {
    capacity: usize,
    families: usize,
    zone_limited: bool,
    tainted: bool,
    limit: Option<i64>,
}

fn node_pool(i: usize, s: &PoolSpec) -> NodePool {
    let capacity: &[&str] = match s.capacity {
        0 => &["spot", "on-demand"],
        1 => &["on-demand"],
        _ => &["spot"],
    };
    let families: &[&str] = match s.families {
        0 => &["c", "m", "r"],
        1 => &["c", "m"],
        _ => &["m", "r"],
    };
    let mut reqs = vec![
        json!({"key": "karpenter.sh/capacity-type", "operator": "In", "values": capacity}),
        json!({"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": families}),
    ];
    if s.zone_limited {
        reqs.push(json!({"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-b", "zone-c"]}));
    }
    let taints = if s.tainted {
        json!([{"key": "team", "value": "batch", "effect": "NoSchedule"}])
    } else {
        json!([])
    };
    let limits = s.limit.map_or(json!({}), |c| json!({"cpu": c.to_string()}));
    serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": format!("pool-{i}")},
        "spec": {
            "weight": 30 - 10 * i as i32,
            "limits": limits,
            "template": {
                "metadata": {"labels": {"team": if s.tainted { "batch" } else { "web" }}},
                "spec": {
                    "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
                    "requirements": reqs,
                    "taints": taints
                }
            }
        }
    }))
    .expect("pool")
}

const CPU: [&str; 5] = ["100m", "250m", "500m", "1000m", "1500m"];
const MEM: [&str; 6] = ["100Mi", "256Mi", "512Mi", "1024Mi", "2048Mi", "4096Mi"];
const KINDS: usize = 8;

/// A pod of one of the generated kinds.
fn pod(i: usize, kind: usize, cpu: usize, mem: usize) -> Pod {
    let app = format!("kind-{kind}");
    let sel = json!({"matchLabels": {"app": app}});
    let extra = match kind {
        1 => {
            json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule", "labelSelector": sel}]})
        }
        2 => {
            json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule", "labelSelector": sel}]})
        }
        3 => {
            json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "topology.kubernetes.io/zone", "labelSelector": sel}]}}})
        }
        4 => {
            json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "kubernetes.io/hostname", "labelSelector": sel}]}}})
        }
        5 => json!({"nodeSelector": {"topology.kubernetes.io/zone": "zone-c"}}),
        6 => {
            json!({"nodeSelector": {"team": "batch"}, "tolerations": [{"key": "team", "operator": "Equal", "value": "batch", "effect": "NoSchedule"}]})
        }
        7 => json!({"nodeSelector": {"karpenter.sh/capacity-type": "on-demand"}}),
        _ => json!({}),
    };
    let mut spec = json!({"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": CPU[cpu], "memory": MEM[mem]}}}]});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    serde_json::from_value(
        json!({"metadata": {"name": format!("p-{i}"), "namespace": "default", "labels": {"app": app}}, "spec": spec}),
    )
    .expect("pod")
}

fn daemon_set(i: usize, batch_only: bool) -> DaemonSet {
    let mut spec = json!({"containers": [{"name": "d", "image": "d", "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]});
    if batch_only {
        spec["nodeSelector"] = json!({"team": "batch"});
        spec["tolerations"] = json!([{"key": "team", "operator": "Exists"}]);
    }
    serde_json::from_value(json!({
        "metadata": {"name": format!("ds-{i}"), "namespace": "kube-system"},
        "spec": {"selector": {"matchLabels": {"ds": i.to_string()}}, "template": {"metadata": {"labels": {"ds": i.to_string()}}, "spec": spec}}
    }))
    .expect("daemonset")
}

fn existing(i: usize, zone: usize, running: usize) -> ExistingNode {
    let name = format!("node-{i}");
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "topology.kubernetes.io/zone": ZONES[zone],
            "karpenter.sh/capacity-type": "on-demand", "karpenter.sh/nodepool": "pool-0", "team": "web",
            "node.kubernetes.io/instance-type": "m.4x", "karpenter.k8s.aws/instance-family": "m",
            "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux"}},
        "status": {"capacity": {"cpu": "4", "memory": "16Gi", "pods": "34"}, "allocatable": {"cpu": "3920m", "memory": "15984Mi", "pods": "34"}}
    }))
    .expect("node");
    let pods = (0..running)
        .map(|j| {
            serde_json::from_value(json!({
                "metadata": {"name": format!("running-{i}-{j}"), "namespace": "default", "labels": {"app": "running"}},
                "spec": {"nodeName": name, "containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}}]}
            }))
            .expect("running pod")
        })
        .collect();
    ExistingNode { node, pods }
}

#[derive(Debug, Clone)]
struct Cluster {
    pools: Vec<PoolSpec>,
    pods: Vec<(usize, usize, usize)>,
    daemons: Vec<bool>,
    nodes: Vec<(usize, usize)>,
}

fn arb_pool() -> impl Strategy<Value = PoolSpec> {
    (
        0..3usize,
        0..3usize,
        any::<bool>(),
        prop::bool::weighted(0.3),
        prop::option::weighted(0.25, 4..40i64),
    )
        .prop_map(|(capacity, families, zone_limited, tainted, limit)| PoolSpec {
            capacity,
            families,
            zone_limited,
            tainted,
            limit,
        })
}

fn arb_cluster() -> impl Strategy<Value = Cluster> {
    (
        prop::collection::vec(arb_pool(), 1..4),
        prop::collection::vec((0..KINDS, 0..CPU.len(), 0..MEM.len()), 1..60),
        prop::collection::vec(any::<bool>(), 0..3),
        prop::collection::vec((0..3usize, 0..3usize), 0..3),
    )
        .prop_map(|(pools, pods, daemons, nodes)| Cluster {
            pools,
            pods,
            daemons,
            nodes,
        })
}

struct Built {
    catalog: Catalog,
    pools: Vec<NodePool>,
    pods: Vec<Pod>,
    daemons: Vec<DaemonSet>,
    nodes: Vec<ExistingNode>,
}

impl Built {
    fn of(c: &Cluster) -> Built {
        Built {
            catalog: catalog(),
            pools: c.pools.iter().enumerate().map(|(i, s)| node_pool(i, s)).collect(),
            pods: c
                .pods
                .iter()
                .enumerate()
                .map(|(i, (k, cpu, mem))| pod(i, *k, *cpu, *mem))
                .collect(),
            daemons: c.daemons.iter().enumerate().map(|(i, b)| daemon_set(i, *b)).collect(),
            nodes: c
                .nodes
                .iter()
                .enumerate()
                .map(|(i, (z, r))| existing(i, *z, *r))
                .collect(),
        }
    }

    fn input(&self) -> SolveInput<'_> {
        let mut input = SolveInput::new(&self.catalog);
        input.pods = &self.pods;
        input.node_pools = &self.pools;
        input.daemon_sets = &self.daemons;
        input.nodes = &self.nodes;
        input
    }
}

fn describe(o: &Outcome) -> Value {
    json!({
        "cost": o.cost(),
        "unschedulable": o.unschedulable,
        "nodes": o.nodes.iter().filter(|n| n.pool.is_some()).map(|n| json!({"pool": n.pool, "zone": n.zone, "price": n.price, "pods": n.pods.len(), "options": n.options.first()})).collect::<Vec<_>>(),
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn never_costs_more_than_karpenter(cluster in arb_cluster()) {
        let built = Built::of(&cluster);
        let input = built.input();
        let karpenter = schedule(&input);
        prop_assert_eq!(validate(&input, &karpenter), Ok(()), "the reference broke a rule: {}", describe(&karpenter));
        let plan = solve(&input, &SolveOptions::default());
        let ours = Outcome::of_plan(&input, &plan);
        prop_assert_eq!(validate(&input, &ours), Ok(()), "nodesmith broke a rule: {}", describe(&ours));
        prop_assert!(ours.unschedulable.len() <= karpenter.unschedulable.len(),
            "nodesmith left more pods pending:\nours {}\nkarpenter {}", describe(&ours), describe(&karpenter));
        if ours.unschedulable.len() == karpenter.unschedulable.len() {
            prop_assert!(ours.cost() <= karpenter.cost() * (1.0 + 1e-9) + 1e-9,
                "nodesmith costs more:\nours {}\nkarpenter {}", describe(&ours), describe(&karpenter));
        }
    }
}
