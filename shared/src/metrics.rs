//! Every metric nodesmith emits, in one catalogue: its name (Karpenter's
//! where Karpenter has one), unit, labels, the functions that emit it and
//! what it means (`docs/metrics.md` lists the same, and the template's
//! dashboard and alarms may show only these); and the pure builders of the
//! labelled series the functions publish through [`crate::telemetry`].

use std::collections::BTreeMap;

use crate::apis::nodepool::NodePool;
use crate::lifecycle::Action;
use crate::nodeclaim::NodeClaim;
use crate::state::Reason;
use crate::telemetry::{Metric, Series};

/// The functions, as the `Function` dimension names them.
pub const FUNCTIONS: [&str; 4] = ["provision", "launch", "interrupt", "sweep"];

/// One metric in the catalogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Def {
    /// The name in CloudWatch (namespace `nodesmith`).
    pub name: &'static str,
    /// The CloudWatch unit.
    pub unit: &'static str,
    /// Its labels (dimensions) besides `Function`.
    pub labels: &'static [&'static str],
    /// The functions that emit it.
    pub functions: &'static [&'static str],
    /// Whether the name (and labels) are Karpenter's.
    pub karpenter: bool,
    /// What it counts or measures.
    pub help: &'static str,
}

const ALL: &[&str] = &FUNCTIONS;
const SWEEP: &[&str] = &["sweep"];
const COUNT: &str = "Count";

const fn sweep_count(name: &'static str, help: &'static str) -> Def {
    Def {
        name,
        unit: COUNT,
        labels: &[],
        functions: SWEEP,
        karpenter: false,
        help,
    }
}

