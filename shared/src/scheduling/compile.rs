//! A snapshot's solver input compiled once: dense resource vectors, pools
//! with their usable instance types (DaemonSet overhead and unavailable
//! offerings applied), existing nodes and in-flight claims with what their
//! pods use, and every pod's constraints. [`super::model::Model`] views it
//! for one solve.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::SolveInput;
use super::daemonset::{self, Daemon};
use super::dense::{self, ResourceTable, Vector};
use super::existing::Existing;
use super::failure::PlacementFailure;
use super::pod::{HostPort, PodModel, PodRef, PodTerm, Spread, Toleration};
use super::topology::DomainId;
use super::volume::{Volumes, cross};
use crate::apis::{KubeletConfiguration, Taint};
use crate::catalog::{InstanceType, Offering, OfferingRequirements};
use crate::kubernetes::drain;
use crate::labels;
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
    /// Per offering, its zone and capacity type as indices into the pool's
    /// [`OfferKeys`], so offering checks are table lookups, not string compares.
    pub offer_keys: Vec<(u16, u16)>,
    /// Its offerings' (zone, capacity type) cells as bits, when the pool has
    /// at most 64 cells ([`OfferKeys::cell`]); else 0.
    pub offer_cells: u64,
    /// Its offerings' indices, cheapest first (zone name on ties).
    pub by_price: Vec<u16>,
}

/// The zones and capacity types of a pool's offerings, interned.
#[derive(Debug, Clone, Default)]
pub struct OfferKeys {
    /// Zone names.
    pub zones: Vec<String>,
    /// Capacity type names.
    pub capacity_types: Vec<String>,
}

/// Which interned zones and capacity types some requirements allow.
#[derive(Debug, Clone)]
pub struct OfferMask {
    zones: Vec<bool>,
    capacity_types: Vec<bool>,
    /// The allowed cells as bits, when the pool has at most 64.
    cells: Option<u64>,
}

impl OfferKeys {
    fn intern(list: &mut Vec<String>, v: &str) -> u16 {
        match list.iter().position(|x| x == v) {
            Some(i) => i as u16,
            None => {
                list.push(v.to_string());
                (list.len() - 1) as u16
            }
        }
    }

    /// The bit of the cell of zone `z` and capacity type `c`, when the pool
    /// has at most 64 cells (one word answers "is any offering allowed").
    pub fn cell(&self, z: u16, c: u16) -> Option<u64> {
        (self.zones.len() * self.capacity_types.len() <= 64)
            .then(|| 1 << (z as usize * self.capacity_types.len() + c as usize))
    }

    /// The mask for `wanted`, or `None` when it constrains reservations (then
    /// offerings are checked one by one).
    pub fn mask(&self, wanted: &OfferingRequirements) -> Option<OfferMask> {
        if wanted.constrains_reservation() {
            return None;
        }
        let zones: Vec<bool> = self.zones.iter().map(|z| wanted.allows_zone(z)).collect();
        let capacity_types: Vec<bool> = self
            .capacity_types
            .iter()
            .map(|c| wanted.allows_capacity_type(c))
            .collect();
        let cells = self.cell(0, 0).map(|_| {
            let mut m = 0;
            for (z, _) in zones.iter().enumerate().filter(|(_, ok)| **ok) {
                for (c, _) in capacity_types.iter().enumerate().filter(|(_, ok)| **ok) {
                    m |= self.cell(z as u16, c as u16).unwrap_or(0);
                }
            }
            m
        });
        Some(OfferMask {
            zones,
            capacity_types,
            cells,
        })
    }
}

impl OfferMask {
    /// True when the type's offering `i` is allowed.
    pub fn allows(&self, t: &TypeModel, i: usize) -> bool {
        let (z, c) = t.offer_keys[i];
        self.zones[z as usize] && self.capacity_types[c as usize]
    }

    /// True when some offering of the type is allowed.
    pub fn offered(&self, t: &TypeModel) -> bool {
        match self.cells {
            Some(cells) => t.offer_cells & cells != 0,
            None => (0..t.offerings.len()).any(|i| self.allows(t, i)),
        }
    }

    /// The cheapest allowed offering of the type (the lower zone name on a tie).
    pub fn cheapest<'t>(&self, t: &'t TypeModel) -> Option<&'t Offering> {
        t.by_price
            .iter()
            .map(|i| *i as usize)
            .find(|i| self.allows(t, *i))
            .map(|i| &t.offerings[i])
    }
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
    /// Per resource, every type's room in it with the type's index, least
    /// room first: the types a claim's growth leaves without room are a range.
    pub by_room: Vec<Vec<(i64, u32)>>,
    /// Limited resources: (index, limit).
    pub limits: Vec<(usize, i64)>,
    /// Limit on the node count, if any.
    pub node_limit: Option<i64>,
    /// True when the pool asks for accelerator types by its requirements.
    pub asks_accelerator: bool,
    /// True when some requirement has minValues.
    pub has_min_values: bool,
    /// True when some type has a reserved offering (pricing looks for one only then).
    pub has_reserved: bool,
    /// Host ports the DaemonSets that run on its nodes bind: taken on every new node.
    pub daemon_ports: Vec<HostPort>,
    /// Set when the pool cannot be used at all.
    pub error: Option<String>,
    /// Its offerings' zones and capacity types, interned.
    pub offer_keys: OfferKeys,
    /// The zones where some type of it is sold as spot.
    pub spot_zones: BTreeSet<String>,
    /// Zones it would launch in but for an ARC zonal shift (their offerings
    /// are left out): a pod that can only go there is told so.
    pub shifted_away: BTreeSet<String>,
}

