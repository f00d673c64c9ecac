//! Underutilized consolidation: nodes whose pods fit on the other nodes
//! (delete), or on the other nodes plus one cheaper new node (replace), are
//! removed. Pools with `consolidationPolicy: WhenEmptyOrUnderutilized` or
//! `Balanced` (whose moves must also pass [`super::balanced`]'s score), once
//! `consolidateAfter` has passed since the node's last pod event; never a
//! static pool's (`replicas`).
//!
//! Every question is a what-if solve on the pass's compiled snapshot, so a
//! decision honours every scheduling constraint the provisioner does. Search:
//! candidates sorted by what removing them saves per unit of disruption (the
//! node's price over Karpenter's disruption cost: pods weighted by priority
//! and deletion cost, times the share of the node's lifetime left), then (1) multi-node: a binary search for the longest prefix that can go
//! for at most one new node, as Karpenter does (prefixes of up to 200 nodes
//! and 2,000 pods; Karpenter: 100 nodes); (2) single-node: every other
//! candidate is tried on its own, which Karpenter cannot afford at scale;
//! (3) regrouping: the binary search assumes that when n nodes cannot go
//! together more cannot either, which is false (two m5.xlarge cost exactly an
//! m5.2xlarge, three fit one for a third less), so what is left is tried in
//! groups: the longest admissible prefix, nodes alike in pool, instance
//! family and zone, then shorter prefixes, within `REGROUP_PROBES` probes
//! and the deadline, while the pass has no new node yet. (3) only adds to
//! what (1) and (2) took, so a pass never saves less than the binary search
//! alone.
//! Each accepted group is committed to the compiled snapshot
//! ([`Compiled::commit`]), so a probe only solves its own group's pods. A pass takes any number of deletes but one replacement, so the
//! pass's joint solve never opens more than one new node.
//!
//! Replacement rules: every option of the new node is cheaper than what it
//! replaces and none is a replaced node's own type, unless the new node goes
//! into a capacity reservation with room (paid for already, priced near
//! zero: work moves there first, and such a node launches only into a
//! reservation); a spot replacement may
//! not fall back to on-demand; spot-to-spot only for a single node with at
//! least [`ConsolidationOptions::spot_to_spot_min_types`] cheaper options,
//! launching from the cheapest of those; a decision saves at least the
//! configured minimum; a node that was itself a replacement is left alone for
//! its pool's `consolidateAfter` or the cooldown, whichever is longer.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::labels;
use crate::requirements::Requirement;
use crate::scheduling::{Compiled, ExistingPlacement, NewNodeClaim, Plan, PodRef, SolveOptions, TargetKind};
use crate::snapshot::Snapshot;

use super::balanced;
use super::candidate::{self, Candidate};
use super::{Context, Held, Method, Pass, Reason, Verdict};

/// The multi-node search considers at most this many nodes at once
/// (Karpenter: 100) ...
const MULTI_NODE_MAX: usize = 200;
/// ... and at most this many pods: every probe re-solves the whole prefix.
const MULTI_NODE_MAX_PODS: usize = 2_000;
/// Regrouping tries at most this many groups a pass, besides stopping at the
/// deadline: each is a solve of up to [`MULTI_NODE_MAX_PODS`] pods over the
/// whole cluster (16 doubled a 1,000-node pass on the benchmark).
const REGROUP_PROBES: usize = 8;

/// The knobs of consolidation (the sweep reads them from its environment).
#[derive(Debug, Clone, PartialEq)]
pub struct ConsolidationOptions {
    /// A decision must save at least this much per hour.
    pub min_saving_per_hour: f64,
    /// And at least this share (percent) of the removed nodes' price.
    pub min_saving_percent: f64,
    /// A replacement is not a candidate until this long after its launch
    /// (or its pool's `consolidateAfter`, if longer).
    pub replacement_cooldown: Duration,
    /// Spot-to-spot replacement needs at least this many cheaper instance
    /// types (Karpenter: 15), and launches from the cheapest this many.
    pub spot_to_spot_min_types: usize,
    /// Whether spot nodes may be replaced by spot nodes at all (Karpenter's
    /// `SpotToSpotConsolidation` feature gate, off by default; spot nodes
    /// are still deleted when their pods fit elsewhere).
    pub spot_to_spot: bool,
}

