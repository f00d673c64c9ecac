//! One solve's model: the compiled snapshot ([`Compiled`]) seen through the
//! solve's options (removed nodes gone, their movable pods pending), with the
//! pending pods' compiled shapes, topology groups, domains and the counts
//! that running pods contribute.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::compile::{Compiled, KeyValues, Pool, accelerator_of};
use super::dense::{self, ResourceTable, Vector};
use super::existing::Existing;
use super::failure::PlacementFailure;
use super::pod::{PodModel, PodRef};
use super::topology::{Counts, DomainId, Domains, Group, GroupId, GroupKind, Groups, NodeFilter};
use super::{SolveOptions, TargetKind};
use crate::labels;
use crate::requirements::Requirements;

/// The domains of the kept existing entries for one solve: each entry's
/// hostname domain and its domain per non-hostname topology key (flat,
/// entries × keys; `None` when it lacks the label). Built without a string
/// per entry: what-ifs solve many times over thousands of nodes.
#[derive(Debug, Clone, Default)]
pub struct EntryDomains {
    hosts: Vec<DomainId>,
    keys: usize,
    ids: Vec<Option<DomainId>>,
}

impl EntryDomains {
    /// Kept entry `e`'s domain for a group's topology key.
    pub fn get(&self, e: usize, g: &Group) -> Option<DomainId> {
        if g.hostname {
            return Some(self.hosts[e]);
        }
        self.ids[e * self.keys + g.slot]
    }
}

/// A pending pod: its name and its shape.
#[derive(Debug, Clone)]
pub struct PodEntry {
    /// The pod.
    pub pod: PodRef,
    /// Index into [`Model::shapes`].
    pub shape: u32,
}

/// A pending pod's compiled constraints (shared by identical replicas).
#[derive(Debug, Clone)]
pub struct PendingPod {
    /// The model of the first pod of this shape.
    pub model: PodModel,
    /// Effective requests.
    pub req: Vector,
    /// Required node terms (OR), volume topology folded in.
    pub terms: Vec<Requirements>,
    /// Preferred node terms, heaviest first.
    pub preferred_node: Vec<Requirements>,
    /// Required groups it owns (DoNotSchedule spreads, affinity, anti-affinity).
    pub required: Vec<GroupId>,
    /// Preferred pod affinity groups, heaviest first.
    pub pref_affinity: Vec<GroupId>,
    /// Preferred pod anti-affinity groups, heaviest first.
    pub pref_anti: Vec<GroupId>,
    /// ScheduleAnyway spread groups.
    pub soft_spread: Vec<GroupId>,
    /// Groups whose selector counts this pod (sorted).
    pub counts_in: Vec<GroupId>,
    /// Required anti-affinity groups whose selector matches this pod: it must
    /// stay away from their owners.
    pub inverse: Vec<GroupId>,
    /// Topology keys (other than hostname) it relates to: a new node it lands
    /// on gets a single domain for each.
    pub pin_keys: Vec<String>,
    /// True when it requests an accelerator.
    pub accelerator: bool,
    /// Pods with equal constraints share a class.
    pub class: u32,
    /// True when a node that rejected the pod will reject its class forever
    /// (no spread or affinity groups owned).
    pub monotone: bool,
}

/// One solve: the compiled snapshot seen through the solve's options (removed
/// nodes gone, their movable pods pending), with the pending pods' shapes,
/// topology groups, domains and counts.
#[derive(Debug, Clone)]
pub(crate) struct Model<'c> {
    /// Resource names.
    pub res: &'c ResourceTable,
    /// Pending pods in first-fit-decreasing order.
    pub pods: Vec<PodEntry>,
    /// Compiled pod shapes (pods differing only in name share one).
    pub shapes: Vec<PendingPod>,
    /// Pods that cannot be modelled, with the reason.
    pub invalid: Vec<(PodRef, PlacementFailure)>,
    /// Pools by weight (highest first), then name.
    pub pools: &'c [Pool],
    /// Capacity each pool already holds (removed nodes excluded).
    pub pool_used: Vec<Vector>,
    /// Nodes each pool already holds (removed nodes excluded).
    pub pool_nodes: Vec<i64>,
    /// Existing nodes, then in-flight claims, less the removed ones.
    pub existing: Vec<&'c Existing>,
    /// Their topology domains.
    pub entry_domains: EntryDomains,
    /// Topology groups.
    pub groups: Groups,
    /// Interned domains (existing ones; runs add hostname domains).
    pub domains: Domains,
    /// Every known domain value per topology key.
    pub key_domains: HashMap<String, Vec<super::topology::DomainId>>,
    /// Counts from running pods.
    pub counts: Counts,
    /// Skipped input.
    pub warnings: Vec<String>,
    /// May the solve open new NodeClaims.
    pub new_claims: bool,
    /// New claims' instance types must cost less than this per hour.
    pub price_below: Option<f64>,
    /// Instance types new claims may not use.
    pub exclude_types: std::collections::BTreeSet<String>,
}

