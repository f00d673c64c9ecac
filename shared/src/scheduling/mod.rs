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
//! first-fit-decreasing, then `packing` searches for a cheaper plan; `bound`
//! says how far from the optimum a plan can be at most. A snapshot
//! is compiled once (`Compiled`) and solved any number of times with
//! `SolveOptions` (nodes removed, new claims forbidden, a price ceiling).

pub(crate) mod bound;
pub(crate) mod claim;
pub(crate) mod compile;
pub(crate) mod daemonset;
pub(crate) mod dense;
pub(crate) mod existing;
pub mod failure;
#[cfg(test)]
pub(crate) mod fixtures;
pub(crate) mod model;
pub(crate) mod packing;
pub(crate) mod pod;
pub(crate) mod preferences;
pub(crate) mod room;
pub(crate) mod scheduler;
pub(crate) mod topology;
pub(crate) mod volume;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use serde::Serialize;

use crate::apis::{EC2NodeClass, NodePool, Taint};
use crate::catalog::{Catalog, OfferingKey};
use crate::labels;
use crate::nodeclaim::NodeClaim;
use crate::requirements::Requirements;
use crate::resources::Resources;

pub use compile::Compiled;
pub use failure::{Constraint, PlacementFailure, PoolRejection, Rejection};
pub use pod::PodRef;

/// A node that exists, with the pods running on it (DaemonSet pods included).
#[derive(Debug, Clone)]
pub struct ExistingNode {
    /// The node.
    pub node: Node,
    /// Pods bound to it.
    pub pods: Vec<Pod>,
}

/// What one solve may do, so that one compiled snapshot answers many
/// questions: provisioning (the defaults), or a disruption what-if such as
/// "if these nodes were gone, where would their pods go, with no new node or
/// one cheaper than theirs?".
#[derive(Debug, Clone, PartialEq)]
pub struct SolveOptions {
    /// Search for a cheaper packing than plain first-fit-decreasing (on by default).
    pub improve: bool,
    /// May the solve open new NodeClaims (off: existing capacity only).
    pub new_claims: bool,
    /// New claims may only use instance types whose cheapest usable
    /// offering costs less than this per hour.
    pub price_below: Option<f64>,
    /// New claims may not use these instance types (consolidation never
    /// replaces a node with its own type).
    pub exclude_types: BTreeSet<String>,
    /// Existing nodes (or in-flight claims) taken away, by name: their
    /// capacity is gone and their movable pods are pending.
    pub removed: BTreeSet<String>,
    /// Whether the removed nodes' movable pods are placed (on by default);
    /// off, only their capacity is gone (pending pods placed ahead of them).
    pub place_removed_pods: bool,
    /// When the cheaper-packing search must stop (the first complete plan is
    /// always finished); `None`: the search's fixed budget alone bounds it.
    pub deadline: Option<Instant>,
}

impl Default for SolveOptions {
    fn default() -> Self {
        SolveOptions {
            improve: true,
            new_claims: true,
            price_below: None,
            exclude_types: BTreeSet::new(),
            removed: BTreeSet::new(),
            place_removed_pods: true,
            deadline: None,
        }
    }
}

impl SolveOptions {
    /// A what-if: the named nodes removed, everything else as provisioning.
    pub fn without<I: IntoIterator<Item = S>, S: Into<String>>(nodes: I) -> Self {
        SolveOptions {
            removed: nodes.into_iter().map(Into::into).collect(),
            ..SolveOptions::default()
        }
    }
}

/// Everything a solve looks at, borrowed from a snapshot.
#[derive(Debug, Clone, Copy)]
pub struct SolveInput<'a> {
    /// Pods waiting for a node.
    pub pods: &'a [Pod],
    /// Existing nodes and their pods.
    pub nodes: &'a [ExistingNode],
    /// NodeClaims decided or launched but not yet nodes (phases that hold capacity).
    pub node_claims: &'a [NodeClaim],
    /// NodePools.
    pub node_pools: &'a [NodePool],
    /// EC2NodeClasses (their kubelet settings shape allocatable).
    pub node_classes: &'a [EC2NodeClass],
    /// DaemonSets (their pods' requests are reserved on every new node they fit).
    pub daemon_sets: &'a [DaemonSet],
    /// PersistentVolumes.
    pub persistent_volumes: &'a [PersistentVolume],
    /// PersistentVolumeClaims.
    pub persistent_volume_claims: &'a [PersistentVolumeClaim],
    /// StorageClasses.
    pub storage_classes: &'a [StorageClass],
    /// Namespaces (their labels, for pod affinity namespaceSelectors).
    pub namespaces: &'a [k8s_openapi::api::core::v1::Namespace],
    /// The instance catalog.
    pub catalog: &'a Catalog,
    /// Offerings not to use.
    pub unavailable: &'a [OfferingKey],
    /// Zones (by name) an ARC zonal shift moves traffic away from: no new
    /// capacity is planned there, and no pod moves onto a node there.
    pub shifted_zones: &'a BTreeSet<String>,
}

