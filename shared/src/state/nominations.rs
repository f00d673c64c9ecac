//! Nominations: an existing node or in-flight claim the last provisioning
//! solve gave pending pods, kept for a short window so the sweep's
//! consolidation leaves it alone while the pods bind (Karpenter keeps the
//! same thing in memory, `StateNode.nominatedUntil`). One small item per
//! nominated node or claim; a later nomination only ever extends it.

use futures::StreamExt;

use super::item::{self, Item, get_i64, get_s, n, s};
use super::{PK_NOMINATION, StateError, StateStore};
use crate::scheduling::TargetKind;

/// How long an item outlives its window before DynamoDB may drop it (s).
const KEEP_AFTER_WINDOW_SECS: i64 = 3600;
/// Writes in flight at once (one per nominated node or claim).
const WRITE_CONCURRENCY: usize = 16;

/// One nominated node or in-flight claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NominationRecord {
    /// The node's or the claim's name.
    pub target: String,
    /// Which of the two `target` names.
    pub kind: TargetKind,
    /// One of its pods (`namespace/name`), to name in messages.
    pub pod: String,
    /// How many pending pods the solve put there.
    pub pods: usize,
    /// Until when it holds (epoch ms).
    pub until_ms: i64,
}

fn kind_str(k: TargetKind) -> &'static str {
    match k {
        TargetKind::Node => "Node",
        TargetKind::NodeClaim => "NodeClaim",
    }
}

/// The sort key: a node and a claim may share a name.
fn sort_key(r: &NominationRecord) -> String {
    format!("{}#{}", kind_str(r.kind), r.target)
}

/// The DynamoDB item for a nomination (pure).
pub fn nomination_item(r: &NominationRecord) -> Item {
    let mut it = item::key(PK_NOMINATION, &sort_key(r));
    it.insert("target".into(), s(&r.target));
    it.insert("kind".into(), s(kind_str(r.kind)));
    it.insert("pod".into(), s(&r.pod));
    it.insert("pods".into(), n(r.pods));
    it.insert("until".into(), n(r.until_ms));
    it.insert("expiresAt".into(), n(r.until_ms / 1000 + KEEP_AFTER_WINDOW_SECS));
    it
}

/// Reads a nomination item (pure).
pub fn nomination_from_item(it: &Item) -> Result<NominationRecord, StateError> {
    const WHAT: &str = "nomination";
    let kind = match get_s(it, WHAT, "kind")? {
        "Node" => TargetKind::Node,
        "NodeClaim" => TargetKind::NodeClaim,
        other => return Err(item::corrupt(it, WHAT, format!("unknown kind {other:?}"))),
    };
    let pods = get_i64(it, WHAT, "pods")?;
    Ok(NominationRecord {
        target: get_s(it, WHAT, "target")?.to_string(),
        kind,
        pod: get_s(it, WHAT, "pod")?.to_string(),
        pods: usize::try_from(pods).map_err(|_| item::corrupt(it, WHAT, format!("pods={pods} is negative")))?,
        until_ms: get_i64(it, WHAT, "until")?,
    })
}

impl StateStore {
    /// Records nominations; each one only extends what is recorded (an older
    /// or equal window is a no-op), so a redelivered batch changes nothing.
    pub async fn nominate(&self, records: &[NominationRecord]) -> Result<(), StateError> {
        let results: Vec<Result<(), StateError>> = futures::stream::iter(records)
            .map(|r| async move {
                let res = self
                    .client
                    .put_item()
                    .table_name(&self.table)
                    .set_item(Some(nomination_item(r)))
                    .condition_expression("attribute_not_exists(pk) OR #until < :until")
                    .expression_attribute_names("#until", "until")
                    .expression_attribute_values(":until", n(r.until_ms))
                    .send()
                    .await;
                match res {
                    Ok(_) => Ok(()),
                    Err(e) if item::condition_failed(&e) => Ok(()),
                    Err(e) => Err(self.dynamo("PutItem", e)),
                }
            })
            .buffer_unordered(WRITE_CONCURRENCY)
            .collect()
            .await;
        results.into_iter().collect()
    }

    /// The nominations whose window has not passed at `now_ms` (epoch ms).
    pub async fn live_nominations(&self, now_ms: i64) -> Result<Vec<NominationRecord>, StateError> {
        let mut out = Vec::new();
        for it in self.query_partition(PK_NOMINATION, None).await? {
            let r = nomination_from_item(&it)?;
            if r.until_ms > now_ms {
                out.push(r);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_expires_an_hour_after_its_window() {
        let r = NominationRecord {
            target: "default-abcde".into(),
            kind: TargetKind::NodeClaim,
            pod: "default/web-0".into(),
            pods: 3,
            until_ms: 1_000_000,
        };
        let it = nomination_item(&r);
        assert_eq!(get_s(&it, "nomination", "sk").unwrap(), "NodeClaim#default-abcde");
        assert_eq!(nomination_from_item(&it).unwrap(), r);
        assert_eq!(get_i64(&it, "nomination", "expiresAt").unwrap(), 1000 + 3600);
        let mut bad = it.clone();
        bad.insert("kind".into(), s("Pod"));
        assert!(
            nomination_from_item(&bad)
                .unwrap_err()
                .to_string()
                .contains("unknown kind")
        );
    }
}
