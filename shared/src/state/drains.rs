//! Drains in progress: a node being emptied because its capacity goes away,
//! kept so that a drain outliving one invocation is continued by the next
//! (the next interruption event, or the sweep).

use super::item::{self, Item, get_i64, get_s, n, s};
use super::{PK_DRAIN, StateError, StateStore};

/// How long a drain record outlives its deadline before DynamoDB may drop it (s).
const KEEP_AFTER_DEADLINE_SECS: i64 = 3600;

/// A drain in progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainRecord {
    /// The NodeClaim whose node is drained (the sort key).
    pub claim: String,
    /// The Node.
    pub node: String,
    /// Why (`spot-interruption`, `scheduled-change`, …).
    pub reason: String,
    /// When the instance goes away (epoch ms), if known.
    pub deadline_ms: Option<i64>,
    /// From when PDBs and do-not-disrupt stop holding pods (epoch ms); None: never.
    pub force_from_ms: Option<i64>,
    /// When the drain began (epoch ms).
    pub started_ms: i64,
}

/// The DynamoDB item for a drain record (pure).
pub fn drain_item(r: &DrainRecord) -> Item {
    let mut it = item::key(PK_DRAIN, &r.claim);
    it.insert("node".into(), s(&r.node));
    it.insert("reason".into(), s(&r.reason));
    it.insert("startedAt".into(), n(r.started_ms));
    if let Some(d) = r.deadline_ms {
        it.insert("deadline".into(), n(d));
    }
    if let Some(f) = r.force_from_ms {
        it.insert("forceFrom".into(), n(f));
    }
    let until = r.deadline_ms.unwrap_or(r.started_ms).max(r.started_ms) / 1000;
    it.insert("expiresAt".into(), n(until + KEEP_AFTER_DEADLINE_SECS));
    it
}

/// Reads a drain record item (pure).
pub fn drain_from_item(it: &Item) -> Result<DrainRecord, StateError> {
    const WHAT: &str = "drain";
    let opt = |attr: &str| it.contains_key(attr).then(|| get_i64(it, WHAT, attr)).transpose();
    Ok(DrainRecord {
        claim: get_s(it, WHAT, "sk")?.to_string(),
        node: get_s(it, WHAT, "node")?.to_string(),
        reason: get_s(it, WHAT, "reason")?.to_string(),
        deadline_ms: opt("deadline")?,
        force_from_ms: opt("forceFrom")?,
        started_ms: get_i64(it, WHAT, "startedAt")?,
    })
}

impl StateStore {
    /// Records a drain, unless one is recorded for the claim already (the first
    /// notice's deadline stands). Returns the record in force.
    pub async fn begin_drain(&self, record: &DrainRecord) -> Result<DrainRecord, StateError> {
        let res = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(drain_item(record)))
            .condition_expression("attribute_not_exists(pk)")
            .send()
            .await;
        match res {
            Ok(_) => Ok(record.clone()),
            Err(e) if item::condition_failed(&e) => {
                let existing = self.drains().await?.into_iter().find(|d| d.claim == record.claim);
                Ok(existing.unwrap_or_else(|| record.clone()))
            }
            Err(e) => Err(self.dynamo("PutItem", e)),
        }
    }

    /// Every drain in progress.
    pub async fn drains(&self) -> Result<Vec<DrainRecord>, StateError> {
        self.query_partition(PK_DRAIN, None)
            .await?
            .iter()
            .map(drain_from_item)
            .collect()
    }

    /// The drain recorded for `claim` now (a strongly consistent read), or
    /// None when it has ended.
    pub async fn drain(&self, claim: &str) -> Result<Option<DrainRecord>, StateError> {
        let out = self.read_item(PK_DRAIN, claim).await?;
        out.as_ref().map(drain_from_item).transpose()
    }

    /// Forgets a drain (done, or its node is gone).
    pub async fn end_drain(&self, claim: &str) -> Result<(), StateError> {
        self.client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(item::key(PK_DRAIN, claim)))
            .send()
            .await
            .map_err(|e| self.dynamo("DeleteItem", e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let r = DrainRecord {
            claim: "default-abcde".into(),
            node: "ip-10-0-0-1".into(),
            reason: "spot-interruption".into(),
            deadline_ms: Some(1_000_000),
            force_from_ms: None,
            started_ms: 900_000,
        };
        assert_eq!(drain_from_item(&drain_item(&r)).unwrap(), r);
        assert_eq!(get_i64(&drain_item(&r), "drain", "expiresAt").unwrap(), 1000 + 3600);
    }
}
