//! Dense resource vectors: every resource name the solve meets gets an index,
//! so fit checks are a tight loop over a few integers instead of map lookups.

use std::collections::BTreeSet;

use crate::quantity::Quantity;
use crate::resources::{self, Resources};

/// Resource names and their indices; cpu, memory and pods come first.
#[derive(Debug, Clone)]
pub struct ResourceTable {
    names: Vec<String>,
}

/// A resource vector in milli-units, indexed by a [`ResourceTable`].
pub type Vector = Vec<i64>;

impl ResourceTable {
    /// A table holding cpu, memory, pods and every other name given.
    pub fn new<'a>(names: impl IntoIterator<Item = &'a str>) -> Self {
        let fixed = [resources::CPU, resources::MEMORY, resources::PODS];
        let rest: BTreeSet<&str> = names.into_iter().filter(|n| !fixed.contains(n)).collect();
        ResourceTable {
            names: fixed.iter().copied().chain(rest).map(str::to_string).collect(),
        }
    }

    /// The index of a resource name.
    pub fn index(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }

    /// The name at an index.
    pub fn name(&self, i: usize) -> &str {
        &self.names[i]
    }

    /// A zero vector.
    pub fn zero(&self) -> Vector {
        vec![0; self.names.len()]
    }

    /// The dense form of a resource list (names missing from the table are dropped).
    pub fn vector(&self, r: &Resources) -> Vector {
        let mut v = self.zero();
        for (k, q) in &r.0 {
            if let Some(i) = self.index(k) {
                v[i] = q.milli();
            }
        }
        v
    }

    /// The map form of a vector, without zero entries.
    pub fn resources(&self, v: &[i64]) -> Resources {
        Resources(
            self.names
                .iter()
                .zip(v)
                .filter(|(_, q)| **q != 0)
                .map(|(n, q)| (n.clone(), Quantity::from_milli(*q)))
                .collect(),
        )
    }
}

/// `a + b`.
pub fn plus(a: &[i64], b: &[i64]) -> Vector {
    a.iter().zip(b).map(|(x, y)| x.saturating_add(*y)).collect()
}

/// `a += b`.
pub fn add(a: &mut [i64], b: &[i64]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x = x.saturating_add(*y);
    }
}

/// `a -= b`.
pub fn sub(a: &mut [i64], b: &[i64]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x = x.saturating_sub(*y);
    }
}

/// True when every positive entry of `need` fits in `have`.
pub fn fits(need: &[i64], have: &[i64]) -> bool {
    need.iter().zip(have).all(|(n, h)| fits_one(*n, *h))
}

/// A need of one resource fits what is there (a need of none always does).
fn fits_one(need: i64, have: i64) -> bool {
    need <= 0 || need <= have
}

/// [`fits`] for `a + b`, without building the sum (first fit asks it of
/// every node).
pub fn fits_sum(a: &[i64], b: &[i64], have: &[i64]) -> bool {
    a.iter()
        .zip(b)
        .zip(have)
        .all(|((x, y), h)| fits_one(x.saturating_add(*y), *h))
}

/// The index of the first entry of `need` that does not fit in `have`.
pub fn first_exceeding(need: &[i64], have: &[i64]) -> Option<usize> {
    need.iter().zip(have).position(|(n, h)| *n > 0 && n > h)
}

/// Element-wise maximum into `a`.
pub fn max_into(a: &mut [i64], b: &[i64]) {
    for (x, y) in a.iter_mut().zip(b) {
        if *y > *x {
            *x = *y;
        }
    }
}
