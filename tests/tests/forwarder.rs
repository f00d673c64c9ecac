//! The in-cluster forwarder against the Kubernetes API test server and moto's SQS,
//! as its ServiceAccount: held to the RBAC of `infra/k8s/forwarder.yaml`.
//!
//! No sleeps decide anything: a sentinel pod made unschedulable last is
//! forwarded after every earlier watch event was handled (the watch is
//! ordered), so once its message arrives the queue holds everything the
//! forwarder will ever send about the earlier pods.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use nodesmith::messages::{PendingMessage, PendingPodRef};
use nodesmith_forwarder::{BatchWindow, Config, Health, SqsSink, Stats, run};
use nodesmith_tests::kube_server::{Identity, KubeServer, NodeRegistration};
use nodesmith_tests::moto::moto;
use serde_json::json;

fn pod(name: &str, cpu: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}]}})
}

fn config(queue_url: &str) -> Config {
    Config {
        queue_url: queue_url.into(),
        health_addr: "127.0.0.1:0".into(),
        batch_idle: Duration::from_millis(20),
        batch_max: Duration::from_secs(1),
        dedupe_capacity: 1000,
        resend_after: Duration::from_secs(3600),
    }
}

struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Stats>,
    health: Health,
}

fn start(server: &KubeServer, sqs: &aws_sdk_sqs::Client, queue_url: &str) -> Running {
    start_with(server, sqs, queue_url, config(queue_url))
}

fn start_with(server: &KubeServer, sqs: &aws_sdk_sqs::Client, queue_url: &str, cfg: Config) -> Running {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let health = Health::default();
    let client = server.client_as(Identity::Forwarder);
    let (sink, h) = (SqsSink::new(sqs.clone(), queue_url), health.clone());
    let task = tokio::spawn(async move {
        run(client, sink, &cfg, h, async {
            let _ = stopped.await;
        })
        .await
    });
    Running { stop, task, health }
}

/// Receives (and deletes) messages until one names `sentinel`; returns all bodies seen.
async fn receive_until(sqs: &aws_sdk_sqs::Client, queue_url: &str, sentinel: &str) -> Vec<PendingPodRef> {
    let mut got = Vec::new();
    for _ in 0..60 {
        let out = sqs
            .receive_message()
            .queue_url(queue_url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .send()
            .await
            .unwrap();
        for m in out.messages() {
            got.push(PendingPodRef::parse(m.body().unwrap()).unwrap());
            sqs.delete_message()
                .queue_url(queue_url)
                .receipt_handle(m.receipt_handle().unwrap())
                .send()
                .await
                .unwrap();
        }
        if got.iter().any(|r| r.name == sentinel) {
            return got;
        }
    }
    panic!("no message for {sentinel} within a minute; got {got:?}");
}

/// Receives (and deletes) messages until `done` holds for all received so far;
/// panics after `within`.
async fn receive_while(
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    within: Duration,
    done: impl Fn(&[PendingPodRef]) -> bool,
) -> Vec<PendingPodRef> {
    let deadline = tokio::time::Instant::now() + within;
    let mut got = Vec::new();
    while !done(&got) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not done within {within:?}; got {got:?}"
        );
        let out = sqs
            .receive_message()
            .queue_url(queue_url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .send()
            .await
            .unwrap();
        for m in out.messages() {
            got.push(PendingPodRef::parse(m.body().unwrap()).unwrap());
            sqs.delete_message()
                .queue_url(queue_url)
                .receipt_handle(m.receipt_handle().unwrap())
                .send()
                .await
                .unwrap();
        }
    }
    got
}

/// Everything left in the queue.
async fn drain_queue(sqs: &aws_sdk_sqs::Client, queue_url: &str) -> Vec<PendingPodRef> {
    let mut got = Vec::new();
    loop {
        let out = sqs
            .receive_message()
            .queue_url(queue_url)
            .max_number_of_messages(10)
            .send()
            .await
            .unwrap();
        if out.messages().is_empty() {
            return got;
        }
        for m in out.messages() {
            got.push(PendingPodRef::parse(m.body().unwrap()).unwrap());
            sqs.delete_message()
                .queue_url(queue_url)
                .receipt_handle(m.receipt_handle().unwrap())
                .send()
                .await
                .unwrap();
        }
    }
}

