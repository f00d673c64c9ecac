//! The compact model of a solve, compiled once from [`SolveInput`]: dense
//! resource vectors, pools with their usable instance types, existing
//! capacity, pending pods with their topology groups, and the counts that
//! running pods contribute.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::daemonset::{self, Daemon};
use super::dense::{self, ResourceTable, Vector};
use super::existing::Existing;
use k8s_openapi::api::core::v1::Pod;

use super::pod::{HostPort, PodModel, PodRef, Toleration};
use super::reason::Reason;
use super::topology::{Counts, Domains, GroupId, GroupKind, Groups};
use super::volume::{Volumes, cross};
use super::{SolveInput, SolveOptions, TargetKind};
use crate::apis::labels;
use crate::apis::{KubeletConfiguration, Taint};
use crate::catalog::{InstanceType, Offering};
use crate::requirements::{Requirement, Requirements};
use crate::resources::{AMD_GPU, AWS_NEURON, AWS_NEURON_CORE, HABANA_GAUDI, NVIDIA_GPU};

/// Resources that make an instance type an accelerator type.
pub const ACCELERATORS: &[&str] = &[NVIDIA_GPU, AMD_GPU, AWS_NEURON, AWS_NEURON_CORE, HABANA_GAUDI];

/// Requirement keys by which a pool asks for accelerator types explicitly.
const ACCELERATOR_KEYS: &[&str] = &[
    labels::aws::GPU_NAME,
    labels::aws::GPU_MANUFACTURER,
    labels::aws::GPU_COUNT,
    labels::aws::GPU_MEMORY,
    labels::aws::ACCELERATOR_NAME,
    labels::aws::ACCELERATOR_MANUFACTURER,
    labels::aws::ACCELERATOR_COUNT,
];

/// An instance type as one pool can use it.
#[derive(Debug, Clone)]
pub struct TypeModel {
    /// Name.
    pub name: String,
    /// What it offers (labels, zones and capacity types of usable offerings).
    pub reqs: Requirements,
    /// Its labels (with region).
    pub labels: BTreeMap<String, String>,
    /// Capacity (counts against limits).
    pub capacity: Vector,
    /// Allocatable, as reported.
    pub allocatable: crate::resources::Resources,
    /// Allocatable minus the pool's DaemonSet overhead on it: what pods may use.
    pub avail: Vector,
    /// DaemonSet overhead on it.
    pub overhead: Vector,
    /// Usable offerings (available, not marked unavailable, allowed by the pool).
    pub offerings: Vec<Offering>,
    /// Cheapest usable offering price.
    pub price: f64,
    /// True when it has GPUs or other accelerators.
    pub accelerator: bool,
}

/// A NodePool, compiled.
#[derive(Debug, Clone)]
pub struct Pool {
    /// Name.
    pub name: String,
    /// EC2NodeClass name.
    pub node_class: String,
    /// Requirements (spec, template labels, nodepool and nodeclass labels).
    pub reqs: Requirements,
    /// Template taints.
    pub taints: Vec<Taint>,
    /// Startup taints.
    pub startup_taints: Vec<Taint>,
    /// Template labels.
    pub labels: BTreeMap<String, String>,
    /// Usable instance types, cheapest first.
    pub types: Vec<TypeModel>,
    /// Limited resources: (index, limit).
    pub limits: Vec<(usize, i64)>,
    /// Limit on the node count, if any.
    pub node_limit: Option<i64>,
    /// True when the pool asks for accelerator types by its requirements.
    pub asks_accelerator: bool,
    /// True when some requirement has minValues.
    pub has_min_values: bool,
    /// Set when the pool cannot be used at all.
    pub error: Option<String>,
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

/// A pending pod as compiled from the snapshot: its model and its required
/// node terms (volume topology folded in), or why it cannot be modelled.
type Source = Result<(PodModel, Vec<Requirements>), (PodRef, Reason)>;

/// A pod running on an existing node, compiled once.
#[derive(Debug, Clone)]
pub(crate) struct Running {
    /// Index of its node in [`Compiled::existing`].
    node: usize,
    /// Its model.
    model: PodModel,
    /// Its required node terms with volume topology, for when it must move.
    terms: Result<Vec<Requirements>, String>,
    /// False for DaemonSet, mirror and finished pods: they never move.
    movable: bool,
}

/// A snapshot compiled once: pools with their usable instance types, existing
/// nodes and in-flight claims with what their pods use, and every pod's
/// constraints. Solving it many times with different [`SolveOptions`] (nodes
/// removed, no new claims, a price ceiling) recompiles none of this.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// Resource names.
    pub(crate) res: ResourceTable,
    /// Pools by weight (highest first), then name.
    pub(crate) pools: Vec<Pool>,
    /// Capacity each pool holds through existing nodes and claims.
    pub(crate) pool_used: Vec<Vector>,
    /// Nodes and claims each pool holds.
    pub(crate) pool_nodes: Vec<i64>,
    /// Existing nodes, then in-flight claims, with their running pods' usage.
    pub(crate) existing: Vec<Existing>,
    /// The pool of each existing entry.
    pub(crate) existing_pool: Vec<Option<usize>>,
    /// The snapshot's pending pods, in input order.
    pending: Vec<Source>,
    /// Pods running on existing nodes.
    running: Vec<Running>,
    /// Skipped input.
    pub(crate) warnings: Vec<String>,
}

