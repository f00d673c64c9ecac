//! Well-known label keys, their deprecated aliases, and the label domains
//! that users may not set (as Karpenter v1 and its AWS provider define them).

/// Zone label.
pub const ZONE: &str = "topology.kubernetes.io/zone";
/// Region label.
pub const REGION: &str = "topology.kubernetes.io/region";
/// Zone id label (AWS).
pub const ZONE_ID: &str = "topology.k8s.aws/zone-id";
/// Instance type label.
pub const INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";
/// CPU architecture label.
pub const ARCH: &str = "kubernetes.io/arch";
/// Operating system label.
pub const OS: &str = "kubernetes.io/os";
/// Windows build label.
pub const WINDOWS_BUILD: &str = "node.kubernetes.io/windows-build";
/// Hostname label.
pub const HOSTNAME: &str = "kubernetes.io/hostname";
/// Capacity type label (spot, on-demand, reserved).
pub const CAPACITY_TYPE: &str = "karpenter.sh/capacity-type";
/// NodePool label.
pub const NODEPOOL: &str = "karpenter.sh/nodepool";
/// Label and instance tag naming a node's NodeClaim.
pub const NODECLAIM: &str = "karpenter.sh/nodeclaim";
/// Initialized label, set once a node is ready.
pub const INITIALIZED: &str = "karpenter.sh/initialized";
/// Registered label, set once a node joined.
pub const REGISTERED: &str = "karpenter.sh/registered";
/// The EC2NodeClass label.
pub const EC2NODECLASS: &str = "karpenter.k8s.aws/ec2nodeclass";

/// Karpenter's finalizer on the Nodes it manages: a deleted Node stays until
/// it is drained and its instance terminated.
pub const TERMINATION_FINALIZER: &str = "karpenter.sh/termination";
/// Taint a node registers with (in its user data) until nodesmith registers it.
pub const UNREGISTERED_TAINT_KEY: &str = "karpenter.sh/unregistered";
/// Taint the node lifecycle controller sets on a node that is not ready.
pub const NOT_READY_TAINT_KEY: &str = "node.kubernetes.io/not-ready";
/// Taint the node lifecycle controller sets on a node it cannot reach.
pub const UNREACHABLE_TAINT_KEY: &str = "node.kubernetes.io/unreachable";
/// Taint a node carries until its cloud provider has initialized it.
pub const UNINITIALIZED_TAINT_KEY: &str = "node.cloudprovider.kubernetes.io/uninitialized";
/// Taints Kubernetes itself puts on and takes off nodes as they start and fail:
/// not part of a node's configuration.
pub const EPHEMERAL_TAINT_KEYS: &[&str] = &[NOT_READY_TAINT_KEY, UNREACHABLE_TAINT_KEY, UNINITIALIZED_TAINT_KEY];

/// Node annotation: `nodesmith rotate` asked for this node to be replaced
/// (the time of the request); the drift method replaces it like a drifted node.
pub const ROTATE_ANNOTATION: &str = "nodesmith/rotate-requested";
/// Node annotation: the disruption reason a node was launched to replace nodes for
/// (consolidation leaves such a node alone for a while).
pub const REPLACEMENT_ANNOTATION: &str = "nodesmith/disruption-replacement";
/// Node and NodeClaim annotation: the NodePool hash the node was made from ([`crate::apis::NodePool::hash`]).
pub const NODEPOOL_HASH_ANNOTATION: &str = "karpenter.sh/nodepool-hash";
/// Node and NodeClaim annotation: the version of that hash ([`crate::apis::NODEPOOL_HASH_VERSION`]).
pub const NODEPOOL_HASH_VERSION_ANNOTATION: &str = "karpenter.sh/nodepool-hash-version";
/// Node and NodeClaim annotation: the EC2NodeClass hash the node was launched with ([`crate::apis::EC2NodeClass::hash`]).
pub const EC2NODECLASS_HASH_ANNOTATION: &str = "karpenter.k8s.aws/ec2nodeclass-hash";
/// Node and NodeClaim annotation: the version of that hash ([`crate::apis::EC2NODECLASS_HASH_VERSION`]).
pub const EC2NODECLASS_HASH_VERSION_ANNOTATION: &str = "karpenter.k8s.aws/ec2nodeclass-hash-version";

