//! A lower bound on what any plan could pay per hour for new nodes: the LP
//! relaxation over cpu, memory and pod slots, where nodes may be bought in
//! fractions. Its columns are the pools' offerings (type × zone × capacity
//! type at that offering's price); free room on existing nodes counts as
//! free capacity.
//!
//! Pods cannot go anywhere, and a bound that ignores that says little about
//! a plan of pinned pods. So pods are grouped by the offerings they may use;
//! for each group's set C of offerings, every pod whose offerings lie within
//! C must be bought from C, which bounds the cost from below; groups with
//! disjoint sets add up. The bound is the best of those sums and the plain
//! bound over everything. Topology (spreads, anti-affinity) is not modelled.
//!
//! With three covering rows each LP is small whatever the catalog: a revised
//! simplex over a 3×3 basis, two phases, Bland's rule so that it ends. The
//! value returned is the dual objective after scaling the duals until every
//! column's constraint holds, so rounding can only lower it, never make it
//! claim more than the true optimum.

use std::collections::BTreeMap;

use super::dense::fits;
use super::model::Model;
use super::pod::tolerates_all;
use crate::catalog::OfferingRequirements;

/// cpu, memory and pods: the dense resource indices the bound covers.
const DIMS: usize = 3;
/// Rounding slack for reduced costs and pivots.
const EPS: f64 = 1e-9;
/// Pivots before giving up on optimality (the scaled duals stay valid).
const MAX_PIVOTS: usize = 10_000;

/// One column: an offering's price and the room of its type.
type Column = (f64, [f64; DIMS]);

/// The bound for the pods `placed` (indices into the model's pods), or 0
/// when they fit in free existing capacity.
pub fn lower_bound(m: &Model, placed: impl Iterator<Item = usize>) -> f64 {
    let mut free = [0f64; DIMS];
    for e in m.existing.iter().filter(|e| !e.cordoned) {
        for (d, v) in free.iter_mut().enumerate() {
            *v += (e.avail[d] - e.used[d]).max(0) as f64;
        }
    }
    // Every usable offering of every pool, with where it is offered.
    let mut columns: Vec<Column> = Vec::new();
    let mut owner: Vec<(usize, usize, usize)> = Vec::new();
    for (pi, pool) in m.pools.iter().enumerate().filter(|(_, p)| p.error.is_none()) {
        let allowed = OfferingRequirements::of(&pool.reqs);
        for (ti, t) in pool.types.iter().enumerate() {
            for (oi, o) in t.offerings.iter().enumerate() {
                if o.available && o.price.is_finite() && allowed.allow(o) {
                    columns.push((o.price, [t.avail[0] as f64, t.avail[1] as f64, t.avail[2] as f64]));
                    owner.push((pi, ti, oi));
                }
            }
        }
    }
    // Demand per set of usable offerings.
    let mut demand_of: BTreeMap<Vec<u32>, [f64; DIMS]> = BTreeMap::new();
    let mut by_shape: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for i in placed {
        let shape = m.pods[i].shape;
        let set = by_shape
            .entry(shape)
            .or_insert_with(|| usable(m, shape, &owner))
            .clone();
        let d = demand_of.entry(set).or_insert([0.0; DIMS]);
        for (r, v) in d.iter_mut().enumerate() {
            *v += m.pod(i).req[r] as f64;
        }
    }
    let net = |d: [f64; DIMS]| std::array::from_fn(|r| d[r] - free[r]);
    let mut total = [0f64; DIMS];
    for d in demand_of.values() {
        for r in 0..DIMS {
            total[r] += d[r];
        }
    }
    let everything = cover(&net(total), &columns);
    // Each set C bounds the pods that can only use offerings within C.
    let mut by_set: Vec<(f64, &Vec<u32>)> = demand_of
        .keys()
        .map(|c| {
            let mut d = [0f64; DIMS];
            for (other, od) in &demand_of {
                if is_subset(other, c) {
                    for r in 0..DIMS {
                        d[r] += od[r];
                    }
                }
            }
            let cols: Vec<Column> = c.iter().map(|j| columns[*j as usize]).collect();
            (cover(&net(d), &cols), c)
        })
        .collect();
    by_set.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut chosen: Vec<&Vec<u32>> = Vec::new();
    let mut disjoint_sum = 0.0;
    for (b, c) in by_set {
        if chosen.iter().all(|o| is_disjoint(o, c)) {
            chosen.push(c);
            disjoint_sum += b;
        }
    }
    everything.max(disjoint_sum)
}

