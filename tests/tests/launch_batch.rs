//! SQS batches through the launch handler: the provision entry points
//! (fenced NodeClaim writes + SendMessageBatch), partial batch failures,
//! malformed and oversized messages, the dead-letter queue.

use crate::launch_fixtures::*;
use aws_lambda_events::sqs::{SqsEvent, SqsMessage};
use nodesmith::launch::{LaunchError, LaunchOutcome, batch};
use nodesmith::messages::launch_requests::{self as request, LaunchRequest, MAX_BODY_BYTES};
use nodesmith::state;
use nodesmith_tests::kube_server::KubeServer;
use nodesmith_tests::moto::moto;

fn message(id: &str, body: &str) -> SqsMessage {
    let mut m = SqsMessage::default();
    m.message_id = Some(id.into());
    m.body = Some(body.into());
    m
}

#[tokio::test]
async fn a_batch_reports_only_its_bad_records() {
    let m = moto().await;
    world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let l = launcher(&m, m.endpoint(), &kube).await;
    let class = node_class("al2023@latest");
    let good = pending(&kube, &st, &claim("batch-1", &["m5.large"], &["on-demand"]), &class).await;
    let body = good.to_body().unwrap();
    let mut event = SqsEvent::default();
    event.records = vec![
        message("m-good", &body),
        message("m-garbage", "{\"nodeClaim\": 42}"),
        message(
            "m-huge",
            &format!("{{\"nodeClaim\":\"{}\"}}", "x".repeat(MAX_BODY_BYTES)),
        ),
        message("m-dup", &body),
    ];
    let (resp, results) = batch::handle(&l, &event).await;
    let failed: Vec<&str> = resp
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.as_str())
        .collect();
    assert_eq!(failed, vec!["m-garbage", "m-huge"]);
    let why = |id: &str| {
        results
            .iter()
            .find(|r| r.message_id.as_deref() == Some(id))
            .unwrap()
            .result
            .as_ref()
            .unwrap_err()
            .to_string()
    };
    assert!(
        why("m-garbage").contains("nodeClaim") && why("m-garbage").contains("invalid type"),
        "{}",
        why("m-garbage")
    );
    assert!(
        why("m-huge").contains("over the 262144-byte limit"),
        "{}",
        why("m-huge")
    );
    // The good request and its duplicate in the same batch: one instance.
    assert_eq!(instances_of(&m, "batch-1").await.len(), 1);
    let ok: Vec<&LaunchOutcome> = results.iter().filter_map(|r| r.result.as_ref().ok()).collect();
    assert_eq!(ok.len(), 2);
    assert!(
        results
            .iter()
            .all(|r| !matches!(r.result, Err(LaunchError::Aws { .. })))
    );
}

#[tokio::test]
async fn a_lambda_test_event_in_json_is_handled() {
    let m = moto().await;
    world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let l = launcher(&m, m.endpoint(), &kube).await;
    let req = pending(
        &kube,
        &st,
        &claim("json-1", &["m5.large"], &["on-demand"]),
        &node_class("al2023@latest"),
    )
    .await;
    // The shape Lambda delivers (and `cargo lambda invoke --data-file` sends).
    let event: SqsEvent = serde_json::from_value(serde_json::json!({
        "Records": [
            {"messageId": "1", "receiptHandle": "r1", "body": req.to_body().unwrap(), "attributes": {}, "messageAttributes": {},
             "md5OfBody": "", "eventSource": "aws:sqs", "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:launch", "awsRegion": "us-east-1"},
            {"messageId": "2", "receiptHandle": "r2", "body": "not json", "attributes": {}, "messageAttributes": {},
             "md5OfBody": "", "eventSource": "aws:sqs", "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:launch", "awsRegion": "us-east-1"}
        ]
    }))
    .unwrap();
    let (resp, _) = batch::handle(&l, &event).await;
    assert_eq!(
        serde_json::to_value(&resp).unwrap(),
        serde_json::json!({"batchItemFailures": [{"itemIdentifier": "2"}]})
    );
    assert_eq!(instances_of(&m, "json-1").await.len(), 1);
}

