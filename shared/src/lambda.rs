//! The one Lambda shell the function binaries share: logging, configuration
//! from the environment (through [`crate::settings`]), the AWS SDK
//! configuration with retries, the partial-batch answer of every SQS
//! consumer, the meter every handler runs in, and each invocation's
//! [`Deadline`].

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use aws_lambda_events::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
use lambda_runtime::LambdaEvent;

use crate::deadline::Deadline;

use crate::metering::{Invocation, Metered};
use crate::settings::{SettingError, Settings};
use crate::state::{CostEntry, StateStore};

/// When this process began its init phase (the first call of [`start`]).
static INIT_STARTED: OnceLock<Instant> = OnceLock::new();

/// What the shell keeps of every invocation for itself after the handler:
/// the meter's write and the answer to the Runtime API.
pub const ANSWER_MARGIN: std::time::Duration = std::time::Duration::from_secs(1);

/// The variable Lambda sets to a function's `Handler`: the template gives
/// each function its name there, and the one Lambda binary serves that one.
pub const HANDLER_ENV: &str = "_HANDLER";

/// One of the four functions the Lambda binary serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Function {
    /// Pending pods → NodeClaims.
    Provision,
    /// NodeClaims → EC2 instances.
    Launch,
    /// EC2 events → taints, drains, replacements.
    Interrupt,
    /// The scheduled node lifecycle and disruption.
    Sweep,
}

impl Function {
    /// All four, in the template's order.
    pub const ALL: [Function; 4] = [
        Function::Provision,
        Function::Launch,
        Function::Interrupt,
        Function::Sweep,
    ];

    /// Its name: its `Handler` in the template, its log group and meter.
    pub fn name(self) -> &'static str {
        match self {
            Function::Provision => "provision",
            Function::Launch => "launch",
            Function::Interrupt => "interrupt",
            Function::Sweep => "sweep",
        }
    }

    /// The function this process serves, from [`HANDLER_ENV`].
    pub fn from_env() -> Result<Function, SettingError> {
        Settings::from_env().parsed_required(HANDLER_ENV)
    }
}

impl std::str::FromStr for Function {
    type Err = UnknownFunction;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Function::ALL.into_iter().find(|f| f.name() == s).ok_or(UnknownFunction)
    }
}

/// A handler name that is none of the four functions.
#[derive(Debug, thiserror::Error)]
#[error("the Lambda binary serves provision, launch, interrupt or sweep")]
pub struct UnknownFunction;

/// The deadline a handler works to: the invocation's (`context.deadline`,
/// milliseconds since the epoch) less [`ANSWER_MARGIN`].
pub fn invocation_deadline(context: &lambda_runtime::Context) -> Deadline {
    lambda_deadline(context).earlier_by(ANSWER_MARGIN)
}

/// When Lambda ends the invocation (`context.deadline`).
fn lambda_deadline(context: &lambda_runtime::Context) -> Deadline {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    Deadline::from_epoch_ms(context.deadline, now_ms, tokio::time::Instant::now())
}

/// Reads a required environment variable, naming it when missing or blank
/// (the process environment through [`Settings`]).
pub fn required_env(name: &str) -> Result<String, SettingError> {
    Settings::from_env().required(name)
}

/// The state table `NODESMITH_TABLE` names, through `sdk`'s DynamoDB client.
pub fn state_store(sdk: &aws_config::SdkConfig) -> Result<StateStore, SettingError> {
    Ok(StateStore::new(
        aws_sdk_dynamodb::Client::new(sdk),
        required_env("NODESMITH_TABLE")?,
    ))
}

/// The answer to an SQS batch that reports failures per record: SQS deletes
/// every record not named and redelivers the named ones (past the queue's
/// maxReceiveCount, to its dead-letter queue). Every SQS consumer answers
/// through this (the event source mapping enables `ReportBatchItemFailures`).
pub fn batch_response<I>(failed_message_ids: I) -> SqsBatchResponse
where
    I: IntoIterator,
    I::Item: Into<String>,
{
    let mut response = SqsBatchResponse::default();
    response.batch_item_failures = failed_message_ids
        .into_iter()
        .map(|id| {
            // The type is non-exhaustive: built from its default.
            let mut failure = BatchItemFailure::default();
            failure.item_identifier = id.into();
            failure
        })
        .collect();
    response
}

