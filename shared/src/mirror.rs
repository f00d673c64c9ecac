//! What `kubectl` shows of nodesmith, as it shows Karpenter: every claim of
//! the state table as a `karpenter.sh/v1` NodeClaim object, and each
//! NodePool's `status` (resources, node count, conditions). DynamoDB stays
//! the source of truth; this module computes the objects from it (pure),
//! launch writes a claim's object once its instance exists and the sweep
//! repairs them all ([`write`]), and a failed write never holds up real
//! work: the next sweep writes again.
//!
//! A NodeClaim object carries Karpenter's termination finalizer, so `kubectl
//! delete nodeclaim` marks it for deletion and the sweep drains and
//! terminates its node as Karpenter does ([`crate::lifecycle::termination`]);
//! the finalizer comes off once the claim is gone.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::ObjectMeta;

use crate::apis::ec2nodeclass::Condition;
use crate::apis::nodeclaim::{NodeClaimObject, NodeClaimObjectSpec, NodeClaimObjectStatus, ResourceRequests};
use crate::apis::nodepool::{NodeClassReference, NodePoolStatus};
use crate::apis::{EC2NodeClass, NodePool};
use crate::disruption::NodeState;
use crate::labels;
use crate::nodeclaim::{NodeClaim, Phase};
use crate::quantity::Quantity;

pub use crate::labels::{MANAGED_BY, MANAGED_BY_LABEL};

/// Karpenter's NodeClaim and NodePool condition types.
pub mod condition_types {
    /// The instance exists.
    pub const LAUNCHED: &str = "Launched";
    /// Its Node joined the cluster.
    pub const REGISTERED: &str = "Registered";
    /// Its Node is ready, its startup taints gone.
    pub const INITIALIZED: &str = "Initialized";
    /// A NodeClaim: launched, registered and initialized. A NodePool: valid and its class ready.
    pub const READY: &str = "Ready";
    /// The claim is being drained and terminated.
    pub const DISRUPTION_REASON: &str = "DisruptionReason";
    /// Its node no longer matches what its NodePool and EC2NodeClass would launch now.
    pub const DRIFTED: &str = "Drifted";
    /// `consolidateAfter` has passed since its node's last pod event.
    pub const CONSOLIDATABLE: &str = "Consolidatable";
    /// The NodePool's spec passes validation.
    pub const VALIDATION_SUCCEEDED: &str = "ValidationSucceeded";
    /// The NodePool's EC2NodeClass exists and is Ready.
    pub const NODE_CLASS_READY: &str = "NodeClassReady";
}

/// RFC 3339 in whole seconds, as Kubernetes writes `metav1.Time`.
fn k8s_time(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn condition(type_: &str, ok: Option<bool>, reason: &str, message: &str, since: Option<Timestamp>) -> Condition {
    let status = match ok {
        Some(true) => "True",
        Some(false) => "False",
        None => "Unknown",
    };
    Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message: message.to_string(),
        // The claim's own times, so an unchanged claim gives an unchanged
        // status (no write); a time is required, and the epoch is stable.
        last_transition_time: k8s_time(since.unwrap_or(Timestamp::UNIX_EPOCH)),
        observed_generation: None,
    }
}

/// A Node's status resource list, as quantities (an unreadable one is left out).
fn resource_list(
    list: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
) -> BTreeMap<String, Quantity> {
    list.into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), Quantity::parse(&v.0).ok()?)))
        .collect()
}

/// The reference from a claim's object to its NodePool, as Karpenter sets
/// it (a NodePool deleted takes its NodeClaims with it); None until the
/// pool has a uid. No `blockOwnerDeletion`: that would need update rights
/// on the pool's finalizers where the API server enforces them.
fn owner(pool: &NodePool) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: "karpenter.sh/v1".to_string(),
        kind: "NodePool".to_string(),
        name: pool.name().to_string(),
        uid: pool.metadata.uid.clone()?,
        ..OwnerReference::default()
    })
}

