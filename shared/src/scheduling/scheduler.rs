//! One scheduling pass: pods in first-fit-decreasing order go to the first
//! existing node, then the first new claim, then a new claim from the first
//! pool (by weight) that can take them; failures are relaxed and retried.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::rc::Rc;

use sha2::{Digest, Sha256};

use super::claim::{Claim, Ctx, Fail, cheapest, cheapest_where};
use super::compile::{OfferMask, Pool, TypeModel};
use super::dense::{self, Vector, fits};
use super::existing::Existing;
use super::failure::{Constraint, PlacementFailure, PoolRejection, Rejection, normalise};
use super::model::{Model, PendingPod};
use super::pod::{PodRef, tolerates_all};
use super::preferences::{Active, Relaxation};
use super::room::RoomIndex;
use super::topology::{Counts, Domains, GroupKind};
use super::{ExistingPlacement, NewNodeClaim, Plan, Unschedulable};
use crate::catalog::{Offering, OfferingRequirements};
use crate::labels;
use crate::requirements::{Requirement, Requirements};

/// How a pass packs.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Strategy {
    /// Largest node shape to open while a smaller one can take the pod.
    pub cap: Option<Cap>,
    /// Try new claims with the fewest pods first (Karpenter's order) rather
    /// than in the order they were opened.
    pub fewest_pods: bool,
    /// Choose a claim's topology domain as Karpenter does (fewest spread
    /// pods, most affinity pods, then the first by name) rather than the
    /// cheapest: the pass then makes Karpenter's own plan.
    pub karpenter_domains: bool,
    /// Take pods in a balanced order (see [`Picker`]) rather than
    /// first-fit-decreasing.
    pub balanced: bool,
    /// Keep pods that could run on spot off new claims that can only be
    /// on-demand (e.g. pinned to a zone without spot), unless they fit there
    /// at no extra cost (the claim's cheapest type still holds them).
    pub spot_first: bool,
}

/// A node size ceiling: room for pods in cpu and memory (milli-units).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cap {
    /// CPU room.
    pub cpu: i64,
    /// Memory room.
    pub memory: i64,
}

impl Cap {
    /// True when a type with this room stays within the cap.
    pub fn admits(&self, avail: &Vector) -> bool {
        avail[0] <= self.cpu && avail[1] <= self.memory
    }
}

/// The order of a balanced pass. First-fit-decreasing by cpu fills the first
/// nodes with cpu and the last with memory, and the mismatch is paid for in
/// node count. Here the node being filled (the newest claim) picks its next
/// pod: of the pod shapes that still fit in its room, the one whose requests
/// point most along that room (the largest dot product of requests and room,
/// each as a share of the node), so that cpu-heavy and memory-heavy pods
/// share nodes. When nothing fits, the largest pod left opens the next node.
pub struct Picker {
    /// Pods left per shape, in first-fit-decreasing order.
    by_shape: Vec<VecDeque<usize>>,
    /// Shapes with pods left.
    live: Vec<u32>,
    /// Pods already taken.
    taken: Vec<bool>,
    /// The first pod (in first-fit-decreasing order) not yet looked at.
    next: usize,
}

impl Picker {
    /// A picker over every pending pod of the model.
    pub fn new(m: &Model) -> Self {
        let mut by_shape = vec![VecDeque::new(); m.shapes.len()];
        for (i, p) in m.pods.iter().enumerate() {
            by_shape[p.shape as usize].push_back(i);
        }
        let live = (0..m.shapes.len() as u32)
            .filter(|s| !by_shape[*s as usize].is_empty())
            .collect();
        Picker {
            by_shape,
            live,
            taken: vec![false; m.pods.len()],
            next: 0,
        }
    }

    /// The next pod to place while `filling` is the newest claim.
    pub fn next(&mut self, m: &Model, filling: Option<&Claim>) -> Option<usize> {
        let pick = filling.and_then(|c| {
            let room: Vec<i64> = (0..3).map(|d| c.max_avail[d] - c.used[d]).collect();
            let share = |d: usize, v: i64| v as f64 / c.max_avail[d].max(1) as f64;
            self.live
                .iter()
                .map(|s| (*s, &m.shapes[*s as usize].req))
                .filter(|(_, r)| (0..3).all(|d| r[d] <= room[d]))
                .map(|(s, r)| {
                    (
                        s,
                        share(0, r[0]) * share(0, room[0]) + share(1, r[1]) * share(1, room[1]),
                    )
                })
                .max_by(|a, b| a.1.total_cmp(&b.1).then_with(|| b.0.cmp(&a.0)))
                .map(|(s, _)| s)
        });
        let i = match pick {
            Some(s) => self.by_shape[s as usize].pop_front()?,
            None => {
                while self.next < self.taken.len() && self.taken[self.next] {
                    self.next += 1;
                }
                if self.next == self.taken.len() {
                    return None;
                }
                let i = self.next;
                self.by_shape[m.pods[i].shape as usize].pop_front();
                i
            }
        };
        self.taken[i] = true;
        let s = m.pods[i].shape;
        if self.by_shape[s as usize].is_empty() {
            self.live.retain(|x| *x != s);
        }
        Some(i)
    }
}

