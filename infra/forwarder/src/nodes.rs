//! Nodes of nodesmith's (labelled `karpenter.sh/nodepool`) that still wait to
//! be registered or initialized: each one is reported
//! ([`NodeRef`]) when it appears and whenever its readiness, registration or
//! taints change while it has something to wait for, so `provision` registers
//! it at once. A Node registered and initialized is forgotten; a repeated
//! report is harmless (the function re-reads everything).
//! Pure: the caller feeds the watch's Nodes.

use std::collections::{BTreeSet, HashMap};

use k8s_openapi::api::core::v1::Node;
use nodesmith::labels;
use nodesmith::messages::NodeRef;

/// What nodesmith's handling of a joining Node depends on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JoinState {
    /// `Ready=True`.
    pub ready: bool,
    /// Registered: `karpenter.sh/registered=true` and no `unregistered` taint.
    pub registered: bool,
    /// The keys of its taints (startup taints going away let it initialize).
    pub taints: BTreeSet<String>,
}

impl JoinState {
    /// Whether nodesmith can act on the Node now: register it, or initialize a Ready one.
    pub fn actionable(&self) -> bool {
        !self.registered || self.ready
    }
}

/// The Node's state when it is one of nodesmith's and not yet both registered
/// and initialized; None otherwise.
pub fn joining_state(node: &Node) -> Option<JoinState> {
    let l = node.metadata.labels.as_ref()?;
    if !l.contains_key(labels::NODEPOOL) {
        return None;
    }
    let taints: BTreeSet<String> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|ts| ts.iter().map(|t| t.key.clone()).collect())
        .unwrap_or_default();
    let label_true = |k: &str| l.get(k).is_some_and(|v| v == "true");
    let registered = label_true(labels::REGISTERED) && !taints.contains(labels::UNREGISTERED_TAINT_KEY);
    if registered && label_true(labels::INITIALIZED) {
        return None;
    }
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    Some(JoinState {
        ready,
        registered,
        taints,
    })
}

/// The joining Nodes seen, by uid, with the state last seen.
#[derive(Clone, Debug, Default)]
pub struct JoiningNodes {
    seen: HashMap<String, JoinState>,
}

impl JoiningNodes {
    /// A Node from the watch: the reference to send, when it is news nodesmith can act on.
    pub fn observe(&mut self, node: &Node) -> Option<NodeRef> {
        let uid = node.metadata.uid.as_deref()?;
        let name = node.metadata.name.as_deref()?;
        let Some(state) = joining_state(node) else {
            self.seen.remove(uid);
            return None;
        };
        if self.seen.get(uid) == Some(&state) {
            return None;
        }
        let send = state.actionable();
        self.seen.insert(uid.to_string(), state);
        send.then(|| NodeRef::new(name))
    }

    /// The Node was deleted.
    pub fn forget(&mut self, node: &Node) {
        if let Some(uid) = node.metadata.uid.as_deref() {
            self.seen.remove(uid);
        }
    }

    /// How many joining Nodes are remembered.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}