#[cfg(test)]
thread_local! {
    /// How many times this thread compiled a snapshot (tests assert what-ifs recompile nothing).
    pub(crate) static COMPILATIONS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
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
    pub invalid: Vec<(PodRef, Reason)>,
    /// Pools by weight (highest first), then name.
    pub pools: &'c [Pool],
    /// Capacity each pool already holds (removed nodes excluded).
    pub pool_used: Vec<Vector>,
    /// Nodes each pool already holds (removed nodes excluded).
    pub pool_nodes: Vec<i64>,
    /// Existing nodes, then in-flight claims, less the removed ones.
    pub existing: Vec<Existing>,
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
}

/// Keys whose value an instance type defines (absent from a type means the
/// type lacks the label), as opposed to keys the pool or offering defines.
pub fn instance_defined(key: &str) -> bool {
    labels::is_well_known(key)
        && !matches!(
            key,
            labels::ZONE
                | labels::CAPACITY_TYPE
                | labels::NODEPOOL
                | labels::EC2NODECLASS
                | labels::ZONE_ID
                | labels::REGION
        )
}

/// True when two requirements on one key can both hold, allocation-free in
/// the common cases.
pub fn overlaps(a: &Requirement, b: &Requirement) -> bool {
    if !a.complement && a.greater_than.is_none() && a.less_than.is_none() {
        return a.values.iter().any(|v| b.has(v)) || (a.values.is_empty() && b.allows_absent());
    }
    if !b.complement && b.greater_than.is_none() && b.less_than.is_none() {
        return b.values.iter().any(|v| a.has(v)) || (b.values.is_empty() && a.allows_absent());
    }
    !a.intersection(b).is_empty() || (a.allows_absent() && b.allows_absent())
}

impl TypeModel {
    /// True when this type can satisfy `req` on its key.
    pub fn allows(&self, req: &Requirement) -> bool {
        match self.reqs.get(&req.key) {
            Some(t) => overlaps(t, req),
            None => !instance_defined(&req.key) || req.allows_absent(),
        }
    }

    /// True when some usable offering satisfies the zone and capacity-type requirements.
    pub fn offered(&self, reqs: &Requirements) -> bool {
        let z = reqs.get(labels::ZONE);
        let c = reqs.get(labels::CAPACITY_TYPE);
        self.offerings
            .iter()
            .any(|o| z.is_none_or(|r| r.has(&o.zone)) && c.is_none_or(|r| r.has(&o.capacity_type)))
    }

    /// True when every requirement holds for this type (offerings included).
    pub fn compatible(&self, reqs: &Requirements) -> bool {
        reqs.iter().all(|r| self.allows(r)) && self.offered(reqs)
    }
}

fn accelerator_of(r: &crate::resources::Resources) -> bool {
    ACCELERATORS.iter().any(|a| r.get(a) > crate::quantity::Quantity::ZERO)
}

impl Pool {
    /// True when the requirements ask for accelerator types explicitly.
    fn asks(reqs: &Requirements) -> bool {
        reqs.iter().any(|r| {
            (ACCELERATOR_KEYS.contains(&r.key.as_str()) && !r.allows_absent())
                || (matches!(r.key.as_str(), labels::INSTANCE_TYPE | labels::aws::FAMILY) && !r.complement)
        })
    }
}

