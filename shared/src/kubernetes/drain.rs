//! Draining a node: which pods to evict, in what order, and what blocks.
//! The choice is pure ([`plan`]); [`drain`] carries it out against a [`Cluster`].

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;

use super::cluster::{Cluster, ClusterError, EvictionOutcome};
use super::events::EventSpec;
use super::pods;

/// How a drain treats `karpenter.sh/do-not-disrupt`, and its deadline.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrainOptions {
    /// Evict do-not-disrupt pods too (only when the cloud imposes the
    /// disruption, e.g. a spot interruption, or a termination grace period ran out).
    pub ignore_do_not_disrupt: bool,
    /// The moment of the pass (do-not-disrupt durations and the deadline count to it).
    pub now: Timestamp,
    /// When the node's termination must be over (its `terminationGracePeriod`):
    /// each pod is deleted in time for its own grace period to end by then.
    pub deadline: Option<Timestamp>,
}

/// Why a pod is left where it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    /// Owned by a DaemonSet (it would come straight back).
    DaemonSet,
    /// A static pod's mirror (the kubelet owns it).
    Mirror,
    /// Already finished.
    Terminal,
    /// Already being deleted.
    Terminating,
    /// Tolerates the disrupted taint, so eviction would not move it.
    ToleratesDisruption,
}

/// What to do with one pod on a node being drained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodAction {
    /// Evict it now.
    Evict,
    /// Evict it after the non-critical pods are gone.
    EvictLater,
    /// Leave it.
    Skip(Skip),
    /// It blocks the drain: `karpenter.sh/do-not-disrupt`.
    DoNotDisrupt,
    /// Delete it now, past PDBs and do-not-disrupt: its grace period would
    /// otherwise outlast the drain's deadline.
    Delete,
}

/// Why a pod stays with its node whatever a drain does (its DaemonSet
/// would bring it straight back, the kubelet owns its mirror, or it has
/// finished); None when it moves with the node. The one answer the solver,
/// disruption and drains share.
pub fn stays_with_node(p: &Pod) -> Option<Skip> {
    if pods::is_daemonset_pod(p) {
        Some(Skip::DaemonSet)
    } else if pods::is_mirror_pod(p) {
        Some(Skip::Mirror)
    } else if pods::is_terminal(p) {
        Some(Skip::Terminal)
    } else {
        None
    }
}

/// Whether a pod moves when its node goes away (see [`stays_with_node`]).
pub fn moves_with_node(p: &Pod) -> bool {
    stays_with_node(p).is_none()
}

/// Decides for every pod of a node. Critical pods (system priority classes)
/// wait until every other evictable pod is gone, as Karpenter orders it.
pub fn plan(pods_on_node: &[Pod], opts: DrainOptions) -> Vec<PodAction> {
    let first: Vec<PodAction> = pods_on_node
        .iter()
        .map(|p| {
            if let Some(skip) = stays_with_node(p) {
                PodAction::Skip(skip)
            } else if pods::is_terminating(p) {
                PodAction::Skip(Skip::Terminating)
            } else if pods::tolerates_disrupted_taint(p) {
                PodAction::Skip(Skip::ToleratesDisruption)
            } else if crate::termination_grace::due(p, opts.deadline, opts.now) {
                PodAction::Delete
            } else if pods::has_do_not_disrupt(p, opts.now) && !opts.ignore_do_not_disrupt {
                PodAction::DoNotDisrupt
            } else if pods::is_critical(p) {
                PodAction::EvictLater
            } else {
                PodAction::Evict
            }
        })
        .collect();
    let others_left = first
        .iter()
        .any(|a| matches!(a, PodAction::Evict | PodAction::DoNotDisrupt));
    first
        .into_iter()
        .map(|a| {
            if a == PodAction::EvictLater && !others_left {
                PodAction::Evict
            } else {
                a
            }
        })
        .collect()
}

/// What one drain pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrainReport {
    /// Pods evicted (`namespace/name`).
    pub evicted: Vec<String>,
    /// Pods deleted to leave by the deadline.
    pub deleted: Vec<String>,
    /// Pods a PDB kept, with the server's reason.
    pub blocked_by_pdb: Vec<(String, String)>,
    /// Pods with `karpenter.sh/do-not-disrupt`.
    pub do_not_disrupt: Vec<String>,
    /// Critical pods waiting for the rest to go first.
    pub waiting: Vec<String>,
    /// Pods left alone on purpose.
    pub skipped: Vec<(String, Skip)>,
}

impl DrainReport {
    /// True when nothing evictable is left on the node (only skipped pods remain).
    pub fn is_complete(&self) -> bool {
        self.evicted.is_empty()
            && self.deleted.is_empty()
            && self.blocked_by_pdb.is_empty()
            && self.do_not_disrupt.is_empty()
            && self.waiting.is_empty()
    }
}

