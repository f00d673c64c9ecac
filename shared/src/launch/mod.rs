//! The launch path for one NodeClaim: read the claim from DynamoDB and its
//! EC2NodeClass from the cluster (never from the request: see
//! [`request`]), resolve the class ([`crate::nodeclass`], once per class a
//! run), ensure the launch templates its mapping calls for, CreateFleet with fallback over offerings,
//! and record the instance on the NodeClaim. A claim whose class no longer
//! exists is deleted (its pods are solved again), not retried.
//!
//! Exactly once under at-least-once delivery: a per-NodeClaim lease serialises
//! concurrent deliveries; after taking it the claim is re-read (Launched →
//! nothing to do) and EC2 is asked for instances already tagged with the
//! claim (a crash after CreateFleet but before the record): the oldest is
//! recorded, any other terminated. Each CreateFleet request is written to the
//! claim (its `launchAttempt`) before it is sent, with a ClientToken that is a
//! function of the claim and the attempt number only; a delivery that finds an
//! attempt not answered yet sends that same request again, so EC2 returns the
//! first call's fleet even while DescribeInstances does not list it. The lease
//! is never released after a CreateFleet launched an instance that is not
//! recorded yet (see [`LaunchError::Unrecorded`]).

pub mod batch;
pub mod errors;
pub mod fleet;
pub mod gc;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};

use aws_config::SdkConfig;
use jiff::Timestamp;
use tokio::sync::OnceCell;

pub use errors::LaunchError;

use self::fleet::{Launched, Override, Ruling, Scope};
use crate::apis::EC2NodeClass;
use crate::catalog::Catalog;
use crate::deadline::Deadline;
use crate::ec2::{Instance, Instances};
use crate::kubernetes::{Cluster, EventSpec, KubeCluster};
use crate::labels::{self, CAPACITY_ON_DEMAND};
use crate::messages::{LaunchRequest, SolveRequest, request_solve};
use crate::nodeclaim::{LaunchedInstance, NodeClaim, Phase};
use crate::nodeclass::ami::{AmiKey, ami_key_of};
use crate::nodeclass::resolved::{AMI_FAMILY_NOT_SET, NO_AMI_FAMILY};
use crate::nodeclass::subnet::{self, Subnet};
use crate::nodeclass::template::{Image, instance_tags, template_spec};
use crate::nodeclass::userdata::ClusterInfo;
use crate::nodeclass::{self, NodeClassError, RunClasses, capacityreservation, eks_cluster, launchtemplate, profile};
use crate::settings::{SettingError, Settings};
use crate::state::{self, OfferingKey, StateStore};

/// How long a launch's lease on its NodeClaim outlives its last renewal by
/// default (renewed every third of that while the launch runs): a launch that
/// died frees its claim that soon, and the sweep sends the claim's request
/// again (`NODESMITH_LAUNCH_LEASE`).
pub const LAUNCH_LEASE_MS: i64 = 15 * 1000;
/// How long the lease of a claim whose instance was launched but not recorded is
/// still held: past EC2's read lag, so the next holder finds the instance by its tag.
pub const LAUNCH_HOLD_MS: i64 = 60 * 1000;

/// What a launch cut at the deadline leaves itself to hold the claim's lease.
const HOLD_MARGIN: std::time::Duration = std::time::Duration::from_secs(2);
/// How long the lease item of a launch that did not end with its claim
/// launched (or gone) is kept before DynamoDB's TTL deletes it: far past the
/// launch timeout, after which the sweep gives the claim up, so the item of a
/// claim that never launches does not stay forever.
pub const LAUNCH_LEASE_ITEM_TTL: std::time::Duration = std::time::Duration::from_secs(60 * 60);
/// How many times one launch retries EC2's refusal of an instance profile it
/// cannot see yet (IAM is eventually consistent), waiting
/// [`PROFILE_RETRY_BASE`] doubled each time (about 15 s in all).
pub const PROFILE_RETRIES: u32 = 5;
/// The first wait after EC2 refused an instance profile.
pub const PROFILE_RETRY_BASE: std::time::Duration = std::time::Duration::from_millis(500);
/// The reason of the warning a launch EC2 refused for good records.
pub const LAUNCH_FAILED: &str = "LaunchFailed";
/// CreateFleet rounds before giving up (each round removes failed offerings).
pub const MAX_FLEET_ROUNDS: usize = 10;
/// How long a launch may spend writing its claim's NodeClaim object before
/// leaving the rest to the sweep (it is a read and two writes).
const MIRROR_TIME: std::time::Duration = std::time::Duration::from_secs(5);

