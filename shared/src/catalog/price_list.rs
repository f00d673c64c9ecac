//! On-demand prices of a region from the AWS Price List API (GetProducts),
//! as Karpenter's AWS provider reads them: EC2 compute products of the
//! region, Linux, no pre-installed software, capacity status `Used`, market
//! option `OnDemand`, shared tenancy, plus bare metal (which the Price List
//! lists as dedicated tenancy). Every page is read.
//!
//! The API answers only at a few endpoints, whatever region it prices
//! ([`endpoint_region`]); the region is a filter. Each answer's price
//! documents are read by the pure [`page_prices`], which also checks each
//! product's attributes itself, since the API ignores a filter on a field it
//! does not know rather than refusing it.

use std::collections::HashMap;

use aws_sdk_pricing::types::{Filter, FilterType};
use serde::Deserialize;

/// The service code of EC2's products.
pub const SERVICE_CODE: &str = "AmazonEC2";
/// GetProducts' largest page.
pub const PAGE_SIZE: i32 = 100;

/// The region whose Price List endpoint serves `region`: the API has
/// endpoints in us-east-1, eu-central-1 and ap-south-1 (and cn-northwest-1
/// for the China partition); a region is priced from the nearest.
pub fn endpoint_region(region: &str) -> &'static str {
    if region.starts_with("ap-") {
        "ap-south-1"
    } else if region.starts_with("eu-") {
        "eu-central-1"
    } else if region.starts_with("cn-") {
        "cn-northwest-1"
    } else {
        "us-east-1"
    }
}

/// One GetProducts query: the products it asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Query<'r> {
    /// The region priced (`regionCode`).
    pub region: &'r str,
    /// `tenancy`.
    pub tenancy: &'static str,
    /// `productFamily`.
    pub product_family: &'static str,
}

impl<'r> Query<'r> {
    /// The two queries that price a region's instance types: virtualized
    /// instances (shared tenancy) and bare metal.
    pub fn for_region(region: &'r str) -> [Query<'r>; 2] {
        [
            Query {
                region,
                tenancy: "Shared",
                product_family: "Compute Instance",
            },
            Query {
                region,
                tenancy: "Dedicated",
                product_family: "Compute Instance (bare metal)",
            },
        ]
    }

    /// Its `TERM_MATCH` filters as (field, value) (pure).
    pub fn filters(&self) -> Vec<(&'static str, &str)> {
        vec![
            ("regionCode", self.region),
            ("serviceCode", SERVICE_CODE),
            ("operatingSystem", "Linux"),
            ("preInstalledSw", "NA"),
            ("capacitystatus", "Used"),
            ("marketoption", "OnDemand"),
            ("tenancy", self.tenancy),
            ("productFamily", self.product_family),
        ]
    }

    /// True when a product's attributes are the ones asked for.
    fn admits(&self, family: &str, a: &Attributes) -> bool {
        family == self.product_family
            && a.region_code == self.region
            && a.operating_system == "Linux"
            && a.pre_installed_sw == "NA"
            && a.capacity_status == "Used"
            && a.tenancy == self.tenancy
            && a.market_option.as_deref().is_none_or(|m| m == "OnDemand")
    }
}

