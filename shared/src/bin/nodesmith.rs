//! The `nodesmith` command line: `nodesmith simulate` plans offline what the
//! provision function would launch for a set of manifests; with
//! `--disruption`, what one sweep pass would disrupt in a running cluster.
//! `nodesmith event` classifies EventBridge events as the `interrupt` function does.
//! `nodesmith status` shows what nodesmith is doing in a cluster and what it costs.
//! `nodesmith rotate` asks for a pool's nodes, or one node, to be replaced.
//! `nodesmith explain` says why a node is or is not being disrupted, and why a pod is pending.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use nodesmith::settings::Settings;

/// Karpenter's node provisioning for Amazon EKS, done by Lambda functions.
#[derive(Parser)]
#[command(name = "nodesmith", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    access: Access,
}

/// Where `status`, `explain` and `rotate` reach AWS and the cluster, as the
/// AWS CLI and kubectl take it.
#[derive(clap::Args, Clone, Default)]
struct Access {
    /// AWS region of the state table (default: the AWS SDK's, e.g. AWS_REGION).
    #[arg(long, global = true)]
    region: Option<String>,
    /// AWS profile (default: the AWS SDK's, e.g. AWS_PROFILE).
    #[arg(long, global = true)]
    profile: Option<String>,
    /// kubeconfig context (default: the current one; overrides NODESMITH_KUBE_URL).
    #[arg(long, global = true)]
    context: Option<String>,
    /// The nodesmith CloudFormation stack: its outputs name the state table
    /// (when --table does not) and, for `install`, the queue.
    #[arg(long, global = true)]
    stack: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Print the nodes nodesmith would launch for these manifests, and their price.
    Simulate {
        /// Instance catalog file (JSON); the built-in us-east-1 catalog without it.
        #[arg(long)]
        catalog: Option<PathBuf>,
        /// Output format (json when stdout is not a terminal, else table; wide is table).
        #[arg(short = 'o', long, value_enum)]
        output: Option<Output>,
        /// Decide one disruption pass over the running cluster instead.
        #[arg(long)]
        disruption: bool,
        /// The moment decisions are taken, RFC 3339 (default: now).
        #[arg(long)]
        now: Option<jiff::Timestamp>,
        /// YAML files or directories.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// Classify EventBridge events as the interrupt function does (acts on nothing).
    Event {
        /// What rebalance recommendations do, for the `action` text (default: NODESMITH_REBALANCE, else ignore).
        #[arg(long)]
        rebalance: Option<String>,
        /// JSON files (an event, a list of events or an SQS message); `-` for stdin.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Show NodeClaims, pending pods and why, disruptions in progress, the
    /// fleet's $/h and what the autoscaler cost today and this month.
    ///
    /// Reads the state table with the AWS SDK's usual configuration, and the
    /// cluster at NODESMITH_KUBE_URL (with NODESMITH_KUBE_TOKEN) when set, else
    /// through the kubeconfig or the in-cluster service account.
    Status {
        /// The state table (default: NODESMITH_TABLE).
        #[arg(long)]
        table: Option<String>,
        /// Output format (default table, even when piped, as kubectl's).
        #[arg(short = 'o', long, value_enum)]
        output: Option<Output>,
        /// The moment the report describes, RFC 3339 (default: now).
        #[arg(long)]
        now: Option<jiff::Timestamp>,
    },
    /// Why a node is or is not being disrupted right now, or why a pod is pending.
    ///
    /// Runs the sweep's disruption decisions, or provision's solve, on the
    /// live cluster and state table (acts on nothing). Reads them as
    /// `status` does.
    Explain {
        /// `node/NAME`, `pod/NAMESPACE/NAME` or `pod/NAME`.
        subject: String,
        /// The state table (default: NODESMITH_TABLE).
        #[arg(long)]
        table: Option<String>,
        /// Output format (default table, even when piped, as kubectl's).
        #[arg(short = 'o', long, value_enum)]
        output: Option<Output>,
    },
    /// Print the in-cluster part (namespace, forwarder, the functions' RBAC)
    /// for `kubectl apply -f -`, with the stack's queue and the image filled in.
    ///
    /// Needs --stack (CloudFormation DescribeStacks). The CRDs are printed
    /// apart, with --crds, so that deleting the rest never deletes them.
    Install {
        /// The forwarder's image, e.g. REGISTRY/nodesmith-forwarder:TAG.
        #[arg(long, required_unless_present = "crds")]
        image: Option<String>,
        /// Print the CRDs instead (`kubectl apply --server-side -f -`).
        #[arg(long)]
        crds: bool,
    },
    /// Replace a NodePool's nodes, or one node, as drift does: a replacement
    /// first, within the pool's disruption budgets, one sweep at a time.
    ///
    /// Marks each node (annotation `nodesmith/rotate-requested`); the sweep
    /// replaces marked nodes, records each like any disruption and resumes
    /// after a failure. Nodes launched later are not marked. Reads the state
    /// table and the cluster as `status` does.
    Rotate {
        /// Every node of this NodePool.
        #[arg(long, required_unless_present = "node", conflicts_with = "node")]
        pool: Option<String>,
        /// This node.
        #[arg(long)]
        node: Option<String>,
        /// The state table (default: NODESMITH_TABLE).
        #[arg(long)]
        table: Option<String>,
        /// Output format (default table, even when piped, as kubectl's).
        #[arg(short = 'o', long, value_enum)]
        output: Option<Output>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Json,
    Yaml,
    Table,
    /// A table with more columns where there are more to show.
    Wide,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let access = cli.access;
    match cli.command {
        Command::Event { rebalance, files } => event(rebalance, &files),
        Command::Install { image, crds } => install(&access, image, crds),
        Command::Status { table, output, now } => status(&access, table, output, now),
        Command::Explain { subject, table, output } => explain(&access, &subject, table, output),
        Command::Rotate {
            pool,
            node,
            table,
            output,
        } => {
            let selection = match (pool, node) {
                (Some(p), _) => nodesmith::rotation::Selection::Pool(p),
                (None, Some(n)) => nodesmith::rotation::Selection::Node(n),
                (None, None) => return bad_input(&"name a --pool or a --node"),
            };
            rotate(&access, &selection, table, output)
        }
        Command::Simulate {
            catalog,
            output,
            disruption,
            now,
            paths,
        } => {
            let now = now.unwrap_or_else(jiff::Timestamp::now);
            let output = output_or_default(output);
            if disruption {
                return match nodesmith::simulate::run_disruption(&paths, catalog.as_deref(), now) {
                    Ok((report, warnings)) => {
                        warn_documents(&warnings);
                        for e in &report.decisions.errors {
                            eprintln!("warning: {e} (the NodePool disrupts nothing voluntarily)");
                        }
                        emit(
                            output,
                            || nodesmith::simulate::disruption_to_json(&report),
                            |_| nodesmith::simulate::disruption_to_table(&report),
                        )
                    }
                    Err(e) => bad_input(&e),
                };
            }
            match nodesmith::simulate::run(&paths, catalog.as_deref(), now) {
                Ok((report, warnings)) => {
                    warn_documents(&warnings);
                    for w in &report.plan.warnings {
                        eprintln!("warning: {w}");
                    }
                    emit(
                        output,
                        || nodesmith::simulate::to_json(&report),
                        |_| nodesmith::simulate::to_table(&report),
                    )
                }
                Err(e) => bad_input(&e),
            }
        }
    }
}

/// `simulate`'s format: the one asked for, else a table on a terminal and
/// JSON elsewhere (its contract, `docs/simulate-format.md`; the commands
/// about a running cluster print a table unless asked, as kubectl does).
fn output_or_default(output: Option<Output>) -> Output {
    output.unwrap_or(if std::io::stdout().is_terminal() {
        Output::Table
    } else {
        Output::Json
    })
}

/// `nodesmith status` (`docs/status-format.md`): exit 2 when the table is not
/// named, 1 when the table or the cluster cannot be read.
fn status(access: &Access, table: Option<String>, output: Option<Output>, now: Option<jiff::Timestamp>) -> ExitCode {
    let now = now.unwrap_or_else(jiff::Timestamp::now);
    let gathered = with_state(access, table, |store, cluster| async move {
        nodesmith::status::gather(&store, &cluster, now)
            .await
            .map_err(|e| error_chain(&e))
    });
    match gathered {
        Ok(input) => {
            let report = nodesmith::status::report(&input);
            emit(
                output.unwrap_or(Output::Table),
                || nodesmith::status::to_json(&report),
                |wide| {
                    if wide {
                        nodesmith::status::to_wide_table(&report)
                    } else {
                        nodesmith::status::to_table(&report)
                    }
                },
            )
        }
        Err(code) => code,
    }
}

/// `nodesmith explain`: the verdict and why, as text or JSON; exit 2 when
/// the subject or table is not named right, 1 when they cannot be read.
fn explain(access: &Access, subject: &str, table: Option<String>, output: Option<Output>) -> ExitCode {
    let subject: nodesmith::explain::Subject = match subject.parse() {
        Ok(s) => s,
        Err(e) => return bad_input(&e),
    };
    let now = jiff::Timestamp::now();
    let explained = with_state(access, table, |store, cluster| async move {
        nodesmith::explain::explain(&store, &cluster, &subject, now)
            .await
            .map_err(|e| error_chain(&e))
    });
    match explained {
        Ok(e) => emit(
            output.unwrap_or(Output::Table),
            || serde_json::to_value(&e).unwrap_or_default(),
            |_| e.to_text(),
        ),
        Err(code) => code,
    }
}

/// `nodesmith rotate`: the nodes marked, as a table or `{"rotations": [...]}`;
/// exit 2 when the table is not named or the pool or node is not
/// nodesmith's, 1 when the table or the cluster cannot be read or written.
fn rotate(
    access: &Access,
    selection: &nodesmith::rotation::Selection,
    table: Option<String>,
    output: Option<Output>,
) -> ExitCode {
    use nodesmith::rotation::RotateError;
    let now = jiff::Timestamp::now();
    let asked = with_state(access, table, |store, cluster| async move {
        Ok(nodesmith::rotation::request(&store, &cluster, selection, now).await)
    });
    let rotations = match asked {
        Ok(Ok(r)) => r,
        Ok(Err(e @ (RotateError::NotManaged(_) | RotateError::EmptyPool(_)))) => return bad_input(&e),
        Ok(Err(e)) => {
            eprintln!("error: {}", error_chain(&e));
            return ExitCode::from(1);
        }
        Err(code) => return code,
    };
    emit(
        output.unwrap_or(Output::Table),
        || serde_json::json!({"rotations": rotations}),
        |_| {
            let mut rows = vec![
                ["NODE", "NODECLAIM", "NODEPOOL", "REQUESTED"]
                    .map(String::from)
                    .to_vec(),
            ];
            rows.extend(rotations.iter().map(|r| {
                let at = if r.already_requested {
                    format!("{} (asked before)", r.requested_at)
                } else {
                    r.requested_at.clone()
                };
                vec![r.node.clone(), r.node_claim.clone(), r.node_pool.clone(), at]
            }));
            format!(
                "{}\nThe sweep replaces each node as drift does: a replacement first, within the NodePool's disruption budgets.\n",
                nodesmith::text_table::columns(&rows)
            )
        },
    )
}

/// `nodesmith install`: the CRDs, or the rest for `--stack` with the
/// image filled in; exit 2 when the stack is not named or lacks an output,
/// 1 when it cannot be read.
fn install(access: &Access, image: Option<String>, crds: bool) -> ExitCode {
    use nodesmith::install::InstallError;
    if crds {
        print!("{}", nodesmith::install::CRDS);
        return ExitCode::SUCCESS;
    }
    let (Some(stack), Some(image)) = (&access.stack, image) else {
        return bad_input(&"name the stack (--stack NAME) and the forwarder's image (--image REF)");
    };
    let made = runtime().and_then(|rt| {
        rt.block_on(async {
            let sdk = sdk(access).await;
            let found = nodesmith::install::describe_stack(&aws_sdk_cloudformation::Client::new(&sdk), stack).await;
            Ok(found.and_then(|s| nodesmith::install::manifests(&s, &image)))
        })
    });
    match made {
        Ok(Ok(text)) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Ok(Err(e @ InstallError::MissingOutput { .. })) => bad_input(&e),
        Ok(Err(e)) => {
            eprintln!("error: {}", error_chain(&e));
            ExitCode::from(1)
        }
        Err(code) => code,
    }
}

/// A runtime for one command; exit 1 when none can be started.
fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("error: cannot start the async runtime: {e}");
            ExitCode::from(1)
        })
}

