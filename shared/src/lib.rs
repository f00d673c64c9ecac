//! nodesmith: Karpenter's node provisioning for Amazon EKS, done by Lambda functions.
//!
//! The modules, grouped by layer. Pure parts (API types, requirements,
//! catalog maths, the solver, disruption decisions, event parsing) have no
//! I/O; adapters to AWS and Kubernetes are thin; the function shells wire
//! them together. `tests/tests/layering.rs` checks that no modules import
//! each other in a circle.
//!
//! The `autoscaler` feature (on by default) is everything but the little the
//! in-cluster forwarder uses: the API vocabulary, the queue message shapes,
//! the settings reader, logging, the connections and the pod helpers. The
//! forwarder builds without it, so its image compiles and links no EC2,
//! DynamoDB or Lambda code.

// Vocabulary: the API types and the values they are made of.
/// Karpenter v1 NodePool and EC2NodeClass: types, defaults, validation.
pub mod apis;
/// Well-known label keys and label syntax.
pub mod labels;
/// A node nodesmith decided to launch, and its lifecycle phases.
#[cfg(feature = "autoscaler")]
pub mod nodeclaim;
/// Kubernetes resource quantities as exact milli-units.
pub mod quantity;
/// The node requirements algebra.
pub mod requirements;
/// Resource lists and their arithmetic.
pub mod resources;

// The pure core: plain data in, decisions out, `now` passed in.
/// Instance types, their offerings and allocatable capacity.
#[cfg(feature = "autoscaler")]
pub mod catalog;
/// Disruption decisions: expiry, drift, emptiness, consolidation.
#[cfg(feature = "autoscaler")]
pub mod disruption;
/// `karpenter.sh/do-not-disrupt`: `"true"` or a duration.
pub mod do_not_disrupt;
/// A node's life after launch: registration, timeouts, garbage collection.
#[cfg(feature = "autoscaler")]
pub mod lifecycle;
/// What `kubectl` shows of nodesmith: NodeClaim objects and NodePool status, from the state table.
#[cfg(feature = "autoscaler")]
pub mod mirror;
/// Pending → Running latency: which pods became Ready in a window, and how long it took.
#[cfg(feature = "autoscaler")]
pub mod pod_startup;
/// Linking a Node to its NodeClaim.
#[cfg(feature = "autoscaler")]
pub mod registration;
/// The provisioning solver.
#[cfg(feature = "autoscaler")]
pub mod scheduling;
/// `nodesmith simulate`: dry runs of provisioning and disruption.
#[cfg(feature = "autoscaler")]
pub mod simulate;
/// Everything a decision looks at, as plain data.
#[cfg(feature = "autoscaler")]
pub mod snapshot;
/// `nodesmith status`: what nodesmith is doing and what it costs.
#[cfg(feature = "autoscaler")]
pub mod status;
/// `terminationGracePeriod`: when a node's termination ends, and when each pod goes.
#[cfg(feature = "autoscaler")]
pub mod termination_grace;
/// Plain-text tables for the CLI.
#[cfg(feature = "autoscaler")]
pub mod text_table;

// Adapters: AWS, Kubernetes and DynamoDB, small and tested against local services.
/// The cluster's EC2 instances.
#[cfg(feature = "autoscaler")]
pub mod ec2;
/// The Kubernetes API: authentication, the cluster adapter, drains, Events.
pub mod kubernetes;
/// Queue contracts: every SQS message shape, who sends it and who reads it.
pub mod messages;
/// EC2NodeClass resolution and the class → launch template mapping.
#[cfg(feature = "autoscaler")]
pub mod nodeclass;
/// Durable state in one DynamoDB table.
#[cfg(feature = "autoscaler")]
pub mod state;
/// ARC zonal shifts: the zones traffic is shifted away from.
#[cfg(feature = "autoscaler")]
pub mod zonal_shift;

// Shared steps: how capacity comes, goes and stays current, whoever asks.
/// The one door for new capacity: claims named, written fenced, launches queued.
#[cfg(feature = "autoscaler")]
pub mod capacity;
/// Keeping the stored instance catalog current.
#[cfg(feature = "autoscaler")]
pub mod catalog_refresh;
/// Drains in progress, for interruption and disruption alike.
#[cfg(feature = "autoscaler")]
pub mod draining;
/// A Node registered and initialized as it joins, on the forwarder's word.
#[cfg(feature = "autoscaler")]
pub mod joining;
/// Nodes whose capacity reservation ends: relabelled on-demand, or drained before a capacity block ends.
#[cfg(feature = "autoscaler")]
pub mod reservation_end;
#[cfg(feature = "autoscaler")]
pub mod static_capacity;

// The function shells and what they share.
/// Crash points for the crash tests (debug builds only).
pub mod crash;
/// The time an invocation has left.
#[cfg(feature = "autoscaler")]
pub mod deadline;
/// `nodesmith explain`: why a node is or is not being disrupted, why a pod is pending.
#[cfg(feature = "autoscaler")]
pub mod explain;
/// `nodesmith install`: the in-cluster manifests with the stack's outputs filled in.
#[cfg(feature = "autoscaler")]
pub mod install;
/// Interruption events, classified and decided, and the `interrupt` function.
#[cfg(feature = "autoscaler")]
pub mod interruption;
/// The one Lambda shell the function binaries share.
#[cfg(feature = "autoscaler")]
pub mod lambda;
/// The `launch` function.
#[cfg(feature = "autoscaler")]
pub mod launch;
/// What the autoscaler itself costs.
#[cfg(feature = "autoscaler")]
pub mod metering;
/// Every metric nodesmith emits (Karpenter's names where it has one), and the series built from what a function did.
#[cfg(feature = "autoscaler")]
pub mod metrics;
/// The `provision` function.
#[cfg(feature = "autoscaler")]
pub mod provisioning;
/// `nodesmith rotate`: replacing a pool's nodes, or one node, as drift does.
#[cfg(feature = "autoscaler")]
pub mod rotation;
/// The one reader of settings.
pub mod settings;
/// The `sweep` function.
#[cfg(feature = "autoscaler")]
pub mod sweep;
/// Structured logs and CloudWatch EMF metrics.
pub mod telemetry;
/// The TLS stack and the AWS SDK configuration every binary connects with.
pub mod transport;
/// What an invocation used of DynamoDB, SQS and the log, counted where every call passes.
pub mod usage;

/// The functions' allocator. A whole-cluster read is a million small objects
/// freed at once; glibc's per-thread arenas kept about 165 MB of them
/// resident at 5,000 nodes, and Lambda bills and kills by resident memory
/// (docs/scale.md, "Memory: one model per pod shape, the allocator, pods
/// trimmed as read").
#[cfg(feature = "autoscaler")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
