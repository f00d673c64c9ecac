//! User data for the node: AL2023 nodeadm `NodeConfig` in a MIME multipart
//! document, or Bottlerocket TOML settings; the EC2NodeClass's own userData
//! merged in as Karpenter does (MIME parts before ours for AL2023, TOML
//! merged under ours for Bottlerocket). Pure.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::apis::{KubeletConfiguration, Taint, TaintEffect};

/// The MIME boundary of generated documents.
pub const BOUNDARY: &str = "nodesmith-boundary-7f3a9c";
/// Content type of a nodeadm NodeConfig part.
pub const NODECONFIG_TYPE: &str = "application/node.eks.aws";

/// What the node needs to know about its cluster (from `eks:DescribeCluster`).
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterInfo {
    /// Cluster name.
    pub name: String,
    /// API server endpoint URL.
    pub endpoint: String,
    /// Base64 PEM of the cluster CA.
    pub certificate_authority: String,
    /// Service CIDR (IPv4).
    pub service_cidr: String,
    /// Kubernetes version, e.g. 1.33.
    pub version: String,
}

/// What this node gets: labels, taints, kubelet settings.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeSettings {
    /// Node labels (incl. karpenter.sh/nodepool and the NodeClaim's name).
    pub labels: BTreeMap<String, String>,
    /// Taints and startup taints, registered with the node.
    pub taints: Vec<Taint>,
    /// The EC2NodeClass kubelet block.
    pub kubelet: Option<KubeletConfiguration>,
    /// The user's userData, if any.
    pub user_data: Option<String>,
    /// `instanceStorePolicy: RAID0`: the instance-store NVMe disks become one
    /// RAID0 array holding the kubelet's and containerd's data.
    pub instance_store_raid0: bool,
}

/// User data that cannot be generated or merged.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum UserDataError {
    /// The EC2NodeClass's userData is not valid for its AMI family.
    #[error("spec.userData: {0}")]
    User(String),
    /// A label or taint breaks Kubernetes' syntax: joined into the kubelet's
    /// flags it could add labels of its own or stop the kubelet from starting.
    #[error("node {what} cannot be written into user data")]
    Label {
        /// "label" or "taint".
        what: &'static str,
        /// What is wrong with it.
        #[source]
        source: crate::labels::LabelError,
    },
    /// The AMI family has no user data generator here.
    #[error("AMI family {0:?} is not supported for launch (supported: AL2023, Bottlerocket, Custom)")]
    UnsupportedFamily(String),
}

/// One part of a MIME multipart document.
#[derive(Debug, Clone, PartialEq)]
pub struct MimePart {
    /// Its Content-Type (without parameters).
    pub content_type: String,
    /// Its body.
    pub body: String,
}

fn effect(e: TaintEffect) -> &'static str {
    match e {
        TaintEffect::NoSchedule => "NoSchedule",
        TaintEffect::PreferNoSchedule => "PreferNoSchedule",
        TaintEffect::NoExecute => "NoExecute",
    }
}

/// Kubelet config fields by their kubelet (KubeletConfiguration) names.
fn kubelet_config(k: Option<&KubeletConfiguration>) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    let Some(k) = k else { return m };
    if !k.cluster_dns.is_empty() {
        m.insert("clusterDNS".into(), json!(k.cluster_dns));
    }
    let ints = [
        ("maxPods", k.max_pods),
        ("podsPerCore", k.pods_per_core),
        ("evictionMaxPodGracePeriod", k.eviction_max_pod_grace_period),
        ("imageGCHighThresholdPercent", k.image_gc_high_threshold_percent),
        ("imageGCLowThresholdPercent", k.image_gc_low_threshold_percent),
    ];
    for (name, v) in ints {
        if let Some(v) = v {
            m.insert(name.into(), json!(v));
        }
    }
    let maps = [
        ("systemReserved", &k.system_reserved),
        ("kubeReserved", &k.kube_reserved),
        ("evictionHard", &k.eviction_hard),
        ("evictionSoft", &k.eviction_soft),
        ("evictionSoftGracePeriod", &k.eviction_soft_grace_period),
    ];
    for (name, v) in maps {
        if !v.is_empty() {
            m.insert(name.into(), json!(v));
        }
    }
    if let Some(q) = k.cpu_cfs_quota {
        m.insert("cpuCFSQuota".into(), json!(q));
    }
    m
}

