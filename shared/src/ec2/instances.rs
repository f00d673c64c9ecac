//! The cluster's EC2 instances, as launch, interrupt and sweep see them: the
//! instance of one NodeClaim, every instance the cluster owns, and idempotent
//! termination.
//!
//! Ownership is by tag, as [`crate::nodeclass::template::instance_tags`] sets them:
//! `kubernetes.io/cluster/<cluster>=owned` for listing, `eks:eks-cluster-name`
//! plus `karpenter.sh/nodeclaim` for finding a claim's instance.

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_ec2::Client;
use aws_sdk_ec2::error::{DisplayErrorContext, ProvideErrorMetadata};
use aws_sdk_ec2::types::Filter;

use crate::apis::ec2nodeclass::{RESERVATION_CAPACITY_BLOCK, RESERVATION_DEFAULT};
use crate::labels;

/// Most instance ids EC2 accepts in one TerminateInstances call.
pub const TERMINATE_BATCH: usize = 1000;
/// DescribeInstances page size unless [`Instances::with_page_size`] sets another.
pub const DEFAULT_PAGE_SIZE: i32 = 1000;
/// EC2's answer when any id of a call is unknown: the whole call fails and the message names the ids.
pub const NOT_FOUND_CODE: &str = "InvalidInstanceID.NotFound";
/// Tag naming the EKS cluster on every instance nodesmith launches.
pub const CLUSTER_NAME_TAG: &str = "eks:eks-cluster-name";
/// Tag naming the cluster whose nodesmith launched an instance. Karpenter tags
/// its instances as nodesmith does otherwise, so without it a cluster moving
/// from Karpenter would see Karpenter's nodes as leaked.
pub const LAUNCHED_BY_TAG: &str = "nodesmith/launched-by";
/// Tag naming the stack (its identity, [`STACK_ENV`]) whose launch made an
/// instance: the sweep adopts or collects only its own stack's instances, so
/// two stacks of one cluster never take each other's nodes for leaks.
pub const STACK_TAG: &str = "nodesmith/stack";
/// The setting that gives a stack its identity (the template sets the stack's name).
pub const STACK_ENV: &str = "NODESMITH_STACK_NAME";
/// States of an instance that still exists or may come back (everything but terminated).
pub const LIVE_STATES: &[&str] = &["pending", "running", "stopping", "stopped", "shutting-down"];

/// The ownership tag key: `kubernetes.io/cluster/<cluster>` (its value is `owned`).
pub fn owned_tag_key(cluster: &str) -> String {
    format!("kubernetes.io/cluster/{cluster}")
}

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A failed instance operation.
#[derive(Debug, thiserror::Error)]
pub enum InstancesError {
    /// An EC2 call failed (after the SDK's own retries of throttling and 5xx).
    #[error("{op}: {message}")]
    Aws {
        /// The operation, e.g. `ec2:TerminateInstances`.
        op: &'static str,
        /// EC2's error code, when it answered with one.
        code: Option<String>,
        /// The error with its causes, for logs.
        message: String,
        /// The SDK's error.
        #[source]
        source: BoxError,
    },
    /// EC2 said ids are unknown without naming any id that was sent, so none can be dropped and retried.
    #[error("ec2:TerminateInstances: {NOT_FOUND_CODE} names none of the {sent} ids sent: {message}")]
    UnnamedNotFound {
        /// EC2's message.
        message: String,
        /// How many ids the call carried.
        sent: usize,
    },
}

impl InstancesError {
    pub(super) fn aws<E>(op: &'static str, err: E) -> Self
    where
        E: std::error::Error + ProvideErrorMetadata + Send + Sync + 'static,
    {
        InstancesError::Aws {
            op,
            code: err.code().map(str::to_string),
            message: DisplayErrorContext(&err).to_string(),
            source: Box::new(err),
        }
    }

    /// EC2's error code, if EC2 answered with one.
    pub fn code(&self) -> Option<&str> {
        match self {
            InstancesError::Aws { code, .. } => code.as_deref(),
            InstancesError::UnnamedNotFound { .. } => Some(NOT_FOUND_CODE),
        }
    }
}

/// An instance's lifecycle state as EC2 names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum InstanceState {
    /// Booting.
    Pending,
    /// Running.
    Running,
    /// Being terminated.
    ShuttingDown,
    /// Terminated (EC2 keeps listing it for about an hour).
    Terminated,
    /// Being stopped.
    Stopping,
    /// Stopped (EBS-backed instances only).
    Stopped,
    /// A state this code does not know.
    Other(String),
}

