//! SQS helpers for tests: queues on moto, draining them, and the event a Lambda
//! event source mapping would hand a function.

use aws_lambda_events::sqs::{SqsEvent, SqsMessage};

/// Creates a queue and returns its URL. Panics on failure (a test's set-up).
pub async fn create_queue(sqs: &aws_sdk_sqs::Client, name: &str) -> String {
    let out = sqs
        .create_queue()
        .queue_name(name)
        .send()
        .await
        .unwrap_or_else(|e| panic!("create queue {name}: {}", aws_sdk_sqs::error::DisplayErrorContext(&e)));
    out.queue_url().unwrap_or_default().to_string()
}

/// Receives and deletes every message on the queue; returns their bodies in order received.
pub async fn drain(sqs: &aws_sdk_sqs::Client, url: &str) -> Vec<String> {
    let mut bodies = Vec::new();
    loop {
        let out = sqs
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .send()
            .await
            .unwrap_or_else(|e| panic!("receive from {url}: {}", aws_sdk_sqs::error::DisplayErrorContext(&e)));
        if out.messages().is_empty() {
            return bodies;
        }
        for msg in out.messages() {
            bodies.push(msg.body().unwrap_or_default().to_string());
            if let Some(handle) = msg.receipt_handle() {
                sqs.delete_message()
                    .queue_url(url)
                    .receipt_handle(handle)
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("delete from {url}: {}", aws_sdk_sqs::error::DisplayErrorContext(&e)));
            }
        }
    }
}

/// An SQS event with one record per (message id, body).
pub fn event<I, S>(messages: I) -> SqsEvent
where
    I: IntoIterator<Item = (S, String)>,
    S: Into<String>,
{
    let mut e = SqsEvent::default();
    e.records = messages
        .into_iter()
        .map(|(id, body)| {
            let mut m = SqsMessage::default();
            m.message_id = Some(id.into());
            m.body = Some(body);
            m
        })
        .collect();
    e
}
