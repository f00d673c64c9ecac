//! The Kubernetes API test server, driven by the real kube-rs client.

use std::collections::BTreeMap;
use std::time::Duration;

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
        capacity: BTreeMap::from([
            ("cpu".into(), cpu.into()),
            ("memory".into(), "8Gi".into()),
            ("pods".into(), "29".into()),
        ]),
        ..Default::default()
    }
}

#[tokio::test]
async fn crud_with_resource_versions_and_conflicts() {
    let server = KubeServer::start().await;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let created = pods
        .create(&PostParams::default(), &pod("a", "100m", json!({"app": "web"})))
        .await
        .unwrap();
    let rv1 = created.metadata.resource_version.clone().unwrap();
    assert!(created.metadata.uid.is_some());
    let err = pods
        .create(&PostParams::default(), &pod("a", "100m", json!({})))
        .await
        .unwrap_err();
    assert!(matches!(err, kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists"));

    let patched = pods
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"tier": "front"}}})),
        )
        .await
        .unwrap();
    let rv2 = patched.metadata.resource_version.clone().unwrap();
    assert_ne!(rv1, rv2);
    assert_eq!(
        patched.metadata.labels.unwrap().get("app").map(String::as_str),
        Some("web")
    );

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
    let err = pods
        .patch("a", &PatchParams::default(), &Patch::<()>::Json(jp))
        .await
        .unwrap_err();
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
    let names = |l: kube::core::ObjectList<Pod>| {
        l.items
            .into_iter()
            .map(|p| p.metadata.name.unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(pods.list(&ListParams::default().labels("app=web")).await.unwrap()),
        vec!["web-1", "web-2"]
    );
    assert_eq!(
        names(pods.list(&ListParams::default().labels("app in (db)")).await.unwrap()),
        vec!["db-1"]
    );
    assert_eq!(
        names(
            pods.list(&ListParams::default().fields("metadata.name=web-2"))
                .await
                .unwrap()
        ),
        vec!["web-2"]
    );
    assert_eq!(
        pods.list(&ListParams::default().fields("spec.nodeName=n1"))
            .await
            .unwrap()
            .items
            .len(),
        3
    );
    assert_eq!(
        pods.list(&ListParams::default().fields("spec.nodeName="))
            .await
            .unwrap()
            .items
            .len(),
        0
    );
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
    tainted.spec.as_mut().unwrap().node_selector = Some(BTreeMap::from([(
        "topology.kubernetes.io/zone".into(),
        "us-east-1b".into(),
    )]));
    server.apply(&tainted).unwrap();
    let report = server.schedule();
    assert_eq!(report.bound, vec![("default/big".to_string(), "n1".to_string())]);
    assert_eq!(
        report.unschedulable,
        vec!["default/selector".to_string(), "default/small".to_string()]
    );
    let small = server.pod("default", "small").unwrap();
    let cond = small
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "PodScheduled")
        .unwrap();
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_deref()),
        ("False", Some("Unschedulable"))
    );
    // A second pass with nothing new writes nothing.
    let rv = server.pod("default", "small").unwrap().metadata.resource_version;
    assert_eq!(
        server.schedule().unschedulable,
        vec!["default/selector".to_string(), "default/small".to_string()]
    );
    assert_eq!(server.pod("default", "small").unwrap().metadata.resource_version, rv);
    // A tainted node is skipped by pods that do not tolerate it.
    let mut reg = node_reg("n2", "4");
    reg.taints = vec!["dedicated=gpu:NoSchedule".into()];
    server.register_node(&reg).unwrap();
    assert!(server.schedule().bound.is_empty());
    server.register_node(&node_reg("n3", "4")).unwrap();
    assert_eq!(
        server.schedule().bound,
        vec![("default/small".to_string(), "n3".to_string())]
    );
}

