//! The `sweep` binary under a local Lambda Runtime API: it builds its clients
//! from the environment, sweeps once against the Kubernetes API test server and
//! moto (here: a claim whose instance is gone is removed and a solve is asked
//! for), and answers with what it did; without configuration it names what is missing.

use std::collections::BTreeMap;

use nodesmith::nodeclaim::{NodeClaim, Phase};
use nodesmith::state::StateStore;
use nodesmith_tests::kube_server::KubeServer;
use nodesmith_tests::lambda_runtime::invoke;
use nodesmith_tests::moto::moto;
use nodesmith_tests::sqs;
use serde_json::json;

#[tokio::test]
async fn binary_sweeps_once_under_the_runtime_api() {
    let m = moto().await;
    let conf = m.sdk_config().await;
    let dynamo = aws_sdk_dynamodb::Client::new(&conf);
    nodesmith::state::create_table(&dynamo, "nodesmith").await.unwrap();
    let store = StateStore::new(dynamo, "nodesmith");
    // Launched long ago; EC2 has never heard of its instance.
    let mut gone = NodeClaim {
        phase: Phase::Launched,
        instance_id: Some("i-0000000000000dead".into()),
        provider_id: Some("aws:///us-east-1a/i-0000000000000dead".into()),
        ..NodeClaim::pending("default-gone1", "default", "default")
    };
    gone.timestamps.created = Some("2026-01-01T00:00:00Z".parse().unwrap());
    gone.timestamps.launched = gone.timestamps.created;
    store.create_node_claim(&gone).await.unwrap();
    let client = aws_sdk_sqs::Client::new(&conf);
    let pending = sqs::create_queue(&client, "pending-pods").await;
    let kube = KubeServer::start().await;

    let mut env: BTreeMap<String, String> = m
        .env()
        .into_iter()
        .chain(kube.env_for(nodesmith_tests::kube_server::Function::Sweep))
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    env.insert("NODESMITH_TABLE".into(), "nodesmith".into());
    env.insert("NODESMITH_CLUSTER_NAME".into(), "demo".into());
    env.insert("NODESMITH_PENDING_QUEUE_URL".into(), pending.clone());
    let event = json!({"version": "0", "source": "aws.scheduler", "detail-type": "Scheduled Event", "detail": {}});
    let done = invoke("sweep", &env, &event).await.unwrap();
    assert_eq!(done.path, "req-1/response", "{}", done.body);
    let mut resp: serde_json::Value = serde_json::from_str(&done.body).unwrap();
    let disruption = resp.as_object_mut().unwrap().remove("disruption").unwrap();
    assert_eq!(disruption["started"], json!([]), "nothing to disrupt: {disruption}");
    assert_eq!(
        resp,
        json!({"skipped": false, "done": 1, "failed": 0, "deferred": 0, "solveRequested": "instance-gone", "nodeClassStatusesWritten": []})
    );
    assert_eq!(store.get_node_claim("default-gone1").await.unwrap(), None);
    assert_eq!(sqs::drain(&client, &pending).await.len(), 1, "a solve was asked for");
}

#[tokio::test]
async fn binary_without_configuration_says_what_is_missing() {
    let text = nodesmith_tests::lambda_runtime::failed_start(
        "sweep",
        &[
            ("NODESMITH_KUBE_URL", Some("http://127.0.0.1:9")),
            ("NODESMITH_TABLE", Some("nodesmith")),
            ("NODESMITH_CLUSTER_NAME", None),
            ("AWS_REGION", Some("us-east-1")),
        ],
    )
    .await;
    assert!(text.contains("NODESMITH_CLUSTER_NAME is not set"), "{text}");
}

#[tokio::test]
async fn the_lambda_binary_names_a_handler_it_does_not_serve_or_a_missing_one() {
    // The template gives every function its Handler; anything else (a typo, the
    // old `bootstrap`) must stop the start, not serve some other function.
    let text = nodesmith_tests::lambda_runtime::failed_start("bootstrap", &[]).await;
    assert!(
        text.contains(
            "environment variable _HANDLER=\"bootstrap\" is not valid: the Lambda binary serves provision, launch, interrupt or sweep"
        ),
        "{text}"
    );
    let text = nodesmith_tests::lambda_runtime::failed_start("sweep", &[("_HANDLER", None)]).await;
    assert!(text.contains("environment variable _HANDLER is not set"), "{text}");
}