/// Spot capacity.
pub const CAPACITY_SPOT: &str = "spot";
/// On-demand capacity.
pub const CAPACITY_ON_DEMAND: &str = "on-demand";
/// Capacity-reservation capacity.
pub const CAPACITY_RESERVED: &str = "reserved";

/// `karpenter.k8s.aws/instance-*` labels that describe an instance type.
pub mod aws {
    /// Instance category (c, m, r, g, ...).
    pub const CATEGORY: &str = "karpenter.k8s.aws/instance-category";
    /// Instance family (m5, c6g, ...).
    pub const FAMILY: &str = "karpenter.k8s.aws/instance-family";
    /// Instance generation (5, 6, ...).
    pub const GENERATION: &str = "karpenter.k8s.aws/instance-generation";
    /// Instance size (large, 2xlarge, metal, ...).
    pub const SIZE: &str = "karpenter.k8s.aws/instance-size";
    /// Local NVMe storage in GiB.
    pub const LOCAL_NVME: &str = "karpenter.k8s.aws/instance-local-nvme";
    /// vCPU count.
    pub const CPU: &str = "karpenter.k8s.aws/instance-cpu";
    /// CPU manufacturer (intel, amd, aws).
    pub const CPU_MANUFACTURER: &str = "karpenter.k8s.aws/instance-cpu-manufacturer";
    /// Sustained clock speed in MHz.
    pub const CPU_SUSTAINED_CLOCK_SPEED_MHZ: &str = "karpenter.k8s.aws/instance-cpu-sustained-clock-speed-mhz";
    /// Memory in MiB.
    pub const MEMORY: &str = "karpenter.k8s.aws/instance-memory";
    /// EBS bandwidth in Mbps.
    pub const EBS_BANDWIDTH: &str = "karpenter.k8s.aws/instance-ebs-bandwidth";
    /// Network bandwidth in Mbps.
    pub const NETWORK_BANDWIDTH: &str = "karpenter.k8s.aws/instance-network-bandwidth";
    /// GPU name (t4, a10g, ...).
    pub const GPU_NAME: &str = "karpenter.k8s.aws/instance-gpu-name";
    /// GPU manufacturer (nvidia, amd).
    pub const GPU_MANUFACTURER: &str = "karpenter.k8s.aws/instance-gpu-manufacturer";
    /// GPU count.
    pub const GPU_COUNT: &str = "karpenter.k8s.aws/instance-gpu-count";
    /// Memory per GPU in MiB.
    pub const GPU_MEMORY: &str = "karpenter.k8s.aws/instance-gpu-memory";
    /// Accelerator name (inferentia, trainium, ...).
    pub const ACCELERATOR_NAME: &str = "karpenter.k8s.aws/instance-accelerator-name";
    /// Accelerator manufacturer.
    pub const ACCELERATOR_MANUFACTURER: &str = "karpenter.k8s.aws/instance-accelerator-manufacturer";
    /// Accelerator count.
    pub const ACCELERATOR_COUNT: &str = "karpenter.k8s.aws/instance-accelerator-count";
    /// Hypervisor (nitro, xen, or empty for metal).
    pub const HYPERVISOR: &str = "karpenter.k8s.aws/instance-hypervisor";
    /// Whether encryption in transit is supported.
    pub const ENCRYPTION_IN_TRANSIT_SUPPORTED: &str = "karpenter.k8s.aws/instance-encryption-in-transit-supported";
    /// Capacity reservation id.
    pub const CAPACITY_RESERVATION_ID: &str = "karpenter.k8s.aws/capacity-reservation-id";
    /// Capacity reservation type.
    pub const CAPACITY_RESERVATION_TYPE: &str = "karpenter.k8s.aws/capacity-reservation-type";
}