/// Every metric nodesmith emits.
pub const CATALOG: &[Def] = &[
    // Karpenter's names.
    Def {
        name: "karpenter_nodeclaims_created_total",
        unit: COUNT,
        labels: &["nodepool", "reason"],
        functions: &["provision", "interrupt", "sweep"],
        karpenter: true,
        help: "NodeClaims created: reason `provisioning` (a solve for pending pods), `interruption` (a replacement planned before the interrupted node goes), or a disruption's reason (`drifted`, `expired`, `underutilized`, `unhealthy`: a replacement launched first).",
    },
    Def {
        name: "karpenter_nodes_created_total",
        unit: COUNT,
        labels: &["nodepool"],
        functions: SWEEP,
        karpenter: true,
        help: "Nodes registered to their NodeClaims.",
    },
    Def {
        name: "karpenter_nodeclaims_terminated_total",
        unit: COUNT,
        labels: &["nodepool", "capacity_type"],
        functions: SWEEP,
        karpenter: true,
        help: "NodeClaims whose instance and record are gone (any reason: disruption, garbage collection, timeouts, deletion).",
    },
    Def {
        name: "karpenter_nodes_terminated_total",
        unit: COUNT,
        labels: &["nodepool"],
        functions: SWEEP,
        karpenter: true,
        help: "Of those, the ones that had registered a Node.",
    },
    Def {
        name: "karpenter_nodeclaims_disrupted_total",
        unit: COUNT,
        labels: &["nodepool", "reason"],
        functions: SWEEP,
        karpenter: true,
        help: "Disruptions begun, by reason: `unhealthy`, `expired`, `drifted`, `empty`, `underutilized`.",
    },
    Def {
        name: "karpenter_voluntary_disruption_decisions_total",
        unit: COUNT,
        labels: &["decision", "reason", "consolidation_type"],
        functions: SWEEP,
        karpenter: true,
        help: "Disruption decisions begun: `decision` `delete` or `replace`, `reason` as above, `consolidation_type` `empty`, `single` or `multi` (`none` for the other reasons: CloudWatch takes no empty value).",
    },
    Def {
        name: "karpenter_voluntary_disruption_consolidation_timeouts_total",
        unit: COUNT,
        labels: &["consolidation_type"],
        functions: SWEEP,
        karpenter: true,
        help: "Passes whose consolidation reached its deadline before it had tried every node it could take (`consolidation_type` `single`: the nodes tried one at a time are the ones left); the sweep's log says how many were left.",
    },
    Def {
        name: "karpenter_pods_startup_duration_seconds",
        unit: "Seconds",
        labels: &[],
        functions: SWEEP,
        karpenter: true,
        help: "Each pod's time from creation to Ready, as the sweep first sees it Ready (EMF value arrays: read percentiles, e.g. p50/p90/p99): every pod, as Karpenter's, not only those that waited for a node.",
    },
    Def {
        name: "karpenter_voluntary_disruption_eligible_nodes",
        unit: COUNT,
        labels: &["reason"],
        functions: SWEEP,
        karpenter: true,
        help: "Nodes a run's disruption pass found eligible, before budgets and protections: `drifted`, `underutilized` (consolidateAfter passed) and `empty` (those with no pod to move); written each run that decides a pass.",
    },
    Def {
        name: "karpenter_nodepools_usage",
        unit: "None",
        labels: &["nodepool", "resource_type"],
        functions: SWEEP,
        karpenter: true,
        help: "Summed capacity of each pool's registered nodes, by resource (`cpu` in cores, `memory` in bytes, `pods`, `nodes`, ...), as in the pool's `status.resources`.",
    },
    Def {
        name: "karpenter_nodepools_limit",
        unit: "None",
        labels: &["nodepool", "resource_type"],
        functions: SWEEP,
        karpenter: true,
        help: "Each pool's `spec.limits`, by resource, in the same units.",
    },
    Def {
        name: "karpenter_cluster_state_node_count",
        unit: COUNT,
        labels: &[],
        functions: SWEEP,
        karpenter: true,
        help: "Nodes nodesmith manages (claims with a registered Node).",
    },
    Def {
        name: "karpenter_scheduler_scheduling_duration_seconds",
        unit: "Seconds",
        labels: &[],
        functions: &["provision"],
        karpenter: true,
        help: "Time of one solve (the bin-packing of a batch's pending pods); Karpenter before v1 named it `karpenter_provisioner_scheduling_duration_seconds`.",
    },
    Def {
        name: "karpenter_scheduler_queue_depth",
        unit: COUNT,
        labels: &[],
        functions: &["provision"],
        karpenter: true,
        help: "Pending pods a solve considered (Karpenter's pods waiting to be scheduled; nodesmith emits no per-pod `karpenter_pods_state`, which would be one series per pod).",
    },
    Def {
        name: "karpenter_interruption_received_messages_total",
        unit: COUNT,
        labels: &["message_type"],
        functions: &["interrupt"],
        karpenter: true,
        help: "Interruption messages received, by type: `spot_interrupted`, `rebalance_recommendation`, `scheduled_change`, `instance_<state>` (state changes), `capacity_reservation_interrupted`, `no_op` (not acted on).",
    },
    Def {
        name: "karpenter_interruption_deleted_messages_total",
        unit: COUNT,
        labels: &[],
        functions: &["interrupt"],
        karpenter: true,
        help: "Interruption messages done with (acted on, duplicates, not actionable): every message received but those given back to SQS.",
    },
    Def {
        name: "karpenter_cloudprovider_errors_total",
        unit: COUNT,
        labels: &["method", "error"],
        functions: &["launch"],
        karpenter: true,
        help: "Launches EC2 refused, by method (`create`) and EC2's error code (`InsufficientInstanceCapacity` when no offering had capacity).",
    },
    // nodesmith's own.
    Def {
        name: "InvocationCostUsd",
        unit: "None",
        labels: &[],
        functions: ALL,
        karpenter: false,
        help: "What one invocation cost: Lambda (duration × memory, plus the request), and the DynamoDB, SQS and log ingestion it used.",
    },
    Def {
        name: "OwnCostUsd",
        unit: "None",
        labels: &["service"],
        functions: ALL,
        karpenter: false,
        help: "That cost by service: `lambda`, `dynamodb` (request units, estimated from the calls' sizes), `sqs` (requests), `logs` (bytes ingested).",
    },
    Def {
        name: "FleetDeltaUsdPerHour",
        unit: "None",
        labels: &[],
        functions: ALL,
        karpenter: false,
        help: "The change an invocation made to the fleet's price, $/h (launches add, removals subtract).",
    },
    Def {
        name: "FleetUsdPerHour",
        unit: "None",
        labels: &[],
        functions: SWEEP,
        karpenter: false,
        help: "The fleet's price, $/h: the offerings of every launched claim.",
    },
    Def {
        name: "NodeClaims",
        unit: COUNT,
        labels: &["nodepool", "capacity_type"],
        functions: SWEEP,
        karpenter: false,
        help: "Launched claims by pool and capacity type (`spot`, `on-demand`, `reserved`).",
    },
    Def {
        name: "PodsUnschedulable",
        unit: COUNT,
        labels: &[],
        functions: &["provision"],
        karpenter: false,
        help: "Pending pods a solve could place nowhere (each gets a FailedScheduling event naming why).",
    },
    Def {
        name: "LaunchesSucceeded",
        unit: COUNT,
        labels: &[],
        functions: &["launch"],
        karpenter: false,
        help: "Instances launched (or recovered after a crash) for claims.",
    },
    Def {
        name: "LaunchesFailed",
        unit: COUNT,
        labels: &[],
        functions: &["launch"],
        karpenter: false,
        help: "Launch requests that failed, and claims given up because their class cannot launch (`LaunchesFailingAlarm`).",
    },
    Def {
        name: "InterruptionMessagesUnreadable",
        unit: COUNT,
        labels: &[],
        functions: &["interrupt"],
        karpenter: false,
        help: "Messages acknowledged because nodesmith cannot read them (an unknown detail-type, a malformed event).",
    },
    Def {
        name: "InterruptionMessagesFailed",
        unit: COUNT,
        labels: &[],
        functions: &["interrupt"],
        karpenter: false,
        help: "Messages given back to SQS to be retried.",
    },
    Def {
        name: "InterruptionNodesTainted",
        unit: COUNT,
        labels: &[],
        functions: &["interrupt"],
        karpenter: false,
        help: "Nodes tainted because of an interruption.",
    },
    Def {
        name: "InterruptionReplacements",
        unit: COUNT,
        labels: &[],
        functions: &["interrupt"],
        karpenter: false,
        help: "Replacement claims planned for interrupted nodes.",
    },
    sweep_count(
        "SweepsCompleted",
        "1 for a run that held the lease and finished, 0 for a skipped one (`SweepStalledAlarm`).",
    ),
    sweep_count("NodesRegistered", "Nodes registered to their claims."),
    sweep_count(
        "RegistrationsRefused",
        "Claims given up because the API server refused their registration.",
    ),
    sweep_count(
        "NodesInitialized",
        "Nodes initialized (startup taints gone, resources reported).",
    ),
    sweep_count("NodeClaimsRemoved", "Claims removed (any reason)."),
    sweep_count(
        "NodeClaimsRegistrationTimedOut",
        "Claims whose Node never joined within the registration timeout (`NodesUnregisteredAlarm`).",
    ),
    sweep_count(
        "InstancesCollected",
        "Instances nodesmith tagged that no claim owns, terminated.",
    ),
    sweep_count("NodesCollected", "Nodes whose instance is gone, deleted."),
    sweep_count("NodeClaimsAdopted", "Instances adopted back into a claim."),
    sweep_count(
        "InstancesCollectionHeld",
        "Instances whose collection waits (their claim may still record them).",
    ),
    sweep_count(
        "LaunchesRequeued",
        "Launch requests sent again for claims never launched.",
    ),
    sweep_count(
        "SweepStepsFailed",
        "Lifecycle steps that failed (the next sweep tries again).",
    ),
    sweep_count("NodeClaimsUnreadable", "Claim items this release could not read."),
    sweep_count(
        "SweepStepsDeferred",
        "Steps left for the next run (the time budget ran out).",
    ),
    sweep_count(
        "SolvesRequested",
        "Solve requests the sweep queued for pods still pending.",
    ),
    sweep_count("DisruptionsStarted", "Disruptions begun (any reason)."),
    sweep_count(
        "DisruptionReplacementsLaunched",
        "Replacement claims launched for disruptions.",
    ),
    sweep_count("NodesDisrupted", "Disrupted nodes terminated."),
    sweep_count("DisruptionsAbandoned", "Disruptions given up."),
    sweep_count(
        "DisruptionsBlocked",
        "Nodes a method wanted that a rule held (`DisruptionBlocked`).",
    ),
    sweep_count("DisruptionStepsFailed", "Disruption steps that failed."),
    sweep_count("NodeClassStatusesWritten", "EC2NodeClass statuses written."),
    sweep_count(
        "NodeClassesUnresolved",
        "EC2NodeClasses that could not be resolved this run.",
    ),
];

