//! A node's life after launch on the local stack: `provision`, `launch` and
//! the `sweep` against moto and the Kubernetes API test server, with kubelets
//! that join late, not ready and tainted, as real ones do. Each of the
//! provisioning path's lifecycle defects has its test here: phantom capacity,
//! a double launch during registration, mislabelled nodes, and pods left
//! pending when capacity is taken away; plus the timeouts, liveness, garbage
//! collection, and sweeps that crash or run at once.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::local_stack::{Stack, fast, taint_keys};
use k8s_openapi::api::core::v1::Node;
use nodesmith::kubernetes::Cluster;
use nodesmith::labels;
use nodesmith::lifecycle::{Action, LifecycleConfig};
use nodesmith::nodeclaim::Phase;
use nodesmith::sweep::SweepReport;
use nodesmith_tests::kube_server::{KubeServer, KubeletTiming, Kubelets};
use serde_json::json;

/// The shared stack with kubelets that take 200 ms to become Ready.
async fn stack(cpu_limit: &str, pods: usize) -> Stack {
    let mut s = Stack::new(cpu_limit, pods).await;
    s.kubelets = Kubelets::new(KubeletTiming::millis(0, 200));
    s
}

fn short(report: &SweepReport) -> Vec<String> {
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    report
        .done
        .iter()
        .map(|a| match a {
            Action::Register { .. } => "register".to_string(),
            Action::Initialize { .. } => "initialize".to_string(),
            Action::Remove { reason, .. } => format!("remove {}", reason.as_str()),
            Action::CollectInstance { .. } => "collect-instance".to_string(),
            Action::CollectNode { .. } => "collect-node".to_string(),
            Action::Relaunch { .. } => "relaunch".to_string(),
            Action::Adopt { .. } => "adopt".to_string(),
            Action::HoldCollection { .. } => "hold-collection".to_string(),
        })
        .collect()
}

fn labels_of(n: &Node) -> BTreeMap<String, String> {
    n.metadata.labels.clone().unwrap_or_default()
}

fn bound(kube: &KubeServer) -> usize {
    kube.pods()
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
        .count()
}

#[tokio::test]
async fn a_launched_node_is_registered_with_its_real_instance_labels_then_initialized() {
    let s = stack("64", 2).await;
    let claims = s.launched(&["web-0", "web-1"]).await;
    assert_eq!(claims.len(), 1, "{claims:?}");
    let claim = &claims[0];
    let sweeper = s.sweeper(fast());

    // The kubelet joins: not ready, tainted, and labelled only with what it knows.
    s.kubelet_step().await;
    let node = s.nodes().await.remove(0);
    let name = node.metadata.name.clone().unwrap();
    assert!(name.starts_with("ip-"), "{name}");
    assert!(taint_keys(&node).contains(&labels::UNREGISTERED_TAINT_KEY.to_string()));
    assert!(
        !labels_of(&node).contains_key(labels::aws::FAMILY),
        "user data carries no instance labels"
    );
    s.kube.schedule();
    assert_eq!(bound(&s.kube), 0, "nothing lands on a registering node");

    // The sweep registers it: the launched instance's labels, the unregistered taint gone.
    assert_eq!(short(&sweeper.run().await.unwrap()), vec!["register"]);
    let node = s.cluster().node(&name).await.unwrap().unwrap();
    let l = labels_of(&node);
    let launched = s.store.get_node_claim(&claim.name).await.unwrap().unwrap();
    assert_eq!(launched.phase, Phase::Registered);
    assert_eq!(launched.node_name.as_deref(), Some(name.as_str()));
    let itype = launched.instance_type.clone().unwrap();
    assert_eq!(l.get(labels::INSTANCE_TYPE), Some(&itype));
    assert_eq!(l.get(labels::aws::FAMILY).map(String::as_str), itype.split('.').next());
    assert_eq!(l.get(labels::ZONE), launched.zone.as_ref());
    assert_eq!(l.get(labels::HOSTNAME), Some(&name), "the hostname is the node's own");
    assert_eq!(l.get(labels::REGISTERED).map(String::as_str), Some("true"));
    assert_eq!(l.get(labels::NODECLAIM), Some(&claim.name));
    assert_eq!(l.get("team").map(String::as_str), Some("web"));
    assert!(!taint_keys(&node).contains(&labels::UNREGISTERED_TAINT_KEY.to_string()));
    let a = node.metadata.annotations.clone().unwrap_or_default();
    assert!(a.contains_key(labels::NODEPOOL_HASH_ANNOTATION), "{a:?}");

    // Not ready yet: not initialized.
    assert!(short(&sweeper.run().await.unwrap()).is_empty());
    tokio::time::sleep(Duration::from_millis(250)).await;
    s.kubelet_step().await;
    assert_eq!(short(&sweeper.run().await.unwrap()), vec!["initialize"]);
    let initialized = s.store.get_node_claim(&claim.name).await.unwrap().unwrap();
    assert_eq!(initialized.phase, Phase::Initialized);
    let node = s.cluster().node(&name).await.unwrap().unwrap();
    assert_eq!(
        labels_of(&node).get(labels::INITIALIZED).map(String::as_str),
        Some("true")
    );
    s.kube.schedule();
    assert_eq!(bound(&s.kube), 2);
    assert!(
        short(&sweeper.run().await.unwrap()).is_empty(),
        "a settled node needs nothing"
    );
}

