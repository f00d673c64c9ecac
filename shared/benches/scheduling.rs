//! Karpenter's scheduling benchmark mix: one NodePool, 400 synthetic instance
//! types (type i: i+1 vCPU, 2(i+1) GiB, 10(i+1) pods; spot in 2 zones,
//! on-demand in 3), pods split evenly into generic / zonal spread / hostname
//! spread / zonal self-affinity / hostname anti-affinity, CPU from
//! {100,250,500,1000,1500}m and memory from {100,256,512,1024,2048,4096}Mi.
//!
//! Before timing, it prints for each size the plan (nodes, $/h) of the full
//! solver, of plain first-fit-decreasing and of Karpenter's algorithm (the
//! reference in `tests/reference/`), the plan's cost over Karpenter's and over
//! the LP lower bound, and the solve rate; for the benchmark mix and for a
//! generic mix (the same pods without topology constraints).
//! `NODESMITH_BENCH_REFERENCE=0` skips the reference (slow at 20,000 pods).

use std::time::Instant;

use criterion::{BenchmarkId, Criterion, criterion_main};
use k8s_openapi::api::core::v1::Pod;
use nodesmith::apis::NodePool;
use nodesmith::catalog::{Catalog, InstanceTypeInfo, Offering};
use nodesmith::scheduling::{Compiled, SolveInput, SolveOptions, solve};
use serde_json::json;

// The reference is test code shared with `tests/karpenter_reference.rs`; its
// plan checks are not used here.
#[allow(dead_code)]
#[path = "../tests/reference/karpenter.rs"]
mod karpenter;

const SIZES: [usize; 6] = [100, 500, 1_000, 2_000, 5_000, 20_000];
const ZONES: [&str; 3] = ["zone-a", "zone-b", "zone-c"];

fn catalog() -> Catalog {
    let instance_types = (0..400i64)
        .map(|i| {
            let cpu = i + 1;
            let mem_gib = 2 * (i + 1);
            let od = 0.04 * cpu as f64 + 0.005 * mem_gib as f64;
            let mut offerings = Vec::new();
            for (zi, z) in ZONES.iter().enumerate() {
                offerings.push(Offering {
                    zone: z.to_string(),
                    capacity_type: "on-demand".into(),
                    price: od,
                    available: true,
                    reservation: None,
                });
                if zi < 2 {
                    // Spot discounts vary by type, as they do on EC2.
                    let discount = 0.25 + 0.5 * (((i * 7919) % 100) as f64 / 100.0);
                    offerings.push(Offering {
                        zone: z.to_string(),
                        capacity_type: "spot".into(),
                        price: od * discount,
                        available: true,
                        reservation: None,
                    });
                }
            }
            InstanceTypeInfo::synthetic(&format!("fake-{i}"), cpu, mem_gib * 1024, 10 * (i + 1), offerings)
        })
        .collect();
    Catalog {
        region: "bench".into(),
        instance_types,
    }
}

fn pool() -> NodePool {
    serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"},
        "spec": {"template": {"spec": {
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
            "requirements": [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot", "on-demand"]}]
        }}}
    }))
    .expect("pool")
}

/// The benchmark's pods; `generic`: all without topology constraints.
fn pods_of(n: usize, generic: bool) -> Vec<Pod> {
    const CPU: [&str; 5] = ["100m", "250m", "500m", "1000m", "1500m"];
    const MEM: [&str; 6] = ["100Mi", "256Mi", "512Mi", "1024Mi", "2048Mi", "4096Mi"];
    let mut seed: u64 = 42;
    (0..n)
        .map(|i| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let cpu = CPU[(seed >> 33) as usize % CPU.len()];
            let mem = MEM[(seed >> 17) as usize % MEM.len()];
            let kind = if generic { 0 } else { i % 5 };
            let app = format!("kind-{kind}");
            let sel = json!({"matchLabels": {"app": app}});
            let spec_extra = match kind {
                1 => json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule", "labelSelector": sel}]}),
                2 => json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule", "labelSelector": sel}]}),
                3 => json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "topology.kubernetes.io/zone", "labelSelector": sel}]}}}),
                4 => json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "kubernetes.io/hostname", "labelSelector": sel}]}}}),
                _ => json!({}),
            };
            let mut spec = json!({"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": cpu, "memory": mem}}}]});
            if let (Some(s), Some(extra)) = (spec.as_object_mut(), spec_extra.as_object()) {
                s.extend(extra.clone());
            }
            serde_json::from_value(json!({"metadata": {"name": format!("p-{i}"), "namespace": "default", "labels": {"app": app}}, "spec": spec})).expect("pod")
        })
        .collect()
}