impl InstanceState {
    /// From EC2's state name (`pending`, `running`, `shutting-down`, ...).
    pub fn from_name(name: &str) -> Self {
        match name {
            "pending" => InstanceState::Pending,
            "running" => InstanceState::Running,
            "shutting-down" => InstanceState::ShuttingDown,
            "terminated" => InstanceState::Terminated,
            "stopping" => InstanceState::Stopping,
            "stopped" => InstanceState::Stopped,
            other => InstanceState::Other(other.to_string()),
        }
    }

    /// EC2's name for the state.
    pub fn as_str(&self) -> &str {
        match self {
            InstanceState::Pending => "pending",
            InstanceState::Running => "running",
            InstanceState::ShuttingDown => "shutting-down",
            InstanceState::Terminated => "terminated",
            InstanceState::Stopping => "stopping",
            InstanceState::Stopped => "stopped",
            InstanceState::Other(s) => s,
        }
    }
}

/// One instance, with what the functions need of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Instance {
    /// Instance id.
    pub id: String,
    /// Instance type (empty if EC2 did not say).
    pub instance_type: String,
    /// Availability zone.
    pub zone: Option<String>,
    /// Subnet.
    pub subnet_id: Option<String>,
    /// The AMI it was launched from.
    pub image_id: Option<String>,
    /// Security group ids (of every network interface).
    pub security_group_ids: BTreeSet<String>,
    /// Lifecycle state.
    pub state: InstanceState,
    /// `spot` when EC2 reports a spot lifecycle, `reserved` when it runs in a
    /// capacity reservation, else `on-demand`.
    pub capacity_type: String,
    /// The capacity reservation it runs in.
    pub capacity_reservation: Option<crate::nodeclaim::ReservationRef>,
    /// When EC2 launched it.
    pub launch_time: Option<jiff::Timestamp>,
    /// Every tag.
    pub tags: BTreeMap<String, String>,
}

impl Instance {
    /// From the SDK's description; None without an instance id (pure).
    pub fn from_sdk(i: &aws_sdk_ec2::types::Instance) -> Option<Instance> {
        let lifecycle = i.instance_lifecycle().map(|l| l.as_str());
        let capacity_reservation = i.capacity_reservation_id().map(|id| crate::nodeclaim::ReservationRef {
            id: id.to_string(),
            reservation_type: match lifecycle {
                Some(RESERVATION_CAPACITY_BLOCK) => RESERVATION_CAPACITY_BLOCK,
                _ => RESERVATION_DEFAULT,
            }
            .to_string(),
        });
        let capacity_type = match (lifecycle, &capacity_reservation) {
            (Some(labels::CAPACITY_SPOT), _) => labels::CAPACITY_SPOT,
            (_, Some(_)) => labels::CAPACITY_RESERVED,
            _ => labels::CAPACITY_ON_DEMAND,
        };
        Some(Instance {
            id: i.instance_id()?.to_string(),
            instance_type: i.instance_type().map(|t| t.as_str().to_string()).unwrap_or_default(),
            zone: i.placement().and_then(|p| p.availability_zone()).map(str::to_string),
            subnet_id: i.subnet_id().map(str::to_string),
            image_id: i.image_id().map(str::to_string),
            security_group_ids: i
                .security_groups()
                .iter()
                .filter_map(|g| g.group_id())
                .map(str::to_string)
                .collect(),
            state: InstanceState::from_name(i.state().and_then(|s| s.name()).map_or("", |n| n.as_str())),
            capacity_type: capacity_type.to_string(),
            capacity_reservation,
            launch_time: i
                .launch_time()
                .and_then(|t| jiff::Timestamp::new(t.secs(), t.subsec_nanos() as i32).ok()),
            tags: i
                .tags()
                .iter()
                .filter_map(|t| Some((t.key()?.to_string(), t.value().unwrap_or_default().to_string())))
                .collect(),
        })
    }