impl Default for ConsolidationOptions {
    fn default() -> Self {
        ConsolidationOptions {
            min_saving_per_hour: 0.001,
            min_saving_percent: 1.0,
            replacement_cooldown: Duration::from_secs(15 * 60),
            spot_to_spot_min_types: 15,
            spot_to_spot: false,
        }
    }
}

/// The Underutilized method: which nodes are candidates.
pub(crate) struct Underutilized;

impl Method for Underutilized {
    fn reason(&self) -> Reason {
        Reason::Underutilized
    }

    fn judge(&self, c: &Candidate, cx: &Context) -> Verdict {
        use crate::apis::nodepool::ConsolidationPolicy;
        let policy = c.pool.spec.disruption.consolidation_policy;
        if policy == ConsolidationPolicy::WhenEmpty || c.is_empty() || c.pool.is_static() {
            return Verdict::Skip;
        }
        if let Err(h) = c.consolidatable(cx.now) {
            return Verdict::Held(h);
        }
        if let Some(remaining_secs) = cooling_down(c, cx) {
            return Verdict::Held(Held::RecentReplacement { remaining_secs });
        }
        match c.price {
            Some(p) if p > 0.0 => Verdict::Disrupt,
            _ => Verdict::Held(Held::NoSaving),
        }
    }

    /// Most saved per disruption first: the node's price over its
    /// disruption cost (Karpenter sorts by the cost alone), then cheapest to
    /// disrupt, then by name.
    fn order(&self, a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
        let per = |c: &Candidate| c.price.unwrap_or(0.0) / c.disruption_cost.max(1e-3);
        per(b)
            .total_cmp(&per(a))
            .then_with(|| a.disruption_cost.total_cmp(&b.disruption_cost))
            .then_with(|| a.name.cmp(&b.name))
    }

    /// Only in passes where repair, expiry and drift chose nothing: Karpenter runs
    /// one command at a time, and their replacements would muddle the price
    /// checks.
    fn runs_after(&self, earlier: &[Reason]) -> bool {
        !earlier
            .iter()
            .any(|r| matches!(r, Reason::Unhealthy | Reason::Expired | Reason::Drifted))
    }

    /// Multi-node, single-node, then regrouping probes, at most one new node a pass.
    fn select<'a>(&self, candidates: &'a [Candidate<'a>], pass: &mut Pass<'a>) -> Vec<&'a Candidate<'a>> {
        consolidate(self, candidates, pass, true)
    }
}

/// Underutilized as it searched before regrouping (binary search, then single
/// nodes): the reference the tests hold the pass's saving against.
#[cfg(test)]
pub(crate) struct BinarySearchOnly;

#[cfg(test)]
impl Method for BinarySearchOnly {
    fn reason(&self) -> Reason {
        Underutilized.reason()
    }

    fn judge(&self, c: &Candidate, cx: &Context) -> Verdict {
        Underutilized.judge(c, cx)
    }

    fn order(&self, a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
        Underutilized.order(a, b)
    }

    fn runs_after(&self, earlier: &[Reason]) -> bool {
        Underutilized.runs_after(earlier)
    }

    fn select<'a>(&self, candidates: &'a [Candidate<'a>], pass: &mut Pass<'a>) -> Vec<&'a Candidate<'a>> {
        consolidate(&Underutilized, candidates, pass, false)
    }
}

/// Seconds left before a replacement node may be consolidated, if any.
fn cooling_down(c: &Candidate, cx: &Context) -> Option<u64> {
    c.annotations.get(labels::REPLACEMENT_ANNOTATION)?;
    let created = c.created?;
    let after = c.pool.spec.disruption.consolidate_after.duration().unwrap_or_default();
    let wait = after.max(cx.options.consolidation.replacement_cooldown);
    let until = created.checked_add(jiff::SignedDuration::try_from(wait).ok()?).ok()?;
    (until > cx.now).then(|| until.duration_since(cx.now).as_secs().unsigned_abs())
}

