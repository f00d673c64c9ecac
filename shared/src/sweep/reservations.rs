//! The sweep's share of [`crate::reservation_end`]: nodes whose instance left
//! its capacity reservation are relabelled on-demand (the Node, then the
//! claim: a crash in between is found again from the claim or the Node), and
//! nodes of capacity blocks about to end begin their termination.

use std::collections::BTreeSet;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;

use super::{StepError, Sweeper};
use crate::catalog::Catalog;
use crate::ec2::Instance;
use crate::kubernetes::Cluster;
use crate::nodeclaim::NodeClaim;
use crate::reservation_end::{self, LeftReservation};
use crate::state::Advance;

/// What a run did about ending reservations.
#[derive(Debug, Default)]
pub struct ReservationReport {
    /// Claims relabelled from reserved to on-demand.
    pub relabelled: Vec<String>,
    /// Claims whose termination began because their capacity block ends.
    pub expiring: Vec<String>,
    /// Claims whose step failed, with why (the next run tries again).
    pub failed: Vec<(String, StepError)>,
}

impl<C: Cluster> Sweeper<C> {
    /// Relabels nodes out of their reservation and begins the terminations
    /// of nodes in expiring capacity blocks, at `now`.
    pub(super) async fn end_reservations(
        &self,
        now: Timestamp,
        claims: &[NodeClaim],
        nodes: &[Node],
        instances: &[Instance],
        catalog: &Catalog,
        report: &mut ReservationReport,
    ) {
        for left in reservation_end::left_reservation(claims, nodes, instances, Some(catalog)) {
            match self.relabel(&left).await {
                Ok(()) => {
                    tracing::info!(node_claim = %left.claim, node = ?left.node, instance_id = %left.instance, price = ?left.on_demand_price, "instance left its capacity reservation: relabelled on-demand");
                    report.relabelled.push(left.claim);
                }
                Err(e) => {
                    tracing::warn!(node_claim = %left.claim, error = %crate::telemetry::causes(&e), "relabelling a node out of its reservation failed; the next sweep tries again");
                    report.failed.push((left.claim, e));
                }
            }
        }
        let blocks = reservation_end::blocks_in_use(claims);
        if blocks.is_empty() {
            return;
        }
        let facts = async {
            let ends = crate::nodeclass::capacityreservation::end_times(self.instances.ec2(), &blocks)
                .await
                .map_err(|e| StepError::Reservations(Box::new(e)))?;
            let mut busy: BTreeSet<String> = self.store.terminations().await?.into_iter().map(|t| t.claim).collect();
            busy.extend(self.store.disruptions().await?.into_iter().map(|d| d.claim));
            Ok::<_, StepError>((ends, busy))
        };
        let (ends, busy) = match facts.await {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(error = %crate::telemetry::causes(&e), "capacity blocks' ends not read; the next sweep tries again");
                report.failed.push((String::new(), e));
                return;
            }
        };
        for b in reservation_end::block_endings(claims, &ends, &busy, now) {
            match self.begin_one(&b, now).await {
                Ok(()) => {
                    tracing::info!(node_claim = %b.claim, node = ?b.node, deadline = ?b.policy.deadline, "capacity block expiring: the node is drained, then terminated");
                    report.expiring.push(b.claim);
                }
                Err(e) => {
                    tracing::warn!(node_claim = %b.claim, error = %crate::telemetry::causes(&e), "beginning a capacity block node's termination failed; the next sweep tries again");
                    report.failed.push((b.claim, e));
                }
            }
        }
    }

    /// The Node first, then the claim.
    async fn relabel(&self, left: &LeftReservation) -> Result<(), StepError> {
        if let Some(node) = &left.node {
            self.cluster
                .update_node(node, &reservation_end::on_demand_labels())
                .await?;
        }
        if left.claim_reserved {
            let moved = self
                .store
                .advance_node_claim(&left.claim, |c| {
                    reservation_end::demoted(c, &left.instance, left.on_demand_price)
                })
                .await?;
            if let Advance::Moved(c) = moved {
                tracing::debug!(node_claim = %c.name, "claim records on-demand capacity");
            }
        }
        Ok(())
    }
}