/// The columns a pod shape may use: pools it tolerates, a node term the
/// pool, type and offering all allow, and room for it.
fn usable(m: &Model, shape: u32, owner: &[(usize, usize, usize)]) -> Vec<u32> {
    let p = &m.shapes[shape as usize];
    let mut out = Vec::new();
    let mut last: Option<(usize, usize, Vec<usize>)> = None;
    for (j, (pi, ti, oi)) in owner.iter().enumerate() {
        // The terms that allow this pool and type, computed once per type.
        if last.as_ref().is_none_or(|(lp, lt, _)| (lp, lt) != (pi, ti)) {
            let pool = &m.pools[*pi];
            let t = &pool.types[*ti];
            let ok = tolerates_all(&p.model.tolerations, &pool.taints, false).is_ok()
                && fits(&p.req, &t.avail)
                && (p.accelerator || pool.asks_accelerator || !t.accelerator);
            let terms = if ok {
                (0..p.terms.len())
                    .filter(|k| {
                        pool.reqs.compatible(&p.terms[*k], true).is_ok() && t.reqs.intersects(&p.terms[*k]).is_ok()
                    })
                    .collect()
            } else {
                Vec::new()
            };
            last = Some((*pi, *ti, terms));
        }
        let Some((_, _, terms)) = &last else { continue };
        let o = &m.pools[*pi].types[*ti].offerings[*oi];
        if terms.iter().any(|k| OfferingRequirements::of(&p.terms[*k]).allow(o)) {
            out.push(j as u32);
        }
    }
    out
}

fn is_subset(a: &[u32], b: &[u32]) -> bool {
    a.iter().all(|x| b.binary_search(x).is_ok())
}

fn is_disjoint(a: &[u32], b: &[u32]) -> bool {
    !a.iter().any(|x| b.binary_search(x).is_ok())
}

/// min Σ cⱼxⱼ subject to Σ aⱼxⱼ ≥ demand, x ≥ 0, by its dual: the largest
/// Σ demandᵣyᵣ with every column's aⱼ·y ≤ cⱼ. Rows without demand drop out.
pub fn cover(demand: &[f64; DIMS], columns: &[Column]) -> f64 {
    let rows: Vec<usize> = (0..DIMS).filter(|r| demand[*r] > 0.0).collect();
    if rows.is_empty() {
        return 0.0;
    }
    // Each row scaled to demand 1 keeps the numbers near 1.
    let cols: Vec<(f64, Vec<f64>)> = columns
        .iter()
        .map(|(c, a)| (*c, rows.iter().map(|r| a[*r] / demand[*r]).collect()))
        .collect();
    if cols.iter().any(|(c, a)| *c <= 0.0 && a.iter().any(|v| *v > 0.0)) {
        return 0.0;
    }
    let y = Simplex::new(&cols).solve();
    // Scale the duals into feasibility: then Σy is a valid lower bound.
    let worst = cols
        .iter()
        .filter(|(c, _)| *c > 0.0)
        .map(|(c, a)| a.iter().zip(&y).map(|(v, w)| v * w).sum::<f64>() / c)
        .fold(1.0f64, f64::max);
    y.iter().map(|v| v.max(0.0)).sum::<f64>() / worst
}

/// Revised simplex for min c·x, A x − s = 1, x, s ≥ 0 (k ≤ 3 rows), with
/// artificial columns for the first phase. Column ids: the real columns,
/// then k surplus, then k artificial.
struct Simplex<'a> {
    cols: &'a [(f64, Vec<f64>)],
    k: usize,
    basis: Vec<usize>,
    inv: Vec<Vec<f64>>,
    x: Vec<f64>,
}

impl<'a> Simplex<'a> {
    fn new(cols: &'a [(f64, Vec<f64>)]) -> Self {
        let k = cols.first().map_or(0, |c| c.1.len());
        let n = cols.len();
        Simplex {
            cols,
            k,
            basis: (0..k).map(|r| n + k + r).collect(),
            inv: (0..k)
                .map(|r| (0..k).map(|c| f64::from(u8::from(r == c))).collect())
                .collect(),
            x: vec![1.0; k],
        }
    }

    fn column(&self, j: usize) -> Vec<f64> {
        let n = self.cols.len();
        if j < n {
            self.cols[j].1.clone()
        } else if j < n + self.k {
            (0..self.k).map(|r| if r == j - n { -1.0 } else { 0.0 }).collect()
        } else {
            (0..self.k)
                .map(|r| if r == j - n - self.k { 1.0 } else { 0.0 })
                .collect()
        }
    }

    fn cost(&self, j: usize, phase_one: bool) -> f64 {
        let n = self.cols.len();
        match (phase_one, j < n, j >= n + self.k) {
            (true, _, artificial) => f64::from(u8::from(artificial)),
            (false, true, _) => self.cols[j].0,
            (false, false, _) => 0.0,
        }
    }

    fn duals(&self, phase_one: bool) -> Vec<f64> {
        (0..self.k)
            .map(|c| {
                (0..self.k)
                    .map(|r| self.cost(self.basis[r], phase_one) * self.inv[r][c])
                    .sum()
            })
            .collect()
    }

    fn direction(&self, j: usize) -> Vec<f64> {
        let a = self.column(j);
        (0..self.k)
            .map(|r| (0..self.k).map(|c| self.inv[r][c] * a[c]).sum())
            .collect()
    }

