//! A compact pod model built once from a Kubernetes `Pod`: effective requests,
//! node requirements, tolerations, topology terms, host ports and volume claims.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    NodeAffinity, NodeSelectorTerm, Pod, PodAffinityTerm, PodSpec, Toleration as K8sToleration,
    TopologySpreadConstraint, WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::apis::{Taint, TaintEffect};
use crate::labels;
use crate::quantity::Quantity;
use crate::requirements::{Operator, Requirement, Requirements};
use crate::resources::{self, Resources};

/// A pod's identity: `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct PodRef {
    /// The namespace.
    pub namespace: String,
    /// The name.
    pub name: String,
}

impl PodRef {
    /// The reference of a Kubernetes pod (namespace defaults to `default`).
    pub fn of(pod: &Pod) -> Self {
        PodRef {
            namespace: pod.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
            name: pod.metadata.name.clone().unwrap_or_default(),
        }
    }
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Why a pod's spec cannot be modelled: the field path and the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct PodError {
    /// Field path inside the pod, e.g. `spec.containers[0].resources.requests.cpu`.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl From<resources::FieldError> for PodError {
    fn from(e: resources::FieldError) -> Self {
        perr(e.path, e.source.to_string())
    }
}

fn perr(path: impl Into<String>, message: impl Into<String>) -> PodError {
    PodError {
        path: path.into(),
        message: message.into(),
    }
}

/// A label selector in normal form (hashable, so equal terms share a topology group).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Selector {
    /// `key In values` / `NotIn` / `Exists` / `DoesNotExist` expressions, sorted.
    pub exprs: Vec<(String, SelectorOp, Vec<String>)>,
    /// True for a missing selector, which matches nothing.
    pub nothing: bool,
}

/// A label selector operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SelectorOp {
    /// Value is one of.
    In,
    /// Value is none of (or absent).
    NotIn,
    /// Key present.
    Exists,
    /// Key absent.
    DoesNotExist,
}

impl Selector {
    /// Builds from a Kubernetes selector; `None` matches nothing, as for pod affinity terms.
    pub fn from_k8s(sel: Option<&LabelSelector>, path: &str) -> Result<Self, PodError> {
        let Some(sel) = sel else {
            return Ok(Selector {
                exprs: vec![],
                nothing: true,
            });
        };
        let mut exprs = Vec::new();
        for (k, v) in sel.match_labels.iter().flatten() {
            exprs.push((k.clone(), SelectorOp::In, vec![v.clone()]));
        }
        for (i, e) in sel.match_expressions.iter().flatten().enumerate() {
            let op = match e.operator.as_str() {
                "In" => SelectorOp::In,
                "NotIn" => SelectorOp::NotIn,
                "Exists" => SelectorOp::Exists,
                "DoesNotExist" => SelectorOp::DoesNotExist,
                o => {
                    return Err(perr(
                        format!("{path}.matchExpressions[{i}].operator"),
                        format!("unknown operator {o:?}"),
                    ));
                }
            };
            let mut values = e.values.clone().unwrap_or_default();
            values.sort();
            exprs.push((e.key.clone(), op, values));
        }
        exprs.sort();
        Ok(Selector { exprs, nothing: false })
    }

    /// Adds `key In [value]` (matchLabelKeys).
    pub fn with_label(mut self, key: &str, value: &str) -> Self {
        self.exprs
            .push((key.to_string(), SelectorOp::In, vec![value.to_string()]));
        self.exprs.sort();
        self
    }

    /// True when the labels satisfy every expression.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        !self.nothing
            && self.exprs.iter().all(|(k, op, vals)| match op {
                SelectorOp::In => labels.get(k).is_some_and(|v| vals.contains(v)),
                SelectorOp::NotIn => labels.get(k).is_none_or(|v| !vals.contains(v)),
                SelectorOp::Exists => labels.contains_key(k),
                SelectorOp::DoesNotExist => !labels.contains_key(k),
            })
    }
}

/// Which namespaces a pod (anti-)affinity term looks at.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Namespaces {
    /// Every namespace (an empty namespaceSelector).
    All,
    /// Only these namespaces.
    Only(BTreeSet<String>),
    /// These namespaces and every namespace whose labels the selector matches.
    Matching {
        /// Listed by name.
        names: BTreeSet<String>,
        /// The namespaceSelector.
        selector: Selector,
    },
}

