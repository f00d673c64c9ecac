//! The local cloud as its users meet it: `nodesmith-local stack` (what
//! `scripts/dev-stack` runs) driven with the real `kubectl` and the AWS SDK
//! through the exported environment, stopped with SIGTERM without leaving a
//! process behind; and the demo's story with assertions on its outcome.
//!
//! The function and forwarder binaries must sit next to `nodesmith-local`:
//! `scripts/test` builds them (`cargo build --workspace --bins`) first.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aws_sdk_ec2::types::Filter;
use nodesmith_tests::kube_server::Identity;
use nodesmith_tests::kubectl::Kubectl;
use nodesmith_tests::local_cloud::burst::{self, BurstOptions};
use nodesmith_tests::local_cloud::demo::{self, DemoOptions};
use nodesmith_tests::local_cloud::{FUNCTIONS, LocalCloud, QueueName, Settings};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nodesmith-local-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `export K=V` lines → map (values as the shell would read them).
fn parse_exports(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("export "))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.trim_matches('\'').to_string()))
        .collect()
}

/// Waits until `n` pods labelled app=web run (on a node).
async fn wait_running(k: &Kubectl, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let pods = k.json(&["get", "pods", "-l", "app=web"]).await;
        let items = pods["items"].as_array().cloned().unwrap_or_default();
        let running = items
            .iter()
            .filter(|p| p["status"]["phase"] == "Running" && p["spec"]["nodeName"].is_string())
            .count();
        if items.len() == n && running == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{running}/{n} pods running after 120 s: {pods}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Every process whose parent is `pid`, recursively.
fn descendants(pid: u32) -> Vec<u32> {
    let mut parents: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // The fields after the command name (which may hold spaces) start with state, ppid.
        let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
        if let Some(ppid) = after.split_whitespace().nth(1).and_then(|p| p.parse().ok()) {
            parents.entry(ppid).or_default().push(child);
        }
    }
    let mut out = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        for c in parents.get(&p).cloned().unwrap_or_default() {
            out.push(c);
            todo.push(c);
        }
    }
    out
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| r.trim_start().starts_with('Z'))
                .map(|zombie| !zombie)
        })
        .unwrap_or(false)
}

fn wait_for_file(path: &Path, child: &mut Child) -> String {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            return text;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the stack exited before it was ready: {status}");
        }
        assert!(Instant::now() < deadline, "the stack was not ready after 90 s");
        std::thread::sleep(Duration::from_millis(200));
    }
}

const DEPLOYMENT: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
        - name: web
          image: public.ecr.aws/eks-distro/kubernetes/pause:3.7
          resources: {requests: {cpu: '1', memory: 1Gi}}
";

