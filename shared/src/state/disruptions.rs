//! Disruptions in progress: one record per disrupted NodeClaim, holding the
//! step the sweep reached, so a sweep killed at any point is resumed by the
//! next one. Every write is conditional (created once, then version-checked).

use aws_sdk_dynamodb::types::AttributeValue;

pub use crate::disruption::progress::{DisruptionRecord, DisruptionStep};

use super::item::{self, Item, get_i64, get_s, n, s};
use super::{PK_DISRUPTION, StateError, StateStore};

/// The DynamoDB item for a record at `version` (pure).
pub fn disruption_item(r: &DisruptionRecord, version: u64) -> Item {
    let mut it = item::key(PK_DISRUPTION, &r.claim);
    it.insert("node".into(), s(&r.node));
    it.insert("reason".into(), s(r.reason.as_str()));
    it.insert("detail".into(), s(&r.detail));
    it.insert("step".into(), s(r.step.as_str()));
    it.insert(
        "replacements".into(),
        AttributeValue::L(r.replacements.iter().map(s).collect()),
    );
    if let Some(g) = r.grace_ms {
        it.insert("graceMs".into(), n(g));
    }
    if let Some(f) = r.force_from_ms {
        it.insert("forceFrom".into(), n(f));
    }
    it.insert("startedAt".into(), n(r.started_ms));
    it.insert("version".into(), n(version));
    it
}

/// Reads a record item (pure).
pub fn disruption_from_item(it: &Item) -> Result<DisruptionRecord, StateError> {
    const WHAT: &str = "disruption";
    let step = get_s(it, WHAT, "step")?;
    let reason = get_s(it, WHAT, "reason")?;
    let replacements = match it.get("replacements") {
        Some(AttributeValue::L(l)) => l
            .iter()
            .map(|v| match v {
                AttributeValue::S(x) => Ok(x.clone()),
                _ => Err(item::corrupt(it, WHAT, "replacements holds a non-string".into())),
            })
            .collect::<Result<Vec<_>, _>>()?,
        None => Vec::new(),
        Some(_) => return Err(item::corrupt(it, WHAT, "replacements is not a list".into())),
    };
    let version = get_i64(it, WHAT, "version")?;
    Ok(DisruptionRecord {
        claim: get_s(it, WHAT, "sk")?.to_string(),
        node: get_s(it, WHAT, "node")?.to_string(),
        reason: reason
            .parse()
            .map_err(|_| item::corrupt(it, WHAT, format!("unknown reason {reason:?}")))?,
        detail: it
            .get("detail")
            .and_then(|v| v.as_s().ok())
            .cloned()
            .unwrap_or_default(),
        step: DisruptionStep::parse(step).ok_or_else(|| item::corrupt(it, WHAT, format!("unknown step {step:?}")))?,
        replacements,
        grace_ms: it
            .contains_key("graceMs")
            .then(|| get_i64(it, WHAT, "graceMs"))
            .transpose()?,
        force_from_ms: it
            .contains_key("forceFrom")
            .then(|| get_i64(it, WHAT, "forceFrom"))
            .transpose()?,
        started_ms: get_i64(it, WHAT, "startedAt")?,
        version: u64::try_from(version).map_err(|_| item::corrupt(it, WHAT, format!("version {version}")))?,
    })
}

fn stale(claim: &str, expected: u64) -> StateError {
    StateError::Stale {
        what: "disruption",
        key: claim.to_string(),
        expected,
    }
}

impl StateStore {
    /// Records a new disruption. Ok(None) when one is recorded for the claim
    /// already (another sweep got there first; it stands).
    pub async fn begin_disruption(&self, record: &DisruptionRecord) -> Result<Option<DisruptionRecord>, StateError> {
        let res = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(disruption_item(record, 1)))
            .condition_expression("attribute_not_exists(pk)")
            .send()
            .await;
        match res {
            Ok(_) => Ok(Some(DisruptionRecord {
                version: 1,
                ..record.clone()
            })),
            Err(e) if item::condition_failed(&e) => Ok(None),
            Err(e) => Err(self.dynamo("PutItem", e)),
        }
    }

    /// Every disruption in progress, by claim.
    pub async fn disruptions(&self) -> Result<Vec<DisruptionRecord>, StateError> {
        self.query_partition(PK_DISRUPTION, None)
            .await?
            .iter()
            .map(disruption_from_item)
            .collect()
    }

    /// Writes `record` if the table still has `record.version`; returns it at the next version.
    pub async fn update_disruption(&self, record: &DisruptionRecord) -> Result<DisruptionRecord, StateError> {
        let next = record.version + 1;
        if self
            .put_at_version(disruption_item(record, next), record.version)
            .await?
        {
            return Ok(DisruptionRecord {
                version: next,
                ..record.clone()
            });
        }
        Err(stale(&record.claim, record.version))
    }

    /// Forgets a disruption (finished or abandoned) if the table still has `version`.
    pub async fn end_disruption(&self, claim: &str, version: u64) -> Result<(), StateError> {
        if self.delete_at_version(PK_DISRUPTION, claim, version).await? {
            return Ok(());
        }
        Err(stale(claim, version))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disruption::Reason;

    #[test]
    fn round_trips() {
        let r = DisruptionRecord {
            claim: "default-abcde".into(),
            node: "ip-10-0-0-1".into(),
            reason: Reason::Expired,
            detail: "older than expireAfter 720h".into(),
            step: DisruptionStep::Launching,
            replacements: vec!["default-x".into(), "default-y".into()],
            grace_ms: Some(60_000),
            force_from_ms: Some(70_000),
            started_ms: 900_000,
            version: 3,
        };
        assert_eq!(disruption_from_item(&disruption_item(&r, 3)).unwrap(), r);
        let none = DisruptionRecord {
            grace_ms: None,
            force_from_ms: None,
            replacements: vec![],
            ..r.clone()
        };
        assert_eq!(disruption_from_item(&disruption_item(&none, 3)).unwrap(), none);
        for step in [
            DisruptionStep::Tainted,
            DisruptionStep::Launching,
            DisruptionStep::Draining,
            DisruptionStep::Terminating,
        ] {
            assert_eq!(DisruptionStep::parse(step.as_str()), Some(step));
        }
        let mut bad = disruption_item(&r, 1);
        bad.insert("step".into(), s("Sleeping"));
        assert!(disruption_from_item(&bad).unwrap_err().to_string().contains("Sleeping"));
    }
}
