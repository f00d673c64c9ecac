//! The pods the forwarder knows to be pending, and when each was last sent.
//!
//! One memory does two jobs: it drops a pod seen again at a version that was
//! sent less than `resend_after` ago (a re-list, a resumed watch), and it names
//! the pods whose last send is at least `resend_after` old, so a pod that
//! stays pending is sent again although the watch says nothing new about it
//! (the scheduler does not rewrite an unchanged `PodScheduled=False`).
//! Pure: the caller passes the time, and times never go backwards.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use nodesmith::messages::PendingPodRef;

/// Pending pods by uid, at most `capacity` of them, each with the time its
/// reference was last queued for sending.
#[derive(Clone, Debug)]
pub struct PendingPods {
    capacity: usize,
    resend_after: Duration,
    pods: HashMap<String, Entry>,
    /// Every remembered pod by (last send, stamp): the oldest send first.
    by_send: BTreeMap<(Instant, u64), String>,
    /// Source of unique stamps (ties between sends at the same instant).
    next_stamp: u64,
    /// Bumped at the start of each re-list; entries carry the one they were last seen in.
    generation: u64,
}

#[derive(Clone, Debug)]
struct Entry {
    reference: PendingPodRef,
    sent: (Instant, u64),
    generation: u64,
}

/// What [`PendingPods::observe`] decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// Whether to send the reference now (first seen, a new resourceVersion,
    /// or its last send is at least `resend_after` old).
    pub send: bool,
    /// A pod forgotten to stay within capacity (the one sent longest ago).
    pub evicted: Option<PendingPodRef>,
}

impl PendingPods {
    /// An empty memory (capacity at least 1).
    pub fn new(capacity: usize, resend_after: Duration) -> Self {
        PendingPods {
            capacity: capacity.max(1),
            resend_after,
            pods: HashMap::new(),
            by_send: BTreeMap::new(),
            next_stamp: 0,
            generation: 0,
        }
    }

    /// A pod seen pending-and-provisionable at `now`: remembers its latest
    /// reference and says whether to send it.
    pub fn observe(&mut self, reference: &PendingPodRef, now: Instant) -> Observed {
        let generation = self.generation;
        if let Some(e) = self.pods.get_mut(&reference.uid) {
            e.generation = generation;
            let fresh = now.saturating_duration_since(e.sent.0) < self.resend_after;
            if fresh && e.reference.resource_version == reference.resource_version {
                return Observed {
                    send: false,
                    evicted: None,
                };
            }
            e.reference = reference.clone();
            self.mark_sent(&reference.uid, now);
            return Observed {
                send: true,
                evicted: None,
            };
        }
        let evicted = if self.pods.len() >= self.capacity {
            self.by_send
                .pop_first()
                .and_then(|(_, uid)| self.pods.remove(&uid))
                .map(|e| e.reference)
        } else {
            None
        };
        let key = (now, self.stamp());
        self.by_send.insert(key, reference.uid.clone());
        self.pods.insert(
            reference.uid.clone(),
            Entry {
                reference: reference.clone(),
                sent: key,
                generation,
            },
        );
        Observed { send: true, evicted }
    }

    /// The pod is no longer pending (deleted, bound, or no longer
    /// unschedulable); true when it was remembered.
    pub fn remove(&mut self, uid: &str) -> bool {
        match self.pods.remove(uid) {
            Some(e) => {
                self.by_send.remove(&e.sent);
                true
            }
            None => false,
        }
    }

    /// A re-list starts: pods it does not [`observe`](Self::observe) before
    /// [`end_relist`](Self::end_relist) are forgotten then.
    pub fn begin_relist(&mut self) {
        self.generation += 1;
    }

    /// The re-list is complete: forgets the pods it did not show (they were
    /// deleted, bound or changed while no watch was open). Returns how many.
    pub fn end_relist(&mut self) -> usize {
        let gone: Vec<String> = self
            .pods
            .iter()
            .filter(|(_, e)| e.generation != self.generation)
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in &gone {
            self.remove(uid);
        }
        gone.len()
    }

    /// The references whose last send is at least `resend_after` before `now`,
    /// oldest send first; each is recorded as sent at `now`.
    pub fn due(&mut self, now: Instant) -> Vec<PendingPodRef> {
        let mut due = Vec::new();
        while let Some((&(at, stamp), _)) = self.by_send.first_key_value() {
            if now.saturating_duration_since(at) < self.resend_after {
                break;
            }
            let Some(uid) = self.by_send.remove(&(at, stamp)) else {
                break;
            };
            if let Some(e) = self.pods.get(&uid) {
                due.push(e.reference.clone());
            }
        }
        // Re-stamped after the scan, so a zero `resend_after` cannot loop.
        for r in &due {
            self.mark_sent(&r.uid, now);
        }
        due
    }