/// One drain pass over a node: evicts what may go now and reports the rest.
/// Call again until [`DrainReport::is_complete`]; PDB refusals are not errors.
/// Emits an `Evicted` event per evicted pod (event failures are logged, not fatal).
pub async fn drain<C: Cluster>(cluster: &C, node: &str, opts: DrainOptions) -> Result<DrainReport, ClusterError> {
    let pods_on_node = cluster.pods_on_node(node).await?;
    let actions = plan(&pods_on_node, opts);
    let mut report = DrainReport::default();
    for (pod, action) in pods_on_node.iter().zip(actions) {
        let key = pods::key(pod);
        match action {
            PodAction::Skip(s) => report.skipped.push((key, s)),
            PodAction::DoNotDisrupt => report.do_not_disrupt.push(key),
            PodAction::EvictLater => report.waiting.push(key),
            PodAction::Delete => {
                tracing::info!(pod = %key, node, deadline = ?opts.deadline, "deleting a pod so its grace period ends by the node's deadline");
                cluster.delete_pod(pod).await?;
                report.deleted.push(key);
            }
            PodAction::Evict => match cluster.evict(pod).await? {
                EvictionOutcome::Evicted => {
                    if let Err(e) = cluster.emit_event(&EventSpec::evicted(pod)).await {
                        tracing::warn!(pod = %key, error = %crate::telemetry::causes(&e), "could not record the eviction event");
                    }
                    report.evicted.push(key);
                }
                EvictionOutcome::Gone => report.evicted.push(key),
                EvictionOutcome::Blocked { reason } => report.blocked_by_pdb.push((key, reason)),
            },
        }
    }
    tracing::info!(
        node,
        evicted = report.evicted.len(),
        deleted = report.deleted.len(),
        blocked = report.blocked_by_pdb.len(),
        do_not_disrupt = report.do_not_disrupt.len(),
        waiting = report.waiting.len(),
        "drain pass"
    );
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(meta: serde_json::Value, spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": meta, "spec": spec, "status": {"phase": "Running"}})).unwrap()
    }

    #[test]
    fn plan_table() {
        let ds = pod(
            json!({"name": "ds", "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "u", "controller": true}]}),
            json!({"containers": []}),
        );
        let mirror = pod(
            json!({"name": "m", "annotations": {"kubernetes.io/config.mirror": "h"}}),
            json!({"containers": []}),
        );
        let dnd = pod(
            json!({"name": "x", "annotations": {"karpenter.sh/do-not-disrupt": "true"}}),
            json!({"containers": []}),
        );
        let plain = pod(json!({"name": "p"}), json!({"containers": []}));
        let critical = pod(
            json!({"name": "c"}),
            json!({"containers": [], "priorityClassName": "system-cluster-critical"}),
        );
        let tolerant = pod(
            json!({"name": "t"}),
            json!({"containers": [], "tolerations": [{"operator": "Exists"}]}),
        );

        let all = [
            ds.clone(),
            mirror.clone(),
            dnd.clone(),
            plain.clone(),
            critical.clone(),
            tolerant,
        ];
        assert_eq!(
            plan(&all, DrainOptions::default()),
            vec![
                PodAction::Skip(Skip::DaemonSet),
                PodAction::Skip(Skip::Mirror),
                PodAction::DoNotDisrupt,
                PodAction::Evict,
                PodAction::EvictLater,
                PodAction::Skip(Skip::ToleratesDisruption)
            ]
        );
        // Forced drains evict do-not-disrupt pods.
        assert_eq!(
            plan(
                std::slice::from_ref(&dnd),
                DrainOptions {
                    ignore_do_not_disrupt: true,
                    ..DrainOptions::default()
                }
            ),
            vec![PodAction::Evict]
        );
        // Critical pods go once the others are gone.
        assert_eq!(
            plan(&[ds, critical.clone()], DrainOptions::default()),
            vec![PodAction::Skip(Skip::DaemonSet), PodAction::Evict]
        );
        // A do-not-disrupt pod holds critical pods back too.
        assert_eq!(
            plan(&[dnd, critical], DrainOptions::default()),
            vec![PodAction::DoNotDisrupt, PodAction::EvictLater]
        );
    }

    #[test]
    fn pods_are_deleted_in_time_for_their_grace_to_end_by_the_deadline() {
        let start: Timestamp = "2026-03-01T12:00:00Z".parse().unwrap();
        let deadline = start + jiff::SignedDuration::from_hours(1);
        let with_grace = |name: &str, grace: i64, annotations: serde_json::Value| {
            pod(
                json!({"name": name, "annotations": annotations}),
                json!({"containers": [], "terminationGracePeriodSeconds": grace}),
            )
        };
        let dnd = with_grace("dnd", 300, json!({"karpenter.sh/do-not-disrupt": "true"}));
        let plain = with_grace("plain", 30, json!({}));
        let long = with_grace("long", 7200, json!({}));
        let at = |mins: i64| DrainOptions {
            now: start + jiff::SignedDuration::from_mins(mins),
            deadline: Some(deadline),
            ..DrainOptions::default()
        };
        let all = [dnd, plain, long];
        // A grace longer than the node's: deleted at once; the others wait or are evicted.
        assert_eq!(
            plan(&all, at(0)),
            vec![PodAction::DoNotDisrupt, PodAction::Evict, PodAction::Delete]
        );
        // 55 minutes in, the do-not-disrupt pod's 300 s must start now.
        assert_eq!(
            plan(&all, at(55)),
            vec![PodAction::Delete, PodAction::Evict, PodAction::Delete]
        );
        assert_eq!(
            plan(&all, at(60)),
            vec![PodAction::Delete, PodAction::Delete, PodAction::Delete]
        );
        // A do-not-disrupt duration that ran out no longer holds the pod.
        let expired = pod(
            json!({"name": "x", "creationTimestamp": "2026-03-01T10:00:00Z", "annotations": {"karpenter.sh/do-not-disrupt": "1h"}}),
            json!({"containers": []}),
        );
        assert_eq!(plan(std::slice::from_ref(&expired), at(0)), vec![PodAction::Evict]);
        let fresh = pod(
            json!({"name": "x", "creationTimestamp": "2026-03-01T11:30:00Z", "annotations": {"karpenter.sh/do-not-disrupt": "1h"}}),
            json!({"containers": []}),
        );
        assert_eq!(plan(std::slice::from_ref(&fresh), at(0)), vec![PodAction::DoNotDisrupt]);
    }
}
