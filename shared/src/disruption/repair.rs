//! Node repair: a managed node whose health condition (the kubelet's `Ready`,
//! or a condition of EKS's node monitoring agent) has shown a problem for its
//! toleration, or whose EC2 status check is impaired, is replaced by force
//! (Karpenter's node health controller with the AWS provider's repair
//! policies). Like expiry it ignores budgets and do-not-disrupt; unlike
//! expiry it does not wait for PDBs or for a replacement: its pods go back to
//! the solver. The safety cap: no node of a NodePool is repaired while more
//! than 20% of that pool's nodes (rounded up) are unhealthy, so a broken AMI
//! or a zone outage does not set off a replacement storm; those nodes are
//! held ([`Held::RepairCapped`]).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;

use super::candidate::Candidate;
use super::{Context, Held, Method, Pass, Reason, Verdict};
use crate::settings::{SettingError, Settings};

/// The share of a NodePool's nodes that may be unhealthy and still be repaired (Karpenter's).
pub const ALLOWED_UNHEALTHY_PERCENT: usize = 20;

/// The setting that turns node repair off (`false`); on by default.
pub const ENABLED_SETTING: &str = "NODESMITH_NODE_REPAIR";
/// The setting for how long an impaired EC2 status check is tolerated.
pub const STATUS_CHECK_SETTING: &str = "NODESMITH_REPAIR_STATUS_CHECK_TOLERATION";

/// A node condition that, in `status`, is a problem once it has lasted `toleration`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairPolicy {
    /// The condition's type, e.g. `Ready`.
    pub condition: String,
    /// The status that is a problem (`False`, `Unknown`).
    pub status: String,
    /// How long the problem is tolerated before the node is repaired.
    pub toleration: Duration,
    /// The setting that overrides `toleration`.
    pub setting: &'static str,
}

/// How node repair decides.
#[derive(Debug, Clone, PartialEq)]
pub struct RepairOptions {
    /// Off: no node is repaired.
    pub enabled: bool,
    /// The conditions watched (Karpenter's AWS repair policies by default).
    pub policies: Vec<RepairPolicy>,
    /// How long an impaired EC2 status check is tolerated (Karpenter: 2 minutes).
    pub status_check_toleration: Duration,
}

impl Default for RepairOptions {
    fn default() -> Self {
        const MIN: u64 = 60;
        let policy = |condition: &str, status: &str, minutes: u64, setting| RepairPolicy {
            condition: condition.into(),
            status: status.into(),
            toleration: Duration::from_secs(minutes * MIN),
            setting,
        };
        RepairOptions {
            enabled: true,
            policies: vec![
                policy("Ready", "False", 30, "NODESMITH_REPAIR_READY_TOLERATION"),
                policy("Ready", "Unknown", 30, "NODESMITH_REPAIR_READY_TOLERATION"),
                policy(
                    "AcceleratedHardwareReady",
                    "False",
                    10,
                    "NODESMITH_REPAIR_ACCELERATED_HARDWARE_TOLERATION",
                ),
                policy("StorageReady", "False", 30, "NODESMITH_REPAIR_STORAGE_TOLERATION"),
                policy("NetworkingReady", "False", 30, "NODESMITH_REPAIR_NETWORKING_TOLERATION"),
                policy("KernelReady", "False", 30, "NODESMITH_REPAIR_KERNEL_TOLERATION"),
                policy(
                    "ContainerRuntimeReady",
                    "False",
                    30,
                    "NODESMITH_REPAIR_CONTAINER_RUNTIME_TOLERATION",
                ),
            ],
            status_check_toleration: Duration::from_secs(2 * MIN),
        }
    }
}

impl RepairOptions {
    /// Reads `NODESMITH_NODE_REPAIR` (true) and the tolerations in Go
    /// notation, Karpenter's by default: `NODESMITH_REPAIR_READY_TOLERATION`
    /// (30m), `NODESMITH_REPAIR_ACCELERATED_HARDWARE_TOLERATION` (10m),
    /// `NODESMITH_REPAIR_STORAGE_TOLERATION`, `..._NETWORKING_TOLERATION`,
    /// `..._KERNEL_TOLERATION`, `..._CONTAINER_RUNTIME_TOLERATION` (30m) and
    /// `NODESMITH_REPAIR_STATUS_CHECK_TOLERATION` (2m).
    pub fn from_settings(settings: &Settings<impl Fn(&str) -> Option<String>>) -> Result<Self, SettingError> {
        let d = RepairOptions::default();
        let mut policies = d.policies;
        for p in &mut policies {
            p.toleration = settings.duration(p.setting, p.toleration)?;
        }
        Ok(RepairOptions {
            enabled: settings.parsed(ENABLED_SETTING, d.enabled)?,
            policies,
            status_check_toleration: settings.duration(STATUS_CHECK_SETTING, d.status_check_toleration)?,
        })
    }
}

/// What is wrong with a node.
#[derive(Debug, Clone, PartialEq)]
pub enum Problem {
    /// A watched condition in the status its policy names.
    Condition {
        /// The condition's type.
        condition: String,
        /// Its status.
        status: String,
        /// Its `lastTransitionTime` (None: unknown, so its toleration is over).
        since: Option<Timestamp>,
        /// The policy's toleration.
        toleration: Duration,
    },
    /// EC2's system or instance status check is impaired.
    StatusCheck {
        /// Since when (None: EC2 did not say, so its toleration is over).
        since: Option<Timestamp>,
        /// The toleration.
        toleration: Duration,
    },
}