/// What a group of nodes replaced together allows its new node to be.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplacementLimits {
    /// Every option must cost less than this per hour (the nodes' total).
    pub price_below: f64,
    /// The nodes' own instance types, never offered again.
    pub exclude_types: BTreeSet<String>,
    /// How many nodes are replaced.
    pub nodes: usize,
    /// All of them are spot.
    pub all_spot: bool,
}

impl ReplacementLimits {
    /// The limits of the named nodes of `snapshot` (nodes without a known price count 0).
    pub fn of(snapshot: &Snapshot, nodes: &BTreeSet<String>) -> ReplacementLimits {
        let mut l = ReplacementLimits {
            all_spot: true,
            ..ReplacementLimits::default()
        };
        for n in &snapshot.nodes {
            let Some(name) = n.node.metadata.name.as_deref() else {
                continue;
            };
            if !nodes.contains(name) {
                continue;
            }
            let node_labels = n.node.metadata.labels.clone().unwrap_or_default();
            l.add(candidate::price(&snapshot.catalog, &node_labels), &node_labels);
        }
        l
    }

    fn add(&mut self, price: Option<f64>, node_labels: &BTreeMap<String, String>) {
        self.price_below += price.unwrap_or(0.0);
        self.nodes += 1;
        self.all_spot &= node_labels.get(labels::CAPACITY_TYPE).map(String::as_str) == Some("spot");
        if let Some(t) = node_labels.get(labels::INSTANCE_TYPE) {
            self.exclude_types.insert(t.clone());
        }
    }

    /// Solve options for these limits with `removed` gone.
    pub fn solve_options(&self, removed: BTreeSet<String>, deadline: Option<Instant>) -> SolveOptions {
        SolveOptions {
            removed,
            deadline,
            price_below: Some(self.price_below),
            exclude_types: self.exclude_types.clone(),
            ..SolveOptions::default()
        }
    }

    /// Why a new node planned for these nodes is not allowed (a replaced
    /// node's own type outside a reservation; spot-to-spot rules).
    pub fn refuse(&self, claim: &NewNodeClaim, opts: &ConsolidationOptions) -> Option<String> {
        if claim.capacity_type != labels::CAPACITY_RESERVED && self.exclude_types.contains(&claim.instance_type) {
            return Some(format!(
                "its replacement would be another {} outside a reservation",
                claim.instance_type
            ));
        }
        if !(self.all_spot && claim.capacity_type == "spot") {
            return None;
        }
        if !opts.spot_to_spot {
            return Some("spot-to-spot consolidation is off (SpotToSpotConsolidation)".into());
        }
        let min_types = opts.spot_to_spot_min_types;
        if self.nodes > 1 {
            return Some("spot-to-spot consolidation replaces single nodes only".into());
        }
        let n = claim.instance_type_options.len();
        (n < min_types)
            .then(|| format!("spot-to-spot consolidation needs {min_types} cheaper instance types, found {n}"))
    }

    /// Whether removing the nodes for `added` per hour of new capacity saves
    /// the minimum (both the absolute and the relative one).
    pub fn pays(&self, added: f64, opts: &ConsolidationOptions) -> Result<(), String> {
        let saving = self.price_below - added;
        let floor = opts
            .min_saving_per_hour
            .max(self.price_below * opts.min_saving_percent / 100.0);
        if saving < floor {
            return Err(format!("saves {saving:.4}/h, less than the minimum {floor:.4}/h"));
        }
        Ok(())
    }

