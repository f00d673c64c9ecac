//! The sweep's static-capacity step: each static pool (`replicas`) is
//! brought back to its count ([`crate::static_capacity`] decides) by new
//! claims admitted through the one door for new capacity, under the
//! provision lease, as provisioning's and disruption's are. A surplus (a
//! lowered `replicas`) is drained and terminated as a deleted Node is
//! ([`crate::lifecycle::termination::scale_down`]).

use std::collections::BTreeSet;

use jiff::Timestamp;

use super::{StepError, Sweeper};
use crate::capacity;
use crate::kubernetes::{Cluster, drain};
use crate::lifecycle::termination;
use crate::snapshot::live;
use crate::static_capacity;

/// What the static-capacity step did.
#[derive(Debug, Default)]
pub struct ReplicasReport {
    /// Claims launched to keep static pools at their count.
    pub launched: Vec<String>,
    /// Static pools that could not launch, with why.
    pub refused: Vec<(String, String)>,
    /// Claims over their static pool's count whose termination began.
    pub surplus: Vec<String>,
    /// Surplus claims whose termination could not begin, with why (the next run tries again).
    pub failed: Vec<(String, StepError)>,
}

impl<C: Cluster> Sweeper<C> {
    /// Launches what static pools lack; a failure is logged and left to the next run.
    pub(super) async fn keep_replicas(&self, now: Timestamp) -> ReplicasReport {
        let mut report = ReplicasReport::default();
        if let Err(e) = self.keep_replicas_or_fail(now, &mut report).await {
            tracing::warn!(error = %crate::telemetry::causes(&e), "static pools not brought to their count; the next sweep tries again");
        }
        report
    }

    async fn keep_replicas_or_fail(&self, now: Timestamp, report: &mut ReplicasReport) -> Result<(), StepError> {
        // Cheap check first: most clusters have no static pool.
        let pools = self.cluster.node_pools().await?;
        if !pools.iter().any(|p| p.is_static()) {
            return Ok(());
        }
        let Some(url) = self.config.launch_queue_url.as_deref() else {
            tracing::warn!("static pools need nodes but NODESMITH_LAUNCH_QUEUE_URL is not set");
            return Ok(());
        };
        let door = &self.door(url);
        let done = door
            .under_lease(|lease| async move {
                // Read under the lease: claims provision wrote meanwhile count.
                let snapshot = live::read_launchable(&self.cluster, &self.store, now).await?;
                let claims = self.store.read_node_claims().await?.claims;
                let empty: BTreeSet<String> = snapshot
                    .nodes
                    .iter()
                    .filter(|n| !n.pods.iter().any(drain::moves_with_node))
                    .filter_map(|n| n.node.metadata.name.clone())
                    .collect();
                let seed = capacity::seed(&lease, now);
                let mut new = Vec::new();
                let mut ends = Vec::new();
                let mut out = ReplicasReport::default();
                // Claims a disruption or a termination already takes down are not counted twice.
                let mut busy: BTreeSet<String> = self.store.disruptions().await?.into_iter().map(|d| d.claim).collect();
                busy.extend(self.store.terminations().await?.into_iter().map(|t| t.claim));
                for pool in &snapshot.node_pools {
                    let Some(want) = static_capacity::decide(pool, &claims, &empty) else {
                        continue;
                    };
                    if want.limited {
                        tracing::info!(node_pool = %want.pool, "limits.nodes keeps the static pool below its replicas");
                    }
                    ends.extend(termination::scale_down(&want.remove, &claims, pool, &busy, now));
                    match static_capacity::plan_launches(
                        &snapshot,
                        &want.pool,
                        want.launch,
                        &format!("{seed}/{}", want.pool),
                    ) {
                        Ok(claims) => new.extend(claims),
                        Err(why) => out.refused.push((want.pool.clone(), why)),
                    }
                }
                let created = door.admit(&lease, &new).await?;
                out.launched = created.into_iter().map(|c| c.name).collect();
                Ok::<_, StepError>((out, ends))
            })
            .await?;
        match done {
            Some(done) => {
                let (mut out, ends) = done?;
                for b in ends {
                    match self.begin_one(&b, now).await {
                        Ok(()) => {
                            tracing::info!(node_claim = %b.claim, node = ?b.node, "static pool above its replicas: the node is drained, then terminated");
                            out.surplus.push(b.claim);
                        }
                        Err(e) => out.failed.push((b.claim, e)),
                    }
                }
                for (pool, why) in &out.refused {
                    tracing::warn!(node_pool = %pool, %why, "static pool cannot launch its replicas");
                }
                for (claim, e) in &out.failed {
                    tracing::warn!(node_claim = %claim, error = %crate::telemetry::causes(e), "a surplus replica's termination did not begin; the next sweep tries again");
                }
                *report = out;
            }
            None => tracing::info!("provision holds its lease; static pools wait for the next sweep"),
        }
        Ok(())
    }
}
