//! Disruption budgets: how many of a NodePool's nodes may be disrupting at
//! once, per reason, at `now`. Each budget is parsed once into a typed value;
//! a budget that cannot be parsed fails closed (its pool allows nothing) with
//! an error naming the NodePool field.

use std::collections::BTreeMap;
use std::time::Duration;

use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use jiff::Timestamp;
use jiff::tz::TimeZone;

use crate::apis::NodePool;
use crate::apis::nodepool::{Budget, DisruptionReason};

use super::Reason;

/// A budget of a NodePool that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("NodePool {pool}: spec.disruption.budgets[{index}].{field}: {message}")]
pub struct BudgetError {
    /// The NodePool.
    pub pool: String,
    /// Which budget.
    pub index: usize,
    /// The field at fault (`nodes`, `schedule`, `duration`).
    pub field: &'static str,
    /// What is wrong.
    pub message: String,
}

/// How many nodes a budget allows: a count or a percentage of the pool's nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Nodes {
    Count(usize),
    Percent(usize),
}

impl Nodes {
    fn parse(s: &str) -> Option<Nodes> {
        let digits = |d: &str| !d.is_empty() && d.bytes().all(|c| c.is_ascii_digit());
        match s.strip_suffix('%') {
            Some(p) if digits(p) => p.parse().ok().filter(|v| *v <= 100).map(Nodes::Percent),
            Some(_) => None,
            None if digits(s) => s.parse().ok().map(Nodes::Count),
            None => None,
        }
    }

    /// Percentages of `total` round up, as Kubernetes scales an intstr.
    fn of(self, total: usize) -> usize {
        match self {
            Nodes::Count(n) => n,
            Nodes::Percent(p) => (total * p).div_ceil(100),
        }
    }
}

/// One budget, parsed.
#[derive(Debug, Clone)]
struct Parsed {
    nodes: Nodes,
    reasons: Option<Vec<DisruptionReason>>,
    window: Option<(Cron, Duration)>,
}

impl Parsed {
    fn parse(pool: &str, index: usize, b: &Budget) -> Result<Parsed, BudgetError> {
        let err = |field, message: String| BudgetError {
            pool: pool.to_string(),
            index,
            field,
            message,
        };
        let nodes = Nodes::parse(&b.nodes).ok_or_else(|| {
            err(
                "nodes",
                format!(
                    "must be a non-negative integer or a percentage up to 100%, got {:?}",
                    b.nodes
                ),
            )
        })?;
        let window = match (&b.schedule, &b.duration) {
            (None, None) => None,
            (Some(_), None) => return Err(err("duration", "is required with a schedule".into())),
            (None, Some(_)) => return Err(err("schedule", "is required with a duration".into())),
            (Some(s), Some(d)) => {
                let cron = parse_schedule(s).map_err(|m| err("schedule", m))?;
                let d = d
                    .duration()
                    .ok_or_else(|| err("duration", "must be a finite duration, got Never".into()))?;
                Some((cron, d))
            }
        };
        Ok(Parsed {
            nodes,
            reasons: b.reasons.clone(),
            window,
        })
    }

    /// Active at `now`: no schedule, or a scheduled start within the last
    /// `duration` (the window is `[start, start + duration)`, in UTC).
    fn active(&self, now: Timestamp) -> bool {
        let Some((cron, duration)) = &self.window else {
            return true;
        };
        let Ok(span) = jiff::SignedDuration::try_from(*duration) else {
            return false;
        };
        let Ok(from) = now.checked_sub(span) else { return false };
        // The first start strictly after `now - duration`: active when it is not after `now`.
        match cron.find_next_occurrence(&from.to_zoned(TimeZone::UTC), false) {
            Ok(next) => next.timestamp() <= now,
            Err(_) => false,
        }
    }

    fn covers(&self, reason: DisruptionReason) -> bool {
        self.reasons.as_ref().is_none_or(|r| r.contains(&reason))
    }
}