/// An existing entry's free room in the first `out.len()` resources
/// (allocatable less `used`; none at all when cordoned).
fn free_room(ex: &Existing, used: &[i64], out: &mut [i64]) {
    for (d, o) in out.iter_mut().enumerate() {
        *o = if ex.cordoned {
            i64::MIN
        } else {
            ex.avail[d].saturating_sub(used[d])
        };
    }
}

/// True when the pod could run on spot capacity and no zonal topology ties
/// it to where it lands (such pods are the ones worth keeping off on-demand).
fn spot_capable(p: &super::model::PendingPod, a: &Active) -> bool {
    p.pin_keys.is_empty()
        && a.terms.iter().any(|t| {
            t.get(labels::CAPACITY_TYPE)
                .is_none_or(|r| r.has(labels::CAPACITY_SPOT))
        })
}

/// The state of one pass.
pub struct Run<'m> {
    m: &'m Model<'m>,
    strategy: Strategy,
    domains: Domains,
    counts: Counts,
    /// What each existing entry's pods use, flat (entries × resources): one
    /// copy per pass, not one allocation per node.
    ex_used: Vec<i64>,
    /// The number of resources (the width of a row of `ex_used`).
    width: usize,
    /// The existing entries' free room, for first fit.
    room: RoomIndex,
    /// Host ports the pods placed this run take, by entry (few take any:
    /// not a copy of every entry's).
    ex_ports: HashMap<usize, Vec<super::pod::HostPort>>,
    ex_pods: Vec<Vec<usize>>,
    claims: Vec<Claim>,
    /// Per claim, whether it holds a pod that could run on spot.
    holds_spot_capable: Vec<bool>,
    /// Per pod class, the claims that turned it away for good (`spot_first`,
    /// or a monotone failure in Karpenter's order), so later pods skip them.
    refused: HashMap<u32, Vec<bool>>,
    /// The claims in Karpenter's order (fewest pods, then oldest), kept as
    /// they fill when the pass tries claims that way.
    fewest: BTreeSet<(usize, usize)>,
    /// Per pool and pod shape, the empty claims a pod may open ([`Run::empty_claims`]).
    claim_templates: HashMap<(usize, u32), Rc<Vec<Claim>>>,
    pool_reserved: Vec<Vector>,
    pool_nodes: Vec<i64>,
    cursors: HashMap<u32, usize>,
}

/// The result of a pass: where each pending pod went.
#[derive(Debug, Clone)]
pub struct Assignment {
    /// New claims with their pods.
    pub claims: Vec<Claim>,
    /// Pending pods per existing target.
    pub existing: Vec<Vec<usize>>,
    /// Unplaceable pods with reasons.
    pub unschedulable: Vec<(usize, PlacementFailure)>,
    /// Hourly price of the new claims.
    pub cost: f64,
}

impl<'m> Run<'m> {
    /// A fresh pass over the model.
    pub fn new(m: &'m Model<'m>, strategy: Strategy) -> Self {
        debug_assert!(m.existing.iter().all(|e| e.used.len() == m.res.zero().len()));
        Run {
            m,
            strategy,
            domains: m.domains.clone(),
            counts: m.counts.clone(),
            ex_used: {
                let mut used = Vec::with_capacity(m.existing.len() * m.res.zero().len());
                for e in &m.existing {
                    used.extend_from_slice(&e.used);
                }
                used
            },
            width: m.res.zero().len(),
            room: RoomIndex::new(m.existing.len(), m.res.zero().len(), |e, out| {
                free_room(m.existing[e], &m.existing[e].used, out)
            }),
            ex_ports: HashMap::new(),
            ex_pods: vec![Vec::new(); m.existing.len()],
            claims: Vec::new(),
            holds_spot_capable: Vec::new(),
            refused: HashMap::new(),
            fewest: BTreeSet::new(),
            claim_templates: HashMap::new(),
            pool_reserved: vec![m.res.zero(); m.pools.len()],
            pool_nodes: vec![0; m.pools.len()],
            cursors: HashMap::new(),
        }
    }

    /// Places every pod it can.
    pub fn schedule(mut self) -> Assignment {
        let n = self.m.pods.len();
        let mut placed = 0usize;
        let mut queue = if self.strategy.balanced {
            // One balanced pass; what fails is retried as usual after it.
            let mut failed = VecDeque::new();
            let mut picker = Picker::new(self.m);
            while let Some(i) = picker.next(self.m, self.claims.last()) {
                if self.place(i, &Relaxation::default()) {
                    placed += 1;
                } else {
                    failed.push_back((i, Relaxation::default()));
                }
            }
            failed
        } else {
            (0..n).map(|i| (i, Relaxation::default())).collect()
        };
        let mut last_fail: Vec<Option<usize>> = vec![None; n];
        let mut unschedulable = Vec::new();
        while let Some((i, mut rel)) = queue.pop_front() {
            if self.place(i, &rel) {
                placed += 1;
                continue;
            }
            if rel.relax(self.m.pod(i)) {
                queue.push_back((i, rel));
            } else if last_fail[i] != Some(placed) {
                // Others placed since its last try may make room (pod affinity).
                last_fail[i] = Some(placed);
                queue.push_back((i, rel));
            } else {
                unschedulable.push((i, self.explain(i, &rel)));
            }
        }
        let cost = price_all(self.m, &self.claims, false)
            .iter()
            .map(|p| p.as_ref().map_or(0.0, |p| p.offering.price))
            .sum();
        Assignment {
            claims: self.claims,
            existing: self.ex_pods,
            unschedulable,
            cost,
        }
    }

