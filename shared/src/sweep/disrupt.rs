//! The disruption shell: each sweep run decides a pass on a fresh snapshot
//! ([`crate::disruption::decide`]), records every new disruption in DynamoDB
//! (one record per claim, conditional writes) and then moves every recorded
//! disruption on by the step [`progress::next`] names: taint, launch
//! replacements through the provisioning path, wait until they are
//! Initialized, drain (the interruption drain records, continued by
//! `sweep_drains`), terminate. A run killed anywhere leaves a record the next
//! run resumes from; `docs/disruption.md` describes the steps.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use futures::StreamExt;
use jiff::Timestamp;

use super::{StepError, SweepConfig, Sweeper};
use crate::capacity::{self, Door, Pending, Replacements};
use crate::deadline::Deadline;
use crate::disruption::consolidation::{self, ReplacementLimits};
use crate::disruption::progress::{self, Facts, Next};
use crate::disruption::resolved_drift::{self, ClassResolution, InstanceFacts};
use crate::disruption::{DecideOptions, Held, Reason, decide, nomination, repair};
use crate::draining::{self, DrainPolicy};
use crate::ec2::{Impaired, Instance};
use crate::kubernetes::{Cluster, EventSpec, events};
use crate::labels;
use crate::nodeclaim::{NodeClaim, Phase};
use crate::nodeclass::ResolvedClass;
use crate::registration;
use crate::scheduling::{NewNodeClaim, SolveOptions};
use crate::snapshot::Snapshot;
use crate::snapshot::live;
use crate::state::{DisruptionRecord, DisruptionStep, DrainRecord, VersionCheck, now_ms};

/// At most this many `DisruptionBlocked` events per run: every blocked node
/// would otherwise get one a minute.
const BLOCKED_EVENTS_PER_RUN: usize = 20;
/// How many new disruptions are recorded and tainted at once.
const BEGIN_CONCURRENCY: usize = 16;
/// Steps one disruption may take in one run (a full walk takes five).
const STEPS_PER_RUN: usize = 6;
/// How long the sweep's launches wait for `provision` to release its lease
/// before leaving them to the next run.
const PROVISION_LEASE_WAIT: Duration = Duration::from_secs(10);
/// How long the what-if solves of one pass may search for cheaper packings.
const DECIDE_DEADLINE: Duration = Duration::from_secs(5);

/// One record's walk in a pass: where it stands, and its claim's drains and
/// report entries to merge back.
struct Walked {
    index: usize,
    next: Result<Option<Next>, StepError>,
    drains: Vec<DrainRecord>,
    report: DisruptionRunReport,
}

/// What the disruption part of one run did.
#[derive(Debug, Default)]
pub struct DisruptionRunReport {
    /// Nodes whose disruption began, with the reason.
    pub started: Vec<(String, Reason)>,
    /// Replacement NodeClaims written and queued for launch.
    pub launched: Vec<String>,
    /// Each of those by pool, with the disruption's reason (`karpenter_nodeclaims_created_total`).
    pub created: Vec<(String, Reason)>,
    /// Each pod this run first saw Ready, with the seconds from its creation ([`crate::pod_startup`]).
    pub pod_startups: Vec<(String, f64)>,
    /// Nodes whose drain began.
    pub draining: Vec<String>,
    /// Nodes terminated (instance, Node and claim gone).
    pub terminated: Vec<String>,
    /// Disruptions given up, with why.
    pub abandoned: Vec<(String, String)>,
    /// Nodes a method wanted that a rule held (`DisruptionBlocked`).
    pub blocked: Vec<(String, String)>,
    /// Steps that failed, by node.
    pub failed: Vec<(String, StepError)>,
    /// Disruptions left for the next run (the time budget ran out).
    pub deferred: usize,
    /// The decisions this run began, as Karpenter counts them
    /// (`karpenter_voluntary_disruption_decisions_total`).
    pub decisions: Vec<crate::metrics::DecisionTaken>,
    /// Each managed node's drift and consolidatability as this run's pass
    /// found them, by node; None when no pass was decided this run.
    pub node_states: Option<BTreeMap<String, crate::disruption::NodeState>>,
    /// How far this run's consolidation got; None when it did not run.
    pub consolidation: Option<crate::disruption::Coverage>,
}

/// Whether a blocked rule is worth an event: a protection or a budget, not
/// a node that is simply not due yet.
fn worth_an_event(h: &Held) -> bool {
    !matches!(
        h,
        Held::ConsolidateAfter { .. }
            | Held::ConsolidationDisabled
            | Held::NoSaving
            | Held::RecentReplacement { .. }
            | Held::Receiving { .. }
            | Held::Unconsolidatable(_)
    )
}

/// How a pass is decided from what the table holds (pure): the sweep's
/// consolidation and repair settings, the replacements receiving pods, and
/// the live nominations. The sweep adds what needs EC2 (drift by live
/// resolution, impaired status checks) and its deadline; `nodesmith explain`
/// decides with exactly this.
pub(crate) fn pass_options(
    config: &SweepConfig,
    records: &[DisruptionRecord],
    claims: &[NodeClaim],
    nominations: &[crate::state::NominationRecord],
    now: Timestamp,
) -> DecideOptions {
    DecideOptions {
        registered: Some(claims.iter().filter_map(|c| c.node_name.clone()).collect()),
        receiving: receiving(records, claims),
        nominated: nomination::live(nominations, claims, now),
        consolidation: config.consolidation.clone(),
        grace_period_bounds_eventual: true,
        repair: config.repair.clone(),
        ..DecideOptions::default()
    }
}

