//! The sweep's share of termination ([`crate::lifecycle::termination`]):
//! it begins the terminations the world calls for (a deleted Node or
//! NodeClaim object, a deleted NodePool) before the run's drain pass, and
//! after it carries out every recorded termination that is due: the instance
//! terminated, the Node deleted and its finalizer removed, the claim and its
//! records forgotten, its NodeClaim object let go.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;

use super::{StepError, Sweeper};
use crate::draining;
use crate::ec2::Instance;
use crate::kubernetes::{Cluster, EventSpec, events};
use crate::lifecycle::termination::{self, Begin, Seen};
use crate::nodeclaim::{NodeClaim, Phase};
use crate::state::{TerminationRecord, VersionCheck};

/// What a run did about terminations.
#[derive(Debug, Default)]
pub struct TerminationReport {
    /// Claims whose termination began.
    pub begun: Vec<String>,
    /// Claims terminated (instance, Node and claim gone).
    pub terminated: Vec<String>,
    /// The $/h the terminated claims cost.
    pub usd_per_hour: f64,
    /// Claims whose step failed, with why (the next run tries again).
    pub failed: Vec<(String, StepError)>,
}

impl<C: Cluster> Sweeper<C> {
    /// Begins the terminations due at `now`: taint, Draining, drain and termination records.
    pub(super) async fn begin_terminations(
        &self,
        now: Timestamp,
        claims: &[NodeClaim],
        nodes: &[Node],
        instances: &[Instance],
        objects_deleted: &BTreeMap<String, Timestamp>,
        report: &mut TerminationReport,
    ) {
        let facts = async {
            let pools = match self.cluster.node_pools().await {
                Ok(p) => Some(p),
                Err(e) => {
                    tracing::warn!(error = %crate::telemetry::causes(&e), "NodePools unreadable: no pool counts as deleted this run");
                    None
                }
            };
            let terminations = self.store.terminations().await?;
            let disrupting: BTreeSet<String> = self.store.disruptions().await?.into_iter().map(|d| d.claim).collect();
            Ok::<_, StepError>((pools, terminations, disrupting))
        };
        let (pools, terminations, disrupting) = match facts.await {
            Ok(f) => f,
            Err(e) => {
                report.failed.push((String::new(), e));
                return;
            }
        };
        let begins = termination::to_begin(&Seen {
            now,
            claims,
            nodes,
            instances,
            pools: pools.as_deref(),
            terminations: &terminations,
            disrupting: &disrupting,
            objects_deleted,
        });
        for b in begins {
            match self.begin_one(&b, now).await {
                Ok(()) => {
                    tracing::info!(node_claim = %b.claim, node = ?b.node, reason = b.reason, deadline = ?b.policy.deadline, "termination begun: the node is drained, then terminated");
                    report.begun.push(b.claim);
                }
                Err(e) => report.failed.push((b.claim, e)),
            }
        }
    }

    /// Begins one termination: taint and event, claim Draining, drain record, termination record.
    pub(super) async fn begin_one(&self, b: &Begin, now: Timestamp) -> Result<(), StepError> {
        if let Some(node) = &b.node {
            match self.cluster.taint_disrupted(node).await {
                Ok(_) => {
                    let why = format!("termination: {}", b.reason);
                    self.node_event(EventSpec::disrupting(events::node_name_ref(node), &why), Some(&b.claim))
                        .await;
                }
                Err(e) if e.code() == Some(404) => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.store
            .advance_node_claim(&b.claim, |c| {
                let mut next = c.clone();
                (c.phase != Phase::Draining && next.advance(Phase::Draining, now).is_ok()).then_some(next)
            })
            .await?;
        // The drain before the termination: a termination without a drain record is due at once.
        if let Some(node) = &b.node {
            self.store
                .begin_drain(&draining::record(&b.claim, node, b.reason, b.policy, now))
                .await?;
        }
        self.store.begin_termination(&termination::record(b, now)).await?;
        Ok(())
    }

    /// Carries out every recorded termination that is due at `now`.
    pub(super) async fn finish_terminations(&self, now: Timestamp, report: &mut TerminationReport) {
        let records = async {
            let drains: BTreeSet<String> = self.store.drains().await?.into_iter().map(|d| d.claim).collect();
            Ok::<_, StepError>((self.store.terminations().await?, drains))
        };
        let (records, drains) = match records.await {
            Ok(r) => r,
            Err(e) => {
                report.failed.push((String::new(), e));
                return;
            }
        };
        for r in records {
            if !termination::due(&r, drains.contains(&r.claim), now) {
                continue;
            }
            match self.finish_one(&r).await {
                Ok(Some(claim)) => {
                    tracing::info!(node_claim = %r.claim, node = ?r.node, reason = %r.reason, "terminated: instance, Node and claim gone");
                    report.usd_per_hour += claim.price.unwrap_or(0.0);
                    report.terminated.push(r.claim);
                }
                Ok(None) => {}
                Err(e) => report.failed.push((r.claim, e)),
            }
        }
    }

    /// Instance first, then the Node (its finalizer removed), then the claim
    /// and the records: a crash in between leaves a record the next run finishes.
    async fn finish_one(&self, r: &TerminationRecord) -> Result<Option<NodeClaim>, StepError> {
        let Some(claim) = self.store.get_node_claim(&r.claim).await? else {
            // Removed meanwhile (its capacity was gone): whoever removed it took the Node.
            self.store.end_termination(&r.claim).await?;
            return Ok(None);
        };
        let instance = claim.instance_id.as_deref();
        self.terminate(instance).await?;
        if let Some(node) = &r.node {
            crate::kubernetes::cluster::delete_node_of(&self.cluster, node, instance).await?;
        }
        self.store.remove_node_claim(&claim, VersionCheck::Regardless).await?;
        self.store.end_drain(&r.claim).await?;
        self.store.end_termination(&r.claim).await?;
        // `kubectl delete nodeclaim` waits for this; a failure is the mirror's to repair next run.
        if let Err(e) = self.cluster.release_node_claim_object(&r.claim).await {
            tracing::warn!(node_claim = %r.claim, error = %crate::telemetry::causes(&e), "NodeClaim object not let go; the next sweep does");
        }
        Ok(Some(claim))
    }
}