/// The AWS SDK's configuration, with `--region` and `--profile`.
async fn sdk(access: &Access) -> aws_config::SdkConfig {
    let mut loader = nodesmith::transport::sdk_defaults();
    if let Some(r) = &access.region {
        loader = loader.region(aws_config::Region::new(r.clone()));
    }
    if let Some(p) = &access.profile {
        loader = loader.profile_name(p);
    }
    loader.load().await
}

/// Runs `work` on its own runtime with the state table (`--table`, else
/// the `--stack`'s, else NODESMITH_TABLE) and the cluster; the exit code
/// when the table is not named (2) or the runtime, the stack, the table or
/// the cluster fails (1).
fn with_state<T, F, Fut>(access: &Access, table: Option<String>, work: F) -> Result<T, ExitCode>
where
    F: FnOnce(nodesmith::state::StateStore, nodesmith::kubernetes::KubeCluster) -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let nonempty = |t: &String| !t.trim().is_empty();
    let named = table.filter(nonempty);
    let from_env = || Settings::from_env().optional("NODESMITH_TABLE").filter(nonempty);
    if named.is_none() && access.stack.is_none() && from_env().is_none() {
        return Err(bad_input(
            &"no state table: pass --table or --stack, or set NODESMITH_TABLE",
        ));
    }
    runtime()?
        .block_on(async {
            let sdk = sdk(access).await;
            let table = match (named, &access.stack) {
                (Some(t), _) => t,
                (None, Some(stack)) => {
                    let cfn = aws_sdk_cloudformation::Client::new(&sdk);
                    let found = nodesmith::install::describe_stack(&cfn, stack).await;
                    found
                        .and_then(|s| Ok(s.output(nodesmith::install::TABLE_OUTPUT)?.to_string()))
                        .map_err(|e| error_chain(&e))?
                }
                (None, None) => from_env().unwrap_or_default(),
            };
            let store = nodesmith::state::StateStore::new(aws_sdk_dynamodb::Client::new(&sdk), table);
            let cluster = cluster(sdk, access.context.as_deref()).await?;
            work(store, cluster).await
        })
        .map_err(|e| {
            eprintln!("error: {e}");
            ExitCode::from(1)
        })
}

