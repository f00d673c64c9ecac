//! Property tests over random mixes of the benchmark's pod kinds.

use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::scheduling::fixtures::ZONES;

const KINDS: usize = 5;

fn kind_extra(kind: usize) -> serde_json::Value {
    let app = format!("k{kind}");
    let sel = json!({"matchLabels": {"app": app}});
    let spec = match kind {
        1 => {
            json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": labels::ZONE, "whenUnsatisfiable": "DoNotSchedule", "labelSelector": sel}]})
        }
        2 => {
            json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": labels::HOSTNAME, "whenUnsatisfiable": "DoNotSchedule", "labelSelector": sel}]})
        }
        3 => {
            json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": labels::ZONE, "labelSelector": sel}]}}})
        }
        4 => {
            json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": labels::HOSTNAME, "labelSelector": sel}]}}})
        }
        _ => json!({}),
    };
    json!({"metadata": {"labels": {"app": app}}, "spec": spec})
}

fn arb_pods() -> impl Strategy<Value = Vec<(usize, usize, usize)>> {
    prop::collection::vec((0..KINDS, 0..5usize, 0..6usize), 1..40)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn plans_respect_every_invariant(specs in arb_pods(), limit in prop::sample::select(vec![0i64, 6, 24]), improve in any::<bool>()) {
        const CPU: [&str; 5] = ["100m", "250m", "500m", "1000m", "1500m"];
        const MEM: [&str; 6] = ["100Mi", "256Mi", "512Mi", "1024Mi", "2048Mi", "4096Mi"];
        let pods: Vec<Pod> = specs.iter().enumerate().map(|(i, (k, c, m))| fixtures::pod(&format!("p{i}"), CPU[*c], MEM[*m], kind_extra(*k))).collect();
        let limits = if limit > 0 { format!("\nlimits: {{cpu: \"{limit}\"}}") } else { String::new() };
        let np = pool("default", &format!("template:\n  spec:\n    nodeClassRef: {{group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}}\n    requirements: [{{key: karpenter.k8s.aws/instance-family, operator: In, values: [c, m, r]}}]{limits}"));
        let mut case = Case::new(pods.clone()).pools(vec![np]);
        case.improve = improve;
        let plan = case.solve(); // checks every pod appears exactly once
        let cat = catalog();
        let info = |n: &str| cat.instance_types.iter().find(|t| t.name == n).unwrap().clone();

        // No node over allocatable, for any type it may be launched as.
        for c in &plan.node_claims {
            for o in &c.instance_type_options {
                let alloc = info(o).allocatable.unwrap();
                prop_assert!(c.requests.fits_in(&alloc), "{} over {}: {:?}", c.name, o, c.requests);
            }
        }
        // Limits: even launching every claim as its largest option stays within.
        if limit > 0 {
            let worst: i64 = plan.node_claims.iter().map(|c| c.instance_type_options.iter().map(|o| info(o).capacity.get("cpu").milli()).max().unwrap_or(0)).sum();
            prop_assert!(worst <= limit * 1000, "cpu {} over limit {}", worst, limit);
        }
        // Per-kind topology invariants.
        let kind_of = |name: &str| -> usize { let i: usize = name[1..].parse().unwrap(); specs[i].0 };
        let mut per_zone = vec![std::collections::BTreeMap::<String, usize>::new(); KINDS];
        for c in &plan.node_claims {
            let mut per_node = [0usize; KINDS];
            for p in &c.pods {
                let k = kind_of(&p.name);
                per_node[k] += 1;
                *per_zone[k].entry(c.zone.clone()).or_insert(0) += 1;
            }
            prop_assert!(per_node[2] <= 1, "hostname spread maxSkew 1 on {}", c.name);
            prop_assert!(per_node[4] <= 1, "hostname anti-affinity on {}", c.name);
        }
        let counts: Vec<usize> = ZONES.iter().map(|z| per_zone[1].get(*z).copied().unwrap_or(0)).collect();
        prop_assert!(counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1, "zonal skew {:?}", counts);
        prop_assert!(per_zone[3].len() <= 1, "zonal self-affinity split: {:?}", per_zone[3]);
    }

    #[test]
    fn improved_plan_never_costs_more_than_ffd(specs in arb_pods()) {
        const CPU: [&str; 5] = ["100m", "250m", "500m", "1000m", "1500m"];
        const MEM: [&str; 6] = ["100Mi", "256Mi", "512Mi", "1024Mi", "2048Mi", "4096Mi"];
        let pods: Vec<Pod> = specs.iter().enumerate().map(|(i, (k, c, m))| fixtures::pod(&format!("p{i}"), CPU[*c], MEM[*m], kind_extra(*k))).collect();
        let mut case = Case::new(pods);
        case.improve = false;
        let ffd = case.solve();
        case.improve = true;
        let better = case.solve();
        prop_assert!(better.unschedulable.len() <= ffd.unschedulable.len());
        if better.unschedulable.len() == ffd.unschedulable.len() {
            prop_assert!(better.total_price() <= ffd.total_price() + 1e-9, "{} > {}", better.total_price(), ffd.total_price());
        }
    }
}

