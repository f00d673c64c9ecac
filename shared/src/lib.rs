//! nodesmith: Karpenter's node provisioning for Amazon EKS, done by Lambda functions.
//!
//! Pure parts (API types, requirements, catalog maths, the solver, disruption
//! decisions, event parsing) have no I/O; adapters to AWS and Kubernetes are
//! thin and live beside them.

pub mod apis;
pub mod capacity;
pub mod catalog;
pub mod catalog_refresh;
pub mod crash;
pub mod disruption;
pub mod draining;
pub mod ec2;
pub mod interruption;
pub mod kubernetes;
pub mod labels;
pub mod lambda;
pub mod launch;
pub mod lifecycle;
pub mod messages;
pub mod metering;
pub mod nodeclaim;
pub mod nodeclass;
pub mod provisioning;
pub mod quantity;
pub mod registration;
pub mod requirements;
pub mod resources;
pub mod scheduling;
pub mod settings;
pub mod simulate;
pub mod snapshot;
pub mod state;
pub mod status;
pub mod sweep;
pub mod telemetry;
pub mod text_table;
