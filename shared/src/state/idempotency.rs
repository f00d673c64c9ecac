//! Idempotency records: "this message was handled", kept until a TTL.

use super::item::{self, n};
use super::{PK_PROCESSED, StateError, StateStore};

impl StateStore {
    /// Records `key` as processed until `expires_at` (epoch s). Returns false if
    /// it was already recorded and has not expired, i.e. the caller should skip.
    pub async fn record_processed(&self, key: &str, expires_at: i64, now_secs: i64) -> Result<bool, StateError> {
        let mut it = item::key(PK_PROCESSED, key);
        it.insert("expiresAt".into(), n(expires_at));
        let res = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(it))
            .condition_expression("attribute_not_exists(pk) OR expiresAt <= :now")
            .expression_attribute_values(":now", n(now_secs))
            .send()
            .await;
        match res {
            Ok(_) => Ok(true),
            Err(e) if item::condition_failed(&e) => Ok(false),
            Err(e) => Err(self.dynamo("PutItem", e)),
        }
    }

    /// Whether `key` is recorded as processed and not expired at `now_secs`.
    pub async fn is_processed(&self, key: &str, now_secs: i64) -> Result<bool, StateError> {
        let out = self.read_item(PK_PROCESSED, key).await?;
        Ok(out
            .as_ref()
            .and_then(|it| it.get("expiresAt"))
            .and_then(|v| v.as_n().ok())
            .and_then(|v| v.parse::<i64>().ok())
            .is_some_and(|expires| expires > now_secs))
    }
}
