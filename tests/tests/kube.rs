//! The Kubernetes side: the adapter and the test server through the real
//! kube-rs client and `kubectl`, the simulated kubelets, registration's
//! writes and the in-cluster forwarder.

mod launch_fixtures;

mod forwarder;
mod karpenter_crds;
mod kube_adapter;
mod kube_server;
mod kubectl;
mod kubelet;
mod registration;