#[tokio::test(flavor = "multi_thread")]
async fn the_stack_serves_kubectl_and_the_aws_sdk_and_stops_on_sigterm_leaving_no_process() {
    let _alone = nodesmith_tests::local_cloud::alone().await;
    let dir = scratch("stack");
    let env_file = dir.join("env");
    let mut stack = Command::new(env!("CARGO_BIN_EXE_nodesmith-local"))
        .args(["stack", "--env-file"])
        .arg(&env_file)
        .env("NODESMITH_DEV_KUBELET_JOIN_SECONDS", "1")
        .env("NODESMITH_DEV_KUBELET_READY_SECONDS", "1")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let env = parse_exports(&wait_for_file(&env_file, &mut stack));
    for key in [
        "KUBECONFIG",
        "AWS_ENDPOINT_URL",
        "AWS_REGION",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "NODESMITH_CLUSTER_NAME",
        "NODESMITH_TABLE",
        "NODESMITH_PENDING_QUEUE_URL",
        "NODESMITH_LAUNCH_QUEUE_URL",
        "NODESMITH_INTERRUPTION_QUEUE_URL",
    ] {
        assert!(
            env.get(key).is_some_and(|v| !v.is_empty()),
            "{key} missing from {env:?}"
        );
    }
    let state_dir = PathBuf::from(&env["KUBECONFIG"]).parent().unwrap().to_path_buf();
    let k = Kubectl {
        kubeconfig: PathBuf::from(&env["KUBECONFIG"]),
        dir: dir.clone(),
    };

    // Exactly the contract's objects at start, and no workload.
    let pools = k.json(&["get", "nodepools"]).await;
    assert_eq!(pools["items"].as_array().unwrap().len(), 1, "{pools}");
    assert_eq!(pools["items"][0]["metadata"]["name"], "default");
    assert_eq!(pools["items"][0]["spec"]["disruption"]["consolidateAfter"], "10s");
    let classes = k.json(&["get", "ec2nodeclasses"]).await;
    assert_eq!(
        classes["items"][0]["spec"]["amiSelectorTerms"][0]["alias"],
        "al2023@latest"
    );
    assert!(
        k.json(&["get", "pods", "-A"]).await["items"]
            .as_array()
            .unwrap()
            .is_empty()
    );

    k.apply(DEPLOYMENT).await;
    wait_running(&k, 3).await;
    k.ok(&["scale", "deployment/web", "--replicas=6"]).await;
    wait_running(&k, 6).await;

    // Nodes carry the labels of the instances EC2 launched; instances carry the contract's tags.
    let conf = nodesmith_tests::moto::sdk_config(&env["AWS_ENDPOINT_URL"]).await;
    let ec2 = aws_sdk_ec2::Client::new(&conf);
    let cluster = &env["NODESMITH_CLUSTER_NAME"];
    let described = ec2
        .describe_instances()
        .filters(
            Filter::builder()
                .name(format!("tag:kubernetes.io/cluster/{cluster}"))
                .values("owned")
                .build(),
        )
        .send()
        .await
        .unwrap();
    let instances: BTreeMap<String, aws_sdk_ec2::types::Instance> = described
        .reservations()
        .iter()
        .flat_map(|r| r.instances())
        .map(|i| (i.instance_id().unwrap().to_string(), i.clone()))
        .collect();
    assert!(!instances.is_empty());
    let nodes = k.json(&["get", "nodes"]).await;
    let nodes = nodes["items"].as_array().unwrap();
    assert!(!nodes.is_empty());
    for n in nodes {
        let provider_id = n["spec"]["providerID"].as_str().unwrap();
        let id = provider_id.rsplit('/').next().unwrap();
        let i = &instances[id];
        let labels = &n["metadata"]["labels"];
        assert_eq!(n["metadata"]["name"], i.private_dns_name().unwrap(), "{n}");
        assert_eq!(
            labels["node.kubernetes.io/instance-type"],
            i.instance_type().unwrap().as_str()
        );
        assert_eq!(
            labels["topology.kubernetes.io/zone"],
            i.placement().unwrap().availability_zone().unwrap()
        );
        let tags: BTreeMap<&str, &str> = i
            .tags()
            .iter()
            .map(|t| (t.key().unwrap(), t.value().unwrap()))
            .collect();
        assert_eq!(tags.get("karpenter.sh/nodepool"), Some(&"default"), "{tags:?}");
        assert_eq!(
            tags.get("karpenter.sh/nodeclaim").copied(),
            labels["karpenter.sh/nodeclaim"].as_str(),
            "{tags:?}"
        );
    }

    // Draining a node through the Eviction API: its pods come back and run elsewhere.
    let mut busiest = (0, String::new());
    for n in nodes {
        let name = n["metadata"]["name"].as_str().unwrap().to_string();
        let selector = format!("spec.nodeName={name}");
        let on = k
            .json(&["get", "pods", "-l", "app=web", "--field-selector", &selector])
            .await;
        let count = on["items"].as_array().unwrap().len();
        if count >= busiest.0 {
            busiest = (count, name);
        }
    }
    let busiest = busiest.1;
    k.ok(&[
        "drain",
        &busiest,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--timeout=60s",
    ])
    .await;
    wait_running(&k, 6).await;
    let on_drained = k
        .json(&[
            "get",
            "pods",
            "-l",
            "app=web",
            "--field-selector",
            &format!("spec.nodeName={busiest}"),
        ])
        .await;
    assert!(on_drained["items"].as_array().unwrap().is_empty(), "{on_drained}");

    // SIGTERM: everything it started is gone within 20 s.
    let children = descendants(stack.id());
    assert!(
        children.len() >= 6,
        "moto, four functions and the forwarder: {children:?}"
    );
    let killed = Command::new("kill")
        .args(["-TERM", &stack.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = stack.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the stack did not stop within 20 s");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "{status}");
    while children.iter().any(|p| alive(*p)) {
        assert!(
            Instant::now() < deadline,
            "still running 20 s after SIGTERM: {:?}",
            children.iter().filter(|p| alive(**p)).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!state_dir.exists(), "{} was left behind", state_dir.display());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Plays the demo's story on a local cloud of its own and asserts its outcome.
async fn play_story(options: DemoOptions) {
    let mut settings = Settings::from_lookup(|_| None, nodesmith_tests::bin_dir()).unwrap();
    // Chapters count sweeps, each run once the functions are done with their
    // queues: a slow machine makes the story longer, never a failure.
    settings.manual_sweep = true;
    settings.kubelet_join = Duration::from_secs(1);
    settings.kubelet_ready = Duration::from_secs(1);
    let cloud = LocalCloud::start(settings).await.unwrap();
    let mut out = Vec::new();
    let summary = demo::run(&cloud, &options, &mut out).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    // Shown with --nocapture: the sweeps each chapter took.
    eprintln!("{text}");
    // Nodes are labelled from the instances EC2 launched.
    let ec2 = aws_sdk_ec2::Client::new(&cloud.sdk);
    let described = ec2.describe_instances().send().await.unwrap();
    let types: BTreeMap<String, String> = described
        .reservations()
        .iter()
        .flat_map(|r| r.instances())
        .map(|i| {
            (
                i.instance_id().unwrap().to_string(),
                i.instance_type().unwrap().as_str().to_string(),
            )
        })
        .collect();
    let nodes = cloud.kube.nodes();
    let denials = cloud.kube.denials();
    let forwarder_used = cloud.kube.permissions_used(Identity::Forwarder);
    let events = cloud.kube.events();
    let refused: usize = cloud.faults().fleets().iter().map(|f| f.failed).sum();
    let throttled = cloud.faults().throttled("CreateFleet");
    let failed = cloud.faults().failed("CreateFleet");
    cloud.stop().await;
    let summary = summary.unwrap();
    assert!(summary.ok, "{summary:?}\n{text}");
    if options.faults {
        // The faults were met, not dodged.
        assert!(refused > 0, "no CreateFleet override was refused for capacity");
        assert!(throttled > 0 && failed > 0, "throttled {throttled}, failed {failed}");
        assert!(
            summary.ec2_faults_injected >= refused + throttled + failed,
            "{summary:?}"
        );
    }
    // The story is told in Kubernetes Events too, on the objects Karpenter's are on.
    let on = |reason: &str| -> BTreeSet<String> {
        events
            .iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .filter_map(|e| e.involved_object.kind.clone())
            .collect()
    };
    // A node's disruption events are on its NodeClaim too, as Karpenter records them.
    for (reason, kinds) in [
        ("Nominated", &["Pod"][..]),
        ("Launched", &["NodeClaim"]),
        ("Registered", &["Node"]),
        ("Initialized", &["Node"]),
        ("Disrupting", &["Node", "NodeClaim"]),
        ("DisruptionTerminating", &["Node", "NodeClaim"]),
    ] {
        let want: BTreeSet<String> = kinds.iter().map(|k| k.to_string()).collect();
        assert_eq!(on(reason), want, "{reason} events");
    }
    // The function binaries and the forwarder ran the whole story within their ClusterRoles.
    assert!(denials.is_empty(), "RBAC refused calls: {denials:#?}");
    // The forwarder ran as its ServiceAccount (the admin's calls are not
    // recorded), listing and watching pods and Nodes and nothing else.
    let call = |kind: &str, verb: &str| (String::new(), kind.to_string(), verb.to_string());
    assert_eq!(
        forwarder_used,
        [
            call("pods", "list"),
            call("pods", "watch"),
            call("nodes", "list"),
            call("nodes", "watch")
        ]
        .into()
    );
    assert_eq!(summary.pods_scheduled, options.replicas, "{text}");
    assert_eq!(summary.pods_pending, 0);
    assert_eq!(summary.leaked_instances, 0, "{summary:?}");
    assert_eq!(summary.double_launches, 0, "{summary:?}");
    assert_eq!(summary.interruptions_handled, 1, "{text}");
    assert!(summary.interruption_to_taint_millis.is_some());
    // The EC2NodeClass change replaces the nodes through the sweep (the expiry
    // chapter's nodes may be taken as drifted: expireAfter is hashed).
    assert!(
        summary.nodes_drifted >= 1 && summary.nodes_expired >= 1,
        "{summary:?}\n{text}"
    );
    assert!(
        summary.nodes_launched >= 2 && summary.nodes_terminated >= 1,
        "{summary:?}"
    );
    assert!(
        summary.fleet_cost_per_hour_peak > 0.0 && summary.autoscaler_cost_usd > 0.0,
        "{summary:?}"
    );
    assert!(summary.pending_to_launch_millis_p50.is_some(), "{text}");
    assert!(summary.pending_to_running_millis_p50.is_some(), "{text}");
    assert!(summary.ready_to_first_running_millis_p50.is_some(), "{text}");
    assert!(!nodes.is_empty());
    for n in &nodes {
        let id = n
            .spec
            .as_ref()
            .unwrap()
            .provider_id
            .as_deref()
            .unwrap()
            .rsplit('/')
            .next()
            .unwrap();
        let labels = n.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["node.kubernetes.io/instance-type"], types[id], "{labels:?}");
    }
}

/// The demo's story (pods pending and running, a spot interruption,
/// consolidation, drift, expiry). By default one run plays it with EC2's bad
/// days (no spot capacity in the cheapest offerings, throttling and 5xx
/// bursts) at 40 replicas; the full level plays the 100-replica story and the
/// faulted one separately.
#[tokio::test(flavor = "multi_thread")]
async fn the_story_runs_every_pod_with_no_leak_and_no_double_launch() {
    let faulted = DemoOptions {
        live: false,
        replicas: 40,
        faults: true,
        ..DemoOptions::default()
    };
    if nodesmith_tests::full_level() {
        play_story(DemoOptions {
            live: false,
            ..DemoOptions::default()
        })
        .await;
    }
    play_story(faulted).await;
}

#[test]
fn the_functions_run_as_the_template_declares_them() {
    let text = std::fs::read_to_string(nodesmith_tests::moto::repo_root().join("template.yaml")).unwrap();
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    let globals = &doc["Globals"]["Function"];
    let resources = doc["Resources"].as_mapping().unwrap();
    let mut seen = Vec::new();
    for (_, r) in resources {
        if r["Type"].as_str() != Some("AWS::Serverless::Function") {
            continue;
        }
        let binary = r["Properties"]["Handler"].as_str().unwrap();
        let def = FUNCTIONS
            .iter()
            .find(|f| f.handler == binary)
            .unwrap_or_else(|| panic!("{binary} is not run by the local cloud"));
        let props = &r["Properties"];
        let memory = props["MemorySize"].as_u64().or(globals["MemorySize"].as_u64()).unwrap();
        let timeout = props["Timeout"].as_u64().or(globals["Timeout"].as_u64()).unwrap();
        assert_eq!((def.memory_mb, def.timeout_secs), (memory, timeout), "{binary}");
        let concurrency = props["ReservedConcurrentExecutions"].as_u64().unwrap();
        assert_eq!(def.concurrency as u64, concurrency, "{binary}");
        let sqs: Vec<&serde_yaml_ng::Value> = props["Events"]
            .as_mapping()
            .map(|m| m.values().filter(|e| e["Type"].as_str() == Some("SQS")).collect())
            .unwrap_or_default();
        match def.queue {
            None => assert!(sqs.is_empty(), "{binary}"),
            Some((queue, batch, windowed)) => {
                assert_eq!(sqs.len(), 1, "{binary}");
                let p = &sqs[0]["Properties"];
                let arn = format!("{:?}", p["Queue"]);
                let name = match queue {
                    QueueName::Pending => "PendingPodsQueue",
                    QueueName::Launch => "LaunchQueue",
                    QueueName::Interruption => "InterruptionQueue",
                };
                assert!(arn.contains(name), "{binary}: {arn}");
                assert_eq!(p["BatchSize"].as_u64(), Some(batch as u64), "{binary}");
                assert_eq!(!p["MaximumBatchingWindowInSeconds"].is_null(), windowed, "{binary}");
                assert!(format!("{:?}", p["FunctionResponseTypes"]).contains("ReportBatchItemFailures"));
            }
        }
        seen.push(binary);
    }
    assert_eq!(seen.len(), FUNCTIONS.len(), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_burst_across_many_deployments_runs_every_pod_launching_each_claim_once() {
    let settings = Settings::from_lookup(|_| None, nodesmith_tests::bin_dir()).unwrap();
    let cloud = LocalCloud::start(settings).await.unwrap();
    // Large enough for several claims per solve (so one CreateFleet per
    // claim shows); the full level plays the 600-pod burst.
    let (pods, deployments) = if nodesmith_tests::full_level() {
        (600, 12)
    } else {
        (300, 6)
    };
    let options = BurstOptions {
        pods,
        deployments,
        timeout: Duration::from_secs(240),
    };
    let mut out = Vec::new();
    let report = burst::run(&cloud, &options, &mut out).await;
    cloud.stop().await;
    let report = report.unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    assert_eq!(report.pods_running, pods, "{report:?}\n{text}");
    assert!(report.seconds_to_all_running.is_some(), "{report:?}");
    assert!(
        report.seconds_to_first_launch <= report.seconds_to_last_launch
            && report.seconds_to_last_launch <= report.seconds_to_all_running,
        "{report:?}"
    );
    assert!(report.invocations_timed_out.is_empty(), "{report:?}");
    assert!(
        report
            .peak_rss_mb_by_function
            .get("provision")
            .is_some_and(|mb| *mb > 0),
        "{report:?}"
    );
    assert_eq!(report.double_launches, 0, "{report:?}");
    assert_eq!(report.leaked_instances, 0, "{report:?}");
    // One CreateFleet a claim, give or take capacity retries: never one per pod.
    assert!(
        report.nodes_launched >= 2,
        "one node shows nothing per claim: {report:?}"
    );
    assert!(
        report.create_fleet_calls >= 1 && report.create_fleet_calls <= 2 * report.nodes_launched,
        "{report:?}"
    );
}
