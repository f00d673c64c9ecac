//! The `interrupt` Lambda: a batch of EventBridge events from the interruption
//! queue → taint, replace, drain or remove the capacity they name
//! (`nodesmith::interruption::handler`), with partial batch failures; an
//! event its deadline leaves no time for is given back untouched.
//! Metered with the fleet's change: minus the price of every claim whose
//! capacity it found gone and removed.

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};
use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use nodesmith::interruption::handler::{InterruptConfig, Interrupter};
use nodesmith::kubernetes::KubeCluster;
use nodesmith::lambda::{self, Meter};

/// Serves `interrupt` invocations from the Runtime API until Lambda ends the sandbox.
pub async fn serve() -> Result<(), Error> {
    let sdk = lambda::start().await;
    let cluster = KubeCluster::from_env(sdk.clone())?;
    let store = lambda::state_store(&sdk)?;
    let config = InterruptConfig::from_env()?;
    let interrupter = Interrupter::new(cluster, store.clone(), aws_sdk_sqs::Client::new(&sdk), config);
    // Last before polling: the meter ends the init phase.
    let meter = Meter::new("interrupt", Some(store));
    let (interrupter, meter) = (&interrupter, &meter);
    run(service_fn(move |event: LambdaEvent<SqsEvent>| async move {
        meter
            .invoke(event, |payload, deadline| async move {
                let outcome = interrupter.handle_within(&payload, deadline).await;
                nodesmith::telemetry::publish("interrupt", &outcome.metrics());
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
                (
                    Ok::<SqsBatchResponse, Error>(outcome.response()),
                    0.0 - outcome.removed_usd_per_hour,
                )
            })
            .await
    }))
    .await
}