impl Namespaces {
    /// True when pods of `ns`, whose labels are `ns_labels` (when known), are in scope.
    pub fn contains(&self, ns: &str, ns_labels: Option<&BTreeMap<String, String>>) -> bool {
        match self {
            Namespaces::All => true,
            Namespaces::Only(s) => s.contains(ns),
            Namespaces::Matching { names, selector } => {
                names.contains(ns) || ns_labels.is_some_and(|l| selector.matches(l))
            }
        }
    }
}

/// A pod (anti-)affinity term: pods matching `selector` in `namespaces`,
/// grouped by the value of `key` on their nodes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodTerm {
    /// The topology key.
    pub key: String,
    /// Which pods count.
    pub selector: Selector,
    /// Where they may live.
    pub namespaces: Namespaces,
}

/// A topology spread constraint.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Spread {
    /// The topology key.
    pub key: String,
    /// Largest allowed difference between the fullest and emptiest domain.
    pub max_skew: i32,
    /// Fewer eligible domains than this make the global minimum zero.
    pub min_domains: Option<i32>,
    /// DoNotSchedule (true) or ScheduleAnyway (false).
    pub required: bool,
    /// nodeAffinityPolicy Honor (the default): only domains the pod's node affinity allows count.
    pub honor_affinity: bool,
    /// nodeTaintsPolicy Honor: only domains whose taints the pod tolerates count.
    pub honor_taints: bool,
    /// Which pods count (namespace is the pod's own).
    pub selector: Selector,
}

/// A toleration in plain form.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Toleration {
    /// Key (empty with Exists tolerates everything).
    pub key: String,
    /// True for `Exists`, false for `Equal`.
    pub exists: bool,
    /// Value for Equal.
    pub value: String,
    /// Effect, empty for all effects.
    pub effect: String,
}

impl Toleration {
    fn from_k8s(t: &K8sToleration, path: &str) -> Result<Self, PodError> {
        let exists = match t.operator.as_deref().unwrap_or("Equal") {
            "Exists" => true,
            "Equal" => false,
            o => return Err(perr(format!("{path}.operator"), format!("unknown operator {o:?}"))),
        };
        Ok(Toleration {
            key: t.key.clone().unwrap_or_default(),
            exists,
            value: t.value.clone().unwrap_or_default(),
            effect: t.effect.clone().unwrap_or_default(),
        })
    }

    /// True when this toleration tolerates `taint`.
    pub fn tolerates(&self, taint: &Taint) -> bool {
        let effect = match taint.effect {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::PreferNoSchedule => "PreferNoSchedule",
            TaintEffect::NoExecute => "NoExecute",
        };
        if !self.effect.is_empty() && self.effect != effect {
            return false;
        }
        if self.key.is_empty() {
            return self.exists;
        }
        self.key == taint.key && (self.exists || self.value == taint.value.clone().unwrap_or_default())
    }
}

/// True when the tolerations tolerate every scheduling taint (NoSchedule,
/// NoExecute, and PreferNoSchedule unless `ignore_prefer`).
pub fn tolerates_all(tolerations: &[Toleration], taints: &[Taint], ignore_prefer: bool) -> Result<(), Taint> {
    for t in taints {
        if ignore_prefer && t.effect == TaintEffect::PreferNoSchedule {
            continue;
        }
        if !tolerations.iter().any(|tol| tol.tolerates(t)) {
            return Err(t.clone());
        }
    }
    Ok(())
}

/// A host port a pod binds.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostPort {
    /// TCP, UDP or SCTP.
    pub protocol: String,
    /// The host IP (empty or 0.0.0.0 for all).
    pub ip: String,
    /// The port.
    pub port: i32,
}

impl HostPort {
    /// True when two bindings cannot share a node.
    pub fn conflicts(&self, o: &HostPort) -> bool {
        let wild = |ip: &str| ip.is_empty() || ip == "0.0.0.0";
        self.port == o.port && self.protocol == o.protocol && (wild(&self.ip) || wild(&o.ip) || self.ip == o.ip)
    }
}

