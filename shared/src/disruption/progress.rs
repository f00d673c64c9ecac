//! The next step of a disruption in progress (pure): the sweep reads what
//! the world says about one recorded disruption ([`Facts`]) and carries out
//! what [`next`] answers, so every run resumes where the last one stopped.
//!
//! ```text
//! Tainted ──replacements launched──▶ Launching ──all Initialized──▶ Draining ──drain record gone──▶ Terminating ──▶ (record deleted)
//!    │ voluntary: do-not-disrupt pod, or pods arrived on an empty node      │ voluntary: a replacement failed
//!    └──────────────────────────▶ untainted, record deleted ◀──────────────┘
//! ```

use jiff::Timestamp;

use crate::nodeclaim::Phase;
use crate::state::{DisruptionRecord, DisruptionStep};

use super::Reason;

/// What the sweep knows about one recorded disruption, read this run.
#[derive(Debug, Clone)]
pub struct Facts<'a> {
    /// The moment.
    pub now: Timestamp,
    /// The record.
    pub record: &'a DisruptionRecord,
    /// The disrupted claim's phase (None: the claim is gone).
    pub claim: Option<Phase>,
    /// The Node exists.
    pub node_exists: bool,
    /// Each recorded replacement with its phase (None: gone, its launch failed).
    pub replacements: Vec<(String, Option<Phase>)>,
    /// A drain record exists for the claim.
    pub drain_recorded: bool,
    /// Pods a graceful drain would still have to move (not DaemonSet, mirror, finished or terminating).
    pub undrained: usize,
    /// A pod on the node asking not to be disrupted.
    pub do_not_disrupt_pod: Option<String>,
}

/// What to do next for one disruption.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Launch replacements for the node's pods (zero needed: drain at once).
    Launch,
    /// Wait for these replacements to be Initialized.
    Wait(Vec<String>),
    /// Record the drain, from when it is forced (None: never), and move the claim to Draining.
    BeginDrain {
        /// When PDBs and do-not-disrupt stop holding pods.
        force_from: Option<Timestamp>,
    },
    /// The drain module is emptying the node.
    Draining,
    /// Terminate the instance, delete the Node, remove the claim, forget the record.
    Terminate,
    /// Give the disruption up: untaint the node and forget the record.
    Abandon(String),
    /// The claim is gone: only the record is left to forget.
    Forget,
}

/// Whether a reason's pods need capacity launched before its drain (Karpenter
/// pre-spins replacements for expiry and drift; an empty node has no pods).
pub fn needs_replacements(reason: Reason) -> bool {
    matches!(reason, Reason::Expired | Reason::Drifted | Reason::Underutilized)
}

/// Which of the disruptions due a replacement launch launch together this
/// run, by index into `due` (their reasons): consolidation's replacements
/// launch alone, as its price checks would be muddled by other reasons'
/// replacements, so it waits for a run without them.
pub fn launching_together(due: &[Reason]) -> Vec<usize> {
    let (consolidating, others): (Vec<usize>, Vec<usize>) =
        (0..due.len()).partition(|i| due[*i] == Reason::Underutilized);
    if others.is_empty() { consolidating } else { others }
}

