//! Drains in progress, for interruption and disruption alike: how a node is
//! drained ([`DrainPolicy`]), the record that lets a drain outlive the
//! invocation that began it ([`record`]), which pods a drain still has to
//! move ([`undrained`]), and the passes every `interrupt` invocation and
//! every sweep make over the recorded drains ([`continue_drains`]).

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;

use crate::kubernetes::{Cluster, ClusterError, DrainOptions, drain, pods};
use crate::state::{DrainRecord, StateError, StateStore};

/// How a node is drained: gracefully until `force_from`, then by force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrainPolicy {
    /// When the instance goes away (None: no deadline, graceful throughout).
    pub deadline: Option<Timestamp>,
    /// From this moment PDBs and do-not-disrupt no longer hold pods (None: never).
    pub force_from: Option<Timestamp>,
}

impl DrainPolicy {
    /// True when the drain is forced at `now`.
    pub fn forced_at(&self, now: Timestamp) -> bool {
        self.force_from.is_some_and(|f| now >= f)
    }

    /// The drain options at `now`.
    pub fn options_at(&self, now: Timestamp) -> DrainOptions {
        DrainOptions {
            ignore_do_not_disrupt: self.forced_at(now),
            now,
            deadline: self.deadline,
        }
    }

    /// The policy a record stands for (pure).
    pub fn of(r: &DrainRecord) -> DrainPolicy {
        DrainPolicy {
            deadline: r.deadline_ms.and_then(|m| Timestamp::from_millisecond(m).ok()),
            force_from: r.force_from_ms.and_then(|m| Timestamp::from_millisecond(m).ok()),
        }
    }
}

