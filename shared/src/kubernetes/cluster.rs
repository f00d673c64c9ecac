//! The cluster as the functions see it: a trait over the Kubernetes API calls
//! nodesmith makes, so decisions can be tested against any implementation.

use std::collections::BTreeMap;
use std::future::Future;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::StorageClass;

use super::client::ClientError;
use super::events::EventSpec;
use crate::apis::nodeclaim::NodeClaimObject;
use crate::apis::{EC2NodeClass, NodePool};

/// A failed cluster call, with what was being done.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The API server answered with an error status.
    #[error("{op}: API server answered {code} {reason}: {message}")]
    Api {
        /// What was being done (e.g. "evict pod default/web-1").
        op: String,
        /// HTTP status.
        code: u16,
        /// Kubernetes reason (NotFound, Conflict, TooManyRequests ...).
        reason: String,
        /// The server's message.
        message: String,
    },
    /// The request did not get an answer (connection, TLS, decoding).
    #[error("{op}: {message}")]
    Transport {
        /// What was being done.
        op: String,
        /// What failed.
        message: String,
    },
    /// No client could be built (authentication, endpoint).
    #[error(transparent)]
    Client(#[from] ClientError),
}

impl ClusterError {
    /// Wraps a kube error with the operation it broke.
    pub fn from_kube(op: impl Into<String>, e: kube::Error) -> Self {
        match e {
            kube::Error::Api(s) => ClusterError::Api {
                op: op.into(),
                code: s.code,
                reason: s.reason.clone(),
                message: s.message.clone(),
            },
            other => ClusterError::Transport {
                op: op.into(),
                message: other.to_string(),
            },
        }
    }

