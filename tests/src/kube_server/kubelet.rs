//! A simulated kubelet for EC2 instances running in moto, with the cloud
//! controller's node initialization folded in, strict where a real one is.
//!
//! What it models, per instance ([`Kubelets::step`]):
//!
//! * **Start-up takes time.** A kubelet starts [`KubeletTiming::join_after`]
//!   after the instance's launch, and only on `pending`/`running` instances.
//! * **It reads its user data**, in the formats nodesmith writes: AL2023 MIME
//!   multipart with nodeadm `NodeConfig` parts (`spec.kubelet.flags` and
//!   `spec.kubelet.config`, later documents over earlier ones), a bare
//!   `NodeConfig`, Bottlerocket TOML (`settings.kubernetes.*`), and AL2-style
//!   shell scripts whose kubelet flags are read from their words.
//! * **It refuses to start** on `--node-labels` in the `kubernetes.io` /
//!   `k8s.io` domains that are not the kubelet's own (see [`refused_label`]),
//!   on malformed labels or taints, and without a node name (the private DNS
//!   name): no Node is ever created, and the step reports a [`Refusal`].
//! * **It registers what a real node has**: the name, `kubernetes.io/hostname`,
//!   `os`, `arch` (and their beta twins), the `--node-labels` (which override
//!   those defaults, as the kubelet lets them), `spec.providerID` (nodeadm
//!   configures it), the user data's taints plus
//!   `node.cloudprovider.kubernetes.io/uninitialized` and
//!   `node.kubernetes.io/not-ready`, capacity and allocatable (from the
//!   catalog, under the user data's kubelet settings), and `Ready=False`.
//!   Not the catalog's `karpenter.k8s.aws/*` labels, nor a capacity type the
//!   user data does not carry.
//! * **It becomes ready** [`KubeletTiming::ready_after`] after registering:
//!   `Ready=True`, the not-ready and uninitialized taints go, and the cloud
//!   provider's labels are set from EC2's facts, over whatever user data said:
//!   `node.kubernetes.io/instance-type` (and its beta twin),
//!   `topology.kubernetes.io/zone` and `/region`. Taints from user data stay
//!   (a DaemonSet removes startup taints: [`KubeServer::remove_node_taint`]).
//!   The change is a read-modify-write at the Node's resourceVersion, retried
//!   on conflict, so what other writers changed survives.
//! * **It re-registers** a Node deleted while its instance still runs (as a
//!   real kubelet does when its node status updates find no Node): the Node
//!   comes back as at first registration, not ready, and turns Ready
//!   [`KubeletTiming::ready_after`] later.
//! * **Its Node goes with the instance**: when the instance stops or
//!   terminates (or is gone from EC2), its Node is deleted, as the cloud
//!   controller's node lifecycle controller does; a stopped instance that
//!   starts again joins anew.
//!
//! Deliberate simplifications:
//!
//! * In EKS the cloud controller initializes a node within about a second,
//!   well before the CNI makes it Ready; here both happen at `ready_after`, so
//!   the cloud labels are missing until the node is Ready (stricter, by that gap).
//! * EC2 reports `LaunchTime` to the second (moto too), so the launch is taken
//!   as the earlier of `LaunchTime + 1 s` and the first time this simulator saw
//!   the instance: never before the real launch, and at most a second (or one
//!   step period) after it.
//! * The architecture comes from the catalog's entry for the instance's type:
//!   EC2 only runs AMIs of the type's architecture, while moto reports
//!   `x86_64` for any AMI it does not know.
//! * A kubelet that finds its Node already there when it starts leaves it as
//!   it is. Nodes are re-registered and deleted once per step, not at once.
//! * Flags given twice: `--node-labels` merge, the last `--register-with-taints`
//!   wins, and flags win over `registerWithTaints` in the config (as the kubelet's
//!   command line wins over its config file). Other kubelet settings, heartbeats
//!   and node leases are not modelled.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nodesmith::apis::KubeletConfiguration;
use nodesmith::catalog::Catalog;
use nodesmith::labels;
use nodesmith::nodeclass::userdata::{NODECONFIG_TYPE, parse_mime};
use serde::Deserialize;
use serde_json::{Value, json};

use super::resources::NODES;
use super::store::{StoreError, now_rfc3339};
use super::{KubeServer, Shared};

/// The taint Kubernetes keeps on a node until it is Ready.
pub const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";
/// The taint a kubelet with an external cloud provider registers with, until
/// the cloud controller initializes the node.
pub const UNINITIALIZED_TAINT: &str = "node.cloudprovider.kubernetes.io/uninitialized";
/// The deprecated instance-type label the cloud provider still sets.
pub const BETA_INSTANCE_TYPE: &str = "beta.kubernetes.io/instance-type";

/// Labels the kubelet sets itself, so `--node-labels` may carry them.
const KUBELET_OWN_LABELS: &[&str] = &[
    labels::HOSTNAME,
    labels::ARCH,
    labels::OS,
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/os",
    BETA_INSTANCE_TYPE,
    labels::INSTANCE_TYPE,
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    labels::ZONE,
    labels::REGION,
];
/// Label domains (and their subdomains) `--node-labels` may use within kubernetes.io.
const KUBELET_LABEL_DOMAINS: &[&str] = &["kubelet.kubernetes.io", "node.kubernetes.io"];
/// Domains (and their subdomains) reserved for Kubernetes.
const KUBERNETES_DOMAINS: &[&str] = &["kubernetes.io", "k8s.io"];
/// Taint effects the kubelet accepts.
const EFFECTS: &[&str] = &["NoSchedule", "PreferNoSchedule", "NoExecute"];

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
    /// Capacity type (spot / on-demand): labelled by [`NodeRegistration::to_node`]
    /// when set. A real kubelet does not know it, so [`Kubelets`] leaves it empty.
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

/// What user data configures of a kubelet.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KubeletUserData {
    /// `--node-labels` (Bottlerocket: `settings.kubernetes.node-labels`), unchecked.
    pub node_labels: BTreeMap<String, String>,
    /// Taints to register with, as `key=value:Effect` or `key:Effect`.
    pub taints: Vec<String>,
    /// Kubelet settings that shape allocatable (maxPods, reservations, eviction).
    pub config: Option<KubeletConfiguration>,
}

/// Flag values gathered from kubelet command lines, in order.
#[derive(Default)]
struct Flags {
    labels: BTreeMap<String, String>,
    taints: Option<Vec<String>>,
}

