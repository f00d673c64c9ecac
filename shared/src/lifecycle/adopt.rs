//! Instances of this stack that no NodeClaim names, decided as data. The
//! state table is a cache that can be lost (restored from a backup, replaced,
//! a stack deleted and deployed again), so a claimless instance is not taken
//! for a leak on sight:
//!
//! - one whose Node is registered (nodesmith took its `unregistered` taint
//!   off) and Ready is **adopted**: its claim is rebuilt from the instance, its
//!   tags and the Node, as Karpenter's former link controller made Machines
//!   for instances it found without one;
//! - one whose Node never registered, or is gone, is collected once the
//!   registration timeout has passed since its launch (no pod can run there);
//!   so is a second instance of a claim that recorded another (a double
//!   launch) and one that is stopped;
//! - terminations per run are capped at a share of the fleet: the rest are
//!   held back for later runs, so no mistake terminates the whole fleet at once.
//!
//! An instance tagged with another stack's identity ([`STACK_TAG`]) is never
//! touched. [`judge`] is pure; the sweep carries the fates out.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;

use super::{LifecycleConfig, Observed, created, node_instance, node_name, older_than};
use crate::apis::nodepool::NodeSelectorRequirementWithMinValues;
use crate::catalog::Catalog;
use crate::ec2::instances::STACK_TAG;
use crate::ec2::{Instance, InstanceState};
use crate::kubernetes::events::{EventSpec, EventType, node_name_ref};
use crate::labels;
use crate::nodeclaim::{NodeClaim, Phase, Timestamps};

/// Whose an instance tagged for the cluster is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// Not launched by nodesmith for a NodePool (another autoscaler's, or no pool tag).
    NotNodesmith,
    /// Launched by another nodesmith stack of the same cluster.
    OtherStack,
    /// This stack's: tagged with its identity, or with none (launched by a
    /// release before the tag, or by a deployment that sets no identity).
    ThisStack,
}

/// Whose `i` is, for a stack whose identity is `stack` (pure). A stack with
/// no identity owns only untagged instances.
pub fn owner(i: &Instance, stack: Option<&str>) -> Owner {
    if i.node_pool().is_none() || !i.launched_by_nodesmith() {
        return Owner::NotNodesmith;
    }
    match (i.tags.get(STACK_TAG), stack) {
        (None, _) => Owner::ThisStack,
        (Some(tag), Some(me)) if tag == me => Owner::ThisStack,
        (Some(_), _) => Owner::OtherStack,
    }
}

/// Why a claimless instance is to be terminated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Collect {
    /// Tagged with a claim that recorded another instance: a double launch
    /// (its Node, if any, never registered, so nothing runs there).
    Duplicate,
    /// Stopped or stopping: it serves nothing.
    NotRunning,
    /// The registration timeout passed since launch and its Node never
    /// registered, or is gone.
    NeverJoined,
}

impl Collect {
    /// A short kebab-case name, for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Collect::Duplicate => "duplicate",
            Collect::NotRunning => "not-running",
            Collect::NeverJoined => "never-joined",
        }
    }
}

/// Why a claimless instance is left alone this run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Wait {
    /// Younger than the leak window.
    Young,
    /// Already shutting down.
    ShuttingDown,
    /// No registered Node yet, inside the registration timeout: it may still join.
    Joining,
    /// Its Node is registered but not Ready (or the instance is still pending): it may come back.
    NotReady,
    /// Its Node is registered, but a claim of its tag's name recorded another
    /// instance: it cannot be adopted under that name, and a registered Node
    /// is never collected.
    NameTaken,
    /// Neither its tags nor its Node name its claim or NodePool.
    Unnamed,
}

/// What becomes of one claimless instance of this stack.
#[derive(Debug, Clone, PartialEq)]
pub enum Fate {
    /// Its claim, rebuilt, to be written to the table.
    Adopt(Box<NodeClaim>),
    /// Terminate it and delete its Node, if any.
    Collect {
        /// Its Node.
        node: Option<String>,
        /// Why.
        why: Collect,
    },
    /// To be collected, but not this run: the cap on terminations is reached.
    HeldBack {
        /// Its Node.
        node: Option<String>,
        /// Why it is to be collected.
        why: Collect,
    },
    /// Left alone this run.
    Keep(Wait),
}

/// The stack's live fleet: its pending and running instances, claimed or not (pure).
pub fn fleet_size(instances: &[Instance], config: &LifecycleConfig) -> usize {
    instances
        .iter()
        .filter(|i| owner(i, config.stack.as_deref()) == Owner::ThisStack)
        .filter(|i| matches!(i.state, InstanceState::Pending | InstanceState::Running))
        .count()
}

