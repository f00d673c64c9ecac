//! The provision function: a batch of pending-pod references → one solve over
//! the cluster's current state → new NodeClaims in DynamoDB and one launch
//! request each on the launch queue.
//!
//! Solves are serialised by a DynamoDB lease and NodeClaims are written with
//! the lease as a fence, so two invocations at once never both add capacity
//! for the same pods nor push a pool past its limits: the second one waits,
//! then sees the first one's claims as in-flight capacity.

pub mod batch;
pub mod trigger;

use std::collections::BTreeSet;
use std::time::Duration;

use aws_lambda_events::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};

use jiff::Timestamp;

use crate::kubernetes::Cluster;
use crate::launch::request::{EnqueueError, LaunchRequest, enqueue};
use crate::nodeclaim::{NodeClaim, Phase, generate_name};
use crate::scheduling::{Plan, SolveOptions};
use crate::snapshot::live::{self, SnapshotError};
use crate::state::{LAST_SOLVE, Lease, StateError, StateStore, now_ms};

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
    /// The cluster or the state table could not be read.
    #[error("{0}")]
    Snapshot(#[from] SnapshotError),
    /// The state table failed.
    #[error("state: {0}")]
    State(#[from] StateError),
    /// Launch requests could not be queued.
    #[error("queueing launches: {0}")]
    Enqueue(#[from] EnqueueError),
    /// No catalog of this region is stored and it could not be built.
    #[error("catalog: {0}")]
    Catalog(#[from] crate::catalog::refresh::RefreshError),
    /// Another solve held the lease for longer than we wait.
    #[error("another solve holds the {LEASE} lease")]
    Busy,
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
    ec2: Option<aws_sdk_ec2::Client>,
}

impl<C: Cluster> Provisioner<C> {
    /// Wires the function.
    pub fn new(cluster: C, store: StateStore, sqs: aws_sdk_sqs::Client, config: ProvisionConfig) -> Self {
        Provisioner {
            cluster,
            store,
            sqs,
            config,
            ec2: None,
        }
    }

    /// Solves with a catalog of the EC2 client's region: when none is stored
    /// (and the region is not the built-in snapshot's) it is built first.
    pub fn with_ec2(mut self, ec2: aws_sdk_ec2::Client) -> Self {
        self.ec2 = Some(ec2);
        self
    }

    /// Handles one SQS batch at the current time.
    pub async fn handle(&self, event: &SqsEvent) -> Outcome {
        self.handle_at(event, Timestamp::now()).await
    }

    /// Handles one SQS batch as of `now`; never fails as a whole because of one record.
    pub async fn handle_at(&self, event: &SqsEvent, now: Timestamp) -> Outcome {
        let records = batch::read_records(&event.records);
        let mut outcome = Outcome::default();
        let mut refs = Vec::new();
        let mut requests = Vec::new();
        for r in records {
            match r {
                Record::Pod { message_id, pod } => refs.push((message_id, pod)),
                Record::Solve { message_id, request } => {
                    tracing::info!(%message_id, reason = %request.reason, node_claim = ?request.node_claim, "solve requested");
                    requests.push(message_id);
                }
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
        if refs.is_empty() && requests.is_empty() {
            return outcome;
        }
        match self.solve_and_record(&refs, &mut outcome, now).await {
            Ok(()) => {}
            Err(e) => {
                tracing::error!(error = %e, records = refs.len() + requests.len(), "provisioning failed; the batch will be retried");
                outcome.failed.extend(refs.into_iter().map(|(id, _)| id));
                outcome.failed.extend(requests);
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
        self.store
            .acquire_lease_within(
                LEASE,
                &self.config.holder,
                self.config.lease_ttl,
                self.config.lease_wait,
            )
            .await?
            .ok_or(ProvisionError::Busy)
    }

    async fn solve_and_record(
        &self,
        refs: &[(String, crate::messages::PendingPodRef)],
        outcome: &mut Outcome,
        now: Timestamp,
    ) -> Result<(), ProvisionError> {
        let lease = self.acquire().await?;
        let result = self.solve_under(&lease, refs, outcome, now).await;
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
        now: Timestamp,
    ) -> Result<(), ProvisionError> {
        if let Some(ec2) = &self.ec2 {
            let prices =
                crate::catalog::ec2::PriceTable::bundled().map_err(crate::catalog::refresh::RefreshError::from)?;
            crate::catalog::refresh::ensure_for_solving(ec2, &self.store, &prices).await?;
        }
        let snapshot = live::read_launchable(&self.cluster, &self.store, now).await?;
        let keys = batch::pod_keys(&snapshot.pods);
        for (_, r) in refs {
            if batch::pod_state(r, &keys) == PodState::Gone {
                outcome.gone += 1;
                tracing::info!(pod = %format!("{}/{}", r.namespace, r.name), "pod is no longer pending");
            }
        }
        self.relaunch(stale_pending(&snapshot.node_claims, now, self.config.relaunch_after))
            .await?;
        let started = std::time::Instant::now();
        let plan: Plan = snapshot.compile().solve(&SolveOptions::default());
        tracing::info!(
            pods = snapshot.pods.len(),
            new_claims = plan.node_claims.len(),
            unschedulable = plan.unschedulable.len(),
            millis = started.elapsed().as_secs_f64() * 1000.0,
            "solved"
        );
        outcome.placed_on_existing = plan.existing.iter().map(|e| e.pods.len()).sum();
        outcome.unschedulable = plan
            .unschedulable
            .iter()
            .map(|u| (u.pod.to_string(), u.reason.to_string()))
            .collect();

        // Names are generated, never derived from the pods: a pod recreated under
        // its old name must not produce the name of a claim that is still stored.
        // Redelivered batches add nothing because the lease serialises solves and
        // the first solve's claims are in-flight capacity for the next.
        let mut taken: BTreeSet<String> = snapshot.node_claims.iter().map(|c| c.name.clone()).collect();
        taken.extend(snapshot.nodes.iter().filter_map(|n| n.node.metadata.name.clone()));
        let seed = format!("{}/{}/{}", lease.holder, lease.version, now.as_nanosecond());
        let new_claims: Vec<NodeClaim> = plan
            .node_claims
            .iter()
            .map(|c| {
                let name = generate_name(&c.node_pool, &seed, &mut taken);
                NodeClaim {
                    name,
                    ..snapshot.node_claim(c)
                }
            })
            .collect();
        let created = self
            .store
            .create_node_claims_fenced(lease, &new_claims, now_ms())
            .await?;
        if let Err(e) = self.store.mark(LAST_SOLVE, now_ms()).await {
            tracing::warn!(error = %e, "cannot record the solve time; the sweep may ask for an extra solve");
        }
        let requests = launch_requests(&created);
        enqueue(&self.sqs, &self.config.launch_queue_url, &requests).await?;
        outcome.created = created;
        Ok(())
    }

    /// A crash between writing a claim and queueing its launch leaves a
    /// Pending claim nobody launches: queue it again (the launch path finds an
    /// instance already tagged for the claim, so a second launch adds nothing).
    async fn relaunch(&self, stale: Vec<&NodeClaim>) -> Result<(), ProvisionError> {
        if stale.is_empty() {
            return Ok(());
        }
        let stale: Vec<NodeClaim> = stale.into_iter().cloned().collect();
        let requests = launch_requests(&stale);
        tracing::warn!(
            claims = requests.len(),
            "re-queueing launches of stale Pending NodeClaims"
        );
        enqueue(&self.sqs, &self.config.launch_queue_url, &requests).await?;
        Ok(())
    }
}

/// Launch requests for claims: their names only (`launch` reads the class
/// from the cluster, and gives up a claim whose class is gone).
fn launch_requests(claims: &[NodeClaim]) -> Vec<LaunchRequest> {
    claims.iter().map(|c| LaunchRequest::new(&c.name)).collect()
}

/// Pending claims older than `after` at `now`: their launch request was
/// probably lost (pure).
pub fn stale_pending(claims: &[NodeClaim], now: Timestamp, after: Duration) -> Vec<&NodeClaim> {
    let after = jiff::SignedDuration::try_from(after).unwrap_or(jiff::SignedDuration::MAX);
    claims
        .iter()
        .filter(|c| c.phase == Phase::Pending && c.timestamps.created.is_some() && c.age(now) > after)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_pending_claims_past_the_delay_are_stale() {
        let now: Timestamp = "2026-01-01T00:10:00Z".parse().unwrap();
        let claim = |name: &str, phase: Phase, created: Option<&str>| NodeClaim {
            phase,
            timestamps: crate::nodeclaim::Timestamps {
                created: created.map(|c| c.parse().unwrap()),
                ..Default::default()
            },
            ..NodeClaim::pending(name, "default", "default")
        };
        let claims = vec![
            claim("old", Phase::Pending, Some("2026-01-01T00:07:00Z")),
            claim("young", Phase::Pending, Some("2026-01-01T00:09:00Z")),
            claim("launched", Phase::Launched, Some("2026-01-01T00:00:00Z")),
            claim("undated", Phase::Pending, None),
        ];
        let stale: Vec<&str> = stale_pending(&claims, now, Duration::from_secs(120))
            .into_iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(stale, ["old"]);
    }
}
