//! The demo: a story played on the local cloud with live progress, and its
//! summary (contract keys in `docs/local-stack.md`).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::LocalCloud;
use super::census::{self, Ledger, World, has_taint};
use super::mapping::Invocation;
use crate::eventbridge;

/// How the demo runs.
#[derive(Clone, Debug)]
pub struct DemoOptions {
    /// Replicas of `inflate`.
    pub replicas: usize,
    /// How long a chapter may take before the demo gives up on it (the
    /// sweep on its schedule), and how long a wait for the functions may take.
    pub chapter_timeout: Duration,
    /// On a cloud whose sweep runs by hand (tests): how many sweeps a chapter
    /// may take before the demo gives up on it. The demo then waits for the
    /// queues to empty before each sweep, so a slow machine takes longer but
    /// never runs out of time.
    pub chapter_sweeps: usize,
    /// Redraw a live table (a terminal) or print a line now and then.
    pub live: bool,
    /// Play EC2's bad days through the fault proxy: no spot capacity in the
    /// cheapest offerings all story long, and at every chapter's start a burst
    /// of throttling and of 5xx answers.
    pub faults: bool,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            replicas: 100,
            chapter_timeout: Duration::from_secs(180),
            chapter_sweeps: 30,
            live: std::io::stdout().is_terminal(),
            faults: false,
        }
    }
}

/// The summary (serialized with the contract's keys).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// The most pods of `inflate` seen running on nodes at once (all 100 in chapter 1).
    pub pods_scheduled: usize,
    /// Pods of `inflate` not running at the end.
    pub pods_pending: usize,
    /// Instances launched for the cluster.
    pub nodes_launched: usize,
    /// Of those, instances terminated (or terminating).
    pub nodes_terminated: usize,
    /// Interruption events answered (taint, replacement, drain).
    pub interruptions_handled: usize,
    /// Nodes removed by consolidation (empty or underused).
    pub nodes_consolidated: usize,
    /// Nodes replaced for drift.
    pub nodes_drifted: usize,
    /// Nodes replaced at expiry.
    pub nodes_expired: usize,
    /// Running instances tagged for the cluster with no NodeClaim at the end.
    pub leaked_instances: usize,
    /// NodeClaims that ever had more than one instance.
    pub double_launches: usize,
    /// The fleet's highest price per hour seen (USD).
    pub fleet_cost_per_hour_peak: f64,
    /// The fleet's price per hour at the end (USD).
    pub fleet_cost_per_hour_end: f64,
    /// What the functions' invocations would cost on Lambda (USD: GB-seconds and requests).
    pub autoscaler_cost_usd: f64,
    /// Median time from a pod going pending to the CreateFleet of the node it runs on.
    pub pending_to_launch_millis_p50: Option<u64>,
    /// 95th percentile of the same.
    pub pending_to_launch_millis_p95: Option<u64>,
    /// Chapter 1: median time from a Node turning Ready to the first pod seen Running on it.
    pub ready_to_first_running_millis_p50: Option<u64>,
    /// 95th percentile of the same.
    pub ready_to_first_running_millis_p95: Option<u64>,
    /// Chapter 1: median time from a pod seen pending to it seen Running.
    pub pending_to_running_millis_p50: Option<u64>,
    /// 95th percentile of the same.
    pub pending_to_running_millis_p95: Option<u64>,
    /// From the interruption warning to the node's `karpenter.sh/disrupted` taint.
    pub interruption_to_taint_millis: Option<u64>,
    /// Function invocations, all told.
    pub invocations: usize,
    /// CreateFleet calls that reached EC2 (the fault proxy counts them).
    pub create_fleet_calls: usize,
    /// EC2 faults injected (`--faults`): throttled calls, 5xx answers and
    /// offerings refused for want of capacity.
    pub ec2_faults_injected: usize,
    /// Seconds the story took.
    pub seconds: f64,
    /// Whether every chapter that ran reached its goal.
    pub ok: bool,
}

