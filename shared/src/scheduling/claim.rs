//! A new NodeClaim being built: the pool it comes from, its requirements
//! (narrowed by every pod it takes), the instance types that still fit, and
//! the pods on it. Adding a pod either yields an update or a failure.

use std::borrow::Cow;

use super::compile::{OfferMask, Pool, instance_defined};
use super::dense::{self, Vector, fits};
use super::model::Model;
use super::pod::HostPort;
use super::preferences::Active;
use super::topology::{Counts, DomainId, Domains, Group, GroupKind, NodeFilter};
use crate::catalog::{OFFERING_KEYS, Offering, OfferingRequirements};
use crate::labels;
use crate::requirements::{Requirement, Requirements};

/// A NodeClaim under construction.
#[derive(Debug, Clone)]
pub struct Claim {
    /// Index of its pool.
    pub pool: usize,
    /// Pool requirements narrowed by its pods.
    pub reqs: Requirements,
    /// Indices into the pool's types that still fit, cheapest first.
    pub options: Vec<u32>,
    /// Requests of its pods.
    pub used: Vector,
    /// Element-wise maximum of the options' room (a quick reject test).
    pub max_avail: Vector,
    /// Element-wise minimum of the options' room: below it every option fits.
    pub min_avail: Vector,
    /// Element-wise maximum of the options' capacity: what it holds against limits.
    pub reserved: Vector,
    /// Pending pods on it (indices into the model's pods).
    pub pods: Vec<usize>,
    /// Host ports bound.
    pub ports: Vec<HostPort>,
    /// Its hostname domain.
    pub host: DomainId,
}

/// The new state of a claim after taking a pod.
#[derive(Debug, Clone)]
pub struct Update {
    /// New requirements, when they changed.
    pub reqs: Option<Requirements>,
    /// Remaining options (`None`: unchanged).
    pub options: Option<Vec<u32>>,
    /// New requests.
    pub used: Vector,
}

/// Why a pod does not go onto a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fail {
    /// True when the claim will never take a pod of the same class (it only
    /// fills up and narrows), so later identical pods may skip it.
    pub monotone: bool,
}

/// Read-only context for checks.
pub struct Ctx<'a> {
    /// The model.
    pub m: &'a Model<'a>,
    /// Topology counts.
    pub counts: &'a Counts,
    /// Domains.
    pub domains: &'a Domains,
    /// Break domain ties by name, ignoring price (Karpenter's choice).
    pub by_name: bool,
}

impl Claim {
    /// An empty claim of a pool with the given options.
    pub fn new(m: &Model<'_>, pool: usize, options: Vec<u32>, host: DomainId) -> Self {
        let p = &m.pools[pool];
        let mut c = Claim {
            pool,
            reqs: p.reqs.clone(),
            options,
            used: m.res.zero(),
            max_avail: m.res.zero(),
            min_avail: m.res.zero(),
            reserved: m.res.zero(),
            pods: Vec::new(),
            ports: p.daemon_ports.clone(),
            host,
        };
        c.refresh(p);
        c
    }

    fn refresh(&mut self, pool: &Pool) {
        self.max_avail.iter_mut().for_each(|v| *v = 0);
        self.min_avail.iter_mut().for_each(|v| *v = i64::MAX);
        self.reserved.iter_mut().for_each(|v| *v = 0);
        for t in &self.options {
            let ty = &pool.types[*t as usize];
            dense::max_into(&mut self.max_avail, &ty.avail);
            for (m, a) in self.min_avail.iter_mut().zip(&ty.avail) {
                *m = (*m).min(*a);
            }
            dense::max_into(&mut self.reserved, &ty.capacity);
        }
    }

    /// The claim's domain for a group's key: its own hostname, or the single
    /// value its requirements pin.
    pub fn domain(&self, g: &Group, domains: &Domains) -> Option<DomainId> {
        if g.hostname {
            return Some(self.host);
        }
        single(self.reqs.get(&g.id.key)).and_then(|v| domains.get(v))
    }

    /// True when a spread group's node filter admits this claim.
    pub fn passes(&self, f: &NodeFilter, pool: &Pool) -> bool {
        f.terms
            .as_ref()
            .is_none_or(|ts| ts.iter().any(|t| self.reqs.intersects(t).is_ok()))
            && f.tolerations
                .as_ref()
                .is_none_or(|t| super::pod::tolerates_all(t, &pool.taints, true).is_ok())
    }

