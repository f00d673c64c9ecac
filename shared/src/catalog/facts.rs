//! EC2 facts about an instance type, and the one pure function that turns
//! them into catalog labels and capacity the way Karpenter's AWS provider does.
//!
//! Both the built-in snapshot and the live EC2 adapter produce [`Ec2Facts`],
//! so labels and allocatable are identical whichever path built the catalog.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::labels;
use crate::quantity::Quantity;
use crate::resources::{self, Resources};

use super::allocatable::{DEFAULT_ROOT_VOLUME_GIB, memory_capacity_mib};
use super::{CatalogError, InstanceTypeInfo, Offering};

/// What DescribeInstanceTypes says about one instance type, reduced to what
/// scheduling needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ec2Facts {
    /// Instance type name, e.g. m5.large.
    pub name: String,
    /// Default vCPUs.
    pub vcpus: i64,
    /// Instance memory in MiB (before the VM overhead).
    pub memory_mib: i64,
    /// EC2 architectures (x86_64, arm64, i386, ...).
    pub architectures: Vec<String>,
    /// CPU manufacturer as EC2 spells it (Intel, AMD, AWS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_manufacturer: Option<String>,
    /// Sustained clock speed in GHz.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_ghz: Option<f64>,
    /// Hypervisor (nitro, xen); absent for bare metal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hypervisor: Option<String>,
    /// Bare-metal instance.
    #[serde(default, skip_serializing_if = "is_false")]
    pub bare_metal: bool,
    /// Network interfaces of the default network card: the VPC CNI places pod
    /// addresses there only, so types with several cards get no more pods.
    pub max_enis: i64,
    /// IPv4 addresses per network interface.
    pub ipv4_per_eni: i64,
    /// Baseline network bandwidth in Mbps, summed over network cards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_bandwidth_mbps: Option<i64>,
    /// Maximum EBS bandwidth in Mbps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ebs_bandwidth_mbps: Option<i64>,
    /// Total instance-store size in GB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_storage_gb: Option<i64>,
    /// Instance store is NVMe.
    #[serde(default, skip_serializing_if = "is_false")]
    pub local_nvme: bool,
    /// GPUs (usually one entry).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<Device>,
    /// Machine-learning accelerators (Neuron devices: Inferentia, Trainium; others).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accelerators: Vec<Device>,
    /// Maximum EFA interfaces (0 when EFA is unsupported).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub efa_interfaces: i64,
    /// Encryption in transit between instances is supported.
    #[serde(default, skip_serializing_if = "is_false")]
    pub encryption_in_transit: bool,
    /// Usage classes (on-demand, spot, capacity-block).
    pub usage_classes: Vec<String>,
}

/// A GPU or accelerator model on an instance type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// Model name as EC2 spells it (A10G, Inferentia2, ...).
    pub name: String,
    /// Manufacturer as EC2 spells it (NVIDIA, AWS, ...).
    pub manufacturer: String,
    /// How many devices.
    pub count: i64,
    /// Memory per device in MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<i64>,
    /// Neuron cores per device (Neuron devices only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores: Option<i64>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(i: &i64) -> bool {
    *i == 0
}

impl Ec2Facts {
    /// The Kubernetes architecture (amd64, arm64), if Linux nodes can run here.
    pub fn kube_arch(&self) -> Option<&'static str> {
        kube_arch(&self.architectures)
    }

    /// Pods the VPC CNI can address: ENIs × (IPv4 per ENI − 1) + 2.
    pub fn eni_max_pods(&self) -> i64 {
        self.max_enis * (self.ipv4_per_eni - 1) + 2
    }

    /// Spot is among the usage classes.
    pub fn supports_spot(&self) -> bool {
        self.usage_classes.iter().any(|u| u == "spot")
    }

    /// On-demand is among the usage classes.
    pub fn supports_on_demand(&self) -> bool {
        self.usage_classes.iter().any(|u| u == "on-demand")
    }
}

/// Maps EC2 architectures to the Kubernetes one; Mac architectures do not run Linux nodes.
pub fn kube_arch(architectures: &[String]) -> Option<&'static str> {
    if architectures.iter().any(|a| a == "x86_64") {
        Some("amd64")
    } else if architectures.iter().any(|a| a == "arm64") {
        Some("arm64")
    } else {
        None
    }
}

