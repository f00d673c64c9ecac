//! `nodesmith status`: what nodesmith is doing in one cluster right now
//! (NodeClaims, pending pods and why, disruptions in progress, the fleet's
//! price) and what the autoscaler itself cost today and this month.
//!
//! [`report`] is pure (plain data in, a report out) and rendered by
//! [`to_json`] (`docs/status-format.md`) and [`to_table`]; [`gather`] is the
//! thin adapter that reads DynamoDB and the Kubernetes API.

use jiff::Timestamp;
use jiff::civil::Date;
use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

use crate::catalog::price_source::{Origin, PriceSource};
use crate::kubernetes::{Cluster, ClusterError, pods};
use crate::metering::from_nano_usd;
use crate::nodeclaim::NodeClaim;
use crate::state::{DayCost, DisruptionRecord, StateError, StateStore};

/// Shown for a pending pod the scheduler has not (yet) given a message for.
pub const WAITING_FOR_A_SOLVE: &str = "waiting for a solve";

/// What the report is made from.
#[derive(Debug, Clone)]
pub struct StatusInput {
    /// The moment the report describes (ages are measured to it; its UTC day is "today").
    pub now: Timestamp,
    /// Every NodeClaim in the table.
    pub claims: Vec<NodeClaim>,
    /// Pods waiting for a node.
    pub pending_pods: Vec<PendingPodStatus>,
    /// Disruptions in progress.
    pub disruptions: Vec<DisruptionRecord>,
    /// The cost counters of at least this month's days up to today.
    pub costs: Vec<DayCost>,
    /// Where the stored catalog's on-demand prices came from (None: not recorded yet).
    pub price_source: Option<PriceSource>,
}

/// A pod no node has taken yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingPodStatus {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The scheduler's `PodScheduled=False` message, if it left one.
    pub message: Option<String>,
}

/// A pending pod as the report shows it, if `pod` is one: not bound, phase
/// Pending (or none yet: just created), not being deleted (pure).
pub fn pending_pod(pod: &Pod) -> Option<PendingPodStatus> {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if pods::node_name(pod).is_some() || !matches!(phase, None | Some("Pending")) || pods::is_terminating(pod) {
        return None;
    }
    let message = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled" && c.status == "False"))
        .and_then(|c| c.message.clone())
        .filter(|m| !m.trim().is_empty());
    Some(PendingPodStatus {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        message,
    })
}

/// The report (`docs/status-format.md`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusReport {
    /// The moment it describes.
    pub generated_at: Timestamp,
    /// Every NodeClaim, by name.
    pub node_claims: Vec<ClaimRow>,
    /// Pending pods, by namespace and name.
    pub pending_pods: Vec<PendingRow>,
    /// Disruptions in progress, by claim.
    pub disruptions: Vec<DisruptionRow>,
    /// The fleet's running price.
    pub fleet: Fleet,
    /// What the Lambda functions themselves cost.
    pub autoscaler_cost: AutoscalerCost,
    /// Where the on-demand prices behind plans and $/h came from (null until
    /// the catalog was first built with them).
    pub on_demand_prices: Option<OnDemandPrices>,
}

/// Where the on-demand prices came from, and how old they are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OnDemandPrices {
    /// `priceListApi` (the AWS Price List API) or `bundledTable` (the table
    /// bundled in the binary: a fallback).
    pub source: Origin,
    /// The region the prices are for (`us-east-1` for the bundled table).
    pub region: String,
    /// Seconds since the prices in use were read from the Price List API
    /// (null for the bundled table).
    pub age_seconds: Option<i64>,
    /// Seconds since the Price List API was last asked.
    pub checked_seconds_ago: i64,
    /// Why the Price List API's answer is not in use, or null.
    pub fallback: Option<String>,
}

/// One NodeClaim.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimRow {
    /// Claim name.
    pub name: String,
    /// Its NodePool.
    pub node_pool: String,
    /// The launched instance type (null before launch).
    pub instance_type: Option<String>,
    /// The launched zone.
    pub zone: Option<String>,
    /// `spot`, `on-demand` or `reserved`.
    pub capacity_type: Option<String>,
    /// Lifecycle phase (`Pending` … `Terminating`).
    pub phase: String,
    /// Seconds since the solver created it (null when the claim has no creation time).
    pub age_seconds: Option<i64>,
    /// Its Node, once registered.
    pub node: Option<String>,
    /// The launched offering's $/h.
    pub price_per_hour: Option<f64>,
    /// Its EC2 instance (null before launch).
    pub instance_id: Option<String>,
}

/// One pending pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingRow {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The scheduler's message, or [`WAITING_FOR_A_SOLVE`].
    pub reason: String,
}

/// One disruption in progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DisruptionRow {
    /// The disrupted claim.
    pub claim: String,
    /// Its Node.
    pub node: String,
    /// `Expired`, `Drifted`, `Empty`, `Underutilized`.
    pub reason: String,
    /// The step reached: `Tainted`, `Launching`, `Draining`, `Terminating`.
    pub step: String,
    /// Claims that must be Initialized before the drain begins.
    pub replacements: Vec<String>,
    /// Seconds since it began.
    pub age_seconds: i64,
}

