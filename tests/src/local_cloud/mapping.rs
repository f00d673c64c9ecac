//! What invokes the functions: SQS event source mappings (batch size,
//! batching window, partial batch failures; failed messages come back after
//! the queue's visibility timeout and go to the dead-letter queue after its
//! `maxReceiveCount`, which SQS itself does) and the sweep's schedule. Every
//! invocation is recorded in the [`Activity`] log.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry, Message, MessageSystemAttributeName,
};
use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::runtime::{Answer, Function, InvokeError};
use crate::moto::REGION;

/// One invocation, as the demo shows it.
#[derive(Clone, Debug)]
pub struct Invocation {
    /// The function.
    pub function: String,
    /// What invoked it: `schedule` or `<n> messages`.
    pub trigger: String,
    /// When it was invoked.
    pub at: jiff::Timestamp,
    /// Its memory size in MiB (for the cost estimate).
    pub memory_mb: u64,
    /// What it answered.
    pub answer: Answer,
    /// Messages it reported as failed (or all of them when it failed as a whole).
    pub failed_messages: usize,
}

impl Invocation {
    /// The function's own summary of what it decided: the fields of its
    /// last `batch done` / `launch request handled` log lines, or its answer.
    pub fn decision(&self) -> String {
        let mut parts = Vec::new();
        for line in &self.answer.logs {
            let Ok(v) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let Some(fields) = v.get("fields").and_then(Value::as_object) else {
                continue;
            };
            let message = fields.get("message").and_then(Value::as_str).unwrap_or_default();
            match message {
                "batch done" => parts.push(
                    fields
                        .iter()
                        .filter(|(k, v)| *k != "message" && v.as_u64() != Some(0))
                        .map(|(k, v)| format!("{k} {v}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                ),
                "launch request handled" => parts.push(format!(
                    "{} {}",
                    fields.get("node_claim").and_then(Value::as_str).unwrap_or("?"),
                    fields.get("outcome").and_then(Value::as_str).unwrap_or("?")
                )),
                _ => {}
            }
        }
        match &self.answer.result {
            Err(e) => format!("error: {}", e.chars().take(120).collect::<String>()),
            Ok(_) if !parts.is_empty() => parts.join("; "),
            Ok(body) => compact(body),
        }
    }
}

/// A JSON answer as `key value` pairs, nested keys joined with dots, lists
/// as their lengths, and nothing for zero, false, null or empty values.
fn compact(body: &str) -> String {
    fn walk(prefix: &str, v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&key, v, out);
                }
            }
            Value::Array(a) if !a.is_empty() => out.push(format!("{prefix} {}", a.len())),
            Value::Number(n) if n.as_f64() != Some(0.0) => out.push(format!("{prefix} {n}")),
            Value::String(s) => out.push(format!("{prefix} {s}")),
            Value::Bool(true) => out.push(prefix.to_string()),
            _ => {}
        }
    }
    match serde_json::from_str::<Value>(body) {
        Ok(v @ Value::Object(_)) => {
            let mut out = Vec::new();
            walk("", &v, &mut out);
            out.join(", ")
        }
        _ => body.chars().take(120).collect(),
    }
}

/// Every invocation so far, and a feed of new ones.
#[derive(Clone)]
pub struct Activity {
    all: Arc<Mutex<Vec<Invocation>>>,
    feed: broadcast::Sender<Invocation>,
}

impl Default for Activity {
    fn default() -> Self {
        Activity {
            all: Arc::default(),
            feed: broadcast::channel(1024).0,
        }
    }
}

impl Activity {
    fn record(&self, inv: Invocation) {
        tracing::info!(function = %inv.function, trigger = %inv.trigger, millis = inv.answer.duration.as_millis() as u64,
            ok = inv.answer.result.is_ok(), decision = %inv.decision(), "invocation");
        // The function's own lines, for a slow or failed invocation looked into with RUST_LOG.
        for line in &inv.answer.logs {
            tracing::debug!(function = %inv.function, %line, "invocation log");
        }
        self.all.lock().unwrap_or_else(|e| e.into_inner()).push(inv.clone());
        let _ = self.feed.send(inv);
    }

    /// Every invocation so far.
    pub fn all(&self) -> Vec<Invocation> {
        self.all.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// New invocations from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Invocation> {
        self.feed.subscribe()
    }
}

