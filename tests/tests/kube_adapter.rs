//! The Kubernetes adapter (`nodesmith::kubernetes::KubeCluster`) against the
//! Kubernetes API test server, through the real kube-rs client.

use std::collections::BTreeMap;
use std::time::Duration;

use http::Method;
use k8s_openapi::api::core::v1::Pod;
use nodesmith::kubernetes::drain::Skip;
use nodesmith::kubernetes::events::{EventSpec, node_name_ref};
use nodesmith::kubernetes::retry::RetryPolicy;
use nodesmith::kubernetes::{Cluster, DrainOptions, EvictionOutcome, KubeCluster, drain};
use nodesmith_tests::kube_server::{Fault, KubeServer, NodeRegistration};
use serde_json::{Value, json};

fn fast_retry() -> RetryPolicy {
    RetryPolicy {
        attempts: 4,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
    }
}

fn adapter(server: &KubeServer) -> KubeCluster {
    KubeCluster::from_client(server.lambda_client()).with_retry(fast_retry())
}

fn pod(name: &str, labels: Value, annotations: Value, extra_meta: Value) -> Value {
    let mut meta = json!({"name": name, "namespace": "default", "labels": labels, "annotations": annotations});
    json_patch::merge(&mut meta, &extra_meta);
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "100m"}}}]}})
}

fn node(name: &str) -> NodeRegistration {
    NodeRegistration {
        name: name.into(),
        instance_id: format!("i-{name}"),
        instance_type: "m5.xlarge".into(),
        zone: "us-east-1a".into(),
        capacity_type: "spot".into(),
        capacity: BTreeMap::from([
            ("cpu".into(), "4".into()),
            ("memory".into(), "16Gi".into()),
            ("pods".into(), "58".into()),
        ]),
        ..Default::default()
    }
}

