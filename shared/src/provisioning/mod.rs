//! The provision function: a batch of pending-pod references → one solve over
//! the cluster's current state → new NodeClaims in DynamoDB and one launch
//! request each on the launch queue.
//!
//! Solves are serialised by a DynamoDB lease and NodeClaims are written with
//! the lease as a fence, so two invocations at once never both add capacity
//! for the same pods nor push a pool past its limits: the second one waits,
//! then sees the first one's claims as in-flight capacity.

pub mod records;

use std::collections::BTreeMap;
use std::time::Duration;

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;

use crate::capacity::{self, CapacityError, Door};
use crate::deadline::Deadline;
use crate::disruption::nomination;
use crate::kubernetes::recorder::{EventBudget, Recorded, Recorder};
use crate::kubernetes::{Cluster, EventSpec};
use crate::nodeclaim::NodeClaim;
use crate::scheduling::{Plan, PodRef, SolveOptions, TargetKind};
use crate::settings::{SettingError, Settings};
use crate::snapshot::Snapshot;
use crate::snapshot::live::{self, SnapshotError};
use crate::state::{LAST_SOLVE, Lease, StateError, StateStore, now_ms};
use crate::telemetry::{Metric, Series};

use records::{PodState, Record};

/// Settings of the provision function.
#[derive(Debug, Clone)]
pub struct ProvisionConfig {
    /// The launch queue's URL.
    pub launch_queue_url: String,
    /// Where malformed messages are sent (when unset they are reported as
    /// failures and reach the dead-letter queue through the redrive policy).
    pub dead_letter_queue_url: Option<String>,
    /// How long the lease outlives its last renewal (renewed every third of
    /// that while the solve runs): how long a solve that died blocks the next.
    pub lease_ttl: Duration,
    /// How long to wait for another invocation's solve before giving the batch back.
    pub lease_wait: Duration,
    /// Who we are, for the lease (each invocation adds an identity of its own).
    pub holder: String,
    /// How long the nodes and in-flight claims a solve gives pending pods
    /// stay nominated (spared by consolidation): Karpenter's window.
    pub nomination_window: Duration,
    /// At most this many events per invocation ([`EventBudget`]); the rest
    /// wait for a later solve. 500 was 10 s of the Kubernetes client's rate
    /// when it was 50 requests per second (2.5 s at Karpenter's 200).
    pub event_budget: usize,
    /// The least time a solve needs (reading the cluster, solving, writing
    /// the claims and launch requests): with less left before the deadline,
    /// the batch is handed back to SQS instead of started.
    pub solve_reserve: Duration,
}

impl ProvisionConfig {
    /// Reads `NODESMITH_LAUNCH_QUEUE_URL` and optionally `NODESMITH_PENDING_DLQ_URL`,
    /// `NODESMITH_PROVISION_LEASE` (a Go duration, default 15s) and Karpenter's
    /// `BATCH_MAX_DURATION` (10s), whose double (at least 10s) is the nomination window.
    pub fn from_env() -> Result<Self, SettingError> {
        Self::from_settings(&Settings::from_env())
    }

    /// As [`Self::from_env`], from any settings.
    pub fn from_settings(settings: &Settings<impl Fn(&str) -> Option<String>>) -> Result<Self, SettingError> {
        let launch_queue_url = settings.required("NODESMITH_LAUNCH_QUEUE_URL")?;
        Ok(ProvisionConfig {
            dead_letter_queue_url: settings.optional("NODESMITH_PENDING_DLQ_URL"),
            lease_ttl: capacity::lease_ttl(settings)?,
            nomination_window: nomination::window(settings.duration("BATCH_MAX_DURATION", BATCH_MAX_DURATION)?),
            ..ProvisionConfig::new(&launch_queue_url)
        })
    }

    /// Defaults around a launch queue URL.
    pub fn new(launch_queue_url: &str) -> Self {
        ProvisionConfig {
            launch_queue_url: launch_queue_url.into(),
            dead_letter_queue_url: None,
            lease_ttl: capacity::LEASE_TTL,
            lease_wait: Duration::from_secs(20),
            holder: format!("provision-{}", now_ms()),
            nomination_window: nomination::window(BATCH_MAX_DURATION),
            event_budget: EVENT_BUDGET,
            solve_reserve: SOLVE_RESERVE,
        }
    }
}

/// Events per invocation ([`ProvisionConfig::event_budget`]).
const EVENT_BUDGET: usize = 500;

/// [`ProvisionConfig::solve_reserve`]: issue 32's target for 1,000 pods on
/// 5,000 nodes is 10 s end to end; half as much again for the slow case.
const SOLVE_RESERVE: Duration = Duration::from_secs(15);