/// What a launch request came to.
#[derive(Debug, Clone, PartialEq)]
pub enum LaunchOutcome {
    /// A new instance, recorded on the claim.
    Launched(NodeClaim),
    /// The claim was launched before (a redelivery); nothing done.
    AlreadyLaunched(NodeClaim),
    /// An instance tagged with the claim existed (crash before recording); now recorded.
    Recovered(NodeClaim),
    /// The claim no longer exists; nothing to do.
    Gone(String),
    /// The claim's EC2NodeClass cannot launch it (its selectors match nothing, an
    /// unsupported alias, no AMI family): the claim was deleted, for good, not
    /// retried; no solve is asked for (it would pick the same class again).
    NotLaunchable {
        /// The claim.
        node_claim: String,
        /// What the class lacks, e.g. `SubnetsNotFound: subnetSelectorTerms select no subnets`.
        reason: String,
    },
    /// No offering had capacity; the claim was deleted so its pods are solved again.
    NoCapacity {
        /// The claim.
        node_claim: String,
        /// Offerings tried and marked unavailable.
        tried: Vec<OfferingKey>,
    },
    /// The claim's EC2NodeClass is not in the cluster (deleted, or being
    /// deleted); the claim was deleted so its pods are solved again.
    ClassGone {
        /// The claim.
        node_claim: String,
        /// The EC2NodeClass it names.
        node_class: String,
    },
}

/// Settings of the launch function.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchConfig {
    /// The state table.
    pub table: String,
    /// The EKS cluster.
    pub cluster_name: String,
    /// The pending-pods queue: a claim given up for lack of capacity asks for a
    /// solve there, so its pods are placed again at once (none: they wait for
    /// the sweep's safety net).
    pub pending_queue_url: Option<String>,
    /// How long a launch's lease outlives its last renewal (ms).
    pub lease_ms: i64,
    /// The stack's identity, tagged on every instance
    /// ([`crate::ec2::instances::STACK_TAG`]) so only this stack's sweep adopts or collects it.
    pub stack: Option<String>,
    /// The least time one launch request may need before the invocation's
    /// deadline: with less left it is not started ([`batch::LAUNCH_RESERVE`]).
    pub reserve: std::time::Duration,
}

impl LaunchConfig {
    /// From `NODESMITH_TABLE` and `NODESMITH_CLUSTER_NAME`, naming what is missing, and
    /// the optional `NODESMITH_PENDING_QUEUE_URL` and `NODESMITH_LAUNCH_LEASE`
    /// (a Go duration, default [`LAUNCH_LEASE_MS`]) and `NODESMITH_STACK_NAME`.
    pub fn from_env() -> Result<Self, SettingError> {
        Self::from_settings(&Settings::from_env())
    }

    /// As [`Self::from_env`], from any settings.
    pub fn from_settings(settings: &Settings<impl Fn(&str) -> Option<String>>) -> Result<Self, SettingError> {
        let default_lease = std::time::Duration::from_millis(LAUNCH_LEASE_MS.unsigned_abs());
        Ok(LaunchConfig {
            table: settings.required("NODESMITH_TABLE")?,
            cluster_name: settings.required("NODESMITH_CLUSTER_NAME")?,
            pending_queue_url: settings.optional("NODESMITH_PENDING_QUEUE_URL"),
            lease_ms: settings.duration("NODESMITH_LAUNCH_LEASE", default_lease)?.as_millis() as i64,
            stack: settings.optional(crate::ec2::instances::STACK_ENV),
            reserve: batch::LAUNCH_RESERVE,
        })
    }
}

/// Clients and caches, built once per process; `C` reads EC2NodeClasses.
pub struct Launcher<C = KubeCluster> {
    kube: C,
    ec2: aws_sdk_ec2::Client,
    instances: Instances,
    ssm: aws_sdk_ssm::Client,
    eks: aws_sdk_eks::Client,
    sqs: aws_sdk_sqs::Client,
    iam: aws_sdk_iam::Client,
    store: StateStore,
    config: LaunchConfig,
    cluster: OnceCell<ClusterInfo>,
}

/// The claim's requirements as an algebra value (unknown operators are skipped, as they cannot narrow).
/// Capacity types the claim allows, reserved first, then spot; on-demand
/// when it says nothing (pure).
pub fn allowed_capacity_types(claim: &NodeClaim) -> Vec<String> {
    let r = claim.requirements();
    match r.get(labels::CAPACITY_TYPE) {
        None => vec![CAPACITY_ON_DEMAND.to_string()],
        Some(req) => [labels::CAPACITY_RESERVED, labels::CAPACITY_SPOT, CAPACITY_ON_DEMAND]
            .iter()
            .filter(|ct| req.has(ct))
            .map(|s| s.to_string())
            .collect(),
    }
}

/// Zones the claim allows, if it narrows them (pure).
pub fn allowed_zones(claim: &NodeClaim, known: impl IntoIterator<Item = String>) -> Option<BTreeSet<String>> {
    let r = claim.requirements();
    r.get(labels::ZONE)
        .map(|req| known.into_iter().filter(|z| req.has(z)).collect())
}

/// What an instance found by its claim tag says about the launch (pure).
fn launched_from(i: &Instance) -> Launched {
    Launched {
        instance_id: i.id.clone(),
        instance_type: i.instance_type.clone(),
        capacity_type: i.capacity_type.clone(),
        zone: i.zone.clone(),
        subnet_id: i.subnet_id.clone(),
        capacity_reservation: i.capacity_reservation.clone(),
    }
}

