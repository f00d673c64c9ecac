//! The manifests in `infra/k8s`: every document is a Kubernetes object that
//! round-trips through its typed form (so no field is misspelt or unknown),
//! the kustomization lists exactly the files there, the CRDs are what the Rust
//! types generate and are structural, users' Karpenter manifests use only
//! fields the CRDs know, and the RBAC grants what the code calls and no more.

use std::collections::BTreeSet;
use std::path::PathBuf;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn k8s_dir() -> PathBuf {
    repo().join("infra/k8s")
}

fn yaml_files() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(k8s_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    out.sort();
    out
}

fn documents(path: &PathBuf) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| <Value as serde::Deserialize>::deserialize(d).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .filter(|v| !v.is_null())
        .collect()
}

/// Drops nulls and empty maps/lists, which typed serialisation omits.
fn normalize(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| (k.clone(), normalize(v)))
                .filter(|(_, v)| {
                    !(v.is_null()
                        || v.as_object().is_some_and(|o| o.is_empty())
                        || v.as_array().is_some_and(|a| a.is_empty()))
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(normalize).collect()),
        other => other.clone(),
    }
}

fn round_trips<K: DeserializeOwned + Serialize>(doc: &Value, what: &str) {
    let typed: K = serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{what}: {e}"));
    let back = serde_json::to_value(&typed).unwrap();
    assert_eq!(
        normalize(&back),
        normalize(doc),
        "{what}: some field is unknown to the typed object"
    );
}

#[test]
fn every_document_is_a_known_kubernetes_object() {
    let mut kinds = Vec::new();
    for file in yaml_files() {
        let name = file.file_name().unwrap().to_string_lossy().to_string();
        if name == "kustomization.yaml" {
            continue;
        }
        for (i, doc) in documents(&file).iter().enumerate() {
            let kind = doc["kind"].as_str().unwrap_or_default().to_string();
            let what = format!("{name} document {i} ({kind})");
            match (doc["apiVersion"].as_str().unwrap_or_default(), kind.as_str()) {
                ("v1", "Namespace") => round_trips::<Namespace>(doc, &what),
                ("v1", "ServiceAccount") => round_trips::<ServiceAccount>(doc, &what),
                ("v1", "ConfigMap") => round_trips::<ConfigMap>(doc, &what),
                ("apps/v1", "Deployment") => round_trips::<Deployment>(doc, &what),
                ("rbac.authorization.k8s.io/v1", "ClusterRole") => round_trips::<ClusterRole>(doc, &what),
                ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => round_trips::<ClusterRoleBinding>(doc, &what),
                ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => {
                    round_trips::<CustomResourceDefinition>(doc, &what)
                }
                (api, k) => panic!("{what}: unexpected {api}/{k}"),
            }
            assert!(
                doc["metadata"]["name"].as_str().is_some_and(|n| !n.is_empty()),
                "{what}: no name"
            );
            kinds.push(kind);
        }
    }
    for k in [
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "CustomResourceDefinition",
    ] {
        assert!(kinds.iter().any(|x| x == k), "no {k} among {kinds:?}");
    }
}

/// The kustomization is everything but the CRDs, which are applied on their
/// own: `kubectl delete -k infra/k8s` (an uninstall, a rollback) must never
/// delete them, which would delete every NodePool and EC2NodeClass with them.
#[test]
fn the_kustomization_lists_exactly_the_manifests_but_the_crds() {
    let k = &documents(&k8s_dir().join("kustomization.yaml"))[0];
    assert_eq!(k["kind"], "Kustomization");
    let listed: BTreeSet<String> = k["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect();
    let present: BTreeSet<String> = yaml_files()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().to_string())
        .filter(|n| n != "kustomization.yaml" && n != "crds.yaml")
        .collect();
    assert_eq!(listed, present);
    assert!(!listed.contains("crds.yaml"));
}

#[test]
fn checked_in_crds_are_what_the_types_generate() {
    let checked_in = std::fs::read_to_string(k8s_dir().join("crds.yaml")).unwrap();
    let generated = nodesmith::kubernetes::crds::crds_yaml().unwrap();
    assert!(
        checked_in == generated,
        "infra/k8s/crds.yaml is stale: run `cargo run -p nodesmith --bin crdgen > infra/k8s/crds.yaml`"
    );
}

