//! Nominations (Karpenter's `Nominate` / `IsNominated`): a node that the
//! last scheduling simulation gave pending pods is left alone by every
//! voluntary method for a while, so the pods find it when they bind.
//!
//! A pass nominates from two sources: the nominations `provision` recorded
//! in the state table (live for Karpenter's window, [`window`]), handed in by
//! the sweep, and the pass's own placement of the snapshot's pending pods,
//! solved as provisioning solves them (existing capacity first). That
//! placement is then held in the pass's compiled snapshot, so no what-if of
//! the pass moves pods into room the pending pods were given. A pending pod
//! that fits on no existing node or in-flight claim nominates nothing and
//! holds nothing back.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use jiff::Timestamp;

use crate::nodeclaim::NodeClaim;
use crate::scheduling::{Compiled, Plan, SolveOptions, TargetKind};
use crate::state::NominationRecord;

/// Karpenter's floor for the nomination window.
const WINDOW_FLOOR: Duration = Duration::from_secs(10);

/// How long a nomination lasts, from the batch's maximum duration (Karpenter:
/// twice `BATCH_MAX_DURATION`, at least 10 s; 20 s with the defaults).
pub fn window(batch_max: Duration) -> Duration {
    (batch_max * 2).max(WINDOW_FLOOR)
}

/// Why a node is nominated: the pending pods a scheduling simulation put on it.
#[derive(Debug, Clone, PartialEq)]
pub struct Nomination {
    /// One of the pods (`namespace/name`), to name in messages.
    pub pod: String,
    /// How many pods.
    pub pods: usize,
    /// Until when `provision`'s nomination lasts; `None` for this pass's own placement.
    pub until: Option<Timestamp>,
}

impl fmt::Display for Nomination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "nominated for pending pod {}", self.pod)?;
        if self.pods > 1 {
            write!(f, " and {} more", self.pods - 1)?;
        }
        match self.until {
            Some(t) => write!(f, " by provisioning, until {t}"),
            None => Ok(()),
        }
    }
}

/// Places the pending pods of `compiled` as provisioning would and holds the
/// placements onto existing capacity in it ([`Compiled::hold_pending`]);
/// returns the nodes (not claims: those are not disrupted) that received
/// pods, with their nomination.
pub(crate) fn place_pending(compiled: &mut Compiled, deadline: Option<Instant>) -> BTreeMap<String, Nomination> {
    let plan = compiled.solve(&SolveOptions {
        deadline,
        ..SolveOptions::default()
    });
    compiled.hold_pending(&plan);
    of_plan(&plan)
}

/// The nodes of `plan`'s placements onto existing nodes, with their pods.
fn of_plan(plan: &Plan) -> BTreeMap<String, Nomination> {
    plan.existing
        .iter()
        .filter(|e| e.kind == TargetKind::Node)
        .filter_map(|e| {
            let mut pods: Vec<String> = e.pods.iter().map(ToString::to_string).collect();
            pods.sort();
            Some((
                e.name.clone(),
                Nomination {
                    pod: pods.first()?.clone(),
                    pods: pods.len(),
                    until: None,
                },
            ))
        })
        .collect()
}

/// The recorded nominations live at `now`, by node: a nominated in-flight
/// claim nominates the node it became (by `claims`); expired ones and claims
/// without a node nominate nothing (pure).
pub fn live(records: &[NominationRecord], claims: &[NodeClaim], now: Timestamp) -> BTreeMap<String, Nomination> {
    let node_of: BTreeMap<&str, &str> = claims
        .iter()
        .filter_map(|c| Some((c.name.as_str(), c.node_name.as_deref()?)))
        .collect();
    let mut out: BTreeMap<String, Nomination> = BTreeMap::new();
    for r in records {
        let Ok(until) = Timestamp::from_millisecond(r.until_ms) else {
            continue;
        };
        if until <= now {
            continue;
        }
        let node = match r.kind {
            TargetKind::Node => r.target.as_str(),
            TargetKind::NodeClaim => match node_of.get(r.target.as_str()) {
                Some(n) => n,
                None => continue,
            },
        };
        let n = Nomination {
            pod: r.pod.clone(),
            pods: r.pods,
            until: Some(until),
        };
        // The longest-lived nomination of a node names it.
        match out.get(node) {
            Some(old) if old.until >= n.until => {}
            _ => {
                out.insert(node.to_string(), n);
            }
        }
    }
    out
}

/// The nominations a provisioning solve makes (pure): one per existing node
/// or in-flight claim that `plan` gave pending pods, until `now + window`.
pub fn records(plan: &Plan, now: Timestamp, window: Duration) -> Vec<NominationRecord> {
    let until = now
        .checked_add(jiff::SignedDuration::try_from(window).unwrap_or(jiff::SignedDuration::ZERO))
        .unwrap_or(now);
    plan.existing
        .iter()
        .filter_map(|e| {
            let mut pods: Vec<String> = e.pods.iter().map(ToString::to_string).collect();
            pods.sort();
            Some(NominationRecord {
                target: e.name.clone(),
                kind: e.kind,
                pod: pods.first()?.clone(),
                pods: pods.len(),
                until_ms: until.as_millisecond(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
