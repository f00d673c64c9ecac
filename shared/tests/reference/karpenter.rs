//! A reimplementation of Karpenter v1's provisioning scheduler, the thing
//! nodesmith's solver claims to beat on cost. It follows Karpenter's
//! documented behaviour and its source's algorithm, built only on nodesmith's
//! public data types (requirements, resources, catalog), so that it shares no
//! decision with the solver it measures:
//!
//! - pods are queued by CPU, then memory, descending (then by name); a pod
//!   that fails goes to the back, and the queue ends after a full cycle with
//!   no progress;
//! - each pod tries the existing nodes in order, then the in-flight claims
//!   ordered by fewest pods, then a new claim from each pool by descending
//!   weight;
//! - a claim keeps every instance type that is compatible with its narrowed
//!   requirements, fits its pods plus the pool's DaemonSet overhead and has an
//!   available offering; its options narrow as pods are added;
//! - topology: a spread picks the compatible domain with the lowest count that
//!   keeps the skew, affinity the domains holding matching pods (any one domain
//!   for the first self-selecting pod), anti-affinity the empty domains; a
//!   placement is counted in a domain only once the claim is pinned to one
//!   (anti-affinity blocks every domain the claim may still take);
//! - a pool's limits are reserved with the largest option's capacity when a
//!   claim opens, and types that would exceed what is left are not offered;
//! - at the end each claim is priced at its cheapest available offering,
//!   spot before on-demand when both are allowed.
//!
//! Not modelled (the generated clusters that use it avoid them): preferred
//! terms and their relaxation, `minDomains`, `matchLabelKeys`, volumes, host
//! ports, minValues, reserved capacity.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Pod, PodSpec, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use nodesmith::apis::{Taint, TaintEffect};
use nodesmith::catalog::{InstanceType, Offering, OfferingRequirements};
use nodesmith::labels;
use nodesmith::quantity::Quantity;
use nodesmith::requirements::{Operator, Requirement, Requirements};
use nodesmith::resources::Resources;
use nodesmith::scheduling::{Plan, SolveInput};

/// A node of a plan, new or existing, as the checks see it.
#[derive(Debug, Clone)]
pub struct PlannedNode {
    /// Node or claim name (also its hostname).
    pub name: String,
    /// The pool, for new nodes.
    pub pool: Option<String>,
    /// What the node may still be: its labels as requirements for existing
    /// nodes, the narrowed requirements for new ones.
    pub requirements: Requirements,
    /// Its zone, once launched at the priced offering.
    pub zone: String,
    /// Taints pods must tolerate.
    pub taints: Vec<Taint>,
    /// Instance types it may be launched as (empty for existing nodes).
    pub options: Vec<String>,
    /// Pending pods placed on it, as `namespace/name`.
    pub pods: Vec<String>,
    /// Hourly price (0 for existing nodes).
    pub price: f64,
}

/// A whole plan as the checks see it.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// New nodes then existing nodes with the pods placed on them.
    pub nodes: Vec<PlannedNode>,
    /// Pods left pending.
    pub unschedulable: Vec<String>,
}

impl Outcome {
    /// The hourly price of the new nodes.
    pub fn cost(&self) -> f64 {
        self.nodes.iter().map(|n| n.price).sum()
    }

    /// The outcome of nodesmith's plan.
    pub fn of_plan(input: &SolveInput, plan: &Plan) -> Outcome {
        let mut nodes: Vec<PlannedNode> = plan
            .node_claims
            .iter()
            .map(|c| {
                let mut requirements = c.requirements.clone();
                requirements.add(Requirement::in_values(labels::HOSTNAME, &[&c.name]));
                PlannedNode {
                    name: c.name.clone(),
                    pool: Some(c.node_pool.clone()),
                    requirements,
                    zone: c.zone.clone(),
                    taints: c.taints.clone(),
                    options: c.instance_type_options.clone(),
                    pods: c.pods.iter().map(|p| format!("{}/{}", p.namespace, p.name)).collect(),
                    price: c.price,
                }
            })
            .collect();
        for n in input.nodes {
            let name = n.node.metadata.name.clone().unwrap_or_default();
            let placed = plan.existing.iter().find(|e| e.name == name);
            let mut node = existing_node(n);
            node.pods = placed
                .map(|e| e.pods.iter().map(|p| format!("{}/{}", p.namespace, p.name)).collect())
                .unwrap_or_default();
            nodes.push(node);
        }
        Outcome {
            nodes,
            unschedulable: plan
                .unschedulable
                .iter()
                .map(|u| format!("{}/{}", u.pod.namespace, u.pod.name))
                .collect(),
        }
    }
}