    /// Applies an update with the pod's requests and ports.
    pub fn apply(&mut self, u: Update, pod: usize, ports: &[HostPort], pool: &Pool) {
        if let Some(r) = u.reqs {
            self.reqs = r;
        }
        let shrunk = u.options.as_ref().is_some_and(|o| o.len() != self.options.len());
        let mut extremes_left = false;
        if let Some(o) = u.options {
            if shrunk {
                extremes_left = self.removes_an_extreme(&o, pool);
            }
            self.options = o;
        }
        self.used = u.used;
        self.pods.push(pod);
        self.ports.extend(ports.iter().cloned());
        if extremes_left {
            self.refresh(pool);
        } else if shrunk {
            // Options that stop fitting are the small ones: the largest stay,
            // so only the minimum moves.
            self.min_avail.iter_mut().for_each(|v| *v = i64::MAX);
            for t in &self.options {
                for (m, a) in self.min_avail.iter_mut().zip(&pool.types[*t as usize].avail) {
                    *m = (*m).min(*a);
                }
            }
        }
    }

    /// True when an option missing from `kept` (a subsequence of the
    /// options) holds a maximum of the room or the capacity.
    fn removes_an_extreme(&self, kept: &[u32], pool: &Pool) -> bool {
        let mut k = kept.iter().peekable();
        self.options.iter().any(|t| {
            if k.peek() == Some(&t) {
                k.next();
                return false;
            }
            let ty = &pool.types[*t as usize];
            let holds = |v: &[i64], top: &[i64]| v.iter().zip(top).any(|(a, m)| *m > 0 && a == m);
            holds(&ty.avail, &self.max_avail) || holds(&ty.capacity, &self.reserved)
        })
    }

    /// The checks a pod must pass before its node terms are tried: room,
    /// the claim's hostname groups and their owners' anti-affinity, taints,
    /// host ports.
    fn admits(&self, cx: &Ctx, pi: usize, a: &Active) -> Result<(), Fail> {
        let m = cx.m;
        let p = m.pod(pi);
        let pool = &m.pools[self.pool];
        let mono = Fail { monotone: true };
        if self
            .used
            .iter()
            .zip(&p.req)
            .zip(&self.max_avail)
            .any(|((u, r), m)| *r > 0 && u + r > *m)
        {
            return Err(mono);
        }
        for g in &a.groups {
            let group = &m.groups.list[*g];
            if group.hostname
                && !cx
                    .counts
                    .allows(group, *g, p.counts_in.binary_search(g).is_ok(), Some(self.host))
            {
                // On its own hostname a node's count only grows, and the
                // minimum over hostnames is always zero (a new node): spread
                // and anti-affinity failures here are permanent.
                let permanent = !matches!(group.id.kind, GroupKind::Affinity);
                return Err(Fail {
                    monotone: permanent || p.monotone,
                });
            }
        }
        for g in &p.inverse {
            if m.groups.list[*g].hostname && !cx.counts.inverse_allows(*g, Some(self.host)) {
                return Err(mono);
            }
        }
        if !pool.taints.is_empty()
            && super::pod::tolerates_all(&p.model.tolerations, &pool.taints, a.tolerate_prefer).is_err()
        {
            return Err(mono);
        }
        if p.model
            .host_ports
            .iter()
            .any(|h| self.ports.iter().any(|o| h.conflicts(o)))
        {
            return Err(mono);
        }
        Ok(())
    }

    /// Checks whether pod `pi` (under the active constraints) can join, and how
    /// the claim would change.
    pub fn try_add(&self, cx: &Ctx, pi: usize, a: &Active) -> Result<Update, Fail> {
        self.admits(cx, pi, a)?;
        let used = dense::plus(&self.used, &cx.m.pod(pi).req);
        let mut fail = Fail { monotone: true };
        for term in a.terms.iter() {
            if self.reqs.compatible(term, true).is_err() {
                continue;
            }
            // Most pods add nothing to the claim's requirements: skip the copy.
            let mut reqs = Cow::Borrowed(&self.reqs);
            if !term.is_empty() {
                let mut r = self.reqs.clone();
                r.add_all(term);
                if r != self.reqs {
                    reqs = Cow::Owned(r);
                }
            }
            let mut changed: Vec<String> = if matches!(reqs, Cow::Owned(_)) {
                term.keys().cloned().collect()
            } else {
                Vec::new()
            };
            match self.pin(cx, pi, a, reqs, &mut changed, &used) {
                Ok((reqs, options)) => {
                    let reqs = match reqs {
                        Cow::Owned(r) if r != self.reqs => Some(r),
                        _ => None,
                    };
                    return Ok(Update { reqs, options, used });
                }
                Err(f) => fail = if f.monotone { fail } else { f },
            }
        }
        Err(fail)
    }

