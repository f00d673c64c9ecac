//! `karpenter.k8s.aws/v1` EC2NodeClass: the AWS settings of a pool's nodes.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::hash;
use super::validation::{Errors, Path};
use crate::quantity::Quantity;

/// The one `instanceStorePolicy`: instance-store disks as one RAID0 array for ephemeral storage.
pub const INSTANCE_STORE_RAID0: &str = "RAID0";

/// The spec of an EC2NodeClass.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "karpenter.k8s.aws",
    version = "v1",
    kind = "EC2NodeClass",
    plural = "ec2nodeclasses",
    shortname = "ec2nc",
    shortname = "ec2ncs",
    category = "karpenter",
    status = "EC2NodeClassStatus",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Role","type":"string","jsonPath":".spec.role","priority":1}"#
)]
#[serde(rename_all = "camelCase")]
pub struct EC2NodeClassSpec {
    /// AMI family (AL2, AL2023, Bottlerocket, Windows2019, Windows2022, Custom);
    /// required unless an amiSelectorTerm has an alias.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ami_family: Option<String>,
    /// How to find the AMI.
    #[serde(default)]
    pub ami_selector_terms: Vec<AmiSelectorTerm>,
    /// How to find subnets.
    #[serde(default)]
    pub subnet_selector_terms: Vec<SelectorTerm>,
    /// How to find security groups.
    #[serde(default)]
    pub security_group_selector_terms: Vec<SelectorTerm>,
    /// How to find capacity reservations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capacity_reservation_selector_terms: Vec<SelectorTerm>,
    /// IAM role for the node's instance profile (one of role / instanceProfile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// An existing instance profile (one of role / instanceProfile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_profile: Option<String>,
    /// User data merged with what nodesmith generates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data: Option<String>,
    /// Tags for instances, volumes and launch templates.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    /// Block device mappings (the root volume defaults to 20Gi gp3).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub block_device_mappings: Vec<BlockDeviceMapping>,
    /// Instance metadata service options.
    #[serde(default)]
    pub metadata_options: MetadataOptions,
    /// Kubelet settings that shape allocatable and eviction. Free-form in the
    /// CRD, as Karpenter's: a key nodesmith does not read is refused by validation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::free_form_object")]
    pub kubelet: Option<KubeletConfiguration>,
    /// Whether instances get a public IPv4 address.
    #[serde(
        default,
        rename = "associatePublicIPAddress",
        skip_serializing_if = "Option::is_none"
    )]
    pub associate_public_ip_address: Option<bool>,
    /// Whether detailed CloudWatch monitoring is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detailed_monitoring: Option<bool>,
    /// How instance store volumes are used (RAID0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_store_policy: Option<String>,
    /// EC2 Fleet context (for ODCR / ABIS integrations).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// The placement group instances launch into, by name or id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement_group_selector: Option<PlacementGroupSelector>,
    /// IPv4 prefixes assigned to the primary network interface.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_prefix_count: Option<i32>,
    /// Network interfaces to attach (EFA); not supported by nodesmith (refused).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network_interfaces: Vec<NetworkInterface>,
    /// Idle connection tracking timeouts of the primary network interface.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_tracking: Option<ConnectionTracking>,
    /// CPU options of the instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_options: Option<CpuOptions>,
}

/// `placementGroupSelector`: exactly one of a name or an id.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacementGroupSelector {
    /// The placement group's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The placement group's id, `pg-...`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

/// One network interface of `networkInterfaces`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkInterface {
    /// The network card it attaches to.
    pub network_card_index: i32,
    /// Its device index.
    pub device_index: i32,
    /// `interface` or `efa-only`.
    pub interface_type: String,
}

/// Idle connection tracking timeouts, in seconds.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConnectionTracking {
    /// Established TCP connections (60..=432000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_established_timeout: Option<i32>,
    /// UDP flows seen in both directions more than once (60..=180).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp_stream_timeout: Option<i32>,
    /// Other UDP flows (30..=60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp_timeout: Option<i32>,
}

/// CPU options.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CpuOptions {
    /// `enabled` or `disabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nested_virtualization: Option<String>,
}

/// Observed state of an EC2NodeClass, as Karpenter v1 writes it: what the
/// selectors resolve to and whether the class can launch (written by the sweep
/// through the status subresource, `nodeclass::conditions`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EC2NodeClassStatus {
    /// Resolved subnets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::free_form_objects")]
    pub subnets: Vec<SubnetStatus>,
    /// Resolved security groups.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::free_form_objects")]
    pub security_groups: Vec<SecurityGroupStatus>,
    /// Resolved AMIs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::free_form_objects")]
    pub amis: Vec<AmiStatus>,
    /// The instance profile in use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_profile: Option<String>,
    /// Capacity reservations the selectors select (active ones).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::free_form_objects")]
    pub capacity_reservations: Vec<CapacityReservationStatus>,
    /// Current conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::free_form_objects")]
    pub conditions: Vec<Condition>,
}

/// `reservationType` of an on-demand capacity reservation.
pub const RESERVATION_DEFAULT: &str = "default";
/// `reservationType` of a capacity block for ML.
pub const RESERVATION_CAPACITY_BLOCK: &str = "capacity-block";

/// A selected capacity reservation in [`EC2NodeClassStatus`], in Karpenter's
/// fields plus how many instances it can still take when last read.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CapacityReservationStatus {
    /// The reservation id, `cr-...`.
    pub id: String,
    /// The instance type it reserves.
    pub instance_type: String,
    /// Its availability zone.
    pub availability_zone: String,
    /// The owning account.
    #[serde(default, rename = "ownerID", skip_serializing_if = "Option::is_none")]
    pub owner_id: Option<String>,
    /// `open` or `targeted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_match_criteria: Option<String>,
    /// `default` or `capacity-block`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation_type: Option<String>,
    /// When it ends (capacity blocks always end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time: Option<String>,
    /// `active` (the only state selected).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Instances it could still take when last read (nodesmith's addition:
    /// the solver plans at most this many nodes into it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_instance_count: Option<u32>,
}

