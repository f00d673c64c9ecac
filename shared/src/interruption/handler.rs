//! The `interrupt` function: an SQS batch of EventBridge events → for every
//! instance nodesmith owns, taint, replace first, mark the offering
//! unavailable, drain (honouring PDBs until the deadline nears), or remove
//! capacity that is already gone. The decisions are [`super::decide`]'s.
//!
//! Each event's own steps come first and at once: taint the node, record its
//! drain; once every event of the batch has done so, the first eviction pass
//! over each node (so the last node of a storm is not left schedulable while
//! the others are evicted). Then one read of the cluster and one
//! replacement solve serve the whole batch ([`super::batch`]), under the
//! provision lease; when provision keeps the lease past our wait, the
//! replacement is handed to it as a solve request. So a storm of warnings
//! never waits on the lease for its drains.
//!
//! Every message is acknowledged unless acting on it failed: unknown and
//! foreign events are logged and dropped, never retried. A failed message is
//! made visible again within seconds ([`crate::messages::redelivery`]), not
//! after the queue's visibility timeout. An event is recorded as handled
//! (keyed by its id) once acted on, and a handled event's redeliveries are
//! dropped; one that failed or died midway is acted on again. A node is never
//! left tainted by a failed event without its drain recorded: when the record
//! cannot be written, the taint this event added is taken off again. Drains
//! are recorded in DynamoDB ([`crate::state::DrainRecord`]) and continued by
//! the invocation that recorded them, by any invocation once their force
//! time has come, and by the sweep ([`crate::draining`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use jiff::Timestamp;
use sha2::Digest;

use super::batch::{Batch, ToReplace};
use super::decide::{Reaction, RebalanceMode, Steps, decide};
use super::event::{self, Event};
use crate::capacity::{self, CapacityError, Door, LEASE, Pending};
use crate::deadline::Deadline;
use crate::draining::{self, DrainError, DrainPolicy};
use crate::kubernetes::{Cluster, ClusterError, EventSpec, drain, events};
use crate::messages::redelivery::{self, FIRST_RETRY};
use crate::messages::{SolveRequest, TriggerError, request_solve};
use crate::nodeclaim::{NodeClaim, Phase};
use crate::scheduling::SolveOptions;
use crate::settings::{SettingError, Settings};
use crate::snapshot::live::{self, SnapshotError};
use crate::state::{DrainRecord, StateError, StateStore, UNAVAILABLE_TTL_SECS, VersionCheck};
use crate::telemetry::Series;

/// How long an event id is remembered (EventBridge redelivers within hours at most).
const PROCESSED_TTL_SECS: i64 = 24 * 3600;

/// The least time an event's own steps (taint, drain record, first
/// evictions) are started with: less, and it is given back for a redelivery.
pub const EVENT_RESERVE: Duration = Duration::from_secs(10);

/// Time kept before the invocation's deadline, when a step still under way
/// is cut, to give the batch's events back and answer.
const GIVE_BACK_MARGIN: Duration = Duration::from_secs(2);

/// `work`, unless `cut` comes first ([`InterruptError::OutOfTime`]): an
/// invocation answers for its batch rather than be ended by Lambda.
async fn before<T>(cut: Deadline, work: impl Future<Output = Result<T, InterruptError>>) -> Result<T, InterruptError> {
    cut.within(work).await.unwrap_or(Err(InterruptError::OutOfTime))
}

/// Settings of the interrupt function.
#[derive(Debug, Clone)]
pub struct InterruptConfig {
    /// The launch queue's URL (replacements).
    pub launch_queue_url: String,
    /// The pending-pods queue's URL (solve requests after capacity is gone).
    pub pending_queue_url: String,
    /// What rebalance recommendations do.
    pub rebalance: RebalanceMode,
    /// Who we are, for the provision lease (each invocation adds an identity of its own).
    pub holder: String,
    /// How long the provision lease outlives a replacement solve that died.
    pub lease_ttl: Duration,
    /// How long to wait for another solve before giving the message back.
    pub lease_wait: Duration,
    /// How long one invocation keeps draining before leaving the rest to the
    /// next invocation or the sweep (0: one pass).
    pub drain_budget: Duration,
    /// Pause between drain passes.
    pub drain_interval: Duration,
    /// The interruption queue's URL, to give failed messages back early
    /// (None: they return after the queue's visibility timeout).
    pub interruption_queue_url: Option<String>,
    /// How long a failed message stays invisible after its first receive
    /// (doubling with each further receive).
    pub retry_after: Duration,
}

