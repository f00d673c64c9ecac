//! A snapshot from manifests (`nodesmith simulate`): workloads expand into
//! pods named `<name>-<i>`, pods with `spec.nodeName` run on that node, and
//! DaemonSet pods are added to the existing nodes they fit.

use std::collections::BTreeMap;
use std::sync::Arc;

use jiff::Timestamp;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::Snapshot;
use crate::apis::manifest::{Document, ManifestError, Object, Warning};
use crate::catalog::Catalog;
use crate::scheduling::ExistingNode;
use crate::scheduling::daemonset::daemon_pod;
use crate::scheduling::pod::{PodModel, tolerates_all};

fn pods_from_template(meta: &ObjectMeta, template: &PodTemplateSpec, count: i32) -> Vec<Pod> {
    let name = meta.name.clone().unwrap_or_default();
    let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
    (0..count.max(0))
        .map(|i| {
            let mut m = template.metadata.clone().unwrap_or_default();
            m.name = Some(format!("{name}-{i}"));
            m.namespace = Some(namespace.clone());
            Pod {
                metadata: m,
                spec: template.spec.clone(),
                status: None,
            }
        })
        .collect()
}

fn err(doc: &Document, path: String, message: String) -> ManifestError {
    ManifestError {
        file: doc.file.clone(),
        index: doc.index,
        path,
        message,
    }
}

/// Checks that the solver can model a pod, naming the field when not.
fn check(doc: &Document, pod: &Pod, prefix: &str) -> Result<(), ManifestError> {
    PodModel::from_pod(pod)
        .map(|_| ())
        .map_err(|e| err(doc, format!("{prefix}{}", e.path), e.message))
}

