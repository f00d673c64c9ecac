//! The one door for new capacity. `provision`, `interrupt` and the sweep's
//! disruption replacements all add capacity the same way: under the
//! provision lease, they name new claims so no stored claim or node is
//! shadowed, write them fenced by the lease (a writer whose lease was taken
//! over writes nothing) and queue one launch each.
//!
//! Replacements are planned here too ([`plan_replacements`]), once for both
//! interruption and disruption. The decision on pending pods: a replacement
//! is sized for the pods of the nodes it replaces alone, so a pending pod
//! never changes its shape, narrows its offerings or delays it; pending pods
//! share the replacement's spare room through provisioning, whose next solve
//! counts the replacement as in-flight capacity. Karpenter likewise needs
//! only the candidates' pods placed (pods pending before never block a
//! disruption). But Karpenter's simulation places the pending pods with the
//! candidates' pods, so a disruption's replacements ([`Pending::Hold`]) never
//! count on room the pending pods take on existing nodes and in-flight
//! claims: its drain would evict pods into room a pending pod binds to
//! first. An interruption's plan ([`Pending::Ignore`]) comes after its first
//! evictions, when the pending pods include its nodes' own, recreated.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Duration;

use jiff::Timestamp;

use crate::deadline::Deadline;
use crate::messages::launch_requests::enqueue;
use crate::messages::{EnqueueError, LaunchRequest};
use crate::nodeclaim::{NodeClaim, generate_name};
use crate::scheduling::{Compiled, NewNodeClaim, PodRef, SolveInput, SolveOptions, TargetKind, Unschedulable};
use crate::settings::{SettingError, Settings};
use crate::snapshot::Snapshot;
use crate::state::{Lease, StateError, StateStore, now_ms};

/// The lease that serialises solves (and every other writer of new claims).
pub const LEASE: &str = "provision";

/// The provision lease's default time to live.
pub const LEASE_TTL: Duration = Duration::from_secs(15);

/// How long the provision lease outlives its holder's last renewal, from
/// `NODESMITH_PROVISION_LEASE` (a Go duration; default 15s): how long a writer
/// of claims that died blocks the next.
pub fn lease_ttl(settings: &Settings<impl Fn(&str) -> Option<String>>) -> Result<Duration, SettingError> {
    settings.duration("NODESMITH_PROVISION_LEASE", LEASE_TTL)
}

/// Why new capacity could not be admitted.
#[derive(Debug, thiserror::Error)]
pub enum CapacityError {
    /// The claims could not be written (or the lease was lost meanwhile).
    #[error("writing new NodeClaims")]
    State(#[from] StateError),
    /// The claims were written but their launches could not be queued (the
    /// sweep sends a Pending claim's launch request again).
    #[error("queueing launches")]
    Enqueue(#[from] EnqueueError),
}

/// Where new capacity goes through: the state table, the launch queue and
/// the terms of the provision lease.
pub struct Door<'a> {
    /// The state table.
    pub store: &'a StateStore,
    /// SQS, for the launch queue.
    pub sqs: &'a aws_sdk_sqs::Client,
    /// The launch queue's URL.
    pub launch_queue_url: &'a str,
    /// Who asks for the lease (the function); each invocation holds it under
    /// an identity of its own made from this.
    pub holder: &'a str,
    /// How long the lease outlives its holder's last renewal.
    pub lease_ttl: Duration,
    /// How long to wait for another holder before giving up.
    pub lease_wait: Duration,
    /// When the lease must be given back by: a release still waiting then is
    /// dropped, and the lease expires by itself (the invocation's deadline).
    pub release_by: Deadline,
}

impl Door<'_> {
    /// Runs `work` under the provision lease, held by this invocation alone
    /// (`holder` names the function; each call adds a fresh identity) and
    /// renewed while `work` runs (a solve inside goes through [`off_task`]);
    /// None when another holder kept it for longer than `lease_wait`.
    pub async fn under_lease<T, Fut: Future<Output = T>>(
        &self,
        work: impl FnOnce(Lease) -> Fut,
    ) -> Result<Option<T>, StateError> {
        self.store
            .with_lease(
                LEASE,
                self.holder,
                self.lease_ttl,
                self.lease_wait,
                self.release_by,
                work,
            )
            .await
    }

