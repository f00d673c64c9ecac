//! Server-side printing (`Accept: application/json;as=Table;...`): pods,
//! nodes and Deployments with the columns `kubectl get` shows for them, and
//! custom resources with their CRD's `additionalPrinterColumns` (JSONPath
//! values, as the API server evaluates them; an `Age` column when the CRD
//! lists none). Every column goes out with its priority: kubectl shows
//! priority 1 columns only with `-o wide`. Other kinds answer with plain
//! objects, which kubectl prints as NAME and AGE.

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

/// A meta.k8s.io/v1 Table of `items`, or None for kinds without columns
/// here. `crd` is the CRD that defines `res`, when it is a custom resource.
pub fn table(res: &Resource, crd: Option<&Value>, items: &[&Value], resource_version: u64) -> Option<Value> {
    let (defs, rows): (Vec<Value>, Vec<Value>) = match columns(res) {
        Some(cols) => {
            let defs = cols
                .iter()
                .map(|(name, priority)| {
                    let format = if *name == "Name" { "name" } else { "" };
                    json!({"name": name, "type": "string", "format": format, "description": "", "priority": priority})
                })
                .collect();
            let rows = items
                .iter()
                .map(|o| json!({"cells": cells(res, o), "object": o}))
                .collect();
            (defs, rows)
        }
        None => {
            let cols = printer_columns(crd?, res.version)?;
            let mut defs = vec![json!({"name": "Name", "type": "string", "format": "name",
                "description": "Name of the object", "priority": 0})];
            defs.extend(cols.iter().map(|c| {
                let description = format!(
                    "Custom resource definition column (in JSONPath format): {}",
                    c.json_path
                );
                json!({"name": c.name, "type": c.type_, "format": c.format, "description": description,
                    "priority": c.priority})
            }));
            let rows = items
                .iter()
                .map(|o| {
                    let mut cells = vec![json!(name_of(o))];
                    cells.extend(cols.iter().map(|c| custom_cell(c, o)));
                    json!({"cells": cells, "object": o})
                })
                .collect();
            (defs, rows)
        }
    };
    Some(json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version.to_string()},
        "columnDefinitions": defs,
        "rows": rows,
    }))
}

/// One of a CRD version's `additionalPrinterColumns`.
struct PrinterColumn {
    name: String,
    type_: String,
    format: String,
    json_path: String,
    priority: i64,
}

/// The printer columns of `crd` for `version`: its `additionalPrinterColumns`,
/// or the API server's default (`Age`) when it lists none; None when the
/// CRD does not serve `version`.
fn printer_columns(crd: &Value, version: &str) -> Option<Vec<PrinterColumn>> {
    let v = crd
        .pointer("/spec/versions")?
        .as_array()?
        .iter()
        .find(|v| v.get("name").and_then(Value::as_str) == Some(version))?;
    let listed = v
        .get("additionalPrinterColumns")
        .and_then(Value::as_array)
        .filter(|a| !a.is_empty());
    let Some(listed) = listed else {
        return Some(vec![PrinterColumn {
            name: "Age".into(),
            type_: "date".into(),
            format: String::new(),
            json_path: ".metadata.creationTimestamp".into(),
            priority: 0,
        }]);
    };
    let text = |c: &Value, k: &str| c.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    Some(
        listed
            .iter()
            .map(|c| PrinterColumn {
                name: text(c, "name"),
                type_: text(c, "type"),
                format: text(c, "format"),
                json_path: text(c, "jsonPath"),
                priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
            })
            .collect(),
    )
}

/// A custom column's cell as the API server fills it: the first JSONPath
/// result, printed as text for `string` columns, typed for the others, an
/// age for `date`; null (kubectl prints an empty cell) when there is none
/// or it is not of the column's type.
fn custom_cell(col: &PrinterColumn, obj: &Value) -> Value {
    let Some(v) = jsonpath(obj, &col.json_path).into_iter().next() else {
        return Value::Null;
    };
    match (col.type_.as_str(), v) {
        (_, Value::Null) => Value::Null,
        ("string", Value::String(s)) => json!(s),
        ("string", other) => json!(other.to_string()),
        ("integer", Value::Number(n)) => n
            .as_i64()
            .or_else(|| n.as_f64().map(|f| f as i64))
            .map_or(Value::Null, |i| json!(i)),
        ("number", Value::Number(n)) => json!(n),
        ("boolean", Value::Bool(b)) => json!(b),
        ("date", Value::String(_)) => {
            let at = json!({"metadata": {"creationTimestamp": v}});
            match age(&at).as_str() {
                "<unknown>" => json!("<invalid>"),
                a => json!(a),
            }
        }
        _ => Value::Null,
    }
}

/// One step of a Kubernetes JSONPath.
#[derive(Debug, PartialEq)]
enum Step {
    /// `.name` (dots in a name escaped as `\.`).
    Field(String),
    /// `[n]`.
    Index(usize),
    /// `[*]`.
    All,
    /// `[?(@.a.b=="v")]`: the items whose field path equals the literal.
    Filter(Vec<String>, String),
}