/// A resolved subnet in [`EC2NodeClassStatus`].
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SubnetStatus {
    /// The subnet id.
    pub id: String,
    /// Its availability zone name.
    pub zone: String,
    /// Its availability zone id.
    #[serde(default, rename = "zoneID", skip_serializing_if = "Option::is_none")]
    pub zone_id: Option<String>,
}

/// A resolved security group in [`EC2NodeClassStatus`].
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecurityGroupStatus {
    /// The group id.
    pub id: String,
    /// The group name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// A resolved AMI in [`EC2NodeClassStatus`], with the instance types it serves.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AmiStatus {
    /// The image id.
    pub id: String,
    /// The image name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Node requirements of the instance types that use it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requirements: Vec<StatusRequirement>,
}

/// One requirement of an [`AmiStatus`] (a node selector requirement).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatusRequirement {
    /// The label key.
    pub key: String,
    /// In, NotIn, Exists, DoesNotExist.
    pub operator: String,
    /// The values.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// Karpenter v1's EC2NodeClass condition types.
pub mod condition_types {
    /// True when every other condition is True.
    pub const READY: &str = "Ready";
    /// The subnet selectors select at least one subnet.
    pub const SUBNETS_READY: &str = "SubnetsReady";
    /// The security group selectors select at least one group.
    pub const SECURITY_GROUPS_READY: &str = "SecurityGroupsReady";
    /// The AMI selectors select at least one AMI.
    pub const AMIS_READY: &str = "AMIsReady";
    /// The instance profile is known.
    pub const INSTANCE_PROFILE_READY: &str = "InstanceProfileReady";
    /// The capacity reservation selectors were read (selecting none is fine).
    pub const CAPACITY_RESERVATIONS_READY: &str = "CapacityReservationsReady";
    /// `placementGroupSelector` selects an available placement group (listed when set).
    pub const PLACEMENT_GROUP_READY: &str = "PlacementGroupReady";
    /// EC2 took the class's latest launch (listed once EC2 refused one; not
    /// part of Ready: a refusal is fixed outside the class, and only a later
    /// launch can show it fixed).
    pub const LAUNCH_SUCCEEDED: &str = "LaunchSucceeded";
}

/// A status condition (the shape of `metav1.Condition`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// The condition type (`Ready`, `SubnetsReady`, ...).
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// A CamelCase reason.
    #[serde(default)]
    pub reason: String,
    /// What a person should know.
    #[serde(default)]
    pub message: String,
    /// When the status last changed (RFC 3339).
    #[serde(default)]
    pub last_transition_time: String,
    /// The generation the condition was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// One way to select an AMI.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AmiSelectorTerm {
    /// `family@version`, e.g. `al2023@latest` (must stand alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    /// An AMI id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// An AMI name (wildcards allowed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The AMI owner (account id, `self` or `amazon`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// An SSM parameter that holds the AMI id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssm_parameter: Option<String>,
    /// Tags the AMI must carry.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
}

/// One way to select subnets, security groups or capacity reservations.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SelectorTerm {
    /// Tags the resource must carry (`*` matches any value).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    /// A resource id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// A name (security groups only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Owner account (capacity reservations only).
    #[serde(default, rename = "ownerID", skip_serializing_if = "Option::is_none")]
    pub owner_id: Option<String>,
    /// `open` or `targeted` (capacity reservations only; not supported by nodesmith, refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_match_criteria: Option<String>,
}

/// A block device mapping.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BlockDeviceMapping {
    /// The device name, e.g. /dev/xvda.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_name: Option<String>,
    /// The EBS volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ebs: Option<BlockDevice>,
    /// Whether this is the root volume (at most one).
    #[serde(default)]
    pub root_volume: bool,
}

/// An EBS volume.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BlockDevice {
    /// Delete on instance termination.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_on_termination: Option<bool>,
    /// Encrypt the volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encrypted: Option<bool>,
    /// Provisioned IOPS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops: Option<i64>,
    /// KMS key for encryption.
    #[serde(default, rename = "kmsKeyID", skip_serializing_if = "Option::is_none")]
    pub kms_key_id: Option<String>,
    /// Snapshot to restore from.
    #[serde(default, rename = "snapshotID", skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<String>,
    /// Throughput in MiB/s (gp3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throughput: Option<i64>,
    /// MiB/s at which the snapshot's blocks are read into the volume (100..=300; needs snapshotID).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_initialization_rate: Option<i32>,
    /// Size, as a quantity (e.g. 100Gi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_size: Option<Quantity>,
    /// gp2, gp3, io1, io2, sc1, st1, standard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_type: Option<String>,
}

/// Instance metadata service options (defaults as Karpenter's).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetadataOptions {
    /// enabled or disabled.
    #[serde(default = "enabled")]
    pub http_endpoint: String,
    /// IPv6 endpoint: enabled or disabled.
    #[serde(default = "disabled", rename = "httpProtocolIPv6")]
    pub http_protocol_ipv6: String,
    /// PUT response hop limit (1..=64).
    #[serde(default = "one")]
    pub http_put_response_hop_limit: i64,
    /// required or optional (IMDSv2).
    #[serde(default = "required")]
    pub http_tokens: String,
}

fn enabled() -> String {
    "enabled".into()
}
fn disabled() -> String {
    "disabled".into()
}
fn one() -> i64 {
    1
}
fn required() -> String {
    "required".into()
}

impl Default for MetadataOptions {
    fn default() -> Self {
        MetadataOptions {
            http_endpoint: enabled(),
            http_protocol_ipv6: disabled(),
            http_put_response_hop_limit: 1,
            http_tokens: required(),
        }
    }
}