/// No zone shifted away.
static NO_ZONES: BTreeSet<String> = BTreeSet::new();

impl<'a> SolveInput<'a> {
    /// An input with only a catalog; fill the rest field by field.
    pub fn new(catalog: &'a Catalog) -> Self {
        SolveInput {
            pods: &[],
            nodes: &[],
            node_claims: &[],
            node_pools: &[],
            node_classes: &[],
            daemon_sets: &[],
            persistent_volumes: &[],
            persistent_volume_claims: &[],
            storage_classes: &[],
            namespaces: &[],
            catalog,
            unavailable: &[],
            shifted_zones: &NO_ZONES,
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
        // From +0.0: an empty f64 sum is -0.0, which JSON would print as such.
        self.node_claims.iter().map(|c| c.price).fold(0.0, |a, p| a + p)
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
    /// Labels the node is predicted to get if launched as the cheapest option
    /// (the instance's, the pool's and the hostname); for `simulate` only.
    pub labels: BTreeMap<String, String>,
    /// The NodePool's template labels.
    #[serde(skip)]
    pub template_labels: BTreeMap<String, String>,
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
    /// The labels known before launch: the pool's template labels, the labels
    /// the requirements pin to one value unless the launched instance decides
    /// them ([`labels::set_from_instance`]), and the pool.
    pub fn labels_before_launch(&self) -> BTreeMap<String, String> {
        let mut l: BTreeMap<String, String> = self
            .requirements
            .single_valued_labels()
            .into_iter()
            .filter(|(k, _)| !labels::set_from_instance(k))
            .collect();
        l.extend(self.template_labels.clone());
        l.insert(labels::NODEPOOL.into(), self.node_pool.clone());
        l
    }

    /// The NodeClaim record (phase Pending) created at `now`, labelled with
    /// [`NewNodeClaim::labels_before_launch`]; its requirements name its
    /// instance-type options, since it is launched as one of them.
    /// Only the cheapest [`crate::nodeclaim::MAX_INSTANCE_TYPE_OPTIONS`] options are kept
    /// (more when the instance-type requirement's minValues asks for more).
    pub fn to_node_claim(&self, now: jiff::Timestamp) -> NodeClaim {
        let mut reqs = self.requirements.clone();
        let min_values = reqs.get(crate::labels::INSTANCE_TYPE).and_then(|r| r.min_values);
        let keep = crate::nodeclaim::MAX_INSTANCE_TYPE_OPTIONS.max(min_values.unwrap_or(0));
        let options = &self.instance_type_options[..self.instance_type_options.len().min(keep)];
        reqs.add(
            crate::requirements::Requirement::in_values(crate::labels::INSTANCE_TYPE, options)
                .with_min_values(min_values),
        );
        let mut claim = NodeClaim {
            resources: self.requests.clone(),
            instance_type_options: options.to_vec(),
            labels: self.labels_before_launch(),
            taints: self.taints.clone(),
            startup_taints: self.startup_taints.clone(),
            ..NodeClaim::pending(self.name.clone(), self.node_pool.clone(), self.node_class.clone())
        };
        claim.set_requirements(&reqs);
        claim.timestamps.created = Some(now);
        claim
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
    /// Why, as data (rendered to text at the edge).
    pub reason: PlacementFailure,
}

/// Solves once: compiles the input and runs one solve with `options`.
/// To ask many questions of one snapshot, compile it once with
/// [`Compiled::new`] and call [`Compiled::solve`] for each.
pub fn solve(input: &SolveInput, options: &SolveOptions) -> Plan {
    Compiled::new(input).solve(options)
}

impl Compiled {
    /// Places the pending pods (and the movable pods of `options.removed`)
    /// onto the remaining capacity and, when allowed, new NodeClaims: packs
    /// first-fit-decreasing and (unless disabled) searches for a cheaper
    /// packing; deterministic unless a deadline cuts the search short.
    pub fn solve(&self, options: &SolveOptions) -> Plan {
        let model = model::Model::new(self, options);
        let plan = if options.improve {
            packing::best(&model, options.deadline)
        } else {
            scheduler::Run::new(&model, scheduler::Strategy::default()).schedule()
        };
        plan.finish(&model)
    }

    /// The least any plan placing the pods `plan` placed could pay per hour
    /// for new nodes (the LP relaxation in `bound`): `plan`'s price over it
    /// bounds how far `plan` is from the optimum. Costs about one solve.
    pub fn lower_bound(&self, plan: &Plan) -> f64 {
        let model = model::Model::new(self, &SolveOptions::default());
        let left: BTreeSet<&PodRef> = plan.unschedulable.iter().map(|u| &u.pod).collect();
        bound::lower_bound(
            &model,
            (0..model.pods.len()).filter(|i| !left.contains(&model.pods[*i].pod)),
        )
    }
}

#[cfg(test)]
mod tests;
