//! The in-cluster forwarder: watches pods that the scheduler marked
//! unschedulable and sends slim references ([`PendingPodRef`]) to the
//! pending-pods SQS queue, batched as Karpenter batches them ([`batch`]: a
//! batch closes `BATCH_IDLE_DURATION` after its last pod, or
//! `BATCH_MAX_DURATION` after its first). It also watches nodesmith's Nodes
//! (labelled `karpenter.sh/nodepool`) and reports at once each one that
//! appears or changes readiness while it waits to be registered or
//! initialized ([`nodes`]), so `provision` makes it usable within seconds.
//! Nothing else.
//!
//! It remembers the pods it knows to be pending (up to `DEDUPE_CAPACITY`;
//! beyond that the one sent longest ago is forgotten, with a warning) and when
//! each was last sent ([`PendingPods`]). A pod seen again at the same
//! resourceVersion less than `RESEND_AFTER_SECS` (300) after its last send is
//! a duplicate and dropped. Because the scheduler does not rewrite an
//! unchanged `PodScheduled=False` condition, a pod that stays pending brings
//! no new watch event; so at every flush tick (`FLUSH_INTERVAL_MS`) the
//! forwarder also re-sends each remembered pod whose last send is at least
//! `RESEND_AFTER_SECS` old, and `provision` solves for it again (its capacity
//! may have been taken away since). A pod leaves the memory when it is
//! deleted, bound (it leaves the `spec.nodeName=` watch), or no longer
//! provisionable, and then is not re-sent.
//!
//! The watch is kube-rs' watcher: after a dropped connection it resumes from
//! the last resourceVersion, and after a 410 it re-lists — the re-listed pods
//! hit the memory, so a reconnect does not send them again, and the pods the
//! re-list no longer shows are forgotten.

pub mod batch;
pub mod health;
pub mod nodes;
pub mod pending;
pub mod sqs;

use std::collections::HashSet;
use std::future::Future;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use nodesmith::kubernetes::pods;
use nodesmith::messages::{NodeRef, PendingPodRef};

pub use batch::BatchWindow;
pub use health::Health;
pub use nodes::JoiningNodes;
pub use pending::PendingPods;
pub use sqs::SqsSink;

/// How long a batch of pending pods is held once no more come, unless
/// `BATCH_IDLE_DURATION` says otherwise (Karpenter's default).
pub const DEFAULT_BATCH_IDLE: Duration = Duration::from_secs(1);

/// Settings, from the environment in `main`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The pending-pods queue URL.
    pub queue_url: String,
    /// Where `/healthz` and `/readyz` are served.
    pub health_addr: String,
    /// A batch is sent once no pod joined it for this long (Karpenter's
    /// `BATCH_IDLE_DURATION`).
    pub batch_idle: Duration,
    /// A batch is sent once it has been open this long (Karpenter's `BATCH_MAX_DURATION`).
    pub batch_max: Duration,
    /// How many pending pods are remembered (for de-duplication and re-sends).
    pub dedupe_capacity: usize,
    /// A pod still pending this long after its last send is sent again (and
    /// the same pod version seen within it is a duplicate).
    pub resend_after: Duration,
}

/// A missing or malformed setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("setting {name}: {message}")]
pub struct ConfigError {
    /// The environment variable.
    pub name: String,
    /// What is wrong.
    pub message: String,
}

