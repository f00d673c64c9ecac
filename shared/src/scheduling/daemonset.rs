//! DaemonSet overhead: a DaemonSet's pod runs on every node whose labels and
//! taints it fits, so its requests are reserved on each new node it would land on.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;

use super::pod::{PodModel, tolerates_all};
use crate::apis::Taint;
use crate::requirements::Requirements;
use crate::resources::Resources;

/// What the solver needs of a DaemonSet's pod.
#[derive(Debug, Clone)]
pub struct Daemon {
    /// Its pod's model.
    pub pod: PodModel,
}

/// The pod a DaemonSet runs on each node (`None` without a spec).
pub fn daemon_pod(ds: &DaemonSet) -> Option<Pod> {
    let spec = ds.spec.as_ref()?;
    let mut meta = spec.template.metadata.clone().unwrap_or_default();
    meta.namespace = ds.metadata.namespace.clone().or_else(|| Some("default".into()));
    meta.name = ds.metadata.name.clone();
    Some(Pod {
        metadata: meta,
        spec: spec.template.spec.clone(),
        status: None,
    })
}

/// Models every DaemonSet; ones whose pod cannot be modelled are skipped
/// with the reason.
pub fn daemons(list: &[DaemonSet]) -> (Vec<Daemon>, Vec<String>) {
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    for ds in list {
        let name = format!(
            "{}/{}",
            ds.metadata.namespace.as_deref().unwrap_or("default"),
            ds.metadata.name.as_deref().unwrap_or_default()
        );
        match daemon_pod(ds).map(|p| PodModel::from_pod(&p)) {
            Some(Ok(pod)) => out.push(Daemon { pod }),
            Some(Err(e)) => skipped.push(format!("daemonset {name}: spec.template.{e}")),
            None => skipped.push(format!("daemonset {name}: spec is required")),
        }
    }
    (out, skipped)
}

impl Daemon {
    /// True when the daemon's pod would run on a node with these taints and
    /// requirements (`compatible` decides requirement fit).
    pub fn lands_on(&self, taints: &[Taint], compatible: impl Fn(&Requirements) -> bool) -> bool {
        tolerates_all(&self.pod.tolerations, taints, true).is_ok() && self.pod.node_terms.iter().any(compatible)
    }

    /// The host ports its pod binds on every node it runs on.
    pub fn host_ports(&self) -> &[super::pod::HostPort] {
        &self.pod.host_ports
    }

    /// Its effective requests (a daemon pod takes a `pods` slot too).
    pub fn requests(&self) -> &Resources {
        &self.pod.requests
    }
}
