//! One SQS batch of launch requests → per-record outcomes → partial batch failures.

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};

use std::time::Duration;

use super::{LaunchError, LaunchOutcome, Launcher};
use crate::deadline::Deadline;
use crate::kubernetes::Cluster;
use crate::messages::LaunchRequest;
use crate::metrics;
use crate::nodeclass::RunClasses;
use crate::telemetry::Series;

/// What happened to one record.
#[derive(Debug)]
pub struct RecordResult {
    /// The SQS message id (None if SQS sent none, which it always does).
    pub message_id: Option<String>,
    /// The outcome.
    pub result: Result<LaunchOutcome, LaunchError>,
}

/// The batch response: every failed record is an item failure, so SQS
/// redelivers it and, past maxReceiveCount, moves it to the dead-letter queue;
/// the other records are deleted (pure).
pub fn response(results: &[RecordResult]) -> SqsBatchResponse {
    crate::lambda::batch_response(
        results
            .iter()
            .filter(|r| r.result.is_err())
            .filter_map(|r| r.message_id.as_deref()),
    )
}

/// The $/h of capacity the batch added, for the meter: the price of every
/// instance it launched, or recovered after a launch that crashed before
/// recording it (that launch was never metered). A redelivery of a claim
/// launched before adds nothing (pure).
pub fn fleet_delta_usd_per_hour(results: &[RecordResult]) -> f64 {
    results
        .iter()
        .filter_map(|r| match &r.result {
            Ok(LaunchOutcome::Launched(c) | LaunchOutcome::Recovered(c)) => c.price,
            _ => None,
        })
        .sum()
}

/// The batch as CloudWatch metrics (EMF): `LaunchesSucceeded` (new or
/// recovered instances) and `LaunchesFailed` (records that failed, but for
/// one another invocation holds, and claims given up because their class
/// cannot launch), which the template's `LaunchesFailingAlarm` watches, and
/// Karpenter's `karpenter_cloudprovider_errors_total` by EC2's error code (pure).
pub fn metrics(results: &[RecordResult]) -> Vec<Series> {
    let count = |f: fn(&Result<LaunchOutcome, LaunchError>) -> bool| results.iter().filter(|r| f(&r.result)).count();
    let succeeded = count(|r| matches!(r, Ok(LaunchOutcome::Launched(_) | LaunchOutcome::Recovered(_))));
    let failed = count(|r| match r {
        Ok(o) => matches!(o, LaunchOutcome::NotLaunchable { .. }),
        Err(e) => !matches!(
            e,
            LaunchError::Busy(_) | LaunchError::NotStarted { .. } | LaunchError::OutOfTime(_)
        ),
    });
    let refused = results.iter().filter_map(|r| match &r.result {
        Ok(LaunchOutcome::NoCapacity { .. }) => Some("InsufficientInstanceCapacity"),
        Err(e) => e.refusal().map(|(code, _)| code),
        Ok(_) => None,
    });
    let mut series = vec![Series::plain(vec![
        metrics::count("LaunchesSucceeded", succeeded),
        metrics::count("LaunchesFailed", failed),
    ])];
    series.extend(metrics::tally(
        "karpenter_cloudprovider_errors_total",
        refused.map(|code| metrics::labels([("method", "create"), ("error", code)])),
    ));
    series
}

async fn handle_record<C: Cluster>(
    launcher: &Launcher<C>,
    run: &RunClasses,
    msg: &SqsMessage,
    deadline: Deadline,
) -> Result<LaunchOutcome, LaunchError> {
    let id = msg.message_id.as_deref().unwrap_or("<none>");
    match LaunchRequest::parse(msg.body.as_deref().unwrap_or_default()) {
        Err(e) => {
            tracing::error!(message_id = id, error = %crate::telemetry::causes(&e), "rejecting launch request; it goes to the dead-letter queue after its retries");
            Err(LaunchError::Request(e))
        }
        Ok(req) => {
            let r = launcher.launch_in(&req, run, deadline).await;
            match &r {
                Ok(o) => {
                    tracing::info!(message_id = id, node_claim = %req.node_claim, outcome = outcome_name(o), "launch request handled")
                }
                Err(e) => {
                    tracing::error!(message_id = id, node_claim = %req.node_claim, error = %crate::telemetry::causes(&e), "launch request failed; SQS will redeliver it")
                }
            }
            r
        }
    }
}