/// The cluster `status`, `explain` and `rotate` use: the kubeconfig's
/// `context` when named, else NODESMITH_KUBE_URL when set, else the
/// kubeconfig's current context or the in-cluster service account.
async fn cluster(
    sdk: aws_config::SdkConfig,
    context: Option<&str>,
) -> Result<nodesmith::kubernetes::KubeCluster, String> {
    use nodesmith::kubernetes::KubeCluster;
    use nodesmith::kubernetes::kube_cluster::KUBE_URL_ENV;
    if context.is_none() && Settings::from_env().optional(KUBE_URL_ENV).is_some() {
        return KubeCluster::from_env(sdk).map_err(|e| format!("{KUBE_URL_ENV}: {}", error_chain(&e)));
    }
    nodesmith::transport::install_crypto_provider();
    let client = match context {
        Some(c) => {
            let options = kube::config::KubeConfigOptions {
                context: Some(c.to_string()),
                ..Default::default()
            };
            let config = kube::Config::from_kubeconfig(&options)
                .await
                .map_err(|e| format!("kubeconfig context {c}: {}", error_chain(&e)))?;
            kube::Client::try_from(config).map_err(|e| format!("kubeconfig context {c}: {}", error_chain(&e)))?
        }
        None => kube::Client::try_default().await.map_err(|e| {
            format!(
                "no cluster: set {KUBE_URL_ENV}, or a kubeconfig (KUBECONFIG, ~/.kube/config): {}",
                error_chain(&e)
            )
        })?,
    };
    Ok(KubeCluster::from_client(client))
}

