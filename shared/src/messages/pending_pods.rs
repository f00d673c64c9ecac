//! The pending-pods queue: [`PendingPodRef`] from the forwarder and
//! [`SolveRequest`] from nodesmith itself, both consumed by `provision`.

use serde::{Deserialize, Serialize};

/// A pod the scheduler could not place, as the forwarder sends it to the
/// pending-pods queue. Slim on purpose: `provision` re-reads the pod, so a
/// stale message can never make it act on an outdated spec.
///
/// JSON schema (one object per SQS message body, no other fields allowed):
///
/// ```json
/// {
///   "type": "object",
///   "additionalProperties": false,
///   "required": ["namespace", "name", "uid", "resourceVersion"],
///   "properties": {
///     "namespace":       {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
///     "name":            {"type": "string", "pattern": "^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$", "maxLength": 253},
///     "uid":             {"type": "string", "minLength": 1, "maxLength": 128},
///     "resourceVersion": {"type": "string", "minLength": 1, "maxLength": 64}
///   }
/// }
/// ```
///
/// Example: `{"namespace":"default","name":"web-6d4cf56db6-x2x7k","uid":"3c1e…","resourceVersion":"48211"}`
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PendingPodRef {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's UID (a recreated pod of the same name is a different pod).
    pub uid: String,
    /// The resourceVersion the forwarder saw (with uid, the dedupe key).
    pub resource_version: String,
}

/// A message body that is not a valid [`PendingPodRef`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid pending-pod message{}: {message}", if field.is_empty() { String::new() } else { format!(" at {field}") })]
pub struct MessageError {
    /// The offending field ("" when the whole body is at fault).
    pub field: String,
    /// What is wrong.
    pub message: String,
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

pub(super) fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

impl PendingPodRef {
    /// Parses and validates a message body.
    pub fn parse(body: &str) -> Result<Self, MessageError> {
        let de = &mut serde_json::Deserializer::from_str(body);
        let r: PendingPodRef = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            MessageError {
                field: if path == "." { String::new() } else { path },
                message: e.inner().to_string(),
            }
        })?;
        r.validate()?;
        Ok(r)
    }

    /// Checks the fields against the schema above.
    pub fn validate(&self) -> Result<(), MessageError> {
        let bad = |field: &str, message: String| {
            Err(MessageError {
                field: field.into(),
                message,
            })
        };
        if !is_dns_label(&self.namespace) {
            return bad(
                "namespace",
                format!("{:?} is not a valid namespace (DNS-1123 label)", self.namespace),
            );
        }
        if !is_dns_subdomain(&self.name) {
            return bad(
                "name",
                format!("{:?} is not a valid pod name (DNS-1123 subdomain)", self.name),
            );
        }
        if self.uid.is_empty() || self.uid.len() > 128 {
            return bad("uid", "must be 1 to 128 characters".into());
        }
        if self.resource_version.is_empty() || self.resource_version.len() > 64 {
            return bad("resourceVersion", "must be 1 to 64 characters".into());
        }
        Ok(())
    }

    /// The JSON message body.
    pub fn to_body(&self) -> String {
        // Serialising four strings cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The dedupe key: a pod at one version.
    pub fn dedupe_key(&self) -> (String, String) {
        (self.uid.clone(), self.resource_version.clone())
    }
}

/// A request to solve again, sent on the pending-pods queue by nodesmith
/// itself whenever capacity is taken away (a launch found no capacity, a claim
/// timed out, an instance vanished) or pods have waited too long: `provision`
/// solves over every pending pod, so the request names no pod.
///
/// Wire form: `{"solve":{"reason":"launch-no-capacity","nodeClaim":"default-x7k2p"}}`
/// (`nodeClaim` optional; unknown fields rejected).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SolveRequest {
    /// Why a solve is wanted (a short kebab-case word, for logs).
    pub reason: String,
    /// The NodeClaim whose removal caused it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_claim: Option<String>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SolveEnvelope {
    solve: SolveRequest,
}

impl SolveRequest {
    /// A request for `reason`, about `node_claim` when given.
    pub fn new(reason: &str, node_claim: Option<&str>) -> Self {
        SolveRequest {
            reason: reason.to_string(),
            node_claim: node_claim.map(str::to_string),
        }
    }

    /// The JSON message body.
    pub fn to_body(&self) -> String {
        // Serialising two strings cannot fail.
        serde_json::to_string(&SolveEnvelope { solve: self.clone() }).unwrap_or_default()
    }
}

/// Any message of the pending-pods queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PendingMessage {
    /// From the forwarder: a pod the scheduler could not place.
    Pod(PendingPodRef),
    /// From nodesmith: solve again.
    Solve(SolveRequest),
    /// From the forwarder: a Node to register or initialize now.
    Node(super::NodeRef),
}

