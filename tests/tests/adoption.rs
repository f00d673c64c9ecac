//! Garbage collection of claimless instances on the local stack, through the
//! real sweep against moto and the Kubernetes API test server: however many
//! instances look collectable, one run terminates at most a tenth of the
//! fleet (at least one), and says so with a warning event on the NodePool and
//! a metric; the rest go in later runs. (The table wipe itself, on the local
//! cloud: `tests/tests/table_loss.rs`.)

use std::time::Duration;

use nodesmith::lifecycle::LifecycleConfig;

use crate::launch_fixtures::CLUSTER;
use crate::local_stack::{Stack, fast};

/// An instance tagged as nodesmith's launch tags it, for a claim the table does
/// not have, whose kubelet never joins (no user data).
async fn claimless(s: &Stack, claim: &str) -> String {
    let tags = [
        (format!("kubernetes.io/cluster/{CLUSTER}"), "owned".to_string()),
        ("eks:eks-cluster-name".to_string(), CLUSTER.to_string()),
        ("nodesmith/launched-by".to_string(), CLUSTER.to_string()),
        ("karpenter.sh/nodepool".to_string(), "default".to_string()),
        ("karpenter.sh/nodeclaim".to_string(), claim.to_string()),
    ];
    nodesmith_tests::moto::run_tagged_instance(&s.ec2, &tags).await
}

#[tokio::test]
async fn a_run_terminates_at_most_a_tenth_of_the_fleet_and_says_so() {
    let s = Stack::new("64", 0).await;
    let mut ids = Vec::new();
    for k in 0..3 {
        ids.push(claimless(&s, &format!("default-gone{k}")).await);
    }
    // Past the leak window and the registration timeout: every one is due.
    let sweeper = s.sweeper(LifecycleConfig {
        leak_window: Duration::ZERO,
        registration_timeout: Duration::ZERO,
        ..fast()
    });
    // Decisions a little later than now: every instance is past both, at once.
    let later = || jiff::Timestamp::now() + jiff::SignedDuration::from_secs(2);
    let terminated = |states: &std::collections::BTreeMap<String, String>| {
        ids.iter()
            .filter(|i| states.get(*i).is_some_and(|s| s != "running"))
            .count()
    };
    for run in 1..=3 {
        let report = sweeper.run_at(later()).await.unwrap();
        assert!(report.failed.is_empty(), "{:?}", report.failed);
        assert_eq!(
            terminated(&s.instance_states().await),
            run,
            "run {run}: three instances, so one a run"
        );
        let held = nodesmith::telemetry::totals(&report.metrics())
            .get("InstancesCollectionHeld")
            .copied();
        assert_eq!(
            held,
            Some((3 - run) as f64),
            "run {run}: the metric counts those held back"
        );
    }
    let warnings: Vec<String> = s
        .kube
        .events()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("GarbageCollectionLimited"))
        .map(|e| {
            format!(
                "{}/{}: {}",
                e.involved_object.kind.unwrap_or_default(),
                e.involved_object.name.unwrap_or_default(),
                e.message.unwrap_or_default()
            )
        })
        .collect();
    assert_eq!(
        warnings.len(),
        2,
        "one warning a run that held some back: {warnings:#?}"
    );
    for held in [2, 1] {
        let start = format!("NodePool/default: {held} of this pool's instances with no NodeClaim");
        assert!(
            warnings
                .iter()
                .any(|w| w.starts_with(&start) && w.ends_with("at most 1")),
            "{warnings:#?}"
        );
    }
}