/// Every label and taint checked by Kubernetes' rules: the planner already
/// refuses invalid ones, this is the last check before they are joined into
/// kubelet flags (`--node-labels=k=v,...`), where a comma or `=` in a value
/// would add a label of its own.
fn check_labels(node: &NodeSettings) -> Result<(), UserDataError> {
    for (k, v) in &node.labels {
        crate::labels::validate_label(k, v).map_err(|source| UserDataError::Label { what: "label", source })?;
    }
    for t in &node.taints {
        crate::labels::validate_label(&t.key, t.value.as_deref().unwrap_or_default())
            .map_err(|source| UserDataError::Label { what: "taint", source })?;
    }
    Ok(())
}

/// The nodeadm NodeConfig YAML for this node.
pub fn node_config(cluster: &ClusterInfo, node: &NodeSettings) -> String {
    let mut config = kubelet_config(node.kubelet.as_ref());
    if !node.taints.is_empty() {
        let taints: Vec<Value> = node
            .taints
            .iter()
            .map(|t| {
                let mut o = json!({"key": t.key, "effect": effect(t.effect)});
                if let Some(v) = &t.value {
                    o["value"] = json!(v);
                }
                o
            })
            .collect();
        config.insert("registerWithTaints".into(), Value::Array(taints));
    }
    // `al2023` refuses invalid labels first; whoever else calls this never
    // gets one joined into the flag either.
    let labels: Vec<String> = node
        .labels
        .iter()
        .filter(|(k, v)| crate::labels::validate_label(k, v).is_ok())
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let mut kubelet = json!({ "config": config });
    if !labels.is_empty() {
        kubelet["flags"] = json!([format!("--node-labels={}", labels.join(","))]);
    }
    let mut doc = json!({
        "apiVersion": "node.eks.aws/v1alpha1",
        "kind": "NodeConfig",
        "spec": {
            "cluster": {
                "name": cluster.name,
                "apiServerEndpoint": cluster.endpoint,
                "certificateAuthority": cluster.certificate_authority,
                "cidr": cluster.service_cidr,
            },
            "kubelet": kubelet,
        }
    });
    if node.instance_store_raid0 {
        doc["spec"]["instance"] = json!({"localStorage": {"strategy": "RAID0"}});
    }
    // A serde_json::Value always serialises to YAML.
    serde_yaml_ng::to_string(&doc).unwrap_or_default()
}

/// Parses a MIME multipart document into its parts.
pub fn parse_mime(doc: &str) -> Result<Vec<MimePart>, String> {
    let doc = doc.replace("\r\n", "\n");
    let (head, body) = doc
        .split_once("\n\n")
        .ok_or("MIME document has no blank line after its headers")?;
    let boundary = head
        .lines()
        .filter(|l| l.to_ascii_lowercase().starts_with("content-type:") || l.starts_with(' ') || l.starts_with('\t'))
        .flat_map(|l| l.split(';'))
        .find_map(|p| p.trim().strip_prefix("boundary="))
        .map(|b| b.trim_matches('"').to_string())
        .ok_or("MIME document has no multipart boundary")?;
    let delim = format!("--{boundary}");
    let mut parts = Vec::new();
    let mut current: Option<Vec<&str>> = None;
    let mut closed = false;
    for line in body.lines() {
        if line.trim_end() == format!("{delim}--") {
            if let Some(p) = current.take() {
                parts.push(p);
            }
            closed = true;
            break;
        }
        if line.trim_end() == delim {
            if let Some(p) = current.take() {
                parts.push(p);
            }
            current = Some(Vec::new());
        } else if let Some(p) = current.as_mut() {
            p.push(line);
        }
    }
    if !closed {
        return Err(format!("MIME document does not end with --{boundary}--"));
    }
    parts
        .into_iter()
        .map(|lines| {
            let text = lines.join("\n");
            let (h, b) = text.split_once("\n\n").unwrap_or((text.as_str(), ""));
            let content_type = h
                .lines()
                .find_map(|l| {
                    l.split_once(':')
                        .filter(|(k, _)| k.trim().eq_ignore_ascii_case("content-type"))
                        .map(|(_, v)| v)
                })
                .map(|v| v.split(';').next().unwrap_or_default().trim().to_string())
                .ok_or_else(|| "MIME part has no Content-Type".to_string())?;
            Ok(MimePart {
                content_type,
                body: b.to_string(),
            })
        })
        .collect()
}

