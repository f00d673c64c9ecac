//! Termination as Karpenter does it, decided as data: which claims' nodes
//! must now be drained and then terminated ([`to_begin`]), and when a
//! termination in progress is carried out ([`due`]).
//!
//! Four things terminate a node. Its Node is deleted (`kubectl delete
//! node`): nodesmith's Nodes carry Karpenter's termination finalizer
//! ([`crate::labels::TERMINATION_FINALIZER`]), so the Node stays, marked for
//! deletion, while it is drained gracefully — PDBs honoured until the pool's
//! `terminationGracePeriod` has passed since the deletion — then its instance
//! is terminated and the finalizer removed. Its NodeClaim object is deleted
//! (`kubectl delete nodeclaim`, [`crate::mirror`]): the same, the object held
//! by the same finalizer until the claim is gone. Its NodePool is deleted: every
//! claim of the pool is drained and terminated, with no replacement and no
//! budget, as Karpenter's NodePool deletion does through the NodeClaims it
//! owns. An interruption drains it (`interrupt` records the termination with
//! the drain): once the drain completes or its deadline passes the
//! instance is terminated, as Karpenter deletes an interrupted NodeClaim.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;

use crate::apis::NodePool;
use crate::draining::DrainPolicy;
use crate::ec2::{Instance, InstanceState};
use crate::labels;
use crate::nodeclaim::{NodeClaim, Phase};
use crate::registration::instance_id;
use crate::state::TerminationRecord;

/// Why a termination began: the claim's Node was deleted.
pub const NODE_DELETED: &str = "node-deleted";
/// Why a termination began: the claim's NodeClaim object was deleted.
pub const NODECLAIM_DELETED: &str = "nodeclaim-deleted";
/// Why a termination began: the claim's NodePool was deleted.
pub const NODEPOOL_DELETED: &str = "nodepool-deleted";
/// Why a termination began: its static NodePool's `replicas` was lowered.
pub const REPLICAS_LOWERED: &str = "replicas-lowered";

/// A termination to begin: taint the node, move the claim to Draining,
/// record the drain (when there is a Node) and the termination.
#[derive(Debug, Clone, PartialEq)]
pub struct Begin {
    /// The claim.
    pub claim: String,
    /// Its Node, when registered.
    pub node: Option<String>,
    /// [`NODE_DELETED`], [`NODECLAIM_DELETED`], [`NODEPOOL_DELETED`] or [`REPLICAS_LOWERED`].
    pub reason: &'static str,
    /// How the node is drained; its deadline is when the instance goes whatever the drain says.
    pub policy: DrainPolicy,
}

/// What the sweep saw, for terminations.
#[derive(Debug, Clone, Copy)]
pub struct Seen<'a> {
    /// The moment.
    pub now: Timestamp,
    /// Every NodeClaim in the state table.
    pub claims: &'a [NodeClaim],
    /// Every Node.
    pub nodes: &'a [Node],
    /// The instances EC2 reports for the cluster.
    pub instances: &'a [Instance],
    /// Every NodePool; None when they could not be read (no pool counts as deleted then).
    pub pools: Option<&'a [NodePool]>,
    /// Terminations already recorded.
    pub terminations: &'a [TerminationRecord],
    /// Claims a disruption is taking down (it terminates them itself).
    pub disrupting: &'a BTreeSet<String>,
    /// Claims whose NodeClaim object is marked for deletion and still held
    /// by the finalizer ([`crate::mirror::deleted_at`]), and since when.
    pub objects_deleted: &'a BTreeMap<String, Timestamp>,
}

/// When the Node was deleted, if it was and our finalizer holds it.
fn deleting_with_finalizer(n: &Node) -> Option<Timestamp> {
    let ours = n
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == labels::TERMINATION_FINALIZER));
    if !ours {
        return None;
    }
    n.metadata.deletion_timestamp.as_ref().map(|t| t.0)
}