/// Pending pods grouped by shape: pods with identical constraints (replicas
/// of one workload) share one compiled model, so 20,000 pods cost little more
/// than their names.
#[derive(Debug, Clone, Default)]
pub(crate) struct Shapes {
    /// Each shape's model (its first pod's) and required node terms (volume topology folded in).
    pub(crate) shapes: Vec<(PodModel, Vec<Requirements>)>,
    /// Every pod with its shape's index, in the order added.
    pub(crate) entries: Vec<(PodRef, usize)>,
    index: HashMap<ShapeKey, usize>,
}

impl Shapes {
    /// Adds `pod` of model `m` (another pod's of its shape, perhaps),
    /// copying the model only when its shape is new.
    pub(crate) fn add(&mut self, pod: &PodRef, m: &PodModel, terms: &[Requirements]) {
        if let Some(i) = self.index.get(&ShapeKey::of(m, terms)) {
            self.entries.push((pod.clone(), *i));
        } else {
            let mut m = m.clone();
            m.pod = pod.clone();
            self.add_owned(m, terms.to_vec());
        }
    }

    /// Adds a pod, keeping its model when its shape is new.
    fn add_owned(&mut self, m: PodModel, terms: Vec<Requirements>) {
        let next = self.shapes.len();
        let i = *self.index.entry(ShapeKey::of(&m, &terms)).or_insert(next);
        self.entries.push((m.pod.clone(), i));
        if i == next {
            self.shapes.push((m, terms));
        }
    }
}

/// A pod running on an existing node, compiled once.
#[derive(Debug, Clone)]
pub(crate) struct Running {
    /// Index of its node in [`Compiled::existing`].
    pub(crate) node: usize,
    /// The pod.
    pub(crate) pod: PodRef,
    /// Its model, shared by the running pods of its shape (replicas of one
    /// workload): 155,000 running pods held a model each, 2 KB apiece. The
    /// model's own `pod` is the first of them; `pod` above is this one.
    pub(crate) model: Arc<PodModel>,
    /// Its required node terms with volume topology, for when it must move
    /// (shared as `model` is).
    pub(crate) terms: Arc<Result<Vec<Requirements>, String>>,
    /// False for DaemonSet, mirror and finished pods: they never move.
    pub(crate) movable: bool,
    /// Index of its (namespace, labels) in [`Compiled::label_classes`].
    pub(crate) label_class: usize,
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
    /// Per existing entry: gone by a [`Compiled::commit`]. Every later solve
    /// treats it as removed whether it names it or not, and its pool no
    /// longer counts it, so a what-if does not look up every earlier
    /// decision's nodes again.
    pub(crate) retired: Vec<bool>,
    /// The indices of the existing entries of each name (what-ifs name the
    /// nodes they remove; a node and a claim may share a name).
    pub(crate) existing_index: HashMap<String, Vec<usize>>,
    /// The snapshot's pending pods by shape, in input order.
    pub(crate) pending: Shapes,
    /// Pending pods that cannot be modelled, with the reason.
    pub(crate) invalid: Vec<(PodRef, PlacementFailure)>,
    /// Pods running on existing nodes.
    pub(crate) running: Vec<Running>,
    /// The distinct (namespace, labels) of running pods: a solve matches each
    /// against its topology groups once, not once per pod (what-ifs over
    /// thousands of nodes solve many times).
    pub(crate) label_classes: Vec<(String, BTreeMap<String, String>)>,
    /// Skipped input.
    pub(crate) warnings: Vec<String>,
    /// Each namespace's labels (pod affinity namespaceSelectors match them).
    pub(crate) namespace_labels: HashMap<String, BTreeMap<String, String>>,
    /// Where the running pods are, so a what-if visits only what it touches.
    pub(crate) placed: RunningIndex,
    /// Each existing entry's hostname domain.
    pub(crate) hosts: Hosts,
    /// Each topology key's values on the existing entries.
    pub(crate) topology_labels: HashMap<String, KeyValues>,
}

/// The running pods indexed three ways: a what-if of one node over 5,000
/// must not walk all 150,000 pods to find that node's, the pods its
/// topology groups count, or the anti-affinity owners.
#[derive(Debug, Clone, Default)]
pub(crate) struct RunningIndex {
    /// Per existing entry, its running pods (indices into `running`).
    pub(crate) on: Vec<Vec<usize>>,
    /// Per label class, its running pods.
    pub(crate) by_class: Vec<Vec<usize>>,
    /// The running pods owning required anti-affinity terms, in order, each
    /// with its terms' place in `anti_terms`.
    pub(crate) anti_owners: Vec<(usize, usize)>,
    /// The owners' distinct term lists: a Deployment's replicas share one,
    /// so a what-if turns hundreds of owners into groups once per list.
    pub(crate) anti_terms: Vec<Vec<PodTerm>>,
    anti_index: HashMap<Vec<PodTerm>, usize>,
    /// Per running pod, its entry (as `Running::node`, packed: counting a
    /// group's pods visits thousands).
    pub(crate) node: Vec<usize>,
}

impl RunningIndex {
    fn new(running: &[Running], entries: usize) -> Self {
        let mut index = RunningIndex {
            on: vec![Vec::new(); entries],
            ..RunningIndex::default()
        };
        for (ri, r) in running.iter().enumerate() {
            index.add(ri, r);
        }
        index
    }

