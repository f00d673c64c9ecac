//! The pending-pods queue's third message: a Node of nodesmith's that has
//! joined or changed readiness and still waits to be registered or
//! initialized. Sent by the forwarder, consumed by `provision`, which
//! registers and initializes the Node at once ([`crate::joining`]); the
//! sweep stays the safety net for a lost message.

use serde::{Deserialize, Serialize};

use super::MessageError;

/// A Node to register or initialize now. Slim on purpose: `provision` re-reads
/// the Node and its claim, so a stale or repeated message decides nothing.
///
/// Wire form: `{"node":{"name":"ip-10-0-1-7.ec2.internal"}}` (unknown fields rejected).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeRef {
    /// The Node's name (a DNS-1123 subdomain).
    pub name: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeEnvelope {
    node: NodeRef,
}

impl NodeRef {
    /// A reference to the Node `name`.
    pub fn new(name: &str) -> Self {
        NodeRef { name: name.to_string() }
    }

    /// The JSON message body.
    pub fn to_body(&self) -> String {
        // Serialising one string cannot fail.
        serde_json::to_string(&NodeEnvelope { node: self.clone() }).unwrap_or_default()
    }

    /// Parses a body of the wire form above.
    pub fn parse(body: &str) -> Result<Self, MessageError> {
        let de = &mut serde_json::Deserializer::from_str(body);
        let env: NodeEnvelope = serde_path_to_error::deserialize(de).map_err(|e| MessageError {
            field: e.path().to_string(),
            message: e.inner().to_string(),
        })?;
        let name = &env.node.name;
        if !super::pending_pods::is_dns_subdomain(name) {
            return Err(MessageError {
                field: "node.name".into(),
                message: format!("{name:?} is not a valid node name (DNS-1123 subdomain)"),
            });
        }
        Ok(env.node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::PendingMessage;

    #[test]
    fn node_refs_round_trip_and_are_checked() {
        let r = NodeRef::new("ip-10-0-1-7.ec2.internal");
        let body = r.to_body();
        assert_eq!(body, r#"{"node":{"name":"ip-10-0-1-7.ec2.internal"}}"#);
        assert_eq!(PendingMessage::parse(&body).unwrap(), PendingMessage::Node(r));
        for (body, field) in [
            (r#"{"node":{"name":"Bad_Name"}}"#, "node.name"),
            (r#"{"node":{"name":""}}"#, "node.name"),
            (r#"{"node":{"name":"n","uid":"u"}}"#, "node.uid"),
            (r#"{"node":{}}"#, "node"),
            (r#"{"node":{"name":"n"},"x":1}"#, "x"),
        ] {
            let e = PendingMessage::parse(body).unwrap_err();
            assert_eq!(e.field, field, "{body}: {e}");
        }
    }
}