/// The demo failed to run (not: a chapter missed its goal; that is in the summary).
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The cluster refused an object.
    #[error("the Kubernetes API test server refused {what}: {message}")]
    Kube {
        /// The object.
        what: String,
        /// Its answer.
        message: String,
    },
    /// An AWS read failed.
    #[error("AWS ({what}): {message}")]
    Aws {
        /// The call.
        what: String,
        /// The error.
        message: String,
    },
}

fn aws_err(what: &str) -> impl Fn(String) -> DemoError + '_ {
    move |message| DemoError::Aws {
        what: what.to_string(),
        message,
    }
}

/// The `inflate` Deployment.
pub fn inflate(replicas: usize) -> Value {
    deployment("inflate", replicas, "1", "1536Mi")
}

/// A Deployment of pause pods labelled `app: <name>`, each requesting `cpu` and `memory`.
pub fn deployment(name: &str, replicas: usize, cpu: &str, memory: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": "default"}, "spec": {
        "replicas": replicas,
        "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}}, "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "app", "image": "public.ecr.aws/eks-distro/kubernetes/pause:3.7",
                "resources": {"requests": {"cpu": cpu, "memory": memory}}}]
        }}
    }})
}

/// Karpenter's default `expireAfter` (the default pool sets none).
const EXPIRE_AFTER_DEFAULT: Duration = Duration::from_secs(720 * 3600);

