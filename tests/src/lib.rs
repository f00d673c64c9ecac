//! The local stack for nodesmith's tests: moto's server (AWS), a Kubernetes API
//! test server, and a fault-injecting proxy, shared by every integration test.

pub mod kube_server;
pub mod moto;