    fn pivot(&mut self, r: usize, j: usize, u: &[f64]) {
        let p = u[r];
        let (row, x) = (self.inv[r].iter().map(|v| v / p).collect::<Vec<_>>(), self.x[r] / p);
        for i in (0..self.k).filter(|i| *i != r) {
            let f = u[i];
            for (v, w) in self.inv[i].iter_mut().zip(&row) {
                *v -= f * w;
            }
            self.x[i] -= f * x;
        }
        self.inv[r] = row;
        self.x[r] = x;
        self.basis[r] = j;
    }

    /// Pivots until no column improves (Bland's rule); false when the limit hit.
    fn run(&mut self, phase_one: bool) -> bool {
        let n = self.cols.len();
        let entering_ids = if phase_one { n + 2 * self.k } else { n + self.k };
        for _ in 0..MAX_PIVOTS {
            let y = self.duals(phase_one);
            let entering = (0..entering_ids).filter(|j| !self.basis.contains(j)).find(|j| {
                let a = self.column(*j);
                self.cost(*j, phase_one) - a.iter().zip(&y).map(|(v, w)| v * w).sum::<f64>() < -EPS
            });
            let Some(j) = entering else { return true };
            let u = self.direction(j);
            let leaving = (0..self.k).filter(|r| u[*r] > EPS).min_by(|a, b| {
                (self.x[*a] / u[*a])
                    .total_cmp(&(self.x[*b] / u[*b]))
                    .then_with(|| self.basis[*a].cmp(&self.basis[*b]))
            });
            let Some(r) = leaving else { return true };
            self.pivot(r, j, &u);
        }
        false
    }

    /// The duals of the optimum (or of the last basis when cut short).
    fn solve(mut self) -> Vec<f64> {
        let n = self.cols.len();
        self.run(true);
        // Drive artificials left at zero out of the basis through a surplus
        // column (one always has a non-zero entry: the basis inverse is regular).
        for r in 0..self.k {
            if self.basis[r] >= n + self.k {
                let pick = (n..n + self.k)
                    .filter(|j| !self.basis.contains(j))
                    .map(|j| (j, self.direction(j)))
                    .find(|(_, u)| u[r].abs() > EPS);
                if let Some((j, u)) = pick {
                    self.pivot(r, j, &u);
                }
            }
        }
        self.run(false);
        self.duals(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_resource_is_bought_at_the_best_rate() {
        // 10 cpu; a 4-cpu node at 1.0 beats a 2-cpu node at 0.6.
        let b = cover(&[10.0, 0.0, 0.0], &[(1.0, [4.0, 0.0, 0.0]), (0.6, [2.0, 0.0, 0.0])]);
        assert!((b - 2.5).abs() < 1e-9, "{b}");
    }

    #[test]
    fn a_mix_of_two_shapes_beats_either_alone() {
        // Demand 8 cpu, 8 memory. A: (4 cpu, 1 mem) at 1; B: (1 cpu, 4 mem) at 1.
        // A alone needs 8 nodes, B alone 8; the mix x_A = x_B = 1.6 costs 3.2.
        let b = cover(&[8.0, 8.0, 0.0], &[(1.0, [4.0, 1.0, 0.0]), (1.0, [1.0, 4.0, 0.0])]);
        assert!((b - 3.2).abs() < 1e-9, "{b}");
    }

    #[test]
    fn the_binding_resource_sets_the_bound() {
        // Pods bind: 30 pods, 10 slots a node at 0.5, cpu plentiful.
        let b = cover(&[1.0, 1.0, 30.0], &[(0.5, [64.0, 256.0, 10.0])]);
        assert!((b - 1.5).abs() < 1e-9, "{b}");
        assert_eq!(cover(&[0.0, -3.0, 0.0], &[(0.5, [1.0, 1.0, 1.0])]), 0.0);
    }

    proptest::proptest! {
        /// The bound never exceeds the cost of any integral cover of the same demand.
        #[test]
        fn never_above_a_real_cover(
            demand in proptest::array::uniform3(0.0f64..50.0),
            cols in proptest::collection::vec((0.1f64..5.0, proptest::array::uniform3(0.5f64..16.0)), 1..12),
        ) {
            let b = cover(&demand, &cols);
            for (c, a) in &cols {
                let n = (0..DIMS).map(|d| (demand[d] / a[d]).ceil()).fold(0.0f64, f64::max);
                proptest::prop_assert!(b <= c * n + 1e-9, "bound {} above {} nodes at {}", b, n, c);
            }
            // And it is tight for one column: that column's fractional count.
            if cols.len() == 1 {
                let (c, a) = &cols[0];
                let x = (0..DIMS).map(|d| demand[d] / a[d]).fold(0.0f64, f64::max);
                proptest::prop_assert!((b - c * x).abs() <= 1e-6 * (1.0 + c * x), "{} vs {}", b, c * x);
            }
        }
    }
}