/// Plays the story on `cloud`, printing progress to `out`.
pub async fn run(cloud: &LocalCloud, options: &DemoOptions, out: &mut dyn Write) -> Result<Summary, DemoError> {
    let mut demo = Demo::new(cloud, options);
    let started = Instant::now();
    let mut ok = true;

    demo.chapter(
        out,
        "1/5",
        &format!("{} replicas of inflate go pending and run", options.replicas),
    );
    cloud
        .kube
        .apply(&inflate(options.replicas))
        .map_err(|message| DemoError::Kube {
            what: "the inflate Deployment".into(),
            message,
        })?;
    let goal = options.replicas;
    let mut samples = super::latency::Samples::default();
    let chapter1 = demo.until(out, |w| w.pods.len() == goal && w.running() == goal);
    ok &= super::latency::sample_while(&cloud.kube, "inflate", &mut samples, chapter1).await?;
    // The sampler's finer first sightings of pending pods.
    for (uid, at) in &samples.pending {
        let seen = demo.first_pending.entry(uid.clone()).or_insert(*at);
        *seen = (*seen).min(*at);
    }
    let latencies = demo.pending_to_launch();
    let ready_to_running = samples.ready_to_first_running();
    let pending_to_running = samples.pending_to_running();

    demo.chapter(out, "2/5", "a spot interruption warning for one node");
    let (handled, to_taint) = demo.interruption(out).await?;
    ok &= handled;

    demo.chapter(
        out,
        "3/5",
        "inflate scales to 10; empty and underused nodes are consolidated",
    );
    cloud.kube.apply(&inflate(10)).map_err(|message| DemoError::Kube {
        what: "the inflate Deployment".into(),
        message,
    })?;
    ok &= demo
        .until(out, |w| {
            w.pods.len() == 10 && w.running() == 10 && w.settled() && w.empty_nodes().is_empty()
        })
        .await?;

    demo.chapter(out, "4/5", "an EC2NodeClass change drifts and replaces the nodes");
    let before = demo.observe().await?.claim_names();
    let mut class = super::default_objects(&cloud.settings.cluster, &cloud.world.node_role)[1].clone();
    class["spec"]["tags"] = json!({"nodesmith.dev/demo": "drift"});
    cloud.kube.apply(&class).map_err(|message| DemoError::Kube {
        what: "the EC2NodeClass".into(),
        message,
    })?;
    let _ = writeln!(
        out,
        "   EC2NodeClass default: spec.tags changed ({} nodes to replace)",
        before.len()
    );
    ok &= demo
        .until(out, |w| {
            w.running() == 10 && w.settled() && w.claim_names().is_disjoint(&before)
        })
        .await?;

    demo.chapter(out, "5/5", "the nodes reach the pool's expireAfter and are replaced");
    let w = demo.observe().await?;
    let before = w.claim_names();
    // The test server's clock moves the nodes past the pool's expireAfter (the
    // default, 720h) instead of the story waiting: the replacements are new,
    // so they do not expire in turn while the pods move onto them.
    let age = EXPIRE_AFTER_DEFAULT + Duration::from_secs(3600);
    for n in &w.nodes {
        let name = n.metadata.name.clone().unwrap_or_default();
        cloud.kube.age_node(&name, age).map_err(|message| DemoError::Kube {
            what: format!("aging node {name}"),
            message,
        })?;
    }
    let _ = writeln!(
        out,
        "   {} nodes are {} h old: past the pool's expireAfter of 720h",
        w.nodes.len(),
        age.as_secs() / 3600
    );
    ok &= demo
        .until(out, |w| {
            w.running() == 10 && w.settled() && w.claim_names().is_disjoint(&before)
        })
        .await?;

    let end = demo.observe().await?;
    let events = cloud.kube.events();
    let invocations = cloud.activity.all();
    let summary = Summary {
        pods_scheduled: demo.peak_running,
        pods_pending: end.pods.len() - end.running(),
        nodes_launched: demo.ledger.launched(),
        nodes_terminated: end
            .instances
            .iter()
            .filter(|i| i.state == "terminated" || i.state == "shutting-down")
            .count(),
        interruptions_handled: usize::from(handled),
        nodes_consolidated: terminated_for(&events, "Empty") + terminated_for(&events, "Underutilized"),
        nodes_drifted: terminated_for(&events, "Drifted"),
        nodes_expired: terminated_for(&events, "Expired"),
        leaked_instances: end.leaked().len(),
        double_launches: demo.ledger.double_launches().len(),
        fleet_cost_per_hour_peak: round4(demo.peak_cost.max(end.cost_per_hour())),
        fleet_cost_per_hour_end: round4(end.cost_per_hour()),
        autoscaler_cost_usd: round6(lambda_cost(&invocations)),
        pending_to_launch_millis_p50: percentile(&latencies, 50),
        pending_to_launch_millis_p95: percentile(&latencies, 95),
        ready_to_first_running_millis_p50: percentile(&ready_to_running, 50),
        ready_to_first_running_millis_p95: percentile(&ready_to_running, 95),
        pending_to_running_millis_p50: percentile(&pending_to_running, 50),
        pending_to_running_millis_p95: percentile(&pending_to_running, 95),
        interruption_to_taint_millis: to_taint,
        invocations: invocations.len(),
        create_fleet_calls: cloud.faults().calls("CreateFleet"),
        ec2_faults_injected: demo.faults_injected(),
        seconds: (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
        ok: ok && end.running() == 10,
    };
    Ok(summary)
}

fn round4(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}

fn round6(x: f64) -> f64 {
    (x * 1_000_000.0).round() / 1_000_000.0
}

/// What the invocations would cost on Lambda, priced as the functions meter
/// themselves (`nodesmith::metering`: compute and requests; SQS, DynamoDB
/// and EventBridge requests are not counted).
pub fn lambda_cost(invocations: &[Invocation]) -> f64 {
    invocations
        .iter()
        .map(|i| {
            nodesmith::metering::invocation_cost_usd(&nodesmith::metering::Invocation {
                duration: i.answer.duration,
                init: i.answer.cold_start,
                memory_mb: u32::try_from(i.memory_mb).unwrap_or(u32::MAX),
            })
        })
        .sum()
}

/// The `p`th percentile (nearest rank) of `values`.
pub fn percentile(values: &[u64], p: u64) -> Option<u64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_unstable();
    let rank = (p as usize * v.len()).div_ceil(100).max(1);
    v.get(rank - 1).copied()
}