/// A small catalog: two families (2 and 4 GiB per vCPU) of six sizes, the
/// on-demand price per vCPU falling, flat or rising with size (`exponent`
/// below, at or above 1), spot in zones a and b at their own discounts (and
/// in zone c when `spot_c` is given).
fn sized_catalog(exponent: f64, spot: [f64; 2], spot_c: Option<f64>) -> crate::catalog::Catalog {
    let mut instance_types = Vec::new();
    for (family, gib, per_cpu) in [("c", 2i64, 0.04), ("m", 4, 0.05)] {
        for (si, cpu) in [1i64, 2, 4, 8, 16, 32].into_iter().enumerate() {
            let od = per_cpu * (cpu as f64).powf(exponent);
            // Discounts also vary a little by type, as they do on EC2.
            let wobble = 0.05 * ((si * 3 + gib as usize) % 4) as f64;
            let discounts = [Some(spot[0]), Some(spot[1]), spot_c];
            let offer = move |z: usize| discounts[z].map(|d| od * (d + wobble).min(0.95));
            let mut t = super::mix::synthetic_type(&format!("{family}.{cpu}x"), cpu, od, &offer);
            t.capacity
                .set("memory", crate::quantity::Quantity::from_mib(gib * cpu * 1024));
            t.allocatable = Some(t.capacity.clone());
            t.labels.insert(labels::aws::FAMILY.into(), family.into());
            instance_types.push(t);
        }
    }
    crate::catalog::Catalog {
        region: "test-region".into(),
        instance_types,
    }
}

/// Pods of the benchmark's five kinds: (kind, cpu, memory, label, selector).
fn arb_mix_pods() -> impl Strategy<Value = Vec<(usize, usize, usize, usize, usize)>> {
    prop::collection::vec(
        (0..super::mix::KINDS, 0..5usize, 0..6usize, 0..3usize, 0..3usize),
        1..40,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Issue 32: on any catalog shape, nodesmith's plan is never dearer than
    /// Karpenter's order for the same pods, and never uses more nodes unless
    /// it is strictly cheaper.
    #[test]
    fn never_dearer_than_karpenters_order_nor_more_nodes_unless_cheaper(
        specs in arb_mix_pods(),
        exponent in prop::sample::select(vec![0.8f64, 1.0, 1.15]),
        spot_a in 0.25f64..0.8,
        spot_b in 0.25f64..0.8,
        spot_c in prop::option::weighted(0.25, 0.25f64..0.8),
    ) {
        use super::mix::{CPU, MEM, kind_extra};
        let pods: Vec<Pod> = specs.iter().enumerate().map(|(i, (k, c, m, l, s))| fixtures::pod(&format!("p{i}"), CPU[*c], MEM[*m], kind_extra(*k, *l, *s))).collect();
        let mut case = Case::new(pods);
        case.catalog = sized_catalog(exponent, [spot_a, spot_b], spot_c);
        let karpenter = super::mix::karpenter_order(&case);
        let plan = case.solve();
        prop_assert!(plan.unschedulable.len() <= karpenter.unschedulable.len(), "pending {} > {}", plan.unschedulable.len(), karpenter.unschedulable.len());
        if plan.unschedulable.len() == karpenter.unschedulable.len() {
            let (ours, theirs) = (plan.total_price(), karpenter.total_price());
            prop_assert!(ours <= theirs + 1e-9, "${} > Karpenter's ${}", ours, theirs);
            prop_assert!(ours < theirs - 1e-9 || plan.node_claims.len() <= karpenter.node_claims.len(),
                "{} nodes at ${} where Karpenter's order uses {} at ${}", plan.node_claims.len(), ours, karpenter.node_claims.len(), theirs);
        }
    }
}