    /// How many pods are remembered.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// Whether no pod is remembered.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }

    /// Moves the pod's send time to `now` (its old place in `by_send` may
    /// already be gone, when [`due`](Self::due) took it).
    fn mark_sent(&mut self, uid: &str, now: Instant) {
        let key = (now, self.stamp());
        if let Some(e) = self.pods.get_mut(uid) {
            self.by_send.remove(&e.sent);
            e.sent = key;
            self.by_send.insert(key, uid.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn r(uid: &str, rv: &str) -> PendingPodRef {
        PendingPodRef {
            namespace: "default".into(),
            name: format!("pod-{uid}"),
            uid: uid.into(),
            resource_version: rv.into(),
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn uids(refs: &[PendingPodRef]) -> Vec<&str> {
        refs.iter().map(|r| r.uid.as_str()).collect()
    }

    #[test]
    fn nothing_is_resent_before_the_period() {
        let t0 = Instant::now();
        let mut p = PendingPods::new(10, secs(60));
        assert!(p.observe(&r("a", "1"), t0).send);
        assert!(p.observe(&r("b", "1"), t0 + secs(30)).send);
        assert!(p.due(t0).is_empty());
        assert!(p.due(t0 + secs(59)).is_empty());
        assert_eq!(uids(&p.due(t0 + secs(60))), ["a"]);
        // "a" was just re-sent; "b" is due 60 s after its own send.
        assert!(p.due(t0 + secs(89)).is_empty());
        assert_eq!(uids(&p.due(t0 + secs(90))), ["b"]);
        assert!(p.due(t0 + secs(119)).is_empty());
        assert_eq!(uids(&p.due(t0 + secs(120))), ["a"]);
    }

    #[test]
    fn the_same_version_within_the_period_is_a_duplicate_and_a_new_one_is_news() {
        let t0 = Instant::now();
        let mut p = PendingPods::new(10, secs(60));
        assert!(p.observe(&r("a", "1"), t0).send);
        assert!(!p.observe(&r("a", "1"), t0 + secs(59)).send);
        assert!(p.observe(&r("a", "2"), t0 + secs(10)).send);
        // The new version's send restarts the period, and re-sends carry it.
        assert!(p.due(t0 + secs(60)).is_empty());
        let again = p.due(t0 + secs(70));
        assert_eq!(again, [r("a", "2")]);
        // Seen again after a full period without a periodic re-send: sent.
        assert!(p.observe(&r("a", "2"), t0 + secs(130)).send);
        assert_eq!(p.len(), 1);
    }

    #[test]
    fn removed_pods_are_not_resent() {
        let t0 = Instant::now();
        let mut p = PendingPods::new(10, secs(60));
        p.observe(&r("a", "1"), t0);
        p.observe(&r("b", "1"), t0);
        assert!(p.remove("a"));
        assert!(!p.remove("a"));
        assert_eq!(uids(&p.due(t0 + secs(60))), ["b"]);
        assert!(p.remove("b"));
        assert!(p.due(t0 + secs(600)).is_empty());
        assert!(p.is_empty());
    }

    #[test]
    fn a_relist_forgets_the_pods_it_did_not_show() {
        let t0 = Instant::now();
        let mut p = PendingPods::new(10, secs(60));
        p.observe(&r("a", "1"), t0);
        p.observe(&r("b", "1"), t0);
        p.begin_relist();
        // Listed again unchanged: a duplicate, and kept.
        assert!(!p.observe(&r("a", "1"), t0 + secs(5)).send);
        assert!(p.observe(&r("c", "1"), t0 + secs(5)).send);
        assert_eq!(p.end_relist(), 1);
        assert_eq!(p.len(), 2);
        // The re-list did not restart the period of "a".
        assert_eq!(uids(&p.due(t0 + secs(60))), ["a"]);
        assert_eq!(uids(&p.due(t0 + secs(65))), ["c"]);
    }

    #[test]
    fn capacity_forgets_the_pod_sent_longest_ago() {
        let t0 = Instant::now();
        let mut p = PendingPods::new(2, secs(60));
        assert_eq!(p.observe(&r("a", "1"), t0).evicted, None);
        assert_eq!(p.observe(&r("b", "1"), t0 + secs(1)).evicted, None);
        // "a" is re-sent, so "b" is now the one sent longest ago.
        assert_eq!(uids(&p.due(t0 + secs(60))), ["a"]);
        let o = p.observe(&r("c", "1"), t0 + secs(61));
        assert!(o.send);
        assert_eq!(o.evicted, Some(r("b", "1")));
        assert_eq!(p.len(), 2);
        assert!(
            p.observe(&r("b", "1"), t0 + secs(62)).send,
            "a forgotten pod is news again"
        );
    }

    #[test]
    fn a_zero_period_resends_once_per_call() {
        let t0 = Instant::now();
        let mut p = PendingPods::new(4, Duration::ZERO);
        p.observe(&r("a", "1"), t0);
        assert_eq!(uids(&p.due(t0)), ["a"]);
        assert_eq!(uids(&p.due(t0)), ["a"]);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Observe(u8, u8),
        Remove(u8),
        Relist(Vec<u8>),
        Due,
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0u8..12, 0u8..3).prop_map(|(u, v)| Op::Observe(u, v)),
            1 => (0u8..12).prop_map(Op::Remove),
            1 => proptest::collection::vec(0u8..12, 0..6).prop_map(Op::Relist),
            2 => Just(Op::Due),
        ]
    }

    proptest::proptest! {
        /// Against a model (last send and version per remembered uid): memory
        /// stays bounded and evicts the pod sent longest ago; a pod is sent
        /// exactly when it is new, changed, or its period passed; a re-send is
        /// never early, never for a removed pod, carries the latest version,
        /// and no remembered pod is left overdue.
        #[test]
        fn matches_the_model(
            ops in proptest::collection::vec((op(), 0u64..40), 1..150),
            cap in 1usize..8,
        ) {
            let period = secs(30);
            let t0 = Instant::now();
            let mut now = t0;
            let mut p = PendingPods::new(cap, period);
            let mut last: HashMap<String, (Instant, String)> = HashMap::new();
            for (op, advance) in ops {
                now += secs(advance);
                // Observes a pod at `now` in `p` and in the model.
                let observe = |p: &mut PendingPods, last: &mut HashMap<String, (Instant, String)>, u: u8, v: u8| {
                    let (uid, rv) = (u.to_string(), v.to_string());
                    let expect_send = match last.get(&uid) {
                        None => true,
                        Some((at, ver)) => *ver != rv || now - *at >= period,
                    };
                    let oldest = last.values().map(|(at, _)| *at).min();
                    let full = !last.contains_key(&uid) && last.len() >= cap;
                    let o = p.observe(&r(&uid, &rv), now);
                    proptest::prop_assert_eq!(o.send, expect_send);
                    proptest::prop_assert_eq!(o.evicted.is_some(), full);
                    if let Some(e) = &o.evicted {
                        let at = last.remove(&e.uid).map(|(at, _)| at);
                        proptest::prop_assert!(at.is_some() && at == oldest, "evicted {} was not sent longest ago", e.uid);
                    }
                    if o.send {
                        last.insert(uid, (now, rv));
                    }
                    Ok(())
                };
                match op {
                    Op::Observe(u, v) => observe(&mut p, &mut last, u, v)?,
                    Op::Remove(u) => {
                        proptest::prop_assert_eq!(p.remove(&u.to_string()), last.remove(&u.to_string()).is_some());
                    }
                    Op::Relist(listed) => {
                        p.begin_relist();
                        for &u in &listed {
                            observe(&mut p, &mut last, u, 0)?;
                        }
                        let listed: BTreeSet<String> = listed.iter().map(|u| u.to_string()).collect();
                        let before = last.len();
                        last.retain(|u, _| listed.contains(u));
                        proptest::prop_assert_eq!(p.end_relist(), before - last.len());
                    }
                    Op::Due => {
                        let due = p.due(now);
                        let mut seen = BTreeSet::new();
                        for d in &due {
                            proptest::prop_assert!(seen.insert(d.uid.clone()), "one re-send per pod per call");
                            let Some((at, ver)) = last.get_mut(&d.uid) else {
                                return Err(proptest::test_runner::TestCaseError::fail(format!("{} re-sent but not remembered", d.uid)));
                            };
                            proptest::prop_assert!(now - *at >= period, "{} re-sent early", d.uid);
                            proptest::prop_assert_eq!(&d.resource_version, &*ver);
                            *at = now;
                        }
                        for (u, (at, _)) in &last {
                            proptest::prop_assert!(now - *at < period, "{} overdue and not re-sent", u);
                        }
                    }
                }
                proptest::prop_assert!(p.len() <= cap);
                proptest::prop_assert_eq!(p.len(), last.len());
            }
        }
    }
}
