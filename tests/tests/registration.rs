//! Registration copies a NodeClaim's drift hashes onto its Node, through the
//! Kubernetes adapter and the real kube-rs client against the API test server.

use std::collections::BTreeMap;
use std::time::Duration;

use http::Method;
use nodesmith::apis::labels::{
    EC2NODECLASS_HASH_ANNOTATION, EC2NODECLASS_HASH_VERSION_ANNOTATION, NODEPOOL_HASH_ANNOTATION,
    NODEPOOL_HASH_VERSION_ANNOTATION,
};
use nodesmith::apis::{EC2NODECLASS_HASH_VERSION, NODEPOOL_HASH_VERSION};
use nodesmith::kubernetes::retry::RetryPolicy;
use nodesmith::kubernetes::{Cluster, KubeCluster};
use nodesmith::nodeclaim::{NodeClaim, Phase};
use nodesmith::registration::annotate_registered;
use nodesmith_tests::kube_server::{Fault, KubeServer, NodeRegistration};

fn adapter(server: &KubeServer) -> KubeCluster {
    KubeCluster::from_client(server.client()).with_retry(RetryPolicy {
        attempts: 2,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(2),
    })
}

fn register(server: &KubeServer, name: &str, instance_id: &str) {
    server
        .register_node(&NodeRegistration {
            name: name.into(),
            instance_id: instance_id.into(),
            instance_type: "m5.large".into(),
            zone: "us-east-1a".into(),
            capacity_type: "on-demand".into(),
            capacity: BTreeMap::from([("cpu".into(), "2".into()), ("pods".into(), "29".into())]),
            ..Default::default()
        })
        .unwrap();
}

fn launched_claim(name: &str, instance_id: &str, pool_hash: &str, class_hash: &str) -> NodeClaim {
    NodeClaim {
        phase: Phase::Launched,
        instance_id: Some(instance_id.into()),
        provider_id: Some(format!("aws:///us-east-1a/{instance_id}")),
        nodepool_hash: Some(pool_hash.into()),
        nodeclass_hash: Some(class_hash.into()),
        ..NodeClaim::pending(name, "default", "default")
    }
}

async fn annotations(cluster: &KubeCluster, node: &str) -> BTreeMap<String, String> {
    let n = cluster.node(node).await.unwrap().expect("the node exists");
    n.metadata.annotations.unwrap_or_default()
}

fn patches(server: &KubeServer) -> usize {
    server.count_requests(&Method::PATCH, "/api/v1/nodes")
}

#[tokio::test]
async fn a_registered_node_gets_its_claims_hashes_once() {
    let server = KubeServer::start().await;
    register(&server, "ip-10-0-1-1", "i-0aaa");
    register(&server, "ip-10-0-1-2", "i-0bbb"); // no claim: not nodesmith's
    let cluster = adapter(&server);
    let bystander_before = cluster.node("ip-10-0-1-2").await.unwrap().unwrap();
    let claims = vec![
        launched_claim("default-a", "i-0aaa", "pool0001", "class0001"),
        launched_claim("default-gone", "i-0ccc", "pool0001", "class0001"), // no Node yet
    ];

    let report = annotate_registered(&cluster, &claims).await.unwrap();
    assert_eq!(report.annotated, vec!["ip-10-0-1-1"]);
    assert!(report.failed.is_empty());

    let got = annotations(&cluster, "ip-10-0-1-1").await;
    let want = BTreeMap::from([
        (NODEPOOL_HASH_ANNOTATION.to_string(), "pool0001".to_string()),
        (
            NODEPOOL_HASH_VERSION_ANNOTATION.to_string(),
            NODEPOOL_HASH_VERSION.to_string(),
        ),
        (EC2NODECLASS_HASH_ANNOTATION.to_string(), "class0001".to_string()),
        (
            EC2NODECLASS_HASH_VERSION_ANNOTATION.to_string(),
            EC2NODECLASS_HASH_VERSION.to_string(),
        ),
    ]);
    assert_eq!(got, want);
    let bystander = cluster.node("ip-10-0-1-2").await.unwrap().unwrap();
    assert_eq!(
        bystander.metadata.annotations, None,
        "a Node without a claim is untouched"
    );
    assert_eq!(
        bystander.metadata.resource_version,
        bystander_before.metadata.resource_version
    );
    assert_eq!(patches(&server), 1);

    // Again: nothing to write.
    let again = annotate_registered(&cluster, &claims).await.unwrap();
    assert!(again.annotated.is_empty());
    assert_eq!(again.up_to_date, vec!["ip-10-0-1-1"]);
    assert_eq!(patches(&server), 1, "a second call makes no write");
}

#[tokio::test]
async fn a_changed_hash_is_rewritten_and_other_annotations_stay() {
    let server = KubeServer::start().await;
    register(&server, "n1", "i-0aaa");
    let cluster = adapter(&server);
    let mut theirs = BTreeMap::from([("example.com/owner".to_string(), "team-a".to_string())]);
    assert!(cluster.annotate_node("n1", &theirs).await.unwrap());
    assert!(!cluster.annotate_node("no-such-node", &theirs).await.unwrap());

    let mut claim = launched_claim("default-a", "i-0aaa", "pool0001", "class0001");
    annotate_registered(&cluster, std::slice::from_ref(&claim))
        .await
        .unwrap();
    claim.nodepool_hash = Some("pool0002".into());
    let report = annotate_registered(&cluster, std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_eq!(report.annotated, vec!["n1"]);

    let got = annotations(&cluster, "n1").await;
    assert_eq!(got[NODEPOOL_HASH_ANNOTATION], "pool0002");
    assert_eq!(got[EC2NODECLASS_HASH_ANNOTATION], "class0001");
    assert_eq!(got["example.com/owner"], "team-a", "a merge patch keeps the others");
    theirs.extend(got.clone());
    assert_eq!(got, theirs);
}

#[tokio::test]
async fn a_failed_write_is_reported_and_retried_by_the_next_call() {
    let server = KubeServer::start().await;
    register(&server, "n1", "i-0aaa");
    register(&server, "n2", "i-0bbb");
    let cluster = adapter(&server);
    let claims = vec![
        launched_claim("default-a", "i-0aaa", "p", "k"),
        launched_claim("default-b", "i-0bbb", "p", "k"),
    ];
    // Forbidden is not transient: the adapter does not retry it.
    server.inject(Fault::new(403, 1).on(Method::PATCH).path("/nodes/n1"));
    let report = annotate_registered(&cluster, &claims).await.unwrap();
    assert_eq!(report.annotated, vec!["n2"]);
    assert_eq!(report.failed.len(), 1);
    assert_eq!(report.failed[0].0, "n1");
    assert_eq!(report.failed[0].1.code(), Some(403));

    let next = annotate_registered(&cluster, &claims).await.unwrap();
    assert_eq!(next.annotated, vec!["n1"]);
    assert_eq!(next.up_to_date, vec!["n2"]);
    assert_eq!(annotations(&cluster, "n1").await[NODEPOOL_HASH_ANNOTATION], "p");
}
