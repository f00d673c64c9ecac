//! The launch queue: [`LaunchRequest`], one per NodeClaim, sent by `provision`,
//! `interrupt` (replacements) and the sweep (disruption replacements, relaunches),
//! consumed by `launch`.
//!
//! JSON schema (camelCase, unknown fields rejected):
//!
//! ```json
//! { "nodeClaim": "default-7x2kq" }
//! ```
//!
//! The message names the claim and nothing else: `launch` reads the NodeClaim
//! from DynamoDB and its EC2NodeClass from the cluster. A class carried in a
//! message is never trusted (anyone who may send to the queue could choose
//! the instance profile), so a body with `nodeClass` or `nodeClassName` (the
//! old format) is refused, naming the field.

use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
use serde::{Deserialize, Serialize};

/// Largest message body accepted, in bytes (SQS's classic limit).
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// SendMessageBatch takes at most 10 entries.
const SQS_BATCH: usize = 10;

/// Fields of the old format, which carried the EC2NodeClass.
const CLASS_FIELDS: [&str; 2] = ["nodeClass", "nodeClassName"];

/// Launch one NodeClaim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LaunchRequest {
    /// The NodeClaim's name (its DynamoDB key).
    pub node_claim: String,
}

/// Why a message is not a launch request.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The body is larger than [`MAX_BODY_BYTES`].
    #[error("launch request is {size} bytes, over the {MAX_BODY_BYTES}-byte limit")]
    TooLarge {
        /// Its size.
        size: usize,
    },
    /// The body carries an EC2NodeClass (the old format); it is never used.
    #[error(
        "launch request carries `{field}`: requests name the NodeClaim only, and launch reads the EC2NodeClass from the cluster"
    )]
    CarriesClass {
        /// The refused field.
        field: &'static str,
    },
    /// The body is not the JSON described above.
    #[error("launch request is not valid JSON for the schema at {path}: {message}")]
    Malformed {
        /// Where in the document.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The JSON is well formed but the request is not usable.
    #[error("launch request is invalid: {0}")]
    Invalid(String),
}

impl LaunchRequest {
    /// A request to launch `node_claim`.
    pub fn new(node_claim: &str) -> Self {
        LaunchRequest {
            node_claim: node_claim.into(),
        }
    }

    /// Parses and validates a message body (pure).
    pub fn parse(body: &str) -> Result<Self, RequestError> {
        if body.len() > MAX_BODY_BYTES {
            return Err(RequestError::TooLarge { size: body.len() });
        }
        let de = &mut serde_json::Deserializer::from_str(body);
        let req: LaunchRequest = serde_path_to_error::deserialize(de).map_err(|e| {
            carried_class(body).map_or_else(
                || RequestError::Malformed {
                    path: e.path().to_string(),
                    message: e.inner().to_string(),
                },
                |field| RequestError::CarriesClass { field },
            )
        })?;
        if req.node_claim.is_empty() {
            return Err(RequestError::Invalid("nodeClaim is empty".into()));
        }
        Ok(req)
    }

    /// The message body.
    pub fn to_body(&self) -> Result<String, RequestError> {
        let body = serde_json::to_string(self).map_err(|e| RequestError::Invalid(format!("cannot serialise: {e}")))?;
        if body.len() > MAX_BODY_BYTES {
            return Err(RequestError::TooLarge { size: body.len() });
        }
        Ok(body)
    }
}

/// The old format's class field a refused body carries, if any: named in the
/// error so nobody takes the class in a message for one that is used (pure).
fn carried_class(body: &str) -> Option<&'static str> {
    let object = serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(body).ok()?;
    CLASS_FIELDS.into_iter().find(|f| object.contains_key(*f))
}

/// Why enqueueing launch requests failed.
#[derive(Debug, thiserror::Error)]
pub enum EnqueueError {
    /// A request could not be turned into a message.
    #[error("nodeclaim {node_claim}: request not built")]
    Request {
        /// The claim.
        node_claim: String,
        /// Why.
        source: RequestError,
    },
    /// SQS refused some or all messages; they name the NodeClaims not enqueued.
    #[error("sqs did not take launch requests for {failed:?}: {message}")]
    Sqs {
        /// NodeClaims whose requests were not sent.
        failed: Vec<String>,
        /// The SDK's or SQS's reason.
        message: String,
    },
}

