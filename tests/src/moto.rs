//! moto's server, started once per test process and shared by its tests.
//!
//! Tests take [`moto()`], which resets moto's state (and reseeds what moto
//! lacks: EKS AMIs, their SSM parameters) and holds a lock so tests of one
//! process never see each other's resources. The server is a child process
//! reading commands on stdin; it exits when the test process ends.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Mutex, OnceLock};

use aws_config::{Region, SdkConfig};
use aws_credential_types::Credentials;

/// The region every test uses.
pub const REGION: &str = "us-east-1";
/// Zones moto offers in [`REGION`].
pub const ZONES: &[&str] = &["us-east-1a", "us-east-1b", "us-east-1c"];

/// An image the server seeds (the EKS AL2023 x86_64 AMI): moto's stock images are not loaded.
pub const SEEDED_AMI: &str = "ami-0a1b2c3d4e5f60001";

/// A moto server child process of its own (the tests share one through
/// [`moto()`]; the local cloud owns one). It exits when this handle is
/// dropped: its stdin closes.
pub struct MotoServer {
    endpoint: String,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    child: Child,
}

static SERVER: OnceLock<Result<Mutex<MotoServer>, String>> = OnceLock::new();
static TEST_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The repository's root (the parent of this crate).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The Python with moto installed: `NODESMITH_PYTHON`, else the repo's `.venv`.
pub fn python() -> PathBuf {
    std::env::var_os("NODESMITH_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".venv/bin/python"))
}

impl MotoServer {
    /// Starts moto's server (seeded, on a free loopback port) and waits until it listens.
    pub fn spawn() -> Result<MotoServer, String> {
        let py = python();
        if !py.exists() {
            return Err(format!(
                "no Python at {} — run scripts/setup, which creates the repo's .venv with moto",
                py.display()
            ));
        }
        let mut child = Command::new(&py)
            .arg(repo_root().join("tests/moto/server.py"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            // Its own process group: a terminal's Ctrl-C reaches the owner,
            // which stops moto last, after the functions using it.
            .process_group(0)
            .spawn()
            .map_err(|e| format!("cannot start moto with {}: {e}", py.display()))?;
        let stdin = child.stdin.take().ok_or("moto has no stdin")?;
        let mut stdout = BufReader::new(child.stdout.take().ok_or("moto has no stdout")?);
        let mut line = String::new();
        stdout
            .read_line(&mut line)
            .map_err(|e| format!("moto did not start: {e}"))?;
        let port = line
            .trim()
            .strip_prefix("READY ")
            .ok_or_else(|| {
                format!(
                    "moto did not start (said {line:?}); is moto[server] installed in {}?",
                    py.display()
                )
            })?
            .to_string();
        Ok(MotoServer {
            endpoint: format!("http://127.0.0.1:{port}"),
            stdin,
            stdout,
            child,
        })
    }

    /// The server's URL.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends one harness command (`reset`, `spot <json>`) and waits for its answer.
    pub fn command(&mut self, line: &str) -> Result<(), String> {
        writeln!(self.stdin, "{line}").map_err(|e| format!("moto is gone: {e}"))?;
        self.stdin.flush().map_err(|e| format!("moto is gone: {e}"))?;
        let mut answer = String::new();
        self.stdout
            .read_line(&mut answer)
            .map_err(|e| format!("moto is gone: {e}"))?;
        match answer.trim() {
            "OK" => Ok(()),
            other => Err(format!("moto refused {line:?}: {other}")),
        }
    }

    /// Sets spot prices, which moto does not model: (type, zone, price per hour).
    pub fn seed_spot_prices(&mut self, prices: &[(&str, &str, f64)]) -> Result<(), String> {
        let json: Vec<serde_json::Value> = prices
            .iter()
            .map(|(t, z, p)| serde_json::json!({"type": t, "zone": z, "price": p}))
            .collect();
        self.command(&format!("spot {}", serde_json::Value::Array(json)))
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn server() -> &'static Mutex<MotoServer> {
    match SERVER.get_or_init(|| MotoServer::spawn().map(Mutex::new)) {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    }
}

fn command(line: &str) -> Result<(), String> {
    server()
        .lock()
        .map_err(|_| "moto harness poisoned".to_string())?
        .command(line)
}

/// Exclusive use of a freshly reset moto for one test.
pub struct Moto {
    endpoint: String,
    _lock: tokio::sync::MutexGuard<'static, ()>,
}

/// Waits for moto, resets it and returns it for this test's exclusive use.
pub async fn moto() -> Moto {
    let lock = TEST_LOCK.lock().await;
    let endpoint = tokio::task::spawn_blocking(|| {
        command("reset").map(|_| server().lock().map(|s| s.endpoint.clone()).unwrap_or_default())
    })
    .await
    .unwrap_or_else(|e| Err(format!("moto reset panicked: {e}")))
    .unwrap_or_else(|e| panic!("{e}"));
    Moto { endpoint, _lock: lock }
}

impl Moto {
    /// The server's URL (also what `AWS_ENDPOINT_URL` should be for a child process).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// SDK configuration pointing every client at moto, with test credentials.
    pub async fn sdk_config(&self) -> SdkConfig {
        self.sdk_config_at(&self.endpoint).await
    }

    /// SDK configuration pointing at another endpoint (e.g. a proxy in front of moto).
    pub async fn sdk_config_at(&self, endpoint: &str) -> SdkConfig {
        sdk_config(endpoint).await
    }

    /// Environment for a child process (a function binary) to use moto.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        child_env(&self.endpoint)
    }

    /// Sets a public (`/aws/...`) SSM parameter, which PutParameter refuses
    /// (e.g. a new AMI behind an alias).
    pub fn set_public_parameter(&self, name: &str, value: &str) {
        Self::run(|s| s.command(&format!("param {name} {value}")));
    }

    /// Seeds spot prices, which moto does not model: (type, zone, price per hour).
    pub fn seed_spot_prices(&self, prices: &[(&str, &str, f64)]) {
        Self::run(|s| s.seed_spot_prices(prices));
    }

    /// Seeds a capacity reservation that CreateCapacityReservation cannot make
    /// (a capacity block): the `reservation` command's JSON (`server.py`).
    pub fn seed_reservation(&self, reservation: &serde_json::Value) {
        Self::run(|s| s.command(&format!("reservation {reservation}")));
    }

    /// Seeds ARC zonal shift state, which moto lacks: `arc-resource`,
    /// `zonal-shift` or `autoshift` with that command's JSON (`server.py`);
    /// the fake's refusal, if it refuses.
    pub fn seed_arc(&self, command: &str, spec: &serde_json::Value) -> Result<(), String> {
        server()
            .lock()
            .map_err(|_| "moto harness poisoned".to_string())?
            .command(&format!("{command} {spec}"))
    }

    /// Fails a running instance's status checks, which moto always passes:
    /// the `impaired` command's JSON (`server.py`), e.g.
    /// `{"instanceId": "i-...", "checks": ["system"], "since": "2026-01-01T00:00:00Z"}`.
    pub fn seed_impaired(&self, spec: &serde_json::Value) {
        Self::run(|s| s.command(&format!("impaired {spec}")));
    }

    fn run(f: impl FnOnce(&mut MotoServer) -> Result<(), String>) {
        let done = server()
            .lock()
            .map_err(|_| "moto harness poisoned".to_string())
            .and_then(|mut s| f(&mut s));
        if let Err(e) = done {
            panic!("{e}");
        }
    }
}

/// SDK configuration pointing every client at `endpoint` (moto, or a proxy in
/// front of it) in [`REGION`], with test credentials.
pub async fn sdk_config(endpoint: &str) -> SdkConfig {
    nodesmith::transport::sdk_defaults()
        .region(Region::new(REGION))
        .credentials_provider(Credentials::new("testing", "testing", None, None, "nodesmith-tests"))
        .endpoint_url(endpoint)
        .load()
        .await
}

/// Environment for a child process (a function binary, boto3, the AWS CLI) to use moto at `endpoint`.
pub fn child_env(endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ENDPOINT_URL", endpoint.to_string()),
        ("AWS_REGION", REGION.to_string()),
        ("AWS_ACCESS_KEY_ID", "testing".to_string()),
        ("AWS_SECRET_ACCESS_KEY", "testing".to_string()),
    ]
}

/// Runs one m5.large instance with `tags`, as a launch from outside the code
/// under test would (a leak, another stack's node); its id.
pub async fn run_tagged_instance(ec2: &aws_sdk_ec2::Client, tags: &[(String, String)]) -> String {
    run_tagged_instances(ec2, &[tags.to_vec()]).await.remove(0)
}

/// Runs one instance per tag set in a single RunInstances call, so they
/// share a launch time to the microsecond (a sweep sees all of them past a
/// grace period, or none): the tags all sets share go on at launch, the rest
/// on each instance after. Returns the ids in the order of `tag_sets`.
pub async fn run_tagged_instances(ec2: &aws_sdk_ec2::Client, tag_sets: &[Vec<(String, String)>]) -> Vec<String> {
    use aws_sdk_ec2::types::{ResourceType, Tag, TagSpecification};
    let tag = |(k, v): &(String, String)| Tag::builder().key(k).value(v).build();
    let common: Vec<&(String, String)> = tag_sets
        .first()
        .into_iter()
        .flatten()
        .filter(|t| tag_sets.iter().all(|set| set.contains(t)))
        .collect();
    let spec = common.iter().fold(
        TagSpecification::builder().resource_type(ResourceType::Instance),
        |b, t| b.tags(tag(t)),
    );
    let count = i32::try_from(tag_sets.len()).expect("a few instances");
    let out = ec2
        .run_instances()
        .image_id(SEEDED_AMI)
        .instance_type(aws_sdk_ec2::types::InstanceType::M5Large)
        .min_count(count)
        .max_count(count)
        .tag_specifications(spec.build())
        .send()
        .await
        .unwrap_or_else(|e| panic!("RunInstances: {e:?}"));
    let ids: Vec<String> = out
        .instances()
        .iter()
        .map(|i| i.instance_id().expect("an instance id").to_string())
        .collect();
    for (id, set) in ids.iter().zip(tag_sets) {
        let own: Vec<Tag> = set.iter().filter(|t| !common.contains(t)).map(tag).collect();
        if !own.is_empty() {
            ec2.create_tags()
                .resources(id)
                .set_tags(Some(own))
                .send()
                .await
                .unwrap_or_else(|e| panic!("CreateTags on {id}: {e:?}"));
        }
    }
    ids
}
