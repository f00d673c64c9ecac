//! Where the stored catalog's on-demand prices came from: one item beside
//! the catalog, written after the catalog it describes.

use super::item::{self, get_s, s};
use super::{PK_CATALOG, StateError, StateStore};
use crate::catalog::price_source::PriceSource;

/// The sort key of the item.
const SK_PRICES: &str = "PRICES";

impl StateStore {
    /// Records where the stored catalog's on-demand prices came from.
    pub async fn put_price_source(&self, source: &PriceSource) -> Result<(), StateError> {
        let doc = serde_json::to_string(source).map_err(|e| StateError::Corrupt {
            what: "price source",
            key: SK_PRICES.into(),
            reason: format!("cannot serialise: {e}"),
        })?;
        let mut it = item::key(PK_CATALOG, SK_PRICES);
        it.insert("doc".into(), s(doc));
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(it))
            .send()
            .await
            .map_err(|e| self.dynamo("PutItem", e))?;
        Ok(())
    }

    /// Where the stored catalog's on-demand prices came from, if recorded.
    pub async fn price_source(&self) -> Result<Option<PriceSource>, StateError> {
        let out = self.read_item(PK_CATALOG, SK_PRICES).await?;
        let Some(it) = out.as_ref() else { return Ok(None) };
        let doc = get_s(it, "price source", "doc")?;
        serde_json::from_str(doc)
            .map(Some)
            .map_err(|e| item::corrupt(it, "price source", format!("not a price source: {e}")))
    }
}
