//! The `launch` Lambda: SQS launch requests → EC2 instances, one per NodeClaim.

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};
use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use nodesmith::launch::{LaunchConfig, Launcher, batch};

#[tokio::main]
async fn main() -> Result<(), Error> {
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_target(false)
        .without_time()
        .init();
    let config = LaunchConfig::from_env()?;
    // Throttling and 5xx are retried by the SDK with exponential backoff and jitter.
    let sdk = aws_config::from_env()
        .retry_config(aws_config::retry::RetryConfig::standard().with_max_attempts(5))
        .load()
        .await;
    let launcher = Launcher::new(&sdk, config);
    let launcher = &launcher;
    run(service_fn(move |event: LambdaEvent<SqsEvent>| async move {
        let (response, _) = batch::handle(launcher, &event.payload).await;
        Ok::<SqsBatchResponse, Error>(response)
    }))
    .await
}