impl PendingMessage {
    /// Parses a body: an object with a `solve` key is a [`SolveRequest`], one
    /// with a `node` key a [`super::NodeRef`], anything else must be a [`PendingPodRef`].
    pub fn parse(body: &str) -> Result<Self, MessageError> {
        let keys = serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(body).ok();
        let has = |k: &str| keys.as_ref().is_some_and(|m| m.contains_key(k));
        if has("node") && !has("solve") {
            return super::NodeRef::parse(body).map(PendingMessage::Node);
        }
        let is_solve = has("solve");
        if !is_solve {
            return PendingPodRef::parse(body).map(PendingMessage::Pod);
        }
        let de = &mut serde_json::Deserializer::from_str(body);
        let env: SolveEnvelope = serde_path_to_error::deserialize(de).map_err(|e| MessageError {
            field: e.path().to_string(),
            message: e.inner().to_string(),
        })?;
        if env.solve.reason.is_empty() || env.solve.reason.len() > 128 {
            return Err(MessageError {
                field: "solve.reason".into(),
                message: "must be 1 to 128 characters".into(),
            });
        }
        Ok(PendingMessage::Solve(env.solve))
    }
}

/// A solve request could not be queued.
#[derive(Debug, thiserror::Error)]
#[error("queueing a solve request ({reason}): {message}")]
pub struct TriggerError {
    /// The request's reason.
    pub reason: String,
    /// What SQS said.
    pub message: String,
}

/// Sends `request` to the pending-pods queue. Whoever takes capacity away
/// (launch, sweep, interrupt) asks so, and the pods that were waiting on that
/// capacity are placed again within seconds.
pub async fn request_solve(
    sqs: &aws_sdk_sqs::Client,
    pending_queue_url: &str,
    request: &SolveRequest,
) -> Result<(), TriggerError> {
    sqs.send_message()
        .queue_url(pending_queue_url)
        .message_body(request.to_body())
        .send()
        .await
        .map(|_| ())
        .map_err(|e| TriggerError {
            reason: request.reason.clone(),
            message: aws_sdk_sqs::error::DisplayErrorContext(&e).to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_the_wire_format() {
        let r = PendingPodRef {
            namespace: "default".into(),
            name: "web-1".into(),
            uid: "u-1".into(),
            resource_version: "42".into(),
        };
        let body = r.to_body();
        assert_eq!(
            body,
            r#"{"namespace":"default","name":"web-1","uid":"u-1","resourceVersion":"42"}"#
        );
        assert_eq!(PendingPodRef::parse(&body).unwrap(), r);
    }

    #[test]
    fn bad_bodies_name_what_is_wrong() {
        for (body, field, needle) in [
            ("not json", "", "expected"),
            (r#"{"namespace":"d","name":"n","uid":"u"}"#, "", "resourceVersion"),
            (
                r#"{"namespace":"d","name":"n","uid":"u","resourceVersion":"1","extra":1}"#,
                "extra",
                "unknown field",
            ),
            (
                r#"{"namespace":"D!","name":"n","uid":"u","resourceVersion":"1"}"#,
                "namespace",
                "DNS-1123",
            ),
            (
                r#"{"namespace":"d","name":"-n","uid":"u","resourceVersion":"1"}"#,
                "name",
                "DNS-1123",
            ),
            (
                r#"{"namespace":"d","name":"n","uid":"","resourceVersion":"1"}"#,
                "uid",
                "1 to 128",
            ),
            (
                r#"{"namespace":"d","name":"n","uid":"u","resourceVersion":""}"#,
                "resourceVersion",
                "1 to 64",
            ),
            (
                r#"{"namespace":"d","name":5,"uid":"u","resourceVersion":"1"}"#,
                "name",
                "invalid type",
            ),
        ] {
            let e = PendingPodRef::parse(body).unwrap_err();
            assert_eq!(e.field, field, "{body}: {e}");
            assert!(e.to_string().contains(needle), "{body}: {e}");
        }
    }

    #[test]
    fn solve_requests_round_trip_and_are_checked() {
        let r = SolveRequest::new("launch-no-capacity", Some("default-x7k2p"));
        let body = r.to_body();
        assert_eq!(
            body,
            r#"{"solve":{"reason":"launch-no-capacity","nodeClaim":"default-x7k2p"}}"#
        );
        assert_eq!(PendingMessage::parse(&body).unwrap(), PendingMessage::Solve(r));
        let bare = SolveRequest::new("sweep", None).to_body();
        assert_eq!(bare, r#"{"solve":{"reason":"sweep"}}"#);
        for (body, field) in [
            (r#"{"solve":{"reason":""}}"#, "solve.reason"),
            (r#"{"solve":{"reason":"x","extra":1}}"#, "solve.extra"),
            (r#"{"solve":{"reason":"x"},"x":1}"#, "x"),
            (r#"{"solve":{}}"#, "solve"),
        ] {
            let e = PendingMessage::parse(body).unwrap_err();
            assert_eq!(e.field, field, "{body}: {e}");
        }
        let pod = r#"{"namespace":"default","name":"web-1","uid":"u-1","resourceVersion":"42"}"#;
        assert!(matches!(PendingMessage::parse(pod), Ok(PendingMessage::Pod(_))));
    }
}
