//! API discovery as `kubectl` reads it: the legacy (non-aggregated) group and
//! resource lists under `/api` and `/apis`, and just enough OpenAPI v3 for
//! `kubectl apply` to learn that the server validates fields itself.
//!
//! kubectl asks for aggregated discovery first and falls back to these lists
//! when the answer is plain `application/json`. The OpenAPI documents carry
//! no schemas: each names its PATCH operations with their
//! group-version-kind and the `fieldValidation` parameter, which is what
//! kubectl looks for before sending `fieldValidation=Strict` instead of
//! validating on the client (which would need the OpenAPI v2 protobuf). With
//! no strategic-merge content type listed, kubectl computes apply patches
//! from its compiled-in types, as it does for servers without OpenAPI.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::resources::{RESOURCES, Resource, SUBRESOURCES};

/// Verbs of every top-level resource (the server serves them all).
const VERBS: &[&str] = &["create", "delete", "get", "list", "patch", "update", "watch"];

/// Group versions in the order kubectl lists them: core first.
fn group_versions() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for r in RESOURCES {
        if !out.contains(&(r.group, r.version)) {
            out.push((r.group, r.version));
        }
    }
    out
}

fn group_version(group: &str, version: &str) -> String {
    if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    }
}

/// The categories a kind is in: `kubectl get all` lists the workloads,
/// `kubectl get karpenter` the Karpenter kinds (their CRDs say so).
fn categories(r: &Resource) -> &'static [&'static str] {
    match (r.group, r.plural) {
        (_, "pods" | "deployments" | "replicasets" | "daemonsets") => &["all"],
        ("karpenter.sh" | "karpenter.k8s.aws", _) => &["karpenter"],
        _ => &[],
    }
}

fn resource_list(group: &str, version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for r in RESOURCES.iter().filter(|r| r.group == group && r.version == version) {
        let mut entry = json!({
            "name": r.plural,
            "singularName": r.kind.to_ascii_lowercase(),
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": VERBS,
        });
        if !r.short_names.is_empty() {
            entry["shortNames"] = json!(r.short_names);
        }
        if !categories(r).is_empty() {
            entry["categories"] = json!(categories(r));
        }
        resources.push(entry);
        for (_, sub, kind) in SUBRESOURCES.iter().filter(|(p, _, _)| *p == r.plural) {
            let verbs: &[&str] = match *sub {
                "eviction" | "binding" => &["create"],
                _ => &["get", "patch", "update"],
            };
            let mut entry = json!({
                "name": format!("{}/{sub}", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": verbs,
            });
            // A subresource of another kind names its group and version.
            if let [g, v, k] = kind.split('/').collect::<Vec<_>>().as_slice() {
                entry["group"] = json!(g);
                entry["version"] = json!(v);
                entry["kind"] = json!(k);
            }
            resources.push(entry);
        }
    }
    if resources.is_empty() {
        return None;
    }
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version(group, version),
        "resources": resources,
    }))
}