/// Kubelet settings (the EC2NodeClass `kubelet` block).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubeletConfiguration {
    /// Cluster DNS server addresses.
    #[serde(default, rename = "clusterDNS", skip_serializing_if = "Vec::is_empty")]
    pub cluster_dns: Vec<String>,
    /// Maximum pods per node (overrides the ENI-based value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pods: Option<i64>,
    /// Pods per vCPU (the lower of this and maxPods wins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods_per_core: Option<i64>,
    /// Resources reserved for system daemons.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub system_reserved: BTreeMap<String, String>,
    /// Resources reserved for Kubernetes daemons (overrides the formula).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kube_reserved: BTreeMap<String, String>,
    /// Hard eviction thresholds.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub eviction_hard: BTreeMap<String, String>,
    /// Soft eviction thresholds.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub eviction_soft: BTreeMap<String, String>,
    /// Grace periods for soft thresholds.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub eviction_soft_grace_period: BTreeMap<String, String>,
    /// Longest grace period for soft evictions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction_max_pod_grace_period: Option<i64>,
    /// Disk usage that triggers image GC.
    #[serde(
        default,
        rename = "imageGCHighThresholdPercent",
        skip_serializing_if = "Option::is_none"
    )]
    pub image_gc_high_threshold_percent: Option<i64>,
    /// Disk usage image GC frees down to.
    #[serde(
        default,
        rename = "imageGCLowThresholdPercent",
        skip_serializing_if = "Option::is_none"
    )]
    pub image_gc_low_threshold_percent: Option<i64>,
    /// Enforce CPU CFS quota.
    #[serde(default, rename = "cpuCFSQuota", skip_serializing_if = "Option::is_none")]
    pub cpu_cfs_quota: Option<bool>,
    /// Any other KubeletConfiguration field: kept so validation can name it (refused).
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// What validation says of a Karpenter field nodesmith does not build.
pub const UNSUPPORTED: &str = "is not supported by nodesmith: the class is not used to launch";

/// Whether `id` is `prefix` then one or more of `[0-9a-z]`.
fn is_id(id: &str, prefix: &str) -> bool {
    id.strip_prefix(prefix)
        .is_some_and(|r| !r.is_empty() && r.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()))
}

const RESERVED_KEYS: &[&str] = &["cpu", "memory", "ephemeral-storage", "pid"];
const EVICTION_SIGNALS: &[&str] = &[
    "memory.available",
    "nodefs.available",
    "nodefs.inodesFree",
    "imagefs.available",
    "imagefs.inodesFree",
    "pid.available",
];
const AMI_FAMILIES: &[&str] = &["AL2", "AL2023", "Bottlerocket", "Windows2019", "Windows2022", "Custom"];
const ALIAS_FAMILIES: &[&str] = &["al2", "al2023", "bottlerocket", "windows2019", "windows2022"];
const RESTRICTED_TAGS: &[&str] = &[
    "karpenter.sh/nodepool",
    "eks:eks-cluster-name",
    "karpenter.sh/nodeclaim",
    "karpenter.k8s.aws/ec2nodeclass",
];

/// Version of [`EC2NodeClass::hash`]'s field set and format, stamped beside the hash
/// (`karpenter.k8s.aws/ec2nodeclass-hash-version`). Bump it when a hashed field is added
/// or removed, a hashed default changes, or the format changes. Deliberately not
/// Karpenter's (`v4`): the digests differ, so hashes Karpenter stamped are never compared with ours.
pub const EC2NODECLASS_HASH_VERSION: &str = "nodesmith-v1";

impl EC2NodeClass {
    /// The status condition of this type, if written.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)
    }

    /// False when the status says the class cannot launch (`Ready=False`);
    /// true when Ready or not judged yet (no status: a new class is not held back).
    pub fn may_launch(&self) -> bool {
        self.condition(condition_types::READY)
            .is_none_or(|c| c.status != "False")
    }

    /// The static-drift hash of the class (16 hex digits; see [`EC2NODECLASS_HASH_VERSION`]).
    ///
    /// As Karpenter's AWS provider v1 (`EC2NodeClass.Hash()`): the spec, except the fields it
    /// tags `hash:"ignore"` — amiSelectorTerms, subnetSelectorTerms, securityGroupSelectorTerms
    /// and capacityReservationSelectorTerms, which its Drift docs list as drifted dynamically
    /// (the resolved AMI, subnet or security group is compared with the instance's, so a
    /// changed term that selects the same resources is no drift), and the literal amiFamily,
    /// replaced by the family in force. Hashed: AMI family, userData, role, instanceProfile,
    /// tags, kubelet, blockDeviceMappings (a set), metadataOptions, associatePublicIPAddress,
    /// detailedMonitoring, instanceStorePolicy and context, and when set placementGroupSelector,
    /// networkInterfaces, connectionTracking and cpuOptions (ipPrefixCount is not). Defaults count as spelled out:
    /// metadataOptions' are applied when the manifest is read, and detailedMonitoring `false`,
    /// an empty userData or kubelet block hash as unset. associatePublicIPAddress `false` does
    /// not hash as unset (unset lets the subnet decide), unlike Karpenter's zero-value rule.
    /// Differs from Karpenter where the family in force differs: an alias wins over amiFamily
    /// here, as launch does ([`EC2NodeClass::ami_family`]).
    pub fn hash(&self) -> String {
        let s = &self.spec;
        let non_empty = |v: &Option<String>| v.clone().filter(|v| !v.is_empty());
        let mut hashed = serde_json::json!({
            "amiFamily": self.ami_family(),
            "userData": non_empty(&s.user_data),
            "role": non_empty(&s.role),
            "instanceProfile": non_empty(&s.instance_profile),
            "tags": s.tags,
            "kubelet": s.kubelet,
            "blockDeviceMappings": hash::set(
                s.block_device_mappings.iter().map(|b| serde_json::to_value(b).unwrap_or_default())
            ),
            "metadataOptions": s.metadata_options,
            "associatePublicIPAddress": s.associate_public_ip_address,
            "detailedMonitoring": s.detailed_monitoring.filter(|m| *m),
            "instanceStorePolicy": non_empty(&s.instance_store_policy),
            "context": non_empty(&s.context),
        });
        // Hashed as Karpenter does (ipPrefixCount is not), and only when set:
        // a class without them keeps the hash it had before they existed.
        let later = [
            (
                "placementGroupSelector",
                serde_json::to_value(&s.placement_group_selector),
            ),
            ("networkInterfaces", serde_json::to_value(&s.network_interfaces)),
            ("connectionTracking", serde_json::to_value(&s.connection_tracking)),
            ("cpuOptions", serde_json::to_value(&s.cpu_options)),
        ];
        for (k, v) in later {
            if let (Some(o), Ok(v)) = (hashed.as_object_mut(), v)
                && !v.is_null()
                && v != serde_json::json!([])
            {
                o.insert(k.into(), v);
            }
        }
        hash::digest(&hashed)
    }

    /// The class's name.
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    /// The AMI family in force: the alias's family, else `amiFamily`.
    pub fn ami_family(&self) -> Option<String> {
        self.spec
            .ami_selector_terms
            .iter()
            .find_map(|t| t.alias.as_deref())
            .and_then(|a| a.split_once('@'))
            .map(|(fam, _)| match fam {
                "al2" => "AL2".to_string(),
                "al2023" => "AL2023".to_string(),
                "bottlerocket" => "Bottlerocket".to_string(),
                "windows2019" => "Windows2019".to_string(),
                "windows2022" => "Windows2022".to_string(),
                other => other.to_string(),
            })
            .or_else(|| self.spec.ami_family.clone())
    }

    /// The capacity reservations this class's status lists as active: the
    /// solver's reserved offerings (none when the class selects none).
    pub fn reserved_capacity(&self) -> Vec<CapacityReservationStatus> {
        if self.spec.capacity_reservation_selector_terms.is_empty() {
            return Vec::new();
        }
        self.status
            .iter()
            .flat_map(|s| &s.capacity_reservations)
            .filter(|r| r.state.as_deref().is_none_or(|st| st == "active"))
            .cloned()
            .collect()
    }

    /// Checks what Karpenter's CRD validation checks; errors name the field path.
    pub fn validate(&self) -> Result<(), Errors> {
        let mut errs = Errors::new("EC2NodeClass", self.name());
        if self.name().is_empty() {
            errs.push(Path::root("metadata").field("name"), "is required");
        }
        self.spec.validate(&mut errs, &Path::root("spec"));
        errs.into_result()
    }
}

