//! Events written within a budget. Events are what users read, never what a
//! decision rests on, so every one may be skipped: the real work of an
//! invocation is done first, then its events, de-duplicated (the same event
//! on the same object is written once per window, as Karpenter's recorder
//! does), several at once, at most so many per invocation, and none started
//! or awaited past the invocation's deadline.
//!
//! What was written is remembered in the process: a warm container carries
//! it from one invocation to the next at no cost. A DynamoDB item per event
//! would cost a write for every event it saves (as much as the event), and
//! a record per claim would grow the claim items every read pays for; a
//! cold container may repeat an event once, which is harmless.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;

use super::events::{EventSpec, reasons};
use crate::deadline::Deadline;

/// How long a written event suppresses its duplicates: Karpenter's recorder
/// default (2 minutes), 5 minutes for `FailedScheduling` as Karpenter sets it.
pub fn window(reason: &str) -> Duration {
    match reason {
        reasons::FAILED_SCHEDULING => Duration::from_secs(5 * 60),
        _ => Duration::from_secs(2 * 60),
    }
}

/// How many written events are remembered at most (a 20,000-pod burst's
/// nominations, with room); past it the soonest to expire are forgotten.
const MAX_REMEMBERED: usize = 50_000;

/// What makes two events the same: the object (its uid, else its namespace
/// and name), the reason and the message. A `Nominated` message names the
/// claim, so a pod nominated to another claim is a new event.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DedupeKey {
    object: String,
    reason: String,
    message: String,
}

impl DedupeKey {
    /// The key of `event`.
    pub fn of(event: &EventSpec) -> Self {
        let o = &event.object;
        let object = match &o.uid {
            Some(uid) => uid.clone(),
            None => format!(
                "{}/{}/{}",
                o.kind.as_deref().unwrap_or_default(),
                o.namespace.as_deref().unwrap_or_default(),
                o.name.as_deref().unwrap_or_default()
            ),
        };
        DedupeKey {
            object,
            reason: event.reason.clone(),
            message: event.message.clone(),
        }
    }
}

/// The events written lately, each with the end of its window.
#[derive(Debug, Default)]
pub struct Recent {
    until: HashMap<DedupeKey, Instant>,
}

impl Recent {
    /// Whether an event with `key` was written within its window before `now`.
    pub fn seen(&self, key: &DedupeKey, now: Instant) -> bool {
        self.until.get(key).is_some_and(|until| *until > now)
    }

    /// Notes that the event `key` was written at `now`.
    pub fn remember(&mut self, key: DedupeKey, now: Instant, window: Duration) {
        if self.until.len() >= MAX_REMEMBERED {
            self.until.retain(|_, until| *until > now);
        }
        if self.until.len() >= MAX_REMEMBERED
            && let Some(soonest) = self.until.iter().min_by_key(|(_, u)| **u).map(|(k, _)| k.clone())
        {
            self.until.remove(&soonest);
        }
        self.until.insert(key, now + window);
    }
}

/// The events an invocation writes, and what it leaves out before writing.
#[derive(Debug, Default, PartialEq)]
pub struct Selection {
    /// The events to write, in the order given.
    pub write: Vec<EventSpec>,
    /// Events written lately (or twice in the list): left out.
    pub duplicates: usize,
    /// Events past the invocation's cap: left out (a later solve writes
    /// those still true, as they are not remembered).
    pub over_budget: usize,
}

/// Picks what to write of `events` at `now`: the first `most` that `recent`
/// has not seen and that the list does not repeat (pure).
pub fn select(events: Vec<EventSpec>, recent: &Recent, now: Instant, most: usize) -> Selection {
    let mut out = Selection::default();
    let mut keys = BTreeSet::new();
    for e in events {
        let key = DedupeKey::of(&e);
        if recent.seen(&key, now) || !keys.insert(key) {
            out.duplicates += 1;
        } else if out.write.len() < most {
            out.write.push(e);
        } else {
            out.over_budget += 1;
        }
    }
    out
}

/// How many events one invocation writes, and how many at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventBudget {
    /// At most this many per invocation.
    pub most: usize,
    /// This many requests in flight at once.
    pub concurrency: usize,
}

/// What became of an invocation's events.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recorded {
    /// Written.
    pub written: usize,
    /// Refused or failed (logged, never retried here).
    pub failed: usize,
    /// Left out as written lately.
    pub duplicates: usize,
    /// Left out past the invocation's cap.
    pub over_budget: usize,
    /// Not written because the deadline came first.
    pub out_of_time: usize,
}

impl Recorded {
    /// Events wanted but not written: over the cap or out of time.
    pub fn skipped(&self) -> usize {
        self.over_budget + self.out_of_time
    }
}

/// Writes events within a budget and remembers what it wrote. Build one per
/// process and keep it for every invocation.
#[derive(Debug, Default)]
pub struct Recorder {
    recent: Mutex<Recent>,
}