fn existing_node(n: &nodesmith::scheduling::ExistingNode) -> PlannedNode {
    let node_labels = n.node.metadata.labels.clone().unwrap_or_default();
    PlannedNode {
        name: n.node.metadata.name.clone().unwrap_or_default(),
        pool: None,
        requirements: Requirements::from_labels(&node_labels),
        zone: node_labels.get(labels::ZONE).cloned().unwrap_or_default(),
        taints: node_taints(n),
        options: Vec::new(),
        pods: Vec::new(),
        price: 0.0,
    }
}

fn node_taints(n: &nodesmith::scheduling::ExistingNode) -> Vec<Taint> {
    let taints = n.node.spec.as_ref().and_then(|s| s.taints.as_ref());
    taints.into_iter().flatten().filter_map(Taint::from_k8s).collect()
}

// ---------------------------------------------------------------------------
// Pods

/// What the scheduler needs of a pod.
#[derive(Debug, Clone)]
pub struct PodData {
    /// `namespace/name`.
    pub key: String,
    /// Its namespace.
    pub namespace: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Requests (with `pods: 1`).
    pub requests: Resources,
    /// nodeSelector and the first required node affinity term.
    pub requirements: Requirements,
    /// Its tolerations.
    pub tolerations: Vec<Toleration>,
    /// Its required topology terms.
    pub terms: Vec<Term>,
}

/// A required topology term of a pod.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Term {
    /// Spread, affinity or anti-affinity.
    pub kind: TermKind,
    /// The topology key.
    pub key: String,
    /// The selected pods' labels (`matchLabels` and `In` expressions).
    pub selector: BTreeMap<String, BTreeSet<String>>,
    /// The namespace the selector applies in.
    pub namespace: String,
}

/// The kind of a topology term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TermKind {
    /// A DoNotSchedule topology spread with this maxSkew.
    Spread(i32),
    /// Required pod affinity.
    Affinity,
    /// Required pod anti-affinity.
    AntiAffinity,
}

impl Term {
    /// True when the term's selector picks the pod.
    pub fn selects(&self, p: &PodData) -> bool {
        p.namespace == self.namespace
            && self
                .selector
                .iter()
                .all(|(k, vs)| p.labels.get(k).is_some_and(|v| vs.contains(v)))
    }
}

fn selector(s: Option<&LabelSelector>) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let Some(s) = s else { return out };
    for (k, v) in s.match_labels.iter().flatten() {
        out.entry(k.clone()).or_default().insert(v.clone());
    }
    for e in s.match_expressions.iter().flatten() {
        assert_eq!(e.operator, "In", "the reference models In selector expressions only");
        out.entry(e.key.clone())
            .or_default()
            .extend(e.values.iter().flatten().cloned());
    }
    out
}

fn requests_of(spec: &PodSpec) -> Resources {
    let sum = |rs: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>| {
        let mut r = Resources::new();
        for (k, q) in rs.into_iter().flatten() {
            r.set(k, Quantity::parse(&q.0).expect("quantity"));
        }
        r
    };
    let mut total = Resources::new();
    for c in &spec.containers {
        total.add(&sum(c.resources.as_ref().and_then(|r| r.requests.as_ref())));
    }
    for c in spec.init_containers.iter().flatten() {
        total = total.max(&sum(c.resources.as_ref().and_then(|r| r.requests.as_ref())));
    }
    total.set("pods", Quantity::from_units(1));
    total
}

