//! The sweep function: every minute, under the `sweep` lease, it reads the
//! state table, the cluster and EC2, asks [`lifecycle::plan`] what each claim,
//! Node and instance needs, and carries that out within a time budget; what is
//! left over is found again by the next run. Every step is idempotent and
//! re-derived from what the world says, so a sweep killed at any point is
//! resumed by the next one. Whenever capacity is given up, or pods have waited
//! too long, it asks `provision` for a solve. Then it resolves each
//! EC2NodeClass and writes its status back ([`classes`]), decides a
//! disruption pass and moves every recorded disruption on ([`disrupt`]).
//! Last, it mirrors the claims as NodeClaim objects and writes NodePool
//! status ([`mirror`]).

pub mod classes;
pub mod disrupt;
pub mod mirror;
pub mod replicas;
pub mod reservations;
pub mod termination;
mod zonal;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;

use crate::catalog;
use crate::disruption::consolidation::ConsolidationOptions;
use crate::ec2::{Instance, Instances, InstancesError};
use crate::kubernetes::{Cluster, ClusterError, EventSpec};
use crate::lifecycle::{self, Action, LifecycleConfig, Observed, Removal};
use crate::messages::{SolveRequest, TriggerError, request_solve};
use crate::nodeclaim::{InvalidTransition, NodeClaim, Phase};
use crate::registration;
use crate::settings::{SettingError, Settings};
use crate::state::{Advance, ClaimListing, LAST_SOLVE, StateError, StateStore, UnreadableClaim, VersionCheck, now_ms};
use crate::telemetry::{Metric, Series};

/// The lease that keeps sweeps from acting at once.
pub const LEASE: &str = "sweep";
/// The part of the budget kept for the run's drain pass: disruptions' walks
/// start only before the budget's end less this and [`CLOSING_SHARE`] (or
/// its first half, if later).
const DRAIN_SHARE: Duration = Duration::from_secs(15);
/// The part of the budget kept at its end for what follows the drain pass
/// (finished drains, terminations, static pools, the mirror's share), and
/// the release.
const CLOSING_SHARE: Duration = MIRROR_SHARE.saturating_add(RELEASE_SHARE);
/// The budget's last second: the closing writes in flight end, the lease is released.
const RELEASE_SHARE: Duration = Duration::from_secs(1);
/// The least time the drain pass gets when the steps before it overran (a
/// slow read, many new disruptions), so drains are never starved.
const DRAIN_FLOOR: Duration = Duration::from_secs(5);
/// Time kept after the drain pass, before the invocation's deadline, for
/// what the run does after it (terminations, the mirror, and collection and
/// the catalog if they are still at work).
const DRAIN_RESERVE: Duration = Duration::from_secs(20);
/// Time kept before the invocation's deadline to release the lease of a run
/// cut there.
const RELEASE_MARGIN: Duration = Duration::from_secs(2);
/// The least time the mirror's writes get (taken from [`DRAIN_RESERVE`]
/// when the run is late): a few hundred writes, so a large first mirror
/// spreads over a few runs instead of holding up their real work.
const MIRROR_SHARE: Duration = Duration::from_secs(5);

/// Settings of the sweep function.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepConfig {
    /// The pending-pods queue, for solve requests (none: nothing is asked, a warning is logged).
    pub pending_queue_url: Option<String>,
    /// The launch queue, for disruption replacements (none: nodes whose pods
    /// need replacements wait tainted, a warning is logged).
    pub launch_queue_url: Option<String>,
    /// Timeouts and windows.
    pub lifecycle: LifecycleConfig,
    /// How long a run takes in all: disruption walks stop in time for the
    /// drain pass and the closing writes to end with it, lifecycle actions in
    /// time for the closing writes; the rest waits for the next run.
    pub budget: Duration,
    /// How long the sweep lease outlives its last renewal (renewed every
    /// third of that while a run works): how long a sweep that died blocks the next.
    pub lease: Duration,
    /// The same for the provision lease, which disruption replacements take.
    pub provision_lease: Duration,
    /// Who we are, for the leases (each run adds an identity of its own).
    pub holder: String,
    /// Consolidation's minimum saving and churn cooldown.
    pub consolidation: crate::disruption::consolidation::ConsolidationOptions,
    /// Node repair: on or off, and its tolerations.
    pub repair: crate::disruption::repair::RepairOptions,
}

