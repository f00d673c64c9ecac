//! The sweep's share of the mirror ([`crate::mirror`]): once a run, after
//! the work that moves nodes, the NodeClaim objects are brought in line with
//! the claims the run read, and each NodePool's status is written when it
//! changed. A failed write is logged and counted and holds up nothing: the
//! next run plans from what it finds.

use std::time::Instant;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;

use super::Sweeper;
use crate::apis::nodeclaim::NodeClaimObject;
use crate::kubernetes::Cluster;
use crate::mirror;
use crate::nodeclaim::NodeClaim;

/// What the mirror part of one run did.
#[derive(Debug, Default)]
pub struct MirrorReport {
    /// NodeClaim objects created.
    pub created: usize,
    /// NodeClaim objects whose metadata, spec or status was rewritten.
    pub updated: usize,
    /// NodeClaim objects let go (their claims are gone).
    pub released: usize,
    /// NodePools whose status was written.
    pub pools_written: usize,
    /// Writes left for the next run (the run's time was up).
    pub deferred: usize,
    /// What failed, with why.
    pub failed: Vec<(String, String)>,
    /// The fleet's gauges, from the claims, nodes and pools this step read ([`crate::metrics::fleet`]).
    pub gauges: Vec<crate::telemetry::Series>,
}

impl<C: Cluster> Sweeper<C> {
    /// Writes what [`mirror::plan`] calls for, and the NodePool statuses
    /// that changed, starting no write after `stop_at`. `claims`: those the
    /// run read, less those it removed; `objects`: nodesmith's NodeClaim
    /// objects as listed this run (None: they could not be listed, so none
    /// is created or let go).
    pub(super) async fn mirror(
        &self,
        now: Timestamp,
        claims: &[&NodeClaim],
        nodes: &[Node],
        objects: Option<&[NodeClaimObject]>,
        stop_at: Instant,
        report: &mut MirrorReport,
    ) {
        let pools = match self.cluster.usable_node_pools().await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %crate::telemetry::causes(&e), "NodePools not listed; no NodePool status this run");
                report.failed.push((String::new(), e.to_string()));
                Vec::new()
            }
        };
        // Summed once, for the gauges and every pool's status.
        let resources = mirror::pool_resources(claims, nodes);
        report.gauges = crate::metrics::fleet(claims, &pools, &resources);
        if let Some(objects) = objects {
            let plan = mirror::plan(claims, nodes, &pools, objects);
            self.write_plan(plan, stop_at, report).await;
        }
        if pools.is_empty() {
            return;
        }
        let classes = match self.cluster.usable_node_classes().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %crate::telemetry::causes(&e), "EC2NodeClasses not listed; no NodePool status this run");
                report.failed.push((String::new(), e.to_string()));
                return;
            }
        };
        for pool in &pools {
            if Instant::now() >= stop_at {
                report.deferred += 1;
                continue;
            }
            let class = classes
                .iter()
                .find(|c| c.name() == pool.spec.template.spec.node_class_ref.name);
            let status = mirror::pool_status(pool, &resources, class, now);
            if pool.status.as_ref() == Some(&status) {
                continue;
            }
            let mut updated = pool.clone();
            updated.status = Some(status);
            match self.cluster.replace_node_pool_status(&updated).await {
                Ok(true) => report.pools_written += 1,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(node_pool = pool.name(), error = %crate::telemetry::causes(&e), "NodePool status not written; the next sweep tries again");
                    report.failed.push((pool.name().to_string(), e.to_string()));
                }
            }
        }
    }

    async fn write_plan(&self, plan: mirror::Plan, stop_at: Instant, report: &mut MirrorReport) {
        let name = |o: &NodeClaimObject| o.metadata.name.clone().unwrap_or_default();
        let mut failed = |what: String, e: &dyn std::fmt::Display| {
            tracing::warn!(node_claim = %what, error = %e, "NodeClaim object not written; the next sweep tries again");
            report.failed.push((what, e.to_string()));
        };
        let mut deferred = 0;
        // Past `stop_at` every write left is counted for the next run.
        let late = |deferred: &mut usize| {
            let late = Instant::now() >= stop_at;
            *deferred += usize::from(late);
            late
        };
        for o in &plan.create {
            if late(&mut deferred) {
                continue;
            }
            match self.cluster.create_node_claim_object(o).await {
                Ok(true) => report.created += 1,
                Ok(false) => {}
                Err(e) => failed(name(o), &crate::telemetry::causes(&e)),
            }
        }
        for o in &plan.update {
            if late(&mut deferred) {
                continue;
            }
            let written = match self.cluster.replace_node_claim_object(o).await {
                Ok(Some(w)) => w,
                Ok(None) => continue,
                Err(e) => {
                    failed(name(o), &crate::telemetry::causes(&e));
                    continue;
                }
            };
            report.updated += 1;
            // The status goes through its own subresource, on the version just written.
            if written.status != o.status {
                let with_status = NodeClaimObject {
                    status: o.status.clone(),
                    ..written
                };
                if let Err(e) = self.cluster.replace_node_claim_object_status(&with_status).await {
                    failed(name(o), &crate::telemetry::causes(&e));
                }
            }
        }
        for o in &plan.status {
            if late(&mut deferred) {
                continue;
            }
            match self.cluster.replace_node_claim_object_status(o).await {
                Ok(_) => report.updated += 1,
                // 409: someone wrote it since the listing; the next run writes.
                Err(e) => failed(name(o), &crate::telemetry::causes(&e)),
            }
        }
        for orphan in &plan.orphans {
            if late(&mut deferred) {
                continue;
            }
            // A claim written since the listing is not gone: read it again first.
            match self.store.get_node_claim(orphan).await {
                Ok(Some(_)) => continue,
                Ok(None) => {}
                Err(e) => {
                    failed(orphan.clone(), &crate::telemetry::causes(&e));
                    continue;
                }
            }
            match self.cluster.release_node_claim_object(orphan).await {
                Ok(_) => report.released += 1,
                Err(e) => failed(orphan.clone(), &crate::telemetry::causes(&e)),
            }
        }
        report.deferred += deferred;
    }
}