/// The terminations to begin now (pure): claims with a live instance whose
/// Node or NodeClaim object is being deleted and still holds the finalizer,
/// or whose NodePool no longer exists, unless a termination or a disruption
/// has them already.
/// A claim whose instance is gone is the lifecycle's to remove.
pub fn to_begin(seen: &Seen<'_>) -> Vec<Begin> {
    let live: BTreeSet<&str> = seen
        .instances
        .iter()
        .filter(|i| matches!(i.state, InstanceState::Pending | InstanceState::Running))
        .map(|i| i.id.as_str())
        .collect();
    let nodes: BTreeMap<&str, &Node> = seen
        .nodes
        .iter()
        .filter_map(|n| Some((n.spec.as_ref()?.provider_id.as_deref().and_then(instance_id)?, n)))
        .collect();
    let recorded: BTreeSet<&str> = seen.terminations.iter().map(|t| t.claim.as_str()).collect();
    let mut out = Vec::new();
    for c in seen.claims {
        if recorded.contains(c.name.as_str()) || seen.disrupting.contains(&c.name) {
            continue;
        }
        if !matches!(
            c.phase,
            Phase::Launched | Phase::Registered | Phase::Initialized | Phase::Draining
        ) {
            continue;
        }
        let Some(id) = c.instance_id.as_deref().filter(|id| live.contains(id)) else {
            continue;
        };
        let node = nodes.get(id).copied();
        let pool = seen.pools.map(|ps| {
            ps.iter()
                .find(|p| p.metadata.name.as_deref() == Some(c.node_pool.as_str()))
        });
        // Karpenter bounds the drain by the claim's grace period (recorded on
        // the claim at launch, else the pool's): from the Node's deletion, or
        // from now when its pool is gone.
        let grace = crate::termination_grace::period(Some(c), pool.flatten());
        let object_deleted = seen.objects_deleted.get(&c.name).copied();
        let (reason, deadline) = match (node.and_then(deleting_with_finalizer), object_deleted, pool) {
            (Some(deleted), _, _) => (NODE_DELETED, crate::termination_grace::deadline(deleted, grace)),
            (None, Some(deleted), _) => (NODECLAIM_DELETED, crate::termination_grace::deadline(deleted, grace)),
            (None, None, Some(None)) => (NODEPOOL_DELETED, crate::termination_grace::deadline(seen.now, grace)),
            (None, None, _) => continue,
        };
        out.push(Begin {
            claim: c.name.clone(),
            node: node.and_then(|n| n.metadata.name.clone()),
            reason,
            policy: DrainPolicy {
                deadline,
                force_from: deadline,
            },
        });
    }
    out
}

/// The terminations that take a static pool down to its count (pure): each
/// surplus claim drained within its grace period from `now`, then
/// terminated, with no replacement and no budget (Karpenter's static
/// scale-down). Claims a disruption or a termination already has are left.
pub fn scale_down(
    surplus: &[String],
    claims: &[NodeClaim],
    pool: &NodePool,
    busy: &BTreeSet<String>,
    now: Timestamp,
) -> Vec<Begin> {
    surplus
        .iter()
        .filter(|name| !busy.contains(*name))
        .filter_map(|name| claims.iter().find(|c| &c.name == name))
        .map(|c| {
            let grace = crate::termination_grace::period(Some(c), Some(pool));
            let deadline = crate::termination_grace::deadline(now, grace);
            Begin {
                claim: c.name.clone(),
                node: c.node_name.clone(),
                reason: REPLICAS_LOWERED,
                policy: DrainPolicy {
                    deadline,
                    force_from: deadline,
                },
            }
        })
        .collect()
}

/// The record of a termination beginning at `now` (pure).
pub fn record(b: &Begin, now: Timestamp) -> TerminationRecord {
    TerminationRecord {
        claim: b.claim.clone(),
        node: b.node.clone(),
        reason: b.reason.to_string(),
        deadline_ms: b.policy.deadline.map(|t| t.as_millisecond()),
        started_ms: now.as_millisecond(),
    }
}

