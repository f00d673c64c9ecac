//! The snapshot read from the live cluster and the state table.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod, Taint as K8sTaint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::Snapshot;
use crate::apis::Taint;
use crate::catalog::{self, Catalog, CatalogError};
use crate::kubernetes::{Cluster, ClusterError, pods};
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
/// offerings still unavailable at `now`.
pub async fn read(cluster: &impl Cluster, store: &StateStore, now: Timestamp) -> Result<Snapshot, SnapshotError> {
    let claims = store.in_flight_node_claims().await?;
    read_with_claims(cluster, store, now, claims).await
}

/// [`read`] with the in-flight claims the caller already read (a sweep reads
/// the claim partition once for its snapshot and its decisions).
pub async fn read_with_claims(
    cluster: &impl Cluster,
    store: &StateStore,
    now: Timestamp,
    claims: Vec<crate::nodeclaim::NodeClaim>,
) -> Result<Snapshot, SnapshotError> {
    let pods = cluster.pending_pods().await?;
    let all_pods = cluster.pods().await?;
    let catalog = match store.get_catalog().await? {
        Some(c) => Arc::new(c),
        None => Arc::new(catalog::builtin()?.clone()),
    };
    let nodes = existing_nodes(
        initializing_as_claimed(cluster.nodes().await?, &claims, &catalog),
        all_pods,
    );
    let node_claims = in_flight(claims, &nodes);
    let unavailable = store
        .unavailable_offerings(now.as_second())
        .await?
        .into_iter()
        .map(|u| u.key)
        .collect();
    Ok(Snapshot {
        now,
        pods,
        nodes,
        node_claims,
        node_pools: cluster.usable_node_pools().await?,
        node_classes: cluster.usable_node_classes().await?,
        daemon_sets: cluster.daemon_sets().await?,
        pod_disruption_budgets: cluster.pod_disruption_budgets().await?,
        persistent_volumes: cluster.persistent_volumes().await?,
        persistent_volume_claims: cluster.persistent_volume_claims().await?,
        storage_classes: cluster.storage_classes().await?,
        namespaces: cluster.namespaces().await?,
        catalog,
        unavailable,
        shifted_zones: BTreeSet::new(),
    })
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
/// Takes the pods by value: a whole cluster's pods are not copied.
pub fn existing_nodes(nodes: Vec<Node>, pods: Vec<Pod>) -> Vec<ExistingNode> {
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
