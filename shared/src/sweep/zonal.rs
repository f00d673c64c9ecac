//! The sweep's zonal shift pass: the zones ARC shifts traffic away from,
//! read once a pass for consolidation, and NodePool events when a zone's
//! shift begins or ends (as Karpenter emits them, on a change only).

use std::collections::BTreeSet;

use jiff::Timestamp;

use super::Sweeper;
use crate::kubernetes::Cluster;
use crate::snapshot::Snapshot;
use crate::state::StateError;
use crate::zonal_shift::{pool_events, zone_ids, zone_names};

/// Markers of when a zone's shift was last seen to begin and to end.
fn markers(id: &str) -> (String, String) {
    (format!("zonal-shift-began#{id}"), format!("zonal-shift-ended#{id}"))
}

impl<C: Cluster> Sweeper<C> {
    /// The zone names shifted away from at `now` (none when handling is
    /// off or ARC cannot be read); NodePools learn of a change by an event.
    pub(super) async fn zonal_shift_pass(&self, snapshot: &Snapshot, now: Timestamp) -> BTreeSet<String> {
        let Some(reader) = &self.zonal_shift else {
            return BTreeSet::new();
        };
        let away = reader.away_from(now).await;
        let names = zone_names(&away, &snapshot.node_classes, &snapshot.nodes);
        if let Err(e) = self.announce_zonal_shifts(snapshot, &away, now).await {
            tracing::warn!(error = %crate::telemetry::causes(&e), "zonal shift changes not announced; the next sweep tries again");
        }
        names
    }

    /// Compares the shifted zones with what the last pass saw (markers in the
    /// table) and records an event on each NodePool a change concerns; the
    /// markers move after the events, so a crash repeats an event, never loses one.
    async fn announce_zonal_shifts(
        &self,
        snapshot: &Snapshot,
        away: &BTreeSet<String>,
        now: Timestamp,
    ) -> Result<(), StateError> {
        let zones = zone_ids(&snapshot.node_classes, &snapshot.nodes);
        let (mut started, mut ended) = (BTreeSet::new(), BTreeSet::new());
        for id in zones.keys() {
            let (began, finished) = markers(id);
            let was =
                self.store.marked_at(&began).await?.unwrap_or(0) > self.store.marked_at(&finished).await?.unwrap_or(0);
            match (was, away.contains(id)) {
                (false, true) => started.insert(id.clone()),
                (true, false) => ended.insert(id.clone()),
                _ => false,
            };
        }
        for e in pool_events(&snapshot.node_pools, &snapshot.node_classes, &zones, &started, &ended) {
            self.event(e).await;
        }
        let at = now.as_millisecond();
        for id in &started {
            self.store.mark(&markers(id).0, at).await?;
        }
        for id in &ended {
            self.store.mark(&markers(id).1, at).await?;
        }
        Ok(())
    }
}
