//! A warm Lambda function: its real binary as a child process under a local
//! Lambda Runtime API, one invocation at a time (reserved concurrency 1), as
//! the Lambda service runs it. A process that exits or overruns its timeout is
//! killed and started again (a cold start), and the invocation it held fails,
//! as on Lambda. Every line the function prints goes to its log file and to
//! the invocation it belongs to.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot, watch};

/// How a function is run.
#[derive(Clone, Debug)]
pub struct FunctionSpec {
    /// The function's name (its `Handler`).
    pub name: String,
    /// The binary.
    pub binary: PathBuf,
    /// Its environment (besides the Runtime API's own variables).
    pub env: BTreeMap<String, String>,
    /// `MemorySize` in MiB (for the cost estimate and the runtime's variable).
    pub memory_mb: u64,
    /// `Timeout`: an invocation running longer is killed.
    pub timeout: Duration,
    /// Where its log lines are appended (none: kept only with the invocation).
    pub log_file: Option<PathBuf>,
}

/// How the error of an invocation killed at its timeout begins (Lambda's words).
pub const TIMED_OUT: &str = "Task timed out";

/// What one invocation produced.
#[derive(Clone, Debug)]
pub struct Answer {
    /// The response body, or the error (function error, crash, timeout).
    pub result: Result<String, String>,
    /// From handing the event over to the answer.
    pub duration: Duration,
    /// Time the process took to start, when this invocation started it (a cold start).
    pub cold_start: Option<Duration>,
    /// The lines the function printed while it ran (JSON when it logs as in Lambda).
    pub logs: Vec<String>,
    /// The process died during the invocation (a crash, or killed at its timeout).
    pub process_ended: bool,
}

struct Job {
    event: String,
    reply: oneshot::Sender<Answer>,
    /// When the invocation must be done (ms since the epoch): handed to the
    /// function as Lambda does, from the time its timeout started.
    deadline_ms: u128,
}

/// The invocation a process is working on.
struct Current {
    reply: oneshot::Sender<Answer>,
    started: Instant,
    cold_start: Option<Duration>,
    logs: Vec<String>,
}