#[tokio::test]
async fn provision_entry_points_then_sqs_redelivery_and_dead_letters_lose_nothing() {
    let m = moto().await;
    world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let conf = m.sdk_config().await;
    let sqs = aws_sdk_sqs::Client::new(&conf);
    let dlq = sqs
        .create_queue()
        .queue_name("launch-dlq")
        .send()
        .await
        .unwrap()
        .queue_url()
        .unwrap()
        .to_string();
    let dlq_arn = sqs
        .get_queue_attributes()
        .queue_url(&dlq)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::QueueArn)
        .send()
        .await
        .unwrap()
        .attributes()
        .unwrap()[&aws_sdk_sqs::types::QueueAttributeName::QueueArn]
        .clone();
    let queue = sqs
        .create_queue()
        .queue_name("launch")
        .attributes(aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout, "0")
        .attributes(
            aws_sdk_sqs::types::QueueAttributeName::RedrivePolicy,
            serde_json::json!({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "2"}).to_string(),
        )
        .send()
        .await
        .unwrap()
        .queue_url()
        .unwrap()
        .to_string();

    // What provision does: write its NodeClaims under the solve lease, then enqueue one request each.
    let lease = st
        .acquire_lease("provision", "solver-1", 60_000, state::now_ms())
        .await
        .unwrap()
        .unwrap();
    put_class(&kube, "default", &node_class("al2023@latest"));
    let claims: Vec<_> = (0..12)
        .map(|i| claim(&format!("q-{i:02}"), &["m5.large"], &["on-demand"]))
        .collect();
    st.create_node_claims_fenced(&lease, &claims, state::now_ms())
        .await
        .unwrap();
    let requests: Vec<LaunchRequest> = claims.iter().map(|c| LaunchRequest::new(&c.name)).collect();
    request::enqueue(&sqs, &queue, &requests).await.unwrap();
    // A redelivered duplicate and a poison message ride along.
    sqs.send_message()
        .queue_url(&queue)
        .message_body(requests[0].to_body().unwrap())
        .send()
        .await
        .unwrap();
    // The poison: the old format, which carried a class (never used, so refused).
    let poison = serde_json::json!({"nodeClaim": "q-00", "nodeClassName": "default",
        "nodeClass": {"instanceProfile": "Chosen", "amiSelectorTerms": [{"alias": "al2023@latest"}]}})
    .to_string();
    sqs.send_message()
        .queue_url(&queue)
        .message_body(&poison)
        .send()
        .await
        .unwrap();

    // The event source mapping: receive, invoke, delete what did not fail.
    let l = launcher(&m, m.endpoint(), &kube).await;
    let mut rounds = 0;
    loop {
        rounds += 1;
        assert!(rounds < 10, "queue never drained");
        let got = sqs
            .receive_message()
            .queue_url(&queue)
            .max_number_of_messages(10)
            .send()
            .await
            .unwrap();
        let msgs = got.messages().to_vec();
        if msgs.is_empty() {
            break;
        }
        let mut event = SqsEvent::default();
        event.records = msgs
            .iter()
            .map(|x| message(x.message_id().unwrap(), x.body().unwrap()))
            .collect();
        let (resp, _) = batch::handle(&l, &event).await;
        for x in &msgs {
            if !resp
                .batch_item_failures
                .iter()
                .any(|f| Some(f.item_identifier.as_str()) == x.message_id())
            {
                sqs.delete_message()
                    .queue_url(&queue)
                    .receipt_handle(x.receipt_handle().unwrap())
                    .send()
                    .await
                    .unwrap();
            }
        }
    }
    for c in &claims {
        assert_eq!(instances_of(&m, &c.name).await.len(), 1, "{}", c.name);
        assert_eq!(
            st.get_node_claim(&c.name).await.unwrap().unwrap().phase,
            nodesmith::nodeclaim::Phase::Launched
        );
    }
    let dead = sqs
        .receive_message()
        .queue_url(&dlq)
        .max_number_of_messages(10)
        .send()
        .await
        .unwrap();
    let bodies: Vec<&str> = dead.messages().iter().filter_map(|x| x.body()).collect();
    assert_eq!(
        bodies,
        vec![poison.as_str()],
        "only the poison message is dead-lettered"
    );
}

/// One claim pending launch, its request as a one-record batch, and a
/// launcher (reserve 1 s) whose AWS calls pass a proxy that answers the next
/// call of `action` `late`, after the work is done.
struct Slow {
    m: nodesmith_tests::moto::Moto,
    st: state::StateStore,
    req: LaunchRequest,
    event: SqsEvent,
    l: nodesmith::launch::Launcher,
    _kube: KubeServer,
    _proxy: nodesmith_tests::fault_proxy::FaultProxy,
}

/// [`Slow`] for claim `name`.
async fn slow(name: &str, action: &str, late: std::time::Duration) -> Slow {
    let m = moto().await;
    world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let proxy = nodesmith_tests::fault_proxy::FaultProxy::start(m.endpoint()).await;
    let class = node_class("al2023@latest");
    let req = pending(&kube, &st, &claim(name, &["m5.large"], &["on-demand"]), &class).await;
    let mut event = SqsEvent::default();
    event.records = vec![message(&format!("m-{name}"), &req.to_body().unwrap())];
    proxy.answer_late(action, 1, late);
    let config = nodesmith::launch::LaunchConfig {
        reserve: std::time::Duration::from_secs(1),
        ..launch_config()
    };
    let l = launcher_configured(&m, proxy.endpoint(), &kube, config).await;
    Slow {
        m,
        st,
        req,
        event,
        l,
        _kube: kube,
        _proxy: proxy,
    }
}

