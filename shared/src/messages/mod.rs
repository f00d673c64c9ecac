//! Queue contracts: every message that crosses an SQS queue between the parts
//! of nodesmith, with who sends it and who consumes it. Senders and consumers
//! import the shapes from here, never from each other.
//!
//! | Queue | Message | Sent by | Consumed by |
//! |---|---|---|---|
//! | pending pods | [`PendingPodRef`] | the forwarder (`infra/forwarder`) | `provision` |
//! | pending pods | [`SolveRequest`] ([`request_solve`]) | `launch`, `interrupt`, the sweep | `provision` |
//! | pending pods | [`NodeRef`] (a Node to register or initialize now) | the forwarder | `provision` |
//! | launch | [`LaunchRequest`] ([`launch_requests::enqueue`]) | `provision`, `interrupt` and the sweep's replacements, all through [`crate::capacity::Door::admit`]; the sweep again for a claim whose launch was lost | `launch` |
//! | interruption | EventBridge events ([`crate::interruption::event`]) | AWS, through the stack's EventBridge rules | `interrupt` |
//!
//! The interruption queue's shape is AWS's, so its parser stays with the
//! interruption logic. Every consumer reports failed records through
//! [`crate::lambda::batch_response`]; `interrupt` also gives its failed
//! records back within seconds ([`redelivery`]).

pub mod launch_requests;
pub mod node_events;
pub mod pending_pods;
pub mod redelivery;

pub use launch_requests::{EnqueueError, LaunchRequest, RequestError};
pub use node_events::NodeRef;
pub use pending_pods::{MessageError, PendingMessage, PendingPodRef, SolveRequest, TriggerError, request_solve};
