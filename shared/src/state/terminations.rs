//! Terminations in progress: a node nodesmith drains and then terminates
//! (its Node was deleted, its NodePool was deleted, or an interruption
//! drains it), kept so the sweep that finds the drain finished, or its
//! deadline passed, ends the instance, the Node and the claim.

use super::item::{self, Item, get_i64, get_s, n, s};
use super::{StateError, StateStore};

/// Partition of termination items.
pub const PK_TERMINATION: &str = "TERMINATION";

/// A termination in progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TerminationRecord {
    /// The NodeClaim terminated (the sort key).
    pub claim: String,
    /// Its Node, when it registered one.
    pub node: Option<String>,
    /// Why (`node-deleted`, `nodepool-deleted`, `spot-interruption`, …).
    pub reason: String,
    /// When the instance is terminated whatever the drain says (epoch ms); None: only once drained.
    pub deadline_ms: Option<i64>,
    /// When the termination began (epoch ms).
    pub started_ms: i64,
}

/// The DynamoDB item for a termination record (pure).
pub fn termination_item(r: &TerminationRecord) -> Item {
    let mut it = item::key(PK_TERMINATION, &r.claim);
    if let Some(node) = &r.node {
        it.insert("node".into(), s(node));
    }
    it.insert("reason".into(), s(&r.reason));
    it.insert("startedAt".into(), n(r.started_ms));
    if let Some(d) = r.deadline_ms {
        it.insert("deadline".into(), n(d));
    }
    it
}

/// Reads a termination record item (pure).
pub fn termination_from_item(it: &Item) -> Result<TerminationRecord, StateError> {
    const WHAT: &str = "termination";
    Ok(TerminationRecord {
        claim: get_s(it, WHAT, "sk")?.to_string(),
        node: it
            .contains_key("node")
            .then(|| get_s(it, WHAT, "node").map(str::to_string))
            .transpose()?,
        reason: get_s(it, WHAT, "reason")?.to_string(),
        deadline_ms: it
            .contains_key("deadline")
            .then(|| get_i64(it, WHAT, "deadline"))
            .transpose()?,
        started_ms: get_i64(it, WHAT, "startedAt")?,
    })
}

impl StateStore {
    /// Records a termination, unless one is recorded for the claim already
    /// (the first one's deadline stands).
    pub async fn begin_termination(&self, record: &TerminationRecord) -> Result<(), StateError> {
        let res = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(termination_item(record)))
            .condition_expression("attribute_not_exists(pk)")
            .send()
            .await;
        match res {
            Ok(_) => Ok(()),
            Err(e) if item::condition_failed(&e) => Ok(()),
            Err(e) => Err(self.dynamo("PutItem", e)),
        }
    }

    /// Every termination in progress.
    pub async fn terminations(&self) -> Result<Vec<TerminationRecord>, StateError> {
        self.query_partition(PK_TERMINATION, None)
            .await?
            .iter()
            .map(termination_from_item)
            .collect()
    }

    /// Forgets a termination (carried out, or its claim is gone).
    pub async fn end_termination(&self, claim: &str) -> Result<(), StateError> {
        self.client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(item::key(PK_TERMINATION, claim)))
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
        let r = TerminationRecord {
            claim: "default-abcde".into(),
            node: Some("ip-10-0-0-1".into()),
            reason: "node-deleted".into(),
            deadline_ms: Some(1_000_000),
            started_ms: 900_000,
        };
        assert_eq!(termination_from_item(&termination_item(&r)).unwrap(), r);
        let bare = TerminationRecord {
            node: None,
            deadline_ms: None,
            ..r
        };
        assert_eq!(termination_from_item(&termination_item(&bare)).unwrap(), bare);
    }
}