    /// Writes `claims` fenced by `lease` and queues one launch request each;
    /// the claims as written. The only path by which claims are created.
    pub async fn admit(&self, lease: &Lease, claims: &[NodeClaim]) -> Result<Vec<NodeClaim>, CapacityError> {
        let created = self.store.create_node_claims_fenced(lease, claims, now_ms()).await?;
        let requests: Vec<LaunchRequest> = created.iter().map(|c| LaunchRequest::new(&c.name)).collect();
        enqueue(self.sqs, self.launch_queue_url, &requests).await?;
        Ok(created)
    }
}

/// Runs CPU-bound work (a solve) on the runtime's blocking pool: the lease
/// renewal and every other task keep running while it computes, whatever
/// the runtime's thread count. A panic in `work` goes on in the caller.
pub async fn off_task<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(work).await {
        Ok(t) => t,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// The seed names are drawn from in one solve under `lease` (pure): unique
/// per holder, fencing token and time, so names never repeat across solves.
pub fn seed(lease: &Lease, now: Timestamp) -> String {
    format!("{}/{}/{}", lease.holder, lease.version, now.as_nanosecond())
}

/// Names the planned claims of a solve over `snapshot` (pure). Names are
/// drawn from `seed`, never derived from the pods (a pod recreated under its
/// old name must not give the name of a claim still stored), and never
/// shadow a stored claim or a node.
pub fn name_claims<'p>(
    snapshot: &Snapshot,
    planned: impl IntoIterator<Item = &'p NewNodeClaim>,
    seed: &str,
) -> Vec<NodeClaim> {
    let mut taken: BTreeSet<String> = snapshot.node_claims.iter().map(|c| c.name.clone()).collect();
    taken.extend(snapshot.nodes.iter().filter_map(|n| n.node.metadata.name.clone()));
    planned
        .into_iter()
        .map(|c| NodeClaim {
            name: generate_name(&c.node_pool, seed, &mut taken),
            ..snapshot.node_claim(c)
        })
        .collect()
}

/// One planned replacement claim.
#[derive(Debug, Clone)]
pub struct Planned {
    /// The node whose pods it is for (the owner of its first pod, by pod order).
    pub replaces: String,
    /// The claim as priced by the solve.
    pub priced: NewNodeClaim,
    /// The claim to write.
    pub claim: NodeClaim,
}

/// The capacity that takes the pods of nodes going away.
#[derive(Debug, Clone, Default)]
pub struct Replacements {
    /// New claims, in the solve's order.
    pub new: Vec<Planned>,
    /// In-flight claims that receive some of a node's pods, by node.
    pub in_flight: BTreeMap<String, BTreeSet<String>>,
    /// The pods of a node nothing can hold, by node, in pod order.
    pub stuck: BTreeMap<String, Vec<Unschedulable>>,
}

impl Replacements {
    /// The claims to write.
    pub fn claims(&self) -> Vec<NodeClaim> {
        self.new.iter().map(|p| p.claim.clone()).collect()
    }

    /// Every pod nothing can hold.
    pub fn unschedulable(&self) -> impl Iterator<Item = &Unschedulable> {
        self.stuck.values().flatten()
    }
}

/// What a replacement plan does with the snapshot's pending pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pending {
    /// They keep the room a solve gives them on what stays (a disruption's
    /// replacements launch before its drain: the pending pods are others').
    Hold,
    /// They are left out (an interruption's evictions come first: its
    /// nodes' own pods are pending again, recreated, and are planned for).
    Ignore,
}