    fn place(&mut self, i: usize, rel: &Relaxation) -> bool {
        let m = self.m;
        let p = m.pod(i);
        let a = rel.active(p);
        // First fit: the first entry that takes the pod, among those with the room.
        let mut from = 0;
        while let Some(e) = self.room.next(from, &p.req) {
            if self.fits_existing(e, i, &a) {
                self.commit_existing(e, i, &a);
                return true;
            }
            from = e + 1;
        }
        if self.strategy.fewest_pods {
            return self.place_fewest_pods(i, &a, rel.is_strict());
        }
        if self.place_on_claims(i, &a, rel.is_strict()) {
            return true;
        }
        for pi in 0..m.pools.len() {
            if self.new_claim(pi, i, &a) {
                return true;
            }
        }
        false
    }

    /// First fit over the claims opened so far, from the pod class's cursor
    /// when the constraints are strict; claims that refuse a class for good
    /// move the cursor past them.
    fn place_on_claims(&mut self, i: usize, a: &Active, use_cursor: bool) -> bool {
        let m = self.m;
        let p = m.pod(i);
        let start = if use_cursor {
            self.cursors.get(&p.class).copied().unwrap_or(0)
        } else {
            0
        };
        let mut cursor = start;
        let mut contiguous = true;
        let spot_first = self.strategy.spot_first;
        let spot_capable = spot_first && spot_capable(p, a);
        // Taken out for the scan, so that looking it up costs nothing per claim.
        let mut refused = if spot_first {
            self.refused.remove(&p.class).unwrap_or_default()
        } else {
            Vec::new()
        };
        for ci in start..self.claims.len() {
            if refused.get(ci) == Some(&true) {
                if contiguous {
                    cursor = ci + 1;
                }
                continue;
            }
            let cx = Ctx {
                m,
                counts: &self.counts,
                domains: &self.domains,
                by_name: self.strategy.karpenter_domains,
            };
            match self.claims[ci].try_add(&cx, i, a) {
                // The claim only fills and narrows, so it stays refused to
                // the class (as good as always: a spread may later choose
                // another zone; skipping it then costs packing, not rules).
                Ok(u) if spot_first && self.costs_spot(ci, &u, spot_capable) => {
                    refused.resize(refused.len().max(ci + 1), false);
                    refused[ci] = true;
                    if contiguous {
                        cursor = ci + 1;
                    }
                }
                Ok(u) => {
                    self.holds_spot_capable[ci] |= spot_capable;
                    self.commit_claim(ci, i, a, u);
                    if use_cursor {
                        self.cursors.insert(p.class, if contiguous { ci } else { cursor });
                    }
                    if !refused.is_empty() {
                        self.refused.insert(p.class, refused);
                    }
                    return true;
                }
                Err(Fail { monotone }) => {
                    if contiguous && monotone {
                        cursor = ci + 1;
                    } else {
                        contiguous = false;
                    }
                }
            }
        }
        if use_cursor {
            self.cursors.insert(p.class, cursor);
        }
        if !refused.is_empty() {
            self.refused.insert(p.class, refused);
        }
        false
    }

    /// True when taking a pod (as `u`) would cost spot capacity: the claim
    /// can only be on-demand and the pod, which could run on spot, would make
    /// it dearer; or the pod would pin a claim holding such pods to where
    /// only on-demand is sold. (Where spot is sold is judged by the pool's
    /// zones, not the claim's remaining types: a packing preference only.)
    fn costs_spot(&self, ci: usize, u: &super::claim::Update, spot_capable: bool) -> bool {
        let c = &self.claims[ci];
        let grows = u.options.as_ref().is_some_and(|o| o.first() != c.options.first());
        let pins = u.reqs.is_some() && self.holds_spot_capable[ci];
        if !(pins || spot_capable && grows) {
            return false;
        }
        let spot_zones = &self.m.pools[c.pool].spot_zones;
        let spot_possible = |reqs: &crate::requirements::Requirements| {
            reqs.get(labels::CAPACITY_TYPE)
                .is_none_or(|r| r.has(labels::CAPACITY_SPOT))
                && reqs
                    .get(labels::ZONE)
                    .is_none_or(|r| spot_zones.iter().any(|z| r.has(z)))
        };
        let pool_allows_spot = spot_possible(&self.m.pools[c.pool].reqs);
        if !pool_allows_spot {
            return false;
        }
        if !spot_possible(&c.reqs) {
            return spot_capable && grows;
        }
        pins && u.reqs.as_ref().is_some_and(|r| !spot_possible(r))
    }

    /// The rest of [`Run::place`] in Karpenter's order: claims by fewest pods
    /// (ties by age), then a new claim. Under strict constraints a claim that
    /// refuses the pod's class for good is skipped by the class from then on,
    /// so the pass stays near first fit's cost at tens of thousands of pods.
    fn place_fewest_pods(&mut self, i: usize, a: &Active, strict: bool) -> bool {
        let class = self.m.pod(i).class;
        let mut refused = if strict {
            self.refused.remove(&class).unwrap_or_default()
        } else {
            Vec::new()
        };
        let mut found = None;
        for &(_, ci) in &self.fewest {
            if refused.get(ci) == Some(&true) {
                continue;
            }
            let cx = Ctx {
                m: self.m,
                counts: &self.counts,
                domains: &self.domains,
                by_name: self.strategy.karpenter_domains,
            };
            match self.claims[ci].try_add(&cx, i, a) {
                Ok(u) => {
                    found = Some((ci, u));
                    break;
                }
                Err(Fail { monotone: true }) if strict => {
                    refused.resize(refused.len().max(ci + 1), false);
                    refused[ci] = true;
                }
                Err(_) => {}
            }
        }
        if !refused.is_empty() {
            self.refused.insert(class, refused);
        }
        if let Some((ci, u)) = found {
            self.commit_claim(ci, i, a, u);
            return true;
        }
        (0..self.m.pools.len()).any(|pi| self.new_claim(pi, i, a))
    }

