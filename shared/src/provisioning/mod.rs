//! The provision function: a batch of pending-pod references → one solve over
//! the cluster's current state → new NodeClaims in DynamoDB and one launch
//! request each on the launch queue.
//!
//! Solves are serialised by a DynamoDB lease and NodeClaims are written with
//! the lease as a fence, so two invocations at once never both add capacity
//! for the same pods nor push a pool past its limits: the second one waits,
//! then sees the first one's claims as in-flight capacity.

pub mod batch;

use std::time::Duration;

use aws_lambda_events::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};

use crate::catalog::{self, Catalog};
use crate::kubernetes::{Cluster, ClusterError};
use crate::launch::request::{EnqueueError, LaunchRequest, enqueue};
use crate::nodeclaim::{NodeClaim, Phase};
use crate::scheduling::{self, Plan, SolveInput, UnavailableOffering};
use crate::state::{Lease, StateError, StateStore, now_ms, now_secs};

use batch::{PodState, Record};

/// The lease that serialises solves.
pub const LEASE: &str = "provision";

/// Settings of the provision function.
#[derive(Debug, Clone)]
pub struct ProvisionConfig {
    /// The launch queue's URL.
    pub launch_queue_url: String,
    /// Where malformed messages are sent (when unset they are reported as
    /// failures and reach the dead-letter queue through the redrive policy).
    pub dead_letter_queue_url: Option<String>,
    /// How long one solve may hold the lease.
    pub lease_ttl: Duration,
    /// How long to wait for another invocation's solve before giving the batch back.
    pub lease_wait: Duration,
    /// Who we are (the Lambda request id), for the lease.
    pub holder: String,
    /// A Pending claim older than this without an instance gets its launch request again.
    pub relaunch_after: Duration,
}

impl ProvisionConfig {
    /// Reads `NODESMITH_LAUNCH_QUEUE_URL` and optionally `NODESMITH_PENDING_DLQ_URL`.
    pub fn from_env() -> Result<Self, ProvisionError> {
        let launch_queue_url = std::env::var("NODESMITH_LAUNCH_QUEUE_URL")
            .map_err(|_| ProvisionError::Config("NODESMITH_LAUNCH_QUEUE_URL is not set".into()))?;
        Ok(ProvisionConfig {
            launch_queue_url,
            dead_letter_queue_url: std::env::var("NODESMITH_PENDING_DLQ_URL")
                .ok()
                .filter(|s| !s.is_empty()),
            ..ProvisionConfig::new("")
        })
    }

    /// Defaults around a launch queue URL.
    pub fn new(launch_queue_url: &str) -> Self {
        ProvisionConfig {
            launch_queue_url: launch_queue_url.into(),
            dead_letter_queue_url: None,
            lease_ttl: Duration::from_secs(60),
            lease_wait: Duration::from_secs(20),
            holder: format!("provision-{}", now_ms()),
            relaunch_after: Duration::from_secs(120),
        }
    }
}

