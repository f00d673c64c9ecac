//! Sending references to the pending-pods queue with SendMessageBatch.

use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
use nodesmith::messages::{NodeRef, PendingPodRef};

/// A message the forwarder sends.
pub trait Outgoing: Clone {
    /// The message body.
    fn body(&self) -> String;
    /// What it names, for logs.
    fn subject(&self) -> String;
}

impl Outgoing for PendingPodRef {
    fn body(&self) -> String {
        self.to_body()
    }
    fn subject(&self) -> String {
        format!("pod {}/{}", self.namespace, self.name)
    }
}

impl Outgoing for NodeRef {
    fn body(&self) -> String {
        self.to_body()
    }
    fn subject(&self) -> String {
        format!("node {}", self.name)
    }
}

/// SQS accepts at most ten entries per SendMessageBatch.
pub const MAX_BATCH: usize = 10;

/// The pending-pods queue.
#[derive(Clone, Debug)]
pub struct SqsSink {
    client: aws_sdk_sqs::Client,
    queue_url: String,
}

impl SqsSink {
    /// A sink for one queue.
    pub fn new(client: aws_sdk_sqs::Client, queue_url: &str) -> Self {
        SqsSink {
            client,
            queue_url: queue_url.to_string(),
        }
    }

    /// Sends the messages in batches of ten; returns the ones to retry
    /// (transient failures). Entries SQS rejects as malformed are dropped and logged.
    pub async fn send<T: Outgoing>(&self, refs: &[T]) -> Vec<T> {
        let mut retry = Vec::new();
        for chunk in refs.chunks(MAX_BATCH) {
            let entries: Vec<SendMessageBatchRequestEntry> = chunk
                .iter()
                .enumerate()
                .filter_map(|(i, r)| {
                    SendMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .message_body(r.body())
                        .build()
                        .ok()
                })
                .collect();
            let out = self
                .client
                .send_message_batch()
                .queue_url(&self.queue_url)
                .set_entries(Some(entries))
                .send()
                .await;
            match out {
                Ok(out) => {
                    for f in out.failed() {
                        let Some(r) = f.id().parse::<usize>().ok().and_then(|i| chunk.get(i)) else {
                            continue;
                        };
                        if f.sender_fault() {
                            tracing::error!(subject = %r.subject(), code = f.code(), message = ?f.message(), "queue rejected the reference; dropping it");
                        } else {
                            retry.push(r.clone());
                        }
                    }
                    tracing::info!(
                        sent = out.successful().len(),
                        failed = out.failed().len(),
                        "sent to the pending-pods queue"
                    );
                }
                Err(e) => {
                    tracing::warn!(error = %aws_sdk_sqs::error::DisplayErrorContext(&e), count = chunk.len(), "SendMessageBatch failed; will retry");
                    retry.extend(chunk.iter().cloned());
                }
            }
        }
        retry
    }
}