/// One disruption decision a sweep began (pure data for the metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecisionTaken {
    /// Why.
    pub reason: Reason,
    /// Whether replacements are launched first.
    pub replace: bool,
    /// How many nodes it takes.
    pub nodes: usize,
}

/// `karpenter_voluntary_disruption_eligible_nodes` from a pass's node
/// states (pure): every reason, zero included, so the gauge falls back.
pub fn eligible(states: &BTreeMap<String, crate::disruption::NodeState>) -> Vec<Series> {
    let consolidatable = || states.values().filter(|s| s.consolidatable_since.is_some());
    [
        ("drifted", states.values().filter(|s| s.drifted.is_some()).count()),
        ("underutilized", consolidatable().count()),
        ("empty", consolidatable().filter(|s| s.empty).count()),
    ]
    .into_iter()
    .map(|(reason, n)| Series {
        labels: labels([("reason", reason)]),
        metrics: vec![count("karpenter_voluntary_disruption_eligible_nodes", n)],
    })
    .collect()
}

/// `karpenter_voluntary_disruption_consolidation_timeouts_total` for one
/// pass (pure): one when its deadline left nodes unexamined, else nothing.
pub fn consolidation_timeouts(coverage: Option<crate::disruption::Coverage>) -> Vec<Series> {
    let timed_out = coverage.is_some_and(|c| c.unexamined > 0);
    tally(
        "karpenter_voluntary_disruption_consolidation_timeouts_total",
        timed_out.then(|| labels([("consolidation_type", "single")])),
    )
}