impl Flags {
    /// Reads `--node-labels` and `--register-with-taints` (as `--flag=v` or
    /// `--flag v`) from whitespace-separated words, quotes stripped.
    fn read(&mut self, text: &str) -> Result<(), String> {
        let unquote = |w: &'_ str| w.trim_matches(|c| c == '"' || c == '\'').to_string();
        let words: Vec<String> = text.split_whitespace().map(unquote).collect();
        for (i, word) in words.iter().enumerate() {
            for flag in ["--node-labels", "--register-with-taints"] {
                let value = match word.strip_prefix(flag) {
                    Some(rest) if rest.starts_with('=') => unquote(&rest[1..]),
                    Some("") => words.get(i + 1).cloned().unwrap_or_default(),
                    _ => continue,
                };
                if flag == "--node-labels" {
                    for pair in value.split(',').filter(|p| !p.is_empty()) {
                        let (k, v) = pair
                            .split_once('=')
                            .ok_or_else(|| format!("--node-labels: malformed pair {pair:?}, expected key=value"))?;
                        self.labels.insert(k.to_string(), v.to_string());
                    }
                } else {
                    let taints = value
                        .split(',')
                        .filter(|t| !t.is_empty())
                        .map(|t| parse_taint(t).map(|_| t.to_string()))
                        .collect::<Result<Vec<_>, _>>()?;
                    self.taints = Some(taints);
                }
            }
        }
        Ok(())
    }
}

/// Splits `key=value:Effect` or `key:Effect`, checking the effect.
pub fn parse_taint(s: &str) -> Result<(String, Option<String>, String), String> {
    let (kv, effect) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("taint {s:?}: expected key=value:Effect"))?;
    let (key, value) = match kv.split_once('=') {
        Some((k, v)) => (k, Some(v.to_string())),
        None => (kv, None),
    };
    if key.is_empty() {
        return Err(format!("taint {s:?}: empty key"));
    }
    if !EFFECTS.contains(&effect) {
        return Err(format!("taint {s:?}: effect {effect:?} is not one of {EFFECTS:?}"));
    }
    Ok((key.to_string(), value, effect.to_string()))
}

/// `key=value:Effect` (or `key:Effect` without a value).
fn taint_string(key: &str, value: Option<&str>, effect: &str) -> Result<String, String> {
    let s = match value.filter(|v| !v.is_empty()) {
        Some(v) => format!("{key}={v}:{effect}"),
        None => format!("{key}:{effect}"),
    };
    parse_taint(&s).map(|_| s)
}

fn looks_mime(s: &str) -> bool {
    s.lines().take(5).any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("mime-version:") || (l.starts_with("content-type:") && l.contains("multipart"))
    })
}

/// nodeadm's view of its NodeConfig documents: flags in order, config keys
/// merged with later documents winning.
#[derive(Default)]
struct NodeConfigs {
    found: bool,
    flags: Vec<String>,
    config: serde_json::Map<String, Value>,
}

