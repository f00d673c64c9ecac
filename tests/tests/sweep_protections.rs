//! Protections on the local stack (moto, the Kubernetes API test server,
//! strict kubelets): a NodePool's template annotations and labels written
//! onto the nodes it launches (a pool-wide do-not-disrupt holds them), and a
//! terminationGracePeriod taking drift past do-not-disrupt pods, deleted in
//! time for their own grace period to end by the node's deadline.

use crate::local_stack::{Stack, fast, pods_on, taint_keys};
use serde_json::{Value, json};

/// The stack's on-demand pool that never consolidates, with `template_metadata`
/// and extra template spec fields.
fn pool(template_metadata: Value, spec_extra: Value) -> Value {
    let mut spec = json!({
        "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
        "requirements": [
            {"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["m5", "c5"]},
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
        ],
    });
    if let (Some(o), Some(extra)) = (spec.as_object_mut(), spec_extra.as_object()) {
        o.extend(extra.clone());
    }
    json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"}, "spec": {
        "template": {"metadata": template_metadata, "spec": spec},
        "disruption": {"consolidateAfter": "Never"},
        "limits": {"cpu": "64"}
    }})
}

/// A ReplicaSet's pod with these annotations and grace period.
fn web_pod(name: &str, annotations: Value, grace_seconds: i64) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
        "labels": {"app": "web"}, "annotations": annotations,
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "rs-web", "controller": true}]},
        "spec": {"terminationGracePeriodSeconds": grace_seconds,
            "containers": [{"name": "c", "image": "web", "resources": {"requests": {"cpu": "900m", "memory": "1Gi"}}}]}})
}

async fn stack(pool: &Value, annotations: Value, grace_seconds: i64) -> Stack {
    let s = Stack::new("64", 0).await;
    s.kube.apply(pool).unwrap();
    for i in 0..2 {
        s.kube
            .apply(&web_pod(&format!("web-{i}"), annotations.clone(), grace_seconds))
            .unwrap();
    }
    s.kube.schedule();
    s
}

fn events(s: &Stack, reason: &str) -> Vec<String> {
    s.kube
        .events()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        // The node's or pod's own (a node's disruption events are on its NodeClaim too).
        .filter(|e| e.involved_object.kind.as_deref() != Some("NodeClaim"))
        .filter_map(|e| e.message)
        .collect()
}

/// The pool with a template label added: its nodes drift.
fn drifted(mut p: Value) -> Value {
    p["spec"]["template"]["metadata"]["labels"]["tier"] = json!("front");
    p
}

