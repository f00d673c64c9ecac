//! The `launch` Lambda: SQS launch requests → EC2 instances, one per NodeClaim.
//! A request the invocation's deadline leaves no time for is handed back unstarted.
//! Metered with the price of every instance it launched as the fleet's change.

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};
use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use nodesmith::kubernetes::KubeCluster;
use nodesmith::lambda::Meter;
use nodesmith::launch::{LaunchConfig, Launcher, batch};

/// Serves `launch` invocations from the Runtime API until Lambda ends the sandbox.
pub async fn serve() -> Result<(), Error> {
    let sdk = nodesmith::lambda::start().await;
    let config = LaunchConfig::from_env()?;
    // EC2NodeClasses are read from the cluster, never taken from a message.
    let kube = KubeCluster::from_env(sdk.clone())?;
    let launcher = Launcher::new(&sdk, kube, config);
    // Last before polling: the meter ends the init phase.
    let meter = Meter::new("launch", Some(launcher.store().clone()));
    let (launcher, meter) = (&launcher, &meter);
    run(service_fn(move |event: LambdaEvent<SqsEvent>| async move {
        meter
            .invoke(event, |payload, deadline| async move {
                let (response, results) = batch::handle_within(launcher, &payload, deadline).await;
                let added = batch::fleet_delta_usd_per_hour(&results);
                nodesmith::telemetry::publish("launch", &batch::metrics(&results));
                (Ok::<SqsBatchResponse, Error>(response), added)
            })
            .await
    }))
    .await
}