/// GHz to whole MHz, rounding half up (the generator script rounds the same way).
pub fn ghz_to_mhz(ghz: f64) -> i64 {
    (ghz * 1000.0 + 0.5).floor() as i64
}

/// Gbps to whole Mbps, rounding half up.
pub fn gbps_to_mbps(gbps: f64) -> i64 {
    (gbps * 1000.0 + 0.5).floor() as i64
}

/// Lowercases a device or manufacturer name and replaces characters that a
/// label value may not hold ("RTX PRO 4500" → "rtx-pro-4500"), keeping at
/// most 63 characters.
pub fn label_value(name: &str) -> String {
    let v: String = name
        .trim()
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    v.trim_matches(|c: char| !c.is_ascii_alphanumeric()).to_string()
}

/// Labels that follow from the name alone: family and size (the parts
/// around the dot), category (the leading letters) and generation (the
/// digits after the category, past an optional `-<n>tb` memory marker as in
/// `u-6tb1`).
pub fn name_labels(name: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Some((family, size)) = name.split_once('.') else {
        return out;
    };
    // Parts that are not valid label values (odd names in catalog files) give no labels.
    if family.is_empty() || size.is_empty() || !labels::is_label_value(family) || !labels::is_label_value(size) {
        return out;
    }
    out.insert(labels::aws::FAMILY.to_string(), family.to_string());
    out.insert(labels::aws::SIZE.to_string(), size.to_string());
    let category: String = family.chars().take_while(|c| c.is_ascii_lowercase()).collect();
    if category.is_empty() {
        return out;
    }
    let mut rest = &family[category.len()..];
    // High-memory families put the memory size between category and generation.
    if let Some(after) = rest.strip_prefix('-') {
        let digits = after.chars().take_while(|c| c.is_ascii_digit()).count();
        if digits > 0 && after[digits..].starts_with("tb") {
            rest = &after[digits + 2..];
        }
    }
    let generation: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    if !generation.is_empty() {
        out.insert(labels::aws::CATEGORY.to_string(), category);
        out.insert(labels::aws::GENERATION.to_string(), generation);
    }
    out
}

