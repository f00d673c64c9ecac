//! The `provision` Lambda: a batch of pending-pod references from SQS → one
//! solve → NodeClaims in DynamoDB and launch requests on the launch queue.
//! Done by the invocation's deadline: a batch it leaves no time to solve is
//! handed back, events come last and stop at the deadline.
//! Metered with no change to the fleet's price: a planned claim is not
//! capacity yet, and launch reports the price of the offering EC2 gave it.

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};
use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use nodesmith::catalog::price_list::PriceList;
use nodesmith::kubernetes::KubeCluster;
use nodesmith::lambda::{self, Meter};
use nodesmith::provisioning::{ProvisionConfig, Provisioner};
use nodesmith::zonal_shift::ZonalShifts;

/// Serves `provision` invocations from the Runtime API until Lambda ends the sandbox.
pub async fn serve() -> Result<(), Error> {
    let sdk = lambda::start().await;
    let cluster = KubeCluster::from_env(sdk.clone())?;
    let store = lambda::state_store(&sdk)?;
    let config = ProvisionConfig::from_env()?;
    let provisioner = Provisioner::new(cluster, store.clone(), aws_sdk_sqs::Client::new(&sdk), config)
        .with_ec2(aws_sdk_ec2::Client::new(&sdk))
        .with_price_list(PriceList::for_sdk(&sdk))
        .with_zonal_shift(ZonalShifts::from_env(&sdk)?);
    // Last before polling: the meter ends the init phase.
    let meter = Meter::new("provision", Some(store));
    let (provisioner, meter) = (&provisioner, &meter);
    run(service_fn(move |event: LambdaEvent<SqsEvent>| async move {
        meter
            .invoke(event, |batch, deadline| async move {
                let outcome = provisioner.handle_within(&batch, deadline).await;
                nodesmith::telemetry::publish("provision", &outcome.metrics());
                tracing::info!(
                    created = outcome.created.len(),
                    joined = outcome.joined.len(),
                    placed_on_existing = outcome.placed_on_existing,
                    unschedulable = outcome.unschedulable.len(),
                    failed = outcome.failed.len(),
                    handed_on = outcome.handed_on,
                    events_written = outcome.events.written,
                    events_skipped = outcome.events.skipped(),
                    "batch done"
                );
                (Ok::<SqsBatchResponse, Error>(outcome.response()), 0.0)
            })
            .await
    }))
    .await
}
