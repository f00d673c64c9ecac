//! Registration, the part that links a Node to its NodeClaim: the Node gets the
//! labels of the instance EC2 actually launched (user data only knew the pool's),
//! `karpenter.sh/registered=true`, the claim's drift hashes as annotations (a
//! kubelet can set labels and taints at start-up but not annotations), and loses
//! the `karpenter.sh/unregistered` taint it registered with. Initialization is
//! judged here too: Ready, startup and ephemeral taints gone, requested
//! extended resources present.
//!
//! A Node belongs to the claim whose instance it runs on: `spec.providerID`
//! (`aws:///<zone>/<instance-id>`) and the claim's provider id name the same
//! instance.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;

use crate::apis::{EC2NODECLASS_HASH_VERSION, NODEPOOL_HASH_VERSION};
use crate::catalog::Catalog;
use crate::kubernetes::NodeUpdate;
use crate::labels;
use crate::labels::{
    EC2NODECLASS_HASH_ANNOTATION, EC2NODECLASS_HASH_VERSION_ANNOTATION, NODEPOOL_HASH_ANNOTATION,
    NODEPOOL_HASH_VERSION_ANNOTATION,
};
use crate::nodeclaim::NodeClaim;

/// The annotations a claim's Node carries: its pool template's, each drift
/// hash the claim has, with its version (the versions in force now: a claim
/// is stamped when it is made), and the disruption reason of a replacement (pure).
pub fn node_annotations(claim: &NodeClaim) -> BTreeMap<String, String> {
    let mut a = claim.annotations.clone();
    if let Some(h) = &claim.nodepool_hash {
        a.insert(NODEPOOL_HASH_ANNOTATION.to_string(), h.clone());
        a.insert(
            NODEPOOL_HASH_VERSION_ANNOTATION.to_string(),
            NODEPOOL_HASH_VERSION.to_string(),
        );
    }
    if let Some(h) = &claim.nodeclass_hash {
        a.insert(EC2NODECLASS_HASH_ANNOTATION.to_string(), h.clone());
        a.insert(
            EC2NODECLASS_HASH_VERSION_ANNOTATION.to_string(),
            EC2NODECLASS_HASH_VERSION.to_string(),
        );
    }
    if let Some(why) = &claim.replacement_for {
        a.insert(crate::labels::REPLACEMENT_ANNOTATION.to_string(), why.clone());
    }
    a
}

/// The instance id of a provider id such as `aws:///us-east-1a/i-0abc` (its last path
/// segment, when that is an `i-` id) (pure).
pub fn instance_id(provider_id: &str) -> Option<&str> {
    provider_id
        .rsplit('/')
        .next()
        .filter(|id| id.strip_prefix("i-").is_some_and(|rest| !rest.is_empty()))
}

/// The instance a claim launched: from its provider id, else its recorded instance id.
fn claim_instance(claim: &NodeClaim) -> Option<&str> {
    claim
        .provider_id
        .as_deref()
        .and_then(instance_id)
        .or(claim.instance_id.as_deref())
}

/// Each Node that runs a claim's instance, with that claim, in node order; Nodes
/// without a provider id or a claim are left out (pure).
pub fn link<'a>(nodes: &'a [Node], claims: &'a [NodeClaim]) -> Vec<(&'a Node, &'a NodeClaim)> {
    let mut by_instance: BTreeMap<&str, &NodeClaim> = BTreeMap::new();
    for c in claims {
        if let Some(id) = claim_instance(c) {
            by_instance.entry(id).or_insert(c);
        }
    }
    nodes
        .iter()
        .filter_map(|n| {
            let id = n.spec.as_ref()?.provider_id.as_deref().and_then(instance_id)?;
            Some((n, *by_instance.get(id)?))
        })
        .collect()
}