    /// Narrows a new node planned for these nodes to what was priced: a
    /// reserved node launches only into a reservation (its price is near
    /// zero; an on-demand fallback would not save what was planned), a spot
    /// node may not fall back to on-demand, and spot-to-spot launches from
    /// the `min_types` cheapest options. The replaced nodes' own types stay
    /// options only inside a reservation.
    pub fn restrict(&self, claim: &mut NewNodeClaim, min_types: usize) {
        if claim.capacity_type == labels::CAPACITY_RESERVED {
            claim.requirements.add(Requirement::in_values(
                labels::CAPACITY_TYPE,
                &[labels::CAPACITY_RESERVED],
            ));
            return;
        }
        if !self.exclude_types.is_empty() {
            claim.instance_type_options.retain(|t| !self.exclude_types.contains(t));
        }
        if claim.capacity_type != "spot" {
            return;
        }
        claim
            .requirements
            .add(Requirement::in_values(labels::CAPACITY_TYPE, &["spot"]));
        if self.all_spot {
            claim.instance_type_options.truncate(min_types.max(1));
        }
    }
}

/// The accepted part of the pass so far.
struct Accepted<'c> {
    nodes: Vec<&'c Candidate<'c>>,
    /// The group the one replacement serves, once there is one.
    replaced: Option<ReplacementLimits>,
    /// Where each moved pod lands (a later decision may move it again).
    moves: BTreeMap<PodRef, (String, TargetKind)>,
    /// The new node, once there is one.
    claims: Vec<NewNodeClaim>,
    /// Nodes gone from the committed state (earlier methods' and ours).
    gone: BTreeSet<String>,
    /// Those of them not committed yet (earlier methods' before the first
    /// accept): the only ones a probe must name, the rest are retired.
    uncommitted: BTreeSet<String>,
}

/// Decides the Underutilized part of a pass on top of what earlier methods
/// removed; returns the chosen nodes (admitted to budgets and PDBs) and
/// leaves the pass's plan as every move and the new node of the decision.
/// Each accepted group is committed to the pass's compiled snapshot, so a
/// probe only ever solves its own group's pods.
fn consolidate<'a>(
    m: &Underutilized,
    candidates: &'a [Candidate<'a>],
    pass: &mut Pass<'a>,
    regrouping: bool,
) -> Vec<&'a Candidate<'a>> {
    let mut order: Vec<&Candidate> = Vec::new();
    let open: Vec<&Candidate> = pass.open(candidates).collect();
    // Every managed node counts in its pool's totals, candidate or not.
    let totals = balanced::totals(candidates);
    for c in open {
        match m.judge(c, &pass.cx) {
            Verdict::Skip => {}
            Verdict::Held(h) => pass.hold(c, h),
            Verdict::Disrupt => match balanced::can_pass(c, &totals) {
                Ok(()) => order.push(c),
                Err(why) => pass.hold(c, Held::Unconsolidatable(why)),
            },
        }
    }
    pass.coverage = Some(super::Coverage {
        candidates: order.len(),
        unexamined: 0,
    });
    if order.is_empty() {
        return Vec::new();
    }
    order.sort_by(|a, b| m.order(a, b));
    let opts = &pass.cx.options.consolidation;
    let deadline = pass.cx.options.deadline;
    let expired = || deadline.is_some_and(|d| Instant::now() >= d);
    let mut acc = Accepted {
        nodes: Vec::new(),
        replaced: None,
        moves: BTreeMap::new(),
        claims: Vec::new(),
        gone: pass.removed.clone(),
        uncommitted: pass.removed.clone(),
    };
    // Earlier methods' moves (none today: expiry and drift end the pass before
    // consolidation, and empty nodes move nothing) become the starting state.
    if let Some(plan) = pass.plan.take() {
        accept(&mut pass.compiled, &mut acc, &[], plan, None);
    }

    // (1) Multi-node: the longest admissible prefix that goes for at most one new node.
    let mut prefix: Vec<&Candidate> = Vec::new();
    let mut pods = 0;
    for c in &order {
        pods += c.evicted().count();
        if prefix.len() >= MULTI_NODE_MAX || pods > MULTI_NODE_MAX_PODS {
            break;
        }
        match pass.admit(m, c) {
            Ok(()) => prefix.push(c),
            Err(h) => pass.hold(c, h),
        }
    }
    let (mut lo, mut hi) = (2usize, prefix.len());
    let mut best: Option<(usize, Plan, ReplacementLimits)> = None;
    while lo <= hi && !expired() {
        let mid = (lo + hi) / 2;
        match probe(&pass.compiled, &acc, &prefix[..mid], opts, deadline, &totals) {
            Ok((plan, limits)) => {
                best = Some((mid, plan, limits));
                lo = mid + 1;
            }
            Err(_) => hi = mid - 1,
        }
    }
    let taken = best.as_ref().map_or(0, |b| b.0);
    for c in &prefix[taken..] {
        pass.release(c);
    }
    if let Some((k, plan, limits)) = best {
        accept(&mut pass.compiled, &mut acc, &prefix[..k], plan, Some(limits));
    }

    // (2) Single nodes: every other candidate on its own; its latest rule is
    // the one that holds it.
    let chosen: BTreeSet<&str> = acc.nodes.iter().map(|c| c.name.as_str()).collect();
    let rest: Vec<&Candidate> = order
        .iter()
        .copied()
        .filter(|c| !chosen.contains(c.name.as_str()))
        .collect();
    for (i, &c) in rest.iter().enumerate() {
        if expired() {
            if let Some(coverage) = &mut pass.coverage {
                coverage.unexamined = rest.len() - i;
            }
            break;
        }
        if let Err(h) = pass.admit(m, c) {
            pass.blocked.insert(c.name.clone(), h);
            continue;
        }
        match probe(&pass.compiled, &acc, &[c], opts, deadline, &totals) {
            Ok((plan, limits)) => {
                pass.blocked.remove(&c.name);
                accept(&mut pass.compiled, &mut acc, &[c], plan, Some(limits));
            }
            Err(h) => {
                pass.release(c);
                pass.blocked.insert(c.name.clone(), h);
            }
        }
    }

    // (3) Regrouping what is left, unless the deadline cut (2) short or the
    // pass's one new node is taken: then a group could only go by deletes,
    // and nodes whose pods found no room one at a time seldom find it with
    // more nodes gone, so the probes would cost a lot for next to nothing.
    if regrouping && acc.replaced.is_none() && !expired() {
        regroup(m, &order, pass, &mut acc, &totals);
    }

    pass.removed = acc.gone;
    pass.plan = Some(merged(
        &pass.compiled,
        acc.moves,
        acc.claims,
        acc.replaced.as_ref(),
        opts,
    ));
    acc.nodes
}

