//! The Kubernetes API test server, driven by the real kube-rs client.

use std::collections::BTreeMap;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use nodesmith::apis::NodePool;
use nodesmith_tests::kube_server::{Fault, KubeServer, NodeRegistration};
use serde_json::json;

fn pod(name: &str, cpu: &str, labels: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu, "memory": "100Mi"}}}]}
    }))
    .unwrap()
}

fn node_reg(name: &str, cpu: &str) -> NodeRegistration {
    NodeRegistration {
        name: name.into(),
        instance_id: format!("i-{name}"),
        instance_type: "m5.large".into(),
        zone: "us-east-1a".into(),
        capacity_type: "on-demand".into(),
        capacity: BTreeMap::from([("cpu".into(), cpu.into()), ("memory".into(), "8Gi".into()), ("pods".into(), "29".into())]),
        ..Default::default()
    }
}

#[tokio::test]
async fn crud_with_resource_versions_and_conflicts() {
    let server = KubeServer::start().await;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let created = pods.create(&PostParams::default(), &pod("a", "100m", json!({"app": "web"}))).await.unwrap();
    let rv1 = created.metadata.resource_version.clone().unwrap();
    assert!(created.metadata.uid.is_some());
    let err = pods.create(&PostParams::default(), &pod("a", "100m", json!({}))).await.unwrap_err();
    assert!(matches!(err, kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists"));

    let patched = pods.patch("a", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"tier": "front"}}}))).await.unwrap();
    let rv2 = patched.metadata.resource_version.clone().unwrap();
    assert_ne!(rv1, rv2);
    assert_eq!(patched.metadata.labels.unwrap().get("app").map(String::as_str), Some("web"));

    // A stale resourceVersion in a replace is a conflict.
    let mut stale = created.clone();
    stale.metadata.labels = Some(BTreeMap::from([("x".into(), "y".into())]));
    let err = pods.replace("a", &PostParams::default(), &stale).await.unwrap_err();
    assert!(matches!(err, kube::Error::Api(s) if s.code == 409 && s.reason == "Conflict"));

    // JSON patch with a failing test op is a conflict too.
    let jp: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv1},
        {"op": "add", "path": "/metadata/labels/z", "value": "1"}
    ]))
    .unwrap();
    let err = pods.patch("a", &PatchParams::default(), &Patch::<()>::Json(jp)).await.unwrap_err();
    assert!(matches!(err, kube::Error::Api(s) if s.code == 409));

    pods.delete("a", &DeleteParams::default()).await.unwrap();
    let err = pods.get("a").await.unwrap_err();
    assert!(matches!(err, kube::Error::Api(s) if s.code == 404));
}

#[tokio::test]
async fn lists_filter_by_label_and_field_selectors() {
    let server = KubeServer::start().await;
    server.apply(&pod("web-1", "100m", json!({"app": "web"}))).unwrap();
    server.apply(&pod("web-2", "100m", json!({"app": "web"}))).unwrap();
    server.apply(&pod("db-1", "100m", json!({"app": "db"}))).unwrap();
    server.register_node(&node_reg("n1", "1")).unwrap();
    server.schedule();
    let pods: Api<Pod> = Api::all(server.client());
    let names = |l: kube::core::ObjectList<Pod>| l.items.into_iter().map(|p| p.metadata.name.unwrap()).collect::<Vec<_>>();
    assert_eq!(names(pods.list(&ListParams::default().labels("app=web")).await.unwrap()), vec!["web-1", "web-2"]);
    assert_eq!(names(pods.list(&ListParams::default().labels("app in (db)")).await.unwrap()), vec!["db-1"]);
    assert_eq!(names(pods.list(&ListParams::default().fields("metadata.name=web-2")).await.unwrap()), vec!["web-2"]);
    assert_eq!(pods.list(&ListParams::default().fields("spec.nodeName=n1")).await.unwrap().items.len(), 3);
    assert_eq!(pods.list(&ListParams::default().fields("spec.nodeName=")).await.unwrap().items.len(), 0);
    let err = pods.list(&ListParams::default().fields("garbage")).await.unwrap_err();
    assert!(matches!(err, kube::Error::Api(s) if s.code == 400));
}