fn count(refs: &[PendingPodRef], name: &str) -> usize {
    refs.iter().filter(|r| r.name == name).count()
}

#[tokio::test]
async fn an_unschedulable_pod_is_sent_once_even_across_reconnects_and_relists() {
    let m = moto().await;
    let sqs = aws_sdk_sqs::Client::new(&m.sdk_config().await);
    let queue_url = sqs
        .create_queue()
        .queue_name("pending-pods")
        .send()
        .await
        .unwrap()
        .queue_url()
        .unwrap()
        .to_string();
    let server = KubeServer::start().await;
    // One small node: "fits" is bound, "big" cannot fit anywhere.
    server
        .register_node(&NodeRegistration {
            name: "n1".into(),
            instance_id: "i-1".into(),
            instance_type: "t3.small".into(),
            zone: "us-east-1a".into(),
            capacity: BTreeMap::from([("cpu".into(), "2".into()), ("pods".into(), "10".into())]),
            ..Default::default()
        })
        .unwrap();
    let fw = start(&server, &sqs, &queue_url);

    server.apply(&pod("fits", "500m")).unwrap();
    server.apply(&pod("big", "8")).unwrap();
    server.apply(&pod("bigger", "12")).unwrap();
    server.schedule();
    server.apply(&pod("first-sentinel", "16")).unwrap();
    server.schedule();
    let first = receive_until(&sqs, &queue_url, "first-sentinel").await;
    assert_eq!(count(&first, "big"), 1, "{first:?}");
    assert_eq!(count(&first, "fits"), 0, "{first:?}");
    let big = server.pod("default", "big").unwrap();
    let sent_big = first.iter().find(|r| r.name == "big").unwrap();
    assert_eq!(Some(&sent_big.uid), big.metadata.uid.as_ref());
    assert_eq!(Some(&sent_big.resource_version), big.metadata.resource_version.as_ref());

    // Nothing new for the scheduler to say: no writes, no messages.
    server.schedule();
    // The watch drops: the watcher resumes from its last resourceVersion.
    server.break_watches();
    // The history is compacted and the watch drops again: the watcher gets
    // 410 Gone, re-lists every pending pod, and the dedupe memory holds them back.
    server.expire_watch_history();
    server.apply(&pod("last-sentinel", "32")).unwrap();
    server.schedule();
    let second = receive_until(&sqs, &queue_url, "last-sentinel").await;

    let _ = fw.stop.send(());
    let stats = fw.task.await.unwrap();
    let rest = drain_queue(&sqs, &queue_url).await;
    let all: Vec<PendingPodRef> = first.iter().chain(&second).chain(&rest).cloned().collect();
    for name in ["big", "bigger", "first-sentinel", "last-sentinel"] {
        assert_eq!(count(&all, name), 1, "{name} in {all:?}");
    }
    assert_eq!(count(&all, "fits"), 0);
    assert_eq!(stats.sent, 4, "{stats:?}");
    let watches: Vec<String> = server
        .requests()
        .into_iter()
        .filter(|r| r.uri.contains("/pods"))
        .map(|r| r.uri)
        .collect();
    assert!(
        stats.duplicates >= 3,
        "the re-list saw the three earlier pending pods again: {stats:?} {watches:#?}"
    );
    assert!(fw.health.is_ready());
    // Lists (the first and after 410) and watches (the first, the resumed
    // one, the one after the re-list), all within its ClusterRole.
    assert_within_its_role(&server);
}

/// The forwarder ran as its ServiceAccount and was refused nothing; it
/// listed and watched pods and Nodes, and used nothing else.
fn assert_within_its_role(server: &KubeServer) {
    assert!(server.denials().is_empty(), "refused: {:#?}", server.denials());
    let on = |resource: &str, verb: &str| (String::new(), resource.to_string(), verb.to_string());
    assert_eq!(
        server.permissions_used(Identity::Forwarder),
        [
            on("nodes", "list"),
            on("nodes", "watch"),
            on("pods", "list"),
            on("pods", "watch")
        ]
        .into(),
    );
}

