//! The whole provisioning loop on the local stack: pending pods in the
//! Kubernetes API test server → pending-pod references → `provision` →
//! NodeClaims and launch requests → `launch` → EC2 instances in moto →
//! kubelets join (late, not ready, tainted) → the sweep registers and
//! initializes the nodes → the scheduler binds every pod.

use std::time::Duration;

use crate::launch_fixtures::{CLUSTER, DISCOVERY, launcher, store, world};
use aws_lambda_events::sqs::{SqsEvent, SqsMessage};
use nodesmith::apis::{EC2NodeClass, NodePool};
use nodesmith::ec2::Instances;
use nodesmith::kubernetes::retry::RetryPolicy;
use nodesmith::kubernetes::{Cluster, KubeCluster};
use nodesmith::labels;
use nodesmith::launch::batch;
use nodesmith::nodeclaim::Phase;
use nodesmith::provisioning::{ProvisionConfig, Provisioner};
use nodesmith::sweep::{SweepConfig, Sweeper};
use nodesmith_tests::kube_server::{KubeServer, KubeletTiming, Kubelets};
use nodesmith_tests::moto::moto;
use serde_json::json;

fn records(bodies: impl IntoIterator<Item = (String, String)>) -> SqsEvent {
    let mut e = SqsEvent::default();
    e.records = bodies
        .into_iter()
        .map(|(id, body)| {
            let mut m = SqsMessage::default();
            m.message_id = Some(id);
            m.body = Some(body);
            m
        })
        .collect();
    e
}