/// State one process generation shares with its Runtime API.
struct Generation {
    jobs: Arc<tokio::sync::Mutex<mpsc::Receiver<Job>>>,
    current: Mutex<Option<Current>>,
    spawned: Instant,
    first_poll: Mutex<bool>,
    function: String,
    next_id: Mutex<u64>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Generation {
    fn finish(&self, result: Result<String, String>, process_ended: bool) {
        if let Some(c) = lock(&self.current).take() {
            let _ = c.reply.send(Answer {
                result,
                duration: c.started.elapsed(),
                cold_start: c.cold_start,
                logs: c.logs,
                process_ended,
            });
        }
    }
}

async fn next(State(g): State<Arc<Generation>>) -> axum::response::Response {
    let cold_start = {
        let mut first = lock(&g.first_poll);
        let cold = (!*first).then(|| g.spawned.elapsed());
        *first = true;
        cold
    };
    let job = g.jobs.lock().await.recv().await;
    let Some(job) = job else {
        // The function is being stopped: hold the poll until the process goes.
        return std::future::pending::<axum::response::Response>().await;
    };
    let id = {
        let mut n = lock(&g.next_id);
        *n += 1;
        format!("{}-{}", g.function, *n)
    };
    *lock(&g.current) = Some(Current {
        reply: job.reply,
        started: Instant::now(),
        cold_start,
        logs: Vec::new(),
    });
    let deadline = job.deadline_ms;
    let mut h = HeaderMap::new();
    let headers = [
        ("Lambda-Runtime-Aws-Request-Id", id),
        ("Lambda-Runtime-Deadline-Ms", deadline.to_string()),
        (
            "Lambda-Runtime-Invoked-Function-Arn",
            format!("arn:aws:lambda:us-east-1:123456789012:function:{}", g.function),
        ),
        (
            "Lambda-Runtime-Trace-Id",
            "Root=1-00000000-000000000000000000000000".to_string(),
        ),
    ];
    for (k, v) in headers {
        if let Ok(v) = v.parse() {
            h.insert(k, v);
        }
    }
    (StatusCode::OK, h, job.event).into_response()
}

async fn respond(
    State(g): State<Arc<Generation>>,
    UrlPath((_id, kind)): UrlPath<(String, String)>,
    body: String,
) -> StatusCode {
    // The function printed its last lines before answering; give the pipe
    // readers a moment so they land with this invocation, not the next.
    tokio::time::sleep(Duration::from_millis(25)).await;
    g.finish(if kind == "response" { Ok(body) } else { Err(body) }, false);
    StatusCode::ACCEPTED
}

async fn init_error(State(g): State<Arc<Generation>>, body: String) -> StatusCode {
    tracing::warn!(function = %g.function, error = %body, "function failed to initialize");
    StatusCode::ACCEPTED
}

/// A running function; dropping it stops its process.
pub struct Function {
    name: String,
    memory_mb: u64,
    timeout: Duration,
    jobs: mpsc::Sender<Job>,
    kill: mpsc::UnboundedSender<&'static str>,
    stop: watch::Sender<bool>,
    supervisor: Mutex<Option<tokio::task::JoinHandle<()>>>,
    pids: Arc<Mutex<Option<u32>>>,
}

/// An invocation that could not be made at all.
#[derive(Debug, thiserror::Error)]
pub enum InvokeError {
    /// The function has been stopped.
    #[error("function {0} is stopped")]
    Stopped(String),
}

impl Function {
    /// Starts the function's process (warm, waiting for its first event).
    pub fn start(spec: FunctionSpec) -> Function {
        let (jobs, rx) = mpsc::channel(1);
        let (kill, kill_rx) = mpsc::unbounded_channel();
        let (stop, stop_rx) = watch::channel(false);
        let pids = Arc::new(Mutex::new(None));
        let supervisor = tokio::spawn(supervise(
            spec.clone(),
            Arc::new(tokio::sync::Mutex::new(rx)),
            kill_rx,
            stop_rx,
            pids.clone(),
        ));
        Function {
            name: spec.name,
            memory_mb: spec.memory_mb,
            timeout: spec.timeout,
            jobs,
            kill,
            stop,
            supervisor: Mutex::new(Some(supervisor)),
            pids,
        }
    }

    /// The function's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its memory size in MiB.
    pub fn memory_mb(&self) -> u64 {
        self.memory_mb
    }

    /// The process id of its current process, if one runs.
    pub fn pid(&self) -> Option<u32> {
        *lock(&self.pids)
    }

    /// Hands `event` to the function and waits for its answer (at most its timeout).
    pub async fn invoke(&self, event: &Value) -> Result<Answer, InvokeError> {
        let (reply, answer) = oneshot::channel();
        let started = Instant::now();
        self.jobs
            .send(Job {
                event: event.to_string(),
                reply,
                deadline_ms: epoch_ms() + self.timeout.as_millis(),
            })
            .await
            .map_err(|_| InvokeError::Stopped(self.name.clone()))?;
        match tokio::time::timeout(self.timeout, answer).await {
            Ok(Ok(a)) => Ok(a),
            Ok(Err(_)) => Err(InvokeError::Stopped(self.name.clone())),
            Err(_) => {
                // Lambda ends an invocation at its timeout by ending the sandbox.
                let _ = self.kill.send("killed at its timeout");
                Ok(Answer {
                    result: Err(format!("{TIMED_OUT} after {:.2} seconds", self.timeout.as_secs_f64())),
                    duration: started.elapsed(),
                    cold_start: None,
                    logs: Vec::new(),
                    process_ended: true,
                })
            }
        }
    }

