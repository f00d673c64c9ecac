//! Facts about pods that provisioning and disruption decide on. Pure.

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

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

/// Drops what nodesmith never reads of a listed pod, so that a whole
/// cluster's pods fit a function's memory: container statuses, conditions
/// other than Ready (startup durations) and PodScheduled (the status report),
/// ephemeral containers, volumes that claim no storage (service account
/// tokens, config maps, secrets, empty dirs), and the containers themselves
/// once their requests are folded into pod-level requests (Kubernetes reads
/// those in their place); only containers holding a host port stay, without
/// their requests. A typed `Container` is about 2 KB and a `Volume` 3 KB
/// however little of them is set, so a running pod's typed form is mostly
/// these; names, labels, owners, requests, host ports, claimed volumes,
/// affinity, tolerations and spread are what scheduling and disruption read,
/// and stay.
pub fn trim_unread(pod: &mut Pod) {
    if let Some(status) = pod.status.as_mut() {
        status.container_statuses = None;
        status.init_container_statuses = None;
        status.ephemeral_container_statuses = None;
        if let Some(cs) = status.conditions.as_mut() {
            cs.retain(|c| matches!(c.type_.as_str(), "Ready" | "PodScheduled"));
        }
    }
    if let Some(spec) = pod.spec.as_mut() {
        spec.ephemeral_containers = None;
        fold_requests(spec);
        if let Some(volumes) = spec.volumes.as_mut() {
            volumes.retain(|v| v.persistent_volume_claim.is_some() || v.ephemeral.is_some());
        }
        spec.volumes = spec.volumes.take().filter(|v| !v.is_empty());
    }
}

