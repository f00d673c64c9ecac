//! The launch request: the SQS message `provision` sends to `launch`, one per NodeClaim.
//!
//! JSON schema (camelCase, unknown fields rejected):
//!
//! ```json
//! {
//!   "nodeClaim": "default-7x2kq",
//!   "nodeClassName": "default",
//!   "nodeClass": { "amiSelectorTerms": [{"alias": "al2023@latest"}], "role": "...", ... }
//! }
//! ```
//!
//! `nodeClass` is the EC2NodeClass `spec` as the solver saw it, so `launch`
//! needs no Kubernetes call; everything else (requirements, instance type
//! options, labels, taints) is read from the NodeClaim item in DynamoDB.

use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
use serde::{Deserialize, Serialize};

use crate::apis::{EC2NodeClass, EC2NodeClassSpec};

/// Largest message body accepted, in bytes (SQS's classic limit).
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// SendMessageBatch takes at most 10 entries.
const SQS_BATCH: usize = 10;

/// Launch one NodeClaim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LaunchRequest {
    /// The NodeClaim's name (its DynamoDB key).
    pub node_claim: String,
    /// The EC2NodeClass's name.
    pub node_class_name: String,
    /// The EC2NodeClass's spec.
    pub node_class: EC2NodeClassSpec,
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
    /// A request for `claim` using `class`.
    pub fn new(node_claim: &str, class: &EC2NodeClass) -> Self {
        LaunchRequest {
            node_claim: node_claim.into(),
            node_class_name: class.name().into(),
            node_class: class.spec.clone(),
        }
    }

    /// Parses and validates a message body (pure).
    pub fn parse(body: &str) -> Result<Self, RequestError> {
        if body.len() > MAX_BODY_BYTES {
            return Err(RequestError::TooLarge { size: body.len() });
        }
        let de = &mut serde_json::Deserializer::from_str(body);
        let req: LaunchRequest = serde_path_to_error::deserialize(de).map_err(|e| RequestError::Malformed {
            path: e.path().to_string(),
            message: e.inner().to_string(),
        })?;
        if req.node_claim.is_empty() {
            return Err(RequestError::Invalid("nodeClaim is empty".into()));
        }
        req.node_class()
            .validate()
            .map_err(|e| RequestError::Invalid(e.to_string()))?;
        Ok(req)
    }

    /// The EC2NodeClass object.
    pub fn node_class(&self) -> EC2NodeClass {
        EC2NodeClass::new(&self.node_class_name, self.node_class.clone())
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

/// Why enqueueing launch requests failed.
#[derive(Debug, thiserror::Error)]
pub enum EnqueueError {
    /// A request could not be turned into a message.
    #[error("nodeclaim {node_claim}: {source}")]
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
        serde_json::json!({
            "nodeClaim": "default-abc",
            "nodeClassName": "default",
            "nodeClass": {
                "amiSelectorTerms": [{"alias": "al2023@latest"}],
                "role": "KarpenterNodeRole",
                "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": "demo"}}],
                "securityGroupSelectorTerms": [{"tags": {"karpenter.sh/discovery": "demo"}}]
            }
        })
    }

    #[test]
    fn parses_and_round_trips() {
        let r = LaunchRequest::parse(&valid().to_string()).unwrap();
        assert_eq!(r.node_claim, "default-abc");
        assert_eq!(r.node_class().ami_family().as_deref(), Some("AL2023"));
        assert_eq!(LaunchRequest::parse(&r.to_body().unwrap()).unwrap(), r);
    }

    #[test]
    fn rejects_bad_bodies_with_what_is_wrong() {
        let mut unknown = valid();
        unknown["extra"] = serde_json::json!(1);
        let mut no_claim = valid();
        no_claim.as_object_mut().unwrap().remove("nodeClaim");
        let mut bad_type = valid();
        bad_type["nodeClass"]["amiSelectorTerms"] = serde_json::json!("al2023@latest");
        let mut empty = valid();
        empty["nodeClaim"] = serde_json::json!("");
        let mut invalid_class = valid();
        invalid_class["nodeClass"]["amiSelectorTerms"] = serde_json::json!([]);
        let cases: Vec<(String, &str)> = vec![
            ("not json".into(), "at .: expected ident"),
            ("".into(), "EOF while parsing"),
            (unknown.to_string(), "unknown field `extra`"),
            (no_claim.to_string(), "missing field `nodeClaim`"),
            (bad_type.to_string(), "nodeClass.amiSelectorTerms"),
            (empty.to_string(), "nodeClaim is empty"),
            (
                invalid_class.to_string(),
                "spec.amiSelectorTerms: must have between 1 and 30 terms",
            ),
            ("x".repeat(MAX_BODY_BYTES + 1), "over the 262144-byte limit"),
        ];
        for (body, want) in cases {
            let got = LaunchRequest::parse(&body).unwrap_err().to_string();
            assert!(got.contains(want), "body {:?}: {got}", &body[..body.len().min(40)]);
        }
    }
}