/// The nodes of replacements that disruptions in progress launched, with the
/// node each replaces (pure): until that node is gone they are where its pods
/// go, so no pass may take them for empty.
fn receiving(records: &[DisruptionRecord], claims: &[NodeClaim]) -> BTreeMap<String, String> {
    let nodes: BTreeMap<&str, &str> = claims
        .iter()
        .filter_map(|c| Some((c.name.as_str(), c.node_name.as_deref()?)))
        .collect();
    records
        .iter()
        .flat_map(|r| {
            r.replacements
                .iter()
                .filter_map(|claim| nodes.get(claim.as_str()))
                .map(|node| (node.to_string(), r.node.clone()))
        })
        .collect()
}

/// The node's `terminationGracePeriod` in ms (its claim's, else its pool's):
/// it bounds the drain whatever the reason (Karpenter's termination).
fn grace_ms(snapshot: &Snapshot, node: &str, claim: &NodeClaim) -> Option<i64> {
    let pool = snapshot
        .nodes
        .iter()
        .find(|n| n.node.metadata.name.as_deref() == Some(node))
        .and_then(|n| n.node.metadata.labels.as_ref()?.get(crate::labels::NODEPOOL))
        .and_then(|p| snapshot.node_pool(p));
    let d = crate::termination_grace::period(Some(claim), pool)?;
    i64::try_from(d.as_millis()).ok()
}

/// The replacement plan for the nodes of `chosen` (pure), through the
/// capacity door's planner: every node being disrupted (`removed`) is gone
/// from the what-if solve. Consolidation's records (all Underutilized)
/// solve under their [`ReplacementLimits`], and their new claims are
/// narrowed to what was priced. Each new claim is marked a replacement for
/// its record's reason.
fn replacements_for(
    snapshot: &Snapshot,
    chosen: &[DisruptionRecord],
    removed: &BTreeSet<String>,
    seed: &str,
    limits: Option<(&ReplacementLimits, usize)>,
) -> Replacements {
    let options = match limits {
        Some((l, _)) => l.solve_options(removed.clone(), None),
        None => SolveOptions::without(removed.iter().cloned()),
    };
    let nodes: Vec<String> = chosen.iter().map(|r| r.node.clone()).collect();
    let mut plan = capacity::plan_replacements(snapshot, &nodes, &options, Pending::Hold, seed, |c| {
        if let Some((l, min_types)) = limits {
            l.restrict(c, min_types);
        }
    });
    let reasons: BTreeMap<&str, String> = chosen.iter().map(|r| (r.node.as_str(), r.reason.to_string())).collect();
    for p in &mut plan.new {
        p.claim.replacement_for = reasons.get(p.replaces.as_str()).cloned();
    }
    plan
}

/// The managed nodes whose instance is impaired, by node (pure): `impaired`
/// lists the account's instances, the nodes' provider ids name theirs.
fn impaired_nodes(snapshot: &Snapshot, impaired: &[Impaired]) -> BTreeMap<String, Option<Timestamp>> {
    let by_instance: BTreeMap<&str, &str> = snapshot
        .nodes
        .iter()
        .filter(|n| {
            n.node
                .metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(labels::NODEPOOL))
        })
        .filter_map(|n| {
            let id = n
                .node
                .spec
                .as_ref()?
                .provider_id
                .as_deref()
                .and_then(registration::instance_id)?;
            Some((id, n.node.metadata.name.as_deref()?))
        })
        .collect();
    impaired
        .iter()
        .filter_map(|i| Some((by_instance.get(i.id.as_str())?.to_string(), i.since)))
        .collect()
}

/// The health problem that has `node` repaired, if it has one (pure).
fn unhealthy_because(snapshot: &Snapshot, options: &DecideOptions, node: &str) -> Option<String> {
    let n = snapshot
        .nodes
        .iter()
        .find(|n| n.node.metadata.name.as_deref() == Some(node))?;
    let impaired = options.impaired.get(node).copied();
    match repair::health(&n.node, impaired, &options.repair, snapshot.now) {
        repair::Health::Due(p) | repair::Health::Tolerated(p) => Some(p.to_string()),
        repair::Health::Healthy => None,
    }
}

/// Why a pod of `node` has nowhere to go, if one has not.
fn stuck(plan: &Replacements, node: &str) -> Option<String> {
    let u = plan.stuck.get(node)?.first()?;
    Some(format!("pod {} cannot be placed: {}", u.pod, u.reason))
}

/// The disruptions one replacement launch serves.
struct Batch<'r> {
    /// Every recorded disruption of the run.
    records: &'r mut [DisruptionRecord],
    /// The indices of those launching now.
    which: &'r [usize],
    /// Every node being disrupted (gone from the what-if solve).
    removed: &'r BTreeSet<String>,
    /// Zones an ARC zonal shift moves traffic away from, read once a pass.
    shifted_zones: &'r BTreeSet<String>,
}

impl<C: Cluster> Sweeper<C> {
    /// The capacity door for the sweep's own launches (replacements, static
    /// replicas): under the provision lease, waiting a while for `provision`.
    pub(super) fn door<'a>(&'a self, launch_queue_url: &'a str) -> Door<'a> {
        Door {
            store: &self.store,
            sqs: &self.sqs,
            launch_queue_url,
            holder: &self.config.holder,
            lease_ttl: self.config.provision_lease,
            lease_wait: PROVISION_LEASE_WAIT,
            // The run's own cut bounds every step, these releases too.
            release_by: Deadline::outside_lambda(),
        }
    }