#[tokio::test]
async fn pending_pods_end_up_running_on_launched_nodes() {
    let m = moto().await;
    world(&m).await;
    let conf = m.sdk_config().await;
    let sqs = aws_sdk_sqs::Client::new(&conf);
    let launch_queue = sqs
        .create_queue()
        .queue_name("launch")
        .send()
        .await
        .unwrap()
        .queue_url()
        .unwrap()
        .to_string();

    let kube = KubeServer::start().await;
    kube.apply(&json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"}, "spec": {
        "template": {
            "metadata": {"labels": {"team": "web"}},
            "spec": {
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
                "requirements": [{"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["m5", "c5"]}]
            }
        },
        "limits": {"cpu": "64"}
    }}))
    .unwrap();
    kube.apply(
        &json!({"apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "default"}, "spec": {
            "role": "KarpenterNodeRole-demo",
            "amiSelectorTerms": [{"alias": "al2023@latest"}],
            "subnetSelectorTerms": [{"tags": {DISCOVERY: "*"}}],
            "securityGroupSelectorTerms": [{"tags": {DISCOVERY: CLUSTER}}]
        }}),
    )
    .unwrap();
    let names: Vec<String> = (0..10).map(|i| format!("web-{i}")).collect();
    for n in &names {
        kube.apply(&json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": n, "namespace": "default", "uid": format!("uid-{n}"), "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "image": "web", "resources": {"requests": {"cpu": "900m", "memory": "1Gi"}}}]}}))
            .unwrap();
    }
    kube.schedule();
    assert!(
        kube.pods()
            .iter()
            .all(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none()),
        "no node exists yet"
    );

    // What the forwarder sends: one reference per unschedulable pod.
    let refs = records(names.iter().map(|n| {
        (
            format!("msg-{n}"),
            json!({"namespace": "default", "name": n, "uid": format!("uid-{n}"), "resourceVersion": "1"}).to_string(),
        )
    }));
    let cluster = KubeCluster::from_client(kube.lambda_client()).with_retry(RetryPolicy {
        attempts: 3,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
    });
    let provisioner = Provisioner::new(
        cluster,
        store(&m).await,
        sqs.clone(),
        ProvisionConfig::new(&launch_queue),
    );
    let outcome = provisioner.handle(&refs).await;
    assert!(
        outcome.failed.is_empty() && outcome.unschedulable.is_empty(),
        "{outcome:?}"
    );
    assert!(!outcome.created.is_empty());

    // The launch function takes what provision queued.
    let mut launch_records = Vec::new();
    loop {
        let got = sqs
            .receive_message()
            .queue_url(&launch_queue)
            .max_number_of_messages(10)
            .send()
            .await
            .unwrap();
        if got.messages().is_empty() {
            break;
        }
        for msg in got.messages() {
            launch_records.push((msg.message_id().unwrap().to_string(), msg.body().unwrap().to_string()));
            sqs.delete_message()
                .queue_url(&launch_queue)
                .receipt_handle(msg.receipt_handle().unwrap())
                .send()
                .await
                .unwrap();
        }
    }
    assert_eq!(launch_records.len(), outcome.created.len());
    let launcher = launcher(&m, m.endpoint(), &kube).await;
    let (response, _) = batch::handle(&launcher, &records(launch_records)).await;
    assert!(
        response.batch_item_failures.is_empty(),
        "{:?}",
        response.batch_item_failures
    );

    // Every claim is Launched with an instance that carries its tags.
    let claims = store(&m).await.list_node_claims().await.unwrap();
    assert_eq!(claims.len(), outcome.created.len());
    let ec2 = aws_sdk_ec2::Client::new(&conf);
    for c in &claims {
        assert_eq!(c.phase, Phase::Launched, "{c:?}");
        let id = c.instance_id.clone().unwrap();
        let found = ec2.describe_instances().instance_ids(&id).send().await.unwrap();
        let instance = &found.reservations()[0].instances()[0];
        let tags: Vec<(String, String)> = instance
            .tags()
            .iter()
            .map(|t| {
                (
                    t.key().unwrap_or_default().to_string(),
                    t.value().unwrap_or_default().to_string(),
                )
            })
            .collect();
        assert!(
            tags.contains(&("karpenter.sh/nodeclaim".into(), c.name.clone())),
            "{tags:?}"
        );
        assert!(tags.contains(&("karpenter.sh/nodepool".into(), "default".into())));
        assert!(tags.contains(&(format!("kubernetes.io/cluster/{CLUSTER}"), "owned".into())));
        let itype = instance.instance_type().unwrap().as_str().to_string();
        assert!(
            c.instance_type_options.contains(&itype),
            "{itype} not among {:?}",
            c.instance_type_options
        );
    }

    // The instances join as nodes, as real kubelets do: late, not ready, tainted.
    let kubelets = Kubelets::new(KubeletTiming::millis(0, 300));
    let catalog = nodesmith::catalog::builtin().unwrap();
    kubelets.step(&kube, &ec2, catalog).await.unwrap();
    assert_eq!(kube.nodes().len(), claims.len());
    kube.schedule();
    // The forwarder sends the still-unschedulable pods again: the registering
    // nodes are their capacity, nothing more is launched.
    let during = provisioner.handle(&refs).await;
    assert!(during.failed.is_empty() && during.created.is_empty(), "{during:?}");

    // The sweep registers the nodes, the kubelets report Ready, the sweep
    // initializes them, and the scheduler binds every pod.
    let sweeper = Sweeper::new(
        KubeCluster::from_client(kube.lambda_client()),
        store(&m).await,
        Instances::new(ec2.clone(), CLUSTER),
        sqs.clone(),
        SweepConfig::from_lookup(|_| None).unwrap(),
    );
    let first = sweeper.run().await.unwrap();
    assert_eq!(first.done.len(), claims.len(), "{first:?}");
    tokio::time::sleep(Duration::from_millis(350)).await;
    kubelets.step(&kube, &ec2, catalog).await.unwrap();
    let second = sweeper.run().await.unwrap();
    assert_eq!(second.done.len(), claims.len(), "{second:?}");
    let settled = store(&m).await.list_node_claims().await.unwrap();
    assert!(settled.iter().all(|c| c.phase == Phase::Initialized), "{settled:?}");
    kube.schedule();
    let unbound: Vec<String> = kube
        .pods()
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none())
        .map(|p| p.metadata.name.clone().unwrap_or_default())
        .collect();
    assert!(
        unbound.is_empty(),
        "pods left pending after the nodes joined: {unbound:?}"
    );
    let cluster = KubeCluster::from_client(kube.lambda_client());
    let pool: NodePool = cluster.node_pools().await.unwrap().remove(0);
    let class: EC2NodeClass = cluster.node_classes().await.unwrap().remove(0);
    for n in &kube.nodes() {
        let labels = n.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get("team").map(String::as_str),
            Some("web"),
            "template labels reach the node"
        );
        assert_eq!(labels.get("karpenter.sh/nodepool").map(String::as_str), Some("default"));
        // The node's and the launched instance's facts, not the solver's predictions.
        assert_eq!(
            labels.get("kubernetes.io/hostname"),
            n.metadata.name.as_ref(),
            "{labels:?}"
        );
        let provider = n.spec.as_ref().and_then(|s| s.provider_id.clone()).unwrap_or_default();
        let claim = settled
            .iter()
            .find(|c| c.provider_id.as_deref() == Some(provider.as_str()))
            .expect("every node is a claim's");
        assert_eq!(
            labels.get(labels::INSTANCE_TYPE),
            claim.instance_type.as_ref(),
            "{labels:?}"
        );
        assert_eq!(labels.get(labels::INITIALIZED).map(String::as_str), Some("true"));
        // The claim's drift hashes, equal to those of the NodePool and EC2NodeClass now.
        let a = n.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(a.get(labels::NODEPOOL_HASH_ANNOTATION), Some(&pool.hash()), "{a:?}");
        assert_eq!(
            a.get(labels::EC2NODECLASS_HASH_ANNOTATION),
            Some(&class.hash()),
            "{a:?}"
        );
    }

    // A redelivered batch now finds the pods running: nothing more is launched.
    let again = provisioner.handle(&refs).await;
    assert!(again.failed.is_empty() && again.created.is_empty(), "{again:?}");
    assert_eq!(again.gone, names.len());
    assert!(
        kube.denials().is_empty(),
        "the functions' RBAC refused calls: {:#?}",
        kube.denials()
    );
}