    /// Ends the process as Lambda ends an idle sandbox: the next invocation
    /// starts a cold one, with nothing kept in memory.
    /// Returns once the new process runs (or after 10 s, if none starts).
    pub async fn recycle(&self) {
        let before = self.pid();
        if before.is_none() || self.kill.send("recycled while idle").is_err() {
            return;
        }
        for _ in 0..500 {
            if self.pid().is_some_and(|p| Some(p) != before) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the process and waits for it to be gone.
    pub async fn stop(&self) {
        let _ = self.stop.send(true);
        let task = lock(&self.supervisor).take();
        if let Some(t) = task {
            let _ = t.await;
        }
    }
}

impl Drop for Function {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

async fn supervise(
    spec: FunctionSpec,
    jobs: Arc<tokio::sync::Mutex<mpsc::Receiver<Job>>>,
    mut kill: mpsc::UnboundedReceiver<&'static str>,
    mut stop: watch::Receiver<bool>,
    pids: Arc<Mutex<Option<u32>>>,
) {
    let mut log = match &spec.log_file {
        Some(p) => tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .await
            .ok(),
        None => None,
    };
    while !*stop.borrow() {
        let g = Arc::new(Generation {
            jobs: jobs.clone(),
            current: Mutex::new(None),
            spawned: Instant::now(),
            first_poll: Mutex::new(false),
            function: spec.name.clone(),
            next_id: Mutex::new(0),
        });
        let app = Router::new()
            .route("/2018-06-01/runtime/invocation/next", get(next))
            .route("/2018-06-01/runtime/invocation/{id}/{kind}", post(respond))
            .route("/2018-06-01/runtime/init/error", post(init_error))
            .with_state(g.clone());
        let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(function = %spec.name, error = %e, "cannot bind the Runtime API");
                return;
            }
        };
        let addr = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let child = tokio::process::Command::new(&spec.binary)
            .envs(&spec.env)
            .env("AWS_LAMBDA_RUNTIME_API", &addr)
            .env(nodesmith::lambda::HANDLER_ENV, &spec.name)
            .env("AWS_LAMBDA_FUNCTION_NAME", &spec.name)
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", spec.memory_mb.to_string())
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env("AWS_LAMBDA_LOG_STREAM_NAME", "local")
            .env("AWS_LAMBDA_LOG_GROUP_NAME", format!("/aws/lambda/{}", spec.name))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group: the owner decides when it stops.
            .process_group(0)
            .kill_on_drop(true)
            .spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(function = %spec.name, binary = %spec.binary.display(), error = %e, "cannot start the function");
                server.abort();
                return;
            }
        };
        *lock(&pids) = child.id();
        let (lines_tx, mut lines) = mpsc::unbounded_channel::<String>();
        for pipe in [
            child
                .stdout
                .take()
                .map(|o| Box::new(o) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
            child
                .stderr
                .take()
                .map(|o| Box::new(o) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let tx = lines_tx.clone();
            tokio::spawn(async move {
                let mut r = BufReader::new(pipe).lines();
                while let Ok(Some(l)) = r.next_line().await {
                    let _ = tx.send(l);
                }
            });
        }
        drop(lines_tx);
        // Whether the owner ended it (recycled, or killed at its timeout):
        // then the next sandbox starts at once, as Lambda's does.
        let mut asked = false;
        let exit = loop {
            tokio::select! {
                status = child.wait() => break format!("process exited ({})", status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string())),
                Some(line) = lines.recv() => {
                    if let Some(f) = log.as_mut() {
                        let _ = f.write_all(format!("{line}\n").as_bytes()).await;
                    }
                    if let Some(c) = lock(&g.current).as_mut() {
                        c.logs.push(line);
                    }
                }
                Some(why) = kill.recv() => {
                    let _ = child.kill().await;
                    asked = true;
                    break why.to_string();
                }
                _ = stop.changed() => {
                    let _ = child.kill().await;
                    break "stopped".to_string();
                }
            }
        };
        *lock(&pids) = None;
        server.abort();
        g.finish(Err(format!("Runtime exited: {exit}")), true);
        if !*stop.borrow() && !asked {
            // A process that ended by itself (a crash) may end again at once:
            // a short pause keeps a crash loop from spinning.
            tracing::warn!(function = %spec.name, why = %exit, "function process ended; starting it again");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Milliseconds since the epoch, now.
fn epoch_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis()
}
