//! Allocatable resources the way EKS AMIs and Karpenter compute them:
//! capacity minus kube-reserved, system-reserved and hard-eviction thresholds.

use crate::apis::KubeletConfiguration;
use crate::quantity::Quantity;
use crate::resources::{self, Resources};

use super::InstanceTypeInfo;

/// Share of reported memory the hypervisor keeps (Karpenter's VM_MEMORY_OVERHEAD_PERCENT).
pub const VM_MEMORY_OVERHEAD_PERCENT: f64 = 0.075;
/// Default hard eviction threshold for memory.available.
pub const EVICTION_MEMORY_MIB: i64 = 100;
/// Default root volume size (Karpenter's AL2023 default block device).
pub const DEFAULT_ROOT_VOLUME_GIB: i64 = 20;
/// Default hard eviction threshold for nodefs.available.
pub const EVICTION_NODEFS_PERCENT: f64 = 10.0;
/// Ephemeral storage kube-reserved by default.
pub const KUBE_RESERVED_EPHEMERAL_GIB: i64 = 1;

/// What arm64 (Graviton) nodes have less than x86 ones of the same instance
/// memory: Karpenter's documented allocatable for every arm64 type is this
/// far below the x86 figure.
pub const ARM64_MEMORY_OVERHEAD_MIB: i64 = 59;

/// Memory the node reports: instance memory less the VM overhead, rounded
/// the way Karpenter does (overhead rounded up to whole MiB), less the arm64
/// overhead on `arch` arm64.
pub fn memory_capacity_mib(instance_mib: i64, arch: &str) -> i64 {
    let arch_overhead = if arch == "arm64" { ARM64_MEMORY_OVERHEAD_MIB } else { 0 };
    instance_mib - (instance_mib as f64 * VM_MEMORY_OVERHEAD_PERCENT).ceil() as i64 - arch_overhead
}

/// Max pods: explicit maxPods, else the ENI limit, capped by podsPerCore × vCPUs.
pub fn max_pods(info: &InstanceTypeInfo, kubelet: Option<&KubeletConfiguration>) -> i64 {
    let base = kubelet.and_then(|k| k.max_pods).unwrap_or(info.eni_max_pods);
    match kubelet.and_then(|k| k.pods_per_core).filter(|p| *p > 0) {
        Some(ppc) => base.min(ppc * info.vcpus),
        None => base,
    }
}

/// Kube-reserved CPU in millicores: 6% of the first core, 1% of the second,
/// 0.5% of the next two and 0.25% of the rest.
pub fn kube_reserved_cpu_milli(vcpus: i64) -> i64 {
    let mut cores = vcpus * 1000;
    let mut reserved = 0.0;
    for (span, pct) in [(1000, 0.06), (1000, 0.01), (2000, 0.005), (i64::MAX, 0.0025)] {
        let take = cores.min(span);
        reserved += take as f64 * pct;
        cores -= take;
        if cores <= 0 {
            break;
        }
    }
    reserved as i64
}

/// Kube-reserved memory in MiB: 11 MiB per pod plus 255 MiB.
pub fn kube_reserved_memory_mib(pods: i64) -> i64 {
    11 * pods + 255
}

/// Capacity and allocatable of one instance type under kubelet settings.
pub fn compute(info: &InstanceTypeInfo, kubelet: Option<&KubeletConfiguration>) -> (Resources, Resources) {
    compute_with(info, kubelet, false)
}