impl Config {
    /// Reads settings through `get` (the environment in `main`):
    /// `QUEUE_URL` (required), `HEALTH_ADDR` (default `0.0.0.0:8080`),
    /// Karpenter's `BATCH_IDLE_DURATION` (1s) and `BATCH_MAX_DURATION` (10s,
    /// at least the idle duration), Go durations,
    /// `DEDUPE_CAPACITY` (10000 pending pods remembered),
    /// `RESEND_AFTER_SECS` (300, at least 1; a pod still pending this long
    /// after its last send is sent again).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let err = |name: &str, message: String| ConfigError {
            name: name.into(),
            message,
        };
        let num = |name: &str, default: u64| -> Result<u64, ConfigError> {
            match get(name) {
                None => Ok(default),
                Some(v) => v
                    .trim()
                    .parse::<u64>()
                    .map_err(|_| err(name, format!("{v:?} is not a non-negative integer"))),
            }
        };
        let queue_url = get("QUEUE_URL")
            .filter(|v| !v.trim().is_empty())
            .ok_or_else(|| err("QUEUE_URL", "is required (the pending-pods queue URL)".into()))?;
        if !queue_url.starts_with("https://") && !queue_url.starts_with("http://") {
            return Err(err("QUEUE_URL", format!("{queue_url:?} is not a queue URL")));
        }
        if get("FLUSH_INTERVAL_MS").is_some() {
            return Err(err(
                "FLUSH_INTERVAL_MS",
                "is replaced by BATCH_IDLE_DURATION and BATCH_MAX_DURATION (Karpenter's batch window)".into(),
            ));
        }
        let settings = nodesmith::settings::Settings::new(&get);
        let duration = |name: &str, default: Duration| {
            settings.duration(name, default).map_err(|_| {
                err(
                    name,
                    format!(
                        "{:?} is not a duration such as 1s or 500ms",
                        get(name).unwrap_or_default()
                    ),
                )
            })
        };
        let batch_idle = duration("BATCH_IDLE_DURATION", DEFAULT_BATCH_IDLE)?;
        let batch_max = duration("BATCH_MAX_DURATION", Duration::from_secs(10))?;
        if batch_idle.is_zero() {
            return Err(err("BATCH_IDLE_DURATION", "must be more than 0".into()));
        }
        if batch_max < batch_idle {
            return Err(err(
                "BATCH_MAX_DURATION",
                format!("must be at least BATCH_IDLE_DURATION ({batch_idle:?})"),
            ));
        }
        let resend = num("RESEND_AFTER_SECS", 300)?;
        if resend == 0 {
            return Err(err("RESEND_AFTER_SECS", "must be at least 1".into()));
        }
        Ok(Config {
            queue_url,
            health_addr: get("HEALTH_ADDR").unwrap_or_else(|| "0.0.0.0:8080".into()),
            batch_idle,
            batch_max,
            dedupe_capacity: usize::try_from(num("DEDUPE_CAPACITY", 10_000)?)
                .unwrap_or(usize::MAX)
                .max(1),
            resend_after: Duration::from_secs(resend),
        })
    }
}

/// The reference to send for a pod, when provisioning should act on it.
pub fn pending_ref(pod: &Pod) -> Option<PendingPodRef> {
    if !pods::is_provisionable(pod) {
        return None;
    }
    let m = &pod.metadata;
    let r = PendingPodRef {
        namespace: m.namespace.clone()?,
        name: m.name.clone()?,
        uid: m.uid.clone()?,
        resource_version: m.resource_version.clone()?,
    };
    r.validate().ok().map(|_| r)
}

/// What the forwarder did, returned when it stops.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// References the queue accepted.
    pub sent: u64,
    /// Joining-Node reports the queue accepted.
    pub nodes_sent: u64,
    /// Pod events dropped as already sent.
    pub duplicates: u64,
    /// References queued again because their pod stayed pending a full
    /// `resend_after` after its last send.
    pub resent: u64,
    /// Pending pods forgotten to stay within `dedupe_capacity`.
    pub evicted: u64,
    /// References whose send failed and were kept for a retry.
    pub retried: u64,
    /// Watch errors (each followed by a backed-off reconnect).
    pub watch_errors: u64,
}

/// Pending references, remembered pods, joining Nodes, and the counts.
struct Forwarder {
    pending: PendingPods,
    batch: Vec<PendingPodRef>,
    window: BatchWindow,
    nodes: JoiningNodes,
    /// Node reports whose send failed, sent again at the next look.
    node_backlog: Vec<NodeRef>,
    stats: Stats,
}

/// Most references held while the queue is unreachable; older ones are dropped
/// (their pods stay remembered, so they go out again once the pod changes or
/// at their next re-send). A batch this full is sent at once.
const MAX_BACKLOG: usize = 10_000;

impl Forwarder {
    /// Nothing pending, remembered or sent yet.
    fn new(config: &Config) -> Self {
        Forwarder {
            pending: PendingPods::new(config.dedupe_capacity, config.resend_after),
            batch: Vec::new(),
            window: BatchWindow::new(config.batch_idle, config.batch_max),
            nodes: JoiningNodes::default(),
            node_backlog: Vec::new(),
            stats: Stats::default(),
        }
    }

