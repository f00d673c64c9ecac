//! Karpenter's scheduling benchmark mix on mixed capacity, as a fixed
//! fixture: 2,000 pods, a fifth each generic, zonal spread, hostname spread,
//! zonal self-affinity and hostname anti-affinity (labels and selectors drawn
//! from a few values, as the benchmark's are); 400 synthetic instance types
//! whose price per vCPU falls as they get larger; spot in two zones (at
//! discounts that differ by zone and type), on-demand in all three.
//! nodesmith's plan is measured against Karpenter's order (the solver's own
//! pass in that order: pods by cpu then memory, each to the in-flight claim
//! with the fewest pods that can take it, else a new one, each claim launched
//! as its cheapest fitting type).

use serde_json::{Value, json};

use super::*;
use crate::catalog::{Catalog, InstanceTypeInfo, Offering};
use crate::scheduling::fixtures::ZONES;
use crate::scheduling::model::Model;
use crate::scheduling::scheduler::{Run, Strategy};

/// On-demand price of a type with `cpu` vCPUs: per vCPU it falls with size.
pub(super) fn falling_price(cpu: i64) -> f64 {
    0.05 * (cpu as f64).powf(0.85)
}

/// Spot price over on-demand for type `i` in zone `zone`: differs by zone
/// and by type.
fn spot_discount(i: i64, zone: usize) -> f64 {
    let jitter = ((i * 7919 + zone as i64 * 104_729) % 100) as f64 / 100.0;
    [0.30, 0.45][zone] + 0.25 * jitter
}

/// One synthetic type: `cpu` vCPUs, 2 GiB per vCPU, 10 pods per vCPU;
/// on-demand at `od` in every zone, spot where `spot(zone)` says.
pub(super) fn synthetic_type(name: &str, cpu: i64, od: f64, spot: &dyn Fn(usize) -> Option<f64>) -> InstanceTypeInfo {
    let mut offerings = Vec::new();
    for (zi, z) in ZONES.iter().enumerate() {
        offerings.push(Offering::new(z, "on-demand", od));
        if let Some(s) = spot(zi) {
            offerings.push(Offering::new(z, "spot", s));
        }
    }
    InstanceTypeInfo::synthetic(name, cpu, 2 * cpu * 1024, 10 * cpu, offerings)
}

/// The benchmark's 400 types (type i: i+1 vCPUs).
pub(super) fn mix_catalog() -> Catalog {
    let instance_types = (0..400i64)
        .map(|i| {
            let od = falling_price(i + 1);
            let spot = move |z: usize| (z < 2).then(|| od * spot_discount(i, z));
            synthetic_type(&format!("fake-{i:03}"), i + 1, od, &spot)
        })
        .collect();
    Catalog {
        region: "test-region".into(),
        instance_types,
    }
}

/// Pod kinds of the benchmark.
pub(super) const KINDS: usize = 5;

/// The labels and constraints of a pod of `kind`, with label value `label`
/// and selector value `selects` (indices into a few values).
pub(super) fn kind_extra(kind: usize, label: usize, selects: usize) -> Value {
    const VALUES: [&str; 7] = ["a", "b", "c", "d", "e", "f", "g"];
    let (v, w) = (VALUES[label % VALUES.len()], VALUES[selects % VALUES.len()]);
    let spread = |key: &str| {
        json!({"metadata": {"labels": {"my-label": v}}, "spec": {"topologySpreadConstraints": [{"maxSkew": 1,
            "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"my-label": w}}}]}})
    };
    match kind {
        1 => spread(labels::ZONE),
        2 => spread(labels::HOSTNAME),
        3 => json!({"metadata": {"labels": {"my-affinity": v}}, "spec": {"affinity": {"podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": labels::ZONE,
                "labelSelector": {"matchLabels": {"my-affinity": v}}}]}}}}),
        4 => json!({"metadata": {"labels": {"my-anti-affinity": v}}, "spec": {"affinity": {"podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": labels::HOSTNAME,
                "labelSelector": {"matchLabels": {"my-anti-affinity": w}}}]}}}}),
        _ => json!({"metadata": {"labels": {"my-label": v}}}),
    }
}

/// The benchmark's requests.
pub(super) const CPU: [&str; 5] = ["100m", "250m", "500m", "1000m", "1500m"];
/// The benchmark's requests.
pub(super) const MEM: [&str; 6] = ["100Mi", "256Mi", "512Mi", "1024Mi", "2048Mi", "4096Mi"];

/// `n` pods of the mix, a fifth of each kind, from a fixed seed.
pub(super) fn mix_pods(n: usize) -> Vec<Pod> {
    let mut seed: u64 = 42;
    let mut next = |m: usize| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) as usize % m
    };
    (0..n)
        .map(|i| {
            let kind = i * KINDS / n;
            let (c, m, label, selects) = (next(CPU.len()), next(MEM.len()), next(7), next(7));
            pod(&format!("p{i}"), CPU[c], MEM[m], kind_extra(kind, label, selects))
        })
        .collect()
}