/// The most instances one run terminates: `percent` of the stack's live fleet
/// (pending and running instances, claimed or not), rounded up, and at least
/// one, so a lone leak is still collected (pure).
pub fn termination_cap(fleet: usize, percent: u32) -> usize {
    let percent = percent.min(100) as usize;
    fleet.saturating_mul(percent).div_ceil(100).max(1)
}

fn is_registered(n: &Node) -> bool {
    !n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == labels::UNREGISTERED_TAINT_KEY))
}

fn is_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn label<'a>(n: &'a Node, key: &str) -> Option<&'a str> {
    n.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

fn annotation(n: &Node, key: &str) -> Option<String> {
    n.metadata.annotations.as_ref()?.get(key).cloned()
}

fn offering_price(catalog: Option<&Catalog>, i: &Instance) -> Option<f64> {
    let zone = i.zone.as_deref()?;
    catalog?
        .instance_types
        .iter()
        .find(|t| t.name == i.instance_type)?
        .offerings
        .iter()
        .find(|o| o.zone == zone && o.capacity_type == i.capacity_type)
        .map(|o| o.price)
}

/// The claim of a running instance whose Node registered, rebuilt from the
/// instance (id, type, zone, capacity type, reservation, launch time, tags:
/// claim, pool, class) and the Node (name, providerID, labels, taints, drift
/// hashes); Initialized when the Node says so, else Registered, so the next
/// run initializes it. None when neither names its claim or pool (pure).
pub fn rebuilt_claim(i: &Instance, node: &Node, now: Timestamp, catalog: Option<&Catalog>) -> Option<NodeClaim> {
    let name = i.node_claim().or(label(node, labels::NODECLAIM))?;
    let pool = i.node_pool().or(label(node, labels::NODEPOOL))?;
    let class = i
        .tags
        .get(labels::EC2NODECLASS)
        .map(String::as_str)
        .or(label(node, labels::EC2NODECLASS))
        .unwrap_or(pool);
    let initialized = label(node, labels::INITIALIZED) == Some("true");
    // Registration recomputes what the instance decides; the rest (the
    // pool's template labels) is the claim's own.
    let own_labels: BTreeMap<String, String> = node
        .metadata
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| !labels::set_from_instance(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| {
            t.key != labels::UNREGISTERED_TAINT_KEY
                && !labels::EPHEMERAL_TAINT_KEYS.contains(&t.key.as_str())
                && t.key != crate::kubernetes::pods::DISRUPTED_TAINT_KEY
        })
        .filter_map(crate::apis::Taint::from_k8s)
        .collect();
    let zone = i.zone.clone().or(label(node, labels::ZONE).map(String::from));
    let pinned = |key: &str, value: &str| NodeSelectorRequirementWithMinValues {
        key: key.into(),
        operator: crate::requirements::Operator::In,
        values: vec![value.into()],
        min_values: None,
    };
    let mut requirements = vec![
        pinned(labels::NODEPOOL, pool),
        pinned(labels::INSTANCE_TYPE, &i.instance_type),
        pinned(labels::CAPACITY_TYPE, &i.capacity_type),
    ];
    if let Some(z) = &zone {
        requirements.push(pinned(labels::ZONE, z));
    }
    let launched = i.launch_time.unwrap_or(now);
    Some(NodeClaim {
        requirements,
        instance_type_options: vec![i.instance_type.clone()],
        labels: own_labels,
        taints,
        phase: if initialized {
            Phase::Initialized
        } else {
            Phase::Registered
        },
        instance_id: Some(i.id.clone()),
        provider_id: node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.clone())
            .or_else(|| zone.as_ref().map(|z| format!("aws:///{z}/{}", i.id))),
        instance_type: Some(i.instance_type.clone()),
        zone,
        capacity_type: Some(i.capacity_type.clone()),
        price: offering_price(catalog, i),
        capacity_reservation: i.capacity_reservation.clone(),
        node_name: node.metadata.name.clone(),
        nodepool_hash: annotation(node, labels::NODEPOOL_HASH_ANNOTATION),
        nodeclass_hash: annotation(node, labels::EC2NODECLASS_HASH_ANNOTATION),
        replacement_for: annotation(node, labels::REPLACEMENT_ANNOTATION),
        timestamps: Timestamps {
            created: Some(launched),
            launched: Some(launched),
            registered: Some(created(node).unwrap_or(now)),
            initialized: initialized.then_some(now),
            ..Timestamps::default()
        },
        ..NodeClaim::pending(name, pool, class)
    })
}