impl EC2NodeClassSpec {
    fn validate(&self, errs: &mut Errors, p: &Path) {
        self.validate_ami_selection(errs, p);
        let terms = p.field("amiSelectorTerms");
        for (i, t) in self.ami_selector_terms.iter().enumerate() {
            t.validate(errs, &terms.index(i));
        }
        let selectors = [
            (
                "subnetSelectorTerms",
                &self.subnet_selector_terms,
                "subnet-",
                false,
                true,
            ),
            (
                "securityGroupSelectorTerms",
                &self.security_group_selector_terms,
                "sg-",
                true,
                true,
            ),
            (
                "capacityReservationSelectorTerms",
                &self.capacity_reservation_selector_terms,
                "cr-",
                false,
                false,
            ),
        ];
        for (field, list, id_prefix, allow_name, required) in selectors {
            let lp = p.field(field);
            if required && (list.is_empty() || list.len() > 30) {
                errs.push(lp.clone(), "must have between 1 and 30 terms");
            }
            for (i, t) in list.iter().enumerate() {
                t.validate(errs, &lp.index(i), id_prefix, allow_name);
            }
        }
        if self.role.is_some() == self.instance_profile.is_some() {
            errs.push(p.clone(), "must specify exactly one of ['role', 'instanceProfile']");
        }
        for k in self.tags.keys() {
            if k.starts_with("kubernetes.io/cluster") || RESTRICTED_TAGS.contains(&k.as_str()) {
                errs.push(p.field("tags").key(k), format!("tag {k:?} is restricted"));
            }
        }
        self.validate_block_device_mappings(errs, &p.field("blockDeviceMappings"));
        self.metadata_options.validate(errs, &p.field("metadataOptions"));
        if let Some(k) = &self.kubelet {
            k.validate(errs, &p.field("kubelet"));
        }
        if let Some(policy) = &self.instance_store_policy
            && policy != INSTANCE_STORE_RAID0
        {
            errs.push(p.field("instanceStorePolicy"), format!("must be RAID0, got {policy:?}"));
        }
        self.validate_launch_shape(errs, p);
        self.refuse_unsupported(errs, p);
    }

    /// Karpenter's CRD rules for the fields that shape the launch template
    /// beyond the classic ones: placement group, prefixes, connection tracking, CPU.
    fn validate_launch_shape(&self, errs: &mut Errors, p: &Path) {
        if let Some(pg) = &self.placement_group_selector {
            let pp = p.field("placementGroupSelector");
            match (&pg.name, &pg.id) {
                (None, None) => errs.push(pp, "expected at least one, got none, ['name', 'id']"),
                (Some(_), Some(_)) => errs.push(pp, "'name' and 'id' are mutually exclusive"),
                (Some(n), None) if n.is_empty() => errs.push(pp.field("name"), "must not be empty"),
                (None, Some(id)) if !is_id(id, "pg-") => {
                    errs.push(pp.field("id"), format!("must match pg-[0-9a-z]+, got {id:?}"))
                }
                _ => {}
            }
        }
        if self.ip_prefix_count.is_some_and(|n| n < 0) {
            errs.push(p.field("ipPrefixCount"), "must be at least 0");
        }
        if let Some(ct) = &self.connection_tracking {
            let cp = p.field("connectionTracking");
            if ct.tcp_established_timeout.is_none() && ct.udp_stream_timeout.is_none() && ct.udp_timeout.is_none() {
                errs.push(
                    cp.clone(),
                    "at least one of tcpEstablishedTimeout, udpStreamTimeout, or udpTimeout must be set",
                );
            }
            for (field, v, range) in [
                ("tcpEstablishedTimeout", ct.tcp_established_timeout, 60..=432_000),
                ("udpStreamTimeout", ct.udp_stream_timeout, 60..=180),
                ("udpTimeout", ct.udp_timeout, 30..=60),
            ] {
                if v.is_some_and(|v| !range.contains(&v)) {
                    errs.push(
                        cp.field(field),
                        format!("must be between {} and {}", range.start(), range.end()),
                    );
                }
            }
        }
        if let Some(nv) = self.cpu_options.as_ref().and_then(|c| c.nested_virtualization.as_ref())
            && !["enabled", "disabled"].contains(&nv.as_str())
        {
            errs.push(
                p.field("cpuOptions").field("nestedVirtualization"),
                format!("must be one of [\"enabled\", \"disabled\"], got {nv:?}"),
            );
        }
    }

