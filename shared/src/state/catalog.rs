//! The catalog snapshot: the whole [`Catalog`] as JSON, split into parts
//! under a content-addressed generation, with a head item written last.
//!
//! A reader reads the head, then the parts it names: a generation the head
//! no longer names may still be being read, so it is kept, listed in the
//! head as retired, for [`RETIRED_GRACE_MS`], and deleted by the first write
//! after that ([`retire`]).

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use sha2::{Digest, Sha256};

use super::item::{self, get_i64, get_s, n, s};
use super::{PK_CATALOG, StateError, StateStore};
use crate::catalog::Catalog;

/// Bytes per part: under DynamoDB's 400 KB item limit with room for the key.
pub const PART_BYTES: usize = 350 * 1024;

/// How long a generation outlives the head that stops naming it: longer than
/// any reader runs (a Lambda invocation lasts at most 15 minutes).
pub const RETIRED_GRACE_MS: i64 = 20 * 60 * 1000;

/// A generation the head no longer names, kept for readers of the old head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retired {
    /// The generation (sha256 of its JSON).
    pub generation: String,
    /// How many parts it has.
    pub parts: usize,
    /// When the head stopped naming it (epoch ms).
    pub at_ms: i64,
}

/// The head's retired list after `current` is stored at `now_ms` over a head
/// that named `replaced`: what stays listed, and what to delete now (pure).
/// A generation stored again is live, never deleted.
pub fn retire(
    listed: Vec<Retired>,
    replaced: Option<Retired>,
    current: &str,
    now_ms: i64,
    grace_ms: i64,
) -> (Vec<Retired>, Vec<Retired>) {
    let mut keep: Vec<Retired> = Vec::new();
    let mut delete = Vec::new();
    for r in listed.into_iter().chain(replaced) {
        if r.generation == current
            || keep
                .iter()
                .chain(&delete)
                .any(|k: &Retired| k.generation == r.generation)
        {
            continue;
        }
        if now_ms - r.at_ms >= grace_ms {
            delete.push(r);
        } else {
            keep.push(r);
        }
    }
    (keep, delete)
}

/// What the head item says.
struct Head {
    generation: String,
    parts: usize,
    retired: Vec<Retired>,
}

/// The sort key of one part.
fn part_key(generation: &str, index: usize) -> String {
    format!("PART#{generation}#{index:04}")
}

/// Splits the serialised catalog into parts and names its generation (pure).
pub fn split(json: &[u8]) -> (String, Vec<&[u8]>) {
    let generation = hex::encode(Sha256::digest(json));
    (generation, json.chunks(PART_BYTES).collect())
}

/// Joins parts (in sort-key order) and checks them against the generation (pure).
pub fn join(generation: &str, parts: &[Vec<u8>]) -> Result<Vec<u8>, StateError> {
    let json = parts.concat();
    let got = hex::encode(Sha256::digest(&json));
    if got != generation {
        return Err(StateError::Corrupt {
            what: "catalog",
            key: generation.to_string(),
            reason: format!("{} parts hash to {got}", parts.len()),
        });
    }
    Ok(json)
}

impl StateStore {
    /// Stores the catalog; returns its generation (sha256 of its JSON).
    pub async fn put_catalog(&self, catalog: &Catalog) -> Result<String, StateError> {
        self.put_catalog_at(catalog, super::now_ms()).await
    }

