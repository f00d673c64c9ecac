//! A small kube-scheduler: binds pending pods to nodes that fit (resources,
//! nodeSelector, required node affinity, taints) and marks the rest
//! `PodScheduled=False, reason=Unschedulable`, as the real scheduler does.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeSelectorRequirement, Pod, PodSpec, Taint, Toleration};
use nodesmith::quantity::Quantity;
use nodesmith::resources::Resources;

/// What one scheduling pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScheduleReport {
    /// `(namespace/name, node)` of every pod bound in this pass.
    pub bound: Vec<(String, String)>,
    /// `namespace/name` of every pod no node could take.
    pub unschedulable: Vec<String>,
    /// How many pods already marked unschedulable got a new message.
    pub remarked: usize,
    /// How many new messages were left for a later pass (past the pass's allowance).
    pub remarks_left: usize,
}

/// A pod's effective requests: the sum over containers (limits stand in for
/// missing requests), at least the largest init container, plus one pod slot.
pub fn pod_requests(pod: &Pod) -> Resources {
    let spec = pod.spec.clone().unwrap_or_default();
    let of = |c: &k8s_openapi::api::core::v1::Container| -> Resources {
        let mut r = Resources::new();
        let res = c.resources.clone().unwrap_or_default();
        let mut map = res.limits.unwrap_or_default();
        map.extend(res.requests.unwrap_or_default());
        for (k, v) in map {
            if let Ok(q) = Quantity::parse(&v.0) {
                r.set(&k, q);
            }
        }
        r
    };
    let mut total = Resources::new();
    for c in &spec.containers {
        total.add(&of(c));
    }
    for c in spec.init_containers.iter().flatten() {
        total = total.max(&of(c));
    }
    total.add(&Resources::from_pairs([("pods", Quantity::from_units(1))]));
    total
}

/// A node's allocatable resources (capacity when allocatable is absent).
pub fn node_allocatable(node: &Node) -> Resources {
    let status = node.status.clone().unwrap_or_default();
    let map = status.allocatable.or(status.capacity).unwrap_or_default();
    let mut r = Resources::new();
    for (k, v) in map {
        if let Ok(q) = Quantity::parse(&v.0) {
            r.set(&k, q);
        }
    }
    r
}

/// Whether a toleration tolerates a taint.
pub fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    let effect_ok = t.effect.as_deref().is_none_or(|e| e.is_empty() || e == taint.effect);
    let exists = t.operator.as_deref() == Some("Exists");
    let key_ok = match t.key.as_deref() {
        None | Some("") => exists,
        Some(k) => k == taint.key,
    };
    let value_ok = exists || t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("");
    effect_ok && key_ok && value_ok
}

fn requirement_holds(r: &NodeSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let vals = r.values.as_deref().unwrap_or_default();
    let got = labels.get(&r.key);
    let num = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => got.is_some_and(|v| vals.contains(v)),
        "NotIn" => got.is_none_or(|v| !vals.contains(v)),
        "Exists" => got.is_some(),
        "DoesNotExist" => got.is_none(),
        "Gt" => matches!((got.and_then(|v| num(v)), vals.first().and_then(|v| num(v))), (Some(a), Some(b)) if a > b),
        "Lt" => matches!((got.and_then(|v| num(v)), vals.first().and_then(|v| num(v))), (Some(a), Some(b)) if a < b),
        _ => false,
    }
}

/// Why a node cannot take a pod, ignoring resources; None when it can.
pub fn node_rejects(pod: &Pod, node: &Node) -> Option<&'static str> {
    // Borrowed, not copied: a pass asks this of every pending pod and Node.
    static NO_SPEC: std::sync::LazyLock<PodSpec> = std::sync::LazyLock::new(PodSpec::default);
    static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();
    let spec = pod.spec.as_ref().unwrap_or(&NO_SPEC);
    let labels = node.metadata.labels.as_ref().unwrap_or(&NO_LABELS);
    if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        return Some("node(s) were unschedulable");
    }
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_none_or(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    if !ready {
        return Some("node(s) were not ready");
    }
    if !spec
        .node_selector
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v))
    {
        return Some("node(s) didn't match Pod's node affinity/selector");
    }
    let terms = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref())
        .map(|s| &s.node_selector_terms);
    if let Some(terms) = terms {
        let any = terms.iter().any(|t| {
            t.match_expressions
                .iter()
                .flatten()
                .all(|r| requirement_holds(r, labels))
        });
        if !any {
            return Some("node(s) didn't match Pod's node affinity/selector");
        }
    }
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    let untolerated = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .any(|taint| !tolerations.iter().any(|t| tolerates(t, taint)));
    if untolerated {
        return Some("node(s) had untolerated taint");
    }
    None
}

/// Whether a pod is bound or finished, so it uses (or used) node resources.
pub fn is_active(pod: &Pod) -> bool {
    !matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    )
}

/// Picks a node for each pending pod, first fit in node-name order.
/// Returns `(pod index, Ok(node name) | Err(message))` for every pending pod.
pub fn plan(pods: &[Pod], nodes: &[Node]) -> Vec<(usize, Result<String, String>)> {
    let mut used: BTreeMap<String, Resources> = BTreeMap::new();
    for p in pods.iter().filter(|p| is_active(p)) {
        if let Some(n) = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .filter(|n| !n.is_empty())
        {
            used.entry(n.clone()).or_default().add(&pod_requests(p));
        }
    }
    // Each Node's name and allocatable read once a pass, not once per pod.
    let allocatable: Vec<(&str, Resources)> = nodes
        .iter()
        .map(|n| (n.metadata.name.as_deref().unwrap_or_default(), node_allocatable(n)))
        .collect();
    let mut out = Vec::new();
    for (i, pod) in pods.iter().enumerate() {
        let bound = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| !n.is_empty());
        if bound || !is_active(pod) || pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let req = pod_requests(pod);
        let mut reasons: BTreeMap<&'static str, usize> = BTreeMap::new();
        let mut chosen = None;
        for (node, (name, allocatable)) in nodes.iter().zip(&allocatable) {
            if let Some(why) = node_rejects(pod, node) {
                *reasons.entry(why).or_default() += 1;
                continue;
            }
            let free = allocatable.minus(used.get(*name).unwrap_or(&Resources::new()));
            if !req.fits_in(&free) {
                *reasons.entry("Insufficient resources").or_default() += 1;
                continue;
            }
            used.entry(name.to_string()).or_default().add(&req);
            chosen = Some(name.to_string());
            break;
        }
        let outcome = match chosen {
            Some(n) => Ok(n),
            None => {
                let detail: Vec<String> = reasons.iter().map(|(r, n)| format!("{n} {r}")).collect();
                let tail = if detail.is_empty() {
                    String::new()
                } else {
                    format!(" {}.", detail.join(", "))
                };
                Err(format!("0/{} nodes are available:{tail}", nodes.len()))
            }
        };
        out.push((i, outcome));
    }
    out
}