struct Demo<'a> {
    cloud: &'a LocalCloud,
    options: &'a DemoOptions,
    ec2: aws_sdk_ec2::Client,
    /// When each pod (by uid) was first seen pending.
    first_pending: BTreeMap<String, jiff::Timestamp>,
    /// The node each pod last ran on.
    pod_node: BTreeMap<String, String>,
    /// Every instance ever seen.
    ledger: Ledger,
    /// Launch time of each claim ever seen.
    claim_launched: BTreeMap<String, jiff::Timestamp>,
    peak_cost: f64,
    peak_running: usize,
    drawn_lines: usize,
    last_line: Instant,
    chapter_started: Instant,
    /// Sweeps run by hand in this chapter.
    chapter_sweeps: usize,
    chapter: String,
}

impl<'a> Demo<'a> {
    fn new(cloud: &'a LocalCloud, options: &'a DemoOptions) -> Self {
        Demo {
            cloud,
            options,
            ec2: aws_sdk_ec2::Client::new(&cloud.sdk),
            first_pending: BTreeMap::new(),
            pod_node: BTreeMap::new(),
            ledger: Ledger::default(),
            claim_launched: BTreeMap::new(),
            peak_cost: 0.0,
            peak_running: 0,
            drawn_lines: 0,
            last_line: Instant::now(),
            chapter_started: Instant::now(),
            chapter_sweeps: 0,
            chapter: String::new(),
        }
    }

    fn chapter(&mut self, out: &mut dyn Write, n: &str, what: &str) {
        if self.options.faults {
            let first = self.chapter.is_empty();
            let offerings = inject_faults(self.cloud, first);
            if first {
                let _ = writeln!(
                    out,
                    "   EC2 faults: no spot capacity in {offerings} offerings; throttling and 5xx bursts at each chapter"
                );
            }
        }
        self.drawn_lines = 0;
        self.chapter = format!("chapter {n}: {what}");
        self.chapter_started = Instant::now();
        self.chapter_sweeps = 0;
        let _ = writeln!(out, "\n== {}", self.chapter);
    }

    async fn observe(&mut self) -> Result<World, DemoError> {
        let now = jiff::Timestamp::now();
        let world = census::observe(self.cloud, |a| a == "inflate")
            .await
            .map_err(aws_err("observing the cloud"))?;
        for p in &world.pods {
            let uid = p.metadata.uid.clone().unwrap_or_default();
            match p.spec.as_ref().and_then(|s| s.node_name.clone()) {
                Some(node) => {
                    self.pod_node.insert(uid, node);
                }
                None => {
                    self.first_pending.entry(uid).or_insert(now);
                }
            }
        }
        for c in &world.claims {
            if let Some(t) = c.timestamps.launched {
                self.claim_launched.entry(c.name.clone()).or_insert(t);
            }
        }
        self.ledger.note(&world);
        self.peak_cost = self.peak_cost.max(world.cost_per_hour());
        self.peak_running = self.peak_running.max(world.running());
        Ok(world)
    }

