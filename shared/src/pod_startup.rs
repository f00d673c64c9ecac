//! Pending → Running latency (`karpenter_pods_startup_duration_seconds`):
//! each pod's time from creation to Ready, counted once by the sweep that
//! first sees it Ready. Windows are whole seconds, as the API server keeps
//! condition times: a run counts the pods that became Ready in
//! `[from, to)`, `to` the run's second, and the next run starts at `to`
//! (a marker in the state table), so a pod turning Ready during a run's
//! second is counted by the next one, never twice. A pod Ready again after
//! a restart is counted again.

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Pod;

/// The marker holding where the last window ended.
pub const MARKER: &str = "pods-startup-counted";

/// How far back the first window (or one after a long pause) reaches.
pub const LOOKBACK: SignedDuration = SignedDuration::from_hours(1);

/// The window a run at `now` counts, given where the last one ended (pure):
/// from there (at most [`LOOKBACK`] back) to `now`'s whole second.
pub fn window(last_end: Option<Timestamp>, now: Timestamp) -> (Timestamp, Timestamp) {
    let to = Timestamp::from_second(now.as_second()).unwrap_or(now);
    let earliest = to.checked_sub(LOOKBACK).unwrap_or(to);
    let from = last_end.map_or(earliest, |t| t.max(earliest)).min(to);
    (from, to)
}

/// When the pod became Ready, if it is.
fn ready_since(pod: &Pod) -> Option<Timestamp> {
    let c = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")?;
    Some(c.last_transition_time.as_ref()?.0)
}

/// Each pod that became Ready in `[from, to)`, as `namespace/name`, with
/// the seconds from its creation to then (pure).
pub fn durations<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    (from, to): (Timestamp, Timestamp),
) -> Vec<(String, f64)> {
    pods.into_iter()
        .filter_map(|p| {
            let ready = ready_since(p)?;
            let created = p.metadata.creation_timestamp.as_ref()?.0;
            let seconds = ready.duration_since(created).as_secs_f64().max(0.0);
            (from <= ready && ready < to).then(|| (crate::kubernetes::pods::key(p), seconds))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(created: &str, ready: Option<&str>) -> Result<Pod, serde_json::Error> {
        let conditions = match ready {
            Some(t) => json!([{"type": "Ready", "status": "True", "lastTransitionTime": t}]),
            None => json!([{"type": "Ready", "status": "False", "lastTransitionTime": created}]),
        };
        serde_json::from_value(json!({
            "metadata": {"name": "p", "creationTimestamp": created},
            "status": {"phase": "Running", "conditions": conditions}
        }))
    }

    fn at(s: &str) -> Result<Timestamp, jiff::Error> {
        s.parse()
    }

    #[test]
    fn each_pod_is_counted_by_the_window_its_ready_second_falls_in() -> Result<(), Box<dyn std::error::Error>> {
        let pods = [
            pod("2026-11-28T12:00:00Z", Some("2026-11-28T12:00:40Z"))?,
            pod("2026-11-28T12:00:30Z", Some("2026-11-28T12:01:05Z"))?,
            pod("2026-11-28T12:00:30Z", None)?,
        ];
        // A run at 12:01:05.400: its window ends at 12:01:05, so the pod Ready
        // in that second waits for the next run.
        let first = window(Some(at("2026-11-28T12:00:10Z")?), at("2026-11-28T12:01:05.400Z")?);
        assert_eq!(first, (at("2026-11-28T12:00:10Z")?, at("2026-11-28T12:01:05Z")?));
        let seconds = |span| durations(&pods, span).into_iter().map(|(_, s)| s).collect::<Vec<_>>();
        assert_eq!(seconds(first), vec![40.0]);
        let second = window(Some(first.1), at("2026-11-28T12:02:05.900Z")?);
        assert_eq!(seconds(second), vec![35.0]);
        // No marker yet, or a long pause: an hour back at most.
        let now = at("2026-11-28T14:00:00Z")?;
        assert_eq!(window(None, now).0, at("2026-11-28T13:00:00Z")?);
        assert_eq!(
            window(Some(at("2026-11-27T00:00:00Z")?), now).0,
            at("2026-11-28T13:00:00Z")?
        );
        // A marker ahead of the clock (another sweep's skew) counts nothing.
        let ahead = window(Some(at("2026-11-28T14:05:00Z")?), now);
        assert_eq!(ahead.0, ahead.1);
        Ok(())
    }
}