/// Everything the solver needs to know about one pod.
#[derive(Debug, Clone)]
pub struct PodModel {
    /// Identity.
    pub pod: PodRef,
    /// The pod's labels.
    pub labels: BTreeMap<String, String>,
    /// Effective requests, including overhead and one `pods`.
    pub requests: Resources,
    /// Required node constraints: nodeSelector AND one of these terms (OR).
    /// Always at least one term.
    pub node_terms: Vec<Requirements>,
    /// Preferred node affinity terms, heaviest first.
    pub preferred_node: Vec<(i32, Requirements)>,
    /// Tolerations.
    pub tolerations: Vec<Toleration>,
    /// Topology spread constraints (required and ScheduleAnyway).
    pub spreads: Vec<Spread>,
    /// Required pod affinity terms.
    pub affinity: Vec<PodTerm>,
    /// Required pod anti-affinity terms.
    pub anti_affinity: Vec<PodTerm>,
    /// Preferred pod affinity terms, heaviest first.
    pub preferred_affinity: Vec<(i32, PodTerm)>,
    /// Preferred pod anti-affinity terms, heaviest first.
    pub preferred_anti_affinity: Vec<(i32, PodTerm)>,
    /// Host ports.
    pub host_ports: Vec<HostPort>,
    /// Names of the PersistentVolumeClaims it mounts (in its namespace).
    pub claims: Vec<String>,
    /// Storage classes of its generic ephemeral volumes.
    pub ephemeral_classes: Vec<Option<String>>,
}

/// Reads a Kubernetes quantity, naming the field on error.
pub fn quantity(q: &K8sQuantity, path: &str) -> Result<Quantity, PodError> {
    Ok(resources::field(q, path)?)
}

/// Kubernetes' effective pod requests: what its containers ask for together
/// ([`resources::container_total`]), plus overhead and one `pods`.
pub fn effective_requests(spec: &PodSpec, path: &str) -> Result<Resources, PodError> {
    let mut total = resources::container_total(spec, path)?;
    total.add(&resources::from_k8s(
        spec.overhead.as_ref(),
        &format!("{path}.overhead"),
    )?);
    total.set(
        resources::PODS,
        total.get(resources::PODS).saturating_add(Quantity::from_units(1)),
    );
    Ok(total)
}

/// Converts a node selector term to requirements.
pub fn term_requirements(term: &NodeSelectorTerm, path: &str) -> Result<Requirements, PodError> {
    let mut r = Requirements::new();
    for (i, e) in term.match_expressions.iter().flatten().enumerate() {
        let p = format!("{path}.matchExpressions[{i}]");
        let op = match e.operator.as_str() {
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            "Gt" => Operator::Gt,
            "Lt" => Operator::Lt,
            o => return Err(perr(format!("{p}.operator"), format!("unknown operator {o:?}"))),
        };
        let values = e.values.clone().unwrap_or_default();
        labels::validate_key(&e.key).map_err(|e| perr(format!("{p}.key"), e.to_string()))?;
        // An `In` value can become the new node's label (on a key the pool
        // leaves open): it must be one, or it reaches the kubelet's flags.
        if op == Operator::In {
            for (j, v) in values.iter().enumerate() {
                labels::validate_label(&e.key, v).map_err(|e| perr(format!("{p}.values[{j}]"), e.to_string()))?;
            }
        }
        r.add(Requirement::new(&e.key, op, &values).map_err(|e| perr(format!("{p}.values"), e.to_string()))?);
    }
    // matchFields (metadata.name) pins a node by name; no new node can match it.
    if let Some(f) = term.match_fields.as_ref().and_then(|f| f.first()) {
        r.add(Requirement::in_values(
            "metadata.name",
            &f.values.clone().unwrap_or_default(),
        ));
    }
    Ok(r)
}

fn pod_term(
    t: &PodAffinityTerm,
    own_ns: &str,
    labels: &BTreeMap<String, String>,
    path: &str,
) -> Result<PodTerm, PodError> {
    let mut selector = Selector::from_k8s(t.label_selector.as_ref(), &format!("{path}.labelSelector"))?;
    for k in t.match_label_keys.iter().flatten() {
        if let Some(v) = labels.get(k) {
            selector = selector.with_label(k, v);
        }
    }
    for k in t.mismatch_label_keys.iter().flatten() {
        if let Some(v) = labels.get(k) {
            selector.exprs.push((k.clone(), SelectorOp::NotIn, vec![v.clone()]));
            selector.exprs.sort();
        }
    }
    // The listed namespaces and those the namespaceSelector selects ({}: all);
    // neither set means the pod's own namespace.
    let listed: BTreeSet<String> = t.namespaces.iter().flatten().cloned().collect();
    let namespaces = match &t.namespace_selector {
        Some(ns)
            if ns.match_labels.as_ref().is_none_or(|m| m.is_empty())
                && ns.match_expressions.as_ref().is_none_or(|m| m.is_empty()) =>
        {
            Namespaces::All
        }
        Some(ns) => Namespaces::Matching {
            names: listed,
            selector: Selector::from_k8s(Some(ns), &format!("{path}.namespaceSelector"))?,
        },
        None if !listed.is_empty() => Namespaces::Only(listed),
        None => Namespaces::Only([own_ns.to_string()].into()),
    };
    if t.topology_key.is_empty() {
        return Err(perr(format!("{path}.topologyKey"), "is required"));
    }
    Ok(PodTerm {
        key: crate::labels::normalize(&t.topology_key).to_string(),
        selector,
        namespaces,
    })
}