impl SweepConfig {
    /// Reads settings through `get` (the environment in the function):
    /// `NODESMITH_PENDING_QUEUE_URL`, `NODESMITH_LAUNCH_QUEUE_URL`, and durations in Go notation (`30s`, `5m`, `500ms`):
    /// `NODESMITH_LAUNCH_TIMEOUT` (5m), `NODESMITH_REGISTRATION_TIMEOUT` (15m), `NODESMITH_RELAUNCH_AFTER` (30s),
    /// `NODESMITH_LEAK_WINDOW` (30s), `NODESMITH_LIVENESS_GRACE` (60s),
    /// `NODESMITH_BATCH_WINDOW` (10s), `NODESMITH_RESOLVE_EVERY` (60s),
    /// `NODESMITH_SWEEP_BUDGET` (60s), `NODESMITH_SWEEP_LEASE` (15s), `NODESMITH_REPLACEMENT_COOLDOWN` (15m);
    /// the stack's identity `NODESMITH_STACK_NAME` and the share of the fleet
    /// one run may collect, `NODESMITH_COLLECT_MAX_PERCENT` (10); and
    /// consolidation's minimum saving, `NODESMITH_CONSOLIDATION_MIN_SAVING`
    /// ($/h, 0.001) and `NODESMITH_CONSOLIDATION_MIN_SAVING_PERCENT` (1); and
    /// Karpenter's `SpotToSpotConsolidation` gate, `NODESMITH_SPOT_TO_SPOT_CONSOLIDATION` (false);
    /// node repair's switch and tolerations ([`crate::disruption::repair::RepairOptions::from_settings`]).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, SettingError> {
        Self::from_settings(&Settings::new(get))
    }

    /// From the process environment.
    pub fn from_env() -> Result<Self, SettingError> {
        Self::from_settings(&Settings::from_env())
    }

    /// As [`Self::from_lookup`], from any settings.
    pub fn from_settings(settings: &Settings<impl Fn(&str) -> Option<String>>) -> Result<Self, SettingError> {
        let d = LifecycleConfig::default();
        let c = ConsolidationOptions::default();
        let dur = |name: &str, default: Duration| settings.duration(name, default);
        Ok(SweepConfig {
            pending_queue_url: settings.optional("NODESMITH_PENDING_QUEUE_URL"),
            launch_queue_url: settings.optional("NODESMITH_LAUNCH_QUEUE_URL"),
            lifecycle: LifecycleConfig {
                launch_timeout: dur("NODESMITH_LAUNCH_TIMEOUT", d.launch_timeout)?,
                registration_timeout: dur("NODESMITH_REGISTRATION_TIMEOUT", d.registration_timeout)?,
                relaunch_after: dur("NODESMITH_RELAUNCH_AFTER", d.relaunch_after)?,
                leak_window: dur("NODESMITH_LEAK_WINDOW", d.leak_window)?,
                liveness_grace: dur("NODESMITH_LIVENESS_GRACE", d.liveness_grace)?,
                batch_window: dur("NODESMITH_BATCH_WINDOW", d.batch_window)?,
                resolve_every: dur("NODESMITH_RESOLVE_EVERY", d.resolve_every)?,
                stack: settings.optional(crate::ec2::instances::STACK_ENV),
                collect_max_percent: settings.parsed("NODESMITH_COLLECT_MAX_PERCENT", d.collect_max_percent)?,
            },
            budget: dur("NODESMITH_SWEEP_BUDGET", Duration::from_secs(60))?,
            lease: dur("NODESMITH_SWEEP_LEASE", Duration::from_secs(15))?,
            provision_lease: crate::capacity::lease_ttl(settings)?,
            holder: format!("sweep-{}-{}", std::process::id(), now_ms()),
            consolidation: ConsolidationOptions {
                min_saving_per_hour: settings.number("NODESMITH_CONSOLIDATION_MIN_SAVING", c.min_saving_per_hour)?,
                min_saving_percent: settings
                    .number("NODESMITH_CONSOLIDATION_MIN_SAVING_PERCENT", c.min_saving_percent)?,
                replacement_cooldown: dur("NODESMITH_REPLACEMENT_COOLDOWN", c.replacement_cooldown)?,
                spot_to_spot: settings.parsed("NODESMITH_SPOT_TO_SPOT_CONSOLIDATION", c.spot_to_spot)?,
                ..c
            },
            repair: crate::disruption::repair::RepairOptions::from_settings(settings)?,
        })
    }
}