/// Whether a termination is carried out now (pure): its drain is no longer
/// recorded (finished, its node gone, or there was nothing to drain), or its
/// deadline has passed.
pub fn due(r: &TerminationRecord, drain_recorded: bool, now: Timestamp) -> bool {
    !drain_recorded || r.deadline_ms.is_some_and(|d| now.as_millisecond() >= d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn claim(name: &str, pool: &str, id: &str, phase: Phase) -> NodeClaim {
        NodeClaim {
            phase,
            instance_id: Some(id.into()),
            ..NodeClaim::pending(name, pool, "default")
        }
    }

    fn node(name: &str, id: &str, deleted: Option<&str>, finalizer: bool) -> Node {
        let mut v = json!({"metadata": {"name": name}, "spec": {"providerID": format!("aws:///us-east-1a/{id}")}});
        if let Some(t) = deleted {
            v["metadata"]["deletionTimestamp"] = json!(t);
        }
        if finalizer {
            v["metadata"]["finalizers"] = json!([labels::TERMINATION_FINALIZER]);
        }
        serde_json::from_value(v).unwrap()
    }

    fn instance(id: &str, state: InstanceState) -> Instance {
        Instance {
            id: id.into(),
            instance_type: "m5.large".into(),
            zone: None,
            subnet_id: None,
            image_id: None,
            security_group_ids: BTreeSet::new(),
            state,
            capacity_type: "on-demand".into(),
            capacity_reservation: None,
            launch_time: None,
            tags: BTreeMap::new(),
        }
    }

    fn pool(name: &str, grace: Option<&str>) -> NodePool {
        let mut spec = json!({"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}, "requirements": []});
        if let Some(g) = grace {
            spec["terminationGracePeriod"] = json!(g);
        }
        serde_json::from_value(
            json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name},
            "spec": {"template": {"spec": spec}}}),
        )
        .unwrap()
    }

    #[test]
    fn a_deleted_node_holding_the_finalizer_is_drained_within_its_pools_grace_period() {
        let now = ts("2026-11-27T12:00:00Z");
        let claims = [
            claim("a", "web", "i-a", Phase::Initialized),
            claim("b", "web", "i-b", Phase::Initialized),
            claim("c", "web", "i-c", Phase::Initialized),
            claim("gone", "web", "i-gone", Phase::Initialized),
        ];
        let nodes = [
            node("n-a", "i-a", Some("2026-11-27T11:59:00Z"), true),
            // Deleted without the finalizer: the API server has removed it already.
            node("n-b", "i-b", Some("2026-11-27T11:59:00Z"), false),
            node("n-c", "i-c", None, true),
            node("n-gone", "i-gone", Some("2026-11-27T11:59:00Z"), true),
        ];
        let instances = [
            instance("i-a", InstanceState::Running),
            instance("i-b", InstanceState::Running),
            instance("i-c", InstanceState::Running),
            instance("i-gone", InstanceState::ShuttingDown),
        ];
        let pools = [pool("web", Some("1h"))];
        let none = BTreeSet::new();
        let seen = Seen {
            now,
            claims: &claims,
            nodes: &nodes,
            instances: &instances,
            pools: Some(&pools),
            terminations: &[],
            disrupting: &none,
            objects_deleted: &BTreeMap::new(),
        };
        let deadline = ts("2026-11-27T12:59:00Z");
        assert_eq!(
            to_begin(&seen),
            vec![Begin {
                claim: "a".into(),
                node: Some("n-a".into()),
                reason: NODE_DELETED,
                policy: DrainPolicy {
                    deadline: Some(deadline),
                    force_from: Some(deadline)
                },
            }]
        );
        // Without a grace period the drain honours PDBs for as long as they hold.
        let pools = [pool("web", None)];
        let got = to_begin(&Seen {
            pools: Some(&pools),
            ..seen
        });
        assert_eq!(
            got[0].policy,
            DrainPolicy {
                deadline: None,
                force_from: None
            }
        );
        // Begun once; a disruption's claim is left to the disruption.
        let recorded = [record(&got[0], now)];
        assert!(
            to_begin(&Seen {
                terminations: &recorded,
                ..seen
            })
            .is_empty()
        );
        let disrupting = BTreeSet::from(["a".to_string()]);
        assert!(
            to_begin(&Seen {
                disrupting: &disrupting,
                ..seen
            })
            .is_empty()
        );
    }

    #[test]
    fn a_deleted_nodeclaim_object_drains_its_node_within_the_grace_period_from_its_deletion() {
        let now = ts("2026-11-27T12:00:00Z");
        let claims = [
            claim("a", "web", "i-a", Phase::Initialized),
            claim("b", "web", "i-b", Phase::Initialized),
        ];
        // b's Node is deleted too, earlier: the Node's deletion is the reason.
        let nodes = [
            node("n-a", "i-a", None, true),
            node("n-b", "i-b", Some("2026-11-27T11:50:00Z"), true),
        ];
        let instances = [
            instance("i-a", InstanceState::Running),
            instance("i-b", InstanceState::Running),
        ];
        let pools = [pool("web", Some("30m"))];
        let none = BTreeSet::new();
        let deleted = BTreeMap::from([
            ("a".to_string(), ts("2026-11-27T11:58:00Z")),
            ("b".to_string(), ts("2026-11-27T11:59:00Z")),
        ]);
        let got: Vec<(String, Option<String>, &str, Option<Timestamp>)> = to_begin(&Seen {
            now,
            claims: &claims,
            nodes: &nodes,
            instances: &instances,
            pools: Some(&pools),
            terminations: &[],
            disrupting: &none,
            objects_deleted: &deleted,
        })
        .into_iter()
        .map(|b| (b.claim, b.node, b.reason, b.policy.deadline))
        .collect();
        assert_eq!(
            got,
            vec![
                (
                    "a".into(),
                    Some("n-a".into()),
                    NODECLAIM_DELETED,
                    Some(ts("2026-11-27T12:28:00Z"))
                ),
                (
                    "b".into(),
                    Some("n-b".into()),
                    NODE_DELETED,
                    Some(ts("2026-11-27T12:20:00Z"))
                ),
            ]
        );
    }

    #[test]
    fn a_deleted_pools_claims_are_terminated_when_the_pools_were_read() {
        let now = ts("2026-11-27T12:00:00Z");
        let claims = [
            claim("a", "old", "i-a", Phase::Initialized),
            claim("l", "old", "i-l", Phase::Launched),
            claim("p", "old", "i-p", Phase::Pending),
            claim("k", "kept", "i-k", Phase::Initialized),
        ];
        let nodes = [node("n-a", "i-a", None, true), node("n-k", "i-k", None, true)];
        let instances = [
            instance("i-a", InstanceState::Running),
            instance("i-l", InstanceState::Pending),
            instance("i-k", InstanceState::Running),
        ];
        let pools = [pool("kept", None)];
        let none = BTreeSet::new();
        let seen = Seen {
            now,
            claims: &claims,
            nodes: &nodes,
            instances: &instances,
            pools: Some(&pools),
            terminations: &[],
            disrupting: &none,
            objects_deleted: &BTreeMap::new(),
        };
        let got: Vec<(String, Option<String>, &str)> = to_begin(&seen)
            .into_iter()
            .map(|b| (b.claim, b.node, b.reason))
            .collect();
        assert_eq!(
            got,
            vec![
                ("a".into(), Some("n-a".into()), NODEPOOL_DELETED),
                ("l".into(), None, NODEPOOL_DELETED)
            ]
        );
        // Pools that could not be read delete nothing.
        assert!(to_begin(&Seen { pools: None, ..seen }).is_empty());
    }

    #[test]
    fn a_termination_is_due_once_drained_or_past_its_deadline() {
        let now = ts("2026-11-27T12:00:00Z");
        let r = TerminationRecord {
            claim: "a".into(),
            node: Some("n".into()),
            reason: "spot-interruption".into(),
            deadline_ms: Some(now.as_millisecond() + 1),
            started_ms: now.as_millisecond() - 60_000,
        };
        assert!(!due(&r, true, now));
        assert!(due(&r, false, now), "drained");
        assert!(due(&r, true, ts("2026-11-27T12:00:01Z")), "deadline passed");
        let open = TerminationRecord { deadline_ms: None, ..r };
        assert!(!due(&open, true, ts("2030-01-01T00:00:00Z")));
    }
}