    /// What existing entry `e`'s pods use now.
    fn used(&self, e: usize) -> &[i64] {
        &self.ex_used[e * self.width..(e + 1) * self.width]
    }

    fn fits_existing(&self, e: usize, i: usize, a: &Active) -> bool {
        let m = self.m;
        let ex = &m.existing[e];
        let p = m.pod(i);
        if ex.cordoned || !dense::fits_sum(self.used(e), &p.req, &ex.avail) {
            return false;
        }
        if tolerates_all(&p.model.tolerations, &ex.taints, a.tolerate_prefer).is_err() {
            return false;
        }
        if p.model.host_ports.iter().any(|h| {
            ex.ports
                .iter()
                .chain(self.ex_ports.get(&e).into_iter().flatten())
                .any(|o| h.conflicts(o))
        }) {
            return false;
        }
        if !a.terms.iter().any(|t| t.matches_labels(&ex.labels)) {
            return false;
        }
        a.groups.iter().all(|g| {
            self.counts.allows(
                &m.groups.list[*g],
                *g,
                p.counts_in.binary_search(g).is_ok(),
                m.entry_domains.get(e, &m.groups.list[*g]),
            )
        }) && p.inverse.iter().all(|g| {
            self.counts
                .inverse_allows(*g, m.entry_domains.get(e, &m.groups.list[*g]))
        })
    }

    fn commit_existing(&mut self, e: usize, i: usize, a: &Active) {
        let m = self.m;
        let p = m.pod(i);
        let ex = &m.existing[e];
        let w = self.width;
        dense::add(&mut self.ex_used[e * w..(e + 1) * w], &p.req);
        let used = &self.ex_used[e * w..(e + 1) * w];
        self.room.set(e, |out| free_room(ex, used, out));
        if !p.model.host_ports.is_empty() {
            self.ex_ports
                .entry(e)
                .or_default()
                .extend(p.model.host_ports.iter().cloned());
        }
        self.ex_pods[e].push(i);
        for g in &p.counts_in {
            let group = &m.groups.list[*g];
            if ex.passes(&group.id.filter)
                && let Some(d) = m.entry_domains.get(e, group)
            {
                self.counts.record(*g, d);
            }
        }
        for g in a
            .groups
            .iter()
            .filter(|g| m.groups.list[**g].id.kind == GroupKind::AntiAffinity { required: true })
        {
            if let Some(d) = m.entry_domains.get(e, &m.groups.list[*g]) {
                self.counts.record_owner(*g, d);
            }
        }
    }

    fn commit_claim(&mut self, ci: usize, i: usize, a: &Active, u: super::claim::Update) {
        let m = self.m;
        let p = m.pod(i);
        let c = &mut self.claims[ci];
        let pool = &m.pools[c.pool];
        let before = c.pods.len();
        dense::sub(&mut self.pool_reserved[c.pool], &c.reserved);
        c.apply(u, i, &p.model.host_ports, pool);
        dense::add(&mut self.pool_reserved[c.pool], &c.reserved);
        if self.strategy.fewest_pods {
            // A new claim (not yet in the order) has no entry to remove.
            self.fewest.remove(&(before, ci));
            self.fewest.insert((c.pods.len(), ci));
        }
        let c = &self.claims[ci];
        for g in &p.counts_in {
            let group = &m.groups.list[*g];
            if c.passes(&group.id.filter, pool)
                && let Some(d) = c.domain(group, &self.domains)
            {
                self.counts.record(*g, d);
            }
        }
        for g in a
            .groups
            .iter()
            .filter(|g| m.groups.list[**g].id.kind == GroupKind::AntiAffinity { required: true })
        {
            if let Some(d) = c.domain(&m.groups.list[*g], &self.domains) {
                self.counts.record_owner(*g, d);
            }
        }
    }

    /// Types a new claim of pool `pi` could start with pod `i`: usable types
    /// within the remaining limits, accelerators only when asked.
    fn options_within_limits(&self, pi: usize, i: usize) -> Vec<u32> {
        let m = self.m;
        let pool = &m.pools[pi];
        let p = m.pod(i);
        if pool
            .node_limit
            .is_some_and(|l| m.pool_nodes[pi] + self.pool_nodes[pi] >= l)
        {
            return Vec::new();
        }
        let accel_ok = p.accelerator || pool.asks_accelerator;
        (0..pool.types.len() as u32)
            .filter(|t| {
                let ty = &pool.types[*t as usize];
                (accel_ok || !ty.accelerator)
                    && fits(&p.req, &ty.avail)
                    && pool
                        .limits
                        .iter()
                        .all(|(d, limit)| ty.capacity[*d] <= limit - m.pool_used[pi][*d] - self.pool_reserved[pi][*d])
            })
            .collect()
    }