/// What writing a plan may take (claims, launch requests, nominations),
/// kept free of the solver's optional passes.
const PLAN_WRITE_RESERVE: Duration = Duration::from_secs(5);

/// Karpenter's default `BATCH_MAX_DURATION`.
const BATCH_MAX_DURATION: Duration = Duration::from_secs(10);

/// Why a batch could not be handled.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    /// The cluster or the state table could not be read.
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    /// The state table failed.
    #[error("state")]
    State(#[from] StateError),
    /// The new claims could not be admitted.
    #[error("adding capacity")]
    Capacity(#[from] CapacityError),
    /// No catalog of this region is stored and it could not be built.
    #[error("catalog")]
    Catalog(#[from] crate::catalog_refresh::RefreshError),
    /// Another solve held the lease for longer than we wait.
    #[error("another solve holds the {} lease", capacity::LEASE)]
    Busy,
    /// The cluster was still being read when only the plan's write reserve
    /// was left before the deadline.
    #[error("the cluster was still being read {} ms before the deadline", PLAN_WRITE_RESERVE.as_millis())]
    OutOfTime,
}

/// What one batch did.
#[derive(Debug, Default)]
pub struct ProvisionOutcome {
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
    /// Nodes this batch registered or initialized (the forwarder's Node messages).
    pub joined: Vec<String>,
    /// Records handed back to SQS because the deadline was too near to start
    /// or finish reading the cluster (also in `failed`).
    pub handed_on: usize,
    /// What became of the solve's events.
    pub events: Recorded,
    /// The solve's time and the pending pods it considered, when it ran.
    pub solve: Option<(Duration, usize)>,
}

impl ProvisionOutcome {
    /// The Lambda response: partial batch failures.
    pub fn response(&self) -> SqsBatchResponse {
        crate::lambda::batch_response(&self.failed)
    }

    /// The batch as CloudWatch metrics (EMF): the solve's time and pending
    /// pods under Karpenter's scheduler names, the pods it could place
    /// nowhere, and the claims created by pool (pure).
    pub fn metrics(&self) -> Vec<Series> {
        let mut plain = vec![crate::metrics::count("PodsUnschedulable", self.unschedulable.len())];
        if let Some((took, pods)) = self.solve {
            plain.push(Metric {
                name: "karpenter_scheduler_scheduling_duration_seconds",
                value: took.as_secs_f64(),
                unit: "Seconds",
                samples: Vec::new(),
            });
            plain.push(crate::metrics::count("karpenter_scheduler_queue_depth", pods));
        }
        let mut series = vec![Series::plain(plain)];
        series.extend(crate::metrics::created(&self.created, "provisioning"));
        series
    }
}

/// The provision function's resources, built once per container.
pub struct Provisioner<C> {
    cluster: C,
    store: StateStore,
    sqs: aws_sdk_sqs::Client,
    config: ProvisionConfig,
    ec2: Option<aws_sdk_ec2::Client>,
    price_list: Option<crate::catalog::price_list::PriceList>,
    /// The events written lately, kept from one invocation to the next.
    recorder: Recorder,
    /// ARC's zonal shifts, read before each solve (`None`: handling is off).
    zonal_shift: Option<crate::zonal_shift::ZonalShifts>,
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
            price_list: None,
            recorder: Recorder::default(),
            zonal_shift: None,
        }
    }

    /// Reads ARC's zonal shifts before each solve and plans no new capacity
    /// in a zone traffic is shifted away from (`None`: handling is off).
    pub fn with_zonal_shift(mut self, zonal_shift: Option<crate::zonal_shift::ZonalShifts>) -> Self {
        self.zonal_shift = zonal_shift;
        self
    }

    /// Solves with a catalog of the EC2 client's region: when none is stored
    /// (and the region is not the built-in snapshot's) it is built first.
    pub fn with_ec2(mut self, ec2: aws_sdk_ec2::Client) -> Self {
        self.ec2 = Some(ec2);
        self
    }

    /// A catalog it builds takes the region's on-demand prices from the
    /// AWS Price List API (the bundled table is the stated fallback).
    pub fn with_price_list(mut self, price_list: Option<crate::catalog::price_list::PriceList>) -> Self {
        self.price_list = price_list;
        self
    }

    /// Handles one SQS batch at the current time, with no deadline but Lambda's longest.
    pub async fn handle(&self, event: &SqsEvent) -> ProvisionOutcome {
        self.handle_within(event, Deadline::outside_lambda()).await
    }

    /// Handles one SQS batch at the current time, done by `deadline`: what
    /// would not fit is handed back to SQS, events are cut first.
    pub async fn handle_within(&self, event: &SqsEvent, deadline: Deadline) -> ProvisionOutcome {
        // Boxed: the function's shell around it would pass the compiler's layout depth limit.
        Box::pin(self.handle_at_within(event, Timestamp::now(), deadline)).await
    }

    /// Handles one SQS batch as of `now`, with no deadline but Lambda's longest.
    pub async fn handle_at(&self, event: &SqsEvent, now: Timestamp) -> ProvisionOutcome {
        self.handle_at_within(event, now, Deadline::outside_lambda()).await
    }

    /// Handles one SQS batch as of `now`, done by `deadline`; never fails as
    /// a whole because of one record.
    pub async fn handle_at_within(&self, event: &SqsEvent, now: Timestamp, deadline: Deadline) -> ProvisionOutcome {
        let records = records::read_records(&event.records);
        let mut outcome = ProvisionOutcome::default();
        let mut refs = Vec::new();
        let mut requests = Vec::new();
        let mut nodes = Vec::new();
        for r in records {
            match r {
                Record::Pod { message_id, pod } => refs.push((message_id, pod)),
                Record::Solve { message_id, request } => {
                    tracing::info!(%message_id, reason = %request.reason, node_claim = ?request.node_claim, "solve requested");
                    requests.push(message_id);
                }
                Record::Node { message_id, node } => nodes.push((message_id, node)),
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
        // Joining Nodes first: a registration takes milliseconds and frees the
        // pods already waiting for that node, whatever the solve then does.
        self.join_nodes(&nodes, &mut outcome, now, deadline).await;
        if refs.is_empty() && requests.is_empty() {
            return outcome;
        }
        // The batch's records, for when it goes back to SQS whole.
        let batch: Vec<String> = refs
            .iter()
            .map(|(id, _)| id.clone())
            .chain(requests.iter().cloned())
            .collect();
        if !deadline.leaves(self.config.solve_reserve) {
            // Given back now, SQS redelivers them after the visibility
            // timeout; cut off by Lambda's timeout, after it too, but half done.
            tracing::warn!(
                records = batch.len(),
                left_ms = deadline.remaining().as_millis() as u64,
                "too little time left for a solve; the batch is handed back to SQS"
            );
            outcome.handed_on += batch.len();
            outcome.failed.extend(batch);
            return outcome;
        }
        if let Err(e) = self.solve_and_record(&refs, &mut outcome, now, deadline).await {
            if matches!(e, ProvisionError::OutOfTime) {
                tracing::warn!(error = %e, records = batch.len(), "the deadline came during the reads; the batch is handed back to SQS");
                outcome.handed_on += batch.len();
            } else {
                tracing::error!(error = %crate::telemetry::causes(&e), records = batch.len(), "provisioning failed; the batch will be retried");
            }
            outcome.failed.extend(batch);
        }
        outcome
    }

    /// Registers and initializes each reported Node ([`crate::joining`]); a
    /// failed one is given back to SQS.
    async fn join_nodes(
        &self,
        nodes: &[(String, crate::messages::NodeRef)],
        outcome: &mut ProvisionOutcome,
        now: Timestamp,
        deadline: Deadline,
    ) {
        for (message_id, node) in nodes {
            if deadline.passed() {
                outcome.handed_on += 1;
                outcome.failed.push(message_id.clone());
                continue;
            }
            match crate::joining::join(&self.cluster, &self.store, node, now).await {
                Ok(joined) => {
                    tracing::info!(node = %node.name, ?joined, "joining node handled");
                    if matches!(joined, crate::joining::Joined::Moved(_)) {
                        outcome.joined.push(node.name.clone());
                    }
                }
                Err(e) => {
                    tracing::warn!(node = %node.name, error = %crate::telemetry::causes(&e), "cannot register the node now; the message is retried and the sweep is the safety net");
                    outcome.failed.push(message_id.clone());
                }
            }
        }
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

    async fn solve_and_record(
        &self,
        refs: &[(String, crate::messages::PendingPodRef)],
        outcome: &mut ProvisionOutcome,
        now: Timestamp,
        deadline: Deadline,
    ) -> Result<(), ProvisionError> {
        let mut door = self.door();
        // Waiting for another solve must leave this one its reserve.
        door.lease_wait = door
            .lease_wait
            .min(deadline.remaining().saturating_sub(self.config.solve_reserve));
        door.release_by = deadline;
        let solved = &mut *outcome;
        let events = door
            .under_lease(|lease| async move { self.solve_under(&lease, refs, solved, now, deadline).await })
            .await?
            .ok_or(ProvisionError::Busy)??;
        // After the lease: the next solve need not wait on a burst's thousands of events.
        outcome.events = self.record_events(events, deadline).await;
        Ok(())
    }

    /// Solves and writes the claims under the lease; the events the solve calls for.
    async fn solve_under(
        &self,
        lease: &Lease,
        refs: &[(String, crate::messages::PendingPodRef)],
        outcome: &mut ProvisionOutcome,
        now: Timestamp,
        deadline: Deadline,
    ) -> Result<Vec<EventSpec>, ProvisionError> {
        // Reads still under way when only the plan's write reserve is left are
        // cut there (the lease released, the batch handed back to SQS) rather
        // than ended by Lambda halfway.
        let snapshot = deadline
            .earlier_by(PLAN_WRITE_RESERVE)
            .within(self.read_for_solving(now))
            .await
            .ok_or(ProvisionError::OutOfTime)??;
        let keys = records::pod_keys(&snapshot.pods);
        for (_, r) in refs {
            if records::pod_state(r, &keys) == PodState::Gone {
                outcome.gone += 1;
                tracing::info!(pod = %format!("{}/{}", r.namespace, r.name), "pod is no longer pending");
            }
        }
        let started = std::time::Instant::now();
        // Off the runtime's thread, so the lease is renewed during a long solve.
        // The solver's extra packing passes stop in time to write the plan
        // (plain first-fit-decreasing always runs).
        let options = SolveOptions {
            deadline: Some(deadline.earlier_by(PLAN_WRITE_RESERVE).instant().into_std()),
            ..SolveOptions::default()
        };
        let (snapshot, plan): (_, Plan) = capacity::off_task(move || {
            let plan = snapshot.compile().solve(&options);
            (snapshot, plan)
        })
        .await;
        outcome.solve = Some((started.elapsed(), snapshot.pods.len()));
        tracing::info!(
            pods = snapshot.pods.len(),
            new_claims = plan.node_claims.len(),
            unschedulable = plan.unschedulable.len(),
            millis = started.elapsed().as_secs_f64() * 1000.0,
            "solved"
        );
        outcome.placed_on_existing = plan.existing.iter().map(|e| e.pods.len()).sum();
        for e in &plan.existing {
            tracing::info!(target_name = %e.name, kind = ?e.kind, pods = e.pods.len(), "pods placed on existing capacity");
        }
        outcome.unschedulable = plan
            .unschedulable
            .iter()
            .map(|u| (u.pod.to_string(), u.reason.to_string()))
            .collect();

        // Redelivered batches add nothing because the lease serialises solves and
        // the first solve's claims are in-flight capacity for the next.
        let new_claims = capacity::name_claims(&snapshot, &plan.node_claims, &capacity::seed(lease, now));
        let created = self.door().admit(lease, &new_claims).await?;
        // After the claims: a nomination names capacity that exists. A failed
        // write is not the batch's failure: the sweep also places the pods
        // still pending itself before it consolidates.
        let nominations = nomination::records(&plan, now, self.config.nomination_window);
        if let Err(e) = self.store.nominate(&nominations).await {
            tracing::warn!(error = %crate::telemetry::causes(&e), "cannot record nominations; consolidation relies on the sweep's own placement of pending pods");
        }
        if let Err(e) = self.store.mark(LAST_SOLVE, now_ms()).await {
            tracing::warn!(error = %crate::telemetry::causes(&e), "cannot record the solve time; the sweep may ask for an extra solve");
        }
        outcome.created = created;
        let names: Vec<String> = new_claims.iter().map(|c| c.name.clone()).collect();
        Ok(plan_events(&plan, &names, &snapshot.pods))
    }

    /// What a solve reads: the catalog (built once per region), the cluster
    /// and its in-flight claims, the zones shifted away from.
    async fn read_for_solving(&self, now: Timestamp) -> Result<Snapshot, ProvisionError> {
        if let Some(ec2) = &self.ec2 {
            let sources = crate::catalog_refresh::OnDemandSources::new(self.price_list.clone())
                .map_err(crate::catalog_refresh::RefreshError::from)?;
            crate::catalog_refresh::ensure_for_solving(ec2, &self.store, &sources).await?;
        }
        let mut snapshot = live::read_launchable(&self.cluster, &self.store, now).await?;
        snapshot.shifted_zones =
            crate::zonal_shift::shifted_zones(self.zonal_shift.as_ref(), now, &snapshot.node_classes, &snapshot.nodes)
                .await;
        Ok(snapshot)
    }

    /// The door new claims go through.
    fn door(&self) -> Door<'_> {
        let c = &self.config;
        Door {
            store: &self.store,
            sqs: &self.sqs,
            launch_queue_url: &c.launch_queue_url,
            holder: &c.holder,
            lease_ttl: c.lease_ttl,
            lease_wait: c.lease_wait,
            release_by: Deadline::outside_lambda(),
        }
    }

    /// Records the events not written lately, a few at a time, within the
    /// invocation's cap and before `deadline`; a failure is logged, never fatal.
    async fn record_events(&self, events: Vec<EventSpec>, deadline: Deadline) -> Recorded {
        let budget = EventBudget {
            most: self.config.event_budget,
            concurrency: EVENT_CONCURRENCY,
        };
        let cluster = &self.cluster;
        self.recorder
            .record(events, budget, deadline, |e| async move {
                cluster.emit_event(&e).await.is_ok()
            })
            .await
    }
}

/// How many events are recorded at once (thousands of pods make thousands of events).
const EVENT_CONCURRENCY: usize = 16;

/// The events a solve records, as Karpenter's provisioner does: `Nominated`
/// on every pod placed on a new NodeClaim (`claim_names[i]` names
/// `plan.node_claims[i]`) or an in-flight one, and `FailedScheduling` with the
/// reason on every pod no NodePool can take. Pods not in `pods` get none (pure).
pub fn plan_events(plan: &Plan, claim_names: &[String], pods: &[Pod]) -> Vec<EventSpec> {
    let by_ref: BTreeMap<PodRef, &Pod> = pods.iter().map(|p| (PodRef::of(p), p)).collect();
    let new = plan
        .node_claims
        .iter()
        .zip(claim_names)
        .flat_map(|(c, name)| c.pods.iter().map(move |p| (p, name.as_str())));
    let in_flight = plan
        .existing
        .iter()
        .filter(|e| e.kind == TargetKind::NodeClaim)
        .flat_map(|e| e.pods.iter().map(move |p| (p, e.name.as_str())));
    let nominated = new
        .chain(in_flight)
        .filter_map(|(p, claim)| by_ref.get(p).map(|pod| EventSpec::nominated(pod, claim)));
    let failed = plan.unschedulable.iter().filter_map(|u| {
        by_ref
            .get(&u.pod)
            .map(|pod| EventSpec::failed_scheduling(pod, &format!("No NodePool can take this pod: {}", u.reason)))
    });
    nominated.chain(failed).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::fixtures;
    use crate::scheduling::{ExistingPlacement, PlacementFailure, Unschedulable};

    #[test]
    fn a_solve_nominates_pods_on_new_and_in_flight_claims_and_says_why_the_rest_wait() {
        let pod = |name: &str| fixtures::pod(name, "1", "1Gi", serde_json::json!({}));
        let pods = vec![pod("a"), pod("b"), pod("c"), pod("d")];
        let r = |name: &str| PodRef::of(&pod(name));
        let plan = Plan {
            node_claims: vec![crate::scheduling::NewNodeClaim {
                pods: vec![r("a")],
                ..fixtures::new_claim()
            }],
            existing: vec![
                ExistingPlacement {
                    name: "default-inflight".into(),
                    kind: TargetKind::NodeClaim,
                    pods: vec![r("b")],
                },
                ExistingPlacement {
                    name: "ip-10-0-0-1".into(),
                    kind: TargetKind::Node,
                    pods: vec![r("c")],
                },
            ],
            unschedulable: vec![
                Unschedulable {
                    pod: r("d"),
                    reason: PlacementFailure::NoNodePool,
                },
                Unschedulable {
                    pod: r("gone"),
                    reason: PlacementFailure::NoNodePool,
                },
            ],
            warnings: vec![],
        };
        let events: Vec<(String, String, String)> = plan_events(&plan, &["default-new".into()], &pods)
            .into_iter()
            .map(|e| (e.object.name.unwrap_or_default(), e.reason, e.message))
            .collect();
        assert_eq!(events.len(), 3, "{events:#?}");
        assert_eq!(
            events[0],
            (
                "a".into(),
                "Nominated".into(),
                "Pod should schedule on: nodeclaim/default-new".into()
            )
        );
        assert_eq!(
            events[1],
            (
                "b".into(),
                "Nominated".into(),
                "Pod should schedule on: nodeclaim/default-inflight".into()
            )
        );
        assert_eq!((events[2].0.as_str(), events[2].1.as_str()), ("d", "FailedScheduling"));
        assert!(
            events[2].2.starts_with("No NodePool can take this pod: "),
            "{}",
            events[2].2
        );
    }
}