impl Recorder {
    /// Writes what [`select`] picks of `events` through `emit` (true when
    /// written), `budget.concurrency` at a time, starting none and awaiting
    /// none once `deadline` has come.
    pub async fn record<F, Fut>(
        &self,
        events: Vec<EventSpec>,
        budget: EventBudget,
        deadline: Deadline,
        emit: F,
    ) -> Recorded
    where
        F: Fn(EventSpec) -> Fut,
        Fut: Future<Output = bool>,
    {
        let selection = {
            let recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
            select(events, &recent, Instant::now(), budget.most)
        };
        let wanted = selection.write.len();
        let mut out = Recorded {
            duplicates: selection.duplicates,
            over_budget: selection.over_budget,
            ..Recorded::default()
        };
        let emit = &emit;
        let writes = futures::stream::iter(selection.write)
            .map(|e| async move {
                if deadline.passed() {
                    return None;
                }
                let (key, window) = (DedupeKey::of(&e), window(&e.reason));
                Some((key, window, emit(e).await))
            })
            .buffer_unordered(budget.concurrency.max(1))
            .take_until(tokio::time::sleep_until(deadline.instant()));
        let mut writes = std::pin::pin!(writes);
        while let Some(done) = writes.next().await {
            match done {
                Some((key, window, true)) => {
                    out.written += 1;
                    let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
                    recent.remember(key, Instant::now(), window);
                }
                Some((_, _, false)) => out.failed += 1,
                None => {}
            }
        }
        out.out_of_time = wanted - out.written - out.failed;
        if out.failed > 0 {
            tracing::warn!(failed = out.failed, "could not record some events");
        }
        if out.skipped() > 0 {
            tracing::info!(
                over_budget = out.over_budget,
                out_of_time = out.out_of_time,
                written = out.written,
                "events left out to keep within the invocation's budget"
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::fixtures;

    fn nominated(pod: &str, claim: &str) -> EventSpec {
        let mut p = fixtures::pod(pod, "1", "1Gi", serde_json::json!({}));
        p.metadata.uid = Some(format!("uid-{pod}"));
        EventSpec::nominated(&p, claim)
    }

    #[test]
    fn the_same_pod_on_the_same_claim_is_nominated_once_per_window() {
        let t0 = Instant::now();
        let mut recent = Recent::default();
        let twice = vec![nominated("a", "c1"), nominated("a", "c1")];
        let first = select(twice.clone(), &recent, t0, 100);
        assert_eq!(first.write, vec![nominated("a", "c1")]);
        assert_eq!(first.duplicates, 1);
        for e in &first.write {
            recent.remember(DedupeKey::of(e), t0, window(&e.reason));
        }
        // The next solve: the same nomination is left out, another claim is news.
        let later = t0 + Duration::from_secs(60);
        let next = select(vec![nominated("a", "c1"), nominated("a", "c2")], &recent, later, 100);
        assert_eq!(next.write, vec![nominated("a", "c2")]);
        assert_eq!(next.duplicates, 1);
        // Past Karpenter's two minutes it is written again.
        let past = t0 + Duration::from_secs(121);
        assert_eq!(select(twice, &recent, past, 100).write.len(), 1);
    }

    #[test]
    fn events_past_the_cap_are_left_out_and_not_remembered() {
        let events: Vec<EventSpec> = (0..5).map(|i| nominated(&format!("p{i}"), "c")).collect();
        let s = select(events, &Recent::default(), Instant::now(), 3);
        assert_eq!(s.write.len(), 3);
        assert_eq!(s.over_budget, 2);
        assert_eq!(s.duplicates, 0);
    }

    #[tokio::test]
    async fn no_event_is_started_or_awaited_past_the_deadline_and_only_written_ones_are_remembered() {
        let recorder = Recorder::default();
        let events: Vec<EventSpec> = (0..10).map(|i| nominated(&format!("p{i}"), "c")).collect();
        let budget = EventBudget {
            most: 8,
            concurrency: 2,
        };
        // Two answer at once, the rest never: the deadline ends the wait.
        let started = std::sync::atomic::AtomicUsize::new(0);
        let emit = |_e: EventSpec| {
            let n = started.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                if n >= 2 {
                    std::future::pending::<()>().await;
                }
                true
            }
        };
        let deadline = Deadline::after(Duration::from_millis(100));
        let r = recorder.record(events.clone(), budget, deadline, emit).await;
        assert!(Instant::now() < deadline.instant() + Duration::from_secs(1));
        assert_eq!(
            r,
            Recorded {
                written: 2,
                failed: 0,
                duplicates: 0,
                over_budget: 2,
                out_of_time: 6
            }
        );
        // The next invocation writes what was not written, and nothing twice.
        let all_at_once = |_e: EventSpec| async { true };
        let r = recorder
            .record(
                events.clone(),
                EventBudget {
                    most: 100,
                    concurrency: 4,
                },
                Deadline::after(Duration::from_secs(60)),
                all_at_once,
            )
            .await;
        assert_eq!((r.written, r.duplicates), (8, 2));
        // A deadline already passed writes nothing.
        let fresh = Recorder::default();
        let r = fresh
            .record(events, budget, Deadline::after(Duration::ZERO), all_at_once)
            .await;
        assert_eq!((r.written, r.out_of_time), (0, 8));
    }
}