/// Every label that an instance type, an offering or the NodePool defines
/// for a new node, so pods may require it even when a pool does not.
pub const WELL_KNOWN: &[&str] = &[
    ZONE,
    REGION,
    ZONE_ID,
    INSTANCE_TYPE,
    ARCH,
    OS,
    WINDOWS_BUILD,
    CAPACITY_TYPE,
    NODEPOOL,
    EC2NODECLASS,
    aws::CATEGORY,
    aws::FAMILY,
    aws::GENERATION,
    aws::SIZE,
    aws::LOCAL_NVME,
    aws::CPU,
    aws::CPU_MANUFACTURER,
    aws::CPU_SUSTAINED_CLOCK_SPEED_MHZ,
    aws::MEMORY,
    aws::EBS_BANDWIDTH,
    aws::NETWORK_BANDWIDTH,
    aws::GPU_NAME,
    aws::GPU_MANUFACTURER,
    aws::GPU_COUNT,
    aws::GPU_MEMORY,
    aws::ACCELERATOR_NAME,
    aws::ACCELERATOR_MANUFACTURER,
    aws::ACCELERATOR_COUNT,
    aws::HYPERVISOR,
    aws::ENCRYPTION_IN_TRANSIT_SUPPORTED,
    aws::CAPACITY_RESERVATION_ID,
    aws::CAPACITY_RESERVATION_TYPE,
];

/// Deprecated or provider-specific keys that mean a well-known key.
const ALIASES: &[(&str, &str)] = &[
    ("failure-domain.beta.kubernetes.io/zone", ZONE),
    ("failure-domain.beta.kubernetes.io/region", REGION),
    ("beta.kubernetes.io/arch", ARCH),
    ("beta.kubernetes.io/instance-type", INSTANCE_TYPE),
    ("beta.kubernetes.io/os", OS),
    ("topology.ebs.csi.aws.com/zone", ZONE),
];

/// Label domains a NodePool requirement may not name (see [`restricted_reason`]).
pub const RESTRICTED_DOMAINS: &[&str] = &["kubernetes.io", "k8s.io", "karpenter.sh", "karpenter.k8s.aws"];

/// Subdomains of restricted domains that users may still set.
pub const DOMAIN_EXCEPTIONS: &[&str] = &["kops.k8s.io", "node.kubernetes.io", "node-restriction.kubernetes.io"];

/// Labels that may never be constrained or set by users.
pub const RESTRICTED: &[&str] = &[NODEPOOL, HOSTNAME, EC2NODECLASS];

/// The label that marks a NodeClaim object as nodesmith's mirror
/// ([`crate::mirror`]): only these are written or deleted (a Karpenter
/// NodeClaim left from before a move is not nodesmith's).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// [`MANAGED_BY_LABEL`]'s value.
pub const MANAGED_BY: &str = "nodesmith";

/// Maps a deprecated alias to its well-known key; other keys are returned as is.
pub fn normalize(key: &str) -> &str {
    ALIASES.iter().find(|(alias, _)| *alias == key).map_or(key, |(_, k)| k)
}

/// True when instance types or the pool define this label for every node.
pub fn is_well_known(key: &str) -> bool {
    WELL_KNOWN.contains(&normalize(key))
}

/// The domain part of a label key (before the `/`), if any.
pub fn domain(key: &str) -> Option<&str> {
    key.split_once('/').map(|(d, _)| d)
}

/// Why a NodePool requirement may not name this key, if so (template labels
/// follow [`nodepool_label_restriction`]).
pub fn restricted_reason(key: &str) -> Option<String> {
    if RESTRICTED.contains(&key) {
        return Some(format!("label {key:?} is restricted"));
    }
    let d = domain(key)?;
    if DOMAIN_EXCEPTIONS
        .iter()
        .any(|e| d == *e || d.ends_with(&format!(".{e}")))
    {
        return None;
    }
    if is_well_known(key) {
        return None;
    }
    RESTRICTED_DOMAINS
        .iter()
        .find(|r| d == **r || d.ends_with(&format!(".{r}")))
        .map(|r| format!("label domain {r:?} is restricted"))
}