/// `karpenter_pods_startup_duration_seconds` for these pods' durations
/// (pure): up to [`crate::telemetry::MAX_SAMPLES`] a series, EMF's limit.
pub fn startup(pods: &[(String, f64)]) -> Vec<Series> {
    pods.chunks(crate::telemetry::MAX_SAMPLES)
        .map(|chunk| {
            let samples: Vec<f64> = chunk.iter().map(|(_, s)| *s).collect();
            Series::plain(vec![Metric {
                name: "karpenter_pods_startup_duration_seconds",
                value: samples.iter().sum(),
                unit: "Seconds",
                samples,
            }])
        })
        .collect()
}

/// `karpenter_nodeclaims_created_total` for the replacements a sweep
/// launched, by pool and the disruption's reason (pure).
pub fn replacements_created(created: &[(String, Reason)]) -> Vec<Series> {
    tally(
        "karpenter_nodeclaims_created_total",
        created.iter().map(|(pool, reason)| {
            labels([
                ("nodepool", pool.as_str()),
                ("reason", &reason.as_str().to_ascii_lowercase()),
            ])
        }),
    )
}

/// `karpenter_voluntary_disruption_decisions_total` for `decisions` (pure).
pub fn decisions(decisions: &[DecisionTaken]) -> Vec<Series> {
    tally(
        "karpenter_voluntary_disruption_decisions_total",
        decisions.iter().map(|d| {
            let consolidation = match (d.reason, d.nodes) {
                (Reason::Empty, _) => "empty",
                (Reason::Underutilized, 1) => "single",
                (Reason::Underutilized, _) => "multi",
                _ => "none",
            };
            labels([
                ("decision", if d.replace { "replace" } else { "delete" }),
                ("reason", &d.reason.as_str().to_ascii_lowercase()),
                ("consolidation_type", consolidation),
            ])
        }),
    )
}

/// The catalogue's entry for `name`.
pub fn def(name: &str) -> Option<&'static Def> {
    CATALOG.iter().find(|d| d.name == name)
}

/// A count.
pub fn count(name: &'static str, n: usize) -> Metric {
    Metric {
        name,
        value: n as f64,
        unit: COUNT,
        samples: Vec::new(),
    }
}

