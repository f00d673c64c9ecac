//! Node repair by the real sweep on the local stack: an instance whose EC2
//! system status check is impaired (seeded in moto, which passes every check)
//! is recorded `Unhealthy`, drained by force past a PDB that allows nothing,
//! and terminated; the AWS Health scheduled change for the same instance that
//! `interrupt` receives meanwhile adds nothing: one disruption record, no
//! termination record, no replacement, one termination.

use std::time::Duration;

use nodesmith::disruption::Reason;
use nodesmith::ec2::Instances;
use nodesmith::kubernetes::Cluster;
use nodesmith::sweep::{SweepConfig, Sweeper};
use serde_json::json;

use crate::launch_fixtures::CLUSTER;
use crate::local_stack::{Stack, event, fast, pods_on, taint_keys};

#[tokio::test]
async fn an_impaired_node_is_repaired_once_whichever_path_hears_of_it() {
    let s = Stack::new("64", 2).await;
    let claim = s.running_node().await;
    let node = claim.node_name.clone().unwrap();
    let instance = claim.instance_id.clone().unwrap();
    s.kube.apply(&crate::local_stack::web_pdb()).unwrap();
    s.m.seed_impaired(&json!({"instanceId": instance, "checks": ["system"], "since": "2026-01-01T00:00:00Z"}));

    // A run with no time left records the repair (and taints) but takes no step.
    let mut config = SweepConfig::from_lookup(|_| None).unwrap();
    config.lifecycle = fast();
    config.pending_queue_url = Some(s.pending_queue.clone());
    config.launch_queue_url = Some(s.launch_queue.clone());
    config.lease = Duration::from_secs(1);
    config.budget = Duration::ZERO;
    let deciding = Sweeper::new(
        s.cluster(),
        s.store.clone(),
        Instances::new(s.ec2.clone(), CLUSTER),
        s.sqs.clone(),
        config,
    );
    let report = deciding.run().await.unwrap();
    assert_eq!(
        report.disruption.started,
        vec![(node.clone(), Reason::Unhealthy)],
        "{report:?}"
    );
    let n = s.cluster().node(&node).await.unwrap().unwrap();
    assert!(taint_keys(&n).contains(&"karpenter.sh/disrupted".to_string()));

    // AWS Health announces the instance's retirement: the repair has it already.
    let start = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(48);
    let retirement = json!({"version": "0", "id": "health-1", "detail-type": "AWS Health Event", "source": "aws.health",
        "account": "123456789012", "time": nodesmith::interruption::rfc3339(&jiff::Timestamp::now()), "region": "us-east-1",
        "resources": [], "detail": {"service": "EC2", "eventTypeCode": "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
            "eventTypeCategory": "scheduledChange", "startTime": start.strftime("%a, %d %b %Y %H:%M:%S GMT").to_string(),
            "affectedEntities": [{"entityValue": instance}]}})
    .to_string();
    let out = s.interrupter(|_| {}).handle(&event(vec![retirement])).await;
    assert!(out.failed.is_empty(), "{out:?}");
    assert!(out.replacements.is_empty() && out.removed.is_empty(), "{out:?}");
    assert_eq!(out.ignored, 1, "{out:?}");
    assert!(s.drain(&s.launch_queue).await.is_empty(), "no replacement launched");
    assert!(s.store.terminations().await.unwrap().is_empty());
    let records = s.store.disruptions().await.unwrap();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].reason, Reason::Unhealthy);
    assert!(records[0].detail.contains("EC2 status check impaired"), "{records:?}");

    // The sweep carries the repair out: forced past the PDB, then terminated.
    let sweeper = s.sweeper(fast());
    let mut terminated = Vec::new();
    for _ in 0..4 {
        let r = sweeper.run().await.unwrap();
        assert!(r.disruption.failed.is_empty(), "{r:?}");
        assert!(r.disruption.started.is_empty(), "never a second record: {r:?}");
        terminated.extend(r.disruption.terminated);
        if !terminated.is_empty() {
            break;
        }
        s.kubelet_step().await;
    }
    assert_eq!(terminated, vec![node.clone()]);
    assert!(pods_on(&s.kube, &node).is_empty());
    assert!(s.cluster().node(&node).await.unwrap().is_none());
    assert!(s.store.get_node_claim(&claim.name).await.unwrap().is_none());
    let state = s.instance_states().await.remove(&instance).unwrap_or_default();
    assert!(matches!(state.as_str(), "shutting-down" | "terminated"), "{state}");
    assert!(s.store.disruptions().await.unwrap().is_empty());
    assert!(s.store.terminations().await.unwrap().is_empty());
    assert!(s.store.drains().await.unwrap().is_empty());
}