#[tokio::test]
async fn a_pool_wide_do_not_disrupt_is_written_onto_its_nodes_and_holds_them() {
    let metadata = json!({"labels": {"team": "web"},
        "annotations": {"karpenter.sh/do-not-disrupt": "true", "example.com/owner": "ops"}});
    let p = pool(metadata, json!({}));
    let s = stack(&p, json!({}), 30).await;
    let old = s.running_node().await;
    let node = old.node_name.clone().unwrap();
    let n = s.kube.node(&node).unwrap();
    let annotations = n.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.get("karpenter.sh/do-not-disrupt").map(String::as_str),
        Some("true"),
        "{annotations:?}"
    );
    assert_eq!(annotations.get("example.com/owner").map(String::as_str), Some("ops"));
    assert_eq!(
        n.metadata.labels.unwrap_or_default().get("team").map(String::as_str),
        Some("web")
    );
    let claim = s.store.get_node_claim(&old.name).await.unwrap().unwrap();
    assert_eq!(
        claim.annotations.get("karpenter.sh/do-not-disrupt").map(String::as_str),
        Some("true")
    );

    // The pool changes: its node drifts, and the annotation holds it.
    s.kube.apply(&drifted(p)).unwrap();
    let sweeper = s.sweeper(fast());
    for _ in 0..2 {
        let report = sweeper.run().await.unwrap();
        assert!(report.disruption.started.is_empty(), "{:?}", report.disruption);
        // Eligible for drift, held; never for consolidation (consolidateAfter: Never).
        let eligible = |r| {
            nodesmith::telemetry::value(
                &report.metrics(),
                "karpenter_voluntary_disruption_eligible_nodes",
                &[("reason", r)],
            )
        };
        assert_eq!((eligible("drifted"), eligible("underutilized")), (Some(1.0), Some(0.0)));
    }
    assert!(s.store.disruptions().await.unwrap().is_empty());
    assert!(!taint_keys(&s.kube.node(&node).unwrap()).contains(&"karpenter.sh/disrupted".to_string()));
    let blocked = events(&s, "DisruptionBlocked");
    assert!(
        blocked
            .iter()
            .any(|m| m.contains("node has karpenter.sh/do-not-disrupt")),
        "{blocked:?}"
    );
    // kubectl shows the claim drifted (and, with consolidateAfter Never, not
    // consolidatable), and the block on the NodeClaim too, as Karpenter does.
    let kubectl = s.kubectl("drifted");
    let o = kubectl.json(&["get", "nodeclaim", &old.name]).await;
    let conditions = o["status"]["conditions"].as_array().cloned().unwrap_or_default();
    let of = |t: &str| conditions.iter().find(|c| c["type"] == t).cloned();
    let drifted = of("Drifted").unwrap_or_default();
    assert_eq!(
        (&drifted["status"], drifted["message"].as_str()),
        (&json!("True"), Some("NodePool default changed")),
        "{o}"
    );
    assert_eq!(of("Consolidatable"), None, "{o}");
    let described = kubectl.ok(&["describe", "nodeclaim", &old.name]).await;
    assert!(
        described.contains("DisruptionBlocked") && described.contains("Cannot disrupt NodeClaim:"),
        "{described}"
    );
    let _ = std::fs::remove_dir_all(&kubectl.dir);
}

#[tokio::test]
async fn drift_with_a_termination_grace_period_goes_past_do_not_disrupt_pods_deleting_them_in_time() {
    // The pods' own two hours of grace outlast the node's hour: they are
    // deleted as soon as the drain begins, past their do-not-disrupt.
    let p = pool(
        json!({"labels": {"team": "web"}}),
        json!({"terminationGracePeriod": "1h"}),
    );
    let s = stack(&p, json!({"karpenter.sh/do-not-disrupt": "true"}), 7200).await;
    let old = s.running_node().await;
    let node = old.node_name.clone().unwrap();
    s.kube.apply(&drifted(p)).unwrap();
    let sweeper = s.sweeper(fast());
    let mut started = false;
    let mut created = 0.0;
    for _ in 0..12 {
        let report = sweeper.run().await.unwrap();
        assert!(report.disruption.failed.is_empty(), "{:?}", report.disruption.failed);
        started |= !report.disruption.started.is_empty();
        created += nodesmith::telemetry::value(
            &report.metrics(),
            "karpenter_nodeclaims_created_total",
            &[("nodepool", "default"), ("reason", "drifted")],
        )
        .unwrap_or_default();
        if s.store.get_node_claim(&old.name).await.unwrap().is_none() {
            break;
        }
        s.launch_all().await;
        s.kubelet_step().await;
    }
    assert!(started, "drift began despite the do-not-disrupt pods");
    assert_eq!(created, 1.0, "one replacement, counted as Karpenter counts it");
    assert!(
        s.store.get_node_claim(&old.name).await.unwrap().is_none(),
        "the drifted node's claim is gone: {:?}",
        s.store.disruptions().await.unwrap()
    );
    assert!(s.kube.node(&node).is_none(), "the Node is deleted");
    assert!(pods_on(&s.kube, &node).is_empty());
    // Deleted, not evicted: the eviction API would have refused nothing, but
    // do-not-disrupt pods are never evicted; the deadline deleted them.
    assert!(events(&s, "Evicted").is_empty(), "{:?}", events(&s, "Evicted"));
    let states = s.instance_states().await;
    assert!(
        matches!(
            states.get(old.instance_id.as_deref().unwrap()).map(String::as_str),
            Some("terminated" | "shutting-down")
        ),
        "{states:?}"
    );
}
