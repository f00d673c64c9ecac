//! A node's life after launch, decided as data: what the sweep must do to each
//! NodeClaim, Node and instance it sees at `now`. Pure: the sweep reads the
//! state table, the cluster and EC2, calls [`plan`], and carries the actions out.
//!
//! ```text
//! Pending ──launch──▶ Launched ──Node with its instance──▶ Registered ──Ready, startup taints gone──▶ Initialized
//!    │ launch timeout       │ registration timeout               │ instance gone / Node deleted
//!    └────────────▶ instance terminated, Node deleted, claim deleted, pods solved again
//! ```
//!
//! Garbage collection ([`adopt`]): an instance of this stack that no claim
//! names is re-adopted when its Node is registered and Ready (the state table
//! is a cache that can be lost), and terminated only when its Node never
//! registered or is gone, a bounded number a run; a Node of a NodePool with
//! neither a claim nor a live instance is deleted.

pub mod adopt;
pub mod termination;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{Node, Pod};

use crate::catalog::Catalog;
use crate::ec2::{Instance, InstanceState};
use crate::kubernetes::NodeUpdate;
use crate::labels;
use crate::nodeclaim::{NodeClaim, Phase};
use crate::registration::{self, instance_id};

/// Timeouts and windows of the lifecycle (Karpenter's defaults; environment in the sweep).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LifecycleConfig {
    /// A claim with no instance this long after it was written is given up.
    pub launch_timeout: Duration,
    /// A launched claim with no Node this long after launch is given up.
    pub registration_timeout: Duration,
    /// A claim still Pending this long after it was written has its launch
    /// request sent again (a crash lost it, or the launch that took it died).
    pub relaunch_after: Duration,
    /// An owned instance without a claim is judged once this old (Karpenter's leak window).
    pub leak_window: Duration,
    /// An instance missing from DescribeInstances counts as gone only this long after
    /// launch (EC2's reads are eventually consistent just after a launch).
    pub liveness_grace: Duration,
    /// Pods unschedulable for longer than this are due a solve (the provisioning batch window).
    pub batch_window: Duration,
    /// While pods stay pending, a solve is requested again once the last one is this old.
    pub resolve_every: Duration,
    /// This stack's identity ([`crate::ec2::instances::STACK_TAG`]); none
    /// owns only instances without the tag.
    pub stack: Option<String>,
    /// Garbage collection terminates at most this percentage of the stack's
    /// fleet a run (at least one instance): [`adopt::termination_cap`].
    pub collect_max_percent: u32,
}

impl Default for LifecycleConfig {
    fn default() -> Self {
        LifecycleConfig {
            launch_timeout: Duration::from_secs(5 * 60),
            registration_timeout: Duration::from_secs(15 * 60),
            relaunch_after: Duration::from_secs(30),
            leak_window: Duration::from_secs(30),
            liveness_grace: Duration::from_secs(60),
            batch_window: Duration::from_secs(10),
            resolve_every: Duration::from_secs(60),
            stack: None,
            collect_max_percent: 10,
        }
    }
}

/// Why a claim's capacity is given up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Removal {
    /// No instance within the launch timeout.
    LaunchTimeout,
    /// No Node within the registration timeout.
    RegistrationTimeout,
    /// Its instance is terminated, stopped or unknown to EC2.
    InstanceGone,
    /// Its Node was deleted.
    NodeGone,
    /// It was left Terminating (a disruption's termination was cut short).
    Terminating,
    /// The API server refused its Node's registration write as invalid (422):
    /// no retry can succeed, so the capacity is given up.
    RegistrationRefused,
}

impl Removal {
    /// A short kebab-case name, for logs, metrics and solve requests.
    pub fn as_str(self) -> &'static str {
        match self {
            Removal::LaunchTimeout => "launch-timeout",
            Removal::RegistrationTimeout => "registration-timeout",
            Removal::InstanceGone => "instance-gone",
            Removal::NodeGone => "node-gone",
            Removal::Terminating => "terminating",
            Removal::RegistrationRefused => "registration-refused",
        }
    }
}

