//! Everything that talks to the cluster: EKS authentication, client building,
//! the [`Cluster`] adapter over kube-rs, drains and Events.

pub mod auth;
pub mod client;
pub mod cluster;
pub mod crds;
pub mod decode;
pub mod drain;
pub mod events;
pub mod kube_cluster;
pub mod pods;
pub mod recorder;
pub mod retry;

pub use cluster::{Cluster, ClusterError, EvictionOutcome, NodeUpdate};
pub use drain::{DrainOptions, DrainReport, drain};
pub use events::EventSpec;
pub use kube_cluster::KubeCluster;