    fn consider(&mut self, pod: &Pod, now: Instant) {
        let Some(r) = pending_ref(pod) else {
            // Bound, finished, nominated, or no longer unschedulable: not re-sent.
            self.forget(pod);
            return;
        };
        let seen = self.pending.observe(&r, now);
        if let Some(e) = seen.evicted {
            self.stats.evicted += 1;
            // The first, then every thousandth: a re-list of many pods would flood the log.
            if self.stats.evicted == 1 || self.stats.evicted.is_multiple_of(1000) {
                tracing::warn!(pod = %format!("{}/{}", e.namespace, e.name), capacity = self.pending.len(), evicted = self.stats.evicted, "too many pending pods to remember (DEDUPE_CAPACITY); forgot the one sent longest ago, which is not re-sent until the watch shows it again");
            }
        }
        if seen.send {
            tracing::debug!(pod = %format!("{}/{}", r.namespace, r.name), rv = %r.resource_version, "unschedulable pod queued");
            self.push(r, now);
        } else {
            self.stats.duplicates += 1;
        }
    }

    /// Queues a reference again for each pod still pending a full period after its last send.
    fn resend_due(&mut self, now: Instant) {
        let due = self.pending.due(now);
        if due.is_empty() {
            return;
        }
        // A reference still waiting in the backlog (the queue is failing) needs no second copy.
        let waiting: HashSet<&str> = self.batch.iter().map(|r| r.uid.as_str()).collect();
        let due: Vec<PendingPodRef> = due.into_iter().filter(|r| !waiting.contains(r.uid.as_str())).collect();
        if due.is_empty() {
            return;
        }
        tracing::info!(count = due.len(), "re-sending pods still pending");
        self.stats.resent += due.len() as u64;
        for r in due {
            self.push(r, now);
        }
    }

    /// Adds a reference to the batch; nothing is dropped here: the batch is
    /// bounded where the queue fails ([`Self::flush`]).
    fn push(&mut self, r: PendingPodRef, now: Instant) {
        self.window.add(now);
        self.batch.push(r);
    }

    /// Whether the batch is full enough to be sent before its window closes.
    fn full(&self) -> bool {
        self.batch.len() >= MAX_BACKLOG
    }

    /// The pod is no longer pending: its re-sends stop.
    fn forget(&mut self, pod: &Pod) {
        if let Some(uid) = pod.metadata.uid.as_deref() {
            self.pending.remove(uid);
        }
    }

    /// Sends the batch; what failed waits one more idle duration.
    async fn flush(&mut self, sink: &SqsSink, now: Instant) {
        self.window.close();
        if self.batch.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.batch);
        let failed = sink.send(&batch).await;
        self.stats.sent += (batch.len() - failed.len()) as u64;
        self.stats.retried += failed.len() as u64;
        self.batch = failed;
        let dropped = keep_newest(&mut self.batch, MAX_BACKLOG);
        if let Some(oldest) = dropped.first() {
            tracing::warn!(dropped = dropped.len(), oldest = %format!("{}/{}", oldest.namespace, oldest.name), "the queue refused more references than the backlog holds; dropped the oldest");
        }
        if !self.batch.is_empty() {
            self.window.add(now);
        }
    }

    /// A Node from the watch: reported at once when nodesmith can act on it.
    async fn consider_node(&mut self, node: &Node, sink: &SqsSink) {
        if let Some(r) = self.nodes.observe(node) {
            tracing::debug!(node = %r.name, "joining node reported");
            self.node_backlog.push(r);
            self.send_nodes(sink).await;
        }
    }

    async fn send_nodes(&mut self, sink: &SqsSink) {
        if self.node_backlog.is_empty() {
            return;
        }
        let reports = std::mem::take(&mut self.node_backlog);
        let failed = sink.send(&reports).await;
        self.stats.nodes_sent += (reports.len() - failed.len()) as u64;
        self.stats.retried += failed.len() as u64;
        // Only the latest state matters and the function re-reads it: a bounded retry list.
        self.node_backlog = failed.into_iter().rev().take(MAX_BACKLOG).collect();
    }
}

/// Cuts `batch` to its newest `cap` references in one pass; returns the dropped ones, oldest first.
fn keep_newest<T>(batch: &mut Vec<T>, cap: usize) -> Vec<T> {
    let excess = batch.len().saturating_sub(cap);
    batch.drain(..excess).collect()
}