/// One step for the sweep to carry out; each is idempotent.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Label the claim's Node, take its `unregistered` taint off, then record it on the claim.
    Register {
        /// The claim.
        claim: String,
        /// Its Node.
        node: String,
        /// The write to the Node.
        update: NodeUpdate,
    },
    /// Send the Pending claim's launch request again, unless a launch holds it
    /// (launch is idempotent: a second request for a launched claim does nothing).
    Relaunch {
        /// The claim.
        claim: String,
    },
    /// Mark the Node initialized, then move the claim to Initialized.
    Initialize {
        /// The claim.
        claim: String,
        /// Its Node.
        node: String,
    },
    /// Give the claim's capacity up: terminate the instance, delete the Node, delete
    /// the claim, and have its pods solved again.
    Remove {
        /// The claim.
        claim: String,
        /// Why.
        reason: Removal,
        /// The instance to terminate, if any.
        instance: Option<String>,
        /// The Node to delete, if any.
        node: Option<String>,
    },
    /// Terminate an instance no claim names, and delete its Node.
    CollectInstance {
        /// The instance.
        instance: String,
        /// Its Node, if one registered.
        node: Option<String>,
    },
    /// Write the rebuilt claim of a running instance whose registered, Ready
    /// Node no claim names (the table lost it), unless one of its name exists.
    Adopt {
        /// The claim, rebuilt from the instance and its Node.
        claim: Box<NodeClaim>,
    },
    /// An instance due for collection that this run leaves running: the cap
    /// on terminations a run is reached (reported with an event and a metric).
    HoldCollection {
        /// The instance.
        instance: String,
        /// Its NodePool (the event is on it).
        node_pool: String,
        /// Why it is due.
        why: adopt::Collect,
    },
    /// Delete a NodePool's Node that has neither a claim nor a live instance.
    CollectNode {
        /// The Node.
        node: String,
    },
}

/// What the sweep saw, at one moment.
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    /// The moment.
    pub now: Timestamp,
    /// Every NodeClaim in the state table.
    pub claims: &'a [NodeClaim],
    /// Every Node.
    pub nodes: &'a [Node],
    /// Every instance tagged as owned by the cluster and not terminated.
    pub instances: &'a [Instance],
    /// The instance catalog (labels of the launched instance type).
    pub catalog: Option<&'a Catalog>,
}

fn older_than(since: Option<Timestamp>, now: Timestamp, d: Duration) -> bool {
    let d = SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX);
    since.is_some_and(|t| now.duration_since(t) > d)
}

fn node_name(n: &Node) -> String {
    n.metadata.name.clone().unwrap_or_default()
}

fn node_instance(n: &Node) -> Option<&str> {
    n.spec.as_ref()?.provider_id.as_deref().and_then(instance_id)
}

fn created(n: &Node) -> Option<Timestamp> {
    n.metadata.creation_timestamp.as_ref().map(|t| t.0)
}

/// Whether EC2 reports the instance as going or gone.
fn is_going(state: &InstanceState) -> bool {
    matches!(
        state,
        InstanceState::ShuttingDown | InstanceState::Terminated | InstanceState::Stopping | InstanceState::Stopped
    )
}

/// Everything the sweep should do now, claims first (in name order), then
/// garbage collection (pure).
pub fn plan(seen: &Observed<'_>, config: &LifecycleConfig) -> Vec<Action> {
    let instances: BTreeMap<&str, &Instance> = seen.instances.iter().map(|i| (i.id.as_str(), i)).collect();
    let nodes_by_instance: BTreeMap<&str, &Node> =
        seen.nodes.iter().filter_map(|n| Some((node_instance(n)?, n))).collect();
    let mut actions = Vec::new();
    for claim in seen.claims {
        if let Some(a) = claim_action(claim, &instances, &nodes_by_instance, seen, config) {
            actions.push(a);
        }
    }
    actions.extend(collect(seen, &instances, config));
    actions
}