fn is_mime(s: &str) -> bool {
    s.lines().take(5).any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("mime-version:") || (l.starts_with("content-type:") && l.contains("multipart"))
    })
}

/// The user's AL2023 userData as MIME parts: a MIME document's parts, a
/// NodeConfig YAML as a NodeConfig part, anything else as a shell script.
fn user_parts(user: &str) -> Result<Vec<MimePart>, UserDataError> {
    if user.trim().is_empty() {
        return Ok(vec![]);
    }
    if is_mime(user) {
        return parse_mime(user).map_err(UserDataError::User);
    }
    let content_type = if user.contains("node.eks.aws/") && user.contains("NodeConfig") {
        NODECONFIG_TYPE
    } else {
        "text/x-shellscript"
    };
    Ok(vec![MimePart {
        content_type: content_type.into(),
        body: user.to_string(),
    }])
}

/// Renders MIME parts as one multipart/mixed document.
pub fn render_mime(parts: &[MimePart]) -> Result<String, UserDataError> {
    let mut out = format!("MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"{BOUNDARY}\"\n\n");
    for p in parts {
        if p.body.contains(BOUNDARY) {
            return Err(UserDataError::User(format!(
                "a part contains the MIME boundary {BOUNDARY}"
            )));
        }
        let charset = if p.content_type.starts_with("text/") {
            "; charset=\"us-ascii\""
        } else {
            ""
        };
        out.push_str(&format!(
            "--{BOUNDARY}\nContent-Type: {}{charset}\n\n{}",
            p.content_type, p.body
        ));
        if !p.body.ends_with('\n') {
            out.push('\n');
        }
        out.push('\n');
    }
    out.push_str(&format!("--{BOUNDARY}--\n"));
    Ok(out)
}

/// AL2023: the user's parts first, then nodesmith's NodeConfig, whose fields
/// nodeadm applies over earlier configs.
pub fn al2023(cluster: &ClusterInfo, node: &NodeSettings) -> Result<String, UserDataError> {
    check_labels(node)?;
    let mut parts = user_parts(node.user_data.as_deref().unwrap_or_default())?;
    parts.push(MimePart {
        content_type: NODECONFIG_TYPE.into(),
        body: node_config(cluster, node),
    });
    render_mime(&parts)
}

