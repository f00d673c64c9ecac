//! Zonal volume topology: a pod that mounts a bound PersistentVolume must run
//! where the volume's node affinity allows; an unbound claim of a
//! `WaitForFirstConsumer` StorageClass must run where the class's
//! `allowedTopologies` allow. An unbound claim of an `Immediate` class (the
//! default mode) is bound by Kubernetes before the pod can be scheduled, in a
//! zone the provisioner picks: the pod waits for it and is not planned yet.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;

use super::pod::{PodModel, term_requirements};
use crate::requirements::{Requirement, Requirements};

/// The annotation that marks the default StorageClass.
pub const DEFAULT_CLASS_ANNOTATION: &str = "storageclass.kubernetes.io/is-default-class";

/// Volumes by name, for lookups while modelling pods.
#[derive(Debug, Default)]
pub struct Volumes<'a> {
    claims: HashMap<(String, String), &'a PersistentVolumeClaim>,
    volumes: HashMap<String, &'a PersistentVolume>,
    classes: HashMap<String, &'a StorageClass>,
    default_class: Option<&'a StorageClass>,
}

impl<'a> Volumes<'a> {
    /// Indexes the given objects.
    pub fn new(pvs: &'a [PersistentVolume], pvcs: &'a [PersistentVolumeClaim], scs: &'a [StorageClass]) -> Self {
        let name = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| m.name.clone().unwrap_or_default();
        Volumes {
            claims: pvcs
                .iter()
                .map(|c| {
                    (
                        (
                            c.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
                            name(&c.metadata),
                        ),
                        c,
                    )
                })
                .collect(),
            volumes: pvs.iter().map(|v| (name(&v.metadata), v)).collect(),
            classes: scs.iter().map(|s| (name(&s.metadata), s)).collect(),
            default_class: scs
                .iter()
                .filter(|s| {
                    s.metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION))
                        .is_some_and(|v| v == "true")
                })
                .min_by_key(|s| name(&s.metadata)),
        }
    }

    /// The node requirements (OR of terms) the pod's volumes impose; an empty
    /// list means none. Errors say which claim or volume is missing.
    pub fn requirements(&self, pod: &PodModel) -> Result<Vec<Requirements>, String> {
        let mut terms: Vec<Requirements> = vec![Requirements::new()];
        let mut constrained = false;
        for claim in &pod.claims {
            let pvc = self
                .claims
                .get(&(pod.pod.namespace.clone(), claim.clone()))
                .ok_or_else(|| format!("persistentvolumeclaim {}/{claim} not found", pod.pod.namespace))?;
            let spec = pvc.spec.as_ref();
            let or = match spec.and_then(|s| s.volume_name.as_deref()).filter(|v| !v.is_empty()) {
                Some(pv_name) => {
                    let pv = self.volumes.get(pv_name).ok_or_else(|| {
                        format!(
                            "persistentvolume {pv_name} (bound to {}/{claim}) not found",
                            pod.pod.namespace
                        )
                    })?;
                    volume_terms(pv)?
                }
                None => {
                    let class = spec.and_then(|s| s.storage_class_name.as_deref());
                    if let Some(sc) = self.class(class)?.filter(|sc| binds_immediately(sc)) {
                        return Err(format!(
                            "persistentvolumeclaim {}/{claim} is not bound yet (StorageClass {} binds Immediate)",
                            pod.pod.namespace,
                            sc.metadata.name.as_deref().unwrap_or_default()
                        ));
                    }
                    self.class_terms(class)?
                }
            };
            if let Some(or) = or {
                constrained = true;
                terms = cross(&terms, &or);
            }
        }
        for class in &pod.ephemeral_classes {
            if let Some(or) = self.class_terms(class.as_deref())? {
                constrained = true;
                terms = cross(&terms, &or);
            }
        }
        Ok(if constrained { terms } else { vec![] })
    }

    /// The StorageClass a claim names (the default one when it names none;
    /// none for `""`, which asks for no class).
    fn class(&self, name: Option<&str>) -> Result<Option<&'a StorageClass>, String> {
        Ok(match name {
            Some("") => None,
            Some(n) => Some(
                *self
                    .classes
                    .get(n)
                    .ok_or_else(|| format!("storageclass {n} not found"))?,
            ),
            None => self.default_class,
        })
    }

    fn class_terms(&self, name: Option<&str>) -> Result<Option<Vec<Requirements>>, String> {
        let sc = self.class(name)?;
        let Some(terms) = sc.and_then(|s| s.allowed_topologies.as_ref()).filter(|t| !t.is_empty()) else {
            return Ok(None);
        };
        let mut or = Vec::new();
        for t in terms {
            let mut r = Requirements::new();
            for e in t.match_label_expressions.iter().flatten() {
                r.add(Requirement::in_values(&e.key, &e.values));
            }
            or.push(r);
        }
        Ok(Some(or))
    }
}

/// True when the class binds its claims at once (`Immediate`, the default).
fn binds_immediately(sc: &StorageClass) -> bool {
    sc.volume_binding_mode.as_deref().is_none_or(|m| m == "Immediate")
}

fn volume_terms(pv: &PersistentVolume) -> Result<Option<Vec<Requirements>>, String> {
    let Some(sel) = pv
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
    else {
        return Ok(None);
    };
    let name = pv.metadata.name.clone().unwrap_or_default();
    let mut or = Vec::new();
    for (i, t) in sel.node_selector_terms.iter().enumerate() {
        or.push(
            term_requirements(
                t,
                &format!("persistentvolume {name} spec.nodeAffinity.required.nodeSelectorTerms[{i}]"),
            )
            .map_err(|e| e.to_string())?,
        );
    }
    Ok(if or.is_empty() { None } else { Some(or) })
}

/// Every combination of one term from `a` and one from `b` (AND of two ORs),
/// capped so a pathological input cannot explode.
pub fn cross(a: &[Requirements], b: &[Requirements]) -> Vec<Requirements> {
    let mut out = Vec::new();
    for x in a {
        for y in b {
            let mut r = x.clone();
            r.add_all(y);
            out.push(r);
            if out.len() >= 64 {
                return out;
            }
        }
    }
    out
}
