//! The mirror's writes ([`super::plan`] carried out): shared by the sweep,
//! which repairs every object once a run, and launch, which writes its
//! claim's object as soon as the instance exists.

use std::time::Instant;

use super::Plan;
use crate::apis::nodeclaim::NodeClaimObject;
use crate::kubernetes::Cluster;

/// What the mirror's writes did (a sweep's also counts NodePool statuses and carries the fleet's gauges).
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

impl MirrorReport {
    /// Counts a write that failed and logs it: the next sweep tries again.
    pub fn failed(&mut self, what: String, e: &dyn std::fmt::Display) {
        tracing::warn!(node_claim = %what, error = %e, "NodeClaim object not written; the next sweep tries again");
        self.failed.push((what, e.to_string()));
    }

    /// Whether `stop_at` has passed, counting the write it leaves for the next run if so.
    pub fn late(&mut self, stop_at: Instant) -> bool {
        let late = Instant::now() >= stop_at;
        self.deferred += usize::from(late);
        late
    }
}

/// Writes the creates, updates and status writes of `plan`, starting none
/// after `stop_at`; what fails is logged and counted in `report`, never
/// returned: the next sweep plans again from what it finds. Orphans are
/// the sweep's to release (launch may not delete NodeClaim objects).
pub async fn write(cluster: &impl Cluster, plan: &Plan, stop_at: Instant, report: &mut MirrorReport) {
    let name = |o: &NodeClaimObject| o.metadata.name.clone().unwrap_or_default();
    for o in &plan.create {
        if report.late(stop_at) {
            continue;
        }
        match cluster.create_node_claim_object(o).await {
            Ok(true) => report.created += 1,
            Ok(false) => {}
            Err(e) => report.failed(name(o), &crate::telemetry::causes(&e)),
        }
    }
    for o in &plan.update {
        if report.late(stop_at) {
            continue;
        }
        let written = match cluster.replace_node_claim_object(o).await {
            Ok(Some(w)) => w,
            Ok(None) => continue,
            Err(e) => {
                report.failed(name(o), &crate::telemetry::causes(&e));
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
            if let Err(e) = cluster.replace_node_claim_object_status(&with_status).await {
                report.failed(name(o), &crate::telemetry::causes(&e));
            }
        }
    }
    for o in &plan.status {
        if report.late(stop_at) {
            continue;
        }
        match cluster.replace_node_claim_object_status(o).await {
            Ok(_) => report.updated += 1,
            // 409: someone wrote it since the listing; the next run writes.
            Err(e) => report.failed(name(o), &crate::telemetry::causes(&e)),
        }
    }
}