/// An error and its causes, `: `-separated.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(&format!(": {s}"));
        source = s.source();
    }
    out
}

/// Input that cannot be simulated: the error on stderr, exit 2.
fn bad_input(e: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::from(2)
}

/// Warnings about manifest documents that were skipped or read leniently.
fn warn_documents(warnings: &[nodesmith::apis::manifest::Warning]) {
    for w in warnings {
        eprintln!("warning: {}: document {}: {}", w.file, w.index, w.message);
    }
}

/// Prints a report as JSON, YAML or a table (`table(true)`: the wide one); exit 1 only when JSON cannot be rendered.
fn emit(output: Output, json: impl FnOnce() -> serde_json::Value, table: impl FnOnce(bool) -> String) -> ExitCode {
    match output {
        Output::Json => match serde_json::to_string_pretty(&json()) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("error: cannot render JSON: {e}");
                return ExitCode::from(1);
            }
        },
        Output::Yaml => match serde_yaml_ng::to_string(&json()) {
            Ok(s) => print!("{s}"),
            Err(e) => {
                eprintln!("error: cannot render YAML: {e}");
                return ExitCode::from(1);
            }
        },
        Output::Table => print!("{}", table(false)),
        Output::Wide => print!("{}", table(true)),
    }
    ExitCode::SUCCESS
}

/// `nodesmith event`: one JSON array, one object per event, in input order
/// (`docs/interruption-format.md`). Exit 2 when a file cannot be read.
fn event(rebalance: Option<String>, files: &[PathBuf]) -> ExitCode {
    use std::io::Read;
    let mode = rebalance
        .or_else(|| Settings::from_env().optional("NODESMITH_REBALANCE"))
        .unwrap_or_default();
    let mode: nodesmith::interruption::RebalanceMode = match mode.parse() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let mut out = Vec::new();
    for f in files {
        let text = if f.as_os_str() == "-" {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s).map(|_| s)
        } else {
            std::fs::read_to_string(f)
        };
        let text = match text {
            Ok(t) => t,
            Err(e) => {
                eprintln!("error: cannot read {}: {e}", f.display());
                return ExitCode::from(2);
            }
        };
        out.extend(
            nodesmith::interruption::read_input(&text)
                .iter()
                .map(|e| nodesmith::interruption::to_json(e, mode)),
        );
    }
    match serde_json::to_string_pretty(&out) {
        Ok(s) => {
            println!("{s}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: cannot render JSON: {e}");
            ExitCode::from(1)
        }
    }
}
