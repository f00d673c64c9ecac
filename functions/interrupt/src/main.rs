//! The `interrupt` Lambda. Its logic is not built yet: it refuses every event with a
//! clear error so that nothing is silently dropped (SQS redelivers, then the DLQ keeps it).

use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use serde_json::Value;

async fn handler(event: LambdaEvent<Value>) -> Result<Value, Error> {
    tracing::error!(request_id = %event.context.request_id, "the interrupt function is not implemented in this release; event left for retry");
    Err("the interrupt function is not implemented in this release".into())
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    nodesmith::telemetry::init();
    run(service_fn(handler)).await
}