/// Sends one message per request (SendMessageBatch, 10 at a time). Entry ids
/// are the batch index, so a failure names the NodeClaims not sent; the caller
/// may retry them (the launch path is idempotent).
pub async fn enqueue(
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    requests: &[LaunchRequest],
) -> Result<(), EnqueueError> {
    let mut failed = Vec::new();
    let mut message = String::new();
    for chunk in requests.chunks(SQS_BATCH) {
        let mut entries = Vec::with_capacity(chunk.len());
        for (i, r) in chunk.iter().enumerate() {
            let body = r.to_body().map_err(|source| EnqueueError::Request {
                node_claim: r.node_claim.clone(),
                source,
            })?;
            let entry = SendMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .message_body(body)
                .build()
                .map_err(|e| EnqueueError::Sqs {
                    failed: vec![r.node_claim.clone()],
                    message: e.to_string(),
                })?;
            entries.push(entry);
        }
        match sqs
            .send_message_batch()
            .queue_url(queue_url)
            .set_entries(Some(entries))
            .send()
            .await
        {
            Ok(out) => {
                for f in out.failed() {
                    if let Some(r) = f.id().parse::<usize>().ok().and_then(|i| chunk.get(i)) {
                        failed.push(r.node_claim.clone());
                        message = format!("{}: {}", f.code(), f.message().unwrap_or_default());
                    }
                }
            }
            Err(e) => {
                failed.extend(chunk.iter().map(|r| r.node_claim.clone()));
                message = aws_smithy_types::error::display::DisplayErrorContext(&e).to_string();
            }
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(EnqueueError::Sqs { failed, message })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid() -> serde_json::Value {
        serde_json::json!({"nodeClaim": "default-abc"})
    }

    #[test]
    fn parses_and_round_trips() {
        let r = LaunchRequest::parse(&valid().to_string()).unwrap();
        assert_eq!(r, LaunchRequest::new("default-abc"));
        assert_eq!(r.to_body().unwrap(), r#"{"nodeClaim":"default-abc"}"#);
        assert_eq!(LaunchRequest::parse(&r.to_body().unwrap()).unwrap(), r);
    }

    #[test]
    fn a_carried_node_class_is_refused_naming_the_field() {
        let class = serde_json::json!({
            "amiSelectorTerms": [{"alias": "al2023@latest"}],
            "instanceProfile": "AttackerChosenProfile",
            "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": "demo"}}],
            "securityGroupSelectorTerms": [{"tags": {"karpenter.sh/discovery": "demo"}}]
        });
        let mut old = valid();
        old["nodeClassName"] = serde_json::json!("default");
        old["nodeClass"] = class.clone();
        let mut spec_only = valid();
        spec_only["nodeClass"] = class;
        let mut name_only = valid();
        name_only["nodeClassName"] = serde_json::json!("default");
        for (body, field) in [
            (old, "nodeClass"),
            (spec_only, "nodeClass"),
            (name_only, "nodeClassName"),
        ] {
            let e = LaunchRequest::parse(&body.to_string()).unwrap_err();
            assert!(
                matches!(e, RequestError::CarriesClass { field: f } if f == field),
                "{body}: {e:?}"
            );
            let text = e.to_string();
            assert!(text.contains(&format!("`{field}`")), "{text}");
            assert!(text.contains("reads the EC2NodeClass from the cluster"), "{text}");
        }
    }

    #[test]
    fn rejects_bad_bodies_with_what_is_wrong() {
        let mut unknown = valid();
        unknown["extra"] = serde_json::json!(1);
        let mut bad_type = valid();
        bad_type["nodeClaim"] = serde_json::json!(["default-abc"]);
        let mut empty = valid();
        empty["nodeClaim"] = serde_json::json!("");
        let cases: Vec<(String, &str)> = vec![
            ("not json".into(), "at .: expected ident"),
            ("".into(), "EOF while parsing"),
            (unknown.to_string(), "unknown field `extra`"),
            ("{}".into(), "missing field `nodeClaim`"),
            (bad_type.to_string(), "at nodeClaim: invalid type"),
            (empty.to_string(), "nodeClaim is empty"),
            ("x".repeat(MAX_BODY_BYTES + 1), "over the 262144-byte limit"),
        ];
        for (body, want) in cases {
            let got = LaunchRequest::parse(&body).unwrap_err().to_string();
            assert!(got.contains(want), "body {:?}: {got}", &body[..body.len().min(40)]);
        }
    }
}
