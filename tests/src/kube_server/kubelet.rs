//! What a kubelet does at start-up, reduced to what tests need: register a
//! Node for an EC2 instance with its labels, taints and resources.

use std::collections::BTreeMap;

use nodesmith::apis::labels;
use serde_json::{Value, json};

/// The plain facts a node registers with (read from an EC2 instance by the caller).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeRegistration {
    /// Node name (EKS uses the private DNS name; tests may use anything).
    pub name: String,
    /// EC2 instance id, for `spec.providerID`.
    pub instance_id: String,
    /// EC2 instance type.
    pub instance_type: String,
    /// Availability zone.
    pub zone: String,
    /// Capacity type (spot / on-demand).
    pub capacity_type: String,
    /// CPU architecture (amd64 / arm64).
    pub arch: String,
    /// Extra labels (from `--node-labels`).
    pub labels: BTreeMap<String, String>,
    /// Taints (from `--register-with-taints`), as `key=value:Effect` strings.
    pub taints: Vec<String>,
    /// Capacity, in Kubernetes notation (`cpu: "2"`, `memory: "3788Mi"`, `pods: "29"`).
    pub capacity: BTreeMap<String, String>,
    /// Allocatable, in Kubernetes notation; capacity is used where missing.
    pub allocatable: BTreeMap<String, String>,
}

/// Labels and taints found in user data's kubelet flags
/// (`--node-labels=a=b,c=d` and `--register-with-taints=k=v:NoSchedule`),
/// which appear in both AL2 bootstrap scripts and AL2023 NodeConfig documents.
pub fn kubelet_flags_from_user_data(user_data: &str) -> (BTreeMap<String, String>, Vec<String>) {
    let mut node_labels = BTreeMap::new();
    let mut taints = Vec::new();
    let value_after = |flag: &str, rest: &str| -> Option<String> {
        let start = rest.find(flag)? + flag.len();
        let tail = &rest[start..];
        let end = tail.find(|c: char| c.is_whitespace() || c == '"' || c == '\'' || c == ']').unwrap_or(tail.len());
        Some(tail[..end].to_string())
    };
    for line in user_data.lines() {
        if let Some(v) = value_after("--node-labels=", line) {
            for pair in v.split(',').filter(|p| !p.is_empty()) {
                if let Some((k, val)) = pair.split_once('=') {
                    node_labels.insert(k.to_string(), val.to_string());
                }
            }
        }
        if let Some(v) = value_after("--register-with-taints=", line) {
            taints.extend(v.split(',').filter(|t| !t.is_empty()).map(str::to_string));
        }
    }
    (node_labels, taints)
}

/// Parses `key=value:Effect` or `key:Effect` into a taint object.
pub fn taint_json(s: &str) -> Option<Value> {
    let (kv, effect) = s.rsplit_once(':')?;
    let (key, value) = match kv.split_once('=') {
        Some((k, v)) => (k, Some(v)),
        None => (kv, None),
    };
    let mut t = json!({"key": key, "effect": effect});
    if let (Some(v), Some(o)) = (value, t.as_object_mut()) {
        o.insert("value".into(), json!(v));
    }
    Some(t)
}

impl NodeRegistration {
    /// The Node object the kubelet would create: well-known labels, provider id,
    /// taints, resources and a Ready condition.
    pub fn to_node(&self) -> Value {
        let mut l = self.labels.clone();
        let region = self.zone.trim_end_matches(|c: char| c.is_ascii_alphabetic()).to_string();
        for (k, v) in [
            (labels::HOSTNAME, self.name.clone()),
            (labels::INSTANCE_TYPE, self.instance_type.clone()),
            ("beta.kubernetes.io/instance-type", self.instance_type.clone()),
            (labels::ZONE, self.zone.clone()),
            (labels::REGION, region.clone()),
            (labels::OS, "linux".into()),
            (labels::ARCH, if self.arch.is_empty() { "amd64".into() } else { self.arch.clone() }),
        ] {
            l.entry(k.to_string()).or_insert(v);
        }
        if !self.capacity_type.is_empty() {
            l.entry(labels::CAPACITY_TYPE.to_string()).or_insert(self.capacity_type.clone());
        }
        let mut allocatable = self.capacity.clone();
        allocatable.extend(self.allocatable.clone());
        let taints: Vec<Value> = self.taints.iter().filter_map(|t| taint_json(t)).collect();
        let now = super::store::now_rfc3339();
        json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": l},
            "spec": {"providerID": format!("aws:///{}/{}", self.zone, self.instance_id), "taints": taints},
            "status": {
                "capacity": self.capacity,
                "allocatable": allocatable,
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": now, "lastTransitionTime": now}],
                "nodeInfo": {"architecture": l.get(labels::ARCH).cloned().unwrap_or_default(), "operatingSystem": "linux",
                    "kubeletVersion": "v1.33.0", "kubeProxyVersion": "", "bootID": "", "containerRuntimeVersion": "containerd://1.7.0",
                    "kernelVersion": "", "machineID": "", "osImage": "", "systemUUID": ""}
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_found_in_bootstrap_and_nodeconfig_user_data() {
        let al2 = "#!/bin/bash\n/etc/eks/bootstrap.sh c --kubelet-extra-args '--node-labels=karpenter.sh/nodepool=default,team=a --register-with-taints=gpu=true:NoSchedule'\n";
        let (l, t) = kubelet_flags_from_user_data(al2);
        assert_eq!(l.get("karpenter.sh/nodepool").map(String::as_str), Some("default"));
        assert_eq!(l.get("team").map(String::as_str), Some("a"));
        assert_eq!(t, vec!["gpu=true:NoSchedule".to_string()]);
        let al2023 = "spec:\n  kubelet:\n    flags:\n    - \"--node-labels=x=y\"\n    - \"--register-with-taints=k:NoExecute\"\n";
        let (l, t) = kubelet_flags_from_user_data(al2023);
        assert_eq!(l.get("x").map(String::as_str), Some("y"));
        assert_eq!(taint_json(&t[0]), Some(json!({"key": "k", "effect": "NoExecute"})));
    }
}