#[tokio::test]
async fn pods_waiting_for_a_registering_node_do_not_launch_a_second_one() {
    let s = stack("64", 2).await;
    let pods = ["web-0", "web-1"];
    s.launched(&pods).await;
    // The node joins, not ready and tainted; the scheduler marks the pods
    // unschedulable again and the forwarder sends them once more.
    s.kubelet_step().await;
    s.kube.schedule();
    let again = s.provision(&pods).await;
    assert!(again.failed.is_empty(), "{again:?}");
    assert!(again.created.is_empty(), "a second node was launched: {again:?}");
    assert_eq!(again.placed_on_existing, 2, "{again:?}");
    // Same once the sweep registered it and it is still not ready.
    s.sweeper(fast()).run().await.unwrap();
    let third = s.provision(&pods).await;
    assert!(third.created.is_empty(), "{third:?}");
    assert_eq!(s.claims().await.len(), 1);
}

#[tokio::test]
async fn an_instance_terminated_behind_our_back_frees_its_pods_and_the_pool_limit() {
    // The limit holds one node: a claim that counts forever would stop the pool.
    let s = stack("2", 2).await;
    let claims = s.launched(&["web-0", "web-1"]).await;
    assert_eq!(claims.len(), 1, "{claims:?}");
    let id = claims[0].instance_id.clone().unwrap();
    s.ec2.terminate_instances().instance_ids(&id).send().await.unwrap();
    // Before the sweep the claim is phantom capacity: the pods are "placed" on it.
    let phantom = s.provision(&["web-0"]).await;
    assert!(phantom.created.is_empty(), "{phantom:?}");

    let report = s.sweeper(fast()).run().await.unwrap();
    assert_eq!(short(&report), vec!["remove instance-gone"]);
    assert!(s.claims().await.is_empty());
    // The pods are solved again at once: the sweep asked for it.
    let (asked, outcome) = s.provision_queued().await;
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert!(asked[0].contains("instance-gone"), "{asked:?}");
    assert_eq!(outcome.created.len(), 1, "the pool has room again: {outcome:?}");
}

#[tokio::test]
async fn a_claim_never_launched_times_out_and_its_pods_are_solved_again() {
    let s = stack("64", 2).await;
    let outcome = s.provision(&["web-0", "web-1"]).await;
    assert_eq!(outcome.created.len(), 1);
    // The launch request is lost: nobody launches.
    s.drain(&s.launch_queue).await;
    // Within its launch timeout the claim is left alone; past it (a zero
    // timeout: any age is past it), removed. No sleep races the first sweep.
    let patient = s.sweeper(fast());
    assert!(short(&patient.run().await.unwrap()).is_empty(), "not yet");
    let sweeper = s.sweeper(LifecycleConfig {
        launch_timeout: Duration::ZERO,
        ..fast()
    });
    let report = sweeper.run().await.unwrap();
    assert_eq!(short(&report), vec!["remove launch-timeout"]);
    assert!(s.claims().await.is_empty());
    let (asked, again) = s.provision_queued().await;
    assert_eq!(asked.len(), 1);
    assert_eq!(again.created.len(), 1, "{again:?}");
    assert_ne!(
        again.created[0].name, outcome.created[0].name,
        "a new claim, a new name"
    );
}