/// Plans the replacement of `nodes` (pure): a what-if solve of `snapshot`
/// under `options` (which removes at least `nodes`) for their pods alone.
/// Pending pods are left to provisioning (see the module's doc), so new
/// claims are only those that hold some of the nodes' pods; with
/// [`Pending::Hold`] they first take the room a solve gives them on the
/// capacity that stays. `narrow` may restrict each planned claim
/// (consolidation keeps what it priced).
pub fn plan_replacements(
    snapshot: &Snapshot,
    nodes: &[String],
    options: &SolveOptions,
    pending: Pending,
    seed: &str,
    narrow: impl Fn(&mut NewNodeClaim),
) -> Replacements {
    // Without copying the snapshot: at 5,000 nodes a copy of its 155,000
    // pods was most of an interrupt's memory.
    let hold = pending == Pending::Hold && !snapshot.pods.is_empty();
    let input = SolveInput {
        pods: if hold { &snapshot.pods } else { &[] },
        ..snapshot.solve_input()
    };
    let mut compiled = Compiled::new(&input);
    if hold {
        // Placed with the nodes gone but their pods not yet moved, held, then forgotten.
        let placed = compiled.solve(&SolveOptions {
            removed: options.removed.clone(),
            place_removed_pods: false,
            deadline: options.deadline,
            ..SolveOptions::default()
        });
        compiled.hold_pending(&placed);
    }
    let mut plan = compiled.solve(options);
    let wanted: BTreeSet<&str> = nodes.iter().map(String::as_str).collect();
    let owner: BTreeMap<PodRef, &str> = snapshot
        .nodes
        .iter()
        .filter_map(|n| Some((*wanted.get(n.node.metadata.name.as_deref()?)?, &n.pods)))
        .flat_map(|(node, ps)| ps.iter().map(move |p| (PodRef::of(p), node)))
        .collect();
    let mut out = Replacements::default();
    let mut owned = Vec::new();
    for c in &mut plan.node_claims {
        let mut pods = c.pods.clone();
        pods.sort();
        if let Some(node) = pods.iter().find_map(|p| owner.get(p)) {
            narrow(c);
            owned.push((node.to_string(), c.clone()));
        }
    }
    let names = name_claims(snapshot, owned.iter().map(|(_, c)| c), seed);
    out.new = owned
        .into_iter()
        .zip(names)
        .map(|((replaces, priced), claim)| Planned {
            replaces,
            priced,
            claim,
        })
        .collect();
    for e in plan.existing.iter().filter(|e| e.kind == TargetKind::NodeClaim) {
        for p in &e.pods {
            if let Some(node) = owner.get(p) {
                out.in_flight
                    .entry(node.to_string())
                    .or_default()
                    .insert(e.name.clone());
            }
        }
    }
    for u in plan.unschedulable {
        if let Some(node) = owner.get(&u.pod) {
            out.stuck.entry(node.to_string()).or_default().push(u);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    use super::*;
    use crate::scheduling::fixtures::{catalog, default_pool, managed_node, pod};
    use crate::scheduling::{ExistingNode, TargetKind};

    fn now() -> Timestamp {
        "2026-03-01T12:00:00Z".parse().unwrap()
    }

    fn running(name: &str, cpu: &str, node: &str) -> Pod {
        pod(
            name,
            cpu,
            "1Gi",
            json!({"metadata": {"ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "u", "controller": true}]},
                "spec": {"nodeName": node}}),
        )
    }

    /// Node `n1` with two pods and `pending` waiting for capacity.
    fn cluster(pending: Vec<Pod>) -> Snapshot {
        let mut s = Snapshot::new(Arc::new(catalog()), now());
        s.node_pools = vec![default_pool()];
        s.nodes = vec![ExistingNode {
            node: managed_node("n1"),
            pods: vec![running("a", "1", "n1"), running("b", "1", "n1")],
        }];
        s.pods = pending;
        s
    }

    fn replace_n1(s: &Snapshot) -> Replacements {
        let nodes = vec!["n1".to_string()];
        plan_replacements(
            s,
            &nodes,
            &SolveOptions::without(nodes.clone()),
            Pending::Hold,
            "seed",
            |_| {},
        )
    }

    /// The shape of a plan: per claim, its pool, instance types, zone and pods.
    fn shape(r: &Replacements) -> Vec<(String, Vec<String>, String, Vec<PodRef>)> {
        r.new
            .iter()
            .map(|p| {
                let c = &p.priced;
                (
                    c.node_pool.clone(),
                    c.instance_type_options.clone(),
                    c.zone.clone(),
                    c.pods.clone(),
                )
            })
            .collect()
    }

    #[tokio::test]
    async fn work_off_task_leaves_the_runtime_thread_to_other_tasks() {
        // A one-thread runtime: had the work run on it, the sender below
        // would never run and the work would wait in vain.
        let (tx, rx) = std::sync::mpsc::channel();
        let work = off_task(move || rx.recv_timeout(std::time::Duration::from_secs(10)).is_ok());
        let other = async move { tx.send(()).is_ok() };
        assert_eq!(tokio::join!(work, other), (true, true));
    }

    #[test]
    fn pending_pods_never_shape_a_replacement() {
        let alone = replace_n1(&cluster(vec![]));
        assert_eq!(alone.new.len(), 1, "{alone:#?}");
        assert!(alone.new.iter().all(|p| p.replaces == "n1"));
        // A pod that would fit beside the replacement, one that would make it
        // larger, and one that needs a different architecture than it: none
        // changes the replacement, none gets a claim from this path.
        let small = pod("small", "500m", "1Gi", json!({}));
        let large = pod("large", "3", "4Gi", json!({}));
        let arm = pod(
            "arm",
            "500m",
            "1Gi",
            json!({"spec": {"nodeSelector": {"kubernetes.io/arch": "arm64"}}}),
        );
        let with_pending = replace_n1(&cluster(vec![small, large, arm]));
        assert_eq!(shape(&with_pending), shape(&alone));
        assert_eq!(
            with_pending.claims().iter().map(|c| &c.name).collect::<Vec<_>>(),
            alone.claims().iter().map(|c| &c.name).collect::<Vec<_>>()
        );
        assert_eq!(with_pending.unschedulable().count(), 0);
    }

    #[test]
    fn pending_pods_share_the_replacement_s_room_through_the_next_solve() {
        let small = pod("small", "500m", "1Gi", json!({}));
        let s = cluster(vec![small.clone()]);
        let plan = replace_n1(&s);
        // The next provisioning solve, once the node is gone and its
        // replacement is in flight: the pending pod goes on the replacement.
        let mut next = s.clone();
        next.nodes.clear();
        next.node_claims = plan.claims();
        let solved = next.compile().solve(&SolveOptions::default());
        assert!(solved.node_claims.is_empty(), "{solved:#?}");
        let on = &solved.existing;
        assert_eq!(on.len(), 1, "{on:#?}");
        assert_eq!(
            (on[0].kind, on[0].name.as_str()),
            (TargetKind::NodeClaim, plan.new[0].claim.name.as_str())
        );
        assert_eq!(on[0].pods, vec![PodRef::of(&small)]);
    }

    #[test]
    fn the_room_pending_pods_get_on_a_staying_node_is_not_a_replacement_s() {
        // n2 (4 cpu, 1 used) holds n1's two 1-cpu pods, or the 2-cpu pending pod.
        let with_n2 = |pending: Vec<Pod>| {
            let mut s = cluster(pending);
            s.nodes.push(ExistingNode {
                node: managed_node("n2"),
                pods: vec![running("c", "1", "n2")],
            });
            s
        };
        let alone = replace_n1(&with_n2(vec![]));
        assert!(alone.new.is_empty(), "n1's pods fit on n2: {alone:#?}");
        let waiting = pod("waiting", "2", "1Gi", json!({}));
        let plan = replace_n1(&with_n2(vec![waiting.clone()]));
        assert!(!plan.new.is_empty(), "the pending pod's room is not n1's: {plan:#?}");
        let planned: Vec<&PodRef> = plan.new.iter().flat_map(|p| &p.priced.pods).collect();
        assert!(!planned.contains(&&PodRef::of(&waiting)), "{planned:?}");
        assert_eq!(plan.unschedulable().count(), 0);
    }

    #[test]
    fn a_replacement_says_which_pods_of_its_node_nothing_can_hold() {
        let mut s = cluster(vec![pod("waiting", "64", "1Gi", json!({}))]);
        s.nodes[0].pods.push(running("huge", "64", "n1"));
        let plan = replace_n1(&s);
        let stuck: Vec<String> = plan.unschedulable().map(|u| u.pod.to_string()).collect();
        assert_eq!(stuck, vec!["default/huge".to_string()]);
        assert_eq!(plan.stuck.keys().collect::<Vec<_>>(), vec!["n1"]);
    }

    #[test]
    fn names_shadow_no_stored_claim_or_node() {
        let s = cluster(vec![]);
        let plan = replace_n1(&s);
        let priced = [plan.new[0].priced.clone()];
        assert_eq!(name_claims(&s, &priced, "seed")[0].name, plan.new[0].claim.name);
        let mut stored = s.clone();
        stored.node_claims = plan.claims();
        let again = name_claims(&stored, &priced, "seed");
        assert_ne!(again[0].name, plan.new[0].claim.name);
        assert!(again[0].name.starts_with("default-"), "{}", again[0].name);
    }
}