    /// The NodeClaim it was launched for (`karpenter.sh/nodeclaim` tag).
    pub fn node_claim(&self) -> Option<&str> {
        self.tags.get(labels::NODECLAIM).map(String::as_str)
    }

    /// The NodePool it was launched for (`karpenter.sh/nodepool` tag).
    pub fn node_pool(&self) -> Option<&str> {
        self.tags.get(labels::NODEPOOL).map(String::as_str)
    }

    /// Whether nodesmith launched it (the [`LAUNCHED_BY_TAG`] tag), not
    /// another autoscaler such as the Karpenter it replaced.
    pub fn launched_by_nodesmith(&self) -> bool {
        self.tags.contains_key(LAUNCHED_BY_TAG)
    }
}

/// What termination came to for one id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Termination {
    /// EC2 accepted it and the instance was not terminated before (it may have been shutting down).
    Terminating,
    /// Terminated before the call, or unknown to EC2: nothing left to do.
    AlreadyGone,
}

/// Distinct ids, in first-seen order, cut into batches of at most `size` (pure).
pub fn batches(ids: &[String], size: usize) -> Vec<Vec<String>> {
    let mut seen = BTreeSet::new();
    let distinct: Vec<String> = ids.iter().filter(|id| seen.insert(id.as_str())).cloned().collect();
    distinct.chunks(size.max(1)).map(<[String]>::to_vec).collect()
}

/// The instance ids an EC2 error message names, e.g. "The instance IDs 'i-1, i-2' do not exist" (pure).
pub fn ids_in_message(message: &str) -> BTreeSet<String> {
    message
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|w| {
            w.strip_prefix("i-")
                .is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_alphanumeric()))
        })
        .map(str::to_string)
        .collect()
}

/// What a successful TerminateInstances answer says of one id, from its previous state (pure).
pub fn termination_from(previous: Option<&InstanceState>) -> Termination {
    match previous {
        Some(InstanceState::Terminated) => Termination::AlreadyGone,
        _ => Termination::Terminating,
    }
}

/// The cluster's instances: one EC2 client and the cluster name.
#[derive(Debug, Clone)]
pub struct Instances {
    ec2: Client,
    cluster: String,
    page_size: i32,
}

impl Instances {
    /// The instances of `cluster`, read and terminated through `ec2`.
    pub fn new(ec2: Client, cluster: impl Into<String>) -> Self {
        Instances {
            ec2,
            cluster: cluster.into(),
            page_size: DEFAULT_PAGE_SIZE,
        }
    }

    /// Sets the DescribeInstances page size, clamped to EC2's 5..=1000.
    pub fn with_page_size(mut self, size: i32) -> Self {
        self.page_size = size.clamp(5, 1000);
        self
    }

    /// The page size of its Describe calls.
    pub fn page_size(&self) -> i32 {
        self.page_size
    }

    /// The cluster name.
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// The EC2 client (the sweep's other EC2 steps share it).
    pub fn ec2(&self) -> &Client {
        &self.ec2
    }

