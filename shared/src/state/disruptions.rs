//! Disruptions in progress: one record per disrupted NodeClaim, holding the
//! step the sweep reached, so a sweep killed at any point is resumed by the
//! next one. Every write is conditional (created once, then version-checked).
//! The disruption reason lives here, below the pure core that decides it
//! (`disruption` re-exports it), so the table's records name it typed.

use std::fmt;

use aws_sdk_dynamodb::types::AttributeValue;

use crate::apis::nodepool::DisruptionReason;

use super::item::{self, Item, get_i64, get_s, n, s};
use super::{PK_DISRUPTION, StateError, StateStore};

/// Why nodes are disrupted (Karpenter's reasons), in priority order; stored
/// and printed by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub enum Reason {
    /// A failed health condition or EC2 status check past its toleration (node repair).
    Unhealthy,
    /// Older than the pool's `expireAfter`.
    Expired,
    /// No longer what its pool and class would launch.
    Drifted,
    /// Only DaemonSet, mirror and finished pods run on it.
    Empty,
    /// Its pods fit on the other nodes, or on them plus one cheaper new node.
    Underutilized,
}

impl Reason {
    /// The reason as budgets name it; `None` for repair and expiry, which budgets do not hold.
    pub fn budget_reason(self) -> Option<DisruptionReason> {
        match self {
            Reason::Unhealthy | Reason::Expired => None,
            Reason::Drifted => Some(DisruptionReason::Drifted),
            Reason::Empty => Some(DisruptionReason::Empty),
            Reason::Underutilized => Some(DisruptionReason::Underutilized),
        }
    }

    /// The name in the simulate contract.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Unhealthy => "Unhealthy",
            Reason::Expired => "Expired",
            Reason::Drifted => "Drifted",
            Reason::Empty => "Empty",
            Reason::Underutilized => "Underutilized",
        }
    }

    /// Happens whatever budgets and do-not-disrupt say (repair, expiry).
    pub fn forceful(self) -> bool {
        matches!(self, Reason::Unhealthy | Reason::Expired)
    }
}

/// A name that is no disruption reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown disruption reason {0:?}")]
pub struct UnknownReason(pub String);

impl std::str::FromStr for Reason {
    type Err = UnknownReason;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            Reason::Unhealthy,
            Reason::Expired,
            Reason::Drifted,
            Reason::Empty,
            Reason::Underutilized,
        ]
        .into_iter()
        .find(|r| r.as_str() == s)
        .ok_or_else(|| UnknownReason(s.to_string()))
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a disruption stands; each step is entered once its predecessor is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum DisruptionStep {
    /// Recorded; the node is (being) tainted `karpenter.sh/disrupted:NoSchedule`.
    Tainted,
    /// Replacements are launched; waiting until every one is Initialized.
    Launching,
    /// A drain record exists for the node (the drain module empties it).
    Draining,
    /// Drained: instance terminated, Node deleted, claim removed.
    Terminating,
}

impl DisruptionStep {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            DisruptionStep::Tainted => "Tainted",
            DisruptionStep::Launching => "Launching",
            DisruptionStep::Draining => "Draining",
            DisruptionStep::Terminating => "Terminating",
        }
    }

    /// From the stored name.
    pub fn parse(v: &str) -> Option<Self> {
        Some(match v {
            "Tainted" => DisruptionStep::Tainted,
            "Launching" => DisruptionStep::Launching,
            "Draining" => DisruptionStep::Draining,
            "Terminating" => DisruptionStep::Terminating,
            _ => return None,
        })
    }
}

/// One disruption in progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DisruptionRecord {
    /// The disrupted NodeClaim (the sort key).
    pub claim: String,
    /// Its Node.
    pub node: String,
    /// Why (stored as its name: `Unhealthy`, `Expired`, `Drifted`, `Empty`, `Underutilized`).
    pub reason: Reason,
    /// A sentence for events and logs (e.g. which hash changed).
    pub detail: String,
    /// The step reached.
    pub step: DisruptionStep,
    /// NodeClaims that must be Initialized before the drain begins.
    pub replacements: Vec<String>,
    /// The node's `terminationGracePeriod` (ms), whatever the reason: PDBs and
    /// do-not-disrupt hold pods only this long into the drain.
    pub grace_ms: Option<i64>,
    /// From when the drain is forced (epoch ms), once it began; None: never.
    pub force_from_ms: Option<i64>,
    /// When the disruption began (epoch ms).
    pub started_ms: i64,
    /// Optimistic-locking version (1 once created).
    pub version: u64,
}

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
        let mut bad = disruption_item(&r, 1);
        bad.insert("reason".into(), s("Bored"));
        assert!(disruption_from_item(&bad).unwrap_err().to_string().contains("Bored"));
    }

    #[test]
    fn reasons_are_stored_and_serialized_by_name() {
        for (reason, name) in [
            (Reason::Unhealthy, "Unhealthy"),
            (Reason::Expired, "Expired"),
            (Reason::Drifted, "Drifted"),
            (Reason::Empty, "Empty"),
            (Reason::Underutilized, "Underutilized"),
        ] {
            let r = DisruptionRecord {
                claim: "c".into(),
                node: "n".into(),
                reason,
                detail: String::new(),
                step: DisruptionStep::Tainted,
                replacements: vec![],
                grace_ms: None,
                force_from_ms: None,
                started_ms: 0,
                version: 1,
            };
            assert_eq!(disruption_item(&r, 1)["reason"], s(name));
            assert_eq!(disruption_from_item(&disruption_item(&r, 1)).unwrap().reason, reason);
            assert_eq!(serde_json::to_value(reason).unwrap(), serde_json::json!(name));
            assert_eq!(
                serde_json::from_value::<Reason>(serde_json::json!(name)).unwrap(),
                reason
            );
        }
    }
}