    /// Karpenter v1 fields nodesmith does not build: named, so the class's
    /// status says which, and the class is not launched from (launching
    /// without them would give nodes other than the ones asked for).
    fn refuse_unsupported(&self, errs: &mut Errors, p: &Path) {
        if !self.network_interfaces.is_empty() {
            errs.push(p.field("networkInterfaces"), UNSUPPORTED);
        }
        for (i, t) in self.capacity_reservation_selector_terms.iter().enumerate() {
            if t.instance_match_criteria.is_some() {
                errs.push(
                    p.field("capacityReservationSelectorTerms")
                        .index(i)
                        .field("instanceMatchCriteria"),
                    UNSUPPORTED,
                );
            }
        }
        for k in self.kubelet.iter().flat_map(|k| k.other.keys()) {
            errs.push(p.field("kubelet").field(k), UNSUPPORTED);
        }
    }

    /// The AMI family and the selector terms as a list: how many, and an
    /// alias alone or a family beside them.
    fn validate_ami_selection(&self, errs: &mut Errors, p: &Path) {
        if let Some(f) = &self.ami_family
            && !AMI_FAMILIES.contains(&f.as_str())
        {
            errs.push(
                p.field("amiFamily"),
                format!("must be one of {AMI_FAMILIES:?}, got {f:?}"),
            );
        }
        let terms = p.field("amiSelectorTerms");
        let n = self.ami_selector_terms.len();
        if n == 0 || n > 30 {
            errs.push(terms.clone(), "must have between 1 and 30 terms");
        }
        let has_alias = self.ami_selector_terms.iter().any(|t| t.alias.is_some());
        if has_alias && n > 1 {
            errs.push(
                terms,
                "'alias' is mutually exclusive, cannot be set with a combination of other amiSelectorTerms",
            );
        }
        if !has_alias && self.ami_family.is_none() && n > 0 {
            errs.push(p.field("amiFamily"), "is required when amiSelectorTerms have no alias");
        }
    }

    /// The mappings as a list (one root volume, at most 50), then each.
    fn validate_block_device_mappings(&self, errs: &mut Errors, p: &Path) {
        let roots = self.block_device_mappings.iter().filter(|b| b.root_volume).count();
        if roots > 1 {
            errs.push(p.clone(), "must have only one blockDeviceMapping with rootVolume");
        }
        if self.block_device_mappings.len() > 50 {
            errs.push(p.clone(), "may have at most 50 items");
        }
        for (i, b) in self.block_device_mappings.iter().enumerate() {
            if let Some(ebs) = &b.ebs {
                ebs.validate(errs, &p.index(i).field("ebs"));
            }
        }
    }
}

impl AmiSelectorTerm {
    fn validate(&self, errs: &mut Errors, p: &Path) {
        let set = [
            self.alias.is_some(),
            self.id.is_some(),
            self.name.is_some(),
            self.ssm_parameter.is_some(),
            !self.tags.is_empty(),
        ];
        if !set.iter().any(|x| *x) {
            errs.push(
                p.clone(),
                "expected at least one, got none, ['tags', 'id', 'name', 'alias', 'ssmParameter']",
            );
        }
        if let Some(a) = &self.alias {
            if set.iter().filter(|x| **x).count() > 1 || self.owner.is_some() {
                errs.push(
                    p.field("alias"),
                    "'alias' is mutually exclusive, cannot be set with a combination of other fields",
                );
            }
            match a.split_once('@') {
                Some((fam, ver)) if ALIAS_FAMILIES.contains(&fam) && !ver.is_empty() => {}
                _ => errs.push(
                    p.field("alias"),
                    format!("must be family@version with family in {ALIAS_FAMILIES:?}, got {a:?}"),
                ),
            }
        }
        if let Some(id) = &self.id {
            if !(id.starts_with("ami-") && id.len() > 4 && id[4..].bytes().all(|c| c.is_ascii_alphanumeric())) {
                errs.push(p.field("id"), format!("must match ami-[0-9a-z]+, got {id:?}"));
            }
            if self.name.is_some() || !self.tags.is_empty() || self.ssm_parameter.is_some() {
                errs.push(
                    p.field("id"),
                    "'id' is mutually exclusive, cannot be set with a combination of other fields",
                );
            }
        }
        validate_tags(errs, &p.field("tags"), &self.tags);
    }
}

