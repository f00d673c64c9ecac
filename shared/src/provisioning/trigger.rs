//! Asking `provision` to solve again: a [`SolveRequest`] on the pending-pods
//! queue. Whoever takes capacity away (launch, sweep, interrupt) sends one so
//! the pods that were waiting on it are placed again within seconds.

use crate::messages::SolveRequest;

/// A solve request could not be queued.
#[derive(Debug, thiserror::Error)]
#[error("queueing a solve request ({reason}): {message}")]
pub struct TriggerError {
    /// The request's reason.
    pub reason: String,
    /// What SQS said.
    pub message: String,
}

/// Sends `request` to the pending-pods queue.
pub async fn request_solve(
    sqs: &aws_sdk_sqs::Client,
    pending_queue_url: &str,
    request: &SolveRequest,
) -> Result<(), TriggerError> {
    sqs.send_message()
        .queue_url(pending_queue_url)
        .message_body(request.to_body())
        .send()
        .await
        .map(|_| ())
        .map_err(|e| TriggerError {
            reason: request.reason.clone(),
            message: aws_sdk_sqs::error::DisplayErrorContext(&e).to_string(),
        })
}