/// A pending shape's compiled model and its required node terms.
type Shape = (PodModel, Vec<Requirements>);

/// The running owners of required anti-affinity on kept entries: each
/// one's kept entry and its groups' place in `lists`.
struct RunningOwned {
    owners: Vec<(usize, usize)>,
    lists: Vec<Vec<GroupId>>,
}

/// A topology key's compiled values and each value's domain in one solve.
type Valued<'c> = (&'c KeyValues, Vec<Option<DomainId>>);

/// Pods that cannot be modelled, with the reason.
type Invalid = Vec<(PodRef, PlacementFailure)>;

/// The topology groups a pending shape owns, by kind.
struct Owned {
    required: Vec<GroupId>,
    pref_affinity: Vec<GroupId>,
    pref_anti: Vec<GroupId>,
    soft_spread: Vec<GroupId>,
}

/// The existing entries a solve keeps and what their pools still hold.
struct Remaining<'c> {
    /// Per compiled entry: taken away by the solve.
    removed: Vec<bool>,
    /// The entries taken away by name (not retired before).
    named: Vec<usize>,
    /// Per compiled entry: its index among the kept ones.
    index: Vec<Option<usize>>,
    /// The kept entries.
    existing: Vec<&'c Existing>,
    /// Their indices among the compiled entries.
    kept: Vec<usize>,
    /// Their hostname domains.
    hosts: Vec<DomainId>,
    /// Capacity each pool holds through kept entries.
    pool_used: Vec<Vector>,
    /// Kept entries each pool holds.
    pool_nodes: Vec<i64>,
}