#[tokio::test]
async fn a_node_that_never_joins_times_out_and_its_instance_is_terminated() {
    let s = stack("64", 2).await;
    let claims = s.launched(&["web-0", "web-1"]).await;
    let id = claims[0].instance_id.clone().unwrap();
    let sweeper = s.sweeper(LifecycleConfig {
        registration_timeout: Duration::from_secs(1),
        ..fast()
    });
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        short(&sweeper.run().await.unwrap()),
        vec!["remove registration-timeout"]
    );
    assert!(s.claims().await.is_empty());
    assert_eq!(
        s.instance_states().await.get(&id).map(String::as_str),
        Some("terminated")
    );
    let (asked, _) = s.provision_queued().await;
    assert!(asked[0].contains("registration-timeout"), "{asked:?}");
}

#[tokio::test]
async fn a_deleted_node_takes_its_claim_and_instance_with_it() {
    let s = stack("64", 2).await;
    let claims = s.launched(&["web-0", "web-1"]).await;
    let id = claims[0].instance_id.clone().unwrap();
    s.kubelet_step().await;
    let sweeper = s.sweeper(fast());
    sweeper.run().await.unwrap();
    let node = s.nodes().await.remove(0).metadata.name.unwrap();
    s.cluster().delete_node(&node, None).await.unwrap();
    assert_eq!(short(&sweeper.run().await.unwrap()), vec!["remove node-gone"]);
    assert!(s.claims().await.is_empty());
    assert_eq!(
        s.instance_states().await.get(&id).map(String::as_str),
        Some("terminated")
    );
}

#[tokio::test]
async fn leaked_instances_and_orphaned_nodes_are_collected() {
    let s = stack("64", 2).await;
    let claims = s.launched(&["web-0", "web-1"]).await;
    let id = claims[0].instance_id.clone().unwrap();
    s.kubelet_step().await;
    let node = s.nodes().await.remove(0).metadata.name.unwrap();
    // The claim vanishes (a crash between a launch and its record, a race with a
    // give-up): the instance is nobody's.
    s.store
        .delete_node_claim(&claims[0].name, claims[0].version)
        .await
        .unwrap();
    // An orphaned Node of the pool: no claim, no instance.
    s.kube
        .apply(
            &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "ip-10-9-9-9.ec2.internal",
            "labels": {"karpenter.sh/nodepool": "default"}},
            "spec": {"providerID": "aws:///us-east-1a/i-0000000000000dead"}}),
        )
        .unwrap();
    // Inside the leak window nothing is touched.
    assert!(short(&s.sweeper(fast()).run().await.unwrap()).is_empty());
    let past_leak_window = s.sweeper(LifecycleConfig {
        leak_window: Duration::ZERO,
        ..fast()
    });
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // The orphaned Node goes; the instance, whose Node never registered, waits
    // out the registration timeout (a launch whose claim the table lost may
    // still be joining).
    assert_eq!(short(&past_leak_window.run().await.unwrap()), vec!["collect-node"]);
    let sweeper = s.sweeper(LifecycleConfig {
        leak_window: Duration::ZERO,
        registration_timeout: Duration::ZERO,
        ..fast()
    });
    assert_eq!(short(&sweeper.run().await.unwrap()), vec!["collect-instance"]);
    assert_eq!(
        s.instance_states().await.get(&id).map(String::as_str),
        Some("terminated")
    );
    assert!(
        s.nodes().await.is_empty(),
        "both nodes deleted, {node} with its instance"
    );
    assert!(short(&sweeper.run().await.unwrap()).is_empty(), "nothing left");
}

