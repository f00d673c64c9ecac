//! Giving a failed message back to its queue sooner than the queue's
//! visibility timeout would. Lambda's SQS poller leaves a failed record
//! invisible for the whole timeout (the interruption queue's is 30 minutes,
//! six times the function's), far past a spot warning's two minutes; a
//! consumer that knows the failure is worth retrying at once shortens it with
//! `ChangeMessageVisibility`.

use std::time::Duration;

use aws_sdk_sqs::error::SdkError;
use aws_sdk_sqs::operation::change_message_visibility::ChangeMessageVisibilityError;

/// The first retry's delay; each later receive doubles it.
pub const FIRST_RETRY: Duration = Duration::from_secs(5);

/// The longest delay [`retry_delay`] gives.
pub const LONGEST_RETRY: Duration = Duration::from_secs(60);

/// A message could not be given back early (it returns after the queue's
/// visibility timeout instead).
#[derive(Debug, thiserror::Error)]
#[error("changing the visibility of a failed message")]
pub struct RedeliveryError(#[source] pub SdkError<ChangeMessageVisibilityError>);

/// How long a message received `receive_count` times stays invisible after
/// failing (pure): `first`, doubled at each further receive, at most
/// [`LONGEST_RETRY`]. The backoff keeps a dependency's outage of a minute
/// or two from sending the message to the dead-letter queue (the queue's
/// `maxReceiveCount` is 5) while a spot warning is still retried several
/// times within its two minutes.
pub fn retry_delay(first: Duration, receive_count: u32) -> Duration {
    let doublings = receive_count.saturating_sub(1).min(16);
    first.saturating_mul(1 << doublings).min(LONGEST_RETRY.max(first))
}

/// The receive count Lambda passes in a record's attributes (1 when absent or unreadable).
pub fn receive_count(attributes: &std::collections::HashMap<String, String>) -> u32 {
    attributes
        .get("ApproximateReceiveCount")
        .and_then(|c| c.parse().ok())
        .unwrap_or(1)
}

/// Makes the message behind `receipt_handle` visible again after `after`.
pub async fn redeliver_after(
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    receipt_handle: &str,
    after: Duration,
) -> Result<(), RedeliveryError> {
    // SQS takes whole seconds, 0 to 12 hours.
    let secs = after.as_secs().min(12 * 3600) as i32;
    sqs.change_message_visibility()
        .queue_url(queue_url)
        .receipt_handle(receipt_handle)
        .visibility_timeout(secs)
        .send()
        .await
        .map(|_| ())
        .map_err(RedeliveryError)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_from_seconds_to_a_minute() {
        let d = |n| retry_delay(FIRST_RETRY, n).as_secs();
        assert_eq!([d(0), d(1), d(2), d(3), d(4), d(5), d(40)], [5, 5, 10, 20, 40, 60, 60]);
        // Well inside a spot warning's two minutes for the first retries.
        assert!((1..=3).map(|n| retry_delay(FIRST_RETRY, n)).sum::<Duration>() < Duration::from_secs(60));
        assert_eq!(retry_delay(Duration::ZERO, 3), Duration::ZERO);
    }

    #[test]
    fn the_receive_count_comes_from_the_record() {
        let mut a = std::collections::HashMap::new();
        assert_eq!(receive_count(&a), 1);
        a.insert("ApproximateReceiveCount".to_string(), "3".to_string());
        assert_eq!(receive_count(&a), 3);
        a.insert("ApproximateReceiveCount".to_string(), "x".to_string());
        assert_eq!(receive_count(&a), 1);
    }
}