/// An SQS event source mapping's settings.
#[derive(Clone, Debug)]
pub struct MappingSpec {
    /// The queue's URL.
    pub queue_url: String,
    /// The queue's ARN (`eventSourceARN` of each record).
    pub queue_arn: String,
    /// `BatchSize`.
    pub batch_size: usize,
    /// `MaximumBatchingWindowInSeconds`.
    pub window: Duration,
    /// Deliver every batch two or three times (SQS delivers at least once).
    pub duplicates: bool,
    /// When an invocation's process dies, make its batch visible again at
    /// once instead of after the visibility timeout (crash tests: a crash is
    /// then followed by the redelivery it causes, not by a wait).
    pub redeliver_on_crash: bool,
}

fn sqs_record(m: &Message, spec: &MappingSpec) -> Value {
    let attrs: BTreeMap<String, String> = m
        .attributes()
        .map(|a| a.iter().map(|(k, v)| (k.as_str().to_string(), v.clone())).collect())
        .unwrap_or_default();
    json!({
        "messageId": m.message_id(),
        "receiptHandle": m.receipt_handle(),
        "body": m.body(),
        "attributes": attrs,
        "messageAttributes": {},
        "md5OfBody": m.md5_of_body(),
        "eventSource": "aws:sqs",
        "eventSourceARN": spec.queue_arn,
        "awsRegion": REGION,
    })
}

/// Which messages of a batch failed, from a function's answer (Lambda's
/// `ReportBatchItemFailures` rules: a failed invocation, or an answer naming
/// an unknown or empty id, fails the whole batch).
pub fn failed_ids(answer: &Result<String, String>, ids: &[String]) -> Vec<String> {
    let Ok(body) = answer else {
        return ids.to_vec();
    };
    let v: Value = match serde_json::from_str(body) {
        Ok(v) => v,
        Err(_) if body.trim().is_empty() => return Vec::new(),
        Err(_) => return ids.to_vec(),
    };
    let Some(items) = v.get("batchItemFailures") else {
        return Vec::new();
    };
    let Some(items) = items.as_array() else {
        return if items.is_null() { Vec::new() } else { ids.to_vec() };
    };
    let mut failed = Vec::new();
    for item in items {
        match item.get("itemIdentifier").and_then(Value::as_str) {
            Some(id) if ids.iter().any(|i| i == id) => failed.push(id.to_string()),
            _ => return ids.to_vec(),
        }
    }
    failed
}

/// A function's sandboxes: as many processes as its reserved concurrency
/// (capped locally), each taking one invocation at a time; an invocation
/// goes to whichever is free, as Lambda places it.
pub struct Pool {
    processes: Vec<Arc<Function>>,
    free: Mutex<Vec<usize>>,
    permits: tokio::sync::Semaphore,
}

impl Pool {
    /// A pool of started functions (at least one).
    pub fn new(processes: Vec<Arc<Function>>) -> Pool {
        let n = processes.len();
        Pool {
            free: Mutex::new((0..n).rev().collect()),
            permits: tokio::sync::Semaphore::new(n),
            processes,
        }
    }

    /// The function's name.
    pub fn name(&self) -> &str {
        self.processes.first().map_or("", |f| f.name())
    }

    /// Its memory size in MiB.
    pub fn memory_mb(&self) -> u64 {
        self.processes.first().map_or(0, |f| f.memory_mb())
    }

    /// How many invocations may run at once.
    pub fn concurrency(&self) -> usize {
        self.processes.len()
    }

    /// Process ids of the processes now running.
    pub fn pids(&self) -> Vec<u32> {
        self.processes.iter().filter_map(|f| f.pid()).collect()
    }

    /// Hands `event` to a free process (waiting for one) and waits for its answer.
    pub async fn invoke(&self, event: &Value) -> Result<Answer, InvokeError> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| InvokeError::Stopped(self.name().to_string()))?;
        let i = self
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .ok_or_else(|| InvokeError::Stopped(self.name().to_string()))?;
        let answer = self.processes[i].invoke(event).await;
        self.free.lock().unwrap_or_else(|e| e.into_inner()).push(i);
        answer
    }

    /// Recycles every process once none is busy (waiting for those that are).
    pub async fn recycle(&self) {
        let n = u32::try_from(self.processes.len()).unwrap_or(u32::MAX);
        if let Ok(_all) = self.permits.acquire_many(n).await {
            futures::future::join_all(self.processes.iter().map(|f| f.recycle())).await;
        }
    }

    /// Stops every process.
    pub async fn stop(&self) {
        self.permits.close();
        for f in &self.processes {
            f.stop().await;
        }
    }
}

