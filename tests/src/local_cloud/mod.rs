//! The local cloud: nodesmith end to end on one machine, with no AWS account
//! and no cluster (contract: `docs/local-stack.md`). moto's server plays AWS;
//! the Kubernetes API test server plays the cluster, with its scheduler,
//! workload controllers and kubelets; the four real function binaries run
//! warm under a local Lambda Runtime API, fed by SQS event source mappings
//! and the sweep's schedule; the real forwarder watches the test server as
//! its ServiceAccount.
//! `scripts/dev-stack` runs it until interrupted; `scripts/demo` plays a story on it.

pub mod aws;
pub mod burst;
pub mod census;
pub mod demo;
pub mod latency;
pub mod mapping;
pub mod runtime;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::fault_proxy::FaultProxy;
use crate::kube_server::{ControllerLoop, Identity, KubeServer, KubeletLoop, KubeletTiming, Kubelets, SchedulerLoop};
use crate::moto::{MotoServer, child_env, sdk_config};
use mapping::{Activity, MappingSpec, Pool, invoke_scheduled, run_mapping, run_schedule};
use runtime::{Answer, Function, FunctionSpec, InvokeError};

/// A function as `template.yaml` declares it, and the queue that feeds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FunctionDef {
    /// The function's name: its `Handler` in the template, which the one
    /// Lambda binary ([`crate::LAMBDA_BINARY`]) reads to serve it.
    pub handler: &'static str,
    /// `MemorySize` in MiB.
    pub memory_mb: u64,
    /// `Timeout` in seconds.
    pub timeout_secs: u64,
    /// `(queue, BatchSize, windowed)` of its SQS event, if any: a windowed
    /// mapping uses the batching window setting.
    pub queue: Option<(QueueName, usize, bool)>,
    /// `ReservedConcurrentExecutions`: the local cloud runs at most
    /// [`LOCAL_CONCURRENCY`] processes of it.
    pub concurrency: usize,
}

/// The most processes of one function the local cloud runs: enough for two
/// invocations at once (what races look like), not a process per sandbox.
pub const LOCAL_CONCURRENCY: usize = 2;

impl FunctionDef {
    /// How many processes of it the local cloud runs.
    pub fn local_concurrency(&self) -> usize {
        self.concurrency.clamp(1, LOCAL_CONCURRENCY)
    }
}

/// The three queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueName {
    /// Pending pods and solve requests.
    Pending,
    /// Launch requests.
    Launch,
    /// Interruption events.
    Interruption,
}

/// The functions (a test checks them against `template.yaml`).
pub const FUNCTIONS: [FunctionDef; 4] = [
    FunctionDef {
        handler: "provision",
        memory_mb: 3008,
        timeout_secs: 60,
        queue: Some((QueueName::Pending, 1000, true)),
        concurrency: 2,
    },
    FunctionDef {
        handler: "launch",
        memory_mb: 512,
        timeout_secs: 60,
        queue: Some((QueueName::Launch, 10, false)),
        concurrency: 10,
    },
    FunctionDef {
        handler: "interrupt",
        memory_mb: 2048,
        timeout_secs: 300,
        queue: Some((QueueName::Interruption, 10, false)),
        concurrency: 20,
    },
    FunctionDef {
        handler: "sweep",
        memory_mb: 3008,
        timeout_secs: 120,
        queue: None,
        concurrency: 1,
    },
];

/// How often [`LocalCloud::quiet`] looks.
const QUIET_LOOK: Duration = Duration::from_millis(100);

/// The stack identity the functions run with (`NODESMITH_STACK_NAME`).
pub const STACK_NAME: &str = "nodesmith-local";

/// The forwarder's binary.
pub const FORWARDER: &str = "nodesmith-forwarder";

/// The forwarder's batch idle setting ([`Settings::batch_idle`]).
const BATCH_IDLE: &str = "BATCH_IDLE_DURATION";