fn group_list() -> Value {
    let mut groups: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut order = Vec::new();
    for (g, v) in group_versions().into_iter().filter(|(g, _)| !g.is_empty()) {
        if !groups.contains_key(g) {
            order.push(g);
        }
        groups.entry(g).or_default().push(v);
    }
    let groups: Vec<Value> = order
        .iter()
        .map(|g| {
            let versions: Vec<Value> = groups[g]
                .iter()
                .map(|v| json!({"groupVersion": group_version(g, v), "version": v}))
                .collect();
            json!({"name": g, "versions": versions, "preferredVersion": versions[0]})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// The OpenAPI v3 path key of a group version (`api/v1`, `apis/apps/v1`).
fn openapi_key(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// A fixed hash: the documents never change while a server runs.
const OPENAPI_HASH: &str = "nodesmith-test-1";

fn openapi_root() -> Value {
    let paths: serde_json::Map<String, Value> = group_versions()
        .into_iter()
        .map(|(g, v)| {
            let key = openapi_key(g, v);
            let url = format!("/openapi/v3/{key}?hash={OPENAPI_HASH}");
            (key, json!({"serverRelativeURL": url}))
        })
        .collect();
    json!({"paths": paths})
}

fn openapi_group_version(group: &str, version: &str) -> Option<Value> {
    let field_validation = json!({
        "name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true},
        "description": "Strict, Warn or Ignore: accepted, not enforced by the test server",
    });
    let mut paths = serde_json::Map::new();
    for r in RESOURCES.iter().filter(|r| r.group == group && r.version == version) {
        let prefix = format!("/{}", openapi_key(group, version));
        let item = if r.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", r.plural)
        } else {
            format!("{prefix}/{}/{{name}}", r.plural)
        };
        let patch = json!({
            "operationId": format!("patch{}", r.kind),
            "parameters": [field_validation],
            "requestBody": {"content": {
                "application/json-patch+json": {"schema": {"type": "object"}},
                "application/merge-patch+json": {"schema": {"type": "object"}},
            }},
            "responses": {"200": {"description": "OK"}},
            "x-kubernetes-action": "patch",
            "x-kubernetes-group-version-kind": {"group": r.group, "version": r.version, "kind": r.kind},
        });
        paths.insert(item, json!({"patch": patch}));
    }
    if paths.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}

/// The discovery or OpenAPI document at `path`, or None when `path` is not one.
pub fn document(path: &str) -> Option<Value> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segs.as_slice() {
        ["api"] => Some(json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})),
        ["apis"] => Some(group_list()),
        ["api", v] => resource_list("", v),
        ["apis", g] => {
            let versions: Vec<Value> = group_versions()
                .into_iter()
                .filter(|(gg, _)| gg == g)
                .map(|(gg, v)| json!({"groupVersion": group_version(gg, v), "version": v}))
                .collect();
            let preferred = versions.first()?.clone();
            Some(
                json!({"kind": "APIGroup", "apiVersion": "v1", "name": g, "versions": versions, "preferredVersion": preferred}),
            )
        }
        ["apis", g, v] => resource_list(g, v),
        ["openapi", "v3"] => Some(openapi_root()),
        ["openapi", "v3", "api", v] => openapi_group_version("", v),
        ["openapi", "v3", "apis", g, v] => openapi_group_version(g, v),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_list_names_short_names_and_subresources() {
        let doc = document("/api/v1").unwrap();
        let names: Vec<&str> = doc["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"pods/eviction") && names.contains(&"nodes/status"));
        let eviction = doc["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "pods/eviction")
            .unwrap();
        assert_eq!(
            (eviction["group"].as_str(), eviction["kind"].as_str()),
            (Some("policy"), Some("Eviction"))
        );
        let pods = doc["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "pods")
            .unwrap();
        assert_eq!(pods["shortNames"], json!(["po"]));
    }

    #[test]
    fn the_installed_crds_short_names_and_categories_are_discovered() {
        for crd in nodesmith::kubernetes::crds::crds() {
            let (group, names) = (&crd.spec.group, &crd.spec.names);
            let listed = document(&format!("/apis/{group}/v1")).unwrap();
            let entry = listed["resources"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["name"] == names.plural.as_str())
                .unwrap_or_else(|| panic!("{} not served", names.plural));
            let short = names.short_names.clone().unwrap_or_default();
            let listed_short: Vec<String> = serde_json::from_value(entry["shortNames"].clone()).unwrap_or_default();
            assert_eq!(listed_short, short, "{}", names.plural);
            assert_eq!(
                entry["categories"],
                json!(names.categories.clone().unwrap_or_default()),
                "{}",
                names.plural
            );
        }
    }

    #[test]
    fn every_group_version_has_discovery_and_openapi() {
        for (g, v) in group_versions() {
            let p = if g.is_empty() {
                format!("/api/{v}")
            } else {
                format!("/apis/{g}/{v}")
            };
            assert!(document(&p).is_some(), "{p}");
            assert!(document(&format!("/openapi/v3{p}")).is_some(), "{p}");
        }
        assert!(document("/apis/nope/v1").is_none());
        let groups = document("/apis").unwrap();
        assert!(
            groups["groups"]
                .as_array()
                .unwrap()
                .iter()
                .any(|g| g["name"] == "karpenter.k8s.aws")
        );
    }
}
