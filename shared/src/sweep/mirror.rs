//! The sweep's share of the mirror ([`crate::mirror`]): once a run, after
//! the work that moves nodes, the NodeClaim objects are brought in line with
//! the claims the run read, and each NodePool's status is written when it
//! changed. A failed write is logged and counted and holds up nothing: the
//! next run plans from what it finds.

use std::time::Instant;

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;

use super::Sweeper;
use crate::apis::nodeclaim::NodeClaimObject;
use crate::disruption::NodeState;
use crate::kubernetes::Cluster;
use crate::mirror;
use crate::nodeclaim::NodeClaim;

pub use crate::mirror::write::MirrorReport;

/// What a run read that the mirror is written from.
pub(super) struct Read<'a> {
    /// The claims the run read, less those it removed.
    pub claims: &'a [&'a NodeClaim],
    /// The Nodes it read.
    pub nodes: &'a [Node],
    /// nodesmith's NodeClaim objects as listed this run (None: they could
    /// not be listed, so none is created or let go).
    pub objects: Option<&'a [NodeClaimObject]>,
    /// Each node's drift and consolidatability from this run's pass (None: no pass ran).
    pub states: Option<&'a BTreeMap<String, NodeState>>,
}

impl<C: Cluster> Sweeper<C> {
    /// Writes what [`mirror::plan`] calls for, and the NodePool statuses
    /// that changed, starting no write after `stop_at`.
    pub(super) async fn mirror(&self, now: Timestamp, read: Read<'_>, stop_at: Instant, report: &mut MirrorReport) {
        let Read {
            claims,
            nodes,
            objects,
            states,
        } = read;
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
            let plan = mirror::plan(
                &mirror::Facts {
                    claims,
                    nodes,
                    pools: &pools,
                    states,
                },
                objects,
                now,
            );
            mirror::write::write(&self.cluster, &plan, stop_at, report).await;
            self.release(&plan.orphans, stop_at, report).await;
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

    /// Lets go of the objects whose claims are gone, once a fresh read
    /// confirms it (a claim written since the listing is not gone).
    async fn release(&self, orphans: &[String], stop_at: Instant, report: &mut MirrorReport) {
        for orphan in orphans {
            if report.late(stop_at) {
                continue;
            }
            match self.store.get_node_claim(orphan).await {
                Ok(Some(_)) => continue,
                Ok(None) => {}
                Err(e) => {
                    report.failed(orphan.clone(), &crate::telemetry::causes(&e));
                    continue;
                }
            }
            match self.cluster.release_node_claim_object(orphan).await {
                Ok(_) => report.released += 1,
                Err(e) => report.failed(orphan.clone(), &crate::telemetry::causes(&e)),
            }
        }
    }
}