/// [`compute`], with `instanceStorePolicy: RAID0` when `raid0`: ephemeral
/// storage is then the instance-store NVMe array, on types that have one.
pub fn compute_with(
    info: &InstanceTypeInfo,
    kubelet: Option<&KubeletConfiguration>,
    raid0: bool,
) -> (Resources, Resources) {
    let pods = max_pods(info, kubelet);
    let mut capacity = info.capacity.clone();
    capacity.set(resources::PODS, Quantity::from_units(pods));
    let nvme_gb = info
        .labels
        .get(crate::labels::aws::LOCAL_NVME)
        .and_then(|v| v.parse::<i64>().ok())
        .filter(|gb| *gb > 0);
    if let (true, Some(gb)) = (raid0, nvme_gb) {
        // EC2 sizes instance stores in decimal GB.
        capacity.set(resources::EPHEMERAL_STORAGE, Quantity::from_units(gb * 1_000_000_000));
    } else if capacity.get(resources::EPHEMERAL_STORAGE) == Quantity::ZERO {
        capacity.set(
            resources::EPHEMERAL_STORAGE,
            Quantity::from_units(DEFAULT_ROOT_VOLUME_GIB << 30),
        );
    }

    let mut kube_reserved = Resources::from_pairs([
        (
            resources::CPU,
            Quantity::from_milli(kube_reserved_cpu_milli(info.vcpus)),
        ),
        (resources::MEMORY, Quantity::from_mib(kube_reserved_memory_mib(pods))),
        (
            resources::EPHEMERAL_STORAGE,
            Quantity::from_units(KUBE_RESERVED_EPHEMERAL_GIB << 30),
        ),
    ]);
    let mut system_reserved = Resources::new();
    if let Some(k) = kubelet {
        override_from(&mut kube_reserved, &k.kube_reserved);
        override_from(&mut system_reserved, &k.system_reserved);
    }

    let storage = capacity.get(resources::EPHEMERAL_STORAGE);
    let mut eviction = Resources::from_pairs([
        (resources::MEMORY, Quantity::from_mib(EVICTION_MEMORY_MIB)),
        (
            resources::EPHEMERAL_STORAGE,
            percent_of(storage, EVICTION_NODEFS_PERCENT),
        ),
    ]);
    if let Some(k) = kubelet {
        // Karpenter takes the larger of the hard and soft thresholds; hard
        // replaces the default.
        for (signal, resource, cap) in [
            ("memory.available", resources::MEMORY, capacity.get(resources::MEMORY)),
            ("nodefs.available", resources::EPHEMERAL_STORAGE, storage),
        ] {
            let hard = k.eviction_hard.get(signal).and_then(|v| threshold(v, cap));
            let soft = k.eviction_soft.get(signal).and_then(|v| threshold(v, cap));
            let base = hard.unwrap_or(eviction.get(resource));
            eviction.set(resource, soft.map_or(base, |s| s.max(base)));
        }
    }

    let mut allocatable = capacity.minus(&kube_reserved).minus(&system_reserved).minus(&eviction);
    for v in allocatable.0.values_mut() {
        if *v < Quantity::ZERO {
            *v = Quantity::ZERO;
        }
    }
    (capacity, allocatable)
}

/// A catalog's explicit allocatable, written for the default kubelet, under
/// an EC2NodeClass's kubelet settings and instance-store policy: pods capped
/// by maxPods / podsPerCore, and cpu, memory and ephemeral storage moved by
/// what those settings change in the computed figures (pure).
pub fn adjust_explicit(
    info: &InstanceTypeInfo,
    explicit: &Resources,
    kubelet: Option<&KubeletConfiguration>,
    raid0: bool,
) -> (Resources, Resources) {
    if kubelet.is_none() && !raid0 {
        return (info.capacity.clone(), explicit.clone());
    }
    let (_, default) = compute_with(info, None, false);
    let (_, with) = compute_with(info, kubelet, raid0);
    let mut allocatable = explicit.clone();
    for r in [resources::CPU, resources::MEMORY, resources::EPHEMERAL_STORAGE] {
        if explicit.0.contains_key(r) {
            let moved = explicit
                .get(r)
                .saturating_add(with.get(r))
                .saturating_sub(default.get(r));
            allocatable.set(r, moved.max(Quantity::ZERO));
        }
    }
    let mut capacity = info.capacity.clone();
    let caps_pods = kubelet.is_some_and(|k| k.max_pods.is_some() || k.pods_per_core.is_some());
    let cap = Quantity::from_units(max_pods(info, kubelet));
    for target in [&mut allocatable, &mut capacity] {
        if caps_pods && target.0.contains_key(resources::PODS) {
            let pods = target.get(resources::PODS).min(cap);
            target.set(resources::PODS, pods);
        }
    }
    (capacity, allocatable)
}