#[tokio::test]
async fn a_pod_that_changes_while_pending_is_sent_again_and_bound_pods_never() {
    let m = moto().await;
    let sqs = aws_sdk_sqs::Client::new(&m.sdk_config().await);
    let queue_url = sqs
        .create_queue()
        .queue_name("pending-pods")
        .send()
        .await
        .unwrap()
        .queue_url()
        .unwrap()
        .to_string();
    let server = KubeServer::start().await;
    let fw = start(&server, &sqs, &queue_url);
    server.apply(&pod("web", "1")).unwrap();
    server.schedule();
    let first = receive_until(&sqs, &queue_url, "web").await;
    assert_eq!(first.len(), 1);
    // A node arrives but is too small: the scheduler's message changes, a new
    // resourceVersion is news, and the pod is sent again.
    server
        .register_node(&NodeRegistration {
            name: "tiny".into(),
            instance_id: "i-2".into(),
            instance_type: "t3.nano".into(),
            zone: "us-east-1a".into(),
            capacity: BTreeMap::from([("cpu".into(), "500m".into()), ("pods".into(), "4".into())]),
            ..Default::default()
        })
        .unwrap();
    server.schedule();
    let second = receive_until(&sqs, &queue_url, "web").await;
    assert_eq!(second.len(), 1);
    assert_ne!(second[0].resource_version, first[0].resource_version);
    // A big node: the pod is bound and leaves the watch; a later sentinel shows nothing else came.
    server
        .register_node(&NodeRegistration {
            name: "big".into(),
            instance_id: "i-3".into(),
            instance_type: "m5.2xlarge".into(),
            zone: "us-east-1a".into(),
            capacity: BTreeMap::from([("cpu".into(), "8".into()), ("pods".into(), "58".into())]),
            ..Default::default()
        })
        .unwrap();
    server.schedule();
    server.apply(&pod("sentinel", "64")).unwrap();
    server.schedule();
    let third = receive_until(&sqs, &queue_url, "sentinel").await;
    assert_eq!(count(&third, "web"), 0, "{third:?}");
    let _ = fw.stop.send(());
    let stats = fw.task.await.unwrap();
    assert_eq!(stats.sent, 3);
    assert_within_its_role(&server);
}

