//! The `provision` binary under a local Lambda Runtime API: it builds its
//! clients from the environment, handles an SQS batch of pending-pod
//! references against the Kubernetes API test server and moto, and answers
//! with partial batch failures; without configuration it names what is missing.

use std::collections::BTreeMap;

use nodesmith_tests::kube_server::KubeServer;
use nodesmith_tests::lambda_runtime::invoke;
use nodesmith_tests::moto::moto;
use serde_json::json;

#[tokio::test]
async fn binary_handles_a_pending_pod_batch() {
    let m = moto().await;
    let conf = m.sdk_config().await;
    nodesmith::state::create_table(&aws_sdk_dynamodb::Client::new(&conf), "nodesmith")
        .await
        .unwrap();
    let sqs = aws_sdk_sqs::Client::new(&conf);
    let queue = sqs
        .create_queue()
        .queue_name("launch")
        .send()
        .await
        .unwrap()
        .queue_url()
        .unwrap()
        .to_string();
    let kube = KubeServer::start().await;
    kube.apply(&json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"}, "spec": {"template": {"spec": {
        "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}, "requirements": []}}}}))
        .unwrap();
    kube.apply(
        &json!({"apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "default"}, "spec": {
        "role": "r", "amiSelectorTerms": [{"alias": "al2023@latest"}],
        "subnetSelectorTerms": [{"tags": {"a": "b"}}], "securityGroupSelectorTerms": [{"tags": {"a": "b"}}]}}),
    )
    .unwrap();
    kube.apply(
        &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-0", "namespace": "default", "uid": "u0"},
        "spec": {"containers": [{"name": "c", "image": "web", "resources": {"requests": {"cpu": "1"}}}]}}),
    )
    .unwrap();
    kube.schedule();

    let event = json!({"Records": [
        {"messageId": "ok", "receiptHandle": "r1", "eventSource": "aws:sqs", "awsRegion": "us-east-1",
         "body": json!({"namespace": "default", "name": "web-0", "uid": "u0", "resourceVersion": "1"}).to_string()},
        {"messageId": "poison", "receiptHandle": "r2", "eventSource": "aws:sqs", "awsRegion": "us-east-1", "body": "{\"namespace\": 7}"}
    ]});
    let mut env: BTreeMap<String, String> = m
        .env()
        .into_iter()
        .chain(kube.env_for(nodesmith_tests::kube_server::Function::Provision))
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    env.insert("NODESMITH_TABLE".into(), "nodesmith".into());
    env.insert("NODESMITH_LAUNCH_QUEUE_URL".into(), queue.clone());
    let done = invoke("provision", &env, &event).await.unwrap();
    eprintln!(
        "provision init (spawn → first poll of the Runtime API): {:?}",
        done.init
    );
    assert_eq!(done.path, "req-1/response", "{}", done.body);
    let resp: serde_json::Value = serde_json::from_str(&done.body).unwrap();
    assert_eq!(resp, json!({"batchItemFailures": [{"itemIdentifier": "poison"}]}));
    let launches = sqs
        .receive_message()
        .queue_url(&queue)
        .max_number_of_messages(10)
        .send()
        .await
        .unwrap();
    assert_eq!(launches.messages().len(), 1, "one NodeClaim, one launch request");
}

#[tokio::test]
async fn binary_without_configuration_says_what_is_missing() {
    let text = nodesmith_tests::lambda_runtime::failed_start(
        "provision",
        &[
            ("NODESMITH_KUBE_URL", Some("http://127.0.0.1:9")),
            ("NODESMITH_TABLE", Some("nodesmith")),
            ("NODESMITH_LAUNCH_QUEUE_URL", None),
            ("AWS_REGION", Some("us-east-1")),
        ],
    )
    .await;
    assert!(text.contains("NODESMITH_LAUNCH_QUEUE_URL is not set"), "{text}");
}