/// The next step (pure).
pub fn next(f: &Facts) -> Next {
    let r = f.record;
    let reason = r.reason;
    let forceful = reason.forceful();
    if f.claim.is_none() {
        return Next::Forget;
    }
    if r.step == DisruptionStep::Terminating || !f.node_exists {
        return Next::Terminate;
    }
    let force_from = || {
        // Repair waits for no PDB: its drain is forced from the start.
        if reason == Reason::Unhealthy {
            return Some(f.now);
        }
        r.grace_ms
            .and_then(|g| f.now.checked_add(jiff::SignedDuration::from_millis(g)).ok())
    };
    match r.step {
        DisruptionStep::Tainted => {
            // Drift with a terminationGracePeriod goes past do-not-disrupt pods (Karpenter's eventual disruption).
            let bounded = reason == Reason::Drifted && r.grace_ms.is_some();
            if !forceful {
                if let Some(p) = f.do_not_disrupt_pod.as_ref().filter(|_| !bounded) {
                    return Next::Abandon(format!("pod {p} has karpenter.sh/do-not-disrupt"));
                }
                if reason == Reason::Empty && f.undrained > 0 {
                    return Next::Abandon(format!("{} pod(s) arrived on the empty node", f.undrained));
                }
            }
            if needs_replacements(reason) && f.undrained > 0 {
                Next::Launch
            } else {
                Next::BeginDrain {
                    force_from: force_from(),
                }
            }
        }
        DisruptionStep::Launching => {
            if let Some((gone, _)) = f.replacements.iter().find(|(_, p)| p.is_none()) {
                // Expiry happens regardless: launch again; a voluntary method rolls back.
                return if forceful {
                    Next::Launch
                } else {
                    Next::Abandon(format!("replacement nodeclaim/{gone} failed to launch"))
                };
            }
            let waiting: Vec<String> = f
                .replacements
                .iter()
                .filter(|(_, p)| *p != Some(Phase::Initialized))
                .map(|(n, _)| n.clone())
                .collect();
            if waiting.is_empty() {
                Next::BeginDrain {
                    force_from: force_from(),
                }
            } else {
                Next::Wait(waiting)
            }
        }
        DisruptionStep::Draining if f.drain_recorded => Next::Draining,
        // The drain record ends when the node is empty; one that is gone while
        // pods remain expired (DynamoDB's TTL): drain again, never terminate a full node.
        DisruptionStep::Draining if f.undrained > 0 => Next::BeginDrain {
            force_from: f.record.force_from_ms.and_then(|m| Timestamp::from_millisecond(m).ok()),
        },
        DisruptionStep::Draining | DisruptionStep::Terminating => Next::Terminate,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(reason: &str, step: DisruptionStep) -> DisruptionRecord {
        DisruptionRecord {
            claim: "c".into(),
            node: "n".into(),
            reason: reason.parse().unwrap(),
            detail: String::new(),
            step,
            replacements: vec![],
            grace_ms: None,
            force_from_ms: None,
            started_ms: 0,
            version: 1,
        }
    }

    fn facts(r: &DisruptionRecord) -> Facts<'_> {
        Facts {
            now: Timestamp::from_second(1_000).unwrap(),
            record: r,
            claim: Some(Phase::Initialized),
            node_exists: true,
            replacements: vec![],
            drain_recorded: false,
            undrained: 0,
            do_not_disrupt_pod: None,
        }
    }

    #[test]
    fn a_full_disruption_walks_every_step() {
        let mut r = record("Drifted", DisruptionStep::Tainted);
        assert_eq!(
            next(&Facts {
                undrained: 2,
                ..facts(&r)
            }),
            Next::Launch
        );
        r.step = DisruptionStep::Launching;
        r.replacements = vec!["x".into()];
        let waiting = Facts {
            undrained: 2,
            replacements: vec![("x".into(), Some(Phase::Registered))],
            ..facts(&r)
        };
        assert_eq!(next(&waiting), Next::Wait(vec!["x".into()]));
        let ready = Facts {
            replacements: vec![("x".into(), Some(Phase::Initialized))],
            ..waiting.clone()
        };
        assert_eq!(next(&ready), Next::BeginDrain { force_from: None });
        r.step = DisruptionStep::Draining;
        assert_eq!(
            next(&Facts {
                drain_recorded: true,
                ..facts(&r)
            }),
            Next::Draining
        );
        assert_eq!(next(&facts(&r)), Next::Terminate);
        r.step = DisruptionStep::Terminating;
        assert_eq!(next(&facts(&r)), Next::Terminate);
        assert_eq!(
            next(&Facts {
                claim: None,
                ..facts(&r)
            }),
            Next::Forget
        );
    }

    #[test]
    fn voluntary_methods_roll_back_and_expiry_does_not() {
        let r = record("Empty", DisruptionStep::Tainted);
        assert!(matches!(next(&Facts { undrained: 1, ..facts(&r) }), Next::Abandon(w) if w.contains("arrived")));
        assert_eq!(next(&facts(&r)), Next::BeginDrain { force_from: None });
        let dnd = |r| Facts {
            do_not_disrupt_pod: Some("default/p".into()),
            undrained: 1,
            ..facts(r)
        };
        let drift = record("Drifted", DisruptionStep::Tainted);
        assert!(matches!(next(&dnd(&drift)), Next::Abandon(w) if w.contains("do-not-disrupt")));
        let mut exp = record("Expired", DisruptionStep::Tainted);
        exp.grace_ms = Some(60_000);
        assert_eq!(next(&dnd(&exp)), Next::Launch);
        exp.step = DisruptionStep::Launching;
        let failed = |r| Facts {
            replacements: vec![("x".into(), None)],
            ..facts(r)
        };
        assert_eq!(next(&failed(&exp)), Next::Launch);
        let mut drift = drift;
        drift.step = DisruptionStep::Launching;
        assert!(matches!(next(&failed(&drift)), Next::Abandon(w) if w.contains("nodeclaim/x")));
        // terminationGracePeriod counts from the drain's start.
        exp.replacements = vec![];
        assert_eq!(
            next(&facts(&exp)),
            Next::BeginDrain {
                force_from: Some(Timestamp::from_second(1_060).unwrap())
            }
        );
    }

    #[test]
    fn drift_with_a_termination_grace_period_goes_past_do_not_disrupt_pods() {
        let mut drift = record("Drifted", DisruptionStep::Tainted);
        drift.grace_ms = Some(600_000);
        let dnd = Facts {
            do_not_disrupt_pod: Some("default/p".into()),
            undrained: 1,
            ..facts(&drift)
        };
        assert_eq!(next(&dnd), Next::Launch);
        // Consolidation still rolls back, grace period or not.
        let mut under = record("Underutilized", DisruptionStep::Tainted);
        under.grace_ms = Some(600_000);
        let dnd = Facts {
            do_not_disrupt_pod: Some("default/p".into()),
            undrained: 1,
            ..facts(&under)
        };
        assert!(matches!(next(&dnd), Next::Abandon(w) if w.contains("do-not-disrupt")));
    }

    #[test]
    fn repair_drains_at_once_by_force_and_never_rolls_back() {
        let r = record("Unhealthy", DisruptionStep::Tainted);
        let f = Facts {
            do_not_disrupt_pod: Some("default/p".into()),
            undrained: 2,
            ..facts(&r)
        };
        assert_eq!(
            next(&f),
            Next::BeginDrain {
                force_from: Some(f.now)
            }
        );
    }

    #[test]
    fn a_lost_drain_record_with_pods_left_drains_again() {
        let mut r = record("Drifted", DisruptionStep::Draining);
        r.force_from_ms = Some(5_000);
        assert_eq!(
            next(&Facts {
                undrained: 1,
                ..facts(&r)
            }),
            Next::BeginDrain {
                force_from: Some(Timestamp::from_millisecond(5_000).unwrap())
            }
        );
        assert_eq!(
            next(&Facts {
                node_exists: false,
                undrained: 1,
                ..facts(&r)
            }),
            Next::Terminate
        );
    }

    #[test]
    fn consolidation_launches_alone() {
        use Reason::*;
        assert_eq!(launching_together(&[Underutilized, Drifted, Expired]), vec![1, 2]);
        assert_eq!(launching_together(&[Underutilized, Underutilized]), vec![0, 1]);
        assert!(launching_together(&[]).is_empty());
    }
}