/// How many times a batch is delivered: once, or (testing SQS's at-least-once
/// delivery) twice and three times in turn.
fn deliveries(duplicates: bool, batch_number: u64) -> usize {
    if duplicates { 2 + (batch_number % 2) as usize } else { 1 }
}

/// One poller of an event source mapping: polls the queue and invokes the
/// function with batches, forever (a mapping runs one poller per sandbox).
pub async fn run_mapping(sqs: aws_sdk_sqs::Client, spec: MappingSpec, pool: Arc<Pool>, activity: Activity) {
    let mut batch_number = 0u64;
    loop {
        let batch = collect(&sqs, &spec).await;
        if batch.is_empty() {
            continue;
        }
        batch_number += 1;
        let event = json!({"Records": batch.iter().map(|m| sqs_record(m, &spec)).collect::<Vec<_>>()});
        let ids: Vec<String> = batch
            .iter()
            .filter_map(|m| m.message_id().map(str::to_string))
            .collect();
        let at = jiff::Timestamp::now();
        // Duplicate deliveries run at once where the pool has room, as two
        // pollers that received the same message would run them.
        let copies = (0..deliveries(spec.duplicates, batch_number)).map(|_| pool.invoke(&event));
        let mut answers = Vec::new();
        for answer in futures::future::join_all(copies).await {
            match answer {
                Ok(a) => answers.push(a),
                Err(e) => {
                    tracing::info!(error = %e, "event source mapping stops");
                    return;
                }
            }
        }
        // A message is done once any delivery of it succeeded.
        let failed: Vec<String> = ids
            .iter()
            .filter(|id| answers.iter().all(|a| failed_ids(&a.result, &ids).contains(id)))
            .cloned()
            .collect();
        let done: Vec<&Message> = batch
            .iter()
            .filter(|m| !m.message_id().is_some_and(|id| failed.iter().any(|f| f == id)))
            .collect();
        if spec.redeliver_on_crash && answers.iter().any(|a| a.process_ended) {
            let crashed: Vec<&Message> = batch
                .iter()
                .filter(|m| m.message_id().is_some_and(|id| failed.iter().any(|f| f == id)))
                .collect();
            redeliver_now(&sqs, &spec.queue_url, &crashed).await;
        }
        for chunk in done.chunks(10) {
            let entries: Vec<DeleteMessageBatchRequestEntry> = chunk
                .iter()
                .enumerate()
                .filter_map(|(i, m)| {
                    DeleteMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(m.receipt_handle().unwrap_or_default())
                        .build()
                        .ok()
                })
                .collect();
            if let Err(e) = sqs
                .delete_message_batch()
                .queue_url(&spec.queue_url)
                .set_entries(Some(entries))
                .send()
                .await
            {
                tracing::warn!(error = %e, queue = %spec.queue_url, "cannot delete handled messages; they will be delivered again");
            }
        }
        for answer in answers {
            let failed_messages = failed_ids(&answer.result, &ids).len();
            activity.record(Invocation {
                function: pool.name().to_string(),
                trigger: format!("{} messages", batch.len()),
                at,
                memory_mb: pool.memory_mb(),
                answer,
                failed_messages,
            });
        }
    }
}

/// Makes `messages` visible again now (their visibility timeout set to 0).
async fn redeliver_now(sqs: &aws_sdk_sqs::Client, queue_url: &str, messages: &[&Message]) {
    for chunk in messages.chunks(10) {
        let entries: Vec<ChangeMessageVisibilityBatchRequestEntry> = chunk
            .iter()
            .enumerate()
            .filter_map(|(i, m)| {
                ChangeMessageVisibilityBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(m.receipt_handle().unwrap_or_default())
                    .visibility_timeout(0)
                    .build()
                    .ok()
            })
            .collect();
        if let Err(e) = sqs
            .change_message_visibility_batch()
            .queue_url(queue_url)
            .set_entries(Some(entries))
            .send()
            .await
        {
            tracing::warn!(error = %e, queue = %queue_url, "cannot make a crashed batch visible; it returns after its visibility timeout");
        }
    }
}

