//! Nominations on the local stack (moto, the Kubernetes API test server):
//! `provision` records the node its solve gave a pending pod, and the sweep's
//! emptiness and consolidation spare exactly that node for Karpenter's window
//! (with a `DisruptionBlocked` event naming the nomination) while a pending
//! pod that no pool can serve holds nothing back.

use crate::local_stack::{Stack, fast};
use nodesmith::nodeclaim::Phase;
use nodesmith::state::NominationRecord;
use serde_json::{Value, json};

/// The stack's pool (on-demand m5/c5 `large`) with this `disruption` block.
fn pool(disruption: Value) -> Value {
    json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"}, "spec": {
        "template": {"metadata": {"labels": {"team": "web"}}, "spec": {
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
            "requirements": [
                {"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["m5", "c5"]},
                {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                {"key": "karpenter.k8s.aws/instance-size", "operator": "In", "values": ["large"]}
            ]}},
        "disruption": disruption,
        "limits": {"cpu": "64"}
    }})
}

/// A ReplicaSet pod asking `cpu`, with `extra` fields merged into its spec and status.
fn web_pod(name: &str, cpu: &str, spec: Value, status: Value) -> Value {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
        "labels": {"app": "web"},
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "rs-web", "controller": true}]},
        "spec": {"containers": [{"name": "c", "image": "web", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]}});
    if let (Some(s), Some(extra)) = (p["spec"].as_object_mut(), spec.as_object()) {
        s.extend(extra.clone());
    }
    if !status.is_null() {
        p["status"] = status;
    }
    p
}

/// Messages of the `DisruptionBlocked` events on `node`.
fn blocked_events(s: &Stack, node: &str) -> Vec<String> {
    s.kube
        .events()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("DisruptionBlocked"))
        .filter(|e| e.involved_object.name.as_deref() == Some(node))
        .filter_map(|e| e.message)
        .collect()
}

#[tokio::test]
async fn an_unplaceable_pending_pod_no_longer_freezes_consolidation_and_only_the_nominated_node_is_spared() {
    // Three large nodes, one 1500m pod each, all Initialized; then the pods go.
    let s = Stack::new("64", 0).await;
    s.kube.apply(&pool(json!({"consolidateAfter": "Never"}))).unwrap();
    let names = ["big-0", "big-1", "big-2"];
    for n in names {
        s.kube.apply(&web_pod(n, "1500m", json!({}), Value::Null)).unwrap();
    }
    s.kube.schedule();
    assert_eq!(s.launched(&names).await.len(), 3);
    let sweeper = s.sweeper(fast());
    for _ in 0..4 {
        s.kubelet_step().await;
        sweeper.run().await.unwrap();
    }
    let claims = s.claims().await;
    assert!(claims.iter().all(|c| c.phase == Phase::Initialized), "{claims:?}");
    for n in names {
        s.kube.delete("v1", "Pod", "default", n).unwrap();
    }
    s.kube
        .apply(&pool(
            json!({"consolidationPolicy": "WhenEmpty", "consolidateAfter": "0s", "budgets": [{"nodes": "100%"}]}),
        ))
        .unwrap();
    let mut nodes: Vec<String> = claims.iter().filter_map(|c| c.node_name.clone()).collect();
    nodes.sort();
    let kept = nodes[0].clone();

    // A pod no pool can serve (900 cpu), marked unschedulable by the scheduler;
    // and one that fits only on `kept`, not bound yet.
    s.kube.apply(&web_pod("stuck", "900", json!({}), Value::Null)).unwrap();
    s.kube.schedule();
    let unschedulable = json!({"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]});
    s.kube
        .apply(&web_pod(
            "fits",
            "500m",
            json!({"nodeSelector": {"kubernetes.io/hostname": kept}}),
            unschedulable,
        ))
        .unwrap();

    // provision nominates `kept` for Karpenter's 20 s window and nothing for `stuck`.
    let t0 = jiff::Timestamp::now();
    let at = |secs: i64| t0 + jiff::SignedDuration::from_secs(secs);
    let out = s
        .provisioner()
        .handle_at(
            &crate::local_stack::event(vec![
                crate::local_stack::pod_ref("stuck"),
                crate::local_stack::pod_ref("fits"),
            ]),
            t0,
        )
        .await;
    assert!(out.failed.is_empty() && out.created.is_empty(), "{out:?}");
    assert_eq!((out.placed_on_existing, out.unschedulable.len()), (1, 1), "{out:?}");
    let recorded = s.store.live_nominations(t0.as_millisecond()).await.unwrap();
    assert_eq!(
        recorded,
        [NominationRecord {
            target: kept.clone(),
            kind: nodesmith::scheduling::TargetKind::Node,
            pod: "default/fits".into(),
            pods: 1,
            until_ms: at(20).as_millisecond(),
        }]
    );

    // Both pods pending: the other two empty nodes go, `kept` is spared.
    let report = sweeper.run_at(at(1)).await.unwrap();
    assert!(report.disruption.failed.is_empty(), "{:?}", report.disruption.failed);
    let mut started: Vec<String> = report.disruption.started.iter().map(|(n, _)| n.clone()).collect();
    started.sort();
    assert_eq!(started, nodes[1..], "{report:?}");
    let held = blocked_events(&s, &kept);
    assert!(
        held.iter()
            .any(|m| m.contains("nominated for pending pod default/fits")),
        "{held:?}"
    );

    // `fits` is gone (deleted, or bound elsewhere): the recorded nomination
    // alone holds `kept` until its window ends, as `stuck` is still pending...
    s.kube.delete("v1", "Pod", "default", "fits").unwrap();
    let report = sweeper.run_at(at(10)).await.unwrap();
    assert!(report.disruption.failed.is_empty(), "{:?}", report.disruption.failed);
    assert!(!report.disruption.started.iter().any(|(n, _)| *n == kept), "{report:?}");
    assert!(
        report
            .disruption
            .blocked
            .iter()
            .any(|(n, why)| *n == kept && why.contains("by provisioning, until")),
        "{:?}",
        report.disruption.blocked
    );
    // ... and then it is empty like any other.
    let report = sweeper.run_at(at(30)).await.unwrap();
    assert!(report.disruption.failed.is_empty(), "{:?}", report.disruption.failed);
    assert!(report.disruption.started.iter().any(|(n, _)| *n == kept), "{report:?}");
}