#[tokio::test]
async fn pods_left_pending_with_nobody_solving_get_a_solve() {
    // A batch went to the DLQ: the pods are pending, no solve ever ran for them.
    let s = stack("64", 2).await;
    let sweeper = s.sweeper(fast());
    let report = sweeper.run().await.unwrap();
    assert_eq!(
        report.solve_requested.as_ref().map(|r| r.reason.as_str()),
        Some("pods-still-pending")
    );
    let (asked, outcome) = s.provision_queued().await;
    assert_eq!(asked.len(), 1);
    assert_eq!(outcome.created.len(), 1, "{outcome:?}");
    // The solve is recorded: the next sweep does not ask again.
    let report = sweeper.run().await.unwrap();
    assert!(report.solve_requested.is_none(), "{report:?}");
    // Still pending long after the last solve (the node never came): ask again.
    let patient = s.sweeper(LifecycleConfig {
        resolve_every: Duration::from_millis(500),
        ..fast()
    });
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(patient.run().await.unwrap().solve_requested.is_some());
}

#[tokio::test]
async fn a_sweep_killed_mid_run_is_finished_by_the_next() {
    let s = stack("64", 2).await;
    let claims = s.launched(&["web-0", "web-1"]).await;
    let id = claims[0].instance_id.clone().unwrap();
    s.ec2.terminate_instances().instance_ids(&id).send().await.unwrap();
    // A sweep died holding its lease, after terminating the instance and before
    // deleting the claim.
    let dead = s
        .store
        .acquire_lease("sweep", "dead-sweep", 1000, nodesmith::state::now_ms())
        .await
        .unwrap();
    assert!(dead.is_some());
    let sweeper = s.sweeper(fast());
    assert!(
        sweeper.run().await.unwrap().skipped,
        "the dead sweep's lease still holds"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(short(&sweeper.run().await.unwrap()), vec!["remove instance-gone"]);
    assert!(s.claims().await.is_empty());

    // Killed partway for real: the next run converges to the same end.
    s.provision(&["web-0", "web-1"]).await;
    s.launch_all().await;
    s.kubelet_step().await;
    let run = tokio::spawn({
        let sweeper = s.sweeper(fast());
        async move { sweeper.run().await.map(|r| r.done.len()) }
    });
    tokio::time::sleep(Duration::from_millis(5)).await;
    run.abort();
    let _ = run.await;
    // Its lease (if it got that far) expires; a later sweep finishes the registration.
    let mut registered = false;
    for _ in 0..20 {
        let r = sweeper.run().await.unwrap();
        let claims = s.claims().await;
        if !r.skipped && !claims.is_empty() && claims.iter().all(|c| c.phase == Phase::Registered) {
            registered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(registered, "{:?}", s.claims().await);
}

#[tokio::test]
async fn two_sweeps_at_once_act_once() {
    let s = stack("64", 2).await;
    let claims = s.launched(&["web-0", "web-1"]).await;
    s.ec2
        .terminate_instances()
        .instance_ids(claims[0].instance_id.clone().unwrap())
        .send()
        .await
        .unwrap();
    let (a, b) = (s.sweeper(fast()), s.sweeper(fast()));
    let (ra, rb) = tokio::join!(a.run(), b.run());
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    let acted = [&ra, &rb].iter().filter(|r| !r.done.is_empty()).count();
    assert_eq!(acted, 1, "exactly one sweep acts: {ra:?} {rb:?}");
    assert!(ra.failed.is_empty() && rb.failed.is_empty());
    let asked = s.drain(&s.pending_queue).await;
    assert_eq!(asked.len(), 1, "one solve request: {asked:?}");
}

#[tokio::test]
async fn a_registration_the_api_server_refuses_ends_the_claim_instead_of_retrying_forever() {
    let s = stack("64", 2).await;
    let claims = s.launched(&["web-0", "web-1"]).await;
    let id = claims[0].instance_id.clone().unwrap();
    s.kubelet_step().await;
    let node = s.nodes().await.remove(0).metadata.name.unwrap();
    // A claim whose labels the API server refuses (written by a release that
    // did not check them): its Node can never be registered.
    let mut claim = s.store.get_node_claim(&claims[0].name).await.unwrap().unwrap();
    claim.labels.insert("team".into(), "a,dedicated=payments".into());
    s.store.update_node_claim(&claim).await.unwrap();

    let sweeper = s.sweeper(fast());
    let report = sweeper.run().await.unwrap();
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    let metrics = nodesmith::telemetry::totals(&report.metrics());
    assert_eq!(metrics["RegistrationsRefused"], 1.0);
    assert_eq!(metrics["NodesRegistered"], 0.0);
    assert!(s.claims().await.is_empty(), "the claim is given up");
    assert_eq!(
        s.instance_states().await.get(&id).map(String::as_str),
        Some("terminated")
    );
    assert!(s.cluster().node(&node).await.unwrap().is_none(), "its Node is deleted");
    let events = s.kube.events();
    let refused = events
        .iter()
        .find(|e| e.reason.as_deref() == Some(nodesmith::kubernetes::events::reasons::REGISTRATION_REFUSED))
        .unwrap_or_else(|| panic!("no event: {events:?}"));
    assert_eq!(refused.involved_object.name.as_deref(), Some(claim.name.as_str()));
    assert!(
        refused
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("a,dedicated=payments"),
        "{refused:?}"
    );
    let (asked, _) = s.provision_queued().await;
    assert!(asked[0].contains("registration-refused"), "{asked:?}");
    // Nothing is left to retry.
    assert!(short(&sweeper.run().await.unwrap()).is_empty());
}

/// Rewrites a claim's stored body as a newer release might have written it:
/// a phase and a field this release does not know.
async fn write_as_a_newer_release(s: &Stack, claim: &str) {
    use aws_sdk_dynamodb::types::AttributeValue;
    let key = std::collections::HashMap::from([
        (
            "pk".to_string(),
            AttributeValue::S(nodesmith::state::PK_NODECLAIM.into()),
        ),
        ("sk".to_string(), AttributeValue::S(claim.into())),
    ]);
    let mut item = s
        .store
        .client()
        .get_item()
        .table_name(s.store.table())
        .set_key(Some(key))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .unwrap();
    use nodesmith::state::{PACKED_CLAIM_ATTRIBUTE, packing};
    let packed = item[PACKED_CLAIM_ATTRIBUTE].as_b().unwrap();
    let mut body: serde_json::Value = serde_json::from_str(&packing::unpack(packed.as_ref()).unwrap()).unwrap();
    body["phase"] = json!("Repairing");
    body["repair"] = json!({"policy": "reboot", "attempts": 1});
    let packed = packing::pack(&body.to_string()).unwrap();
    item.insert(
        PACKED_CLAIM_ATTRIBUTE.into(),
        AttributeValue::B(aws_sdk_dynamodb::primitives::Blob::new(packed)),
    );
    item.insert("phase".into(), AttributeValue::S("Repairing".into()));
    s.store
        .client()
        .put_item()
        .table_name(s.store.table())
        .set_item(Some(item))
        .send()
        .await
        .unwrap();
}

#[tokio::test]
async fn a_claim_item_a_newer_release_wrote_neither_stops_the_sweep_nor_loses_its_instance() {
    let s = stack("64", 4).await;
    let first = s.launched(&["web-0", "web-1"]).await;
    let unreadable = first[0].clone();
    write_as_a_newer_release(&s, &unreadable.name).await;
    let id = unreadable.instance_id.clone().unwrap();

    // The rest goes on: a solve for more pods, their launch, their registration.
    let out = s.provision(&["web-2", "web-3"]).await;
    assert!(out.failed.is_empty() && !out.created.is_empty(), "{out:?}");
    s.launch_all().await;
    s.kubelet_step().await;
    let sweeper = s.sweeper(LifecycleConfig {
        leak_window: Duration::ZERO,
        ..fast()
    });
    let report = sweeper.run().await.unwrap();
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    let done = short(&report);
    assert!(done.contains(&"register".to_string()), "{done:?}");
    assert!(
        !done.iter().any(|a| a.starts_with("collect")),
        "the unreadable claim's instance and Node are not collected: {done:?}"
    );
    assert_eq!(s.instance_states().await.get(&id).map(String::as_str), Some("running"));
    let metrics = nodesmith::telemetry::totals(&report.metrics());
    let unreadable_count = metrics.get("NodeClaimsUnreadable").copied();
    assert_eq!(unreadable_count, Some(1.0), "{metrics:?}");
    // The item is left as it is for the release that wrote it.
    assert!(s.store.get_node_claim(&unreadable.name).await.is_err());
}