/// The fate of every claimless instance of this stack (`config.stack`), in
/// instance id order: adopt, collect, keep, or hold back beyond
/// [`termination_cap`] (the oldest are collected first). Instances a claim
/// names, or tagged with a claim whose launch is in flight, are not in it (pure).
pub fn judge(seen: &Observed<'_>, config: &LifecycleConfig) -> Vec<(String, Fate)> {
    let by_name: BTreeMap<&str, &NodeClaim> = seen.claims.iter().map(|c| (c.name.as_str(), c)).collect();
    let claimed: BTreeSet<&str> = seen.claims.iter().filter_map(|c| c.instance_id.as_deref()).collect();
    let nodes: BTreeMap<&str, &Node> = seen.nodes.iter().filter_map(|n| Some((node_instance(n)?, n))).collect();
    let mut ours: Vec<&Instance> = seen
        .instances
        .iter()
        .filter(|i| owner(i, config.stack.as_deref()) == Owner::ThisStack)
        .collect();
    ours.sort_by(|a, b| a.id.cmp(&b.id));
    let fleet = fleet_size(seen.instances, config);
    let mut fates: Vec<(&Instance, Fate)> = Vec::new();
    for i in ours {
        let tagged = i.node_claim().and_then(|n| by_name.get(n));
        // Tagged with a claim that has not recorded an instance yet: a launch in flight.
        let in_flight = tagged.is_some_and(|c| c.instance_id.as_deref().is_none_or(|id| id == i.id));
        if in_flight || claimed.contains(i.id.as_str()) {
            continue;
        }
        let duplicate = tagged.is_some();
        let node = nodes.get(i.id.as_str()).copied();
        let collect = |why| Fate::Collect {
            node: node.map(node_name),
            why,
        };
        let fate = if !older_than(i.launch_time, seen.now, config.leak_window) {
            Fate::Keep(Wait::Young)
        } else if i.state == InstanceState::ShuttingDown {
            Fate::Keep(Wait::ShuttingDown)
        } else if !matches!(i.state, InstanceState::Pending | InstanceState::Running) {
            collect(Collect::NotRunning)
        } else {
            match node.filter(|n| is_registered(n)) {
                Some(_) if duplicate => Fate::Keep(Wait::NameTaken),
                Some(n) if i.state == InstanceState::Running && is_ready(n) => {
                    match rebuilt_claim(i, n, seen.now, seen.catalog) {
                        Some(c) => Fate::Adopt(Box::new(c)),
                        None => Fate::Keep(Wait::Unnamed),
                    }
                }
                Some(_) => Fate::Keep(Wait::NotReady),
                None if duplicate => collect(Collect::Duplicate),
                None if older_than(i.launch_time, seen.now, config.registration_timeout) => {
                    collect(Collect::NeverJoined)
                }
                None => Fate::Keep(Wait::Joining),
            }
        };
        fates.push((i, fate));
    }
    let cap = termination_cap(fleet, config.collect_max_percent);
    let mut to_collect: Vec<usize> = (0..fates.len())
        .filter(|k| matches!(fates[*k].1, Fate::Collect { .. }))
        .collect();
    to_collect.sort_by(|a, b| {
        let (a, b) = (fates[*a].0, fates[*b].0);
        a.launch_time.cmp(&b.launch_time).then_with(|| a.id.cmp(&b.id))
    });
    for k in to_collect.into_iter().skip(cap) {
        if let Fate::Collect { node, why } = fates[k].1.clone() {
            fates[k].1 = Fate::HeldBack { node, why };
        }
    }
    fates.into_iter().map(|(i, f)| (i.id.clone(), f)).collect()
}

/// Event reason: a node's claim was rebuilt from its instance and Node.
pub const ADOPTED: &str = "Adopted";
/// Event reason: garbage collection left instances for later runs (the cap).
pub const COLLECTION_LIMITED: &str = "GarbageCollectionLimited";

/// `Adopted`, on the node: its claim was missing from the state table and is rebuilt.
pub fn adopted_event(node: &str, claim: &NodeClaim) -> EventSpec {
    EventSpec {
        object: node_name_ref(node),
        type_: EventType::Normal,
        reason: ADOPTED.into(),
        message: format!(
            "Node and instance {} had no NodeClaim in the state table: nodeclaim/{} rebuilt from them ({:?})",
            claim.instance_id.as_deref().unwrap_or("?"),
            claim.name,
            claim.phase
        ),
    }
}

/// `GarbageCollectionLimited`, a warning on the NodePool: `held` of its
/// instances are due for collection but wait, as one run terminates at most `cap`.
pub fn held_event(node_pool: &str, held: usize, cap: usize) -> EventSpec {
    EventSpec {
        object: k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("karpenter.sh/v1".into()),
            kind: Some("NodePool".into()),
            name: Some(node_pool.into()),
            ..Default::default()
        },
        type_: EventType::Warning,
        reason: COLLECTION_LIMITED.into(),
        message: format!(
            "{held} of this pool's instances with no NodeClaim are due for termination and wait \
             for later sweeps: one sweep terminates at most {cap}"
        ),
    }
}

#[cfg(test)]
mod tests;
