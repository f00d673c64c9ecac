//! The `interrupt` handler on the local stack: moto (DynamoDB, SQS, EC2) and
//! the Kubernetes API test server with strict kubelets. A node is launched,
//! registered and filled by provision → launch → kubelets → sweep, then
//! interruption events arrive as SQS records.

use crate::local_stack;

use crate::local_stack::{Stack, ec2_event, event, pods_on, taint_keys};
use nodesmith::kubernetes::Cluster;
use nodesmith::nodeclaim::Phase;
use serde_json::json;

#[tokio::test]
async fn spot_interruption_taints_replaces_first_honours_pdbs_then_forces_at_the_deadline() {
    let s = Stack::new("64", 2).await;
    let claim = s.running_node().await;
    let node = claim.node_name.clone().unwrap();
    let instance = claim.instance_id.clone().unwrap();
    // A budget that allows no disruption at all.
    s.kube
        .apply(&json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web", "namespace": "default"},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}}))
        .unwrap();
    let now = jiff::Timestamp::now();
    let warning = ec2_event(
        "spot-1",
        "EC2 Spot Instance Interruption Warning",
        now,
        json!({"instance-id": instance, "instance-action": "terminate"}),
    );
    let garbage = "{\"detail-type\": 5}".to_string();
    let foreign = ec2_event(
        "spot-foreign",
        "EC2 Spot Instance Interruption Warning",
        now,
        json!({"instance-id": "i-0123456789abcdef0"}),
    );
    let h = s.interrupter(|_| {});
    let out = h.handle(&event(vec![warning.clone(), garbage, foreign])).await;
    assert!(out.failed.is_empty(), "{out:?}");
    assert_eq!((out.unknown, out.ignored), (1, 1), "{out:?}");
    assert_eq!(out.tainted, vec![node.clone()]);
    assert_eq!(out.replacements.len(), 1, "{out:?}");

    // Tainted, replacement written and queued, the pods still where they were (PDB).
    let n = s.cluster().node(&node).await.unwrap().unwrap();
    assert!(taint_keys(&n).contains(&"karpenter.sh/disrupted".to_string()));
    let queued = s.drain(&s.launch_queue).await;
    assert_eq!(queued.len(), 1);
    assert!(queued[0].contains(&out.replacements[0].name), "{queued:?}");
    assert_eq!(
        pods_on(&s.kube, &node).len(),
        2,
        "the PDB holds the pods before the deadline nears"
    );
    let stored = s.store.get_node_claim(&claim.name).await.unwrap().unwrap();
    assert_eq!(stored.phase, Phase::Draining);
    let offering = nodesmith::state::OfferingKey::new(
        claim.instance_type.as_deref().unwrap(),
        claim.zone.as_deref().unwrap(),
        claim.capacity_type.as_deref().unwrap(),
    );
    let unavailable = s.store.unavailable_offerings(now.as_second()).await.unwrap();
    assert!(unavailable.iter().any(|u| u.key == offering), "{unavailable:?}");
    let drains = s.store.drains().await.unwrap();
    assert_eq!(drains.len(), 1, "{drains:?}");

    // The same event again: nothing more.
    let again = h.handle(&event(vec![warning])).await;
    assert!(
        again.replacements.is_empty() && again.tainted.is_empty() && again.failed.is_empty(),
        "{again:?}"
    );
    assert!(s.drain(&s.launch_queue).await.is_empty());

    // Later, with the deadline near, any invocation continues the drain and forces it.
    let late = s.interrupter(|_| {});
    let mut forced_store = s.store.drains().await.unwrap().remove(0);
    forced_store.force_from_ms = Some(now.as_millisecond() - 1);
    s.store.end_drain(&forced_store.claim).await.unwrap();
    s.store.begin_drain(&forced_store).await.unwrap();
    let out = late.handle(&event(vec![])).await;
    assert!(out.failed.is_empty(), "{out:?}");
    assert!(
        pods_on(&s.kube, &node).is_empty(),
        "forced at the deadline: {:?}",
        pods_on(&s.kube, &node)
    );

    // moto's offerings carry no spot price: give the claim one for the meter.
    let mut priced = s.store.get_node_claim(&claim.name).await.unwrap().unwrap();
    priced.price = Some(0.0416);
    s.store.update_node_claim(&priced).await.unwrap();
    // The instance terminates: Node and claim go, a solve is requested; no second replacement.
    let gone = ec2_event(
        "state-1",
        "EC2 Instance State-change Notification",
        now,
        json!({"instance-id": instance, "state": "terminated"}),
    );
    let out = h.handle(&event(vec![gone])).await;
    assert_eq!(out.removed, vec![claim.name.clone()], "{out:?}");
    // What the fleet no longer pays for, for the meter.
    assert_eq!(out.removed_usd_per_hour, 0.0416, "{out:?}");
    assert!(out.replacements.is_empty());
    assert!(s.cluster().node(&node).await.unwrap().is_none());
    assert!(s.store.get_node_claim(&claim.name).await.unwrap().is_none());
    let asked = s.drain(&s.pending_queue).await;
    assert!(asked.iter().any(|b| b.contains("instance-state-change")), "{asked:?}");
    assert!(s.store.drains().await.unwrap().is_empty());
}

#[tokio::test]
async fn rebalance_recommendations_follow_the_configured_mode() {
    let s = Stack::new("64", 2).await;
    let claim = s.running_node().await;
    let node = claim.node_name.clone().unwrap();
    let instance = claim.instance_id.clone().unwrap();
    let rebalance = |id: &str| {
        ec2_event(
            id,
            "EC2 Instance Rebalance Recommendation",
            jiff::Timestamp::now(),
            json!({"instance-id": instance}),
        )
    };
    let ignore = s.interrupter(|c| c.rebalance = "ignore".parse().unwrap());
    let out = ignore.handle(&event(vec![rebalance("r-1")])).await;
    assert!(
        out.tainted.is_empty() && out.replacements.is_empty() && out.ignored == 1,
        "{out:?}"
    );

    // Karpenter's default: a recommendation is acknowledged and nothing is done.
    let default = s.interrupter(|_| {});
    let out = default.handle(&event(vec![rebalance("r-0")])).await;
    assert!(
        out.tainted.is_empty() && out.replacements.is_empty() && out.ignored == 1,
        "the default does nothing: {out:?}"
    );

    let replace = s.interrupter(|c| c.rebalance = "replace".parse().unwrap());
    let out = replace.handle(&event(vec![rebalance("r-2")])).await;
    assert_eq!((out.tainted.len(), out.replacements.len()), (1, 1), "{out:?}");
    assert_eq!(pods_on(&s.kube, &node).len(), 2, "replace mode drains nothing");
    assert!(s.store.drains().await.unwrap().is_empty());

    let drain = s.interrupter(|c| c.rebalance = "drain".parse().unwrap());
    let out = drain.handle(&event(vec![rebalance("r-3")])).await;
    assert!(
        out.replacements.is_empty(),
        "a draining claim is not replaced twice: {out:?}"
    );
    assert!(pods_on(&s.kube, &node).is_empty(), "drain mode evicts (no PDB here)");
}

#[tokio::test]
async fn the_sweep_continues_a_recorded_drain_and_forces_it_at_the_deadline() {
    let s = Stack::new("64", 2).await;
    let claim = s.running_node().await;
    let node = claim.node_name.clone().unwrap();
    let instance = claim.instance_id.clone().unwrap();
    s.kube
        .apply(&json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web", "namespace": "default"},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}}))
        .unwrap();
    let now = jiff::Timestamp::now();
    let warning = ec2_event(
        "spot-sweep",
        "EC2 Spot Instance Interruption Warning",
        now,
        json!({"instance-id": instance}),
    );
    let out = s.interrupter(|_| {}).handle(&event(vec![warning])).await;
    assert_eq!(out.tainted, vec![node.clone()], "{out:?}");
    assert_eq!(s.store.drains().await.unwrap().len(), 1);

    // No further event arrives; the sweep continues the drain. Before the
    // deadline nears the PDB holds.
    let sweeper = s.sweeper(local_stack::fast());
    sweeper.run().await.unwrap();
    assert_eq!(pods_on(&s.kube, &node).len(), 2, "the PDB holds before the deadline");
    assert_eq!(s.store.drains().await.unwrap().len(), 1);

    // The deadline nears: the sweep forces what the PDB holds, then finds the node empty.
    let mut record = s.store.drains().await.unwrap().remove(0);
    record.force_from_ms = Some(jiff::Timestamp::now().as_millisecond() - 1);
    s.store.end_drain(&record.claim).await.unwrap();
    s.store.begin_drain(&record).await.unwrap();
    sweeper.run().await.unwrap();
    assert!(pods_on(&s.kube, &node).is_empty(), "{:?}", pods_on(&s.kube, &node));
    sweeper.run().await.unwrap();
    assert!(
        s.store.drains().await.unwrap().is_empty(),
        "the finished drain is forgotten"
    );
}
