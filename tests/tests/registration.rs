//! Registration's write to a Node through the Kubernetes adapter and the real
//! kube-rs client against the API test server: the launched instance's labels,
//! the claim's drift hashes, the `unregistered` taint taken off; others'
//! labels, annotations and taints kept; no write when there is nothing to do.

use std::collections::BTreeMap;
use std::time::Duration;

use http::Method;
use nodesmith::apis::{EC2NODECLASS_HASH_VERSION, NODEPOOL_HASH_VERSION};
use nodesmith::kubernetes::retry::RetryPolicy;
use nodesmith::kubernetes::{Cluster, KubeCluster};
use nodesmith::labels::{
    self, EC2NODECLASS_HASH_ANNOTATION, EC2NODECLASS_HASH_VERSION_ANNOTATION, NODEPOOL_HASH_ANNOTATION,
    NODEPOOL_HASH_VERSION_ANNOTATION,
};
use nodesmith::nodeclaim::{NodeClaim, Phase};
use nodesmith::registration::registration_update;
use nodesmith_tests::kube_server::{Fault, KubeServer, NodeRegistration};

fn adapter(server: &KubeServer) -> KubeCluster {
    KubeCluster::from_client(server.lambda_client()).with_retry(RetryPolicy {
        attempts: 3,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(2),
    })
}

/// A node as its kubelet registers it, with the taint nodesmith's user data adds
/// and one a CNI agent will take off later.
fn register(server: &KubeServer, name: &str, instance_id: &str) {
    server
        .register_node(&NodeRegistration {
            name: name.into(),
            instance_id: instance_id.into(),
            instance_type: "m5.large".into(),
            zone: "us-east-1a".into(),
            capacity: BTreeMap::from([("cpu".into(), "2".into()), ("pods".into(), "29".into())]),
            taints: vec![
                "karpenter.sh/unregistered:NoExecute".into(),
                "example.com/cni=starting:NoSchedule".into(),
            ],
            ..Default::default()
        })
        .unwrap();
}

fn launched_claim(instance_id: &str, pool_hash: &str) -> NodeClaim {
    NodeClaim {
        phase: Phase::Launched,
        instance_id: Some(instance_id.into()),
        provider_id: Some(format!("aws:///us-east-1a/{instance_id}")),
        instance_type: Some("m5.large".into()),
        zone: Some("us-east-1a".into()),
        capacity_type: Some("spot".into()),
        nodepool_hash: Some(pool_hash.into()),
        nodeclass_hash: Some("class0001".into()),
        labels: BTreeMap::from([("team".to_string(), "web".to_string())]),
        ..NodeClaim::pending("default-a", "default", "default")
    }
}

fn patches(server: &KubeServer) -> usize {
    server.count_requests(&Method::PATCH, "/api/v1/nodes")
}

