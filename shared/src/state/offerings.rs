//! Unavailable offerings: (instance type, zone, capacity type) that recently
//! failed with insufficient capacity or were interrupted.

use std::collections::BTreeSet;

use aws_sdk_dynamodb::types::{PutRequest, WriteRequest};

use super::item::{self, Item, get_i64, get_s, n, s};
use super::{PK_UNAVAILABLE, StateError, StateStore};
pub use crate::catalog::OfferingKey;

/// How long an offering stays unavailable, as Karpenter's cache (3 minutes).
pub const UNAVAILABLE_TTL_SECS: i64 = 180;

/// DynamoDB's BatchWriteItem limit.
const BATCH: usize = 25;

impl OfferingKey {
    /// The sort key: `<capacity type>#<zone>#<instance type>`.
    pub fn sort_key(&self) -> String {
        format!("{}#{}#{}", self.capacity_type, self.zone, self.instance_type)
    }

    /// Parses a sort key (pure).
    pub fn from_sort_key(sk: &str) -> Option<Self> {
        let mut it = sk.splitn(3, '#');
        let (ct, zone, t) = (it.next()?, it.next()?, it.next()?);
        (!ct.is_empty() && !zone.is_empty() && !t.is_empty()).then(|| OfferingKey::new(t, zone, ct))
    }
}

/// An offering marked unavailable, and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnavailableOffering {
    /// The offering.
    pub key: OfferingKey,
    /// Why (the EC2 error code).
    pub reason: String,
    /// Unavailable until this time (epoch s).
    pub expires_at: i64,
}

/// Items still unexpired at `now_secs` (pure; DynamoDB's TTL deletion is lazy).
pub fn live(items: &[Item], now_secs: i64) -> Result<Vec<UnavailableOffering>, StateError> {
    let mut out = Vec::new();
    for it in items {
        let expires_at = get_i64(it, "unavailable offering", "expiresAt")?;
        if expires_at <= now_secs {
            continue;
        }
        let sk = get_s(it, "unavailable offering", "sk")?;
        let key = OfferingKey::from_sort_key(sk)
            .ok_or_else(|| item::corrupt(it, "unavailable offering", "sort key is not capacity#zone#type".into()))?;
        let reason = get_s(it, "unavailable offering", "reason")
            .unwrap_or("unknown")
            .to_string();
        out.push(UnavailableOffering {
            key,
            reason,
            expires_at,
        });
    }
    Ok(out)
}

impl StateStore {
    /// Marks offerings unavailable until `expires_at` (epoch s).
    pub async fn mark_unavailable(
        &self,
        offerings: &[OfferingKey],
        reason: &str,
        expires_at: i64,
    ) -> Result<(), StateError> {
        let unique: BTreeSet<&OfferingKey> = offerings.iter().collect();
        let unique: Vec<&OfferingKey> = unique.into_iter().collect();
        for chunk in unique.chunks(BATCH) {
            let mut writes = Vec::with_capacity(chunk.len());
            for o in chunk {
                let mut it = item::key(PK_UNAVAILABLE, &o.sort_key());
                it.insert("reason".into(), s(reason));
                it.insert("expiresAt".into(), n(expires_at));
                let put = PutRequest::builder()
                    .set_item(Some(it))
                    .build()
                    .map_err(|e| self.dynamo("BatchWriteItem", e))?;
                writes.push(WriteRequest::builder().put_request(put).build());
            }
            let mut pending = Some(writes);
            // Unprocessed items are retried a few times; DynamoDB returns them under throttling.
            for _ in 0..5 {
                let Some(w) = pending.take().filter(|w| !w.is_empty()) else {
                    break;
                };
                let out = self
                    .client
                    .batch_write_item()
                    .request_items(&self.table, w)
                    .send()
                    .await
                    .map_err(|e| self.dynamo("BatchWriteItem", e))?;
                pending = out.unprocessed_items().and_then(|m| m.get(&self.table)).cloned();
            }
            if pending.is_some_and(|w| !w.is_empty()) {
                return Err(StateError::Dynamo {
                    op: "BatchWriteItem",
                    table: self.table.clone(),
                    source: "unprocessed items left after 5 attempts".into(),
                });
            }
        }
        Ok(())
    }

    /// Offerings unavailable at `now_secs`.
    pub async fn unavailable_offerings(&self, now_secs: i64) -> Result<Vec<UnavailableOffering>, StateError> {
        let items = self.query_partition(PK_UNAVAILABLE, None).await?;
        live(&items, now_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn it(sk: &str, expires: i64) -> Item {
        let mut i = item::key(PK_UNAVAILABLE, sk);
        i.insert("expiresAt".into(), n(expires));
        i.insert("reason".into(), s("InsufficientInstanceCapacity"));
        i
    }

    #[test]
    fn sort_key_round_trips() {
        let k = OfferingKey::new("m5.large", "us-east-1a", "spot");
        assert_eq!(k.sort_key(), "spot#us-east-1a#m5.large");
        assert_eq!(OfferingKey::from_sort_key(&k.sort_key()), Some(k));
        for bad in ["", "spot", "spot#us-east-1a", "spot##m5.large"] {
            assert_eq!(OfferingKey::from_sort_key(bad), None, "{bad}");
        }
    }

    #[test]
    fn expired_items_are_filtered_at_the_boundary() {
        let items = [
            it("spot#a#m5.large", 100),
            it("spot#b#m5.large", 101),
            it("on-demand#a#c5.large", 99),
        ];
        let got: Vec<String> = live(&items, 100)
            .unwrap()
            .into_iter()
            .map(|u| u.key.sort_key())
            .collect();
        assert_eq!(got, vec!["spot#b#m5.large"]);
        assert!(live(&[it("garbage", 200)], 100).is_err());
    }
}