/// The local cloud's settings: every slow duration of a real cluster, short.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// The cluster's name (`NODESMITH_CLUSTER_NAME`).
    pub cluster: String,
    /// Period of the sweep schedule.
    pub sweep_period: Duration,
    /// The pending-pods queue's batching window.
    pub batch_window: Duration,
    /// How long the forwarder's batch stays open after its last pending pod
    /// (Karpenter's `BATCH_IDLE_DURATION`, which it reads; default 1s).
    pub batch_idle: Duration,
    /// Age after which an owned instance with no NodeClaim is collected.
    pub leak_grace: Duration,
    /// Lifecycle timeout: launch.
    pub launch_timeout: Duration,
    /// Lifecycle timeout: registration.
    pub registration_timeout: Duration,
    /// From instance running to Node created.
    pub kubelet_join: Duration,
    /// How long a new Node stays not ready.
    pub kubelet_ready: Duration,
    /// How often the kubelets look at EC2 by themselves (each look is a
    /// DescribeInstances); [`LocalCloud::quiet`] also steps them.
    pub kubelet_period: Duration,
    /// The queues' visibility timeout (how soon a failed message comes back).
    pub visibility_timeout: Duration,
    /// The sweep's time budget (`NODESMITH_SWEEP_BUDGET`; its lease lasts twice that).
    pub sweep_budget: Duration,
    /// How long the provision, launch and sweep leases outlive their holder's
    /// last renewal (`NODESMITH_PROVISION_LEASE`, `NODESMITH_LAUNCH_LEASE`,
    /// `NODESMITH_SWEEP_LEASE`): a function that died frees its work that soon.
    pub lease: Duration,
    /// After how long the sweep sends a still-Pending claim's launch request
    /// again (`NODESMITH_RELAUNCH_AFTER`).
    pub relaunch_after: Duration,
    /// After how long the forwarder sends a still-pending pod again
    /// (`RESEND_AFTER_SECS`; 30 s here, 300 s as deployed).
    pub resend_after: Duration,
    /// How long one `interrupt` invocation keeps draining before leaving the
    /// rest to the sweep (`NODESMITH_INTERRUPT_DRAIN_BUDGET`; 0: one pass).
    pub interrupt_drain_budget: Duration,
    /// No sweep schedule: the sweep runs only when [`LocalCloud::sweep`] is called (tests).
    pub manual_sweep: bool,
    /// Deliver every SQS batch two or three times (tests of at-least-once delivery).
    pub duplicate_deliveries: bool,
    /// One process per function, whatever its reserved concurrency (crash
    /// tests: a crash point then fires in the one invocation that reaches it).
    pub single_process: bool,
    /// Each function runs as many processes as its reserved concurrency
    /// (launch 10, interrupt 20), as Lambda would, not [`LOCAL_CONCURRENCY`]:
    /// a burst's launches go ten batches at a time, as in AWS.
    pub reserved_concurrency: bool,
    /// Run alone: wait until no other local cloud of this process runs
    /// ([`alone`]). Clouds whose goals are timed need the machine to
    /// themselves; the crash tests, which count sweeps, run two at a time.
    pub alone: bool,
    /// Arm the functions' crash hook (`nodesmith::crash`, debug builds): each
    /// function's crash file is `<dir>/<function>.point` and its call log
    /// `<dir>/<function>.calls`.
    pub crash_dir: Option<PathBuf>,
    /// Where the kubeconfig and function logs go (kept when given; otherwise a
    /// temporary directory removed at stop).
    pub state_dir: Option<PathBuf>,
    /// Where the function binaries are.
    pub bin_dir: PathBuf,
}

/// A setting that cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("{name}: {message}")]
pub struct SettingsError {
    /// The environment variable.
    pub name: String,
    /// What is wrong with it.
    pub message: String,
}

/// The environment variables of [`Settings`], with their defaults in seconds.
pub const DURATION_VARIABLES: [(&str, u64); 8] = [
    ("NODESMITH_DEV_SWEEP_SECONDS", 5),
    ("NODESMITH_BATCH_WINDOW_SECONDS", 1),
    ("NODESMITH_LEAK_GRACE_SECONDS", 10),
    ("NODESMITH_LAUNCH_TIMEOUT_SECONDS", 60),
    ("NODESMITH_REGISTRATION_TIMEOUT_SECONDS", 120),
    ("NODESMITH_DEV_KUBELET_JOIN_SECONDS", 2),
    ("NODESMITH_DEV_KUBELET_READY_SECONDS", 3),
    ("NODESMITH_DEV_VISIBILITY_SECONDS", 10),
];

