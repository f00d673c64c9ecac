//! Reading Kubernetes manifests (multi-document YAML) into typed objects, with
//! errors that name the file, the document index and the field path.

use std::path::{Path as FsPath, PathBuf};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::StorageClass;
use serde::de::DeserializeOwned;

use super::{EC2NodeClass, NodePool};

/// One recognised Kubernetes object.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // short-lived: read and matched at once; boxing only adds indirection
pub enum Object {
    /// karpenter.sh/v1 NodePool.
    NodePool(NodePool),
    /// karpenter.k8s.aws/v1 EC2NodeClass.
    EC2NodeClass(EC2NodeClass),
    /// v1 Pod.
    Pod(Pod),
    /// apps/v1 Deployment.
    Deployment(Deployment),
    /// apps/v1 ReplicaSet.
    ReplicaSet(ReplicaSet),
    /// apps/v1 StatefulSet.
    StatefulSet(StatefulSet),
    /// batch/v1 Job.
    Job(Job),
    /// apps/v1 DaemonSet.
    DaemonSet(DaemonSet),
    /// v1 Node.
    Node(Node),
    /// policy/v1 PodDisruptionBudget.
    PodDisruptionBudget(PodDisruptionBudget),
    /// v1 PersistentVolume.
    PersistentVolume(PersistentVolume),
    /// v1 PersistentVolumeClaim.
    PersistentVolumeClaim(PersistentVolumeClaim),
    /// storage.k8s.io/v1 StorageClass.
    StorageClass(StorageClass),
    /// v1 Namespace (its labels, for pod affinity namespaceSelectors).
    Namespace(Namespace),
}

/// A parsed document and where it came from.
#[derive(Debug, Clone)]
pub struct Document {
    /// The file it was read from.
    pub file: String,
    /// Its index among the file's documents (from 0).
    pub index: usize,
    /// The object.
    pub object: Object,
}

/// Bad input: which file, which document, which field, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: document {index}{}: {message}", if path.is_empty() { String::new() } else { format!(": {path}") })]
pub struct ManifestError {
    /// The file.
    pub file: String,
    /// The document index (from 0).
    pub index: usize,
    /// The field path, empty when the whole document is at fault.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

/// A document that was read but not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// The file.
    pub file: String,
    /// The document index.
    pub index: usize,
    /// What was skipped and why.
    pub message: String,
}