/// Dot-separated names, where `\.` is a dot inside a name.
fn fields(path: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut chars = path.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'.') => {
                chars.next();
                if let Some(s) = out.last_mut() {
                    s.push('.');
                }
            }
            '.' => out.push(String::new()),
            c => {
                if let Some(s) = out.last_mut() {
                    s.push(c);
                }
            }
        }
    }
    out.into_iter().filter(|s| !s.is_empty()).collect()
}

/// The steps of `path` (`.a.b[0].c`, `.a[?(@.type=="Ready")].status`, with
/// or without the `{}` kubectl's templates wrap it in); None for what this
/// subset does not read.
fn parse(path: &str) -> Option<Vec<Step>> {
    let path = path.trim();
    let path = path.strip_prefix('{').and_then(|p| p.strip_suffix('}')).unwrap_or(path);
    let mut steps = Vec::new();
    let mut rest = path;
    while !rest.is_empty() {
        if let Some(inner) = rest.strip_prefix('[') {
            let end = if inner.starts_with("?(") {
                inner.find(")]")? + 1
            } else {
                inner.find(']')?
            };
            let body = &inner[..end];
            rest = &inner[end + 1..];
            if body == "*" {
                steps.push(Step::All);
            } else if let Some(expr) = body.strip_prefix("?(").and_then(|b| b.strip_suffix(')')) {
                let (left, right) = expr.split_once("==")?;
                let left = left.trim().strip_prefix('@')?;
                let right = right.trim();
                let literal = right
                    .strip_prefix('"')
                    .and_then(|r| r.strip_suffix('"'))
                    .or_else(|| right.strip_prefix('\'').and_then(|r| r.strip_suffix('\'')))?;
                steps.push(Step::Filter(fields(left), literal.to_string()));
            } else {
                steps.push(Step::Index(body.parse().ok()?));
            }
        } else {
            // Up to the next unescaped '['.
            let bytes = rest.as_bytes();
            let end = (0..bytes.len())
                .find(|&i| bytes[i] == b'[' && (i == 0 || bytes[i - 1] != b'\\'))
                .unwrap_or(bytes.len());
            steps.extend(fields(&rest[..end]).into_iter().map(Step::Field));
            rest = &rest[end..];
        }
    }
    Some(steps)
}

/// What `path` selects in `obj` (missing keys select nothing, as the API
/// server's printer allows).
fn jsonpath<'a>(obj: &'a Value, path: &str) -> Vec<&'a Value> {
    let Some(steps) = parse(path) else {
        return Vec::new();
    };
    let mut cur = vec![obj];
    for step in &steps {
        cur = cur
            .into_iter()
            .flat_map(|v| -> Vec<&Value> {
                match (step, v) {
                    (Step::Field(f), Value::Object(m)) => m.get(f).into_iter().collect(),
                    (Step::Index(i), Value::Array(a)) => a.get(*i).into_iter().collect(),
                    (Step::All, Value::Array(a)) => a.iter().collect(),
                    (Step::Filter(path, want), Value::Array(a)) => a
                        .iter()
                        .filter(|item| {
                            path.iter().try_fold(*item, |x, f| x.get(f)).and_then(Value::as_str) == Some(want.as_str())
                        })
                        .collect(),
                    _ => Vec::new(),
                }
            })
            .collect();
    }
    cur
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonpath_reads_escaped_label_keys_and_filters_conditions() {
        let o = json!({"metadata": {"labels": {"node.kubernetes.io/instance-type": "m5.large"}},
            "status": {"nodes": 3, "conditions": [{"type": "Launched", "status": "True"},
                                                   {"type": "Ready", "status": "False"}]}});
        assert_eq!(
            jsonpath(&o, r".metadata.labels.node\.kubernetes\.io/instance-type"),
            [&json!("m5.large")]
        );
        assert_eq!(
            jsonpath(&o, r#".status.conditions[?(@.type=="Ready")].status"#),
            [&json!("False")]
        );
        assert_eq!(jsonpath(&o, ".status.conditions[0].type"), [&json!("Launched")]);
        assert_eq!(jsonpath(&o, "{.status.conditions[*].type}").len(), 2);
        assert!(jsonpath(&o, r#".status.conditions[?(@.type=="Drifted")].status"#).is_empty());
        assert!(jsonpath(&o, ".status.nodeName").is_empty());
        let col = |t: &str, p: &str| PrinterColumn {
            name: "X".into(),
            type_: t.into(),
            format: String::new(),
            json_path: p.into(),
            priority: 0,
        };
        // A string column prints a number as text, as Karpenter's NODES column relies on.
        assert_eq!(custom_cell(&col("string", ".status.nodes"), &o), json!("3"));
        assert_eq!(custom_cell(&col("integer", ".status.nodes"), &o), json!(3));
        assert_eq!(custom_cell(&col("string", ".status.nodeName"), &o), Value::Null);
    }
}