fn pods(n: usize) -> Vec<Pod> {
    pods_of(n, false)
}

fn peak_rss_mib() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// Sizes to run: `NODESMITH_BENCH_SIZES=2000,20000` narrows the default list.
fn sizes() -> Vec<usize> {
    match std::env::var("NODESMITH_BENCH_SIZES") {
        Ok(s) => s.split(',').filter_map(|x| x.trim().parse().ok()).collect(),
        Err(_) => SIZES.to_vec(),
    }
}

fn report(cat: &Catalog) {
    let reference = std::env::var("NODESMITH_BENCH_REFERENCE").as_deref() != Ok("0");
    for generic in [false, true] {
        let mix = if generic { "generic" } else { "benchmark" };
        for n in sizes() {
            let pools = vec![pool()];
            let pending = pods_of(n, generic);
            let mut input = SolveInput::new(cat);
            input.node_pools = &pools;
            input.pods = &pending;
            let plain = SolveOptions {
                improve: false,
                ..SolveOptions::default()
            };
            let ffd = solve(&input, &plain).total_price();
            let t = Instant::now();
            let plan = solve(&input, &SolveOptions::default());
            let ms = t.elapsed().as_secs_f64() * 1000.0;
            let bound = Compiled::new(&input).lower_bound(&plan);
            let price = plan.total_price();
            let vs_karpenter = if reference {
                let k = karpenter::schedule(&input);
                format!(
                    "karpenter ${:.4}/h ({} pending): {:.3}x",
                    k.cost(),
                    k.unschedulable.len(),
                    price / k.cost().max(1e-12)
                )
            } else {
                "karpenter skipped".to_string()
            };
            eprintln!(
                "scheduling/{mix}/{n}: solve {ms:.1} ms ({:.0} pods/s), {} nodes, ${price:.4}/h, {} unschedulable | {vs_karpenter} | bound ${bound:.4}/h: {:.3}x | plain FFD ${ffd:.4}/h | peak RSS {:.0} MiB",
                n as f64 / (ms / 1000.0),
                plan.node_claims.len(),
                plan.unschedulable.len(),
                price / bound.max(1e-12),
                peak_rss_mib().unwrap_or(0.0),
            );
        }
    }
}

/// 20,000 pods against the full built-in catalog (the memory target).
fn report_real_catalog() {
    let Ok(cat) = nodesmith::catalog::builtin() else {
        eprintln!("built-in catalog unavailable");
        return;
    };
    let pools = vec![pool()];
    let pending = pods(20_000);
    let mut input = SolveInput::new(cat);
    input.node_pools = &pools;
    input.pods = &pending;
    let t = Instant::now();
    let plan = solve(&input, &SolveOptions::default());
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    eprintln!(
        "real catalog ({} types) x 20000 pods: solve {ms:.1} ms, {} nodes, ${:.4}/h, {} unschedulable, peak RSS {:.0} MiB",
        cat.instance_types.len(),
        plan.node_claims.len(),
        plan.total_price(),
        plan.unschedulable.len(),
        peak_rss_mib().unwrap_or(0.0)
    );
}

fn bench(c: &mut Criterion) {
    if std::env::var_os("NODESMITH_BENCH_REAL").is_some() {
        report_real_catalog();
    }
    let cat = catalog();
    report(&cat);
    let mut group = c.benchmark_group("scheduling");
    group.sample_size(10);
    for n in sizes() {
        let pools = vec![pool()];
        let pending = pods(n);
        let mut input = SolveInput::new(&cat);
        input.node_pools = &pools;
        input.pods = &pending;
        group.bench_with_input(BenchmarkId::from_parameter(n), &input, |b, input| {
            b.iter(|| solve(input, &SolveOptions::default()))
        });
    }
    group.finish();
}

// `criterion_group!` defines a `pub fn`; a private module keeps it out of missing_docs.
mod group {
    criterion::criterion_group!(benches, super::bench);
}
criterion_main!(group::benches);
