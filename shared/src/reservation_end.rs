//! What happens to a node when its capacity reservation ends, decided as data
//! with `now` passed in (Karpenter's `capacityreservation` controllers).
//!
//! - An On-Demand Capacity Reservation that expires or is cancelled leaves its
//!   instances running outside it, at the on-demand rate: EC2 stops reporting
//!   a `CapacityReservationId` for them. Such a node is relabelled from
//!   `karpenter.sh/capacity-type: reserved` to `on-demand` and loses the
//!   reservation's labels; its claim records on-demand and the on-demand
//!   price, so plans, consolidation and `nodesmith status` price it as what
//!   it now costs ([`left_reservation`]).
//! - EC2 begins terminating a capacity block's instances 30 minutes before the
//!   block ends. From 40 minutes before the end (Karpenter: the block is then
//!   `expiring`) its nodes are drained and terminated like a deleted NodeClaim,
//!   the drain bounded by EC2's reclaim, so their pods move while the node
//!   still runs ([`block_endings`]).

use std::collections::{BTreeMap, BTreeSet};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node;

use crate::catalog::Catalog;
use crate::draining::DrainPolicy;
use crate::ec2::{Instance, InstanceState};
use crate::kubernetes::NodeUpdate;
use crate::labels;
use crate::lifecycle::termination::Begin;
use crate::nodeclaim::{NodeClaim, Phase};
use crate::registration::instance_id;

/// Why a termination began: the node's capacity block is about to end.
pub const CAPACITY_BLOCK_EXPIRING: &str = "capacity-block-expiring";
/// A capacity block's nodes are drained from this long before its end
/// (Karpenter's expiration period: 10 minutes before EC2 starts reclaiming).
pub const BLOCK_DRAIN_AHEAD: SignedDuration = SignedDuration::from_mins(40);
/// EC2 begins terminating a capacity block's instances this long before its end.
pub const BLOCK_RECLAIM_AHEAD: SignedDuration = SignedDuration::from_mins(30);

/// The labels only a node in a reservation carries.
const RESERVATION_LABELS: [&str; 2] = [
    labels::aws::CAPACITY_RESERVATION_ID,
    labels::aws::CAPACITY_RESERVATION_TYPE,
];

/// A claim whose instance runs outside the reservation it launched into.
#[derive(Debug, Clone, PartialEq)]
pub struct LeftReservation {
    /// The claim.
    pub claim: String,
    /// Its instance (the claim is demoted only while it still names it).
    pub instance: String,
    /// Its Node, when that still carries reserved labels.
    pub node: Option<String>,
    /// Whether the claim still records reserved capacity.
    pub claim_reserved: bool,
    /// The instance's on-demand $/h, when the catalog has it.
    pub on_demand_price: Option<f64>,
}

/// Whether a claim or its labels say reserved capacity (pure).
fn records_reserved(c: &NodeClaim) -> bool {
    c.capacity_type.as_deref() == Some(labels::CAPACITY_RESERVED)
        || c.capacity_reservation.is_some()
        || c.labels.get(labels::CAPACITY_TYPE).map(String::as_str) == Some(labels::CAPACITY_RESERVED)
}

/// Whether a Node's labels say reserved capacity (pure).
fn labelled_reserved(n: &Node) -> bool {
    n.metadata.labels.as_ref().is_some_and(|l| {
        l.get(labels::CAPACITY_TYPE).map(String::as_str) == Some(labels::CAPACITY_RESERVED)
            || RESERVATION_LABELS.iter().any(|k| l.contains_key(*k))
    })
}

/// The on-demand $/h of a type in a zone (pure).
fn on_demand_price(catalog: Option<&Catalog>, instance_type: &str, zone: Option<&str>) -> Option<f64> {
    let ty = catalog?.instance_types.iter().find(|t| t.name == instance_type)?;
    let zone = zone?;
    ty.offerings
        .iter()
        .find(|o| o.zone == zone && o.capacity_type == labels::CAPACITY_ON_DEMAND)
        .map(|o| o.price)
}

