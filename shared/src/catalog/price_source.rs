//! Where the catalog's on-demand prices came from, and which prices a
//! refresh uses ([`settle`]): the Price List API's answer for the region;
//! when it fails, the prices it gave last time for this region (Karpenter
//! keeps its last good prices too); with none, the bundled us-east-1 table,
//! stated as a fallback with the reason, which `nodesmith status` shows.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::Catalog;
use super::ec2::PriceTable;
use crate::labels;

/// Where on-demand prices came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Origin {
    /// The AWS Price List API, for the cluster's region.
    PriceListApi,
    /// The table bundled in the binary (us-east-1's prices).
    BundledTable,
}

/// The provenance of the stored catalog's on-demand prices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PriceSource {
    /// Where the prices in use came from.
    pub origin: Origin,
    /// The region the prices are for (the table's for the bundled table).
    pub region: String,
    /// When the prices in use were read from the Price List API (epoch ms);
    /// None for the bundled table.
    pub read_ms: Option<i64>,
    /// When the Price List API was last asked (epoch ms).
    pub checked_ms: i64,
    /// Why the last answer is not in use (the API's error, or no API client),
    /// None when it is.
    pub fallback: Option<String>,
}

impl PriceSource {
    /// True when the prices are the region's, read from the Price List API,
    /// and the last read succeeded.
    pub fn is_live_for(&self, region: &str) -> bool {
        self.origin == Origin::PriceListApi && self.region == region && self.fallback.is_none()
    }
}

/// The on-demand price per instance type a catalog carries (the lowest of
/// its on-demand offerings; pure).
pub fn on_demand_prices_of(catalog: &Catalog) -> HashMap<String, f64> {
    catalog
        .instance_types
        .iter()
        .filter_map(|t| {
            let p = t
                .offerings
                .iter()
                .filter(|o| o.capacity_type == labels::CAPACITY_ON_DEMAND)
                .map(|o| o.price)
                .reduce(f64::min)?;
            Some((t.name.clone(), p))
        })
        .collect()
}

/// The on-demand prices a refresh of `region` at `now_ms` uses, and their
/// provenance (pure). `read` is the Price List API's answer (Err: why there
/// is none); `previous` the stored provenance and the stored catalog's
/// prices.
pub fn settle(
    now_ms: i64,
    region: &str,
    read: Result<HashMap<String, f64>, String>,
    previous: Option<(&PriceSource, HashMap<String, f64>)>,
    bundled: &PriceTable,
) -> (HashMap<String, f64>, PriceSource) {
    match read {
        Ok(prices) => (
            prices,
            PriceSource {
                origin: Origin::PriceListApi,
                region: region.to_string(),
                read_ms: Some(now_ms),
                checked_ms: now_ms,
                fallback: None,
            },
        ),
        Err(why) => match previous {
            Some((p, prices)) if p.origin == Origin::PriceListApi && p.region == region && !prices.is_empty() => (
                prices,
                PriceSource {
                    checked_ms: now_ms,
                    fallback: Some(why),
                    ..p.clone()
                },
            ),
            _ => (
                bundled.prices.clone(),
                PriceSource {
                    origin: Origin::BundledTable,
                    region: bundled.region.clone(),
                    read_ms: None,
                    checked_ms: now_ms,
                    fallback: Some(why),
                },
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> PriceTable {
        PriceTable {
            region: "us-east-1".into(),
            prices: HashMap::from([("m5.large".to_string(), 0.096)]),
        }
    }

    #[test]
    fn the_api_answer_is_used_and_a_failure_keeps_the_last_answer_else_states_the_bundled_fallback() {
        let eu = HashMap::from([("m5.large".to_string(), 0.107)]);
        let (prices, live) = settle(1000, "eu-west-1", Ok(eu.clone()), None, &table());
        assert_eq!(prices, eu);
        assert!(live.is_live_for("eu-west-1") && !live.is_live_for("us-west-2"));
        assert_eq!(live.read_ms, Some(1000));

        // Failing after a good read: the last good prices stay, the failure is stated.
        let (prices, kept) = settle(
            5000,
            "eu-west-1",
            Err("throttled".into()),
            Some((&live, eu.clone())),
            &table(),
        );
        assert_eq!(prices, eu);
        assert_eq!(kept.origin, Origin::PriceListApi);
        assert_eq!((kept.read_ms, kept.checked_ms), (Some(1000), 5000));
        assert_eq!(kept.fallback.as_deref(), Some("throttled"));
        assert!(!kept.is_live_for("eu-west-1"));

        // Never read, or read for another region: the bundled table, stated.
        for previous in [None, Some((&live, eu.clone()))] {
            let (prices, fell_back) = settle(5000, "ap-south-1", Err("denied".into()), previous, &table());
            assert_eq!(prices, table().prices);
            assert_eq!(fell_back.origin, Origin::BundledTable);
            assert_eq!(fell_back.region, "us-east-1");
            assert_eq!(fell_back.read_ms, None);
            assert_eq!(fell_back.fallback.as_deref(), Some("denied"));
        }
    }
}