impl SelectorTerm {
    /// One subnet, security group or capacity reservation term: ids start
    /// with `id_prefix`; names only where `allow_name`.
    fn validate(&self, errs: &mut Errors, p: &Path, id_prefix: &str, allow_name: bool) {
        // Capacity reservation terms may select by instanceMatchCriteria alone.
        let reservations = id_prefix == "cr-";
        let criteria = reservations && self.instance_match_criteria.is_some();
        if self.tags.is_empty() && self.id.is_none() && self.name.is_none() && !criteria {
            errs.push(
                p.clone(),
                match (allow_name, reservations) {
                    (true, _) => "expected at least one, got none, ['tags', 'id', 'name']",
                    (false, true) => "expected at least one, got none, ['tags', 'id', 'instanceMatchCriteria']",
                    (false, false) => "expected at least one, got none, ['tags', 'id']",
                },
            );
        }
        if self.name.is_some() && !allow_name {
            errs.push(p.field("name"), "is not supported here");
        }
        match &self.instance_match_criteria {
            Some(_) if !reservations => errs.push(p.field("instanceMatchCriteria"), "is not supported here"),
            Some(c) if !["open", "targeted"].contains(&c.as_str()) => errs.push(
                p.field("instanceMatchCriteria"),
                format!("must be one of [\"open\", \"targeted\"], got {c:?}"),
            ),
            _ => {}
        }
        if let Some(id) = &self.id {
            let ok = id
                .strip_prefix(id_prefix)
                .is_some_and(|r| !r.is_empty() && r.bytes().all(|c| c.is_ascii_alphanumeric()));
            if !ok {
                errs.push(p.field("id"), format!("must match {id_prefix}[0-9a-z]+, got {id:?}"));
            }
            if !self.tags.is_empty() || self.name.is_some() || criteria {
                errs.push(
                    p.field("id"),
                    "'id' is mutually exclusive, cannot be set with a combination of other fields",
                );
            }
        }
        validate_tags(errs, &p.field("tags"), &self.tags);
    }
}

impl BlockDevice {
    fn validate(&self, errs: &mut Errors, p: &Path) {
        if let Some(t) = &self.volume_type
            && !["standard", "io1", "io2", "gp2", "sc1", "st1", "gp3"].contains(&t.as_str())
        {
            errs.push(p.field("volumeType"), format!("unsupported volume type {t:?}"));
        }
        if self.snapshot_id.is_none() && self.volume_size.is_none() {
            errs.push(p.clone(), "must specify snapshotID or volumeSize");
        }
        if let Some(rate) = self.volume_initialization_rate {
            if !(100..=300).contains(&rate) {
                errs.push(p.field("volumeInitializationRate"), "must be between 100 and 300");
            }
            if self.snapshot_id.as_deref().is_none_or(str::is_empty) {
                errs.push(
                    p.field("volumeInitializationRate"),
                    "snapshotID must be set when volumeInitializationRate is set",
                );
            }
        }
    }
}

impl MetadataOptions {
    fn validate(&self, errs: &mut Errors, p: &Path) {
        for (field, v, allowed) in [
            ("httpEndpoint", &self.http_endpoint, &["enabled", "disabled"][..]),
            (
                "httpProtocolIPv6",
                &self.http_protocol_ipv6,
                &["enabled", "disabled"][..],
            ),
            ("httpTokens", &self.http_tokens, &["required", "optional"][..]),
        ] {
            if !allowed.contains(&v.as_str()) {
                errs.push(p.field(field), format!("must be one of {allowed:?}, got {v:?}"));
            }
        }
        if !(1..=64).contains(&self.http_put_response_hop_limit) {
            errs.push(p.field("httpPutResponseHopLimit"), "must be between 1 and 64");
        }
    }
}

fn validate_tags(errs: &mut Errors, p: &Path, tags: &std::collections::BTreeMap<String, String>) {
    for (k, v) in tags {
        if k.is_empty() || v.is_empty() {
            errs.push(p.key(k), "empty tag keys or values aren't supported");
        }
    }
}

impl KubeletConfiguration {
    fn validate(&self, errs: &mut Errors, p: &Path) {
        if self.max_pods.is_some_and(|m| m < 0) {
            errs.push(p.field("maxPods"), "must be non-negative");
        }
        if self.pods_per_core.is_some_and(|m| m < 0) {
            errs.push(p.field("podsPerCore"), "must be non-negative");
        }
        for (field, map) in [
            ("systemReserved", &self.system_reserved),
            ("kubeReserved", &self.kube_reserved),
        ] {
            for (k, v) in map {
                if !RESERVED_KEYS.contains(&k.as_str()) {
                    errs.push(p.field(field).key(k), format!("valid keys are {RESERVED_KEYS:?}"));
                } else if Quantity::parse(v).map_or(true, |q| q.milli() < 0) {
                    errs.push(p.field(field).key(k), format!("{v:?} is not a non-negative quantity"));
                }
            }
        }
        for (field, map) in [
            ("evictionHard", &self.eviction_hard),
            ("evictionSoft", &self.eviction_soft),
            ("evictionSoftGracePeriod", &self.eviction_soft_grace_period),
        ] {
            for (k, v) in map {
                if !EVICTION_SIGNALS.contains(&k.as_str()) {
                    errs.push(p.field(field).key(k), format!("valid keys are {EVICTION_SIGNALS:?}"));
                } else if field != "evictionSoftGracePeriod" && !is_threshold(v) {
                    errs.push(p.field(field).key(k), format!("{v:?} is not a quantity or percentage"));
                }
            }
        }
        for k in self.eviction_soft.keys() {
            if !self.eviction_soft_grace_period.contains_key(k) {
                errs.push(
                    p.field("evictionSoftGracePeriod"),
                    format!("evictionSoft {k:?} needs a matching grace period"),
                );
            }
        }
        if let (Some(h), Some(l)) = (
            self.image_gc_high_threshold_percent,
            self.image_gc_low_threshold_percent,
        ) && l >= h
        {
            errs.push(
                p.field("imageGCLowThresholdPercent"),
                "must be less than imageGCHighThresholdPercent",
            );
        }
        for (field, v) in [
            ("imageGCHighThresholdPercent", self.image_gc_high_threshold_percent),
            ("imageGCLowThresholdPercent", self.image_gc_low_threshold_percent),
        ] {
            if v.is_some_and(|v| !(0..=100).contains(&v)) {
                errs.push(p.field(field), "must be between 0 and 100");
            }
        }
    }
}

