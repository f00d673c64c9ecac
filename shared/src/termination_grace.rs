//! `terminationGracePeriod` (pure): once a node's termination begins, for
//! whatever reason (expiry, drift, consolidation, emptiness, an interruption,
//! a user's delete), it ends at most that long after. Until then PDBs and
//! do-not-disrupt are honoured, except that each pod still on the node is
//! deleted early enough for its own `terminationGracePeriodSeconds` to end by
//! the deadline (Karpenter deletes it at deadline minus that grace, bypassing
//! PDBs and do-not-disrupt); at the deadline what is left goes.
//!
//! The period is the one the node was launched with (stamped on its claim,
//! as Karpenter copies it onto the NodeClaim), else its pool's today.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Pod;

use crate::apis::NodePool;
use crate::nodeclaim::NodeClaim;

/// A pod's grace period when its spec has none (the API server's default).
pub const DEFAULT_POD_GRACE: Duration = Duration::from_secs(30);

/// The period a node of `claim` gets: the claim's, else `pool`'s.
pub fn period(claim: Option<&NodeClaim>, pool: Option<&NodePool>) -> Option<Duration> {
    claim
        .and_then(|c| c.termination_grace_period.as_ref())
        .or_else(|| pool.and_then(|p| p.spec.template.spec.termination_grace_period.as_ref()))
        .and_then(|d| d.duration())
}

/// When a termination that began at `started` must be over (None: no bound).
pub fn deadline(started: Timestamp, period: Option<Duration>) -> Option<Timestamp> {
    let span = SignedDuration::try_from(period?).ok()?;
    started.checked_add(span).ok()
}

/// The earlier of two deadlines (None is no deadline).
pub fn earlier(a: Option<Timestamp>, b: Option<Timestamp>) -> Option<Timestamp> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The pod's own grace period (`spec.terminationGracePeriodSeconds`).
pub fn pod_grace(pod: &Pod) -> Duration {
    pod.spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .map_or(DEFAULT_POD_GRACE, |s| {
            Duration::from_secs(u64::try_from(s).unwrap_or(0))
        })
}

/// From when the pod is deleted rather than evicted, so that its grace
/// period ends by `deadline`.
pub fn delete_from(pod: &Pod, deadline: Timestamp) -> Timestamp {
    SignedDuration::try_from(pod_grace(pod))
        .ok()
        .and_then(|g| deadline.checked_sub(g).ok())
        .unwrap_or(Timestamp::MIN)
}

/// Whether the pod must be deleted at `now` to leave by `deadline`.
pub fn due(pod: &Pod, deadline: Option<Timestamp>, now: Timestamp) -> bool {
    deadline.is_some_and(|d| now >= delete_from(pod, d))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(grace: Option<i64>) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {"containers": [],
            "terminationGracePeriodSeconds": grace}}))
        .unwrap()
    }

    #[test]
    fn each_pod_goes_in_time_for_its_own_grace_to_end_by_the_deadline() {
        let start: Timestamp = "2026-03-01T12:00:00Z".parse().unwrap();
        let hour = Some(Duration::from_secs(3600));
        let end = deadline(start, hour).unwrap();
        assert_eq!(end, "2026-03-01T13:00:00Z".parse().unwrap());
        assert_eq!(deadline(start, None), None);
        let at = |m: i64| start + SignedDuration::from_mins(m);
        // Karpenter's example: 300 s of grace, deleted 55 minutes in.
        let five_minutes = pod(Some(300));
        assert!(!due(&five_minutes, Some(end), at(54)));
        assert!(due(&five_minutes, Some(end), at(55)));
        // No grace given: the API server's 30 s.
        assert!(!due(&pod(None), Some(end), at(59)));
        assert!(due(&pod(None), Some(end), at(60) - SignedDuration::from_secs(30)));
        // A grace longer than the node's: deleted as soon as the drain begins.
        assert!(due(&pod(Some(7200)), Some(end), start));
        // No deadline: never.
        assert!(!due(&pod(Some(7200)), None, at(10_000)));
    }

    #[test]
    fn the_claim_s_period_wins_over_the_pool_s() {
        let pool: NodePool = serde_json::from_value(json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool",
            "metadata": {"name": "p"}, "spec": {"template": {"spec": {"terminationGracePeriod": "2h",
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "d"}}}}}))
        .unwrap();
        let mut claim = NodeClaim::pending("c", "p", "d");
        assert_eq!(period(Some(&claim), Some(&pool)), Some(Duration::from_secs(7200)));
        claim.termination_grace_period = crate::apis::NillableDuration::parse("10m").ok();
        assert_eq!(period(Some(&claim), Some(&pool)), Some(Duration::from_secs(600)));
        assert_eq!(period(None, None), None);
        let t = |s: &str| s.parse::<Timestamp>().ok();
        assert_eq!(earlier(t("2026-01-01T00:00:00Z"), None), t("2026-01-01T00:00:00Z"));
        assert_eq!(
            earlier(t("2026-01-02T00:00:00Z"), t("2026-01-01T00:00:00Z")),
            t("2026-01-01T00:00:00Z")
        );
    }
}