#[tokio::test]
async fn registration_labels_annotates_and_untaints_once() {
    let server = KubeServer::start().await;
    register(&server, "ip-10-0-1-1", "i-0aaa");
    let cluster = adapter(&server);
    let catalog = nodesmith::catalog::builtin().unwrap();
    let update = registration_update(&launched_claim("i-0aaa", "pool0001"), Some(catalog));
    assert!(cluster.update_node("ip-10-0-1-1", &update).await.unwrap());

    let n = cluster.node("ip-10-0-1-1").await.unwrap().unwrap();
    let l = n.metadata.labels.clone().unwrap_or_default();
    for (k, v) in [
        (labels::INSTANCE_TYPE, "m5.large"),
        (labels::aws::FAMILY, "m5"),
        (labels::ZONE, "us-east-1a"),
        (labels::REGION, "us-east-1"),
        (labels::CAPACITY_TYPE, "spot"),
        (labels::NODEPOOL, "default"),
        (labels::NODECLAIM, "default-a"),
        (labels::REGISTERED, "true"),
        (labels::HOSTNAME, "ip-10-0-1-1"),
        ("team", "web"),
    ] {
        assert_eq!(l.get(k).map(String::as_str), Some(v), "{k}: {l:?}");
    }
    let a = n.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        a,
        BTreeMap::from([
            (NODEPOOL_HASH_ANNOTATION.to_string(), "pool0001".to_string()),
            (
                NODEPOOL_HASH_VERSION_ANNOTATION.to_string(),
                NODEPOOL_HASH_VERSION.to_string()
            ),
            (EC2NODECLASS_HASH_ANNOTATION.to_string(), "class0001".to_string()),
            (
                EC2NODECLASS_HASH_VERSION_ANNOTATION.to_string(),
                EC2NODECLASS_HASH_VERSION.to_string()
            ),
        ])
    );
    let taints: Vec<String> = n.spec.unwrap().taints.unwrap().into_iter().map(|t| t.key).collect();
    assert_eq!(taints, vec!["example.com/cni"], "only the unregistered taint goes");
    assert_eq!(patches(&server), 1);

    assert!(cluster.update_node("ip-10-0-1-1", &update).await.unwrap());
    assert_eq!(patches(&server), 1, "nothing to write the second time");
    assert!(!cluster.update_node("no-such-node", &update).await.unwrap());
}

#[tokio::test]
async fn a_changed_hash_is_rewritten_and_what_others_wrote_stays() {
    let server = KubeServer::start().await;
    register(&server, "n1", "i-0aaa");
    let cluster = adapter(&server);
    let theirs = nodesmith::kubernetes::NodeUpdate {
        labels: BTreeMap::from([("example.com/rack".to_string(), "r7".to_string())]),
        annotations: BTreeMap::from([("example.com/owner".to_string(), "team-a".to_string())]),
        ..Default::default()
    };
    assert!(cluster.update_node("n1", &theirs).await.unwrap());
    cluster
        .update_node("n1", &registration_update(&launched_claim("i-0aaa", "pool0001"), None))
        .await
        .unwrap();
    cluster
        .update_node("n1", &registration_update(&launched_claim("i-0aaa", "pool0002"), None))
        .await
        .unwrap();
    let n = cluster.node("n1").await.unwrap().unwrap();
    let a = n.metadata.annotations.unwrap_or_default();
    assert_eq!(a[NODEPOOL_HASH_ANNOTATION], "pool0002");
    assert_eq!(a["example.com/owner"], "team-a");
    assert_eq!(n.metadata.labels.unwrap_or_default()["example.com/rack"], "r7");
}

#[tokio::test]
async fn a_concurrent_writer_is_not_clobbered() {
    let server = KubeServer::start().await;
    register(&server, "n1", "i-0aaa");
    let cluster = adapter(&server);
    // Someone changes the node right after each of our reads: the taint list we
    // write back would be stale, so the server answers 409 and we read again.
    server.modify_after_get("/api/v1/nodes/n1", 2);
    let update = registration_update(&launched_claim("i-0aaa", "p"), None);
    assert!(cluster.update_node("n1", &update).await.unwrap());
    let n = cluster.node("n1").await.unwrap().unwrap();
    assert!(update.is_satisfied_by(&n));
    let a = n.metadata.annotations.unwrap_or_default();
    assert!(a.len() > 4, "the other writer's annotation is kept: {a:?}");
}

#[tokio::test]
async fn a_refused_write_is_an_error_and_the_next_call_succeeds() {
    let server = KubeServer::start().await;
    register(&server, "n1", "i-0aaa");
    let cluster = adapter(&server);
    let update = registration_update(&launched_claim("i-0aaa", "p"), None);
    // Forbidden is not transient: the adapter does not retry it.
    server.inject(Fault::new(403, 1).on(Method::PATCH).path("/nodes/n1"));
    let e = cluster.update_node("n1", &update).await.unwrap_err();
    assert_eq!(e.code(), Some(403));
    assert!(cluster.update_node("n1", &update).await.unwrap());
}