/// Records a launched instance on the claim, and the AMI when known (pure).
pub fn record(
    claim: &NodeClaim,
    launched: &Launched,
    zone: &str,
    (price, image_id): (Option<f64>, Option<String>),
    at: Timestamp,
) -> Result<NodeClaim, LaunchError> {
    let mut c = claim.clone();
    c.launched(
        LaunchedInstance {
            instance_id: launched.instance_id.clone(),
            instance_type: launched.instance_type.clone(),
            zone: zone.to_string(),
            capacity_type: launched.capacity_type.clone(),
            price,
            capacity_reservation: launched.capacity_reservation.clone(),
            image_id,
        },
        at,
    )?;
    Ok(c)
}

/// The lease a launch of `claim` holds while it runs (the sweep reads it
/// before sending a stale claim's launch request again).
pub fn lease_name(claim: &str) -> String {
    format!("launch/{claim}")
}

fn lease_holder() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "launch-{}-{}-{}",
        std::process::id(),
        state::now_ms(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The shell's clock: the pure parts take the time as an argument.
fn clock() -> Timestamp {
    Timestamp::now()
}

impl<C: Cluster> Launcher<C> {
    /// Builds the clients from one SDK configuration; EC2NodeClasses are read through `kube`.
    pub fn new(sdk: &SdkConfig, kube: C, config: LaunchConfig) -> Self {
        let store = StateStore::new(aws_sdk_dynamodb::Client::new(sdk), config.table.clone());
        let ec2 = aws_sdk_ec2::Client::new(sdk);
        Launcher {
            kube,
            instances: Instances::new(ec2.clone(), config.cluster_name.clone()),
            ec2,
            ssm: aws_sdk_ssm::Client::new(sdk),
            eks: aws_sdk_eks::Client::new(sdk),
            sqs: aws_sdk_sqs::Client::new(sdk),
            iam: aws_sdk_iam::Client::new(sdk),
            store,
            config,
            cluster: OnceCell::new(),
        }
    }

    /// The state store.
    pub fn store(&self) -> &StateStore {
        &self.store
    }

    async fn cluster(&self) -> Result<&ClusterInfo, LaunchError> {
        Ok(self
            .cluster
            .get_or_try_init(|| eks_cluster::describe(&self.eks, &self.config.cluster_name))
            .await?)
    }

    /// Handles one launch request, idempotently, as a run of its own.
    pub async fn launch(&self, req: &LaunchRequest) -> Result<LaunchOutcome, LaunchError> {
        self.launch_in(req, &RunClasses::default(), Deadline::outside_lambda())
            .await
    }

    /// Handles one launch request of a run (one batch): a class the run
    /// resolved for another claim is not resolved again.
    pub async fn launch_in(
        &self,
        req: &LaunchRequest,
        run: &RunClasses,
        deadline: Deadline,
    ) -> Result<LaunchOutcome, LaunchError> {
        let name = &req.node_claim;
        match self.store.get_node_claim(name).await? {
            None => return Ok(LaunchOutcome::Gone(name.clone())),
            Some(c) if c.phase != Phase::Pending => return Ok(LaunchOutcome::AlreadyLaunched(c)),
            Some(_) => {}
        }
        let lease_name = lease_name(name);
        let Some(lease) = self
            .store
            .acquire_lease(&lease_name, &lease_holder(), self.config.lease_ms, state::now_ms())
            .await?
        else {
            return Err(LaunchError::Busy(name.clone()));
        };
        let ttl = std::time::Duration::from_millis(self.config.lease_ms.max(1) as u64);
        // Cut at the deadline, less the time to hold the lease, rather than be
        // ended by Lambda in the middle: the invocation still answers for its batch.
        let cut = deadline.earlier_by(HOLD_MARGIN);
        let result = self
            .store
            .while_holding(&lease, ttl, async {
                cut.within(self.launch_leased(req, run))
                    .await
                    .unwrap_or_else(|| Err(LaunchError::OutOfTime(name.clone())))
            })
            .await;
        // Done with the claim: the lease item goes. Failed before an instance existed:
        // released for the redelivery. An instance launched but not recorded, or cut
        // at the deadline (its CreateFleet may have gone through): the lease is held
        // (shortened to LAUNCH_HOLD_MS), never released, so no one launches for the
        // claim meanwhile. A failed write only delays a redelivery until the lease expires.
        // Either failure may be the claim's last launch (the sweep gives it up): its
        // item then expires by TTL (LAUNCH_LEASE_ITEM_TTL).
        // What follows the launch is bounded by the deadline too: a write still
        // waiting then is dropped, as when an invocation dies there (the lease
        // expires at its TTL, the sweep writes the NodeClaim object).
        let after = async {
            let now = state::now_ms();
            let freed = match &result {
                Ok(_) => self.store.delete_lease(&lease, now).await,
                Err(e @ (LaunchError::Unrecorded { .. } | LaunchError::OutOfTime(_))) => {
                    tracing::warn!(node_claim = %name, error = %e, hold_ms = LAUNCH_HOLD_MS, "an instance may exist unrecorded; keeping the claim's lease");
                    self.store.renew_lease(&lease, LAUNCH_HOLD_MS, now).await.map(|_| ())
                }
                Err(_) => self.store.release_lease(&lease, now).await,
            };
            if let Err(e) = freed {
                tracing::warn!(node_claim = %name, error = %crate::telemetry::causes(&e), "cannot free launch lease");
            }
            if result.is_err() {
                let expires = now / 1000 + LAUNCH_LEASE_ITEM_TTL.as_secs() as i64;
                if let Err(e) = self.store.expire_lease_item(&lease_name, expires).await {
                    tracing::warn!(node_claim = %name, error = %crate::telemetry::causes(&e), "cannot set the launch lease item's expiry");
                }
            }
            if let Ok(LaunchOutcome::Launched(c) | LaunchOutcome::Recovered(c)) = &result {
                self.launched_event(c).await;
                self.mirror(c).await;
            }
        };
        if deadline.within(after).await.is_none() {
            tracing::warn!(node_claim = %name, "the deadline came before the launch lease was freed or the launch recorded in Kubernetes; the lease expires by itself");
        }
        result
    }

    /// Writes the claim's NodeClaim object now, so `kubectl get nodeclaims`
    /// shows the launch before the next sweep ([`crate::mirror`]); the sweep
    /// repairs whatever this misses, so a failure is only logged.
    async fn mirror(&self, c: &NodeClaim) {
        let read = async {
            let pool = self.kube.node_pool(&c.node_pool).await?;
            let existing = self.kube.node_claim_object(&c.name).await?;
            Ok::<_, crate::kubernetes::ClusterError>((pool, existing))
        };
        let (pool, existing) = match read.await {
            Ok(read) => read,
            Err(e) => {
                tracing::warn!(node_claim = %c.name, error = %crate::telemetry::causes(&e), "NodeClaim object not written; the next sweep writes it");
                return;
            }
        };
        // The claim's own object only: nothing here is an orphan to release.
        let facts = crate::mirror::Facts {
            claims: &[c],
            nodes: &[],
            pools: pool.as_slice(),
            states: None,
        };
        let plan = crate::mirror::plan(&facts, existing.as_slice(), clock());
        let stop_at = std::time::Instant::now() + MIRROR_TIME;
        let mut report = crate::mirror::write::MirrorReport::default();
        crate::mirror::write::write(&self.kube, &plan, stop_at, &mut report).await;
    }

    /// Records `Launched` on the claim; a failure is logged, never fatal.
    async fn launched_event(&self, c: &NodeClaim) {
        let event = EventSpec::launched(
            &c.name,
            c.instance_id.as_deref().unwrap_or_default(),
            c.instance_type.as_deref().unwrap_or_default(),
            c.zone.as_deref().unwrap_or_default(),
            c.capacity_type.as_deref().unwrap_or_default(),
        );
        if let Err(e) = self.kube.emit_event(&event).await {
            tracing::warn!(node_claim = %c.name, error = %crate::telemetry::causes(&e), "could not record the Launched event");
        }
    }

    async fn launch_leased(&self, req: &LaunchRequest, run: &RunClasses) -> Result<LaunchOutcome, LaunchError> {
        let name = &req.node_claim;
        // Re-read under the lease: the previous holder may have finished.
        let mut claim = match self.store.get_node_claim(name).await? {
            None => return Ok(LaunchOutcome::Gone(name.clone())),
            Some(c) if c.phase != Phase::Pending => return Ok(LaunchOutcome::AlreadyLaunched(c)),
            Some(c) => c,
        };
        // A crash after CreateFleet but before the record: a tagged instance is authoritative.
        if let Some(c) = self.adopt(&claim).await? {
            return Ok(LaunchOutcome::Recovered(c));
        }
        let mut unavailable: BTreeSet<OfferingKey> = self
            .store
            .unavailable_offerings(state::now_secs())
            .await?
            .into_iter()
            .map(|u| u.key)
            .collect();
        let mut resolved: Option<LaunchInputs> = None;
        let mut tried = Vec::new();
        let mut refusals = 0u32;
        for round in 0..MAX_FLEET_ROUNDS {
            let (plan, tags) = match claim.launch_attempt.as_ref().filter(|a| !a.concluded) {
                // A request sent before (its answer was lost): send it again as it was,
                // so EC2 answers with that call's fleet (DescribeInstances may not list it yet).
                Some(a) => {
                    tracing::info!(node_claim = %name, attempt = a.number, "repeating the last CreateFleet request");
                    (fleet::FleetPlan::from_attempt(a), a.tags.clone())
                }
                None => {
                    if resolved.is_none() {
                        // Read here, when a new request is built: a request sent before is
                        // repeated above without it, and an unanswered one is never given up.
                        let class = match self.node_class(&claim).await {
                            Ok(Some(class)) => class,
                            Ok(None) => return self.class_gone(&claim).await,
                            // Invalid: every retry would find the same (the sweep marks it not Ready).
                            Err(LaunchError::Resolve { what, .. }) => return self.give_up(&claim, what).await,
                            Err(e) => return Err(e),
                        };
                        // The node is launched from the class as it is now: its drift hash too.
                        claim.nodeclass_hash = Some(class.hash());
                        match self.resolve(&claim, &class, run).await {
                            Ok(r) => resolved = Some(r),
                            // No instance exists (none adopted, no attempt open): the claim goes.
                            Err(LaunchError::Resolve { what, .. }) => return self.give_up(&claim, what).await,
                            Err(e) => return Err(e),
                        }
                    }
                    let Some(r) = resolved.as_ref() else { break };
                    let cands = r.candidates(&unavailable);
                    let Some(ct) = fleet::capacity_type(&cands) else { break };
                    let number = claim.launch_attempt.as_ref().map_or(1, |a| a.number + 1);
                    let plan =
                        fleet::plan(fleet::client_token(&claim, number), &cands, ct).with_context(r.context.clone());
                    // Written before the call: a retry finds it and repeats it.
                    claim.launch_attempt = Some(plan.to_attempt(number, &r.tags));
                    claim = self.store.update_node_claim(&claim).await?;
                    (plan, r.tags.clone())
                }
            };
            tracing::info!(node_claim = %name, round, capacity_type = plan.capacity_type, overrides = plan.candidates().count(), "CreateFleet");
            let answer = match fleet::create(&self.ec2, &plan, &tags).await {
                // Refused before any fleet existed: the same request is sent again.
                Err(LaunchError::ProfileNotReady(why)) if refusals < PROFILE_RETRIES => {
                    refusals += 1;
                    wait_for_profile(name, refusals, &why).await;
                    continue;
                }
                Err(e @ LaunchError::Refused { .. }) => {
                    self.launch_refused(&claim, &e).await;
                    return Err(e);
                }
                other => other?,
            };
            let failed = fleet::capacity_failures(&plan, &answer);
            if !failed.is_empty() {
                tracing::warn!(node_claim = %name, offerings = ?failed, "insufficient capacity; marking offerings unavailable");
                let mut by_code: BTreeMap<String, Vec<OfferingKey>> = BTreeMap::new();
                for (k, code) in failed {
                    unavailable.insert(k.clone());
                    tried.push(k.clone());
                    by_code.entry(code).or_default().push(k);
                }
                for (code, keys) in by_code {
                    self.store
                        .mark_unavailable(&keys, &code, state::now_secs() + state::UNAVAILABLE_TTL_SECS)
                        .await?;
                }
            }
            let ruling = fleet::decide(&plan, &answer);
            if !matches!(ruling, Ruling::Launched(_))
                && let Some(a) = claim.launch_attempt.as_mut()
            {
                // Answered without an instance: the next request is a new attempt.
                a.concluded = true;
            }
            match ruling {
                Ruling::Launched(mut l) => {
                    let chosen = plan.candidates().find(|c| {
                        c.offering.instance_type == l.instance_type
                            && c.offering.capacity_type == l.capacity_type
                            && (l.subnet_id.as_ref() == Some(&c.subnet_id) || l.zone.as_ref() == Some(&c.offering.zone))
                    });
                    let zone = l
                        .zone
                        .clone()
                        .or_else(|| chosen.map(|c| c.offering.zone.clone()))
                        .unwrap_or_default();
                    let price = chosen.and_then(|c| c.price);
                    l.capacity_reservation = chosen.and_then(|c| c.reservation.clone());
                    // A request repeated after a lost answer has no resolution at hand: the AMI stays unknown.
                    let image = resolved.as_ref().and_then(|r| r.images.get(&l.instance_type)).cloned();
                    let launched = record(&claim, &l, &zone, (price, image), clock())?;
                    let c =
                        self.store
                            .update_node_claim(&launched)
                            .await
                            .map_err(|source| LaunchError::Unrecorded {
                                node_claim: name.clone(),
                                instance_id: l.instance_id.clone(),
                                source,
                            })?;
                    tracing::info!(node_claim = %name, instance_id = %l.instance_id, instance_type = %l.instance_type, zone = %zone, capacity_type = %l.capacity_type, "launched");
                    return Ok(LaunchOutcome::Launched(c));
                }
                // Already marked above; the next round tries the rest.
                Ruling::Retry(_) => {}
                Ruling::Transient(why) => {
                    self.conclude(&claim).await;
                    return Err(LaunchError::Aws {
                        op: "ec2:CreateFleet",
                        message: why,
                    });
                }
                // Refused inside the answer (which EC2 keeps under the token): a new attempt.
                Ruling::Fatal(code, message)
                    if profile::is_profile_refusal(&code, &message) && refusals < PROFILE_RETRIES =>
                {
                    refusals += 1;
                    wait_for_profile(name, refusals, &message).await;
                }
                Ruling::Fatal(code, message) => {
                    self.conclude(&claim).await;
                    let e = LaunchError::Fleet {
                        node_claim: name.clone(),
                        code,
                        message,
                    };
                    self.launch_refused(&claim, &e).await;
                    return Err(e);
                }
            }
        }
        tracing::warn!(node_claim = %name, tried = ?tried, "no offering has capacity; deleting the claim so its pods are solved again");
        self.store.delete_node_claim(name, claim.version).await?;
        self.request_solve_for(name, "launch-no-capacity").await;
        Ok(LaunchOutcome::NoCapacity {
            node_claim: name.clone(),
            tried,
        })
    }

    /// The claim's EC2NodeClass as the cluster has it now; None when it does
    /// not exist or is being deleted. A class that fails validation is a
    /// [`LaunchError::Resolve`] (the claim is given up with that reason).
    async fn node_class(&self, claim: &NodeClaim) -> Result<Option<EC2NodeClass>, LaunchError> {
        let Some(class) = self.kube.node_class(&claim.node_class).await? else {
            return Ok(None);
        };
        if class.metadata.deletion_timestamp.is_some() {
            return Ok(None);
        }
        class.validate().map_err(|e| LaunchError::Resolve {
            node_claim: claim.name.clone(),
            what: e.to_string(),
        })?;
        Ok(Some(class))
    }

    /// Gives up a claim whose EC2NodeClass is gone: no launch can ever be built
    /// for it, so it is deleted (not retried) and a solve requested for its pods.
    async fn class_gone(&self, claim: &NodeClaim) -> Result<LaunchOutcome, LaunchError> {
        let name = &claim.name;
        tracing::warn!(node_claim = %name, node_class = %claim.node_class, "the claim's EC2NodeClass does not exist; deleting the claim so its pods are solved again");
        self.store.delete_node_claim(name, claim.version).await?;
        self.request_solve_for(name, "launch-class-gone").await;
        Ok(LaunchOutcome::ClassGone {
            node_claim: name.clone(),
            node_class: claim.node_class.clone(),
        })
    }

    /// Asks for a solve after a claim was given up; a lost request leaves its
    /// pods to the sweep's safety net.
    async fn request_solve_for(&self, name: &str, reason: &str) {
        if let Some(url) = &self.config.pending_queue_url {
            let request = SolveRequest::new(reason, Some(name));
            if let Err(e) = request_solve(&self.sqs, url, &request).await {
                tracing::warn!(node_claim = %name, error = %crate::telemetry::causes(&e), "cannot request a solve after giving the claim up");
            }
        }
    }

    /// Deletes a claim its class cannot launch; a retry would find the same.
    async fn give_up(&self, claim: &NodeClaim, reason: String) -> Result<LaunchOutcome, LaunchError> {
        tracing::error!(node_claim = %claim.name, node_class = %claim.node_class, %reason, "the EC2NodeClass cannot launch this claim; deleting it (no retry)");
        self.store.delete_node_claim(&claim.name, claim.version).await?;
        Ok(LaunchOutcome::NotLaunchable {
            node_claim: claim.name.clone(),
            reason,
        })
    }

    /// EC2 refused the claim's launch for good (a bad AMI, an IAM denial):
    /// a `LaunchFailed` warning on its EC2NodeClass and on the NodeClaim, so
    /// `kubectl describe ec2nodeclass` and `kubectl get events` say why, as
    /// Karpenter's events do, and a record the sweep turns into the class's
    /// `LaunchSucceeded=False`. A failure to record is logged, never fatal.
    async fn launch_refused(&self, claim: &NodeClaim, why: &LaunchError) {
        tracing::error!(node_claim = %claim.name, node_class = %claim.node_class, error = %crate::telemetry::causes(why), "EC2 refused the launch");
        let (code, message) = why.refusal().unwrap_or(("", ""));
        if let Err(e) = self
            .store
            .record_launch_refusal(&claim.node_class, clock().as_millisecond(), code, message)
            .await
        {
            tracing::warn!(node_claim = %claim.name, error = %crate::telemetry::causes(&e), "could not record the refusal on its class");
        }
        let class = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("karpenter.k8s.aws/v1".into()),
            kind: Some("EC2NodeClass".into()),
            name: Some(claim.node_class.clone()),
            ..Default::default()
        };
        for object in [class, crate::kubernetes::events::nodeclaim_ref(&claim.name)] {
            let event = EventSpec {
                object,
                type_: crate::kubernetes::events::EventType::Warning,
                reason: LAUNCH_FAILED.into(),
                message: format!("Launching NodeClaim {} failed: {why}", claim.name),
            };
            if let Err(e) = self.kube.emit_event(&event).await {
                tracing::warn!(node_claim = %claim.name, error = %crate::telemetry::causes(&e), "could not record the LaunchFailed event");
            }
        }
    }

    /// Stores that the claim's last attempt was answered without an instance, so the
    /// next delivery makes a new request; if this write fails the next delivery
    /// repeats the request and gets the same answer, then tries again.
    async fn conclude(&self, claim: &NodeClaim) {
        if let Err(e) = self.store.update_node_claim(claim).await {
            tracing::warn!(node_claim = %claim.name, error = %crate::telemetry::causes(&e), "cannot record that the last CreateFleet launched nothing");
        }
    }

    /// Every instance tagged with the claim: the oldest is the claim's and is
    /// recorded, any other is a second launch and is terminated.
    async fn adopt(&self, claim: &NodeClaim) -> Result<Option<NodeClaim>, LaunchError> {
        let found = self.instances.find_all_by_claim(&claim.name).await?;
        let Some((keep, extra)) = found.split_first() else {
            return Ok(None);
        };
        if !extra.is_empty() {
            let ids: Vec<String> = extra.iter().map(|i| i.id.clone()).collect();
            tracing::warn!(node_claim = %claim.name, kept = %keep.id, terminated = ?ids, "more than one instance carries the claim's tag; terminating all but the oldest");
            self.instances.terminate(&ids).await?;
        }
        let existing = launched_from(keep);
        let zone = existing.zone.clone().unwrap_or_default();
        let price = claim
            .launch_attempt
            .as_ref()
            .and_then(|a| {
                a.overrides
                    .iter()
                    .find(|o| o.instance_type == existing.instance_type && o.zone == zone)
            })
            .and_then(|o| o.price);
        let c = self
            .store
            .update_node_claim(&record(
                claim,
                &existing,
                &zone,
                (price, keep.image_id.clone()),
                clock(),
            )?)
            .await
            .map_err(|source| LaunchError::Unrecorded {
                node_claim: claim.name.clone(),
                instance_id: existing.instance_id.clone(),
                source,
            })?;
        tracing::info!(node_claim = %claim.name, instance_id = %existing.instance_id, "found an instance launched before; recorded it");
        Ok(Some(c))
    }

    /// What a new CreateFleet request is built from: the class resolved (once
    /// this run), the templates its mapping calls for (ensured), the catalog and
    /// the instance tags. I/O glue around [`nodeclass::template::template_spec`].
    async fn resolve(
        &self,
        claim: &NodeClaim,
        class: &EC2NodeClass,
        run: &RunClasses,
    ) -> Result<LaunchInputs, LaunchError> {
        let name = &claim.name;
        let unusable = |what: String| LaunchError::Resolve {
            node_claim: name.clone(),
            what,
        };
        if class.ami_family().is_none() {
            return Err(unusable(format!("{AMI_FAMILY_NOT_SET}: {NO_AMI_FAMILY}")));
        }
        let cluster = self.cluster().await?.clone();
        let catalog = self.store.get_catalog().await?;
        let facts = match run.get(class) {
            Some(facts) => facts,
            None => {
                let facts = nodeclass::resolve(&self.ec2, &self.ssm, &cluster.name, &cluster.version, class).await?;
                run.put(class, facts)
            }
        };
        let key_by_type: BTreeMap<String, AmiKey> = claim
            .instance_type_options
            .iter()
            .map(|t| (t.clone(), ami_key_of(t, catalog.as_ref())))
            .collect();
        let keys: BTreeSet<AmiKey> = key_by_type.values().cloned().collect();
        if let Some(why) = facts.unusable_for(&keys) {
            return Err(unusable(why));
        }
        let amis = facts.amis_for(&keys);
        let images = key_by_type
            .iter()
            .filter_map(|(t, k)| Some((t.clone(), amis.get(k)?.clone())))
            .collect();
        let subnets = subnet::per_zone(&facts.subnets);

        // Made ready before any template names it; the name is the one resolved.
        if let Some((p, true)) = profile::ensure(&self.iam, &cluster.name, class).await? {
            tracing::info!(node_claim = %name, profile = %p, "instance profile made ready just now; EC2 may not see it for a few seconds");
        }
        let spec = |image: Image<'_>| {
            template_spec(class, &facts, &cluster, claim, &image).map_err(|e| match e {
                NodeClassError::UserData(source) => LaunchError::UserData {
                    node_claim: name.clone(),
                    source,
                },
                NodeClassError::Unusable { what } => unusable(what),
                other => other.into(),
            })
        };
        let mut tags = instance_tags(&cluster.name, claim, class);
        // On the instance only: templates are shared and named by their content.
        if let Some(stack) = &self.config.stack {
            tags.insert(crate::ec2::instances::STACK_TAG.into(), stack.clone());
        }
        let capacity_types = allowed_capacity_types(claim);
        // One template per (AMI, capacity type): the node's karpenter.sh/capacity-type
        // label is in its user data, and the capacity type is known per CreateFleet call;
        // reserved capacity has one per reservation.
        let mut templates: BTreeMap<(String, String), String> = BTreeMap::new();
        let zones = allowed_zones(claim, subnets.keys().cloned());
        let mut reserved = Vec::new();
        for ct in &capacity_types {
            if ct == labels::CAPACITY_RESERVED {
                for r in facts.capacity_reservations.iter().flatten().filter(|r| {
                    // An expiring capacity block takes no new node: its nodes are being drained.
                    r.state.as_deref() != Some(capacityreservation::EXPIRING)
                        && r.available_instance_count.is_some_and(|n| n > 0)
                        && claim.instance_type_options.contains(&r.instance_type)
                        && zones.as_ref().is_none_or(|z| z.contains(&r.availability_zone))
                }) {
                    let zone = &r.availability_zone;
                    let (Some(subnet), Some(image)) = (
                        subnets.get(zone),
                        key_by_type.get(&r.instance_type).and_then(|k| amis.get(k)),
                    ) else {
                        continue;
                    };
                    let template = spec(Image {
                        capacity_type: ct,
                        id: image,
                        reservation: Some(r),
                    })?;
                    reserved.push(Override {
                        offering: OfferingKey::new(&r.instance_type, zone, labels::CAPACITY_RESERVED),
                        subnet_id: subnet.id.clone(),
                        template: launchtemplate::ensure(&self.ec2, &template).await?,
                        price: catalog
                            .as_ref()
                            .and_then(|c| c.instance_types.iter().find(|i| i.name == r.instance_type))
                            .map(|i| i.reserved_price(zone)),
                        reservation: Some(capacityreservation::target(r)),
                    });
                }
                continue;
            }
            for (key, image) in &amis {
                let template = spec(Image {
                    capacity_type: ct,
                    id: image,
                    reservation: None,
                })?;
                let lt = launchtemplate::ensure(&self.ec2, &template).await?;
                for (t, k) in &key_by_type {
                    if k == key {
                        templates.insert((t.clone(), ct.clone()), lt.clone());
                    }
                }
            }
        }
        Ok(LaunchInputs {
            instance_types: claim.instance_type_options.clone(),
            zones,
            capacity_types,
            reserved,
            subnets,
            templates,
            catalog,
            tags,
            context: class.spec.context.clone(),
            images,
        })
    }
}

