//! EC2NodeClass resolution, one module per concept as the AWS provider cuts
//! it: subnets, security groups, AMIs, capacity reservations, instance
//! profiles; the class resolved as one plain value ([`ResolvedClass`], by
//! [`resolve`], once per class per run), its status, and the pure class →
//! launch-template mapping ([`template::template_spec`]). The sweep (status,
//! drift) and launch both read a class through here.

pub mod ami;
pub mod capacityreservation;
pub mod conditions;
pub mod eks_cluster;
pub mod error;
pub mod launchtemplate;
pub mod placementgroup;
pub mod profile;
pub mod resolved;
pub mod securitygroup;
pub mod subnet;
pub mod template;
pub mod userdata;

pub use error::NodeClassError;
pub use resolved::{ResolvedClass, RunClasses, k8s_version, resolve};