    /// Gives the claim one domain for every topology key the pod relates to,
    /// then filters the options.
    fn pin<'r>(
        &self,
        cx: &Ctx,
        pi: usize,
        a: &Active,
        mut reqs: Cow<'r, Requirements>,
        changed: &mut Vec<String>,
        used: &Vector,
    ) -> Result<(Cow<'r, Requirements>, Option<Vec<u32>>), Fail> {
        let m = cx.m;
        let p = m.pod(pi);
        let pool = &m.pools[self.pool];
        let topo = Fail { monotone: p.monotone };
        for key in &p.pin_keys {
            let Some(choice) = self.domain_choice(cx, pi, a, key, &reqs)? else {
                continue;
            };
            let Some(r) = self.best_domain(cx, key, &choice, &reqs, changed, used) else {
                return Err(topo);
            };
            reqs = Cow::Owned(r);
            changed.push(key.clone());
        }
        // Nothing narrowed and every option still has room: keep the list
        // (already checked against minValues when the claim took its first pod).
        if changed.is_empty() && !self.pods.is_empty() && fits(used, &self.min_avail) {
            return Ok((reqs, None));
        }
        let narrowed = self.narrowed(&self.keep(pool, &reqs, changed, used));
        let left = narrowed.as_deref().unwrap_or(&self.options);
        if left.is_empty() {
            return Err(Fail {
                monotone: p.pin_keys.is_empty() || p.monotone,
            });
        }
        if pool.has_min_values && !min_values_met(pool, &reqs, left) {
            return Err(Fail { monotone: true });
        }
        Ok((reqs, narrowed))
    }

    /// The options `keep` keeps, or `None` when it keeps them all (then
    /// nothing is copied: first fit asks this of every claim it tries).
    fn narrowed(&self, keep: &Keep) -> Option<Vec<u32>> {
        let first_dropped = self.options.iter().position(|t| !keep.keeps(*t))?;
        let mut kept = Vec::with_capacity(self.options.len() - 1);
        kept.extend_from_slice(&self.options[..first_dropped]);
        kept.extend(
            self.options[first_dropped + 1..]
                .iter()
                .copied()
                .filter(|t| keep.keeps(*t)),
        );
        Some(kept)
    }

    /// The domains the claim may take for topology key `key`: `None` when
    /// nothing is to pin (its value is already single, or no known value
    /// exists and an unseen one is allowed).
    fn domain_choice(
        &self,
        cx: &Ctx,
        pi: usize,
        a: &Active,
        key: &str,
        reqs: &Requirements,
    ) -> Result<Option<DomainChoice>, Fail> {
        let m = cx.m;
        let p = m.pod(pi);
        let topo = Fail { monotone: p.monotone };
        let owned: Vec<usize> = a
            .groups
            .iter()
            .copied()
            .filter(|g| m.groups.list[*g].id.key == key)
            .collect();
        let inverse: Vec<usize> = p
            .inverse
            .iter()
            .copied()
            .filter(|g| m.groups.list[*g].id.key == key)
            .collect();
        let allowed = |d: Option<DomainId>| {
            owned.iter().all(|g| {
                cx.counts
                    .allows(&m.groups.list[*g], *g, p.counts_in.binary_search(g).is_ok(), d)
            }) && inverse.iter().all(|g| cx.counts.inverse_allows(*g, d))
        };
        let current = reqs.get(key);
        if let Some(v) = single(current) {
            // A value no group has seen yet has no pods: any unseen id works.
            let d = cx.domains.get(v).unwrap_or(DomainId::MAX);
            return if allowed(Some(d)) { Ok(None) } else { Err(topo) };
        }
        let pinnable = current.is_some() || labels::is_well_known(key);
        let known: Vec<DomainId> = if pinnable {
            m.key_domains
                .get(key)
                .into_iter()
                .flatten()
                .copied()
                .filter(|d| current.is_none_or(|r| r.has(cx.domains.name(*d))))
                .collect()
        } else {
            Vec::new()
        };
        if known.is_empty() {
            // No known value: the node gets one nobody has seen (or, for a
            // key nothing defines, none at all).
            if allowed(if pinnable { Some(DomainId::MAX) } else { None }) {
                return Ok(None);
            }
            return Err(topo);
        }
        let candidates: Vec<DomainId> = known.into_iter().filter(|d| allowed(Some(*d))).collect();
        if candidates.is_empty() {
            return Err(topo);
        }
        Ok(Some(DomainChoice { owned, candidates }))
    }

    /// The requirements pinned to the best candidate domain that leaves some
    /// option: fewest spread pods, most affinity pods, cheapest, lowest id.
    fn best_domain(
        &self,
        cx: &Ctx,
        key: &str,
        choice: &DomainChoice,
        reqs: &Requirements,
        changed: &[String],
        used: &Vector,
    ) -> Option<Requirements> {
        let m = cx.m;
        let pool = &m.pools[self.pool];
        let mut best: Option<(DomainScore, DomainId, Requirements)> = None;
        for &d in &choice.candidates {
            let mut r = reqs.clone();
            r.add(Requirement::in_values(key, &[cx.domains.name(d)]));
            let mut ch = changed.to_vec();
            ch.push(key.to_string());
            // The cheapest offering of the options this domain keeps; none kept: not this domain.
            let price = {
                let keep = self.keep(pool, &r, &ch, used);
                let wanted = keep.wanted;
                // The keep test built the mask when an offering key changed.
                let mask = keep.mask.clone().or_else(|| pool.offer_keys.mask(&wanted));
                let mut kept = self.options.iter().filter(|t| keep.keeps(**t)).peekable();
                if kept.peek().is_none() {
                    continue;
                }
                kept.map(|t| {
                    let ty = &pool.types[*t as usize];
                    match &mask {
                        Some(mask) => mask.cheapest(ty),
                        None => cheapest(&ty.offerings, &wanted),
                    }
                    .map_or(f64::INFINITY, |o| o.price)
                })
                .fold(f64::INFINITY, f64::min)
            };
            let count = |kind: fn(&GroupKind) -> bool| -> i64 {
                choice
                    .owned
                    .iter()
                    .filter(|g| kind(&m.groups.list[**g].id.kind))
                    .map(|g| cx.counts.count(*g, d) as i64)
                    .sum()
            };
            let spread = count(|k| matches!(k, GroupKind::Spread { .. }));
            let aff = count(|k| *k == GroupKind::Affinity);
            let score = (spread, -aff, if cx.by_name { 0 } else { (price * 1e6) as u64 });
            let wins = best.as_ref().is_none_or(|(s, bd, _)| {
                score < *s
                    || score == *s
                        && if cx.by_name {
                            cx.domains.name(d) < cx.domains.name(*bd)
                        } else {
                            d < *bd
                        }
            });
            if wins {
                best = Some((score, d, r));
            }
        }
        best.map(|(_, _, r)| r)
    }

    /// Which options keep fitting once the claim holds `used` under `reqs`,
    /// of which the `changed` keys are new.
    fn keep<'a>(&self, pool: &'a Pool, reqs: &'a Requirements, changed: &[String], used: &Vector) -> Keep<'a> {
        let offer = changed.iter().any(|k| OFFERING_KEYS.contains(&k.as_str()));
        let wanted = OfferingRequirements::of(reqs);
        let mask = if offer { pool.offer_keys.mask(&wanted) } else { None };
        // With a mask, an allowed offering already proves the offering keys.
        let checks = changed
            .iter()
            .filter(|k| mask.is_none() || !OFFERING_KEYS.contains(&k.as_str()))
            .filter_map(|k| reqs.get(k))
            .collect();
        Keep {
            pool,
            full: self.out_of_room(pool, used),
            checks,
            offer,
            wanted,
            mask,
        }
    }

    /// The pool's types without room for `used`, of those that may be among
    /// the options: found by range in [`Pool::by_room`], not by trying every
    /// option (first fit asks this of nearly full claims, with hundreds of options).
    fn out_of_room(&self, pool: &Pool, used: &[i64]) -> TypeSet {
        let mut full = TypeSet::default();
        if fits(used, &self.min_avail) {
            return full;
        }
        for (d, (&need, rooms)) in used.iter().zip(&pool.by_room).enumerate() {
            if need <= 0 || need <= self.min_avail.get(d).copied().unwrap_or(i64::MAX) {
                continue;
            }
            // Every option has room for what the claim holds already (each
            // update kept only those), so only rooms from there up to `need`
            // can drop out; an empty claim's options were never narrowed.
            let held = self.used.get(d).copied().unwrap_or(0);
            let from = if held > 0 && !self.pods.is_empty() {
                held
            } else {
                i64::MIN
            };
            let lo = rooms.partition_point(|(room, _)| *room < from);
            let hi = rooms.partition_point(|(room, _)| *room < need);
            for (_, t) in rooms.get(lo..hi).unwrap_or_default() {
                full.insert(*t, pool.types.len());
            }
        }
        full
    }
}