    /// Every pending or running instance tagged with this NodeClaim in this cluster,
    /// oldest launch first (ties: the lower id). More than one means a launch ran twice.
    pub async fn find_all_by_claim(&self, claim: &str) -> Result<Vec<Instance>, InstancesError> {
        let mut pages = self
            .ec2
            .describe_instances()
            .filters(tag_filter(labels::NODECLAIM, claim))
            .filters(tag_filter(CLUSTER_NAME_TAG, &self.cluster))
            .filters(state_filter(&["pending", "running"]))
            .into_paginator()
            .send();
        let mut out: Vec<Instance> = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| InstancesError::aws("ec2:DescribeInstances", e))?;
            for i in page.reservations().iter().flat_map(|r| r.instances()) {
                if let Some(i) = Instance::from_sdk(i).filter(|i| out.iter().all(|o| o.id != i.id)) {
                    out.push(i);
                }
            }
        }
        out.sort_by(|a, b| a.launch_time.cmp(&b.launch_time).then_with(|| a.id.cmp(&b.id)));
        Ok(out)
    }

    /// The pending or running instance tagged with this NodeClaim in this cluster, if any
    /// (the first EC2 lists when a crash left more than one).
    pub async fn find_by_claim(&self, claim: &str) -> Result<Option<Instance>, InstancesError> {
        let mut pages = self
            .ec2
            .describe_instances()
            .filters(tag_filter(labels::NODECLAIM, claim))
            .filters(tag_filter(CLUSTER_NAME_TAG, &self.cluster))
            .filters(state_filter(&["pending", "running"]))
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| InstancesError::aws("ec2:DescribeInstances", e))?;
            if let Some(found) = page
                .reservations()
                .iter()
                .flat_map(|r| r.instances())
                .find_map(Instance::from_sdk)
            {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    /// Every instance tagged `kubernetes.io/cluster/<cluster>=owned` that is not terminated, all pages.
    pub async fn list_owned(&self) -> Result<Vec<Instance>, InstancesError> {
        let mut pages = self
            .ec2
            .describe_instances()
            .filters(tag_filter(&owned_tag_key(&self.cluster), "owned"))
            .filters(state_filter(LIVE_STATES))
            .max_results(self.page_size)
            .into_paginator()
            .send();
        let mut out = Vec::new();
        let mut seen = BTreeSet::new();
        let mut page_count = 0usize;
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| InstancesError::aws("ec2:DescribeInstances", e))?;
            page_count += 1;
            for i in page.reservations().iter().flat_map(|r| r.instances()) {
                if let Some(i) = Instance::from_sdk(i).filter(|i| seen.insert(i.id.clone())) {
                    out.push(i);
                }
            }
        }
        tracing::debug!(cluster = %self.cluster, instances = out.len(), pages = page_count, "listed owned instances");
        Ok(out)
    }

    /// Terminates instances, idempotently: batches of at most [`TERMINATE_BATCH`] ids; ids EC2
    /// does not know (it fails the whole call with [`NOT_FOUND_CODE`] naming them) are dropped
    /// and the rest retried. Every distinct id gets an outcome.
    pub async fn terminate(&self, ids: &[String]) -> Result<BTreeMap<String, Termination>, InstancesError> {
        let mut out = BTreeMap::new();
        for batch in batches(ids, TERMINATE_BATCH) {
            self.terminate_batch(batch, &mut out).await?;
        }
        Ok(out)
    }

    async fn terminate_batch(
        &self,
        mut ids: Vec<String>,
        out: &mut BTreeMap<String, Termination>,
    ) -> Result<(), InstancesError> {
        // Each retry drops at least one id, so this ends.
        while !ids.is_empty() {
            let answer = self
                .ec2
                .terminate_instances()
                .set_instance_ids(Some(ids.clone()))
                .send()
                .await;
            match answer {
                Ok(answer) => {
                    for t in answer.terminating_instances() {
                        let Some(id) = t.instance_id() else { continue };
                        let previous = t
                            .previous_state()
                            .and_then(|s| s.name())
                            .map(|n| InstanceState::from_name(n.as_str()));
                        out.insert(id.to_string(), termination_from(previous.as_ref()));
                    }
                    // EC2 lists every id it accepted; one it left out was accepted all the same.
                    for id in ids {
                        out.entry(id).or_insert(Termination::Terminating);
                    }
                    return Ok(());
                }
                Err(e) if e.code() == Some(NOT_FOUND_CODE) => {
                    let message = e.message().unwrap_or_default().to_string();
                    let named = ids_in_message(&message);
                    let sent = ids.len();
                    let (gone, rest): (Vec<String>, Vec<String>) = ids.into_iter().partition(|id| named.contains(id));
                    if gone.is_empty() {
                        return Err(InstancesError::UnnamedNotFound { message, sent });
                    }
                    tracing::info!(
                        cluster = %self.cluster,
                        unknown = ?gone,
                        remaining = rest.len(),
                        "EC2 does not know some instances; retrying without them"
                    );
                    for id in gone {
                        out.insert(id, Termination::AlreadyGone);
                    }
                    ids = rest;
                }
                Err(e) => return Err(InstancesError::aws("ec2:TerminateInstances", e)),
            }
        }
        Ok(())
    }
}

fn tag_filter(key: &str, value: &str) -> Filter {
    Filter::builder().name(format!("tag:{key}")).values(value).build()
}

