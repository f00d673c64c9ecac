//! Keeping the stored catalog live: the sweep rebuilds it from EC2
//! (DescribeInstanceTypes, DescribeInstanceTypeOfferings, DescribeSpotPriceHistory)
//! every [`TYPES_EVERY`] and refreshes spot prices every [`PRICES_EVERY`]
//! (Karpenter's cadence), into the state table. `provision` solves with the
//! stored catalog of its region; the built-in us-east-1 snapshot stands in
//! only while nothing is stored and the region is us-east-1; elsewhere the
//! catalog is built first ([`ensure_for_solving`]).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::catalog::ec2::{self, Pricing};
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

/// What is due at `now_ms`, from the stored catalog's region and the markers (pure).
pub fn due(now_ms: i64, region: &str, stored: Option<&str>, types_at: Option<i64>, prices_at: Option<i64>) -> Due {
    let older = |at: Option<i64>, every: Duration| at.is_none_or(|t| now_ms - t >= every.as_millis() as i64);
    if stored != Some(region) || older(types_at, TYPES_EVERY) {
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

/// Refreshes what is due at `now_ms` and stores it; returns what was done.
pub async fn refresh(
    client: &aws_sdk_ec2::Client,
    store: &StateStore,
    pricing: &impl Pricing,
    now_ms: i64,
) -> Result<Due, RefreshError> {
    let region = region_of(client)?;
    let types_at = store.marked_at(TYPES_MARKER).await?;
    let prices_at = store.marked_at(PRICES_MARKER).await?;
    // Markers are written only after a catalog of this deployment's region was stored:
    // when both are fresh, the (large) catalog is not read at all.
    if due(now_ms, &region, Some(&region), types_at, prices_at) == Due::Nothing {
        return Ok(Due::Nothing);
    }
    let stored = store.get_catalog().await?;
    let what = due(
        now_ms,
        &region,
        stored.as_ref().map(|c| c.region.as_str()),
        types_at,
        prices_at,
    );
    match (what, stored) {
        (Due::Nothing, _) => {}
        (Due::SpotPrices, Some(c)) => {
            let spot = ec2::describe_spot_prices(client).await?;
            store.put_catalog(&with_spot_prices(&c, &spot)).await?;
            store.mark(PRICES_MARKER, now_ms).await?;
            tracing::info!(region = %region, prices = spot.len(), "refreshed spot prices");
        }
        _ => {
            let c = ec2::catalog(client, &region, pricing).await?;
            store.put_catalog(&c).await?;
            store.mark(TYPES_MARKER, now_ms).await?;
            store.mark(PRICES_MARKER, now_ms).await?;
            tracing::info!(region = %region, instance_types = c.instance_types.len(), "rebuilt the instance catalog from EC2");
            return Ok(Due::Everything);
        }
    }
    Ok(what)
}

/// Before a solve: nothing to do when a catalog of this region is stored, or
/// none is and the region is the built-in snapshot's (which stands in);
/// otherwise the catalog is built and stored first.
pub async fn ensure_for_solving(
    client: &aws_sdk_ec2::Client,
    store: &StateStore,
    pricing: &impl Pricing,
) -> Result<(), RefreshError> {
    let region = region_of(client)?;
    let stored = store.get_catalog().await?;
    match stored {
        Some(c) if c.region == region => Ok(()),
        None if region == BUILTIN_REGION => Ok(()),
        _ => {
            tracing::info!(region = %region, "no stored catalog for this region; building it before solving");
            refresh(client, store, pricing, crate::state::now_ms())
                .await
                .map(|_| ())
        }
    }
}

/// The sweep's step: refreshes what is due with the bundled on-demand prices.
/// A failure is logged and left to the next run.
pub async fn sweep(client: &aws_sdk_ec2::Client, store: &StateStore) {
    let pricing = match ec2::PriceTable::bundled() {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %crate::telemetry::causes(&e), "no bundled price table; the catalog is not refreshed");
            return;
        }
    };
    if let Err(e) = refresh(client, store, &pricing, crate::state::now_ms()).await {
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
        assert_eq!(due(now, r, None, None, None), Due::Everything);
        assert_eq!(
            due(now, r, Some("us-east-1"), Some(now), Some(now)),
            Due::Everything,
            "another region's catalog"
        );
        assert_eq!(due(now, r, Some(r), Some(now - H), Some(now - H / 2)), Due::Nothing);
        assert_eq!(due(now, r, Some(r), Some(now - 2 * H), Some(now - H)), Due::SpotPrices);
        assert_eq!(due(now, r, Some(r), Some(now - 12 * H), Some(now)), Due::Everything);
        assert_eq!(due(now, r, Some(r), None, Some(now)), Due::Everything);
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