impl Problem {
    /// When the node is to be repaired for it (None: at once).
    fn due(&self) -> Option<Timestamp> {
        let (since, toleration) = match self {
            Problem::Condition { since, toleration, .. } | Problem::StatusCheck { since, toleration } => {
                (since, toleration)
            }
        };
        let span = jiff::SignedDuration::try_from(*toleration).unwrap_or(jiff::SignedDuration::MAX);
        since.map(|s| s.checked_add(span).unwrap_or(Timestamp::MAX))
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Condition { condition, status, .. } => write!(f, "condition {condition} is {status}"),
            Problem::StatusCheck { .. } => write!(f, "EC2 status check impaired"),
        }
    }
}

/// A node's health at a moment.
#[derive(Debug, Clone, PartialEq)]
pub enum Health {
    /// No watched problem.
    Healthy,
    /// A problem still within its toleration (it counts against the cap).
    Tolerated(Problem),
    /// A problem past its toleration: the node is to be repaired.
    Due(Problem),
}

/// The node's health at `now` (pure): the problem whose toleration ends
/// first, as Karpenter picks it; `impaired`: since when EC2 reports its
/// status check impaired, if it does (`Some(None)`: it does not say since when).
pub fn health(node: &Node, impaired: Option<Option<Timestamp>>, options: &RepairOptions, now: Timestamp) -> Health {
    let conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let mut problems: Vec<Problem> = options
        .policies
        .iter()
        .filter_map(|p| {
            let c = conditions
                .iter()
                .find(|c| c.type_ == p.condition && c.status == p.status)?;
            Some(Problem::Condition {
                condition: p.condition.clone(),
                status: p.status.clone(),
                since: c.last_transition_time.as_ref().map(|t| t.0),
                toleration: p.toleration,
            })
        })
        .collect();
    if let Some(since) = impaired {
        problems.push(Problem::StatusCheck {
            since,
            toleration: options.status_check_toleration,
        });
    }
    let Some(first) = problems.into_iter().min_by_key(|p| p.due()) else {
        return Health::Healthy;
    };
    match first.due() {
        Some(at) if at > now => Health::Tolerated(first),
        _ => Health::Due(first),
    }
}

/// Whether `unhealthy` of a pool's `total` nodes is more than the cap allows
/// (20%, rounded up as Karpenter rounds: one of three may be unhealthy).
pub fn over_cap(unhealthy: usize, total: usize) -> bool {
    unhealthy > (total * ALLOWED_UNHEALTHY_PERCENT).div_ceil(100)
}

/// The repair method.
pub(crate) struct Repair;

impl Repair {
    fn health_of(c: &Candidate, cx: &Context) -> Health {
        let impaired = cx.options.impaired.get(&c.name).copied();
        health(&c.node.node, impaired, &cx.options.repair, cx.now)
    }
}

impl Method for Repair {
    fn reason(&self) -> Reason {
        Reason::Unhealthy
    }

    fn forceful(&self) -> bool {
        true
    }

    fn judge(&self, c: &Candidate, cx: &Context) -> Verdict {
        if !cx.options.repair.enabled {
            return Verdict::Skip;
        }
        match Self::health_of(c, cx) {
            Health::Due(_) => Verdict::Disrupt,
            _ => Verdict::Skip,
        }
    }

    fn order(&self, a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
        a.name.cmp(&b.name)
    }

    /// Every due node of a pool under the cap, none of a pool over it; no
    /// protection, budget or PDB holds them, and pods that fit nowhere are
    /// left to provisioning (a replacement is not waited for).
    fn select<'a>(&self, candidates: &'a [Candidate<'a>], pass: &mut Pass<'a>) -> Vec<&'a Candidate<'a>> {
        if !pass.cx.options.repair.enabled {
            return Vec::new();
        }
        // Every node of the pool counts, those already disrupting too.
        let mut pools: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
        let mut due: Vec<&'a Candidate<'a>> = Vec::new();
        for c in candidates {
            let health = Self::health_of(c, &pass.cx);
            let e = pools.entry(c.pool.name()).or_default();
            e.1 += 1;
            if health != Health::Healthy {
                e.0 += 1;
            }
            if matches!(health, Health::Due(_)) && !c.disrupting && !pass.removed.contains(&c.name) {
                due.push(c);
            }
        }
        let mut batch = Vec::new();
        for c in due {
            let (unhealthy, total) = pools.get(c.pool.name()).copied().unwrap_or_default();
            if over_cap(unhealthy, total) {
                pass.hold(
                    c,
                    Held::RepairCapped {
                        pool: c.pool.name().to_string(),
                        unhealthy,
                        total,
                    },
                );
                continue;
            }
            // Unbudgeted, but it counts as disrupting against the pool's other budgets.
            let _ = pass.ledger.take(c.pool.name(), Reason::Unhealthy);
            batch.push(c);
        }
        if batch.is_empty() {
            return batch;
        }
        pass.forced.extend(batch.iter().map(|c| c.name.clone()));
        pass.removed.extend(batch.iter().map(|c| c.name.clone()));
        if batch.iter().any(|c| !c.is_empty()) {
            // Where its pods would go; what fits nowhere waits for provisioning.
            pass.plan = Some(pass.solve(&pass.removed));
        }
        batch
    }
}
