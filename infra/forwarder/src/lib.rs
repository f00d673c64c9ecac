//! The in-cluster forwarder: watches pods that the scheduler marked
//! unschedulable and sends slim references ([`PendingPodRef`]) to the
//! pending-pods SQS queue, in batches of up to ten, de-duplicated by
//! uid + resourceVersion within a bounded window. Nothing else.
//!
//! The watch is kube-rs' watcher: after a dropped connection it resumes from
//! the last resourceVersion, and after a 410 it re-lists — the re-listed pods
//! hit the dedupe memory, so a reconnect does not send them again.

pub mod dedupe;
pub mod health;
pub mod sqs;

use std::future::Future;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use nodesmith::kubernetes::pods;
use nodesmith::messages::PendingPodRef;

pub use dedupe::Dedupe;
pub use health::Health;
pub use sqs::SqsSink;

/// Settings, from the environment in `main`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The pending-pods queue URL.
    pub queue_url: String,
    /// Where `/healthz` and `/readyz` are served.
    pub health_addr: String,
    /// Longest a reference waits before its batch is sent.
    pub flush_interval: Duration,
    /// How many (uid, resourceVersion) keys are remembered.
    pub dedupe_capacity: usize,
    /// How long a key is remembered: a pod still pending after this is sent again.
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
    /// `FLUSH_INTERVAL_MS` (1000), `DEDUPE_CAPACITY` (10000), `RESEND_AFTER_SECS` (300).
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
        let flush = num("FLUSH_INTERVAL_MS", 1000)?;
        if flush == 0 {
            return Err(err("FLUSH_INTERVAL_MS", "must be at least 1".into()));
        }
        Ok(Config {
            queue_url,
            health_addr: get("HEALTH_ADDR").unwrap_or_else(|| "0.0.0.0:8080".into()),
            flush_interval: Duration::from_millis(flush),
            dedupe_capacity: usize::try_from(num("DEDUPE_CAPACITY", 10_000)?)
                .unwrap_or(usize::MAX)
                .max(1),
            resend_after: Duration::from_secs(num("RESEND_AFTER_SECS", 300)?),
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
    /// Pod events dropped as already sent.
    pub duplicates: u64,
    /// References whose send failed and were kept for a retry.
    pub retried: u64,
    /// Watch errors (each followed by a backed-off reconnect).
    pub watch_errors: u64,
}

/// Pending references, remembered keys, and the counts.
struct Forwarder {
    dedupe: Dedupe<(String, String)>,
    batch: Vec<PendingPodRef>,
    stats: Stats,
}

/// Most references held while the queue is unreachable; older ones are dropped
/// (and forgotten, so they go out once the pod changes or the window passes).
const MAX_BACKLOG: usize = 10_000;

impl Forwarder {
    fn consider(&mut self, pod: &Pod, now: Instant) {
        let Some(r) = pending_ref(pod) else { return };
        if self.dedupe.insert(r.dedupe_key(), now) {
            tracing::debug!(pod = %format!("{}/{}", r.namespace, r.name), rv = %r.resource_version, "unschedulable pod queued");
            self.batch.push(r);
            if self.batch.len() > MAX_BACKLOG {
                let dropped = self.batch.remove(0);
                self.dedupe.forget(&dropped.dedupe_key());
                tracing::warn!(pod = %format!("{}/{}", dropped.namespace, dropped.name), "backlog full; dropped the oldest reference");
            }
        } else {
            self.stats.duplicates += 1;
        }
    }

    async fn flush(&mut self, sink: &SqsSink) {
        if self.batch.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.batch);
        let failed = sink.send(&batch).await;
        self.stats.sent += (batch.len() - failed.len()) as u64;
        self.stats.retried += failed.len() as u64;
        self.batch = failed;
    }
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
    let api: Api<Pod> = Api::all(client);
    // Only pods without a node can be unschedulable; the server filters the rest.
    let stream = watcher(api, watcher::Config::default().fields("spec.nodeName=")).default_backoff();
    futures::pin_mut!(stream);
    futures::pin_mut!(shutdown);
    let mut ticker = tokio::time::interval(config.flush_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut fw = Forwarder {
        dedupe: Dedupe::new(config.dedupe_capacity, config.resend_after),
        batch: Vec::new(),
        stats: Stats::default(),
    };
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            _ = ticker.tick() => fw.flush(&sink).await,
            ev = stream.next() => match ev {
                Some(Ok(watcher::Event::Apply(p))) | Some(Ok(watcher::Event::InitApply(p))) => {
                    health.observed();
                    fw.consider(&p, Instant::now());
                    if fw.batch.len() >= sqs::MAX_BATCH {
                        fw.flush(&sink).await;
                    }
                }
                Some(Ok(watcher::Event::Init)) => tracing::info!("listing pods (initial or after a lost watch)"),
                Some(Ok(watcher::Event::InitDone)) => {
                    health.synced();
                    tracing::info!(remembered = fw.dedupe.len(), "pod list synced; watching");
                }
                Some(Ok(watcher::Event::Delete(_))) => health.observed(),
                Some(Err(e)) => {
                    fw.stats.watch_errors += 1;
                    health.failed();
                    tracing::warn!(error = %e, "pod watch failed; reconnecting with backoff");
                }
                None => break,
            },
        }
    }
    fw.flush(&sink).await;
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
        assert_eq!(c.flush_interval, Duration::from_secs(1));
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
        let e = Config::from_lookup(lookup(&[("QUEUE_URL", "https://q"), ("FLUSH_INTERVAL_MS", "soon")])).unwrap_err();
        assert_eq!(e.name, "FLUSH_INTERVAL_MS");
        assert!(e.to_string().contains("\"soon\""));
        assert_eq!(
            Config::from_lookup(lookup(&[("QUEUE_URL", "https://q"), ("FLUSH_INTERVAL_MS", "0")]))
                .unwrap_err()
                .name,
            "FLUSH_INTERVAL_MS"
        );
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
}