/// A node running two `app=web` pods guarded by a PDB (minAvailable 1), one
/// do-not-disrupt pod, one DaemonSet pod and one mirror pod.
async fn busy_node() -> KubeServer {
    let server = KubeServer::start().await;
    server.register_node(&node("n1")).unwrap();
    server
        .apply(&pod("web-1", json!({"app": "web"}), json!({}), json!({})))
        .unwrap();
    server
        .apply(&pod("web-2", json!({"app": "web"}), json!({}), json!({})))
        .unwrap();
    server
        .apply(&pod(
            "precious",
            json!({}),
            json!({"karpenter.sh/do-not-disrupt": "true"}),
            json!({}),
        ))
        .unwrap();
    let ds_owner = json!({"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "u-ds", "controller": true}]});
    server.apply(&pod("agent-x", json!({}), json!({}), ds_owner)).unwrap();
    server
        .apply(&pod(
            "static",
            json!({}),
            json!({"kubernetes.io/config.mirror": "abc"}),
            json!({}),
        ))
        .unwrap();
    server
        .apply(&json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web", "namespace": "default"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}}))
        .unwrap();
    let report = server.schedule();
    assert_eq!(report.bound.len(), 5);
    server
}

#[tokio::test]
async fn drain_evicts_within_the_pdb_and_honours_do_not_disrupt() {
    let server = busy_node().await;
    let cluster = adapter(&server);
    let report = drain(&cluster, "n1", DrainOptions::default()).await.unwrap();
    assert_eq!(report.evicted, vec!["default/web-1".to_string()]);
    assert_eq!(report.blocked_by_pdb.len(), 1);
    assert_eq!(report.blocked_by_pdb[0].0, "default/web-2");
    assert!(
        report.blocked_by_pdb[0].1.contains("disruption budget web"),
        "{:?}",
        report.blocked_by_pdb
    );
    assert_eq!(report.do_not_disrupt, vec!["default/precious".to_string()]);
    assert_eq!(
        report.skipped,
        vec![
            ("default/agent-x".to_string(), Skip::DaemonSet),
            ("default/static".to_string(), Skip::Mirror)
        ]
    );
    assert!(!report.is_complete());
    // The blocked and protected pods are still there; the evicted one is gone.
    assert!(server.pod("default", "web-1").is_none());
    assert!(server.pod("default", "web-2").is_some());
    assert!(server.pod("default", "precious").is_some());
    assert!(server.pod("default", "agent-x").is_some());
    // The eviction was recorded as an Event on the pod.
    assert!(
        server
            .events()
            .iter()
            .any(|e| e.reason.as_deref() == Some("Evicted") && e.involved_object.name.as_deref() == Some("web-1"))
    );
    // Exactly one eviction request per evictable pod: the PDB's 429 is an answer, not retried.
    assert_eq!(server.count_requests(&Method::POST, "/pods/web-2/eviction"), 1);
}

#[tokio::test]
async fn at_the_deadline_a_drain_deletes_what_the_pdb_and_do_not_disrupt_hold() {
    let server = busy_node().await;
    let cluster = adapter(&server);
    let now = jiff::Timestamp::now();
    // The node's terminationGracePeriod ends now: no pod's 30 s of grace fits before it.
    let options = DrainOptions {
        now,
        deadline: Some(now),
        ..DrainOptions::default()
    };
    let report = drain(&cluster, "n1", options).await.unwrap();
    let mut deleted = report.deleted.clone();
    deleted.sort();
    assert_eq!(deleted, ["default/precious", "default/web-1", "default/web-2"]);
    assert!(report.blocked_by_pdb.is_empty() && report.do_not_disrupt.is_empty());
    assert!(server.pod("default", "web-2").is_none() && server.pod("default", "precious").is_none());
    assert!(server.pod("default", "agent-x").is_some(), "the DaemonSet's pod stays");
    assert_eq!(
        server.count_requests(&Method::POST, "/eviction"),
        0,
        "deleted, not evicted"
    );
    // An hour ahead, nothing is due yet: the PDB and do-not-disrupt hold again.
    let server = busy_node().await;
    let cluster = adapter(&server);
    let later = DrainOptions {
        deadline: Some(now + jiff::SignedDuration::from_hours(1)),
        ..options
    };
    let report = drain(&cluster, "n1", later).await.unwrap();
    assert!(report.deleted.is_empty());
    assert_eq!(report.do_not_disrupt, vec!["default/precious".to_string()]);
}

#[tokio::test]
async fn forced_drain_evicts_do_not_disrupt_pods() {
    let server = busy_node().await;
    let cluster = adapter(&server);
    let report = drain(
        &cluster,
        "n1",
        DrainOptions {
            ignore_do_not_disrupt: true,
            ..DrainOptions::default()
        },
    )
    .await
    .unwrap();
    assert!(report.evicted.contains(&"default/precious".to_string()));
    assert!(server.pod("default", "precious").is_none());
}

#[tokio::test]
async fn evict_reports_blocked_evicted_and_gone() {
    let server = busy_node().await;
    let cluster = adapter(&server);
    let web1 = server.pod("default", "web-1").unwrap();
    let web2 = server.pod("default", "web-2").unwrap();
    assert_eq!(cluster.evict(&web1).await.unwrap(), EvictionOutcome::Evicted);
    assert!(matches!(
        cluster.evict(&web2).await.unwrap(),
        EvictionOutcome::Blocked { .. }
    ));
    assert_eq!(cluster.evict(&web1).await.unwrap(), EvictionOutcome::Gone);
}

#[tokio::test]
async fn throttled_evictions_are_retried_until_they_succeed() {
    let server = busy_node().await;
    let cluster = adapter(&server);
    // A 429 without a DisruptionBudget cause is API throttling: retry.
    server.inject(Fault::new(429, 2).on(Method::POST).path("/eviction"));
    let web1 = server.pod("default", "web-1").unwrap();
    assert_eq!(cluster.evict(&web1).await.unwrap(), EvictionOutcome::Evicted);
    assert_eq!(server.count_requests(&Method::POST, "/pods/web-1/eviction"), 3);
}

#[tokio::test]
async fn taint_conflicts_are_retried_from_a_fresh_read() {
    let server = busy_node().await;
    let cluster = adapter(&server);
    server.inject(Fault::new(409, 2).on(Method::PATCH).path("/api/v1/nodes/n1"));
    assert!(cluster.taint_disrupted("n1").await.unwrap());
    assert_eq!(server.count_requests(&Method::PATCH, "/api/v1/nodes/n1"), 3);
    let taints = server.node("n1").unwrap().spec.unwrap().taints.unwrap();
    assert_eq!(
        taints
            .iter()
            .filter(|t| t.key == "karpenter.sh/disrupted" && t.effect == "NoSchedule")
            .count(),
        1
    );
    // Idempotent: a second call changes nothing.
    assert!(!cluster.taint_disrupted("n1").await.unwrap());
    assert_eq!(server.count_requests(&Method::PATCH, "/api/v1/nodes/n1"), 3);
    assert!(cluster.untaint_disrupted("n1").await.unwrap());
    assert!(
        server
            .node("n1")
            .unwrap()
            .spec
            .unwrap()
            .taints
            .unwrap_or_default()
            .is_empty()
    );
    // The new taint keeps the scheduler away.
    assert!(cluster.taint_disrupted("n1").await.unwrap());
    server.apply(&pod("late", json!({}), json!({}), json!({}))).unwrap();
    assert_eq!(server.schedule().unschedulable, vec!["default/late".to_string()]);
}

#[tokio::test]
async fn a_real_stale_write_conflicts_and_is_retried() {
    let server = busy_node().await;
    let cluster = adapter(&server);
    // Someone else changes the node between the adapter's read and its write,
    // twice: the server answers 409 for the stale resourceVersion, the adapter re-reads.
    server.modify_after_get("/api/v1/nodes/n1", 2);
    assert!(cluster.taint_disrupted("n1").await.unwrap());
    assert_eq!(server.count_requests(&Method::GET, "/api/v1/nodes/n1"), 3);
    assert_eq!(server.count_requests(&Method::PATCH, "/api/v1/nodes/n1"), 3);
    let n = server.node("n1").unwrap();
    assert!(n.metadata.annotations.unwrap().contains_key("test.nodesmith/touched"));
    assert_eq!(n.spec.unwrap().taints.unwrap().len(), 1);
}

#[tokio::test]
async fn transient_list_failures_are_retried_and_persistent_ones_reported() {
    let server = busy_node().await;
    let cluster = adapter(&server);
    server.inject(Fault::new(503, 2).on(Method::GET).path("/api/v1/nodes"));
    assert_eq!(cluster.nodes().await.unwrap().len(), 1);
    server.inject(Fault::new(429, 10).on(Method::GET).path("/api/v1/nodes"));
    let err = cluster.nodes().await.unwrap_err();
    assert_eq!(err.code(), Some(429));
    assert!(err.to_string().contains("list nodes"), "{err}");
}

#[tokio::test]
async fn pending_pods_are_the_unschedulable_ones() {
    let server = KubeServer::start().await;
    server.register_node(&node("n1")).unwrap();
    server.apply(&pod("fits", json!({}), json!({}), json!({}))).unwrap();
    let mut picky = pod("picky", json!({}), json!({}), json!({}));
    json_patch::merge(&mut picky, &json!({"spec": {"nodeSelector": {"gpu": "true"}}}));
    server.apply(&picky).unwrap();
    server
        .apply(&pod("not-yet-seen", json!({}), json!({}), json!({})))
        .unwrap();
    let cluster = adapter(&server);
    // Before the scheduler ran nothing is known to be unschedulable.
    assert!(cluster.pending_pods().await.unwrap().is_empty());
    server.schedule();
    let pending: Vec<String> = cluster
        .pending_pods()
        .await
        .unwrap()
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(pending, vec!["picky".to_string()]);
    let on_node: Vec<String> = cluster
        .pods_on_node("n1")
        .await
        .unwrap()
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(on_node, vec!["fits".to_string(), "not-yet-seen".to_string()]);
    // No function reads one pod by name, so no function's role grants it:
    // the read itself is checked as the admin.
    let admin = KubeCluster::from_client(server.client());
    assert!(admin.pod("default", "picky").await.unwrap().is_some());
    assert!(admin.pod("default", "nope").await.unwrap().is_none());
}

#[tokio::test]
async fn lists_every_kind_the_functions_read() {
    let server = KubeServer::start().await;
    for obj in [
        json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent", "namespace": "kube-system"},
            "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c"}]}}}}),
        json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv1"}, "spec": {"capacity": {"storage": "1Gi"}}}),
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data", "namespace": "default"}, "spec": {"storageClassName": "gp3"}}),
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "gp3"}, "provisioner": "ebs.csi.aws.com", "volumeBindingMode": "WaitForFirstConsumer"}),
        json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"},
            "spec": {"template": {"spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}, "requirements": []}}}}),
        json!({"apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "default"},
            "spec": {"role": "KarpenterNodeRole", "amiSelectorTerms": [{"alias": "al2023@latest"}], "subnetSelectorTerms": [{"tags": {"k": "v"}}], "securityGroupSelectorTerms": [{"tags": {"k": "v"}}]}}),
    ] {
        server.apply(&obj).unwrap();
    }
    let cluster = adapter(&server);
    assert_eq!(cluster.daemon_sets().await.unwrap().len(), 1);
    assert_eq!(cluster.persistent_volumes().await.unwrap().len(), 1);
    assert_eq!(
        cluster.persistent_volume_claims().await.unwrap()[0]
            .spec
            .as_ref()
            .unwrap()
            .storage_class_name
            .as_deref(),
        Some("gp3")
    );
    assert_eq!(
        cluster.storage_classes().await.unwrap()[0].provisioner,
        "ebs.csi.aws.com"
    );
    assert_eq!(cluster.node_pools().await.unwrap()[0].name(), "default");
    assert_eq!(
        cluster.node_classes().await.unwrap()[0].ami_family().as_deref(),
        Some("AL2023")
    );
    assert!(cluster.pod_disruption_budgets().await.unwrap().is_empty());
}

