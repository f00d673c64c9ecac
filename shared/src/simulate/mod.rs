//! `nodesmith simulate`: read ordinary manifests, expand workloads into pods,
//! run the provisioning solver offline and report the plan (JSON or a table),
//! exactly as `docs/simulate-format.md` specifies. With `--disruption`, the
//! same manifests are a running cluster and one disruption pass is decided.

pub mod output;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use jiff::Timestamp;

use crate::apis::manifest::{ManifestError, Warning, load_paths};
use crate::catalog::Catalog;
use crate::disruption::{DecideOptions, Decisions, decide};
use crate::scheduling::{Plan, SolveOptions};
use crate::snapshot::Snapshot;

pub use output::{disruption_to_json, disruption_to_table, to_json, to_table};

/// Why a simulation could not run (all of it is bad input: exit status 2).
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    /// A manifest is unreadable or invalid.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// The catalog file is unreadable or invalid.
    #[error("{file}: {message}")]
    Catalog {
        /// The catalog file (or `built-in`).
        file: String,
        /// What is wrong.
        message: String,
    },
}

/// A finished simulation.
#[derive(Debug, Clone)]
pub struct Report {
    /// The plan.
    pub plan: Plan,
    /// Pending pods considered.
    pub pending_pods: usize,
    /// Wall time of the solve, in milliseconds.
    pub solve_millis: f64,
    /// The least any plan placing the same pods could pay per hour
    /// ([`crate::scheduling::Compiled::lower_bound`]).
    pub lower_bound: f64,
}

impl Report {
    /// The plan's price over its lower bound (1 is optimal); `None` when
    /// the bound is 0 (everything fits on existing capacity).
    pub fn cost_to_bound(&self) -> Option<f64> {
        (self.lower_bound > 0.0).then(|| self.plan.total_price() / self.lower_bound)
    }
}

/// Plans the snapshot's pending pods with the provisioning solver.
pub fn simulate(s: &Snapshot) -> Report {
    let start = Instant::now();
    let compiled = s.compile();
    let plan = compiled.solve(&SolveOptions::default());
    let solve_millis = start.elapsed().as_secs_f64() * 1000.0;
    let lower_bound = compiled.lower_bound(&plan);
    Report {
        plan,
        pending_pods: s.pods.len(),
        solve_millis,
        lower_bound,
    }
}

/// Reads the catalog file, or the built-in catalog without one.
pub fn load_catalog(path: Option<&std::path::Path>) -> Result<Catalog, SimulateError> {
    match path {
        Some(p) => {
            let file = p.display().to_string();
            let text = std::fs::read_to_string(p).map_err(|e| SimulateError::Catalog {
                file: file.clone(),
                message: format!("cannot read: {e}"),
            })?;
            crate::catalog::file::parse(&text).map_err(|e| SimulateError::Catalog {
                file,
                message: e.to_string(),
            })
        }
        None => crate::catalog::builtin().cloned().map_err(|e| SimulateError::Catalog {
            file: "built-in catalog".into(),
            message: e.to_string(),
        }),
    }
}

/// Loads manifests and the catalog into a snapshot at `now`; warnings are
/// returned for stderr.
pub fn load(
    paths: &[PathBuf],
    catalog: Option<&std::path::Path>,
    now: Timestamp,
) -> Result<(Snapshot, Vec<Warning>), SimulateError> {
    let (docs, mut warnings) = load_paths(paths)?;
    // Manifest errors are reported before catalog errors: read the manifests
    // against an empty catalog, then put the real one in.
    let empty = Arc::new(Catalog {
        region: String::new(),
        instance_types: Vec::new(),
    });
    let mut snapshot = Snapshot::from_manifests(&docs, empty, now, &mut warnings)?;
    snapshot.catalog = Arc::new(load_catalog(catalog)?);
    Ok((snapshot, warnings))
}

/// Loads manifests and the catalog, and simulates at `now`; warnings are
/// returned for stderr.
pub fn run(
    paths: &[PathBuf],
    catalog: Option<&std::path::Path>,
    now: Timestamp,
) -> Result<(Report, Vec<Warning>), SimulateError> {
    let (snapshot, warnings) = load(paths, catalog, now)?;
    Ok((simulate(&snapshot), warnings))
}

/// A finished disruption simulation.
#[derive(Debug, Clone)]
pub struct DisruptionReport {
    /// The pass's decisions.
    pub decisions: Decisions,
    /// Nodes in the snapshot.
    pub nodes: usize,
    /// Pods running on them.
    pub pods: usize,
    /// Wall time of the decision, in milliseconds.
    pub decide_millis: f64,
}

/// Decides one disruption pass over the snapshot, as the sweep would.
pub fn simulate_disruption(s: &Snapshot) -> DisruptionReport {
    let start = Instant::now();
    let decisions = decide(s, &DecideOptions::default());
    DisruptionReport {
        decisions,
        nodes: s.nodes.len(),
        pods: s.nodes.iter().map(|n| n.pods.len()).sum(),
        decide_millis: start.elapsed().as_secs_f64() * 1000.0,
    }
}

/// Loads manifests and the catalog, and decides one disruption pass at `now`.
pub fn run_disruption(
    paths: &[PathBuf],
    catalog: Option<&std::path::Path>,
    now: Timestamp,
) -> Result<(DisruptionReport, Vec<Warning>), SimulateError> {
    let (snapshot, warnings) = load(paths, catalog, now)?;
    Ok((simulate_disruption(&snapshot), warnings))
}

#[cfg(test)]
mod tests;
