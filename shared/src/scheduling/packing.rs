//! The cost improvement over plain first-fit-decreasing. FFD fills each new
//! node until the largest instance type is full, then launches the cheapest
//! type that holds what it got; when big types cost more per useful resource
//! than smaller ones, that is wasteful, and sorting by cpu alone leaves the
//! first nodes short of memory and the last short of cpu. So the solve also
//! runs other passes and keeps whichever complete plan schedules the most
//! pods at the lowest price (ties go to plain FFD). A pass that schedules as
//! many pods as Karpenter's order but not the same ones is never kept, however cheap:
//! which pods wait is Karpenter's call (its first-fit-decreasing order), and
//! a cheaper plan that leaves a larger pod pending for a smaller one (say a
//! zone-pinned pod for one that must avoid it) is a different answer, not a
//! better price. Only a pass that schedules strictly more may change the set.
//!
//! - Karpenter's own order (claims with the fewest pods first, topology
//!   domains chosen as Karpenter chooses them), at every size, so that a
//!   plan is never dearer than the one Karpenter would make for the same
//!   pods, nor on more nodes at the same price; and, up to
//!   [`FEWEST_PODS_MAX`] pods, that order with domains chosen for price;
//! - a balanced pass (pods picked to fill each node's cpu and memory
//!   together) that keeps pods able to run on spot off nodes that can only be
//!   on-demand (`Strategy::spot_first`);
//! - the same with node sizes capped at the shapes that are cheapest per
//!   unit of this workload's demand.
//!
//! Each candidate is a full, valid solve, so every constraint holds whichever
//! wins. The number of capped passes shrinks with the pod count, so the
//! search has a bounded, deterministic budget.

use std::time::Instant;

use super::model::Model;
use super::scheduler::{Assignment, Cap, Run, Strategy};

/// Pod-passes the search may spend beyond the FFD pass (pods × passes).
pub const SEARCH_BUDGET: usize = 8_000;
/// The most capped passes tried.
pub const MAX_CANDIDATES: usize = 6;
/// Up to this many pods, Karpenter's claim order (fewest pods first) is also
/// tried with domains chosen for price; Karpenter's own plan is tried at
/// every size.
pub const FEWEST_PODS_MAX: usize = 2_000;

/// Node shapes worth capping at: for each pool type that can hold the largest
/// pod, its price per unit of the workload's cpu:memory mix, cheapest first.
pub fn candidate_caps(m: &Model) -> Vec<Cap> {
    if m.pods.is_empty() {
        return Vec::new();
    }
    let (mut cpu, mut mem, mut max_cpu, mut max_mem) = (0i128, 0i128, 0i64, 0i64);
    for i in 0..m.pods.len() {
        let p = m.pod(i);
        cpu += p.req[0] as i128;
        mem += p.req[1] as i128;
        max_cpu = max_cpu.max(p.req[0]);
        max_mem = max_mem.max(p.req[1]);
    }
    let cpu = (cpu.max(1)) as f64;
    let mem = (mem.max(1)) as f64;
    let mut scored: Vec<(f64, Cap)> = Vec::new();
    let mut largest = Cap { cpu: 0, memory: 0 };
    for pool in m.pools.iter().filter(|p| p.error.is_none()) {
        for t in pool.types.iter().filter(|t| !t.accelerator) {
            let (c, g) = (t.avail[0], t.avail[1]);
            largest = largest.max(Cap { cpu: c, memory: g });
            if c < max_cpu || g < max_mem || !t.price.is_finite() || t.price <= 0.0 {
                continue;
            }
            // Fraction of the whole demand one node of this type can hold.
            let units = (c as f64 / cpu).min(g as f64 / mem);
            if units > 0.0 {
                scored.push((t.price / units, Cap { cpu: c, memory: g }));
            }
        }
    }
    scored.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
    let mut caps: Vec<Cap> = Vec::new();
    for (_, c) in scored {
        if caps.contains(&c) || (c.cpu >= largest.cpu && c.memory >= largest.memory) {
            continue;
        }
        caps.push(c);
        if caps.len() == MAX_CANDIDATES {
            break;
        }
    }
    caps
}

/// True when `a` schedules more pods than `b`, or as many for less, or as
/// many for the same price on fewer nodes.
fn better(a: &Assignment, b: &Assignment) -> bool {
    let (ua, ub) = (a.unschedulable.len(), b.unschedulable.len());
    ua < ub || (ua == ub && (a.cost < b.cost - 1e-9 || (a.cost <= b.cost + 1e-9 && a.claims.len() < b.claims.len())))
}

/// The pods a pass leaves pending, sorted.
fn left_pending(a: &Assignment) -> Vec<usize> {
    let mut left: Vec<usize> = a.unschedulable.iter().map(|(i, _)| *i).collect();
    left.sort_unstable();
    left
}

/// True when a pass may be kept against Karpenter's order, which left
/// `reference` pending: it schedules strictly more pods, or the same ones.
fn admissible(a: &Assignment, reference: &[usize]) -> bool {
    a.unschedulable.len() < reference.len()
        || (a.unschedulable.len() == reference.len() && left_pending(a) == reference)
}

/// The passes tried after plain FFD, in order.
pub(super) fn strategies(m: &Model) -> Vec<Strategy> {
    // Karpenter's plan itself (claims by fewest pods, domains chosen as
    // Karpenter chooses them): a plan is never dearer than it, nor on more
    // nodes at its price, at any size.
    let mut out = vec![Strategy {
        fewest_pods: true,
        karpenter_domains: true,
        ..Strategy::default()
    }];
    if m.pods.len() <= FEWEST_PODS_MAX {
        // The same order with each claim's domain chosen for price.
        out.push(Strategy {
            fewest_pods: true,
            ..Strategy::default()
        });
    }
    let tuned = Strategy {
        balanced: true,
        spot_first: true,
        ..Strategy::default()
    };
    out.push(tuned);
    let passes = (SEARCH_BUDGET / m.pods.len().max(1)).clamp(1, MAX_CANDIDATES);
    out.extend(candidate_caps(m).into_iter().take(passes).map(|cap| Strategy {
        cap: Some(cap),
        ..tuned
    }));
    out
}

/// The cheapest plan among plain FFD and the passes of [`strategies`] the
/// deadline (checked between passes) allows, among those [`admissible`].
pub fn best(m: &Model, deadline: Option<Instant>) -> Assignment {
    let mut best = Run::new(m, Strategy::default()).schedule();
    // The pods Karpenter's order leaves pending: its own pass's when that
    // runs (first of the strategies), plain FFD's otherwise.
    let mut reference = left_pending(&best);
    for strategy in strategies(m) {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let o = Run::new(m, strategy).schedule();
        if strategy.karpenter_domains {
            reference = left_pending(&o);
            if !admissible(&best, &reference) {
                best = o;
                continue;
            }
        }
        if admissible(&o, &reference) && better(&o, &best) {
            best = o;
        }
    }
    best
}
