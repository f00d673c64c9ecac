//! Keeping the stored catalog live: the sweep rebuilds it from EC2
//! (DescribeInstanceTypes, DescribeInstanceTypeOfferings, DescribeSpotPriceHistory)
//! and the region's on-demand prices from the AWS Price List API every
//! [`TYPES_EVERY`], and refreshes spot prices every [`PRICES_EVERY`]
//! (Karpenter's cadence), into the state table. When the Price List API
//! gives nothing, the last prices it gave for the region stay, else the
//! bundled us-east-1 table stands in; either is recorded as a fallback
//! (`nodesmith status` shows it) and retried every [`PRICES_EVERY`].
//! `provision` solves with the stored catalog of its region; the built-in
//! us-east-1 snapshot stands in only while nothing is stored and the region
//! is us-east-1; elsewhere the catalog is built first ([`ensure_for_solving`]).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::catalog::ec2::{self, PriceTable};
use crate::catalog::price_list::PriceList;
use crate::catalog::price_source::{self, PriceSource};
use crate::catalog::{Catalog, CatalogError};
use crate::state::{StateError, StateStore};

/// Instance types and offerings are rebuilt this often.
pub const TYPES_EVERY: Duration = Duration::from_secs(12 * 3600);
/// Spot prices are refreshed this often.
pub const PRICES_EVERY: Duration = Duration::from_secs(3600);
/// Marker: when types and offerings were last built (epoch ms).
pub const TYPES_MARKER: &str = "catalog-types";
/// Marker: when spot prices were last refreshed (epoch ms).
pub const PRICES_MARKER: &str = "catalog-prices";
/// The region the built-in snapshot describes.
pub const BUILTIN_REGION: &str = "us-east-1";

/// Why the catalog could not be refreshed.
#[derive(Debug, thiserror::Error)]
pub enum RefreshError {
    /// EC2 or the price source failed, or the result is not a catalog.
    #[error("building the catalog")]
    Catalog(#[from] CatalogError),
    /// The state table failed.
    #[error("storing the catalog")]
    State(#[from] StateError),
    /// The region is unknown (the SDK has none configured).
    #[error("the EC2 client has no region")]
    NoRegion,
}

/// What a refresh has to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// The stored catalog is fresh.
    Nothing,
    /// Spot prices are older than [`PRICES_EVERY`].
    SpotPrices,
    /// Nothing stored, another region's, or types older than [`TYPES_EVERY`].
    Everything,
}

/// What is due at `now_ms`, from the stored catalog's region and the
/// markers (pure). With `retry_on_demand` (the stored on-demand prices are a
/// fallback, or not known to be the region's), the rebuild that reads them
/// is due every [`PRICES_EVERY`] instead of every [`TYPES_EVERY`].
pub fn due(
    now_ms: i64,
    region: &str,
    stored: Option<&str>,
    types_at: Option<i64>,
    prices_at: Option<i64>,
    retry_on_demand: bool,
) -> Due {
    let older = |at: Option<i64>, every: Duration| at.is_none_or(|t| now_ms - t >= every.as_millis() as i64);
    let types_every = if retry_on_demand { PRICES_EVERY } else { TYPES_EVERY };
    if stored != Some(region) || older(types_at, types_every) {
        Due::Everything
    } else if older(prices_at, PRICES_EVERY) {
        Due::SpotPrices
    } else {
        Due::Nothing
    }
}

/// The catalog with its spot offerings repriced where `spot` has a price for
/// (type, zone); other offerings stay as they are (pure).
pub fn with_spot_prices(catalog: &Catalog, spot: &BTreeMap<(String, String), f64>) -> Catalog {
    let mut c = catalog.clone();
    for t in &mut c.instance_types {
        for o in t.offerings.iter_mut().filter(|o| o.capacity_type == "spot") {
            if let Some(p) = spot.get(&(t.name.clone(), o.zone.clone())) {
                o.price = *p;
            }
        }
    }
    c
}

/// The region an EC2 client calls.
pub fn region_of(client: &aws_sdk_ec2::Client) -> Result<String, RefreshError> {
    client
        .config()
        .region()
        .map(|r| r.to_string())
        .ok_or(RefreshError::NoRegion)
}

/// Where a refresh reads on-demand prices.
#[derive(Debug, Clone)]
pub struct OnDemandSources {
    /// The AWS Price List API; None where no client is configured (the
    /// bundled table is then used, stated as a fallback).
    pub price_list: Option<PriceList>,
    /// The bundled us-east-1 table: the fallback.
    pub bundled: PriceTable,
}

impl OnDemandSources {
    /// The Price List API (when given) with the bundled table as the fallback.
    pub fn new(price_list: Option<PriceList>) -> Result<OnDemandSources, CatalogError> {
        Ok(OnDemandSources {
            price_list,
            bundled: PriceTable::bundled()?,
        })
    }