impl NodeConfigs {
    fn read(&mut self, yaml: &str) -> Result<(), String> {
        for doc in serde_yaml_ng::Deserializer::from_str(yaml) {
            let v = Value::deserialize(doc).map_err(|e| format!("NodeConfig is not valid YAML: {e}"))?;
            if v.is_null() {
                continue;
            }
            let kind = v.get("kind").and_then(Value::as_str).unwrap_or_default();
            if kind != "NodeConfig" {
                return Err(format!("expected a NodeConfig document, found kind {kind:?}"));
            }
            self.found = true;
            if let Some(flags) = v.pointer("/spec/kubelet/flags") {
                let flags = flags
                    .as_array()
                    .ok_or("spec.kubelet.flags must be a list")?
                    .iter()
                    .map(|f| {
                        f.as_str()
                            .map(str::to_string)
                            .ok_or("spec.kubelet.flags must be strings")
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                self.flags.extend(flags);
            }
            if let Some(config) = v.pointer("/spec/kubelet/config") {
                let config = config.as_object().ok_or("spec.kubelet.config must be a mapping")?;
                self.config.extend(config.clone());
            }
        }
        Ok(())
    }

    fn into_user_data(self) -> Result<KubeletUserData, String> {
        let mut flags = Flags::default();
        for f in &self.flags {
            flags.read(f)?;
        }
        let mut config_taints = Vec::new();
        if let Some(list) = self.config.get("registerWithTaints") {
            for t in list.as_array().ok_or("registerWithTaints must be a list")? {
                let field = |f: &str| t.get(f).and_then(Value::as_str);
                let key = field("key").ok_or_else(|| format!("registerWithTaints: {t} has no key"))?;
                let effect = field("effect").ok_or_else(|| format!("registerWithTaints: {t} has no effect"))?;
                config_taints.push(taint_string(key, field("value"), effect)?);
            }
        }
        let config = if self.config.is_empty() {
            None
        } else {
            let c: KubeletConfiguration =
                serde_json::from_value(Value::Object(self.config)).map_err(|e| format!("spec.kubelet.config: {e}"))?;
            Some(c)
        };
        Ok(KubeletUserData {
            node_labels: flags.labels,
            taints: flags.taints.unwrap_or(config_taints),
            config,
        })
    }
}

/// Bottlerocket's `settings.kubernetes` as the kubelet gets it.
fn bottlerocket(doc: &toml_edit::DocumentMut) -> Result<KubeletUserData, String> {
    let mut out = KubeletUserData::default();
    let Some(k8s) = doc
        .get("settings")
        .and_then(|s| s.get("kubernetes"))
        .and_then(toml_edit::Item::as_table_like)
    else {
        return Err("Bottlerocket user data has no [settings.kubernetes]".into());
    };
    let table = |name: &str| -> Result<BTreeMap<String, String>, String> {
        let mut m = BTreeMap::new();
        let Some(item) = k8s.get(name) else { return Ok(m) };
        let t = item
            .as_table_like()
            .ok_or_else(|| format!("settings.kubernetes.{name} must be a table"))?;
        for (k, v) in t.iter() {
            let v = v
                .as_str()
                .ok_or_else(|| format!("settings.kubernetes.{name}.{k} must be a string"))?;
            m.insert(k.to_string(), v.to_string());
        }
        Ok(m)
    };
    out.node_labels = table("node-labels")?;
    if let Some(item) = k8s.get("node-taints") {
        let t = item
            .as_table_like()
            .ok_or("settings.kubernetes.node-taints must be a table")?;
        for (key, v) in t.iter() {
            let values: Vec<&str> = match (v.as_str(), v.as_array()) {
                (Some(s), _) => vec![s],
                (_, Some(a)) => a.iter().filter_map(|x| x.as_str()).collect(),
                _ => return Err(format!("settings.kubernetes.node-taints.{key} must be strings")),
            };
            for value_effect in values {
                let (value, effect) = value_effect.rsplit_once(':').ok_or_else(|| {
                    format!("settings.kubernetes.node-taints.{key}: {value_effect:?} is not value:Effect")
                })?;
                out.taints.push(taint_string(key, Some(value), effect)?);
            }
        }
    }
    let mut config = serde_json::Map::new();
    if let Some(n) = k8s.get("max-pods").and_then(toml_edit::Item::as_integer) {
        config.insert("maxPods".into(), json!(n));
    }
    for (toml, kubelet) in [
        ("system-reserved", "systemReserved"),
        ("kube-reserved", "kubeReserved"),
        ("eviction-hard", "evictionHard"),
    ] {
        let m = table(toml)?;
        if !m.is_empty() {
            config.insert(kubelet.into(), json!(m));
        }
    }
    if !config.is_empty() {
        out.config =
            Some(serde_json::from_value(Value::Object(config)).map_err(|e| format!("settings.kubernetes: {e}"))?);
    }
    Ok(out)
}

/// What the kubelet on an instance is told by its user data (decoded, not
/// base64): AL2023 MIME multipart or a bare NodeConfig, Bottlerocket TOML, or
/// an AL2-style shell script. Errors say why no kubelet would start.
pub fn kubelet_flags_from_user_data(user_data: &str) -> Result<KubeletUserData, String> {
    let text = user_data.trim_start();
    if text.trim().is_empty() {
        return Err("user data is empty: nothing configures a kubelet".into());
    }
    if text.starts_with("#!") {
        let mut flags = Flags::default();
        flags.read(text)?;
        return Ok(KubeletUserData {
            node_labels: flags.labels,
            taints: flags.taints.unwrap_or_default(),
            config: None,
        });
    }
    if looks_mime(text) {
        let parts = parse_mime(text)?;
        let mut configs = NodeConfigs::default();
        for p in parts.iter().filter(|p| p.content_type == NODECONFIG_TYPE) {
            configs.read(&p.body)?;
        }
        if configs.found {
            return configs.into_user_data();
        }
        // No NodeConfig: AL2-style MIME, whose scripts call the bootstrap script.
        let mut flags = Flags::default();
        let mut scripts = parts
            .iter()
            .filter(|p| p.content_type == "text/x-shellscript")
            .peekable();
        if scripts.peek().is_none() {
            return Err("MIME user data has neither a NodeConfig part nor a shell script".into());
        }
        for p in scripts {
            flags.read(&p.body)?;
        }
        return Ok(KubeletUserData {
            node_labels: flags.labels,
            taints: flags.taints.unwrap_or_default(),
            config: None,
        });
    }
    if let Ok(doc) = text.parse::<toml_edit::DocumentMut>()
        && doc.contains_key("settings")
    {
        return bottlerocket(&doc);
    }
    let mut configs = NodeConfigs::default();
    configs.read(text)?;
    configs.into_user_data()
}

fn in_domain(domain: &str, of: &str) -> bool {
    domain == of || domain.strip_suffix(of).is_some_and(|d| d.ends_with('.'))
}

/// Why the kubelet refuses to start with this `--node-labels` key, or None
/// when it takes it: keys in the `kubernetes.io` or `k8s.io` domains (or
/// their subdomains) are reserved, except the kubelet's own labels and the
/// `kubelet.kubernetes.io` and `node.kubernetes.io` domains.
pub fn refused_label(key: &str) -> Option<String> {
    let (domain, _) = key.split_once('/')?;
    let reserved = KUBERNETES_DOMAINS.iter().any(|d| in_domain(domain, d));
    let allowed = KUBELET_OWN_LABELS.contains(&key) || KUBELET_LABEL_DOMAINS.iter().any(|d| in_domain(domain, d));
    (reserved && !allowed).then(|| {
        format!(
            "unknown 'kubernetes.io' or 'k8s.io' label {key:?} in --node-labels: the kubelet may only set its own labels and those under {KUBELET_LABEL_DOMAINS:?}"
        )
    })
}

/// A name segment: 1-63 alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric.
fn valid_name(s: &str) -> bool {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    (1..=63).contains(&s.len())
        && s.starts_with(alnum)
        && s.ends_with(alnum)
        && s.chars().all(|c| alnum(c) || "-_.".contains(c))
}

/// A DNS subdomain: at most 253 characters of lowercase dot-separated labels.
fn valid_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|l| {
            let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
            (1..=63).contains(&l.len()) && l.starts_with(ok) && l.ends_with(ok) && l.chars().all(|c| ok(c) || c == '-')
        })
}