/// Each pool's summed capacity of its registered nodes, with `nodes` (their
/// count) among the resources as Karpenter counts it there, in one pass
/// over the claims (pure). A pool without registered nodes is absent: see
/// [`resources_of`].
pub fn pool_resources(claims: &[&NodeClaim], nodes: &[Node]) -> BTreeMap<String, BTreeMap<String, Quantity>> {
    let nodes: BTreeMap<&str, &Node> = nodes
        .iter()
        .filter_map(|n| Some((n.metadata.name.as_deref()?, n)))
        .collect();
    let mut out: BTreeMap<String, BTreeMap<String, Quantity>> = BTreeMap::new();
    for c in claims {
        let Some(node) = c.node_name.as_deref().and_then(|n| nodes.get(n)) else {
            continue;
        };
        let resources = out.entry(c.node_pool.clone()).or_default();
        let capacity = resource_list(node.status.as_ref().and_then(|s| s.capacity.as_ref()));
        for (k, v) in capacity
            .into_iter()
            .chain([("nodes".to_string(), Quantity::from_units(1))])
        {
            let sum = resources.entry(k).or_insert(Quantity::ZERO);
            *sum = Quantity(sum.0.saturating_add(v.0));
        }
    }
    out
}

/// One pool's entry of [`pool_resources`]; `nodes` 0 when it has no registered node.
pub fn resources_of(all: &BTreeMap<String, BTreeMap<String, Quantity>>, pool: &str) -> BTreeMap<String, Quantity> {
    all.get(pool)
        .cloned()
        .unwrap_or_else(|| BTreeMap::from([("nodes".to_string(), Quantity::ZERO)]))
}

/// The conditions of a claim's object (pure): each of Launched, Registered
/// and Initialized True from the moment the claim reached it, Ready once all
/// three are, and DisruptionReason while it is drained or terminated.
fn claim_conditions(claim: &NodeClaim) -> Vec<Condition> {
    let t = &claim.timestamps;
    // A claim written before its step's time was kept still shows the step reached.
    let launched = t.launched.or_else(|| claim.instance_id.as_ref().and(t.created));
    let registered = t.registered.or_else(|| claim.node_name.as_ref().and(launched));
    let initialized = t
        .initialized
        .or_else(|| (claim.phase == Phase::Initialized).then_some(registered).flatten());
    let steps = [
        (condition_types::LAUNCHED, launched, "AwaitingLaunch"),
        (condition_types::REGISTERED, registered, "AwaitingRegistration"),
        (condition_types::INITIALIZED, initialized, "AwaitingInitialization"),
    ];
    let mut out: Vec<Condition> = steps
        .iter()
        .map(|(type_, at, waiting)| match at {
            Some(at) => condition(type_, Some(true), type_, "", Some(*at)),
            None => condition(type_, None, waiting, "", t.created),
        })
        .collect();
    let ready = match steps.iter().find(|(_, at, _)| at.is_none()) {
        Some((type_, _, waiting)) => condition(
            condition_types::READY,
            None,
            waiting,
            &format!("{type_}=Unknown"),
            t.created,
        ),
        None => condition(
            condition_types::READY,
            Some(true),
            condition_types::READY,
            "",
            initialized,
        ),
    };
    out.push(ready);
    if matches!(claim.phase, Phase::Draining | Phase::Terminating) {
        out.push(condition(
            condition_types::DISRUPTION_REASON,
            Some(true),
            "Disrupting",
            "the node is drained, then terminated",
            t.draining.or(t.terminating),
        ));
    }
    out
}