/// Checks the rules that make a CRD schema structural (what the API server
/// requires of apiextensions.k8s.io/v1 CRDs); returns the violations.
fn structural_violations(schema: &Value, path: &str, out: &mut Vec<String>) {
    let Some(s) = schema.as_object() else {
        out.push(format!("{path}: not an object"));
        return;
    };
    let escape = s.contains_key("x-kubernetes-int-or-string") || s.contains_key("x-kubernetes-preserve-unknown-fields");
    if !s.contains_key("type") && !escape {
        out.push(format!("{path}: no type"));
    }
    for junctor in ["anyOf", "allOf", "oneOf"] {
        for (i, member) in s
            .get(junctor)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            for banned in [
                "type",
                "additionalProperties",
                "default",
                "nullable",
                "description",
                "properties",
                "items",
            ] {
                let int_or_string =
                    junctor == "anyOf" && banned == "type" && s.contains_key("x-kubernetes-int-or-string");
                if member.get(banned).is_some() && !int_or_string {
                    out.push(format!(
                        "{path}.{junctor}[{i}]: {banned} is not allowed inside {junctor}"
                    ));
                }
            }
        }
    }
    if s.contains_key("properties") && s.contains_key("additionalProperties") {
        out.push(format!("{path}: properties and additionalProperties together"));
    }
    if s.get("type").and_then(Value::as_str) == Some("array") {
        match s.get("items") {
            Some(items) => structural_violations(items, &format!("{path}[]"), out),
            None => out.push(format!("{path}: array without items")),
        }
    }
    for (k, v) in s.get("properties").and_then(Value::as_object).into_iter().flatten() {
        structural_violations(v, &format!("{path}.{k}"), out);
    }
    if let Some(ap) = s.get("additionalProperties").filter(|v| v.is_object()) {
        structural_violations(ap, &format!("{path}.*"), out);
    }
}

fn crd_schemas() -> Vec<(String, Value)> {
    nodesmith::kubernetes::crds::crds()
        .into_iter()
        .map(|c| {
            let v = serde_json::to_value(&c.spec.versions[0].schema.as_ref().unwrap().open_api_v3_schema).unwrap();
            (c.spec.names.kind.clone(), v)
        })
        .collect()
}

#[test]
fn crd_schemas_are_structural() {
    for (kind, schema) in crd_schemas() {
        let mut v = Vec::new();
        structural_violations(&schema, &kind, &mut v);
        assert!(v.is_empty(), "{kind}: {v:#?}");
    }
    // The checker itself catches what it claims to.
    let mut v = Vec::new();
    structural_violations(
        &serde_json::json!({"type": "object", "properties": {"a": {}, "b": {"type": "array"}}}),
        "t",
        &mut v,
    );
    assert_eq!(
        v,
        vec!["t.a: no type".to_string(), "t.b: array without items".to_string()]
    );
}

/// Fields of `doc` the schema does not declare (the API server would prune them).
fn unknown_fields(doc: &Value, schema: &Value, path: &str, out: &mut Vec<String>) {
    if schema.get("x-kubernetes-preserve-unknown-fields").is_some() {
        return;
    }
    match doc {
        Value::Object(m) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let extra = schema.get("additionalProperties").filter(|a| a.is_object());
            for (k, v) in m {
                match (props.and_then(|p| p.get(k)), extra) {
                    (Some(s), _) => unknown_fields(v, s, &format!("{path}.{k}"), out),
                    (None, Some(s)) => unknown_fields(v, s, &format!("{path}.{k}"), out),
                    (None, None) => out.push(format!("{path}.{k}")),
                }
            }
        }
        Value::Array(a) => {
            if let Some(items) = schema.get("items") {
                for (i, v) in a.iter().enumerate() {
                    unknown_fields(v, items, &format!("{path}[{i}]"), out);
                }
            }
        }
        _ => {}
    }
}

