//! PodDisruptionBudget arithmetic, as the disruption controller and the
//! eviction subresource compute it (simplified: expected pods are the pods
//! the selector matches, not the owning controller's scale).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};

/// Whether a `metav1.LabelSelector` selects these labels (empty selects all).
pub fn selector_matches(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let by_labels = sel.match_labels.iter().flatten().all(|(k, v)| labels.get(k) == Some(v));
    let by_exprs = sel.match_expressions.iter().flatten().all(|e| {
        let vals = e.values.clone().unwrap_or_default();
        match e.operator.as_str() {
            "In" => labels.get(&e.key).is_some_and(|v| vals.contains(v)),
            "NotIn" => labels.get(&e.key).is_none_or(|v| !vals.contains(v)),
            "Exists" => labels.contains_key(&e.key),
            "DoesNotExist" => !labels.contains_key(&e.key),
            _ => false,
        }
    });
    by_labels && by_exprs
}

/// Running with the Ready condition true.
pub fn is_healthy(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    status.and_then(|s| s.phase.as_deref()) == Some("Running")
        && status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    )
}

/// What a budget allows right now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Pods the selector matches (not terminal).
    pub expected: i32,
    /// Of those, healthy ones.
    pub healthy: i32,
    /// Healthy pods the budget wants kept.
    pub desired: i32,
    /// healthy - desired, floored at 0.
    pub allowed: i32,
}

fn scaled(v: &IntOrString, total: i32) -> i32 {
    match v {
        IntOrString::Int(n) => *n,
        IntOrString::String(s) => {
            let p: i64 = s.trim_end_matches('%').parse().unwrap_or(0);
            ((i64::from(total) * p + 99) / 100) as i32
        }
    }
}

/// Computes a budget over the pods of its namespace.
pub fn budget(pdb: &PodDisruptionBudget, pods: &[Pod]) -> Budget {
    let ns = pdb.metadata.namespace.as_deref().unwrap_or("");
    let spec = pdb.spec.clone().unwrap_or_default();
    let matching: Vec<&Pod> = match &spec.selector {
        // A null selector selects nothing in policy/v1.
        None => Vec::new(),
        Some(sel) => pods
            .iter()
            .filter(|p| p.metadata.namespace.as_deref().unwrap_or("") == ns && !is_terminal(p))
            .filter(|p| selector_matches(sel, &p.metadata.labels.clone().unwrap_or_default()))
            .collect(),
    };
    let expected = matching.len() as i32;
    let healthy = matching.iter().filter(|p| is_healthy(p)).count() as i32;
    let desired = match (&spec.min_available, &spec.max_unavailable) {
        (Some(min), _) => scaled(min, expected),
        (None, Some(max)) => (expected - scaled(max, expected)).max(0),
        (None, None) => 0,
    };
    Budget {
        expected,
        healthy,
        desired,
        allowed: (healthy - desired).max(0),
    }
}

/// Whether a budget covers a pod.
pub fn covers(pdb: &PodDisruptionBudget, pod: &Pod) -> bool {
    pdb.metadata.namespace == pod.metadata.namespace
        && pdb
            .spec
            .as_ref()
            .and_then(|s| s.selector.as_ref())
            .is_some_and(|sel| selector_matches(sel, &pod.metadata.labels.clone().unwrap_or_default()))
}

/// The PDB object with its status filled from the current pods.
pub fn with_status(pdb_json: Value, pods: &[Pod]) -> Value {
    let Ok(pdb) = serde_json::from_value::<PodDisruptionBudget>(pdb_json.clone()) else {
        return pdb_json;
    };
    let b = budget(&pdb, pods);
    let mut out = pdb_json;
    if let Some(o) = out.as_object_mut() {
        o.insert(
            "status".into(),
            json!({
                "currentHealthy": b.healthy,
                "desiredHealthy": b.desired,
                "disruptionsAllowed": b.allowed,
                "expectedPods": b.expected,
                "observedGeneration": pdb.metadata.generation.unwrap_or(1),
            }),
        );
    }
    out
}