impl PodModel {
    /// Builds the model of a pod; errors name the field (the first invalid
    /// one, in the order the phases below read them).
    pub fn from_pod(pod: &Pod) -> Result<Self, PodError> {
        let pod_ref = PodRef::of(pod);
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        let Some(spec) = pod.spec.as_ref() else {
            return Err(perr("spec", "is required"));
        };
        let requests = effective_requests(spec, "spec")?;
        let na = spec.affinity.as_ref().and_then(|a| a.node_affinity.as_ref());
        let node_terms = required_node_terms(spec, na)?;
        let preferred_node = preferred_node_terms(na)?;
        let mut tolerations = Vec::new();
        for (i, t) in spec.tolerations.iter().flatten().enumerate() {
            tolerations.push(Toleration::from_k8s(t, &format!("spec.tolerations[{i}]"))?);
        }
        let mut spreads = Vec::new();
        for (i, c) in spec.topology_spread_constraints.iter().flatten().enumerate() {
            spreads.push(spread(c, &format!("spec.topologySpreadConstraints[{i}]"), &labels)?);
        }
        let ns = pod_ref.namespace.clone();
        let pa = spec.affinity.as_ref().and_then(|a| a.pod_affinity.as_ref());
        let paa = spec.affinity.as_ref().and_then(|a| a.pod_anti_affinity.as_ref());
        let required = |list, kind| required_pod_terms(list, kind, &ns, &labels);
        let affinity = required(
            pa.and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref()),
            "podAffinity",
        )?;
        let anti_affinity = required(
            paa.and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref()),
            "podAntiAffinity",
        )?;
        let preferred = |list, kind| preferred_pod_terms(list, kind, &ns, &labels);
        let preferred_affinity = preferred(
            pa.and_then(|a| a.preferred_during_scheduling_ignored_during_execution.as_ref()),
            "podAffinity",
        )?;
        let preferred_anti_affinity = preferred(
            paa.and_then(|a| a.preferred_during_scheduling_ignored_during_execution.as_ref()),
            "podAntiAffinity",
        )?;
        let (claims, ephemeral_classes) = volume_claims(spec);
        Ok(PodModel {
            pod: pod_ref,
            labels,
            requests,
            node_terms,
            preferred_node,
            tolerations,
            spreads,
            affinity,
            anti_affinity,
            preferred_affinity,
            preferred_anti_affinity,
            host_ports: host_ports(spec),
            claims,
            ephemeral_classes,
        })
    }
}

/// The required node terms (OR): each required node-affinity term with the
/// nodeSelector added, or the nodeSelector alone.
fn required_node_terms(spec: &PodSpec, na: Option<&NodeAffinity>) -> Result<Vec<Requirements>, PodError> {
    let mut selector_reqs = Requirements::new();
    for (k, v) in spec.node_selector.iter().flatten() {
        labels::validate_label(k, v).map_err(|e| perr(format!("spec.nodeSelector[{k:?}]"), e.to_string()))?;
        selector_reqs.add(Requirement::in_values(k, &[v]));
    }
    let mut node_terms = Vec::new();
    if let Some(req) = na.and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref()) {
        for (i, t) in req.node_selector_terms.iter().enumerate() {
            let p = format!(
                "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[{i}]"
            );
            let mut r = selector_reqs.clone();
            r.add_all(&term_requirements(t, &p)?);
            node_terms.push(r);
        }
    }
    if node_terms.is_empty() {
        node_terms.push(selector_reqs);
    }
    Ok(node_terms)
}

/// The preferred node-affinity terms, heaviest first.
fn preferred_node_terms(na: Option<&NodeAffinity>) -> Result<Vec<(i32, Requirements)>, PodError> {
    let mut preferred_node = Vec::new();
    for (i, t) in na
        .and_then(|n| n.preferred_during_scheduling_ignored_during_execution.as_ref())
        .into_iter()
        .flatten()
        .enumerate()
    {
        let p = format!("spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[{i}].preference");
        preferred_node.push((t.weight, term_requirements(&t.preference, &p)?));
    }
    preferred_node.sort_by_key(|t| std::cmp::Reverse(t.0));
    Ok(preferred_node)
}

