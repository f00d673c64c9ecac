//! EC2 adapters shared by the functions: the cluster's instances (find, list,
//! terminate) as launch, interrupt and sweep all see them.

pub mod instances;

pub use instances::{Instance, InstanceState, Instances, InstancesError, Termination};