/// The instance a claim launched (recorded), else the one tagged with its name.
fn claim_instance<'a>(claim: &'a NodeClaim, instances: &BTreeMap<&str, &'a Instance>) -> Option<&'a str> {
    claim.instance_id.as_deref().or_else(|| {
        instances
            .values()
            .find(|i| i.node_claim() == Some(claim.name.as_str()))
            .map(|i| i.id.as_str())
    })
}

fn claim_action(
    claim: &NodeClaim,
    instances: &BTreeMap<&str, &Instance>,
    nodes_by_instance: &BTreeMap<&str, &Node>,
    seen: &Observed<'_>,
    config: &LifecycleConfig,
) -> Option<Action> {
    let now = seen.now;
    let remove = |reason: Removal, node: Option<&Node>| Action::Remove {
        claim: claim.name.clone(),
        reason,
        instance: claim_instance(claim, instances).map(str::to_string),
        node: node.map(node_name),
    };
    match claim.phase {
        Phase::Pending if older_than(claim.timestamps.created, now, config.launch_timeout) => {
            Some(remove(Removal::LaunchTimeout, None))
        }
        Phase::Pending => older_than(claim.timestamps.created, now, config.relaunch_after).then(|| Action::Relaunch {
            claim: claim.name.clone(),
        }),
        Phase::Launched | Phase::Registered | Phase::Initialized => {
            let id = claim.instance_id.as_deref()?;
            let node = nodes_by_instance.get(id).copied();
            let launched = claim.timestamps.launched.or(claim.timestamps.created);
            let instance = instances.get(id);
            let gone = match instance {
                Some(i) => is_going(&i.state),
                None => older_than(launched, now, config.liveness_grace),
            };
            if gone {
                return Some(remove(Removal::InstanceGone, node));
            }
            match (claim.phase, node) {
                (Phase::Launched, None) => older_than(launched, now, config.registration_timeout)
                    .then(|| remove(Removal::RegistrationTimeout, None)),
                (_, None) => Some(remove(Removal::NodeGone, None)),
                (_, Some(node)) => joining_action(claim, node, seen.catalog),
            }
        }
        // Disruption and interruption drive these phases; the lifecycle only
        // removes what they can no longer finish: capacity that is gone (a
        // drained spot node the cloud took), or a claim left Terminating.
        Phase::Draining => {
            let id = claim.instance_id.as_deref()?;
            let node = nodes_by_instance.get(id).copied();
            let gone = instances.get(id).is_none_or(|i| is_going(&i.state));
            if gone {
                Some(remove(Removal::InstanceGone, node))
            } else if node.is_none() {
                Some(remove(Removal::NodeGone, None))
            } else {
                None
            }
        }
        Phase::Terminating => {
            let node = claim
                .instance_id
                .as_deref()
                .and_then(|id| nodes_by_instance.get(id).copied());
            Some(remove(Removal::Terminating, node))
        }
    }
}

/// What a launched claim's Node needs to join: [`Action::Register`] until it
/// carries the registration, then [`Action::Initialize`] once it is Ready with
/// its startup taints gone; None when neither (or the claim is in another
/// phase). The one rule the sweep and the event path ([`crate::joining`]) share (pure).
pub fn joining_action(claim: &NodeClaim, node: &Node, catalog: Option<&Catalog>) -> Option<Action> {
    let phase = claim.phase;
    if !matches!(phase, Phase::Launched | Phase::Registered | Phase::Initialized) {
        return None;
    }
    let update = registration::registration_update(claim, catalog);
    if phase == Phase::Launched || !update.is_satisfied_by(node) {
        return Some(Action::Register {
            claim: claim.name.clone(),
            node: node_name(node),
            update,
        });
    }
    let labelled = node
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.get(labels::INITIALIZED).is_some_and(|v| v == "true"));
    let ready = registration::not_initialized_because(node, claim).is_none();
    (ready && (phase == Phase::Registered || !labelled)).then(|| Action::Initialize {
        claim: claim.name.clone(),
        node: node_name(node),
    })
}

