//! One SQS batch of interruption events, between the per-event steps and the
//! batch's single replacement solve (pure).
//!
//! Each event's own steps (taint, record the drain, first eviction) are taken
//! at once, event by event; what needs the provision lease and a read of the
//! whole cluster (the replacement) is gathered here and planned once for the
//! whole batch, so a storm of warnings costs one read and one solve, and a
//! busy lease delays only the replacement, never a drain.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use crate::kubernetes::pods;
use crate::nodeclaim::NodeClaim;
use crate::snapshot::Snapshot;

/// A node whose pods the batch's solve places on new capacity.
#[derive(Clone, Debug, PartialEq)]
pub struct ToReplace {
    /// The node.
    pub node: String,
    /// Its pods as they were before the first eviction pass moved some off.
    pub pods: Vec<Pod>,
}

/// What the events of one batch leave for the batch's end.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    /// Nodes to replace, in the order the events named them, each once.
    replace: Vec<ToReplace>,
    /// Per message: the claims it acted on that move to Draining once the
    /// replacement is planned (a Draining claim is never replaced again, so
    /// it moves only after; a redelivery then still replaces).
    settle: BTreeMap<String, Vec<NodeClaim>>,
}

impl Batch {
    /// `message`'s event acted on `claim`; `replace` carries its node and the
    /// pods on it before the first eviction when the event asks for a
    /// replacement.
    pub fn acted(&mut self, message: &str, claim: &NodeClaim, replace: Option<ToReplace>) {
        if let Some(r) = replace
            && !self.replace.iter().any(|x| x.node == r.node)
        {
            self.replace.push(r);
        }
        self.settle.entry(message.to_string()).or_default().push(claim.clone());
    }

    /// The nodes the batch's one solve replaces.
    pub fn nodes(&self) -> Vec<String> {
        self.replace.iter().map(|r| r.node.clone()).collect()
    }

    /// Messages whose event needs the replacement (they fail when it does).
    pub fn replacing(&self) -> Vec<String> {
        self.settle
            .iter()
            .filter(|(_, claims)| {
                claims.iter().any(|c| {
                    c.node_name
                        .as_ref()
                        .is_some_and(|n| self.replace.iter().any(|r| &r.node == n))
                })
            })
            .map(|(m, _)| m.clone())
            .collect()
    }

    /// The claims each message moves to Draining at the batch's end.
    pub fn settling(&self) -> &BTreeMap<String, Vec<NodeClaim>> {
        &self.settle
    }

    /// Puts the pods the first eviction passes moved back on their nodes in
    /// `snapshot` (read after them), so the solve plans room for every pod
    /// the nodes held, as a replacement planned before evicting would.
    /// Terminal pods are left out.
    pub fn restore(&self, snapshot: &mut Snapshot) {
        for r in &self.replace {
            if let Some(n) = snapshot
                .nodes
                .iter_mut()
                .find(|n| n.node.metadata.name.as_deref() == Some(r.node.as_str()))
            {
                let present: Vec<String> = n.pods.iter().map(pods::key).collect();
                n.pods.extend(
                    r.pods
                        .iter()
                        .filter(|p| !pods::is_terminal(p) && !present.contains(&pods::key(p)))
                        .cloned(),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;

    use jiff::Timestamp;
    use serde_json::json;

    use super::*;
    use crate::capacity::{Pending, plan_replacements};
    use crate::scheduling::fixtures::{catalog, default_pool, managed_node, pod};
    use crate::scheduling::{ExistingNode, PodRef, SolveOptions};

    fn running(name: &str, node: &str) -> Pod {
        pod(
            name,
            "1",
            "1Gi",
            json!({"metadata": {"ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "u", "controller": true}]},
                "spec": {"nodeName": node}}),
        )
    }

    fn claim(name: &str, node: &str) -> NodeClaim {
        let mut c = NodeClaim::pending(name, "default", "k");
        c.node_name = Some(node.to_string());
        c
    }

    /// Four interrupted nodes of two pods each.
    fn cluster() -> (Snapshot, Vec<ToReplace>) {
        let now: Timestamp = "2026-03-01T12:00:00Z".parse().unwrap();
        let mut s = Snapshot::new(Arc::new(catalog()), now);
        s.node_pools = vec![default_pool()];
        let mut before = Vec::new();
        for i in 0..4 {
            let node = format!("n{i}");
            let pods = vec![running(&format!("a{i}"), &node), running(&format!("b{i}"), &node)];
            before.push(ToReplace {
                node: node.clone(),
                pods: pods.clone(),
            });
            s.nodes.push(ExistingNode {
                node: managed_node(&node),
                pods,
            });
        }
        (s, before)
    }

    #[test]
    fn a_batch_replaces_every_node_of_its_events_once_in_one_solve() {
        let (mut s, before) = cluster();
        let mut batch = Batch::default();
        for (i, r) in before.iter().enumerate() {
            batch.acted(&format!("m{i}"), &claim(&format!("c{i}"), &r.node), Some(r.clone()));
        }
        // The same warning delivered twice, and a second notice (no replacement).
        batch.acted("m0-again", &claim("c0", "n0"), Some(before[0].clone()));
        batch.acted("m9", &claim("c9", "n9"), None);
        assert_eq!(batch.nodes(), vec!["n0", "n1", "n2", "n3"]);
        assert_eq!(batch.replacing(), vec!["m0", "m0-again", "m1", "m2", "m3"]);
        assert_eq!(batch.settling().len(), 6);

        // The first eviction passes emptied the nodes before the batch's read.
        for n in s.nodes.iter_mut() {
            n.pods.clear();
        }
        let nodes = batch.nodes();
        let options = SolveOptions::without(nodes.clone());
        let unrestored = plan_replacements(&s, &nodes, &options, Pending::Ignore, "seed", |_| {});
        assert!(unrestored.new.is_empty(), "evicted pods are not on the nodes any more");

        // Restored, one solve plans room for all eight pods of the four nodes.
        batch.restore(&mut s);
        let plan = plan_replacements(&s, &nodes, &options, Pending::Ignore, "seed", |_| {});
        let placed: BTreeSet<PodRef> = plan.new.iter().flat_map(|p| p.priced.pods.clone()).collect();
        let wanted: BTreeSet<PodRef> = before.iter().flat_map(|r| r.pods.iter().map(PodRef::of)).collect();
        assert_eq!(placed, wanted, "{plan:#?}");
        assert_eq!(plan.unschedulable().count(), 0);
        let replaced: BTreeSet<&str> = plan.new.iter().map(|p| p.replaces.as_str()).collect();
        assert!(replaced.iter().all(|n| nodes.iter().any(|x| x == n)), "{replaced:?}");
        // Restoring twice adds nothing.
        let once = s.nodes[0].pods.len();
        batch.restore(&mut s);
        assert_eq!(s.nodes[0].pods.len(), once);
    }
}