/// Runs `handle` on every record of an SQS batch and answers with the ones
/// that failed. Records with the same `group` key run one after another in
/// arrival order (a duplicate sees its twin's work, not its lease), different
/// groups concurrently. The results are in record order.
pub async fn handle_records<'e, K, T, E, Fut>(
    event: &'e SqsEvent,
    group: impl Fn(usize, &SqsMessage) -> K,
    handle: impl Fn(&'e SqsMessage) -> Fut,
) -> (SqsBatchResponse, Vec<Result<T, E>>)
where
    K: Ord,
    Fut: Future<Output = Result<T, E>>,
{
    let mut groups: BTreeMap<K, Vec<usize>> = BTreeMap::new();
    for (i, record) in event.records.iter().enumerate() {
        groups.entry(group(i, record)).or_default().push(i);
    }
    let handle = &handle;
    let runs = groups.into_values().map(|members| async move {
        let mut out = Vec::with_capacity(members.len());
        for i in members {
            out.push((i, handle(&event.records[i]).await));
        }
        out
    });
    let mut results: Vec<(usize, Result<T, E>)> = futures::future::join_all(runs).await.into_iter().flatten().collect();
    results.sort_by_key(|(i, _)| *i);
    let failed: Vec<Option<&str>> = results
        .iter()
        .filter(|(_, r)| r.is_err())
        .map(|(i, _)| event.records[*i].message_id.as_deref())
        .collect();
    if failed.contains(&None) {
        tracing::error!("a failed record has no message id and cannot be reported for redelivery");
    }
    (
        batch_response(failed.into_iter().flatten()),
        results.into_iter().map(|(_, r)| r).collect(),
    )
}

/// Structured logs (JSON in Lambda), then the SDK configuration from the
/// environment: throttling and 5xx are retried by the SDK with exponential
/// backoff and jitter, up to 5 attempts.
pub async fn start() -> aws_config::SdkConfig {
    INIT_STARTED.get_or_init(Instant::now);
    crate::telemetry::init();
    small_pages();
    crate::transport::sdk_defaults()
        .retry_config(aws_config::retry::RetryConfig::standard().with_max_attempts(5))
        .load()
        .await
}

/// Turns transparent huge pages off for this process. Where the kernel
/// backs every anonymous mapping with 2 MB pages (`enabled = always`), a
/// whole-cluster read faulted its ~1 GB in huge pages whose zeroing was most
/// of provision's time: 16 s at 5,000 nodes, 6 s with them off
/// (docs/scale.md, "Huge pages"). Where they are off already nothing changes;
/// a kernel that refuses is logged and the process runs on as it is.
pub fn small_pages() {
    if let Err(e) = rustix::thread::disable_transparent_huge_pages(true) {
        tracing::warn!(error = %e, "transparent huge pages stay as the kernel sets them");
    }
}

/// Meters every invocation of one function: its price (billed duration, the
/// init phase on the first invocation of the process, memory), and the fleet
/// $/h its work added or removed. Each is logged as one JSON line, published
/// as EMF metrics (namespace `nodesmith`, dimension `Function`) and added to
/// the day's cost counter in DynamoDB.
///
/// The meter's own write happens inside the invocation, after the duration
/// was taken: Lambda bills those few milliseconds, the counter does not see
/// them. A failed write is logged and never fails the invocation.
#[derive(Debug)]
pub struct Meter {
    function: &'static str,
    memory_mb: u32,
    store: Option<StateStore>,
    /// The init phase: from [`start`] to the meter's creation, the last step
    /// of `main` before the runtime polls for events (time spent waiting for
    /// the first event is not billed, so it must not count).
    init: std::time::Duration,
    warm: AtomicBool,
}

impl Meter {
    /// A meter for `function` (`provision`, `launch`, `interrupt`, `sweep`),
    /// with the memory from `AWS_LAMBDA_FUNCTION_MEMORY_SIZE`; counters go
    /// to `store` when given. Create it last in `main`: it ends the init phase.
    pub fn new(function: &'static str, store: Option<StateStore>) -> Self {
        Meter {
            function,
            memory_mb: crate::metering::memory_mb(
                Settings::from_env()
                    .optional("AWS_LAMBDA_FUNCTION_MEMORY_SIZE")
                    .as_deref(),
            ),
            store,
            init: INIT_STARTED.get_or_init(Instant::now).elapsed(),
            warm: AtomicBool::new(false),
        }
    }