fn node_requirements(spec: &PodSpec) -> Requirements {
    let mut r = Requirements::new();
    for (k, v) in spec.node_selector.iter().flatten() {
        r.add(Requirement::in_values(k, &[v]));
    }
    let terms = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref())
        .map(|s| s.node_selector_terms.clone())
        .unwrap_or_default();
    // Karpenter uses the first term and relaxes to the next on failure.
    if let Some(t) = terms.first() {
        for e in t.match_expressions.iter().flatten() {
            let op: Operator = serde_json::from_value(serde_json::json!(e.operator)).expect("operator");
            r.add(Requirement::new(&e.key, op, e.values.as_deref().unwrap_or_default()).expect("requirement"));
        }
    }
    r
}

/// A pod's scheduling data.
pub fn pod_data(p: &Pod) -> PodData {
    let spec = p.spec.clone().unwrap_or_default();
    let namespace = p.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    let mut terms = Vec::new();
    for c in spec.topology_spread_constraints.iter().flatten() {
        if c.when_unsatisfiable == "DoNotSchedule" {
            terms.push(Term {
                kind: TermKind::Spread(c.max_skew),
                key: c.topology_key.clone(),
                selector: selector(c.label_selector.as_ref()),
                namespace: namespace.clone(),
            });
        }
    }
    let aff = spec.affinity.as_ref();
    let required = |kind: TermKind, ts: Option<&Vec<k8s_openapi::api::core::v1::PodAffinityTerm>>| {
        ts.into_iter()
            .flatten()
            .map(|t| Term {
                kind,
                key: t.topology_key.clone(),
                selector: selector(t.label_selector.as_ref()),
                namespace: namespace.clone(),
            })
            .collect::<Vec<_>>()
    };
    terms.extend(required(
        TermKind::Affinity,
        aff.and_then(|a| a.pod_affinity.as_ref())
            .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref()),
    ));
    terms.extend(required(
        TermKind::AntiAffinity,
        aff.and_then(|a| a.pod_anti_affinity.as_ref())
            .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref()),
    ));
    PodData {
        key: format!("{namespace}/{}", p.metadata.name.clone().unwrap_or_default()),
        namespace,
        labels: p.metadata.labels.clone().unwrap_or_default(),
        requests: requests_of(&spec),
        requirements: node_requirements(&spec),
        tolerations: spec.tolerations.clone().unwrap_or_default(),
        terms,
    }
}

/// True when the tolerations tolerate every NoSchedule and NoExecute taint.
pub fn tolerates(tolerations: &[Toleration], taints: &[Taint]) -> bool {
    taints
        .iter()
        .filter(|t| t.effect != TaintEffect::PreferNoSchedule)
        .all(|t| {
            tolerations.iter().any(|o| {
                let effect_ok = o
                    .effect
                    .as_deref()
                    .is_none_or(|e| e.is_empty() || e == format!("{:?}", t.effect));
                let exists = o.operator.as_deref() == Some("Exists");
                let key_ok = match o.key.as_deref() {
                    None | Some("") => exists,
                    Some(k) => k == t.key,
                };
                let value_ok =
                    exists || o.value.as_deref().unwrap_or_default() == t.value.as_deref().unwrap_or_default();
                effect_ok && key_ok && value_ok
            })
        })
}

// ---------------------------------------------------------------------------
// Topology

/// One topology group: the pods a term selects, counted per domain.
#[derive(Debug, Clone)]
struct Group {
    term: Term,
    counts: BTreeMap<String, i32>,
}

impl Group {
    fn min_count(&self, pod_domains: &Requirement) -> i32 {
        if self.term.key == labels::HOSTNAME {
            return 0;
        }
        self.counts
            .iter()
            .filter(|(d, _)| pod_domains.has(d))
            .map(|(_, c)| *c)
            .min()
            .unwrap_or(0)
    }