    /// The HTTP status, when the server answered.
    pub fn code(&self) -> Option<u16> {
        match self {
            ClusterError::Api { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// What became of one eviction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EvictionOutcome {
    /// The API server accepted the eviction.
    Evicted,
    /// A PodDisruptionBudget refused it (HTTP 429): try again later.
    Blocked {
        /// The server's explanation.
        reason: String,
    },
    /// The pod no longer exists.
    Gone,
}

/// Labels and annotations to set on a node, taints to take off it and
/// finalizers to add or remove, in one write (registration, initialization,
/// the end of a termination).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeUpdate {
    /// Labels set (others stay).
    pub labels: BTreeMap<String, String>,
    /// Keys of labels removed (a node that left its capacity reservation
    /// loses the reservation's labels).
    pub remove_labels: Vec<String>,
    /// Annotations set (others stay).
    pub annotations: BTreeMap<String, String>,
    /// Keys of taints removed (all effects).
    pub remove_taints: Vec<String>,
    /// Finalizers added (others stay).
    pub finalizers: Vec<String>,
    /// Finalizers removed.
    pub remove_finalizers: Vec<String>,
}

impl NodeUpdate {
    /// True when applying it to `node` would change nothing (pure).
    pub fn is_satisfied_by(&self, node: &Node) -> bool {
        let has = |have: Option<&BTreeMap<String, String>>, want: &BTreeMap<String, String>| {
            want.iter().all(|(k, v)| have.and_then(|h| h.get(k)) == Some(v))
        };
        let taints = node.spec.as_ref().and_then(|s| s.taints.as_ref());
        let finalizers = node.metadata.finalizers.as_deref().unwrap_or_default();
        self.finalizers.iter().all(|f| finalizers.contains(f))
            && !finalizers.iter().any(|f| self.remove_finalizers.contains(f))
            && has(node.metadata.labels.as_ref(), &self.labels)
            && !node
                .metadata
                .labels
                .as_ref()
                .is_some_and(|l| self.remove_labels.iter().any(|k| l.contains_key(k)))
            && has(node.metadata.annotations.as_ref(), &self.annotations)
            && !taints.is_some_and(|ts| ts.iter().any(|t| self.remove_taints.contains(&t.key)))
    }
}

/// The Kubernetes API calls nodesmith makes. Implemented over kube-rs by
/// [`super::KubeCluster`]; calls are rate-limited and retried there.
pub trait Cluster: Send + Sync {
    /// One pod, or None when it does not exist.
    fn pod(&self, namespace: &str, name: &str) -> impl Future<Output = Result<Option<Pod>, ClusterError>> + Send;
    /// Every pod in the cluster, page by page as read, without what nodesmith
    /// never reads of a pod ([`super::pods::trim_unread`]).
    fn pods(&self) -> impl Future<Output = Result<super::Paged<Pod>, ClusterError>> + Send;
    /// Pods the scheduler could not place (`PodScheduled=False, reason=Unschedulable`) and that provisioning should act on.
    fn pending_pods(&self) -> impl Future<Output = Result<Vec<Pod>, ClusterError>> + Send;
    /// Pods bound to one node (field selector `spec.nodeName=<node>`).
    fn pods_on_node(&self, node: &str) -> impl Future<Output = Result<Vec<Pod>, ClusterError>> + Send;
    /// Every node.
    fn nodes(&self) -> impl Future<Output = Result<Vec<Node>, ClusterError>> + Send;
    /// One node, or None when it does not exist.
    fn node(&self, name: &str) -> impl Future<Output = Result<Option<Node>, ClusterError>> + Send;
    /// Every DaemonSet (their pods land on every new node).
    fn daemon_sets(&self) -> impl Future<Output = Result<Vec<DaemonSet>, ClusterError>> + Send;
    /// Every PodDisruptionBudget.
    fn pod_disruption_budgets(&self) -> impl Future<Output = Result<Vec<PodDisruptionBudget>, ClusterError>> + Send;
    /// Every PersistentVolume.
    fn persistent_volumes(&self) -> impl Future<Output = Result<Vec<PersistentVolume>, ClusterError>> + Send;
    /// Every PersistentVolumeClaim.
    fn persistent_volume_claims(&self)
    -> impl Future<Output = Result<Vec<PersistentVolumeClaim>, ClusterError>> + Send;
    /// Every StorageClass.
    fn storage_classes(&self) -> impl Future<Output = Result<Vec<StorageClass>, ClusterError>> + Send;
    /// Every Namespace (pod affinity `namespaceSelector`s select them by label).
    fn namespaces(&self) -> impl Future<Output = Result<Vec<Namespace>, ClusterError>> + Send;
    /// Every NodePool, or an error when any one cannot be read.
    fn node_pools(&self) -> impl Future<Output = Result<Vec<NodePool>, ClusterError>> + Send;
    /// Every EC2NodeClass, or an error when any one cannot be read: for
    /// decisions that delete what no class names (a class left out would
    /// lose its launch templates and instance profile).
    fn node_classes(&self) -> impl Future<Output = Result<Vec<EC2NodeClass>, ClusterError>> + Send;
    /// The NodePools this release can read; each one it cannot is left out
    /// with a `FailedToDecode` Warning Event on it: for decisions about what
    /// to launch or disrupt, which one unreadable pool must not stop.
    fn usable_node_pools(&self) -> impl Future<Output = Result<Vec<NodePool>, ClusterError>> + Send;
    /// The EC2NodeClasses this release can read, as [`Cluster::usable_node_pools`].
    fn usable_node_classes(&self) -> impl Future<Output = Result<Vec<EC2NodeClass>, ClusterError>> + Send;
    /// One EC2NodeClass, or None when it does not exist.
    fn node_class(&self, name: &str) -> impl Future<Output = Result<Option<EC2NodeClass>, ClusterError>> + Send;
    /// One NodePool, or None when it does not exist.
    fn node_pool(&self, name: &str) -> impl Future<Output = Result<Option<NodePool>, ClusterError>> + Send;
    /// Replaces an EC2NodeClass's status through the status subresource (the
    /// spec is not touched), guarded by the resourceVersion `class` carries: a
    /// 409 means someone wrote the class since it was read. Ok(false) when the
    /// class does not exist.
    fn replace_node_class_status(
        &self,
        class: &EC2NodeClass,
    ) -> impl Future<Output = Result<bool, ClusterError>> + Send;
    /// Replaces a NodePool's status through the status subresource, guarded
    /// by the resourceVersion `pool` carries. Ok(false) when the pool does not exist.
    fn replace_node_pool_status(&self, pool: &NodePool) -> impl Future<Output = Result<bool, ClusterError>> + Send;
    /// nodesmith's NodeClaim objects ([`crate::labels::MANAGED_BY_LABEL`]).
    fn node_claim_objects(&self) -> impl Future<Output = Result<Vec<NodeClaimObject>, ClusterError>> + Send;
    /// One NodeClaim object (nodesmith's or not), or None when it does not exist.
    fn node_claim_object(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<NodeClaimObject>, ClusterError>> + Send;
    /// Creates a NodeClaim object, then writes its status (a create drops
    /// it). Ok(false) when one of that name exists already.
    fn create_node_claim_object(
        &self,
        object: &NodeClaimObject,
    ) -> impl Future<Output = Result<bool, ClusterError>> + Send;
    /// Replaces a NodeClaim object's metadata and spec, guarded by its
    /// resourceVersion (409 when it changed since it was read); the object
    /// as written, or None when it does not exist.
    fn replace_node_claim_object(
        &self,
        object: &NodeClaimObject,
    ) -> impl Future<Output = Result<Option<NodeClaimObject>, ClusterError>> + Send;
    /// Replaces a NodeClaim object's status through the status subresource,
    /// guarded by its resourceVersion. Ok(false) when it does not exist.
    fn replace_node_claim_object_status(
        &self,
        object: &NodeClaimObject,
    ) -> impl Future<Output = Result<bool, ClusterError>> + Send;
    /// Lets a NodeClaim object go once its claim is gone: the termination
    /// finalizer off, and deleted unless it was being deleted already.
    /// Ok(false) when it did not exist.
    fn release_node_claim_object(&self, name: &str) -> impl Future<Output = Result<bool, ClusterError>> + Send;
    /// Adds `karpenter.sh/disrupted:NoSchedule` to a node. Ok(false) when it was already there.
    fn taint_disrupted(&self, node: &str) -> impl Future<Output = Result<bool, ClusterError>> + Send;
    /// Removes `karpenter.sh/disrupted` from a node (a disruption was abandoned). Ok(false) when absent.
    fn untaint_disrupted(&self, node: &str) -> impl Future<Output = Result<bool, ClusterError>> + Send;
    /// Evicts one pod through the Eviction API (PDBs apply).
    fn evict(&self, pod: &Pod) -> impl Future<Output = Result<EvictionOutcome, ClusterError>> + Send;
    /// Deletes one pod outright, past any PodDisruptionBudget (only for capacity
    /// the cloud takes anyway). Ok(false) when it did not exist.
    fn delete_pod(&self, pod: &Pod) -> impl Future<Output = Result<bool, ClusterError>> + Send;
    /// Applies a [`NodeUpdate`] (read-modify-write guarded by the resourceVersion; no
    /// write when nothing would change). Ok(false) when the node does not exist.
    fn update_node(&self, name: &str, update: &NodeUpdate) -> impl Future<Output = Result<bool, ClusterError>> + Send;
    /// Deletes a node object; with `uid`, only that very object (a
    /// precondition the API server checks), never a Node recreated since
    /// under the same name. Ok(false) when it did not exist or was replaced.
    fn delete_node(&self, name: &str, uid: Option<&str>) -> impl Future<Output = Result<bool, ClusterError>> + Send;
    /// Records an Event.
    fn emit_event(&self, event: &EventSpec) -> impl Future<Output = Result<(), ClusterError>> + Send;
}

/// Deletes the Node `name` if it is still the one of `instance_id` (its
/// `spec.providerID` names the instance; without an id, the Node as read
/// now), guarded by that Node's UID so a Node recreated under the same name
/// in between is left alone. Ok(false) when there was none to delete.
pub async fn delete_node_of<C: Cluster>(
    cluster: &C,
    name: &str,
    instance_id: Option<&str>,
) -> Result<bool, ClusterError> {
    let Some(node) = cluster.node(name).await? else {
        return Ok(false);
    };
    let backing = node
        .spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .and_then(|p| p.rsplit('/').next());
    if let (Some(want), Some(found)) = (instance_id, backing)
        && want != found
    {
        tracing::info!(
            node = name,
            instance_id = want,
            found,
            "the node now belongs to another instance; left alone"
        );
        return Ok(false);
    }
    cluster.delete_node(name, node.metadata.uid.as_deref()).await
}
