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
        let end = tail
            .find(|c: char| c.is_whitespace() || c == '"' || c == '\'' || c == ']')
            .unwrap_or(tail.len());
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
        let region = self
            .zone
            .trim_end_matches(|c: char| c.is_ascii_alphabetic())
            .to_string();
        for (k, v) in [
            (labels::HOSTNAME, self.name.clone()),
            (labels::INSTANCE_TYPE, self.instance_type.clone()),
            ("beta.kubernetes.io/instance-type", self.instance_type.clone()),
            (labels::ZONE, self.zone.clone()),
            (labels::REGION, region.clone()),
            (labels::OS, "linux".into()),
            (
                labels::ARCH,
                if self.arch.is_empty() {
                    "amd64".into()
                } else {
                    self.arch.clone()
                },
            ),
        ] {
            l.entry(k.to_string()).or_insert(v);
        }
        if !self.capacity_type.is_empty() {
            l.entry(labels::CAPACITY_TYPE.to_string())
                .or_insert(self.capacity_type.clone());
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

/// Registrations for every running (or pending) EC2 instance, as the kubelets
/// on them would make: labels from the catalog's instance type plus the user
/// data's `--node-labels`, taints from `--register-with-taints`, capacity and
/// allocatable from the catalog. Instance types missing from the catalog are
/// an error naming them.
pub async fn registrations_from_ec2(
    ec2: &aws_sdk_ec2::Client,
    catalog: &nodesmith::catalog::Catalog,
) -> Result<Vec<NodeRegistration>, String> {
    use base64::Engine;
    let mut out = Vec::new();
    let mut pages = ec2.describe_instances().into_paginator().send();
    while let Some(page) = pages.next().await {
        let page = page.map_err(|e| format!("DescribeInstances: {}", aws_sdk_ec2::error::DisplayErrorContext(&e)))?;
        for inst in page.reservations().iter().flat_map(|r| r.instances()) {
            let state = inst
                .state()
                .and_then(|s| s.name())
                .map(|n| n.as_str().to_string())
                .unwrap_or_default();
            if state != "running" && state != "pending" {
                continue;
            }
            let id = inst.instance_id().unwrap_or_default().to_string();
            let itype = inst.instance_type().map(|t| t.as_str().to_string()).unwrap_or_default();
            let zone = inst
                .placement()
                .and_then(|p| p.availability_zone())
                .unwrap_or_default()
                .to_string();
            let info = catalog
                .instance_types
                .iter()
                .find(|i| i.name == itype)
                .ok_or_else(|| format!("instance {id}: type {itype:?} is not in the catalog"))?;
            let resolved = info.resolve(&catalog.region, None);
            let attr = ec2
                .describe_instance_attribute()
                .instance_id(&id)
                .attribute(aws_sdk_ec2::types::InstanceAttributeName::UserData)
                .send()
                .await
                .map_err(|e| {
                    format!(
                        "DescribeInstanceAttribute {id}: {}",
                        aws_sdk_ec2::error::DisplayErrorContext(&e)
                    )
                })?;
            let user_data = attr
                .user_data()
                .and_then(|u| u.value())
                .and_then(|b64| base64::engine::general_purpose::STANDARD.decode(b64).ok())
                .map(|b| String::from_utf8_lossy(&b).to_string())
                .unwrap_or_default();
            let (flag_labels, taints) = kubelet_flags_from_user_data(&user_data);
            let mut node_labels = resolved.labels.clone();
            node_labels.extend(flag_labels);
            let spot = inst.instance_lifecycle().is_some_and(|l| l.as_str() == "spot");
            let name = inst
                .private_dns_name()
                .filter(|n| !n.is_empty())
                .map(str::to_string)
                .unwrap_or_else(|| id.clone());
            out.push(NodeRegistration {
                name,
                instance_id: id,
                instance_type: itype,
                zone,
                capacity_type: if spot {
                    labels::CAPACITY_SPOT.into()
                } else {
                    labels::CAPACITY_ON_DEMAND.into()
                },
                arch: node_labels.get(labels::ARCH).cloned().unwrap_or_default(),
                labels: node_labels,
                taints,
                capacity: resolved.capacity.to_k8s_strings(),
                allocatable: resolved.allocatable.to_k8s_strings(),
            });
        }
    }
    Ok(out)
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