/// The fleet's running price.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Fleet {
    /// Sum of the $/h of live claims (every phase but Terminating) whose price is known.
    pub usd_per_hour: f64,
    /// Live claims (every phase but Terminating).
    pub live_claims: usize,
}

/// The autoscaler's own cost from the day counters.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AutoscalerCost {
    /// Today (UTC).
    pub today: Date,
    /// Today's invocations' price, $.
    pub today_usd: f64,
    /// Today's invocations.
    pub today_invocations: i64,
    /// This month (UTC), `yyyy-mm`.
    pub month: String,
    /// This month's invocations' price up to now, $.
    pub month_usd: f64,
    /// This month's invocations.
    pub month_invocations: i64,
}

/// Builds the report (pure).
pub fn report(input: &StatusInput) -> StatusReport {
    let now = input.now;
    let seconds_since = |t: Timestamp| (now.as_second() - t.as_second()).max(0);
    let mut node_claims: Vec<ClaimRow> = input
        .claims
        .iter()
        .map(|c| ClaimRow {
            name: c.name.clone(),
            node_pool: c.node_pool.clone(),
            instance_type: c.instance_type.clone(),
            zone: c.zone.clone(),
            capacity_type: c.capacity_type.clone(),
            phase: format!("{:?}", c.phase),
            age_seconds: c.timestamps.created.map(seconds_since),
            node: c.node_name.clone(),
            price_per_hour: c.price,
            instance_id: c.instance_id.clone(),
        })
        .collect();
    node_claims.sort_by(|a, b| a.name.cmp(&b.name));

    let mut pending_pods: Vec<PendingRow> = input
        .pending_pods
        .iter()
        .map(|p| PendingRow {
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            reason: p.message.clone().unwrap_or_else(|| WAITING_FOR_A_SOLVE.to_string()),
        })
        .collect();
    pending_pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));

    let mut disruptions: Vec<DisruptionRow> = input
        .disruptions
        .iter()
        .map(|d| DisruptionRow {
            claim: d.claim.clone(),
            node: d.node.clone(),
            reason: d.reason.to_string(),
            step: d.step.as_str().to_string(),
            replacements: d.replacements.clone(),
            age_seconds: (now.as_millisecond() - d.started_ms).max(0) / 1000,
        })
        .collect();
    disruptions.sort_by(|a, b| a.claim.cmp(&b.claim));

    let live: Vec<&NodeClaim> = input.claims.iter().filter(|c| c.phase.holds_capacity()).collect();
    let fleet = Fleet {
        // A fold from +0.0: an empty f64 sum is -0.0, shown as "$-0.0000/h".
        usd_per_hour: live.iter().filter_map(|c| c.price).fold(0.0, |a, p| a + p),
        live_claims: live.len(),
    };

    let today = now.to_zoned(jiff::tz::TimeZone::UTC).date();
    let first = today.first_of_month();
    let sum = |days: &mut dyn Iterator<Item = &DayCost>| {
        days.fold((0i64, 0i64), |(usd, n), d| {
            (
                usd + d.nano_usd(),
                n + d.functions.values().map(|f| f.invocations).sum::<i64>(),
            )
        })
    };
    let (today_nano, today_invocations) = sum(&mut input.costs.iter().filter(|d| d.day == today));
    let (month_nano, month_invocations) = sum(&mut input.costs.iter().filter(|d| d.day >= first && d.day <= today));
    let on_demand_prices = input.price_source.as_ref().map(|p| OnDemandPrices {
        source: p.origin,
        region: p.region.clone(),
        age_seconds: p.read_ms.map(|t| (now.as_millisecond() - t).max(0) / 1000),
        checked_seconds_ago: (now.as_millisecond() - p.checked_ms).max(0) / 1000,
        fallback: p.fallback.clone(),
    });
    StatusReport {
        generated_at: now,
        on_demand_prices,
        node_claims,
        pending_pods,
        disruptions,
        fleet,
        autoscaler_cost: AutoscalerCost {
            today,
            today_usd: from_nano_usd(today_nano),
            today_invocations,
            month: today.strftime("%Y-%m").to_string(),
            month_usd: from_nano_usd(month_nano),
            month_invocations,
        },
    }
}

/// The report as JSON (`docs/status-format.md`).
pub fn to_json(report: &StatusReport) -> serde_json::Value {
    serde_json::to_value(report).unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }))
}

