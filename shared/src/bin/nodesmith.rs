//! The `nodesmith` command line: `nodesmith simulate` plans offline what the
//! provision function would launch for a set of manifests; with
//! `--disruption`, what one sweep pass would disrupt in a running cluster.

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
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Json,
    Table,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
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
                return simulate_disruption(&paths, catalog.as_deref(), now, output);
            }
            let (report, warnings) = match nodesmith::simulate::run(&paths, catalog.as_deref(), now) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            };
            for w in &warnings {
                eprintln!("warning: {}: document {}: {}", w.file, w.index, w.message);
            }
            for w in &report.plan.warnings {
                eprintln!("warning: {w}");
            }
            match output {
                Output::Json => match serde_json::to_string_pretty(&nodesmith::simulate::to_json(&report)) {
                    Ok(s) => println!("{s}"),
                    Err(e) => {
                        eprintln!("error: cannot render JSON: {e}");
                        return ExitCode::from(1);
                    }
                },
                Output::Table => print!("{}", nodesmith::simulate::to_table(&report)),
            }
            ExitCode::SUCCESS
        }
    }
}

fn simulate_disruption(
    paths: &[PathBuf],
    catalog: Option<&std::path::Path>,
    now: jiff::Timestamp,
    output: Output,
) -> ExitCode {
    let (report, warnings) = match nodesmith::simulate::run_disruption(paths, catalog, now) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    for w in &warnings {
        eprintln!("warning: {}: document {}: {}", w.file, w.index, w.message);
    }
    for e in &report.decisions.errors {
        eprintln!("warning: {e} (the NodePool disrupts nothing voluntarily)");
    }
    match output {
        Output::Json => match serde_json::to_string_pretty(&nodesmith::simulate::disruption_to_json(&report)) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("error: cannot render JSON: {e}");
                return ExitCode::from(1);
            }
        },
        Output::Table => print!("{}", nodesmith::simulate::disruption_to_table(&report)),
    }
    ExitCode::SUCCESS
}