/// Bottlerocket: the user's TOML with nodesmith's `settings.kubernetes` keys
/// set over it (labels and taints merged, nodesmith's winning on the same key).
pub fn bottlerocket(cluster: &ClusterInfo, node: &NodeSettings) -> Result<String, UserDataError> {
    use toml_edit::{Array, DocumentMut, Item, Table, value};
    check_labels(node)?;
    let mut doc: DocumentMut = node
        .user_data
        .as_deref()
        .unwrap_or_default()
        .parse()
        .map_err(|e: toml_edit::TomlError| UserDataError::User(format!("not valid TOML for Bottlerocket: {e}")))?;
    fn table<'a>(parent: &'a mut Table, key: &str) -> Result<&'a mut Table, UserDataError> {
        let item = parent.entry(key).or_insert_with(|| Item::Table(Table::new()));
        item.as_table_mut()
            .ok_or_else(|| UserDataError::User(format!("Bottlerocket userData: {key} must be a table")))
    }
    let settings = table(doc.as_table_mut(), "settings")?;
    let k8s = table(settings, "kubernetes")?;
    k8s["cluster-name"] = value(&cluster.name);
    k8s["api-server"] = value(&cluster.endpoint);
    k8s["cluster-certificate"] = value(&cluster.certificate_authority);
    let labels = table(k8s, "node-labels")?;
    for (k, v) in &node.labels {
        labels[k.as_str()] = value(v);
    }
    if !node.taints.is_empty() {
        let taints = table(k8s, "node-taints")?;
        let mut by_key: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for t in &node.taints {
            by_key.entry(&t.key).or_default().push(format!(
                "{}:{}",
                t.value.as_deref().unwrap_or_default(),
                effect(t.effect)
            ));
        }
        for (k, vs) in by_key {
            taints[k] = value(vs.into_iter().collect::<Array>());
        }
    }
    if let Some(kc) = &node.kubelet {
        if let Some(dns) = kc.cluster_dns.first() {
            k8s["cluster-dns-ip"] = value(dns);
        }
        let ints = [
            ("max-pods", kc.max_pods),
            ("eviction-max-pod-grace-period", kc.eviction_max_pod_grace_period),
            ("image-gc-high-threshold-percent", kc.image_gc_high_threshold_percent),
            ("image-gc-low-threshold-percent", kc.image_gc_low_threshold_percent),
        ];
        for (name, v) in ints {
            if let Some(v) = v {
                k8s[name] = value(v);
            }
        }
        let maps = [
            ("system-reserved", &kc.system_reserved),
            ("kube-reserved", &kc.kube_reserved),
            ("eviction-hard", &kc.eviction_hard),
            ("eviction-soft", &kc.eviction_soft),
            ("eviction-soft-grace-period", &kc.eviction_soft_grace_period),
        ];
        for (name, m) in maps {
            if !m.is_empty() {
                let t = table(k8s, name)?;
                for (k, v) in m {
                    t[k.as_str()] = value(v);
                }
            }
        }
        if let Some(q) = kc.cpu_cfs_quota {
            k8s["cpu-cfs-quota-enforced"] = value(q);
        }
    }
    if node.instance_store_raid0 {
        // Bottlerocket's apiclient builds the array and binds the kubelet's,
        // containerd's and the pod logs' directories onto it at every boot.
        let commands = table(settings, "bootstrap-commands")?;
        let ephemeral = table(commands, "k8s-ephemeral-storage")?;
        let init: Array = ["apiclient", "ephemeral-storage", "init"].into_iter().collect();
        let bind: Array = [
            "apiclient",
            "ephemeral-storage",
            "bind",
            "--dirs",
            "/var/lib/containerd",
            "/var/lib/kubelet",
            "/var/log/pods",
        ]
        .into_iter()
        .collect();
        ephemeral["commands"] = value([init, bind].into_iter().collect::<Array>());
        ephemeral["mode"] = value("always");
        ephemeral["essential"] = value(true);
    }
    Ok(doc.to_string())
}

