//! The provisioning solver: given pending pods, cluster state, NodePools and
//! the instance catalog, decide where each pod goes: onto an existing node or
//! in-flight NodeClaim, onto a new NodeClaim (with its cheapest-first instance
//! type options), or nowhere (with a reason). Pure and deterministic.
//!
//! Semantics follow Karpenter v1's scheduler: pools by weight, pod
//! requirements against pool requirements allowing undefined well-known
//! labels, instance types filtered by requirements, resources (allocatable
//! minus DaemonSet overhead), offerings and limits, topology domains from pool
//! requirements and offerings, preferences relaxed step by step. Packing is
//! first-fit-decreasing, then [`packing`] searches for a cheaper plan.

pub mod claim;
pub mod daemonset;
pub mod dense;
pub mod existing;
#[cfg(test)]
pub mod fixtures;
pub mod model;
pub mod packing;
pub mod pod;
pub mod preferences;
pub mod scheduler;
pub mod topology;
pub mod volume;

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use serde::Serialize;

use crate::apis::nodepool::NodeSelectorRequirementWithMinValues;
use crate::apis::{EC2NodeClass, NodePool, Taint};
use crate::catalog::Catalog;
use crate::nodeclaim::NodeClaim;
use crate::requirements::Requirements;
use crate::resources::Resources;

pub use pod::PodRef;

/// A node that exists, with the pods running on it (DaemonSet pods included).
#[derive(Debug, Clone)]
pub struct ExistingNode {
    /// The node.
    pub node: Node,
    /// Pods bound to it.
    pub pods: Vec<Pod>,
}

/// An offering that recently failed (insufficient capacity, interruption).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UnavailableOffering {
    /// Instance type name.
    pub instance_type: String,
    /// Zone.
    pub zone: String,
    /// Capacity type.
    pub capacity_type: String,
}

/// Knobs of the solve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SolveOptions {
    /// Search for a cheaper packing than plain first-fit-decreasing (on by default).
    pub improve: bool,
}

impl Default for SolveOptions {
    fn default() -> Self {
        SolveOptions { improve: true }
    }
}

/// Everything a solve looks at, as plain data.
#[derive(Debug, Clone)]
pub struct SolveInput<'a> {
    /// Pods waiting for a node.
    pub pods: Vec<Pod>,
    /// Existing nodes and their pods.
    pub nodes: Vec<ExistingNode>,
    /// NodeClaims decided or launched but not yet nodes (phases that hold capacity).
    pub node_claims: Vec<NodeClaim>,
    /// NodePools.
    pub node_pools: Vec<NodePool>,
    /// EC2NodeClasses (their kubelet settings shape allocatable).
    pub node_classes: Vec<EC2NodeClass>,
    /// DaemonSets (their pods' requests are reserved on every new node they fit).
    pub daemon_sets: Vec<DaemonSet>,
    /// PersistentVolumes.
    pub persistent_volumes: Vec<PersistentVolume>,
    /// PersistentVolumeClaims.
    pub persistent_volume_claims: Vec<PersistentVolumeClaim>,
    /// StorageClasses.
    pub storage_classes: Vec<StorageClass>,
    /// The instance catalog.
    pub catalog: &'a Catalog,
    /// Offerings not to use.
    pub unavailable: Vec<UnavailableOffering>,
    /// Knobs.
    pub options: SolveOptions,
}

impl<'a> SolveInput<'a> {
    /// An input with only a catalog; fill the rest field by field.
    pub fn new(catalog: &'a Catalog) -> Self {
        SolveInput {
            pods: vec![],
            nodes: vec![],
            node_claims: vec![],
            node_pools: vec![],
            node_classes: vec![],
            daemon_sets: vec![],
            persistent_volumes: vec![],
            persistent_volume_claims: vec![],
            storage_classes: vec![],
            catalog,
            unavailable: vec![],
            options: SolveOptions::default(),
        }
    }
}