/// Polls `check` every 20 ms for up to 5 s.
async fn eventually(what: &str, check: impl Fn() -> bool) {
    for _ in 0..250 {
        if check() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("never happened: {what}");
}

#[tokio::test]
async fn the_scheduler_and_controller_loops_answer_every_kind_of_change() {
    // The loops skip a pass when nothing they read has moved; each kind of
    // change they read must still wake them.
    let server = KubeServer::start().await;
    let period = std::time::Duration::from_millis(10);
    let (_scheduler, _controllers) = (server.spawn_scheduler(period), server.spawn_controllers(period));
    let deployment = nodesmith_tests::local_cloud::demo::deployment("web", 3, "600m", "64Mi");
    server.apply(&deployment).unwrap();
    let running = |n: usize| {
        let pods = server.pods();
        pods.len() == n && pods.iter().all(|p| p.spec.as_ref().unwrap().node_name.is_some())
    };
    // A Deployment: its pods are made, then marked unschedulable (no node yet).
    eventually("three pods, all unschedulable", || {
        let pods = server.pods();
        pods.len() == 3
            && pods.iter().all(|p| {
                p.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable"))
                })
            })
    })
    .await;
    // A node: the pods that fit are bound.
    server.register_node(&node_reg("n1", "4")).unwrap();
    eventually("three pods bound to n1", || running(3)).await;
    // A Deployment scaled: a pod more, bound.
    let mut scaled = deployment.clone();
    scaled["spec"]["replicas"] = json!(4);
    server.apply(&scaled).unwrap();
    eventually("four pods bound", || running(4)).await;
    // A pod deleted: the ReplicaSet replaces it.
    let gone = server.pods()[0].metadata.name.clone().unwrap();
    server.delete("v1", "Pod", "default", &gone).unwrap();
    eventually("the deleted pod replaced", || {
        running(4)
            && server
                .pods()
                .iter()
                .all(|p| p.metadata.name.as_deref() != Some(gone.as_str()))
    })
    .await;
    // The node gone: its pods are collected and recreated pending.
    server.delete("v1", "Node", "", "n1").unwrap();
    eventually("four pods again, none bound", || {
        let pods = server.pods();
        pods.len() == 4 && pods.iter().all(|p| p.spec.as_ref().unwrap().node_name.is_none())
    })
    .await;
    server.register_node(&node_reg("n2", "4")).unwrap();
    eventually("four pods bound to n2", || running(4)).await;
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
    assert_eq!(
        (
            status.current_healthy,
            status.desired_healthy,
            status.disruptions_allowed
        ),
        (1, 1, 0)
    );
}

#[tokio::test]
async fn watches_stream_changes_and_selector_transitions() {
    let server = KubeServer::start().await;
    let pods: Api<Pod> = Api::all(server.client());
    let list = pods.list(&ListParams::default()).await.unwrap();
    let rv = list.metadata.resource_version.unwrap();
    let mut stream = pods
        .watch(&WatchParams::default().fields("spec.nodeName="), &rv)
        .await
        .unwrap()
        .boxed();
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

#[tokio::test]
async fn kubelet_registers_nodes_for_ec2_instances_with_user_data_labels_and_taints() {
    use base64::Engine;
    use nodesmith::catalog::{Catalog, InstanceTypeInfo};
    use nodesmith::resources::Resources;
    let m = nodesmith_tests::moto::moto().await;
    let ec2 = aws_sdk_ec2::Client::new(&m.sdk_config().await);
    let ami = ec2.describe_images().send().await.unwrap().images()[0]
        .image_id()
        .unwrap()
        .to_string();
    let user_data = "#!/bin/bash\n/etc/eks/bootstrap.sh prod --kubelet-extra-args '--node-labels=karpenter.sh/nodepool=default,team=a --register-with-taints=dedicated=batch:NoSchedule'\n";
    let run = ec2
        .run_instances()
        .image_id(ami)
        .instance_type(aws_sdk_ec2::types::InstanceType::M5Large)
        .min_count(1)
        .max_count(1)
        .placement(
            aws_sdk_ec2::types::Placement::builder()
                .availability_zone("us-east-1b")
                .build(),
        )
        .user_data(base64::engine::general_purpose::STANDARD.encode(user_data))
        .send()
        .await
        .unwrap();
    let id = run.instances()[0].instance_id().unwrap().to_string();
    let catalog = Catalog {
        region: "us-east-1".into(),
        instance_types: vec![InstanceTypeInfo {
            name: "m5.large".into(),
            labels: BTreeMap::from([
                ("node.kubernetes.io/instance-type".into(), "m5.large".into()),
                ("kubernetes.io/arch".into(), "amd64".into()),
            ]),
            capacity: Resources::parse([("cpu", "2"), ("memory", "7577Mi")]).unwrap(),
            allocatable: None,
            vcpus: 2,
            eni_max_pods: 29,
            offerings: vec![],
        }],
    };
    let server = KubeServer::start().await;
    let nodes = server.register_ec2_instances(&ec2, &catalog).await.unwrap();
    assert_eq!(nodes.len(), 1);
    let n = &nodes[0];
    let labels = n.metadata.labels.clone().unwrap();
    assert_eq!(labels["karpenter.sh/nodepool"], "default");
    assert_eq!(labels["team"], "a");
    assert_eq!(labels["topology.kubernetes.io/zone"], "us-east-1b");
    assert_eq!(labels["node.kubernetes.io/instance-type"], "m5.large");
    // A real kubelet knows neither the capacity type nor the catalog's labels.
    assert!(!labels.contains_key("karpenter.sh/capacity-type"), "{labels:?}");
    assert!(n.metadata.name.as_deref().unwrap().ends_with(".ec2.internal"));
    let spec = n.spec.clone().unwrap();
    assert_eq!(spec.provider_id.unwrap(), format!("aws:///us-east-1b/{id}"));
    let taints = spec.taints.unwrap();
    assert_eq!(
        (
            taints[0].key.as_str(),
            taints[0].value.as_deref(),
            taints[0].effect.as_str()
        ),
        ("dedicated", Some("batch"), "NoSchedule")
    );
    let status = n.status.clone().unwrap();
    assert_eq!(status.capacity.unwrap()["pods"].0, "29");
    // Allocatable is below capacity by the EKS reservations.
    assert_eq!(status.allocatable.unwrap()["cpu"].0, "1930m");
    // Re-registering is idempotent and keeps what others changed on the node.
    let all: Api<Node> = Api::all(server.client());
    let name = n.metadata.name.clone().unwrap();
    all.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"unschedulable": true}})),
    )
    .await
    .unwrap();
    let again = server.register_ec2_instances(&ec2, &catalog).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].spec.as_ref().unwrap().unschedulable, Some(true));
    assert_eq!(all.list(&ListParams::default()).await.unwrap().items.len(), 1);
    // A type the catalog lacks is named.
    let empty = Catalog {
        region: "us-east-1".into(),
        instance_types: vec![],
    };
    let err = server.register_ec2_instances(&ec2, &empty).await.unwrap_err();
    assert!(err.contains("m5.large"), "{err}");
}