    /// Observes and redraws until `goal` holds (true) or the chapter runs out
    /// of time or, on a cloud whose sweep runs by hand, of sweeps (false).
    /// By hand, it sweeps once the queues were empty at two looks in a row
    /// and the kubelets had time to act, looking on meanwhile.
    async fn until(&mut self, out: &mut dyn Write, goal: impl Fn(&World) -> bool) -> Result<bool, DemoError> {
        let by_hand = self.cloud.settings.manual_sweep;
        let mut calm = 0;
        let mut waiting_since = Instant::now();
        loop {
            let w = self.observe().await?;
            let done = goal(&w);
            let quiet = calm >= 2;
            let gave_up = if by_hand {
                quiet && self.chapter_sweeps >= self.options.chapter_sweeps
            } else {
                self.chapter_started.elapsed() > self.options.chapter_timeout
            };
            self.draw(out, &w, done || gave_up);
            if done {
                if by_hand {
                    let _ = writeln!(out, "   done after {} sweeps", self.chapter_sweeps);
                }
                return Ok(true);
            }
            if gave_up {
                let _ = match by_hand {
                    true => writeln!(out, "   gave up after {} sweeps", self.chapter_sweeps),
                    false => writeln!(out, "   gave up after {} s", self.options.chapter_timeout.as_secs()),
                };
                return Ok(false);
            }
            if !by_hand {
                tokio::time::sleep(Duration::from_millis(200)).await;
            } else if quiet {
                // The functions are done and the kubelets had their time: sweep.
                if let Err(e) = self.cloud.sweep().await {
                    let _ = writeln!(out, "   the sweep could not be invoked: {e}");
                }
                self.chapter_sweeps += 1;
                calm = 0;
                waiting_since = Instant::now();
            } else {
                // Queues that never empty (a message failing over and over)
                // count as quiet after the chapter's timeout: the sweep may be
                // what they wait for.
                let empty = self.cloud.queues_empty().await || waiting_since.elapsed() > self.options.chapter_timeout;
                calm = if empty { calm + 1 } else { 0 };
                let pause = if calm >= 2 {
                    self.cloud.kubelet_time()
                } else {
                    Duration::from_millis(300)
                };
                tokio::time::sleep(pause).await;
            }
        }
    }

    fn draw(&mut self, out: &mut dyn Write, w: &World, last: bool) {
        let total = w.pods.len().max(1);
        let running = w.running();
        let width = 30;
        let filled = running * width / total;
        let bar = format!("{}{}", "█".repeat(filled), "░".repeat(width - filled));
        let live_instances = w.instances.iter().filter(|i| i.live()).count();
        let mut lines = vec![
            format!(
                "   t={:>5.1}s  pods {bar} {running}/{} running, {} pending",
                self.chapter_started.elapsed().as_secs_f64(),
                w.pods.len(),
                w.pods.len() - running
            ),
            format!(
                "   nodes {} ready / {} registered · claims {} · instances {} running · fleet ${:.4}/h",
                w.ready_nodes(),
                w.nodes.len(),
                w.claims.len(),
                live_instances,
                w.cost_per_hour()
            ),
            format!(
                "   {:<10} {:>5} {:>8}  {}",
                "function", "calls", "last", "what it decided last"
            ),
        ];
        let all = self.cloud.activity.all();
        for f in super::FUNCTIONS {
            let mine: Vec<&Invocation> = all.iter().filter(|i| i.function == f.handler).collect();
            // The last invocation that decided something (an idle sweep says nothing).
            let last = mine
                .iter()
                .rev()
                .map(|i| (i, i.decision()))
                .find(|(i, d)| i.trigger != "schedule" || !d.is_empty())
                .or_else(|| mine.last().map(|i| (i, String::new())));
            let (took, decided) = match last {
                Some((i, d)) => (format!("{} ms", i.answer.duration.as_millis()), d),
                None => ("-".into(), "-".into()),
            };
            lines.push(format!(
                "   {:<10} {:>5} {:>8}  {}",
                f.handler,
                mine.len(),
                took,
                decided.chars().take(70).collect::<String>()
            ));
        }
        if self.options.live {
            if self.drawn_lines > 0 {
                let _ = write!(out, "\x1b[{}A\x1b[J", self.drawn_lines);
            }
            for l in &lines {
                let _ = writeln!(out, "{l}");
            }
            self.drawn_lines = lines.len();
        } else if last || self.last_line.elapsed() >= Duration::from_secs(3) || self.drawn_lines == 0 {
            let _ = writeln!(out, "{}", lines[0]);
            let _ = writeln!(out, "{}", lines[1]);
            if last {
                for l in &lines[2..] {
                    let _ = writeln!(out, "{l}");
                }
            }
            self.last_line = Instant::now();
            self.drawn_lines = 1;
        }
        let _ = out.flush();
    }

