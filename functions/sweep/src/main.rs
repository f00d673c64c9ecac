//! The `sweep` Lambda, run every minute by EventBridge Scheduler: one sweep of
//! the node lifecycle under the sweep lease (registration, initialization,
//! timeouts, liveness, garbage collection, the pending-pod safety net). The
//! scheduler's event carries nothing the sweep needs.

use std::collections::BTreeMap;

use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use nodesmith::ec2::Instances;
use nodesmith::kubernetes::KubeCluster;
use nodesmith::state::StateStore;
use nodesmith::sweep::{SweepConfig, Sweeper};
use serde_json::{Value, json};

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
    let instances = Instances::new(aws_sdk_ec2::Client::new(&sdk), env("NODESMITH_CLUSTER_NAME")?);
    let config = SweepConfig::from_env()?;
    let sweeper = Sweeper::new(cluster, store, instances, aws_sdk_sqs::Client::new(&sdk), config)
        .with_iam(aws_sdk_iam::Client::new(&sdk));
    let sweeper = &sweeper;
    run(service_fn(move |_: LambdaEvent<Value>| async move {
        let report = sweeper.run().await?;
        let dimensions = BTreeMap::from([("Function", "sweep".to_string())]);
        nodesmith::telemetry::publish(&dimensions, &report.metrics());
        Ok::<Value, Error>(json!({
            "skipped": report.skipped,
            "done": report.done.len(),
            "failed": report.failed.len(),
            "deferred": report.deferred.len(),
            "solveRequested": report.solve_requested.map(|r| r.reason),
        }))
    }))
    .await
}