/// A paged LIST as the apiserver serves it: `limit` objects a page, a
/// continue token while more remain, `remainingItemCount` without selectors,
/// every page of one snapshot (the first page's resourceVersion), and 410
/// Expired once that revision is compacted.
#[tokio::test]
async fn lists_page_with_limit_and_continue_over_one_snapshot() {
    let server = KubeServer::start().await;
    let pods: Api<Pod> = Api::all(server.client());
    for i in 0..7 {
        server
            .apply(&pod(&format!("p{i}"), "100m", json!({"app": "web"})))
            .unwrap();
    }
    let first = pods.list(&ListParams::default().limit(3)).await.unwrap();
    let names = |l: &kube::core::ObjectList<Pod>| -> Vec<String> {
        l.items.iter().map(|p| p.metadata.name.clone().unwrap()).collect()
    };
    assert_eq!(names(&first), ["p0", "p1", "p2"]);
    assert_eq!(first.metadata.remaining_item_count, Some(4));
    let token = first.metadata.continue_.clone().expect("a continue token");
    let rv = first.metadata.resource_version.clone();

    // Changes after the first page do not show in the rest of the list.
    server.apply(&pod("p9", "100m", json!({"app": "web"}))).unwrap();
    server.delete("v1", "Pod", "default", "p4").unwrap();
    let second = pods
        .list(&ListParams::default().limit(3).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(names(&second), ["p3", "p4", "p5"], "p4 as it was when the list began");
    assert_eq!(second.metadata.resource_version, rv, "one snapshot");
    let third = pods
        .list(
            &ListParams::default()
                .limit(3)
                .continue_token(second.metadata.continue_.as_ref().unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(names(&third), ["p6"]);
    assert_eq!(third.metadata.continue_, None);

    // A selector leaves the remaining count out, as the apiserver does.
    let selected = pods
        .list(&ListParams::default().labels("app=web").limit(2))
        .await
        .unwrap();
    assert_eq!(selected.items.len(), 2);
    assert!(selected.metadata.continue_.is_some());
    assert_eq!(selected.metadata.remaining_item_count, None);

    // A continue with a resourceVersion is refused; a bad token too.
    // (kube-rs never sends both: the request is made by hand.)
    let both = server
        .client()
        .request::<serde_json::Value>(
            http::Request::get(format!(
                "/api/v1/pods?limit=3&continue={}&resourceVersion=1",
                form_urlencoded::byte_serialize(token.as_bytes()).collect::<String>()
            ))
            .body(Vec::new())
            .unwrap(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(both, kube::Error::Api(s) if s.code == 400),
        "continue with a resourceVersion"
    );
    let bad = pods
        .list(&ListParams::default().limit(3).continue_token("not-a-token"))
        .await
        .unwrap_err();
    assert!(matches!(bad, kube::Error::Api(s) if s.code == 400), "a bad token");

    // The snapshot's revision compacted away: 410 Expired.
    server.set_history_limit(1);
    server.apply(&pod("p10", "100m", json!({}))).unwrap();
    let gone = pods
        .list(&ListParams::default().limit(3).continue_token(&token))
        .await
        .unwrap_err();
    assert!(
        matches!(&gone, kube::Error::Api(s) if s.code == 410 && s.reason == "Expired"),
        "{gone:?}"
    );
}

/// A paged list resumes from its snapshot for as long as kube-apiserver has
/// etcd keep revisions (five minutes), however many changes come meanwhile
/// (a burst makes tens of thousands in seconds); only once the snapshot is
/// older than that does its continue token expire.
#[tokio::test]
async fn a_paged_list_continues_across_a_bursts_changes_until_its_revision_is_five_minutes_old() {
    let server = KubeServer::start().await;
    for i in 0..4 {
        server.apply(&pod(&format!("p{i}"), "100m", json!({}))).unwrap();
    }
    let pods: Api<Pod> = Api::all(server.client());
    let first = pods.list(&ListParams::default().limit(2)).await.unwrap();
    let token = first.metadata.continue_.clone().expect("a continue token");
    // More changes than a window of 20,000 would keep, all within the retention.
    for i in 0..20_500 {
        server
            .apply(&pod("churn", "100m", json!({"generation": i.to_string()})))
            .unwrap();
    }
    let rest = pods
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    let names: Vec<_> = rest.items.iter().filter_map(|p| p.metadata.name.clone()).collect();
    assert_eq!(
        names,
        ["p2", "p3"],
        "the rest of the snapshot, without the pod made after it"
    );

    // Four minutes on (and the seconds the changes took): still kept.
    server.advance_compaction_clock(Duration::from_secs(240));
    server.apply(&pod("p4", "100m", json!({}))).unwrap();
    assert!(
        pods.list(&ListParams::default().limit(2).continue_token(&token))
            .await
            .is_ok(),
        "inside five minutes"
    );
    server.advance_compaction_clock(Duration::from_secs(61));
    server.apply(&pod("p5", "100m", json!({}))).unwrap();
    let gone = pods
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap_err();
    assert!(
        matches!(&gone, kube::Error::Api(s) if s.code == 410 && s.reason == "Expired"),
        "{gone:?}"
    );
}

/// The server keeps a window of changes, as etcd compacts revisions: older
/// ones are dropped, and a watch from before the window gets 410 Gone
/// ("too old resource version") while one inside it is served.
#[tokio::test]
async fn old_revisions_are_compacted_and_a_watch_from_before_the_window_gets_410() {
    let server = KubeServer::start().await;
    server.set_history_limit(5);
    let pods: Api<Pod> = Api::all(server.client());
    let before = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    for i in 0..20 {
        server.apply(&pod(&format!("p{i}"), "100m", json!({}))).unwrap();
    }
    assert_eq!(server.history_len(), 5, "only the window is kept");

    let mut old = pods.watch(&WatchParams::default(), &before).await.unwrap().boxed();
    match old.try_next().await.unwrap().unwrap() {
        WatchEvent::Error(e) => {
            assert_eq!(e.code, 410);
            assert!(e.message.contains("too old resource version"), "{}", e.message);
        }
        other => panic!("expected 410 Gone, got {other:?}"),
    }

    let recent = Api::<Pod>::namespaced(server.client(), "default")
        .get("p17")
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut inside = pods.watch(&WatchParams::default(), &recent).await.unwrap().boxed();
    let next = inside.try_next().await.unwrap().unwrap();
    assert!(matches!(next, WatchEvent::Added(p) if p.metadata.name.as_deref() == Some("p18")));
}