    /// Indexes running pod `ri`.
    fn add(&mut self, ri: usize, r: &Running) {
        debug_assert_eq!(ri, self.node.len());
        self.node.push(r.node);
        if self.on.len() <= r.node {
            self.on.resize(r.node + 1, Vec::new());
        }
        self.on[r.node].push(ri);
        if self.by_class.len() <= r.label_class {
            self.by_class.resize(r.label_class + 1, Vec::new());
        }
        self.by_class[r.label_class].push(ri);
        if !r.model.anti_affinity.is_empty() {
            let terms = match self.anti_index.get(&r.model.anti_affinity) {
                Some(&t) => t,
                None => {
                    self.anti_terms.push(r.model.anti_affinity.clone());
                    self.anti_index
                        .insert(r.model.anti_affinity.clone(), self.anti_terms.len() - 1);
                    self.anti_terms.len() - 1
                }
            };
            self.anti_owners.push((ri, terms));
        }
    }

    /// Running pod `ri` moved from entry `from` to entry `to`.
    fn relocate(&mut self, ri: usize, from: usize, to: usize) {
        if let Some(on) = self.on.get_mut(from) {
            on.retain(|&i| i != ri);
        }
        if self.on.len() <= to {
            self.on.resize(to + 1, Vec::new());
        }
        self.on[to].push(ri);
        self.node[ri] = to;
    }
}

/// The values the existing entries carry for one topology key, numbered
/// once per snapshot: a solve reads each entry's domain and the key's
/// values without a string lookup per node.
#[derive(Debug, Clone, Default)]
pub(crate) struct KeyValues {
    /// The distinct values.
    pub(crate) values: Vec<String>,
    /// Per existing entry, its value's number (`None`: it lacks the label).
    pub(crate) of: Vec<Option<u32>>,
    /// Per value, how many entries carry it.
    pub(crate) carriers: Vec<u32>,
    /// Per label class of running pods, per value: its pods on the entries
    /// carrying the value, retired entries excepted. A what-if's zonal spread
    /// then counts a class with one add per zone, not one per pod (a pass
    /// over 5,000 nodes solves thousands of times).
    pub(crate) by_class: Vec<Vec<u32>>,
    index: HashMap<String, u32>,
}

impl KeyValues {
    /// Numbers the next entry's value.
    fn push(&mut self, value: Option<&String>) {
        let id = value.map(|v| match self.index.get(v) {
            Some(&id) => id,
            None => {
                let id = self.values.len() as u32;
                self.index.insert(v.clone(), id);
                self.values.push(v.clone());
                self.carriers.push(0);
                id
            }
        });
        if let Some(id) = id {
            self.carriers[id as usize] += 1;
        }
        self.of.push(id);
    }

    /// Counts a running pod of `class` on `entry` in (`up`) or out.
    fn count(&mut self, class: usize, entry: usize, up: bool) {
        let Some(v) = self.of.get(entry).copied().flatten() else {
            return;
        };
        if self.by_class.len() <= class {
            self.by_class.resize(class + 1, Vec::new());
        }
        let row = &mut self.by_class[class];
        if row.len() < self.values.len() {
            row.resize(self.values.len(), 0);
        }
        let n = &mut row[v as usize];
        *n = if up { *n + 1 } else { n.saturating_sub(1) };
    }
}

/// The topology keys (other than the hostname) any pod's spread or
/// (anti-)affinity names, each with its [`KeyValues`].
fn topology_labels(running: &[Running], pending: &Shapes, existing: &[Existing]) -> HashMap<String, KeyValues> {
    let models = running
        .iter()
        .map(|r| &*r.model)
        .chain(pending.shapes.iter().map(|(m, _)| m));
    let mut keys: BTreeSet<&str> = BTreeSet::new();
    for m in models {
        keys.extend(m.spreads.iter().map(|s| s.key.as_str()));
        keys.extend(m.affinity.iter().chain(&m.anti_affinity).map(|t| t.key.as_str()));
        keys.extend(
            m.preferred_affinity
                .iter()
                .chain(&m.preferred_anti_affinity)
                .map(|(_, t)| t.key.as_str()),
        );
    }
    keys.remove(labels::HOSTNAME);
    keys.into_iter()
        .map(|k| {
            let mut kv = KeyValues::default();
            for e in existing {
                kv.push(e.labels.get(k));
            }
            for r in running {
                kv.count(r.label_class, r.node, true);
            }
            (k.to_string(), kv)
        })
        .collect()
}

/// Hostname domains, numbered once per snapshot (entries sharing a hostname,
/// a claim and its node, share one): a solve need not intern 5,000 names.
#[derive(Debug, Clone, Default)]
pub(crate) struct Hosts {
    /// Per existing entry, its hostname's number.
    pub(crate) of: Vec<DomainId>,
    ids: HashMap<String, DomainId>,
}

impl Hosts {
    fn new(existing: &[Existing]) -> Self {
        let mut hosts = Hosts::default();
        for e in existing {
            hosts.push(&e.hostname);
        }
        hosts
    }

    /// Numbers the next entry's hostname.
    fn push(&mut self, hostname: &str) {
        let next = self.ids.len() as DomainId;
        let id = *self.ids.entry(hostname.to_string()).or_insert(next);
        self.of.push(id);
    }

    /// How many distinct hostnames there are.
    pub(crate) fn count(&self) -> DomainId {
        self.ids.len() as DomainId
    }
}