/// The test an option must pass to stay on a claim that changes: room, the
/// changed requirement keys, an allowed offering (built once, asked per option).
struct Keep<'a> {
    pool: &'a Pool,
    /// Types out of room.
    full: TypeSet,
    /// The changed keys' requirements each option's labels must allow.
    checks: Vec<&'a Requirement>,
    /// True when an offering key changed.
    offer: bool,
    wanted: OfferingRequirements<'a>,
    mask: Option<OfferMask>,
}

impl Keep<'_> {
    /// True when option `t` stays.
    fn keeps(&self, t: u32) -> bool {
        let ty = &self.pool.types[t as usize];
        !self.full.has(t)
            && self.checks.iter().all(|r| ty.allows(r))
            && (!self.offer
                || self
                    .mask
                    .as_ref()
                    .map_or_else(|| ty.offered(&self.wanted), |m| m.offered(ty)))
    }
}

/// A set of a pool's type indices, as bits; empty without allocating.
#[derive(Debug, Default)]
struct TypeSet(Vec<u64>);

impl TypeSet {
    /// Adds type `t` of a pool of `types` types.
    fn insert(&mut self, t: u32, types: usize) {
        if self.0.is_empty() {
            self.0 = vec![0; types.div_ceil(64)];
        }
        if let Some(w) = self.0.get_mut(t as usize / 64) {
            *w |= 1 << (t % 64);
        }
    }