/// `kubernetes.io` labels the kubelet sets or accepts by name in `--node-labels`.
const KUBELET_LABELS: &[&str] = &[
    HOSTNAME,
    ARCH,
    OS,
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/instance-type",
    INSTANCE_TYPE,
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    ZONE,
    REGION,
];

/// True when `d` is `root` or a subdomain of it.
fn within(d: &str, root: &str) -> bool {
    d.strip_suffix(root)
        .is_some_and(|rest| rest.is_empty() || rest.ends_with('.'))
}

/// Whether a kubelet accepts this key in `--node-labels`: it refuses keys in
/// the `kubernetes.io` and `k8s.io` domains (and their subdomains) except its
/// own labels and the `kubelet.kubernetes.io` and `node.kubernetes.io` domains,
/// and will not start when given one it refuses.
pub fn kubelet_may_set(key: &str) -> bool {
    let Some(d) = domain(key) else { return true };
    if !within(d, "kubernetes.io") && !within(d, "k8s.io") {
        return true;
    }
    KUBELET_LABELS.contains(&key) || within(d, "kubelet.kubernetes.io") || within(d, "node.kubernetes.io")
}

/// `kubernetes.io` labels a NodePool template may set by name.
const TEMPLATE_KUBERNETES_LABELS: &[&str] = &[
    "beta.kubernetes.io/instance-type",
    "failure-domain.beta.kubernetes.io/region",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "failure-domain.beta.kubernetes.io/zone",
    ZONE,
    REGION,
    ARCH,
    OS,
    WINDOWS_BUILD,
];

/// Why a key may not be one of a NodePool's `spec.template.metadata.labels`,
/// by Karpenter v1's NodePool CRD rules, or `None` when it may. As those
/// rules, the domain is the key up to its first `/` (the whole key without
/// one) and domains are matched by plain suffix.
pub fn nodepool_label_restriction(key: &str) -> Option<String> {
    if key == NODEPOOL || key == HOSTNAME {
        return Some(format!("label {key:?} is restricted"));
    }
    let d = key.split('/').next().unwrap_or(key);
    let restricted = |root: &str| Some(format!("label domain {root:?} is restricted"));
    if d.ends_with("kubernetes.io")
        && !TEMPLATE_KUBERNETES_LABELS.contains(&key)
        && !d.ends_with("node.kubernetes.io")
        && !d.ends_with("node-restriction.kubernetes.io")
    {
        return restricted("kubernetes.io");
    }
    if d.ends_with("k8s.io") && !d.ends_with("kops.k8s.io") {
        return restricted("k8s.io");
    }
    if d.ends_with("karpenter.sh") && key != CAPACITY_TYPE {
        return restricted("karpenter.sh");
    }
    if d.ends_with("karpenter.k8s.aws")
        && !(key.starts_with("karpenter.k8s.aws/instance-") && WELL_KNOWN.contains(&key))
    {
        return restricted("karpenter.k8s.aws");
    }
    None
}

/// True for a label whose value comes from the launched instance, so it is
/// not known before launch: the well-known labels (instance type, zone,
/// region, arch, os, capacity type, ...), the hostname, and every
/// `karpenter.sh` and `karpenter.k8s.aws` label.
pub fn set_from_instance(key: &str) -> bool {
    is_well_known(key) || key == HOSTNAME || matches!(domain(key), Some("karpenter.sh" | "karpenter.k8s.aws"))
}