/// The NodeClaim object mirroring `claim` (pure): its Node (when it has
/// registered) gives the capacity; its NodePool (when it still exists) the
/// `expireAfter`. Labels as Karpenter's: the claim's, its pool, and once
/// launched the instance type, zone and capacity type.
pub fn object(claim: &NodeClaim, node: Option<&Node>, pool: Option<&NodePool>) -> NodeClaimObject {
    let mut labels_ = claim.labels.clone();
    labels_.insert(labels::NODEPOOL.to_string(), claim.node_pool.clone());
    for (key, value) in [
        (labels::INSTANCE_TYPE, &claim.instance_type),
        (labels::ZONE, &claim.zone),
        (labels::CAPACITY_TYPE, &claim.capacity_type),
    ] {
        if let Some(v) = value {
            labels_.insert(key.to_string(), v.clone());
        }
    }
    labels_.insert(MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string());
    let mut annotations = claim.annotations.clone();
    if let Some(h) = &claim.nodepool_hash {
        annotations.insert(labels::NODEPOOL_HASH_ANNOTATION.to_string(), h.clone());
    }
    let expire_after = pool.map_or_else(crate::apis::nodepool::default_expire_after, |p| {
        p.spec.template.spec.expire_after
    });
    let status = node.and_then(|n| n.status.as_ref());
    NodeClaimObject {
        metadata: ObjectMeta {
            name: Some(claim.name.clone()),
            labels: Some(labels_),
            annotations: Some(annotations).filter(|a| !a.is_empty()),
            finalizers: Some(vec![labels::TERMINATION_FINALIZER.to_string()]),
            owner_references: pool.and_then(owner).map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        spec: NodeClaimObjectSpec {
            requirements: claim.requirements.clone(),
            node_class_ref: NodeClassReference {
                group: "karpenter.k8s.aws".to_string(),
                kind: "EC2NodeClass".to_string(),
                name: claim.node_class.clone(),
            },
            taints: claim.taints.clone(),
            startup_taints: claim.startup_taints.clone(),
            expire_after,
            termination_grace_period: claim.termination_grace_period,
            resources: Some(ResourceRequests {
                requests: claim.resources.0.clone(),
            })
            .filter(|r| !r.requests.is_empty()),
        },
        status: Some(NodeClaimObjectStatus {
            node_name: claim.node_name.clone(),
            provider_id: claim.provider_id.clone(),
            image_id: claim.image_id.clone(),
            capacity: resource_list(status.and_then(|s| s.capacity.as_ref())),
            allocatable: resource_list(status.and_then(|s| s.allocatable.as_ref())),
            conditions: claim_conditions(claim),
            last_pod_event_time: None,
        }),
    }
}

/// Whether a NodeClaim object is nodesmith's mirror.
pub fn is_ours(o: &NodeClaimObject) -> bool {
    o.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY_LABEL))
        .map(String::as_str)
        == Some(MANAGED_BY)
}

/// When `kubectl delete nodeclaim` marked the object for deletion, if it did
/// and the termination finalizer still holds it.
pub fn deleted_at(o: &NodeClaimObject) -> Option<Timestamp> {
    let held = o
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == labels::TERMINATION_FINALIZER));
    o.metadata.deletion_timestamp.as_ref().filter(|_| held).map(|t| t.0)
}

/// The writes that bring the NodeClaim objects in line with the claims.
#[derive(Debug, Default)]
pub struct Plan {
    /// Objects to create (their status is written after the create, which drops it).
    pub create: Vec<NodeClaimObject>,
    /// Existing objects whose labels, annotations or spec changed: the object as
    /// read with those and its status replaced (its resourceVersion guards the
    /// write; the status is written after it, if it changed too).
    pub update: Vec<NodeClaimObject>,
    /// Existing objects whose status alone changed: the object as read with the new status.
    pub status: Vec<NodeClaimObject>,
    /// Our objects with no claim in the listing: released (finalizer off,
    /// deleted) once a fresh read confirms the claim is gone.
    pub orphans: Vec<String>,
}

impl Plan {
    /// True when nothing is to be written.
    pub fn is_empty(&self) -> bool {
        self.create.is_empty() && self.update.is_empty() && self.status.is_empty() && self.orphans.is_empty()
    }
}

/// Whether `have` holds every entry of `want`.
fn holds(have: &Option<BTreeMap<String, String>>, want: &Option<BTreeMap<String, String>>) -> bool {
    want.iter()
        .flatten()
        .all(|(k, v)| have.as_ref().and_then(|h| h.get(k)) == Some(v))
}

/// What the NodeClaim objects are computed from.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    /// The claims to mirror.
    pub claims: &'a [&'a NodeClaim],
    /// The Nodes (a registered claim's capacity).
    pub nodes: &'a [Node],
    /// The NodePools (owner, `expireAfter`).
    pub pools: &'a [NodePool],
    /// Each node's drift and consolidatability from a disruption pass, by
    /// node; None when no pass ran: an existing object keeps its `Drifted`
    /// and `Consolidatable` conditions as they are.
    pub states: Option<&'a BTreeMap<String, NodeState>>,
}