/// A duration in seconds the way kubectl shows ages: `45s`, `12m`, `3h5m`, `2d4h`.
pub fn human_age(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86_400 if s % 3600 / 60 == 0 => format!("{}h", s / 3600),
        3600..86_400 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        _ if s % 86_400 / 3600 == 0 => format!("{}d", s / 86_400),
        _ => format!("{}d{}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// The report as text tables for a terminal.
pub fn to_table(report: &StatusReport) -> String {
    table(report, false)
}

/// [`to_table`] with more columns (`-o wide`, as kubectl's): each claim's instance too.
pub fn to_wide_table(report: &StatusReport) -> String {
    table(report, true)
}

fn table(report: &StatusReport, wide: bool) -> String {
    let dash = || "-".to_string();
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(dash);
    let mut out = String::new();
    out.push_str("NODECLAIMS\n");
    if report.node_claims.is_empty() {
        out.push_str("(none)\n");
    } else {
        let mut rows = vec![
            [
                "NAME", "POOL", "TYPE", "ZONE", "CAPACITY", "PHASE", "AGE", "NODE", "$/H",
            ]
            .map(String::from)
            .to_vec(),
        ];
        if wide {
            rows[0].push("INSTANCE".to_string());
        }
        for c in &report.node_claims {
            let mut row = vec![
                c.name.clone(),
                c.node_pool.clone(),
                opt(&c.instance_type),
                opt(&c.zone),
                opt(&c.capacity_type),
                c.phase.clone(),
                c.age_seconds.map(human_age).unwrap_or_else(dash),
                opt(&c.node),
                c.price_per_hour.map(|p| format!("{p:.4}")).unwrap_or_else(dash),
            ];
            if wide {
                row.push(opt(&c.instance_id));
            }
            rows.push(row);
        }
        out.push_str(&crate::text_table::columns(&rows));
    }
    out.push_str("\nPENDING PODS\n");
    if report.pending_pods.is_empty() {
        out.push_str("(none)\n");
    } else {
        let mut rows = vec![vec!["POD".to_string(), "WHY".to_string()]];
        for p in &report.pending_pods {
            rows.push(vec![format!("{}/{}", p.namespace, p.name), p.reason.clone()]);
        }
        out.push_str(&crate::text_table::columns(&rows));
    }
    out.push_str("\nDISRUPTIONS\n");
    if report.disruptions.is_empty() {
        out.push_str("(none)\n");
    } else {
        let mut rows = vec![
            ["CLAIM", "NODE", "REASON", "STEP", "AGE", "REPLACEMENTS"]
                .map(String::from)
                .to_vec(),
        ];
        for d in &report.disruptions {
            rows.push(vec![
                d.claim.clone(),
                d.node.clone(),
                d.reason.clone(),
                d.step.clone(),
                human_age(d.age_seconds),
                if d.replacements.is_empty() {
                    dash()
                } else {
                    d.replacements.join(",")
                },
            ]);
        }
        out.push_str(&crate::text_table::columns(&rows));
    }
    let c = &report.autoscaler_cost;
    out.push_str(&format!(
        "\nFLEET: ${:.4}/h over {} live claims\nAUTOSCALER: today ({}) ${:.6} in {} invocations; this month ({}) ${:.6} in {} invocations\n",
        report.fleet.usd_per_hour,
        report.fleet.live_claims,
        c.today,
        c.today_usd,
        c.today_invocations,
        c.month,
        c.month_usd,
        c.month_invocations
    ));
    out.push_str(&on_demand_line(report.on_demand_prices.as_ref()));
    out
}

/// The table's line saying where on-demand prices came from.
fn on_demand_line(p: Option<&OnDemandPrices>) -> String {
    let Some(p) = p else {
        return "ON-DEMAND PRICES: not recorded yet (the catalog has not been built from the Price List API)\n"
            .to_string();
    };
    let what = match (p.source, p.age_seconds) {
        (Origin::PriceListApi, Some(age)) => {
            format!("AWS Price List API for {}, read {} ago", p.region, human_age(age))
        }
        (Origin::PriceListApi, None) => format!("AWS Price List API for {}", p.region),
        (Origin::BundledTable, _) => format!("FALLBACK: the bundled {} table", p.region),
    };
    match &p.fallback {
        None => format!("ON-DEMAND PRICES: {what}\n"),
        Some(why) => format!(
            "ON-DEMAND PRICES: {what}; the Price List API failed {} ago: {why}\n",
            human_age(p.checked_seconds_ago)
        ),
    }
}

/// What `nodesmith status` could not read.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// The state table could not be read.
    #[error("cannot read the state table")]
    State(#[source] StateError),
    /// The cluster could not be read.
    #[error("cannot read the cluster")]
    Cluster(#[source] ClusterError),
}

/// Reads what the report needs: every claim, disruption, this month's
/// counters and where on-demand prices came from from the table, every pod
/// from the cluster.
pub async fn gather<C: Cluster>(store: &StateStore, cluster: &C, now: Timestamp) -> Result<StatusInput, StatusError> {
    let today = now.to_zoned(jiff::tz::TimeZone::UTC).date();
    let claims = store.list_node_claims().await.map_err(StatusError::State)?;
    let disruptions = store.disruptions().await.map_err(StatusError::State)?;
    let costs = store
        .costs(today.first_of_month(), today)
        .await
        .map_err(StatusError::State)?;
    let price_source = store.price_source().await.map_err(StatusError::State)?;
    let pending_pods = cluster
        .pods()
        .await
        .map_err(StatusError::Cluster)?
        .iter()
        .filter_map(pending_pod)
        .collect();
    Ok(StatusInput {
        now,
        claims,
        pending_pods,
        disruptions,
        costs,
        price_source,
    })
}

#[cfg(test)]
mod tests;