/// Why a label key or value breaks Kubernetes' syntax (the API server refuses
/// such an object with 422 Unprocessable Entity, a kubelet refuses to start).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    /// The key's prefix (before `/`) is not a DNS subdomain of at most 253 characters.
    #[error("label key {key:?} has an invalid prefix: it must be a lowercase DNS subdomain of at most 253 characters")]
    Prefix {
        /// The key.
        key: String,
    },
    /// The key's name (after any `/`) breaks the qualified-name rule.
    #[error(
        "label key {key:?} has an invalid name: it must be 1 to 63 characters of letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
    )]
    Name {
        /// The key.
        key: String,
    },
    /// The value breaks the label-value rule.
    #[error(
        "label value {value:?} (key {key:?}) is invalid: it must be empty or at most 63 characters of letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
    )]
    Value {
        /// The key the value was given for (empty when checked alone).
        key: String,
        /// The value.
        value: String,
    },
}

/// Checks a label key as Kubernetes does (a qualified name): an optional
/// prefix that is a DNS subdomain (lowercase, at most 253 characters) and a
/// `/`, then a name of 1 to 63 letters, digits, `-`, `_` and `.` that starts
/// and ends with a letter or digit.
pub fn validate_key(key: &str) -> Result<(), LabelError> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if prefix.is_some_and(|p| !is_dns_subdomain(p)) {
        return Err(LabelError::Prefix { key: key.into() });
    }
    if name.is_empty() || !is_label_value(name) {
        return Err(LabelError::Name { key: key.into() });
    }
    Ok(())
}

/// Checks a label value as Kubernetes does ([`is_label_value`]).
pub fn validate_value(value: &str) -> Result<(), LabelError> {
    validate_label("", value).map_err(|e| match e {
        LabelError::Value { value, .. } => LabelError::Value {
            key: String::new(),
            value,
        },
        other => other,
    })
}

/// Checks a label's key, then its value: what the API server checks before
/// it stores an object's labels.
pub fn validate_label(key: &str, value: &str) -> Result<(), LabelError> {
    if !key.is_empty() {
        validate_key(key)?;
    }
    if !is_label_value(value) {
        return Err(LabelError::Value {
            key: key.into(),
            value: value.into(),
        });
    }
    Ok(())
}