/// Tries groups of the candidates no step took yet and takes the first that
/// goes (see the module's (3)), then looks again at what is left; stops after
/// [`REGROUP_PROBES`] probes, at the deadline, or when no group goes. A group
/// that does not go leaves its nodes held as (2) held them.
fn regroup<'a>(
    m: &Underutilized,
    order: &[&'a Candidate<'a>],
    pass: &mut Pass<'a>,
    acc: &mut Accepted<'a>,
    totals: &BTreeMap<String, balanced::PoolTotals>,
) {
    let options = pass.cx.options;
    let (opts, deadline) = (&options.consolidation, options.deadline);
    let expired = || deadline.is_some_and(|d| Instant::now() >= d);
    let mut tried: BTreeSet<Vec<&str>> = BTreeSet::new();
    let mut probes = 0;
    'search: loop {
        let taken: BTreeSet<&str> = acc.nodes.iter().map(|c| c.name.as_str()).collect();
        // Only nodes a probe refused: a budget, a PDB or a protection that
        // held one in (2) holds it still (accepted groups only use them up).
        let rest: Vec<&Candidate> = order
            .iter()
            .copied()
            .filter(|c| !taken.contains(c.name.as_str()))
            .filter(|c| matches!(pass.blocked.get(&c.name), None | Some(Held::Unconsolidatable(_))))
            .collect();
        for group in groups(&rest) {
            if probes >= REGROUP_PROBES || expired() {
                break 'search;
            }
            if !tried.insert(group.iter().map(|c| c.name.as_str()).collect()) {
                continue;
            }
            let mut admitted: Vec<&Candidate> = Vec::new();
            for c in group {
                if pass.admit(m, c).is_ok() {
                    admitted.push(c);
                }
            }
            if admitted.len() >= 2 {
                probes += 1;
                if let Ok((plan, limits)) = probe(&pass.compiled, acc, &admitted, opts, deadline, totals) {
                    for c in &admitted {
                        pass.blocked.remove(&c.name);
                    }
                    accept(&mut pass.compiled, acc, &admitted, plan, Some(limits));
                    continue 'search;
                }
            }
            for c in admitted {
                pass.release(c);
            }
        }
        break;
    }
}

