//! A managed node as the methods see it: its pool, price, age, pods and the
//! facts the protections look at, read once per pass.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;

use crate::apis::NodePool;
use crate::catalog::Catalog;
use crate::kubernetes::{drain, pods};
use crate::labels;
use crate::scheduling::{ExistingNode, PodRef};
use crate::snapshot::Snapshot;

use super::{DecideOptions, Held};

/// A node that carries `karpenter.sh/nodepool` and whose pool exists.
#[derive(Debug, Clone)]
pub(crate) struct Candidate<'a> {
    /// The node's name.
    pub name: String,
    /// The node and its pods.
    pub node: &'a ExistingNode,
    /// Its NodePool.
    pub pool: &'a NodePool,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its annotations.
    pub annotations: BTreeMap<String, String>,
    /// Launch time (`metadata.creationTimestamp`).
    pub created: Option<Timestamp>,
    /// The newest pod's creation, or the node's own.
    pub last_pod_event: Option<Timestamp>,
    /// Hourly price of the offering its labels name, if the catalog has it.
    pub price: Option<f64>,
    /// Tainted `karpenter.sh/disrupted`: already being disrupted.
    pub disrupting: bool,
    /// The node being disrupted whose pods are to move onto this one, its replacement.
    pub receiving_from: Option<String>,
    /// Karpenter's disruption cost: its evicted pods' eviction costs times
    /// the share of its lifetime left (consolidation takes cheap ones first).
    pub disruption_cost: f64,
}

impl<'a> Candidate<'a> {
    /// Pods a drain would evict: not DaemonSet, mirror or finished pods.
    pub fn evicted(&self) -> impl Iterator<Item = &'a Pod> + use<'a> {
        self.node.pods.iter().filter(|p| drain::moves_with_node(p))
    }

    /// True when only DaemonSet, mirror and finished pods run here.
    pub fn is_empty(&self) -> bool {
        self.evicted().next().is_none()
    }

    /// The node's own do-not-disrupt annotation, in force at `now` (a
    /// duration counts from the node's creation).
    pub fn do_not_disrupt(&self, now: Timestamp) -> bool {
        crate::do_not_disrupt::protects(Some(&self.annotations), self.created, now)
    }

    /// The first running pod whose do-not-disrupt is in force at `now`.
    pub fn do_not_disrupt_pod(&self, now: Timestamp) -> Option<PodRef> {
        self.node
            .pods
            .iter()
            .filter(|p| !pods::is_terminal(p))
            .find(|p| pods::has_do_not_disrupt(p, now))
            .map(PodRef::of)
    }

    /// The node's `terminationGracePeriod` (its pool's): with one, drift
    /// and expiry go ahead past do-not-disrupt pods and blocking PDBs, as
    /// its termination ends by then whatever they say.
    pub fn termination_grace_period(&self) -> Option<Duration> {
        crate::termination_grace::period(None, Some(self.pool))
    }

    /// The first evicted pod with no owner: it would not come back.
    pub fn uncontrolled_pod(&self) -> Option<PodRef> {
        self.evicted()
            .find(|p| p.metadata.owner_references.as_ref().is_none_or(Vec::is_empty))
            .map(PodRef::of)
    }

    /// Since when the node has been consolidatable: `consolidateAfter` after
    /// its last pod event (or its creation), once that is past; None before,
    /// or with consolidation off.
    pub fn consolidatable_since(&self, now: Timestamp) -> Option<Timestamp> {
        self.consolidatable(now).ok()?;
        let after = jiff::SignedDuration::try_from(self.pool.spec.disruption.consolidate_after.duration()?).ok()?;
        self.last_pod_event.or(self.created)?.checked_add(after).ok()
    }

    /// Whether `consolidateAfter` has passed since the node's last pod event
    /// (shared by both consolidation methods), else the rule that holds it.
    pub fn consolidatable(&self, now: Timestamp) -> Result<(), Held> {
        let Some(after) = self.pool.spec.disruption.consolidate_after.duration() else {
            return Err(Held::ConsolidationDisabled);
        };
        if let Some(last) = self.last_pod_event
            && let Ok(span) = jiff::SignedDuration::try_from(after)
            && let Ok(ready) = last.checked_add(span)
            && ready > now
        {
            return Err(Held::ConsolidateAfter {
                remaining_secs: ready.duration_since(now).as_secs().unsigned_abs(),
            });
        }
        Ok(())
    }
}