/// Checks `--node-labels` as the kubelet (and the API server) would: syntax,
/// then the reserved domains ([`refused_label`]).
pub fn check_node_labels(node_labels: &BTreeMap<String, String>) -> Result<(), String> {
    for (k, v) in node_labels {
        let syntax_ok = match k.split_once('/') {
            Some((prefix, name)) => valid_subdomain(prefix) && valid_name(name),
            None => valid_name(k),
        };
        if !syntax_ok {
            return Err(format!(
                "label key {k:?} in --node-labels is not a valid qualified name"
            ));
        }
        if !v.is_empty() && !valid_name(v) {
            return Err(format!("label {k}={v:?} in --node-labels: not a valid label value"));
        }
        if let Some(why) = refused_label(k) {
            return Err(why);
        }
    }
    Ok(())
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

fn region_of(zone: &str) -> String {
    zone.trim_end_matches(|c: char| c.is_ascii_alphabetic()).to_string()
}

impl NodeRegistration {
    fn arch_or_default(&self) -> String {
        if self.arch.is_empty() {
            "amd64".into()
        } else {
            self.arch.clone()
        }
    }

    fn node_json(&self, labels: BTreeMap<String, String>, taints: Vec<Value>, ready: Value) -> Value {
        let mut allocatable = self.capacity.clone();
        allocatable.extend(self.allocatable.clone());
        json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": labels},
            "spec": {"providerID": format!("aws:///{}/{}", self.zone, self.instance_id), "taints": taints},
            "status": {
                "capacity": self.capacity,
                "allocatable": allocatable,
                "conditions": [ready],
                "nodeInfo": {"architecture": labels.get(labels::ARCH).cloned().unwrap_or_default(), "operatingSystem": "linux",
                    "kubeletVersion": "v1.33.0", "kubeProxyVersion": "", "bootID": "", "containerRuntimeVersion": "containerd://1.7.0",
                    "kernelVersion": "", "machineID": "", "osImage": "", "systemUUID": ""}
            }
        })
    }

    /// A node that has finished joining, for tests that register nodes by
    /// hand: well-known labels (the given labels win), the capacity type when
    /// set, provider id, taints, resources and `Ready=True`.
    pub fn to_node(&self) -> Value {
        let mut l = self.labels.clone();
        for (k, v) in [
            (labels::HOSTNAME, self.name.clone()),
            (labels::INSTANCE_TYPE, self.instance_type.clone()),
            (BETA_INSTANCE_TYPE, self.instance_type.clone()),
            (labels::ZONE, self.zone.clone()),
            (labels::REGION, region_of(&self.zone)),
            (labels::OS, "linux".into()),
            (labels::ARCH, self.arch_or_default()),
        ] {
            l.entry(k.to_string()).or_insert(v);
        }
        if !self.capacity_type.is_empty() {
            l.entry(labels::CAPACITY_TYPE.to_string())
                .or_insert(self.capacity_type.clone());
        }
        let taints: Vec<Value> = self.taints.iter().filter_map(|t| taint_json(t)).collect();
        let now = now_rfc3339();
        let ready = json!({"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
            "lastHeartbeatTime": now, "lastTransitionTime": now});
        self.node_json(l, taints, ready)
    }

    /// The Node a kubelet creates when it registers: its own labels
    /// (hostname, os, arch and their beta twins) under the given labels, no
    /// cloud-provider labels yet, the given taints plus the uninitialized and
    /// not-ready taints, resources and `Ready=False`.
    pub fn to_registering_node(&self) -> Value {
        let arch = self.arch_or_default();
        let mut l: BTreeMap<String, String> = [
            (labels::HOSTNAME, self.name.clone()),
            (labels::OS, "linux".to_string()),
            (labels::ARCH, arch.clone()),
            ("beta.kubernetes.io/os", "linux".to_string()),
            ("beta.kubernetes.io/arch", arch),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        // The kubelet lets --node-labels overwrite its defaults.
        l.extend(self.labels.clone());
        let mut taints: Vec<Value> = self.taints.iter().filter_map(|t| taint_json(t)).collect();
        taints.push(json!({"key": UNINITIALIZED_TAINT, "value": "true", "effect": "NoSchedule"}));
        taints.push(json!({"key": NOT_READY_TAINT, "effect": "NoSchedule"}));
        let now = now_rfc3339();
        let not_ready = json!({"type": "Ready", "status": "False", "reason": "KubeletNotReady",
            "message": "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized",
            "lastHeartbeatTime": now, "lastTransitionTime": now});
        self.node_json(l, taints, not_ready)
    }
}

/// Marks a Node ready and initialized, in place: the cloud labels set (EC2's
/// facts win), the not-ready and uninitialized taints gone, `Ready=True`.
/// Everything else on the Node is left as it is.
pub fn make_ready(node: &mut Value, cloud_labels: &BTreeMap<String, String>) {
    let Some(o) = node.as_object_mut() else { return };
    let meta = o.entry("metadata").or_insert_with(|| json!({}));
    if let Some(m) = meta.as_object_mut() {
        let l = m.entry("labels").or_insert_with(|| json!({}));
        if let Some(l) = l.as_object_mut() {
            for (k, v) in cloud_labels {
                l.insert(k.clone(), json!(v));
            }
        }
    }
    if let Some(taints) = o
        .get_mut("spec")
        .and_then(|s| s.get_mut("taints"))
        .and_then(Value::as_array_mut)
    {
        taints.retain(|t| {
            let key = t.get("key").and_then(Value::as_str);
            key != Some(NOT_READY_TAINT) && key != Some(UNINITIALIZED_TAINT)
        });
    }
    let status = o.entry("status").or_insert_with(|| json!({}));
    let Some(status) = status.as_object_mut() else { return };
    let conditions = status.entry("conditions").or_insert_with(|| json!([]));
    let Some(conditions) = conditions.as_array_mut() else {
        return;
    };
    let ready = conditions.iter().any(|c| c["type"] == "Ready" && c["status"] == "True");
    if !ready {
        conditions.retain(|c| c["type"] != "Ready");
        let now = now_rfc3339();
        conditions.push(json!({"type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "kubelet is posting ready status", "lastHeartbeatTime": now, "lastTransitionTime": now}));
    }
}

/// Read-modify-write of a Node at its resourceVersion, retried on conflict.
/// Ok(None) when there is no such Node, Ok(Some(changed)) otherwise.
fn update_node(shared: &Shared, name: &str, change: impl Fn(&mut Value)) -> Result<Option<bool>, String> {
    for _ in 0..10 {
        let Some(current) = shared.lock_store().get(NODES, "", name).cloned() else {
            return Ok(None);
        };
        let mut next = current.clone();
        change(&mut next);
        if next == current {
            return Ok(Some(false));
        }
        // The lock is taken again: another writer may have been in between,
        // and then the resourceVersion in `next` is stale and the store says so.
        match shared.lock_store().update(NODES, "", name, next) {
            Ok(_) => return Ok(Some(true)),
            Err(StoreError::Conflict(_)) => continue,
            Err(StoreError::NotFound(_)) => return Ok(None),
            Err(e) => return Err(format!("updating node {name}: {e:?}")),
        }
    }
    Err(format!("updating node {name}: still conflicting after 10 attempts"))
}

impl KubeServer {
    /// Removes every taint with `key` from a Node, as a DaemonSet does with its
    /// startup taint once it runs there. Ok(false) when the Node has no such taint.
    pub fn remove_node_taint(&self, node: &str, key: &str) -> Result<bool, String> {
        let changed = update_node(&self.shared, node, |n| {
            if let Some(taints) = n.pointer_mut("/spec/taints").and_then(Value::as_array_mut) {
                taints.retain(|t| t.get("key").and_then(Value::as_str) != Some(key));
            }
        })?;
        changed.ok_or_else(|| format!("node {node} not found"))
    }
}

/// How long a kubelet takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KubeletTiming {
    /// From the instance's launch to the kubelet registering its Node.
    pub join_after: Duration,
    /// From registering to the Node being Ready and initialized.
    pub ready_after: Duration,
}

impl Default for KubeletTiming {
    /// About what an EKS AL2023 node takes: joins 30 s after launch, Ready 15 s later.
    fn default() -> Self {
        KubeletTiming {
            join_after: Duration::from_secs(30),
            ready_after: Duration::from_secs(15),
        }
    }
}

impl KubeletTiming {
    /// Registers every running instance in the first step that sees it and
    /// makes it Ready later in that same step.
    pub fn instant() -> Self {
        KubeletTiming {
            join_after: Duration::ZERO,
            ready_after: Duration::ZERO,
        }
    }

    /// A timing in milliseconds (for tests).
    pub fn millis(join_after: u64, ready_after: u64) -> Self {
        KubeletTiming {
            join_after: Duration::from_millis(join_after),
            ready_after: Duration::from_millis(ready_after),
        }
    }
}

/// An instance whose kubelet refused to start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The EC2 instance id.
    pub instance_id: String,
    /// Why, as the kubelet would log it.
    pub reason: String,
}

/// What one [`Kubelets::step`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KubeletReport {
    /// Nodes registered in this step (or found already there by a starting kubelet).
    pub registered: Vec<String>,
    /// Nodes made Ready and initialized in this step.
    pub ready: Vec<String>,
    /// Instances whose kubelet refused to start in this step.
    pub refused: Vec<Refusal>,
    /// Running instances whose kubelet has not started yet.
    pub waiting: Vec<String>,
    /// Nodes deleted in this step because their instance stopped or terminated.
    pub deleted: Vec<String>,
}