    /// The disruption part of a run: new decisions, then every recorded
    /// disruption moved on as far as it goes now (no walk starts after
    /// `walks_by`); `instances`: the run's list of the cluster's instances.
    pub(super) async fn disrupt(
        &self,
        walks_by: Instant,
        now: Timestamp,
        classes: &BTreeMap<String, ResolvedClass>,
        instances: &[Instance],
    ) -> DisruptionRunReport {
        let mut report = DisruptionRunReport::default();
        // One claim read for the snapshot and the decisions both.
        let reading = Instant::now();
        let claims = match self.store.list_node_claims().await {
            Ok(c) => c,
            Err(e) => {
                report.failed.push((String::new(), e.into()));
                return report;
            }
        };
        let in_flight = claims.iter().filter(|c| c.phase.holds_capacity()).cloned().collect();
        let mut snapshot = match live::read_with_claims(&self.cluster, &self.store, now, in_flight).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %crate::telemetry::causes(&e), "no snapshot; disruption waits for the next sweep");
                report.failed.push((String::new(), e.into()));
                return report;
            }
        };
        tracing::info!(
            read_ms = reading.elapsed().as_millis() as u64,
            pods = snapshot.nodes.iter().map(|n| n.pods.len()).sum::<usize>() + snapshot.pods.len(),
            "disruption read the claims and the cluster"
        );
        snapshot.shifted_zones = self.zonal_shift_pass(&snapshot, now).await;
        report.pod_startups = self.pod_startups(&snapshot, now).await;
        let mut records = match self.store.disruptions().await {
            Ok(r) => r,
            Err(e) => {
                report.failed.push((String::new(), e.into()));
                return report;
            }
        };
        if let Err(e) = self
            .begin_new(&snapshot, &claims, classes, instances, &mut records, &mut report)
            .await
        {
            tracing::warn!(error = %crate::telemetry::causes(&e), "new disruptions not started; the next sweep decides again");
            report.failed.push((String::new(), e));
        }
        // Moving on may read the cluster again (replacements under the lease):
        // two whole-cluster snapshots at once would double the run's peak.
        let shifted_zones = std::mem::take(&mut snapshot.shifted_zones);
        drop(snapshot);
        self.move_on(&mut records, walks_by, &shifted_zones, &mut report).await;
        report
    }

    /// Decides a pass and records + taints every chosen node not recorded yet.
    async fn begin_new(
        &self,
        snapshot: &Snapshot,
        claims: &[NodeClaim],
        classes: &BTreeMap<String, ResolvedClass>,
        instances: &[Instance],
        records: &mut Vec<DisruptionRecord>,
        report: &mut DisruptionRunReport,
    ) -> Result<(), StepError> {
        // Unreadable nominations stop new disruptions this run (the `?`): a
        // node may be where pods are about to bind.
        let nominations = self.store.live_nominations(snapshot.now.as_millisecond()).await?;
        let options = DecideOptions {
            resolved_drift: resolved_drift_of(snapshot, classes, instances),
            deadline: Some(Instant::now() + DECIDE_DEADLINE),
            impaired: self.impaired(snapshot).await,
            ..pass_options(&self.config, records, claims, &nominations, snapshot.now)
        };
        let deciding = Instant::now();
        let decisions = decide(snapshot, &options);
        let coverage = decisions.consolidation.unwrap_or_default();
        tracing::info!(
            decide_ms = deciding.elapsed().as_millis() as u64,
            nodes = snapshot.nodes.len(),
            consolidation_candidates = coverage.candidates,
            consolidation_unexamined = coverage.unexamined,
            "disruption decided"
        );
        report.node_states = Some(decisions.nodes.clone());
        report.consolidation = decisions.consolidation;
        for e in &decisions.errors {
            tracing::error!(error = %crate::telemetry::causes(&e), "a disruption budget cannot be parsed; its NodePool allows no disruption");
        }
        let by_node: BTreeMap<&str, &NodeClaim> = claims
            .iter()
            .filter_map(|c| Some((c.node_name.as_deref()?, c)))
            .collect();
        for b in decisions
            .blocked
            .iter()
            .filter(|b| worth_an_event(&b.rule))
            .take(BLOCKED_EVENTS_PER_RUN)
        {
            let why = b.rule.to_string();
            let claim = by_node.get(b.node.as_str()).map(|c| c.name.as_str());
            self.node_event(
                EventSpec::disruption_blocked(events::node_name_ref(&b.node), &why),
                claim,
            )
            .await;
            report.blocked.push((b.node.clone(), why));
        }
        let mut recorded: BTreeSet<String> = records.iter().map(|r| r.claim.clone()).collect();
        // New disruptions are recorded whatever the time budget (a few writes
        // each, bounded by the disruption budgets); their steps wait for time.
        let mut chosen: Vec<(usize, DisruptionRecord)> = Vec::new();
        for (i, d) in decisions.decisions.iter().enumerate() {
            for node in &d.nodes {
                let Some(claim) = by_node.get(node.as_str()) else {
                    tracing::warn!(node, reason = %d.reason, "no NodeClaim for a node chosen for disruption; left alone");
                    continue;
                };
                if !matches!(claim.phase, Phase::Initialized) || !recorded.insert(claim.name.clone()) {
                    continue;
                }
                let record = DisruptionRecord {
                    claim: claim.name.clone(),
                    node: node.clone(),
                    reason: d.reason,
                    // The resolution reason (e.g. SubnetDrift) says what to fix in the class.
                    detail: match options.resolved_drift.get(node) {
                        Some(why) if d.reason == Reason::Drifted => {
                            format!("{} ({why}) by nodesmith's sweep", d.reason)
                        }
                        // Which condition or status check, for events and logs.
                        _ if d.reason == Reason::Unhealthy => match unhealthy_because(snapshot, &options, node) {
                            Some(why) => format!("{} ({why}) by nodesmith's sweep", d.reason),
                            None => format!("{} by nodesmith's sweep", d.reason),
                        },
                        _ => format!("{} by nodesmith's sweep", d.reason),
                    },
                    step: DisruptionStep::Tainted,
                    replacements: Vec::new(),
                    grace_ms: grace_ms(snapshot, node, claim),
                    force_from_ms: None,
                    started_ms: now_ms(),
                    version: 0,
                };
                chosen.push((i, record));
            }
        }
        // Several at once: a pass over thousands of nodes may begin hundreds
        // (10 % of 5,000 by Karpenter's default budget), each two round trips.
        // The futures made first: a stream's closure that makes them would
        // borrow for any lifetime, and the sweep's future would not be Send.
        let begins: Vec<_> = chosen
            .into_iter()
            .map(|(i, record)| async move { (i, self.begin_disruption(record).await) })
            .collect();
        let begun: Vec<(usize, Result<Option<DisruptionRecord>, StepError>)> = futures::stream::iter(begins)
            .buffered(BEGIN_CONCURRENCY)
            .collect()
            .await;
        let mut started_by_decision = vec![false; decisions.decisions.len()];
        let mut failure = None;
        for (i, result) in begun {
            match result {
                Ok(Some(record)) => {
                    let d = &decisions.decisions[i];
                    tracing::info!(node = %record.node, claim = %record.claim, reason = %d.reason, "disruption begins");
                    report.started.push((record.node.clone(), d.reason));
                    records.push(record);
                    started_by_decision[i] = true;
                }
                Ok(None) => {}
                Err(e) => failure = failure.or(Some(e)),
            }
        }
        for (d, _) in decisions
            .decisions
            .iter()
            .zip(&started_by_decision)
            .filter(|(_, started)| **started)
        {
            report.decisions.push(crate::metrics::DecisionTaken {
                reason: d.reason,
                replace: !d.replacements.is_empty(),
                nodes: d.nodes.len(),
            });
        }
        failure.map_or(Ok(()), Err)
    }

    /// Records one disruption, then taints its node; `None` when another run
    /// recorded it first.
    async fn begin_disruption(&self, record: DisruptionRecord) -> Result<Option<DisruptionRecord>, StepError> {
        // Recorded before the taint: a run dying in between leaves a
        // record whose next step (re)applies the taint.
        let Some(record) = self.store.begin_disruption(&record).await? else {
            return Ok(None);
        };
        self.cluster.taint_disrupted(&record.node).await?;
        Ok(Some(record))
    }

    /// Moves every record on; replacement launches are batched into one solve.
    async fn move_on(
        &self,
        records: &mut [DisruptionRecord],
        walks_by: Instant,
        shifted_zones: &BTreeSet<String>,
        report: &mut DisruptionRunReport,
    ) {
        if records.is_empty() {
            return;
        }
        let mut drains = match self.store.drains().await {
            Ok(d) => d,
            Err(e) => {
                report.failed.push((String::new(), e.into()));
                return;
            }
        };
        // Several records at once (each step is a few round trips, and a
        // pass may move hundreds); each walks with its own claim's drains.
        let all_drains = &drains;
        let walks: Vec<_> = records
            .iter_mut()
            .enumerate()
            .map(|(i, r)| async move {
                // Checked as each walk starts, not when the pass began.
                if Instant::now() >= walks_by {
                    return None;
                }
                let mut own: Vec<DrainRecord> = all_drains.iter().filter(|d| d.claim == r.claim).cloned().collect();
                let mut part = DisruptionRunReport::default();
                let next = self.walk(r, &mut own, &mut part).await;
                Some(Walked {
                    index: i,
                    next,
                    drains: own,
                    report: part,
                })
            })
            .collect();
        let walked: Vec<Walked> = futures::stream::iter(walks)
            .buffered(BEGIN_CONCURRENCY)
            .filter_map(std::future::ready)
            .collect()
            .await;
        report.deferred += records.len() - walked.len();
        let mut launch: Vec<usize> = Vec::new();
        // Each walked claim's drains are as its walk left them.
        let walked_claims: BTreeSet<&str> = walked.iter().map(|w| records[w.index].claim.as_str()).collect();
        drains.retain(|d| !walked_claims.contains(d.claim.as_str()));
        for w in walked {
            drains.extend(w.drains);
            report.draining.extend(w.report.draining);
            report.terminated.extend(w.report.terminated);
            report.abandoned.extend(w.report.abandoned);
            match w.next {
                Ok(Some(Next::Launch)) => launch.push(w.index),
                Ok(_) => {}
                Err(e) => {
                    let node = records[w.index].node.clone();
                    tracing::warn!(%node, error = %crate::telemetry::causes(&e), "disruption step failed; the next sweep tries again");
                    report.failed.push((node, e));
                }
            }
        }
        let due: Vec<Reason> = launch.iter().map(|i| records[*i].reason).collect();
        let launch: Vec<usize> = progress::launching_together(&due)
            .into_iter()
            .map(|k| launch[k])
            .collect();
        if launch.is_empty() {
            return;
        }
        let removed: BTreeSet<String> = records.iter().map(|r| r.node.clone()).collect();
        let batch = Batch {
            records: &mut *records,
            which: &launch,
            removed: &removed,
            shifted_zones,
        };
        match self.launch(batch, report).await {
            Ok(()) => {
                for i in launch {
                    // A consolidation the fresh solve refused is already rolled back.
                    if report.abandoned.iter().any(|(n, _)| *n == records[i].node) {
                        continue;
                    }
                    if let Err(e) = self.walk(&mut records[i], &mut drains, report).await {
                        report.failed.push((records[i].node.clone(), e));
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %crate::telemetry::causes(&e), "replacements not launched; the next sweep tries again");
                report.failed.push((String::new(), e));
            }
        }
    }

    /// Finishes the disruptions whose drain `sweep_drains` just completed.
    pub(super) async fn finish_drained(&self, drained: &[String], report: &mut DisruptionRunReport) {
        if drained.is_empty() {
            return;
        }
        let records = match self.store.disruptions().await {
            Ok(r) => r,
            Err(e) => {
                report.failed.push((String::new(), e.into()));
                return;
            }
        };
        let mut drains = match self.store.drains().await {
            Ok(d) => d,
            Err(e) => {
                report.failed.push((String::new(), e.into()));
                return;
            }
        };
        for mut r in records.into_iter().filter(|r| drained.contains(&r.node)) {
            if let Err(e) = self.walk(&mut r, &mut drains, report).await {
                report.failed.push((r.node.clone(), e));
            }
        }
    }

    /// What the world says about one record now.
    async fn facts<'a>(&self, r: &'a DisruptionRecord, drains: &[DrainRecord]) -> Result<Facts<'a>, StepError> {
        let claim = self.store.get_node_claim(&r.claim).await?.map(|c| c.phase);
        let node_exists = self.cluster.node(&r.node).await?.is_some();
        let (undrained, do_not_disrupt_pod) = if node_exists {
            draining::undrained(&self.cluster.pods_on_node(&r.node).await?, Timestamp::now())
        } else {
            (0, None)
        };
        let mut replacements = Vec::with_capacity(r.replacements.len());
        for name in &r.replacements {
            let phase = self.store.get_node_claim(name).await?.map(|c| c.phase);
            replacements.push((name.clone(), phase));
        }
        Ok(Facts {
            now: Timestamp::now(),
            record: r,
            claim,
            node_exists,
            replacements,
            drain_recorded: drains.iter().any(|d| d.claim == r.claim),
            undrained,
            do_not_disrupt_pod,
        })
    }

    /// Takes the steps of one disruption until it waits (or needs a launch,
    /// which is returned so launches share one solve).
    /// `drains` is the drain partition as read once for a whole pass, kept
    /// current here as steps begin and end drains (re-reading it at every step
    /// of every disruption cost a full partition read each).
    async fn walk(
        &self,
        r: &mut DisruptionRecord,
        drains: &mut Vec<DrainRecord>,
        report: &mut DisruptionRunReport,
    ) -> Result<Option<Next>, StepError> {
        for _ in 0..STEPS_PER_RUN {
            let next = progress::next(&self.facts(r, drains).await?);
            tracing::debug!(node = %r.node, step = r.step.as_str(), next = ?next, "disruption");
            match next {
                Next::Launch => {
                    // The taint first: a record written by a run that died before tainting.
                    self.cluster.taint_disrupted(&r.node).await?;
                    return Ok(Some(Next::Launch));
                }
                Next::Wait(_) | Next::Draining => return Ok(Some(next)),
                Next::BeginDrain { force_from } => {
                    self.cluster.taint_disrupted(&r.node).await?;
                    let policy = DrainPolicy {
                        deadline: force_from,
                        force_from,
                    };
                    let reason = format!("disruption-{}", r.reason.as_str().to_lowercase());
                    let drain = draining::record(&r.claim, &r.node, &reason, policy, Timestamp::now());
                    self.store.begin_drain(&drain).await?;
                    drains.retain(|d| d.claim != drain.claim);
                    drains.push(drain.clone());
                    self.claim_to(&r.claim, Phase::Draining).await?;
                    let mut moved = r.clone();
                    moved.step = DisruptionStep::Draining;
                    moved.force_from_ms = drain.force_from_ms;
                    *r = self.store.update_disruption(&moved).await?;
                    tracing::info!(node = %r.node, force_from = ?force_from, "drain begins");
                    report.draining.push(r.node.clone());
                }
                Next::Terminate => {
                    self.terminate_disrupted(r).await?;
                    drains.retain(|d| d.claim != r.claim);
                    report.terminated.push(r.node.clone());
                    return Ok(None);
                }
                Next::Abandon(why) => {
                    self.abandon(r, &why, report).await?;
                    return Ok(None);
                }
                Next::Forget => {
                    self.store.end_disruption(&r.claim, r.version).await?;
                    return Ok(None);
                }
            }
        }
        Ok(None)
    }

    /// Gives a disruption up: the node untainted, the record forgotten, an event.
    async fn abandon(
        &self,
        r: &mut DisruptionRecord,
        why: &str,
        report: &mut DisruptionRunReport,
    ) -> Result<(), StepError> {
        if self.cluster.untaint_disrupted(&r.node).await.is_err() {
            tracing::warn!(node = %r.node, "could not untaint an abandoned disruption's node");
        }
        self.store.end_disruption(&r.claim, r.version).await?;
        self.node_event(
            EventSpec::disruption_blocked(events::node_name_ref(&r.node), why),
            Some(&r.claim),
        )
        .await;
        tracing::info!(node = %r.node, %why, "disruption abandoned");
        report.abandoned.push((r.node.clone(), why.to_string()));
        Ok(())
    }

    /// Instance first, then the Node, then the claim and the records (as the
    /// lifecycle removes capacity: never an instance nobody owns).
    async fn terminate_disrupted(&self, r: &mut DisruptionRecord) -> Result<(), StepError> {
        if r.step != DisruptionStep::Terminating {
            let mut moved = r.clone();
            moved.step = DisruptionStep::Terminating;
            *r = self.store.update_disruption(&moved).await?;
            self.node_event(
                EventSpec::disruption_terminating(events::node_name_ref(&r.node), r.reason.as_str()),
                Some(&r.claim),
            )
            .await;
        }
        let claim = self.claim_to(&r.claim, Phase::Terminating).await?;
        if let Some(id) = claim.as_ref().and_then(|c| c.instance_id.clone()) {
            let out = self.instances.terminate(std::slice::from_ref(&id)).await?;
            tracing::info!(instance_id = %id, outcome = ?out.get(&id), "disrupted instance terminated");
        }
        let instance = claim.as_ref().and_then(|c| c.instance_id.as_deref());
        crate::kubernetes::cluster::delete_node_of(&self.cluster, &r.node, instance).await?;
        if let Some(c) = claim {
            self.store.remove_node_claim(&c, VersionCheck::IfUnchanged).await?;
        }
        self.store.end_drain(&r.claim).await?;
        self.store.end_disruption(&r.claim, r.version).await?;
        tracing::info!(node = %r.node, reason = %r.reason, "disrupted node terminated");
        Ok(())
    }

    /// Moves a claim to `phase` when it may (version-checked). Returns the
    /// claim as stored, None when it is gone.
    async fn claim_to(&self, name: &str, phase: Phase) -> Result<Option<NodeClaim>, StepError> {
        let advanced = self
            .store
            .advance_node_claim(name, |c| {
                let mut next = c.clone();
                (c.phase != phase && next.advance(phase, Timestamp::now()).is_ok()).then_some(next)
            })
            .await?;
        Ok(advanced.claim())
    }

    /// One solve for the records of `batch`, under the provision lease (so
    /// `provision` and this never plan the same pods at once); the claims
    /// admitted through the capacity door, as provisioning does.
    async fn launch(&self, batch: Batch<'_>, report: &mut DisruptionRunReport) -> Result<(), StepError> {
        let Some(url) = self.config.launch_queue_url.as_deref() else {
            tracing::warn!("replacements are due but NODESMITH_LAUNCH_QUEUE_URL is not set");
            return Ok(());
        };
        let door = &self.door(url);
        let launched = door
            .under_lease(|lease| async move { self.launch_under(door, &lease, batch, report).await })
            .await?;
        match launched {
            Some(result) => result,
            None => {
                tracing::info!("provision holds its lease; replacements wait for the next sweep");
                Ok(())
            }
        }
    }

    async fn launch_under(
        &self,
        door: &Door<'_>,
        lease: &crate::state::Lease,
        batch: Batch<'_>,
        report: &mut DisruptionRunReport,
    ) -> Result<(), StepError> {
        let Batch {
            records,
            which,
            removed,
            shifted_zones,
        } = batch;
        // Re-read under the lease: claims provision wrote since count as capacity.
        let now = Timestamp::now();
        let mut fresh = live::read_launchable(&self.cluster, &self.store, now).await?;
        fresh.shifted_zones = shifted_zones.clone();
        let chosen: Vec<DisruptionRecord> = which.iter().map(|i| records[*i].clone()).collect();
        let consolidating = chosen.iter().all(|r| r.reason == Reason::Underutilized);
        let limits = consolidating.then(|| {
            let nodes: BTreeSet<String> = chosen.iter().map(|r| r.node.clone()).collect();
            ReplacementLimits::of(&fresh, &nodes)
        });
        let min_types = self.config.consolidation.spot_to_spot_min_types;
        let seed = capacity::seed(lease, now);
        // Off the runtime's thread, so the lease is renewed during a long solve.
        let plan = {
            let (chosen, removed, limits) = (chosen.clone(), removed.clone(), limits.clone());
            capacity::off_task(move || {
                replacements_for(
                    &fresh,
                    &chosen,
                    &removed,
                    &seed,
                    limits.as_ref().map(|l| (l, min_types)),
                )
            })
            .await
        };
        if let Some(l) = &limits {
            let priced: Vec<NewNodeClaim> = plan.new.iter().map(|p| p.priced.clone()).collect();
            let first_stuck = chosen.iter().find_map(|r| stuck(&plan, &r.node));
            if let Err(why) = consolidation::revalidate(l, &priced, first_stuck.as_deref(), &self.config.consolidation)
            {
                // The cluster changed since the decision: roll it back, as Karpenter does.
                let why = format!("consolidation no longer valid: {why}");
                for i in which {
                    self.abandon(&mut records[*i], &why, report).await?;
                }
                return Ok(());
            }
        }
        door.admit(lease, &plan.claims()).await?;
        for i in which {
            let node = records[*i].node.clone();
            if let Some(why) = stuck(&plan, &node) {
                tracing::warn!(node = %node, %why, "a pod of a disrupted node has nowhere to go");
            }
            let new: Vec<&NodeClaim> = plan
                .new
                .iter()
                .filter(|p| p.replaces == node)
                .map(|p| &p.claim)
                .collect();
            let mine: Vec<String> = new
                .iter()
                .map(|c| c.name.clone())
                .chain(plan.in_flight.get(&node).into_iter().flatten().cloned())
                .collect();
            let mut moved = records[*i].clone();
            moved.step = DisruptionStep::Launching;
            moved.replacements = mine.clone();
            records[*i] = self.store.update_disruption(&moved).await?;
            let node_ref = || events::node_name_ref(&node);
            let claim = Some(records[*i].claim.as_str());
            for c in new {
                let launching = EventSpec::disruption_launching(node_ref(), &c.name, records[*i].reason.as_str());
                self.node_event(launching, claim).await;
                report.launched.push(c.name.clone());
                report.created.push((c.node_pool.clone(), records[*i].reason));
            }
            if !mine.is_empty() {
                self.node_event(EventSpec::disruption_waiting_readiness(node_ref(), &mine), claim)
                    .await;
            }
            tracing::info!(node = %node, replacements = ?mine, "replacements launched");
        }
        Ok(())
    }

    /// Records an event; a failure is logged, never fatal.
    pub(super) async fn event(&self, e: EventSpec) {
        if let Err(err) = self.cluster.emit_event(&e).await {
            tracing::warn!(reason = %e.reason, error = %crate::telemetry::causes(&err), "could not record an event");
        }
    }

    /// The startup durations of the pods that became Ready since the last
    /// run's window ([`crate::pod_startup`]); none this run when the marker
    /// cannot be read, and the window stays open when it cannot be written.
    async fn pod_startups(&self, snapshot: &Snapshot, now: Timestamp) -> Vec<(String, f64)> {
        use crate::pod_startup::{MARKER, durations, window};
        let last = match self.store.marked_at(MARKER).await {
            Ok(ms) => ms.and_then(|ms| Timestamp::from_millisecond(ms).ok()),
            Err(e) => {
                tracing::warn!(error = %crate::telemetry::causes(&e), "pod startup marker not read; counted next run");
                return Vec::new();
            }
        };
        let span = window(last, now);
        if let Err(e) = self.store.mark(MARKER, span.1.as_millisecond()).await {
            tracing::warn!(error = %crate::telemetry::causes(&e), "pod startup marker not written; counted next run");
            return Vec::new();
        }
        durations(snapshot.nodes.iter().flat_map(|n| &n.pods), span)
    }

    /// Records a node's disruption event on the node and, as Karpenter
    /// does, on its NodeClaim (`claim`, when the node has one).
    pub(super) async fn node_event(&self, e: EventSpec, claim: Option<&str>) {
        if let Some(claim) = claim {
            let uid = self.object_uids.lock().ok().and_then(|u| u.get(claim).cloned());
            self.event(e.on_node_claim(claim, uid)).await;
        }
        self.event(e).await;
    }

    /// The managed nodes whose EC2 status check is impaired (none when
    /// repair is off; none this run when EC2 cannot be read: repair by node
    /// conditions goes on).
    async fn impaired(&self, snapshot: &Snapshot) -> BTreeMap<String, Option<Timestamp>> {
        if !self.config.repair.enabled {
            return BTreeMap::new();
        }
        match self.instances.impaired().await {
            Ok(list) => impaired_nodes(snapshot, &list),
            Err(e) => {
                tracing::warn!(error = %crate::telemetry::causes(&e), "status checks not read; no repair by them this run");
                BTreeMap::new()
            }
        }
    }
}

