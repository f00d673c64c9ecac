//! The `launch` binary under a local Lambda Runtime API: it starts, reads its
//! configuration (the Kubernetes API from `NODESMITH_KUBE_URL`), handles an
//! SQS event against moto and answers with partial batch failures; without
//! configuration it stops with a clear message.

use std::collections::BTreeMap;

use nodesmith_tests::lambda_runtime::{Invocation, invoke};
use nodesmith_tests::moto::moto;

#[tokio::test]
async fn binary_handles_an_sqs_event_against_moto() {
    let m = moto().await;
    let ddb = aws_sdk_dynamodb::Client::new(&m.sdk_config().await);
    nodesmith::state::create_table(&ddb, "nodesmith").await.unwrap();

    let event = serde_json::json!({"Records": [
        {"messageId": "gone", "receiptHandle": "r1", "eventSource": "aws:sqs", "awsRegion": "us-east-1",
         "body": serde_json::json!({"nodeClaim": "no-such-claim"}).to_string()},
        {"messageId": "poison", "receiptHandle": "r2", "eventSource": "aws:sqs", "awsRegion": "us-east-1", "body": "{"},
        // The old format, which carried the class: refused, so no one can pick the instance profile.
        {"messageId": "carries-class", "receiptHandle": "r3", "eventSource": "aws:sqs", "awsRegion": "us-east-1",
         "body": serde_json::json!({"nodeClaim": "no-such-claim", "nodeClassName": "default", "nodeClass": {
            "amiSelectorTerms": [{"alias": "al2023@latest"}], "instanceProfile": "Chosen",
            "subnetSelectorTerms": [{"tags": {"a": "b"}}], "securityGroupSelectorTerms": [{"tags": {"a": "b"}}]}}).to_string()}
    ]});
    let mut env: BTreeMap<String, String> = m.env().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    env.insert("NODESMITH_TABLE".into(), "nodesmith".into());
    env.insert("NODESMITH_CLUSTER_NAME".into(), "demo".into());
    let Invocation { path, body, init, .. } = invoke("launch", &env, &event).await.unwrap();
    // Reported, not asserted: timing depends on the machine.
    eprintln!("launch init (spawn → first poll of the Runtime API): {init:?}");
    assert_eq!(path, "req-1/response");
    let resp: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        resp,
        serde_json::json!({"batchItemFailures": [{"itemIdentifier": "poison"}, {"itemIdentifier": "carries-class"}]})
    );
}

#[tokio::test]
async fn binary_without_configuration_says_what_is_missing() {
    let text = nodesmith_tests::lambda_runtime::failed_start(
        "launch",
        &[("NODESMITH_TABLE", None), ("NODESMITH_CLUSTER_NAME", Some("demo"))],
    )
    .await;
    assert!(
        text.contains("environment variable NODESMITH_TABLE is not set"),
        "{text}"
    );
}