    /// True when type `t` of pool `pi` is cheaper than the solve's price
    /// ceiling and not excluded. An excluded type (a replaced node's own)
    /// stays when a reservation of it has room: moving a paid node into
    /// capacity that is paid for already saves its whole price (the
    /// consolidation then keeps it to that reservation).
    fn under_ceiling(&self, pi: usize, t: u32) -> bool {
        let ty = &self.m.pools[pi].types[t as usize];
        let excluded = !self.m.exclude_types.is_empty()
            && self.m.exclude_types.contains(&ty.name)
            && !ty
                .offerings
                .iter()
                .any(|o| o.reservation.as_ref().is_some_and(|r| r.available > 0));
        self.m.price_below.is_none_or(|ceiling| ty.price < ceiling) && !excluded
    }

    /// Options of a new claim of pool `pi` that pod `i` could start: within
    /// the limits and under the price ceiling.
    fn base_options(&self, pi: usize, i: usize) -> Vec<u32> {
        let mut opts = self.options_within_limits(pi, i);
        opts.retain(|t| self.under_ceiling(pi, *t));
        opts
    }

    /// The empty claims pod `i` may open in pool `pi`, in the order to try:
    /// capped to the strategy's size first when that leaves any option.
    fn empty_claims(&self, pi: usize, i: usize) -> Vec<Claim> {
        let m = self.m;
        let pool = &m.pools[pi];
        let base = self.base_options(pi, i);
        if base.is_empty() {
            return Vec::new();
        }
        let mut attempts = Vec::new();
        if let Some(cap) = self.strategy.cap {
            let capped: Vec<u32> = base
                .iter()
                .copied()
                .filter(|t| cap.admits(&pool.types[*t as usize].avail))
                .collect();
            if !capped.is_empty() && capped.len() < base.len() {
                attempts.push(capped);
            }
        }
        attempts.push(base);
        attempts
            .into_iter()
            .map(|opts| Claim::new(m, pi, opts, super::topology::DomainId::MAX))
            .collect()
    }

    fn new_claim(&mut self, pi: usize, i: usize, a: &Active) -> bool {
        let m = self.m;
        let pool = &m.pools[pi];
        let p = m.pod(i);
        if !m.new_claims
            || pool.error.is_some()
            || tolerates_all(&p.model.tolerations, &pool.taints, a.tolerate_prefer).is_err()
        {
            return false;
        }
        if !a.terms.iter().any(|t| pool.reqs.compatible(t, true).is_ok()) {
            return false;
        }
        if pool
            .node_limit
            .is_some_and(|l| m.pool_nodes[pi] + self.pool_nodes[pi] >= l)
        {
            return false;
        }
        // The empty claims a pod of this shape may open depend on nothing
        // else while the pool has no resource limits: build them once.
        let key = (pi, m.pods[i].shape);
        let templates = match self.claim_templates.get(&key) {
            Some(t) => Rc::clone(t),
            None => {
                let t = Rc::new(self.empty_claims(pi, i));
                if pool.limits.is_empty() {
                    self.claim_templates.insert(key, Rc::clone(&t));
                }
                t
            }
        };
        for template in templates.iter() {
            let mut claim = template.clone();
            claim.host = self.domains.fresh();
            let cx = Ctx {
                m,
                counts: &self.counts,
                domains: &self.domains,
                by_name: self.strategy.karpenter_domains,
            };
            if let Ok(u) = claim.try_add(&cx, i, a) {
                self.claims.push(claim);
                self.holds_spot_capable
                    .push(self.strategy.spot_first && spot_capable(p, a));
                self.pool_nodes[pi] += 1;
                let ci = self.claims.len() - 1;
                dense::add(&mut self.pool_reserved[pi], &self.claims[ci].reserved);
                self.commit_claim(ci, i, a, u);
                return true;
            }
        }
        false
    }

    /// Why pod `i` cannot be placed anywhere, pool by pool.
    fn explain(&self, i: usize, rel: &Relaxation) -> PlacementFailure {
        let m = self.m;
        let p = m.pod(i);
        let a = rel.active(p);
        if m.pools.is_empty() {
            return PlacementFailure::NoNodePool;
        }
        // A what-if over existing capacity: that is the answer, and weighing
        // every instance type per pod would cost what-ifs at scale dearly.
        if !m.new_claims {
            return PlacementFailure::Pools(
                m.pools
                    .iter()
                    .map(|pool| PoolRejection {
                        pool: pool.name.clone(),
                        why: Rejection::NewClaimsForbidden,
                    })
                    .collect(),
            );
        }
        let rejections = m
            .pools
            .iter()
            .enumerate()
            .map(|(pi, pool)| PoolRejection {
                pool: pool.name.clone(),
                why: self.rejection(pi, i, &a),
            })
            .collect();
        PlacementFailure::Pools(rejections)
    }

