//! The `sweep` Lambda, run every minute by EventBridge Scheduler: one sweep of
//! the node lifecycle under the sweep lease (registration, initialization,
//! timeouts, liveness, garbage collection, the pending-pod safety net) and
//! disruption (expiry, drift, emptiness: `docs/disruption.md`). The
//! scheduler's event carries nothing the sweep needs. Metered with the
//! fleet's change: minus the price of every claim it removed or whose
//! disruption it finished.

use lambda_runtime::{Error, LambdaEvent, run, service_fn};
use nodesmith::catalog::price_list::PriceList;
use nodesmith::deadline::Deadline;
use nodesmith::ec2::Instances;
use nodesmith::kubernetes::KubeCluster;
use nodesmith::lambda::{self, Meter};
use nodesmith::sweep::{SweepConfig, Sweeper};
use nodesmith::zonal_shift::ZonalShifts;
use serde_json::{Value, json};

/// Serves `sweep` invocations from the Runtime API until Lambda ends the sandbox.
pub async fn serve() -> Result<(), Error> {
    let sdk = lambda::start().await;
    let cluster = KubeCluster::from_env(sdk.clone())?;
    let store = lambda::state_store(&sdk)?;
    let instances = Instances::new(
        aws_sdk_ec2::Client::new(&sdk),
        lambda::required_env("NODESMITH_CLUSTER_NAME")?,
    );
    let config = SweepConfig::from_env()?;
    let sweeper = Sweeper::new(
        cluster,
        store.clone(),
        instances,
        aws_sdk_sqs::Client::new(&sdk),
        config,
    )
    .with_iam(aws_sdk_iam::Client::new(&sdk))
    .with_resolution(aws_sdk_ssm::Client::new(&sdk), aws_sdk_eks::Client::new(&sdk))
    .with_price_list(PriceList::for_sdk(&sdk))
    .with_zonal_shift(ZonalShifts::from_env(&sdk)?);
    // Last before polling: the meter ends the init phase.
    let meter = Meter::new("sweep", Some(store));
    let (sweeper, meter) = (&sweeper, &meter);
    run(service_fn(move |event: LambdaEvent<Value>| async move {
        meter
            .invoke(event, |_, deadline| async move {
                match sweep(sweeper, deadline).await {
                    Ok((response, removed)) => (Ok(response), 0.0 - removed),
                    Err(e) => (Err(e), 0.0),
                }
            })
            .await
    }))
    .await
}

/// One sweep within its budget and the invocation's `deadline`, its
/// metrics published: its report as the response, and the $/h of the
/// capacity it gave up.
async fn sweep(sweeper: &Sweeper<KubeCluster>, deadline: Deadline) -> Result<(Value, f64), Error> {
    let report = sweeper.run_within(deadline).await?;
    nodesmith::telemetry::publish("sweep", &report.metrics());
    let response = json!({
        "skipped": report.skipped,
        "done": report.done.len(),
        "failed": report.failed.len(),
        "deferred": report.deferred.len(),
        "solveRequested": report.solve_requested.map(|r| r.reason),
        "nodeClassStatusesWritten": report.classes.written,
        "disruption": {
            "started": report.disruption.started.iter().map(|(n, r)| json!({"node": n, "reason": r.to_string()})).collect::<Vec<_>>(),
            "launched": report.disruption.launched,
            "draining": report.disruption.draining,
            "terminated": report.disruption.terminated,
            "abandoned": report.disruption.abandoned.iter().map(|(n, w)| json!({"node": n, "why": w})).collect::<Vec<_>>(),
            "blocked": report.disruption.blocked.iter().map(|(n, w)| json!({"node": n, "why": w})).collect::<Vec<_>>(),
            "failed": report.disruption.failed.iter().map(|(n, e)| json!({"node": n, "error": e.to_string()})).collect::<Vec<_>>(),
        },
    });
    Ok((response, report.removed_usd_per_hour))
}