/// Turns EC2 facts and offerings into the catalog's instance type: the
/// well-known and `karpenter.k8s.aws/instance-*` labels, capacity (memory
/// after the VM overhead, ENI-limited pods, default root volume, GPUs,
/// Neuron devices, EFA) and the ENI pod limit.
pub fn instance_type_info(facts: &Ec2Facts, offerings: Vec<Offering>) -> Result<InstanceTypeInfo, CatalogError> {
    let bad = |message: String| CatalogError::Facts {
        name: facts.name.clone(),
        message,
    };
    let arch = facts
        .kube_arch()
        .ok_or_else(|| bad(format!("no Linux architecture among {:?}", facts.architectures)))?;
    if facts.vcpus <= 0 || facts.memory_mib <= 0 {
        return Err(bad(format!(
            "vcpus {} and memory {} MiB must be positive",
            facts.vcpus, facts.memory_mib
        )));
    }
    if facts.max_enis <= 0 || facts.ipv4_per_eni <= 1 {
        return Err(bad(format!(
            "{} ENIs × {} IPv4 addresses leave no pod addresses",
            facts.max_enis, facts.ipv4_per_eni
        )));
    }

    let mut l = name_labels(&facts.name);
    let mut set = |k: &str, v: String| {
        l.insert(k.to_string(), v);
    };
    set(labels::INSTANCE_TYPE, facts.name.clone());
    set(labels::ARCH, arch.to_string());
    set(labels::OS, "linux".to_string());
    set(labels::aws::CPU, facts.vcpus.to_string());
    set(labels::aws::MEMORY, facts.memory_mib.to_string());
    if let Some(m) = &facts.cpu_manufacturer {
        set(labels::aws::CPU_MANUFACTURER, label_value(m));
    }
    if let Some(ghz) = facts.clock_ghz {
        set(labels::aws::CPU_SUSTAINED_CLOCK_SPEED_MHZ, ghz_to_mhz(ghz).to_string());
    }
    if let Some(b) = facts.ebs_bandwidth_mbps {
        set(labels::aws::EBS_BANDWIDTH, b.to_string());
    }
    if let Some(b) = facts.network_bandwidth_mbps {
        set(labels::aws::NETWORK_BANDWIDTH, b.to_string());
    }
    if let (Some(gb), true) = (facts.local_storage_gb, facts.local_nvme) {
        set(labels::aws::LOCAL_NVME, gb.to_string());
    }
    // Bare metal has no hypervisor; Karpenter labels it with an empty value.
    set(
        labels::aws::HYPERVISOR,
        facts.hypervisor.as_deref().map(label_value).unwrap_or_default(),
    );
    set(
        labels::aws::ENCRYPTION_IN_TRANSIT_SUPPORTED,
        facts.encryption_in_transit.to_string(),
    );
    if let Some(g) = facts.gpus.first() {
        set(labels::aws::GPU_NAME, label_value(&g.name));
        set(labels::aws::GPU_MANUFACTURER, label_value(&g.manufacturer));
        set(labels::aws::GPU_COUNT, g.count.to_string());
        if let Some(m) = g.memory_mib {
            set(labels::aws::GPU_MEMORY, m.to_string());
        }
    }
    if let Some(a) = facts.accelerators.first() {
        set(labels::aws::ACCELERATOR_NAME, label_value(&a.name));
        set(labels::aws::ACCELERATOR_MANUFACTURER, label_value(&a.manufacturer));
        set(labels::aws::ACCELERATOR_COUNT, a.count.to_string());
    }

    let eni_max_pods = facts.eni_max_pods();
    let mut capacity = Resources::from_pairs([
        (resources::CPU, Quantity::from_units(facts.vcpus)),
        (
            resources::MEMORY,
            Quantity::from_mib(memory_capacity_mib(facts.memory_mib, arch)),
        ),
        (resources::PODS, Quantity::from_units(eni_max_pods)),
        (
            resources::EPHEMERAL_STORAGE,
            Quantity::from_units(DEFAULT_ROOT_VOLUME_GIB << 30),
        ),
    ]);
    let mut add = |name: &str, n: i64| {
        if n > 0 {
            let q = capacity.get(name).saturating_add(Quantity::from_units(n));
            capacity.set(name, q);
        }
    };
    for g in &facts.gpus {
        match label_value(&g.manufacturer).as_str() {
            "nvidia" => add(resources::NVIDIA_GPU, g.count),
            "amd" => add(resources::AMD_GPU, g.count),
            "habana" => add(resources::HABANA_GAUDI, g.count),
            _ => {}
        }
    }
    for a in &facts.accelerators {
        // Neuron devices (Inferentia, Trainium) are AWS-made and carry core counts.
        if label_value(&a.manufacturer) == "aws" {
            add(resources::AWS_NEURON, a.count);
            add(resources::AWS_NEURON_CORE, a.count * a.cores.unwrap_or(0));
        }
    }
    add(resources::AWS_EFA, facts.efa_interfaces);

    Ok(InstanceTypeInfo {
        name: facts.name.clone(),
        labels: l,
        capacity,
        allocatable: None,
        vcpus: facts.vcpus,
        eni_max_pods,
        offerings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(name: &str) -> Ec2Facts {
        Ec2Facts {
            name: name.into(),
            vcpus: 2,
            memory_mib: 8192,
            architectures: vec!["x86_64".into()],
            cpu_manufacturer: Some("Intel".into()),
            clock_ghz: Some(3.1),
            hypervisor: Some("nitro".into()),
            bare_metal: false,
            max_enis: 3,
            ipv4_per_eni: 10,
            network_bandwidth_mbps: Some(750),
            ebs_bandwidth_mbps: Some(4750),
            local_storage_gb: None,
            local_nvme: false,
            gpus: vec![],
            accelerators: vec![],
            efa_interfaces: 0,
            encryption_in_transit: false,
            usage_classes: vec!["on-demand".into(), "spot".into()],
        }
    }

    fn lbl(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn name_derived_labels() {
        use labels::aws::*;
        let table: &[(&str, &[(&str, &str)])] = &[
            (
                "m5.large",
                &[(FAMILY, "m5"), (SIZE, "large"), (CATEGORY, "m"), (GENERATION, "5")],
            ),
            (
                "c6gn.16xlarge",
                &[(FAMILY, "c6gn"), (SIZE, "16xlarge"), (CATEGORY, "c"), (GENERATION, "6")],
            ),
            (
                "m5.metal",
                &[(FAMILY, "m5"), (SIZE, "metal"), (CATEGORY, "m"), (GENERATION, "5")],
            ),
            (
                "u-6tb1.metal",
                &[(FAMILY, "u-6tb1"), (SIZE, "metal"), (CATEGORY, "u"), (GENERATION, "1")],
            ),
            (
                "u7i-12tb.224xlarge",
                &[
                    (FAMILY, "u7i-12tb"),
                    (SIZE, "224xlarge"),
                    (CATEGORY, "u"),
                    (GENERATION, "7"),
                ],
            ),
            (
                "inf2.xlarge",
                &[(FAMILY, "inf2"), (SIZE, "xlarge"), (CATEGORY, "inf"), (GENERATION, "2")],
            ),
            (
                "x2iedn.32xlarge",
                &[
                    (FAMILY, "x2iedn"),
                    (SIZE, "32xlarge"),
                    (CATEGORY, "x"),
                    (GENERATION, "2"),
                ],
            ),
            (
                "mac2-m2pro.metal",
                &[
                    (FAMILY, "mac2-m2pro"),
                    (SIZE, "metal"),
                    (CATEGORY, "mac"),
                    (GENERATION, "2"),
                ],
            ),
            (
                "c7i-flex.large",
                &[
                    (FAMILY, "c7i-flex"),
                    (SIZE, "large"),
                    (CATEGORY, "c"),
                    (GENERATION, "7"),
                ],
            ),
            // No digits after the letters: no category or generation.
            ("custom.big", &[(FAMILY, "custom"), (SIZE, "big")]),
            ("nodot", &[]),
            ("m5-.large", &[]),
            (".large", &[]),
        ];
        for (name, want) in table {
            assert_eq!(name_labels(name), lbl(want), "{name}");
        }
    }

    #[test]
    fn m5_large_labels_and_capacity() {
        let i = instance_type_info(&facts("m5.large"), vec![]).unwrap();
        use labels::aws::*;
        let want = lbl(&[
            (labels::INSTANCE_TYPE, "m5.large"),
            (labels::ARCH, "amd64"),
            (labels::OS, "linux"),
            (FAMILY, "m5"),
            (SIZE, "large"),
            (CATEGORY, "m"),
            (GENERATION, "5"),
            (CPU, "2"),
            (MEMORY, "8192"),
            (CPU_MANUFACTURER, "intel"),
            (CPU_SUSTAINED_CLOCK_SPEED_MHZ, "3100"),
            (EBS_BANDWIDTH, "4750"),
            (NETWORK_BANDWIDTH, "750"),
            (HYPERVISOR, "nitro"),
            (ENCRYPTION_IN_TRANSIT_SUPPORTED, "false"),
        ]);
        assert_eq!(i.labels, want);
        assert_eq!(i.eni_max_pods, 29);
        assert_eq!(
            i.capacity.to_k8s_strings(),
            lbl(&[
                ("cpu", "2"),
                ("memory", "7577Mi"),
                ("pods", "29"),
                ("ephemeral-storage", "20Gi")
            ])
        );
    }

    #[test]
    fn gpu_accelerator_efa_and_metal() {
        let mut g5 = facts("g5.xlarge");
        g5.vcpus = 4;
        g5.memory_mib = 16384;
        g5.cpu_manufacturer = Some("AMD".into());
        g5.local_storage_gb = Some(250);
        g5.local_nvme = true;
        g5.encryption_in_transit = true;
        g5.gpus = vec![Device {
            name: "A10G".into(),
            manufacturer: "NVIDIA".into(),
            count: 1,
            memory_mib: Some(22888),
            cores: None,
        }];
        let i = instance_type_info(&g5, vec![]).unwrap();
        use labels::aws::*;
        for (k, v) in [
            (GPU_NAME, "a10g"),
            (GPU_MANUFACTURER, "nvidia"),
            (GPU_COUNT, "1"),
            (GPU_MEMORY, "22888"),
            (LOCAL_NVME, "250"),
            (CPU_MANUFACTURER, "amd"),
            (ENCRYPTION_IN_TRANSIT_SUPPORTED, "true"),
        ] {
            assert_eq!(i.labels.get(k).map(String::as_str), Some(v), "{k}");
        }
        assert_eq!(i.capacity.get(resources::NVIDIA_GPU), Quantity::from_units(1));

        let mut trn = facts("trn1.32xlarge");
        trn.accelerators = vec![Device {
            name: "Trainium".into(),
            manufacturer: "AWS".into(),
            count: 16,
            memory_mib: Some(32768),
            cores: Some(2),
        }];
        trn.efa_interfaces = 8;
        let i = instance_type_info(&trn, vec![]).unwrap();
        assert_eq!(i.labels.get(ACCELERATOR_NAME).map(String::as_str), Some("trainium"));
        assert_eq!(i.labels.get(ACCELERATOR_MANUFACTURER).map(String::as_str), Some("aws"));
        assert_eq!(i.labels.get(ACCELERATOR_COUNT).map(String::as_str), Some("16"));
        assert_eq!(i.capacity.get(resources::AWS_NEURON), Quantity::from_units(16));
        assert_eq!(i.capacity.get(resources::AWS_NEURON_CORE), Quantity::from_units(32));
        assert_eq!(i.capacity.get(resources::AWS_EFA), Quantity::from_units(8));
        assert!(!i.labels.contains_key(GPU_NAME));

        let mut dl1 = facts("dl1.24xlarge");
        dl1.gpus = vec![Device {
            name: "Gaudi HL-205".into(),
            manufacturer: "Habana".into(),
            count: 8,
            memory_mib: Some(32768),
            cores: None,
        }];
        let i = instance_type_info(&dl1, vec![]).unwrap();
        assert_eq!(i.capacity.get(resources::HABANA_GAUDI), Quantity::from_units(8));
        assert_eq!(i.labels.get(GPU_NAME).map(String::as_str), Some("gaudi-hl-205"));

        let mut metal = facts("m5.metal");
        metal.hypervisor = None;
        metal.bare_metal = true;
        let i = instance_type_info(&metal, vec![]).unwrap();
        assert_eq!(i.labels.get(HYPERVISOR).map(String::as_str), Some(""));
    }

    #[test]
    fn arm_and_unsupported_facts() {
        let mut f = facts("c6g.medium");
        f.architectures = vec!["arm64".into()];
        f.cpu_manufacturer = Some("AWS".into());
        let i = instance_type_info(&f, vec![]).unwrap();
        assert_eq!(i.labels.get(labels::ARCH).map(String::as_str), Some("arm64"));
        assert_eq!(
            i.labels.get(labels::aws::CPU_MANUFACTURER).map(String::as_str),
            Some("aws")
        );

        f.architectures = vec!["arm64_mac".into()];
        let e = instance_type_info(&f, vec![]).unwrap_err().to_string();
        assert!(e.contains("c6g.medium") && e.contains("arm64_mac"), "{e}");
        let mut f = facts("m5.large");
        f.ipv4_per_eni = 1;
        assert!(instance_type_info(&f, vec![]).is_err());
    }

    proptest::proptest! {
        #[test]
        fn derived_label_values_are_always_valid(name in "\\PC{0,80}") {
            proptest::prop_assert!(labels::is_label_value(&label_value(&name)));
            for v in name_labels(&name).values() {
                proptest::prop_assert!(labels::is_label_value(v) && !v.is_empty(), "{name:?} -> {v:?}");
            }
        }

        #[test]
        fn name_labels_round_trip_family_and_size(family in "[a-z]{1,3}[0-9]{1,2}[a-z]{0,4}", size in "[0-9]{0,2}(x)?large|metal|medium") {
            let l = name_labels(&format!("{family}.{size}"));
            proptest::prop_assert_eq!(l.get(labels::aws::FAMILY), Some(&family));
            proptest::prop_assert_eq!(l.get(labels::aws::SIZE), Some(&size));
            let category: String = family.chars().take_while(|c| c.is_ascii_lowercase()).collect();
            proptest::prop_assert_eq!(l.get(labels::aws::CATEGORY), Some(&category));
        }
    }

    #[test]
    fn label_values_are_valid() {
        for (raw, want) in [
            ("RTX PRO Server 6000", "rtx-pro-server-6000"),
            ("NVIDIA", "nvidia"),
            ("Qualcomm AI100", "qualcomm-ai100"),
            (" x ", "x"),
        ] {
            assert_eq!(label_value(raw), want);
            assert!(labels::is_label_value(want));
        }
    }
}