/// True for a running pod that moves when its node goes: not a DaemonSet or
/// mirror pod, and not finished.
fn movable(p: &Pod) -> bool {
    let daemon = p
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "DaemonSet");
    let mirror = p
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
    let finished = p
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|ph| ph == "Succeeded" || ph == "Failed");
    !(daemon || mirror || finished)
}

impl Compiled {
    /// Compiles a solver input once.
    pub fn new(input: &SolveInput) -> Compiled {
        #[cfg(test)]
        COMPILATIONS.with(|c| c.set(c.get() + 1));
        let mut warnings = Vec::new();
        let (daemons, skipped) = daemonset::daemons(input.daemon_sets);
        warnings.extend(skipped);

        // Model pods first: their resource names size the vectors.
        let volumes = Volumes::new(
            input.persistent_volumes,
            input.persistent_volume_claims,
            input.storage_classes,
        );
        let with_volumes = |m: &PodModel| {
            volumes.requirements(m).map(|v| {
                if v.is_empty() {
                    m.node_terms.clone()
                } else {
                    cross(&m.node_terms, &v)
                }
            })
        };
        let pending: Vec<Source> = input
            .pods
            .iter()
            .map(|p| match PodModel::from_pod(p) {
                Ok(m) => match with_volumes(&m) {
                    Ok(terms) => Ok((m, terms)),
                    Err(e) => Err((m.pod.clone(), Reason::Volume(e))),
                },
                Err(e) => Err((PodRef::of(p), Reason::InvalidPod(e.to_string()))),
            })
            .collect();
        let mut running: Vec<Running> = Vec::new();
        for (ni, n) in input.nodes.iter().enumerate() {
            for p in &n.pods {
                match PodModel::from_pod(p) {
                    Ok(m) => running.push(Running {
                        node: ni,
                        terms: with_volumes(&m),
                        movable: movable(p),
                        model: m,
                    }),
                    Err(e) => warnings.push(format!("running pod {}: {e}", PodRef::of(p))),
                }
            }
        }

        let resolved: Vec<(String, Vec<InstanceType>)> = {
            let mut classes: BTreeSet<String> = input
                .node_pools
                .iter()
                .map(|p| p.spec.template.spec.node_class_ref.name.clone())
                .collect();
            classes.extend(input.node_claims.iter().map(|c| c.node_class.clone()));
            classes
                .into_iter()
                .map(|c| {
                    let kubelet: Option<&KubeletConfiguration> = input
                        .node_classes
                        .iter()
                        .find(|nc| nc.metadata.name.as_deref() == Some(c.as_str()))
                        .and_then(|nc| nc.spec.kubelet.as_ref());
                    (c, input.catalog.resolve(kubelet))
                })
                .collect()
        };

        let mut names: BTreeSet<String> = BTreeSet::new();
        for (m, _) in pending.iter().flatten() {
            names.extend(m.requests.0.keys().cloned());
        }
        for (_, types) in &resolved {
            for t in types {
                names.extend(t.allocatable.0.keys().cloned());
                names.extend(t.capacity.0.keys().cloned());
            }
        }
        for p in input.node_pools {
            names.extend(p.spec.limits.keys().filter(|k| *k != "nodes").cloned());
        }
        for n in input.nodes {
            names.extend(
                n.node
                    .status
                    .as_ref()
                    .and_then(|s| s.allocatable.as_ref())
                    .into_iter()
                    .flatten()
                    .map(|(k, _)| k.clone()),
            );
        }
        let res = ResourceTable::new(names.iter().map(String::as_str));

        let unavailable: BTreeSet<(&str, &str, &str)> = input
            .unavailable
            .iter()
            .map(|u| (u.instance_type.as_str(), u.zone.as_str(), u.capacity_type.as_str()))
            .collect();

        // Pools, highest weight first.
        let mut pool_list: Vec<&crate::apis::NodePool> = input.node_pools.iter().collect();
        pool_list.sort_by(|a, b| b.weight().cmp(&a.weight()).then_with(|| a.name().cmp(b.name())));
        let mut pools = Vec::new();
        for np in pool_list {
            let node_class = np.spec.template.spec.node_class_ref.name.clone();
            let mut error = None;
            let mut reqs = match np.requirements() {
                Ok(r) => r,
                Err(e) => {
                    error = Some(format!("invalid requirements: {e}"));
                    Requirements::new()
                }
            };
            reqs.add(Requirement::in_values(labels::EC2NODECLASS, &[node_class.as_str()]));
            let types_src = resolved
                .iter()
                .find(|(c, _)| *c == node_class)
                .map(|(_, t)| t.as_slice())
                .unwrap_or(&[]);
            let taints = np.spec.template.spec.taints.clone();
            let overhead_daemons: Vec<&Daemon> = daemons
                .iter()
                .filter(|d| d.lands_on(&taints, |t| reqs.compatible(t, true).is_ok()))
                .collect();
            let mut types = Vec::new();
            for it in types_src {
                if let Some(t) = type_model(it, &reqs, &unavailable, &res, &overhead_daemons) {
                    types.push(t);
                }
            }
            types.sort_by(|a, b| a.price.total_cmp(&b.price).then_with(|| a.name.cmp(&b.name)));
            drop(overhead_daemons);
            let asks_accelerator = Pool::asks(&reqs);
            let has_min_values = reqs.iter().any(|r| r.min_values.is_some());
            let limits = np
                .spec
                .limits
                .iter()
                .filter_map(|(k, q)| res.index(k).map(|i| (i, q.milli())))
                .collect();
            let node_limit = np.spec.limits.get("nodes").map(|q| q.units_ceil());
            pools.push(Pool {
                name: np.name().to_string(),
                node_class,
                asks_accelerator,
                has_min_values,
                reqs,
                taints,
                startup_taints: np.spec.template.spec.startup_taints.clone(),
                labels: np.spec.template.metadata.labels.clone(),
                types,
                limits,
                node_limit,
                error,
            });
        }

        // Existing nodes and in-flight claims, and what they hold of their pools.
        let mut pool_used = vec![res.zero(); pools.len()];
        let mut pool_nodes = vec![0i64; pools.len()];
        let mut existing = Vec::new();
        let mut existing_pool = Vec::new();
        let mut hold = |e: &Existing, pool_used: &mut Vec<Vector>| {
            let pi = e
                .pool
                .as_ref()
                .and_then(|name| pools.iter().position(|p| &p.name == name));
            if let Some(pi) = pi {
                dense::add(&mut pool_used[pi], &e.capacity);
                pool_nodes[pi] += 1;
            }
            pi
        };
        for n in input.nodes {
            let e = Existing::from_node(n, &res);
            existing_pool.push(hold(&e, &mut pool_used));
            existing.push(e);
        }
        for r in &running {
            let e = &mut existing[r.node];
            dense::add(&mut e.used, &res.vector(&r.model.requests));
            e.ports.extend(r.model.host_ports.iter().cloned());
        }
        for c in input.node_claims.iter().filter(|c| c.phase.holds_capacity()) {
            let types = resolved
                .iter()
                .find(|(n, _)| *n == c.node_class)
                .map(|(_, t)| t.as_slice())
                .unwrap_or(&[]);
            let mut e = Existing::from_claim(c, types, &res);
            // An in-flight claim's pods are still pending and this solve packs
            // them again (onto it first); only its DaemonSet pods are spoken for.
            e.used = res.zero();
            let claim_reqs = c.requirements();
            for d in daemons
                .iter()
                .filter(|d| d.lands_on(&c.taints, |t| claim_reqs.compatible(t, true).is_ok()))
            {
                dense::add(&mut e.used, &res.vector(d.requests()));
            }
            existing_pool.push(hold(&e, &mut pool_used));
            existing.push(e);
        }
        Compiled {
            res,
            pools,
            pool_used,
            pool_nodes,
            existing,
            existing_pool,
            pending,
            running,
            warnings,
        }
    }

