//! The cluster snapshot: everything a decision looks at, as plain data taken
//! at one moment `now`. `provision`, `nodesmith simulate` and the sweep build
//! their solver input from it, and compile it once to ask the solver many
//! questions. Reading it from the cluster and DynamoDB is [`live::read`];
//! building it from manifests is [`Snapshot::from_manifests`].

pub mod live;
mod manifests;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::StorageClass;

use crate::apis::{EC2NodeClass, NodePool};
use crate::catalog::{Catalog, OfferingKey};
use crate::nodeclaim::NodeClaim;
use crate::scheduling::{Compiled, ExistingNode, NewNodeClaim, SolveInput};

/// What a decision needs, taken at `now`.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The moment the snapshot stands for: every time-based rule is evaluated against it.
    pub now: Timestamp,
    /// Pods waiting for a node (workloads already expanded).
    pub pods: Vec<Pod>,
    /// Nodes with the pods bound to them (DaemonSet pods included, finished pods not).
    pub nodes: Vec<ExistingNode>,
    /// NodeClaims whose capacity is on its way and not yet a Node.
    pub node_claims: Vec<NodeClaim>,
    /// NodePools.
    pub node_pools: Vec<NodePool>,
    /// EC2NodeClasses.
    pub node_classes: Vec<EC2NodeClass>,
    /// DaemonSets (their pods' requests are reserved on every node they fit).
    pub daemon_sets: Vec<DaemonSet>,
    /// PodDisruptionBudgets (disruption honours them).
    pub pod_disruption_budgets: Vec<PodDisruptionBudget>,
    /// PersistentVolumes (zonal topology).
    pub persistent_volumes: Vec<PersistentVolume>,
    /// PersistentVolumeClaims, StatefulSet claim templates expanded.
    pub persistent_volume_claims: Vec<PersistentVolumeClaim>,
    /// StorageClasses (allowed topologies).
    pub storage_classes: Vec<StorageClass>,
    /// Namespaces (their labels, for pod affinity namespaceSelectors).
    pub namespaces: Vec<Namespace>,
    /// The instance catalog (types, offerings, prices).
    pub catalog: Arc<Catalog>,
    /// Offerings that recently failed and are not to be used.
    pub unavailable: Vec<OfferingKey>,
    /// Zones (by name) an ARC zonal shift moves traffic away from ([`crate::zonal_shift`]).
    pub shifted_zones: BTreeSet<String>,
}

impl Snapshot {
    /// An empty cluster at `now` with a catalog; fill the rest field by field.
    pub fn new(catalog: Arc<Catalog>, now: Timestamp) -> Self {
        Snapshot {
            now,
            pods: Vec::new(),
            nodes: Vec::new(),
            node_claims: Vec::new(),
            node_pools: Vec::new(),
            node_classes: Vec::new(),
            daemon_sets: Vec::new(),
            pod_disruption_budgets: Vec::new(),
            persistent_volumes: Vec::new(),
            persistent_volume_claims: Vec::new(),
            storage_classes: Vec::new(),
            namespaces: Vec::new(),
            catalog,
            unavailable: Vec::new(),
            shifted_zones: BTreeSet::new(),
        }
    }

    /// The solver's view of the snapshot (borrowed, nothing copied).
    pub fn solve_input(&self) -> SolveInput<'_> {
        SolveInput {
            pods: &self.pods,
            nodes: &self.nodes,
            node_claims: &self.node_claims,
            node_pools: &self.node_pools,
            node_classes: &self.node_classes,
            daemon_sets: &self.daemon_sets,
            persistent_volumes: &self.persistent_volumes,
            persistent_volume_claims: &self.persistent_volume_claims,
            storage_classes: &self.storage_classes,
            namespaces: &self.namespaces,
            catalog: &self.catalog,
            unavailable: &self.unavailable,
            shifted_zones: &self.shifted_zones,
        }
    }

    /// Compiles the snapshot once for any number of solves.
    pub fn compile(&self) -> Compiled {
        Compiled::new(&self.solve_input())
    }

    /// The NodePool of that name.
    pub fn node_pool(&self, name: &str) -> Option<&NodePool> {
        self.node_pools.iter().find(|p| p.name() == name)
    }

    /// The EC2NodeClass of that name.
    pub fn node_class(&self, name: &str) -> Option<&EC2NodeClass> {
        self.node_classes.iter().find(|c| c.name() == name)
    }

    /// Leaves out the NodePools whose EC2NodeClass says it cannot launch
    /// (`Ready=False`), as Karpenter provisions only from ready classes; returns
    /// the pools left out with their class's reason (no I/O). A class with no
    /// status yet, or missing, keeps its pools (the solver reports the latter).
    pub fn without_unready_pools(&mut self) -> Vec<(String, String)> {
        let unready: BTreeMap<String, String> = self
            .node_classes
            .iter()
            .filter(|c| !c.may_launch())
            .map(|c| {
                let why = c
                    .condition(crate::apis::ec2nodeclass::condition_types::READY)
                    .map(|r| format!("{}: {}", r.reason, r.message))
                    .unwrap_or_default();
                (c.name().to_string(), why)
            })
            .collect();
        let mut left_out = Vec::new();
        self.node_pools
            .retain(|p| match unready.get(&p.spec.template.spec.node_class_ref.name) {
                Some(why) => {
                    left_out.push((p.name().to_string(), why.clone()));
                    false
                }
                None => true,
            });
        left_out
    }

    /// The NodeClaim record for a planned node, created at `now`.
    pub fn node_claim(&self, planned: &NewNodeClaim) -> NodeClaim {
        let mut claim = planned.to_node_claim(self.now);
        // Drift is judged against what the node was made from (Karpenter's static drift).
        claim.nodepool_hash = self.node_pool(&planned.node_pool).map(NodePool::hash);
        claim.nodeclass_hash = self.node_class(&planned.node_class).map(EC2NodeClass::hash);
        if let Some(pool) = self.node_pool(&planned.node_pool) {
            claim.annotations = pool.spec.template.metadata.annotations.clone();
            claim.termination_grace_period = pool.spec.template.spec.termination_grace_period;
        }
        claim
    }
}

#[cfg(test)]
mod tests;