/// The groups regrouping tries, likeliest first, each of two nodes or more
/// and within the multi-node caps: the longest prefix of `rest`; the nodes
/// alike in pool, instance family and zone, then in pool and family, the
/// dearest group first (the most to save); then halves, quarters, ... of the
/// longest prefix.
fn groups<'a>(rest: &[&'a Candidate<'a>]) -> Vec<Vec<&'a Candidate<'a>>> {
    fn capped<'a>(nodes: impl IntoIterator<Item = &'a Candidate<'a>>) -> Vec<&'a Candidate<'a>> {
        let (mut group, mut pods) = (Vec::new(), 0);
        for c in nodes {
            pods += c.evicted().count();
            if group.len() >= MULTI_NODE_MAX || pods > MULTI_NODE_MAX_PODS {
                break;
            }
            group.push(c);
        }
        group
    }
    let label = |c: &Candidate, key: &str| c.labels.get(key).cloned().unwrap_or_default();
    // Nodes carry Karpenter's family label; the type's prefix stands in for it.
    let family = |c: &Candidate| match c.labels.get(labels::aws::FAMILY) {
        Some(f) => f.clone(),
        None => label(c, labels::INSTANCE_TYPE)
            .split('.')
            .next()
            .unwrap_or_default()
            .to_string(),
    };
    let price = |g: &[&Candidate]| g.iter().filter_map(|c| c.price).sum::<f64>();
    let longest = capped(rest.iter().copied());
    let mut out = vec![longest.clone()];
    for with_zone in [true, false] {
        let mut alike: BTreeMap<(String, String, String), Vec<&Candidate>> = BTreeMap::new();
        for c in rest {
            let zone = if with_zone {
                label(c, labels::ZONE)
            } else {
                String::new()
            };
            alike
                .entry((c.pool.name().to_string(), family(c), zone))
                .or_default()
                .push(c);
        }
        let mut found: Vec<Vec<&Candidate>> = alike.into_values().map(capped).collect();
        found.sort_by(|a, b| price(b).total_cmp(&price(a)));
        out.extend(found);
    }
    let mut n = longest.len() / 2;
    while n >= 2 {
        out.push(longest[..n].to_vec());
        n /= 2;
    }
    out.retain(|g| g.len() >= 2);
    out
}

/// Takes `group` into the pass: its solve is committed and its moves recorded.
fn accept<'c>(
    compiled: &mut Compiled,
    acc: &mut Accepted<'c>,
    group: &[&'c Candidate<'c>],
    plan: Plan,
    limits: Option<ReplacementLimits>,
) {
    acc.gone.extend(group.iter().map(|c| c.name.clone()));
    compiled.commit(&plan, &acc.gone);
    acc.uncommitted.clear();
    for e in plan.existing {
        for p in e.pods {
            acc.moves.insert(p, (e.name.clone(), e.kind));
        }
    }
    for c in plan.node_claims {
        for p in &c.pods {
            acc.moves.insert(p.clone(), (c.name.clone(), TargetKind::NodeClaim));
        }
        acc.replaced = limits.clone();
        acc.claims.push(c);
    }
    acc.nodes.extend_from_slice(group);
}