/// Why a batch could not be handled.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    /// Missing or bad configuration.
    #[error("configuration: {0}")]
    Config(String),
    /// The cluster could not be read.
    #[error("reading the cluster: {0}")]
    Cluster(#[from] ClusterError),
    /// The state table failed.
    #[error("state: {0}")]
    State(#[from] StateError),
    /// Launch requests could not be queued.
    #[error("queueing launches: {0}")]
    Enqueue(#[from] EnqueueError),
    /// Another solve held the lease for longer than we wait.
    #[error("another solve holds the {LEASE} lease")]
    Busy,
    /// The built-in catalog could not be loaded.
    #[error("catalog: {0}")]
    Catalog(String),
}

/// What one batch did.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Messages to give back to SQS (retried, then dead-lettered).
    pub failed: Vec<String>,
    /// NodeClaims created.
    pub created: Vec<NodeClaim>,
    /// Pods placed on existing nodes or in-flight claims.
    pub placed_on_existing: usize,
    /// Pods no plan can place, with the reason.
    pub unschedulable: Vec<(String, String)>,
    /// Referenced pods that are no longer pending.
    pub gone: usize,
    /// Malformed messages.
    pub malformed: usize,
}

impl Outcome {
    /// The Lambda response: partial batch failures.
    pub fn response(&self) -> SqsBatchResponse {
        let mut r = SqsBatchResponse::default();
        r.batch_item_failures = self
            .failed
            .iter()
            .map(|id| {
                let mut f = BatchItemFailure::default();
                f.item_identifier = id.clone();
                f
            })
            .collect();
        r
    }
}

/// The provision function's resources, built once per container.
pub struct Provisioner<C> {
    cluster: C,
    store: StateStore,
    sqs: aws_sdk_sqs::Client,
    config: ProvisionConfig,
}

impl<C: Cluster> Provisioner<C> {
    /// Wires the function.
    pub fn new(cluster: C, store: StateStore, sqs: aws_sdk_sqs::Client, config: ProvisionConfig) -> Self {
        Provisioner {
            cluster,
            store,
            sqs,
            config,
        }
    }

    /// Handles one SQS batch; never fails as a whole because of one record.
    pub async fn handle(&self, event: &SqsEvent) -> Outcome {
        let records = batch::read_records(&event.records);
        let mut outcome = Outcome::default();
        let mut refs = Vec::new();
        for r in records {
            match r {
                Record::Pod { message_id, pod } => refs.push((message_id, pod)),
                Record::Malformed {
                    message_id,
                    body,
                    error,
                } => {
                    outcome.malformed += 1;
                    tracing::error!(%message_id, %error, "rejecting malformed pending-pod message");
                    if !self.dead_letter(&body, &error.to_string()).await {
                        outcome.failed.push(message_id);
                    }
                }
            }
        }
        if refs.is_empty() {
            return outcome;
        }
        match self.solve_and_record(&refs, &mut outcome).await {
            Ok(()) => {}
            Err(e) => {
                tracing::error!(error = %e, records = refs.len(), "provisioning failed; the batch will be retried");
                outcome.failed.extend(refs.into_iter().map(|(id, _)| id));
            }
        }
        outcome
    }

    async fn dead_letter(&self, body: &str, error: &str) -> bool {
        let Some(url) = &self.config.dead_letter_queue_url else {
            return false;
        };
        let Ok(reason) = aws_sdk_sqs::types::MessageAttributeValue::builder()
            .data_type("String")
            .string_value(error)
            .build()
        else {
            return false;
        };
        let sent = self
            .sqs
            .send_message()
            .queue_url(url)
            .message_body(body)
            .message_attributes("error", reason)
            .send()
            .await;
        match sent {
            Ok(_) => true,
            Err(e) => {
                tracing::error!(error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "cannot dead-letter a malformed message");
                false
            }
        }
    }

    async fn acquire(&self) -> Result<Lease, ProvisionError> {
        let deadline = now_ms() + self.config.lease_wait.as_millis() as i64;
        loop {
            let ttl = self.config.lease_ttl.as_millis() as i64;
            if let Some(lease) = self
                .store
                .acquire_lease(LEASE, &self.config.holder, ttl, now_ms())
                .await?
            {
                return Ok(lease);
            }
            if now_ms() >= deadline {
                return Err(ProvisionError::Busy);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn solve_and_record(
        &self,
        refs: &[(String, crate::messages::PendingPodRef)],
        outcome: &mut Outcome,
    ) -> Result<(), ProvisionError> {
        let lease = self.acquire().await?;
        let result = self.solve_under(&lease, refs, outcome).await;
        if let Err(e) = self.store.release_lease(&lease, now_ms()).await {
            tracing::warn!(error = %e, "could not release the provision lease; it expires by itself");
        }
        result
    }

    async fn solve_under(
        &self,
        lease: &Lease,
        refs: &[(String, crate::messages::PendingPodRef)],
        outcome: &mut Outcome,
    ) -> Result<(), ProvisionError> {
        let pending = self.cluster.pending_pods().await?;
        let keys = batch::pod_keys(&pending);
        for (_, r) in refs {
            if batch::pod_state(r, &keys) == PodState::Gone {
                outcome.gone += 1;
                tracing::info!(pod = %format!("{}/{}", r.namespace, r.name), "pod is no longer pending");
            }
        }
        let all_pods = self.cluster.pods().await?;
        let nodes = batch::existing_nodes(self.cluster.nodes().await?, &all_pods);
        let claims = self.store.in_flight_node_claims().await?;
        self.relaunch_stale(&claims).await?;
        let claims = batch::in_flight(claims, &nodes);
        let catalog = self.catalog().await?;
        let unavailable = self
            .store
            .unavailable_offerings(now_secs())
            .await?
            .into_iter()
            .map(|u| UnavailableOffering {
                instance_type: u.key.instance_type,
                zone: u.key.zone,
                capacity_type: u.key.capacity_type,
            })
            .collect();
        let node_classes = self.cluster.node_classes().await?;
        let mut input = SolveInput::new(&catalog);
        input.pods = pending;
        input.nodes = nodes;
        input.node_claims = claims;
        input.node_pools = self.cluster.node_pools().await?;
        input.node_classes = node_classes.clone();
        input.daemon_sets = self.cluster.daemon_sets().await?;
        input.persistent_volumes = self.cluster.persistent_volumes().await?;
        input.persistent_volume_claims = self.cluster.persistent_volume_claims().await?;
        input.storage_classes = self.cluster.storage_classes().await?;
        input.unavailable = unavailable;
        let started = std::time::Instant::now();
        let plan: Plan = scheduling::solve(&input);
        tracing::info!(
            pods = input.pods.len(),
            new_claims = plan.node_claims.len(),
            unschedulable = plan.unschedulable.len(),
            millis = started.elapsed().as_secs_f64() * 1000.0,
            "solved"
        );
        outcome.placed_on_existing = plan.existing.iter().map(|e| e.pods.len()).sum();
        outcome.unschedulable = plan
            .unschedulable
            .iter()
            .map(|u| (u.pod.to_string(), u.reason.clone()))
            .collect();

        let now = jiff::Timestamp::now().to_string();
        let new_claims: Vec<NodeClaim> = plan
            .node_claims
            .iter()
            .map(|c| {
                let mut claim = c.to_node_claim();
                claim.timestamps.insert("created".into(), now.clone());
                claim
            })
            .collect();
        let created = self
            .store
            .create_node_claims_fenced(lease, &new_claims, now_ms())
            .await?;
        let requests: Vec<LaunchRequest> = created
            .iter()
            .filter_map(|c| {
                node_classes
                    .iter()
                    .find(|nc| nc.name() == c.node_class)
                    .map(|nc| LaunchRequest::new(&c.name, nc))
            })
            .collect();
        if requests.len() < created.len() {
            tracing::error!(
                "a NodeClaim names an EC2NodeClass that does not exist; it stays Pending until the class appears"
            );
        }
        enqueue(&self.sqs, &self.config.launch_queue_url, &requests).await?;
        outcome.created = created;
        Ok(())
    }

    /// A crash between writing a claim and queueing its launch leaves a
    /// Pending claim nobody launches: queue it again (CreateFleet's client
    /// token makes a second launch of the same claim a no-op).
    async fn relaunch_stale(&self, claims: &[NodeClaim]) -> Result<(), ProvisionError> {
        let cutoff =
            jiff::Timestamp::now() - jiff::SignedDuration::try_from(self.config.relaunch_after).unwrap_or_default();
        let stale: Vec<&NodeClaim> = claims
            .iter()
            .filter(|c| c.phase == Phase::Pending)
            .filter(|c| {
                c.timestamps
                    .get("created")
                    .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                    .is_some_and(|t| t < cutoff)
            })
            .collect();
        if stale.is_empty() {
            return Ok(());
        }
        let classes = self.cluster.node_classes().await?;
        let requests: Vec<LaunchRequest> = stale
            .iter()
            .filter_map(|c| {
                classes
                    .iter()
                    .find(|nc| nc.name() == c.node_class)
                    .map(|nc| LaunchRequest::new(&c.name, nc))
            })
            .collect();
        tracing::warn!(
            claims = requests.len(),
            "re-queueing launches of stale Pending NodeClaims"
        );
        enqueue(&self.sqs, &self.config.launch_queue_url, &requests).await?;
        Ok(())
    }

    async fn catalog(&self) -> Result<Catalog, ProvisionError> {
        if let Some(c) = self.store.get_catalog().await? {
            return Ok(c);
        }
        catalog::builtin()
            .map(Clone::clone)
            .map_err(|e| ProvisionError::Catalog(e.to_string()))
    }
}