#[test]
fn users_karpenter_manifests_use_only_fields_the_crds_declare() {
    let schemas = crd_schemas();
    let mut checked = 0;
    for entry in std::fs::read_dir(repo().join("examples")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        for doc in documents(&path) {
            let kind = doc["kind"].as_str().unwrap_or_default();
            let Some((_, schema)) = schemas.iter().find(|(k, _)| k == kind) else {
                continue;
            };
            let mut body = doc.clone();
            // apiVersion, kind and metadata are the API server's, not the schema's.
            for f in ["apiVersion", "kind", "metadata"] {
                body.as_object_mut().unwrap().remove(f);
            }
            let mut unknown = Vec::new();
            unknown_fields(&body, schema, kind, &mut unknown);
            assert!(unknown.is_empty(), "{}: {unknown:?}", path.display());
            checked += 1;
        }
    }
    assert!(
        checked >= 2,
        "expected NodePools and EC2NodeClasses among the examples, checked {checked}"
    );
    // A misspelt field is caught.
    let (_, np) = schemas.iter().find(|(k, _)| k == "NodePool").unwrap();
    let mut unknown = Vec::new();
    unknown_fields(
        &serde_json::json!({"spec": {"template": {"spec": {"nodeClasRef": {}}}}}),
        np,
        "NodePool",
        &mut unknown,
    );
    assert_eq!(unknown, vec!["NodePool.spec.template.spec.nodeClasRef".to_string()]);
}

fn rules(file: &str, role: &str) -> Vec<PolicyRule> {
    let doc = documents(&k8s_dir().join(file))
        .into_iter()
        .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == role)
        .unwrap_or_else(|| panic!("no ClusterRole {role} in {file}"));
    serde_json::from_value::<ClusterRole>(doc)
        .unwrap()
        .rules
        .unwrap_or_default()
}

fn grants(rules: &[PolicyRule]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for r in rules {
        for g in r.api_groups.iter().flatten() {
            for res in r.resources.iter().flatten() {
                for v in &r.verbs {
                    assert_ne!(v, "*", "no wildcard verbs");
                    assert_ne!(res, "*", "no wildcard resources");
                    out.insert(format!("{g}/{res}:{v}"));
                }
            }
        }
    }
    out
}