/// What the solve decided.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    /// New nodes to launch.
    pub node_claims: Vec<NewNodeClaim>,
    /// Pending pods placed on existing nodes or in-flight NodeClaims.
    pub existing: Vec<ExistingPlacement>,
    /// Pending pods no plan can place, with the reason.
    pub unschedulable: Vec<Unschedulable>,
    /// Input that was skipped (e.g. a DaemonSet that could not be read).
    pub warnings: Vec<String>,
}

impl Plan {
    /// The hourly price of all new NodeClaims.
    pub fn total_price(&self) -> f64 {
        self.node_claims.iter().map(|c| c.price).sum()
    }
}

/// A new node to launch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NewNodeClaim {
    /// Deterministic name (`<pool>-<5 lowercase alphanumerics>`), also the hostname.
    pub name: String,
    /// The NodePool.
    pub node_pool: String,
    /// The EC2NodeClass.
    pub node_class: String,
    /// Pool requirements narrowed by the pods (and topology domains chosen);
    /// [`NewNodeClaim::to_node_claim`] adds the instance-type options.
    #[serde(skip)]
    pub requirements: Requirements,
    /// Every compatible instance type, cheapest first (CreateFleet overrides).
    pub instance_type_options: Vec<String>,
    /// The cheapest option.
    pub instance_type: String,
    /// The zone of its cheapest compatible offering.
    pub zone: String,
    /// spot or on-demand (spot when allowed and offered).
    pub capacity_type: String,
    /// Hourly price of that offering.
    pub price: f64,
    /// Allocatable of the cheapest option.
    pub allocatable: Resources,
    /// Labels the node gets.
    pub labels: BTreeMap<String, String>,
    /// Template taints.
    pub taints: Vec<Taint>,
    /// Template startup taints.
    pub startup_taints: Vec<Taint>,
    /// Pending pods placed on it.
    pub pods: Vec<PodRef>,
    /// Requests of its pods plus DaemonSet overhead on the cheapest option.
    pub requests: Resources,
}

impl NewNodeClaim {
    /// The NodeClaim record (phase Pending) the provision function stores.
    pub fn to_node_claim(&self) -> NodeClaim {
        // The claim is launched as one of its options: say so in its requirements.
        let mut reqs = self.requirements.clone();
        let min_values = reqs.get(crate::apis::labels::INSTANCE_TYPE).and_then(|r| r.min_values);
        reqs.add(
            crate::requirements::Requirement::in_values(
                crate::apis::labels::INSTANCE_TYPE,
                &self.instance_type_options,
            )
            .with_min_values(min_values),
        );
        let requirements = reqs
            .iter()
            .map(|r| {
                let (key, operator, values) = r.to_manifest();
                NodeSelectorRequirementWithMinValues {
                    key,
                    operator,
                    values,
                    min_values: r.min_values.map(|m| m as i64),
                }
            })
            .collect();
        NodeClaim {
            requirements,
            resources: self.requests.clone(),
            instance_type_options: self.instance_type_options.clone(),
            labels: self.labels.clone(),
            taints: self.taints.clone(),
            startup_taints: self.startup_taints.clone(),
            ..NodeClaim::pending(self.name.clone(), self.node_pool.clone(), self.node_class.clone())
        }
    }
}

/// Whether a placement target already exists as a node or is an in-flight claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum TargetKind {
    /// A Kubernetes node.
    Node,
    /// An in-flight NodeClaim.
    NodeClaim,
}

/// Pending pods placed onto an existing node or in-flight claim.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExistingPlacement {
    /// Node or NodeClaim name.
    pub name: String,
    /// Which of the two.
    pub kind: TargetKind,
    /// The pods.
    pub pods: Vec<PodRef>,
}

/// A pod no plan can place.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Unschedulable {
    /// The pod.
    pub pod: PodRef,
    /// Why.
    pub reason: String,
}

/// Solves: builds the compact model once, packs first-fit-decreasing, and
/// (unless disabled) searches for a cheaper packing; deterministic.
pub fn solve(input: &SolveInput) -> Plan {
    let model = model::Model::build(input);
    let plan = if input.options.improve {
        packing::best(&model)
    } else {
        scheduler::Run::new(&model, packing::Strategy::default()).schedule()
    };
    plan.finish(&model)
}

#[cfg(test)]
mod tests;