    /// The domains a pod owning this term may go to on a node allowing `node_domains`.
    fn next_domains(&self, p: &PodData, pod_domains: &Requirement, node_domains: &Requirement) -> Vec<String> {
        let in_node = |d: &String| node_domains.has(d) && pod_domains.has(d);
        match self.term.kind {
            TermKind::Spread(max_skew) => {
                let min = self.min_count(pod_domains);
                let own = i32::from(self.term.selects(p));
                let mut best: Option<(i32, &String)> = None;
                for (d, c) in self.counts.iter().filter(|(d, _)| node_domains.has(d)) {
                    let count = c + own;
                    if count - min <= max_skew && best.is_none_or(|(b, _)| count < b) {
                        best = Some((count, d));
                    }
                }
                best.map(|(_, d)| vec![d.clone()]).unwrap_or_default()
            }
            TermKind::Affinity => {
                let held: Vec<String> = self
                    .counts
                    .iter()
                    .filter(|(d, c)| **c > 0 && pod_domains.has(d))
                    .map(|(d, _)| d.clone())
                    .collect();
                if !held.is_empty() || !self.term.selects(p) {
                    return held;
                }
                // The first self-selecting pod bootstraps one domain.
                self.counts
                    .keys()
                    .find(|d| in_node(d))
                    .or_else(|| self.counts.keys().find(|d| pod_domains.has(d)))
                    .map(|d| vec![d.clone()])
                    .unwrap_or_default()
            }
            TermKind::AntiAffinity => self
                .counts
                .iter()
                .filter(|(d, c)| **c == 0 && in_node(d))
                .map(|(d, _)| d.clone())
                .collect(),
        }
    }
}

#[derive(Debug, Clone, Default)]
struct Topology {
    groups: Vec<Group>,
    /// Per anti-affinity group, the domains its owners hold (the inverse check).
    owners: Vec<BTreeSet<String>>,
    /// Every value seen per topology key.
    universe: BTreeMap<String, BTreeSet<String>>,
}

impl Topology {
    fn group(&mut self, term: &Term) -> usize {
        if let Some(i) = self.groups.iter().position(|g| &g.term == term) {
            return i;
        }
        let counts = self
            .universe
            .get(&term.key)
            .map(|u| u.iter().map(|d| (d.clone(), 0)).collect())
            .unwrap_or_default();
        self.groups.push(Group {
            term: term.clone(),
            counts,
        });
        self.owners.push(BTreeSet::new());
        self.groups.len() - 1
    }

    fn register(&mut self, key: &str, domain: &str) {
        self.universe.entry(key.into()).or_default().insert(domain.into());
        for g in self.groups.iter_mut().filter(|g| g.term.key == key) {
            g.counts.entry(domain.into()).or_insert(0);
        }
    }

    /// The requirements the pod's terms add on a node that may be `node`,
    /// or `None` when some term leaves no domain.
    fn add_requirements(&self, p: &PodData, node: &Requirements) -> Option<Requirements> {
        let mut out = Requirements::new();
        let domains =
            |reqs: &Requirements, key: &str| reqs.get(key).cloned().unwrap_or_else(|| Requirement::exists(key));
        for t in &p.terms {
            let g = self.groups.iter().find(|g| &g.term == t)?;
            let pod_domains = domains(&p.requirements, &t.key);
            let node_domains = domains(node, &t.key);
            let next = g.next_domains(p, &pod_domains, &node_domains);
            if next.is_empty() {
                return None;
            }
            let r = Requirement::in_values(&t.key, &next);
            match out.get(&t.key) {
                Some(prev) => {
                    let both = prev.intersection(&r);
                    if both.is_empty() {
                        return None;
                    }
                    out.add(both);
                }
                None => out.add(r),
            }
        }
        // Inverse anti-affinity: pods already placed keep selected pods out
        // of their domains.
        for (g, held) in self.groups.iter().zip(&self.owners) {
            if g.term.kind != TermKind::AntiAffinity || held.is_empty() || !g.term.selects(p) {
                continue;
            }
            let node_domains = domains(node, &g.term.key);
            let allowed: Vec<String> = self
                .universe
                .get(&g.term.key)
                .into_iter()
                .flatten()
                .filter(|d| node_domains.has(d) && !held.contains(*d))
                .cloned()
                .collect();
            if allowed.is_empty() {
                return None;
            }
            let r = Requirement::in_values(&g.term.key, &allowed);
            let both = out.get(&g.term.key).map_or(r.clone(), |prev| prev.intersection(&r));
            if both.is_empty() {
                return None;
            }
            out.add(both);
        }
        Some(out)
    }