/// Watches pods and forwards unschedulable ones until `shutdown` resolves;
/// then sends what is pending and returns the counts.
pub async fn run(
    client: kube::Client,
    sink: SqsSink,
    config: &Config,
    health: Health,
    shutdown: impl Future<Output = ()>,
) -> Stats {
    let api: Api<Pod> = Api::all(client.clone());
    // Only pods without a node can be unschedulable; the server filters the rest.
    let stream = watcher(api, watcher::Config::default().fields("spec.nodeName=")).default_backoff();
    // Only nodesmith's Nodes carry the pool label; the server filters the rest.
    let node_api: Api<Node> = Api::all(client);
    let node_stream =
        watcher(node_api, watcher::Config::default().labels(nodesmith::labels::NODEPOOL)).default_backoff();
    futures::pin_mut!(stream);
    futures::pin_mut!(node_stream);
    futures::pin_mut!(shutdown);
    // How often re-sends (and failed Node reports) are looked for.
    let mut ticker = tokio::time::interval(config.batch_idle.min(Duration::from_secs(1)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut fw = Forwarder::new(config);
    loop {
        let deadline = fw.window.deadline();
        // A closed window never fires; a far-off instant stands in for "never".
        let due =
            tokio::time::Instant::from_std(deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600)));
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tokio::time::sleep_until(due), if deadline.is_some() => {
                fw.flush(&sink, Instant::now()).await;
            }
            _ = ticker.tick() => {
                fw.resend_due(Instant::now());
                // A re-send round larger than the backlog is sent rather than cut.
                if fw.full() {
                    fw.flush(&sink, Instant::now()).await;
                }
                fw.send_nodes(&sink).await;
            }
            ev = node_stream.next() => match ev {
                Some(Ok(watcher::Event::Apply(n))) | Some(Ok(watcher::Event::InitApply(n))) => {
                    fw.consider_node(&n, &sink).await;
                }
                Some(Ok(watcher::Event::Delete(n))) => fw.nodes.forget(&n),
                Some(Ok(watcher::Event::Init)) | Some(Ok(watcher::Event::InitDone)) => {}
                Some(Err(e)) => {
                    fw.stats.watch_errors += 1;
                    tracing::warn!(error = %e, "node watch failed; reconnecting with backoff");
                }
                None => break,
            },
            ev = stream.next() => match ev {
                Some(Ok(watcher::Event::Apply(p))) | Some(Ok(watcher::Event::InitApply(p))) => {
                    health.observed();
                    fw.consider(&p, Instant::now());
                    // A full backlog is sent rather than cut.
                    if fw.full() {
                        fw.flush(&sink, Instant::now()).await;
                    }
                }
                Some(Ok(watcher::Event::Init)) => {
                    fw.pending.begin_relist();
                    tracing::info!("listing pods (initial or after a lost watch)");
                }
                Some(Ok(watcher::Event::InitDone)) => {
                    health.synced();
                    let gone = fw.pending.end_relist();
                    tracing::info!(pending = fw.pending.len(), forgotten = gone, "pod list synced; watching");
                }
                Some(Ok(watcher::Event::Delete(p))) => {
                    health.observed();
                    fw.forget(&p);
                }
                Some(Err(e)) => {
                    fw.stats.watch_errors += 1;
                    health.failed();
                    tracing::warn!(error = %e, "pod watch failed; reconnecting with backoff");
                }
                None => break,
            },
        }
    }
    fw.flush(&sink, Instant::now()).await;
    fw.send_nodes(&sink).await;
    tracing::info!(stats = ?fw.stats, unsent = fw.batch.len(), "forwarder stopped");
    fw.stats
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn settings_have_defaults_and_name_bad_values() {
        let c = Config::from_lookup(lookup(&[(
            "QUEUE_URL",
            "https://sqs.us-east-1.amazonaws.com/1/pending",
        )]))
        .unwrap();
        assert_eq!(
            (c.batch_idle, c.batch_max),
            (Duration::from_secs(1), Duration::from_secs(10))
        );
        assert_eq!(c.dedupe_capacity, 10_000);
        assert_eq!(c.resend_after, Duration::from_secs(300));
        assert_eq!(c.health_addr, "0.0.0.0:8080");
        assert_eq!(Config::from_lookup(lookup(&[])).unwrap_err().name, "QUEUE_URL");
        assert_eq!(
            Config::from_lookup(lookup(&[("QUEUE_URL", "pending")]))
                .unwrap_err()
                .name,
            "QUEUE_URL"
        );
        let e =
            Config::from_lookup(lookup(&[("QUEUE_URL", "https://q"), ("BATCH_IDLE_DURATION", "soon")])).unwrap_err();
        assert_eq!(e.name, "BATCH_IDLE_DURATION");
        assert!(e.to_string().contains("soon"), "{e}");
        for (k, v) in [
            ("BATCH_IDLE_DURATION", "0s"),
            ("BATCH_MAX_DURATION", "500ms"),
            ("FLUSH_INTERVAL_MS", "1000"),
        ] {
            assert_eq!(
                Config::from_lookup(lookup(&[("QUEUE_URL", "https://q"), (k, v)]))
                    .unwrap_err()
                    .name,
                k
            );
        }
        let c = Config::from_lookup(lookup(&[
            ("QUEUE_URL", "https://q"),
            ("BATCH_IDLE_DURATION", "250ms"),
            ("BATCH_MAX_DURATION", "2s"),
        ]))
        .unwrap();
        assert_eq!(
            (c.batch_idle, c.batch_max),
            (Duration::from_millis(250), Duration::from_secs(2))
        );
        assert_eq!(
            Config::from_lookup(lookup(&[("QUEUE_URL", "https://q"), ("RESEND_AFTER_SECS", "0")]))
                .unwrap_err()
                .name,
            "RESEND_AFTER_SECS"
        );
        let c = Config::from_lookup(lookup(&[("QUEUE_URL", "https://q"), ("RESEND_AFTER_SECS", "60")])).unwrap();
        assert_eq!(c.resend_after, Duration::from_secs(60));
    }

    #[test]
    fn only_provisionable_pods_become_references() {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "u", "resourceVersion": "7"},
            "spec": {"containers": []},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
        }))
        .unwrap();
        let r = pending_ref(&p).unwrap();
        assert_eq!(
            (
                r.namespace.as_str(),
                r.name.as_str(),
                r.uid.as_str(),
                r.resource_version.as_str()
            ),
            ("default", "web", "u", "7")
        );
        let mut bound = p.clone();
        bound.spec.as_mut().unwrap().node_name = Some("n".into());
        assert!(pending_ref(&bound).is_none());
        let mut no_uid = p;
        no_uid.metadata.uid = None;
        assert!(pending_ref(&no_uid).is_none());
    }

    /// A pod the scheduler found no room for, numbered.
    fn unschedulable(i: usize) -> Result<Pod, serde_json::Error> {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("web-{i}"), "namespace": "default", "uid": format!("u{i}"), "resourceVersion": "1"},
            "spec": {"containers": []},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
        }))
    }

    #[test]
    fn a_re_send_round_larger_than_the_backlog_loses_no_pod() -> Result<(), Box<dyn std::error::Error>> {
        let n = MAX_BACKLOG + 2_000;
        let remembered = n.to_string();
        let config = Config::from_lookup(lookup(&[("QUEUE_URL", "https://q"), ("DEDUPE_CAPACITY", &remembered)]))?;
        let mut fw = Forwarder::new(&config);
        let start = Instant::now();
        for i in 0..n {
            fw.consider(&unschedulable(i)?, start);
            // Sent when full, as `run` does.
            if fw.full() {
                fw.batch.clear();
            }
        }
        fw.batch.clear();
        // Every pod is still pending when its re-send is due: all go out again.
        fw.resend_due(start + config.resend_after);
        let uids: HashSet<&str> = fw.batch.iter().map(|r| r.uid.as_str()).collect();
        assert_eq!(uids.len(), n);
        Ok(())
    }

    #[test]
    fn a_failing_queue_keeps_the_newest_references_up_to_the_backlog() {
        let mut batch: Vec<usize> = (0..12).collect();
        assert_eq!(keep_newest(&mut batch, 10), vec![0, 1]);
        assert_eq!(batch, (2..12).collect::<Vec<_>>());
        assert!(keep_newest(&mut batch, 10).is_empty());
        assert_eq!(batch.len(), 10);
    }
}