/// A launch still under way when the invocation's time runs out is cut
/// there, so the invocation answers for its batch instead of being ended by
/// Lambda: the record goes back to SQS, the claim's lease stays held (its
/// CreateFleet may have gone through), and the redelivery after the hold ends
/// with one instance.
#[tokio::test]
async fn a_launch_still_under_way_at_the_deadline_is_handed_back_and_not_launched_twice() {
    use nodesmith::deadline::Deadline;
    use std::time::Duration;
    // CreateFleet launches, but its answer comes long after the deadline.
    let s = slow("cut-1", "CreateFleet", Duration::from_secs(60)).await;
    let (resp, results) = batch::handle_within(&s.l, &s.event, Deadline::after(Duration::from_secs(4))).await;
    let failed: Vec<&str> = resp
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.as_str())
        .collect();
    assert_eq!(failed, ["m-cut-1"]);
    assert!(
        matches!(&results[0].result, Err(LaunchError::OutOfTime(c)) if c == "cut-1"),
        "{:?}",
        results[0].result
    );
    // Redelivered at once: the lease is held, nothing is launched again.
    let again = s.l.launch(&s.req).await;
    assert!(matches!(again, Err(LaunchError::Busy(_))), "{again:?}");
    // After the hold: one instance, found or launched.
    expire_lease(&s.st, "cut-1").await;
    let last = s.l.launch(&s.req).await.unwrap();
    assert!(
        matches!(last, LaunchOutcome::Launched(_) | LaunchOutcome::Recovered(_)),
        "{last:?}"
    );
    assert_eq!(instances_of(&s.m, "cut-1").await.len(), 1);
}

/// Whatever step a request is in when the deadline comes (here reading its
/// claim, before any lease), the invocation answers for its batch, and the
/// redelivery launches once.
#[tokio::test]
async fn a_request_slow_before_its_launch_is_handed_back_at_the_deadline() {
    use nodesmith::deadline::Deadline;
    use std::time::Duration;
    // The claim's read answers long after the deadline.
    let s = slow("slow-1", "GetItem", Duration::from_secs(120)).await;
    let deadline = Deadline::after(Duration::from_secs(3));
    let (resp, results) = batch::handle_within(&s.l, &s.event, deadline).await;
    // Not a measure of speed: the answer comes at the deadline, not two minutes on with the read.
    assert!(
        deadline.instant() + Duration::from_secs(60) > tokio::time::Instant::now(),
        "answered when the slow read came back, long past the deadline"
    );
    assert_eq!(resp.batch_item_failures.len(), 1, "{resp:?}");
    assert!(
        matches!(&results[0].result, Err(LaunchError::OutOfTime(c)) if c == "slow-1"),
        "{:?}",
        results[0].result
    );
    assert!(instances_of(&s.m, "slow-1").await.is_empty(), "nothing launched");
    expire_lease(&s.st, "slow-1").await;
    let last = s.l.launch(&s.req).await.unwrap();
    assert!(matches!(last, LaunchOutcome::Launched(_)), "{last:?}");
    assert_eq!(instances_of(&s.m, "slow-1").await.len(), 1);
}

#[tokio::test]
async fn requests_the_deadline_leaves_no_time_for_are_handed_back_unstarted() {
    use nodesmith::deadline::Deadline;
    use std::time::Duration;
    let m = moto().await;
    world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let l = launcher(&m, m.endpoint(), &kube).await;
    let class = node_class("al2023@latest");
    let req = pending(&kube, &st, &claim("late-1", &["m5.large"], &["on-demand"]), &class).await;
    let mut event = SqsEvent::default();
    event.records = vec![message("m-late", &req.to_body().unwrap())];
    let near = Deadline::after(batch::LAUNCH_RESERVE - Duration::from_secs(1));
    let (resp, results) = batch::handle_within(&l, &event, near).await;
    let failed: Vec<&str> = resp
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.as_str())
        .collect();
    assert_eq!(failed, ["m-late"]);
    assert!(
        matches!(results[0].result, Err(LaunchError::NotStarted { .. })),
        "{:?}",
        results[0].result
    );
    assert!(instances_of(&m, "late-1").await.is_empty(), "nothing launched");
    // Redelivered with time: launched.
    let (resp, _) = batch::handle_within(&l, &event, Deadline::after(Duration::from_secs(60))).await;
    assert!(resp.batch_item_failures.is_empty());
    assert_eq!(instances_of(&m, "late-1").await.len(), 1);
}
