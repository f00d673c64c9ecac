//! Pure parts of the provision function: reading the records of a batch of pending-pod
//! messages, and matching what the cluster and the state table say.

use std::collections::BTreeSet;

use aws_lambda_events::sqs::SqsMessage;
use k8s_openapi::api::core::v1::Pod;

use crate::messages::{MessageError, PendingMessage, PendingPodRef, SolveRequest};

/// One record of the batch, read.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    /// A well-formed reference to a pod.
    Pod {
        /// The SQS message id (for partial batch failures).
        message_id: String,
        /// The pod it names.
        pod: PendingPodRef,
    },
    /// nodesmith asks for a solve (capacity was taken away, or pods waited too long).
    Solve {
        /// The SQS message id.
        message_id: String,
        /// The request.
        request: SolveRequest,
    },
    /// The forwarder reports a Node to register or initialize now.
    Node {
        /// The SQS message id.
        message_id: String,
        /// The Node it names.
        node: crate::messages::NodeRef,
    },
    /// A body that is not a pending-pod reference; it goes to the dead-letter queue.
    Malformed {
        /// The SQS message id.
        message_id: String,
        /// The body as received.
        body: String,
        /// What is wrong with it.
        error: MessageError,
    },
}

/// Reads every record; a bad one never spoils the others.
pub fn read_records(records: &[SqsMessage]) -> Vec<Record> {
    records
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let message_id = r.message_id.clone().unwrap_or_else(|| format!("record-{i}"));
            let body = r.body.clone().unwrap_or_default();
            match PendingMessage::parse(&body) {
                Ok(PendingMessage::Pod(pod)) => Record::Pod { message_id, pod },
                Ok(PendingMessage::Solve(request)) => Record::Solve { message_id, request },
                Ok(PendingMessage::Node(node)) => Record::Node { message_id, node },
                Err(error) => Record::Malformed {
                    message_id,
                    body,
                    error,
                },
            }
        })
        .collect()
}

/// What became of a referenced pod once the cluster was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodState {
    /// Still waiting for a node: the solve covers it.
    Pending,
    /// Bound, deleted, or replaced by a new pod of the same name: nothing to do.
    Gone,
}

/// Matches references against the pods that are pending now (by uid, since a
/// recreated pod of the same name is another pod).
pub fn pod_state(reference: &PendingPodRef, pending: &BTreeSet<(String, String, String)>) -> PodState {
    let key = (
        reference.namespace.clone(),
        reference.name.clone(),
        reference.uid.clone(),
    );
    if pending.contains(&key) {
        PodState::Pending
    } else {
        PodState::Gone
    }
}

/// The (namespace, name, uid) of each pod, for [`pod_state`].
pub fn pod_keys(pods: &[Pod]) -> BTreeSet<(String, String, String)> {
    pods.iter()
        .map(|p| {
            let m = &p.metadata;
            (
                m.namespace.clone().unwrap_or_else(|| "default".into()),
                m.name.clone().unwrap_or_default(),
                m.uid.clone().unwrap_or_default(),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(id: &str, body: &str) -> SqsMessage {
        let mut m = SqsMessage::default();
        m.message_id = Some(id.into());
        m.body = Some(body.into());
        m
    }

    #[test]
    fn malformed_records_do_not_spoil_the_batch() {
        let good = r#"{"namespace":"default","name":"web-1","uid":"u1","resourceVersion":"7"}"#;
        let recs = read_records(&[
            msg("a", good),
            msg("b", "not json"),
            msg("c", r#"{"namespace":"default"}"#),
            msg("d", good),
            msg("e", r#"{"solve":{"reason":"launch-no-capacity"}}"#),
            msg("f", r#"{"node":{"name":"ip-10-0-1-7.ec2.internal"}}"#),
        ]);
        let kinds: Vec<&str> = recs
            .iter()
            .map(|r| match r {
                Record::Pod { .. } => "pod",
                Record::Solve { .. } => "solve",
                Record::Node { .. } => "node",
                Record::Malformed { .. } => "malformed",
            })
            .collect();
        assert_eq!(kinds, vec!["pod", "malformed", "malformed", "pod", "solve", "node"]);
        let Record::Malformed {
            message_id,
            body,
            error,
        } = &recs[1]
        else {
            panic!("b is malformed")
        };
        assert_eq!((message_id.as_str(), body.as_str()), ("b", "not json"));
        assert!(!error.to_string().is_empty());
    }

    #[test]
    fn recreated_pods_are_other_pods() {
        let mut pod = Pod::default();
        pod.metadata.namespace = Some("default".into());
        pod.metadata.name = Some("web-1".into());
        pod.metadata.uid = Some("u2".into());
        let keys = pod_keys(&[pod]);
        let r = |uid: &str| PendingPodRef {
            namespace: "default".into(),
            name: "web-1".into(),
            uid: uid.into(),
            resource_version: "1".into(),
        };
        assert_eq!(pod_state(&r("u2"), &keys), PodState::Pending);
        assert_eq!(pod_state(&r("u1"), &keys), PodState::Gone);
    }
}
