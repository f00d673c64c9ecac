//! A local Lambda Runtime API: hands one event to a function binary run as a
//! child process and records its answer, as the Lambda service would (what
//! `cargo lambda watch` gives a developer, without installing it).

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use tokio::sync::mpsc;

#[derive(Clone)]
struct Api {
    event: Arc<Mutex<Option<String>>>,
    function: String,
    polls: mpsc::UnboundedSender<Instant>,
    answers: mpsc::UnboundedSender<(String, String)>,
}

async fn next(State(api): State<Api>) -> impl IntoResponse {
    let _ = api.polls.send(Instant::now());
    let event = api.event.lock().ok().and_then(|mut e| e.take());
    match event {
        Some(body) => {
            let deadline = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis()
                + 60_000;
            let headers = [
                ("Lambda-Runtime-Aws-Request-Id", "req-1".to_string()),
                ("Lambda-Runtime-Deadline-Ms", deadline.to_string()),
                (
                    "Lambda-Runtime-Invoked-Function-Arn",
                    format!("arn:aws:lambda:us-east-1:123456789012:function:{}", api.function),
                ),
                (
                    "Lambda-Runtime-Trace-Id",
                    "Root=1-00000000-000000000000000000000000".to_string(),
                ),
            ];
            let mut h = HeaderMap::new();
            for (k, v) in headers {
                if let Ok(v) = v.parse() {
                    h.insert(k, v);
                }
            }
            (StatusCode::OK, h, body).into_response()
        }
        // One event per run: hold the next poll until the test ends the process.
        None => std::future::pending::<axum::response::Response>().await,
    }
}

async fn answer(State(api): State<Api>, UrlPath((id, kind)): UrlPath<(String, String)>, body: String) -> StatusCode {
    let _ = api.answers.send((format!("{id}/{kind}"), body));
    StatusCode::ACCEPTED
}

/// What one invocation produced.
#[derive(Debug)]
pub struct Invocation {
    /// `req-1/response` or `req-1/error`.
    pub path: String,
    /// The function's answer.
    pub body: String,
    /// From spawning the binary to its first poll of the Runtime API (cold start).
    pub init: Duration,
    /// What the function wrote to stdout (its logs, as CloudWatch would get them).
    pub logs: String,
}

/// Runs the Lambda binary as `function` with `env` under a Runtime API that
/// hands it `event`, and returns its answer (or an error after 60 s without one).
pub async fn invoke(
    function: &str,
    env: &BTreeMap<String, String>,
    event: &serde_json::Value,
) -> Result<Invocation, String> {
    let (polls, mut polled) = mpsc::unbounded_channel();
    let (answers, mut answered) = mpsc::unbounded_channel();
    let api = Api {
        event: Arc::new(Mutex::new(Some(event.to_string()))),
        function: function.into(),
        polls,
        answers,
    };
    let app = Router::new()
        .route("/2018-06-01/runtime/invocation/next", get(next))
        .route("/2018-06-01/runtime/invocation/{id}/{kind}", post(answer))
        .with_state(api);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let started = Instant::now();
    let binary = crate::binary(crate::LAMBDA_BINARY);
    let mut child = tokio::process::Command::new(&binary)
        .envs(env)
        .env(nodesmith::lambda::HANDLER_ENV, function)
        .env("AWS_LAMBDA_RUNTIME_API", addr.to_string())
        .env("AWS_LAMBDA_FUNCTION_NAME", function)
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "512")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        .env("AWS_LAMBDA_LOG_STREAM_NAME", "test")
        .env("AWS_LAMBDA_LOG_GROUP_NAME", "test")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
    let stdout = child.stdout.take();
    let logs = tokio::spawn(async move {
        let mut text = String::new();
        if let Some(mut out) = stdout {
            let _ = tokio::io::AsyncReadExt::read_to_string(&mut out, &mut text).await;
        }
        text
    });
    let result = tokio::time::timeout(Duration::from_secs(60), async {
        let first = polled.recv().await.ok_or("the function never polled")?;
        let (path, body) = answered.recv().await.ok_or("the function never answered")?;
        Ok::<_, String>((path, body, first - started))
    })
    .await
    .map_err(|_| format!("{function} did not answer within 60 s"));
    let _ = child.kill().await;
    server.abort();
    let logs = logs.await.unwrap_or_default();
    let (path, body, init) = result??;
    Ok(Invocation { path, body, init, logs })
}

/// Starts the Lambda binary as `function` with `env` changed (`None`:
/// removed), expects it to fail before serving any invocation, and returns
/// all it printed.
pub async fn failed_start(function: &str, env: &[(&str, Option<&str>)]) -> String {
    let binary = crate::binary(crate::LAMBDA_BINARY);
    let mut command = tokio::process::Command::new(&binary);
    command.env(nodesmith::lambda::HANDLER_ENV, function);
    // A Runtime API nobody serves: a binary that got past its configuration would fail here instead.
    command.env("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9");
    for (name, value) in env {
        match value {
            Some(v) => command.env(name, v),
            None => command.env_remove(name),
        };
    }
    let out = command.output().await.expect("the binary runs");
    assert!(!out.status.success(), "{} started with {env:?}", binary.display());
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
