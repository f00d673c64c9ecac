//! The `interrupt` Lambda: a batch of EventBridge events from the interruption
//! queue → taint, replace, drain or remove the capacity they name
//! (`nodesmith::interruption::handler`), with partial batch failures.

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};
use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use nodesmith::interruption::handler::{InterruptConfig, Interrupter};
use nodesmith::kubernetes::KubeCluster;
use nodesmith::state::StateStore;

/// Reads a required environment variable, naming it when missing.
fn env(name: &str) -> Result<String, Error> {
    std::env::var(name).map_err(|_| format!("environment variable {name} is not set").into())
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    nodesmith::telemetry::init();
    let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let cluster = KubeCluster::from_env(sdk.clone())?;
    let store = StateStore::new(aws_sdk_dynamodb::Client::new(&sdk), env("NODESMITH_TABLE")?);
    let config = InterruptConfig::from_env()?;
    let interrupter = Interrupter::new(cluster, store, aws_sdk_sqs::Client::new(&sdk), config);
    let interrupter = &interrupter;
    run(service_fn(move |event: LambdaEvent<SqsEvent>| async move {
        let outcome = interrupter.handle(&event.payload).await;
        tracing::info!(
            tainted = outcome.tainted.len(),
            replacements = outcome.replacements.len(),
            removed = outcome.removed.len(),
            drained = outcome.drained.len(),
            ignored = outcome.ignored,
            unknown = outcome.unknown,
            failed = outcome.failed.len(),
            "batch done"
        );
        Ok::<SqsBatchResponse, Error>(outcome.response())
    }))
    .await
}