    /// The bundled table alone.
    pub fn bundled_only() -> Result<OnDemandSources, CatalogError> {
        OnDemandSources::new(None)
    }

    /// The Price List API's prices for `region`, or why there are none.
    async fn read(&self, region: &str) -> Result<HashMap<String, f64>, String> {
        match &self.price_list {
            None => Err("no Price List API client is configured".to_string()),
            Some(p) => p
                .on_demand_prices(region)
                .await
                .map_err(|e| crate::telemetry::causes(&e).to_string()),
        }
    }
}

/// Refreshes what is due at `now_ms` and stores it; returns what was done.
pub async fn refresh(
    client: &aws_sdk_ec2::Client,
    store: &StateStore,
    sources: &OnDemandSources,
    now_ms: i64,
) -> Result<Due, RefreshError> {
    let region = region_of(client)?;
    let types_at = store.marked_at(TYPES_MARKER).await?;
    let prices_at = store.marked_at(PRICES_MARKER).await?;
    let source = store.price_source().await?;
    let retry = sources.price_list.is_some() && !source.as_ref().is_some_and(|s| s.is_live_for(&region));
    // Markers are written only after a catalog of this deployment's region was stored:
    // when both are fresh, the (large) catalog is not read at all.
    if due(now_ms, &region, Some(&region), types_at, prices_at, retry) == Due::Nothing {
        return Ok(Due::Nothing);
    }
    let stored = store.get_catalog().await?;
    let what = due(
        now_ms,
        &region,
        stored.as_ref().map(|c| c.region.as_str()),
        types_at,
        prices_at,
        retry,
    );
    match (what, stored) {
        (Due::Nothing, _) => {}
        (Due::SpotPrices, Some(c)) => {
            let spot = ec2::describe_spot_prices(client).await?;
            store.put_catalog(&with_spot_prices(&c, &spot)).await?;
            store.mark(PRICES_MARKER, now_ms).await?;
            tracing::info!(region = %region, prices = spot.len(), "refreshed spot prices");
        }
        (_, stored) => {
            let read = sources.read(&region).await;
            let previous = source
                .as_ref()
                .zip(stored.filter(|c| c.region == region))
                .map(|(s, c)| (s, price_source::on_demand_prices_of(&c)));
            let (prices, provenance) = price_source::settle(now_ms, &region, read, previous, &sources.bundled);
            log_price_source(&region, &provenance, prices.len());
            let table = PriceTable {
                region: provenance.region.clone(),
                prices,
            };
            let c = ec2::catalog(client, &region, &table).await?;
            store.put_catalog(&c).await?;
            store.put_price_source(&provenance).await?;
            store.mark(TYPES_MARKER, now_ms).await?;
            store.mark(PRICES_MARKER, now_ms).await?;
            tracing::info!(region = %region, instance_types = c.instance_types.len(), "rebuilt the instance catalog from EC2");
            return Ok(Due::Everything);
        }
    }
    Ok(what)
}

/// Says where on-demand prices came from: a fallback as a warning with its reason.
fn log_price_source(region: &str, source: &PriceSource, types: usize) {
    match &source.fallback {
        None => tracing::info!(region, types, "read on-demand prices from the AWS Price List API"),
        Some(why) => tracing::warn!(
            region,
            using = ?source.origin,
            prices_of = %source.region,
            types,
            reason = %why,
            "the AWS Price List API gave no on-demand prices; falling back"
        ),
    }
}

/// Before a solve: nothing to do when a catalog of this region is stored, or
/// none is and the region is the built-in snapshot's (which stands in);
/// otherwise the catalog is built and stored first.
pub async fn ensure_for_solving(
    client: &aws_sdk_ec2::Client,
    store: &StateStore,
    sources: &OnDemandSources,
) -> Result<(), RefreshError> {
    let region = region_of(client)?;
    let stored = store.get_catalog().await?;
    match stored {
        Some(c) if c.region == region => Ok(()),
        None if region == BUILTIN_REGION => Ok(()),
        _ => {
            tracing::info!(region = %region, "no stored catalog for this region; building it before solving");
            refresh(client, store, sources, crate::state::now_ms())
                .await
                .map(|_| ())
        }
    }
}

/// The sweep's step: refreshes what is due, on-demand prices from the Price
/// List API (`price_list`) with the bundled table as the fallback. A failure
/// is logged and left to the next run.
pub async fn sweep(client: &aws_sdk_ec2::Client, store: &StateStore, price_list: Option<&PriceList>) {
    let sources = match OnDemandSources::new(price_list.cloned()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %crate::telemetry::causes(&e), "no bundled price table; the catalog is not refreshed");
            return;
        }
    };
    if let Err(e) = refresh(client, store, &sources, crate::state::now_ms()).await {
        tracing::warn!(error = %crate::telemetry::causes(&e), "cannot refresh the instance catalog; the next sweep tries again");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{InstanceTypeInfo, Offering};
    use crate::resources::Resources;

    const H: i64 = 3600 * 1000;

    #[test]
    fn types_every_twelve_hours_prices_every_hour_and_a_new_region_at_once() {
        let now = 100 * H;
        let r = "eu-west-1";
        assert_eq!(due(now, r, None, None, None, false), Due::Everything);
        assert_eq!(
            due(now, r, Some("us-east-1"), Some(now), Some(now), false),
            Due::Everything,
            "another region's catalog"
        );
        assert_eq!(
            due(now, r, Some(r), Some(now - H), Some(now - H / 2), false),
            Due::Nothing
        );
        assert_eq!(
            due(now, r, Some(r), Some(now - 2 * H), Some(now - H), false),
            Due::SpotPrices
        );
        assert_eq!(
            due(now, r, Some(r), Some(now - 12 * H), Some(now), false),
            Due::Everything
        );
        assert_eq!(due(now, r, Some(r), None, Some(now), false), Due::Everything);
    }

    #[test]
    fn fallback_on_demand_prices_are_retried_hourly_not_twice_a_day() {
        let now = 100 * H;
        let r = "eu-west-1";
        assert_eq!(
            due(now, r, Some(r), Some(now - 2 * H), Some(now - H), false),
            Due::SpotPrices
        );
        assert_eq!(
            due(now, r, Some(r), Some(now - H), Some(now - H), true),
            Due::Everything
        );
        assert_eq!(
            due(now, r, Some(r), Some(now - H / 2), Some(now - H / 2), true),
            Due::Nothing
        );
    }

    #[test]
    fn spot_prices_replace_only_spot_offerings_they_name() {
        let o = |zone: &str, ct: &str, price: f64| Offering {
            zone: zone.into(),
            capacity_type: ct.into(),
            price,
            available: true,
            reservation: None,
        };
        let c = Catalog {
            region: "eu-west-1".into(),
            instance_types: vec![InstanceTypeInfo {
                name: "m5.large".into(),
                labels: Default::default(),
                capacity: Resources::new(),
                allocatable: None,
                vcpus: 2,
                eni_max_pods: 29,
                offerings: vec![
                    o("eu-west-1a", "spot", 0.05),
                    o("eu-west-1b", "spot", 0.05),
                    o("eu-west-1a", "on-demand", 0.107),
                ],
            }],
        };
        let spot = BTreeMap::from([
            (("m5.large".to_string(), "eu-west-1a".to_string()), 0.031),
            (("c5.large".to_string(), "eu-west-1a".to_string()), 0.02),
        ]);
        let got = with_spot_prices(&c, &spot);
        let prices: Vec<f64> = got.instance_types[0].offerings.iter().map(|o| o.price).collect();
        assert_eq!(prices, vec![0.031, 0.05, 0.107]);
    }
}