    /// Runs one invocation's `work`, which yields the response and the fleet
    /// $/h it changed, and meters it whatever the response.
    pub async fn run<T>(&self, work: impl Future<Output = (T, f64)>) -> T {
        self.run_by(work, Deadline::outside_lambda()).await
    }

    /// [`Self::run`] with the meter's own write dropped if still waiting at
    /// `record_by`: a slow counter must not get the invocation ended.
    async fn run_by<T>(&self, work: impl Future<Output = (T, f64)>, record_by: Deadline) -> T {
        let started = Instant::now();
        crate::crash::begin_invocation();
        // What came before (init, the previous invocation's last lines) is not this one's.
        let _ = crate::usage::take();
        let init = (!self.warm.swap(true, Ordering::Relaxed)).then_some(self.init);
        let (response, fleet_delta) = work.await;
        let metered = Metered::new(
            &Invocation {
                duration: started.elapsed(),
                init,
                memory_mb: self.memory_mb,
            },
            &crate::usage::take(),
            fleet_delta,
        );
        if record_by
            .within(self.record(&metered, jiff::Timestamp::now()))
            .await
            .is_none()
        {
            tracing::warn!(
                function = self.function,
                "the deadline came before the cost counter was updated"
            );
        }
        response
    }

    /// Runs `handler` on one invocation's payload with its deadline
    /// ([`invocation_deadline`]) and meters it ([`Meter::run`]): the way
    /// every function takes its events.
    pub async fn invoke<P, T, Fut>(&self, event: LambdaEvent<P>, handler: impl FnOnce(P, Deadline) -> Fut) -> T
    where
        Fut: Future<Output = (T, f64)>,
    {
        let deadline = invocation_deadline(&event.context);
        // Half the answer margin for the meter's write, half for the answer.
        let record_by = lambda_deadline(&event.context).earlier_by(ANSWER_MARGIN / 2);
        self.run_by(handler(event.payload, deadline), record_by).await
    }

