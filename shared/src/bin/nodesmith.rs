//! The `nodesmith` command line: `nodesmith simulate` plans offline what the
//! provision function would launch for a set of manifests; with
//! `--disruption`, what one sweep pass would disrupt in a running cluster.
//! `nodesmith event` classifies EventBridge events as the `interrupt` function does.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

/// Karpenter's node provisioning for Amazon EKS, done by Lambda functions.
#[derive(Parser)]
#[command(name = "nodesmith", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the nodes nodesmith would launch for these manifests, and their price.
    Simulate {
        /// Instance catalog file (JSON); the built-in us-east-1 catalog without it.
        #[arg(long)]
        catalog: Option<PathBuf>,
        /// Output format (json when stdout is not a terminal, else table).
        #[arg(long, value_enum)]
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
        /// What rebalance recommendations do, for the `action` text (default: NODESMITH_REBALANCE, else replace).
        #[arg(long)]
        rebalance: Option<String>,
        /// JSON files (an event, a list of events or an SQS message); `-` for stdin.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Json,
    Table,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Event { rebalance, files } => event(rebalance, &files),
        Command::Simulate {
            catalog,
            output,
            disruption,
            now,
            paths,
        } => {
            let now = now.unwrap_or_else(jiff::Timestamp::now);
            let output = output.unwrap_or(if std::io::stdout().is_terminal() {
                Output::Table
            } else {
                Output::Json
            });
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
                            || nodesmith::simulate::disruption_to_table(&report),
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
                        || nodesmith::simulate::to_table(&report),
                    )
                }
                Err(e) => bad_input(&e),
            }
        }
    }
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

/// Prints a report as JSON or a table; exit 1 only when JSON cannot be rendered.
fn emit(output: Output, json: impl FnOnce() -> serde_json::Value, table: impl FnOnce() -> String) -> ExitCode {
    match output {
        Output::Json => match serde_json::to_string_pretty(&json()) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("error: cannot render JSON: {e}");
                return ExitCode::from(1);
            }
        },
        Output::Table => print!("{}", table()),
    }
    ExitCode::SUCCESS
}

/// `nodesmith event`: one JSON array, one object per event, in input order
/// (`docs/interruption-format.md`). Exit 2 when a file cannot be read.
fn event(rebalance: Option<String>, files: &[PathBuf]) -> ExitCode {
    use std::io::Read;
    let mode = rebalance
        .or_else(|| std::env::var("NODESMITH_REBALANCE").ok())
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
