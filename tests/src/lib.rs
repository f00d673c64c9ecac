//! Local stack for tests.

pub mod kube_server;