/// Karpenter's plan: the solver's own pass in Karpenter's order, choosing
/// domains as Karpenter does.
pub(super) fn karpenter_order(case: &Case) -> Plan {
    let compiled = Compiled::new(&case.input());
    let model = Model::new(&compiled, &SolveOptions::default());
    let strategy = Strategy {
        fewest_pods: true,
        karpenter_domains: true,
        ..Strategy::default()
    };
    Run::new(&model, strategy).schedule().finish(&model)
}

/// One line about a plan: price, nodes, pending, nodes per zone and capacity type.
fn describe(plan: &Plan) -> String {
    let mut per: std::collections::BTreeMap<(String, String), (usize, f64)> = Default::default();
    for c in &plan.node_claims {
        let e = per.entry((c.zone.clone(), c.capacity_type.clone())).or_default();
        e.0 += 1;
        e.1 += c.price;
    }
    let per: Vec<String> = per
        .iter()
        .map(|((z, ct), (n, p))| format!("{z}/{ct}: {n} ${p:.3}"))
        .collect();
    format!(
        "${:.4}/h, {} nodes, {} pending [{}]",
        plan.total_price(),
        plan.node_claims.len(),
        plan.unschedulable.len(),
        per.join(", ")
    )
}

/// The measurement: nodesmith's plan on the mix against Karpenter's
/// order; printed (run with `--nocapture`), and held to 0.95× its cost with
/// no more nodes.
#[test]
fn mix_costs_at_most_095_of_karpenters_order_with_fewer_nodes() {
    let mut case = Case::new(mix_pods(2_000));
    case.catalog = mix_catalog();
    let karpenter = karpenter_order(&case);
    case.improve = false;
    let ffd = case.solve();
    case.improve = true;
    let plan = case.solve();
    let ratio = plan.total_price() / karpenter.total_price();
    println!("karpenter order: {}", describe(&karpenter));
    println!("plain FFD:       {}", describe(&ffd));
    println!("nodesmith:       {}", describe(&plan));
    println!(
        "nodesmith / karpenter order: {ratio:.3}x, {} vs {} nodes",
        plan.node_claims.len(),
        karpenter.node_claims.len()
    );
    assert_eq!(plan.unschedulable.len(), karpenter.unschedulable.len());
    assert!(ratio <= 0.95, "{ratio:.3}x Karpenter's order");
    assert!(plan.node_claims.len() <= karpenter.node_claims.len());
}

/// Karpenter's own plan is a candidate of every solve, however many pods
/// (it was only up to 2,000): what holds a plan to Karpenter's price and
/// node count then holds for a 20,000-pod burst too. Its pass skips the
/// claims a pod's class can never join, so it costs about one more first fit.
#[test]
fn karpenters_order_is_a_candidate_at_every_size() {
    use crate::scheduling::packing::{FEWEST_PODS_MAX, strategies};
    let karpenter = Strategy {
        fewest_pods: true,
        karpenter_domains: true,
        ..Strategy::default()
    };
    for n in [10, FEWEST_PODS_MAX + 1, 5_000] {
        let case = Case::new(mix_pods(n));
        let compiled = Compiled::new(&case.input());
        let model = Model::new(&compiled, &SolveOptions::default());
        assert_eq!(strategies(&model).first(), Some(&karpenter), "{n} pods");
    }
}

/// Above [`FEWEST_PODS_MAX`](crate::scheduling::packing::FEWEST_PODS_MAX)
/// pods, where fewer passes run, the mix's plan is still never dearer than
/// Karpenter's order, nor on more nodes unless cheaper, with as many pods
/// pending (the 0.95x measurement above is at 2,000 pods only).
#[test]
fn a_mix_above_two_thousand_pods_is_never_dearer_than_karpenters_order() {
    let mut case = Case::new(mix_pods(2_500));
    case.catalog = mix_catalog();
    let karpenter = karpenter_order(&case);
    let plan = case.solve();
    println!("karpenter order: {}", describe(&karpenter));
    println!("nodesmith:       {}", describe(&plan));
    assert_eq!(plan.unschedulable.len(), karpenter.unschedulable.len());
    assert!(
        plan.total_price() <= karpenter.total_price() + 1e-9,
        "{} over Karpenter's {}",
        plan.total_price(),
        karpenter.total_price()
    );
    assert!(
        plan.node_claims.len() <= karpenter.node_claims.len() || plan.total_price() < karpenter.total_price() - 1e-9,
        "{} nodes where Karpenter's order uses {} at the same price",
        plan.node_claims.len(),
        karpenter.node_claims.len()
    );
}