/// Waits before sending a request EC2 refused for an instance profile it cannot see yet.
async fn wait_for_profile(node_claim: &str, refusals: u32, why: &str) {
    let wait = PROFILE_RETRY_BASE * 2u32.pow(refusals.saturating_sub(1));
    tracing::warn!(
        node_claim,
        refusals,
        wait_ms = wait.as_millis() as u64,
        reason = why,
        "EC2 refused the instance profile (IAM propagation); retrying"
    );
    tokio::time::sleep(wait).await;
}

/// What [`Launcher::resolve`] found for one claim: what its CreateFleet requests are built from.
struct LaunchInputs {
    instance_types: Vec<String>,
    zones: Option<BTreeSet<String>>,
    capacity_types: Vec<String>,
    /// Reserved offerings with room, each with its reservation's template.
    reserved: Vec<Override>,
    subnets: BTreeMap<String, Subnet>,
    templates: BTreeMap<(String, String), String>,
    catalog: Option<Catalog>,
    tags: BTreeMap<String, String>,
    /// The class's CreateFleet `Context`.
    context: Option<String>,
    /// The AMI each instance type launches from.
    images: BTreeMap<String, String>,
}

impl LaunchInputs {
    /// Every offering that may be tried now: reserved ones first.
    fn candidates(&self, unavailable: &BTreeSet<OfferingKey>) -> Vec<Override> {
        let mut out: Vec<Override> = self
            .reserved
            .iter()
            .filter(|c| !unavailable.contains(&c.offering))
            .cloned()
            .collect();
        out.extend(fleet::candidates(&self.scope(), unavailable));
        out
    }

