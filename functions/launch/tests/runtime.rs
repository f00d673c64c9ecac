//! The `launch` binary under a local Lambda Runtime API: it starts, reads its
//! configuration, handles an SQS event against moto and answers with partial
//! batch failures; without configuration it stops with a clear message.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use nodesmith_tests::moto::moto;
use tokio::sync::mpsc;

#[derive(Clone)]
struct Api {
    event: Arc<Mutex<Option<String>>>,
    first_poll: mpsc::UnboundedSender<Instant>,
    answers: mpsc::UnboundedSender<(String, String)>,
}

async fn next(State(api): State<Api>) -> impl IntoResponse {
    let _ = api.first_poll.send(Instant::now());
    let event = api.event.lock().unwrap().take();
    match event {
        Some(body) => {
            let mut h = HeaderMap::new();
            h.insert("Lambda-Runtime-Aws-Request-Id", "req-1".parse().unwrap());
            let deadline = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() + 60_000;
            h.insert("Lambda-Runtime-Deadline-Ms", deadline.to_string().parse().unwrap());
            h.insert("Lambda-Runtime-Invoked-Function-Arn", "arn:aws:lambda:us-east-1:123456789012:function:launch".parse().unwrap());
            h.insert("Lambda-Runtime-Trace-Id", "Root=1-00000000-000000000000000000000000".parse().unwrap());
            (StatusCode::OK, h, body).into_response()
        }
        // No second event: hold the poll until the test ends the process.
        None => std::future::pending::<axum::response::Response>().await,
    }
}

async fn answer(State(api): State<Api>, Path((id, kind)): Path<(String, String)>, body: String) -> StatusCode {
    let _ = api.answers.send((format!("{id}/{kind}"), body));
    StatusCode::ACCEPTED
}

#[tokio::test]
async fn binary_handles_an_sqs_event_against_moto() {
    let m = moto().await;
    let ddb = aws_sdk_dynamodb::Client::new(&m.sdk_config().await);
    nodesmith::state::create_table(&ddb, "nodesmith").await.unwrap();

    let event = serde_json::json!({"Records": [
        {"messageId": "gone", "receiptHandle": "r1", "eventSource": "aws:sqs", "awsRegion": "us-east-1",
         "body": serde_json::json!({"nodeClaim": "no-such-claim", "nodeClassName": "default", "nodeClass": {
            "amiSelectorTerms": [{"alias": "al2023@latest"}], "role": "r",
            "subnetSelectorTerms": [{"tags": {"a": "b"}}], "securityGroupSelectorTerms": [{"tags": {"a": "b"}}]}}).to_string()},
        {"messageId": "poison", "receiptHandle": "r2", "eventSource": "aws:sqs", "awsRegion": "us-east-1", "body": "{"}
    ]});
    let (first_poll, mut polls) = mpsc::unbounded_channel();
    let (answers, mut answered) = mpsc::unbounded_channel();
    let api = Api { event: Arc::new(Mutex::new(Some(event.to_string()))), first_poll, answers };
    let app = Router::new()
        .route("/2018-06-01/runtime/invocation/next", get(next))
        .route("/2018-06-01/runtime/invocation/{id}/{kind}", post(answer))
        .with_state(api);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let started = Instant::now();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_launch"))
        .envs(m.env())
        .env("AWS_LAMBDA_RUNTIME_API", addr.to_string())
        .env("AWS_LAMBDA_FUNCTION_NAME", "launch")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        .env("AWS_LAMBDA_LOG_STREAM_NAME", "test")
        .env("AWS_LAMBDA_LOG_GROUP_NAME", "test")
        .env("NODESMITH_TABLE", "nodesmith")
        .env("NODESMITH_CLUSTER_NAME", "demo")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let polled = polls.recv().await.unwrap();
    let (path, body) = answered.recv().await.unwrap();
    child.kill().await.unwrap();
    server.abort();
    // Reported, not asserted: timing depends on the machine.
    eprintln!("launch init (spawn → first poll of the Runtime API): {:?}", polled - started);
    assert_eq!(path, "req-1/response");
    let resp: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(resp, serde_json::json!({"batchItemFailures": [{"itemIdentifier": "poison"}]}));
}

#[tokio::test]
async fn binary_without_configuration_says_what_is_missing() {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_launch"))
        .env_remove("NODESMITH_TABLE")
        .env("NODESMITH_CLUSTER_NAME", "demo")
        .env("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9")
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("environment variable NODESMITH_TABLE is not set"), "{text}");
}