    /// True when type `t` is in the set.
    fn has(&self, t: u32) -> bool {
        self.0.get(t as usize / 64).is_some_and(|w| w & (1 << (t % 64)) != 0)
    }
}

/// How good a domain is for a pod, lower first: spread count, minus affinity
/// count, price in micro-dollars (0 when choosing as Karpenter does); ties go
/// to the lower domain id, or name as Karpenter's choice.
type DomainScore = (i64, i64, u64);

/// The domains a claim may take for one topology key, with the pod's groups on that key.
struct DomainChoice {
    /// The pod's active groups on the key.
    owned: Vec<usize>,
    /// Allowed domains, in id order.
    candidates: Vec<DomainId>,
}

/// The single value a requirement pins, if it pins one.
pub fn single(r: Option<&Requirement>) -> Option<&str> {
    r.filter(|r| !r.complement && r.values.len() == 1)
        .and_then(|r| r.values.iter().next())
        .map(String::as_str)
}

/// The cheapest offering that satisfies the offering requirements (zone,
/// capacity type, reservation), looked up once by the caller for many types.
pub fn cheapest<'o>(offerings: &'o [Offering], wanted: &OfferingRequirements) -> Option<&'o Offering> {
    cheapest_where(offerings, wanted, |_| true)
}

/// The cheapest offering that satisfies the requirements and `usable`.
pub fn cheapest_where<'o>(
    offerings: &'o [Offering],
    wanted: &OfferingRequirements,
    usable: impl Fn(&Offering) -> bool,
) -> Option<&'o Offering> {
    offerings
        .iter()
        .filter(|o| wanted.allow(o) && usable(o))
        .min_by(|a, b| a.price.total_cmp(&b.price).then_with(|| a.zone.cmp(&b.zone)))
}

/// True when the options keep at least minValues distinct values for every
/// requirement that sets it.
pub fn min_values_met(pool: &Pool, reqs: &Requirements, opts: &[u32]) -> bool {
    reqs.iter()
        .filter_map(|r| r.min_values.map(|m| (r, m)))
        .all(|(r, min)| {
            let mut seen = std::collections::BTreeSet::new();
            for t in opts {
                let ty = &pool.types[*t as usize];
                match r.key.as_str() {
                    labels::ZONE => {
                        seen.extend(ty.offerings.iter().filter(|o| r.has(&o.zone)).map(|o| o.zone.as_str()))
                    }
                    labels::CAPACITY_TYPE => seen.extend(
                        ty.offerings
                            .iter()
                            .filter(|o| r.has(&o.capacity_type))
                            .map(|o| o.capacity_type.as_str()),
                    ),
                    k => {
                        if let Some(v) = ty.labels.get(k).filter(|v| r.has(v)) {
                            seen.insert(v.as_str());
                        } else if !instance_defined(k) {
                            return true;
                        }
                    }
                }
            }
            seen.len() >= min
        })
}