/// Nodes whose instance no longer matches what their class resolves to now
/// (AMI, subnet, security groups, capacity reservation), with why, from this run's resolution of
/// each class (`classes`; empty when resolution is not wired). A class not
/// resolved this run drifts nothing. `instances`: the run's list (an instance
/// launched since is not a registered node yet).
fn resolved_drift_of(
    snapshot: &Snapshot,
    classes: &BTreeMap<String, ResolvedClass>,
    instances: &[Instance],
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    // Nodes of a NodePool, by class, with their instance ids and whether
    // they are labelled reserved capacity.
    let mut by_class: BTreeMap<String, Vec<(String, String, bool)>> = BTreeMap::new();
    for n in &snapshot.nodes {
        let node_labels = n.node.metadata.labels.clone().unwrap_or_default();
        let Some(pool) = node_labels.get(labels::NODEPOOL).and_then(|p| snapshot.node_pool(p)) else {
            continue;
        };
        let class = node_labels
            .get(labels::EC2NODECLASS)
            .cloned()
            .unwrap_or_else(|| pool.spec.template.spec.node_class_ref.name.clone());
        let Some(id) = n
            .node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .and_then(registration::instance_id)
        else {
            continue;
        };
        let name = n.node.metadata.name.clone().unwrap_or_default();
        let reserved = node_labels.get(labels::CAPACITY_TYPE).map(String::as_str) == Some(labels::CAPACITY_RESERVED);
        by_class
            .entry(class)
            .or_default()
            .push((name, id.to_string(), reserved));
    }
    by_class.retain(|c, _| classes.contains_key(c));
    if by_class.is_empty() {
        return out;
    }
    let instances: BTreeMap<&str, &Instance> = instances.iter().map(|i| (i.id.as_str(), i)).collect();
    for (class_name, nodes) in by_class {
        let Some(facts) = classes.get(&class_name) else {
            continue;
        };
        let subnets = facts.subnet_ids();
        let security_groups = facts.security_group_ids();
        let reservations: BTreeSet<String> = facts
            .capacity_reservations
            .iter()
            .flatten()
            .map(|r| r.id.clone())
            .collect();
        for (node, i, reserved) in nodes
            .into_iter()
            .filter_map(|(node, id, reserved)| Some((node, *instances.get(id.as_str())?, reserved)))
        {
            let key = crate::nodeclass::ami::ami_key_of(&i.instance_type, Some(&snapshot.catalog));
            let now = ClassResolution {
                amis: facts.amis.get(&key).cloned().into_iter().collect(),
                subnets: subnets.clone(),
                security_groups: security_groups.clone(),
                capacity_reservations: reservations.clone(),
            };
            let facts = InstanceFacts {
                image_id: i.image_id.clone(),
                subnet_id: i.subnet_id.clone(),
                security_groups: i.security_group_ids.clone(),
                // Only a node launched as reserved capacity: EC2 also matches plain
                // on-demand instances into open ODCRs, which is no reason to replace them
                // (Karpenter counts only instances launched into a reservation).
                capacity_reservation: i
                    .capacity_reservation
                    .as_ref()
                    .filter(|_| reserved)
                    .map(|r| r.id.clone()),
            };
            if let Some(why) = resolved_drift::reason(&facts, &now) {
                tracing::info!(node = %node, instance_id = %i.id, class = %class_name, reason = why, "drifted by live resolution");
                out.insert(node, why.to_string());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replacements_with_a_node_receive_the_pods_of_their_record_s_node() {
        let claim = |name: &str, node: Option<&str>| NodeClaim {
            node_name: node.map(str::to_string),
            ..NodeClaim::pending(name, "default", "default")
        };
        let record = |claim: &str, node: &str, replacements: &[&str]| DisruptionRecord {
            claim: claim.into(),
            node: node.into(),
            reason: Reason::Underutilized,
            detail: String::new(),
            step: DisruptionStep::Draining,
            replacements: replacements.iter().map(|r| r.to_string()).collect(),
            grace_ms: None,
            force_from_ms: None,
            started_ms: 0,
            version: 1,
        };
        let claims = [
            claim("old", Some("n-old")),
            claim("new-a", Some("n-a")),
            claim("new-b", None),
            claim("other", Some("n-other")),
        ];
        let records = [
            record("old", "n-old", &["new-a", "new-b", "gone"]),
            record("other", "n-other", &[]),
        ];
        assert_eq!(
            receiving(&records, &claims),
            BTreeMap::from([("n-a".to_string(), "n-old".to_string())])
        );
        assert!(receiving(&[], &claims).is_empty());
    }

    #[test]
    fn a_node_whose_claim_has_not_registered_it_is_no_candidate() -> Result<(), Box<dyn std::error::Error>> {
        use crate::scheduling::fixtures::{catalog, managed_node, merge, pool};
        let now: Timestamp = "2026-03-01T12:00:00Z".parse()?;
        let node = |name: &str, extra: serde_json::Value| {
            let mut v = serde_json::to_value(managed_node(name))?;
            merge(
                &mut v,
                serde_json::json!({"metadata": {"creationTimestamp": "2026-03-01T07:00:00Z"},
                    "spec": {"providerID": format!("aws:///test-zone-a/i-{name}")}}),
            );
            merge(&mut v, extra);
            serde_json::from_value::<k8s_openapi::api::core::v1::Node>(v)
        };
        // Two empty nodes: one registered, one whose kubelet joined but whose
        // claim the sweep has not registered yet.
        let joining = node(
            "joining",
            serde_json::json!({"spec": {"taints": [{"key": labels::UNREGISTERED_TAINT_KEY, "effect": "NoExecute"}]}}),
        )?;
        let mut registered = NodeClaim::pending("c-idle", "default", "default");
        registered.node_name = Some("idle".into());
        registered.phase = Phase::Initialized;
        let mut launched = NodeClaim::pending("c-joining", "default", "default");
        launched.instance_id = Some("i-joining".into());
        launched.phase = Phase::Launched;
        let claims = [registered, launched];
        let catalog = catalog();
        let nodes = crate::snapshot::live::initializing_as_claimed(
            vec![joining, node("idle", serde_json::json!({}))?],
            &claims,
            &catalog,
        );
        // The snapshot shows the joining node as its claim will be, without
        // the taint that says it is not registered.
        assert!(
            nodes[0]
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_none_or(Vec::is_empty)
        );
        let mut snapshot = Snapshot::new(std::sync::Arc::new(catalog), now);
        snapshot.node_pools = vec![pool(
            "default",
            "template:\n  spec:\n    nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}\n    requirements: []\ndisruption:\n  budgets: [{nodes: '100%'}]\n",
        )];
        snapshot.nodes = nodes
            .into_iter()
            .map(|node| crate::scheduling::ExistingNode { node, pods: vec![] })
            .collect();
        let config = SweepConfig::from_lookup(|_| None)?;
        let d = crate::disruption::decide(&snapshot, &pass_options(&config, &[], &claims, &[], now));
        let chosen: Vec<&str> = d
            .decisions
            .iter()
            .flat_map(|c| c.nodes.iter().map(String::as_str))
            .collect();
        assert_eq!(chosen, ["idle"], "{d:#?}");
        assert!(!d.nodes.contains_key("joining"), "{d:#?}");
        Ok(())
    }

    #[test]
    fn impaired_instances_name_their_managed_nodes_and_a_held_repair_is_an_event() {
        let node = |name: &str, id: &str, managed: bool| {
            let mut labels = serde_json::json!({});
            if managed {
                labels[labels::NODEPOOL] = "default".into();
            }
            crate::scheduling::ExistingNode {
                node: serde_json::from_value(serde_json::json!({"metadata": {"name": name, "labels": labels},
                    "spec": {"providerID": format!("aws:///us-east-1a/{id}")}}))
                .unwrap(),
                pods: vec![],
            }
        };
        let mut s = Snapshot::new(
            std::sync::Arc::new(crate::scheduling::fixtures::catalog()),
            Timestamp::from_second(1_000).unwrap(),
        );
        s.nodes = vec![
            node("a", "i-0a", true),
            node("b", "i-0b", true),
            node("unmanaged", "i-0c", false),
        ];
        let since = Timestamp::from_second(10).ok();
        let impaired = [
            Impaired {
                id: "i-0a".into(),
                since,
            },
            Impaired {
                id: "i-0c".into(),
                since: None,
            },
            Impaired {
                id: "i-0ther".into(),
                since: None,
            },
        ];
        assert_eq!(
            impaired_nodes(&s, &impaired),
            BTreeMap::from([("a".to_string(), since)])
        );
        assert!(worth_an_event(&Held::RepairCapped {
            pool: "default".into(),
            unhealthy: 2,
            total: 4
        }));
    }

    #[test]
    fn only_protections_and_budgets_are_worth_an_event() {
        assert!(worth_an_event(&Held::DoNotDisruptNode));
        assert!(!worth_an_event(&Held::ConsolidateAfter { remaining_secs: 3 }));
        assert!(!worth_an_event(&Held::NoSaving));
        assert!(!worth_an_event(&Held::Unconsolidatable("no cheaper place".into())));
        assert!(!worth_an_event(&Held::RecentReplacement { remaining_secs: 60 }));
        assert!(!worth_an_event(&Held::Receiving { from: "n".into() }));
    }
}