/// Why recorded drains could not be continued.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    /// The state table failed.
    #[error("reading or ending drain records")]
    State(#[from] StateError),
    /// A cluster call failed.
    #[error("draining through the cluster")]
    Cluster(#[from] ClusterError),
}

/// The record of a drain of `claim`'s node beginning at `now` (pure).
pub fn record(claim: &str, node: &str, reason: &str, policy: DrainPolicy, now: Timestamp) -> DrainRecord {
    DrainRecord {
        claim: claim.to_string(),
        node: node.to_string(),
        reason: reason.to_string(),
        deadline_ms: policy.deadline.map(|t| t.as_millisecond()),
        force_from_ms: policy.force_from.map(|t| t.as_millisecond()),
        started_ms: now.as_millisecond(),
    }
}

/// The pods a graceful drain still has to move, and the first pod whose
/// do-not-disrupt is in force at `now` (pure).
pub fn undrained(pods_on_node: &[Pod], now: Timestamp) -> (usize, Option<String>) {
    let options = DrainOptions {
        now,
        ..DrainOptions::default()
    };
    let left = drain::plan(pods_on_node, options)
        .iter()
        .filter(|a| !matches!(a, drain::PodAction::Skip(_)))
        .count();
    let dnd = pods_on_node
        .iter()
        .filter(|p| !pods::is_terminal(p))
        .find(|p| pods::has_do_not_disrupt(p, now))
        .map(pods::key);
    (left, dnd)
}

/// Continues the recorded drains `mine` keeps: passes until each node is empty, its node
/// gone, or `budget` spent (pausing `interval` between passes; a zero budget
/// makes one pass). Honours PDBs and do-not-disrupt until the record's force
/// time, then deletes what evictions cannot move. No node's pass starts at or
/// after `stop_at` (the invocation's time is up: at a storm's size one pass
/// over every drain can outlast it), and each pass starts at a different
/// record ([`turn`]), so the same first drains do not take every invocation's
/// time; each record but the first of a list is read again before its pass,
/// so a drain another invocation ended meanwhile is not passed or ended
/// again. Returns the nodes whose drain finished (their records are removed).
pub async fn continue_drains(
    cluster: &impl Cluster,
    store: &StateStore,
    budget: Duration,
    interval: Duration,
    stop_at: std::time::Instant,
    mine: impl Fn(&DrainRecord) -> bool,
) -> Result<Vec<String>, DrainError> {
    let started = std::time::Instant::now();
    let mut drained = Vec::new();
    loop {
        let mut records = store.drains().await?;
        records.retain(&mine);
        if records.is_empty() {
            return Ok(drained);
        }
        turn(&mut records, Timestamp::now());
        let mut left = 0;
        for (i, r) in records.iter().enumerate() {
            if std::time::Instant::now() >= stop_at {
                tracing::info!(
                    left = records.len() - i,
                    "no time left for more drain passes; the next invocation goes on"
                );
                return Ok(drained);
            }
            // A list read passes ago may be stale: in a storm other
            // invocations end and pass the same drains meanwhile (20 of them
            // ended 200 drains 1,850 times from such lists). The first
            // record was just read.
            let current = if i == 0 {
                Some(r.clone())
            } else {
                store.drain(&r.claim).await?
            };
            let Some(r) = current else {
                tracing::debug!(claim = %r.claim, node = %r.node, "drain ended meanwhile");
                continue;
            };
            let r = &r;
            if pass(cluster, r, Timestamp::now()).await? {
                drained.push(r.node.clone());
                store.end_drain(&r.claim).await?;
            } else {
                left += 1;
            }
        }
        if left == 0 || started.elapsed() + interval > budget {
            return Ok(drained);
        }
        tokio::time::sleep(interval).await;
    }
}

/// Puts `records` in the order a pass at `now` takes them: turned by the
/// seconds of `now`, so over successive passes each record comes first (pure).
pub fn turn<T>(records: &mut [T], now: Timestamp) {
    if !records.is_empty() {
        let by = now.as_second().rem_euclid(records.len() as i64) as usize;
        records.rotate_left(by);
    }
}

/// The sweep's share: one pass over every recorded drain (none started at or
/// after `stop_at`), so a drain outlives the invocation that began it even
/// when no further event arrives.
/// Failures are logged; the next sweep tries again.
pub async fn sweep_drains(cluster: &impl Cluster, store: &StateStore, stop_at: std::time::Instant) -> Vec<String> {
    match continue_drains(cluster, store, Duration::ZERO, Duration::ZERO, stop_at, |_| true).await {
        Ok(drained) => drained,
        Err(e) => {
            tracing::warn!(error = %crate::telemetry::causes(&e), "recorded drains not continued; the next sweep tries again");
            Vec::new()
        }
    }
}

/// One pass over one drain; true when it is finished. `interrupt` makes the
/// first right after recording the drain.
pub async fn pass(cluster: &impl Cluster, r: &DrainRecord, now: Timestamp) -> Result<bool, DrainError> {
    if cluster.node(&r.node).await?.is_none() {
        tracing::info!(node = %r.node, "drained node is gone");
        return Ok(true);
    }
    let policy = DrainPolicy::of(r);
    let report = drain(cluster, &r.node, policy.options_at(now)).await?;
    if report.is_complete() {
        tracing::info!(node = %r.node, reason = %r.reason, "drain complete");
        return Ok(true);
    }
    if policy.forced_at(now) {
        // The cloud takes the node at the deadline: what a PDB still holds goes now.
        let pods = cluster.pods_on_node(&r.node).await?;
        for p in pods {
            let key = pods::key(&p);
            if report.blocked_by_pdb.iter().any(|(k, _)| *k == key) {
                tracing::warn!(pod = %key, node = %r.node, "deadline near: deleting a pod its PDB still protects");
                cluster.delete_pod(&p).await?;
            }
        }
    } else if !report.blocked_by_pdb.is_empty() || !report.do_not_disrupt.is_empty() {
        tracing::info!(node = %r.node, blocked = report.blocked_by_pdb.len(), do_not_disrupt = report.do_not_disrupt.len(),
            force_from = ?policy.force_from, "drain waiting on PDBs or do-not-disrupt");
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn each_record_comes_first_in_some_pass() -> Result<(), jiff::Error> {
        let base: Timestamp = "2026-03-02T14:20:00Z".parse()?;
        let firsts: std::collections::BTreeSet<u32> = (0..3)
            .map(|s| {
                let mut records = vec![1, 2, 3];
                turn(&mut records, base + jiff::SignedDuration::from_secs(s));
                records[0]
            })
            .collect();
        assert_eq!(firsts, [1, 2, 3].into());
        let mut none: Vec<u32> = Vec::new();
        turn(&mut none, base);
        assert!(none.is_empty());
        Ok(())
    }

    #[test]
    fn a_record_stands_for_its_policy() {
        let now: Timestamp = "2026-03-02T14:20:06Z".parse().unwrap();
        let policy = DrainPolicy {
            deadline: Some(now),
            force_from: None,
        };
        assert_eq!(DrainPolicy::of(&record("c", "n", "r", policy, now)), policy);
    }

    #[test]
    fn undrained_counts_what_a_drain_must_move() {
        let ds = pod(
            json!({"metadata": {"name": "ds", "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "u", "controller": true}]}, "spec": {"containers": []}, "status": {"phase": "Running"}}),
        );
        let web = pod(
            json!({"metadata": {"name": "web", "namespace": "default"}, "spec": {"containers": []}, "status": {"phase": "Running"}}),
        );
        let dnd = pod(
            json!({"metadata": {"name": "db", "namespace": "default", "annotations": {"karpenter.sh/do-not-disrupt": "true"}}, "spec": {"containers": []}, "status": {"phase": "Running"}}),
        );
        let done =
            pod(json!({"metadata": {"name": "job"}, "spec": {"containers": []}, "status": {"phase": "Succeeded"}}));
        let now = Timestamp::now();
        assert_eq!(undrained(&[ds.clone(), done.clone()], now), (0, None));
        assert_eq!(undrained(&[ds, web, dnd, done], now), (2, Some("default/db".into())));
    }
}
