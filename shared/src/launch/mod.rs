//! The launch path for one NodeClaim: read the claim from DynamoDB and its
//! EC2NodeClass from the cluster (never from the request: see
//! [`request`]), resolve subnets, security groups and the AMI, build user
//! data, ensure a launch template, CreateFleet with fallback over offerings,
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

pub mod ami;
pub mod batch;
pub mod capacityreservation;
pub mod cluster;
pub mod errors;
pub mod fleet;
pub mod gc;
pub mod launchtemplate;
pub mod nodeclass;
pub mod profile;
pub mod securitygroup;
pub mod status;
pub mod subnet;
pub mod userdata;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};

use aws_config::SdkConfig;
use jiff::Timestamp;
use tokio::sync::OnceCell;

pub use errors::LaunchError;

use self::fleet::{Candidate, Decision, Launched, Scope};
use self::launchtemplate::TemplateSpec;
use self::userdata::{ClusterInfo, NodeSettings};
use crate::apis::ec2nodeclass::INSTANCE_STORE_RAID0;
use crate::apis::labels::{self, CAPACITY_ON_DEMAND};
use crate::apis::{EC2NodeClass, Taint, TaintEffect};
use crate::catalog::Catalog;
use crate::ec2::{Instance, Instances};
use crate::kubernetes::{Cluster, EventSpec, KubeCluster};
use crate::messages::{LaunchRequest, SolveRequest, request_solve};
use crate::nodeclaim::{LaunchedInstance, NodeClaim, Phase};
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
/// How many times one launch retries EC2's refusal of an instance profile it
/// cannot see yet (IAM is eventually consistent), waiting
/// [`PROFILE_RETRY_BASE`] doubled each time (about 15 s in all).
pub const PROFILE_RETRIES: u32 = 5;
/// The first wait after EC2 refused an instance profile.
pub const PROFILE_RETRY_BASE: std::time::Duration = std::time::Duration::from_millis(500);
/// CreateFleet rounds before giving up (each round removes failed offerings).
pub const MAX_FLEET_ROUNDS: usize = 10;

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
}