fn state_filter(states: &[&str]) -> Filter {
    states
        .iter()
        .fold(Filter::builder().name("instance-state-name"), |b, s| b.values(*s))
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("i-{i:017x}")).collect()
    }

    #[test]
    fn batches_hold_at_most_a_thousand_distinct_ids_in_order() {
        let sizes = |n: usize| {
            batches(&ids(n), TERMINATE_BATCH)
                .iter()
                .map(Vec::len)
                .collect::<Vec<_>>()
        };
        assert_eq!(sizes(0), Vec::<usize>::new());
        assert_eq!(sizes(1), vec![1]);
        assert_eq!(sizes(1000), vec![1000]);
        assert_eq!(sizes(1001), vec![1000, 1]);
        assert_eq!(sizes(2500), vec![1000, 1000, 500]);
        let all = ids(2500);
        assert_eq!(batches(&all, TERMINATE_BATCH).concat(), all, "order kept, nothing lost");
    }

    #[test]
    fn batches_drop_repeated_ids() {
        let mut with_repeats = ids(1000);
        with_repeats.extend(ids(3));
        let b = batches(&with_repeats, TERMINATE_BATCH);
        assert_eq!(b.len(), 1);
        assert_eq!(b[0], ids(1000));
        assert_eq!(batches(&ids(5), 2).len(), 3);
    }

    #[test]
    fn not_found_messages_name_their_ids() {
        let one = ids_in_message("The instance ID 'i-0123456789abcdef0' does not exist");
        assert_eq!(one, BTreeSet::from(["i-0123456789abcdef0".to_string()]));
        let two = ids_in_message("The instance IDs 'i-0123456789abcdef0, i-1234abcd' do not exist");
        assert_eq!(
            two,
            BTreeSet::from(["i-0123456789abcdef0".to_string(), "i-1234abcd".to_string()])
        );
        assert!(ids_in_message("The instance ID 'i-' does not exist").is_empty());
        assert!(ids_in_message("Request limit exceeded.").is_empty());
    }

    #[test]
    fn previously_terminated_instances_are_gone() {
        assert_eq!(
            termination_from(Some(&InstanceState::Terminated)),
            Termination::AlreadyGone
        );
        for s in ["running", "pending", "shutting-down", "stopped"] {
            assert_eq!(
                termination_from(Some(&InstanceState::from_name(s))),
                Termination::Terminating,
                "{s}"
            );
        }
        assert_eq!(termination_from(None), Termination::Terminating);
    }

    #[test]
    fn state_names_round_trip() {
        for s in LIVE_STATES.iter().chain(&["terminated", "rebooting"]) {
            assert_eq!(InstanceState::from_name(s).as_str(), *s);
        }
    }

    #[test]
    fn instances_from_the_sdk_carry_tags_zone_and_capacity_type() {
        use aws_sdk_ec2::types as t;
        let sdk = t::Instance::builder()
            .instance_id("i-1")
            .instance_type(t::InstanceType::M5Large)
            .placement(t::Placement::builder().availability_zone("us-east-1b").build())
            .state(t::InstanceState::builder().name(t::InstanceStateName::Running).build())
            .instance_lifecycle(t::InstanceLifecycleType::Spot)
            .launch_time(aws_smithy_types::DateTime::from_secs(1_700_000_000))
            .tags(t::Tag::builder().key(labels::NODECLAIM).value("default-abc").build())
            .tags(t::Tag::builder().key(labels::NODEPOOL).value("default").build())
            .build();
        let i = Instance::from_sdk(&sdk).unwrap();
        assert_eq!(i.id, "i-1");
        assert_eq!(i.instance_type, "m5.large");
        assert_eq!(i.zone.as_deref(), Some("us-east-1b"));
        assert_eq!(i.state, InstanceState::Running);
        assert_eq!(i.capacity_type, "spot");
        assert_eq!(i.launch_time.map(|t| t.as_second()), Some(1_700_000_000));
        assert_eq!((i.node_claim(), i.node_pool()), (Some("default-abc"), Some("default")));
        assert_eq!(Instance::from_sdk(&t::Instance::builder().build()), None);
    }
}