/// The claims whose instance left its capacity reservation (pure): a live
/// claim (not being drained or terminated: those go anyway) whose claim or
/// Node still says reserved while EC2 reports its running instance in no
/// reservation and not spot. EC2's word is the instance's own: Karpenter
/// decides from the same field.
pub fn left_reservation(
    claims: &[NodeClaim],
    nodes: &[Node],
    instances: &[Instance],
    catalog: Option<&Catalog>,
) -> Vec<LeftReservation> {
    let instances: BTreeMap<&str, &Instance> = instances.iter().map(|i| (i.id.as_str(), i)).collect();
    let nodes: BTreeMap<&str, &Node> = nodes
        .iter()
        .filter_map(|n| Some((n.spec.as_ref()?.provider_id.as_deref().and_then(instance_id)?, n)))
        .collect();
    let mut out = Vec::new();
    for c in claims {
        if !matches!(c.phase, Phase::Launched | Phase::Registered | Phase::Initialized) {
            continue;
        }
        let Some(i) = c.instance_id.as_deref().and_then(|id| instances.get(id)) else {
            continue;
        };
        let outside = matches!(i.state, InstanceState::Pending | InstanceState::Running)
            && i.capacity_reservation.is_none()
            && i.capacity_type == labels::CAPACITY_ON_DEMAND;
        if !outside {
            continue;
        }
        let node = nodes
            .get(i.id.as_str())
            .filter(|n| labelled_reserved(n))
            .and_then(|n| n.metadata.name.clone());
        let claim_reserved = records_reserved(c);
        if node.is_none() && !claim_reserved {
            continue;
        }
        out.push(LeftReservation {
            claim: c.name.clone(),
            instance: i.id.clone(),
            node,
            claim_reserved,
            on_demand_price: on_demand_price(catalog, &i.instance_type, i.zone.as_deref()),
        });
    }
    out
}

/// The write that relabels a Node out of its reservation (pure).
pub fn on_demand_labels() -> NodeUpdate {
    NodeUpdate {
        labels: BTreeMap::from([(
            labels::CAPACITY_TYPE.to_string(),
            labels::CAPACITY_ON_DEMAND.to_string(),
        )]),
        remove_labels: RESERVATION_LABELS.iter().map(|k| k.to_string()).collect(),
        ..NodeUpdate::default()
    }
}

/// The claim as it is outside its reservation, or None when it no longer
/// names `instance` or records reserved capacity (pure).
pub fn demoted(c: &NodeClaim, instance: &str, price: Option<f64>) -> Option<NodeClaim> {
    if c.instance_id.as_deref() != Some(instance) || !records_reserved(c) {
        return None;
    }
    let mut next = c.clone();
    next.capacity_type = Some(labels::CAPACITY_ON_DEMAND.to_string());
    next.capacity_reservation = None;
    next.price = price;
    if next.labels.contains_key(labels::CAPACITY_TYPE) {
        next.labels
            .insert(labels::CAPACITY_TYPE.into(), labels::CAPACITY_ON_DEMAND.into());
    }
    for k in RESERVATION_LABELS {
        next.labels.remove(k);
    }
    Some(next)
}

/// Whether a capacity block ending at `end` has its nodes drained at `now` (pure).
pub fn block_expiring(end: Timestamp, now: Timestamp) -> bool {
    end.checked_sub(BLOCK_DRAIN_AHEAD).is_ok_and(|from| now >= from)
}

/// The capacity blocks the live claims run in, by id (pure): the ids whose
/// end the sweep asks EC2 for.
pub fn blocks_in_use(claims: &[NodeClaim]) -> BTreeSet<String> {
    claims
        .iter()
        .filter(|c| matches!(c.phase, Phase::Launched | Phase::Registered | Phase::Initialized))
        .filter_map(|c| c.capacity_reservation.as_ref())
        .filter(|r| r.capacity_block())
        .map(|r| r.id.clone())
        .collect()
}

/// The terminations to begin for nodes in expiring capacity blocks (pure):
/// `ends` holds each block's end time as EC2 reports it; claims a
/// termination or disruption already has (`busy`) are left. The drain is
/// bounded by the claim's grace period and by EC2's reclaim, whichever
/// comes first; a new solve finds the pods a home elsewhere (an expiring
/// block is not offered: [`block_expiring`]).
pub fn block_endings(
    claims: &[NodeClaim],
    ends: &BTreeMap<String, Timestamp>,
    busy: &BTreeSet<String>,
    now: Timestamp,
) -> Vec<Begin> {
    let mut out = Vec::new();
    for c in claims {
        if busy.contains(&c.name) || !matches!(c.phase, Phase::Launched | Phase::Registered | Phase::Initialized) {
            continue;
        }
        let Some(r) = c.capacity_reservation.as_ref().filter(|r| r.capacity_block()) else {
            continue;
        };
        let Some(end) = ends.get(&r.id).copied().filter(|end| block_expiring(*end, now)) else {
            continue;
        };
        let grace = crate::termination_grace::period(Some(c), None);
        let reclaim = end.checked_sub(BLOCK_RECLAIM_AHEAD).ok();
        let deadline = match (crate::termination_grace::deadline(now, grace), reclaim) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        out.push(Begin {
            claim: c.name.clone(),
            node: c.node_name.clone(),
            reason: CAPACITY_BLOCK_EXPIRING,
            policy: DrainPolicy {
                deadline,
                force_from: deadline,
            },
        });
    }
    out
}

#[cfg(test)]
mod tests;
