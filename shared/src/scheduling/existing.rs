//! Existing capacity: nodes already in the cluster and in-flight NodeClaims
//! (decided or launching). Pending pods go there first when they fit.

use std::collections::BTreeMap;

use super::dense::{ResourceTable, Vector};
use super::pod::{HostPort, quantity, tolerates_all};
use super::topology::NodeFilter;
use super::{ExistingNode, TargetKind};
use crate::apis::Taint;
use crate::catalog::InstanceType;
use crate::labels;
use crate::nodeclaim::NodeClaim;
use crate::resources::Resources;

/// An existing node or in-flight claim, compiled.
#[derive(Debug, Clone)]
pub struct Existing {
    /// Node or claim name.
    pub name: String,
    /// Node or claim.
    pub kind: TargetKind,
    /// Its hostname label (the name when absent).
    pub hostname: String,
    /// Labels (plus `metadata.name`, for matchFields).
    pub labels: BTreeMap<String, String>,
    /// Taints that repel pods (NoSchedule, NoExecute, PreferNoSchedule).
    pub taints: Vec<Taint>,
    /// What pods may use in total.
    pub avail: Vector,
    /// Capacity, for pool limits.
    pub capacity: Vector,
    /// What running pods already use.
    pub used: Vector,
    /// Host ports already bound.
    pub ports: Vec<HostPort>,
    /// Cordoned: takes no new pods.
    pub cordoned: bool,
    /// The NodePool it belongs to, if any.
    pub pool: Option<String>,
}

fn resources_of(list: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>) -> Resources {
    let mut r = Resources::new();
    for (k, v) in list.into_iter().flatten() {
        // An unreadable quantity on a live node is treated as absent: the node
        // then offers none of that resource, which is the safe side.
        if let Ok(q) = quantity(v, k) {
            r.set(k, q);
        }
    }
    r
}

impl Existing {
    /// Compiles a node with its running pods' usage left at zero (added later).
    pub fn from_node(n: &ExistingNode, res: &ResourceTable) -> Self {
        let name = n.node.metadata.name.clone().unwrap_or_default();
        let mut labels = n.node.metadata.labels.clone().unwrap_or_default();
        let hostname = labels.get(labels::HOSTNAME).cloned().unwrap_or_else(|| name.clone());
        labels
            .entry(labels::HOSTNAME.to_string())
            .or_insert_with(|| name.clone());
        labels.insert("metadata.name".to_string(), name.clone());
        let spec = n.node.spec.as_ref();
        let taints = spec
            .and_then(|s| s.taints.as_ref())
            .into_iter()
            .flatten()
            .filter_map(crate::apis::Taint::from_k8s)
            .collect();
        let status = n.node.status.as_ref();
        let alloc = resources_of(status.and_then(|s| s.allocatable.as_ref()));
        let mut capacity = resources_of(status.and_then(|s| s.capacity.as_ref()));
        if capacity.is_zero() {
            capacity = alloc.clone();
        }
        Existing {
            kind: TargetKind::Node,
            hostname,
            pool: labels.get(labels::NODEPOOL).cloned(),
            labels,
            taints,
            avail: res.vector(&alloc),
            capacity: res.vector(&capacity),
            used: res.zero(),
            ports: Vec::new(),
            cordoned: spec.and_then(|s| s.unschedulable).unwrap_or(false),
            name,
        }
    }

    /// Compiles an in-flight claim: its labels are what it pins (single-valued
    /// requirements and launch facts); its room is the smallest of its
    /// options' allocatable (or its launched type's) less what it reserved.
    pub fn from_claim(c: &NodeClaim, types: &[InstanceType], res: &ResourceTable) -> Self {
        let reqs = c.requirements();
        let mut labels = reqs.single_valued_labels();
        labels.extend(c.labels.clone());
        let options: Vec<&InstanceType> = match &c.instance_type {
            Some(t) => types.iter().filter(|it| &it.name == t).collect(),
            None => types
                .iter()
                .filter(|it| c.instance_type_options.contains(&it.name))
                .collect(),
        };
        if let [only] = options.as_slice() {
            labels.extend(only.labels.clone());
            labels.insert(labels::INSTANCE_TYPE.to_string(), only.name.clone());
        }
        if let Some(z) = &c.zone {
            labels.insert(labels::ZONE.to_string(), z.clone());
        }
        if let Some(ct) = &c.capacity_type {
            labels.insert(labels::CAPACITY_TYPE.to_string(), ct.clone());
        }
        labels.insert(labels::NODEPOOL.to_string(), c.node_pool.clone());
        let hostname = c.node_name.clone().unwrap_or_else(|| c.name.clone());
        labels.insert(labels::HOSTNAME.to_string(), hostname.clone());
        let mut avail: Option<Vector> = None;
        let mut capacity = res.zero();
        for t in &options {
            let a = res.vector(&t.allocatable);
            avail = Some(match avail {
                None => a,
                Some(cur) => cur.iter().zip(&a).map(|(x, y)| *x.min(y)).collect(),
            });
            super::dense::max_into(&mut capacity, &res.vector(&t.capacity));
        }
        Existing {
            name: c.name.clone(),
            kind: TargetKind::NodeClaim,
            hostname,
            labels,
            taints: c.taints.clone(),
            avail: avail.unwrap_or_else(|| res.zero()),
            capacity,
            used: res.vector(&c.resources),
            ports: Vec::new(),
            cordoned: false,
            pool: Some(c.node_pool.clone()),
        }
    }

    /// True when a spread group's node filter admits this node.
    pub fn passes(&self, f: &NodeFilter) -> bool {
        f.terms
            .as_ref()
            .is_none_or(|ts| ts.iter().any(|t| t.matches_labels(&self.labels)))
            && f.tolerations
                .as_ref()
                .is_none_or(|t| tolerates_all(t, &self.taints, true).is_ok())
    }
}
