//! EC2 adapters shared by the functions: the cluster's instances (find, list,
//! terminate) as launch, interrupt and sweep all see them, and their status
//! checks (node repair).

pub mod instances;
pub mod status;

pub use instances::{Instance, InstanceState, Instances, InstancesError, Termination};
pub use status::Impaired;