/// One topology spread constraint, at path `p`.
fn spread(c: &TopologySpreadConstraint, p: &str, labels: &BTreeMap<String, String>) -> Result<Spread, PodError> {
    if c.max_skew < 1 {
        return Err(perr(
            format!("{p}.maxSkew"),
            format!("must be at least 1, got {}", c.max_skew),
        ));
    }
    let required = match c.when_unsatisfiable.as_str() {
        "DoNotSchedule" => true,
        "ScheduleAnyway" => false,
        o => {
            return Err(perr(
                format!("{p}.whenUnsatisfiable"),
                format!("must be DoNotSchedule or ScheduleAnyway, got {o:?}"),
            ));
        }
    };
    if c.topology_key.is_empty() {
        return Err(perr(format!("{p}.topologyKey"), "is required"));
    }
    let mut selector = Selector::from_k8s(c.label_selector.as_ref(), &format!("{p}.labelSelector"))?;
    for k in c.match_label_keys.iter().flatten() {
        if let Some(v) = labels.get(k) {
            selector = selector.with_label(k, v);
        }
    }
    let policy = |v: &Option<String>, default: bool, field: &str| match v.as_deref() {
        None => Ok(default),
        Some("Honor") => Ok(true),
        Some("Ignore") => Ok(false),
        Some(o) => Err(perr(
            format!("{p}.{field}"),
            format!("must be Honor or Ignore, got {o:?}"),
        )),
    };
    Ok(Spread {
        key: crate::labels::normalize(&c.topology_key).to_string(),
        max_skew: c.max_skew,
        min_domains: c.min_domains,
        required,
        honor_affinity: policy(&c.node_affinity_policy, true, "nodeAffinityPolicy")?,
        honor_taints: policy(&c.node_taints_policy, false, "nodeTaintsPolicy")?,
        selector,
    })
}

/// The required terms of `spec.affinity.<kind>` (podAffinity or podAntiAffinity).
fn required_pod_terms(
    list: Option<&Vec<PodAffinityTerm>>,
    kind: &str,
    ns: &str,
    labels: &BTreeMap<String, String>,
) -> Result<Vec<PodTerm>, PodError> {
    let mut out = Vec::new();
    for (i, t) in list.into_iter().flatten().enumerate() {
        let p = format!("spec.affinity.{kind}.requiredDuringSchedulingIgnoredDuringExecution[{i}]");
        out.push(pod_term(t, ns, labels, &p)?);
    }
    Ok(out)
}

/// The preferred terms of `spec.affinity.<kind>` (podAffinity or podAntiAffinity), heaviest first.
fn preferred_pod_terms(
    list: Option<&Vec<WeightedPodAffinityTerm>>,
    kind: &str,
    ns: &str,
    labels: &BTreeMap<String, String>,
) -> Result<Vec<(i32, PodTerm)>, PodError> {
    let mut out = Vec::new();
    for (i, t) in list.into_iter().flatten().enumerate() {
        let p = format!("spec.affinity.{kind}.preferredDuringSchedulingIgnoredDuringExecution[{i}].podAffinityTerm");
        out.push((t.weight, pod_term(&t.pod_affinity_term, ns, labels, &p)?));
    }
    out.sort_by_key(|t| std::cmp::Reverse(t.0));
    Ok(out)
}

/// The host ports of its containers and sidecars (restartable init containers), sorted.
fn host_ports(spec: &PodSpec) -> Vec<HostPort> {
    let mut host_ports = Vec::new();
    let all = spec.containers.iter().chain(
        spec.init_containers
            .iter()
            .flatten()
            .filter(|c| c.restart_policy.as_deref() == Some("Always")),
    );
    for c in all {
        for p in c.ports.iter().flatten() {
            if let Some(port) = p.host_port.filter(|p| *p > 0) {
                host_ports.push(HostPort {
                    protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    ip: p.host_ip.clone().unwrap_or_default(),
                    port,
                });
            }
        }
    }
    host_ports.sort();
    host_ports
}

/// The claims its volumes name, and the storage class of each ephemeral volume.
fn volume_claims(spec: &PodSpec) -> (Vec<String>, Vec<Option<String>>) {
    let mut claims = Vec::new();
    let mut ephemeral_classes = Vec::new();
    for v in spec.volumes.iter().flatten() {
        if let Some(c) = &v.persistent_volume_claim {
            claims.push(c.claim_name.clone());
        }
        if let Some(e) = &v.ephemeral {
            ephemeral_classes.push(
                e.volume_claim_template
                    .as_ref()
                    .and_then(|t| t.spec.storage_class_name.clone()),
            );
        }
    }
    (claims, ephemeral_classes)
}