/// Why an eviction must wait, or None when it may proceed.
pub fn eviction_blocked_by(pod: &Pod, pdbs: &[PodDisruptionBudget], pods: &[Pod]) -> Option<String> {
    // Pods that are not running can always be evicted (as the API server allows).
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending");
    if phase != "Running" || pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    for pdb in pdbs.iter().filter(|p| covers(p, pod)) {
        let b = budget(pdb, pods);
        // An unhealthy pod does not count toward the budget, so evicting it costs nothing.
        let cost = i32::from(is_healthy(pod));
        if b.allowed < cost || (cost == 0 && b.healthy < b.desired) {
            return Some(format!(
                "The disruption budget {} needs {} healthy pods and has {} currently",
                pdb.metadata.name.as_deref().unwrap_or(""),
                b.desired,
                b.healthy
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, app: &str, healthy: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "labels": {"app": app}},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if healthy {"True"} else {"False"}}]}
        }))
        .unwrap()
    }

    fn pdb(spec: Value) -> PodDisruptionBudget {
        serde_json::from_value(json!({"metadata": {"name": "b", "namespace": "ns"}, "spec": spec})).unwrap()
    }

    #[test]
    fn budget_table() {
        let pods = vec![
            pod("a", "web", true),
            pod("b", "web", true),
            pod("c", "web", false),
            pod("d", "db", true),
        ];
        for (spec, allowed, desired) in [
            (
                json!({"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}),
                1,
                1,
            ),
            (
                json!({"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}),
                0,
                2,
            ),
            (
                json!({"minAvailable": "50%", "selector": {"matchLabels": {"app": "web"}}}),
                0,
                2,
            ),
            (
                json!({"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}}),
                0,
                2,
            ),
            (
                json!({"maxUnavailable": 2, "selector": {"matchLabels": {"app": "web"}}}),
                1,
                1,
            ),
            (json!({"maxUnavailable": "100%", "selector": {}}), 3, 0),
        ] {
            let b = budget(&pdb(spec.clone()), &pods);
            assert_eq!((b.allowed, b.desired), (allowed, desired), "{spec}");
        }
    }

    #[test]
    fn eviction_respects_budgets() {
        let pods = vec![pod("a", "web", true), pod("b", "web", true)];
        let strict = pdb(json!({"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}));
        let loose = pdb(json!({"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}));
        assert!(eviction_blocked_by(&pods[0], std::slice::from_ref(&strict), &pods).is_some());
        assert!(eviction_blocked_by(&pods[0], &[loose], &pods).is_none());
        let other = pod("x", "db", true);
        assert!(eviction_blocked_by(&other, &[strict], &pods).is_none());
    }

    proptest::proptest! {
        /// The budget never allows more than the healthy pods, and evicting a
        /// healthy covered pod is refused exactly when nothing is allowed.
        #[test]
        fn eviction_follows_the_budget(health in proptest::collection::vec(proptest::bool::ANY, 1..8), min in 0i32..9, use_max in proptest::bool::ANY) {
            let pods: Vec<Pod> = health.iter().enumerate().map(|(i, h)| pod(&format!("p{i}"), "web", *h)).collect();
            let spec = if use_max {
                json!({"maxUnavailable": min, "selector": {"matchLabels": {"app": "web"}}})
            } else {
                json!({"minAvailable": min, "selector": {"matchLabels": {"app": "web"}}})
            };
            let b = pdb(spec);
            let got = budget(&b, &pods);
            let healthy = health.iter().filter(|h| **h).count() as i32;
            let desired = if use_max { (pods.len() as i32 - min).max(0) } else { min };
            proptest::prop_assert_eq!(got.allowed, (healthy - desired).max(0));
            proptest::prop_assert!(got.allowed <= healthy);
            if let Some(i) = health.iter().position(|h| *h) {
                let blocked = eviction_blocked_by(&pods[i], std::slice::from_ref(&b), &pods).is_some();
                proptest::prop_assert_eq!(blocked, got.allowed == 0);
            }
        }
    }
}
