//! Markers: when something last happened (the last solve), for the sweep's
//! pending-pod safety net.

use super::item::{self, get_i64, n};
use super::{PK_MARKER, StateError, StateStore};

/// The marker `provision` writes after every solve.
pub const LAST_SOLVE: &str = "last-solve";

impl StateStore {
    /// Records that `marker` happened at `at_ms` (epoch ms); an older time never
    /// overwrites a newer one.
    pub async fn mark(&self, marker: &str, at_ms: i64) -> Result<(), StateError> {
        let mut it = item::key(PK_MARKER, marker);
        it.insert("at".into(), n(at_ms));
        let res = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(it))
            .condition_expression("attribute_not_exists(pk) OR #at < :at")
            .expression_attribute_names("#at", "at")
            .expression_attribute_values(":at", n(at_ms))
            .send()
            .await;
        match res {
            Ok(_) => Ok(()),
            Err(e) if item::condition_failed(&e) => Ok(()),
            Err(e) => Err(self.dynamo("PutItem", e)),
        }
    }

    /// When `marker` last happened (epoch ms), if ever.
    pub async fn marked_at(&self, marker: &str) -> Result<Option<i64>, StateError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(item::key(PK_MARKER, marker)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.dynamo("GetItem", e))?;
        out.item().map(|it| get_i64(it, "marker", "at")).transpose()
    }
}