impl Snapshot {
    /// Builds a snapshot at `now` from manifest documents; bad pod specs are
    /// errors naming file, document and field.
    pub fn from_manifests(
        docs: &[Document],
        catalog: Arc<Catalog>,
        now: Timestamp,
        warnings: &mut Vec<Warning>,
    ) -> Result<Self, ManifestError> {
        let mut s = Snapshot::new(catalog, now);
        let mut bound: Vec<(&Document, Pod)> = Vec::new();
        for d in docs {
            let expanded: Vec<Pod> = match &d.object {
                Object::NodePool(p) => {
                    s.node_pools.push(p.clone());
                    continue;
                }
                Object::EC2NodeClass(c) => {
                    s.node_classes.push(c.clone());
                    continue;
                }
                Object::Pod(p) => {
                    check(d, p, "")?;
                    if p.spec
                        .as_ref()
                        .and_then(|s| s.node_name.as_deref())
                        .is_some_and(|n| !n.is_empty())
                    {
                        bound.push((d, p.clone()));
                        continue;
                    }
                    let mut p = p.clone();
                    p.metadata.namespace.get_or_insert_with(|| "default".into());
                    vec![p]
                }
                Object::Deployment(x) => x
                    .spec
                    .as_ref()
                    .map(|sp| pods_from_template(&x.metadata, &sp.template, sp.replicas.unwrap_or(1)))
                    .unwrap_or_default(),
                Object::ReplicaSet(x) => x
                    .spec
                    .as_ref()
                    .and_then(|sp| {
                        sp.template
                            .as_ref()
                            .map(|t| pods_from_template(&x.metadata, t, sp.replicas.unwrap_or(1)))
                    })
                    .unwrap_or_default(),
                Object::StatefulSet(x) => {
                    let Some(sp) = x.spec.as_ref() else { continue };
                    let mut pods = pods_from_template(&x.metadata, &sp.template, sp.replicas.unwrap_or(1));
                    let set = x.metadata.name.clone().unwrap_or_default();
                    let ns = x.metadata.namespace.clone().unwrap_or_else(|| "default".into());
                    for (i, p) in pods.iter_mut().enumerate() {
                        for t in sp.volume_claim_templates.iter().flatten() {
                            let tmpl = t.metadata.name.clone().unwrap_or_default();
                            let claim = format!("{tmpl}-{set}-{i}");
                            if let Some(spec) = p.spec.as_mut() {
                                spec.volumes
                                    .get_or_insert_with(Vec::new)
                                    .push(k8s_openapi::api::core::v1::Volume {
                                        name: tmpl.clone(),
                                        persistent_volume_claim: Some(
                                            k8s_openapi::api::core::v1::PersistentVolumeClaimVolumeSource {
                                                claim_name: claim.clone(),
                                                read_only: None,
                                            },
                                        ),
                                        ..Default::default()
                                    });
                            }
                            let exists = s.persistent_volume_claims.iter().any(|c| {
                                c.metadata.name.as_deref() == Some(claim.as_str())
                                    && c.metadata.namespace.as_deref().unwrap_or("default") == ns
                            });
                            if !exists {
                                s.persistent_volume_claims.push(PersistentVolumeClaim {
                                    metadata: ObjectMeta {
                                        name: Some(claim),
                                        namespace: Some(ns.clone()),
                                        ..Default::default()
                                    },
                                    spec: t.spec.clone(),
                                    status: None,
                                });
                            }
                        }
                    }
                    pods
                }
                Object::Job(x) => x
                    .spec
                    .as_ref()
                    .map(|sp| pods_from_template(&x.metadata, &sp.template, sp.parallelism.unwrap_or(1)))
                    .unwrap_or_default(),
                Object::DaemonSet(x) => {
                    if let Some(p) = daemon_pod(x) {
                        check(d, &p, "spec.template.")?;
                    }
                    s.daemon_sets.push(x.clone());
                    continue;
                }
                Object::Node(n) => {
                    s.nodes.push(ExistingNode {
                        node: n.clone(),
                        pods: vec![],
                    });
                    continue;
                }
                Object::PodDisruptionBudget(b) => {
                    let mut b = b.clone();
                    b.metadata.namespace.get_or_insert_with(|| "default".into());
                    s.pod_disruption_budgets.push(b);
                    continue;
                }
                Object::PersistentVolume(v) => {
                    s.persistent_volumes.push(v.clone());
                    continue;
                }
                Object::PersistentVolumeClaim(c) => {
                    let mut c = c.clone();
                    c.metadata.namespace.get_or_insert_with(|| "default".into());
                    // A claim template expanded earlier is replaced by the real claim.
                    s.persistent_volume_claims.retain(|o| {
                        !(o.metadata.name == c.metadata.name && o.metadata.namespace == c.metadata.namespace)
                    });
                    s.persistent_volume_claims.push(c);
                    continue;
                }
                Object::StorageClass(c) => {
                    s.storage_classes.push(c.clone());
                    continue;
                }
                Object::Namespace(n) => {
                    s.namespaces.push(n.clone());
                    continue;
                }
            };
            if let Some(first) = expanded.first() {
                check(d, first, "spec.template.")?;
            }
            s.pods.extend(expanded);
        }
        let index: BTreeMap<String, usize> = s
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.node.metadata.name.clone().unwrap_or_default(), i))
            .collect();
        for (d, p) in bound {
            let node = p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
            match index.get(&node) {
                Some(i) => s.nodes[*i].pods.push(p),
                None => warnings.push(Warning {
                    file: d.file.clone(),
                    index: d.index,
                    message: format!("pod bound to unknown node {node:?} ignored"),
                }),
            }
        }
        s.add_daemon_pods();
        Ok(s)
    }

    /// Puts each DaemonSet's pod on every existing node it fits (labels and
    /// taints) unless one of its pods already runs there.
    fn add_daemon_pods(&mut self) {
        for ds in &self.daemon_sets {
            let Some(pod) = daemon_pod(ds) else { continue };
            let Ok(model) = PodModel::from_pod(&pod) else { continue };
            let ds_name = ds.metadata.name.clone().unwrap_or_default();
            for n in &mut self.nodes {
                let labels = n.node.metadata.labels.clone().unwrap_or_default();
                let taints: Vec<_> = n
                    .node
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .into_iter()
                    .flatten()
                    .filter_map(crate::apis::Taint::from_k8s)
                    .collect();
                let runs = n.pods.iter().any(|p| {
                    p.metadata
                        .owner_references
                        .iter()
                        .flatten()
                        .any(|o| o.kind == "DaemonSet" && o.name == ds_name)
                });
                if runs
                    || tolerates_all(&model.tolerations, &taints, true).is_err()
                    || !model.node_terms.iter().any(|t| t.matches_labels(&labels))
                {
                    continue;
                }
                let mut p = pod.clone();
                let node_name = n.node.metadata.name.clone().unwrap_or_default();
                p.metadata.name = Some(format!("{ds_name}-{node_name}"));
                // Owned by its DaemonSet, as the real one is: it never moves.
                p.metadata.owner_references = Some(vec![OwnerReference {
                    api_version: "apps/v1".into(),
                    kind: "DaemonSet".into(),
                    name: ds_name.clone(),
                    uid: ds.metadata.uid.clone().unwrap_or_default(),
                    controller: Some(true),
                    block_owner_deletion: None,
                }]);
                if let Some(spec) = p.spec.as_mut() {
                    spec.node_name = Some(node_name);
                }
                n.pods.push(p);
            }
        }
    }
}
