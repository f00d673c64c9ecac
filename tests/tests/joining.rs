//! Nodes usable in seconds: a joining Node reported by the forwarder
//! (`{"node":{"name":...}}` on the pending-pods queue) is registered and
//! initialized by `provision` at once, with no sweep; and the sweep, the
//! safety net, still registers nodes when a read registration does not need
//! (EC2's instances) fails.

use std::collections::BTreeMap;

use http::Method;
use nodesmith::ec2::Instances;
use nodesmith::kubernetes::Cluster;
use nodesmith::labels;
use nodesmith::nodeclaim::Phase;
use nodesmith::sweep::{SweepConfig, Sweeper};
use nodesmith_tests::fault_proxy::FaultProxy;
use serde_json::json;

use crate::launch_fixtures::CLUSTER;
use crate::local_stack::{Stack, event, fast, pods_on, taint_keys};

fn node_message(name: &str) -> String {
    json!({"node": {"name": name}}).to_string()
}

fn labels_of(n: &k8s_openapi::api::core::v1::Node) -> BTreeMap<String, String> {
    n.metadata.labels.clone().unwrap_or_default()
}

#[tokio::test]
async fn a_reported_node_is_registered_and_initialized_at_once_without_a_sweep() {
    let s = Stack::new("64", 2).await;
    let claims = s.launched(&["web-0", "web-1"]).await;
    assert_eq!(claims.len(), 1, "{claims:?}");
    // The kubelet joins and turns Ready at once; the unregistered taint keeps pods off.
    s.kubelet_step().await;
    let node = s.nodes().await.remove(0);
    let name = node.metadata.name.clone().unwrap();
    assert!(taint_keys(&node).contains(&labels::UNREGISTERED_TAINT_KEY.to_string()));
    s.kube.schedule();
    assert!(pods_on(&s.kube, &name).is_empty());

    // The forwarder's report, handled by provision: no sweep runs in this test.
    let outcome = s.provisioner().handle(&event(vec![node_message(&name)])).await;
    assert!(outcome.failed.is_empty(), "{outcome:?}");
    assert_eq!(outcome.malformed, 0, "{outcome:?}");
    assert!(outcome.created.is_empty(), "a node report solves nothing: {outcome:?}");

    let claim = s.store.get_node_claim(&claims[0].name).await.unwrap().unwrap();
    assert_eq!(claim.phase, Phase::Initialized, "{claim:?}");
    assert_eq!(claim.node_name.as_deref(), Some(name.as_str()));
    let node = s.cluster().node(&name).await.unwrap().unwrap();
    assert!(!taint_keys(&node).contains(&labels::UNREGISTERED_TAINT_KEY.to_string()));
    let l = labels_of(&node);
    assert_eq!(l.get(labels::REGISTERED).map(String::as_str), Some("true"));
    assert_eq!(l.get(labels::INITIALIZED).map(String::as_str), Some("true"));
    assert_eq!(l.get(labels::NODECLAIM), Some(&claim.name));
    assert_eq!(l.get(labels::INSTANCE_TYPE), claim.instance_type.as_ref());
    s.kube.schedule();
    assert_eq!(pods_on(&s.kube, &name).len(), 2, "the pods run on it");

    // A repeated report changes nothing, and writes nothing.
    let patches = s.kube.count_requests(&Method::PATCH, "/api/v1/nodes");
    let again = s.provisioner().handle(&event(vec![node_message(&name)])).await;
    assert!(again.failed.is_empty(), "{again:?}");
    assert_eq!(s.kube.count_requests(&Method::PATCH, "/api/v1/nodes"), patches);
    // A report of a Node that is gone, or not nodesmith's, is dropped, not retried.
    let gone = s
        .provisioner()
        .handle(&event(vec![node_message("ip-10-9-9-9.ec2.internal")]))
        .await;
    assert!(gone.failed.is_empty() && gone.malformed == 0, "{gone:?}");
}

#[tokio::test]
async fn a_sweep_whose_instance_read_fails_still_registers_and_initializes_nodes() {
    let s = Stack::new("64", 2).await;
    let claims = s.launched(&["web-0", "web-1"]).await;
    s.kubelet_step().await;
    let name = s.nodes().await.remove(0).metadata.name.clone().unwrap();

    // The sweep reaches EC2 through the fault proxy, which fails every DescribeInstances.
    let proxy = FaultProxy::start(s.m.endpoint()).await;
    proxy.fail_next(
        "DescribeInstances",
        1000,
        503,
        "Unavailable",
        "The service is unavailable.",
    );
    let ec2 = aws_sdk_ec2::Client::new(&s.m.sdk_config_at(proxy.endpoint()).await);
    let mut config = SweepConfig::from_lookup(|_| None).unwrap();
    config.lifecycle = fast();
    config.pending_queue_url = Some(s.pending_queue.clone());
    config.launch_queue_url = Some(s.launch_queue.clone());
    config.lease = std::time::Duration::from_secs(1);
    let sweeper = Sweeper::new(
        s.cluster(),
        s.store.clone(),
        Instances::new(ec2, CLUSTER),
        s.sqs.clone(),
        config,
    );
    let run = sweeper.run().await;
    assert!(run.is_err(), "the run reports the failed read: {run:?}");
    assert!(proxy.failed("DescribeInstances") > 0);

    let claim = s.store.get_node_claim(&claims[0].name).await.unwrap().unwrap();
    assert_eq!(claim.phase, Phase::Registered, "registered despite EC2: {claim:?}");
    let node = s.cluster().node(&name).await.unwrap().unwrap();
    assert!(!taint_keys(&node).contains(&labels::UNREGISTERED_TAINT_KEY.to_string()));
    // The next run (EC2 still failing) initializes it, as a sweep does one step a run.
    assert!(sweeper.run().await.is_err());
    let claim = s.store.get_node_claim(&claims[0].name).await.unwrap().unwrap();
    assert_eq!(claim.phase, Phase::Initialized, "{claim:?}");
    s.kube.schedule();
    assert_eq!(pods_on(&s.kube, &name).len(), 2);
}