/// Registration and initialization only, for every launched claim whose
/// instance has a Node: what a sweep still does when a read that only the
/// other decisions need (EC2's instances) failed (pure).
pub fn joining_actions(claims: &[NodeClaim], nodes: &[Node], catalog: Option<&Catalog>) -> Vec<Action> {
    let nodes_by_instance: BTreeMap<&str, &Node> = nodes.iter().filter_map(|n| Some((node_instance(n)?, n))).collect();
    claims
        .iter()
        .filter_map(|c| {
            let node = nodes_by_instance.get(c.instance_id.as_deref()?)?;
            joining_action(c, node, catalog)
        })
        .collect()
}

/// Garbage collection: claimless instances ([`adopt::judge`]) and orphaned Nodes.
fn collect(seen: &Observed<'_>, instances: &BTreeMap<&str, &Instance>, config: &LifecycleConfig) -> Vec<Action> {
    let names: BTreeSet<&str> = seen.claims.iter().map(|c| c.name.as_str()).collect();
    let claimed: BTreeSet<&str> = seen.claims.iter().filter_map(|c| c.instance_id.as_deref()).collect();
    let mut out = Vec::new();
    // Instances collected or held back this run: their Nodes go with them, later.
    let mut handled: BTreeSet<String> = BTreeSet::new();
    for (id, fate) in adopt::judge(seen, config) {
        match fate {
            adopt::Fate::Adopt(claim) => out.push(Action::Adopt { claim }),
            adopt::Fate::Collect { node, .. } => {
                handled.insert(id.clone());
                out.push(Action::CollectInstance { instance: id, node });
            }
            adopt::Fate::HeldBack { why, .. } => {
                let node_pool = instances
                    .get(id.as_str())
                    .and_then(|i| i.node_pool())
                    .unwrap_or_default()
                    .to_string();
                handled.insert(id.clone());
                out.push(Action::HoldCollection {
                    instance: id,
                    node_pool,
                    why,
                });
            }
            adopt::Fate::Keep(_) => {}
        }
    }
    for n in seen.nodes {
        let managed = n
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(labels::NODEPOOL));
        let id = node_instance(n);
        let has_claim = id.is_some_and(|id| claimed.contains(id))
            || n.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(labels::NODECLAIM))
                .is_some_and(|c| names.contains(c.as_str()));
        let live = id.is_some_and(|id| instances.get(id).is_some_and(|i| !is_going(&i.state)));
        let handled = id.is_some_and(|id| handled.contains(id));
        if managed && !has_claim && !live && !handled && older_than(created(n), seen.now, config.leak_window) {
            out.push(Action::CollectNode { node: node_name(n) });
        }
    }
    out
}

/// When a pod became unschedulable: its `PodScheduled=False` condition's
/// transition time, else its creation.
fn unschedulable_since(p: &Pod) -> Option<Timestamp> {
    let cond = p
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled" && c.status == "False"));
    let t = cond
        .and_then(|c| c.last_transition_time.as_ref())
        .or(p.metadata.creation_timestamp.as_ref())?;
    Some(t.0)
}

/// Whether the pending pods are due a solve: one has waited longer than the
/// batch window, and no solve ran since it started waiting, or the last solve
/// is older than `resolve_every` (pure).
pub fn solve_due(pending: &[Pod], last_solve: Option<Timestamp>, now: Timestamp, config: &LifecycleConfig) -> bool {
    let window = SignedDuration::try_from(config.batch_window).unwrap_or(SignedDuration::MAX);
    let stale = older_than(last_solve, now, config.resolve_every) || last_solve.is_none();
    pending.iter().any(|p| {
        let Some(since) = unschedulable_since(p) else {
            return false;
        };
        let waited = now.duration_since(since) > window;
        let unseen = last_solve.is_none_or(|s| s < since);
        waited && (unseen || stale)
    })
}

#[cfg(test)]
mod tests;