/// Parses every document of one YAML text. Unknown kinds become warnings.
pub fn parse_documents(file: &str, text: &str) -> Result<(Vec<Document>, Vec<Warning>), ManifestError> {
    let mut docs = Vec::new();
    let mut warnings = Vec::new();
    for (index, de) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let err = |path: String, message: String| ManifestError {
            file: file.to_string(),
            index,
            path,
            message,
        };
        let value: serde_json::Value = match serde_path_to_error::deserialize(de) {
            Ok(v) => v,
            Err(e) => return Err(err(path_of(e.path()), format!("invalid YAML: {}", e.inner()))),
        };
        if value.is_null() {
            continue;
        }
        let api_version = value
            .get("apiVersion")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string();
        let kind = value
            .get("kind")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string();
        if kind.is_empty() {
            return Err(err("kind".into(), "is required".into()));
        }
        if api_version.is_empty() {
            return Err(err("apiVersion".into(), "is required".into()));
        }
        let object = match (api_version.as_str(), kind.as_str()) {
            ("karpenter.sh/v1", "NodePool") => {
                let np: NodePool = strict(value).map_err(|(p, m)| err(p, m))?;
                np.validate().map_err(|e| validation_error(file, index, e))?;
                Object::NodePool(np)
            }
            ("karpenter.k8s.aws/v1", "EC2NodeClass") => {
                let nc: EC2NodeClass = strict(value).map_err(|(p, m)| err(p, m))?;
                nc.validate().map_err(|e| validation_error(file, index, e))?;
                Object::EC2NodeClass(nc)
            }
            ("v1", "Pod") => {
                let pod: Pod = typed(value).map_err(|(p, m)| err(p, m))?;
                check_pod_spec(pod.spec.as_ref(), "spec").map_err(|(p, m)| err(p, m))?;
                Object::Pod(pod)
            }
            ("apps/v1", "Deployment") => {
                let o: Deployment = typed(value).map_err(|(p, m)| err(p, m))?;
                check_pod_spec(
                    o.spec.as_ref().and_then(|s| s.template.spec.as_ref()),
                    "spec.template.spec",
                )
                .map_err(|(p, m)| err(p, m))?;
                Object::Deployment(o)
            }
            ("apps/v1", "ReplicaSet") => {
                let o: ReplicaSet = typed(value).map_err(|(p, m)| err(p, m))?;
                check_pod_spec(
                    o.spec
                        .as_ref()
                        .and_then(|s| s.template.as_ref())
                        .and_then(|t| t.spec.as_ref()),
                    "spec.template.spec",
                )
                .map_err(|(p, m)| err(p, m))?;
                Object::ReplicaSet(o)
            }
            ("apps/v1", "StatefulSet") => {
                let o: StatefulSet = typed(value).map_err(|(p, m)| err(p, m))?;
                check_pod_spec(
                    o.spec.as_ref().and_then(|s| s.template.spec.as_ref()),
                    "spec.template.spec",
                )
                .map_err(|(p, m)| err(p, m))?;
                Object::StatefulSet(o)
            }
            ("batch/v1", "Job") => {
                let o: Job = typed(value).map_err(|(p, m)| err(p, m))?;
                check_pod_spec(
                    o.spec.as_ref().and_then(|s| s.template.spec.as_ref()),
                    "spec.template.spec",
                )
                .map_err(|(p, m)| err(p, m))?;
                Object::Job(o)
            }
            ("apps/v1", "DaemonSet") => {
                let o: DaemonSet = typed(value).map_err(|(p, m)| err(p, m))?;
                check_pod_spec(
                    o.spec.as_ref().and_then(|s| s.template.spec.as_ref()),
                    "spec.template.spec",
                )
                .map_err(|(p, m)| err(p, m))?;
                Object::DaemonSet(o)
            }
            ("v1", "Node") => {
                let node: Node = typed(value).map_err(|(p, m)| err(p, m))?;
                let status = node.status.as_ref();
                for (field, list) in [
                    ("capacity", status.and_then(|s| s.capacity.as_ref())),
                    ("allocatable", status.and_then(|s| s.allocatable.as_ref())),
                ] {
                    check_quantities(list, &format!("status.{field}")).map_err(|(p, m)| err(p, m))?;
                }
                Object::Node(node)
            }
            ("policy/v1", "PodDisruptionBudget") => {
                Object::PodDisruptionBudget(typed(value).map_err(|(p, m)| err(p, m))?)
            }
            ("v1", "PersistentVolume") => Object::PersistentVolume(typed(value).map_err(|(p, m)| err(p, m))?),
            ("v1", "PersistentVolumeClaim") => Object::PersistentVolumeClaim(typed(value).map_err(|(p, m)| err(p, m))?),
            ("storage.k8s.io/v1", "StorageClass") => Object::StorageClass(typed(value).map_err(|(p, m)| err(p, m))?),
            ("v1", "Namespace") => Object::Namespace(typed(value).map_err(|(p, m)| err(p, m))?),
            (av, k) if (k == "NodePool" || k == "EC2NodeClass") && av.starts_with("karpenter") => {
                return Err(err(
                    "apiVersion".into(),
                    format!("{av} is not supported for {k}: use the v1 API"),
                ));
            }
            (av, k) => {
                warnings.push(Warning {
                    file: file.to_string(),
                    index,
                    message: format!("ignoring {av} {k}"),
                });
                continue;
            }
        };
        docs.push(Document {
            file: file.to_string(),
            index,
            object,
        });
    }
    Ok((docs, warnings))
}

fn validation_error(file: &str, index: usize, e: super::Errors) -> ManifestError {
    let first = e.fields.first().cloned();
    ManifestError {
        file: file.to_string(),
        index,
        path: first.as_ref().map(|f| f.path.clone()).unwrap_or_default(),
        message: format!(
            "{} {:?}: {}",
            e.kind,
            e.name,
            e.fields
                .iter()
                .map(|f| if Some(f) == first.as_ref() {
                    f.message.clone()
                } else {
                    format!("{}: {}", f.path, f.message)
                })
                .collect::<Vec<_>>()
                .join("; ")
        ),
    }
}