impl Settings {
    /// Reads the settings through `get` (the environment); `bin_dir` holds the binaries.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>, bin_dir: PathBuf) -> Result<Settings, SettingsError> {
        let mut d = [Duration::ZERO; 8];
        for (i, (name, default)) in DURATION_VARIABLES.iter().enumerate() {
            d[i] = match get(name).filter(|v| !v.trim().is_empty()) {
                None => Duration::from_secs(*default),
                Some(v) => {
                    let secs: f64 = v.trim().parse().map_err(|_| SettingsError {
                        name: name.to_string(),
                        message: format!("{v:?} is not a number of seconds"),
                    })?;
                    if !(0.0..=86_400.0).contains(&secs) {
                        return Err(SettingsError {
                            name: name.to_string(),
                            message: format!("{v:?} is not between 0 and 86400 seconds"),
                        });
                    }
                    Duration::from_secs_f64(secs)
                }
            };
        }
        if d[0].is_zero() {
            return Err(SettingsError {
                name: DURATION_VARIABLES[0].0.into(),
                message: "must be more than 0".into(),
            });
        }
        let batch_idle = nodesmith::settings::Settings::new(&get)
            .duration(BATCH_IDLE, nodesmith_forwarder::DEFAULT_BATCH_IDLE)
            .map_err(|e| SettingsError {
                name: BATCH_IDLE.into(),
                message: e.to_string(),
            })?;
        if batch_idle.is_zero() {
            return Err(SettingsError {
                name: BATCH_IDLE.into(),
                message: "must be more than 0".into(),
            });
        }
        Ok(Settings {
            cluster: get("NODESMITH_CLUSTER_NAME")
                .filter(|c| !c.trim().is_empty())
                .unwrap_or_else(|| "nodesmith-local".into()),
            sweep_period: d[0],
            batch_window: d[1],
            batch_idle,
            leak_grace: d[2],
            launch_timeout: d[3],
            registration_timeout: d[4],
            kubelet_join: d[5],
            kubelet_ready: d[6],
            kubelet_period: Duration::from_millis(250),
            visibility_timeout: d[7],
            sweep_budget: Duration::from_secs(30),
            lease: Duration::from_secs(10),
            relaunch_after: Duration::from_secs(5),
            resend_after: Duration::from_secs(30),
            interrupt_drain_budget: Duration::from_secs(20),
            manual_sweep: false,
            duplicate_deliveries: false,
            single_process: false,
            reserved_concurrency: false,
            alone: true,
            crash_dir: None,
            state_dir: get("NODESMITH_DEV_STATE_DIR")
                .filter(|v| !v.trim().is_empty())
                .map(PathBuf::from),
            bin_dir,
        })
    }
}