    fn scope(&self) -> Scope<'_> {
        Scope {
            instance_types: &self.instance_types,
            zones: self.zones.as_ref(),
            capacity_types: &self.capacity_types,
            subnets: &self.subnets,
            templates: &self.templates,
            catalog: self.catalog.as_ref(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::nodeclaim::fixtures::claim;

    #[test]
    fn capacity_types_and_zones_from_requirements() {
        assert_eq!(allowed_capacity_types(&claim(vec![])), vec!["on-demand"]);
        assert_eq!(
            allowed_capacity_types(&claim(vec![(labels::CAPACITY_TYPE, &["on-demand", "spot"])])),
            vec!["spot", "on-demand"]
        );
        assert_eq!(
            allowed_capacity_types(&claim(vec![(labels::CAPACITY_TYPE, &["spot"])])),
            vec!["spot"]
        );
        let known = || ["us-east-1a".to_string(), "us-east-1b".to_string()];
        assert_eq!(allowed_zones(&claim(vec![]), known()), None);
        assert_eq!(
            allowed_zones(&claim(vec![(labels::ZONE, &["us-east-1b"])]), known()),
            Some(BTreeSet::from(["us-east-1b".to_string()]))
        );
    }

    #[test]
    fn recording_moves_to_launched_once() -> Result<(), Box<dyn std::error::Error>> {
        let l = Launched {
            instance_id: "i-1".into(),
            instance_type: "m5.large".into(),
            capacity_type: "spot".into(),
            zone: None,
            subnet_id: None,
            capacity_reservation: None,
        };
        let t: Timestamp = "2026-01-01T00:00:00Z".parse()?;
        let c = record(&claim(vec![]), &l, "us-east-1a", (Some(0.03), Some("ami-1".into())), t)?;
        assert_eq!(c.phase, Phase::Launched);
        assert_eq!(c.provider_id.as_deref(), Some("aws:///us-east-1a/i-1"));
        assert_eq!(c.price, Some(0.03));
        assert_eq!(c.image_id.as_deref(), Some("ami-1"));
        assert!(record(&c, &l, "us-east-1a", (None, None), t).is_err());
        Ok(())
    }
}