    /// Names of the existing nodes and in-flight claims, in solve order.
    pub fn existing_names(&self) -> impl Iterator<Item = &str> {
        self.existing.iter().map(|e| e.name.as_str())
    }
}

impl<'c> Model<'c> {
    /// The compiled snapshot as one solve sees it.
    pub fn new(c: &'c Compiled, options: &SolveOptions) -> Model<'c> {
        let removed: Vec<bool> = c.existing.iter().map(|e| options.removed.contains(&e.name)).collect();
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
            existing.push(e.clone());
        }

        // Pending: the snapshot's pending pods, then the movable pods of removed nodes.
        let mut invalid = Vec::new();
        let mut sources: Vec<(&PodModel, &[Requirements])> = Vec::new();
        for s in &c.pending {
            match s {
                Ok((m, terms)) => sources.push((m, terms)),
                Err((p, r)) => invalid.push((p.clone(), r.clone())),
            }
        }
        for r in c.running.iter().filter(|r| removed[r.node] && r.movable) {
            match &r.terms {
                Ok(terms) => sources.push((&r.model, terms)),
                Err(e) => invalid.push((r.model.pod.clone(), Reason::Volume(e.clone()))),
            }
        }
        // Pods with identical constraints (replicas of one workload) share one
        // compiled shape, so 20,000 pods cost little more than their names.
        let mut pending: Vec<(PodModel, Vec<Requirements>)> = Vec::new();
        let mut shape_index: HashMap<ShapeKey, usize> = HashMap::new();
        let mut entries: Vec<(PodRef, usize)> = Vec::new();
        for (m, terms) in sources {
            let key = ShapeKey::of(m, terms);
            let next = pending.len();
            let idx = *shape_index.entry(key).or_insert(next);
            entries.push((m.pod.clone(), idx));
            if idx == next {
                pending.push((m.clone(), terms.to_vec()));
            }
        }
        drop(shape_index);
        let running: Vec<(usize, &PodModel)> = c
            .running
            .iter()
            .filter_map(|r| index[r.node].map(|ni| (ni, &r.model)))
            .collect();
        let pools = c.pools.as_slice();
        let res = &c.res;
        // Topology groups of pending pods and of running pods' anti-affinity.
        let mut groups = Groups::default();
        struct Owned {
            required: Vec<GroupId>,
            pref_affinity: Vec<GroupId>,
            pref_anti: Vec<GroupId>,
            soft_spread: Vec<GroupId>,
        }
        let mut owned = Vec::new();
        for (m, terms) in &pending {
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
        for (_, m) in &running {
            running_owned.push(
                m.anti_affinity
                    .iter()
                    .map(|t| groups.term(t, GroupKind::AntiAffinity { required: true }))
                    .collect::<Vec<_>>(),
            );
        }

        // Domains: every value a topology key can take.
        let mut domains = Domains::default();
        let mut key_domains: HashMap<String, Vec<super::topology::DomainId>> = HashMap::new();
        let keys: BTreeSet<String> = groups
            .list
            .iter()
            .filter(|g| !g.hostname)
            .map(|g| g.id.key.clone())
            .collect();
        for key in &keys {
            let vals = domain_values(key, pools, &existing, None);
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
            let vals = domain_values(&group.id.key, pools, &existing, group.id.filter.tolerations.as_deref());
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

        // Counts from running pods.
        let mut counts = Counts::new(groups.list.len());
        let mut match_cache: HashMap<(String, BTreeMap<String, String>), Vec<GroupId>> = HashMap::new();
        for ((ni, m), anti) in running.iter().zip(&running_owned) {
            let e = &existing[*ni];
            let matching = match_cache
                .entry((m.pod.namespace.clone(), m.labels.clone()))
                .or_insert_with(|| groups.matching(&m.pod.namespace, &m.labels))
                .clone();
            for g in matching {
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

        // Pending shapes compiled; pods sorted first-fit-decreasing.
        let mut shapes = Vec::new();
        for (si, ((m, terms), o)) in pending.into_iter().zip(owned).enumerate() {
            let counts_in = match_cache
                .entry((m.pod.namespace.clone(), m.labels.clone()))
                .or_insert_with(|| groups.matching(&m.pod.namespace, &m.labels))
                .clone();
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
            shapes.push(PendingPod {
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
                class: si as u32,
                monotone,
                model: m,
            });
        }
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

        Model {
            res,
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

/// Everything about a pod but its name: equal keys share a compiled shape.
#[derive(Hash, PartialEq, Eq)]
struct ShapeKey {
    namespace: String,
    labels: BTreeMap<String, String>,
    requests: Vec<(String, i64)>,
    terms: Vec<Requirements>,
    preferred: Vec<(i32, Requirements)>,
    tolerations: Vec<Toleration>,
    spreads: Vec<super::pod::Spread>,
    affinity: Vec<super::pod::PodTerm>,
    anti_affinity: Vec<super::pod::PodTerm>,
    preferred_affinity: Vec<(i32, super::pod::PodTerm)>,
    preferred_anti_affinity: Vec<(i32, super::pod::PodTerm)>,
    ports: Vec<HostPort>,
}

impl ShapeKey {
    fn of(m: &PodModel, terms: &[Requirements]) -> Self {
        ShapeKey {
            namespace: m.pod.namespace.clone(),
            labels: m.labels.clone(),
            requests: m.requests.0.iter().map(|(k, v)| (k.clone(), v.milli())).collect(),
            terms: terms.to_vec(),
            preferred: m.preferred_node.clone(),
            tolerations: m.tolerations.clone(),
            spreads: m.spreads.clone(),
            affinity: m.affinity.clone(),
            anti_affinity: m.anti_affinity.clone(),
            preferred_affinity: m.preferred_affinity.clone(),
            preferred_anti_affinity: m.preferred_anti_affinity.clone(),
            ports: m.host_ports.clone(),
        }
    }
}

/// The values a topology key takes across pools (their requirements and
/// their instance types' offerings) and existing nodes; with `tolerations`,
/// only pools and nodes whose taints they tolerate count.
fn domain_values(
    key: &str,
    pools: &[Pool],
    existing: &[Existing],
    tolerations: Option<&[Toleration]>,
) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for p in pools {
        if p.error.is_some() || tolerations.is_some_and(|t| super::pod::tolerates_all(t, &p.taints, true).is_err()) {
            continue;
        }
        let pool_req = p.reqs.get(key);
        if let Some(r) = pool_req.filter(|r| !r.complement) {
            out.extend(
                r.values
                    .iter()
                    .filter(|v| p.types.iter().any(|t| t.reqs.get(key).is_none_or(|tr| tr.has(v))))
                    .cloned(),
            );
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
    for e in existing {
        if tolerations.is_some_and(|t| super::pod::tolerates_all(t, &e.taints, true).is_err()) {
            continue;
        }
        if let Some(v) = e.labels.get(key) {
            out.insert(v.clone());
        }
    }
    out
}

/// One instance type as a pool can use it, or `None` when the pool's
/// requirements or the usable offerings rule it out.
fn type_model(
    it: &InstanceType,
    pool_reqs: &Requirements,
    unavailable: &BTreeSet<(&str, &str, &str)>,
    res: &ResourceTable,
    daemons: &[&Daemon],
) -> Option<TypeModel> {
    let zone = pool_reqs.get(labels::ZONE);
    let ct = pool_reqs.get(labels::CAPACITY_TYPE);
    let offerings: Vec<Offering> = it
        .offerings
        .iter()
        .filter(|o| {
            o.available && !unavailable.contains(&(it.name.as_str(), o.zone.as_str(), o.capacity_type.as_str()))
        })
        .filter(|o| zone.is_none_or(|r| r.has(&o.zone)) && ct.is_none_or(|r| r.has(&o.capacity_type)))
        .cloned()
        .collect();
    if offerings.is_empty() {
        return None;
    }
    let mut labels_map = it.labels.clone();
    labels_map
        .entry(labels::OS.to_string())
        .or_insert_with(|| "linux".to_string());
    labels_map.insert(labels::INSTANCE_TYPE.to_string(), it.name.clone());
    let mut reqs = Requirements::from_labels(labels_map.iter());
    let zones: Vec<&str> = offerings.iter().map(|o| o.zone.as_str()).collect();
    let cts: Vec<&str> = offerings.iter().map(|o| o.capacity_type.as_str()).collect();
    reqs.add(Requirement::in_values(labels::ZONE, &zones));
    reqs.add(Requirement::in_values(labels::CAPACITY_TYPE, &cts));
    let price = offerings.iter().map(|o| o.price).fold(f64::INFINITY, f64::min);
    let t = TypeModel {
        name: it.name.clone(),
        reqs,
        labels: labels_map,
        capacity: res.vector(&it.capacity),
        allocatable: it.allocatable.clone(),
        avail: Vec::new(),
        overhead: res.zero(),
        offerings,
        price,
        accelerator: accelerator_of(&it.capacity) || accelerator_of(&it.allocatable),
    };
    if !pool_reqs.iter().all(|r| t.allows(r)) {
        return None;
    }
    let mut overhead = res.zero();
    for d in daemons {
        if d.pod.node_terms.iter().any(|term| term.iter().all(|r| t.allows(r))) {
            dense::add(&mut overhead, &res.vector(d.requests()));
        }
    }
    let mut avail = res.vector(&it.allocatable);
    dense::sub(&mut avail, &overhead);
    if avail.iter().any(|v| *v < 0) {
        return None;
    }
    Some(TypeModel { avail, overhead, ..t })
}
