//! A Node joining, handled as it happens: the forwarder reports each Node of
//! nodesmith's that appears or changes readiness ([`crate::messages::NodeRef`]),
//! and `provision` registers and initializes it at once, instead of leaving it
//! tainted until the next sweep. The decision is the sweep's own
//! ([`lifecycle::joining_action`]) and every write is idempotent and
//! version-checked, so a repeated or stale message, or a sweep acting at the
//! same moment, changes nothing twice. Anything unusual (no claim yet, a
//! registration the API server refuses) is left to the sweep, the safety net.
//!
//! Only the Node, its claim and the catalog are read: no failing read of
//! anything else can hold a registration back.

use jiff::Timestamp;

use crate::catalog::{self, Catalog};
use crate::kubernetes::{Cluster, ClusterError, EventSpec};
use crate::labels;
use crate::lifecycle::{self, Action};
use crate::messages::NodeRef;
use crate::nodeclaim::{InvalidTransition, NodeClaim, Phase};
use crate::registration;
use crate::state::{Advance, StateError, StateStore};

/// What became of one Node message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Joined {
    /// The Node was registered and, when Ready, initialized by this call (the steps taken).
    Moved(Vec<&'static str>),
    /// The Node needed nothing (already registered and initialized, or not Ready yet).
    Nothing,
    /// No such Node, or not one of nodesmith's (no `karpenter.sh/nodepool` label).
    NotOurs,
    /// No claim names its instance yet, or the API server refused the
    /// registration: the sweep decides.
    LeftToSweep(String),
}

/// A read or write failed; the message is retried.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// The Kubernetes API failed.
    #[error("node {node}")]
    Cluster {
        /// The Node.
        node: String,
        /// The failure.
        #[source]
        source: ClusterError,
    },
    /// The state table failed.
    #[error("claim of node {node}")]
    State {
        /// The Node.
        node: String,
        /// The failure.
        #[source]
        source: StateError,
    },
}

/// Most steps one message takes: register, then initialize.
const MAX_STEPS: usize = 2;

/// Registers and initializes the Node `node` names, as far as it is ready to be, at `now`.
pub async fn join<C: Cluster>(
    cluster: &C,
    store: &StateStore,
    node: &NodeRef,
    now: Timestamp,
) -> Result<Joined, JoinError> {
    let name = node.name.as_str();
    let kube = |source| JoinError::Cluster {
        node: name.to_string(),
        source,
    };
    let state = |source| JoinError::State {
        node: name.to_string(),
        source,
    };
    let catalog = catalog_or_builtin(store).await;
    let mut steps = Vec::new();
    for _ in 0..MAX_STEPS {
        let Some(n) = cluster.node(name).await.map_err(kube)? else {
            return Ok(Joined::NotOurs);
        };
        let ours = n
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(labels::NODEPOOL));
        let instance = n
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .and_then(registration::instance_id);
        let (true, Some(instance)) = (ours, instance) else {
            return Ok(Joined::NotOurs);
        };
        let Some(claim) = claim_of(store, instance).await.map_err(state)? else {
            return Ok(Joined::LeftToSweep(format!("no claim names instance {instance} yet")));
        };
        match lifecycle::joining_action(&claim, &n, catalog.as_ref()) {
            Some(Action::Register { claim, node, update }) => {
                match cluster.update_node(&node, &update).await {
                    Ok(true) => {}
                    Ok(false) => return Ok(Joined::NotOurs),
                    // The sweep gives such a claim up (and terminates its instance).
                    Err(ClusterError::Api { code: 422, message, .. }) => {
                        return Ok(Joined::LeftToSweep(format!("registration refused: {message}")));
                    }
                    Err(e) => return Err(kube(e)),
                }
                if advance(store, &claim, Phase::Launched, |c| c.registered(&node, now))
                    .await
                    .map_err(state)?
                {
                    emit(cluster, EventSpec::registered(&node, &claim)).await;
                }
                steps.push("registered");
            }
            Some(Action::Initialize { claim, node }) => {
                if !cluster
                    .update_node(&node, &registration::initialization_update())
                    .await
                    .map_err(kube)?
                {
                    return Ok(Joined::NotOurs);
                }
                if advance(store, &claim, Phase::Registered, |c| c.advance(Phase::Initialized, now))
                    .await
                    .map_err(state)?
                {
                    emit(cluster, EventSpec::initialized(&node, &claim)).await;
                }
                steps.push("initialized");
            }
            _ => break,
        }
    }
    Ok(if steps.is_empty() {
        Joined::Nothing
    } else {
        Joined::Moved(steps)
    })
}

/// The stored catalog (the instance labels a registration writes); the
/// built-in one when it cannot be read, so a catalog failure holds nothing back.
async fn catalog_or_builtin(store: &StateStore) -> Option<Catalog> {
    match store.get_catalog().await {
        Ok(Some(c)) => return Some(c),
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(error = %crate::telemetry::causes(&e), "cannot read the stored catalog; registering with the built-in one");
        }
    }
    catalog::builtin().ok().cloned()
}

/// The claim that launched `instance`, read by name after the index lookup
/// (the index is eventually consistent, the item read is not).
async fn claim_of(store: &StateStore, instance: &str) -> Result<Option<NodeClaim>, StateError> {
    let Some(found) = store.node_claim_by_instance(instance).await? else {
        return Ok(None);
    };
    store.get_node_claim(&found.name).await
}

/// Moves the claim on from `from`, version-checked; true when this call moved it.
async fn advance(
    store: &StateStore,
    name: &str,
    from: Phase,
    step: impl Fn(&mut NodeClaim) -> Result<(), InvalidTransition>,
) -> Result<bool, StateError> {
    let advanced = store
        .advance_node_claim(name, |c| {
            let mut next = c.clone();
            (c.phase == from && step(&mut next).is_ok()).then_some(next)
        })
        .await?;
    Ok(matches!(advanced, Advance::Moved(_)))
}

async fn emit<C: Cluster>(cluster: &C, event: EventSpec) {
    if let Err(e) = cluster.emit_event(&event).await {
        tracing::warn!(error = %crate::telemetry::causes(&e), reason = %event.reason, "cannot record the event");
    }
}