/// Parses a standard 5-field cron schedule or an @ macro (UTC).
pub fn parse_schedule(s: &str) -> Result<Cron, String> {
    CronParser::builder()
        .seconds(Seconds::Disallowed)
        .year(Year::Disallowed)
        .build()
        .parse(s)
        .map_err(|e| format!("invalid schedule {s:?}: {e}"))
}

/// A NodePool's budgets, parsed once.
#[derive(Debug, Clone)]
pub struct PoolBudgets {
    parsed: Result<Vec<Parsed>, BudgetError>,
}

impl PoolBudgets {
    /// Parses the pool's budgets; the first bad one makes the whole pool fail closed.
    pub fn new(pool: &NodePool) -> Self {
        let parsed = pool
            .spec
            .disruption
            .budgets
            .iter()
            .enumerate()
            .map(|(i, b)| Parsed::parse(pool.name(), i, b))
            .collect();
        PoolBudgets { parsed }
    }

    /// The error that makes the pool fail closed, if any.
    pub fn error(&self) -> Option<&BudgetError> {
        self.parsed.as_ref().err()
    }

    /// How many of the pool's `total` nodes may be disrupting at `now` for
    /// `reason`: the least of the active budgets that cover it; no limit when
    /// none does; 0 when a budget is unusable. Expiry is not budgeted (`None`
    /// means no limit).
    pub fn allowed(&self, reason: Reason, total: usize, now: Timestamp) -> Option<usize> {
        let reason = reason.budget_reason()?;
        let parsed = match &self.parsed {
            Ok(p) => p,
            Err(_) => return Some(0),
        };
        parsed
            .iter()
            .filter(|b| b.covers(reason) && b.active(now))
            .map(|b| b.nodes.of(total))
            .min()
    }
}

/// Budget accounting for one pass: per pool, how many nodes are disrupting
/// (already tainted, plus those chosen so far this pass, for any reason).
#[derive(Debug, Clone)]
pub struct Ledger {
    now: Timestamp,
    pools: BTreeMap<String, PoolState>,
}

#[derive(Debug, Clone)]
struct PoolState {
    budgets: PoolBudgets,
    total: usize,
    disrupting: usize,
}

/// Why the ledger refused a node.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// The pool's budget for the reason is used up.
    Exhausted {
        /// Nodes the active budgets allow.
        allowed: usize,
    },
    /// A budget of the pool is unusable.
    Invalid(BudgetError),
}

impl Ledger {
    /// A ledger at `now` over the pools, with each pool's node count and the
    /// nodes already disrupting.
    pub fn new<'a>(now: Timestamp, pools: impl IntoIterator<Item = (&'a NodePool, usize, usize)>) -> Self {
        let pools = pools
            .into_iter()
            .map(|(p, total, disrupting)| {
                (
                    p.name().to_string(),
                    PoolState {
                        budgets: PoolBudgets::new(p),
                        total,
                        disrupting,
                    },
                )
            })
            .collect();
        Ledger { now, pools }
    }

    /// The errors of unusable budgets, one per pool.
    pub fn errors(&self) -> Vec<BudgetError> {
        self.pools.values().filter_map(|p| p.budgets.error().cloned()).collect()
    }

    /// Takes one node of `pool` for `reason` if its budgets allow it.
    pub fn take(&mut self, pool: &str, reason: Reason) -> Result<(), Refusal> {
        let now = self.now;
        let Some(p) = self.pools.get_mut(pool) else {
            return Err(Refusal::Exhausted { allowed: 0 });
        };
        if reason.budget_reason().is_some()
            && let Some(e) = p.budgets.error()
        {
            return Err(Refusal::Invalid(e.clone()));
        }
        match p.budgets.allowed(reason, p.total, now) {
            Some(allowed) if p.disrupting >= allowed => Err(Refusal::Exhausted { allowed }),
            _ => {
                p.disrupting += 1;
                Ok(())
            }
        }
    }

    /// Gives back a node taken by [`Ledger::take`].
    pub fn give_back(&mut self, pool: &str) {
        if let Some(p) = self.pools.get_mut(pool) {
            p.disrupting = p.disrupting.saturating_sub(1);
        }
    }
}