#[tokio::test]
async fn a_pod_left_pending_is_sent_again_every_period_until_bound_or_deleted() {
    let m = moto().await;
    let sqs = aws_sdk_sqs::Client::new(&m.sdk_config().await);
    let queue_url = sqs
        .create_queue()
        .queue_name("pending-pods")
        .send()
        .await
        .unwrap()
        .queue_url()
        .unwrap()
        .to_string();
    let server = KubeServer::start().await;
    let mut cfg = config(&queue_url);
    cfg.resend_after = Duration::from_millis(400);
    let fw = start_with(&server, &sqs, &queue_url, cfg);
    server.apply(&pod("stuck", "4")).unwrap();
    server.apply(&pod("doomed", "12")).unwrap();
    server.schedule();
    // No node comes and nothing writes the pods again, so the watch has nothing
    // more to say about them: only the forwarder's own re-sends can repeat them.
    let pending = receive_while(&sqs, &queue_url, Duration::from_secs(30), |got| {
        count(got, "stuck") >= 3 && count(got, "doomed") >= 3
    })
    .await;
    for name in ["stuck", "doomed"] {
        let now = server.pod("default", name).unwrap().metadata.resource_version;
        assert!(
            pending
                .iter()
                .filter(|r| r.name == name)
                .all(|r| Some(&r.resource_version) == now.as_ref()),
            "{name} never changed, yet was sent at another version: {pending:?}"
        );
    }

    // "stuck" is bound (the node fits it, not "doomed"), then "doomed" is deleted.
    server
        .register_node(&NodeRegistration {
            name: "n1".into(),
            instance_id: "i-1".into(),
            instance_type: "m5.2xlarge".into(),
            zone: "us-east-1a".into(),
            capacity: BTreeMap::from([("cpu".into(), "8".into()), ("pods".into(), "58".into())]),
            ..Default::default()
        })
        .unwrap();
    server.schedule();
    assert!(
        server
            .pod("default", "stuck")
            .unwrap()
            .spec
            .unwrap()
            .node_name
            .is_some()
    );
    server.delete("v1", "Pod", "default", "doomed").unwrap();
    // The sentinel's first send follows both watch events; by its third (two
    // periods later) the others would have been re-sent had they been kept.
    server.apply(&pod("sentinel", "64")).unwrap();
    server.schedule();
    let after = receive_while(&sqs, &queue_url, Duration::from_secs(30), |got| {
        count(got, "sentinel") >= 3
    })
    .await;
    let first = after.iter().position(|r| r.name == "sentinel").unwrap();
    for name in ["stuck", "doomed"] {
        assert_eq!(
            count(&after[first..], name),
            0,
            "{name} re-sent after it left: {after:?}"
        );
    }

    let _ = fw.stop.send(());
    let stats = fw.task.await.unwrap();
    let rest = drain_queue(&sqs, &queue_url).await;
    assert_eq!(count(&rest, "stuck") + count(&rest, "doomed"), 0, "{rest:?}");
    assert!(stats.resent >= 6, "{stats:?}");
    assert_within_its_role(&server);
}