#[tokio::test]
async fn nodes_are_deleted_idempotently_and_events_recorded() {
    let server = KubeServer::start().await;
    server.register_node(&node("n1")).unwrap();
    let cluster = adapter(&server);
    let n = cluster.node("n1").await.unwrap().unwrap();
    cluster
        .emit_event(&EventSpec::disrupting(
            nodesmith::kubernetes::events::node_ref(&n),
            "Underutilized",
        ))
        .await
        .unwrap();
    cluster
        .emit_event(&EventSpec::disruption_blocked(
            node_name_ref("n1"),
            "pdb default/web prevents eviction",
        ))
        .await
        .unwrap();
    let p: Pod = serde_json::from_value(pod("w", json!({}), json!({}), json!({}))).unwrap();
    cluster
        .emit_event(&EventSpec::nominated(&p, "default-x1"))
        .await
        .unwrap();
    let events = server.events();
    let reasons: Vec<&str> = events.iter().filter_map(|e| e.reason.as_deref()).collect();
    assert_eq!(events.len(), 3, "{reasons:?}");
    for r in ["Disrupting", "DisruptionBlocked", "Nominated"] {
        assert!(reasons.contains(&r), "{reasons:?}");
    }
    assert!(cluster.delete_node("n1", None).await.unwrap());
    assert!(!cluster.delete_node("n1", None).await.unwrap());
    assert!(cluster.node("n1").await.unwrap().is_none());
}

