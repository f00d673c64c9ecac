//! One solve's model: the compiled snapshot ([`Compiled`]) seen through the
//! solve's options (removed nodes gone, their movable pods pending), with the
//! pending pods' compiled shapes, topology groups, domains and the counts
//! that running pods contribute.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::compile::{Compiled, Pool, accelerator_of};
use super::dense::{self, ResourceTable, Vector};
use super::existing::Existing;
use super::failure::PlacementFailure;
use super::pod::{PodModel, PodRef};
use super::topology::{Counts, Domains, GroupId, GroupKind, Groups, NodeFilter};
use super::{SolveOptions, TargetKind};
use crate::labels;
use crate::requirements::Requirements;

/// An existing node or in-flight claim as one solve sees it: the compiled
/// entry, borrowed (what-ifs solve many times over thousands of nodes), and
/// its topology domains, interned for this solve.
#[derive(Debug, Clone)]
pub struct SolveExisting<'c> {
    /// The compiled entry.
    pub base: &'c Existing,
    /// Its hostname domain.
    pub host: super::topology::DomainId,
    /// Its domain per topology key (`None` when it lacks the label).
    pub domains: BTreeMap<String, Option<super::topology::DomainId>>,
}

impl std::ops::Deref for SolveExisting<'_> {
    type Target = Existing;

    fn deref(&self) -> &Existing {
        self.base
    }
}

impl SolveExisting<'_> {
    /// Its domain for a group's topology key.
    pub fn domain(&self, g: &super::topology::Group) -> Option<super::topology::DomainId> {
        if g.hostname {
            return Some(self.host);
        }
        self.domains.get(&g.id.key).copied().flatten()
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
    pub existing: Vec<SolveExisting<'c>>,
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
    /// Per compiled entry: its index among the kept ones.
    index: Vec<Option<usize>>,
    /// The kept entries.
    existing: Vec<SolveExisting<'c>>,
    /// Capacity each pool holds through kept entries.
    pool_used: Vec<Vector>,
    /// Kept entries each pool holds.
    pool_nodes: Vec<i64>,
}