/// Why a sweep could not run at all (a failed step is reported, not an error).
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// The state table failed.
    #[error("state")]
    State(#[from] StateError),
    /// The Kubernetes API failed.
    #[error("cluster")]
    Cluster(#[from] ClusterError),
    /// EC2 failed.
    #[error("ec2")]
    Instances(#[from] InstancesError),
    /// Neither a stored nor the built-in catalog could be read.
    #[error("catalog")]
    Catalog(#[from] catalog::CatalogError),
    /// The run was still under way (a read, at thousands of nodes) when the
    /// invocation's deadline came; the next sweep goes on.
    #[error("the run was cut at the invocation's deadline")]
    OutOfTime,
}

/// One step that failed; the next run tries again.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// The state table failed (a version conflict means someone else moved the claim).
    #[error(transparent)]
    State(#[from] StateError),
    /// The Kubernetes API failed.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// EC2 failed.
    #[error(transparent)]
    Instances(#[from] InstancesError),
    /// The claim cannot move to the phase asked for.
    #[error(transparent)]
    Transition(#[from] InvalidTransition),
    /// A solve request could not be queued.
    #[error(transparent)]
    Trigger(#[from] TriggerError),
    /// The snapshot a disruption is checked against could not be read.
    #[error(transparent)]
    Snapshot(#[from] crate::snapshot::live::SnapshotError),
    /// Launch requests could not be queued.
    #[error(transparent)]
    Enqueue(#[from] crate::messages::EnqueueError),
    /// Replacements could not be admitted.
    #[error("adding replacements")]
    Capacity(#[from] crate::capacity::CapacityError),
    /// The capacity reservations of nodes could not be read.
    #[error("reading capacity reservations")]
    Reservations(#[source] Box<crate::nodeclass::NodeClassError>),
}

/// When each part of a run ends, from its start and budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Schedule {
    /// No disruption walk starts after it.
    walks_by: Instant,
    /// No lifecycle action starts after it (a node's registration,
    /// timeouts and collection come before the drain pass's share), and the
    /// drain pass ends by it (unless the steps overran).
    drains_by: Instant,
    /// The closing writes end by it: the budget's end less [`RELEASE_SHARE`].
    end: Instant,
}

impl Schedule {
    /// The walks get the budget less the drain pass's and the closing shares,
    /// and at least its first half (a short budget still gets walks done).
    fn of(started: Instant, budget: Duration) -> Schedule {
        let end = started + budget.saturating_sub(RELEASE_SHARE);
        let walks_by = (started + budget.saturating_sub(DRAIN_SHARE + CLOSING_SHARE)).max(started + budget / 2);
        Schedule {
            walks_by,
            drains_by: (started + budget.saturating_sub(CLOSING_SHARE)).max(walks_by),
            end,
        }
    }
}

/// `work`'s output and the milliseconds it took, for the run's log of where its time went.
async fn timed<T>(work: impl std::future::Future<Output = T>) -> (T, u64) {
    let start = Instant::now();
    let out = work.await;
    (out, start.elapsed().as_millis() as u64)
}

/// What one run did.
#[derive(Debug, Default)]
pub struct SweepReport {
    /// Another sweep held the lease: nothing was done.
    pub skipped: bool,
    /// Actions carried out.
    pub done: Vec<Action>,
    /// Actions that failed, with why.
    pub failed: Vec<(Action, StepError)>,
    /// Actions left for the next run (the budget ran out).
    pub deferred: Vec<Action>,
    /// The solve request queued, if any.
    pub solve_requested: Option<SolveRequest>,
    /// What disruption did.
    pub disruption: disrupt::DisruptionRunReport,
    /// EC2NodeClass statuses written and classes not resolved.
    pub classes: classes::ClassReport,
    /// The $/h of the capacity this run gave up, for the meter.
    pub removed_usd_per_hour: f64,
    /// Claim items this release could not read (left out, their instances spared).
    pub unreadable_claims: usize,
    /// Claims given up because the API server refused their registration (422).
    pub registrations_refused: Vec<String>,
    /// What static pools (`replicas`) launched.
    pub replicas: replicas::ReplicasReport,
    /// Terminations begun and carried out (deleted Nodes and NodePools, interruptions).
    pub terminations: termination::TerminationReport,
    /// Nodes relabelled out of their reservation, and capacity-block nodes whose termination began.
    pub reservations: reservations::ReservationReport,
    /// NodeClaim objects and NodePool statuses written.
    pub mirror: mirror::MirrorReport,
    /// The run's labelled metrics: what it changed by pool, and the fleet's gauges.
    pub series: Vec<Series>,
}

/// Garbage collection without what an unreadable claim item names: its
/// instance (recorded on the item, or tagged with its name) and that
/// instance's Node stay until a release that can read the item decides (pure).
pub fn spare_unreadable(
    actions: Vec<Action>,
    unreadable: &[UnreadableClaim],
    nodes: &[Node],
    instances: &[Instance],
) -> Vec<Action> {
    if unreadable.is_empty() {
        return actions;
    }
    let names: BTreeSet<&str> = unreadable.iter().map(|u| u.name.as_str()).collect();
    let mut ids: BTreeSet<&str> = unreadable.iter().filter_map(|u| u.instance_id.as_deref()).collect();
    ids.extend(
        instances
            .iter()
            .filter(|i| i.node_claim().is_some_and(|c| names.contains(c)))
            .map(|i| i.id.as_str()),
    );
    let node_spared = |name: &str| {
        nodes.iter().any(|n| {
            n.metadata.name.as_deref() == Some(name)
                && (n
                    .spec
                    .as_ref()
                    .and_then(|s| s.provider_id.as_deref())
                    .and_then(registration::instance_id)
                    .is_some_and(|id| ids.contains(id))
                    || n.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(crate::labels::NODECLAIM))
                        .is_some_and(|c| names.contains(c.as_str())))
        })
    };
    actions
        .into_iter()
        .filter(|a| match a {
            Action::CollectInstance { instance, .. } => !ids.contains(instance.as_str()),
            Action::CollectNode { node } => !node_spared(node),
            _ => true,
        })
        .collect()
}

/// The $/h of the capacity a run gave up: claims it removed, and claims whose
/// Node it terminated at the end of a disruption; claims never launched have
/// no price and add nothing (pure).
pub fn removed_usd_per_hour(claims: &[NodeClaim], removed: &[&str], terminated_nodes: &[String]) -> f64 {
    claims
        .iter()
        .filter(|c| {
            removed.contains(&c.name.as_str()) || c.node_name.as_ref().is_some_and(|n| terminated_nodes.contains(n))
        })
        .filter_map(|c| c.price)
        .sum()
}

impl SweepReport {
    /// The run as CloudWatch metrics (EMF): actions done by kind, failures,
    /// deferred work, and `SweepsCompleted` (1 for a run that held the lease
    /// and finished, 0 for a skipped one), whose absence for minutes is the
    /// template's `SweepStalledAlarm`; then the labelled series
    /// ([`crate::metrics::sweep_changes`], [`crate::metrics::fleet`]).
    pub fn metrics(&self) -> Vec<Series> {
        let mut series = vec![Series::plain(self.counts())];
        series.extend(self.series.iter().cloned());
        series
    }

    /// The run's counts, unlabelled.
    fn counts(&self) -> Vec<Metric> {
        let count = crate::metrics::count;
        let done = |f: fn(&Action) -> bool| self.done.iter().filter(|a| f(a)).count();
        vec![
            count("SweepsCompleted", usize::from(!self.skipped)),
            count(
                "NodesRegistered",
                done(|a| matches!(a, Action::Register { .. })).saturating_sub(self.registrations_refused.len()),
            ),
            count("RegistrationsRefused", self.registrations_refused.len()),
            count("NodesInitialized", done(|a| matches!(a, Action::Initialize { .. }))),
            count("NodeClaimsRemoved", done(|a| matches!(a, Action::Remove { .. }))),
            count(
                "NodeClaimsRegistrationTimedOut",
                done(|a| {
                    matches!(
                        a,
                        Action::Remove {
                            reason: Removal::RegistrationTimeout,
                            ..
                        }
                    )
                }),
            ),
            count(
                "InstancesCollected",
                done(|a| matches!(a, Action::CollectInstance { .. })),
            ),
            count("NodesCollected", done(|a| matches!(a, Action::CollectNode { .. }))),
            count("NodeClaimsAdopted", done(|a| matches!(a, Action::Adopt { .. }))),
            count(
                "InstancesCollectionHeld",
                done(|a| matches!(a, Action::HoldCollection { .. })),
            ),
            count("LaunchesRequeued", done(|a| matches!(a, Action::Relaunch { .. }))),
            count("SweepStepsFailed", self.failed.len()),
            count("NodeClaimsUnreadable", self.unreadable_claims),
            count("SweepStepsDeferred", self.deferred.len()),
            count("SolvesRequested", usize::from(self.solve_requested.is_some())),
            count("DisruptionsStarted", self.disruption.started.len()),
            count("DisruptionReplacementsLaunched", self.disruption.launched.len()),
            count("NodesDisrupted", self.disruption.terminated.len()),
            count("DisruptionsAbandoned", self.disruption.abandoned.len()),
            count("DisruptionsBlocked", self.disruption.blocked.len()),
            count("DisruptionStepsFailed", self.disruption.failed.len()),
            count("NodeClassStatusesWritten", self.classes.written.len()),
            count("NodeClassesUnresolved", self.classes.unresolved.len()),
        ]
    }
}

/// The sweep function's resources, built once per container.
pub struct Sweeper<C> {
    cluster: C,
    store: StateStore,
    instances: Instances,
    sqs: aws_sdk_sqs::Client,
    config: SweepConfig,
    iam: Option<aws_sdk_iam::Client>,
    resolution: Option<Resolution>,
    price_list: Option<crate::catalog::price_list::PriceList>,
    zonal_shift: Option<crate::zonal_shift::ZonalShifts>,
    /// The uid of each claim's NodeClaim object as the last run listed
    /// them: events on a NodeClaim name it so `kubectl describe` finds them.
    object_uids: std::sync::Mutex<BTreeMap<String, String>>,
}

/// The clients that resolve EC2NodeClasses for drift (AMIs through SSM need
/// the cluster's Kubernetes version from EKS).
#[derive(Debug, Clone)]
pub(crate) struct Resolution {
    pub(crate) ssm: aws_sdk_ssm::Client,
    pub(crate) eks: aws_sdk_eks::Client,
}

impl<C: Cluster> Sweeper<C> {
    /// Wires the function.
    pub fn new(
        cluster: C,
        store: StateStore,
        instances: Instances,
        sqs: aws_sdk_sqs::Client,
        config: SweepConfig,
    ) -> Self {
        Sweeper {
            cluster,
            store,
            instances,
            sqs,
            config,
            iam: None,
            resolution: None,
            price_list: None,
            zonal_shift: None,
            object_uids: std::sync::Mutex::default(),
        }
    }

    /// Reads ARC's zonal shifts once a disruption pass: consolidation plans
    /// no replacement in a zone traffic is shifted away from (`None`: off).
    pub fn with_zonal_shift(mut self, zonal_shift: Option<crate::zonal_shift::ZonalShifts>) -> Self {
        self.zonal_shift = zonal_shift;
        self
    }

    /// The catalog refresh reads the region's on-demand prices from the AWS
    /// Price List API (the bundled table is the stated fallback).
    pub fn with_price_list(mut self, price_list: Option<crate::catalog::price_list::PriceList>) -> Self {
        self.price_list = price_list;
        self
    }

    /// Also collects the instance profiles no EC2NodeClass names and no instance uses (`nodeclass::profile`).
    pub fn with_iam(mut self, iam: aws_sdk_iam::Client) -> Self {
        self.iam = Some(iam);
        self
    }

    /// Also resolves each EC2NodeClass once a run: its status is written back
    /// (`sweep::classes`) and drift is found by live resolution (a new AMI,
    /// subnets or security groups no longer selected).
    pub fn with_resolution(mut self, ssm: aws_sdk_ssm::Client, eks: aws_sdk_eks::Client) -> Self {
        self.resolution = Some(Resolution { ssm, eks });
        self
    }

    /// One run at the current time.
    pub async fn run(&self) -> Result<SweepReport, SweepError> {
        // Boxed: one more async layer would pass the compiler's layout depth limit.
        Box::pin(self.run_at(Timestamp::now())).await
    }

    /// One run at the current time that starts no step after `deadline`
    /// (nor after its own budget, whichever ends first).
    pub async fn run_within(&self, deadline: crate::deadline::Deadline) -> Result<SweepReport, SweepError> {
        Box::pin(self.run_at_within(Timestamp::now(), deadline)).await
    }

    /// One run whose decisions (timeouts, leak windows, expiry) take `now`
    /// as the time: tests reach a timeout by passing a later time, not by
    /// waiting. The lease keeps the wall clock.
    pub async fn run_at(&self, now: Timestamp) -> Result<SweepReport, SweepError> {
        self.run_at_within(now, crate::deadline::Deadline::outside_lambda())
            .await
    }

    /// [`Self::run_at`] whose time budget ends by `deadline` at the latest.
    pub async fn run_at_within(
        &self,
        now: Timestamp,
        deadline: crate::deadline::Deadline,
    ) -> Result<SweepReport, SweepError> {
        // The budget is counted from `started`: moved back by what the
        // deadline cuts off, it runs out at the earlier of the two.
        let started = deadline
            .budget_start(self.config.budget, tokio::time::Instant::now())
            .into_std();
        let ttl = self.config.lease.as_millis() as i64;
        let Some(lease) = self
            .store
            .acquire_lease(
                LEASE,
                &crate::state::invocation_holder(&self.config.holder),
                ttl,
                now_ms(),
            )
            .await?
        else {
            tracing::info!("another sweep holds the lease; skipping this run");
            return Ok(SweepReport {
                skipped: true,
                ..SweepReport::default()
            });
        };
        let result = self
            .store
            .while_holding(
                &lease,
                self.config.lease,
                // The backstop: whatever the run is doing when the deadline
                // comes, it ends there and the lease is released, rather than
                // Lambda ending the invocation with the lease held.
                async {
                    let run = self.run_leased(started, deadline.earlier_by(DRAIN_RESERVE).instant().into_std(), now);
                    deadline
                        .earlier_by(RELEASE_MARGIN)
                        .within(run)
                        .await
                        .unwrap_or(Err(SweepError::OutOfTime))
                },
            )
            .await;
        self.store.release_lease_by(&lease, deadline).await;
        result
    }

    /// One run under the lease; `drains_by`: no drain pass starts after it.
    async fn run_leased(
        &self,
        started: Instant,
        drains_by: Instant,
        now: Timestamp,
    ) -> Result<SweepReport, SweepError> {
        // The five reads at once (at thousands of nodes they are most of a
        // run, and each waits on a different service); how long each took.
        let (
            (claims, claims_ms),
            (nodes, nodes_ms),
            (objects, objects_ms),
            (catalog, catalog_ms),
            (instances, instances_ms),
        ) = tokio::join!(
            // Boxed: side by side, their futures would add up on the stack.
            timed(Box::pin(self.store.read_node_claims())),
            timed(Box::pin(self.cluster.nodes())),
            timed(Box::pin(self.cluster.node_claim_objects())),
            timed(Box::pin(self.store.get_catalog())),
            timed(Box::pin(self.instances.list_owned())),
        );
        let ClaimListing { claims, unreadable } = claims?;
        let nodes = nodes?;
        let objects = match objects {
            Ok(o) => Some(o),
            Err(e) => {
                tracing::warn!(error = %crate::telemetry::causes(&e), "NodeClaim objects not listed: none is mirrored, and none deleted counts, this run");
                None
            }
        };
        if let Some(objects) = &objects
            && let Ok(mut uids) = self.object_uids.lock()
        {
            *uids = objects
                .iter()
                .filter_map(|o| Some((o.metadata.name.clone()?, o.metadata.uid.clone()?)))
                .collect();
        }
        let objects_deleted: BTreeMap<String, Timestamp> = objects
            .iter()
            .flatten()
            .filter(|o| crate::mirror::is_ours(o))
            .filter_map(|o| Some((o.metadata.name.clone()?, crate::mirror::deleted_at(o)?)))
            .collect();
        let catalog = match catalog {
            Ok(Some(c)) => c,
            Ok(None) => catalog::builtin()?.clone(),
            // Only labels come from it: a registration must not wait for it.
            Err(e) => {
                tracing::warn!(error = %crate::telemetry::causes(&e), "cannot read the stored catalog; this run uses the built-in one");
                catalog::builtin()?.clone()
            }
        };
        let instances = match instances {
            Ok(i) => i,
            Err(e) => {
                // Liveness and collection need EC2's word; joining nodes do not.
                tracing::warn!(error = %crate::telemetry::causes(&e), "cannot list the instances; this run only registers and initializes nodes");
                self.join_only(&claims, &nodes, &catalog).await;
                return Err(e.into());
            }
        };
        tracing::info!(
            since_start_ms = started.elapsed().as_millis() as u64,
            claims_ms,
            nodes_ms,
            objects_ms,
            catalog_ms,
            instances_ms,
            claims = claims.len(),
            nodes = nodes.len(),
            instances = instances.len(),
            "sweep read the claims, Nodes, NodeClaim objects, catalog and instances"
        );
        let seen = Observed {
            now,
            claims: &claims,
            nodes: &nodes,
            instances: &instances,
            catalog: Some(&catalog),
        };
        let actions = spare_unreadable(
            lifecycle::plan(&seen, &self.config.lifecycle),
            &unreadable,
            &nodes,
            &instances,
        );
        let by_name: BTreeMap<&str, &NodeClaim> = claims.iter().map(|c| (c.name.as_str(), c)).collect();
        // The Nodes decided on: a deletion takes only that object, never one recreated since.
        let node_uids: BTreeMap<&str, &str> = nodes
            .iter()
            .filter_map(|n| Some((n.metadata.name.as_deref()?, n.metadata.uid.as_deref()?)))
            .collect();
        let mut report = SweepReport {
            unreadable_claims: unreadable.len(),
            ..SweepReport::default()
        };
        let Schedule {
            walks_by,
            drains_by: drains_end,
            end,
        } = Schedule::of(started, self.config.budget);
        let mut removed = Vec::new();
        for action in actions {
            if Instant::now() >= drains_end {
                report.deferred.push(action);
                continue;
            }
            match self.act(&action, &by_name, &node_uids).await {
                Ok(removal) => {
                    tracing::info!(action = ?action, "done");
                    if let (Some(reason), Action::Remove { claim, .. } | Action::Register { claim, .. }) =
                        (removal, &action)
                    {
                        if reason == lifecycle::Removal::RegistrationRefused {
                            report.registrations_refused.push(claim.clone());
                        }
                        removed.push((reason.as_str(), claim.clone()));
                    }
                    report.done.push(action);
                }
                Err(e) => {
                    tracing::warn!(action = ?action, error = %crate::telemetry::causes(&e), "step failed; the next sweep tries again");
                    report.failed.push((action, e));
                }
            }
        }
        self.report_held(&report.done, &instances).await;
        // Deleted Nodes and NodePools: their drains are recorded before the run's drain pass.
        Box::pin(self.begin_terminations(
            now,
            &claims,
            &nodes,
            &instances,
            &objects_deleted,
            &mut report.terminations,
        ))
        .await;
        // Reservations that ended or are about to: relabel, or drain before EC2 reclaims.
        Box::pin(self.end_reservations(now, &claims, &nodes, &instances, &catalog, &mut report.reservations)).await;
        if !report.deferred.is_empty() {
            tracing::info!(
                left = report.deferred.len(),
                "time budget spent; the next sweep goes on"
            );
        }
        // Every class resolved once: its status written back, its nodes checked for drift.
        let resolved = self.classes(now, &claims, &mut report.classes).await;
        report.disruption = self.disrupt(walks_by, now, &resolved, &instances).await;
        // One pass over every recorded drain (interruptions' and disruptions'),
        // then the disruptions whose drain just finished are terminated.
        // Drains get the budget up to its closing share, and when the steps
        // before overran, DRAIN_FLOOR within the budget, so they never starve.
        let stop_at = drains_end.max((Instant::now() + DRAIN_FLOOR).min(end)).min(drains_by);
        // Collection and the catalog wait on EC2 (and IAM), the drain pass on
        // the cluster: side by side, they do not add up.
        let (drained, ()) = tokio::join!(
            Box::pin(crate::draining::sweep_drains(&self.cluster, &self.store, stop_at)),
            Box::pin(self.collect_and_refresh()),
        );
        self.finish_drained(&drained, &mut report.disruption).await;
        Box::pin(self.finish_terminations(now, &mut report.terminations)).await;
        // Static pools back to their count, after this run's removals.
        report.replicas = Box::pin(self.keep_replicas(now)).await;
        let removed_claims: Vec<&str> = removed.iter().map(|(_, c)| c.as_str()).collect();
        report.removed_usd_per_hour = removed_usd_per_hour(&claims, &removed_claims, &report.disruption.terminated)
            + report.terminations.usd_per_hour;
        report.solve_requested = self.ask_for_solve(&removed, now).await;
        // kubectl's view, from what this run read less what it removed.
        let disrupted = &report.disruption.terminated;
        let terminated = &report.terminations.terminated;
        let live: Vec<&NodeClaim> = claims
            .iter()
            .filter(|c| !c.node_name.as_ref().is_some_and(|n| disrupted.contains(n)))
            .filter(|c| !removed_claims.contains(&c.name.as_str()) && !terminated.contains(&c.name))
            .collect();
        let mirror_by = end.max(Instant::now() + MIRROR_SHARE).min(drains_by + MIRROR_SHARE);
        let mut mirrored = mirror::MirrorReport::default();
        let read = mirror::Read {
            claims: &live,
            nodes: &nodes,
            objects: objects.as_deref(),
            states: report.disruption.node_states.as_ref(),
        };
        Box::pin(self.mirror(now, read, mirror_by, &mut mirrored)).await;
        let changes =
            crate::metrics::sweep_changes(&claims, &report.done, &report.disruption.started, disrupted, terminated);
        report.series = changes;
        report
            .series
            .extend(crate::metrics::decisions(&report.disruption.decisions));
        report
            .series
            .extend(crate::metrics::replacements_created(&report.disruption.created));
        report
            .series
            .extend(crate::metrics::startup(&report.disruption.pod_startups));
        if let Some(states) = &report.disruption.node_states {
            report.series.extend(crate::metrics::eligible(states));
        }
        report
            .series
            .extend(crate::metrics::consolidation_timeouts(report.disruption.consolidation));
        report.series.append(&mut mirrored.gauges);
        report.mirror = mirrored;
        tracing::info!(
            ran_ms = started.elapsed().as_millis() as u64,
            budget_ms = self.config.budget.as_millis() as u64,
            deferred = report.deferred.len() + report.disruption.deferred,
            "sweep run done"
        );
        Ok(report)
    }

    /// Collects what no EC2NodeClass uses, then refreshes the instance catalog.
    async fn collect_and_refresh(&self) {
        // Launch templates and instance profiles no EC2NodeClass uses any more (shared/src/launch/gc.rs).
        crate::launch::gc::sweep(
            &self.cluster,
            self.instances.ec2(),
            self.iam.as_ref(),
            &self.store,
            self.instances.cluster(),
        )
        .await;
        // The instance catalog from EC2: types every 12 h, spot prices hourly (shared/src/catalog_refresh.rs).
        crate::catalog_refresh::sweep(self.instances.ec2(), &self.store, self.price_list.as_ref()).await;
    }

    /// Registration and initialization only ([`lifecycle::joining_actions`]),
    /// for a run whose other reads failed.
    async fn join_only(&self, claims: &[NodeClaim], nodes: &[Node], catalog: &catalog::Catalog) {
        let by_name: BTreeMap<&str, &NodeClaim> = claims.iter().map(|c| (c.name.as_str(), c)).collect();
        let node_uids: BTreeMap<&str, &str> = nodes
            .iter()
            .filter_map(|n| Some((n.metadata.name.as_deref()?, n.metadata.uid.as_deref()?)))
            .collect();
        for action in lifecycle::joining_actions(claims, nodes, Some(catalog)) {
            match self.act(&action, &by_name, &node_uids).await {
                Ok(_) => tracing::info!(action = ?action, "done"),
                Err(e) => {
                    tracing::warn!(action = ?action, error = %crate::telemetry::causes(&e), "step failed; the next sweep tries again")
                }
            }
        }
    }

    /// Capacity given up, or pods waiting with nobody solving: ask `provision`.
    async fn ask_for_solve(&self, removed: &[(&str, String)], now: Timestamp) -> Option<SolveRequest> {
        let request = match removed {
            [(reason, claim)] => Some(SolveRequest::new(reason, Some(claim))),
            [] => match self.pods_due_a_solve(now).await {
                Ok(true) => Some(SolveRequest::new("pods-still-pending", None)),
                Ok(false) => None,
                Err(e) => {
                    tracing::warn!(error = %crate::telemetry::causes(&e), "cannot tell whether pending pods need a solve");
                    None
                }
            },
            _ => Some(SolveRequest::new("capacity-removed", None)),
        }?;
        let Some(url) = &self.config.pending_queue_url else {
            tracing::warn!(reason = %request.reason, "a solve is due but NODESMITH_PENDING_QUEUE_URL is not set");
            return None;
        };
        match request_solve(&self.sqs, url, &request).await {
            Ok(()) => {
                tracing::info!(reason = %request.reason, "solve requested");
                Some(request)
            }
            Err(e) => {
                tracing::warn!(error = %crate::telemetry::causes(&e), "cannot request a solve; the next sweep tries again");
                None
            }
        }
    }

    async fn pods_due_a_solve(&self, now: Timestamp) -> Result<bool, StepError> {
        let pending = self.cluster.pending_pods().await?;
        if pending.is_empty() {
            return Ok(false);
        }
        let last = self
            .store
            .marked_at(LAST_SOLVE)
            .await?
            .and_then(|ms| Timestamp::from_millisecond(ms).ok());
        Ok(lifecycle::solve_due(&pending, last, now, &self.config.lifecycle))
    }

    /// Carries one action out; the capacity it gave up, if it did.
    async fn act(
        &self,
        action: &Action,
        claims: &BTreeMap<&str, &NodeClaim>,
        node_uids: &BTreeMap<&str, &str>,
    ) -> Result<Option<lifecycle::Removal>, StepError> {
        match action {
            Action::Register { claim, node, update } => {
                match self.cluster.update_node(node, update).await {
                    Ok(true) => {}
                    Ok(false) => return Ok(None),
                    // Invalid (a label the API server refuses): every retry gets the
                    // same answer while the node sits tainted and billed.
                    Err(ClusterError::Api { code: 422, message, .. }) => {
                        tracing::warn!(node_claim = %claim, node = %node, %message, "the API server refused the registration; the claim is given up");
                        self.event(EventSpec::registration_refused(claim, node, &message)).await;
                        let instance = claims.get(claim.as_str()).and_then(|c| c.instance_id.as_deref());
                        self.give_up(claim, instance, Some(node), claims, node_uids).await?;
                        return Ok(Some(lifecycle::Removal::RegistrationRefused));
                    }
                    Err(e) => return Err(e.into()),
                }
                if self
                    .advance(claim, Phase::Launched, |c| c.registered(node, Timestamp::now()))
                    .await?
                {
                    self.event(EventSpec::registered(node, claim)).await;
                }
                Ok(None)
            }
            Action::Initialize { claim, node } => {
                if !self
                    .cluster
                    .update_node(node, &registration::initialization_update())
                    .await?
                {
                    return Ok(None);
                }
                if self
                    .advance(claim, Phase::Registered, |c| {
                        c.advance(Phase::Initialized, Timestamp::now())
                    })
                    .await?
                {
                    self.event(EventSpec::initialized(node, claim)).await;
                }
                Ok(None)
            }
            Action::Remove {
                claim,
                reason,
                instance,
                node,
            } => {
                self.give_up(claim, instance.as_deref(), node.as_deref(), claims, node_uids)
                    .await?;
                Ok(Some(*reason))
            }
            Action::CollectInstance { instance, node } => {
                self.terminate(Some(instance)).await?;
                if let Some(n) = node {
                    self.cluster.delete_node(n, node_uids.get(n.as_str()).copied()).await?;
                }
                Ok(None)
            }
            Action::CollectNode { node } => {
                self.cluster
                    .delete_node(node, node_uids.get(node.as_str()).copied())
                    .await?;
                Ok(None)
            }
            Action::Adopt { claim } => {
                match self.store.create_node_claim(claim).await {
                    Ok(_) => {}
                    // Written since the run read the table (a launch recorded it, a
                    // sweep adopted it): the table's claim stands.
                    Err(crate::state::StateError::AlreadyExists(_)) => return Ok(None),
                    Err(e) => return Err(e.into()),
                }
                tracing::warn!(
                    node_claim = %claim.name,
                    instance_id = claim.instance_id.as_deref().unwrap_or_default(),
                    node = claim.node_name.as_deref().unwrap_or_default(),
                    "adopted a registered node whose claim the state table did not have"
                );
                if let Some(node) = &claim.node_name {
                    self.event(lifecycle::adopt::adopted_event(node, claim)).await;
                }
                Ok(None)
            }
            // Reported once per pool after the run's steps (`report_held`).
            Action::HoldCollection { .. } => Ok(None),
            Action::Relaunch { claim } => {
                let lease = self.store.read_lease(&crate::launch::lease_name(claim)).await?;
                if lease.is_some_and(|l| l.until_ms > now_ms()) {
                    return Ok(None);
                }
                let Some(url) = &self.config.launch_queue_url else {
                    tracing::warn!(node_claim = %claim, "a launch is due again but NODESMITH_LAUNCH_QUEUE_URL is not set");
                    return Ok(None);
                };
                tracing::warn!(node_claim = %claim, "claim still Pending with no launch under way: its launch request is sent again");
                crate::messages::launch_requests::enqueue(
                    &self.sqs,
                    url,
                    &[crate::messages::LaunchRequest::new(claim)],
                )
                .await?;
                Ok(None)
            }
        }
    }

    /// One warning event per NodePool (and a log line) for the instances the
    /// run held back from collection: the cap on terminations was reached.
    async fn report_held(&self, done: &[Action], instances: &[crate::ec2::Instance]) {
        let mut by_pool: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for a in done {
            if let Action::HoldCollection {
                instance, node_pool, ..
            } = a
            {
                by_pool.entry(node_pool.as_str()).or_default().push(instance.as_str());
            }
        }
        if by_pool.is_empty() {
            return;
        }
        let cap = lifecycle::adopt::termination_cap(
            lifecycle::adopt::fleet_size(instances, &self.config.lifecycle),
            self.config.lifecycle.collect_max_percent,
        );
        for (pool, held) in by_pool {
            tracing::warn!(
                node_pool = pool,
                held = held.len(),
                cap,
                instances = ?held,
                "garbage collection held instances back: at most {cap} are terminated a run"
            );
            self.event(lifecycle::adopt::held_event(pool, held.len(), cap)).await;
        }
    }

    /// Gives a claim's capacity up: its instance, its Node, then the claim.
    async fn give_up(
        &self,
        claim: &str,
        instance: Option<&str>,
        node: Option<&str>,
        claims: &BTreeMap<&str, &NodeClaim>,
        node_uids: &BTreeMap<&str, &str>,
    ) -> Result<(), StepError> {
        // Instance first: a crash after it leaves a claim whose instance is
        // gone, which the next sweep removes; never an unowned instance.
        self.terminate(instance).await?;
        if let Some(n) = node {
            self.cluster.delete_node(n, node_uids.get(n).copied()).await?;
        }
        if let Some(c) = claims.get(claim) {
            self.store.remove_node_claim(c, VersionCheck::IfUnchanged).await?;
        }
        Ok(())
    }

    async fn terminate(&self, instance: Option<&str>) -> Result<(), StepError> {
        if let Some(id) = instance {
            let out = self.instances.terminate(&[id.to_string()]).await?;
            tracing::info!(instance_id = id, outcome = ?out.get(id), "terminated");
        }
        Ok(())
    }

    /// Re-reads the claim and, when it is still in `from`, applies `step` and
    /// writes it, version-checked (a claim that moved on meanwhile is left
    /// as it is). True when this call moved it.
    async fn advance(
        &self,
        name: &str,
        from: Phase,
        step: impl Fn(&mut NodeClaim) -> Result<(), InvalidTransition>,
    ) -> Result<bool, StepError> {
        let advanced = self
            .store
            .advance_node_claim(name, |c| {
                let mut next = c.clone();
                (c.phase == from && step(&mut next).is_ok()).then_some(next)
            })
            .await?;
        Ok(matches!(advanced, Advance::Moved(_)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runs_walks_drains_and_closing_writes_share_its_budget() {
        let t = Instant::now();
        let s = |secs: u64| t + Duration::from_secs(secs);
        let at = |budget: u64, walks_by: u64, drains_by: u64| {
            assert_eq!(
                Schedule::of(t, Duration::from_secs(budget)),
                Schedule {
                    walks_by: s(walks_by),
                    drains_by: s(drains_by),
                    end: s(budget.saturating_sub(1)),
                },
                "budget {budget} s"
            );
        };
        at(60, 39, 54);
        at(45, 24, 39);
        // Short budgets: the walks keep half, the drains what is left before the closing share.
        at(30, 15, 24);
        at(10, 5, 5);
        at(0, 0, 0);
    }

    #[test]
    fn capacity_given_up_is_priced_once_per_claim() {
        let claim = |name: &str, node: Option<&str>, price: Option<f64>| NodeClaim {
            node_name: node.map(String::from),
            price,
            ..NodeClaim::pending(name, "default", "default")
        };
        let claims = [
            claim("a", Some("n-a"), Some(0.1)),
            claim("b", Some("n-b"), Some(0.02)),
            claim("c", None, None),
            claim("d", Some("n-d"), Some(5.0)),
        ];
        // "a" removed and its node terminated: counted once; "c" never launched.
        let got = removed_usd_per_hour(&claims, &["a", "c"], &["n-a".to_string(), "n-b".to_string()]);
        assert!((got - 0.12).abs() < 1e-12, "{got}");
        assert_eq!(removed_usd_per_hour(&claims, &[], &[]), 0.0);
    }

    fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: BTreeMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn a_report_counts_what_was_done_by_kind() {
        let report = SweepReport {
            done: vec![
                Action::CollectNode { node: "n".into() },
                Action::Initialize {
                    claim: "c".into(),
                    node: "n".into(),
                },
            ],
            deferred: vec![Action::CollectNode { node: "m".into() }],
            ..SweepReport::default()
        };
        let m = crate::telemetry::totals(&report.metrics());
        assert_eq!(m["NodesCollected"], 1.0);
        assert_eq!(m["NodesInitialized"], 1.0);
        assert_eq!(m["NodesRegistered"], 0.0);
        assert_eq!(m["SweepStepsDeferred"], 1.0);
        assert_eq!(m["SolvesRequested"], 0.0);
    }

    #[test]
    fn a_finished_run_says_so_and_counts_nodes_that_never_registered() {
        let remove = |reason| Action::Remove {
            claim: "c".into(),
            reason,
            instance: Some("i-1".into()),
            node: None,
        };
        let report = SweepReport {
            done: vec![remove(Removal::RegistrationTimeout), remove(Removal::InstanceGone)],
            ..SweepReport::default()
        };
        let m = crate::telemetry::totals(&report.metrics());
        assert_eq!(m["SweepsCompleted"], 1.0);
        assert_eq!(m["NodeClaimsRegistrationTimedOut"], 1.0);
        assert_eq!(m["NodeClaimsRemoved"], 2.0);
        // A run that found the lease held did not sweep.
        let skipped = SweepReport {
            skipped: true,
            ..SweepReport::default()
        };
        let m = crate::telemetry::totals(&skipped.metrics());
        assert_eq!(m["SweepsCompleted"], 0.0);
    }

    #[test]
    fn garbage_collection_spares_what_an_unreadable_claim_names() {
        use crate::ec2::InstanceState;
        let instance = |id: &str, claim: &str| Instance {
            id: id.into(),
            instance_type: "m5.large".into(),
            zone: None,
            subnet_id: None,
            image_id: None,
            security_group_ids: BTreeSet::new(),
            state: InstanceState::Running,
            capacity_type: "on-demand".into(),
            capacity_reservation: None,
            launch_time: None,
            tags: BTreeMap::from([(crate::labels::NODECLAIM.to_string(), claim.to_string())]),
        };
        let node = |name: &str, id: &str| -> Node {
            serde_json::from_value(
                serde_json::json!({"metadata": {"name": name}, "spec": {"providerID": format!("aws:///z/{id}")}}),
            )
            .unwrap()
        };
        let unreadable = [UnreadableClaim {
            name: "newer-a".into(),
            instance_id: Some("i-recorded".into()),
            error: StateError::Corrupt {
                what: "nodeclaim",
                key: "newer-a".into(),
                reason: "unknown variant".into(),
            },
        }];
        let instances = [instance("i-tagged", "newer-a"), instance("i-leak", "gone-b")];
        let nodes = [
            node("n-recorded", "i-recorded"),
            node("n-tagged", "i-tagged"),
            node("n-orphan", "i-x"),
        ];
        let collect_instance = |id: &str| Action::CollectInstance {
            instance: id.into(),
            node: None,
        };
        let collect_node = |n: &str| Action::CollectNode { node: n.into() };
        let actions = vec![
            collect_instance("i-recorded"),
            collect_instance("i-tagged"),
            collect_instance("i-leak"),
            collect_node("n-recorded"),
            collect_node("n-tagged"),
            collect_node("n-orphan"),
            Action::Relaunch { claim: "other".into() },
        ];
        let kept = spare_unreadable(actions.clone(), &unreadable, &nodes, &instances);
        assert_eq!(
            kept,
            vec![
                collect_instance("i-leak"),
                collect_node("n-orphan"),
                Action::Relaunch { claim: "other".into() }
            ]
        );
        assert_eq!(spare_unreadable(actions.clone(), &[], &nodes, &instances), actions);
    }

    #[test]
    fn settings_default_to_karpenters_and_name_bad_values() {
        let c = SweepConfig::from_lookup(lookup(&[])).unwrap();
        assert_eq!(c.lifecycle, LifecycleConfig::default());
        assert_eq!(c.lifecycle.launch_timeout, Duration::from_secs(300));
        assert_eq!(c.lifecycle.registration_timeout, Duration::from_secs(900));
        assert_eq!(c.pending_queue_url, None);
        let c = SweepConfig::from_lookup(lookup(&[
            ("NODESMITH_LAUNCH_TIMEOUT", "2s"),
            ("NODESMITH_REGISTRATION_TIMEOUT", "1500ms"),
            ("NODESMITH_PENDING_QUEUE_URL", "http://q"),
        ]))
        .unwrap();
        assert_eq!(c.lifecycle.launch_timeout, Duration::from_secs(2));
        assert_eq!(c.lifecycle.registration_timeout, Duration::from_millis(1500));
        assert_eq!(c.pending_queue_url.as_deref(), Some("http://q"));
        let e = SweepConfig::from_lookup(lookup(&[("NODESMITH_LEAK_WINDOW", "soon")])).unwrap_err();
        assert_eq!(e.name, "NODESMITH_LEAK_WINDOW");
        assert!(e.to_string().contains("invalid duration"), "{e}");
    }

    #[test]
    fn the_stack_identity_and_the_collection_cap_are_settings() {
        let c = SweepConfig::from_lookup(lookup(&[])).unwrap();
        assert_eq!((c.lifecycle.stack, c.lifecycle.collect_max_percent), (None, 10));
        let c = SweepConfig::from_lookup(lookup(&[
            ("NODESMITH_STACK_NAME", "nodesmith-prod"),
            ("NODESMITH_COLLECT_MAX_PERCENT", "25"),
        ]))
        .unwrap();
        assert_eq!(c.lifecycle.stack.as_deref(), Some("nodesmith-prod"));
        assert_eq!(c.lifecycle.collect_max_percent, 25);
        let e = SweepConfig::from_lookup(lookup(&[("NODESMITH_COLLECT_MAX_PERCENT", "10%")])).unwrap_err();
        assert_eq!(e.name, "NODESMITH_COLLECT_MAX_PERCENT");
    }

    #[test]
    fn consolidation_settings_default_small_and_name_bad_values() {
        let c = SweepConfig::from_lookup(lookup(&[])).unwrap();
        assert_eq!(c.consolidation, ConsolidationOptions::default());
        assert!(c.consolidation.min_saving_per_hour > 0.0);
        let c = SweepConfig::from_lookup(lookup(&[
            ("NODESMITH_CONSOLIDATION_MIN_SAVING", "0.05"),
            ("NODESMITH_CONSOLIDATION_MIN_SAVING_PERCENT", "10"),
            ("NODESMITH_REPLACEMENT_COOLDOWN", "1h"),
        ]))
        .unwrap();
        assert_eq!(c.consolidation.min_saving_per_hour, 0.05);
        assert_eq!(c.consolidation.min_saving_percent, 10.0);
        assert_eq!(c.consolidation.replacement_cooldown, Duration::from_secs(3600));
        assert!(!c.consolidation.spot_to_spot, "off unless turned on");
        let on = SweepConfig::from_lookup(lookup(&[("NODESMITH_SPOT_TO_SPOT_CONSOLIDATION", "true")])).unwrap();
        assert!(on.consolidation.spot_to_spot);
        let e = SweepConfig::from_lookup(lookup(&[("NODESMITH_SPOT_TO_SPOT_CONSOLIDATION", "yes")])).unwrap_err();
        assert_eq!(e.name, "NODESMITH_SPOT_TO_SPOT_CONSOLIDATION");
        for bad in ["-1", "cheap", "NaN"] {
            let e = SweepConfig::from_lookup(lookup(&[("NODESMITH_CONSOLIDATION_MIN_SAVING", bad)])).unwrap_err();
            assert_eq!(e.name, "NODESMITH_CONSOLIDATION_MIN_SAVING");
            assert!(e.to_string().contains("non-negative number"), "{e}");
        }
    }
}