/// Replaces the containers' requests by their total as pod-level requests
/// and keeps only the containers (and sidecars) that hold a host port, with
/// nothing but their name, ports and restart policy. A pod whose requests do
/// not parse stays whole, so that its model names the field at fault.
fn fold_requests(spec: &mut PodSpec) {
    let Ok(total) = crate::resources::container_total(spec, "spec") else {
        return;
    };
    let requests = total
        .0
        .iter()
        .map(|(k, v)| (k.clone(), Quantity(v.to_k8s_string(k))))
        .collect();
    let pod_level = spec.resources.get_or_insert_with(Default::default);
    pod_level.requests = Some(requests);
    pod_level.limits = None;
    let port_holder = |c: Container| {
        c.ports
            .as_ref()
            .is_some_and(|ports| ports.iter().any(|p| p.host_port.is_some_and(|h| h > 0)))
            .then(|| Container {
                name: c.name,
                ports: c.ports,
                restart_policy: c.restart_policy,
                ..Container::default()
            })
    };
    spec.containers = std::mem::take(&mut spec.containers)
        .into_iter()
        .filter_map(port_holder)
        .collect();
    spec.init_containers = spec
        .init_containers
        .take()
        .map(|init| {
            init.into_iter()
                .filter(|c| c.restart_policy.as_deref() == Some("Always"))
                .filter_map(port_holder)
                .collect::<Vec<_>>()
        })
        .filter(|kept| !kept.is_empty());
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

    fn spec_of(p: &Pod) -> &PodSpec {
        p.spec.as_ref().unwrap()
    }

    /// A running pod as a real cluster lists it: probes, environment, mounts,
    /// statuses, beside everything scheduling and disruption read.
    fn running_in_production() -> Pod {
        let container = |name: &str, cpu: &str| {
            json!({"name": name, "image": "registry.example/app:1.2.3", "imagePullPolicy": "IfNotPresent",
                "command": ["/app"], "args": ["--port=8080"], "workingDir": "/srv",
                "env": [{"name": "MODE", "value": "prod"}, {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                "envFrom": [{"configMapRef": {"name": "settings"}}],
                "ports": [{"containerPort": 8080, "hostPort": 8080, "protocol": "TCP"}],
                "resources": {"requests": {"cpu": cpu, "memory": "512Mi"}, "limits": {"memory": "1Gi"}},
                "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 10},
                "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}},
                "startupProbe": {"tcpSocket": {"port": 8080}},
                "lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}},
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                "securityContext": {"runAsNonRoot": true},
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"})
        };
        let mut sidecar = container("proxy", "100m");
        sidecar["restartPolicy"] = json!("Always");
        pod(json!({
            "metadata": {"name": "web-1", "namespace": "shop", "uid": "u1", "labels": {"app": "web"},
                "annotations": {"karpenter.sh/do-not-disrupt": "10m"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "rs", "controller": true}],
                "creationTimestamp": "2026-12-04T10:00:00Z"},
            "spec": {"nodeName": "n1", "priority": 100, "overhead": {"cpu": "10m"},
                "containers": [container("web", "1")], "initContainers": [sidecar],
                "ephemeralContainers": [{"name": "debug", "image": "busybox"}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-web-1"}},
                    {"name": "settings", "configMap": {"name": "settings"}},
                    {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {"storageClassName": "fast", "accessModes": ["ReadWriteOnce"]}}}}],
                "nodeSelector": {"kubernetes.io/arch": "amd64"},
                "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "web", "effect": "NoSchedule"}],
                "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}]}},
                "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                    "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}]},
            "status": {"phase": "Running", "startTime": "2026-12-04T10:00:01Z", "hostIP": "10.0.0.1",
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-12-04T10:00:00Z"},
                    {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-12-04T10:00:02Z"},
                    {"type": "ContainersReady", "status": "True", "lastTransitionTime": "2026-12-04T10:00:09Z"},
                    {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-04T10:00:09Z"}],
                "containerStatuses": [{"name": "web", "image": "registry.example/app:1.2.3", "imageID": "sha256:1",
                    "containerID": "containerd://1", "ready": true, "restartCount": 0,
                    "state": {"running": {"startedAt": "2026-12-04T10:00:05Z"}}}],
                "initContainerStatuses": [{"name": "proxy", "image": "envoy", "imageID": "sha256:2", "ready": true,
                    "restartCount": 0, "state": {"running": {"startedAt": "2026-12-04T10:00:02Z"}}}]}
        }))
    }

    #[test]
    fn a_trimmed_pod_schedules_and_disrupts_as_the_whole_one() {
        let whole = running_in_production();
        let mut trimmed = whole.clone();
        trim_unread(&mut trimmed);
        let size = |p: &Pod| serde_json::to_string(p).unwrap().len();
        assert!(
            size(&trimmed) * 2 < size(&whole),
            "{} of {} bytes kept",
            size(&trimmed),
            size(&whole)
        );
        let model = |p: &Pod| format!("{:?}", crate::scheduling::pod::PodModel::from_pod(p).unwrap());
        assert_eq!(model(&trimmed), model(&whole));
        let now: jiff::Timestamp = "2026-12-04T10:05:00Z".parse().unwrap();
        assert_eq!(
            crate::do_not_disrupt::pod_started(&trimmed),
            crate::do_not_disrupt::pod_started(&whole)
        );
        assert_eq!(
            crate::do_not_disrupt::pod_protected(&trimmed, now),
            crate::do_not_disrupt::pod_protected(&whole, now)
        );
        let span = crate::pod_startup::window(None, now);
        assert_eq!(
            crate::pod_startup::durations([&trimmed], span),
            crate::pod_startup::durations([&whole], span)
        );
        assert_eq!(
            crate::pod_startup::durations([&whole], span).len(),
            1,
            "the startup is seen at all"
        );
        for p in [&trimmed, &whole] {
            assert_eq!(
                (key(p), node_name(p), is_terminal(p), is_daemonset_pod(p)),
                ("shop/web-1".into(), Some("n1"), false, false)
            );
        }
        let status = trimmed.status.as_ref().unwrap();
        assert!(status.container_statuses.is_none() && status.init_container_statuses.is_none());
        let kept: Vec<_> = status.conditions.iter().flatten().map(|c| c.type_.as_str()).collect();
        assert_eq!(kept, ["PodScheduled", "Ready"]);
        let volumes: Vec<_> = spec_of(&trimmed)
            .volumes
            .iter()
            .flatten()
            .map(|v| v.name.as_str())
            .collect();
        assert_eq!(volumes, ["data", "scratch"], "the volumes that claim storage");
        // Both containers hold host port 8080: they stay, with only their ports.
        let spec = trimmed.spec.as_ref().unwrap();
        assert_eq!(
            spec.containers[0],
            Container {
                name: "web".into(),
                ports: whole.spec.as_ref().unwrap().containers[0].ports.clone(),
                ..Container::default()
            }
        );
        assert_eq!(
            spec.init_containers.as_ref().unwrap()[0].restart_policy.as_deref(),
            Some("Always")
        );
    }

    /// Containers without host ports go, their requests kept as the pod's:
    /// each case's model is the whole pod's.
    #[test]
    fn folded_requests_are_the_containers_requests() {
        let c = |name: &str, resources: serde_json::Value| json!({"name": name, "image": "i", "resources": resources});
        let cases = [
            (
                "one container",
                json!({"containers": [c("a", json!({"requests": {"cpu": "1", "memory": "512Mi"}}))]}),
            ),
            (
                "limits only",
                json!({"containers": [c("a", json!({"limits": {"cpu": "250m", "nvidia.com/gpu": "1"}}))]}),
            ),
            (
                "two containers",
                json!({"containers": [c("a", json!({"requests": {"cpu": "1"}})), c("b", json!({"requests": {"cpu": "1500m", "memory": "1Gi"}}))]}),
            ),
            (
                "an init container larger than the rest",
                json!({"containers": [c("a", json!({"requests": {"cpu": "1"}}))],
                "initContainers": [c("setup", json!({"requests": {"cpu": "3", "memory": "2Gi"}}))]}),
            ),
            (
                "a sidecar",
                json!({"containers": [c("a", json!({"requests": {"cpu": "1"}}))],
                "initContainers": [{"name": "proxy", "image": "i", "restartPolicy": "Always", "resources": {"requests": {"cpu": "100m"}}}]}),
            ),
            (
                "pod-level requests",
                json!({"resources": {"requests": {"cpu": "2"}}, "overhead": {"memory": "64Mi"},
                "containers": [c("a", json!({"requests": {"cpu": "1", "memory": "1Gi"}}))]}),
            ),
            ("no requests", json!({"containers": [c("a", json!({}))]})),
        ];
        for (case, spec) in cases {
            let whole = pod(json!({"metadata": {"name": "p", "namespace": "default"}, "spec": spec}));
            let mut trimmed = whole.clone();
            trim_unread(&mut trimmed);
            let model = |p: &Pod| format!("{:?}", crate::scheduling::pod::PodModel::from_pod(p).unwrap());
            assert_eq!(model(&trimmed), model(&whole), "{case}");
            let spec = trimmed.spec.as_ref().unwrap();
            assert!(
                spec.containers.is_empty() && spec.init_containers.is_none(),
                "{case}: {spec:?}"
            );
        }
    }

    #[test]
    fn a_pod_whose_requests_do_not_parse_stays_whole() {
        let whole = pod(json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "a", "resources": {"requests": {"cpu": "lots"}}}]}}));
        let mut trimmed = whole.clone();
        trim_unread(&mut trimmed);
        assert_eq!(trimmed, whole);
        let err = crate::scheduling::pod::PodModel::from_pod(&trimmed).unwrap_err();
        assert!(
            err.to_string().contains("spec.containers[0].resources.requests.cpu"),
            "{err}"
        );
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
