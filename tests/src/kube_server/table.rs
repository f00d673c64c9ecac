//! Server-side printing (`Accept: application/json;as=Table;...`) for the
//! kinds people look at most: pods, nodes and Deployments, with the columns
//! `kubectl get` shows for them (priority 1 columns only with `-o wide`).
//! Other kinds answer with plain objects, which kubectl prints as NAME and AGE.

use axum::http::HeaderMap;
use serde_json::{Value, json};

use super::resources::{DEPLOYMENTS, NODES, PODS, Resource};
use super::store::name_of;

/// Whether the client asked for a Table.
pub fn wants_table(headers: &HeaderMap) -> bool {
    headers
        .get("accept")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.split(',').next().is_some_and(|first| first.contains("as=Table")))
}

/// How long ago an RFC 3339 time was, as kubectl prints ages (`5s`, `3m`, `2h`, `4d`).
fn age(obj: &Value) -> String {
    let Some(ts) = obj
        .pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
    else {
        return "<unknown>".into();
    };
    let secs = jiff::Timestamp::now().as_second().saturating_sub(ts.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

fn str_at<'a>(obj: &'a Value, ptr: &str) -> &'a str {
    obj.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

fn or_none(s: &str) -> String {
    if s.is_empty() { "<none>".into() } else { s.into() }
}

fn condition_true(obj: &Value, kind: &str) -> bool {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == kind && c["status"] == "True"))
}

fn int_at(obj: &Value, ptr: &str) -> i64 {
    obj.pointer(ptr).and_then(Value::as_i64).unwrap_or(0)
}

/// Column names with their priority (0 always shown, 1 with `-o wide`).
fn columns(res: &Resource) -> Option<&'static [(&'static str, u8)]> {
    if res == PODS {
        Some(&[
            ("Name", 0),
            ("Ready", 0),
            ("Status", 0),
            ("Restarts", 0),
            ("Age", 0),
            ("IP", 1),
            ("Node", 1),
            ("Nominated Node", 1),
            ("Readiness Gates", 1),
        ])
    } else if res == NODES {
        Some(&[
            ("Name", 0),
            ("Status", 0),
            ("Roles", 0),
            ("Age", 0),
            ("Version", 0),
            ("Internal-IP", 1),
            ("External-IP", 1),
            ("OS-Image", 1),
            ("Kernel-Version", 1),
            ("Container-Runtime", 1),
        ])
    } else if res == DEPLOYMENTS {
        Some(&[
            ("Name", 0),
            ("Ready", 0),
            ("Up-to-date", 0),
            ("Available", 0),
            ("Age", 0),
            ("Containers", 1),
            ("Images", 1),
            ("Selector", 1),
        ])
    } else {
        None
    }
}

fn address(node: &Value, kind: &str) -> String {
    let found = node
        .pointer("/status/addresses")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().find(|x| x["type"] == kind))
        .and_then(|x| x["address"].as_str())
        .unwrap_or("");
    or_none(found)
}

fn cells(res: &Resource, o: &Value) -> Vec<Value> {
    if res == PODS {
        let containers = o
            .pointer("/spec/containers")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        let ready = if condition_true(o, "Ready") { containers } else { 0 };
        let phase = str_at(o, "/status/phase");
        vec![
            json!(name_of(o)),
            json!(format!("{ready}/{containers}")),
            json!(if phase.is_empty() { "Pending" } else { phase }),
            json!(0),
            json!(age(o)),
            json!(or_none(str_at(o, "/status/podIP"))),
            json!(or_none(str_at(o, "/spec/nodeName"))),
            json!("<none>"),
            json!("<none>"),
        ]
    } else if res == NODES {
        let mut status = if condition_true(o, "Ready") {
            "Ready"
        } else {
            "NotReady"
        }
        .to_string();
        if o.pointer("/spec/unschedulable") == Some(&json!(true)) {
            status.push_str(",SchedulingDisabled");
        }
        let roles: Vec<&str> = o
            .pointer("/metadata/labels")
            .and_then(Value::as_object)
            .map(|m| {
                m.keys()
                    .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
                    .collect()
            })
            .unwrap_or_default();
        vec![
            json!(name_of(o)),
            json!(status),
            json!(or_none(&roles.join(","))),
            json!(age(o)),
            json!(str_at(o, "/status/nodeInfo/kubeletVersion")),
            json!(address(o, "InternalIP")),
            json!(address(o, "ExternalIP")),
            json!(or_none(str_at(o, "/status/nodeInfo/osImage"))),
            json!(or_none(str_at(o, "/status/nodeInfo/kernelVersion"))),
            json!(or_none(str_at(o, "/status/nodeInfo/containerRuntimeVersion"))),
        ]
    } else {
        let containers = o
            .pointer("/spec/template/spec/containers")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let field = |f: &str| -> String {
            containers
                .iter()
                .filter_map(|c| c[f].as_str())
                .collect::<Vec<_>>()
                .join(",")
        };
        let selector = super::workloads::scale_of(o)["status"]["selector"]
            .as_str()
            .unwrap_or("")
            .to_string();
        vec![
            json!(name_of(o)),
            json!(format!(
                "{}/{}",
                int_at(o, "/status/readyReplicas"),
                o.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1)
            )),
            json!(int_at(o, "/status/updatedReplicas")),
            json!(int_at(o, "/status/availableReplicas")),
            json!(age(o)),
            json!(field("name")),
            json!(field("image")),
            json!(selector),
        ]
    }
}

/// A meta.k8s.io/v1 Table of `items`, or None for kinds without columns here.
pub fn table(res: &Resource, items: &[Value], resource_version: u64) -> Option<Value> {
    let cols = columns(res)?;
    let defs: Vec<Value> = cols
        .iter()
        .map(|(name, priority)| {
            let format = if *name == "Name" { "name" } else { "" };
            json!({"name": name, "type": "string", "format": format, "description": "", "priority": priority})
        })
        .collect();
    let rows: Vec<Value> = items
        .iter()
        .map(|o| json!({"cells": cells(res, o), "object": o}))
        .collect();
    Some(json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version.to_string()},
        "columnDefinitions": defs,
        "rows": rows,
    }))
}
