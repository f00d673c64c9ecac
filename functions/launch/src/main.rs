//! The `launch` Lambda: SQS launch requests → EC2 instances, one per NodeClaim.

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};
use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use nodesmith::kubernetes::KubeCluster;
use nodesmith::launch::{LaunchConfig, Launcher, batch};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let sdk = nodesmith::lambda::start().await;
    let config = LaunchConfig::from_env()?;
    // EC2NodeClasses are read from the cluster, never taken from a message.
    let kube = KubeCluster::from_env(sdk.clone())?;
    let launcher = Launcher::new(&sdk, kube, config);
    let launcher = &launcher;
    run(service_fn(move |event: LambdaEvent<SqsEvent>| async move {
        let (response, _) = batch::handle(launcher, &event.payload).await;
        Ok::<SqsBatchResponse, Error>(response)
    }))
    .await
}