/// The `Drifted` and `Consolidatable` conditions of a claim's object (pure):
/// from its node's state, each True since it was True on `have`, else since
/// `now` (drift) or the moment consolidateAfter passed; absent when not so,
/// as Karpenter clears them; as on `have` when the state is not known.
fn disruption_conditions(
    state: Option<Option<&NodeState>>,
    have: Option<&NodeClaimObject>,
    now: Timestamp,
) -> Vec<Condition> {
    let had = |type_: &str| {
        have.and_then(|h| h.status.as_ref())
            .into_iter()
            .flat_map(|s| s.conditions.iter())
            .find(|c| c.type_ == type_ && c.status == "True")
            .cloned()
    };
    let Some(state) = state else {
        return [condition_types::DRIFTED, condition_types::CONSOLIDATABLE]
            .iter()
            .filter_map(|t| had(t))
            .collect();
    };
    // (type, message, since) of each that holds.
    let holding = [
        state
            .and_then(|s| s.drifted.clone())
            .map(|why| (condition_types::DRIFTED, why, now)),
        state
            .and_then(|s| s.consolidatable_since)
            .map(|since| (condition_types::CONSOLIDATABLE, String::new(), since)),
    ];
    holding
        .into_iter()
        .flatten()
        .map(|(type_, message, since)| {
            let mut c = condition(type_, Some(true), type_, &message, Some(since));
            // True already: since then (a pod landing moves the last pod event, not this).
            if let Some(before) = had(type_) {
                c.last_transition_time = before.last_transition_time;
            }
            c
        })
        .collect()
}

/// What to write so that `existing` (the objects of [`is_ours`]) mirror
/// the claims of `facts` at `now` (pure). An object marked for deletion
/// keeps its spec (a deleting object's finalizers cannot be added back) but
/// still gets status.
pub fn plan(facts: &Facts<'_>, existing: &[NodeClaimObject], now: Timestamp) -> Plan {
    let Facts {
        claims,
        nodes,
        pools,
        states,
    } = *facts;
    let nodes: BTreeMap<&str, &Node> = nodes
        .iter()
        .filter_map(|n| Some((n.metadata.name.as_deref()?, n)))
        .collect();
    let pools: BTreeMap<&str, &NodePool> = pools.iter().map(|p| (p.name(), p)).collect();
    let existing: BTreeMap<&str, &NodeClaimObject> = existing
        .iter()
        .filter(|o| is_ours(o))
        .filter_map(|o| Some((o.metadata.name.as_deref()?, o)))
        .collect();
    let mut out = Plan::default();
    let mut mirrored = BTreeSet::new();
    for claim in claims {
        mirrored.insert(claim.name.as_str());
        let node = claim.node_name.as_deref().and_then(|n| nodes.get(n).copied());
        let mut want = object(claim, node, pools.get(claim.node_pool.as_str()).copied());
        let state = states.map(|s| claim.node_name.as_deref().and_then(|n| s.get(n)));
        let have = existing.get(claim.name.as_str()).copied();
        if let Some(status) = want.status.as_mut() {
            status.conditions.extend(disruption_conditions(state, have, now));
        }
        let Some(have) = have else {
            out.create.push(want);
            continue;
        };
        let deleting = have.metadata.deletion_timestamp.is_some();
        let owned = |o: &OwnerReference| have.metadata.owner_references.iter().flatten().any(|h| h == o);
        let meta_differs = !holds(&have.metadata.labels, &want.metadata.labels)
            || !holds(&have.metadata.annotations, &want.metadata.annotations)
            || !want.metadata.owner_references.iter().flatten().all(owned)
            || !have
                .metadata
                .finalizers
                .as_ref()
                .is_some_and(|f| f.iter().any(|f| f == labels::TERMINATION_FINALIZER));
        if !deleting && (meta_differs || have.spec != want.spec) {
            let mut next = (*have).clone();
            // Ours set, anyone else's kept.
            for (mine, theirs) in [
                (&want.metadata.labels, &mut next.metadata.labels),
                (&want.metadata.annotations, &mut next.metadata.annotations),
            ] {
                if let Some(mine) = mine {
                    theirs.get_or_insert_default().extend(mine.clone());
                }
            }
            let mut finalizers = next.metadata.finalizers.take().unwrap_or_default();
            if !finalizers.iter().any(|f| f == labels::TERMINATION_FINALIZER) {
                finalizers.push(labels::TERMINATION_FINALIZER.to_string());
            }
            next.metadata.finalizers = Some(finalizers);
            if let Some(mine) = &want.metadata.owner_references {
                // Ours replaces any earlier reference to a pool of that name; others stay.
                let refs = next.metadata.owner_references.get_or_insert_default();
                refs.retain(|r| !mine.iter().any(|m| m.kind == r.kind && m.name == r.name));
                refs.extend(mine.iter().cloned());
            }
            next.spec = want.spec.clone();
            next.status = want.status;
            out.update.push(next);
        } else if have.status != want.status {
            let mut next = (*have).clone();
            next.status = want.status;
            out.status.push(next);
        }
    }
    out.orphans = existing
        .keys()
        .filter(|name| !mirrored.contains(*name))
        .map(|n| n.to_string())
        .collect();
    out
}