    /// Why pool `pi` cannot take pod `i` on a new claim.
    fn rejection(&self, pi: usize, i: usize, a: &Active) -> Rejection {
        let m = self.m;
        let p = m.pod(i);
        let pool = &m.pools[pi];
        if let Some(e) = &pool.error {
            return Rejection::PoolInvalid(e.clone());
        }
        if let Err(t) = tolerates_all(&p.model.tolerations, &pool.taints, a.tolerate_prefer) {
            return Rejection::Untolerated(t);
        }
        let fitting = match self.fitting_types(pi, i, a) {
            Ok(fitting) => fitting,
            Err(why) => return why,
        };
        if !m.new_claims {
            return Rejection::NewClaimsForbidden;
        }
        let within = self.options_within_limits(pi, i);
        if !fitting.iter().any(|t| within.contains(&(*t as u32))) {
            return Rejection::Limits;
        }
        if !within.iter().any(|t| self.under_ceiling(pi, *t)) {
            return Rejection::PriceCeiling;
        }
        Rejection::Constraints(unmet_constraints(m, p, a))
    }

    /// The pool's types that pod `i` fits on under its node terms (before
    /// limits and prices), or why there are none.
    fn fitting_types(&self, pi: usize, i: usize, a: &Active) -> Result<Vec<usize>, Rejection> {
        let m = self.m;
        let p = m.pod(i);
        let pool = &m.pools[pi];
        let compatible: Vec<_> = a
            .terms
            .iter()
            .filter(|t| pool.reqs.compatible(t, true).is_ok())
            .collect();
        if compatible.is_empty() {
            let err = a
                .terms
                .iter()
                .find_map(|t| pool.reqs.compatible(t, true).err())
                .map(|e| e.to_string())
                .unwrap_or_default();
            return Err(Rejection::Requirements(err));
        }
        let accel_ok = p.accelerator || pool.asks_accelerator;
        let merged: Vec<crate::requirements::Requirements> = compatible
            .iter()
            .map(|term| {
                let mut r = pool.reqs.clone();
                r.add_all(term);
                r
            })
            .collect();
        let matching: Vec<usize> = (0..pool.types.len())
            .filter(|t| merged.iter().any(|r| pool.types[*t].compatible(r)))
            .collect();
        let usable: Vec<usize> = matching
            .iter()
            .copied()
            .filter(|t| accel_ok || !pool.types[*t].accelerator)
            .collect();
        if matching.is_empty() && !pool.shifted_away.is_empty() {
            let zones: Vec<String> = pool
                .shifted_away
                .iter()
                .filter(|z| {
                    pool.types.is_empty()
                        || merged
                            .iter()
                            .any(|r| r.get(labels::ZONE).is_some_and(|want| want.has(z)))
                })
                .cloned()
                .collect();
            if !zones.is_empty() {
                return Err(Rejection::ZoneShiftedAway { zones });
            }
        }
        if usable.is_empty() {
            return Err(Rejection::NoInstanceType {
                accelerators_only: !matching.is_empty(),
            });
        }
        let fitting: Vec<usize> = usable
            .iter()
            .copied()
            .filter(|t| fits(&p.req, &pool.types[*t].avail))
            .collect();
        if fitting.is_empty() {
            let mut best = m.res.zero();
            for t in &usable {
                dense::max_into(&mut best, &pool.types[*t].avail);
            }
            let what = match dense::first_exceeding(&p.req, &best) {
                Some(d) => {
                    let r = m.res.name(d);
                    format!(
                        "{} {r}",
                        crate::quantity::Quantity::from_milli(p.req[d]).to_k8s_string(r)
                    )
                }
                None => "the pod's requests".into(),
            };
            return Err(Rejection::TooLarge { what });
        }
        Ok(fitting)
    }
}

/// The scheduling constraints a pod brings to a new claim: its groups (as
/// owner, or as the target of others' anti-affinity) and its host ports.
fn unmet_constraints(m: &Model<'_>, p: &PendingPod, a: &Active) -> Vec<Constraint> {
    let mut constraints = Vec::new();
    for g in a.groups.iter().chain(&p.inverse) {
        let group = &m.groups.list[*g];
        let key = group.id.key.clone();
        constraints.push(match group.id.kind {
            GroupKind::Spread { max_skew, .. } => Constraint::TopologySpread { max_skew, key },
            GroupKind::Affinity => Constraint::PodAffinity { key },
            GroupKind::AntiAffinity { .. } if p.inverse.contains(g) && !a.groups.contains(g) => {
                Constraint::OthersAntiAffinity { key }
            }
            GroupKind::AntiAffinity { .. } => Constraint::PodAntiAffinity { key },
        });
    }
    if !p.model.host_ports.is_empty() {
        constraints.push(Constraint::HostPorts);
    }
    normalise(constraints)
}

/// The launch a claim would get: its options cheapest first and the chosen offering.
#[derive(Debug, Clone)]
pub struct Priced {
    /// Option indices (into the pool's types), cheapest first.
    pub options: Vec<u32>,
    /// The chosen offering (of `options[0]`).
    pub offering: Offering,
}