/// Rejects resource quantities Kubernetes would reject, naming the field.
fn check_pod_spec(spec: Option<&k8s_openapi::api::core::v1::PodSpec>, at: &str) -> Result<(), (String, String)> {
    let Some(spec) = spec else { return Ok(()) };
    let none = Vec::new();
    let lists = [
        ("containers", &spec.containers),
        ("initContainers", spec.init_containers.as_ref().unwrap_or(&none)),
    ];
    for (field, containers) in lists {
        for (i, c) in containers.iter().enumerate() {
            let r = c.resources.as_ref();
            for (kind, list) in [
                ("requests", r.and_then(|r| r.requests.as_ref())),
                ("limits", r.and_then(|r| r.limits.as_ref())),
            ] {
                check_quantities(list, &format!("{at}.{field}[{i}].resources.{kind}"))?;
            }
        }
    }
    check_quantities(spec.overhead.as_ref(), &format!("{at}.overhead"))
}

fn check_quantities(
    list: Option<&std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
    at: &str,
) -> Result<(), (String, String)> {
    for (name, q) in list.into_iter().flatten() {
        if let Err(e) = crate::quantity::Quantity::parse(&q.0) {
            return Err((format!("{at}.{name}"), e.to_string()));
        }
    }
    Ok(())
}

fn typed<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, (String, String)> {
    serde_path_to_error::deserialize(value).map_err(|e| (path_of(e.path()), e.inner().to_string()))
}

/// Like [`typed`], but an unknown field is an error, as the API server's
/// strict field validation makes it: a misspelt `requirments` must not
/// silently give a pool with no requirements.
fn strict<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, (String, String)> {
    let mut unknown = None;
    let mut track = serde_path_to_error::Track::new();
    let de = serde_path_to_error::Deserializer::new(value, &mut track);
    let parsed = serde_ignored::deserialize(de, |path| {
        let path = bracket_indices(&path.to_string());
        let top_level = matches!(path.as_str(), "apiVersion" | "kind");
        if !top_level && !path.starts_with("metadata.") && !path.starts_with("status.") {
            unknown.get_or_insert(path);
        }
    });
    match (parsed, unknown) {
        (Err(e), _) => Err((path_of(&track.path()), e.to_string())),
        (Ok(_), Some(path)) => {
            let field = path.rsplit('.').next().unwrap_or(&path).to_string();
            Err((path, format!("unknown field {field:?}")))
        }
        (Ok(v), None) => Ok(v),
    }
}

/// `a.0.b` → `a[0].b`, the notation of the other errors.
fn bracket_indices(path: &str) -> String {
    let mut out = String::new();
    for seg in path.split('.').filter(|s| *s != "?") {
        if !seg.is_empty() && seg.bytes().all(|c| c.is_ascii_digit()) {
            out.push_str(&format!("[{seg}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(seg);
        }
    }
    out
}

fn path_of(p: &serde_path_to_error::Path) -> String {
    let s = p.to_string();
    if s == "." { String::new() } else { s }
}

/// Reads YAML files and directories (recursively, `*.yaml`/`*.yml`, sorted).
pub fn load_paths(paths: &[PathBuf]) -> Result<(Vec<Document>, Vec<Warning>), ManifestError> {
    let mut files = Vec::new();
    for p in paths {
        collect(p, &mut files).map_err(|message| ManifestError {
            file: p.display().to_string(),
            index: 0,
            path: String::new(),
            message,
        })?;
    }
    let mut docs = Vec::new();
    let mut warnings = Vec::new();
    for f in files {
        let name = f.display().to_string();
        let text = std::fs::read_to_string(&f).map_err(|e| ManifestError {
            file: name.clone(),
            index: 0,
            path: String::new(),
            message: format!("cannot read: {e}"),
        })?;
        let (d, w) = parse_documents(&name, &text)?;
        docs.extend(d);
        warnings.extend(w);
    }
    Ok((docs, warnings))
}

fn collect(p: &FsPath, out: &mut Vec<PathBuf>) -> Result<(), String> {
    let meta = std::fs::metadata(p).map_err(|e| format!("cannot read: {e}"))?;
    if meta.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(p)
            .map_err(|e| format!("cannot read directory: {e}"))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        entries.sort();
        for e in entries {
            if e.is_dir() {
                collect(&e, out)?;
            } else if e.extension().is_some_and(|x| x == "yaml" || x == "yml") {
                out.push(e);
            }
        }
    } else {
        out.push(p.to_path_buf());
    }
    Ok(())
}