impl InterruptConfig {
    /// Defaults around the two queue URLs.
    pub fn new(launch_queue_url: &str, pending_queue_url: &str) -> Self {
        InterruptConfig {
            launch_queue_url: launch_queue_url.into(),
            pending_queue_url: pending_queue_url.into(),
            rebalance: RebalanceMode::default(),
            holder: format!("interrupt-{}", crate::state::now_ms()),
            lease_ttl: crate::capacity::LEASE_TTL,
            lease_wait: Duration::from_secs(20),
            drain_budget: Duration::from_secs(100),
            drain_interval: Duration::from_secs(5),
            interruption_queue_url: None,
            retry_after: FIRST_RETRY,
        }
    }

    /// Reads `NODESMITH_LAUNCH_QUEUE_URL`, `NODESMITH_PENDING_QUEUE_URL`,
    /// `NODESMITH_REBALANCE` (ignore|replace|drain),
    /// `NODESMITH_INTERRUPT_DRAIN_BUDGET` (seconds) and the optional
    /// `NODESMITH_INTERRUPTION_QUEUE_URL`.
    pub fn from_env() -> Result<Self, SettingError> {
        Self::from_settings(&Settings::from_env())
    }

    /// As [`Self::from_env`], over any lookup (pure).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, SettingError> {
        Self::from_settings(&Settings::new(get))
    }

    /// As [`Self::from_env`], from any settings.
    pub fn from_settings(settings: &Settings<impl Fn(&str) -> Option<String>>) -> Result<Self, SettingError> {
        let mut c = InterruptConfig::new(
            &settings.required("NODESMITH_LAUNCH_QUEUE_URL")?,
            &settings.required("NODESMITH_PENDING_QUEUE_URL")?,
        );
        c.lease_ttl = crate::capacity::lease_ttl(settings)?;
        c.rebalance = settings.parsed("NODESMITH_REBALANCE", RebalanceMode::default())?;
        c.drain_budget = settings.seconds("NODESMITH_INTERRUPT_DRAIN_BUDGET", c.drain_budget)?;
        c.interruption_queue_url = settings.optional("NODESMITH_INTERRUPTION_QUEUE_URL");
        Ok(c)
    }
}

