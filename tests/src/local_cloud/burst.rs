//! A burst: thousands of pods across many Deployments go pending at once and
//! run through the whole loop (forwarder, provision, launch, the kubelets,
//! the sweep's registration). It measures what a platform team asks of an
//! autoscaler under load: how long until every pod runs, how many CreateFleet
//! calls and nodes that took, and that nothing launched twice or leaked.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use super::LocalCloud;
use super::census::{self, Ledger};
use super::demo::deployment;
use super::runtime;

/// What the burst asks for.
#[derive(Clone, Debug)]
pub struct BurstOptions {
    /// Pods in all.
    pub pods: usize,
    /// Deployments they are spread over.
    pub deployments: usize,
    /// How long to wait for every pod to run.
    pub timeout: Duration,
}

impl Default for BurstOptions {
    fn default() -> Self {
        BurstOptions {
            pods: 5000,
            deployments: 50,
            timeout: Duration::from_secs(900),
        }
    }
}

/// What the burst measured.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BurstReport {
    /// Pods created.
    pub pods: usize,
    /// Deployments.
    pub deployments: usize,
    /// Pods running at the end.
    pub pods_running: usize,
    /// From the Deployments' creation to the first CreateFleet.
    pub seconds_to_first_launch: Option<f64>,
    /// From the Deployments' creation to the last CreateFleet seen (every
    /// CreateFleet issued, once every pod runs).
    pub seconds_to_last_launch: Option<f64>,
    /// From the Deployments' creation to every pod running.
    pub seconds_to_all_running: Option<f64>,
    /// CreateFleet calls that reached EC2.
    pub create_fleet_calls: usize,
    /// Instances launched.
    pub nodes_launched: usize,
    /// NodeClaims that ever had more than one instance.
    pub double_launches: usize,
    /// Live instances no NodeClaim names at the end.
    pub leaked_instances: usize,
    /// `provision` invocations.
    pub provision_invocations: usize,
    /// `launch` invocations.
    pub launch_invocations: usize,
    /// Invocations killed at their function's timeout, by function.
    pub invocations_timed_out: BTreeMap<String, usize>,
    /// The largest resident memory a function's process reached, by function,
    /// and the forwarder's (held to its limit in `infra/k8s/forwarder.yaml`)
    /// (MB; its high-water mark read five times a second, so a process that ended
    /// between reads after a new peak is missed).
    pub peak_rss_mb_by_function: BTreeMap<String, u64>,
    /// The fleet's price per hour at the end (USD).
    pub fleet_cost_per_hour: f64,
}

/// The label every burst pod carries (`app` is its Deployment's name).
const PREFIX: &str = "burst-";
/// How often the CreateFleet count and the functions' memory are read.
const SAMPLE: Duration = Duration::from_millis(200);
/// How often the pods are counted.
const COUNT_EVERY: Duration = Duration::from_secs(2);
/// How often progress is printed (and the instances noted).
const PRINT_EVERY: Duration = Duration::from_secs(10);

/// A pod of the burst (its JSON).
fn is_burst_pod(pod: &serde_json::Value) -> bool {
    pod.pointer("/metadata/labels/app")
        .and_then(serde_json::Value::as_str)
        .is_some_and(|a| a.starts_with(PREFIX))
}

/// A pod bound to a node and Running (its JSON), as [`census::pod_running`] asks of a typed one.
fn is_running(pod: &serde_json::Value) -> bool {
    pod.pointer("/spec/nodeName").is_some_and(|n| !n.is_null())
        && pod.pointer("/status/phase").and_then(serde_json::Value::as_str) == Some("Running")
}

/// Plays the burst on `cloud`, printing progress to `out` now and then.
pub async fn run(cloud: &LocalCloud, options: &BurstOptions, out: &mut dyn Write) -> Result<BurstReport, String> {
    let deployments = options.deployments.max(1);
    let started = Instant::now();
    for d in 0..deployments {
        // The pods shared out as evenly as they go.
        let replicas = options.pods / deployments + usize::from(d < options.pods % deployments);
        cloud
            .kube
            .apply(&deployment(&format!("{PREFIX}{d}"), replicas, "250m", "512Mi"))
            .map_err(|e| format!("the Deployment {PREFIX}{d}: {e}"))?;
    }
    let mut ledger = Ledger::default();
    let mut first_launch = None;
    let mut last_launch = None;
    let mut launches = 0;
    let mut all_running = None;
    let mut last_count = Instant::now();
    let mut last_print = Instant::now();
    let mut peaks = BTreeMap::new();
    while started.elapsed() < options.timeout {
        // Cheap, so sampled often: the launch times are as fine as SAMPLE.
        let calls = cloud.faults().calls("CreateFleet");
        if calls > launches {
            launches = calls;
            last_launch = Some(started.elapsed().as_secs_f64());
            first_launch = first_launch.or(last_launch);
        }
        let forwarder = cloud.forwarder_pid().map(|pid| ("forwarder", pid));
        for (function, pid) in cloud.function_pids().into_iter().chain(forwarder) {
            let mb = crate::memory_mb(&pid.to_string(), "VmHWM:");
            let peak = peaks.entry(function.to_string()).or_insert(0);
            *peak = mb.max(*peak);
        }
        // The pod census holds the test server's lock: seldom, and copying nothing.
        if last_count.elapsed() >= COUNT_EVERY {
            last_count = Instant::now();
            let running = cloud.kube.count_pods(|p| is_burst_pod(p) && is_running(p));
            if last_print.elapsed() >= PRINT_EVERY {
                last_print = Instant::now();
                // Every instance is noted as it comes, so a second one for a claim is seen.
                let instances =
                    census::instances(&aws_sdk_ec2::Client::new(&cloud.sdk), &cloud.settings.cluster).await?;
                ledger.note_instances(&instances);
                let _ = writeln!(
                    out,
                    "   t={:>6.1}s  {running}/{} pods running · {launches} CreateFleet calls",
                    started.elapsed().as_secs_f64(),
                    options.pods,
                );
            }
            if running == options.pods && cloud.kube.count_pods(is_burst_pod) == options.pods {
                all_running = Some(started.elapsed().as_secs_f64());
                break;
            }
        }
        tokio::time::sleep(SAMPLE).await;
    }
    let world = census::observe(cloud, |a| a.starts_with(PREFIX)).await?;
    ledger.note(&world);
    let invocations = cloud.activity.all();
    let count = |f: &str| invocations.iter().filter(|i| i.function == f).count();
    let mut timed_out = BTreeMap::new();
    for i in &invocations {
        if i.answer
            .result
            .as_ref()
            .is_err_and(|e| e.starts_with(runtime::TIMED_OUT))
        {
            *timed_out.entry(i.function.clone()).or_insert(0) += 1;
        }
    }
    Ok(BurstReport {
        pods: options.pods,
        deployments,
        pods_running: world.pods.iter().filter(|p| census::pod_running(p)).count(),
        seconds_to_first_launch: first_launch,
        seconds_to_last_launch: last_launch,
        seconds_to_all_running: all_running,
        create_fleet_calls: cloud.faults().calls("CreateFleet"),
        nodes_launched: ledger.launched(),
        double_launches: ledger.double_launches().len(),
        leaked_instances: world.leaked().len(),
        provision_invocations: count("provision"),
        launch_invocations: count("launch"),
        invocations_timed_out: timed_out,
        peak_rss_mb_by_function: peaks,
        fleet_cost_per_hour: (world.cost_per_hour() * 10_000.0).round() / 10_000.0,
    })
}