#[tokio::test]
async fn scheduler_binds_what_fits_and_marks_the_rest_unschedulable() {
    let server = KubeServer::start().await;
    server.register_node(&node_reg("n1", "1")).unwrap();
    server.apply(&pod("small", "600m", json!({}))).unwrap();
    server.apply(&pod("big", "600m", json!({}))).unwrap();
    let mut tainted = pod("selector", "10m", json!({}));
    tainted.spec.as_mut().unwrap().node_selector = Some(BTreeMap::from([("topology.kubernetes.io/zone".into(), "us-east-1b".into())]));
    server.apply(&tainted).unwrap();
    let report = server.schedule();
    assert_eq!(report.bound, vec![("default/big".to_string(), "n1".to_string())]);
    assert_eq!(report.unschedulable, vec!["default/selector".to_string(), "default/small".to_string()]);
    let small = server.pod("default", "small").unwrap();
    let cond = small.status.unwrap().conditions.unwrap().into_iter().find(|c| c.type_ == "PodScheduled").unwrap();
    assert_eq!((cond.status.as_str(), cond.reason.as_deref()), ("False", Some("Unschedulable")));
    // A second pass with nothing new writes nothing.
    let rv = server.pod("default", "small").unwrap().metadata.resource_version;
    assert_eq!(server.schedule().unschedulable, vec!["default/selector".to_string(), "default/small".to_string()]);
    assert_eq!(server.pod("default", "small").unwrap().metadata.resource_version, rv);
    // A tainted node is skipped by pods that do not tolerate it.
    let mut reg = node_reg("n2", "4");
    reg.taints = vec!["dedicated=gpu:NoSchedule".into()];
    server.register_node(&reg).unwrap();
    assert!(server.schedule().bound.is_empty());
    server.register_node(&node_reg("n3", "4")).unwrap();
    assert_eq!(server.schedule().bound, vec![("default/small".to_string(), "n3".to_string())]);
}

#[tokio::test]
async fn eviction_enforces_disruption_budgets() {
    let server = KubeServer::start().await;
    server.register_node(&node_reg("n1", "4")).unwrap();
    server.apply(&pod("w1", "100m", json!({"app": "web"}))).unwrap();
    server.apply(&pod("w2", "100m", json!({"app": "web"}))).unwrap();
    server.schedule();
    server
        .apply(&json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}}))
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    pods.evict("w1", &Default::default()).await.unwrap();
    let err = pods.evict("w2", &Default::default()).await.unwrap_err();
    match err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 429);
            assert_eq!(s.details.unwrap().causes[0].reason, "DisruptionBudget");
        }
        other => panic!("expected a 429, got {other}"),
    }
    assert!(server.pod("default", "w1").is_none());
    assert!(server.pod("default", "w2").is_some());
    let pdbs: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> = Api::namespaced(server.client(), "default");
    let status = pdbs.get("web").await.unwrap().status.unwrap();
    assert_eq!((status.current_healthy, status.desired_healthy, status.disruptions_allowed), (1, 1, 0));
}

#[tokio::test]
async fn watches_stream_changes_and_selector_transitions() {
    let server = KubeServer::start().await;
    let pods: Api<Pod> = Api::all(server.client());
    let list = pods.list(&ListParams::default()).await.unwrap();
    let rv = list.metadata.resource_version.unwrap();
    let mut stream = pods.watch(&WatchParams::default().fields("spec.nodeName="), &rv).await.unwrap().boxed();
    server.apply(&pod("p", "100m", json!({}))).unwrap();
    server.register_node(&node_reg("n1", "1")).unwrap();
    server.schedule();
    let first = stream.try_next().await.unwrap().unwrap();
    assert!(matches!(first, WatchEvent::Added(p) if p.metadata.name.as_deref() == Some("p")));
    // Binding moves the pod out of `spec.nodeName=`: the watch reports it deleted.
    let second = stream.try_next().await.unwrap().unwrap();
    assert!(matches!(second, WatchEvent::Deleted(p) if p.spec.as_ref().unwrap().node_name.as_deref() == Some("n1")));
}

#[tokio::test]
async fn faults_are_injected_and_crds_are_served() {
    let server = KubeServer::start().await;
    let nodes: Api<Node> = Api::all(server.client());
    server.inject(Fault::new(429, 2).path("/api/v1/nodes"));
    for _ in 0..2 {
        let err = nodes.list(&ListParams::default()).await.unwrap_err();
        assert!(matches!(err, kube::Error::Api(s) if s.code == 429));
    }
    assert!(nodes.list(&ListParams::default()).await.unwrap().items.is_empty());

    let np: NodePool = serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"},
        "spec": {"template": {"spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}, "requirements": []}}}
    }))
    .unwrap();
    let pools: Api<NodePool> = Api::all(server.client());
    pools.create(&PostParams::default(), &np).await.unwrap();
    let got = pools.get("default").await.unwrap();
    assert_eq!(got.spec.template.spec.node_class_ref.name, "default");
}
