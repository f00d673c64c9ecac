//! Resource lists (cpu, memory, pods, extended resources) and their arithmetic.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use serde::{Deserialize, Serialize};

use crate::quantity::{Quantity, QuantityError};

/// The resource name for CPU.
pub const CPU: &str = "cpu";
/// The resource name for memory.
pub const MEMORY: &str = "memory";
/// The resource name for the pod count.
pub const PODS: &str = "pods";
/// The resource name for node-local ephemeral storage.
pub const EPHEMERAL_STORAGE: &str = "ephemeral-storage";
/// The resource name for NVIDIA GPUs.
pub const NVIDIA_GPU: &str = "nvidia.com/gpu";
/// The resource name for AMD GPUs.
pub const AMD_GPU: &str = "amd.com/gpu";
/// The resource name for AWS Neuron devices.
pub const AWS_NEURON: &str = "aws.amazon.com/neuron";
/// The resource name for AWS Neuron cores.
pub const AWS_NEURON_CORE: &str = "aws.amazon.com/neuroncore";
/// The resource name for Habana Gaudi accelerators.
pub const HABANA_GAUDI: &str = "habana.ai/gaudi";
/// The resource name for EFA interfaces.
pub const AWS_EFA: &str = "vpc.amazonaws.com/efa";

/// A map from resource name to quantity, ordered for deterministic output.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(transparent)]
pub struct Resources(pub BTreeMap<String, Quantity>);

impl Resources {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    /// Builds a list from (name, quantity) pairs.
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, Quantity)>) -> Self {
        Resources(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    }

    /// Parses a Kubernetes resource list ({"cpu": "100m", ...}).
    pub fn parse<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<Self, QuantityError> {
        let mut r = Resources::new();
        for (k, v) in pairs {
            r.0.insert(k.to_string(), Quantity::parse(v)?);
        }
        Ok(r)
    }

    /// The quantity of one resource, zero when absent.
    pub fn get(&self, name: &str) -> Quantity {
        self.0.get(name).copied().unwrap_or_default()
    }

    /// Sets one resource.
    pub fn set(&mut self, name: &str, q: Quantity) {
        self.0.insert(name.to_string(), q);
    }

    /// Adds `other` into `self`, resource by resource.
    pub fn add(&mut self, other: &Resources) {
        for (k, v) in &other.0 {
            let e = self.0.entry(k.clone()).or_default();
            *e = e.saturating_add(*v);
        }
    }

    /// The sum of two lists.
    pub fn plus(&self, other: &Resources) -> Resources {
        let mut r = self.clone();
        r.add(other);
        r
    }

    /// `self - other`, resource by resource (may go negative).
    pub fn minus(&self, other: &Resources) -> Resources {
        let mut r = self.clone();
        for (k, v) in &other.0 {
            let e = r.0.entry(k.clone()).or_default();
            *e = e.saturating_sub(*v);
        }
        r
    }

    /// The element-wise maximum.
    pub fn max(&self, other: &Resources) -> Resources {
        let mut r = self.clone();
        for (k, v) in &other.0 {
            let e = r.0.entry(k.clone()).or_default();
            if *v > *e {
                *e = *v;
            }
        }
        r
    }

    /// True when every resource requested is available in `capacity`
    /// (a resource that capacity lacks counts as zero).
    pub fn fits_in(&self, capacity: &Resources) -> bool {
        self.0
            .iter()
            .all(|(k, v)| *v <= Quantity::ZERO || *v <= capacity.get(k))
    }

    /// The first resource that does not fit, for error messages.
    pub fn first_exceeding(&self, capacity: &Resources) -> Option<(&str, Quantity, Quantity)> {
        self.0
            .iter()
            .find(|(k, v)| **v > Quantity::ZERO && **v > capacity.get(k))
            .map(|(k, v)| (k.as_str(), *v, capacity.get(k)))
    }

    /// True when no resource is positive.
    pub fn is_zero(&self) -> bool {
        self.0.values().all(|v| *v <= Quantity::ZERO)
    }

    /// Renders as Kubernetes strings ("1930m", "6903Mi").
    pub fn to_k8s_strings(&self) -> BTreeMap<String, String> {
        self.0.iter().map(|(k, v)| (k.clone(), v.to_k8s_string(k))).collect()
    }
}

/// A quantity in a pod's spec that does not parse, and the field it is in.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{path}: {source}")]
pub struct FieldError {
    /// Field path inside the pod, e.g. `spec.containers[0].resources.requests.cpu`.
    pub path: String,
    /// Why it does not parse.
    #[source]
    pub source: QuantityError,
}

