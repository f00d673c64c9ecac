//! The snapshot read from the live cluster and the state table.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod, Taint as K8sTaint};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::Snapshot;
use crate::apis::{EC2NodeClass, NodePool, Taint};
use crate::catalog::{self, Catalog, CatalogError};
use crate::kubernetes::{Cluster, ClusterError, Paged, pods};
use crate::nodeclaim::{NodeClaim, Phase};
use crate::registration;
use crate::scheduling::ExistingNode;
use crate::state::{StateError, StateStore};

/// Why a snapshot could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The Kubernetes API failed.
    #[error("reading the cluster")]
    Cluster(#[from] ClusterError),
    /// The state table failed.
    #[error("reading the state table")]
    State(#[from] StateError),
    /// No catalog in the state table and the built-in one is unreadable.
    #[error("catalog")]
    Catalog(#[from] CatalogError),
}

/// Reads the cluster and the state table at `now`: pending pods, nodes with
/// their pods, in-flight claims, NodePools and classes, DaemonSets, PDBs,
/// volumes, the catalog (the stored one, else the built-in snapshot) and the
/// offerings still unavailable at `now`. The state table is read in that
/// order while the cluster's lists are read together, all at once: one after
/// another, a 5,000-node cluster's lists took as long as their sum.
pub async fn read(cluster: &impl Cluster, store: &StateStore, now: Timestamp) -> Result<Snapshot, SnapshotError> {
    let state = async {
        let claims = store.in_flight_node_claims().await?;
        Ok::<_, SnapshotError>((claims, read_state(store, now).await?))
    };
    let ((claims, state), lists) = tokio::try_join!(state, read_lists(cluster))?;
    Ok(assemble(now, claims, state, lists))
}

/// [`read`] with the in-flight claims the caller already read (a sweep reads
/// the claim partition once for its snapshot and its decisions).
pub async fn read_with_claims(
    cluster: &impl Cluster,
    store: &StateStore,
    now: Timestamp,
    claims: Vec<NodeClaim>,
) -> Result<Snapshot, SnapshotError> {
    let (state, lists) = tokio::try_join!(read_state(store, now), read_lists(cluster))?;
    Ok(assemble(now, claims, state, lists))
}

/// What a snapshot reads from the state table besides the claims.
struct StateRead {
    catalog: Arc<Catalog>,
    unavailable: Vec<catalog::OfferingKey>,
}

/// The catalog, then the offerings still unavailable at `now`.
async fn read_state(store: &StateStore, now: Timestamp) -> Result<StateRead, SnapshotError> {
    let catalog = match store.get_catalog().await? {
        Some(c) => Arc::new(c),
        None => Arc::new(catalog::builtin()?.clone()),
    };
    let unavailable = store
        .unavailable_offerings(now.as_second())
        .await?
        .into_iter()
        .map(|u| u.key)
        .collect();
    Ok(StateRead { catalog, unavailable })
}

/// Every Kubernetes list a snapshot is made of, in [`read_lists`]' order:
/// pending pods, all pods, Nodes, NodePools, EC2NodeClasses, DaemonSets,
/// PDBs, PersistentVolumes and their claims, StorageClasses, Namespaces.
type Lists = (
    Vec<Pod>,
    Paged<Pod>,
    Vec<Node>,
    Vec<NodePool>,
    Vec<EC2NodeClass>,
    Vec<DaemonSet>,
    Vec<PodDisruptionBudget>,
    Vec<PersistentVolume>,
    Vec<PersistentVolumeClaim>,
    Vec<StorageClass>,
    Vec<Namespace>,
);

/// The lists of [`Lists`], all at once (each list's future on the heap: eleven
/// side by side overflow a thread's stack in a debug build).
async fn read_lists(cluster: &impl Cluster) -> Result<Lists, SnapshotError> {
    Ok(tokio::try_join!(
        Box::pin(cluster.pending_pods()),
        Box::pin(cluster.pods()),
        Box::pin(cluster.nodes()),
        Box::pin(cluster.usable_node_pools()),
        Box::pin(cluster.usable_node_classes()),
        Box::pin(cluster.daemon_sets()),
        Box::pin(cluster.pod_disruption_budgets()),
        Box::pin(cluster.persistent_volumes()),
        Box::pin(cluster.persistent_volume_claims()),
        Box::pin(cluster.storage_classes()),
        Box::pin(cluster.namespaces()),
    )?)
}

/// The snapshot the reads make (pure).
fn assemble(now: Timestamp, claims: Vec<NodeClaim>, state: StateRead, l: Lists) -> Snapshot {
    // The two pod lists are read at once but each at its own revision: a pod
    // bound between them is pending in one and on its node in the other, and
    // counted twice it would be planned a second place (a node launched for
    // pods already running). Where the whole cluster's list has it bound, it is.
    let pending: BTreeSet<&str> = l.0.iter().filter_map(|p| p.metadata.uid.as_deref()).collect();
    let mut bound_since: BTreeSet<String> = BTreeSet::new();
    let all_pods = l.1.into_iter().inspect(|p| {
        if let Some(uid) = p.metadata.uid.as_deref().filter(|u| pending.contains(u))
            && pods::node_name(p).is_some()
        {
            bound_since.insert(uid.to_owned());
        }
    });
    let nodes = existing_nodes(initializing_as_claimed(l.2, &claims, &state.catalog), all_pods);
    let pending_pods =
        l.0.into_iter()
            .filter(|p| !p.metadata.uid.as_ref().is_some_and(|u| bound_since.contains(u)))
            .collect();
    let node_claims = in_flight(claims, &nodes);
    Snapshot {
        now,
        pods: pending_pods,
        nodes,
        node_claims,
        node_pools: l.3,
        node_classes: l.4,
        daemon_sets: l.5,
        pod_disruption_budgets: l.6,
        persistent_volumes: l.7,
        persistent_volume_claims: l.8,
        storage_classes: l.9,
        namespaces: l.10,
        catalog: state.catalog,
        unavailable: state.unavailable,
        shifted_zones: BTreeSet::new(),
    }
}

/// [`read`], without the NodePools whose EC2NodeClass is not Ready: what new
/// claims may be planned on (provisioning and replacements alike).
pub async fn read_launchable(
    cluster: &impl Cluster,
    store: &StateStore,
    now: Timestamp,
) -> Result<Snapshot, SnapshotError> {
    let mut snapshot = read(cluster, store, now).await?;
    for (pool, why) in snapshot.without_unready_pools() {
        tracing::warn!(node_pool = %pool, reason = %why, "NodePool not used: its EC2NodeClass is not Ready");
    }
    Ok(snapshot)
}

/// Groups bound pods by node; pods on nodes that are not listed are dropped.
/// Takes the pods by value: a whole cluster's pods are not copied, and a
/// list's pages ([`Paged`]) are freed as their pods are moved.
pub fn existing_nodes(nodes: Vec<Node>, pods: impl IntoIterator<Item = Pod>) -> Vec<ExistingNode> {
    let mut by_node: BTreeMap<String, Vec<Pod>> = BTreeMap::new();
    for p in pods {
        if let Some(n) = pods::node_name(&p).filter(|_| !pods::is_terminal(&p)) {
            by_node.entry(n.to_string()).or_default().push(p);
        }
    }
    nodes
        .into_iter()
        .map(|node| {
            let name = node.metadata.name.clone().unwrap_or_default();
            let pods = by_node.remove(name.as_str()).unwrap_or_default();
            ExistingNode { node, pods }
        })
        .collect()
}

/// Nodes whose claim is not Initialized yet, as the solver must see them: with
/// the claim's template taints instead of the taints a registering node carries
/// for a while (not-ready, uninitialized, `karpenter.sh/unregistered`, the pool's
/// startup taints), and with the launched type's allocatable for any resource the
/// node does not advertise yet (a device plugin's GPUs). Otherwise pods waiting
/// for that node would look unschedulable and a second node would be launched
/// for them (Karpenter models an uninitialized node the same way) (pure).
pub fn initializing_as_claimed(nodes: Vec<Node>, claims: &[NodeClaim], catalog: &Catalog) -> Vec<Node> {
    let initializing: BTreeMap<String, NodeClaim> = registration::link(&nodes, claims)
        .into_iter()
        .filter(|(_, c)| matches!(c.phase, Phase::Pending | Phase::Launched | Phase::Registered))
        .filter_map(|(n, c)| Some((n.metadata.name.clone()?, c.clone())))
        .collect();
    nodes
        .into_iter()
        .map(|mut node| {
            let Some(claim) = node.metadata.name.as_ref().and_then(|n| initializing.get(n)) else {
                return node;
            };
            let spec = node.spec.get_or_insert_with(Default::default);
            // A disruption taint is real news, not part of start-up: it stays.
            let mut taints: Vec<K8sTaint> = spec
                .taints
                .take()
                .unwrap_or_default()
                .into_iter()
                .filter(|t| t.key == pods::DISRUPTED_TAINT_KEY)
                .collect();
            taints.extend(claim.taints.iter().map(to_k8s_taint));
            spec.taints = Some(taints);
            let launched = claim
                .instance_type
                .as_ref()
                .and_then(|t| catalog.instance_types.iter().find(|i| &i.name == t))
                .map(|i| i.resolve(&catalog.region, None));
            if let Some(t) = launched {
                let status = node.status.get_or_insert_with(Default::default);
                for (list, from) in [
                    (&mut status.allocatable, &t.allocatable),
                    (&mut status.capacity, &t.capacity),
                ] {
                    let list = list.get_or_insert_with(Default::default);
                    for (k, v) in from.to_k8s_strings() {
                        list.entry(k).or_insert(Quantity(v));
                    }
                }
            }
            node
        })
        .collect()
}

fn to_k8s_taint(t: &Taint) -> K8sTaint {
    K8sTaint {
        key: t.key.clone(),
        value: t.value.clone(),
        effect: format!("{:?}", t.effect),
        time_added: None,
    }
}

/// NodeClaims whose capacity is not yet a node: a claim that registered
/// (its provider id or node name matches a node) is counted as that node. Only
/// a claim not registered yet (Pending, Launched) can still become a node: one
/// that registered, or is draining, and has no node any more is capacity that
/// is gone (its instance was taken), not capacity on its way, and pods placed
/// on it would wait for nothing until the sweep removed it.
pub fn in_flight(claims: Vec<NodeClaim>, nodes: &[ExistingNode]) -> Vec<NodeClaim> {
    let provider_ids: BTreeSet<&str> = nodes
        .iter()
        .filter_map(|n| n.node.spec.as_ref().and_then(|s| s.provider_id.as_deref()))
        .collect();
    let names: BTreeSet<&str> = nodes.iter().filter_map(|n| n.node.metadata.name.as_deref()).collect();
    claims
        .into_iter()
        .filter(|c| matches!(c.phase, Phase::Pending | Phase::Launched))
        .filter(|c| !c.provider_id.as_deref().is_some_and(|p| provider_ids.contains(p)))
        .filter(|c| !c.node_name.as_deref().is_some_and(|n| names.contains(n)))
        .collect()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Node, Pod};

    use super::*;
    use crate::nodeclaim::Phase;

    fn claim(name: &str, phase: Phase, provider: Option<&str>) -> NodeClaim {
        let mut c: NodeClaim = serde_json::from_value(serde_json::json!({
            "name": name, "nodePool": "default", "nodeClass": "default", "requirements": [],
            "resources": {}, "instanceTypeOptions": ["m5.large"], "phase": "Pending"
        }))
        .unwrap();
        c.phase = phase;
        c.provider_id = provider.map(Into::into);
        c
    }

    #[test]
    fn registered_claims_count_as_their_nodes() {
        let mut node = Node::default();
        node.metadata.name = Some("ip-10-0-0-1.ec2.internal".into());
        node.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            provider_id: Some("aws:///us-east-1a/i-1".into()),
            ..Default::default()
        });
        let nodes = existing_nodes(vec![node], Vec::new());
        let claims = vec![
            claim("a", Phase::Pending, None),
            claim("b", Phase::Launched, Some("aws:///us-east-1a/i-1")),
            claim("c", Phase::Launched, Some("aws:///us-east-1b/i-2")),
            claim("d", Phase::Terminating, Some("aws:///us-east-1b/i-3")),
            // Their nodes went with their instances: nothing is on its way.
            claim("e", Phase::Draining, Some("aws:///us-east-1b/i-4")),
            claim("f", Phase::Initialized, Some("aws:///us-east-1b/i-5")),
            claim("g", Phase::Registered, Some("aws:///us-east-1b/i-6")),
        ];
        let names: Vec<String> = in_flight(claims, &nodes).into_iter().map(|c| c.name).collect();
        assert_eq!(names, vec!["a", "c"]);
    }

    /// The pending pods and the whole cluster's pods are two lists read at
    /// different revisions: a pod the scheduler bound between them is pending
    /// in one and on its node in the other, and must be planned only where it is.
    #[test]
    fn a_pod_bound_between_the_two_lists_is_not_pending() -> Result<(), Box<dyn std::error::Error>> {
        let pod = |uid: &str, node: Option<&str>| -> Result<Pod, serde_json::Error> {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("p-{uid}"), "namespace": "default", "uid": uid},
                "spec": {"containers": [], "nodeName": node},
                "status": {"phase": "Pending", "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]},
            }))
        };
        let mut node = Node::default();
        node.metadata.name = Some("n1".into());
        let state = StateRead {
            catalog: Arc::new(crate::catalog::builtin()?.clone()),
            unavailable: Vec::new(),
        };
        let lists: Lists = (
            vec![pod("u1", None)?, pod("u2", None)?],
            Paged::new(vec![
                vec![pod("u1", Some("n1"))?],
                vec![pod("u2", None)?, pod("u3", None)?],
            ]),
            vec![node],
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
        );
        let snapshot = assemble(Timestamp::UNIX_EPOCH, Vec::new(), state, lists);
        let uids = |pods: &[Pod]| -> Vec<String> { pods.iter().filter_map(|p| p.metadata.uid.clone()).collect() };
        assert_eq!(uids(&snapshot.nodes[0].pods), vec!["u1"]);
        // u3 is pending in the later list only: the pending list is what says
        // the scheduler gave up on it, so it waits for the next solve.
        assert_eq!(uids(&snapshot.pods), vec!["u2"]);
        Ok(())
    }

    #[test]
    fn finished_pods_free_their_nodes() {
        let mut node = Node::default();
        node.metadata.name = Some("n1".into());
        let pod = |phase: &str| Pod {
            spec: Some(k8s_openapi::api::core::v1::PodSpec {
                node_name: Some("n1".into()),
                ..Default::default()
            }),
            status: Some(k8s_openapi::api::core::v1::PodStatus {
                phase: Some(phase.into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let nodes = existing_nodes(vec![node], vec![pod("Running"), pod("Succeeded"), pod("Failed")]);
        assert_eq!(nodes[0].pods.len(), 1);
    }
}