/// A NodePool's status as Karpenter writes it (pure): the summed capacity
/// and the number of its registered nodes, and Ready from
/// ValidationSucceeded and NodeClassReady. `class` is the pool's
/// EC2NodeClass (None: it does not exist). Times of the previous status are
/// kept for conditions whose status did not change.
pub fn pool_status(
    pool: &NodePool,
    resources: &BTreeMap<String, BTreeMap<String, Quantity>>,
    class: Option<&EC2NodeClass>,
    now: Timestamp,
) -> NodePoolStatus {
    let resources = resources_of(resources, pool.name());
    let count = resources.get("nodes").map_or(0, |n| n.units_ceil());
    let validation = pool.validate().map_err(|e| e.to_string());
    let class_name = &pool.spec.template.spec.node_class_ref.name;
    let class_ready = match class {
        None => Err(format!("EC2NodeClass {class_name} not found")),
        Some(c) if !c.may_launch() => Err(format!("EC2NodeClass {class_name} is not Ready")),
        Some(_) => Ok(()),
    };
    let previous = pool.status.as_ref();
    let since = |type_: &str, status: &str| {
        previous
            .into_iter()
            .flat_map(|s| s.conditions.iter())
            .filter_map(|c| serde_json::from_value::<Condition>(c.clone()).ok())
            .find(|c| c.type_ == type_ && c.status == status)
            .map(|c| c.last_transition_time)
            .filter(|t| !t.is_empty())
            .unwrap_or_else(|| k8s_time(now))
    };
    let generation = pool.metadata.generation;
    let cond = |type_: &str, outcome: &Result<(), String>, bad_reason: &str| {
        let (status, reason, message) = match outcome {
            Ok(()) => ("True", type_.to_string(), String::new()),
            Err(m) => ("False", bad_reason.to_string(), m.clone()),
        };
        Condition {
            type_: type_.to_string(),
            status: status.to_string(),
            reason,
            message,
            last_transition_time: since(type_, status),
            observed_generation: generation,
        }
    };
    let ready = match (&validation, &class_ready) {
        (Ok(()), Ok(())) => Ok(()),
        (Err(m), _) | (_, Err(m)) => Err(m.clone()),
    };
    let conditions = [
        cond(condition_types::VALIDATION_SUCCEEDED, &validation, "ValidationFailed"),
        cond(condition_types::NODE_CLASS_READY, &class_ready, "NodeClassNotReady"),
        cond(condition_types::READY, &ready, "NotReady"),
    ]
    .iter()
    .filter_map(|c| serde_json::to_value(c).ok())
    .collect();
    NodePoolStatus {
        resources,
        conditions,
        nodes: Some(count),
        node_class_observed_generation: class.and_then(|c| c.metadata.generation),
    }
}

pub mod write;

#[cfg(test)]
mod tests;