#[tokio::test]
async fn a_node_recreated_under_the_same_name_is_not_deleted() {
    let server = KubeServer::start().await;
    server.register_node(&node("n1")).unwrap();
    let cluster = adapter(&server);
    let decided_on = cluster.node("n1").await.unwrap().unwrap();
    // The instance went and another joined under the same name (its private IP reused).
    server.delete("v1", "Node", "", "n1").unwrap();
    let successor = server.register_node(&node("n1")).unwrap();
    assert_ne!(decided_on.metadata.uid, successor.metadata.uid);
    assert!(
        !cluster
            .delete_node("n1", decided_on.metadata.uid.as_deref())
            .await
            .unwrap(),
        "deleting the Node decided on took its successor"
    );
    assert!(
        cluster.node("n1").await.unwrap().is_some(),
        "a Node recreated under the name of one decided on was deleted"
    );
    assert!(
        cluster
            .delete_node("n1", successor.metadata.uid.as_deref())
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn an_event_on_an_object_with_the_longest_name_is_recorded() {
    let server = KubeServer::start().await;
    let cluster = adapter(&server);
    let long = format!("web-{}", "x".repeat(249));
    assert_eq!(long.len(), 253, "the longest name an object can have");
    let p: Pod = serde_json::from_value(pod(&long, json!({}), json!({}), json!({}))).unwrap();
    let spec = EventSpec::nominated(&p, "default-x1");
    cluster
        .emit_event(&spec)
        .await
        .unwrap_or_else(|e| panic!("the event was refused: {}", nodesmith::telemetry::causes(&e)));
    let events = server.events();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].involved_object.name.as_deref(), Some(long.as_str()));
    // The test server is as strict as the API server about names.
    let mut named = serde_json::to_value(spec.to_event(jiff::Timestamp::now())).unwrap();
    named["metadata"]["name"] = json!(format!("{long}.0123456789abcdef"));
    let refused = server.apply(&named).unwrap_err();
    assert!(refused.contains("must be no more than 253 characters"), "{refused}");
}

#[tokio::test]
async fn a_node_now_backed_by_another_instance_is_left_alone() {
    let server = KubeServer::start().await;
    server.register_node(&node("n1")).unwrap();
    let cluster = adapter(&server);
    let delete_of =
        |instance: &'static str| nodesmith::kubernetes::cluster::delete_node_of(&cluster, "n1", Some(instance));
    // The claim's instance was i-old; the Node of that name is i-n1's now.
    assert!(!delete_of("i-old").await.unwrap());
    assert!(cluster.node("n1").await.unwrap().is_some());
    assert!(delete_of("i-n1").await.unwrap());
    assert!(cluster.node("n1").await.unwrap().is_none());
    assert!(!delete_of("i-n1").await.unwrap(), "nothing left to delete");
}