fn outcome_name(o: &LaunchOutcome) -> &'static str {
    match o {
        LaunchOutcome::Launched(_) => "launched",
        LaunchOutcome::AlreadyLaunched(_) => "already-launched",
        LaunchOutcome::Recovered(_) => "recovered",
        LaunchOutcome::Gone(_) => "gone",
        LaunchOutcome::NoCapacity { .. } => "no-capacity",
        LaunchOutcome::ClassGone { .. } => "class-gone",
        LaunchOutcome::NotLaunchable { .. } => "not-launchable",
    }
}

/// The least time one launch request may need (the claim's lease, its class
/// resolved, CreateFleet with the SDK's retries, the launch recorded): one
/// with less left before the deadline is not started but handed back (the
/// default of [`super::LaunchConfig::reserve`]).
pub const LAUNCH_RESERVE: Duration = Duration::from_secs(20);

/// [`handle_within`] with no deadline but Lambda's longest.
pub async fn handle<C: Cluster>(launcher: &Launcher<C>, event: &SqsEvent) -> (SqsBatchResponse, Vec<RecordResult>) {
    handle_within(launcher, event, Deadline::outside_lambda()).await
}

/// Handles every record of a batch: different NodeClaims concurrently,
/// duplicates of one NodeClaim in order (so the second sees the first's launch
/// instead of its lease). A record whose turn comes with less than the
/// launcher's reserve left before `deadline` is not started and fails
/// ([`LaunchError::NotStarted`]); one still under way near `deadline` is cut
/// ([`LaunchError::OutOfTime`]); SQS redelivers both. Results are in record order.
pub async fn handle_within<C: Cluster>(
    launcher: &Launcher<C>,
    event: &SqsEvent,
    deadline: Deadline,
) -> (SqsBatchResponse, Vec<RecordResult>) {
    let group = |i: usize, m: &SqsMessage| match LaunchRequest::parse(m.body.as_deref().unwrap_or_default()) {
        Ok(r) => format!("claim/{}", r.node_claim),
        // Unparseable records each get their own group.
        Err(_) => format!("record/{i}"),
    };
    // The batch is one run: each class is resolved once for all its claims.
    let run = RunClasses::default();
    let run = &run;
    let (response, results) = crate::lambda::handle_records(event, group, |m| async move {
        let reserve = launcher.config.reserve;
        if !deadline.leaves(reserve) {
            let left_ms = deadline.remaining().as_millis() as u64;
            tracing::warn!(
                message_id = m.message_id.as_deref().unwrap_or("<none>"),
                left_ms,
                "too little time left to launch; the request is handed back to SQS"
            );
            return Err(LaunchError::NotStarted {
                left_ms,
                needed_ms: reserve.as_millis() as u64,
            });
        }
        // The backstop: whatever step a request is in when the deadline comes,
        // the invocation answers (the launch itself is cut earlier, its lease held).
        deadline
            .within(handle_record(launcher, run, m, deadline))
            .await
            .unwrap_or_else(|| {
                let claim = LaunchRequest::parse(m.body.as_deref().unwrap_or_default())
                    .map(|r| r.node_claim)
                    .unwrap_or_default();
                tracing::warn!(
                    message_id = m.message_id.as_deref().unwrap_or("<none>"),
                    node_claim = %claim,
                    "the invocation's deadline came during the request; it is handed back to SQS"
                );
                Err(LaunchError::OutOfTime(claim))
            })
    })
    .await;
    let results = event
        .records
        .iter()
        .zip(results)
        .map(|(m, result)| RecordResult {
            message_id: m.message_id.clone(),
            result,
        })
        .collect();
    (response, results)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::RequestError;

    #[test]
    fn only_new_instances_add_to_the_fleet_price() {
        let claim = |price: Option<f64>| crate::nodeclaim::NodeClaim {
            price,
            ..crate::nodeclaim::NodeClaim::pending("default-a", "default", "default")
        };
        let rec = |result| RecordResult {
            message_id: None,
            result,
        };
        let results = [
            rec(Ok(LaunchOutcome::Launched(claim(Some(0.096))))),
            rec(Ok(LaunchOutcome::Recovered(claim(Some(0.0416))))),
            rec(Ok(LaunchOutcome::Launched(claim(None)))),
            rec(Ok(LaunchOutcome::AlreadyLaunched(claim(Some(1.0))))),
            rec(Ok(LaunchOutcome::Gone("x".into()))),
            rec(Err(LaunchError::Request(RequestError::Invalid("x".into())))),
        ];
        assert!((fleet_delta_usd_per_hour(&results) - 0.1376).abs() < 1e-12);
        assert_eq!(fleet_delta_usd_per_hour(&[]), 0.0);
    }

    #[test]
    fn failures_are_counted_but_for_a_claim_another_invocation_is_launching() {
        let claim = crate::nodeclaim::NodeClaim::pending("default-a", "default", "default");
        let rec = |result| RecordResult {
            message_id: None,
            result,
        };
        let results = [
            rec(Ok(LaunchOutcome::Launched(claim.clone()))),
            rec(Ok(LaunchOutcome::Gone("x".into()))),
            rec(Ok(LaunchOutcome::NotLaunchable {
                node_claim: "b".into(),
                reason: "SubnetsNotFound".into(),
            })),
            rec(Err(LaunchError::Fleet {
                node_claim: "c".into(),
                code: "InvalidAMIID.NotFound".into(),
                message: "gone".into(),
            })),
            rec(Err(LaunchError::Busy("d".into()))),
        ];
        let series = metrics(&results);
        let m = crate::telemetry::totals(&series);
        assert_eq!(m["LaunchesSucceeded"], 1.0);
        assert_eq!(m["LaunchesFailed"], 2.0);
        // EC2's refusal by its code, as Karpenter labels cloud provider errors.
        let errors: Vec<_> = series.iter().filter(|s| !s.labels.is_empty()).collect();
        assert_eq!(errors.len(), 1, "{series:?}");
        assert_eq!(
            errors[0].labels,
            crate::metrics::labels([("method", "create"), ("error", "InvalidAMIID.NotFound")])
        );
        assert_eq!(
            errors[0].metrics,
            vec![crate::metrics::count("karpenter_cloudprovider_errors_total", 1)]
        );
    }

    #[test]
    fn only_failed_records_are_reported() {
        let ok = |id: &str| RecordResult {
            message_id: Some(id.into()),
            result: Ok(LaunchOutcome::Gone("x".into())),
        };
        let bad = |id: Option<&str>| RecordResult {
            message_id: id.map(String::from),
            result: Err(LaunchError::Request(RequestError::Invalid("x".into()))),
        };
        let resp = response(&[ok("1"), bad(Some("2")), ok("3"), bad(Some("4")), bad(None)]);
        let ids: Vec<&str> = resp
            .batch_item_failures
            .iter()
            .map(|f| f.item_identifier.as_str())
            .collect();
        assert_eq!(ids, vec!["2", "4"]);
        assert_eq!(
            serde_json::to_value(&resp).unwrap(),
            serde_json::json!({"batchItemFailures": [{"itemIdentifier": "2"}, {"itemIdentifier": "4"}]})
        );
    }
}
