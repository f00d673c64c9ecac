//! The room left on existing entries, indexed for first fit: a pod takes the
//! first existing node or claim it fits, and once most of a large cluster is
//! full, walking every entry to find it made each what-if cost time in
//! proportion to the cluster. A max tree over each entry's free cpu, memory
//! and pod slots skips every stretch of entries too full for the pod, and
//! finds the same first entry the walk would.
//!
//! A stretch's maxima per resource may come from different entries (one with
//! cpu to spare, another with memory), so a search can look inside stretches
//! where no single entry has the room. Within one solve room only shrinks, so
//! the index remembers, per need, how far from the start no entry has room
//! for it, and pods of the same size never search that stretch again.

use std::collections::HashMap;

/// How many leading resources (cpu, memory, pods: the table's fixed first
/// three) the index tracks.
const TRACKED: usize = 3;

/// A need in the tracked resources (zero where it asks for none).
type Need = [i64; TRACKED];

/// The most free room of each tracked resource over every stretch of entries
/// (a complete binary tree over the entries, padded to a power of two).
#[derive(Debug, Clone)]
pub struct RoomIndex {
    entries: usize,
    leaves: usize,
    width: usize,
    /// Node `n`'s maximum per resource at `n * width ..`; the root is node 1.
    max: Vec<i64>,
    /// Per need, the first entry that might have room for it: none before
    /// does. Forgotten when any entry's room grows.
    none_before: HashMap<Need, usize>,
}

impl RoomIndex {
    /// The index over `entries` entries, `free` writing each one's free room
    /// (allocatable less used; `i64::MIN` where it takes no pods).
    pub fn new(entries: usize, width: usize, free: impl Fn(usize, &mut [i64])) -> RoomIndex {
        let width = width.min(TRACKED);
        let leaves = entries.next_power_of_two().max(1);
        let mut max = vec![i64::MIN; 2 * leaves * width];
        for e in 0..entries {
            let at = (leaves + e) * width;
            free(e, &mut max[at..at + width]);
        }
        for n in (1..leaves).rev() {
            for d in 0..width {
                max[n * width + d] = max[2 * n * width + d].max(max[(2 * n + 1) * width + d]);
            }
        }
        RoomIndex {
            entries,
            leaves,
            width,
            max,
            none_before: HashMap::new(),
        }
    }

    /// Entry `e`'s free room changed: `free` writes it, as for [`RoomIndex::new`].
    pub fn set(&mut self, e: usize, free: impl Fn(&mut [i64])) {
        let w = self.width;
        let mut n = self.leaves + e;
        let leaf = &mut self.max[n * w..(n + 1) * w];
        let mut was = [0; TRACKED];
        was[..w].copy_from_slice(leaf);
        free(leaf);
        if leaf.iter().zip(was).any(|(now, before)| *now > before) {
            self.none_before.clear();
        }
        while n > 1 {
            n /= 2;
            for d in 0..w {
                self.max[n * w + d] = self.max[2 * n * w + d].max(self.max[(2 * n + 1) * w + d]);
            }
        }
    }

    /// The first entry at or after `from` with at least `need` free in every
    /// tracked resource `need` asks for (resources it does not ask for are
    /// not looked at): the only entries a pod needing `need` might fit.
    ///
    /// It starts at `from`'s leaf, not at the root: first fit asks again
    /// from the entry after each one that refused the pod for another
    /// reason, and when most entries have room that costs a step, not a
    /// descent from the root.
    pub fn next(&mut self, from: usize, need: &[i64]) -> Option<usize> {
        let mut key: Need = [0; TRACKED];
        for (k, r) in key.iter_mut().zip(need.iter().take(self.width)) {
            *k = (*r).max(0);
        }
        let known = self.none_before.get(&key).copied().unwrap_or(0);
        let start = from.max(known);
        let found = self.search(start, need);
        // What this search saw joins what is known only when it began where that ends.
        if from <= known {
            self.none_before.insert(key, found.unwrap_or(self.entries));
        }
        found
    }

    /// The first entry at or after `from` with the room, by the tree alone.
    fn search(&self, from: usize, need: &[i64]) -> Option<usize> {
        if from >= self.entries {
            return None;
        }
        let mut n = self.leaves + from;
        loop {
            if self.room_for(n, need) {
                if n >= self.leaves {
                    // Leaves past the entries are padding, and so is every one after.
                    let e = n - self.leaves;
                    return (e < self.entries).then_some(e);
                }
                // A stretch's maxima may come from different entries: look inside.
                n *= 2;
                continue;
            }
            // Past this stretch: to the next one on the right, at the lowest level there is one.
            while n % 2 == 1 {
                n /= 2;
            }
            if n == 0 {
                return None;
            }
            n += 1;
        }
    }

    fn room_for(&self, n: usize, need: &[i64]) -> bool {
        let w = self.width;
        need.iter()
            .take(w)
            .enumerate()
            .all(|(d, r)| *r <= 0 || self.max[n * w + d] >= *r)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::RoomIndex;

    /// The walk the index replaces: the first entry at or after `from` with
    /// the room.
    fn walk(free: &[Vec<i64>], from: usize, need: &[i64]) -> Option<usize> {
        (from..free.len()).find(|&e| need.iter().zip(&free[e]).all(|(r, f)| *r <= 0 || f >= r))
    }

    proptest! {
        /// Through any mix of updates (room shrinking or growing) and
        /// searches, the index finds the entry the walk finds.
        #[test]
        fn finds_what_a_walk_finds(
            free in prop::collection::vec(prop::collection::vec(-4i64..16, 3), 1..40),
            steps in prop::collection::vec(
                prop_oneof![
                    (0usize..40, prop::collection::vec(-4i64..16, 3)).prop_map(|(e, f)| (Some((e, f)), 0, vec![])),
                    // A few sizes, as a solve's pods come in: searches for the same need repeat.
                    (0usize..45, prop::sample::select(vec![vec![2, 2, 1], vec![6, 3, 1], vec![10, 10, 1], vec![0, 8, 0]]))
                        .prop_map(|(from, need)| (None, from, need)),
                ],
                1..40,
            ),
        ) {
            let mut free = free;
            let mut index = RoomIndex::new(free.len(), 3, |e, out| out.copy_from_slice(&free[e]));
            for (update, from, need) in steps {
                if let Some((e, f)) = update {
                    if e < free.len() {
                        index.set(e, |out| out.copy_from_slice(&f));
                        free[e] = f;
                    }
                    continue;
                }
                let mut from = from;
                // Every qualifying entry in turn, as first fit asks when a leaf refuses.
                loop {
                    let want = walk(&free, from, &need);
                    prop_assert_eq!(index.next(from, &need), want);
                    match want {
                        Some(e) => from = e + 1,
                        None => break,
                    }
                }
            }
        }
    }

    #[test]
    fn an_empty_index_finds_nothing() {
        let mut index = RoomIndex::new(0, 3, |_, _| {});
        assert_eq!(index.next(0, &[1, 1, 1]), None);
    }
}