impl<'c> Model<'c> {
    /// The compiled snapshot as one solve sees it.
    pub fn new(c: &'c Compiled, options: &SolveOptions) -> Model<'c> {
        Self::counted(c, options, true)
    }

    /// [`Model::new`], its running pods counted by value where it can
    /// (`by_value`) or all visited one by one (the plain count tests hold the
    /// other to).
    pub(crate) fn counted(c: &'c Compiled, options: &SolveOptions, by_value: bool) -> Model<'c> {
        let Remaining {
            removed,
            named,
            index,
            existing,
            kept,
            hosts,
            pool_used,
            pool_nodes,
        } = Self::remaining(c, options);
        let (pending, entries, invalid) = Self::pending(c, &removed, options.place_removed_pods);
        // Only the running owners of required anti-affinity add groups.
        let anti_owners: Vec<(usize, usize)> = c
            .placed
            .anti_owners
            .iter()
            .filter_map(|&(ri, terms)| index[c.placed.node[ri]].map(|ni| (ni, terms)))
            .collect();
        let pools = c.pools.as_slice();
        let (mut groups, owned, running_owned) = Self::topology_groups(&pending, &anti_owners, &c.placed.anti_terms);
        let (domains, key_domains, entry_domains) =
            Self::intern_domains(c, &mut groups, pools, &existing, (&kept, &removed, hosts));
        let named = if by_value { Some(named.as_slice()) } else { None };
        let counts = Self::count_running(c, (&groups, &domains), &entry_domains, (&index, named), &running_owned);
        let shapes = Self::compile_shapes(c, &groups, pending, owned);
        let pods = Self::first_fit_decreasing(entries, &shapes);
        Model {
            res: &c.res,
            pods,
            shapes,
            invalid,
            pools,
            pool_used,
            pool_nodes,
            existing,
            entry_domains,
            groups,
            domains,
            key_domains,
            counts,
            warnings: c.warnings.clone(),
            new_claims: options.new_claims,
            price_below: options.price_below,
            exclude_types: options.exclude_types.clone(),
        }
    }

    /// Takes the removed entries away (the retired ones are already out of
    /// their pools), with what they held of their pools.
    fn remaining(c: &'c Compiled, options: &SolveOptions) -> Remaining<'c> {
        let mut removed = c.retired.clone();
        let mut named = Vec::new();
        let mut pool_used = c.pool_used.clone();
        let mut pool_nodes = c.pool_nodes.clone();
        for &i in options.removed.iter().filter_map(|n| c.existing_index.get(n)).flatten() {
            if std::mem::replace(&mut removed[i], true) {
                continue;
            }
            named.push(i);
            if let Some(pi) = c.existing_pool[i] {
                dense::sub(&mut pool_used[pi], &c.existing[i].capacity);
                pool_nodes[pi] -= 1;
            }
        }
        let mut existing = Vec::with_capacity(c.existing.len());
        let mut hosts = Vec::with_capacity(c.existing.len());
        let mut kept = Vec::with_capacity(c.existing.len());
        let mut index: Vec<Option<usize>> = vec![None; c.existing.len()];
        for (i, e) in c.existing.iter().enumerate() {
            if removed[i] {
                continue;
            }
            index[i] = Some(existing.len());
            existing.push(e);
            kept.push(i);
            hosts.push(c.hosts.of[i]);
        }
        Remaining {
            removed,
            named,
            index,
            existing,
            kept,
            hosts,
            pool_used,
            pool_nodes,
        }
    }

    /// Pending: the snapshot's pending pods, then (if `place_removed`) the
    /// movable pods of removed nodes; shapes, each pod with its shape, and the
    /// pods that cannot be modelled.
    fn pending(c: &Compiled, removed: &[bool], place_removed: bool) -> (Vec<Shape>, Vec<(PodRef, usize)>, Invalid) {
        let mut invalid = c.invalid.clone();
        // In input order, as a walk over every running pod would find them.
        let mut moved: Vec<usize> = (0..removed.len())
            .filter(|&i| place_removed && removed[i])
            .filter_map(|i| c.placed.on.get(i))
            .flatten()
            .copied()
            .filter(|&ri| c.running[ri].movable)
            .collect();
        moved.sort_unstable();
        let moved: Vec<_> = moved.into_iter().map(|ri| &c.running[ri]).collect();
        // The shape index is needed only to add moved pods: provisioning solves skip copying it.
        let (pending, entries) = if moved.is_empty() {
            (c.pending.shapes.clone(), c.pending.entries.clone())
        } else {
            let mut shapes = c.pending.clone();
            for r in moved {
                match r.terms.as_ref() {
                    Ok(terms) => shapes.add(&r.pod, &r.model, terms),
                    Err(e) => invalid.push((r.pod.clone(), PlacementFailure::Volume(e.clone()))),
                }
            }
            (shapes.shapes, shapes.entries)
        };
        (pending, entries, invalid)
    }

    /// Topology groups of pending pods (by shape) and of the running owners
    /// of anti-affinity (each with its kept entry and its term list in
    /// `anti_terms`).
    fn topology_groups(
        pending: &[Shape],
        anti_owners: &[(usize, usize)],
        anti_terms: &[Vec<super::pod::PodTerm>],
    ) -> (Groups, Vec<Owned>, RunningOwned) {
        let mut groups = Groups::default();
        let mut owned = Vec::new();
        for (m, terms) in pending {
            let mut o = Owned {
                required: vec![],
                pref_affinity: vec![],
                pref_anti: vec![],
                soft_spread: vec![],
            };
            for s in &m.spreads {
                let g = groups.spread(s, &m.pod.namespace, terms, &m.tolerations);
                if s.required {
                    o.required.push(g)
                } else {
                    o.soft_spread.push(g)
                }
            }
            for t in &m.affinity {
                o.required.push(groups.term(t, GroupKind::Affinity));
            }
            for t in &m.anti_affinity {
                o.required
                    .push(groups.term(t, GroupKind::AntiAffinity { required: true }));
            }
            for (_, t) in &m.preferred_affinity {
                o.pref_affinity.push(groups.term(t, GroupKind::Affinity));
            }
            for (_, t) in &m.preferred_anti_affinity {
                o.pref_anti
                    .push(groups.term(t, GroupKind::AntiAffinity { required: false }));
            }
            owned.push(o);
        }
        // Each list becomes groups once, at its first owner, as a walk of the
        // owners in order would intern them.
        let mut local: Vec<Option<usize>> = vec![None; anti_terms.len()];
        let mut running_owned = RunningOwned {
            owners: Vec::with_capacity(anti_owners.len()),
            lists: Vec::new(),
        };
        for &(ni, terms) in anti_owners {
            let l = *local[terms].get_or_insert_with(|| {
                running_owned.lists.push(
                    anti_terms[terms]
                        .iter()
                        .map(|t| groups.term(t, GroupKind::AntiAffinity { required: true }))
                        .collect(),
                );
                running_owned.lists.len() - 1
            });
            running_owned.owners.push((ni, l));
        }
        (groups, owned, running_owned)
    }

    /// Domains: every value a topology key can take, interned; each kept
    /// entry's domains; each spread group's universe.
    fn intern_domains(
        c: &Compiled,
        groups: &mut Groups,
        pools: &[Pool],
        existing: &[&Existing],
        (kept, removed, hosts): (&[usize], &[bool], Vec<DomainId>),
    ) -> (Domains, HashMap<String, Vec<DomainId>>, EntryDomains) {
        let mut domains = Domains::with_hosts(c.hosts.count());
        let mut key_domains: HashMap<String, Vec<DomainId>> = HashMap::new();
        let keys: BTreeSet<String> = groups
            .list
            .iter()
            .filter(|g| !g.hostname)
            .map(|g| g.id.key.clone())
            .collect();
        for key in &keys {
            let vals = match c.topology_labels.get(key) {
                Some(kv) => kept_values(key, pools, kv, removed),
                None => domain_values(key, pools, existing, &NodeFilter::default()),
            };
            key_domains.insert(key.clone(), vals.iter().map(|v| domains.intern(v)).collect());
        }
        let k = keys.len();
        let mut ids = vec![None; existing.len() * k];
        for (slot, key) in keys.iter().enumerate() {
            let Some(kv) = c.topology_labels.get(key) else {
                for (ni, e) in existing.iter().enumerate() {
                    ids[ni * k + slot] = e.labels.get(key).map(|v| domains.intern(v));
                }
                continue;
            };
            let mut numbered: Vec<Option<DomainId>> = vec![None; kv.values.len()];
            for (ni, &ci) in kept.iter().enumerate() {
                ids[ni * k + slot] = kv.of[ci]
                    .map(|v| *numbered[v as usize].get_or_insert_with(|| domains.intern(&kv.values[v as usize])));
            }
        }
        for g in 0..groups.list.len() {
            if groups.list[g].hostname {
                continue;
            }
            let slot = keys
                .iter()
                .position(|k| *k == groups.list[g].id.key)
                .unwrap_or_default();
            groups.list[g].slot = slot;
            let group = &groups.list[g];
            if !matches!(group.id.kind, GroupKind::Spread { .. }) {
                continue;
            }
            // Without a node filter the universe is every value of the key.
            if group.id.filter == NodeFilter::default() {
                groups.list[g].universe = key_domains.get(&group.id.key).cloned().unwrap_or_default();
                continue;
            }
            let vals = domain_values(&group.id.key, pools, existing, &group.id.filter);
            let universe = vals
                .iter()
                .filter(|v| {
                    group
                        .id
                        .filter
                        .terms
                        .as_ref()
                        .is_none_or(|ts| ts.iter().any(|t| t.get(&group.id.key).is_none_or(|r| r.has(v))))
                })
                .filter_map(|v| domains.get(v))
                .collect();
            groups.list[g].universe = universe;
        }
        let entry_domains = EntryDomains {
            hosts,
            keys: keys.len(),
            ids,
        };
        (domains, key_domains, entry_domains)
    }

    /// Counts from running pods on kept entries: the groups that count them
    /// (visiting only the label classes some group matches), and the
    /// required anti-affinity they own. A group over a compiled topology key
    /// with no node filter takes each class's count per value from the
    /// snapshot ([`KeyValues::by_class`]) less the pods of the entries this
    /// solve names (`named`; `None`: every group visits).
    fn count_running(
        c: &Compiled,
        (groups, interned): (&Groups, &Domains),
        domains: &EntryDomains,
        (index, named): (&[Option<usize>], Option<&[usize]>),
        running_owned: &RunningOwned,
    ) -> Counts {
        let mut counts = Counts::new(groups.list.len());
        if groups.list.is_empty() {
            return counts;
        }
        // Per group counted by value: its key's values and each value's domain,
        // looked up once per solve, not per class and pod.
        let by_value: Vec<Option<Valued>> = groups
            .list
            .iter()
            .map(|g| {
                (named.is_some() && !g.hostname && g.id.filter == NodeFilter::default())
                    .then(|| c.topology_labels.get(&g.id.key))
                    .flatten()
                    .map(|kv| (kv, kv.values.iter().map(|v| interned.get(v)).collect()))
            })
            .collect();
        // Per class, the groups counted by value (for the named entries' pods).
        let mut valued: Vec<Vec<GroupId>> = vec![Vec::new(); c.placed.by_class.len()];
        for (class, members) in c.placed.by_class.iter().enumerate() {
            let (ns, labels) = &c.label_classes[class];
            let matching = groups.matching(ns, c.namespace_labels.get(ns), labels);
            let (fast, walked): (Vec<GroupId>, Vec<GroupId>) =
                matching.into_iter().partition(|&g| by_value[g].is_some());
            for &g in &fast {
                let Some((kv, ids)) = &by_value[g] else {
                    continue;
                };
                let row = kv.by_class.get(class).map_or(&[][..], Vec::as_slice);
                for (&n, d) in row.iter().zip(ids).filter(|(n, _)| **n > 0) {
                    if let Some(d) = d {
                        counts.record_n(g, *d, n);
                    }
                }
            }
            valued[class] = fast;
            if walked.is_empty() {
                continue;
            }
            for &ri in members {
                let e = c.placed.node[ri];
                let Some(ni) = index[e] else {
                    continue;
                };
                for &g in &walked {
                    let group = &groups.list[g];
                    if c.existing[e].passes(&group.id.filter)
                        && let Some(d) = domains.get(ni, group)
                    {
                        counts.record(g, d);
                    }
                }
            }
        }
        for &e in named.unwrap_or_default() {
            for &ri in c.placed.on.get(e).into_iter().flatten() {
                for &g in &valued[c.running[ri].label_class] {
                    if let Some((kv, ids)) = &by_value[g]
                        && let Some(d) = kv.of[e].and_then(|v| ids[v as usize])
                    {
                        counts.unrecord(g, d);
                    }
                }
            }
        }
        for &(ni, l) in &running_owned.owners {
            for g in &running_owned.lists[l] {
                if let Some(d) = domains.get(ni, &groups.list[*g]) {
                    counts.record_owner(*g, d);
                }
            }
        }
        counts
    }

    /// Compiles each pending shape against the topology groups.
    fn compile_shapes(c: &Compiled, groups: &Groups, pending: Vec<Shape>, owned: Vec<Owned>) -> Vec<PendingPod> {
        let mut match_cache: HashMap<(String, BTreeMap<String, String>), Vec<GroupId>> = HashMap::new();
        let mut shapes = Vec::new();
        for (si, ((m, terms), o)) in pending.into_iter().zip(owned).enumerate() {
            let counts_in = match_cache
                .entry((m.pod.namespace.clone(), m.labels.clone()))
                .or_insert_with(|| {
                    groups.matching(&m.pod.namespace, c.namespace_labels.get(&m.pod.namespace), &m.labels)
                })
                .clone();
            shapes.push(PendingPod::compile(&c.res, groups, m, terms, o, counts_in, si as u32));
        }
        shapes
    }

    /// The pending pods sorted first-fit-decreasing: largest cpu, then
    /// memory, first; ties by pod.
    fn first_fit_decreasing(entries: Vec<(PodRef, usize)>, shapes: &[PendingPod]) -> Vec<PodEntry> {
        let mut pods: Vec<PodEntry> = entries
            .into_iter()
            .map(|(pod, shape)| PodEntry {
                pod,
                shape: shape as u32,
            })
            .collect();
        let (cpu, mem) = (0, 1);
        pods.sort_by(|a, b| {
            let (x, y) = (&shapes[a.shape as usize].req, &shapes[b.shape as usize].req);
            y[cpu]
                .cmp(&x[cpu])
                .then_with(|| y[mem].cmp(&x[mem]))
                .then_with(|| a.pod.cmp(&b.pod))
        });
        pods
    }
}

impl PendingPod {
    /// One shape's compiled constraints: the groups it owns and counts in,
    /// the anti-affinity it must stay away from, its pin keys.
    fn compile(
        res: &ResourceTable,
        groups: &Groups,
        m: PodModel,
        terms: Vec<Requirements>,
        o: Owned,
        counts_in: Vec<GroupId>,
        class: u32,
    ) -> PendingPod {
        let inverse: Vec<GroupId> = counts_in
            .iter()
            .copied()
            .filter(|g| groups.list[*g].id.kind == GroupKind::AntiAffinity { required: true })
            .collect();
        let all_owned = o
            .required
            .iter()
            .chain(&o.pref_affinity)
            .chain(&o.pref_anti)
            .chain(&o.soft_spread);
        let pin_keys: BTreeSet<String> = all_owned
            .clone()
            .chain(&counts_in)
            .filter(|g| !groups.list[**g].hostname)
            .map(|g| groups.list[*g].id.key.clone())
            .collect();
        let monotone = all_owned
            .clone()
            .all(|g| matches!(groups.list[*g].id.kind, GroupKind::AntiAffinity { .. }));
        let req = res.vector(&m.requests);
        let accelerator = accelerator_of(&m.requests);
        let preferred_node: Vec<Requirements> = m.preferred_node.iter().map(|(_, r)| r.clone()).collect();
        PendingPod {
            req,
            terms,
            preferred_node,
            required: o.required,
            pref_affinity: o.pref_affinity,
            pref_anti: o.pref_anti,
            soft_spread: o.soft_spread,
            counts_in,
            inverse,
            pin_keys: pin_keys.into_iter().collect(),
            accelerator,
            class,
            monotone,
            model: m,
        }
    }
}

impl Model<'_> {
    /// The compiled shape of pending pod `i`.
    pub fn pod(&self, i: usize) -> &PendingPod {
        &self.shapes[self.pods[i].shape as usize]
    }

    /// The kind of an existing target.
    pub fn target_kind(&self, i: usize) -> TargetKind {
        self.existing[i].kind
    }
}

/// The values a topology key takes across pools (their requirements and
/// their instance types' offerings) and existing nodes that `filter` admits
/// (nodeAffinityPolicy / nodeTaintsPolicy Honor): a node or pool the owner's
/// node affinity or tolerations rule out is no domain of its spread.
fn domain_values<'a>(
    key: &str,
    pools: &'a [Pool],
    existing: &[&'a Existing],
    filter: &NodeFilter,
) -> BTreeSet<&'a str> {
    let mut out = pool_values(key, pools, filter);
    for e in existing.iter().filter(|e| e.passes(filter)) {
        if let Some(v) = e.labels.get(key) {
            out.insert(v.as_str());
        }
    }
    out
}

/// [`domain_values`] without a node filter, from the compiled values of the
/// key: those some kept entry carries (`removed`: per compiled entry).
fn kept_values<'a>(key: &str, pools: &'a [Pool], kv: &'a KeyValues, removed: &[bool]) -> BTreeSet<&'a str> {
    let mut out = pool_values(key, pools, &NodeFilter::default());
    let mut carriers = kv.carriers.clone();
    for (i, _) in removed.iter().enumerate().filter(|(_, r)| **r) {
        if let Some(v) = kv.of[i] {
            carriers[v as usize] -= 1;
        }
    }
    out.extend(
        kv.values
            .iter()
            .zip(carriers)
            .filter(|(_, n)| *n > 0)
            .map(|(v, _)| v.as_str()),
    );
    out
}

/// The values a topology key takes across the pools `filter` admits.
fn pool_values<'a>(key: &str, pools: &'a [Pool], filter: &NodeFilter) -> BTreeSet<&'a str> {
    let tolerations = filter.tolerations.as_deref();
    let mut out = BTreeSet::new();
    for p in pools {
        if p.error.is_some()
            || tolerations.is_some_and(|t| super::pod::tolerates_all(t, &p.taints, true).is_err())
            || filter
                .terms
                .as_ref()
                .is_some_and(|ts| !ts.iter().any(|t| p.reqs.compatible(t, true).is_ok()))
        {
            continue;
        }
        let pool_req = p.reqs.get(key);
        if let Some(r) = pool_req.filter(|r| !r.complement) {
            // Every value the pool names is a domain, whether or not a type
            // it can launch offers it now, as Karpenter counts them: a spread
            // over a named zone that cannot be launched into leaves the pod
            // pending rather than stacking it elsewhere.
            out.extend(r.values.iter().map(String::as_str));
            continue;
        }
        for t in &p.types {
            if key == labels::ZONE {
                out.extend(
                    t.offerings
                        .iter()
                        .map(|o| o.zone.as_str())
                        .filter(|z| pool_req.is_none_or(|r| r.has(z))),
                );
            } else if key == labels::CAPACITY_TYPE {
                out.extend(
                    t.offerings
                        .iter()
                        .map(|o| o.capacity_type.as_str())
                        .filter(|z| pool_req.is_none_or(|r| r.has(z))),
                );
            } else if let Some(tr) = t.reqs.get(key).filter(|r| !r.complement) {
                out.extend(
                    tr.values
                        .iter()
                        .filter(|v| pool_req.is_none_or(|r| r.has(v)))
                        .map(String::as_str),
                );
            }
        }
    }
    out
}