    /// Logs, publishes and counts one metered invocation.
    async fn record(&self, m: &Metered, now: jiff::Timestamp) {
        tracing::info!(
            function = self.function,
            invocation_cost_usd = m.cost_usd,
            fleet_delta_usd_per_hour = m.fleet_delta_usd_per_hour,
            billed_ms = m.billed_ms,
            cold_start = m.cold_start,
            memory_mb = self.memory_mb,
            "invocation metered"
        );
        crate::telemetry::publish(self.function, &m.series());
        let Some(store) = &self.store else { return };
        let entry = CostEntry {
            function: self.function.to_string(),
            day: now.to_zoned(jiff::tz::TimeZone::UTC).date(),
            nano_usd: crate::metering::to_nano_usd(m.cost_usd),
            fleet_delta_nano_usd_per_hour: crate::metering::to_nano_usd(m.fleet_delta_usd_per_hour),
        };
        if let Err(e) = store.add_cost(&entry).await {
            tracing::warn!(error = %crate::telemetry::causes(&e), function = self.function, "cost counter not updated");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handler_names_exactly_one_function_and_nothing_else_is_one() {
        for f in Function::ALL {
            assert_eq!(f.name().parse::<Function>().ok(), Some(f));
        }
        for other in ["bootstrap", "Sweep", " sweep", "", "forwarder"] {
            assert!(other.parse::<Function>().is_err(), "{other:?}");
        }
        let settings = Settings::new(|k: &str| (k == HANDLER_ENV).then(|| "sweeps".to_string()));
        let e = settings.parsed_required::<Function>(HANDLER_ENV).unwrap_err();
        assert_eq!(
            format!("{e:?}"),
            "environment variable _HANDLER=\"sweeps\" is not valid: the Lambda binary serves provision, launch, interrupt or sweep"
        );
        let unset = Settings::new(|_: &str| None).parsed_required::<Function>(HANDLER_ENV);
        assert_eq!(
            format!("{:?}", unset.unwrap_err()),
            "environment variable _HANDLER is not set"
        );
    }

    #[test]
    fn a_functions_process_runs_on_small_pages() {
        small_pages();
        assert_eq!(rustix::thread::transparent_huge_pages_are_disabled().ok(), Some(true));
    }

    #[tokio::test]
    async fn the_first_invocation_is_the_cold_one_and_the_response_passes_through() {
        let meter = Meter::new("sweep", None);
        assert!(!meter.warm.load(Ordering::Relaxed));
        assert_eq!(meter.run(async { ("first", 0.5) }).await, "first");
        assert!(meter.warm.load(Ordering::Relaxed));
        assert_eq!(meter.run(async { (7, -0.5) }).await, 7);
    }

    #[tokio::test]
    async fn the_invocations_deadline_reaches_the_handler_less_the_answer_margin() {
        let meter = Meter::new("provision", None);
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let mut context = lambda_runtime::Context::default();
        context.deadline = now_ms + 30_000;
        let event = LambdaEvent::new("payload", context);
        let before = tokio::time::Instant::now();
        let (payload, deadline) = meter.invoke(event, |p, d| async move { ((p, d), 0.0) }).await;
        assert_eq!(payload, "payload");
        let left = deadline.remaining_at(before);
        let expected = std::time::Duration::from_secs(30) - ANSWER_MARGIN;
        // Milliseconds of the epoch clock's rounding and of the test's own run.
        assert!(
            left <= expected + std::time::Duration::from_millis(1)
                && left + std::time::Duration::from_secs(2) > expected,
            "{left:?}"
        );
        // A context without a deadline (0) leaves no time rather than forever.
        let none = meter
            .invoke(
                LambdaEvent::new((), lambda_runtime::Context::default()),
                |_, d| async move { (d, 0.0) },
            )
            .await;
        assert!(none.passed());
    }

    #[test]
    fn failed_records_are_named_in_the_wire_format() {
        let response = batch_response(["2", "4"]);
        assert_eq!(
            serde_json::to_value(&response).unwrap(),
            serde_json::json!({"batchItemFailures": [{"itemIdentifier": "2"}, {"itemIdentifier": "4"}]})
        );
        let none = batch_response(Vec::<String>::new());
        assert_eq!(
            serde_json::to_value(&none).unwrap(),
            serde_json::json!({"batchItemFailures": []})
        );
    }

    #[tokio::test]
    async fn records_of_one_group_run_in_order_and_failures_are_named() {
        let record = |id: Option<&str>, body: &str| {
            let mut m = SqsMessage::default();
            m.message_id = id.map(String::from);
            m.body = Some(body.into());
            m
        };
        let mut event = SqsEvent::default();
        event.records = vec![
            record(Some("1"), "a"),
            record(Some("2"), "b!"),
            record(Some("3"), "a"),
            record(None, "c!"),
            record(Some("5"), "a!"),
        ];
        let seen = std::sync::Mutex::new(Vec::new());
        let (response, results) = handle_records(
            &event,
            |_, m| m.body.clone().unwrap_or_default().trim_end_matches('!').to_string(),
            |m| {
                let seen = &seen;
                async move {
                    let body = m.body.clone().unwrap_or_default();
                    seen.lock().unwrap().push(m.message_id.clone());
                    tokio::task::yield_now().await;
                    if body.ends_with('!') { Err(body) } else { Ok(body) }
                }
            },
        )
        .await;
        let ids: Vec<&str> = response
            .batch_item_failures
            .iter()
            .map(|f| f.item_identifier.as_str())
            .collect();
        assert_eq!(ids, ["2", "5"], "a failure without an id cannot be named");
        assert_eq!(results.len(), 5);
        assert_eq!(results[0], Ok("a".to_string()));
        assert_eq!(results[3], Err("c!".to_string()));
        let seen = seen.into_inner().unwrap();
        let group_a: Vec<_> = seen
            .iter()
            .filter(|id| matches!(id.as_deref(), Some("1" | "3" | "5")))
            .collect();
        assert_eq!(
            group_a,
            [&Some("1".to_string()), &Some("3".to_string()), &Some("5".to_string())]
        );
    }

    #[test]
    fn a_missing_variable_is_named() {
        let e = required_env("NODESMITH_TEST_SURELY_UNSET_VARIABLE").unwrap_err();
        assert_eq!(
            e.to_string(),
            "environment variable NODESMITH_TEST_SURELY_UNSET_VARIABLE is not set"
        );
    }
}
