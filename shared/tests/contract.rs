//! The command-line contracts (`nodesmith simulate`, `nodesmith event`), the
//! example manifests, and the solver against Karpenter's reference behaviour,
//! through the built `nodesmith` binary where a contract is its output.

mod reference;

mod event_cli;
mod karpenter_reference;
mod manifests;
mod simulate_cli;
mod simulate_disruption;
mod simulate_examples;
mod simulate_nomination;
mod simulate_repair;
