//! Latencies a user sees on a scale-out, sampled from the test server while a
//! story plays: when each pod was first seen pending and first seen Running
//! on a node, and when each Node was first seen Ready. The server's own
//! timestamps are whole seconds, so the sampler looks every
//! [`SAMPLE_EVERY`] instead (in process, cheap).

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use jiff::Timestamp;

use crate::kube_server::KubeServer;

/// How often the sampler looks.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(50);

/// What the sampler saw, by pod uid and node name.
#[derive(Clone, Debug, Default)]
pub struct Samples {
    /// When each pod was first seen without a node.
    pub pending: BTreeMap<String, Timestamp>,
    /// When each pod was first seen Running on a node, and that node.
    pub running: BTreeMap<String, (Timestamp, String)>,
    /// When each Node was first seen Ready.
    pub ready: BTreeMap<String, Timestamp>,
}

impl Samples {
    /// One look at the pods `app` selects and at every Node, at `now`.
    pub fn look(&mut self, kube: &KubeServer, app: &str, now: Timestamp) {
        for p in kube.pods() {
            let ours = p
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app"))
                .is_some_and(|a| a == app);
            let Some(uid) = p.metadata.uid.clone().filter(|_| ours) else {
                continue;
            };
            let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
            let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            match node {
                None => {
                    self.pending.entry(uid).or_insert(now);
                }
                Some(n) if running => {
                    self.running.entry(uid).or_insert((now, n));
                }
                Some(_) => {}
            }
        }
        for n in kube.nodes() {
            let ready = n
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            if let (true, Some(name)) = (ready, n.metadata.name.clone()) {
                self.ready.entry(name).or_insert(now);
            }
        }
    }

    /// Per pod seen both pending and running: the milliseconds between.
    pub fn pending_to_running(&self) -> Vec<u64> {
        self.running
            .iter()
            .filter_map(|(uid, (at, _))| millis(*self.pending.get(uid)?, *at))
            .collect()
    }

    /// Per Node that became Ready while sampled and ran a sampled pod: from
    /// Ready to the first such pod seen Running on it.
    pub fn ready_to_first_running(&self) -> Vec<u64> {
        let mut first: BTreeMap<&str, Timestamp> = BTreeMap::new();
        for (at, node) in self.running.values() {
            let e = first.entry(node.as_str()).or_insert(*at);
            *e = (*e).min(*at);
        }
        first
            .into_iter()
            .filter_map(|(node, at)| millis(*self.ready.get(node)?, at))
            .collect()
    }
}

fn millis(from: Timestamp, to: Timestamp) -> Option<u64> {
    u64::try_from(to.as_millisecond() - from.as_millisecond()).ok()
}

/// Runs `work` while sampling `kube` every [`SAMPLE_EVERY`] into `samples`
/// (and once more at its end); returns what `work` returned.
pub async fn sample_while<F: Future>(kube: &KubeServer, app: &str, samples: &mut Samples, work: F) -> F::Output {
    let mut work = std::pin::pin!(work);
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            out = &mut work => {
                samples.look(kube, app, Timestamp::now());
                return out;
            }
            _ = tick.tick() => samples.look(kube, app, Timestamp::now()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_pair_what_was_seen() {
        let t = |ms: i64| Timestamp::from_millisecond(1_000_000 + ms).unwrap();
        let s = Samples {
            pending: BTreeMap::from([("a".into(), t(0)), ("b".into(), t(100)), ("c".into(), t(0))]),
            running: BTreeMap::from([
                ("a".into(), (t(5000), "n1".into())),
                ("b".into(), (t(4000), "n1".into())),
                ("d".into(), (t(9000), "n2".into())),
            ]),
            ready: BTreeMap::from([("n1".into(), t(3000)), ("n3".into(), t(1))]),
        };
        assert_eq!(s.pending_to_running(), vec![5000, 3900]);
        assert_eq!(s.ready_to_first_running(), vec![1000]);
    }
}