fn override_from(target: &mut Resources, overrides: &std::collections::BTreeMap<String, String>) {
    for (k, v) in overrides {
        if k == "pid" {
            continue;
        }
        if let Ok(q) = Quantity::parse(v) {
            target.set(k, q);
        }
    }
}

fn percent_of(q: Quantity, pct: f64) -> Quantity {
    Quantity((q.milli() as f64 * pct / 100.0).ceil() as i64)
}

fn threshold(v: &str, capacity: Quantity) -> Option<Quantity> {
    match v.strip_suffix('%') {
        Some(p) => p.parse::<f64>().ok().map(|p| percent_of(capacity, p)),
        None => Quantity::parse(v).ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn info(name: &str, arch: &str, vcpus: i64, mem_mib: i64, enis: i64, ips: i64) -> InstanceTypeInfo {
        InstanceTypeInfo {
            name: name.into(),
            labels: BTreeMap::new(),
            capacity: Resources::from_pairs([
                (resources::CPU, Quantity::from_units(vcpus)),
                (
                    resources::MEMORY,
                    Quantity::from_mib(memory_capacity_mib(mem_mib, arch)),
                ),
            ]),
            allocatable: None,
            vcpus,
            eni_max_pods: enis * (ips - 1) + 2,
            offerings: vec![],
        }
    }

    fn alloc(i: &InstanceTypeInfo, k: Option<&KubeletConfiguration>) -> (String, String, String) {
        let (_, a) = compute(i, k);
        (
            a.get("cpu").to_k8s_string("cpu"),
            a.get("memory").to_k8s_string("memory"),
            a.get("pods").to_string(),
        )
    }

    #[test]
    fn matches_karpenter_documented_values() {
        let table = [
            (info("m5.large", "amd64", 2, 8192, 3, 10), ("1930m", "6903Mi", "29")),
            (
                info("c5.4xlarge", "amd64", 16, 32768, 8, 30),
                ("15890m", "27381Mi", "234"),
            ),
            (
                info("t4g.2xlarge", "arm64", 8, 32768, 4, 15),
                ("7910m", "29258Mi", "58"),
            ),
            (info("t4g.small", "arm64", 2, 2048, 3, 4), ("1930m", "1359Mi", "11")),
            (
                info("a1.4xlarge", "arm64", 16, 32768, 8, 30),
                ("15890m", "27322Mi", "234"),
            ),
            (info("g5.xlarge", "amd64", 4, 16384, 4, 15), ("3920m", "14162Mi", "58")),
        ];
        for (i, (cpu, mem, pods)) in table {
            assert_eq!(
                alloc(&i, None),
                (cpu.to_string(), mem.to_string(), pods.to_string()),
                "{}",
                i.name
            );
        }
    }

    #[test]
    fn raid0_makes_the_instance_store_the_ephemeral_storage() {
        let mut nvme = info("m5d.large", "amd64", 2, 8192, 3, 10);
        nvme.labels.insert(crate::labels::aws::LOCAL_NVME.into(), "75".into());
        let eph = |i: &InstanceTypeInfo, raid0: bool| compute_with(i, None, raid0).0.get(resources::EPHEMERAL_STORAGE);
        assert_eq!(eph(&nvme, true), Quantity::from_units(75_000_000_000));
        assert_eq!(
            eph(&nvme, false),
            Quantity::from_units(20 << 30),
            "the root volume without RAID0"
        );
        let plain = info("m5.large", "amd64", 2, 8192, 3, 10);
        assert_eq!(
            eph(&plain, true),
            Quantity::from_units(20 << 30),
            "no instance store: the root volume"
        );
    }

    #[test]
    fn default_ephemeral_storage() {
        let (_, a) = compute(&info("m5.large", "amd64", 2, 8192, 3, 10), None);
        // 20Gi root - 10% nodefs eviction - 1Gi kube-reserved = 17Gi
        assert_eq!(a.get(resources::EPHEMERAL_STORAGE), Quantity::from_units(17 << 30));
    }

    #[test]
    fn kubelet_overrides() {
        let i = info("m5.large", "amd64", 2, 8192, 3, 10);
        let k = KubeletConfiguration {
            max_pods: Some(110),
            ..Default::default()
        };
        // 7577 - (11*110+255) - 100
        assert_eq!(alloc(&i, Some(&k)), ("1930m".into(), "6012Mi".into(), "110".into()));
        let k = KubeletConfiguration {
            pods_per_core: Some(4),
            ..Default::default()
        };
        assert_eq!(alloc(&i, Some(&k)).2, "8");
        let k = KubeletConfiguration {
            kube_reserved: [
                ("cpu".to_string(), "200m".to_string()),
                ("memory".to_string(), "1Gi".to_string()),
            ]
            .into(),
            system_reserved: [("cpu".to_string(), "100m".to_string())].into(),
            eviction_hard: [("memory.available".to_string(), "500Mi".to_string())].into(),
            ..Default::default()
        };
        assert_eq!(
            alloc(&i, Some(&k)),
            ("1700m".into(), format!("{}Mi", 7577 - 1024 - 500), "29".into())
        );
        let k = KubeletConfiguration {
            eviction_hard: [("memory.available".to_string(), "10%".to_string())].into(),
            ..Default::default()
        };
        let (_, a) = compute(&i, Some(&k));
        let expect = Quantity::from_mib(7577).milli()
            - Quantity::from_mib(574).milli()
            - (Quantity::from_mib(7577).milli() as f64 * 0.1).ceil() as i64;
        assert_eq!(a.get("memory").milli(), expect);
    }

    #[test]
    fn an_explicit_allocatable_follows_the_class_kubelet() {
        let mut i = info("m5.large", "amd64", 2, 8192, 3, 10);
        i.capacity.set("pods", Quantity::from_units(29));
        let explicit = Resources::parse([("cpu", "1930m"), ("memory", "6903Mi"), ("pods", "29")]).unwrap();
        i.allocatable = Some(explicit.clone());
        assert_eq!(
            adjust_explicit(&i, &explicit, None, false).1,
            explicit,
            "default kubelet: as given"
        );
        let k = KubeletConfiguration {
            max_pods: Some(10),
            system_reserved: [("cpu".to_string(), "500m".to_string())].into(),
            ..Default::default()
        };
        let (capacity, a) = adjust_explicit(&i, &explicit, Some(&k), false);
        assert_eq!(a.get("pods"), Quantity::from_units(10));
        assert_eq!(
            a.get("cpu"),
            Quantity::from_milli(1430),
            "500m of system reservation less"
        );
        assert!(
            a.get("memory") > explicit.get("memory"),
            "fewer pods reserve less memory"
        );
        assert_eq!(
            capacity.get("pods"),
            Quantity::from_units(10),
            "the node reports maxPods"
        );
    }

    #[test]
    fn kube_reserved_cpu_formula() {
        assert_eq!(kube_reserved_cpu_milli(1), 60);
        assert_eq!(kube_reserved_cpu_milli(2), 70);
        assert_eq!(kube_reserved_cpu_milli(4), 80);
        assert_eq!(kube_reserved_cpu_milli(16), 110);
        assert_eq!(kube_reserved_cpu_milli(96), 310);
    }
}