/// The pass's plan from what was accepted: moves by destination, and the new
/// node with every pod that landed on it and what they use, narrowed to what
/// was priced.
fn merged(
    compiled: &Compiled,
    moves: BTreeMap<PodRef, (String, TargetKind)>,
    mut claims: Vec<NewNodeClaim>,
    replaced: Option<&ReplacementLimits>,
    opts: &ConsolidationOptions,
) -> Plan {
    let mut existing: BTreeMap<String, ExistingPlacement> = BTreeMap::new();
    for c in &mut claims {
        c.pods.clear();
        if let Some(used) = compiled.used_by(&c.name) {
            c.requests = used;
        }
        if let Some(l) = replaced {
            l.restrict(c, opts.spot_to_spot_min_types);
        }
    }
    for (pod, (to, kind)) in moves {
        if let Some(c) = claims.iter_mut().find(|c| c.name == to) {
            c.pods.push(pod);
            continue;
        }
        existing
            .entry(to.clone())
            .or_insert_with(|| ExistingPlacement {
                name: to,
                kind,
                pods: Vec::new(),
            })
            .pods
            .push(pod);
    }
    Plan {
        node_claims: claims,
        existing: existing.into_values().collect(),
        unschedulable: Vec::new(),
        warnings: Vec::new(),
    }
}

/// The solve with `group` gone too, if it is a valid consolidation on top of
/// what was accepted (and committed): everything placed, at most one new
/// node in the pass, that node's rules kept, and the saving above the minimum.
fn probe(
    compiled: &Compiled,
    acc: &Accepted,
    group: &[&Candidate],
    opts: &ConsolidationOptions,
    deadline: Option<Instant>,
    totals: &BTreeMap<String, balanced::PoolTotals>,
) -> Result<(Plan, ReplacementLimits), Held> {
    let mut limits = ReplacementLimits {
        all_spot: true,
        ..ReplacementLimits::default()
    };
    for c in group {
        limits.add(c.price, &c.labels);
    }
    let mut removed = acc.uncommitted.clone();
    removed.extend(group.iter().map(|c| c.name.clone()));
    // A delete first: cheap (no new-node options to weigh) and the most common
    // answer. Then, while the pass has no new node yet, a replacement. One new
    // node is FFD's cheapest type holding its pods, so the cost search that
    // compares several node sizes is skipped.
    let delete = SolveOptions {
        removed,
        deadline,
        new_claims: false,
        improve: false,
        ..SolveOptions::default()
    };
    let mut plan = compiled.solve(&delete);
    if !plan.unschedulable.is_empty() && acc.replaced.is_none() {
        plan = compiled.solve(&SolveOptions {
            improve: false,
            ..limits.solve_options(delete.removed, deadline)
        });
    }
    // Not `CannotPlace`: for consolidation that is the common "no cheaper
    // home" answer, not a rule worth an event every run.
    if let Some(u) = plan.unschedulable.first() {
        return Err(Held::Unconsolidatable(format!(
            "pod {} has no cheaper place: {}",
            u.pod, u.reason
        )));
    }
    if plan.node_claims.len() > 1 {
        return Err(Held::Unconsolidatable(format!(
            "its pods need {} new nodes",
            plan.node_claims.len()
        )));
    }
    if let Some(why) = plan.node_claims.iter().find_map(|claim| limits.refuse(claim, opts)) {
        return Err(Held::Unconsolidatable(why));
    }
    limits.pays(plan.total_price(), opts).map_err(Held::Unconsolidatable)?;
    balanced::judge_move(group, limits.price_below - plan.total_price(), totals).map_err(Held::Unconsolidatable)?;
    Ok((plan, limits))
}

/// Re-checks a consolidation on a fresh solve before anything is launched
/// (pure): its pods still all fit, on at most one new node that keeps the
/// rules, and it still saves the minimum. Karpenter re-validates a command
/// the same way before acting on it.
pub fn revalidate(
    limits: &ReplacementLimits,
    planned: &[NewNodeClaim],
    stuck: Option<&str>,
    opts: &ConsolidationOptions,
) -> Result<(), String> {
    if let Some(why) = stuck {
        return Err(why.to_string());
    }
    if planned.len() > 1 {
        return Err(format!("its pods now need {} new nodes", planned.len()));
    }
    if let Some(why) = planned.iter().find_map(|c| limits.refuse(c, opts)) {
        return Err(why);
    }
    limits.pays(planned.iter().map(|c| c.price).sum(), opts)
}
