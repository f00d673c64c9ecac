//! The local stack for nodesmith's tests: moto's server (AWS), a Kubernetes API
//! test server, a fault-injecting proxy, EventBridge rules as the template
//! declares them, and a Lambda Runtime API for running
//! the function binaries — shared by every integration test.

pub mod calls;
pub mod eventbridge;
pub mod fault_proxy;
pub mod kube_server;
pub mod kubectl;
pub mod lambda_runtime;
pub mod local_cloud;
pub mod moto;
pub mod sqs;
