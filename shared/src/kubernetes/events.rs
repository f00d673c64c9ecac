//! Kubernetes Events on pods and nodes, as Karpenter emits them, so
//! `kubectl describe` tells users what nodesmith did. Building is pure.

use k8s_openapi::api::core::v1::{Event, EventSource, Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use sha2::{Digest, Sha256};

/// Event reasons (Karpenter's names where Karpenter has one).
pub mod reasons {
    /// A pod is expected to land on a NodeClaim being launched.
    pub const NOMINATED: &str = "Nominated";
    /// A node is being disrupted (consolidation, drift, expiry, interruption).
    pub const DISRUPTING: &str = "Disrupting";
    /// Disruption of a node is blocked (PDB, do-not-disrupt, budgets).
    pub const DISRUPTION_BLOCKED: &str = "DisruptionBlocked";
    /// A replacement NodeClaim is launched for a node being disrupted.
    pub const DISRUPTION_LAUNCHING: &str = "DisruptionLaunching";
    /// A disruption waits for its replacements to be initialized.
    pub const DISRUPTION_WAITING_READINESS: &str = "DisruptionWaitingReadiness";
    /// A disrupted node is drained and terminated.
    pub const DISRUPTION_TERMINATING: &str = "DisruptionTerminating";
    /// A pod was evicted from a node being drained.
    pub const EVICTED: &str = "Evicted";
    /// Draining a node could not finish yet.
    pub const FAILED_DRAINING: &str = "FailedDraining";
    /// The instance behind a node got a spot interruption notice.
    pub const SPOT_INTERRUPTED: &str = "SpotInterrupted";
    /// No NodePool could satisfy a pod.
    pub const FAILED_SCHEDULING: &str = "FailedScheduling";
    /// A NodeClaim's instance was launched.
    pub const LAUNCHED: &str = "Launched";
    /// A NodeClaim's Node registered and was linked to it.
    pub const REGISTERED: &str = "Registered";
    /// A node is Ready with its startup taints gone.
    pub const INITIALIZED: &str = "Initialized";
    /// The API server refused a NodeClaim's registration write; the claim is given up.
    pub const REGISTRATION_REFUSED: &str = "RegistrationRefused";
    /// A NodePool or EC2NodeClass could not be read; it is skipped until fixed.
    pub const FAILED_TO_DECODE: &str = "FailedToDecode";
}

/// The component name events are reported under.
pub const COMPONENT: &str = "nodesmith";

/// Normal or Warning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// Something expected happened.
    Normal,
    /// Something needs attention.
    Warning,
}

impl EventType {
    /// The API string.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// An event to record about one object.
#[derive(Clone, Debug, PartialEq)]
pub struct EventSpec {
    /// The object it is about.
    pub object: ObjectReference,
    /// Normal or Warning.
    pub type_: EventType,
    /// A CamelCase reason from [`reasons`].
    pub reason: String,
    /// A human-readable message.
    pub message: String,
}

/// A reference to a pod.
pub fn pod_ref(pod: &Pod) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: pod.metadata.name.clone(),
        namespace: pod.metadata.namespace.clone(),
        uid: pod.metadata.uid.clone(),
        resource_version: pod.metadata.resource_version.clone(),
        field_path: None,
    }
}

/// A reference to a node.
pub fn node_ref(node: &Node) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: node.metadata.name.clone(),
        uid: node.metadata.uid.clone(),
        resource_version: node.metadata.resource_version.clone(),
        ..Default::default()
    }
}

/// A reference to a node by name only (when the Node object is not at
/// hand). Its uid is the name, as the kubelet records its own node events:
/// `kubectl describe node` looks for events by the node's uid and by its
/// name as uid, so one without a uid would not be shown.
pub fn node_name_ref(name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(name.into()),
        uid: Some(name.into()),
        ..Default::default()
    }
}

/// A reference to a NodeClaim by name: nodesmith's mirror of the claim
/// ([`crate::mirror`]), so `kubectl describe nodeclaim` shows its events.
pub fn nodeclaim_ref(name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("karpenter.sh/v1".into()),
        kind: Some("NodeClaim".into()),
        name: Some(name.into()),
        ..Default::default()
    }
}

impl EventSpec {
    /// `Launched`, on the NodeClaim: its instance is running in EC2.
    pub fn launched(claim: &str, instance_id: &str, instance_type: &str, zone: &str, capacity_type: &str) -> Self {
        EventSpec {
            object: nodeclaim_ref(claim),
            type_: EventType::Normal,
            reason: reasons::LAUNCHED.into(),
            message: format!("Launched instance {instance_id} ({instance_type}, {zone}, {capacity_type})"),
        }
    }

    /// `Registered`, on the node: it joined and is linked to its NodeClaim.
    pub fn registered(node: &str, claim: &str) -> Self {
        EventSpec {
            object: node_name_ref(node),
            type_: EventType::Normal,
            reason: reasons::REGISTERED.into(),
            message: format!("Node joined the cluster for nodeclaim/{claim}"),
        }
    }