/// User data for an AMI family.
pub fn render(family: &str, cluster: &ClusterInfo, node: &NodeSettings) -> Result<String, UserDataError> {
    match family {
        "AL2023" => al2023(cluster, node),
        "Bottlerocket" => bottlerocket(cluster, node),
        // Custom AMIs get exactly what the user wrote.
        "Custom" => Ok(node.user_data.clone().unwrap_or_default()),
        other => Err(UserDataError::UnsupportedFamily(other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> ClusterInfo {
        ClusterInfo {
            name: "demo".into(),
            endpoint: "https://ABC.gr7.us-east-1.eks.amazonaws.com".into(),
            certificate_authority: "Q0FEQVRB".into(),
            service_cidr: "10.100.0.0/16".into(),
            version: "1.33".into(),
        }
    }

    fn node(user: Option<&str>) -> NodeSettings {
        NodeSettings {
            labels: BTreeMap::from([
                ("karpenter.sh/nodepool".to_string(), "default".to_string()),
                ("karpenter.sh/nodeclaim".to_string(), "default-abc".to_string()),
            ]),
            taints: vec![
                Taint::new("dedicated", Some("gpu"), TaintEffect::NoSchedule),
                Taint::new("node.cilium.io/agent-not-ready", None, TaintEffect::NoExecute),
            ],
            kubelet: Some(KubeletConfiguration {
                max_pods: Some(58),
                cluster_dns: vec!["10.100.0.10".into()],
                image_gc_high_threshold_percent: Some(85),
                system_reserved: BTreeMap::from([("cpu".to_string(), "100m".to_string())]),
                ..Default::default()
            }),
            user_data: user.map(String::from),
            instance_store_raid0: false,
        }
    }

    #[test]
    fn raid0_asks_each_family_for_an_instance_store_array() {
        let raid = NodeSettings {
            instance_store_raid0: true,
            ..node(None)
        };
        let nc = nodeconfig_of(&al2023(&cluster(), &raid).unwrap());
        assert_eq!(nc["spec"]["instance"]["localStorage"]["strategy"], "RAID0");
        assert!(nodeconfig_of(&al2023(&cluster(), &node(None)).unwrap())["spec"]["instance"].is_null());

        let doc: toml_edit::DocumentMut = bottlerocket(&cluster(), &raid).unwrap().parse().unwrap();
        let eph = &doc["settings"]["bootstrap-commands"]["k8s-ephemeral-storage"];
        assert_eq!(eph["mode"].as_str(), Some("always"));
        assert_eq!(eph["essential"].as_bool(), Some(true));
        let commands = eph["commands"].as_array().unwrap();
        assert_eq!(commands.len(), 2);
        assert!(commands.get(1).unwrap().to_string().contains("/var/lib/kubelet"));
        let plain: toml_edit::DocumentMut = bottlerocket(&cluster(), &node(None)).unwrap().parse().unwrap();
        assert!(plain["settings"].get("bootstrap-commands").is_none());
    }

    fn nodeconfig_of(doc: &str) -> serde_json::Value {
        let parts = parse_mime(doc).unwrap();
        let last = parts.last().unwrap();
        assert_eq!(last.content_type, NODECONFIG_TYPE);
        serde_yaml_ng::from_str(&last.body).unwrap()
    }

    #[test]
    fn al2023_nodeconfig_carries_cluster_labels_taints_and_kubelet() {
        let doc = al2023(&cluster(), &node(None)).unwrap();
        let parts = parse_mime(&doc).unwrap();
        assert_eq!(parts.len(), 1);
        let nc = nodeconfig_of(&doc);
        assert_eq!(nc["kind"], "NodeConfig");
        assert_eq!(nc["spec"]["cluster"]["name"], "demo");
        assert_eq!(
            nc["spec"]["cluster"]["apiServerEndpoint"],
            "https://ABC.gr7.us-east-1.eks.amazonaws.com"
        );
        assert_eq!(nc["spec"]["cluster"]["certificateAuthority"], "Q0FEQVRB");
        assert_eq!(nc["spec"]["cluster"]["cidr"], "10.100.0.0/16");
        let config = &nc["spec"]["kubelet"]["config"];
        assert_eq!(config["maxPods"], 58);
        assert_eq!(config["clusterDNS"], json!(["10.100.0.10"]));
        assert_eq!(config["imageGCHighThresholdPercent"], 85);
        assert_eq!(config["systemReserved"]["cpu"], "100m");
        assert_eq!(
            config["registerWithTaints"],
            json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}, {"key": "node.cilium.io/agent-not-ready", "effect": "NoExecute"}])
        );
        assert_eq!(
            nc["spec"]["kubelet"]["flags"],
            json!(["--node-labels=karpenter.sh/nodeclaim=default-abc,karpenter.sh/nodepool=default"])
        );
    }

    #[test]
    fn al2023_user_data_goes_first_whatever_its_form() {
        let script = "#!/bin/bash\necho hello\n";
        let nodeconfig = "apiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\nspec:\n  kubelet:\n    config:\n      shutdownGracePeriod: 30s\n";
        let mime = "MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"BOUNDARY\"\n\n--BOUNDARY\nContent-Type: text/x-shellscript; charset=\"us-ascii\"\n\n#!/bin/bash\necho one\n\n--BOUNDARY\nContent-Type: application/node.eks.aws\n\nkind: NodeConfig\n\n--BOUNDARY--\n";
        let cases: Vec<(&str, Vec<(&str, &str)>)> = vec![
            (script, vec![("text/x-shellscript", "echo hello")]),
            (nodeconfig, vec![(NODECONFIG_TYPE, "shutdownGracePeriod: 30s")]),
            (
                mime,
                vec![
                    ("text/x-shellscript", "echo one"),
                    (NODECONFIG_TYPE, "kind: NodeConfig"),
                ],
            ),
            ("", vec![]),
        ];
        for (user, want) in cases {
            let doc = al2023(&cluster(), &node(Some(user))).unwrap();
            let parts = parse_mime(&doc).unwrap();
            assert_eq!(parts.len(), want.len() + 1, "{user}");
            for (p, (ct, snippet)) in parts.iter().zip(&want) {
                assert_eq!(&p.content_type, ct);
                assert!(p.body.contains(snippet), "{:?} lacks {snippet}", p.body);
            }
            assert_eq!(nodeconfig_of(&doc)["spec"]["cluster"]["name"], "demo");
        }
    }

    #[test]
    fn broken_user_mime_is_a_clear_error() {
        let bad = "MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"B\"\n\n--B\nContent-Type: text/x-shellscript\n\necho\n";
        let e = al2023(&cluster(), &node(Some(bad))).unwrap_err().to_string();
        assert!(
            e.contains("spec.userData") && e.contains("does not end with --B--"),
            "{e}"
        );
    }

    #[test]
    fn bottlerocket_merges_user_toml_under_ours() {
        let user = "[settings.kubernetes]\ncluster-name = \"wrong\"\nmax-pods = 10\n[settings.kubernetes.node-labels]\nteam = \"a\"\n\"karpenter.sh/nodepool\" = \"spoofed\"\n[settings.host-containers.admin]\nenabled = true\n";
        let out = bottlerocket(&cluster(), &node(Some(user))).unwrap();
        let doc: toml_edit::DocumentMut = out.parse().unwrap();
        let k = &doc["settings"]["kubernetes"];
        assert_eq!(k["cluster-name"].as_str(), Some("demo"));
        assert_eq!(
            k["api-server"].as_str(),
            Some("https://ABC.gr7.us-east-1.eks.amazonaws.com")
        );
        assert_eq!(k["cluster-certificate"].as_str(), Some("Q0FEQVRB"));
        assert_eq!(k["cluster-dns-ip"].as_str(), Some("10.100.0.10"));
        assert_eq!(k["max-pods"].as_integer(), Some(58));
        assert_eq!(k["node-labels"]["team"].as_str(), Some("a"));
        assert_eq!(k["node-labels"]["karpenter.sh/nodepool"].as_str(), Some("default"));
        assert_eq!(k["node-labels"]["karpenter.sh/nodeclaim"].as_str(), Some("default-abc"));
        let dedicated: Vec<&str> = k["node-taints"]["dedicated"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        assert_eq!(dedicated, vec!["gpu:NoSchedule"]);
        assert_eq!(k["system-reserved"]["cpu"].as_str(), Some("100m"));
        assert_eq!(
            doc["settings"]["host-containers"]["admin"]["enabled"].as_bool(),
            Some(true)
        );
    }

    #[test]
    fn labels_and_taints_that_are_not_valid_never_reach_the_kubelet() {
        let inject = |labels: &[(&str, &str)], taint: Option<Taint>| {
            let mut n = node(None);
            n.labels
                .extend(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())));
            n.taints.extend(taint);
            n
        };
        let bad = [
            inject(&[("team", "a,dedicated=payments")], None),
            inject(&[("team,dedicated", "payments")], None),
            inject(&[("team", "a\n--register-with-taints=x")], None),
            inject(&[("team", &"x".repeat(64))], None),
            inject(
                &[],
                Some(Taint::new(
                    "dedicated",
                    Some("a,b=c:NoSchedule"),
                    TaintEffect::NoSchedule,
                )),
            ),
        ];
        for n in &bad {
            for family in ["AL2023", "Bottlerocket"] {
                let e = render(family, &cluster(), n).unwrap_err();
                assert!(matches!(e, UserDataError::Label { .. }), "{family}: {e}");
            }
        }
        let e = al2023(&cluster(), &bad[0]).unwrap_err();
        let why = std::error::Error::source(&e)
            .map(ToString::to_string)
            .unwrap_or_default();
        assert!(why.contains("\"a,dedicated=payments\""), "{e}: {why}");
        // Valid labels, the empty value among them, are written as given.
        let ok = inject(&[("team", ""), ("example.com/tier", "web-1")], None);
        let doc = nodeconfig_of(&al2023(&cluster(), &ok).unwrap());
        let flags = doc["spec"]["kubelet"]["flags"][0].as_str().unwrap().to_string();
        assert!(
            flags.contains(",team=") && flags.contains("example.com/tier=web-1"),
            "{flags}"
        );
    }

    #[test]
    fn bottlerocket_rejects_bad_toml_and_unsupported_families_are_named() {
        let e = bottlerocket(&cluster(), &node(Some("[settings")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not valid TOML"), "{e}");
        let e = bottlerocket(&cluster(), &node(Some("settings = 1")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("settings must be a table"), "{e}");
        let e = render("Windows2022", &cluster(), &node(None)).unwrap_err().to_string();
        assert!(e.contains("\"Windows2022\" is not supported"), "{e}");
        assert_eq!(render("Custom", &cluster(), &node(Some("raw"))).unwrap(), "raw");
    }
}
