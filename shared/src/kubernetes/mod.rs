//! Everything that talks to the cluster: EKS authentication, client building,
//! the [`Cluster`] adapter over kube-rs, drains and Events. Only the pod
//! helpers ([`pods`]) are built without the `autoscaler` feature: the forwarder
//! uses them.

#[cfg(feature = "autoscaler")]
pub mod auth;
#[cfg(feature = "autoscaler")]
pub mod client;
#[cfg(feature = "autoscaler")]
pub mod cluster;
#[cfg(feature = "autoscaler")]
pub mod crds;
#[cfg(feature = "autoscaler")]
pub mod decode;
#[cfg(feature = "autoscaler")]
pub mod drain;
#[cfg(feature = "autoscaler")]
pub mod events;
#[cfg(feature = "autoscaler")]
pub mod kube_cluster;
#[cfg(feature = "autoscaler")]
mod pages;
pub mod pods;
#[cfg(feature = "autoscaler")]
pub mod recorder;
#[cfg(feature = "autoscaler")]
pub mod retry;

#[cfg(feature = "autoscaler")]
pub use cluster::{Cluster, ClusterError, EvictionOutcome, NodeUpdate};
#[cfg(feature = "autoscaler")]
pub use drain::{DrainOptions, DrainReport, drain};
#[cfg(feature = "autoscaler")]
pub use events::EventSpec;
#[cfg(feature = "autoscaler")]
pub use kube_cluster::KubeCluster;
#[cfg(feature = "autoscaler")]
pub use pages::Paged;
