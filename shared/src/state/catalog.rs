//! The catalog snapshot: the whole [`Catalog`] as JSON, split into parts
//! under a content-addressed generation, with a head item written last.

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use sha2::{Digest, Sha256};

use super::item::{self, get_i64, get_s, n, s};
use super::{PK_CATALOG, StateError, StateStore};
use crate::catalog::Catalog;

/// Bytes per part: under DynamoDB's 400 KB item limit with room for the key.
pub const PART_BYTES: usize = 350 * 1024;

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
        let mut head = item::key(PK_CATALOG, "HEAD");
        head.insert("generation".into(), s(&generation));
        head.insert("parts".into(), n(parts.len()));
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(head))
            .send()
            .await
            .map_err(|e| self.dynamo("PutItem", e))?;
        // The old generation's parts are garbage now; a reader that fetched the
        // old head a moment ago may still want them, so failures here are only logged.
        if let Some((old, count)) = previous.filter(|(g, _)| *g != generation) {
            for i in 0..count {
                if let Err(e) = self
                    .client
                    .delete_item()
                    .table_name(&self.table)
                    .set_key(Some(item::key(PK_CATALOG, &part_key(&old, i))))
                    .send()
                    .await
                {
                    tracing::warn!(generation = %old, part = i, error = %aws_smithy_types::error::display::DisplayErrorContext(&e), "cannot delete old catalog part");
                }
            }
        }
        Ok(generation)
    }

    async fn catalog_head(&self) -> Result<Option<(String, usize)>, StateError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(item::key(PK_CATALOG, "HEAD")))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.dynamo("GetItem", e))?;
        let Some(it) = out.item() else { return Ok(None) };
        Ok(Some((
            get_s(it, "catalog", "generation")?.to_string(),
            get_i64(it, "catalog", "parts")? as usize,
        )))
    }

    /// The stored catalog, if any. The parts are read only when the head
    /// names a generation this store has not read yet.
    pub async fn get_catalog(&self) -> Result<Option<Catalog>, StateError> {
        let Some((generation, count)) = self.catalog_head().await? else {
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
}
