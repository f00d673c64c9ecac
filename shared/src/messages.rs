//! Messages between the parts of nodesmith that cross a queue.

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

fn is_dns_subdomain(s: &str) -> bool {
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
}