fn is_threshold(v: &str) -> bool {
    match v.strip_suffix('%') {
        Some(p) => p.parse::<f64>().is_ok_and(|f| (0.0..=100.0).contains(&f)),
        None => Quantity::parse(v).is_ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASHED_CLASS: &str = r#"
apiVersion: karpenter.k8s.aws/v1
kind: EC2NodeClass
metadata: {name: hashed}
spec:
  amiSelectorTerms: [{alias: al2023@latest}]
  subnetSelectorTerms: [{tags: {karpenter.sh/discovery: demo}}]
  securityGroupSelectorTerms: [{tags: {karpenter.sh/discovery: demo}}]
  role: KarpenterNodeRole-demo
  userData: "echo hello"
  tags: {team: platform, cost-center: "42"}
  kubelet: {maxPods: 110, systemReserved: {cpu: 100m}}
  blockDeviceMappings:
    - {deviceName: /dev/xvda, rootVolume: true, ebs: {volumeSize: 100Gi, volumeType: gp3, encrypted: true}}
    - {deviceName: /dev/xvdb, ebs: {volumeSize: 50Gi, volumeType: gp3}}
  metadataOptions: {httpTokens: required, httpPutResponseHopLimit: 2}
  associatePublicIPAddress: false
  detailedMonitoring: true
  instanceStorePolicy: RAID0
"#;

    fn hashed_class() -> EC2NodeClass {
        serde_yaml_ng::from_str(HASHED_CLASS).unwrap()
    }

    type Edit = (&'static str, fn(&mut EC2NodeClassSpec));

    fn ebs(b: &mut BlockDeviceMapping) -> &mut BlockDevice {
        b.ebs.get_or_insert_with(Default::default)
    }

    #[test]
    fn hash_changes_with_every_hashed_field() {
        let edits: &[Edit] = &[
            ("AMI family from the alias", |s| {
                s.ami_selector_terms[0].alias = Some("bottlerocket@latest".into())
            }),
            ("AMI family without an alias", |s| {
                s.ami_selector_terms = vec![AmiSelectorTerm {
                    id: Some("ami-0123".into()),
                    ..Default::default()
                }];
                s.ami_family = Some("AL2".into());
            }),
            ("userData", |s| s.user_data = Some("echo bye".into())),
            ("userData unset", |s| s.user_data = None),
            ("role", |s| s.role = Some("OtherRole".into())),
            ("instanceProfile instead of role", |s| {
                s.role = None;
                s.instance_profile = Some("KarpenterNodeRole-demo".into());
            }),
            ("tag value", |s| {
                s.tags.insert("team".into(), "data".into());
            }),
            ("tag added", |s| {
                s.tags.insert("env".into(), "prod".into());
            }),
            ("kubelet maxPods", |s| {
                if let Some(k) = s.kubelet.as_mut() {
                    k.max_pods = Some(58)
                }
            }),
            ("kubelet unset", |s| s.kubelet = None),
            ("volume size", |s| {
                ebs(&mut s.block_device_mappings[0]).volume_size = Quantity::parse("200Gi").ok()
            }),
            ("volume type", |s| {
                ebs(&mut s.block_device_mappings[1]).volume_type = Some("io2".into())
            }),
            ("volume removed", |s| {
                s.block_device_mappings.pop();
            }),
            ("root volume flag", |s| s.block_device_mappings[0].root_volume = false),
            ("metadata hop limit", |s| {
                s.metadata_options.http_put_response_hop_limit = 1
            }),
            ("metadata tokens", |s| {
                s.metadata_options.http_tokens = "optional".into()
            }),
            ("metadata endpoint", |s| {
                s.metadata_options.http_endpoint = "disabled".into()
            }),
            ("public IP on", |s| s.associate_public_ip_address = Some(true)),
            ("public IP left to the subnet", |s| s.associate_public_ip_address = None),
            ("detailed monitoring off", |s| s.detailed_monitoring = Some(false)),
            ("instance store policy unset", |s| s.instance_store_policy = None),
            ("context", |s| s.context = Some("ctx-1".into())),
            ("placement group", |s| {
                s.placement_group_selector = Some(PlacementGroupSelector {
                    name: Some("pg".into()),
                    id: None,
                })
            }),
            ("connection tracking", |s| {
                s.connection_tracking = Some(ConnectionTracking {
                    udp_timeout: Some(30),
                    ..Default::default()
                })
            }),
            ("cpu options", |s| {
                s.cpu_options = Some(CpuOptions {
                    nested_virtualization: Some("enabled".into()),
                })
            }),
            ("network interfaces", |s| {
                s.network_interfaces = vec![NetworkInterface {
                    interface_type: "interface".into(),
                    ..Default::default()
                }]
            }),
            ("volume initialization rate", |s| {
                ebs(&mut s.block_device_mappings[1]).volume_initialization_rate = Some(100)
            }),
        ];
        let base = hashed_class().hash();
        let mut seen = std::collections::BTreeSet::from([base.clone()]);
        for (what, edit) in edits {
            let mut c = hashed_class();
            edit(&mut c.spec);
            let h = c.hash();
            assert_ne!(h, base, "{what} must change the hash");
            assert!(seen.insert(h), "{what} collides with another edit");
        }
    }

    #[test]
    fn karpenter_v1_14_launch_fields_are_checked_and_the_unbuilt_ones_refused_by_name() {
        let with = |extra: &str| {
            let y = format!(
                "apiVersion: karpenter.k8s.aws/v1\nkind: EC2NodeClass\nmetadata: {{name: c}}\nspec:\n  \
                 role: R\n  amiSelectorTerms: [{{alias: al2023@latest}}]\n  \
                 subnetSelectorTerms: [{{id: subnet-1}}]\n  securityGroupSelectorTerms: [{{id: sg-1}}]\n{extra}"
            );
            serde_yaml_ng::from_str::<EC2NodeClass>(&y).unwrap()
        };
        let ok = "  placementGroupSelector: {id: pg-0abc}\n  ipPrefixCount: 1\n  \
                  connectionTracking: {udpTimeout: 30}\n  cpuOptions: {nestedVirtualization: disabled}\n  \
                  capacityReservationSelectorTerms: [{tags: {a: b}}]\n  \
                  blockDeviceMappings: [{ebs: {snapshotID: snap-1, volumeInitializationRate: 100}}]\n";
        assert_eq!(with(ok).validate(), Ok(()));
        let cases = [
            ("  placementGroupSelector: {}\n", "spec.placementGroupSelector"),
            (
                "  placementGroupSelector: {name: a, id: pg-1}\n",
                "spec.placementGroupSelector",
            ),
            (
                "  placementGroupSelector: {id: group-1}\n",
                "spec.placementGroupSelector.id",
            ),
            ("  ipPrefixCount: -1\n", "spec.ipPrefixCount"),
            ("  connectionTracking: {}\n", "spec.connectionTracking"),
            (
                "  connectionTracking: {udpTimeout: 61}\n",
                "spec.connectionTracking.udpTimeout",
            ),
            (
                "  cpuOptions: {nestedVirtualization: on}\n",
                "spec.cpuOptions.nestedVirtualization",
            ),
            (
                "  blockDeviceMappings: [{ebs: {volumeSize: 1Gi, volumeInitializationRate: 200}}]\n",
                "spec.blockDeviceMappings[0].ebs.volumeInitializationRate",
            ),
            (
                "  networkInterfaces: [{networkCardIndex: 0, deviceIndex: 0, interfaceType: interface}]\n",
                "spec.networkInterfaces: is not supported by nodesmith",
            ),
            (
                "  capacityReservationSelectorTerms: [{instanceMatchCriteria: open}]\n",
                "spec.capacityReservationSelectorTerms[0].instanceMatchCriteria: is not supported by nodesmith",
            ),
            (
                "  kubelet: {maxPods: 10, topologyManagerPolicy: none}\n",
                "spec.kubelet.topologyManagerPolicy: is not supported by nodesmith",
            ),
        ];
        for (extra, named) in cases {
            let err = with(extra).validate().unwrap_err().to_string();
            assert!(err.contains(named), "{extra}: {err}");
        }
        // A kubelet field nodesmith does not read is kept, so its name reaches the status.
        let k = with("  kubelet: {maxPods: 10, topologyManagerPolicy: none}\n");
        let back = serde_json::to_value(&k.spec.kubelet).unwrap();
        assert_eq!(
            back,
            serde_json::json!({"maxPods": 10, "topologyManagerPolicy": "none"})
        );
    }

    #[test]
    fn hash_leaves_dynamic_selectors_to_dynamic_drift() {
        let edits: &[Edit] = &[
            ("AMI alias version (same family)", |s| {
                s.ami_selector_terms[0].alias = Some("al2023@v20250101".into())
            }),
            ("amiFamily spelled out as the alias's", |s| {
                s.ami_family = Some("AL2023".into())
            }),
            ("subnet selector", |s| {
                s.subnet_selector_terms[0].id = Some("subnet-0abc".into())
            }),
            ("subnet terms added", |s| {
                s.subnet_selector_terms.push(SelectorTerm {
                    id: Some("subnet-0def".into()),
                    ..Default::default()
                })
            }),
            ("security group selector", |s| {
                s.security_group_selector_terms[0].name = Some("nodes".into())
            }),
            ("capacity reservation selector", |s| {
                s.capacity_reservation_selector_terms.push(SelectorTerm {
                    id: Some("cr-0abc".into()),
                    ..Default::default()
                })
            }),
            ("block device order", |s| s.block_device_mappings.reverse()),
            ("ipPrefixCount (Karpenter does not hash it)", |s| {
                s.ip_prefix_count = Some(2)
            }),
        ];
        let base = hashed_class().hash();
        for (what, edit) in edits {
            let mut c = hashed_class();
            edit(&mut c.spec);
            assert_eq!(c.hash(), base, "{what} must not change the hash");
        }
        let mut renamed = hashed_class();
        renamed.metadata.name = Some("other".into());
        assert_eq!(renamed.hash(), base, "the name is not hashed");
    }

    #[test]
    fn hash_ignores_key_order_and_spelled_out_defaults() {
        let reordered = r#"
spec:
  instanceStorePolicy: RAID0
  detailedMonitoring: true
  associatePublicIPAddress: false
  metadataOptions: {httpPutResponseHopLimit: 2, httpEndpoint: enabled, httpProtocolIPv6: disabled}
  blockDeviceMappings:
    - {ebs: {volumeType: gp3, volumeSize: "53687091200"}, deviceName: /dev/xvdb}
    - {rootVolume: true, ebs: {encrypted: true, volumeType: gp3, volumeSize: 100Gi}, deviceName: /dev/xvda}
  kubelet: {systemReserved: {cpu: 100m}, maxPods: 110}
  tags: {cost-center: "42", team: platform}
  userData: "echo hello"
  role: KarpenterNodeRole-demo
  securityGroupSelectorTerms: [{tags: {karpenter.sh/discovery: demo}}]
  subnetSelectorTerms: [{tags: {karpenter.sh/discovery: demo}}]
  amiSelectorTerms: [{alias: al2023@latest}]
metadata: {name: hashed}
kind: EC2NodeClass
apiVersion: karpenter.k8s.aws/v1
"#;
        let c: EC2NodeClass = serde_yaml_ng::from_str(reordered).unwrap();
        assert_eq!(c.hash(), hashed_class().hash());

        let minimal = |extra: &str| {
            let y = format!(
                "apiVersion: karpenter.k8s.aws/v1\nkind: EC2NodeClass\nmetadata: {{name: m}}\nspec:\n  \
                 role: R\n  amiSelectorTerms: [{{alias: al2023@latest}}]\n{extra}"
            );
            serde_yaml_ng::from_str::<EC2NodeClass>(&y).unwrap().hash()
        };
        let defaults = "  metadataOptions: {httpEndpoint: enabled, httpProtocolIPv6: disabled, \
                        httpPutResponseHopLimit: 1, httpTokens: required}\n  detailedMonitoring: false\n  \
                        kubelet: {}\n  tags: {}\n  blockDeviceMappings: []\n  userData: \"\"\n";
        assert_eq!(minimal(""), minimal(defaults));
        assert_ne!(minimal(""), minimal("  associatePublicIPAddress: false\n"));
    }
}