/// One series per distinct label set in `keys`, counting its occurrences
/// under `name` (pure).
pub fn tally<I>(name: &'static str, keys: I) -> Vec<Series>
where
    I: IntoIterator<Item = BTreeMap<&'static str, String>>,
{
    let mut counts: BTreeMap<BTreeMap<&'static str, String>, usize> = BTreeMap::new();
    for k in keys {
        *counts.entry(k).or_default() += 1;
    }
    counts
        .into_iter()
        .map(|(labels, n)| Series {
            labels,
            metrics: vec![count(name, n)],
        })
        .collect()
}

/// Labels from pairs.
pub fn labels<const N: usize>(pairs: [(&'static str, &str); N]) -> BTreeMap<&'static str, String> {
    pairs.into_iter().map(|(k, v)| (k, v.to_string())).collect()
}

/// `karpenter_nodeclaims_created_total` for `claims`, created for `reason` (pure).
pub fn created(claims: &[NodeClaim], reason: &str) -> Vec<Series> {
    tally(
        "karpenter_nodeclaims_created_total",
        claims
            .iter()
            .map(|c| labels([("nodepool", c.node_pool.as_str()), ("reason", reason)])),
    )
}

/// The fleet as the sweep read it (gauges, pure): its price, node count,
/// claims by pool and capacity type, and each pool's usage
/// ([`crate::mirror::pool_resources`]) and limits.
pub fn fleet(
    claims: &[&NodeClaim],
    pools: &[NodePool],
    resources: &BTreeMap<String, BTreeMap<String, crate::quantity::Quantity>>,
) -> Vec<Series> {
    let launched = || claims.iter().filter(|c| c.instance_id.is_some());
    // Plus zero: an empty float sum is -0.0.
    let usd_per_hour: f64 = launched().filter_map(|c| c.price).sum::<f64>() + 0.0;
    let registered = claims.iter().filter(|c| c.node_name.is_some()).count();
    let mut series = vec![Series::plain(vec![
        Metric {
            name: "FleetUsdPerHour",
            value: usd_per_hour,
            unit: "None",
            samples: Vec::new(),
        },
        count("karpenter_cluster_state_node_count", registered),
    ])];
    series.extend(tally(
        "NodeClaims",
        launched().map(|c| {
            labels([
                ("nodepool", c.node_pool.as_str()),
                ("capacity_type", c.capacity_type.as_deref().unwrap_or("unknown")),
            ])
        }),
    ));
    let resource = |name: &'static str, pool: &str, resource: &str, value: f64| Series {
        labels: labels([("nodepool", pool), ("resource_type", resource)]),
        metrics: vec![Metric {
            name,
            value,
            unit: "None",
            samples: Vec::new(),
        }],
    };
    for pool in pools {
        for (r, q) in crate::mirror::resources_of(resources, pool.name()) {
            series.push(resource("karpenter_nodepools_usage", pool.name(), &r, q.as_f64()));
        }
        for (r, q) in &pool.spec.limits {
            series.push(resource("karpenter_nodepools_limit", pool.name(), r, q.as_f64()));
        }
    }
    series
}

/// What one sweep run changed, by pool (pure): nodes registered, claims
/// (and their nodes) terminated, disruptions begun by reason. `claims`: all
/// the run read; `done`: the lifecycle steps carried out; `disrupted`: the
/// disruptions begun (by node); `disrupted_gone`: nodes whose disruption
/// ended in termination; `terminated`: claims terminated for deletions
/// and interruptions.
pub fn sweep_changes(
    claims: &[NodeClaim],
    done: &[Action],
    disrupted: &[(String, Reason)],
    disrupted_gone: &[String],
    terminated: &[String],
) -> Vec<Series> {
    let by_name: BTreeMap<&str, &NodeClaim> = claims.iter().map(|c| (c.name.as_str(), c)).collect();
    let by_node: BTreeMap<&str, &NodeClaim> = claims
        .iter()
        .filter_map(|c| Some((c.node_name.as_deref()?, c)))
        .collect();
    let pool = |c: &NodeClaim| labels([("nodepool", c.node_pool.as_str())]);
    let registered = done.iter().filter_map(|a| match a {
        Action::Register { claim, .. } => by_name.get(claim.as_str()).copied(),
        _ => None,
    });
    let mut gone: Vec<&NodeClaim> = done
        .iter()
        .filter_map(|a| match a {
            Action::Remove { claim, .. } => by_name.get(claim.as_str()).copied(),
            _ => None,
        })
        .chain(disrupted_gone.iter().filter_map(|n| by_node.get(n.as_str()).copied()))
        .chain(terminated.iter().filter_map(|c| by_name.get(c.as_str()).copied()))
        .collect();
    gone.sort_by(|a, b| a.name.cmp(&b.name));
    gone.dedup_by(|a, b| a.name == b.name);
    let mut series = tally("karpenter_nodes_created_total", registered.map(pool));
    series.extend(tally(
        "karpenter_nodeclaims_terminated_total",
        gone.iter().map(|c| {
            labels([
                ("nodepool", c.node_pool.as_str()),
                ("capacity_type", c.capacity_type.as_deref().unwrap_or("unknown")),
            ])
        }),
    ));
    series.extend(tally(
        "karpenter_nodes_terminated_total",
        gone.iter().filter(|c| c.node_name.is_some()).map(|c| pool(c)),
    ));
    series.extend(tally(
        "karpenter_nodeclaims_disrupted_total",
        disrupted.iter().filter_map(|(node, reason)| {
            let c = by_node.get(node.as_str())?;
            Some(labels([
                ("nodepool", c.node_pool.as_str()),
                ("reason", &reason.as_str().to_ascii_lowercase()),
            ]))
        }),
    ));
    series
}

#[cfg(test)]
mod tests;