/// Why the local cloud could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A binary is missing.
    #[error("{0} not found: build the workspace first (`cargo build --workspace --bins`; scripts/dev-stack does)")]
    MissingBinary(PathBuf),
    /// moto did not start or refused a command.
    #[error("moto: {0}")]
    Moto(String),
    /// Making the AWS resources failed.
    #[error(transparent)]
    World(#[from] aws::WorldError),
    /// The Kubernetes API test server did not start, or the cluster's objects could not be written.
    #[error("the Kubernetes API test server: {0}")]
    Kube(String),
    /// The forwarder did not get ready (its first pod list synced).
    #[error("the forwarder: {0}")]
    Forwarder(String),
    /// A file could not be written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// How long the forwarder may take to list the cluster's pods at start.
const FORWARDER_READY_WITHIN: Duration = Duration::from_secs(60);

/// Waits until the forwarder's `/readyz` answers 200 (its first pod list
/// synced), as kubelet's readiness probe would; fails if it exits first or
/// is not ready within [`FORWARDER_READY_WITHIN`].
async fn forwarder_ready(
    forwarder: &mut tokio::process::Child,
    health: std::net::SocketAddr,
    log: &Path,
) -> Result<(), StartError> {
    let started = std::time::Instant::now();
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .map_err(|e| StartError::Forwarder(format!("no HTTP client for its readiness probe: {e}")))?;
    loop {
        if let Ok(Some(status)) = forwarder.try_wait() {
            return Err(StartError::Forwarder(format!(
                "exited ({status}) before it was ready; see {}",
                log.display()
            )));
        }
        if ready(&client, health).await.unwrap_or(false) {
            return Ok(());
        }
        if started.elapsed() > FORWARDER_READY_WITHIN {
            return Err(StartError::Forwarder(format!(
                "not ready within {}s; see {}",
                FORWARDER_READY_WITHIN.as_secs(),
                log.display()
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One readiness probe: whether `/readyz` answers 200.
async fn ready(client: &reqwest::Client, health: std::net::SocketAddr) -> Result<bool, reqwest::Error> {
    let answer = client.get(format!("http://{health}/readyz")).send().await?;
    Ok(answer.status().is_success())
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> StartError + '_ {
    move |source| StartError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The running local cloud; [`LocalCloud::stop`] ends every process it started.
pub struct LocalCloud {
    /// Its settings.
    pub settings: Settings,
    /// Every function invocation.
    pub activity: Activity,
    /// The Kubernetes API test server (in this process).
    pub kube: KubeServer,
    /// What was made in moto.
    pub world: aws::World,
    /// SDK configuration for moto.
    pub sdk: aws_config::SdkConfig,
    moto: MotoServer,
    proxy: FaultProxy,
    pools: Vec<Arc<Pool>>,
    forwarder: Option<tokio::process::Child>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    _scheduler: SchedulerLoop,
    _controllers: ControllerLoop,
    kubelets: Kubelets,
    _kubelet_loop: KubeletLoop,
    catalog: Arc<nodesmith::catalog::Catalog>,
    state_dir: PathBuf,
    temporary_state: bool,
    kubeconfig: PathBuf,
    _alone: Option<tokio::sync::MutexGuard<'static, ()>>,
}

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Waits until no other local cloud of this process runs, and keeps others
/// out while the guard lives. A [`LocalCloud`] holds it unless its settings
/// say otherwise: a cloud's kubelets, leases and schedules run on the wall
/// clock, and two clouds on two cores slow each other past what a story allows.
pub async fn alone() -> tokio::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().await
}

/// The NodePool and EC2NodeClass the local cloud starts with (the contract's).
pub fn default_objects(cluster: &str, role: &str) -> [Value; 2] {
    [
        json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"}, "spec": {
            "template": {"spec": {
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
                "requirements": [
                    {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot", "on-demand"]},
                    {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]},
                    {"key": "karpenter.k8s.aws/instance-category", "operator": "In", "values": ["c", "m", "r"]}
                ]
            }},
            "disruption": {"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "10s", "budgets": [{"nodes": "100%"}]}
        }}),
        json!({"apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "default"}, "spec": {
            "role": role,
            "amiSelectorTerms": [{"alias": "al2023@latest"}],
            "subnetSelectorTerms": [{"tags": {aws::DISCOVERY: cluster}}],
            "securityGroupSelectorTerms": [{"tags": {aws::DISCOVERY: cluster}}]
        }}),
    ]
}

/// Writes `text` to `path` atomically (a temporary file renamed into place).
pub fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

impl LocalCloud {
    /// Starts everything and applies the default NodePool and EC2NodeClass.
    pub async fn start(settings: Settings) -> Result<LocalCloud, StartError> {
        let alone = match settings.alone {
            true => Some(alone().await),
            false => None,
        };
        for name in [crate::LAMBDA_BINARY, FORWARDER] {
            let p = settings.bin_dir.join(name);
            if !p.is_file() {
                return Err(StartError::MissingBinary(p));
            }
        }
        let (state_dir, temporary_state) = match &settings.state_dir {
            Some(d) => (d.clone(), false),
            None => (
                std::env::temp_dir().join(format!("nodesmith-local-{}", std::process::id())),
                true,
            ),
        };
        std::fs::create_dir_all(state_dir.join("logs")).map_err(io_error(&state_dir))?;
        let mut moto = tokio::task::spawn_blocking(MotoServer::spawn)
            .await
            .map_err(|e| StartError::Moto(e.to_string()))?
            .map_err(StartError::Moto)?;
        let sdk = sdk_config(moto.endpoint()).await;
        // The functions reach moto through the fault proxy: it keeps EC2's
        // ClientToken promise (moto ignores it) and can inject EC2's faults.
        let proxy = FaultProxy::start(moto.endpoint()).await;
        let catalog = nodesmith::catalog::builtin().map_err(|e| StartError::Moto(e.to_string()))?;
        aws::seed_spot_prices(&mut moto, catalog)?;
        let world = aws::create(&sdk, &settings.cluster, settings.visibility_timeout.as_secs()).await?;

        let kube = KubeServer::start_on(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .map_err(|e| StartError::Kube(format!("cannot start: {e}")))?;
        for obj in default_objects(&settings.cluster, &world.node_role) {
            kube.apply(&obj).map_err(StartError::Kube)?;
        }
        let kubeconfig_path = state_dir.join("kubeconfig");
        kube.write_kubeconfig(&kubeconfig_path)
            .map_err(io_error(&kubeconfig_path))?;
        // The forwarder runs as its ServiceAccount, held to forwarder.yaml's RBAC as in a cluster.
        let forwarder_kubeconfig = state_dir.join("forwarder.kubeconfig");
        kube.write_kubeconfig_as(&forwarder_kubeconfig, Identity::Forwarder)
            .map_err(io_error(&forwarder_kubeconfig))?;
        let scheduler = kube.spawn_scheduler(Duration::from_millis(200));
        let controllers = kube.spawn_controllers(Duration::from_millis(200));
        let kubelets = Kubelets::new(KubeletTiming {
            join_after: settings.kubelet_join,
            ready_after: settings.kubelet_ready,
        });
        let catalog = Arc::new(catalog.clone());
        let kubelet_loop = kubelets.spawn(
            &kube,
            aws_sdk_ec2::Client::new(&sdk),
            catalog.clone(),
            settings.kubelet_period,
        );

        let secs = |d: Duration| format!("{}ms", d.as_millis());
        let mut common: BTreeMap<String, String> = child_env(proxy.endpoint())
            .into_iter()
            .chain(kube.env())
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        for (k, v) in [
            ("NODESMITH_CLUSTER_NAME", settings.cluster.clone()),
            // The identity a deployed stack has (the template sets its stack's name).
            ("NODESMITH_STACK_NAME", STACK_NAME.to_string()),
            ("NODESMITH_TABLE", aws::TABLE.to_string()),
            ("NODESMITH_LAUNCH_QUEUE_URL", world.launch.url.clone()),
            ("NODESMITH_PENDING_QUEUE_URL", world.pending.url.clone()),
            ("RUST_LOG", "info".to_string()),
        ] {
            common.insert(k.into(), v);
        }
        let extra: BTreeMap<&str, Vec<(&str, String)>> = BTreeMap::from([
            (
                "provision",
                vec![
                    ("NODESMITH_PENDING_DLQ_URL", world.pending.dlq_url.clone()),
                    ("NODESMITH_PROVISION_LEASE", secs(settings.lease)),
                ],
            ),
            ("launch", vec![("NODESMITH_LAUNCH_LEASE", secs(settings.lease))]),
            (
                "interrupt",
                vec![
                    ("NODESMITH_PROVISION_LEASE", secs(settings.lease)),
                    ("NODESMITH_REBALANCE", "replace".to_string()),
                    ("NODESMITH_INTERRUPTION_QUEUE_URL", world.interruption.url.clone()),
                    (
                        "NODESMITH_INTERRUPT_DRAIN_BUDGET",
                        settings.interrupt_drain_budget.as_secs().to_string(),
                    ),
                ],
            ),
            (
                "sweep",
                vec![
                    ("NODESMITH_LAUNCH_TIMEOUT", secs(settings.launch_timeout)),
                    ("NODESMITH_REGISTRATION_TIMEOUT", secs(settings.registration_timeout)),
                    ("NODESMITH_LEAK_WINDOW", secs(settings.leak_grace)),
                    ("NODESMITH_BATCH_WINDOW", secs(settings.batch_window)),
                    ("NODESMITH_SWEEP_BUDGET", secs(settings.sweep_budget)),
                    ("NODESMITH_RELAUNCH_AFTER", secs(settings.relaunch_after)),
                    ("NODESMITH_SWEEP_LEASE", secs(settings.lease)),
                    ("NODESMITH_PROVISION_LEASE", secs(settings.lease)),
                ],
            ),
        ]);
        let sqs = aws_sdk_sqs::Client::new(&sdk);
        let activity = Activity::default();
        let mut pools = Vec::new();
        let mut tasks = Vec::new();
        if let Some(dir) = &settings.crash_dir {
            std::fs::create_dir_all(dir).map_err(io_error(dir))?;
        }
        for def in FUNCTIONS {
            let mut env = common.clone();
            // Each function as its own identity, held to its own ClusterRole.
            if let Ok(f) = def.handler.parse::<nodesmith::lambda::Function>() {
                env.extend(kube.env_for(f).into_iter().map(|(k, v)| (k.to_string(), v)));
            }
            for (k, v) in extra.get(def.handler).into_iter().flatten() {
                env.insert(k.to_string(), v.clone());
            }
            if let Some(dir) = &settings.crash_dir {
                let file = |ext: &str| dir.join(format!("{}.{ext}", def.handler)).display().to_string();
                env.insert(nodesmith::crash::CRASH_FILE_ENV.into(), file("point"));
                env.insert(nodesmith::crash::CALL_LOG_ENV.into(), file("calls"));
            }
            let concurrency = if settings.single_process {
                1
            } else if settings.reserved_concurrency {
                def.concurrency.max(1)
            } else {
                def.local_concurrency()
            };
            let processes = (0..concurrency)
                .map(|_| {
                    Arc::new(Function::start(FunctionSpec {
                        name: def.handler.to_string(),
                        binary: settings.bin_dir.join(crate::LAMBDA_BINARY),
                        env: env.clone(),
                        memory_mb: def.memory_mb,
                        timeout: Duration::from_secs(def.timeout_secs),
                        log_file: Some(state_dir.join("logs").join(format!("{}.log", def.handler))),
                    }))
                })
                .collect();
            let pool = Arc::new(Pool::new(processes));
            match def.queue {
                Some((queue, batch_size, windowed)) => {
                    let q = match queue {
                        QueueName::Pending => &world.pending,
                        QueueName::Launch => &world.launch,
                        QueueName::Interruption => &world.interruption,
                    };
                    let spec = MappingSpec {
                        queue_url: q.url.clone(),
                        queue_arn: q.arn.clone(),
                        batch_size,
                        window: if windowed {
                            settings.batch_window
                        } else {
                            Duration::ZERO
                        },
                        duplicates: settings.duplicate_deliveries,
                        // A crashed invocation's batch comes back at once, as the crash tests count sweeps.
                        redeliver_on_crash: settings.crash_dir.is_some(),
                    };
                    // Lambda's pollers scale with the function's concurrency.
                    for _ in 0..pool.concurrency() {
                        let poller = run_mapping(sqs.clone(), spec.clone(), pool.clone(), activity.clone());
                        tasks.push(tokio::spawn(poller));
                    }
                }
                None if settings.manual_sweep => {}
                None => tasks.push(tokio::spawn(run_schedule(
                    settings.sweep_period,
                    pool.clone(),
                    activity.clone(),
                ))),
            }
            pools.push(pool);
        }
        let forwarder_log = state_dir.join("logs").join("forwarder.log");
        let log = std::fs::File::create(&forwarder_log).map_err(io_error(&forwarder_log))?;
        let log2 = log.try_clone().map_err(io_error(&forwarder_log))?;
        let health = std::net::TcpListener::bind(("127.0.0.1", 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| StartError::Forwarder(format!("no free port for its health endpoint: {e}")))?;
        let mut forwarder = tokio::process::Command::new(settings.bin_dir.join(FORWARDER))
            .envs(child_env(moto.endpoint()))
            .env("KUBECONFIG", &forwarder_kubeconfig)
            .env("QUEUE_URL", &world.pending.url)
            .env("HEALTH_ADDR", health.to_string())
            .env("RESEND_AFTER_SECS", settings.resend_after.as_secs().to_string())
            // Karpenter's batch window: the idle duration as set, the longest when the caller sets it (10s).
            .env(BATCH_IDLE, format!("{}ms", settings.batch_idle.as_millis()))
            .envs(std::env::var("BATCH_MAX_DURATION").ok().map(|v| ("BATCH_MAX_DURATION", v)))
            .env("RUST_LOG", "info")
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log2)
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(io_error(&settings.bin_dir.join(FORWARDER)))?;
        // Started as its Deployment is Ready: once its first pod list is in.
        // Before that, pods created wait for the list, not for nodesmith.
        forwarder_ready(&mut forwarder, health, &forwarder_log).await?;
        Ok(LocalCloud {
            settings,
            activity,
            kube,
            world,
            sdk,
            moto,
            proxy,
            pools,
            forwarder: Some(forwarder),
            tasks,
            _scheduler: scheduler,
            _controllers: controllers,
            kubelets,
            _kubelet_loop: kubelet_loop,
            catalog,
            state_dir,
            temporary_state,
            kubeconfig: kubeconfig_path,
            _alone: alone,
        })
    }

    /// The fault-injecting proxy between the functions and moto.
    pub fn faults(&self) -> &FaultProxy {
        &self.proxy
    }

    /// Runs the sweep once now, as its schedule would, and waits for its answer.
    pub async fn sweep(&self) -> Result<Answer, InvokeError> {
        let pool = self
            .pools
            .iter()
            .find(|p| p.name() == "sweep")
            .ok_or_else(|| InvokeError::Stopped("sweep".into()))?;
        invoke_scheduled(pool, &self.activity).await
    }

    /// Ends every function's processes once idle, as Lambda reclaims idle
    /// sandboxes: each next invocation is a cold start, remembering nothing
    /// of earlier ones (e.g. the events a warm process would not repeat).
    pub async fn recycle(&self) {
        futures::future::join_all(self.pools.iter().map(|p| p.recycle())).await;
    }

    /// Messages visible and in flight in the queue at `url`, or what SQS said.
    pub async fn queued(&self, url: &str) -> Result<usize, String> {
        use aws_sdk_sqs::types::QueueAttributeName as A;
        let answer = aws_sdk_sqs::Client::new(&self.sdk)
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(A::ApproximateNumberOfMessages)
            .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .map_err(|e| {
                format!(
                    "GetQueueAttributes {url}: {}",
                    aws_sdk_sqs::error::DisplayErrorContext(&e)
                )
            })?;
        Ok(answer
            .attributes()
            .into_iter()
            .flat_map(|m| m.values())
            .filter_map(|v| v.parse::<usize>().ok())
            .sum())
    }

    /// Whether no queue holds a message (visible, or in flight: handled or
    /// redelivered after a failure); a queue SQS cannot describe is not empty.
    pub async fn queues_empty(&self) -> bool {
        let w = &self.world;
        for url in [&w.pending.url, &w.launch.url, &w.interruption.url] {
            if self.queued(url).await != Ok(0) {
                return false;
            }
        }
        true
    }

    /// As long as a new instance takes to become a Ready Node here.
    pub fn kubelet_time(&self) -> Duration {
        self.settings.kubelet_join + self.settings.kubelet_ready + Duration::from_millis(500)
    }

    /// Waits until nothing is under way (at most `limit`): the queues empty
    /// at two looks in a row; then every instance's kubelet at rest (its
    /// Node Ready, or refused), stepped here rather than waiting for the
    /// kubelets' loop; a pass of the controllers and the scheduler over what
    /// they left; while pods are pending, the forwarder's batch window gone
    /// by; and the queues empty again (else it starts over). Tests that count
    /// sweeps call it before each one.
    pub async fn quiet(&self, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        let ec2 = aws_sdk_ec2::Client::new(&self.sdk);
        while tokio::time::Instant::now() < deadline {
            let mut calm = 0;
            while calm < 2 && tokio::time::Instant::now() < deadline {
                calm = if self.queues_empty().await { calm + 1 } else { 0 };
                tokio::time::sleep(QUIET_LOOK).await;
            }
            while tokio::time::Instant::now() < deadline {
                let stepped = self.kubelets.step(&self.kube, &ec2, &self.catalog).await;
                if stepped.is_ok() && self.kubelets.at_rest() {
                    break;
                }
                tokio::time::sleep(QUIET_LOOK).await;
            }
            self.kube.reconcile();
            self.kube.schedule();
            // A pod that went pending reaches the queue once the forwarder's
            // batch has been idle that long.
            if self.kube.count_pods(|p| p.pointer("/spec/nodeName").is_none()) > 0 {
                tokio::time::sleep(self.settings.batch_idle + QUIET_LOOK).await;
            }
            if self.queues_empty().await {
                return;
            }
        }
    }

    /// The kubeconfig file for `kubectl`.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// Where the function and forwarder logs are.
    pub fn log_dir(&self) -> PathBuf {
        self.state_dir.join("logs")
    }

    /// The contract's `export` lines.
    pub fn exports(&self) -> String {
        let mut vars: Vec<(&str, String)> = vec![("KUBECONFIG", self.kubeconfig.display().to_string())];
        vars.extend(child_env(self.moto.endpoint()));
        vars.extend([
            ("NODESMITH_CLUSTER_NAME", self.settings.cluster.clone()),
            ("NODESMITH_TABLE", aws::TABLE.to_string()),
            ("NODESMITH_PENDING_QUEUE_URL", self.world.pending.url.clone()),
            ("NODESMITH_LAUNCH_QUEUE_URL", self.world.launch.url.clone()),
            ("NODESMITH_INTERRUPTION_QUEUE_URL", self.world.interruption.url.clone()),
        ]);
        vars.iter()
            .map(|(k, v)| format!("export {k}={}\n", shell_quote(v)))
            .collect()
    }

    /// Process ids of every child process now running (moto, functions, forwarder).
    pub fn child_pids(&self) -> Vec<u32> {
        let mut pids = vec![self.moto.pid()];
        pids.extend(self.pools.iter().flat_map(|p| p.pids()));
        pids.extend(self.forwarder.as_ref().and_then(|f| f.id()));
        pids
    }

    /// The forwarder's process id, while it runs.
    pub fn forwarder_pid(&self) -> Option<u32> {
        self.forwarder.as_ref().and_then(tokio::process::Child::id)
    }

    /// Each function process now running, by its function's name.
    pub fn function_pids(&self) -> Vec<(&str, u32)> {
        self.pools
            .iter()
            .flat_map(|p| p.pids().into_iter().map(move |pid| (p.name(), pid)))
            .collect()
    }

    /// Stops everything: pollers and schedule first, then the forwarder
    /// (SIGTERM, so it flushes), the functions, the cluster and moto.
    pub async fn stop(mut self) {
        for t in &self.tasks {
            t.abort();
        }
        if let Some(mut fwd) = self.forwarder.take() {
            if let Some(pid) = fwd.id() {
                let _ = std::process::Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status();
            }
            if tokio::time::timeout(Duration::from_secs(5), fwd.wait()).await.is_err() {
                let _ = fwd.kill().await;
            }
        }
        for p in &self.pools {
            p.stop().await;
        }
        if self.temporary_state {
            let _ = std::fs::remove_dir_all(&self.state_dir);
        }
        // Dropping the rest stops the kube server, its loops and moto.
    }
}

fn shell_quote(v: &str) -> String {
    if v.chars().all(|c| c.is_ascii_alphanumeric() || "-_./:=@".contains(c)) {
        v.to_string()
    } else {
        format!("'{}'", v.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(vars: &[(&str, &str)]) -> Result<Settings, SettingsError> {
        let vars: BTreeMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Settings::from_lookup(|k| vars.get(k).cloned(), PathBuf::from("bin"))
    }

    #[test]
    fn the_forwarder_batch_idle_is_read_as_karpenter_writes_it_and_a_bad_one_is_named() {
        assert_eq!(read(&[]).unwrap().batch_idle, nodesmith_forwarder::DEFAULT_BATCH_IDLE);
        assert_eq!(
            read(&[("BATCH_IDLE_DURATION", "250ms")]).unwrap().batch_idle,
            Duration::from_millis(250)
        );
        for bad in ["0s", "soon"] {
            let e = read(&[("BATCH_IDLE_DURATION", bad)]).unwrap_err();
            assert_eq!(e.name, "BATCH_IDLE_DURATION", "{bad}: {e}");
        }
    }
}