/// The labels a registered claim's Node carries: the claim's own labels (those
/// known before launch), then the facts of the launched instance (its type's
/// labels from the catalog, zone, region, capacity type), the pool, class and
/// claim, and `karpenter.sh/registered=true`. The hostname is the kubelet's (pure).
pub fn node_labels(claim: &NodeClaim, catalog: Option<&Catalog>) -> BTreeMap<String, String> {
    // Claims written before labels were limited to what is known before launch
    // carry predicted instance labels: the launched instance's facts replace them.
    let mut l: BTreeMap<String, String> = claim
        .labels
        .iter()
        .filter(|(k, _)| k.as_str() != labels::HOSTNAME && !labels::WELL_KNOWN.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if let Some(t) = &claim.instance_type {
        if let Some(info) = catalog.and_then(|c| c.instance_types.iter().find(|i| &i.name == t)) {
            l.extend(info.labels.clone());
        }
        l.insert(labels::INSTANCE_TYPE.into(), t.clone());
    }
    if let Some(region) = catalog.map(|c| c.region.clone()).filter(|r| !r.is_empty()) {
        l.insert(labels::REGION.into(), region);
    }
    if let Some(z) = &claim.zone {
        l.insert(labels::ZONE.into(), z.clone());
    }
    if let Some(ct) = &claim.capacity_type {
        l.insert(labels::CAPACITY_TYPE.into(), ct.clone());
    }
    if let Some(r) = &claim.capacity_reservation {
        l.insert(labels::aws::CAPACITY_RESERVATION_ID.into(), r.id.clone());
        l.insert(
            labels::aws::CAPACITY_RESERVATION_TYPE.into(),
            r.reservation_type.clone(),
        );
    }
    l.insert(labels::NODEPOOL.into(), claim.node_pool.clone());
    l.insert(labels::EC2NODECLASS.into(), claim.node_class.clone());
    l.insert(labels::NODECLAIM.into(), claim.name.clone());
    l.insert(labels::REGISTERED.into(), "true".into());
    l
}

/// The write that registers a claim's Node (pure).
pub fn registration_update(claim: &NodeClaim, catalog: Option<&Catalog>) -> NodeUpdate {
    NodeUpdate {
        labels: node_labels(claim, catalog),
        annotations: node_annotations(claim),
        remove_taints: vec![labels::UNREGISTERED_TAINT_KEY.to_string()],
        // A deleted Node waits for nodesmith to drain it and end its instance.
        finalizers: vec![labels::TERMINATION_FINALIZER.to_string()],
        ..NodeUpdate::default()
    }
}

/// The write that marks a Node initialized (pure).
pub fn initialization_update() -> NodeUpdate {
    NodeUpdate {
        labels: BTreeMap::from([(labels::INITIALIZED.to_string(), "true".to_string())]),
        ..NodeUpdate::default()
    }
}

/// Resources the kubelet always reports; any other requested resource must be
/// advertised (by a device plugin) before the node counts as initialized.
const BASE_RESOURCES: &[&str] = &["cpu", "memory", "pods", "ephemeral-storage"];

/// Why a registered Node is not initialized yet, or None when it is (Karpenter's
/// rule: Ready, no startup taint of the claim left, no ephemeral or
/// `unregistered` taint, every requested extended resource advertised) (pure).
pub fn not_initialized_because(node: &Node, claim: &NodeClaim) -> Option<String> {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    if !ready {
        return Some("node is not Ready".into());
    }
    let taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
    for t in &taints {
        let startup = claim
            .startup_taints
            .iter()
            .any(|s| s.key == t.key && format!("{:?}", s.effect) == t.effect);
        if startup || labels::EPHEMERAL_TAINT_KEYS.contains(&t.key.as_str()) || t.key == labels::UNREGISTERED_TAINT_KEY
        {
            return Some(format!("taint {}:{} is still present", t.key, t.effect));
        }
    }
    let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    for (name, q) in &claim.resources.0 {
        if BASE_RESOURCES.contains(&name.as_str()) || q.0 == 0 {
            continue;
        }
        let advertised = allocatable
            .and_then(|a| a.get(name.as_str()))
            .is_some_and(|v| v.0.trim() != "0" && !v.0.trim().is_empty());
        if !advertised {
            return Some(format!("requested resource {name} is not advertised yet"));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn node(name: &str, provider_id: Option<&str>, annotations: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                annotations: (!annotations.is_empty()).then(|| {
                    annotations
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect()
                }),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                provider_id: provider_id.map(Into::into),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn claim(name: &str, provider_id: Option<&str>, pool: Option<&str>, class: Option<&str>) -> NodeClaim {
        NodeClaim {
            provider_id: provider_id.map(Into::into),
            nodepool_hash: pool.map(Into::into),
            nodeclass_hash: class.map(Into::into),
            ..NodeClaim::pending(name, "default", "default")
        }
    }

    #[test]
    fn annotations_hold_the_hashes_present_with_their_versions() {
        let both = node_annotations(&claim("c", None, Some("p1"), Some("k1")));
        assert_eq!(
            both,
            BTreeMap::from([
                ("karpenter.sh/nodepool-hash".to_string(), "p1".to_string()),
                (
                    "karpenter.sh/nodepool-hash-version".to_string(),
                    NODEPOOL_HASH_VERSION.to_string()
                ),
                ("karpenter.k8s.aws/ec2nodeclass-hash".to_string(), "k1".to_string()),
                (
                    "karpenter.k8s.aws/ec2nodeclass-hash-version".to_string(),
                    EC2NODECLASS_HASH_VERSION.to_string()
                ),
            ])
        );
        let pool_only = node_annotations(&claim("c", None, Some("p1"), None));
        assert_eq!(pool_only.len(), 2);
        assert!(pool_only.contains_key(NODEPOOL_HASH_VERSION_ANNOTATION));
        assert!(node_annotations(&claim("c", None, None, None)).is_empty());
        let replacement = NodeClaim {
            replacement_for: Some("Underutilized".into()),
            ..claim("c", None, None, None)
        };
        assert_eq!(
            node_annotations(&replacement),
            BTreeMap::from([(
                "nodesmith/disruption-replacement".to_string(),
                "Underutilized".to_string()
            )])
        );
    }

    #[test]
    fn provider_ids_name_their_instance() {
        assert_eq!(instance_id("aws:///us-east-1a/i-0abc123"), Some("i-0abc123"));
        assert_eq!(instance_id("i-0abc123"), Some("i-0abc123"));
        assert_eq!(instance_id("aws:///us-east-1a/"), None);
        assert_eq!(instance_id("aws:///us-east-1a/i-"), None);
        assert_eq!(instance_id("kind://docker/kind/node-1"), None);
    }

    #[test]
    fn nodes_link_to_claims_by_instance_id() {
        let nodes = vec![
            node("n1", Some("aws:///us-east-1a/i-1"), &[]),
            node("n2", Some("aws:///us-east-1b/i-2"), &[]),
            node("n3", None, &[]),
            node("n4", Some("aws:///us-east-1a/i-4"), &[]),
        ];
        let mut by_instance_only = claim("c4", None, None, None);
        by_instance_only.instance_id = Some("i-4".into());
        let claims = vec![
            // The zone in the provider id does not matter, the instance does.
            claim("c1", Some("aws:///us-east-1c/i-1"), None, None),
            claim("c9", Some("aws:///us-east-1a/i-9"), None, None),
            by_instance_only,
        ];
        let linked: Vec<(&str, &str)> = link(&nodes, &claims)
            .into_iter()
            .map(|(n, c)| (n.metadata.name.as_deref().unwrap(), c.name.as_str()))
            .collect();
        assert_eq!(linked, vec![("n1", "c1"), ("n4", "c4")]);
    }
}
