//! The AWS adapters against moto's server through the real SDK clients:
//! catalog, EC2 instances, EKS authentication, the state store, the launch
//! path, the live snapshot and `nodesmith status`.
//!
//! One moto serves every test of this executable (`nodesmith_tests::moto`).

mod launch_fixtures;

mod catalog_ec2;
mod catalog_refresh;
mod ec2_instances;
mod eks_auth;
mod launch_batch;
mod launch_class;
mod launch_exactly_once;
mod launch_faults;
mod launch_moto;
mod launch_nodeclass_fields;
mod launch_profiles;
mod launch_reserved;
mod leases;
mod moto_harness;
mod price_list;
mod snapshot_live;
mod state_store;
mod status;
mod zonal_shift;