    /// `Initialized`, on the node: Ready, startup taints gone, pods may land.
    pub fn initialized(node: &str, claim: &str) -> Self {
        EventSpec {
            object: node_name_ref(node),
            type_: EventType::Normal,
            reason: reasons::INITIALIZED.into(),
            message: format!("Node is ready for pods (nodeclaim/{claim} initialized)"),
        }
    }

    /// `RegistrationRefused`, on the NodeClaim: the API server refused its
    /// Node's labels (`why` is its answer), so the claim and its instance are given up.
    pub fn registration_refused(claim: &str, node: &str, why: &str) -> Self {
        EventSpec {
            object: nodeclaim_ref(claim),
            type_: EventType::Warning,
            reason: reasons::REGISTRATION_REFUSED.into(),
            message: format!("The API server refused to register Node {node}, the NodeClaim is given up: {why}"),
        }
    }

    /// `FailedToDecode`, on a NodePool or EC2NodeClass (`object`) nodesmith
    /// cannot read: it is left out of every decision until it is fixed.
    pub fn failed_to_decode(object: ObjectReference, why: &str) -> Self {
        EventSpec {
            object,
            type_: EventType::Warning,
            reason: reasons::FAILED_TO_DECODE.into(),
            message: format!("Cannot read this object, it is ignored until fixed: {why}"),
        }
    }

    /// `Nominated`: the pod should schedule on the NodeClaim being launched.
    pub fn nominated(pod: &Pod, nodeclaim: &str) -> Self {
        EventSpec {
            object: pod_ref(pod),
            type_: EventType::Normal,
            reason: reasons::NOMINATED.into(),
            message: format!("Pod should schedule on: nodeclaim/{nodeclaim}"),
        }
    }

    /// `Disrupting`: the node is being disrupted for `why` (e.g. "Underutilized").
    pub fn disrupting(node: ObjectReference, why: &str) -> Self {
        EventSpec {
            object: node,
            type_: EventType::Normal,
            reason: reasons::DISRUPTING.into(),
            message: format!("Disrupting Node: {why}"),
        }
    }

    /// `DisruptionBlocked`: the node cannot be disrupted because of `why`.
    pub fn disruption_blocked(node: ObjectReference, why: &str) -> Self {
        EventSpec {
            object: node,
            type_: EventType::Normal,
            reason: reasons::DISRUPTION_BLOCKED.into(),
            message: format!("Cannot disrupt Node: {why}"),
        }
    }

    /// `DisruptionLaunching`: replacement `claim` is launched for the node's disruption.
    pub fn disruption_launching(node: ObjectReference, claim: &str, reason: &str) -> Self {
        EventSpec {
            object: node,
            type_: EventType::Normal,
            reason: reasons::DISRUPTION_LAUNCHING.into(),
            message: format!("Launching NodeClaim: {reason} (nodeclaim/{claim})"),
        }
    }

    /// `DisruptionWaitingReadiness`: the disruption waits for its replacements.
    pub fn disruption_waiting_readiness(node: ObjectReference, claims: &[String]) -> Self {
        EventSpec {
            object: node,
            type_: EventType::Normal,
            reason: reasons::DISRUPTION_WAITING_READINESS.into(),
            message: format!(
                "Waiting on readiness to continue disruption (nodeclaim/{})",
                claims.join(", nodeclaim/")
            ),
        }
    }

    /// `DisruptionTerminating`: the drained node is terminated for `reason`.
    pub fn disruption_terminating(node: ObjectReference, reason: &str) -> Self {
        EventSpec {
            object: node,
            type_: EventType::Normal,
            reason: reasons::DISRUPTION_TERMINATING.into(),
            message: format!("Disrupting Node: {reason}"),
        }
    }

    /// `Evicted`: the pod was evicted from a node being drained.
    pub fn evicted(pod: &Pod) -> Self {
        EventSpec {
            object: pod_ref(pod),
            type_: EventType::Normal,
            reason: reasons::EVICTED.into(),
            message: "Evicted pod: draining node".into(),
        }
    }

    /// `FailedDraining`: a node's drain is waiting on pods.
    pub fn failed_draining(node: ObjectReference, why: &str) -> Self {
        EventSpec {
            object: node,
            type_: EventType::Warning,
            reason: reasons::FAILED_DRAINING.into(),
            message: format!("Failed to drain node, {why}"),
        }
    }

    /// `FailedScheduling`: no NodePool can take the pod.
    pub fn failed_scheduling(pod: &Pod, why: &str) -> Self {
        EventSpec {
            object: pod_ref(pod),
            type_: EventType::Warning,
            reason: reasons::FAILED_SCHEDULING.into(),
            message: why.to_string(),
        }
    }

    /// The same event on the node's NodeClaim `claim` (its object's `uid`
    /// when known: `kubectl describe` selects events by it): Karpenter
    /// records its disruption events on both, saying "NodeClaim" where the
    /// node's says "Node".
    pub fn on_node_claim(&self, claim: &str, uid: Option<String>) -> Self {
        EventSpec {
            object: ObjectReference {
                uid,
                ..nodeclaim_ref(claim)
            },
            message: self.message.replacen(" Node:", " NodeClaim:", 1),
            ..self.clone()
        }
    }