/// Prices a claim as a launch would buy it: reserved capacity with room
/// left (`taken` counts what earlier claims of the plan use of each
/// reservation), else spot, else on-demand, whichever the requirements allow
/// first; options sorted by that price.
fn price(m: &Model<'_>, c: &Claim, taken: &BTreeMap<String, u32>, sorted: bool) -> Option<Priced> {
    let pool = &m.pools[c.pool];
    let room = |o: &Offering| {
        o.reservation
            .as_ref()
            .is_none_or(|r| taken.get(&r.id).copied().unwrap_or(0) < r.available)
    };
    let reqs = buying_requirements(pool, c, &room);
    let (wanted, any) = (OfferingRequirements::of(&reqs), OfferingRequirements::of(&c.reqs));
    let (mask, any_mask) = (mask_for(pool, &wanted), mask_for(pool, &any));
    // Only the chosen offering is wanted (a pass's cost): one scan, no list.
    if !sorted && let Some(p) = cheapest_option(pool, c, &wanted, mask.as_ref(), &room) {
        return Some(p);
    }
    let mut priced: Vec<(f64, &str, u32, Option<&Offering>)> = c
        .options
        .iter()
        .map(|t| {
            let ty = &pool.types[*t as usize];
            let chosen = cheapest_of(ty, &wanted, mask.as_ref(), &room);
            let fallback = || cheapest_of(ty, &any, any_mask.as_ref(), &room).or_else(|| cheapest(&ty.offerings, &any));
            let p = chosen.map_or(f64::INFINITY, |o| o.price);
            (p, ty.name.as_str(), *t, chosen.or_else(fallback))
        })
        .collect();
    priced.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(b.1)));
    let offering = priced.first().and_then(|p| p.3).cloned()?;
    Some(Priced {
        options: priced.iter().map(|p| p.2).collect(),
        offering,
    })
}

/// A type's cheapest offering that `wanted` allows and that has `room`.
/// Without reservations every offering has room, and interned masks answer
/// the offering checks (the common case, and the hot one).
fn cheapest_of<'t>(
    ty: &'t TypeModel,
    wanted: &OfferingRequirements,
    mask: Option<&OfferMask>,
    room: &dyn Fn(&Offering) -> bool,
) -> Option<&'t Offering> {
    match mask {
        Some(mask) => mask.cheapest(ty),
        None => cheapest_where(&ty.offerings, wanted, room),
    }
}

/// The pool's interned offering mask for `wanted`, unless it has reservations
/// (whose room the mask does not know).
fn mask_for(pool: &Pool, wanted: &OfferingRequirements) -> Option<OfferMask> {
    if pool.has_reserved {
        None
    } else {
        pool.offer_keys.mask(wanted)
    }
}

/// The claim's requirements narrowed to the first capacity type (reserved,
/// spot, on-demand) some option can buy; unchanged when none can.
fn buying_requirements(pool: &Pool, c: &Claim, room: &dyn Fn(&Offering) -> bool) -> Requirements {
    let order: &[&str] = if pool.has_reserved {
        &[
            labels::CAPACITY_RESERVED,
            labels::CAPACITY_SPOT,
            labels::CAPACITY_ON_DEMAND,
        ]
    } else {
        &[labels::CAPACITY_SPOT, labels::CAPACITY_ON_DEMAND]
    };
    for ct in order {
        let mut r = c.reqs.clone();
        r.add(Requirement::in_values(labels::CAPACITY_TYPE, &[ct]));
        let wanted = OfferingRequirements::of(&r);
        let mask = mask_for(pool, &wanted);
        if c.options
            .iter()
            .any(|t| cheapest_of(&pool.types[*t as usize], &wanted, mask.as_ref(), room).is_some())
        {
            return r;
        }
    }
    c.reqs.clone()
}

/// The option with the cheapest offering (ties by type name), alone; `None`
/// when no option has one.
fn cheapest_option(
    pool: &Pool,
    c: &Claim,
    wanted: &OfferingRequirements,
    mask: Option<&OfferMask>,
    room: &dyn Fn(&Offering) -> bool,
) -> Option<Priced> {
    let mut best: Option<(f64, &str, u32, &Offering)> = None;
    for t in &c.options {
        let ty = &pool.types[*t as usize];
        if let Some(o) = cheapest_of(ty, wanted, mask, room)
            && best.is_none_or(|(p, n, _, _)| (o.price, ty.name.as_str()) < (p, n))
        {
            best = Some((o.price, ty.name.as_str(), *t, o));
        }
    }
    best.map(|(_, _, t, o)| Priced {
        options: vec![t],
        offering: o.clone(),
    })
}

/// Prices every claim in order; a reservation backs at most as many claims
/// as it has room for, later claims buy otherwise.
pub fn price_all(m: &Model<'_>, claims: &[Claim], sorted: bool) -> Vec<Option<Priced>> {
    let mut taken: BTreeMap<String, u32> = BTreeMap::new();
    claims
        .iter()
        .map(|c| {
            let p = price(m, c, &taken, sorted);
            if let Some(r) = p.as_ref().and_then(|p| p.offering.reservation.as_ref()) {
                *taken.entry(r.id.clone()).or_default() += 1;
            }
            p
        })
        .collect()
}

/// `<pool>-<5 lowercase alphanumerics>` from a hash of the pool and its pods.
fn claim_name(pool: &str, pods: &[PodRef], salt: u32) -> String {
    let mut h = Sha256::new();
    h.update(pool.as_bytes());
    for p in pods {
        h.update([0]);
        h.update(p.to_string().as_bytes());
    }
    h.update(salt.to_le_bytes());
    let digest = h.finalize();
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let suffix: String = digest
        .iter()
        .take(5)
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect();
    format!("{pool}-{suffix}")
}