/// Reads a Kubernetes quantity, the field at `path`.
pub fn field(q: &K8sQuantity, path: &str) -> Result<Quantity, FieldError> {
    Quantity::parse(&q.0).map_err(|source| FieldError {
        path: path.into(),
        source,
    })
}

/// Reads a Kubernetes resource list at `path`.
pub fn from_k8s(list: Option<&BTreeMap<String, K8sQuantity>>, path: &str) -> Result<Resources, FieldError> {
    let mut r = Resources::new();
    for (k, v) in list.into_iter().flatten() {
        // The key joins the path only on error: this reads every pod's resources.
        let q = field(v, path).map_err(|e| FieldError {
            path: format!("{}.{k}", e.path),
            source: e.source,
        })?;
        r.set(k, q);
    }
    Ok(r)
}

/// Requests, each resource defaulting to its limit where only a limit is
/// set (containers and pod-level resources alike).
fn requests_of(res: Option<&ResourceRequirements>, path: &str) -> Result<Resources, FieldError> {
    let mut req = from_k8s(
        res.and_then(|r| r.requests.as_ref()),
        &format!("{path}.resources.requests"),
    )?;
    let limits = from_k8s(res.and_then(|r| r.limits.as_ref()), &format!("{path}.resources.limits"))?;
    for (k, v) in limits.0 {
        req.0.entry(k).or_insert(v);
    }
    Ok(req)
}

/// What a pod's containers ask for together, as Kubernetes counts it:
/// max(each init container plus the sidecars started before it, containers
/// plus all sidecars), where pod-level `spec.resources` (Kubernetes 1.32+)
/// replace that for the resources they set. Overhead and the pod's slot are
/// not in it.
pub fn container_total(spec: &PodSpec, path: &str) -> Result<Resources, FieldError> {
    let mut sum = Resources::new();
    for (i, c) in spec.containers.iter().enumerate() {
        sum.add(&requests_of(c.resources.as_ref(), &format!("{path}.containers[{i}]"))?);
    }
    let mut sidecars = Resources::new();
    let mut init_max = Resources::new();
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        let req = requests_of(c.resources.as_ref(), &format!("{path}.initContainers[{i}]"))?;
        if c.restart_policy.as_deref() == Some("Always") {
            sum.add(&req);
            sidecars.add(&req);
            init_max = init_max.max(&sidecars);
        } else {
            init_max = init_max.max(&req.plus(&sidecars));
        }
    }
    let mut total = sum.max(&init_max);
    for (k, v) in requests_of(spec.resources.as_ref(), path)?.0 {
        total.set(&k, v);
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_and_fit() {
        let a = Resources::parse([("cpu", "500m"), ("memory", "1Gi")]).unwrap();
        let b = Resources::parse([("cpu", "1"), ("nvidia.com/gpu", "1")]).unwrap();
        let sum = a.plus(&b);
        assert_eq!(sum.get(CPU), Quantity::from_milli(1500));
        assert_eq!(sum.get(NVIDIA_GPU), Quantity::from_units(1));
        assert!(a.fits_in(&sum));
        assert!(!sum.fits_in(&a));
        assert_eq!(sum.first_exceeding(&a).map(|x| x.0), Some("cpu"));
        assert_eq!(a.max(&b).get(CPU), Quantity::from_units(1));
        assert_eq!(
            sum.minus(&b),
            a.plus(&Resources::parse([("cpu", "0"), ("nvidia.com/gpu", "0")]).unwrap())
        );
    }

    /// A quantity that does not parse is named by its field, wherever it is.
    #[test]
    fn a_bad_quantity_names_its_field() {
        let cases = [
            (
                serde_json::json!({"containers": [{"name": "a", "resources": {"limits": {"cpu": "x"}}}]}),
                "spec.containers[0].resources.limits.cpu",
            ),
            (
                serde_json::json!({"containers": [], "initContainers": [{"name": "i", "resources": {"requests": {"memory": "1Zi"}}}]}),
                "spec.initContainers[0].resources.requests.memory",
            ),
            (
                serde_json::json!({"containers": [], "resources": {"requests": {"cpu": "two"}}}),
                "spec.resources.requests.cpu",
            ),
        ];
        for (spec, path) in cases {
            let spec: PodSpec = serde_json::from_value(spec).unwrap();
            assert_eq!(container_total(&spec, "spec").unwrap_err().path, path);
        }
    }
}
