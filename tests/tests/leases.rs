//! Leases under DynamoDB's concurrency rules, through the fault proxy: a
//! transaction that meets another write of one of its items is cancelled
//! (`TransactionConflict`), a waiter's write to the lease item cancels the
//! holder's fenced transactions, and any call can fail transiently.

use std::time::{Duration, Instant};

use aws_sdk_dynamodb::config::retry::RetryConfig;
use nodesmith::capacity::Door;
use nodesmith::nodeclaim::NodeClaim;
use nodesmith::state::{self, StateStore, now_ms};
use nodesmith_tests::fault_proxy::FaultProxy;
use nodesmith_tests::moto::{Moto, moto};

const TABLE: &str = "nodesmith";

/// A store whose calls go to `endpoint` (moto, or the proxy in front of it);
/// `sdk_retries: false` lets every error reach nodesmith's own code.
async fn store_at(m: &Moto, endpoint: &str, sdk_retries: bool) -> StateStore {
    let sdk = m.sdk_config_at(endpoint).await;
    let mut conf = aws_sdk_dynamodb::config::Builder::from(&sdk);
    if !sdk_retries {
        conf = conf.retry_config(RetryConfig::disabled());
    }
    StateStore::new(aws_sdk_dynamodb::Client::from_conf(conf.build()), TABLE)
}

/// The table, made through moto directly.
async fn table(m: &Moto) -> StateStore {
    let st = store_at(m, m.endpoint(), true).await;
    state::create_table(st.client(), TABLE).await.unwrap();
    st
}

fn claim(name: &str) -> NodeClaim {
    NodeClaim {
        instance_type_options: vec!["m5.large".into()],
        ..NodeClaim::pending(name, "default", "default")
    }
}

#[tokio::test]
async fn a_holders_claim_write_survives_a_transaction_conflict() {
    let m = moto().await;
    table(&m).await;
    let proxy = FaultProxy::start(m.endpoint()).await;
    let st = store_at(&m, proxy.endpoint(), true).await;
    let lease = st
        .acquire_lease("provision", "solver", 60_000, now_ms())
        .await
        .unwrap()
        .expect("a free lease is taken");
    // Another write met the transaction on one of its items: DynamoDB cancels
    // it (nothing written) and the writer may try again.
    proxy.transaction_conflict(1);
    let made = st
        .create_node_claims_fenced(&lease, &[claim("conflict-1")], now_ms())
        .await
        .unwrap_or_else(|e| {
            panic!(
                "one TransactionConflict failed the claim write: {}",
                nodesmith::telemetry::causes(&e)
            )
        });
    assert_eq!(made.len(), 1);
    assert!(st.get_node_claim("conflict-1").await.unwrap().is_some());
    assert_eq!(proxy.failed("TransactWriteItems"), 1);
    assert_eq!(proxy.calls("TransactWriteItems"), 2, "written on the second try");
}

#[tokio::test]
async fn renewal_survives_a_transient_error() {
    let m = moto().await;
    table(&m).await;
    let proxy = FaultProxy::start(m.endpoint()).await;
    let st = store_at(&m, proxy.endpoint(), false).await;
    let ttl = Duration::from_millis(600);
    let lease = st
        .acquire_lease("provision", "solver", ttl.as_millis() as i64, now_ms())
        .await
        .unwrap()
        .expect("a free lease is taken");
    // The first renewal meets a transient DynamoDB failure.
    proxy.fail_dynamo_next("UpdateItem", 1, 500, "InternalServerError", "Internal server error");
    let work = async {
        // Work on until the failed renewal and two after it were sent (the
        // proxy's count, not a guess at timing), and past the time the lease
        // would have expired had it not been renewed since.
        let deadline = Instant::now() + Duration::from_secs(5);
        while (proxy.calls("UpdateItem") < 4 || now_ms() <= lease.until_ms + 100) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        st.create_node_claims_fenced(&lease, &[claim("after-error")], now_ms())
            .await
    };
    let written = st.while_holding(&lease, ttl, work).await;
    assert_eq!(proxy.failed("UpdateItem"), 1);
    if let Err(e) = written {
        panic!(
            "the lease was lost after one failed renewal ({} renewals sent): {}",
            proxy.calls("UpdateItem") - 1,
            nodesmith::telemetry::causes(&e)
        );
    }
}

#[tokio::test]
async fn a_waiter_does_not_write_while_the_lease_is_held() {
    let m = moto().await;
    let holder = table(&m).await;
    let proxy = FaultProxy::start(m.endpoint()).await;
    // Only the waiter goes through the proxy: every write it counts is the waiter's.
    let waiter = store_at(&m, proxy.endpoint(), true).await;
    let held = holder
        .acquire_lease("provision", "holder", 30_000, now_ms())
        .await
        .unwrap()
        .expect("a free lease is taken");
    let got = waiter
        .acquire_lease_within(
            "provision",
            "waiter",
            Duration::from_secs(15),
            Duration::from_millis(500),
        )
        .await
        .unwrap();
    assert_eq!(got, None, "the lease is held");
    let writes: usize = ["UpdateItem", "PutItem", "DeleteItem", "TransactWriteItems"]
        .iter()
        .map(|a| proxy.calls(a))
        .sum();
    assert_eq!(
        writes, 0,
        "a waiter wrote to the lease item while it was held (a write there cancels the holder's fenced transactions)"
    );
    assert!(proxy.calls("GetItem") >= 2, "the waiter polls by reading");

    // Once the holder lets go, the waiter takes it, with one write.
    holder.release_lease(&held, now_ms()).await.unwrap();
    let got = waiter
        .acquire_lease_within("provision", "waiter", Duration::from_secs(15), Duration::from_secs(5))
        .await
        .unwrap()
        .expect("a released lease is taken");
    assert_eq!(got.version, 2);
    assert_eq!(proxy.calls("UpdateItem"), 1);
}

#[tokio::test]
async fn two_invocations_in_one_process_do_not_share_a_holder() {
    let m = moto().await;
    let st = table(&m).await;
    let sqs = aws_sdk_sqs::Client::new(&m.sdk_config().await);
    // One container's door: its settings (and the holder name in them) are built once.
    let door = Door {
        store: &st,
        sqs: &sqs,
        launch_queue_url: "unused",
        holder: "provision-container-1",
        lease_ttl: Duration::from_secs(30),
        lease_wait: Duration::ZERO,
        release_by: nodesmith::deadline::Deadline::outside_lambda(),
    };
    let (inside_tx, inside_rx) = tokio::sync::oneshot::channel();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let first = door.under_lease(|lease| async move {
        let _ = inside_tx.send(lease.clone());
        let _ = done_rx.await;
        lease
    });
    let second = async {
        let first_lease = inside_rx.await.expect("the first invocation holds the lease");
        let second = door.under_lease(|lease| async move { lease }).await.unwrap();
        let _ = done_tx.send(());
        (first_lease, second)
    };
    let (first, (first_lease, second)) = tokio::join!(first, second);
    first.unwrap().expect("the first invocation ran");
    assert_eq!(
        second, None,
        "a second invocation in the same container took the lease its first invocation held"
    );
    let third = door
        .under_lease(|lease| async move { lease })
        .await
        .unwrap()
        .expect("a released lease is taken");
    assert_ne!(third.holder, first_lease.holder, "holder identities are per invocation");
    assert!(third.version > first_lease.version);
}