impl<'c> Model<'c> {
    /// The compiled snapshot as one solve sees it.
    pub fn new(c: &'c Compiled, options: &SolveOptions) -> Model<'c> {
        let Remaining {
            removed,
            index,
            mut existing,
            pool_used,
            pool_nodes,
        } = Self::remaining(c, options);
        let (pending, entries, invalid) = Self::pending(c, &removed);
        let running: Vec<(usize, &super::compile::Running)> = c
            .running
            .iter()
            .filter_map(|r| index[r.node].map(|ni| (ni, r)))
            .collect();
        let pools = c.pools.as_slice();
        let (mut groups, owned, running_owned) = Self::topology_groups(&pending, &running);
        let (domains, key_domains) = Self::intern_domains(&mut groups, pools, &mut existing);
        let counts = Self::count_running(c, &groups, &existing, &running, &running_owned);
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

    /// Takes the removed entries away, with what they held of their pools.
    fn remaining(c: &'c Compiled, options: &SolveOptions) -> Remaining<'c> {
        let mut removed = vec![false; c.existing.len()];
        for i in options.removed.iter().filter_map(|n| c.existing_index.get(n)).flatten() {
            removed[*i] = true;
        }
        let mut pool_used = c.pool_used.clone();
        let mut pool_nodes = c.pool_nodes.clone();
        let mut existing = Vec::with_capacity(c.existing.len());
        let mut index: Vec<Option<usize>> = vec![None; c.existing.len()];
        for (i, e) in c.existing.iter().enumerate() {
            if removed[i] {
                if let Some(pi) = c.existing_pool[i] {
                    dense::sub(&mut pool_used[pi], &e.capacity);
                    pool_nodes[pi] -= 1;
                }
                continue;
            }
            index[i] = Some(existing.len());
            existing.push(SolveExisting {
                base: e,
                host: 0,
                domains: BTreeMap::new(),
            });
        }
        Remaining {
            removed,
            index,
            existing,
            pool_used,
            pool_nodes,
        }
    }

    /// Pending: the snapshot's pending pods, then the movable pods of removed
    /// nodes; shapes, each pod with its shape, and the pods that cannot be modelled.
    fn pending(c: &Compiled, removed: &[bool]) -> (Vec<Shape>, Vec<(PodRef, usize)>, Invalid) {
        let mut invalid = c.invalid.clone();
        let moved: Vec<_> = c.running.iter().filter(|r| removed[r.node] && r.movable).collect();
        // The shape index is needed only to add moved pods: provisioning solves skip copying it.
        let (pending, entries) = if moved.is_empty() {
            (c.pending.shapes.clone(), c.pending.entries.clone())
        } else {
            let mut shapes = c.pending.clone();
            for r in moved {
                match &r.terms {
                    Ok(terms) => shapes.add(&r.model, terms),
                    Err(e) => invalid.push((r.model.pod.clone(), PlacementFailure::Volume(e.clone()))),
                }
            }
            (shapes.shapes, shapes.entries)
        };
        (pending, entries, invalid)
    }

    /// Topology groups of pending pods (by shape) and of running pods' anti-affinity.
    fn topology_groups(
        pending: &[Shape],
        running: &[(usize, &super::compile::Running)],
    ) -> (Groups, Vec<Owned>, Vec<Vec<GroupId>>) {
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
        let mut running_owned = Vec::new();
        for (_, r) in running {
            running_owned.push(
                r.model
                    .anti_affinity
                    .iter()
                    .map(|t| groups.term(t, GroupKind::AntiAffinity { required: true }))
                    .collect::<Vec<_>>(),
            );
        }
        (groups, owned, running_owned)
    }

    /// Domains: every value a topology key can take, interned; each kept
    /// entry's domains; each spread group's universe.
    fn intern_domains(
        groups: &mut Groups,
        pools: &[Pool],
        existing: &mut [SolveExisting],
    ) -> (Domains, HashMap<String, Vec<super::topology::DomainId>>) {
        let mut domains = Domains::default();
        let mut key_domains: HashMap<String, Vec<super::topology::DomainId>> = HashMap::new();
        let keys: BTreeSet<String> = groups
            .list
            .iter()
            .filter(|g| !g.hostname)
            .map(|g| g.id.key.clone())
            .collect();
        for key in &keys {
            let vals = domain_values(key, pools, existing, &NodeFilter::default());
            key_domains.insert(key.clone(), vals.iter().map(|v| domains.intern(v)).collect());
        }
        for e in existing.iter_mut() {
            e.host = domains.intern(&format!("node:{}", e.hostname));
            e.domains = keys
                .iter()
                .map(|k| (k.clone(), e.labels.get(k).map(|v| domains.intern(v))))
                .collect();
        }
        for g in 0..groups.list.len() {
            let group = &groups.list[g];
            if group.hostname || !matches!(group.id.kind, GroupKind::Spread { .. }) {
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
        (domains, key_domains)
    }

    /// Counts from running pods: the groups that count them, and the
    /// required anti-affinity they own.
    fn count_running(
        c: &Compiled,
        groups: &Groups,
        existing: &[SolveExisting],
        running: &[(usize, &super::compile::Running)],
        running_owned: &[Vec<GroupId>],
    ) -> Counts {
        let mut counts = Counts::new(groups.list.len());
        let mut class_groups: Vec<Option<Vec<GroupId>>> = vec![None; c.label_classes.len()];
        for ((ni, r), anti) in running.iter().zip(running_owned) {
            let e = &existing[*ni];
            let matching = class_groups[r.label_class].get_or_insert_with(|| {
                let (ns, labels) = &c.label_classes[r.label_class];
                groups.matching(ns, c.namespace_labels.get(ns), labels)
            });
            for &g in matching.iter() {
                let group = &groups.list[g];
                if e.passes(&group.id.filter)
                    && let Some(d) = e.domain(group)
                {
                    counts.record(g, d);
                }
            }
            for g in anti {
                if let Some(d) = e.domain(&groups.list[*g]) {
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
fn domain_values(key: &str, pools: &[Pool], existing: &[SolveExisting], filter: &NodeFilter) -> BTreeSet<String> {
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
            out.extend(r.values.iter().cloned());
            continue;
        }
        for t in &p.types {
            if key == labels::ZONE {
                out.extend(
                    t.offerings
                        .iter()
                        .map(|o| o.zone.clone())
                        .filter(|z| pool_req.is_none_or(|r| r.has(z))),
                );
            } else if key == labels::CAPACITY_TYPE {
                out.extend(
                    t.offerings
                        .iter()
                        .map(|o| o.capacity_type.clone())
                        .filter(|z| pool_req.is_none_or(|r| r.has(z))),
                );
            } else if let Some(tr) = t.reqs.get(key).filter(|r| !r.complement) {
                out.extend(tr.values.iter().filter(|v| pool_req.is_none_or(|r| r.has(v))).cloned());
            }
        }
    }
    for e in existing.iter().filter(|e| e.passes(filter)) {
        if let Some(v) = e.labels.get(key) {
            out.insert(v.clone());
        }
    }
    out
}