/// Karpenter's eviction cost of one pod: 1, raised by its priority and its
/// `controller.kubernetes.io/pod-deletion-cost`, kept within [-10, 10].
pub(crate) fn eviction_cost(p: &Pod) -> f64 {
    let deletion = p
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(pods::DELETION_COST))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    let priority = p.spec.as_ref().and_then(|s| s.priority).map_or(0.0, f64::from);
    (1.0 + deletion / 2f64.powi(27) + priority / 2f64.powi(25)).clamp(-10.0, 10.0)
}

/// The share of a node's `expireAfter` still ahead of it (1 without expiry).
pub(crate) fn lifetime_remaining(created: Option<Timestamp>, expire_after: Option<Duration>, now: Timestamp) -> f64 {
    let (Some(created), Some(expire)) = (created, expire_after) else {
        return 1.0;
    };
    let age = now.duration_since(created).as_secs_f64().max(0.0);
    let total = expire.as_secs_f64();
    if total <= 0.0 {
        0.0
    } else {
        (1.0 - age / total).clamp(0.0, 1.0)
    }
}

/// The hourly price of the offering named by the node's instance-type, zone
/// and capacity-type labels.
pub(crate) fn price(catalog: &Catalog, labels: &BTreeMap<String, String>) -> Option<f64> {
    let it = labels.get(labels::INSTANCE_TYPE)?;
    let zone = labels.get(labels::ZONE)?;
    let ct = labels.get(labels::CAPACITY_TYPE)?;
    let info = match catalog.instance_types.binary_search_by(|t| t.name.as_str().cmp(it)) {
        Ok(i) => &catalog.instance_types[i],
        Err(_) => catalog.instance_types.iter().find(|t| &t.name == it)?,
    };
    info.offerings
        .iter()
        .find(|o| &o.zone == zone && &o.capacity_type == ct)
        .map(|o| o.price)
}

/// Every managed node of the snapshot whose pool exists and which is
/// registered ([`DecideOptions::registered`]), by name, each with the node it
/// replaces if it is a replacement of a disruption in progress.
pub(crate) fn collect<'a>(s: &'a Snapshot, options: &DecideOptions) -> Vec<Candidate<'a>> {
    let pools: BTreeMap<&str, &NodePool> = s.node_pools.iter().map(|p| (p.name(), p)).collect();
    let mut out: Vec<Candidate> = s
        .nodes
        .iter()
        .filter_map(|n| {
            let labels = n.node.metadata.labels.clone().unwrap_or_default();
            let pool = *pools.get(labels.get(labels::NODEPOOL)?.as_str())?;
            let tainted = |key: &str| {
                n.node
                    .spec
                    .as_ref()
                    .and_then(|sp| sp.taints.as_ref())
                    .is_some_and(|ts| ts.iter().any(|t| t.key == key))
            };
            let name = n.node.metadata.name.clone().unwrap_or_default();
            // Not registered yet: no claim names it, so nothing may take it
            // or count it against a budget (Karpenter considers registered,
            // initialized nodes only); registration's timeout deals with it.
            let unregistered = match &options.registered {
                Some(registered) => !registered.contains(&name),
                None => tainted(labels::UNREGISTERED_TAINT_KEY),
            };
            if unregistered {
                return None;
            }
            let created = n.node.metadata.creation_timestamp.as_ref().map(|t| t.0);
            let newest_pod = n
                .pods
                .iter()
                .filter_map(|p| p.metadata.creation_timestamp.as_ref().map(|t| t.0))
                .max();
            let disrupting = tainted(pods::DISRUPTED_TAINT_KEY);
            let expire_after = pool.spec.template.spec.expire_after.duration();
            let disruption_cost = n
                .pods
                .iter()
                .filter(|p| drain::moves_with_node(p))
                .map(eviction_cost)
                .sum::<f64>()
                * lifetime_remaining(created, expire_after, s.now);
            Some(Candidate {
                receiving_from: options.receiving.get(&name).cloned(),
                name,
                node: n,
                pool,
                price: price(&s.catalog, &labels),
                labels,
                annotations: n.node.metadata.annotations.clone().unwrap_or_default(),
                created,
                last_pod_event: newest_pod.or(created),
                disrupting,
                disruption_cost,
            })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}