    /// The core/v1 Event object for this spec at `now`. Its name is derived
    /// from the object, reason, message and time, so a retried create of the
    /// same event answers AlreadyExists instead of recording it twice.
    pub fn to_event(&self, now: jiff::Timestamp) -> Event {
        let obj_name = self.object.name.clone().unwrap_or_default();
        let mut h = Sha256::new();
        for part in [
            obj_name.as_str(),
            self.object.uid.as_deref().unwrap_or(""),
            &self.reason,
            &self.message,
            &now.as_second().to_string(),
        ] {
            h.update(part.as_bytes());
            h.update([0]);
        }
        let digest = hex::encode(h.finalize());
        let t = Time(now);
        Event {
            metadata: ObjectMeta {
                name: Some(event_name(&obj_name, &digest[..16])),
                // Events about cluster-scoped objects live in "default", as kubectl expects.
                namespace: Some(self.object.namespace.clone().unwrap_or_else(|| "default".into())),
                ..Default::default()
            },
            involved_object: self.object.clone(),
            reason: Some(self.reason.clone()),
            message: Some(self.message.clone()),
            type_: Some(self.type_.as_str().into()),
            source: Some(EventSource {
                component: Some(COMPONENT.into()),
                host: None,
            }),
            reporting_component: Some(COMPONENT.into()),
            reporting_instance: Some(COMPONENT.into()),
            first_timestamp: Some(t.clone()),
            last_timestamp: Some(t),
            count: Some(1),
            ..Default::default()
        }
    }
}

/// The longest object name the API server takes (a DNS subdomain, as
/// `metadata.name` of an Event must be).
pub const MAX_NAME: usize = 253;

/// An Event's name: the object's name and a hash suffix, the object's name
/// cut (at a label boundary the rules allow) so the whole stays a valid
/// name. Deterministic: the same event gets the same name (pure).
fn event_name(obj_name: &str, suffix: &str) -> String {
    let room = MAX_NAME - suffix.len() - 1;
    // Object names are ASCII; cut on a char boundary anyway.
    let mut cut = obj_name.len().min(room);
    while !obj_name.is_char_boundary(cut) {
        cut -= 1;
    }
    // A label may not end in '-' or '.', nor may the name before the suffix's dot.
    let prefix = obj_name[..cut].trim_end_matches(['-', '.']);
    if prefix.is_empty() {
        suffix.to_string()
    } else {
        format!("{prefix}.{suffix}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_reference_their_object_and_land_in_its_namespace() {
        let pod: Pod =
            serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "shop", "uid": "u1"}})).unwrap();
        let now = jiff::Timestamp::from_second(1_700_000_000).unwrap();
        let e = EventSpec::nominated(&pod, "default-abc12").to_event(now);
        assert_eq!(e.metadata.namespace.as_deref(), Some("shop"));
        assert!(e.metadata.name.as_deref().unwrap().starts_with("web."));
        assert_eq!(e.involved_object.kind.as_deref(), Some("Pod"));
        assert_eq!(e.involved_object.uid.as_deref(), Some("u1"));
        assert_eq!(e.reason.as_deref(), Some("Nominated"));
        assert_eq!(
            e.message.as_deref(),
            Some("Pod should schedule on: nodeclaim/default-abc12")
        );
        assert_eq!(
            e,
            EventSpec::nominated(&pod, "default-abc12").to_event(now),
            "same event, same name"
        );
        let n = EventSpec::disrupting(node_name_ref("ip-10-0-0-1"), "Underutilized").to_event(now);
        assert_eq!(n.metadata.namespace.as_deref(), Some("default"));
        assert_ne!(n.metadata.name, e.metadata.name);
    }

    #[test]
    fn event_names_stay_within_the_api_server_s_limit() {
        let now = jiff::Timestamp::from_second(1_700_000_000).unwrap();
        // The longest pod name there can be, with a '.' where the cut falls.
        let mut long = "a".repeat(235);
        long.push('.');
        long.push_str(&"b".repeat(MAX_NAME - long.len()));
        assert_eq!(long.len(), MAX_NAME);
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": long, "namespace": "shop"}})).unwrap();
        let name = EventSpec::nominated(&pod, "default-abc12")
            .to_event(now)
            .metadata
            .name
            .unwrap();
        assert!(name.len() <= MAX_NAME, "{} characters", name.len());
        assert!(name.starts_with(&"a".repeat(235)) && !name.contains(".."), "{name}");
        assert_eq!(
            Some(name),
            EventSpec::nominated(&pod, "default-abc12").to_event(now).metadata.name,
            "same event, same name"
        );
        // Two long names that differ only past the cut get different names.
        let other: Pod = serde_json::from_value(
            json!({"metadata": {"name": format!("{}c", &long[..MAX_NAME - 1]), "namespace": "shop"}}),
        )
        .unwrap();
        assert_ne!(
            EventSpec::nominated(&other, "default-abc12")
                .to_event(now)
                .metadata
                .name,
            EventSpec::nominated(&pod, "default-abc12").to_event(now).metadata.name
        );
        assert_eq!(event_name("", "0123456789abcdef"), "0123456789abcdef");
    }
}