/// A name no existing node or earlier claim has: `<pool>-<hash>`, salted
/// until unique; the name is taken.
fn unique_claim_name(pool: &str, pods: &[PodRef], taken: &mut BTreeSet<String>) -> String {
    let mut salt = 0;
    let mut name = claim_name(pool, pods, salt);
    while taken.contains(&name) {
        salt += 1;
        name = claim_name(pool, pods, salt);
    }
    taken.insert(name.clone());
    name
}

/// The plan's NodeClaim for a priced claim: its options by name, the chosen
/// offering, its labels and requests (DaemonSet overhead included).
fn new_node_claim(m: &Model<'_>, c: &Claim, priced: &Priced, name: String, pods: Vec<PodRef>) -> NewNodeClaim {
    let pool = &m.pools[c.pool];
    let ty = &pool.types[priced.options[0] as usize];
    let option_names: Vec<String> = priced
        .options
        .iter()
        .map(|t| pool.types[*t as usize].name.clone())
        .collect();
    let mut requirements = c.reqs.clone();
    if !pool.shifted_away.is_empty() {
        // The launch tries every zone its requirements allow: keep it out of shifted ones.
        let zones: Vec<&str> = pool.shifted_away.iter().map(String::as_str).collect();
        if let Ok(r) = crate::requirements::Requirement::new(labels::ZONE, crate::requirements::Operator::NotIn, &zones)
        {
            requirements.add(r);
        }
    }
    let mut labels_map: BTreeMap<String, String> = ty.labels.clone();
    labels_map.extend(pool.labels.clone());
    labels_map.extend(c.reqs.single_valued_labels());
    labels_map.insert(labels::INSTANCE_TYPE.into(), ty.name.clone());
    labels_map.insert(labels::ZONE.into(), priced.offering.zone.clone());
    labels_map.insert(labels::CAPACITY_TYPE.into(), priced.offering.capacity_type.clone());
    if let Some(r) = &priced.offering.reservation {
        labels_map.insert(labels::aws::CAPACITY_RESERVATION_ID.into(), r.id.clone());
        labels_map.insert(
            labels::aws::CAPACITY_RESERVATION_TYPE.into(),
            r.reservation_type.clone(),
        );
    }
    labels_map.insert(labels::NODEPOOL.into(), pool.name.clone());
    labels_map.insert(labels::HOSTNAME.into(), name.clone());
    let requests = m.res.resources(&dense::plus(&c.used, &ty.overhead));
    NewNodeClaim {
        name,
        node_pool: pool.name.clone(),
        node_class: pool.node_class.clone(),
        requirements,
        instance_type_options: option_names,
        instance_type: ty.name.clone(),
        zone: priced.offering.zone.clone(),
        capacity_type: priced.offering.capacity_type.clone(),
        price: priced.offering.price,
        allocatable: ty.allocatable.clone(),
        labels: labels_map,
        template_labels: pool.labels.clone(),
        taints: pool.taints.clone(),
        startup_taints: pool.startup_taints.clone(),
        pods,
        requests,
    }
}

impl Assignment {
    /// Turns a pass into a plan: names, cheapest offerings, labels.
    pub fn finish(self, m: &Model<'_>) -> Plan {
        // Names new claims must avoid (only needed when there are new claims).
        let mut taken: BTreeSet<String> = if self.claims.is_empty() {
            BTreeSet::new()
        } else {
            m.existing.iter().map(|e| e.name.clone()).collect()
        };
        let mut node_claims = Vec::new();
        let mut unschedulable: Vec<Unschedulable> = m
            .invalid
            .iter()
            .map(|(p, r)| Unschedulable {
                pod: p.clone(),
                reason: r.clone(),
            })
            .collect();
        for (c, priced) in self.claims.iter().zip(price_all(m, &self.claims, true)) {
            let pool = &m.pools[c.pool];
            let mut pods: Vec<PodRef> = c.pods.iter().map(|i| m.pods[*i].pod.clone()).collect();
            pods.sort();
            let Some(priced) = priced else {
                // Cannot happen for a claim with options; keep the pods accounted for.
                for p in pods {
                    unschedulable.push(Unschedulable {
                        pod: p,
                        reason: PlacementFailure::NoOffering,
                    });
                }
                continue;
            };
            let name = unique_claim_name(&pool.name, &pods, &mut taken);
            node_claims.push(new_node_claim(m, c, &priced, name, pods));
        }
        let existing = self.existing_placements(m);
        unschedulable.extend(self.unschedulable.iter().map(|(i, r)| Unschedulable {
            pod: m.pods[*i].pod.clone(),
            reason: r.clone(),
        }));
        unschedulable.sort_by(|a, b| a.pod.cmp(&b.pod));
        Plan {
            node_claims,
            existing,
            unschedulable,
            warnings: m.warnings.clone(),
        }
    }

    /// The pods placed on existing nodes and in-flight claims, by target name.
    fn existing_placements(&self, m: &Model<'_>) -> Vec<ExistingPlacement> {
        let mut existing: Vec<ExistingPlacement> = self
            .existing
            .iter()
            .enumerate()
            .filter(|(_, pods)| !pods.is_empty())
            .map(|(e, pods)| {
                let mut pods: Vec<PodRef> = pods.iter().map(|i| m.pods[*i].pod.clone()).collect();
                pods.sort();
                ExistingPlacement {
                    name: m.existing[e].name.clone(),
                    kind: m.target_kind(e),
                    pods,
                }
            })
            .collect();
        existing.sort_by(|a, b| a.name.cmp(&b.name));
        existing
    }
}
