//! The external calls the code makes, found by reading it: what the IAM
//! tests hold each function's role to, and what the crash tests must crash
//! after.

use std::path::PathBuf;

use serde::Deserialize;

/// The AWS calls in `shared/src` as `service:Operation` with the file each
/// is in: every `.operation()` called on a client (`ec2`, `eks`, `ssm`,
/// `iam`, `sqs`, the state store's `client`) in a file that uses the SDK,
/// with its service told by the operation's name.
pub fn sdk_calls() -> Vec<(String, String)> {
    fn files(dir: &std::path::Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let root = crate::moto::repo_root().join("shared/src");
    let mut all = Vec::new();
    files(&root, &mut all);
    const DYNAMODB: &[&str] = &[
        "put_item",
        "get_item",
        "update_item",
        "delete_item",
        "query",
        "batch_write_item",
        "transact_write_items",
        "scan",
        "create_table",
    ];
    // Operation names by prefix: EC2/EKS/SSM/IAM verbs, DynamoDB's, SQS's sends and visibility changes.
    let verbs: Vec<&str> = [
        "describe_",
        "create_",
        "delete_",
        "terminate_",
        "run_",
        "list_",
        "add_",
        "remove_",
        "tag_",
        "get_parameter",
        "get_instance_profile",
        "get_products",
        "get_managed_resource",
        "send_message",
        "change_message_visibility",
    ]
    .into_iter()
    .chain(DYNAMODB.iter().copied())
    .collect();
    let mut out = Vec::new();
    for f in all {
        let text = std::fs::read_to_string(&f).unwrap();
        // The state store's files call DynamoDB through `self.client`
        // without naming the SDK.
        let in_state = f.strip_prefix(&root).unwrap().starts_with("state");
        if !in_state && !text.contains("aws_sdk_") {
            continue;
        }
        let b = text.as_bytes();
        for (i, _) in text.match_indices('.') {
            let mut j = i + 1;
            while j < b.len() && b[j].is_ascii_whitespace() {
                j += 1;
            }
            let start = j;
            while j < b.len() && (b[j].is_ascii_lowercase() || b[j] == b'_') {
                j += 1;
            }
            let op = &text[start..j];
            if !text[j..].starts_with("()") || !verbs.iter().any(|v| op.starts_with(v)) {
                continue;
            }
            // An SDK operation is called on a client; getters and
            // nodesmith's own methods are called on other things.
            let before = text[..i].trim_end();
            let receiver: String = before
                .chars()
                .rev()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            if !["ec2", "eks", "ssm", "iam", "client", "sqs"].contains(&receiver.as_str()) {
                continue;
            }
            let service = if DYNAMODB.contains(&op) {
                "dynamodb"
            } else if op.starts_with("send_message") || op == "change_message_visibility" {
                "sqs"
            } else if op == "describe_cluster" {
                "eks"
            } else if op.starts_with("get_parameter") {
                "ssm"
            } else if op.contains("instance_profile") {
                "iam"
            } else if op == "get_products" {
                "pricing"
            } else if op == "get_managed_resource" {
                "arc-zonal-shift"
            } else {
                "ec2"
            };
            let pascal: String = op
                .split('_')
                .map(|w| {
                    let mut c = w.chars();
                    c.next()
                        .map(|h| h.to_ascii_uppercase().to_string() + c.as_str())
                        .unwrap_or_default()
                })
                .collect();
            let file = f.strip_prefix(&root).unwrap().display().to_string();
            out.push((format!("{service}:{pascal}"), file));
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The Kubernetes writes the functions' ClusterRole (`infra/k8s/lambda-rbac.yaml`,
/// which a test holds to exactly what the code calls) grants, named as
/// `nodesmith::crash` names calls: `kube:<verb> <resource>`.
pub fn kube_writes() -> Vec<String> {
    let path = crate::moto::repo_root().join("infra/k8s/lambda-rbac.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let v = serde_yaml_ng::Value::deserialize(doc).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if v["kind"].as_str() != Some("ClusterRole") {
            continue;
        }
        for rule in v["rules"].as_sequence().into_iter().flatten() {
            let list = |key: &str| -> Vec<String> {
                rule[key]
                    .as_sequence()
                    .into_iter()
                    .flatten()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            };
            for verb in list("verbs") {
                if !["create", "update", "patch", "delete"].contains(&verb.as_str()) {
                    continue;
                }
                for resource in list("resources") {
                    out.push(format!("kube:{verb} {resource}"));
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}