/// Why acting on an event failed (the message is given back to SQS).
#[derive(Debug, thiserror::Error)]
pub enum InterruptError {
    /// The state table failed.
    #[error("state")]
    State(#[from] StateError),
    /// A cluster call failed.
    #[error("cluster")]
    Cluster(#[from] ClusterError),
    /// The replacement's snapshot could not be read.
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    /// The replacement could not be admitted.
    #[error("adding the replacement")]
    Capacity(#[from] CapacityError),
    /// Recorded drains could not be continued.
    #[error("continuing drains")]
    Drain(#[from] DrainError),
    /// A solve request could not be queued.
    #[error(transparent)]
    Trigger(#[from] TriggerError),
    /// Another solve held the provision lease for longer than we wait.
    #[error("another solve holds the {LEASE} lease")]
    Busy,
    /// The step was still under way when the invocation's time ran out.
    #[error("cut at the invocation's deadline")]
    OutOfTime,
}

/// What one batch did.
#[derive(Debug, Default)]
pub struct InterruptOutcome {
    /// Messages given back to SQS.
    pub failed: Vec<String>,
    /// Nodes tainted.
    pub tainted: Vec<String>,
    /// Replacement NodeClaims written and queued for launch.
    pub replacements: Vec<NodeClaim>,
    /// Claims removed because their capacity is gone.
    pub removed: Vec<String>,
    /// The $/h of those claims' offerings: what the fleet no longer costs.
    pub removed_usd_per_hour: f64,
    /// Events not acted on (foreign instances, ignored kinds, duplicates).
    pub ignored: usize,
    /// Unknown or malformed events.
    pub unknown: usize,
    /// Drains finished in this invocation.
    pub drained: Vec<String>,
    /// Nodes whose replacement was handed to provision (it held the lease
    /// past our wait) as a solve request.
    pub handed_to_provision: Vec<String>,
    /// Messages received, by Karpenter's `message_type` ([`event::Kind::message_type`]).
    pub received: Vec<String>,
}

impl InterruptOutcome {
    /// The Lambda response: partial batch failures.
    pub fn response(&self) -> SqsBatchResponse {
        crate::lambda::batch_response(&self.failed)
    }

    /// The batch as CloudWatch metrics (EMF): `InterruptionMessagesUnreadable`
    /// counts messages acknowledged because nodesmith cannot read them (an
    /// unknown detail-type, a malformed event), so they are not dropped
    /// silently; `InterruptionMessagesFailed` those given back to SQS; and
    /// Karpenter's messages received by type, messages done with, and
    /// replacement claims created by pool.
    pub fn metrics(&self) -> Vec<Series> {
        let count = crate::metrics::count;
        let mut series = vec![Series::plain(vec![
            count("InterruptionMessagesUnreadable", self.unknown),
            count("InterruptionMessagesFailed", self.failed.len()),
            count("InterruptionNodesTainted", self.tainted.len()),
            count("InterruptionReplacements", self.replacements.len()),
            count(
                "karpenter_interruption_deleted_messages_total",
                self.received.len().saturating_sub(self.failed.len()),
            ),
        ])];
        series.extend(crate::metrics::tally(
            "karpenter_interruption_received_messages_total",
            self.received
                .iter()
                .map(|t| crate::metrics::labels([("message_type", t.as_str())])),
        ));
        series.extend(crate::metrics::created(&self.replacements, "interruption"));
        series
    }
}

/// The idempotency key of an event: its EventBridge id, else a hash of the body.
pub fn idempotency_key(event: &Event, body: &str) -> String {
    match &event.id {
        Some(id) if !id.is_empty() => format!("interrupt/{id}"),
        _ => format!(
            "interrupt/sha256:{}",
            hex::encode(sha2::Sha256::digest(body.as_bytes()))
        ),
    }
}

/// The interrupt function's resources, built once per container.
pub struct Interrupter<C> {
    cluster: C,
    store: StateStore,
    sqs: aws_sdk_sqs::Client,
    config: InterruptConfig,
}

impl<C: Cluster> Interrupter<C> {
    /// Wires the function.
    pub fn new(cluster: C, store: StateStore, sqs: aws_sdk_sqs::Client, config: InterruptConfig) -> Self {
        Interrupter {
            cluster,
            store,
            sqs,
            config,
        }
    }

    /// Handles one SQS batch now, with no deadline but Lambda's longest.
    pub async fn handle(&self, batch: &SqsEvent) -> InterruptOutcome {
        self.handle_within(batch, Deadline::outside_lambda()).await
    }

    /// Handles one SQS batch now, done by `deadline`: each event's own steps
    /// at once, then the batch's replacement, then the claims move to
    /// Draining, then the drains go on. An event the deadline leaves less
    /// than [`EVENT_RESERVE`] for is given back untouched (visible again
    /// within seconds), never cut between its taint and its drain record.
    pub async fn handle_within(&self, batch: &SqsEvent, deadline: Deadline) -> InterruptOutcome {
        // Boxed: the function's shell around it would pass the compiler's layout depth limit.
        Box::pin(self.handle_batch(batch, deadline)).await
    }

    /// [`Self::handle_within`]'s body.
    async fn handle_batch(&self, batch: &SqsEvent, deadline: Deadline) -> InterruptOutcome {
        let mut outcome = InterruptOutcome::default();
        let mut pending = Batch::default();
        // Acted on, to be recorded as handled once the batch's end succeeds.
        let mut handled: Vec<(&SqsMessage, String, i64)> = Vec::new();
        // Drains recorded by this batch, for their first eviction pass.
        let mut recorded: Vec<DrainRecord> = Vec::new();
        // The claims node repair is taking down, read once for the batch
        // (once per event was a tenth of a storm's DynamoDB calls).
        let mut repairing: Option<Vec<String>> = None;
        // Whatever an event's steps or the batch's replacement wait on when
        // the deadline nears, they stop there and their events go back.
        let cut = deadline.earlier_by(GIVE_BACK_MARGIN);
        for record in &batch.records {
            let message_id = record.message_id.clone().unwrap_or_default();
            let body = record.body.as_deref().unwrap_or("");
            let event = event::parse(body);
            outcome.received.push(event.kind.message_type());
            if let event::Kind::Unknown { error } = &event.kind {
                outcome.unknown += 1;
                tracing::warn!(%message_id, %error, source = ?event.source, detail_type = ?event.detail_type,
                    "acknowledging an interruption message nodesmith does not act on");
                continue;
            }
            if !deadline.leaves(EVENT_RESERVE) {
                tracing::warn!(%message_id, left_ms = deadline.remaining().as_millis() as u64,
                    "no time left for this event before the invocation's deadline; given back");
                self.give_back(record, deadline, &mut outcome).await;
                continue;
            }
            let now = Timestamp::now();
            let key = idempotency_key(&event, body);
            let secs = now.as_second();
            // Recorded only once acted on: an invocation that dies midway leaves
            // the event to its redelivery. Acting twice (a duplicate delivered
            // while the first is at work) is harmless: every step is idempotent,
            // and replacements are solved under the provision lease with the
            // first one's claims in flight.
            match before(cut, async { Ok(self.store.is_processed(&key, secs).await?) }).await {
                Ok(false) => {}
                Ok(true) => {
                    outcome.ignored += 1;
                    tracing::info!(%message_id, %key, "event already handled; acknowledging the duplicate");
                    continue;
                }
                Err(e) => {
                    tracing::error!(%message_id, error = %crate::telemetry::causes(&e), "cannot read the event's record; it will be retried");
                    self.give_back(record, deadline, &mut outcome).await;
                    continue;
                }
            }
            tracing::info!(%message_id, kind = event.kind.name(), instances = ?event.instance_ids, deadline = ?event.deadline, "interruption event");
            match before(cut, self.act(&event, now, &mut outcome, &mut recorded, &mut repairing)).await {
                Ok(acted) => {
                    for (claim, replace) in acted {
                        pending.acted(&message_id, &claim, replace);
                    }
                    handled.push((record, key, secs));
                }
                Err(e) => {
                    tracing::error!(%message_id, error = %crate::telemetry::causes(&e), "acting on the event failed; it will be retried");
                    self.give_back(record, deadline, &mut outcome).await;
                }
            }
        }
        // Every event's taint and drain record came first: now the first
        // eviction pass over each node, so a storm's last node is not
        // tainted only after every other node's evictions. The passes run
        // together (sharing the client's rate limit), so every node's first
        // eviction comes within a few requests, not after the nodes before it.
        let first_passes_then_replace = async {
            let passes = recorded
                .iter()
                .map(|r| async move { (r, draining::pass(&self.cluster, r, Timestamp::now()).await) });
            for (r, result) in futures::future::join_all(passes).await {
                if let Err(e) = result {
                    tracing::warn!(node = %r.node, error = %crate::telemetry::causes(&e), "first eviction pass failed; the drain is recorded and continued");
                }
            }
            self.replace_batch(&pending, &mut outcome).await
        };
        let mut failed: BTreeSet<String> = BTreeSet::new();
        if let Err(e) = before(cut, first_passes_then_replace).await {
            tracing::error!(nodes = ?pending.nodes(), error = %crate::telemetry::causes(&e),
                "the batch's replacement failed; its events will be retried (their drains are recorded)");
            failed.extend(pending.replacing());
        }
        // Draining only now: a Draining claim is never replaced again, so an
        // event whose replacement failed is retried with its claim as it was.
        let now = Timestamp::now();
        for (message_id, claims) in pending.settling() {
            if failed.contains(message_id) {
                continue;
            }
            for claim in claims {
                if let Err(e) = self.mark_draining(claim, now).await {
                    tracing::error!(%message_id, claim = %claim.name, error = %crate::telemetry::causes(&e), "cannot move the claim to Draining; the event will be retried");
                    failed.insert(message_id.clone());
                    break;
                }
            }
        }
        let by_id: BTreeMap<String, &SqsMessage> = handled
            .iter()
            .map(|(r, _, _)| (r.message_id.clone().unwrap_or_default(), *r))
            .collect();
        for message_id in &failed {
            if let Some(record) = by_id.get(message_id) {
                self.give_back(record, deadline, &mut outcome).await;
            }
        }
        for (record, key, secs) in handled {
            let message_id = record.message_id.clone().unwrap_or_default();
            if failed.contains(&message_id) {
                continue;
            }
            // Bounded: an answer past the deadline would get the invocation ended.
            match deadline
                .within(self.store.record_processed(&key, secs + PROCESSED_TTL_SECS, secs))
                .await
            {
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    tracing::warn!(%message_id, error = %crate::telemetry::causes(&e), "cannot record the event as handled; a redelivery acts on it again, harmlessly");
                }
                None => {
                    tracing::warn!(%message_id, "the deadline came before the event was recorded as handled; a redelivery acts on it again, harmlessly");
                }
            }
        }
        let stop_at = deadline.earlier_by(EVENT_RESERVE);
        let budget = self.config.drain_budget.min(stop_at.remaining());
        let mine: BTreeSet<String> = recorded.into_iter().map(|r| r.claim).collect();
        if let Err(e) = self
            .continue_drains_for(&mine, budget, stop_at.instant().into_std(), &mut outcome)
            .await
        {
            tracing::warn!(error = %crate::telemetry::causes(&e), "drains not continued; the next invocation or the sweep continues them");
        }
        outcome
    }

    /// Reports `record` failed and makes it visible again within seconds
    /// (backing off with its receive count), so its retry comes while the
    /// capacity it names is still there.
    /// A call still waiting at `deadline` is dropped: the message then
    /// returns after the queue's visibility timeout.
    async fn give_back(&self, record: &SqsMessage, deadline: Deadline, outcome: &mut InterruptOutcome) {
        let message_id = record.message_id.clone().unwrap_or_default();
        outcome.failed.push(message_id.clone());
        let (Some(queue), Some(handle)) = (&self.config.interruption_queue_url, &record.receipt_handle) else {
            tracing::warn!(%message_id, "NODESMITH_INTERRUPTION_QUEUE_URL not set: the failed message returns after the queue's visibility timeout");
            return;
        };
        let after = redelivery::retry_delay(self.config.retry_after, redelivery::receive_count(&record.attributes));
        match deadline
            .within(redelivery::redeliver_after(&self.sqs, queue, handle, after))
            .await
        {
            Some(Ok(())) => {
                tracing::info!(%message_id, after_secs = after.as_secs(), "failed message given back early")
            }
            Some(Err(e)) => {
                tracing::warn!(%message_id, error = %crate::telemetry::causes(&e), "cannot give the failed message back early; it returns after the queue's visibility timeout")
            }
            None => {
                tracing::warn!(%message_id, "the deadline came before the failed message was given back; it returns after the queue's visibility timeout")
            }
        }
    }

    /// Acts on one event at `now`: for each instance, capacity already gone
    /// is removed; otherwise the node is tainted and its drain recorded (in
    /// `recorded`, for the batch's first eviction passes). The claims node
    /// repair is taking down are read into `repairing` once per batch.
    /// Returns the claims acted on, with what the batch's replacement needs of each.
    async fn act(
        &self,
        ev: &Event,
        now: Timestamp,
        outcome: &mut InterruptOutcome,
        recorded: &mut Vec<DrainRecord>,
        repairing: &mut Option<Vec<String>>,
    ) -> Result<Vec<(NodeClaim, Option<ToReplace>)>, InterruptError> {
        let mut plans: Vec<(NodeClaim, Steps)> = Vec::new();
        for id in &ev.instance_ids {
            let claim = self.store.node_claim_by_instance(id).await?;
            if let Some(c) = &claim {
                if repairing.is_none() {
                    *repairing = Some(self.repairing().await?);
                }
                if repairing.as_ref().is_some_and(|r| r.contains(&c.name)) {
                    // The sweep's repair drains it by force and terminates it: one record, one termination.
                    outcome.ignored += 1;
                    tracing::info!(instance = %id, claim = %c.name, "node repair is replacing the node already");
                    continue;
                }
            }
            match decide(ev, claim.as_ref(), self.config.rebalance, now) {
                Reaction::Ignore { why } => {
                    outcome.ignored += 1;
                    tracing::info!(instance = %id, %why, "not acting");
                }
                Reaction::Act(steps) => {
                    if let Some(c) = claim {
                        plans.push((c, steps));
                    }
                }
            }
        }
        let mut acted = Vec::new();
        for (claim, s) in &plans {
            if s.remove {
                self.remove(claim, s, outcome).await?;
                continue;
            }
            let (replace, drain) = self.take_node_out(claim, s, now, outcome).await?;
            recorded.extend(drain);
            acted.push((claim.clone(), replace));
        }
        // The interrupted offerings are not chosen for the batch's replacement.
        let unavailable: Vec<_> = plans.iter().filter_map(|(_, s)| s.mark_unavailable.clone()).collect();
        if !unavailable.is_empty() {
            self.store
                .mark_unavailable(&unavailable, "Interrupted", now.as_second() + UNAVAILABLE_TTL_SECS)
                .await?;
        }
        Ok(acted)
    }

    /// Taint → record the drain, for one claim's node (the batch makes the
    /// first eviction pass once every event's node is tainted and recorded).
    /// When the drain cannot be recorded, the taint this call added comes off
    /// again (as Karpenter untaints the candidates of a disruption it
    /// abandons): a tainted node without a recorded drain would be emptied by
    /// nobody. Returns the node and its pods before evicting when the event
    /// asks for a replacement, and the drain in force.
    async fn take_node_out(
        &self,
        claim: &NodeClaim,
        s: &Steps,
        now: Timestamp,
        outcome: &mut InterruptOutcome,
    ) -> Result<(Option<ToReplace>, Option<DrainRecord>), InterruptError> {
        let Some(node) = &s.node else {
            return Ok((None, None));
        };
        let mut added = false;
        if s.taint {
            match self.cluster.taint_disrupted(node).await {
                Ok(a) => {
                    added = a;
                    outcome.tainted.push(node.clone());
                    let why = format!("interruption: {}", s.reason);
                    let on_node = EventSpec::disrupting(events::node_name_ref(node), &why);
                    // On the NodeClaim too, as Karpenter records it (its uid, for kubectl describe).
                    let uid = match self.cluster.node_claim_object(&claim.name).await {
                        Ok(o) => o.and_then(|o| o.metadata.uid),
                        // The event goes without it: `kubectl get events` still shows it.
                        Err(_) => None,
                    };
                    for e in [on_node.on_node_claim(&claim.name, uid), on_node] {
                        if let Err(err) = self.cluster.emit_event(&e).await {
                            tracing::warn!(node, error = %crate::telemetry::causes(&err), "cannot record the disruption event");
                        }
                    }
                }
                Err(e) if e.code() == Some(404) => tracing::info!(node, "the node is gone already"),
                Err(e) => return Err(e.into()),
            }
        }
        let mut in_force = None;
        if let Some(policy) = s.drain {
            let record = draining::record(&claim.name, node, s.reason, policy, now);
            match self.store.begin_drain(&record).await {
                Ok(r) => in_force = Some(r),
                Err(e) => {
                    if added && let Err(u) = self.cluster.untaint_disrupted(node).await {
                        tracing::error!(node, error = %crate::telemetry::causes(&u),
                            "cannot take the taint off a node whose drain was not recorded; the event's retry records it");
                    }
                    outcome.tainted.retain(|n| n != node || !added);
                    return Err(e.into());
                }
            }
            // The sweep terminates the node once drained, or at the deadline.
            let end = crate::lifecycle::termination::Begin {
                claim: claim.name.clone(),
                node: Some(node.clone()),
                reason: s.reason,
                policy,
            };
            self.store
                .begin_termination(&crate::lifecycle::termination::record(&end, now))
                .await?;
        }
        let replace = if s.replace {
            let pods = match self.cluster.pods_on_node(node).await {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(node, error = %crate::telemetry::causes(&e), "cannot list the node's pods; the replacement sees what is left on it");
                    Vec::new()
                }
            };
            Some(ToReplace {
                node: node.clone(),
                pods,
            })
        } else {
            None
        };
        Ok((replace, in_force))
    }

    /// The batch's replacement: one read of the cluster and one solve for the
    /// pods of every node it replaces, under the provision lease; when
    /// provision keeps the lease past our wait, a solve request instead.
    async fn replace_batch(&self, batch: &Batch, outcome: &mut InterruptOutcome) -> Result<(), InterruptError> {
        let nodes = batch.nodes();
        if nodes.is_empty() {
            return Ok(());
        }
        let now = Timestamp::now();
        match self.replace(batch, &nodes, now).await {
            Ok(created) => {
                outcome.replacements.extend(created);
                Ok(())
            }
            Err(InterruptError::Busy) => {
                // Provision is solving: it places the evicted pods once they
                // are pending, with every other pending pod.
                request_solve(
                    &self.sqs,
                    &self.config.pending_queue_url,
                    &SolveRequest::new("interruption", None),
                )
                .await?;
                tracing::warn!(
                    ?nodes,
                    "provision holds the lease; replacements handed to it as a solve request"
                );
                outcome.handed_to_provision.extend(nodes);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// The claims the sweep's node repair is taking down.
    async fn repairing(&self) -> Result<Vec<String>, InterruptError> {
        Ok(self
            .store
            .disruptions()
            .await?
            .into_iter()
            .filter(|d| d.reason == crate::disruption::Reason::Unhealthy)
            .map(|d| d.claim)
            .collect())
    }

    /// Moves a claim to Draining (version-checked, once).
    async fn mark_draining(&self, claim: &NodeClaim, now: Timestamp) -> Result<(), InterruptError> {
        self.store
            .advance_node_claim(&claim.name, |c| {
                let mut next = c.clone();
                next.advance(Phase::Draining, now).ok().map(|()| next)
            })
            .await?;
        Ok(())
    }

    /// Capacity already gone: one drain pass, the Node deleted, the claim
    /// removed, a solve requested for its pods.
    async fn remove(&self, claim: &NodeClaim, s: &Steps, outcome: &mut InterruptOutcome) -> Result<(), InterruptError> {
        if let Some(node) = &s.node {
            match drain(&self.cluster, node, Default::default()).await {
                Ok(report) if !report.is_complete() => {
                    tracing::info!(
                        node,
                        left = report.blocked_by_pdb.len() + report.do_not_disrupt.len() + report.waiting.len(),
                        "capacity gone; pods left go with the Node"
                    )
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(node, error = %crate::telemetry::causes(&e), "drain of a node whose capacity is gone failed")
                }
            }
            crate::kubernetes::cluster::delete_node_of(&self.cluster, node, claim.instance_id.as_deref()).await?;
        }
        self.store.remove_node_claim(claim, VersionCheck::Regardless).await?;
        self.store.end_drain(&claim.name).await?;
        request_solve(
            &self.sqs,
            &self.config.pending_queue_url,
            &SolveRequest::new(s.reason, Some(&claim.name)),
        )
        .await?;
        outcome.removed.push(claim.name.clone());
        outcome.removed_usd_per_hour += claim.price.unwrap_or(0.0);
        tracing::info!(claim = %claim.name, node = ?s.node, "capacity gone: node and claim removed, solve requested");
        Ok(())
    }

    /// A what-if solve with `nodes` removed, its new claims admitted through
    /// the capacity door.
    async fn replace(&self, batch: &Batch, nodes: &[String], now: Timestamp) -> Result<Vec<NodeClaim>, InterruptError> {
        let c = &self.config;
        let door = Door {
            store: &self.store,
            sqs: &self.sqs,
            launch_queue_url: &c.launch_queue_url,
            holder: &c.holder,
            lease_ttl: c.lease_ttl,
            lease_wait: c.lease_wait,
            // The batch's cut bounds the whole replacement, its release too.
            release_by: Deadline::outside_lambda(),
        };
        let door = &door;
        door.under_lease(|lease| async move {
            let mut snapshot = live::read_launchable(&self.cluster, &self.store, now).await?;
            batch.restore(&mut snapshot);
            let (replaced, seed) = (nodes.to_vec(), capacity::seed(&lease, now));
            // Off the runtime's thread, so the lease is renewed during a long solve.
            let plan = capacity::off_task(move || {
                let options = SolveOptions::without(replaced.iter().cloned());
                capacity::plan_replacements(&snapshot, &replaced, &options, Pending::Ignore, &seed, |_| {})
            })
            .await;
            for u in plan.unschedulable() {
                tracing::warn!(pod = %u.pod, reason = %u.reason, "no replacement can hold this pod");
            }
            let created = door.admit(&lease, &plan.claims()).await?;
            tracing::info!(replaced = ?nodes, replacements = created.len(), "replacement launched");
            Ok(created)
        })
        .await?
        .ok_or(InterruptError::Busy)?
    }

    /// Continues this batch's drains (claims in `mine`) and any drain whose
    /// force time has come for at most `budget`, starting no node's pass at
    /// or after `stop_at`. Other drains are their own invocation's and the
    /// sweep's: in a storm, 20 invocations each passing over every drain
    /// repeated each other's work 20 times over; a drain at its deadline is
    /// still forced by whichever invocation runs then.
    async fn continue_drains_for(
        &self,
        mine: &BTreeSet<String>,
        budget: Duration,
        stop_at: std::time::Instant,
        outcome: &mut InterruptOutcome,
    ) -> Result<(), InterruptError> {
        let keep = |r: &DrainRecord| mine.contains(&r.claim) || DrainPolicy::of(r).forced_at(Timestamp::now());
        let drained = draining::continue_drains(
            &self.cluster,
            &self.store,
            budget,
            self.config.drain_interval,
            stop_at,
            keep,
        )
        .await?;
        outcome.drained.extend(drained);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::draining::DrainPolicy;

    #[test]
    fn config_from_lookup() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        const BASE: &[(&str, &str)] = &[
            ("NODESMITH_LAUNCH_QUEUE_URL", "http://l"),
            ("NODESMITH_PENDING_QUEUE_URL", "http://p"),
        ];
        let c = InterruptConfig::from_lookup(env(&[
            ("NODESMITH_LAUNCH_QUEUE_URL", "http://l"),
            ("NODESMITH_PENDING_QUEUE_URL", "http://p"),
            ("NODESMITH_REBALANCE", "drain"),
            ("NODESMITH_INTERRUPT_DRAIN_BUDGET", "0"),
        ]))
        .unwrap();
        assert_eq!((c.rebalance, c.drain_budget), (RebalanceMode::Drain, Duration::ZERO));
        assert_eq!(
            InterruptConfig::from_lookup(env(BASE)).unwrap().rebalance,
            RebalanceMode::Ignore
        );
        assert!(InterruptConfig::from_lookup(env(&[("NODESMITH_LAUNCH_QUEUE_URL", "x")])).is_err());
        assert!(
            InterruptConfig::from_lookup(env(&[
                ("NODESMITH_LAUNCH_QUEUE_URL", "http://l"),
                ("NODESMITH_PENDING_QUEUE_URL", "http://p"),
                ("NODESMITH_REBALANCE", "maybe"),
            ]))
            .is_err()
        );
    }

    #[test]
    fn keys_and_records() {
        let e = event::parse(r#"{"id":"abc","source":"x"}"#);
        assert_eq!(idempotency_key(&e, "b"), "interrupt/abc");
        let anon = event::parse(r#"{"source":"x"}"#);
        assert!(idempotency_key(&anon, "b").starts_with("interrupt/sha256:"));
        let now: Timestamp = "2026-03-02T14:20:06Z".parse().unwrap();
        let policy = DrainPolicy {
            deadline: Some(now),
            force_from: None,
        };
        let c = NodeClaim::pending("c", "p", "k");
        assert_eq!(
            DrainPolicy::of(&draining::record(&c.name, "n", "r", policy, now)),
            policy
        );
    }
}