impl LaunchConfig {
    /// From `NODESMITH_TABLE` and `NODESMITH_CLUSTER_NAME`, naming what is missing, and
    /// the optional `NODESMITH_PENDING_QUEUE_URL` and `NODESMITH_LAUNCH_LEASE`
    /// (a Go duration, default [`LAUNCH_LEASE_MS`]).
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

/// The Kubernetes architecture of an instance type: the catalog's label, else
/// the naming rule (a `g` after the generation digit means Graviton) (pure).
pub fn arch_of(instance_type: &str, catalog: Option<&Catalog>) -> String {
    if let Some(a) = catalog
        .and_then(|c| c.instance_types.iter().find(|i| i.name == instance_type))
        .and_then(|i| i.labels.get(labels::ARCH))
    {
        return a.clone();
    }
    let family = instance_type.split('.').next().unwrap_or_default();
    let after_digit = family
        .trim_start_matches(|c: char| c.is_ascii_alphabetic())
        .trim_start_matches(|c: char| c.is_ascii_digit());
    if after_digit.starts_with('g') {
        "arm64".into()
    } else {
        "amd64".into()
    }
}

/// Whether an instance type has NVIDIA GPUs: the catalog's label, else the
/// naming rule (g and p families, but not the AMD-GPU g4ad) (pure).
pub fn has_nvidia_gpu(instance_type: &str, catalog: Option<&Catalog>) -> bool {
    if let Some(info) = catalog.and_then(|c| c.instance_types.iter().find(|i| i.name == instance_type)) {
        return info
            .labels
            .get(labels::aws::GPU_MANUFACTURER)
            .is_some_and(|m| m == "nvidia");
    }
    let family = instance_type.split('.').next().unwrap_or_default();
    let mut chars = family.chars();
    matches!(chars.next(), Some('g' | 'p'))
        && chars.next().is_some_and(|c| c.is_ascii_digit())
        && !family.starts_with("g4ad")
}

/// The AMI an instance type needs (pure).
pub fn ami_key_of(instance_type: &str, catalog: Option<&Catalog>) -> ami::AmiKey {
    ami::AmiKey {
        arch: arch_of(instance_type, catalog),
        nvidia: has_nvidia_gpu(instance_type, catalog),
    }
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

/// The kubelet's `--node-labels`: the claim's labels a kubelet may set
/// ([`labels::kubelet_may_set`]; nodesmith applies the others at registration),
/// plus the pool and the class. A label the launched instance decides
/// ([`labels::set_from_instance`]) is left out unless the claim's requirements
/// pin it to that value, so a prediction never reaches a node. The claim's name
/// is not there: user data is shared by every claim of a pool (one launch
/// template for them all); the node gets `karpenter.sh/nodeclaim` at
/// registration, from the instance's tag of that name (pure).
pub fn node_labels(claim: &NodeClaim) -> BTreeMap<String, String> {
    let pinned = claim.requirements().single_valued_labels();
    let mut l: BTreeMap<String, String> = claim
        .labels
        .iter()
        .filter(|(k, _)| labels::kubelet_may_set(k))
        .filter(|(k, v)| !labels::set_from_instance(k) || pinned.get(*k) == Some(*v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    l.insert(labels::NODEPOOL.into(), claim.node_pool.clone());
    l.insert(labels::EC2NODECLASS.into(), claim.node_class.clone());
    l
}

/// The taints a node registers with: the claim's taints and startup taints,
/// and `karpenter.sh/unregistered:NoExecute`, which nodesmith removes when it
/// registers the node (pure).
pub fn node_taints(claim: &NodeClaim) -> Vec<Taint> {
    let mut t: Vec<Taint> = claim.taints.iter().chain(&claim.startup_taints).cloned().collect();
    if !t.iter().any(|t| t.key == labels::UNREGISTERED_TAINT_KEY) {
        t.push(Taint::new(labels::UNREGISTERED_TAINT_KEY, None, TaintEffect::NoExecute));
    }
    t
}

/// What the node's user data tells its kubelet when launched as `capacity_type`:
/// [`node_labels`] with that capacity type, [`node_taints`], and the class's
/// kubelet settings and userData (pure).
pub fn node_settings(claim: &NodeClaim, class: &EC2NodeClass, capacity_type: &str) -> NodeSettings {
    let mut l = node_labels(claim);
    l.insert(labels::CAPACITY_TYPE.into(), capacity_type.to_string());
    NodeSettings {
        labels: l,
        taints: node_taints(claim),
        kubelet: class.spec.kubelet.clone(),
        user_data: class.spec.user_data.clone(),
        instance_store_raid0: class.spec.instance_store_policy.as_deref() == Some(INSTANCE_STORE_RAID0),
    }
}

/// Instance tags: the class's, then the ones nodesmith owns (pure).
pub fn instance_tags(cluster: &str, claim: &NodeClaim, class: &EC2NodeClass) -> BTreeMap<String, String> {
    let mut t = class.spec.tags.clone();
    t.insert(crate::ec2::instances::owned_tag_key(cluster), "owned".into());
    t.insert(crate::ec2::instances::CLUSTER_NAME_TAG.into(), cluster.into());
    t.insert(crate::ec2::instances::LAUNCHED_BY_TAG.into(), cluster.into());
    t.insert(labels::NODEPOOL.into(), claim.node_pool.clone());
    t.insert(labels::NODECLAIM.into(), claim.name.clone());
    t.insert(labels::EC2NODECLASS.into(), class.name().into());
    t
}

/// Tags of a launch template (and of the volumes and network interfaces it
/// makes): the instance tags without the claim's name, so every claim of a pool
/// shares one template, plus the class's drift hash, which the sweep compares
/// to find templates no class uses any more (pure).
pub fn template_tags(cluster: &str, claim: &NodeClaim, class: &EC2NodeClass) -> BTreeMap<String, String> {
    let mut t = instance_tags(cluster, claim, class);
    t.remove(labels::NODECLAIM);
    t.insert(labels::EC2NODECLASS_HASH_ANNOTATION.into(), class.hash());
    t
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

/// Records a launched instance on the claim (pure).
pub fn record(
    claim: &NodeClaim,
    launched: &Launched,
    zone: &str,
    price: Option<f64>,
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
        self.cluster
            .get_or_try_init(|| cluster::describe(&self.eks, &self.config.cluster_name))
            .await
    }

    /// Handles one launch request, idempotently.
    pub async fn launch(&self, req: &LaunchRequest) -> Result<LaunchOutcome, LaunchError> {
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
        let result = self.store.while_holding(&lease, ttl, self.launch_leased(req)).await;
        // Done with the claim: the lease item goes. Failed before an instance existed:
        // released for the redelivery. An instance launched but not recorded: the lease
        // is held (shortened to LAUNCH_HOLD_MS), never released, so no one launches for
        // the claim meanwhile. A failed write only delays a redelivery until the lease expires.
        let now = state::now_ms();
        let freed = match &result {
            Ok(_) => self.store.delete_lease(&lease, now).await,
            Err(LaunchError::Unrecorded { instance_id, .. }) => {
                tracing::warn!(node_claim = %name, instance_id = %instance_id, hold_ms = LAUNCH_HOLD_MS, "instance launched but not recorded; keeping the claim's lease");
                self.store.renew_lease(&lease, LAUNCH_HOLD_MS, now).await.map(|_| ())
            }
            Err(_) => self.store.release_lease(&lease, now).await,
        };
        if let Err(e) = freed {
            tracing::warn!(node_claim = %name, error = %e, "cannot free launch lease");
        }
        if let Ok(LaunchOutcome::Launched(c) | LaunchOutcome::Recovered(c)) = &result {
            self.launched_event(c).await;
        }
        result
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
            tracing::warn!(node_claim = %c.name, error = %e, "could not record the Launched event");
        }
    }

    async fn launch_leased(&self, req: &LaunchRequest) -> Result<LaunchOutcome, LaunchError> {
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
        let mut resolved: Option<Resolved> = None;
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
                        match self.resolve(&claim, &class).await {
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
            let decision = fleet::decide(&plan, &answer);
            if !matches!(decision, Decision::Launched(_))
                && let Some(a) = claim.launch_attempt.as_mut()
            {
                // Answered without an instance: the next request is a new attempt.
                a.concluded = true;
            }
            match decision {
                Decision::Launched(mut l) => {
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
                    let launched = record(&claim, &l, &zone, price, clock())?;
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
                Decision::Retry(_) => {}
                Decision::Transient(why) => {
                    self.conclude(&claim).await;
                    return Err(LaunchError::Aws {
                        op: "ec2:CreateFleet",
                        message: why,
                    });
                }
                // Refused inside the answer (which EC2 keeps under the token): a new attempt.
                Decision::Fatal(code, message)
                    if profile::is_profile_refusal(&code, &message) && refusals < PROFILE_RETRIES =>
                {
                    refusals += 1;
                    wait_for_profile(name, refusals, &message).await;
                }
                Decision::Fatal(code, message) => {
                    self.conclude(&claim).await;
                    return Err(LaunchError::Fleet {
                        node_claim: name.clone(),
                        code,
                        message,
                    });
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
                tracing::warn!(node_claim = %name, error = %e, "cannot request a solve after giving the claim up");
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

    /// Stores that the claim's last attempt was answered without an instance, so the
    /// next delivery makes a new request; if this write fails the next delivery
    /// repeats the request and gets the same answer, then tries again.
    async fn conclude(&self, claim: &NodeClaim) {
        if let Err(e) = self.store.update_node_claim(claim).await {
            tracing::warn!(node_claim = %claim.name, error = %e, "cannot record that the last CreateFleet launched nothing");
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
            .update_node_claim(&record(claim, &existing, &zone, price, clock())?)
            .await
            .map_err(|source| LaunchError::Unrecorded {
                node_claim: claim.name.clone(),
                instance_id: existing.instance_id.clone(),
                source,
            })?;
        tracing::info!(node_claim = %claim.name, instance_id = %existing.instance_id, "found an instance launched before; recorded it");
        Ok(Some(c))
    }

    /// What a new CreateFleet request is built from: subnets, security groups,
    /// AMIs, launch templates (ensured), the catalog, the instance tags.
    async fn resolve(&self, claim: &NodeClaim, class: &EC2NodeClass) -> Result<Resolved, LaunchError> {
        let name = &claim.name;
        let resolve = |what: String| LaunchError::Resolve {
            node_claim: name.clone(),
            what,
        };
        let family = class.ami_family().ok_or_else(|| {
            resolve(format!(
                "{}: {}",
                nodeclass::AMI_FAMILY_NOT_SET,
                nodeclass::NO_AMI_FAMILY
            ))
        })?;
        let cluster = self.cluster().await?.clone();
        let catalog = self.store.get_catalog().await?;

        let all_subnets = subnet::resolve(&self.ec2, &class.spec.subnet_selector_terms).await?;
        let subnets = subnet::per_zone(&all_subnets);
        if subnets.is_empty() {
            return Err(resolve(format!(
                "{}: {}",
                status::SUBNETS_NOT_FOUND,
                status::NO_SUBNETS
            )));
        }
        let security_groups = securitygroup::resolve(&self.ec2, &class.spec.security_group_selector_terms).await?;
        if security_groups.is_empty() {
            return Err(resolve(format!(
                "{}: {}",
                status::SECURITY_GROUPS_NOT_FOUND,
                status::NO_SECURITY_GROUPS
            )));
        }
        let key_by_type: BTreeMap<String, ami::AmiKey> = claim
            .instance_type_options
            .iter()
            .map(|t| (t.clone(), ami_key_of(t, catalog.as_ref())))
            .collect();
        let keys: BTreeSet<ami::AmiKey> = key_by_type.values().cloned().collect();
        let amis = ami::resolve(
            &self.ec2,
            &self.ssm,
            &class.spec.ami_selector_terms,
            &cluster.version,
            &keys,
        )
        .await
        .map_err(|e| match e {
            LaunchError::Resolve { what, .. } => resolve(what),
            other => other,
        })?;
        if amis.is_empty() {
            return Err(resolve(format!(
                "{}: {} for {keys:?}",
                status::AMI_NOT_FOUND,
                status::NO_AMIS
            )));
        }

        let instance_profile = match profile::ensure(&self.iam, &cluster.name, class).await? {
            Some((p, fresh)) => {
                if fresh {
                    tracing::info!(node_claim = %name, profile = %p, "instance profile made ready just now; EC2 may not see it for a few seconds");
                }
                Some(p)
            }
            None => None,
        };
        let tags = instance_tags(&cluster.name, claim, class);
        let capacity_types = allowed_capacity_types(claim);
        // One template per (AMI, capacity type): the node's karpenter.sh/capacity-type
        // label is in its user data, and the capacity type is known per CreateFleet call;
        // reserved capacity has one per reservation.
        let mut templates: BTreeMap<(String, String), String> = BTreeMap::new();
        let zones = allowed_zones(claim, subnets.keys().cloned());
        let mut reserved = Vec::new();
        for ct in &capacity_types {
            let settings = node_settings(claim, class, ct);
            let user_data = userdata::render(&family, &cluster, &settings).map_err(|source| LaunchError::UserData {
                node_claim: name.clone(),
                source,
            })?;
            let template = |image: &String| TemplateSpec {
                cluster: cluster.name.clone(),
                image_id: image.clone(),
                user_data: user_data.clone(),
                security_groups: security_groups.clone(),
                instance_profile: instance_profile.clone(),
                block_devices: launchtemplate::block_devices(&family, &class.spec.block_device_mappings),
                metadata: class.spec.metadata_options.clone(),
                monitoring: class.spec.detailed_monitoring.unwrap_or(false),
                associate_public_ip: class.spec.associate_public_ip_address,
                tags: {
                    let mut t = template_tags(&cluster.name, claim, class);
                    t.insert(gc::IMAGE_TAG.into(), image.clone());
                    t
                },
                capacity_reservation: None,
            };
            // Reserved offerings: one template per reservation (EC2 reads the target there).
            if ct == labels::CAPACITY_RESERVED {
                let reservations =
                    capacityreservation::resolve(&self.ec2, &class.spec.capacity_reservation_selector_terms).await?;
                for r in reservations.iter().filter(|r| {
                    r.available_instance_count.is_some_and(|n| n > 0)
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
                    let mut spec = template(image);
                    spec.tags.insert(gc::RESERVATION_TAG.into(), r.id.clone());
                    spec.capacity_reservation = Some(capacityreservation::target(r));
                    reserved.push(Candidate {
                        offering: OfferingKey::new(&r.instance_type, zone, labels::CAPACITY_RESERVED),
                        subnet_id: subnet.id.clone(),
                        template: launchtemplate::ensure(&self.ec2, &spec).await?,
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
                let lt = launchtemplate::ensure(&self.ec2, &template(image)).await?;
                for (t, k) in &key_by_type {
                    if k == key {
                        templates.insert((t.clone(), ct.clone()), lt.clone());
                    }
                }
            }
        }
        Ok(Resolved {
            instance_types: claim.instance_type_options.clone(),
            zones,
            capacity_types,
            reserved,
            subnets,
            templates,
            catalog,
            tags,
            context: class.spec.context.clone(),
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

/// What [`Launcher::resolve`] found for one claim.
struct Resolved {
    instance_types: Vec<String>,
    zones: Option<BTreeSet<String>>,
    capacity_types: Vec<String>,
    /// Reserved offerings with room, each with its reservation's template.
    reserved: Vec<Candidate>,
    subnets: BTreeMap<String, subnet::Subnet>,
    templates: BTreeMap<(String, String), String>,
    catalog: Option<Catalog>,
    tags: BTreeMap<String, String>,
    /// The class's CreateFleet `Context`.
    context: Option<String>,
}

impl Resolved {
    /// Every offering that may be tried now: reserved ones first.
    fn candidates(&self, unavailable: &BTreeSet<OfferingKey>) -> Vec<Candidate> {
        let mut out: Vec<Candidate> = self
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
    use crate::apis::nodepool::NodeSelectorRequirementWithMinValues;
    use crate::resources::Resources;

    fn claim(reqs: Vec<(&str, &[&str])>) -> NodeClaim {
        NodeClaim {
            requirements: reqs
                .into_iter()
                .map(|(k, vs)| {
                    serde_json::from_value::<NodeSelectorRequirementWithMinValues>(
                        serde_json::json!({"key": k, "operator": "In", "values": vs}),
                    )
                    .unwrap()
                })
                .collect(),
            instance_type_options: vec!["m5.large".into()],
            labels: BTreeMap::from([("team".to_string(), "a".to_string())]),
            version: 1,
            ..NodeClaim::pending("default-x", "default", "default")
        }
    }

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
    fn architecture_from_catalog_or_name() {
        for (t, want) in [
            ("m5.large", "amd64"),
            ("m6g.large", "arm64"),
            ("c7gd.xlarge", "arm64"),
            ("g5.xlarge", "amd64"),
            ("t4g.micro", "arm64"),
            ("m7i.large", "amd64"),
        ] {
            assert_eq!(arch_of(t, None), want, "{t}");
        }
    }

    #[test]
    fn nvidia_gpus_from_catalog_or_name() {
        for (t, want) in [
            ("g5.xlarge", true),
            ("p4d.24xlarge", true),
            ("g5g.xlarge", true),
            ("g4ad.xlarge", false),
            ("m5.large", false),
            ("c7gd.large", false),
        ] {
            assert_eq!(has_nvidia_gpu(t, None), want, "{t}");
        }
        let info = crate::catalog::InstanceTypeInfo {
            name: "x1.large".into(),
            labels: BTreeMap::from([
                (labels::aws::GPU_MANUFACTURER.to_string(), "nvidia".to_string()),
                (labels::ARCH.to_string(), "arm64".to_string()),
            ]),
            capacity: Resources::new(),
            allocatable: None,
            vcpus: 2,
            eni_max_pods: 29,
            offerings: vec![],
        };
        let catalog = Catalog {
            region: "r".into(),
            instance_types: vec![info],
        };
        assert_eq!(
            ami_key_of("x1.large", Some(&catalog)),
            ami::AmiKey {
                arch: "arm64".into(),
                nvidia: true
            }
        );
        assert_eq!(
            ami_key_of("g5.xlarge", Some(&catalog)),
            ami::AmiKey {
                arch: "amd64".into(),
                nvidia: true
            },
            "unknown to the catalog: the name decides"
        );
        assert_eq!(
            ami_key_of("g5g.xlarge", None),
            ami::AmiKey {
                arch: "arm64".into(),
                nvidia: true
            }
        );
    }

    #[test]
    fn labels_and_tags_carry_pool_class_and_claim() {
        let c = claim(vec![]);
        let l = node_labels(&c);
        assert_eq!(l["karpenter.sh/nodepool"], "default");
        assert!(
            !l.contains_key(labels::NODECLAIM),
            "the claim's name stays out of user data: {l:?}"
        );
        assert_eq!(l["team"], "a");
        let mut class = EC2NodeClass::new("default", Default::default());
        class.spec.tags.insert("cost-center".into(), "42".into());
        let t = instance_tags("demo", &c, &class);
        assert_eq!(t["kubernetes.io/cluster/demo"], "owned");
        assert_eq!(t["eks:eks-cluster-name"], "demo");
        assert_eq!(t["karpenter.sh/nodepool"], "default");
        assert_eq!(t["karpenter.sh/nodeclaim"], "default-x");
        assert_eq!(t["karpenter.k8s.aws/ec2nodeclass"], "default");
        assert_eq!(t["cost-center"], "42");
        let lt = template_tags("demo", &c, &class);
        assert!(!lt.contains_key(labels::NODECLAIM), "{lt:?}");
        assert_eq!(lt[labels::EC2NODECLASS_HASH_ANNOTATION], class.hash());
        let other = NodeClaim {
            name: "default-y".into(),
            ..c.clone()
        };
        assert_eq!(
            node_settings(&c, &class, "spot"),
            node_settings(&other, &class, "spot"),
            "two claims of one pool: the same user data"
        );
        assert_eq!(template_tags("demo", &other, &class), lt);
    }

    /// A claim as the solver recorded it before labels were limited to what is
    /// known before launch: every prediction among its labels.
    fn predicted_claim() -> NodeClaim {
        let mut c = claim(vec![
            (labels::REGION, &["us-east-1"]),
            (labels::INSTANCE_TYPE, &["m5.large", "m5.xlarge"]),
        ]);
        c.instance_type_options = vec!["m5.large".into(), "m5.xlarge".into()];
        for (k, v) in [
            (labels::INSTANCE_TYPE, "m5.large"),
            ("beta.kubernetes.io/instance-type", "m5.large"),
            (labels::ZONE, "us-east-1a"),
            (labels::REGION, "us-east-1"),
            (labels::HOSTNAME, "default-x"),
            (labels::ARCH, "amd64"),
            (labels::aws::FAMILY, "m5"),
            (labels::aws::CPU, "2"),
            (labels::CAPACITY_TYPE, "spot"),
            ("node-restriction.kubernetes.io/team", "a"),
            ("node.kubernetes.io/lifecycle", "normal"),
            ("kops.k8s.io/instancegroup", "nodes"),
        ] {
            c.labels.insert(k.into(), v.into());
        }
        c
    }

    #[test]
    fn kubelet_labels_are_known_and_allowed_ones_only() {
        let l = node_labels(&predicted_claim());
        let want: BTreeMap<String, String> = [
            ("team", "a"),
            (labels::REGION, "us-east-1"),
            ("node.kubernetes.io/lifecycle", "normal"),
            (labels::NODEPOOL, "default"),
            (labels::EC2NODECLASS, "default"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(
            l, want,
            "pinned region kept; predictions and kubelet-refused labels left out"
        );
        assert!(l.keys().all(|k| labels::kubelet_may_set(k)));
    }

    #[test]
    fn user_data_registers_unregistered_and_names_no_prediction() {
        let c = predicted_claim();
        let class = EC2NodeClass::new("default", Default::default());
        let s = node_settings(&c, &class, "spot");
        assert_eq!(s.labels[labels::CAPACITY_TYPE], "spot");
        assert_eq!(
            s.taints.last(),
            Some(&Taint::new(
                labels::UNREGISTERED_TAINT_KEY,
                None,
                TaintEffect::NoExecute
            ))
        );
        let cluster = userdata::ClusterInfo {
            name: "demo".into(),
            endpoint: "https://example".into(),
            certificate_authority: "Q0E=".into(),
            service_cidr: "10.100.0.0/16".into(),
            version: "1.33".into(),
        };
        let ud = userdata::al2023(&cluster, &s).unwrap();
        let nc: serde_json::Value =
            serde_yaml_ng::from_str(&userdata::parse_mime(&ud).unwrap().last().unwrap().body).unwrap();
        let flag = nc["spec"]["kubelet"]["flags"][0].as_str().unwrap();
        let given: Vec<&str> = flag
            .strip_prefix("--node-labels=")
            .unwrap()
            .split(',')
            .map(|kv| kv.split_once('=').unwrap().0)
            .collect();
        for k in &given {
            assert!(labels::kubelet_may_set(k), "{k} in {flag}");
            assert!(!k.starts_with("karpenter.k8s.aws/instance-"), "{flag}");
        }
        for k in [labels::INSTANCE_TYPE, labels::ZONE, labels::HOSTNAME] {
            assert!(!given.contains(&k), "{k} in {flag}");
        }
        let taints = nc["spec"]["kubelet"]["config"]["registerWithTaints"]
            .as_array()
            .unwrap();
        assert!(
            taints.contains(&serde_json::json!({"key": "karpenter.sh/unregistered", "effect": "NoExecute"})),
            "{taints:?}"
        );
        // The claim's own taints stay; the unregistered taint is never doubled.
        let mut tainted = c.clone();
        tainted.taints = vec![Taint::new("dedicated", Some("web"), TaintEffect::NoSchedule)];
        tainted.startup_taints = vec![Taint::new(labels::UNREGISTERED_TAINT_KEY, None, TaintEffect::NoExecute)];
        let keys: Vec<String> = node_taints(&tainted).into_iter().map(|t| t.key).collect();
        assert_eq!(keys, vec!["dedicated", labels::UNREGISTERED_TAINT_KEY]);
    }

    #[test]
    fn recording_moves_to_launched_once() {
        let l = Launched {
            instance_id: "i-1".into(),
            instance_type: "m5.large".into(),
            capacity_type: "spot".into(),
            zone: None,
            subnet_id: None,
            capacity_reservation: None,
        };
        let t: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let c = record(&claim(vec![]), &l, "us-east-1a", Some(0.03), t).unwrap();
        assert_eq!(c.phase, Phase::Launched);
        assert_eq!(c.provider_id.as_deref(), Some("aws:///us-east-1a/i-1"));
        assert_eq!(c.price, Some(0.03));
        assert!(record(&c, &l, "us-east-1a", None, t).is_err());
    }
}