/// One batch: waits (long polling) for a first message, then gathers more
/// until the batch is full or the batching window has passed (with no
/// window: until nothing more is visible).
async fn collect(sqs: &aws_sdk_sqs::Client, spec: &MappingSpec) -> Vec<Message> {
    let mut batch: Vec<Message> = Vec::new();
    let mut first: Option<Instant> = None;
    loop {
        let wait_secs = match first {
            None => 1,
            Some(t) => spec.window.saturating_sub(t.elapsed()).as_secs().min(1),
        };
        let max = (spec.batch_size - batch.len()).clamp(1, 10) as i32;
        let got = sqs
            .receive_message()
            .queue_url(&spec.queue_url)
            .max_number_of_messages(max)
            .wait_time_seconds(wait_secs as i32)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .send()
            .await;
        let n = match got {
            Ok(out) => {
                batch.extend(out.messages().iter().cloned());
                out.messages().len()
            }
            Err(e) => {
                tracing::warn!(error = %e, queue = %spec.queue_url, "cannot receive");
                tokio::time::sleep(Duration::from_secs(1)).await;
                return batch;
            }
        };
        if batch.is_empty() {
            return batch;
        }
        let started = *first.get_or_insert_with(Instant::now);
        if batch.len() >= spec.batch_size || (n == 0 && spec.window.is_zero()) {
            return batch;
        }
        if !spec.window.is_zero() && started.elapsed() >= spec.window {
            return batch;
        }
        if n == 0 && wait_secs == 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The event EventBridge Scheduler sends the sweep.
fn schedule_event(at: jiff::Timestamp) -> Value {
    json!({"version": "0", "id": format!("schedule-{}", at.as_millisecond()), "detail-type": "Scheduled Event",
        "source": "aws.scheduler", "account": "123456789012", "time": at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        "region": REGION, "resources": ["arn:aws:scheduler:us-east-1:123456789012:schedule/default/nodesmith-sweep"], "detail": "{}"})
}

/// Invokes the sweep once, as its schedule does, and records the invocation.
pub async fn invoke_scheduled(pool: &Pool, activity: &Activity) -> Result<Answer, InvokeError> {
    let at = jiff::Timestamp::now();
    let answer = pool.invoke(&schedule_event(at)).await?;
    activity.record(Invocation {
        function: pool.name().to_string(),
        trigger: "schedule".into(),
        at,
        memory_mb: pool.memory_mb(),
        answer: answer.clone(),
        failed_messages: usize::from(answer.result.is_err()),
    });
    Ok(answer)
}

/// Invokes the sweep every `period` as EventBridge Scheduler would (an
/// invocation still running when the next is due makes that one wait: the
/// sweep's reserved concurrency is 1).
pub async fn run_schedule(period: Duration, pool: Arc<Pool>, activity: Activity) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = invoke_scheduled(&pool, &activity).await {
            tracing::info!(error = %e, "schedule stops");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> Vec<String> {
        vec!["a".into(), "b".into()]
    }

    #[test]
    fn partial_batch_failures_follow_lambda_rules() {
        let cases: &[(Result<String, String>, Vec<&str>)] = &[
            (Ok(r#"{"batchItemFailures":[]}"#.into()), vec![]),
            (
                Ok(r#"{"batchItemFailures":[{"itemIdentifier":"b"}]}"#.into()),
                vec!["b"],
            ),
            (
                Ok(r#"{"batchItemFailures":[{"itemIdentifier":"zz"}]}"#.into()),
                vec!["a", "b"],
            ),
            (
                Ok(r#"{"batchItemFailures":[{"itemIdentifier":""}]}"#.into()),
                vec!["a", "b"],
            ),
            (Ok(r#"{"batchItemFailures":null}"#.into()), vec![]),
            (Ok("".into()), vec![]),
            (Ok("{}".into()), vec![]),
            (Ok("not json".into()), vec!["a", "b"]),
            (Err("boom".into()), vec!["a", "b"]),
        ];
        for (answer, want) in cases {
            assert_eq!(failed_ids(answer, &ids()), *want, "{answer:?}");
        }
    }

    #[test]
    fn duplicates_deliver_each_batch_two_or_three_times() {
        assert_eq!((1..=4).map(|n| deliveries(false, n)).collect::<Vec<_>>(), [1, 1, 1, 1]);
        assert_eq!((1..=4).map(|n| deliveries(true, n)).collect::<Vec<_>>(), [3, 2, 3, 2]);
    }

    #[test]
    fn answers_are_summarised_without_empty_parts() {
        let body = r#"{"skipped":false,"done":2,"failed":0,"disruption":{"launched":["a"],"failed":[]},"solveRequested":"removed"}"#;
        assert_eq!(compact(body), "disruption.launched 1, done 2, solveRequested removed");
        assert_eq!(compact(r#"{"skipped":true}"#), "skipped");
        assert_eq!(compact("plain"), "plain");
    }
}