#[test]
fn rbac_grants_what_the_code_calls_and_no_more() {
    let forwarder = grants(&rules("forwarder.yaml", "nodesmith-forwarder"));
    assert_eq!(
        forwarder,
        ["/nodes:list", "/nodes:watch", "/pods:list", "/pods:watch"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    );
    // Each function's own role: what it must have, and what it must not.
    let role = |f: &str| grants(&rules("lambda-rbac.yaml", &format!("nodesmith-{f}")));
    let snapshot = [
        "/nodes:list",
        "/pods:list",
        "apps/daemonsets:list",
        "policy/poddisruptionbudgets:list",
        "/persistentvolumes:list",
        "/persistentvolumeclaims:list",
        "storage.k8s.io/storageclasses:list",
        "karpenter.sh/nodepools:list",
        "karpenter.k8s.aws/ec2nodeclasses:list",
        "/events:create",
    ];
    // interrupt and the sweep drain; at the deadline they delete the pods a PDB still holds.
    let drains = [
        "/nodes:get",
        "/nodes:patch",
        "/nodes:delete",
        "/pods:delete",
        "/pods/eviction:create",
    ];
    // Registration of a joining Node (provision, on the forwarder's report).
    let registration = ["/nodes:get", "/nodes:patch"];
    for (f, needed, never) in [
        (
            "provision",
            [snapshot.as_slice(), &registration].concat(),
            vec!["/nodes:delete", "/pods:delete", "/pods/eviction:create"],
        ),
        (
            "launch",
            // launch reads the class its claim names (never one from the message).
            vec!["karpenter.k8s.aws/ec2nodeclasses:get", "/events:create"],
            [drains.as_slice(), &["/pods:list", "/nodes:list"]].concat(),
        ),
        (
            "interrupt",
            [snapshot.as_slice(), &drains].concat(),
            vec![
                "karpenter.k8s.aws/ec2nodeclasses/status:update",
                "karpenter.sh/nodeclaims:create",
            ],
        ),
        (
            "sweep",
            [
                snapshot.as_slice(),
                &drains,
                &[
                    "karpenter.k8s.aws/ec2nodeclasses/status:update",
                    "karpenter.sh/nodeclaims:create",
                    "karpenter.sh/nodeclaims:delete",
                    "karpenter.sh/nodeclaims/status:update",
                    "karpenter.sh/nodepools/status:update",
                ],
            ]
            .concat(),
            vec!["karpenter.sh/nodepools:update", "karpenter.sh/nodepools:patch"],
        ),
    ] {
        let granted = role(f);
        for n in needed {
            assert!(granted.contains(n), "nodesmith-{f} lacks {n}");
        }
        for n in never.iter().chain(&[
            "/pods:create",
            "/nodes:create",
            "/secrets:get",
            "/secrets:list",
            "/pods:patch",
            "karpenter.k8s.aws/ec2nodeclasses:update",
            "karpenter.k8s.aws/ec2nodeclasses:patch",
        ]) {
            assert!(!granted.contains(*n), "nodesmith-{f} must not have {n}");
        }
    }
}

#[test]
fn the_forwarder_deployment_is_small_and_locked_down() {
    let doc = documents(&k8s_dir().join("forwarder.yaml"))
        .into_iter()
        .find(|d| d["kind"] == "Deployment")
        .unwrap();
    let d: Deployment = serde_json::from_value(doc).unwrap();
    let spec = d.spec.unwrap();
    assert_eq!(spec.replicas, Some(1));
    let pod = spec.template.spec.unwrap();
    let c = &pod.containers[0];
    let req = c.resources.as_ref().unwrap().requests.as_ref().unwrap();
    assert_eq!(req["cpu"].0, "10m");
    assert_eq!(req["memory"].0, "64Mi");
    // Above the 61 MiB a 20,000-pod burst took it to (docs/scale.md).
    let limits = c.resources.as_ref().unwrap().limits.as_ref().unwrap();
    assert_eq!(limits["memory"].0, "128Mi");
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(pod.service_account_name.as_deref(), Some("nodesmith-forwarder"));
    let probes = [c.liveness_probe.as_ref(), c.readiness_probe.as_ref()];
    let paths: Vec<&str> = probes
        .iter()
        .map(|p| p.unwrap().http_get.as_ref().unwrap().path.as_deref().unwrap())
        .collect();
    assert_eq!(paths, vec!["/healthz", "/readyz"]);
    // It runs while nodesmith's nodes come and go: high priority, never on one of them.
    assert_eq!(pod.priority_class_name.as_deref(), Some("system-cluster-critical"));
    let terms = &pod
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref())
        .expect("a required node affinity")
        .node_selector_terms;
    assert!(!terms.is_empty());
    for t in terms {
        let e = t.match_expressions.as_deref().unwrap_or_default();
        assert!(
            e.iter()
                .any(|e| e.key == "karpenter.sh/nodepool" && e.operator == "DoesNotExist"),
            "every term keeps it off nodes with karpenter.sh/nodepool: {t:?}"
        );
    }
}

/// The image's build context (the repository root) leaves out the build
/// outputs, the venvs and git's history: gigabytes a `docker build` would send.
#[test]
fn the_forwarder_images_build_context_leaves_out_builds_and_venvs() {
    let ignore = std::fs::read_to_string(repo().join(".dockerignore")).unwrap();
    let lines: Vec<&str> = ignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    for want in ["target/", ".venv/", ".venv-*/", ".git/"] {
        assert!(lines.contains(&want), ".dockerignore lacks {want}");
    }
    // Every workspace member stays in (cargo reads their manifests).
    for member in ["shared", "functions", "tests", "infra"] {
        assert!(
            !lines.iter().any(|l| l.trim_end_matches('/') == member),
            "{member} is ignored"
        );
    }
    let dockerfile = std::fs::read_to_string(repo().join("infra/forwarder/Dockerfile")).unwrap();
    assert!(dockerfile.contains("--locked"), "the image builds what Cargo.lock pins");
}