/// The part of a price document that prices an instance type.
#[derive(Debug, Deserialize)]
struct PriceDocument {
    product: Product,
    #[serde(default)]
    terms: Terms,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Product {
    #[serde(default)]
    product_family: String,
    attributes: Attributes,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Attributes {
    #[serde(default)]
    instance_type: String,
    #[serde(default)]
    region_code: String,
    #[serde(default)]
    operating_system: String,
    #[serde(default)]
    pre_installed_sw: String,
    #[serde(default, rename = "capacitystatus")]
    capacity_status: String,
    #[serde(default)]
    tenancy: String,
    #[serde(default, rename = "marketoption")]
    market_option: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct Terms {
    #[serde(default, rename = "OnDemand")]
    on_demand: HashMap<String, Term>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Term {
    #[serde(default)]
    price_dimensions: HashMap<String, Dimension>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Dimension {
    #[serde(default)]
    unit: String,
    #[serde(default)]
    price_per_unit: HashMap<String, String>,
}

/// What one page of price documents says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PagePrices {
    /// Hourly USD price by instance type.
    pub prices: HashMap<String, f64>,
    /// Documents that are not JSON, not a product of the query, or carry no
    /// positive hourly USD on-demand price.
    pub skipped: usize,
}

/// Reads one GetProducts page's `PriceList` for `query` (pure).
pub fn page_prices(query: &Query<'_>, documents: &[String]) -> PagePrices {
    let mut out = PagePrices::default();
    for text in documents {
        let price = serde_json::from_str::<PriceDocument>(text).ok().and_then(|d| {
            let a = &d.product.attributes;
            if a.instance_type.is_empty() || !query.admits(&d.product.product_family, a) {
                return None;
            }
            let hourly = d
                .terms
                .on_demand
                .values()
                .flat_map(|t| t.price_dimensions.values())
                .filter(|dim| dim.unit == "Hrs")
                .filter_map(|dim| dim.price_per_unit.get("USD")?.parse::<f64>().ok())
                .filter(|p| p.is_finite() && *p > 0.0)
                .reduce(f64::min)?;
            Some((a.instance_type.clone(), hourly))
        });
        match price {
            Some((name, p)) => {
                out.prices
                    .entry(name)
                    .and_modify(|q: &mut f64| *q = q.min(p))
                    .or_insert(p);
            }
            None => out.skipped += 1,
        }
    }
    out
}

/// Why the Price List API gave no prices.
#[derive(Debug, thiserror::Error)]
pub enum PriceListError {
    /// A GetProducts call failed.
    #[error("Price List GetProducts for {region}")]
    GetProducts {
        /// The region priced.
        region: String,
        /// The SDK's error.
        #[source]
        source: Box<aws_sdk_pricing::error::SdkError<aws_sdk_pricing::operation::get_products::GetProductsError>>,
    },
    /// A filter could not be built (a programming error).
    #[error("building a Price List filter")]
    Filter(#[source] aws_sdk_pricing::error::BuildError),
    /// The API answered without a price for one of the queries.
    #[error("the Price List API has no Linux on-demand prices of {product_family} in {region}")]
    Empty {
        /// The region priced.
        region: String,
        /// The product family that had none.
        product_family: &'static str,
    },
}

/// The AWS Price List API, at the endpoint that serves the cluster's region.
#[derive(Debug, Clone)]
pub struct PriceList {
    client: aws_sdk_pricing::Client,
}

impl PriceList {
    /// A client at the endpoint serving `sdk`'s region (credentials, endpoint
    /// override and HTTP client as `sdk` has them); None without a region.
    pub fn for_sdk(sdk: &aws_config::SdkConfig) -> Option<PriceList> {
        let region = sdk.region()?.to_string();
        let conf = aws_sdk_pricing::config::Builder::from(sdk)
            .region(aws_config::Region::new(endpoint_region(&region)))
            .build();
        Some(PriceList::from_client(aws_sdk_pricing::Client::from_conf(conf)))
    }

    /// Over a client already pointed at a Price List endpoint.
    pub fn from_client(client: aws_sdk_pricing::Client) -> PriceList {
        PriceList { client }
    }

    /// Hourly on-demand USD prices of `region`'s instance types (every page
    /// of both queries). Either query answering nothing is an error, as
    /// Karpenter treats it: a partial price list would drop instance types.
    pub async fn on_demand_prices(&self, region: &str) -> Result<HashMap<String, f64>, PriceListError> {
        let mut all = HashMap::new();
        for q in Query::for_region(region) {
            let got = self.query(&q).await?;
            if got.is_empty() {
                return Err(PriceListError::Empty {
                    region: region.to_string(),
                    product_family: q.product_family,
                });
            }
            all.extend(got);
        }
        Ok(all)
    }

    async fn query(&self, q: &Query<'_>) -> Result<HashMap<String, f64>, PriceListError> {
        let filters = q
            .filters()
            .into_iter()
            .map(|(field, value)| {
                Filter::builder()
                    .r#type(FilterType::TermMatch)
                    .field(field)
                    .value(value)
                    .build()
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(PriceListError::Filter)?;
        let mut pages = self
            .client
            .get_products()
            .service_code(SERVICE_CODE)
            .format_version("aws_v1")
            .set_filters(Some(filters))
            .max_results(PAGE_SIZE)
            .into_paginator()
            .send();
        let mut prices = HashMap::new();
        let mut skipped = 0;
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| PriceListError::GetProducts {
                region: q.region.to_string(),
                source: Box::new(e),
            })?;
            let read = page_prices(q, page.price_list());
            skipped += read.skipped;
            prices.extend(read.prices);
        }
        if skipped > 0 {
            tracing::debug!(
                region = q.region,
                family = q.product_family,
                skipped,
                "price documents not used"
            );
        }
        Ok(prices)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(itype: &str, os: &str, tenancy: &str, capacity: &str, usd: &str) -> String {
        serde_json::json!({
            "product": {"productFamily": "Compute Instance", "sku": "SKU1",
                "attributes": {"instanceType": itype, "regionCode": "eu-west-1", "operatingSystem": os,
                    "preInstalledSw": "NA", "capacitystatus": capacity, "tenancy": tenancy,
                    "marketoption": "OnDemand", "location": "EU (Ireland)"}},
            "serviceCode": "AmazonEC2",
            "terms": {
                "OnDemand": {"SKU1.JRTCKXETXF": {"priceDimensions": {"SKU1.JRTCKXETXF.6YS6EN2CT7": {
                    "unit": "Hrs", "pricePerUnit": {"USD": usd}, "rateCode": "SKU1.JRTCKXETXF.6YS6EN2CT7"}},
                    "offerTermCode": "JRTCKXETXF"}},
                "Reserved": {"SKU1.4NA7Y494T4": {"priceDimensions": {"SKU1.4NA7Y494T4.6YS6EN2CT7": {
                    "unit": "Hrs", "pricePerUnit": {"USD": "0.0100000000"}}}}}
            }
        })
        .to_string()
    }

    #[test]
    fn a_page_prices_only_the_products_asked_for_from_their_on_demand_terms() {
        let [shared, _] = Query::for_region("eu-west-1");
        let docs = vec![
            doc("m5.large", "Linux", "Shared", "Used", "0.1070000000"),
            doc("m5.large", "Windows", "Shared", "Used", "0.2000000000"),
            doc("m5.large", "Linux", "Dedicated", "Used", "0.1180000000"),
            doc(
                "c5.large",
                "Linux",
                "Shared",
                "UnusedCapacityReservation",
                "0.0960000000",
            ),
            doc("c5.large", "Linux", "Shared", "Used", "0.0000000000"),
            doc("t3.medium", "Linux", "Shared", "Used", "0.0456000000"),
            "not json".to_string(),
        ];
        let got = page_prices(&shared, &docs);
        assert_eq!(
            got.prices,
            HashMap::from([("m5.large".to_string(), 0.107), ("t3.medium".to_string(), 0.0456)])
        );
        assert_eq!(got.skipped, 5);
        // Another region's products are not this region's prices.
        let [us, _] = Query::for_region("us-east-1");
        assert!(page_prices(&us, &docs).prices.is_empty());
    }

    #[test]
    fn the_api_is_asked_at_the_endpoint_nearest_the_region_with_karpenters_filters() {
        assert_eq!(endpoint_region("eu-west-1"), "eu-central-1");
        assert_eq!(endpoint_region("ap-northeast-1"), "ap-south-1");
        assert_eq!(endpoint_region("us-west-2"), "us-east-1");
        assert_eq!(endpoint_region("sa-east-1"), "us-east-1");
        let [shared, metal] = Query::for_region("eu-west-1");
        let f = shared.filters();
        for want in [
            ("regionCode", "eu-west-1"),
            ("operatingSystem", "Linux"),
            ("preInstalledSw", "NA"),
            ("capacitystatus", "Used"),
            ("tenancy", "Shared"),
        ] {
            assert!(f.contains(&want), "{want:?} in {f:?}");
        }
        assert!(metal.filters().contains(&("tenancy", "Dedicated")));
        assert!(
            metal
                .filters()
                .contains(&("productFamily", "Compute Instance (bare metal)"))
        );
    }
}