    /// Counts a pod placed on a node that may be `node`.
    fn record(&mut self, p: &PodData, node: &Requirements) {
        for (g, held) in self.groups.iter_mut().zip(self.owners.iter_mut()) {
            let values: Vec<String> = match node.get(&g.term.key) {
                Some(r) if !r.complement => r.values.iter().cloned().collect(),
                _ => Vec::new(),
            };
            if g.term.selects(p) {
                if g.term.kind == TermKind::AntiAffinity {
                    for v in &values {
                        *g.counts.entry(v.clone()).or_insert(0) += 1;
                    }
                } else if let [v] = values.as_slice() {
                    *g.counts.entry(v.clone()).or_insert(0) += 1;
                }
            }
            if g.term.kind == TermKind::AntiAffinity && p.terms.contains(&g.term) {
                held.extend(values);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The scheduler

struct Template {
    pool: String,
    weight: i32,
    requirements: Requirements,
    taints: Vec<Taint>,
    daemon: Resources,
    types: Vec<InstanceType>,
    remaining: Option<Resources>,
}

struct Claim {
    template: usize,
    hostname: String,
    requirements: Requirements,
    options: Vec<usize>,
    requests: Resources,
    pods: Vec<String>,
    /// The largest allocatable among the options: a pod that does not fit
    /// in it fits no option (a shortcut only; the full filter decides).
    largest: Resources,
}

struct Existing {
    requirements: Requirements,
    taints: Vec<Taint>,
    available: Resources,
    pods: Vec<String>,
}

fn has_offering(t: &InstanceType, reqs: &Requirements) -> bool {
    let wanted = OfferingRequirements::of(reqs);
    t.offerings.iter().any(|o| o.available && wanted.allow(o))
}

fn keep_type(t: &InstanceType, reqs: &Requirements, requests: &Resources) -> bool {
    t.requirements.intersects(reqs).is_ok() && requests.fits_in(&t.allocatable) && has_offering(t, reqs)
}

fn daemon_overhead(input: &SolveInput, reqs: &Requirements, taints: &[Taint]) -> Resources {
    let mut total = Resources::new();
    for ds in input.daemon_sets {
        let Some(spec) = ds.spec.as_ref().and_then(|s| s.template.spec.as_ref()) else {
            continue;
        };
        let pod = Pod {
            spec: Some(spec.clone()),
            ..Pod::default()
        };
        let d = pod_data(&pod);
        if tolerates(&d.tolerations, taints) && reqs.compatible(&d.requirements, true).is_ok() {
            let mut r = d.requests.clone();
            r.set("pods", Quantity::from_units(1));
            total.add(&r);
        }
    }
    total
}

fn templates(input: &SolveInput) -> Vec<Template> {
    let mut out: Vec<Template> = input
        .node_pools
        .iter()
        .map(|pool| {
            let requirements = pool.requirements().expect("pool requirements");
            let taints = pool.spec.template.spec.taints.clone();
            let class = input
                .node_classes
                .iter()
                .find(|c| c.metadata.name.as_deref() == Some(pool.spec.template.spec.node_class_ref.name.as_str()));
            let kubelet = class.and_then(|c| c.spec.kubelet.as_ref());
            let daemon = daemon_overhead(input, &requirements, &taints);
            let types = input
                .catalog
                .resolve(kubelet)
                .into_iter()
                .filter(|t| keep_type(t, &requirements, &daemon))
                .collect();
            let remaining = (!pool.spec.limits.is_empty()).then(|| {
                let mut r = Resources::from_pairs(pool.spec.limits.iter().map(|(k, v)| (k.as_str(), *v)));
                for n in input.nodes {
                    let l = n.node.metadata.labels.clone().unwrap_or_default();
                    if l.get(labels::NODEPOOL).map(String::as_str) == Some(pool.name()) {
                        let cap = n.node.status.as_ref().and_then(|s| s.capacity.as_ref());
                        // Only the limited resources are counted down.
                        for (k, q) in cap
                            .into_iter()
                            .flatten()
                            .filter(|(k, _)| pool.spec.limits.contains_key(*k))
                        {
                            let used = Quantity::parse(&q.0).expect("quantity");
                            r.set(k, Quantity::from_milli(r.get(k).milli() - used.milli()));
                        }
                    }
                }
                r
            });
            Template {
                pool: pool.name().to_string(),
                weight: pool.weight(),
                requirements,
                taints,
                daemon,
                types,
                remaining,
            }
        })
        .collect();
    out.sort_by(|a, b| b.weight.cmp(&a.weight).then_with(|| a.pool.cmp(&b.pool)));
    out
}

fn largest_allocatable(tpl: &Template, options: &[usize]) -> Resources {
    options
        .iter()
        .fold(Resources::new(), |acc, i| acc.max(&tpl.types[*i].allocatable))
}

fn within(capacity: &Resources, remaining: &Resources) -> bool {
    remaining.0.iter().all(|(k, q)| capacity.get(k).milli() <= q.milli())
}

fn subtract_max(remaining: &mut Resources, types: &[&InstanceType]) {
    let mut largest = Resources::new();
    for t in types {
        largest = largest.max(&t.capacity);
    }
    let keys: Vec<String> = remaining.0.keys().cloned().collect();
    for k in keys {
        let left = remaining.get(&k).milli() - largest.get(&k).milli();
        remaining.set(&k, Quantity::from_milli(left));
    }
}

struct Scheduler {
    templates: Vec<Template>,
    claims: Vec<Claim>,
    existing: Vec<Existing>,
    topology: Topology,
}

impl Scheduler {
    fn add(&mut self, p: &PodData) -> bool {
        for e in 0..self.existing.len() {
            if self.add_existing(e, p) {
                return true;
            }
        }
        // Fewest pods first; Karpenter's sort is unstable, a stable one
        // keeps the reference deterministic.
        let mut order: Vec<usize> = (0..self.claims.len()).collect();
        order.sort_by_key(|c| self.claims[*c].pods.len());
        for c in order {
            if self.add_claim(c, p) {
                return true;
            }
        }
        for t in 0..self.templates.len() {
            let tpl = &self.templates[t];
            let options: Vec<usize> = (0..tpl.types.len())
                .filter(|i| {
                    tpl.remaining
                        .as_ref()
                        .is_none_or(|r| within(&tpl.types[*i].capacity, r))
                })
                .collect();
            if options.is_empty() {
                continue;
            }
            let hostname = format!("reference-{}", self.claims.len());
            let mut requirements = tpl.requirements.clone();
            requirements.add(Requirement::in_values(labels::HOSTNAME, &[&hostname]));
            self.topology.register(labels::HOSTNAME, &hostname);
            let largest = largest_allocatable(tpl, &options);
            self.claims.push(Claim {
                template: t,
                hostname,
                requirements,
                options,
                requests: tpl.daemon.clone(),
                pods: Vec::new(),
                largest,
            });
            let c = self.claims.len() - 1;
            if self.add_claim(c, p) {
                let tpl = &mut self.templates[t];
                if let Some(r) = tpl.remaining.as_mut() {
                    let opts: Vec<&InstanceType> = self.claims[c].options.iter().map(|i| &tpl.types[*i]).collect();
                    subtract_max(r, &opts);
                }
                return true;
            }
            self.claims.pop();
        }
        false
    }

    fn add_existing(&mut self, e: usize, p: &PodData) -> bool {
        let ex = &self.existing[e];
        if !tolerates(&p.tolerations, &ex.taints)
            || ex.requirements.compatible(&p.requirements, false).is_err()
            || !p.requests.fits_in(&ex.available)
        {
            return false;
        }
        let Some(topo) = self.topology.add_requirements(p, &ex.requirements) else {
            return false;
        };
        if ex.requirements.compatible(&topo, false).is_err() {
            return false;
        }
        let ex = &mut self.existing[e];
        ex.available = ex.available.minus(&p.requests);
        ex.pods.push(p.key.clone());
        let reqs = ex.requirements.clone();
        self.topology.record(p, &reqs);
        true
    }

    fn add_claim(&mut self, c: usize, p: &PodData) -> bool {
        let claim = &self.claims[c];
        let tpl = &self.templates[claim.template];
        if !claim.requests.plus(&p.requests).fits_in(&claim.largest)
            || !tolerates(&p.tolerations, &tpl.taints)
            || claim.requirements.compatible(&p.requirements, true).is_err()
        {
            return false;
        }
        let mut reqs = claim.requirements.clone();
        reqs.add_all(&p.requirements);
        let Some(topo) = self.topology.add_requirements(p, &reqs) else {
            return false;
        };
        if reqs.compatible(&topo, true).is_err() {
            return false;
        }
        reqs.add_all(&topo);
        let requests = claim.requests.plus(&p.requests);
        let options: Vec<usize> = claim
            .options
            .iter()
            .copied()
            .filter(|i| keep_type(&tpl.types[*i], &reqs, &requests))
            .collect();
        if options.is_empty() {
            return false;
        }
        let largest = largest_allocatable(tpl, &options);
        let claim = &mut self.claims[c];
        claim.largest = largest;
        claim.options = options;
        claim.requests = requests;
        claim.requirements = reqs.clone();
        claim.pods.push(p.key.clone());
        self.topology.record(p, &reqs);
        true
    }

    /// The claim's cheapest offering among its options: spot when the claim
    /// allows spot and any option offers it, else on-demand.
    fn price(&self, c: &Claim) -> Option<Offering> {
        let tpl = &self.templates[c.template];
        let wanted = OfferingRequirements::of(&c.requirements);
        let offers: Vec<(&str, &Offering)> = c
            .options
            .iter()
            .flat_map(|i| {
                tpl.types[*i]
                    .offerings
                    .iter()
                    .map(move |o| (tpl.types[*i].name.as_str(), o))
            })
            .filter(|(_, o)| o.available && wanted.allow(o))
            .collect();
        let cheapest = |ct: &str| {
            offers
                .iter()
                .filter(|(_, o)| o.capacity_type == ct)
                .min_by(|a, b| a.1.price.total_cmp(&b.1.price).then_with(|| a.0.cmp(b.0)))
                .map(|(_, o)| (*o).clone())
        };
        cheapest(labels::CAPACITY_SPOT).or_else(|| cheapest(labels::CAPACITY_ON_DEMAND))
    }
}

/// Karpenter's plan for the input's pending pods.
pub fn schedule(input: &SolveInput) -> Outcome {
    let mut pods: Vec<PodData> = input.pods.iter().map(pod_data).collect();
    let cpu = |p: &PodData| p.requests.get("cpu").milli();
    let mem = |p: &PodData| p.requests.get("memory").milli();
    pods.sort_by(|a, b| {
        cpu(b)
            .cmp(&cpu(a))
            .then_with(|| mem(b).cmp(&mem(a)))
            .then_with(|| a.key.cmp(&b.key))
    });
    let templates = templates(input);
    let mut topology = Topology::default();
    for t in &templates {
        for it in &t.types {
            for o in it.offerings.iter().filter(|o| o.available) {
                if t.requirements.get(labels::ZONE).is_none_or(|z| z.has(&o.zone)) {
                    topology.register(labels::ZONE, &o.zone);
                }
            }
        }
        for r in t.requirements.iter().filter(|r| !r.complement) {
            for v in &r.values {
                topology.register(&r.key, v);
            }
        }
    }
    let mut existing = Vec::new();
    let mut running: Vec<(PodData, Requirements)> = Vec::new();
    for n in input.nodes {
        let node = existing_node(n);
        for (k, v) in n.node.metadata.labels.iter().flatten() {
            topology.register(k, v);
        }
        let alloc = n.node.status.as_ref().and_then(|s| s.allocatable.as_ref());
        let mut available = Resources::new();
        for (k, q) in alloc.into_iter().flatten() {
            available.set(k, Quantity::parse(&q.0).expect("quantity"));
        }
        for p in &n.pods {
            let d = pod_data(p);
            available = available.minus(&d.requests);
            running.push((d, node.requirements.clone()));
        }
        existing.push(Existing {
            requirements: node.requirements,
            taints: node.taints,
            available,
            pods: Vec::new(),
        });
    }
    for p in pods.iter().chain(running.iter().map(|(p, _)| p)) {
        for t in &p.terms {
            topology.group(t);
        }
    }
    for (p, reqs) in &running {
        topology.record(p, reqs);
    }
    let mut s = Scheduler {
        templates,
        claims: Vec::new(),
        existing,
        topology,
    };
    let mut queue: std::collections::VecDeque<usize> = (0..pods.len()).collect();
    let mut failed_since_progress = 0usize;
    let mut unschedulable = Vec::new();
    while let Some(i) = queue.pop_front() {
        if s.add(&pods[i]) {
            failed_since_progress = 0;
            continue;
        }
        failed_since_progress += 1;
        if failed_since_progress > queue.len() {
            unschedulable.push(pods[i].key.clone());
            unschedulable.extend(queue.drain(..).map(|j| pods[j].key.clone()));
            break;
        }
        queue.push_back(i);
    }
    let mut nodes = Vec::new();
    for c in &s.claims {
        let tpl = &s.templates[c.template];
        let Some(offering) = s.price(c) else {
            unschedulable.extend(c.pods.iter().cloned());
            continue;
        };
        let mut options: Vec<(f64, String)> = c
            .options
            .iter()
            .map(|i| {
                let t = &tpl.types[*i];
                let p = t.cheapest_offering(&c.requirements).map_or(f64::INFINITY, |o| o.price);
                (p, t.name.clone())
            })
            .collect();
        options.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
        let mut requirements = c.requirements.clone();
        requirements.add(Requirement::in_values(labels::ZONE, &[&offering.zone]));
        requirements.add(Requirement::in_values(
            labels::CAPACITY_TYPE,
            &[&offering.capacity_type],
        ));
        nodes.push(PlannedNode {
            name: c.hostname.clone(),
            pool: Some(tpl.pool.clone()),
            requirements,
            zone: offering.zone.clone(),
            taints: tpl.taints.clone(),
            options: options.into_iter().map(|(_, n)| n).collect(),
            pods: c.pods.clone(),
            price: offering.price,
        });
    }
    for (n, e) in input.nodes.iter().zip(s.existing) {
        let mut node = existing_node(n);
        node.pods = e.pods;
        nodes.push(node);
    }
    Outcome { nodes, unschedulable }
}

/// Per pool: its DaemonSet overhead and the allocatable of each instance type
/// it may launch (for the plan checks).
pub fn pool_capacity(input: &SolveInput) -> BTreeMap<String, (Resources, BTreeMap<String, Resources>)> {
    templates(input)
        .into_iter()
        .map(|t| {
            let alloc = t.types.into_iter().map(|it| (it.name, it.allocatable)).collect();
            (t.pool, (t.daemon, alloc))
        })
        .collect()
}

/// The zones of a pod's topology domains: those of existing nodes its node
/// requirements match (tainted or not, as `nodeTaintsPolicy: Ignore`), and
/// those a pool it tolerates could launch a node for it in.
pub fn reachable_zones(input: &SolveInput, reqs: &Requirements, tolerations: &[Toleration]) -> BTreeSet<String> {
    let mut out: BTreeSet<String> = input
        .nodes
        .iter()
        .map(existing_node)
        .filter(|n| n.requirements.compatible(reqs, false).is_ok())
        .map(|n| n.zone)
        .collect();
    for t in templates(input) {
        if !tolerates(tolerations, &t.taints) || t.requirements.compatible(reqs, true).is_err() {
            continue;
        }
        let mut both = t.requirements.clone();
        both.add_all(reqs);
        for it in t.types.iter().filter(|it| it.requirements.intersects(&both).is_ok()) {
            let wanted = OfferingRequirements::of(&both);
            out.extend(
                it.offerings
                    .iter()
                    .filter(|o| o.available && wanted.allow(o))
                    .map(|o| o.zone.clone()),
            );
        }
    }
    out
}