#[tokio::test]
async fn health_endpoints_follow_the_watch() {
    let health = Health::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let h = health.clone();
    let server = tokio::spawn(async move {
        h.serve(listener, async {
            let _ = stopped.await;
        })
        .await
    });
    let get = |path: &'static str| async move {
        reqwest::get(format!("http://{addr}{path}"))
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!((get("/healthz").await, get("/readyz").await), (200, 503));
    health.synced();
    assert_eq!((get("/healthz").await, get("/readyz").await), (200, 200));
    health.failed();
    assert_eq!(get("/healthz").await, 503);
    health.observed();
    assert_eq!(get("/healthz").await, 200);
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

#[test]
fn a_batch_closes_after_the_idle_duration_or_at_its_maximum() {
    let ms = Duration::from_millis;
    let t0 = Instant::now();
    // Karpenter's defaults: BATCH_IDLE_DURATION 1s, BATCH_MAX_DURATION 10s.
    let mut w = BatchWindow::new(ms(1000), ms(10_000));
    assert!(!w.is_open() && !w.is_due(t0 + ms(60_000)) && w.deadline().is_none());
    // A lone pod waits one idle duration, not the whole window.
    w.add(t0);
    assert!(!w.is_due(t0 + ms(999)));
    assert!(w.is_due(t0 + ms(1000)));
    assert_eq!(w.deadline(), Some(t0 + ms(1000)));
    w.close();
    assert!(!w.is_open() && !w.is_due(t0 + ms(5000)));
    // Each pod within the idle duration keeps the batch open ...
    let start = t0 + ms(5000);
    w.add(start);
    let mut t = start;
    for _ in 0..19 {
        t += ms(500);
        assert!(!w.is_due(t), "closed early at {:?}", t - start);
        w.add(t);
    }
    // ... but never past the maximum, however pods keep coming.
    assert_eq!(t - start, ms(9500));
    assert!(!w.is_due(start + ms(9999)));
    assert!(
        w.is_due(start + ms(10_000)),
        "the maximum closes it though the last pod came 500 ms ago"
    );
    assert_eq!(w.deadline(), Some(start + ms(10_000)));
    // A pod after a quiet spell opens a new batch with its own maximum.
    w.close();
    w.add(start + ms(20_000));
    assert_eq!(w.deadline(), Some(start + ms(21_000)));
}

/// A Node as its kubelet creates it: not Ready, with the given labels and taints.
fn joining_node(name: &str, instance: &str, labels: &[(&str, &str)], taints: &[&str]) -> serde_json::Value {
    NodeRegistration {
        name: name.into(),
        instance_id: instance.into(),
        instance_type: "m5.large".into(),
        zone: "us-east-1a".into(),
        labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        taints: taints.iter().map(|t| t.to_string()).collect(),
        capacity: BTreeMap::from([("cpu".into(), "2".into()), ("pods".into(), "29".into())]),
        ..Default::default()
    }
    .to_registering_node()
}

/// Receives (and deletes) messages until `done` holds for the Node names
/// reported so far; returns them (pod references are skipped).
async fn receive_nodes(sqs: &aws_sdk_sqs::Client, queue_url: &str, done: impl Fn(&[String]) -> bool) -> Vec<String> {
    let mut got = Vec::new();
    for _ in 0..60 {
        if done(&got) {
            return got;
        }
        let out = sqs
            .receive_message()
            .queue_url(queue_url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .send()
            .await
            .unwrap();
        for m in out.messages() {
            if let PendingMessage::Node(n) = PendingMessage::parse(m.body().unwrap()).unwrap() {
                got.push(n.name);
            }
            sqs.delete_message()
                .queue_url(queue_url)
                .receipt_handle(m.receipt_handle().unwrap())
                .send()
                .await
                .unwrap();
        }
    }
    panic!("not done within a minute; got {got:?}");
}

#[tokio::test]
async fn a_joining_node_of_nodesmith_is_reported_when_it_appears_and_when_it_turns_ready() {
    let m = moto().await;
    let sqs = aws_sdk_sqs::Client::new(&m.sdk_config().await);
    let queue_url = sqs
        .create_queue()
        .queue_name("pending-pods")
        .send()
        .await
        .unwrap()
        .queue_url()
        .unwrap()
        .to_string();
    let server = KubeServer::start().await;
    let fw = start(&server, &sqs, &queue_url);
    let pool = ("karpenter.sh/nodepool", "default");
    let unregistered = "karpenter.sh/unregistered:NoExecute";
    // Not nodesmith's, and nodesmith's but settled: never reported.
    server.apply(&joining_node("other", "i-0", &[], &[])).unwrap();
    server
        .apply(&joining_node(
            "settled",
            "i-1",
            &[
                pool,
                ("karpenter.sh/registered", "true"),
                ("karpenter.sh/initialized", "true"),
            ],
            &[],
        ))
        .unwrap();
    // Joining: reported as it appears (the watch is ordered, so the earlier ones came first).
    server
        .apply(&joining_node("joining", "i-2", &[pool], &[unregistered]))
        .unwrap();
    let first = receive_nodes(&sqs, &queue_url, |got| got.iter().any(|n| n == "joining")).await;
    assert_eq!(first, ["joining"]);

    // It turns Ready: reported again.
    let mut ready = serde_json::to_value(server.node("joining").unwrap()).unwrap();
    nodesmith_tests::kube_server::kubelet::make_ready(&mut ready, &BTreeMap::new());
    server.apply(&ready).unwrap();
    let second = receive_nodes(&sqs, &queue_url, |got| !got.is_empty()).await;
    assert_eq!(second, ["joining"]);

    // A change that matters to nobody (a label) is not news; a later joining Node shows nothing else came.
    let mut labelled = serde_json::to_value(server.node("joining").unwrap()).unwrap();
    labelled["metadata"]["labels"]["team"] = serde_json::json!("web");
    server.apply(&labelled).unwrap();
    server
        .apply(&joining_node("sentinel", "i-3", &[pool], &[unregistered]))
        .unwrap();
    let third = receive_nodes(&sqs, &queue_url, |got| got.iter().any(|n| n == "sentinel")).await;
    assert_eq!(third, ["sentinel"]);

    let _ = fw.stop.send(());
    let stats = fw.task.await.unwrap();
    assert_eq!(stats.nodes_sent, 3, "{stats:?}");
    assert_eq!(stats.sent, 0, "{stats:?}");
    assert_within_its_role(&server);
}
