//! `snapshot::live::read`: the one function that reads a decision's input
//! from the Kubernetes API (test server) and the state table (moto's
//! DynamoDB), through the real kube-rs and AWS SDK clients.

use jiff::Timestamp;
use nodesmith::catalog::OfferingKey;
use nodesmith::kubernetes::KubeCluster;
use nodesmith::nodeclaim::{NodeClaim, Phase};
use nodesmith::snapshot::live;
use nodesmith::state::{self, StateStore};
use nodesmith_tests::kube_server::{KubeServer, bind_json};
use nodesmith_tests::moto::moto;
use serde_json::json;

const TABLE: &str = "nodesmith";

fn pod(name: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"), "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "app", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_pods_nodes_claims_objects_and_live_offerings_as_of_now() {
    let m = moto().await;
    let conf = m.sdk_config().await;
    let dynamo = aws_sdk_dynamodb::Client::new(&conf);
    state::create_table(&dynamo, TABLE).await.unwrap();
    let store = StateStore::new(dynamo, TABLE);
    let now: Timestamp = "2026-05-01T10:00:00Z".parse().unwrap();

    let kube = KubeServer::start().await;
    kube.apply(&json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"},
        "spec": {"template": {"spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}}}}}))
    .unwrap();
    kube.apply(
        &json!({"apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "default"}, "spec": {
        "role": "KarpenterNodeRole", "amiSelectorTerms": [{"alias": "al2023@latest"}],
        "subnetSelectorTerms": [{"tags": {"k": "v"}}], "securityGroupSelectorTerms": [{"tags": {"k": "v"}}]}}),
    )
    .unwrap();
    kube.apply(&json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}}))
        .unwrap();
    kube.apply(&json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "ip-10-0-0-1", "labels": {"karpenter.sh/nodepool": "default"}},
        "spec": {"providerID": "aws:///us-east-1a/i-registered",
                 "taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]},
        "status": {"allocatable": {"cpu": "2", "memory": "8Gi", "pods": "29"}}}))
        .unwrap();
    let mut running = pod("running");
    bind_json(&mut running, "ip-10-0-0-1");
    kube.apply(&running).unwrap();
    let mut done = pod("done");
    bind_json(&mut done, "ip-10-0-0-1");
    done["status"]["phase"] = json!("Succeeded");
    kube.apply(&done).unwrap();
    kube.apply(&pod("waiting")).unwrap();
    kube.apply(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "payments", "labels": {"tier": "critical"}}}))
        .unwrap();
    kube.schedule();

    // One claim still launching, one whose Node exists (counted as that node), one on its way out.
    let claim = |name: &str, phase: Phase, provider: Option<&str>| NodeClaim {
        phase,
        provider_id: provider.map(Into::into),
        instance_type_options: vec!["m5.large".into()],
        ..NodeClaim::pending(name, "default", "default")
    };
    for c in [
        claim(
            "default-launching",
            Phase::Launched,
            Some("aws:///us-east-1b/i-launching"),
        ),
        claim(
            "default-joined",
            Phase::Launched,
            Some("aws:///us-east-1a/i-registered"),
        ),
        claim(
            "default-leaving",
            Phase::Terminating,
            Some("aws:///us-east-1c/i-leaving"),
        ),
    ] {
        store.create_node_claim(&c).await.unwrap();
    }
    let live_offering = OfferingKey::new("m5.large", "us-east-1a", "spot");
    let expired = OfferingKey::new("c5.large", "us-east-1a", "spot");
    let at = now.as_second();
    store
        .mark_unavailable(
            std::slice::from_ref(&live_offering),
            "InsufficientInstanceCapacity",
            at + 60,
        )
        .await
        .unwrap();
    store
        .mark_unavailable(&[expired], "InsufficientInstanceCapacity", at - 1)
        .await
        .unwrap();

    let cluster = KubeCluster::from_client(kube.lambda_client());
    let s = live::read(&cluster, &store, now).await.unwrap();

    assert_eq!(s.now, now);
    let pending: Vec<_> = s
        .pods
        .iter()
        .map(|p| p.metadata.name.clone().unwrap_or_default())
        .collect();
    assert_eq!(pending, ["waiting"]);
    assert_eq!(s.nodes.len(), 1);
    let on_node: Vec<_> = s.nodes[0]
        .pods
        .iter()
        .map(|p| p.metadata.name.clone().unwrap_or_default())
        .collect();
    assert_eq!(on_node, ["running"], "finished pods hold no capacity");
    let claims: Vec<&str> = s.node_claims.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(claims, ["default-launching"]);
    assert_eq!((s.node_pools.len(), s.node_classes.len()), (1, 1));
    assert_eq!(s.pod_disruption_budgets.len(), 1);
    let payments = s
        .namespaces
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some("payments"));
    assert_eq!(
        payments
            .and_then(|n| n.metadata.labels.as_ref())
            .and_then(|l| l.get("tier"))
            .map(String::as_str),
        Some("critical"),
        "namespace labels are read for namespaceSelectors"
    );
    assert_eq!(
        s.unavailable,
        [live_offering],
        "offerings past their expiry are not unavailable at now"
    );
    // No catalog stored yet: the built-in snapshot serves.
    assert_eq!(s.catalog.region, "us-east-1");
    // The snapshot is the solver's input as it is: the pending pod gets a place.
    let plan = s.compile().solve(&Default::default());
    assert_eq!(plan.unschedulable.len(), 0, "{:?}", plan.unschedulable);
}