/// A list longer than one page is read over several requests (the adapter
/// pages as client-go's pager does), every object arrives once, and managed
/// fields are not kept. The list takes one token of the rate limit, as an
/// informer's list is one request: here the only token for a thousand
/// seconds (before, its second page waited for the next one).
#[tokio::test]
async fn a_list_longer_than_a_page_is_read_over_several_requests() {
    let server = KubeServer::start().await;
    let page = nodesmith::kubernetes::kube_cluster::LIST_PAGE_SIZE as usize;
    let total = 2 * page + 5;
    for i in 0..total {
        let managed = json!({"managedFields": [{"manager": "kubectl", "operation": "Apply", "apiVersion": "v1",
            "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {"f:app": {}}}}}]});
        server
            .apply(&pod(&format!("p{i:04}"), json!({"app": "web"}), json!({}), managed))
            .unwrap();
    }
    let before = server.count_requests(&Method::GET, "/api/v1/pods");
    let one_token = adapter(&server).with_rate_limit(0.001, 1);
    let pods = tokio::time::timeout(Duration::from_secs(60), one_token.pods())
        .await
        .expect("the list's further pages do not wait for the rate limit")
        .unwrap();
    let requests = server.count_requests(&Method::GET, "/api/v1/pods") - before;
    assert_eq!(pods.len(), total);
    let names: std::collections::BTreeSet<_> = pods.iter().map(|p| p.metadata.name.clone()).collect();
    assert_eq!(names.len(), total, "each object once");
    // Pages are read while the next is fetched, and still kept in order.
    let order: Vec<_> = pods.iter().map(|p| p.metadata.name.clone()).collect();
    assert_eq!(order, names.into_iter().collect::<Vec<_>>(), "in the server's order");
    assert_eq!(requests, 3, "{total} pods in pages of {page}");
    assert!(
        pods.iter().all(|p| p.metadata.managed_fields.is_none()),
        "managed fields are dropped"
    );
}

/// The whole-cluster pods list keeps what scheduling and disruption read of
/// a pod and drops the rest as each page is read (a running pod's statuses
/// and containers are most of its typed form).
#[tokio::test]
async fn the_pods_list_drops_what_is_never_read_of_a_pod() {
    let server = KubeServer::start().await;
    let mut p = pod("web", json!({"app": "web"}), json!({}), json!({}));
    p["spec"]["containers"][0]["env"] = json!([{"name": "MODE", "value": "prod"}]);
    p["spec"]["containers"][0]["readinessProbe"] = json!({"httpGet": {"path": "/ready", "port": 8080}});
    p["spec"]["containers"][0]["ports"] = json!([{"containerPort": 8080, "hostPort": 8080}]);
    p["status"] = json!({"phase": "Running", "startTime": "2026-12-04T10:00:01Z", "conditions": [
        {"type": "Initialized", "status": "True"}, {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-04T10:00:09Z"}],
        "containerStatuses": [{"name": "c", "image": "busybox", "imageID": "sha256:1", "ready": true, "restartCount": 0}]});
    server.apply(&p).unwrap();
    let cluster = adapter(&server);
    let listed = cluster.pods().await.unwrap().into_vec();
    let [listed] = listed.as_slice() else {
        panic!("one pod, not {}", listed.len())
    };
    let (spec, status) = (listed.spec.as_ref().unwrap(), listed.status.as_ref().unwrap());
    let c = &spec.containers[0];
    assert!(
        c.env.is_none() && c.readiness_probe.is_none() && c.image.is_none(),
        "{c:?}"
    );
    assert!(status.container_statuses.is_none());
    let conditions: Vec<_> = status.conditions.iter().flatten().map(|c| c.type_.as_str()).collect();
    assert_eq!(conditions, ["Ready"]);
    assert_eq!(
        status.start_time.as_ref().map(|t| t.0.to_string()).as_deref(),
        Some("2026-12-04T10:00:01Z")
    );
    // The container's requests are the pod's now; it stays for its host port.
    assert!(c.resources.is_none(), "{c:?}");
    assert!(
        spec.resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .is_some_and(|r| r.contains_key("cpu"))
    );
    assert_eq!(c.ports.as_ref().unwrap()[0].host_port, Some(8080));
}
