//! SQS delivers at least once, and Lambda runs two invocations of a function
//! at once: on the local cloud every message of every queue is delivered two
//! or three times, two of each function's processes take them at once, and
//! still no NodeClaim gets a second instance, no instance leaks, and a pool's
//! limit holds at every moment.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use nodesmith_tests::local_cloud::census::{self, Ledger, World, pod_running};
use nodesmith_tests::local_cloud::demo::deployment;
use nodesmith_tests::local_cloud::mapping::Invocation;
use nodesmith_tests::local_cloud::{LocalCloud, Settings, default_objects};
use serde_json::json;

const APPS: [&str; 4] = ["web", "api", "batch", "cache"];
const LIMIT_CPU: u64 = 24;

async fn world(cloud: &LocalCloud, ledger: &mut Ledger) -> World {
    let w = census::observe(cloud, |a| APPS.contains(&a)).await.unwrap();
    ledger.note(&w);
    w
}

/// Two invocations of `function` ran at once.
fn overlapped(all: &[Invocation], function: &str) -> bool {
    let spans: Vec<(jiff::Timestamp, jiff::Timestamp)> = all
        .iter()
        .filter(|i| i.function == function)
        .map(|i| {
            let end = i.at + jiff::SignedDuration::try_from(i.answer.duration).unwrap_or_default();
            (i.at, end)
        })
        .collect();
    spans
        .iter()
        .enumerate()
        .any(|(n, a)| spans[n + 1..].iter().any(|b| a.0 < b.1 && b.0 < a.1))
}

/// Pods a `FailedScheduling` event says the pool's limit kept out.
fn refused_for_the_limit(cloud: &LocalCloud) -> BTreeSet<String> {
    cloud
        .kube
        .events()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("FailedScheduling"))
        .filter(|e| e.message.as_deref().is_some_and(|m| m.contains("limit")))
        .filter(|e| e.involved_object.kind.as_deref() == Some("Pod"))
        .filter_map(|e| e.involved_object.name)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn duplicated_deliveries_and_concurrent_invocations_launch_once_within_the_limit() {
    let mut settings = Settings::from_lookup(|_| None, nodesmith_tests::bin_dir()).unwrap();
    settings.duplicate_deliveries = true;
    let cloud = LocalCloud::start(settings).await.unwrap();
    let mut pool = default_objects(&cloud.settings.cluster, &cloud.world.node_role)[0].clone();
    pool["spec"]["limits"] = json!({"cpu": LIMIT_CPU.to_string()});
    pool["spec"]["disruption"]["consolidateAfter"] = json!("Never");
    cloud.kube.apply(&pool).unwrap();
    // 32 cpu asked of a pool limited to 24, in four Deployments at once.
    for app in APPS {
        cloud.kube.apply(&deployment(app, 8, "1", "1Gi")).unwrap();
    }
    let mut ledger = Ledger::default();
    let mut peak_cpu = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    // Until the limit allows no more: nothing in flight, and every pod not
    // running was refused for the limit (a decision the functions made, not a
    // quiet spell on the clock).
    loop {
        let w = world(&cloud, &mut ledger).await;
        let cpu: u64 = w.instances.iter().filter(|i| i.live()).map(|i| i.cpu()).sum();
        peak_cpu = peak_cpu.max(cpu);
        assert!(cpu <= LIMIT_CPU, "{cpu} vCPU running against a limit of {LIMIT_CPU}");
        let refused = refused_for_the_limit(&cloud);
        let waiting: Vec<&str> = w
            .pods
            .iter()
            .filter(|p| !pod_running(p))
            .filter_map(|p| p.metadata.name.as_deref())
            .collect();
        if w.pods.len() == 32 && w.settled() && !waiting.is_empty() && waiting.iter().all(|p| refused.contains(*p)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after 120 s: {} running, waiting {waiting:?}, refused for the limit {refused:?}",
            w.running()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let limited = world(&cloud, &mut ledger).await;
    assert!(
        limited.running() >= 12,
        "only {} pods run within the limit",
        limited.running()
    );
    assert!(
        peak_cpu > LIMIT_CPU / 2,
        "the limit was never approached ({peak_cpu} vCPU)"
    );

    // The limit lifted: every pod runs.
    pool["spec"].as_object_mut().unwrap().remove("limits");
    cloud.kube.apply(&pool).unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let end = loop {
        let w = world(&cloud, &mut ledger).await;
        if w.pods.len() == 32 && w.pods.iter().all(pod_running) && w.settled() {
            break w;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} pods running after 120 s",
            w.running(),
            w.pods.len()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let invocations = cloud.activity.all();
    let denials = cloud.kube.denials();
    let failed_scheduling: Vec<String> = cloud
        .kube
        .events()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("FailedScheduling"))
        .filter_map(|e| e.message)
        .collect();
    cloud.stop().await;
    assert_eq!(
        ledger.double_launches(),
        Vec::<String>::new(),
        "NodeClaims with two instances"
    );
    assert_eq!(end.leaked(), Vec::<String>::new(), "leaked instances");
    assert!(denials.is_empty(), "{denials:?}");
    // The pods the limit kept out were told why.
    assert!(
        failed_scheduling.iter().any(|m| m.contains("limit")),
        "{failed_scheduling:#?}"
    );
    // The races this test is about did happen.
    for f in ["provision", "launch"] {
        assert!(overlapped(&invocations, f), "no two {f} invocations ran at once");
    }
    let provisions = invocations.iter().filter(|i| i.function == "provision").count();
    assert!(provisions >= 4, "{provisions} provision invocations");
}