/// The indices of `existing` by name.
fn index_by_name(existing: &[Existing]) -> HashMap<String, Vec<usize>> {
    let mut index: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, e) in existing.iter().enumerate() {
        index.entry(e.name.clone()).or_default().push(i);
    }
    index
}

#[cfg(test)]
thread_local! {
    /// How many times this thread compiled a snapshot (tests assert what-ifs recompile nothing).
    pub(crate) static COMPILATIONS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Keys whose value an instance type defines (absent from a type means the
/// type lacks the label), as opposed to keys the pool or offering defines.
pub fn instance_defined(key: &str) -> bool {
    labels::is_well_known(key)
        && !matches!(
            key,
            labels::ZONE
                | labels::CAPACITY_TYPE
                | labels::aws::CAPACITY_RESERVATION_ID
                | labels::aws::CAPACITY_RESERVATION_TYPE
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

    /// True when some usable offering satisfies the offering requirements
    /// (zone, capacity type, reservation).
    pub fn offered(&self, wanted: &OfferingRequirements) -> bool {
        self.offerings.iter().any(|o| wanted.allow(o))
    }

    /// True when every requirement holds for this type (offerings included).
    pub fn compatible(&self, reqs: &Requirements) -> bool {
        reqs.iter().all(|r| self.allows(r)) && self.offered(&OfferingRequirements::of(reqs))
    }
}

pub(crate) fn accelerator_of(r: &crate::resources::Resources) -> bool {
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

/// Each node class's instance types, as its kubelet settings, instance-store
/// policy and reservations shape them, by class name.
type ClassTypes = Vec<(String, Vec<InstanceType>)>;

/// A running pod's namespace and labels.
type LabelClass = (String, BTreeMap<String, String>);

/// Unavailable offerings as (instance type, zone, capacity type).
type UnavailableSet<'a> = BTreeSet<(&'a str, &'a str, &'a str)>;

/// The instance types resolved for `class` (none for an unknown class).
fn types_of<'r>(resolved: &'r ClassTypes, class: &str) -> &'r [InstanceType] {
    resolved
        .iter()
        .find(|(c, _)| c == class)
        .map(|(_, t)| t.as_slice())
        .unwrap_or(&[])
}

/// A pod's required node terms with its volumes' topology folded in.
fn terms_with_volumes(volumes: &Volumes<'_>, m: &PodModel) -> Result<Vec<Requirements>, String> {
    volumes.requirements(m).map(|v| {
        if v.is_empty() {
            m.node_terms.clone()
        } else {
            cross(&m.node_terms, &v)
        }
    })
}

/// What existing nodes and in-flight claims hold, and of which pool.
#[derive(Default)]
struct Holdings {
    /// Existing nodes, then in-flight claims.
    existing: Vec<Existing>,
    /// The pool of each entry.
    existing_pool: Vec<Option<usize>>,
    /// Capacity each pool holds.
    pool_used: Vec<Vector>,
    /// Entries each pool holds.
    pool_nodes: Vec<i64>,
}

impl Holdings {
    /// Adds an entry, counting its capacity against its pool.
    fn hold(&mut self, e: Existing, pools: &[Pool]) {
        let pi = e
            .pool
            .as_ref()
            .and_then(|name| pools.iter().position(|p| &p.name == name));
        if let Some(pi) = pi {
            dense::add(&mut self.pool_used[pi], &e.capacity);
            self.pool_nodes[pi] += 1;
        }
        self.existing_pool.push(pi);
        self.existing.push(e);
    }
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
        let (pending, invalid) = Self::model_pending(input, &volumes);
        let (running, label_classes) = Self::model_running(input, &volumes, &mut warnings);
        let resolved = Self::resolve_types(input);
        let res = Self::resource_table(input, &pending, &resolved);
        let pools = Self::compile_pools(input, &resolved, &daemons, &res);
        let held = Self::hold_existing(input, &pools, &running, &resolved, &daemons, &res);
        let placed = RunningIndex::new(&running, held.existing.len());
        let hosts = Hosts::new(&held.existing);
        let topology_labels = topology_labels(&running, &pending, &held.existing);
        Compiled {
            res,
            pools,
            pool_used: held.pool_used,
            pool_nodes: held.pool_nodes,
            existing_index: index_by_name(&held.existing),
            retired: vec![false; held.existing.len()],
            existing: held.existing,
            existing_pool: held.existing_pool,
            pending,
            invalid,
            running,
            label_classes,
            warnings,
            namespace_labels: input
                .namespaces
                .iter()
                .filter_map(|n| Some((n.metadata.name.clone()?, n.metadata.labels.clone().unwrap_or_default())))
                .collect(),
            placed,
            hosts,
            topology_labels,
        }
    }

    /// Models the pending pods by shape; those that cannot be modelled get their reason.
    fn model_pending(input: &SolveInput, volumes: &Volumes<'_>) -> (Shapes, Vec<(PodRef, PlacementFailure)>) {
        let mut pending = Shapes::default();
        let mut invalid = Vec::new();
        for p in input.pods {
            match PodModel::from_pod(p) {
                Ok(m) => match terms_with_volumes(volumes, &m) {
                    Ok(terms) => pending.add_owned(m, terms),
                    Err(e) => invalid.push((m.pod.clone(), PlacementFailure::Volume(e))),
                },
                Err(e) => invalid.push((PodRef::of(p), PlacementFailure::InvalidPod(e.to_string()))),
            }
        }
        (pending, invalid)
    }

    /// Models the pods running on existing nodes, with their distinct
    /// (namespace, labels) classes; a pod that cannot be modelled is a warning.
    fn model_running(
        input: &SolveInput,
        volumes: &Volumes<'_>,
        warnings: &mut Vec<String>,
    ) -> (Vec<Running>, Vec<LabelClass>) {
        let mut running: Vec<Running> = Vec::new();
        let mut label_classes: Vec<LabelClass> = Vec::new();
        let mut class_index: HashMap<LabelClass, usize> = HashMap::new();
        let mut shapes: HashMap<RunningKey, RunningShape> = HashMap::new();
        for (ni, n) in input.nodes.iter().enumerate() {
            for p in &n.pods {
                let m = match PodModel::from_pod(p) {
                    Ok(m) => m,
                    Err(e) => {
                        warnings.push(format!("running pod {}: {e}", PodRef::of(p)));
                        continue;
                    }
                };
                let label_class = *class_index
                    .entry((m.pod.namespace.clone(), m.labels.clone()))
                    .or_insert_with_key(|k| {
                        label_classes.push(k.clone());
                        label_classes.len() - 1
                    });
                let pod = m.pod.clone();
                let (model, terms) = shapes
                    .entry(RunningKey::of(&m))
                    .or_insert_with(|| {
                        let terms = Arc::new(terms_with_volumes(volumes, &m));
                        (Arc::new(m), terms)
                    })
                    .clone();
                running.push(Running {
                    node: ni,
                    pod,
                    model,
                    terms,
                    movable: drain::moves_with_node(p),
                    label_class,
                });
            }
        }
        (running, label_classes)
    }

    /// Resolves the instance types of every node class a pool or claim names.
    fn resolve_types(input: &SolveInput) -> ClassTypes {
        let mut classes: BTreeSet<String> = input
            .node_pools
            .iter()
            .map(|p| p.spec.template.spec.node_class_ref.name.clone())
            .collect();
        classes.extend(input.node_claims.iter().map(|c| c.node_class.clone()));
        classes
            .into_iter()
            .map(|c| {
                let class = input
                    .node_classes
                    .iter()
                    .find(|nc| nc.metadata.name.as_deref() == Some(c.as_str()));
                let kubelet: Option<&KubeletConfiguration> = class.and_then(|nc| nc.spec.kubelet.as_ref());
                let raid0 = class.is_some_and(|nc| {
                    nc.spec.instance_store_policy.as_deref() == Some(crate::apis::ec2nodeclass::INSTANCE_STORE_RAID0)
                });
                let reserved = class.map(|nc| nc.reserved_capacity()).unwrap_or_default();
                (c, input.catalog.resolve_for(kubelet, raid0, &reserved))
            })
            .collect()
    }

    /// Names every resource the snapshot mentions (pod requests, types, pool
    /// limits, node allocatable): the dimensions of the dense vectors.
    fn resource_table(input: &SolveInput, pending: &Shapes, resolved: &ClassTypes) -> ResourceTable {
        let mut names: BTreeSet<String> = BTreeSet::new();
        for (m, _) in &pending.shapes {
            names.extend(m.requests.0.keys().cloned());
        }
        for (_, types) in resolved {
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
        ResourceTable::new(names.iter().map(String::as_str))
    }

    /// Compiles the pools, highest weight first (then by name).
    fn compile_pools(input: &SolveInput, resolved: &ClassTypes, daemons: &[Daemon], res: &ResourceTable) -> Vec<Pool> {
        let unavailable: UnavailableSet = input
            .unavailable
            .iter()
            .map(|u| (u.instance_type.as_str(), u.zone.as_str(), u.capacity_type.as_str()))
            .collect();
        let mut pool_list: Vec<&crate::apis::NodePool> = input.node_pools.iter().collect();
        pool_list.sort_by(|a, b| b.weight().cmp(&a.weight()).then_with(|| a.name().cmp(b.name())));
        pool_list
            .into_iter()
            .map(|np| Pool::compile(np, resolved, daemons, (&unavailable, input.shifted_zones), res))
            .collect()
    }

    /// Adds the existing nodes (with their running pods' usage) and the
    /// in-flight claims (with their DaemonSet pods' usage), and what they hold
    /// of their pools.
    fn hold_existing(
        input: &SolveInput,
        pools: &[Pool],
        running: &[Running],
        resolved: &ClassTypes,
        daemons: &[Daemon],
        res: &ResourceTable,
    ) -> Holdings {
        let mut held = Holdings {
            pool_used: vec![res.zero(); pools.len()],
            pool_nodes: vec![0i64; pools.len()],
            ..Holdings::default()
        };
        for n in input.nodes {
            let mut e = Existing::from_node(n, res);
            // No pod is moved or placed into a zone traffic is shifted away
            // from (EKS cordons those nodes too; this holds before it does).
            if e.labels
                .get(labels::ZONE)
                .is_some_and(|z| input.shifted_zones.contains(z))
            {
                e.cordoned = true;
            }
            held.hold(e, pools);
        }
        for r in running {
            let e = &mut held.existing[r.node];
            dense::add(&mut e.used, &res.vector(&r.model.requests));
            e.ports.extend(r.model.host_ports.iter().cloned());
        }
        for c in input.node_claims.iter().filter(|c| c.phase.holds_capacity()) {
            let mut e = Existing::from_claim(c, types_of(resolved, &c.node_class), res);
            // An in-flight claim's pods are still pending and this solve packs
            // them again (onto it first); only its DaemonSet pods are spoken for.
            e.used = res.zero();
            let claim_reqs = c.requirements();
            for d in daemons
                .iter()
                .filter(|d| d.lands_on(&c.taints, |t| claim_reqs.compatible(t, true).is_ok()))
            {
                dense::add(&mut e.used, &res.vector(d.requests()));
                e.ports.extend(d.host_ports().iter().cloned());
            }
            held.hold(e, pools);
        }
        held
    }
}

impl Pool {
    /// Compiles one NodePool: its requirements (or why it is unusable), its
    /// usable types with the overhead of the DaemonSets that land on them,
    /// and its limits.
    fn compile(
        np: &crate::apis::NodePool,
        resolved: &ClassTypes,
        daemons: &[Daemon],
        (unavailable, shifted): (&UnavailableSet, &BTreeSet<String>),
        res: &ResourceTable,
    ) -> Pool {
        let node_class = np.spec.template.spec.node_class_ref.name.clone();
        let (reqs, error) = Self::requirements_of(np, &node_class);
        let shifted_away: BTreeSet<String> = if shifted.is_empty() {
            BTreeSet::new()
        } else {
            let wanted = OfferingRequirements::of(&reqs);
            types_of(resolved, &node_class)
                .iter()
                .flat_map(|it| it.offerings.iter())
                .filter(|o| o.available && shifted.contains(&o.zone) && wanted.allow(o))
                .map(|o| o.zone.clone())
                .collect()
        };
        let taints = np.spec.template.spec.taints.clone();
        let overhead_daemons: Vec<&Daemon> = daemons
            .iter()
            .filter(|d| d.lands_on(&taints, |t| reqs.compatible(t, true).is_ok()))
            .collect();
        let (types, offer_keys) = Self::usable_types(
            types_of(resolved, &node_class),
            &reqs,
            (unavailable, shifted),
            res,
            &overhead_daemons,
        );
        let spot_zones = types
            .iter()
            .flat_map(|t| t.offerings.iter())
            .filter(|o| o.capacity_type == labels::CAPACITY_SPOT)
            .map(|o| o.zone.clone())
            .collect();
        // Ports of every daemon that may land on the pool's nodes (even one limited to
        // some of its types: a pod refused a port waits, a pod planned onto a taken one never runs).
        let daemon_ports: Vec<HostPort> = overhead_daemons
            .iter()
            .flat_map(|d| d.host_ports().iter().cloned())
            .collect();
        drop(overhead_daemons);
        let asks_accelerator = Pool::asks(&reqs);
        let has_min_values = reqs.iter().any(|r| r.min_values.is_some());
        let has_reserved = types
            .iter()
            .any(|t| t.offerings.iter().any(|o| o.reservation.is_some()));
        let limits = np
            .spec
            .limits
            .iter()
            .filter_map(|(k, q)| res.index(k).map(|i| (i, q.milli())))
            .collect();
        let node_limit = np.spec.limits.get("nodes").map(|q| q.units_ceil());
        let by_room = (0..res.zero().len())
            .map(|d| {
                let mut rooms: Vec<(i64, u32)> = (0u32..)
                    .zip(&types)
                    .map(|(i, t)| (t.avail.get(d).copied().unwrap_or(0), i))
                    .collect();
                rooms.sort_unstable();
                rooms
            })
            .collect();
        Pool {
            name: np.name().to_string(),
            node_class,
            asks_accelerator,
            has_min_values,
            has_reserved,
            daemon_ports,
            reqs,
            taints,
            startup_taints: np.spec.template.spec.startup_taints.clone(),
            labels: np.spec.template.metadata.labels.clone(),
            types,
            by_room,
            limits,
            node_limit,
            error,
            offer_keys,
            spot_zones,
            shifted_away,
        }
    }

    /// The pool's requirements with its node class, and why the pool is
    /// unusable, if it is.
    fn requirements_of(np: &crate::apis::NodePool, node_class: &str) -> (Requirements, Option<String>) {
        let mut error = None;
        let mut reqs = match np.requirements() {
            Ok(r) => r,
            Err(e) => {
                error = Some(format!("invalid requirements: {e}"));
                Requirements::new()
            }
        };
        // A pool read from a cluster was not checked by Karpenter's CRD rules:
        // labels it may not set would land on its nodes, so it is not used.
        if error.is_none()
            && let Some((k, why)) = np
                .spec
                .template
                .metadata
                .labels
                .keys()
                .find_map(|k| labels::nodepool_label_restriction(k).map(|why| (k, why)))
        {
            error = Some(format!("spec.template.metadata.labels[{k:?}]: {why}"));
        }
        // A static pool's nodes are its replicas, launched to keep their count
        // (`static_capacity`), never for pods; pods still land on them.
        if error.is_none() && np.is_static() {
            error = Some("static NodePool (replicas): it launches only its replicas, not nodes for pods".into());
        }
        reqs.add(Requirement::in_values(labels::EC2NODECLASS, &[node_class]));
        (reqs, error)
    }

    /// The types the pool can use, cheapest first, with their offerings'
    /// zones and capacity types interned.
    fn usable_types(
        types_src: &[InstanceType],
        reqs: &Requirements,
        unavailable: (&UnavailableSet, &BTreeSet<String>),
        res: &ResourceTable,
        overhead_daemons: &[&Daemon],
    ) -> (Vec<TypeModel>, OfferKeys) {
        let mut types = Vec::new();
        for it in types_src {
            if let Some(t) = type_model(it, reqs, unavailable, res, overhead_daemons) {
                types.push(t);
            }
        }
        types.sort_by(|a, b| a.price.total_cmp(&b.price).then_with(|| a.name.cmp(&b.name)));
        let mut offer_keys = OfferKeys::default();
        for t in &mut types {
            t.offer_keys = t
                .offerings
                .iter()
                .map(|o| {
                    (
                        OfferKeys::intern(&mut offer_keys.zones, &o.zone),
                        OfferKeys::intern(&mut offer_keys.capacity_types, &o.capacity_type),
                    )
                })
                .collect();
        }
        for t in &mut types {
            t.offer_cells = t
                .offer_keys
                .iter()
                .filter_map(|(z, c)| offer_keys.cell(*z, *c))
                .fold(0, |m, b| m | b);
            let mut order: Vec<u16> = (0..t.offerings.len() as u16).collect();
            order.sort_by(|a, b| {
                let (a, b) = (&t.offerings[*a as usize], &t.offerings[*b as usize]);
                a.price.total_cmp(&b.price).then_with(|| a.zone.cmp(&b.zone))
            });
            t.by_price = order;
        }
        (types, offer_keys)
    }
}

impl Compiled {
    /// Names of the existing nodes and in-flight claims, in solve order.
    pub fn existing_names(&self) -> impl Iterator<Item = &str> {
        self.existing.iter().map(|e| e.name.as_str())
    }

    /// A committed new claim as an in-flight entry: the room of its smallest
    /// option, the capacity of its largest, its pods' requests used.
    fn in_flight_entry(&self, pi: usize, c: &super::NewNodeClaim) -> Existing {
        let options: Vec<&TypeModel> = self.pools[pi]
            .types
            .iter()
            .filter(|t| c.instance_type_options.contains(&t.name))
            .collect();
        let mut avail: Option<Vector> = None;
        let mut capacity = self.res.zero();
        for t in &options {
            let a = self.res.vector(&t.allocatable);
            avail = Some(match avail {
                None => a,
                Some(cur) => cur.iter().zip(&a).map(|(x, y)| *x.min(y)).collect(),
            });
            dense::max_into(&mut capacity, &t.capacity);
        }
        let mut labels = c.labels.clone();
        labels.insert(labels::HOSTNAME.to_string(), c.name.clone());
        labels.insert("metadata.name".to_string(), c.name.clone());
        Existing {
            name: c.name.clone(),
            kind: super::TargetKind::NodeClaim,
            hostname: c.name.clone(),
            labels,
            taints: c.taints.clone(),
            avail: avail.unwrap_or_else(|| self.res.vector(&c.allocatable)),
            capacity,
            used: self.res.vector(&c.requests),
            ports: Vec::new(),
            cordoned: false,
            pool: Some(c.node_pool.clone()),
        }
    }

    /// Makes a what-if's placements permanent, so later solves start from
    /// them instead of placing the same pods again (consolidation takes
    /// hundreds of decisions per pass; solving each on top of all earlier
    /// ones would grow with every one): every moved pod of a node in
    /// `removed` now runs where `plan` put it, and each new claim becomes an
    /// in-flight entry holding its pods, with the room of its smallest
    /// option. The removed nodes keep only their unmovable pods and are
    /// retired: later solves treat them as removed without naming them.
    pub(crate) fn commit(&mut self, plan: &super::Plan, removed: &BTreeSet<String>) {
        let gone: std::collections::HashSet<usize> = removed
            .iter()
            .filter_map(|n| self.existing_index.get(n))
            .flatten()
            .copied()
            .collect();
        for &i in &gone {
            if std::mem::replace(&mut self.retired[i], true) {
                continue;
            }
            if let Some(pi) = self.existing_pool[i] {
                dense::sub(&mut self.pool_used[pi], &self.existing[i].capacity);
                self.pool_nodes[pi] -= 1;
            }
            for &ri in self.placed.on.get(i).into_iter().flatten() {
                for kv in self.topology_labels.values_mut() {
                    kv.count(self.running[ri].label_class, i, false);
                }
            }
        }
        let by_pod: HashMap<PodRef, usize> = gone
            .iter()
            .filter_map(|&n| self.placed.on.get(n))
            .flatten()
            .map(|&i| (&self.running[i], i))
            .filter(|(r, _)| r.movable)
            .map(|(r, i)| (r.pod.clone(), i))
            .collect();
        for c in &plan.node_claims {
            let Some(pi) = self.pools.iter().position(|p| p.name == c.node_pool) else {
                continue;
            };
            let e = self.in_flight_entry(pi, c);
            dense::add(&mut self.pool_used[pi], &e.capacity);
            self.pool_nodes[pi] += 1;
            self.existing_index
                .entry(c.name.clone())
                .or_default()
                .push(self.existing.len());
            self.hosts.push(&e.hostname);
            for (k, kv) in &mut self.topology_labels {
                kv.push(e.labels.get(k));
            }
            self.existing.push(e);
            self.existing_pool.push(Some(pi));
            self.retired.push(false);
            let t = self.existing.len() - 1;
            for p in &c.pods {
                if let Some(&ri) = by_pod.get(p) {
                    self.relocate(ri, t);
                    let r = &self.running[ri];
                    self.existing[t].ports.extend(r.model.host_ports.iter().cloned());
                }
            }
        }
        for placement in &plan.existing {
            let Some(&t) = self.existing_index.get(&placement.name).and_then(|v| v.last()) else {
                continue;
            };
            for p in &placement.pods {
                if let Some(&ri) = by_pod.get(p) {
                    self.relocate(ri, t);
                    let r = &self.running[ri];
                    let e = &mut self.existing[t];
                    dense::add(&mut e.used, &self.res.vector(&r.model.requests));
                    e.ports.extend(r.model.host_ports.iter().cloned());
                }
            }
        }
    }

    /// Running pod `ri` now runs on entry `to`, in every index and count.
    fn relocate(&mut self, ri: usize, to: usize) {
        let r = &mut self.running[ri];
        let from = std::mem::replace(&mut r.node, to);
        self.placed.relocate(ri, from, to);
        for kv in self.topology_labels.values_mut() {
            if !self.retired[from] {
                kv.count(r.label_class, from, false);
            }
            kv.count(r.label_class, to, true);
        }
    }

    /// Turns the pending pods `plan` placed on existing nodes and in-flight
    /// claims into pods running there, and forgets every pending pod: later
    /// what-ifs keep that room taken and never place pending pods themselves.
    /// The held pods never move (they are nobody's to evict). Disruption uses
    /// it so a decision never takes room the pending pods were given.
    pub(crate) fn hold_pending(&mut self, plan: &super::Plan) {
        let models: HashMap<&PodRef, (&PodModel, &Vec<Requirements>)> = self
            .pending
            .entries
            .iter()
            .map(|(p, shape)| {
                let (m, terms) = &self.pending.shapes[*shape];
                (p, (m, terms))
            })
            .collect();
        let mut held: Vec<(usize, PodRef, PodModel, Vec<Requirements>)> = Vec::new();
        for placement in &plan.existing {
            // A node and a claim may share a name: take the entry of the placement's kind.
            let Some(t) = self.existing_index.get(&placement.name).and_then(|v| {
                v.iter()
                    .rev()
                    .find(|i| self.existing[**i].kind == placement.kind)
                    .copied()
            }) else {
                continue;
            };
            for p in &placement.pods {
                if let Some((m, terms)) = models.get(p) {
                    held.push((t, p.clone(), (*m).clone(), (*terms).clone()));
                }
            }
        }
        for (t, pod, model, terms) in held {
            let e = &mut self.existing[t];
            dense::add(&mut e.used, &self.res.vector(&model.requests));
            e.ports.extend(model.host_ports.iter().cloned());
            let class = (pod.namespace.clone(), model.labels.clone());
            let label_class = match self.label_classes.iter().position(|c| *c == class) {
                Some(i) => i,
                None => {
                    self.label_classes.push(class);
                    self.label_classes.len() - 1
                }
            };
            let r = Running {
                node: t,
                pod,
                model: Arc::new(model),
                terms: Arc::new(Ok(terms)),
                movable: false,
                label_class,
            };
            self.placed.add(self.running.len(), &r);
            for kv in self.topology_labels.values_mut() {
                kv.count(r.label_class, t, true);
            }
            self.running.push(r);
        }
        self.pending = Shapes::default();
        self.invalid.clear();
    }

    /// What an existing entry's pods use (after commits: a committed claim's
    /// planned requests plus the pods placed on it since).
    pub(crate) fn used_by(&self, name: &str) -> Option<crate::resources::Resources> {
        self.existing
            .iter()
            .find(|e| e.name == name)
            .map(|e| self.res.resources(&e.used))
    }
}

/// One instance type as a pool can use it, or `None` when the pool's
/// requirements or the usable offerings rule it out.
fn type_model(
    it: &InstanceType,
    pool_reqs: &Requirements,
    (unavailable, shifted): (&BTreeSet<(&str, &str, &str)>, &BTreeSet<String>),
    res: &ResourceTable,
    daemons: &[&Daemon],
) -> Option<TypeModel> {
    let wanted = OfferingRequirements::of(pool_reqs);
    let offerings: Vec<Offering> = it
        .offerings
        .iter()
        .filter(|o| {
            o.available
                && !shifted.contains(&o.zone)
                && !unavailable.contains(&(it.name.as_str(), o.zone.as_str(), o.capacity_type.as_str()))
        })
        .filter(|o| wanted.allow(o))
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
        offer_keys: Vec::new(),
        offer_cells: 0,
        by_price: Vec::new(),
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

/// A running pod's shared model and node terms ([`Running`]).
type RunningShape = (Arc<PodModel>, Arc<Result<Vec<Requirements>, String>>);

/// Everything about a running pod but its name, its volumes included (its
/// node terms fold in their topology): equal keys share one model.
#[derive(Hash, PartialEq, Eq)]
struct RunningKey {
    shape: ShapeKey,
    claims: Vec<String>,
    ephemeral_classes: Vec<Option<String>>,
}

impl RunningKey {
    fn of(m: &PodModel) -> Self {
        RunningKey {
            shape: ShapeKey::of(m, &m.node_terms),
            claims: m.claims.clone(),
            ephemeral_classes: m.ephemeral_classes.clone(),
        }
    }
}

/// Everything about a pod but its name: equal keys share a compiled shape.
#[derive(Debug, Clone, Hash, PartialEq, Eq)]
struct ShapeKey {
    namespace: String,
    labels: BTreeMap<String, String>,
    requests: Vec<(String, i64)>,
    terms: Vec<Requirements>,
    preferred: Vec<(i32, Requirements)>,
    tolerations: Vec<Toleration>,
    spreads: Vec<Spread>,
    affinity: Vec<PodTerm>,
    anti_affinity: Vec<PodTerm>,
    preferred_affinity: Vec<(i32, PodTerm)>,
    preferred_anti_affinity: Vec<(i32, PodTerm)>,
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