/// Where one instance's kubelet is.
#[derive(Clone, Debug)]
enum Phase {
    Booting {
        first_seen: SystemTime,
    },
    Refused {
        reason: String,
    },
    Registered {
        node: Value,
        at: Instant,
        cloud_labels: BTreeMap<String, String>,
    },
    Ready {
        node: Value,
        cloud_labels: BTreeMap<String, String>,
    },
}

impl Phase {
    /// The Node a started kubelet registers (as first created), if started.
    fn node(&self) -> Option<&Value> {
        match self {
            Phase::Registered { node, .. } | Phase::Ready { node, .. } => Some(node),
            _ => None,
        }
    }
}

fn node_name(node: &Value) -> String {
    super::store::name_of(node).to_string()
}

/// The facts of one instance from DescribeInstances.
struct Facts {
    id: String,
    running: bool,
    private_dns: String,
    instance_type: String,
    zone: String,
    architecture: Option<String>,
    launch_time: Option<SystemTime>,
}

fn facts_of(inst: &aws_sdk_ec2::types::Instance) -> Facts {
    let state = inst
        .state()
        .and_then(|s| s.name())
        .map(|n| n.as_str())
        .unwrap_or_default();
    let launch_time = inst
        .launch_time()
        .and_then(|t| u64::try_from(t.secs()).ok())
        .map(|s| UNIX_EPOCH + Duration::from_secs(s));
    let architecture = inst.architecture().map(|a| {
        match a.as_str() {
            "x86_64" | "x86_64_mac" => "amd64",
            "arm64" | "arm64_mac" => "arm64",
            "i386" => "386",
            other => other,
        }
        .to_string()
    });
    Facts {
        id: inst.instance_id().unwrap_or_default().to_string(),
        running: state == "running" || state == "pending",
        private_dns: inst.private_dns_name().unwrap_or_default().to_string(),
        instance_type: inst.instance_type().map(|t| t.as_str().to_string()).unwrap_or_default(),
        zone: inst
            .placement()
            .and_then(|p| p.availability_zone())
            .unwrap_or_default()
            .to_string(),
        architecture,
        launch_time,
    }
}