    /// Faults the proxy injected: throttled and failed calls, refused offerings.
    fn faults_injected(&self) -> usize {
        let f = self.cloud.faults();
        let calls: usize = FAULT_BURSTS
            .iter()
            .map(|(action, _, _)| f.throttled(action) + f.failed(action))
            .sum();
        calls + f.fleets().iter().map(|fl| fl.failed).sum::<usize>()
    }

    /// Per pod now running: from first seen pending to the launch of its node's claim.
    fn pending_to_launch(&self) -> Vec<u64> {
        let claim_of_node: BTreeMap<String, String> = self
            .cloud
            .kube
            .nodes()
            .iter()
            .filter_map(|n| {
                let claim = n.metadata.labels.as_ref()?.get("karpenter.sh/nodeclaim")?.clone();
                Some((n.metadata.name.clone()?, claim))
            })
            .collect();
        self.first_pending
            .iter()
            .filter_map(|(uid, seen)| {
                let node = self.pod_node.get(uid)?;
                let launched = self.claim_launched.get(claim_of_node.get(node)?)?;
                let ms = launched.as_millisecond() - seen.as_millisecond();
                // A pod placed on a node launched before it appeared waited for no launch.
                u64::try_from(ms).ok()
            })
            .collect()
    }

    /// Sends a spot interruption warning for the node with the most pods;
    /// waits for the taint, the replacement and every pod running again; then
    /// plays EC2 taking the instance. Returns (handled, warning → taint).
    async fn interruption(&mut self, out: &mut dyn Write) -> Result<(bool, Option<u64>), DemoError> {
        let w = self.observe().await?;
        let spot = w
            .claims
            .iter()
            .filter(|c| c.capacity_type.as_deref() == Some("spot"))
            .filter(|c| c.node_name.is_some() && c.instance_id.is_some())
            .max_by_key(|c| {
                self.pod_node
                    .values()
                    .filter(|n| Some(*n) == c.node_name.as_ref())
                    .count()
            });
        let Some(victim) = spot.or_else(|| w.claims.iter().find(|c| c.node_name.is_some())) else {
            let _ = writeln!(out, "   no node to interrupt: skipped");
            return Ok((false, None));
        };
        let (node, instance) = (
            victim.node_name.clone().unwrap_or_default(),
            victim.instance_id.clone().unwrap_or_default(),
        );
        let _ = writeln!(
            out,
            "   EC2 warns: spot instance {instance} (node {node}) will be interrupted in 2 minutes"
        );
        let eb = aws_sdk_eventbridge::Client::new(&self.cloud.sdk);
        let sent = Instant::now();
        eventbridge::put_spot_warning(&eb, &instance)
            .await
            .map_err(aws_err("PutEvents"))?;
        let mut to_taint = None;
        while sent.elapsed() < self.options.chapter_timeout {
            if self
                .cloud
                .kube
                .node(&node)
                .is_some_and(|n| has_taint(&n, "karpenter.sh/disrupted"))
            {
                to_taint = Some(sent.elapsed().as_millis() as u64);
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let Some(ms) = to_taint else {
            let _ = writeln!(out, "   the node was never tainted");
            return Ok((false, None));
        };
        let _ = writeln!(
            out,
            "   tainted karpenter.sh/disrupted after {ms} ms; waiting for the replacement and the drain"
        );
        let goal = self.options.replicas;
        let node_name = node.clone();
        let drained = self
            .until(out, |w| {
                w.running() == goal
                    && !w
                        .pods
                        .iter()
                        .any(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&node_name))
            })
            .await?;
        // Two minutes after the warning EC2 takes the instance; play that now.
        let _ = writeln!(out, "   EC2 reclaims {instance}");
        self.ec2
            .terminate_instances()
            .instance_ids(&instance)
            .send()
            .await
            .map_err(|e| aws_err("TerminateInstances")(format!("{e:?}")))?;
        let gone = self
            .until(out, |w| {
                w.running() == goal && !w.claims.iter().any(|c| c.instance_id.as_deref() == Some(&instance))
            })
            .await?;
        Ok((drained && gone, Some(ms)))
    }
}

/// The EC2 calls whose bursts of faults the demo plays: (action, throttled, 5xx).
const FAULT_BURSTS: [(&str, usize, usize); 3] = [
    ("CreateFleet", 2, 1),
    ("DescribeInstances", 2, 1),
    ("TerminateInstances", 1, 1),
];

/// The `n` cheapest spot offerings (type, zone) per vCPU of the default
/// pool's instance categories in the built-in catalog, among types of two
/// vCPUs or more: what the solver picks first for the story's pods.
fn cheapest_spot_offerings(n: usize) -> Vec<(String, String)> {
    let Ok(catalog) = nodesmith::catalog::builtin() else {
        return Vec::new();
    };
    let mut offers: Vec<(f64, String, String)> = catalog
        .instance_types
        .iter()
        .filter(|t| {
            t.labels
                .get("karpenter.k8s.aws/instance-category")
                .is_some_and(|c| ["c", "m", "r"].contains(&c.as_str()))
        })
        .filter_map(|t| {
            let cpu: f64 = t.labels.get("karpenter.k8s.aws/instance-cpu")?.parse().ok()?;
            (cpu >= 2.0).then_some((t, cpu))
        })
        .flat_map(|(t, cpu)| {
            t.offerings
                .iter()
                .filter(|o| o.capacity_type == "spot")
                .map(move |o| (o.price / cpu, t.name.clone(), o.zone.clone()))
        })
        .collect();
    offers.sort_by(|a, b| a.0.total_cmp(&b.0));
    offers.into_iter().take(n).map(|(_, t, z)| (t, z)).collect()
}

/// Arms the fault proxy (see [`DemoOptions::faults`]); the offerings refused.
fn inject_faults(cloud: &LocalCloud, first: bool) -> usize {
    let f = cloud.faults();
    let mut refused = 0;
    if first {
        for (t, z) in cheapest_spot_offerings(10) {
            f.no_capacity(&t, &z, Some("spot"));
            refused += 1;
        }
    }
    for (action, throttled, failed) in FAULT_BURSTS {
        f.throttle(action, throttled);
        f.fail_next(action, failed, 500, "InternalError", "An internal error has occurred.");
    }
    refused
}

/// Nodes terminated by a disruption for `reason` (its `DisruptionTerminating` events).
fn terminated_for(events: &[k8s_openapi::api::core::v1::Event], reason: &str) -> usize {
    events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("DisruptionTerminating"))
        .filter(|e| e.message.as_deref() == Some(&format!("Disrupting Node: {reason}")))
        .filter_map(|e| e.involved_object.name.as_deref())
        .collect::<BTreeSet<_>>()
        .len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_take_the_nearest_rank() {
        assert_eq!(percentile(&[], 50), None);
        assert_eq!(percentile(&[7], 95), Some(7));
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50), Some(50));
        assert_eq!(percentile(&v, 95), Some(95));
        assert_eq!(percentile(&[30, 10, 20], 50), Some(20));
    }

    #[test]
    fn the_summary_carries_every_contract_key() {
        let v = serde_json::to_value(Summary::default()).unwrap();
        for key in [
            "podsScheduled",
            "podsPending",
            "nodesLaunched",
            "nodesTerminated",
            "interruptionsHandled",
            "nodesConsolidated",
            "nodesDrifted",
            "nodesExpired",
            "leakedInstances",
            "doubleLaunches",
            "fleetCostPerHourPeak",
            "fleetCostPerHourEnd",
            "autoscalerCostUsd",
            "pendingToLaunchMillisP50",
            "interruptionToTaintMillis",
        ] {
            assert!(v.get(key).is_some(), "{key} missing from {v}");
        }
    }
}
