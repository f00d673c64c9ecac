//! Facts about pods that provisioning and disruption decide on. Pure.

use k8s_openapi::api::core::v1::{Pod, Taint};

/// Pods and nodes with this annotation are not voluntarily disrupted
/// (`"true"`, or for a duration: [`crate::do_not_disrupt`]).
pub const DO_NOT_DISRUPT: &str = crate::do_not_disrupt::ANNOTATION;
/// The taint put on nodes being disrupted.
pub const DISRUPTED_TAINT_KEY: &str = "karpenter.sh/disrupted";
/// Annotation ranking a ReplicaSet's pods for scale-down (and, in Karpenter, consolidation).
pub const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";
/// Mirror (static) pods carry this annotation.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// The pod's `namespace/name`.
pub fn key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or(""),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

/// Whether a DaemonSet owns the pod.
pub fn is_daemonset_pod(pod: &Pod) -> bool {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "DaemonSet" && o.controller == Some(true))
}

/// Whether the pod is a static pod's mirror (owned by its node, or annotated so).
pub fn is_mirror_pod(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION))
        || pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == "Node" && o.controller == Some(true))
}

/// Whether the pod's do-not-disrupt protection is in force at `now`.
pub fn has_do_not_disrupt(pod: &Pod, now: jiff::Timestamp) -> bool {
    crate::do_not_disrupt::pod_protected(pod, now)
}

/// Whether the pod has finished (Succeeded or Failed).
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    )
}

/// Whether the pod is being deleted.
pub fn is_terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// The node the pod is bound to, if any.
pub fn node_name(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

/// Whether the scheduler tried and failed: `PodScheduled=False, reason=Unschedulable`.
pub fn is_unschedulable(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some("Unschedulable")
            })
        })
}

/// Whether provisioning should act on the pod, as Karpenter judges it: not
/// bound, not finished or terminating, marked unschedulable, not nominated for
/// a node being freed by preemption, and not owned by a DaemonSet or a node.
pub fn is_provisionable(pod: &Pod) -> bool {
    let nominated = pod
        .status
        .as_ref()
        .and_then(|s| s.nominated_node_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    node_name(pod).is_none()
        && !is_terminal(pod)
        && !is_terminating(pod)
        && is_unschedulable(pod)
        && !nominated
        && !is_daemonset_pod(pod)
        && !is_mirror_pod(pod)
}

/// Whether the pod tolerates the `karpenter.sh/disrupted:NoSchedule` taint
/// (evicting it is pointless: it could land on the same node again).
pub fn tolerates_disrupted_taint(pod: &Pod) -> bool {
    let taint = disrupted_taint();
    pod.spec
        .as_ref()
        .and_then(|s| s.tolerations.as_ref())
        .is_some_and(|ts| {
            ts.iter().any(|t| {
                let exists = t.operator.as_deref() == Some("Exists");
                let key_ok = match t.key.as_deref() {
                    None | Some("") => exists,
                    Some(k) => k == taint.key,
                };
                let effect_ok = t.effect.as_deref().is_none_or(|e| e.is_empty() || e == taint.effect);
                let value_ok = exists || t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("");
                key_ok && effect_ok && value_ok
            })
        })
}

/// The `karpenter.sh/disrupted:NoSchedule` taint.
pub fn disrupted_taint() -> Taint {
    Taint {
        key: DISRUPTED_TAINT_KEY.into(),
        value: None,
        effect: "NoSchedule".into(),
        time_added: None,
    }
}

/// Whether the pod runs at system-critical priority (drained last).
pub fn is_critical(pod: &Pod) -> bool {
    matches!(
        pod.spec.as_ref().and_then(|s| s.priority_class_name.as_deref()),
        Some("system-cluster-critical") | Some("system-node-critical")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    fn unschedulable() -> serde_json::Value {
        json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]})
    }

    #[test]
    fn provisionable_table() {
        let ds_owner =
            json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "u", "controller": true}]);
        for (name, p, want) in [
            (
                "unschedulable",
                json!({"metadata": {"name": "a"}, "spec": {"containers": []}, "status": unschedulable()}),
                true,
            ),
            (
                "never tried",
                json!({"metadata": {"name": "a"}, "spec": {"containers": []}, "status": {"phase": "Pending"}}),
                false,
            ),
            (
                "bound",
                json!({"metadata": {"name": "a"}, "spec": {"containers": [], "nodeName": "n"}, "status": unschedulable()}),
                false,
            ),
            (
                "daemonset",
                json!({"metadata": {"name": "a", "ownerReferences": ds_owner}, "spec": {"containers": []}, "status": unschedulable()}),
                false,
            ),
            (
                "terminating",
                json!({"metadata": {"name": "a", "deletionTimestamp": "2026-01-01T00:00:00Z"}, "spec": {"containers": []}, "status": unschedulable()}),
                false,
            ),
            (
                "nominated",
                json!({"metadata": {"name": "a"}, "spec": {"containers": []}, "status": {"nominatedNodeName": "n", "conditions": unschedulable()["conditions"]}}),
                false,
            ),
            (
                "failed",
                json!({"metadata": {"name": "a"}, "spec": {"containers": []}, "status": {"phase": "Failed", "conditions": unschedulable()["conditions"]}}),
                false,
            ),
        ] {
            assert_eq!(is_provisionable(&pod(p)), want, "{name}");
        }
    }

    #[test]
    fn mirror_and_do_not_disrupt_are_read_from_metadata() {
        let m = pod(json!({"metadata": {"name": "a", "annotations": {"kubernetes.io/config.mirror": "x"}}}));
        assert!(is_mirror_pod(&m));
        let d = pod(json!({"metadata": {"name": "a", "annotations": {"karpenter.sh/do-not-disrupt": "true"}}}));
        let now = jiff::Timestamp::now();
        assert!(has_do_not_disrupt(&d, now));
        let f = pod(json!({"metadata": {"name": "a", "annotations": {"karpenter.sh/do-not-disrupt": "false"}}}));
        assert!(!has_do_not_disrupt(&f, now));
    }

    #[test]
    fn disrupted_taint_toleration() {
        let t = |tol: serde_json::Value| {
            tolerates_disrupted_taint(&pod(
                json!({"metadata": {"name": "a"}, "spec": {"containers": [], "tolerations": [tol]}}),
            ))
        };
        assert!(t(json!({"operator": "Exists"})));
        assert!(t(
            json!({"key": "karpenter.sh/disrupted", "operator": "Exists", "effect": "NoSchedule"})
        ));
        assert!(!t(
            json!({"key": "karpenter.sh/disrupted", "operator": "Exists", "effect": "NoExecute"})
        ));
        assert!(!t(json!({"key": "other", "operator": "Exists"})));
    }
}