async fn user_data_of(ec2: &aws_sdk_ec2::Client, id: &str) -> Result<String, String> {
    use base64::Engine;
    let attr = ec2
        .describe_instance_attribute()
        .instance_id(id)
        .attribute(aws_sdk_ec2::types::InstanceAttributeName::UserData)
        .send()
        .await
        .map_err(|e| {
            format!(
                "DescribeInstanceAttribute {id}: {}",
                aws_sdk_ec2::error::DisplayErrorContext(&e)
            )
        })?;
    let Some(b64) = attr.user_data().and_then(|u| u.value()) else {
        return Ok(String::new());
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| format!("instance {id}: user data is not base64: {e}"))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The kubelets of every EC2 instance, simulated: see the module docs.
/// Clones share their state.
#[derive(Clone)]
pub struct Kubelets {
    timing: KubeletTiming,
    phases: Arc<tokio::sync::Mutex<BTreeMap<String, Phase>>>,
    at_rest: Arc<std::sync::atomic::AtomicBool>,
}

/// A background kubelet loop; dropping it stops it.
pub struct KubeletLoop(tokio::task::JoinHandle<()>);

impl Drop for KubeletLoop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Kubelets {
    /// Kubelets taking `timing`, none of which has seen an instance yet.
    pub fn new(timing: KubeletTiming) -> Self {
        Kubelets {
            timing,
            phases: Arc::default(),
            at_rest: Arc::default(),
        }
    }

    /// The timing they take.
    pub fn timing(&self) -> KubeletTiming {
        self.timing
    }

    /// Whether the last finished step left every live instance's kubelet at
    /// rest: its Node Ready, or refused (none waiting to start or to be Ready).
    pub fn at_rest(&self) -> bool {
        self.at_rest.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Every instance whose kubelet refused to start so far, by instance id.
    pub async fn refusals(&self) -> Vec<Refusal> {
        self.phases
            .lock()
            .await
            .iter()
            .filter_map(|(id, p)| match p {
                Phase::Refused { reason } => Some(Refusal {
                    instance_id: id.clone(),
                    reason: reason.clone(),
                }),
                _ => None,
            })
            .collect()
    }

    /// One pass: starts the kubelets that are due (registering their Nodes or
    /// refusing), then makes the Nodes that are due Ready. Errors are the
    /// simulator's (EC2 calls failing, an instance type missing from the
    /// catalog), not the kubelets'.
    pub async fn step(
        &self,
        kube: &KubeServer,
        ec2: &aws_sdk_ec2::Client,
        catalog: &Catalog,
    ) -> Result<KubeletReport, String> {
        self.step_on(&kube.shared, ec2, catalog).await
    }

    /// Runs [`Kubelets::step`] every `period` until the handle is dropped;
    /// errors are logged. [`Kubelets::refusals`] (on a clone) tells who refused.
    pub fn spawn(
        &self,
        kube: &KubeServer,
        ec2: aws_sdk_ec2::Client,
        catalog: Arc<Catalog>,
        period: Duration,
    ) -> KubeletLoop {
        let me = self.clone();
        let shared = kube.shared.clone();
        KubeletLoop(tokio::spawn(async move {
            loop {
                if let Err(e) = me.step_on(&shared, &ec2, &catalog).await {
                    tracing::warn!(error = %e, "simulated kubelets: step failed");
                }
                tokio::time::sleep(period).await;
            }
        }))
    }

    async fn step_on(
        &self,
        shared: &Shared,
        ec2: &aws_sdk_ec2::Client,
        catalog: &Catalog,
    ) -> Result<KubeletReport, String> {
        // One step at a time, so a spawned loop and a test's own steps never
        // start the same kubelet twice.
        let mut phases = self.phases.lock().await;
        let mut instances = Vec::new();
        // Only instances that can run a kubelet: the rest count as gone
        // (below), and a long run's terminated ones (moto keeps them for
        // good) would make every step's answer, four a second, grow.
        let live = aws_sdk_ec2::types::Filter::builder()
            .name("instance-state-name")
            .values("pending")
            .values("running")
            .build();
        let mut pages = ec2.describe_instances().filters(live).into_paginator().send();
        while let Some(page) = pages.next().await {
            let page =
                page.map_err(|e| format!("DescribeInstances: {}", aws_sdk_ec2::error::DisplayErrorContext(&e)))?;
            instances.extend(page.reservations().iter().flat_map(|r| r.instances()).map(facts_of));
        }
        let region = ec2
            .config()
            .region()
            .map(|r| r.to_string())
            .unwrap_or_else(|| catalog.region.clone());
        let mut report = KubeletReport::default();
        let now = SystemTime::now();
        for inst in instances.iter().filter(|i| i.running) {
            let phase = phases
                .entry(inst.id.clone())
                .or_insert(Phase::Booting { first_seen: now });
            let Phase::Booting { first_seen } = *phase else {
                continue;
            };
            // LaunchTime is truncated to the second: the launch was before
            // LaunchTime + 1 s, and before this simulator first saw it.
            let launched = inst
                .launch_time
                .map_or(first_seen, |t| (t + Duration::from_secs(1)).min(first_seen));
            if now < launched + self.timing.join_after {
                report.waiting.push(inst.id.clone());
                continue;
            }
            *phase = match self.start(shared, ec2, catalog, &region, inst).await? {
                Ok((node, cloud_labels)) => {
                    report.registered.push(node_name(&node));
                    Phase::Registered {
                        node,
                        at: Instant::now(),
                        cloud_labels,
                    }
                }
                Err(reason) => {
                    report.refused.push(Refusal {
                        instance_id: inst.id.clone(),
                        reason: reason.clone(),
                    });
                    Phase::Refused { reason }
                }
            };
        }
        for inst in instances.iter().filter(|i| i.running) {
            let Some(phase) = phases.get_mut(&inst.id) else {
                continue;
            };
            let Some(node) = phase.node().cloned() else {
                continue;
            };
            let name = node_name(&node);
            if shared.lock_store().get(NODES, "", &name).is_none() {
                // Deleted under a running kubelet: it registers again.
                shared
                    .lock_store()
                    .create(NODES, "", node.clone())
                    .map_err(|e| format!("re-registering node {name}: {e:?}"))?;
                report.registered.push(name);
                let (Phase::Registered { cloud_labels, .. } | Phase::Ready { cloud_labels, .. }) = phase.clone() else {
                    continue;
                };
                *phase = Phase::Registered {
                    node,
                    at: Instant::now(),
                    cloud_labels,
                };
                continue;
            }
            let Phase::Registered { at, cloud_labels, .. } = &*phase else {
                continue;
            };
            if at.elapsed() < self.timing.ready_after {
                continue;
            }
            if update_node(shared, &name, |n| make_ready(n, cloud_labels))?.is_some() {
                report.ready.push(name);
            }
            *phase = Phase::Ready {
                node,
                cloud_labels: cloud_labels.clone(),
            };
        }
        // Stopped, terminated or gone: the Node goes, and a restart joins anew.
        let gone: Vec<String> = phases
            .keys()
            .filter(|id| !instances.iter().any(|i| i.running && &i.id == *id))
            .cloned()
            .collect();
        for id in gone {
            let Some(phase) = phases.remove(&id) else {
                continue;
            };
            let Some(node) = phase.node() else {
                continue;
            };
            let name = node_name(node);
            let mut store = shared.lock_store();
            // Only the instance's own Node: a Node of that name for another
            // instance (a reused private IP) stays.
            let ours = store
                .get(NODES, "", &name)
                .and_then(|n| n.pointer("/spec/providerID"))
                .and_then(Value::as_str)
                .is_some_and(|p| p.ends_with(&format!("/{id}")));
            if ours && store.delete(NODES, "", &name).is_ok() {
                report.deleted.push(name);
            }
        }
        let rest = phases
            .values()
            .all(|p| matches!(p, Phase::Ready { .. } | Phase::Refused { .. }));
        self.at_rest.store(rest, std::sync::atomic::Ordering::Release);
        Ok(report)
    }

    /// Starts one instance's kubelet: Ok(Ok(node name, cloud labels)) when it
    /// registered (or found its Node), Ok(Err(reason)) when it refused.
    async fn start(
        &self,
        shared: &Shared,
        ec2: &aws_sdk_ec2::Client,
        catalog: &Catalog,
        region: &str,
        inst: &Facts,
    ) -> Result<Result<(Value, BTreeMap<String, String>), String>, String> {
        let info = catalog
            .instance_types
            .iter()
            .find(|i| i.name == inst.instance_type)
            .ok_or_else(|| {
                format!(
                    "instance {}: type {:?} is not in the catalog",
                    inst.id, inst.instance_type
                )
            })?;
        if inst.private_dns.is_empty() {
            return Ok(Err("the instance has no private DNS name to name its Node".into()));
        }
        let user_data = user_data_of(ec2, &inst.id).await?;
        let parsed = match kubelet_flags_from_user_data(&user_data) {
            Ok(p) => p,
            Err(e) => return Ok(Err(e)),
        };
        if let Err(e) = check_node_labels(&parsed.node_labels) {
            return Ok(Err(e));
        }
        let arch = info
            .labels
            .get(labels::ARCH)
            .cloned()
            .or_else(|| inst.architecture.clone())
            .unwrap_or_default();
        let resolved = info.resolve(&catalog.region, parsed.config.as_ref());
        let reg = NodeRegistration {
            name: inst.private_dns.clone(),
            instance_id: inst.id.clone(),
            instance_type: inst.instance_type.clone(),
            zone: inst.zone.clone(),
            capacity_type: String::new(),
            arch,
            labels: parsed.node_labels,
            taints: parsed.taints,
            capacity: resolved.capacity.to_k8s_strings(),
            allocatable: resolved.allocatable.to_k8s_strings(),
        };
        let node = reg.to_registering_node();
        {
            let mut store = shared.lock_store();
            if store.get(NODES, "", &reg.name).is_none() {
                store
                    .create(NODES, "", node.clone())
                    .map_err(|e| format!("creating node {}: {e:?}", reg.name))?;
            }
        }
        let cloud_labels = BTreeMap::from([
            (labels::INSTANCE_TYPE.to_string(), inst.instance_type.clone()),
            (BETA_INSTANCE_TYPE.to_string(), inst.instance_type.clone()),
            (labels::ZONE.to_string(), inst.zone.clone()),
            (labels::REGION.to_string(), region.to_string()),
        ]);
        Ok(Ok((node, cloud_labels)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodesmith::apis::{Taint, TaintEffect};
    use nodesmith::nodeclass::userdata::{ClusterInfo, NodeSettings, al2023, bottlerocket as render_bottlerocket};

    fn cluster() -> ClusterInfo {
        ClusterInfo {
            name: "demo".into(),
            endpoint: "https://ABC.gr7.us-east-1.eks.amazonaws.com".into(),
            certificate_authority: "Q0FEQVRB".into(),
            service_cidr: "10.100.0.0/16".into(),
            version: "1.33".into(),
        }
    }

    fn settings(user: Option<&str>) -> NodeSettings {
        NodeSettings {
            labels: BTreeMap::from([
                ("karpenter.sh/nodepool".to_string(), "default".to_string()),
                ("karpenter.sh/capacity-type".to_string(), "spot".to_string()),
            ]),
            taints: vec![
                Taint::new("dedicated", Some("gpu"), TaintEffect::NoSchedule),
                Taint::new("node.cilium.io/agent-not-ready", None, TaintEffect::NoExecute),
            ],
            kubelet: Some(KubeletConfiguration {
                max_pods: Some(58),
                ..Default::default()
            }),
            user_data: user.map(String::from),
            instance_store_raid0: false,
        }
    }

    fn labels_of(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn al2_bootstrap_script_flags_are_read() {
        let al2 = "#!/bin/bash\n/etc/eks/bootstrap.sh c --kubelet-extra-args '--node-labels=karpenter.sh/nodepool=default,team=a --register-with-taints=gpu=true:NoSchedule'\n";
        let got = kubelet_flags_from_user_data(al2).unwrap();
        assert_eq!(
            got.node_labels,
            labels_of(&[("karpenter.sh/nodepool", "default"), ("team", "a")])
        );
        assert_eq!(got.taints, vec!["gpu=true:NoSchedule".to_string()]);
        // The space-separated form too.
        let spaced = "#!/bin/sh\nkubelet --node-labels x=y --register-with-taints k:NoExecute --node-labels=\"q=1\"\n";
        let got = kubelet_flags_from_user_data(spaced).unwrap();
        assert_eq!(got.node_labels, labels_of(&[("x", "y"), ("q", "1")]));
        assert_eq!(
            taint_json(&got.taints[0]),
            Some(json!({"key": "k", "effect": "NoExecute"}))
        );
    }

    #[test]
    fn nodesmith_al2023_user_data_gives_labels_config_taints_and_kubelet_settings() {
        let user = "#!/bin/bash\necho hello\n";
        let doc = al2023(&cluster(), &settings(Some(user))).unwrap();
        let got = kubelet_flags_from_user_data(&doc).unwrap();
        assert_eq!(
            got.node_labels,
            labels_of(&[
                ("karpenter.sh/nodepool", "default"),
                ("karpenter.sh/capacity-type", "spot")
            ])
        );
        assert_eq!(
            got.taints,
            vec![
                "dedicated=gpu:NoSchedule".to_string(),
                "node.cilium.io/agent-not-ready:NoExecute".to_string()
            ]
        );
        assert_eq!(got.config.and_then(|c| c.max_pods), Some(58));
    }

    #[test]
    fn nodeconfig_documents_merge_and_flags_win_over_config_taints() {
        let user = "apiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\nspec:\n  kubelet:\n    flags:\n    - --node-labels=team=a\n    config:\n      maxPods: 20\n      registerWithTaints:\n      - {key: a, effect: NoSchedule}\n";
        let doc = al2023(&cluster(), &settings(Some(user))).unwrap();
        let got = kubelet_flags_from_user_data(&doc).unwrap();
        // Labels from both documents' flags; nodesmith's later maxPods and taints win.
        assert_eq!(got.node_labels.get("team").map(String::as_str), Some("a"));
        assert_eq!(
            got.node_labels.get("karpenter.sh/nodepool").map(String::as_str),
            Some("default")
        );
        assert_eq!(got.config.and_then(|c| c.max_pods), Some(58));
        assert_eq!(got.taints.len(), 2);
        // A bare NodeConfig whose flags also register taints: the flags win.
        let bare = "apiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\nspec:\n  kubelet:\n    flags: [\"--register-with-taints=f=1:NoSchedule\"]\n    config:\n      registerWithTaints:\n      - {key: c, value: \"2\", effect: NoExecute}\n";
        assert_eq!(
            kubelet_flags_from_user_data(bare).unwrap().taints,
            vec!["f=1:NoSchedule".to_string()]
        );
        let config_only = bare.replace("    flags: [\"--register-with-taints=f=1:NoSchedule\"]\n", "");
        assert_eq!(
            kubelet_flags_from_user_data(&config_only).unwrap().taints,
            vec!["c=2:NoExecute".to_string()]
        );
    }

    #[test]
    fn bottlerocket_toml_gives_labels_taints_and_max_pods() {
        let doc = render_bottlerocket(
            &cluster(),
            &settings(Some("[settings.host-containers.admin]\nenabled = true\n")),
        )
        .unwrap();
        let got = kubelet_flags_from_user_data(&doc).unwrap();
        assert_eq!(
            got.node_labels.get("karpenter.sh/nodepool").map(String::as_str),
            Some("default")
        );
        let mut taints = got.taints.clone();
        taints.sort();
        assert_eq!(
            taints,
            vec![
                "dedicated=gpu:NoSchedule".to_string(),
                "node.cilium.io/agent-not-ready:NoExecute".to_string()
            ]
        );
        assert_eq!(got.config.and_then(|c| c.max_pods), Some(58));
        let two = "[settings.kubernetes.node-taints]\nk = [\"a:NoSchedule\", \"b:NoExecute\"]\n";
        assert_eq!(
            kubelet_flags_from_user_data(two).unwrap().taints,
            vec!["k=a:NoSchedule".to_string(), "k=b:NoExecute".to_string()]
        );
    }

    #[test]
    fn malformed_user_data_is_an_error() {
        for (ud, want) in [
            ("", "empty"),
            ("   \n", "empty"),
            ("#!/bin/bash\nkubelet --node-labels=novalue\n", "malformed pair"),
            ("#!/bin/bash\nkubelet --register-with-taints=k=v:Sometimes\n", "effect"),
            ("#!/bin/bash\nkubelet --register-with-taints=k=v\n", "Effect"),
            ("apiVersion: v1\nkind: ConfigMap\n", "NodeConfig"),
            (
                "kind: NodeConfig\nspec: {kubelet: {config: {registerWithTaints: [{key: a}]}}}\n",
                "no effect",
            ),
            ("[settings.kubernetes.node-taints]\nk = [\"novalue\"]\n", "value:Effect"),
            (
                "MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"b\"\n\n--b\nContent-Type: text/plain\n\nhi\n--b--\n",
                "neither",
            ),
        ] {
            let err = kubelet_flags_from_user_data(ud).unwrap_err();
            assert!(err.contains(want), "{ud:?}: {err}");
        }
    }

    #[test]
    fn the_kubelet_refuses_reserved_label_domains() {
        let table = [
            ("team", false),
            ("example.com/team", false),
            ("karpenter.sh/nodepool", false),
            ("karpenter.k8s.aws/instance-family", false),
            ("kubernetes.io/hostname", false),
            ("kubernetes.io/arch", false),
            ("kubernetes.io/os", false),
            ("beta.kubernetes.io/arch", false),
            ("beta.kubernetes.io/os", false),
            ("beta.kubernetes.io/instance-type", false),
            ("node.kubernetes.io/instance-type", false),
            ("failure-domain.beta.kubernetes.io/zone", false),
            ("failure-domain.beta.kubernetes.io/region", false),
            ("topology.kubernetes.io/zone", false),
            ("topology.kubernetes.io/region", false),
            ("node.kubernetes.io/exclude-from-external-load-balancers", false),
            ("kubelet.kubernetes.io/anything", false),
            ("x.node.kubernetes.io/y", false),
            ("x.kubelet.kubernetes.io/y", false),
            ("notkubernetes.io/y", false),
            ("kubernetes.io/role", true),
            ("node-role.kubernetes.io/worker", true),
            ("node-restriction.kubernetes.io/team", true),
            ("topology.kubernetes.io/rack", true),
            ("k8s.io/x", true),
            ("foo.k8s.io/x", true),
            ("topology.k8s.aws/zone-id", false),
            ("beta.kubernetes.io/fluentd-ds-ready", true),
        ];
        for (key, refused) in table {
            assert_eq!(refused_label(key).is_some(), refused, "{key}");
            let labels = labels_of(&[(key, "v")]);
            assert_eq!(check_node_labels(&labels).is_err(), refused, "{key}");
        }
        assert!(check_node_labels(&labels_of(&[("bad key", "v")])).is_err());
        assert!(check_node_labels(&labels_of(&[("k", "bad value!")])).is_err());
        assert!(check_node_labels(&labels_of(&[("Example.com/k", "v")])).is_err());
        assert!(check_node_labels(&labels_of(&[("k", "")])).is_ok());
    }

    fn reg() -> NodeRegistration {
        NodeRegistration {
            name: "ip-10-0-1-5.ec2.internal".into(),
            instance_id: "i-1".into(),
            instance_type: "m5.large".into(),
            zone: "us-east-1a".into(),
            arch: "amd64".into(),
            labels: labels_of(&[("team", "a"), (labels::INSTANCE_TYPE, "c5.xlarge")]),
            taints: vec!["dedicated=web:NoSchedule".into()],
            capacity: labels_of(&[("cpu", "2"), ("pods", "29")]),
            ..Default::default()
        }
    }

    #[test]
    fn a_registering_node_is_not_ready_and_uninitialized() {
        let n = reg().to_registering_node();
        let l = &n["metadata"]["labels"];
        assert_eq!(l["kubernetes.io/hostname"], "ip-10-0-1-5.ec2.internal");
        assert_eq!(l["kubernetes.io/os"], "linux");
        assert_eq!(l["kubernetes.io/arch"], "amd64");
        assert_eq!(l["team"], "a");
        // What user data says until the cloud provider initializes the node.
        assert_eq!(l[labels::INSTANCE_TYPE], "c5.xlarge");
        assert!(l.get(labels::ZONE).is_none() && l.get(labels::CAPACITY_TYPE).is_none());
        let keys: Vec<&str> = n["spec"]["taints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["key"].as_str().unwrap())
            .collect();
        assert_eq!(keys, vec!["dedicated", UNINITIALIZED_TAINT, NOT_READY_TAINT]);
        assert_eq!(n["status"]["conditions"][0]["status"], "False");
        assert_eq!(n["status"]["conditions"][0]["reason"], "KubeletNotReady");
        assert_eq!(n["spec"]["providerID"], "aws:///us-east-1a/i-1");
    }

    #[test]
    fn making_ready_sets_cloud_labels_and_keeps_everything_else() {
        let mut n = reg().to_registering_node();
        n["metadata"]["labels"]["other"] = json!("writer");
        n["spec"]["taints"]
            .as_array_mut()
            .unwrap()
            .push(json!({"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}));
        let cloud = labels_of(&[(labels::INSTANCE_TYPE, "m5.large"), (labels::ZONE, "us-east-1a")]);
        make_ready(&mut n, &cloud);
        assert_eq!(n["metadata"]["labels"][labels::INSTANCE_TYPE], "m5.large");
        assert_eq!(n["metadata"]["labels"]["other"], "writer");
        let keys: Vec<&str> = n["spec"]["taints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["key"].as_str().unwrap())
            .collect();
        assert_eq!(keys, vec!["dedicated", "karpenter.sh/disrupted"]);
        let conds = n["status"]["conditions"].as_array().unwrap();
        assert_eq!(conds.len(), 1);
        assert_eq!(conds[0]["status"], "True");
        // Idempotent.
        let before = n.clone();
        make_ready(&mut n, &cloud);
        assert_eq!(n, before);
    }
}