/// True for a valid label value: at most 63 characters, alphanumerics at both
/// ends and `-`, `_`, `.` inside (empty is allowed).
pub fn is_label_value(v: &str) -> bool {
    if v.is_empty() {
        return true;
    }
    let b = v.as_bytes();
    v.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Kubernetes' DNS-1123 subdomain: at most 253 characters, dot-separated
/// labels of lowercase alphanumerics and `-`, each starting and ending with an
/// alphanumeric.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !s.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_aliases() {
        assert_eq!(normalize("failure-domain.beta.kubernetes.io/zone"), ZONE);
        assert_eq!(normalize("beta.kubernetes.io/arch"), ARCH);
        assert_eq!(normalize("topology.ebs.csi.aws.com/zone"), ZONE);
        assert_eq!(normalize("example.com/team"), "example.com/team");
    }

    #[test]
    fn restricted_labels() {
        let table: &[(&str, bool)] = &[
            ("kubernetes.io/hostname", true),
            ("karpenter.sh/nodepool", true),
            ("karpenter.sh/custom", true),
            ("example.kubernetes.io/x", true),
            ("karpenter.k8s.aws/foo", true),
            ("node.kubernetes.io/instance-type", false),
            ("node-restriction.kubernetes.io/team", false),
            ("kops.k8s.io/instancegroup", false),
            ("topology.kubernetes.io/zone", false),
            ("team", false),
            ("example.com/team", false),
        ];
        for (k, restricted) in table {
            assert_eq!(restricted_reason(k).is_some(), *restricted, "{k}");
        }
    }

    #[test]
    fn kubelet_label_rule() {
        let table: &[(&str, bool)] = &[
            ("team", true),
            ("example.com/team", true),
            ("karpenter.sh/nodepool", true),
            ("karpenter.sh/capacity-type", true),
            ("karpenter.k8s.aws/instance-family", true),
            ("karpenter.k8s.aws/ec2nodeclass", true),
            ("topology.k8s.aws/zone-id", true),
            ("kops.k8s.io/instancegroup", false),
            ("k8s.io/x", false),
            ("example.k8s.io/x", false),
            ("kubernetes.io/hostname", true),
            ("kubernetes.io/arch", true),
            ("kubernetes.io/os", true),
            ("beta.kubernetes.io/arch", true),
            ("beta.kubernetes.io/os", true),
            ("beta.kubernetes.io/instance-type", true),
            ("node.kubernetes.io/instance-type", true),
            ("failure-domain.beta.kubernetes.io/zone", true),
            ("failure-domain.beta.kubernetes.io/region", true),
            ("topology.kubernetes.io/zone", true),
            ("topology.kubernetes.io/region", true),
            ("topology.kubernetes.io/other", false),
            ("kubernetes.io/team", false),
            ("node-role.kubernetes.io/worker", false),
            ("node-restriction.kubernetes.io/team", false),
            ("node.kubernetes.io/windows-build", true),
            ("node.kubernetes.io/anything", true),
            ("x.node.kubernetes.io/y", true),
            ("kubelet.kubernetes.io/y", true),
            ("a.kubelet.kubernetes.io/y", true),
            ("notkubernetes.io/x", true),
            ("mynode.kubernetes.io/x", false),
        ];
        for (k, may) in table {
            assert_eq!(kubelet_may_set(k), *may, "{k}");
        }
    }

    #[test]
    fn nodepool_template_label_rules() {
        let kube = Some("label domain \"kubernetes.io\" is restricted");
        let k8s = Some("label domain \"k8s.io\" is restricted");
        let karpenter = Some("label domain \"karpenter.sh\" is restricted");
        let aws = Some("label domain \"karpenter.k8s.aws\" is restricted");
        let table: &[(&str, Option<&str>)] = &[
            ("team", None),
            ("example.com/team", None),
            ("topology.k8s.aws/zone-id", None),
            (
                "kubernetes.io/hostname",
                Some("label \"kubernetes.io/hostname\" is restricted"),
            ),
            (
                "karpenter.sh/nodepool",
                Some("label \"karpenter.sh/nodepool\" is restricted"),
            ),
            ("kubernetes.io/arch", None),
            ("kubernetes.io/os", None),
            ("beta.kubernetes.io/arch", None),
            ("beta.kubernetes.io/os", None),
            ("beta.kubernetes.io/instance-type", None),
            ("failure-domain.beta.kubernetes.io/zone", None),
            ("failure-domain.beta.kubernetes.io/region", None),
            ("topology.kubernetes.io/zone", None),
            ("topology.kubernetes.io/region", None),
            ("node.kubernetes.io/windows-build", None),
            ("node.kubernetes.io/instance-type", None),
            ("node.kubernetes.io/team", None),
            ("x.node.kubernetes.io/team", None),
            ("node-restriction.kubernetes.io/team", None),
            ("kubernetes.io/team", kube),
            ("topology.kubernetes.io/rack", kube),
            ("node-role.kubernetes.io/worker", kube),
            ("example.kubernetes.io/x", kube),
            ("kubernetes.io", kube),
            ("kops.k8s.io/instancegroup", None),
            ("x.kops.k8s.io/y", None),
            ("k8s.io/x", k8s),
            ("example.k8s.io/x", k8s),
            ("karpenter.sh/capacity-type", None),
            ("karpenter.sh/custom", karpenter),
            ("karpenter.sh/registered", karpenter),
            ("sub.karpenter.sh/x", karpenter),
            ("karpenter.k8s.aws/instance-family", None),
            ("karpenter.k8s.aws/instance-cpu", None),
            ("karpenter.k8s.aws/instance-gpu-name", None),
            ("karpenter.k8s.aws/instance-encryption-in-transit-supported", None),
            ("karpenter.k8s.aws/instance-made-up", aws),
            ("karpenter.k8s.aws/ec2nodeclass", aws),
            ("karpenter.k8s.aws/capacity-reservation-id", aws),
            ("karpenter.k8s.aws/foo", aws),
        ];
        for (k, want) in table {
            assert_eq!(nodepool_label_restriction(k).as_deref(), *want, "{k}");
        }
    }

    #[test]
    fn labels_set_from_the_instance() {
        for k in [
            INSTANCE_TYPE,
            "beta.kubernetes.io/instance-type",
            ZONE,
            REGION,
            ARCH,
            OS,
            CAPACITY_TYPE,
            HOSTNAME,
            NODEPOOL,
            aws::FAMILY,
            EC2NODECLASS,
            "karpenter.k8s.aws/anything",
            "karpenter.sh/anything",
        ] {
            assert!(set_from_instance(k), "{k}");
        }
        for k in ["team", "example.com/team", "node-restriction.kubernetes.io/team"] {
            assert!(!set_from_instance(k), "{k}");
        }
    }

    #[test]
    fn label_syntax_follows_kubernetes() {
        let long64 = "a".repeat(64);
        let long63 = "a".repeat(63);
        let keys: Vec<(String, bool)> = vec![
            ("team".into(), true),
            ("example.com/team".into(), true),
            ("a.b-c.example.com/Team_1.x".into(), true),
            ("Team".into(), true),
            ("1".into(), true),
            (long63.clone(), true),
            (format!("{}/x", "a".repeat(253)), true),
            (format!("{}.b/x", "a".repeat(70)), true),
            ("".into(), false),
            ("/team".into(), false),
            ("example.com/".into(), false),
            ("Example.com/team".into(), false),
            ("a/b/c".into(), false),
            ("team,x=y".into(), false),
            ("a,dedicated=payments".into(), false),
            ("te am".into(), false),
            ("-team".into(), false),
            ("team-".into(), false),
            ("example..com/team".into(), false),
            ("-example.com/team".into(), false),
            ("example.com/team=x".into(), false),
            ("caf\u{e9}".into(), false),
            (long64.clone(), false),
            (format!("example.com/{long64}"), false),
            (format!("{}/x", "a".repeat(254)), false),
        ];
        for (k, ok) in &keys {
            assert_eq!(validate_key(k).is_ok(), *ok, "key {k:?}");
        }
        let values: Vec<(String, bool)> = vec![
            ("".into(), true),
            ("web".into(), true),
            ("a.b_c-D9".into(), true),
            (long63.clone(), true),
            (long64.clone(), false),
            ("a,dedicated=payments".into(), false),
            ("a b".into(), false),
            ("a=b".into(), false),
            ("a\nb".into(), false),
            ("a\n--node-labels=x=y".into(), false),
            ("\"quoted\"".into(), false),
            ("-a".into(), false),
            ("a.".into(), false),
            ("_".into(), false),
            ("x/y".into(), false),
            ("caf\u{e9}".into(), false),
        ];
        for (v, ok) in &values {
            assert_eq!(validate_value(v).is_ok(), *ok, "value {v:?}");
            assert_eq!(is_label_value(v), *ok, "value {v:?}");
        }
        let e = validate_value("a,dedicated=payments").unwrap_err();
        assert!(e.to_string().contains("\"a,dedicated=payments\""), "{e}");
        let e = validate_label("team", "a,dedicated=payments").unwrap_err();
        assert!(e.to_string().contains("\"a,dedicated=payments\""), "{e}");
        let e = validate_label("a b", "x").unwrap_err();
        assert!(e.to_string().contains("\"a b\""), "{e}");
        assert!(validate_label("team", "").is_ok());
    }

    #[test]
    fn key_syntax() {
        assert!(validate_key("example.com/team").is_ok());
        assert!(validate_key("team").is_ok());
        assert!(validate_key("Example.com/team").is_err());
        assert!(validate_key("/team").is_err());
        assert!(validate_key("example.com/").is_err());
        assert!(validate_key(&"a".repeat(64)).is_err());
    }
}
