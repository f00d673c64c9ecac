//! What to do about one instance named by an event (pure): the event's kind,
//! the instance's NodeClaim (None: not nodesmith's), the configuration, `now`.

use jiff::{SignedDuration, Timestamp};

use super::event::{Event, Kind, NOTICE};
use crate::catalog::OfferingKey;
use crate::draining::DrainPolicy;
use crate::nodeclaim::{NodeClaim, Phase};
use crate::termination_grace;

/// How close to the deadline a drain stops honouring PDBs and do-not-disrupt:
/// the cloud takes the node at the deadline whatever we do, so the last
/// seconds go to getting every pod off while the kubelet can still stop it.
pub const FORCE_BEFORE_DEADLINE: SignedDuration = SignedDuration::from_secs(30);

/// What a rebalance recommendation does (`NODESMITH_REBALANCE`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RebalanceMode {
    /// Acknowledge and log it, do nothing: Karpenter's behaviour, so the default.
    #[default]
    Ignore,
    /// Taint the node and launch a replacement; leave the pods where they are.
    Replace,
    /// Taint, launch a replacement and drain gracefully.
    Drain,
}

impl std::str::FromStr for RebalanceMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "ignore" | "" => Ok(RebalanceMode::Ignore),
            "replace" => Ok(RebalanceMode::Replace),
            "drain" => Ok(RebalanceMode::Drain),
            other => Err(format!(
                "NODESMITH_REBALANCE={other:?}: expected ignore, replace or drain"
            )),
        }
    }
}

/// The steps for one instance.
#[derive(Clone, Debug, PartialEq)]
pub struct Steps {
    /// The instance's claim.
    pub claim: String,
    /// Its Node, when registered.
    pub node: Option<String>,
    /// Taint the node `karpenter.sh/disrupted:NoSchedule` and move the claim to Draining.
    pub taint: bool,
    /// Solve for the node's pods with the node removed and launch what that needs.
    pub replace: bool,
    /// Drain the node.
    pub drain: Option<DrainPolicy>,
    /// Mark this offering unavailable.
    pub mark_unavailable: Option<OfferingKey>,
    /// The capacity is gone: delete the Node, remove the claim, ask for a solve.
    pub remove: bool,
    /// Why, for logs and Events.
    pub reason: &'static str,
}

/// What to do about one instance.
#[derive(Clone, Debug, PartialEq)]
pub enum Reaction {
    /// Nothing (acknowledge the message).
    Ignore {
        /// Why.
        why: String,
    },
    /// Act.
    Act(Steps),
}

/// Decides for one instance of `event` (pure).
pub fn decide(event: &Event, claim: Option<&NodeClaim>, rebalance: RebalanceMode, now: Timestamp) -> Reaction {
    let Some(claim) = claim else {
        return Reaction::Ignore {
            why: "no NodeClaim owns the instance (not nodesmith's)".into(),
        };
    };
    // A claim already on its way out was replaced when that began; it is not replaced twice.
    let first_notice = !matches!(claim.phase, Phase::Draining | Phase::Terminating);
    let base = Steps {
        claim: claim.name.clone(),
        node: claim.node_name.clone(),
        taint: claim.node_name.is_some(),
        replace: first_notice,
        drain: None,
        mark_unavailable: None,
        remove: false,
        reason: "",
    };
    let offering = || match (&claim.instance_type, &claim.zone, &claim.capacity_type) {
        (Some(t), Some(z), Some(c)) => Some(OfferingKey::new(t, z, c)),
        _ => None,
    };
    let notice_deadline = event.deadline.or_else(|| now.checked_add(NOTICE).ok());
    // The node's terminationGracePeriod bounds an interruption's drain too.
    let bound = termination_grace::deadline(now, termination_grace::period(Some(claim), None));
    let forced_drain = DrainPolicy {
        deadline: termination_grace::earlier(notice_deadline, bound),
        force_from: notice_deadline.and_then(|d| d.checked_sub(FORCE_BEFORE_DEADLINE).ok()),
    };
    let graceful = DrainPolicy {
        deadline: termination_grace::earlier(event.deadline, bound),
        force_from: None,
    };
    let steps = match &event.kind {
        Kind::SpotInterruption | Kind::CapacityReservationInterruption => Steps {
            drain: Some(forced_drain),
            mark_unavailable: offering(),
            reason: if event.kind == Kind::SpotInterruption {
                "spot-interruption"
            } else {
                "capacity-reservation-interruption"
            },
            ..base
        },
        Kind::RebalanceRecommendation => match rebalance {
            RebalanceMode::Ignore => {
                return Reaction::Ignore {
                    why: "rebalance recommendations are ignored (NODESMITH_REBALANCE=ignore)".into(),
                };
            }
            RebalanceMode::Replace => Steps {
                reason: "rebalance-recommendation",
                ..base
            },
            RebalanceMode::Drain => Steps {
                drain: Some(graceful),
                reason: "rebalance-recommendation",
                ..base
            },
        },
        Kind::ScheduledChange => Steps {
            drain: Some(graceful),
            reason: "scheduled-change",
            ..base
        },
        Kind::StateChange { state } if super::event::is_gone_state(state) => Steps {
            // Nothing replaces capacity that is already gone: the solve request
            // places its pods (on a replacement already in flight, if any).
            taint: claim.node_name.is_some(),
            replace: false,
            drain: Some(DrainPolicy {
                deadline: Some(now),
                force_from: None,
            }),
            remove: true,
            reason: "instance-state-change",
            ..base
        },
        Kind::StateChange { state } => {
            return Reaction::Ignore {
                why: format!("the instance is {state}"),
            };
        }
        Kind::Unknown { error } => {
            return Reaction::Ignore { why: error.clone() };
        }
    };
    Reaction::Act(steps)
}