    /// [`StateStore::put_catalog`] at `now_ms`: the generation it replaces is
    /// kept for [`RETIRED_GRACE_MS`] from now, older retired ones are deleted.
    pub async fn put_catalog_at(&self, catalog: &Catalog, now_ms: i64) -> Result<String, StateError> {
        let json = serde_json::to_vec(catalog).map_err(|e| StateError::Corrupt {
            what: "catalog",
            key: "HEAD".into(),
            reason: format!("cannot serialise: {e}"),
        })?;
        let (generation, parts) = split(&json);
        let previous = self.catalog_head().await?;
        for (i, p) in parts.iter().enumerate() {
            let mut it = item::key(PK_CATALOG, &part_key(&generation, i));
            it.insert("data".into(), AttributeValue::B(Blob::new(p.to_vec())));
            self.client
                .put_item()
                .table_name(&self.table)
                .set_item(Some(it))
                .send()
                .await
                .map_err(|e| self.dynamo("PutItem", e))?;
        }
        let (listed, replaced) = match previous {
            Some(h) => (
                h.retired,
                Some(Retired {
                    generation: h.generation,
                    parts: h.parts,
                    at_ms: now_ms,
                }),
            ),
            None => (Vec::new(), None),
        };
        let (keep, delete) = retire(listed, replaced, &generation, now_ms, RETIRED_GRACE_MS);
        let mut head = item::key(PK_CATALOG, "HEAD");
        head.insert("generation".into(), s(&generation));
        head.insert("parts".into(), n(parts.len()));
        head.insert(
            "retired".into(),
            AttributeValue::L(
                keep.iter()
                    .map(|r| {
                        AttributeValue::M(
                            [
                                ("generation".to_string(), s(&r.generation)),
                                ("parts".to_string(), n(r.parts)),
                                ("at".to_string(), n(r.at_ms)),
                            ]
                            .into(),
                        )
                    })
                    .collect(),
            ),
        );
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(head))
            .send()
            .await
            .map_err(|e| self.dynamo("PutItem", e))?;
        // The writer keeps what a reader of this generation would get, so its
        // next read is the head alone (the parts are megabytes).
        if let Ok(stored) = serde_json::from_slice::<Catalog>(&json) {
            *self.catalog.lock().unwrap_or_else(|e| e.into_inner()) = Some((generation.clone(), stored));
        }
        // Retired past the grace: no reader can still want them. A failure leaves
        // parts no head lists (harmless garbage), so it is only logged.
        for old in delete {
            for i in 0..old.parts {
                if let Err(e) = self
                    .client
                    .delete_item()
                    .table_name(&self.table)
                    .set_key(Some(item::key(PK_CATALOG, &part_key(&old.generation, i))))
                    .send()
                    .await
                {
                    tracing::warn!(generation = %old.generation, part = i, error = %aws_smithy_types::error::display::DisplayErrorContext(&e), "cannot delete old catalog part");
                }
            }
        }
        Ok(generation)
    }

    async fn catalog_head(&self) -> Result<Option<Head>, StateError> {
        let out = self.read_item(PK_CATALOG, "HEAD").await?;
        let Some(it) = out.as_ref() else { return Ok(None) };
        let mut retired = Vec::new();
        if let Some(AttributeValue::L(list)) = it.get("retired") {
            for r in list {
                let AttributeValue::M(m) = r else {
                    return Err(item::corrupt(it, "catalog", "a retired generation is not a map".into()));
                };
                retired.push(Retired {
                    generation: get_s(m, "catalog", "generation")?.to_string(),
                    parts: get_i64(m, "catalog", "parts")? as usize,
                    at_ms: get_i64(m, "catalog", "at")?,
                });
            }
        }
        Ok(Some(Head {
            generation: get_s(it, "catalog", "generation")?.to_string(),
            parts: get_i64(it, "catalog", "parts")? as usize,
            retired,
        }))
    }

    /// The stored catalog, if any. The parts are read only when the head
    /// names a generation this store has not read yet.
    pub async fn get_catalog(&self) -> Result<Option<Catalog>, StateError> {
        let Some(Head {
            generation,
            parts: count,
            ..
        }) = self.catalog_head().await?
        else {
            return Ok(None);
        };
        if let Some((g, c)) = self.catalog.lock().unwrap_or_else(|e| e.into_inner()).as_ref()
            && *g == generation
        {
            return Ok(Some(c.clone()));
        }
        let mut parts: Vec<(String, Vec<u8>)> = Vec::with_capacity(count);
        for it in &self
            .query_partition(PK_CATALOG, Some(&format!("PART#{generation}#")))
            .await?
        {
            let sk = get_s(it, "catalog", "sk")?.to_string();
            match it.get("data") {
                Some(AttributeValue::B(b)) => parts.push((sk, b.clone().into_inner())),
                _ => return Err(item::corrupt(it, "catalog", "part has no binary data".into())),
            }
        }
        if parts.len() != count {
            return Err(StateError::Corrupt {
                what: "catalog",
                key: generation,
                reason: format!("head says {count} parts, found {}", parts.len()),
            });
        }
        parts.sort_by(|a, b| a.0.cmp(&b.0));
        let bytes: Vec<Vec<u8>> = parts.into_iter().map(|(_, b)| b).collect();
        let json = join(&generation, &bytes)?;
        let catalog: Catalog = serde_json::from_slice(&json).map_err(|e| StateError::Corrupt {
            what: "catalog",
            key: generation.clone(),
            reason: format!("not a Catalog: {e}"),
        })?;
        *self.catalog.lock().unwrap_or_else(|e| e.into_inner()) = Some((generation, catalog.clone()));
        Ok(Some(catalog))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_and_join_round_trip_and_detect_damage() {
        let json = vec![b'x'; PART_BYTES * 2 + 10];
        let (g, parts) = split(&json);
        assert_eq!(parts.len(), 3);
        let owned: Vec<Vec<u8>> = parts.iter().map(|p| p.to_vec()).collect();
        assert_eq!(join(&g, &owned).unwrap(), json);
        let mut damaged = owned.clone();
        damaged.pop();
        assert!(join(&g, &damaged).unwrap_err().to_string().contains("2 parts hash to"));
        assert!(part_key(&g, 3).ends_with("#0003"));
    }

    #[test]
    fn a_replaced_generation_is_kept_for_the_grace_then_deleted() {
        let r = |g: &str, at_ms: i64| Retired {
            generation: g.into(),
            parts: 2,
            at_ms,
        };
        let grace = 1000;
        // g1 replaced by g2 now: kept.
        assert_eq!(
            retire(vec![], Some(r("g1", 5000)), "g2", 5000, grace),
            (vec![r("g1", 5000)], vec![])
        );
        // g2 replaced by g3 within the grace of g1's retirement: both kept.
        assert_eq!(
            retire(vec![r("g1", 5000)], Some(r("g2", 5500)), "g3", 5500, grace),
            (vec![r("g1", 5000), r("g2", 5500)], vec![])
        );
        // Past g1's grace: g1 goes, g2 stays.
        assert_eq!(
            retire(
                vec![r("g1", 5000), r("g2", 5500)],
                Some(r("g3", 6000)),
                "g4",
                6000,
                grace
            ),
            (vec![r("g2", 5500), r("g3", 6000)], vec![r("g1", 5000)])
        );
        // The same content stored again: its generation is live, never deleted.
        assert_eq!(
            retire(vec![r("g1", 0)], Some(r("g1", 9000)), "g1", 9000, grace),
            (vec![], vec![])
        );
    }
}
