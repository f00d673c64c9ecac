//! The room left on existing entries, indexed for first fit: a pod takes the
//! first existing node or claim it fits, and once most of a large cluster is
//! full, walking every entry to find it made each what-if cost time in
//! proportion to the cluster. A max tree over each entry's free cpu, memory
//! and pod slots skips every stretch of entries too full for the pod, and
//! finds the same first entry the walk would.

/// How many leading resources (cpu, memory, pods: the table's fixed first
/// three) the index tracks.
const TRACKED: usize = 3;

/// The most free room of each tracked resource over every stretch of entries
/// (a complete binary tree over the entries, padded to a power of two).
#[derive(Debug, Clone)]
pub struct RoomIndex {
    entries: usize,
    leaves: usize,
    width: usize,
    /// Node `n`'s maximum per resource at `n * width ..`; the root is node 1.
    max: Vec<i64>,
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
        }
    }

    /// Entry `e`'s free room changed: `free` writes it, as for [`RoomIndex::new`].
    pub fn set(&mut self, e: usize, free: impl Fn(&mut [i64])) {
        let w = self.width;
        let mut n = self.leaves + e;
        free(&mut self.max[n * w..(n + 1) * w]);
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
    pub fn next(&self, from: usize, need: &[i64]) -> Option<usize> {
        if from >= self.entries {
            return None;
        }
        self.descend(1, 0, self.leaves, from, need)
    }

    fn room_for(&self, n: usize, need: &[i64]) -> bool {
        let w = self.width;
        need.iter()
            .take(w)
            .enumerate()
            .all(|(d, r)| *r <= 0 || self.max[n * w + d] >= *r)
    }

    /// The first qualifying leaf at or after `from` under node `n`, which
    /// spans leaves `lo..hi`.
    fn descend(&self, n: usize, lo: usize, hi: usize, from: usize, need: &[i64]) -> Option<usize> {
        if hi <= from || lo >= self.entries || !self.room_for(n, need) {
            return None;
        }
        if hi - lo == 1 {
            return Some(lo);
        }
        let mid = (lo + hi) / 2;
        self.descend(2 * n, lo, mid, from, need)
            .or_else(|| self.descend(2 * n + 1, mid, hi, from, need))
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
        /// After any updates, the index finds the entry the walk finds.
        #[test]
        fn finds_what_a_walk_finds(
            free in prop::collection::vec(prop::collection::vec(-4i64..16, 3), 1..40),
            updates in prop::collection::vec((0usize..40, prop::collection::vec(-4i64..16, 3)), 0..20),
            need in prop::collection::vec(0i64..12, 3),
            from in 0usize..45,
        ) {
            let mut free = free;
            let mut index = RoomIndex::new(free.len(), 3, |e, out| out.copy_from_slice(&free[e]));
            for (e, f) in updates {
                if e < free.len() {
                    index.set(e, |out| out.copy_from_slice(&f));
                    free[e] = f;
                }
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

    #[test]
    fn an_empty_index_finds_nothing() {
        let index = RoomIndex::new(0, 3, |_, _| {});
        assert_eq!(index.next(0, &[1, 1, 1]), None);
    }
}
