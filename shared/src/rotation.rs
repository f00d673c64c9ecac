//! `nodesmith rotate`: replacing a pool's nodes, or one node, the way drift
//! replaces them: a replacement first, within the pool's disruption budgets,
//! recorded and resumed like any disruption. The request is an annotation on
//! each Node ([`labels::ROTATE_ANNOTATION`], the time of the request), which
//! the drift method reads; the nodes that replace them do not carry it, so a
//! rotation ends by itself, and asking twice changes nothing.

use jiff::Timestamp;

use crate::kubernetes::{Cluster, ClusterError, NodeUpdate};
use crate::labels;
use crate::nodeclaim::{NodeClaim, Phase};
use crate::state::{StateError, StateStore};

/// What to rotate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// Every node of this NodePool.
    Pool(String),
    /// This one node.
    Node(String),
}

/// One node asked to rotate.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Rotation {
    /// The Node.
    pub node: String,
    /// Its NodeClaim.
    pub node_claim: String,
    /// Its NodePool.
    pub node_pool: String,
    /// When the rotation was asked for (an earlier request's time when it was asked before).
    pub requested_at: String,
    /// Whether an earlier request had asked already.
    pub already_requested: bool,
}

/// Why a rotation could not be asked for.
#[derive(Debug, thiserror::Error)]
pub enum RotateError {
    /// The node is not one nodesmith manages (or has not registered yet).
    #[error("node {0} is not a registered nodesmith node (is it Karpenter's, or still launching?)")]
    NotManaged(String),
    /// The pool has no registered node.
    #[error("NodePool {0} has no registered nodesmith node")]
    EmptyPool(String),
    /// The state table could not be read.
    #[error("cannot read the state table")]
    State(#[source] StateError),
    /// The Nodes could not be listed.
    #[error("cannot list the nodes")]
    List(#[source] ClusterError),
    /// A Node could not be annotated.
    #[error("node {node}")]
    Cluster {
        /// The node.
        node: String,
        /// Why.
        #[source]
        source: ClusterError,
    },
}

/// The claims a selection names: registered nodes not already on their way
/// out (pure).
pub fn select<'a>(claims: &'a [NodeClaim], selection: &Selection) -> Result<Vec<&'a NodeClaim>, RotateError> {
    let live = |c: &&NodeClaim| c.node_name.is_some() && matches!(c.phase, Phase::Registered | Phase::Initialized);
    let picked: Vec<&NodeClaim> = match selection {
        Selection::Pool(pool) => claims.iter().filter(live).filter(|c| &c.node_pool == pool).collect(),
        Selection::Node(node) => claims
            .iter()
            .filter(live)
            .filter(|c| c.node_name.as_ref() == Some(node))
            .collect(),
    };
    match (picked.is_empty(), selection) {
        (true, Selection::Pool(p)) => Err(RotateError::EmptyPool(p.clone())),
        (true, Selection::Node(n)) => Err(RotateError::NotManaged(n.clone())),
        (false, _) => Ok(picked),
    }
}

/// Asks for the selection's nodes to rotate at `now`: annotates each Node
/// not annotated yet. The sweep does the rest.
pub async fn request<C: Cluster>(
    store: &StateStore,
    cluster: &C,
    selection: &Selection,
    now: Timestamp,
) -> Result<Vec<Rotation>, RotateError> {
    let claims = store.list_node_claims().await.map_err(RotateError::State)?;
    let selected = select(&claims, selection)?;
    // One list for a pool of any size, not a read per node.
    let listed = cluster.nodes().await.map_err(RotateError::List)?;
    let by_name: std::collections::BTreeMap<&str, &k8s_openapi::api::core::v1::Node> = listed
        .iter()
        .filter_map(|n| Some((n.metadata.name.as_deref()?, n)))
        .collect();
    let mut out = Vec::new();
    for claim in selected {
        let node = claim.node_name.clone().unwrap_or_default();
        let Some(current) = by_name.get(node.as_str()) else {
            return Err(RotateError::NotManaged(node));
        };
        let earlier = current
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(labels::ROTATE_ANNOTATION))
            .cloned();
        let requested_at = match &earlier {
            Some(at) => at.clone(),
            None => {
                let at = now.to_string();
                let update = NodeUpdate {
                    annotations: [(labels::ROTATE_ANNOTATION.to_string(), at.clone())].into(),
                    ..NodeUpdate::default()
                };
                cluster
                    .update_node(&node, &update)
                    .await
                    .map_err(|source| RotateError::Cluster {
                        node: node.clone(),
                        source,
                    })?;
                at
            }
        };
        out.push(Rotation {
            node,
            node_claim: claim.name.clone(),
            node_pool: claim.node_pool.clone(),
            requested_at,
            already_requested: earlier.is_some(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(name: &str, pool: &str, phase: Phase, node: Option<&str>) -> NodeClaim {
        NodeClaim {
            phase,
            node_name: node.map(str::to_string),
            ..NodeClaim::pending(name, pool, "default")
        }
    }

    #[test]
    fn a_selection_names_registered_nodes_not_on_their_way_out() {
        let claims = [
            claim("a", "web", Phase::Initialized, Some("n-a")),
            claim("b", "web", Phase::Registered, Some("n-b")),
            claim("c", "web", Phase::Launched, None),
            claim("d", "web", Phase::Draining, Some("n-d")),
            claim("e", "batch", Phase::Initialized, Some("n-e")),
        ];
        let names = |s: &Selection| -> Result<Vec<String>, String> {
            select(&claims, s)
                .map(|v| v.iter().map(|c| c.name.clone()).collect())
                .map_err(|e| e.to_string())
        };
        assert_eq!(names(&Selection::Pool("web".into())), Ok(vec!["a".into(), "b".into()]));
        assert_eq!(names(&Selection::Node("n-e".into())), Ok(vec!["e".into()]));
        assert_eq!(
            names(&Selection::Node("n-d".into())),
            Err("node n-d is not a registered nodesmith node (is it Karpenter's, or still launching?)".into())
        );
        assert_eq!(
            names(&Selection::Pool("gpu".into())),
            Err("NodePool gpu has no registered nodesmith node".into())
        );
    }
}
