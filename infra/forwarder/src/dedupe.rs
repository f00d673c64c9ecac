//! A bounded, time-limited memory of what was already sent.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Remembers up to `capacity` keys for at most `ttl` each. A key seen again
/// within that window is a duplicate; after it (or once evicted by newer keys)
/// it is new again, so a pod still pending much later is re-sent.
#[derive(Clone, Debug)]
pub struct Dedupe<K> {
    capacity: usize,
    ttl: Duration,
    order: VecDeque<(K, Instant)>,
    seen: HashMap<K, Instant>,
}

impl<K: Clone + Eq + std::hash::Hash> Dedupe<K> {
    /// An empty memory (capacity at least 1).
    pub fn new(capacity: usize, ttl: Duration) -> Self {
        Dedupe {
            capacity: capacity.max(1),
            ttl,
            order: VecDeque::new(),
            seen: HashMap::new(),
        }
    }

    /// Records `key` at `now`; true when it was not remembered (send it).
    pub fn insert(&mut self, key: K, now: Instant) -> bool {
        self.expire(now);
        if self.seen.contains_key(&key) {
            return false;
        }
        while self.seen.len() >= self.capacity {
            match self.order.pop_front() {
                Some((k, at)) => {
                    if self.seen.get(&k) == Some(&at) {
                        self.seen.remove(&k);
                    }
                }
                None => break,
            }
        }
        self.seen.insert(key.clone(), now);
        self.order.push_back((key, now));
        true
    }

    /// Forgets `key` (its send failed, so it must go out again).
    pub fn forget(&mut self, key: &K) {
        self.seen.remove(key);
    }

    /// How many keys are remembered.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    fn expire(&mut self, now: Instant) {
        while let Some((k, at)) = self.order.front() {
            if now.duration_since(*at) < self.ttl {
                break;
            }
            if self.seen.get(k) == Some(at) {
                self.seen.remove(k);
            }
            self.order.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_within_the_window_are_dropped() {
        let t0 = Instant::now();
        let mut d = Dedupe::new(10, Duration::from_secs(60));
        assert!(d.insert(("u1", "1"), t0));
        assert!(!d.insert(("u1", "1"), t0 + Duration::from_secs(59)));
        // A new resourceVersion of the same pod is news.
        assert!(d.insert(("u1", "2"), t0));
        // After the window the same key goes out again.
        assert!(d.insert(("u1", "1"), t0 + Duration::from_secs(60)));
    }

    #[test]
    fn capacity_bounds_memory_oldest_first() {
        let t0 = Instant::now();
        let mut d = Dedupe::new(2, Duration::from_secs(60));
        assert!(d.insert(1, t0));
        assert!(d.insert(2, t0));
        assert!(d.insert(3, t0));
        assert_eq!(d.len(), 2);
        assert!(!d.insert(3, t0));
        assert!(!d.insert(2, t0));
        assert!(d.insert(1, t0), "the oldest key was evicted");
    }

    #[test]
    fn forgotten_keys_are_new_again() {
        let t0 = Instant::now();
        let mut d = Dedupe::new(4, Duration::from_secs(60));
        assert!(d.insert("k", t0));
        d.forget(&"k");
        assert!(d.insert("k", t0));
        assert_eq!(d.len(), 1);
    }

    proptest::proptest! {
        /// Whatever the sequence, memory stays bounded and a key just inserted
        /// is a duplicate until the window passes.
        #[test]
        fn bounded_and_remembering(ops in proptest::collection::vec((0u8..20, 0u64..5), 1..200), cap in 1usize..8) {
            let t0 = Instant::now();
            let ttl = Duration::from_secs(10);
            let mut d = Dedupe::new(cap, ttl);
            let mut now = t0;
            for (key, advance) in ops {
                now += Duration::from_secs(advance);
                d.insert(key, now);
                proptest::prop_assert!(d.len() <= cap);
                proptest::prop_assert!(!d.insert(key, now), "a key just inserted must be remembered");
                // Looked at from the end of the window (on a copy: time only moves forward).
                proptest::prop_assert!(d.clone().insert(key, now + ttl), "after the window the key is new again");
            }
        }
    }
}
