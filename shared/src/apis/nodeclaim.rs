//! `karpenter.sh/v1` NodeClaim, the Kubernetes object: the shape of Karpenter's
//! CRD, so `kubectl get nodeclaims` works as it does with Karpenter. nodesmith's
//! own record of a claim is [`crate::nodeclaim::NodeClaim`] (in DynamoDB); this
//! type is only the API object and its CRD.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Taint;
use super::duration::NillableDuration;
use super::ec2nodeclass::Condition;
use super::nodepool::{NodeClassReference, NodeSelectorRequirementWithMinValues};
use crate::quantity::Quantity;

/// The spec of a NodeClaim object.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "karpenter.sh",
    version = "v1",
    kind = "NodeClaim",
    root = "NodeClaimObject",
    plural = "nodeclaims",
    category = "karpenter",
    status = "NodeClaimObjectStatus",
    printcolumn = r#"{"name":"Type","type":"string","jsonPath":".metadata.labels.node\\.kubernetes\\.io/instance-type"}"#,
    printcolumn = r#"{"name":"Capacity","type":"string","jsonPath":".metadata.labels.karpenter\\.sh/capacity-type"}"#,
    printcolumn = r#"{"name":"Zone","type":"string","jsonPath":".metadata.labels.topology\\.kubernetes\\.io/zone"}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".status.nodeName"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"ImageID","type":"string","jsonPath":".status.imageID","priority":1}"#,
    printcolumn = r#"{"name":"ID","type":"string","jsonPath":".status.providerID","priority":1}"#,
    printcolumn = r#"{"name":"NodePool","type":"string","jsonPath":".metadata.labels.karpenter\\.sh/nodepool","priority":1}"#,
    printcolumn = r#"{"name":"NodeClass","type":"string","jsonPath":".spec.nodeClassRef.name","priority":1}"#,
    printcolumn = r#"{"name":"Drifted","type":"string","jsonPath":".status.conditions[?(@.type==\"Drifted\")].status","priority":1}"#
)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimObjectSpec {
    /// Constraints on instance type, zone, capacity type and other labels.
    #[schemars(length(max = 100))]
    pub requirements: Vec<NodeSelectorRequirementWithMinValues>,
    /// The node class (EC2NodeClass) that holds the AWS settings.
    pub node_class_ref: NodeClassReference,
    /// Taints the node carries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<Taint>,
    /// Taints present at start-up and removed by a daemon once ready.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub startup_taints: Vec<Taint>,
    /// Node lifetime before it is replaced, or `Never` (default 720h).
    #[serde(default = "super::nodepool::default_expire_after")]
    pub expire_after: NillableDuration,
    /// Longest the node may take to drain before it is forcibly deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period: Option<NillableDuration>,
    /// What the claim's pods request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequests>,
}

/// Resource requests of a NodeClaim.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceRequests {
    /// The least resources the node must have.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, Quantity>,
}

/// Observed state of a NodeClaim object.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimObjectStatus {
    /// Name of the Node the claim became.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// The cloud provider's id of the node (`aws:///zone/instance-id`).
    #[serde(default, rename = "providerID", skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    /// The image the node runs.
    #[serde(default, rename = "imageID", skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,
    /// The node's expected full capacity.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub capacity: BTreeMap<String, Quantity>,
    /// The node's expected allocatable resources.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub allocatable: BTreeMap<String, Quantity>,
    /// Launched, Registered, Initialized, Ready, Drifted, ...
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// When a pod last arrived on or left the node (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_pod_event_time: Option<String>,
}
