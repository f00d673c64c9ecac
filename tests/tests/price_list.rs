//! The AWS Price List API through the real SDK client against moto's server
//! (the Price List patch in tests/moto/server.py): a region's on-demand
//! prices read page by page at the endpoint that serves it, the fake as
//! strict as the API, and the catalog refresh's fallback: the bundled table
//! while the API fails, the region's prices an hour later once it answers,
//! the last good prices kept when it fails again.

use aws_config::SdkConfig;
use aws_sdk_pricing::types::{Filter, FilterType};
use nodesmith::catalog::Catalog;
use nodesmith::catalog::price_list::{PriceList, endpoint_region};
use nodesmith::catalog::price_source::Origin;
use nodesmith::catalog_refresh::{self as refresh, Due, OnDemandSources};
use nodesmith::state::{self, StateStore};
use nodesmith_tests::fault_proxy::FaultProxy;
use nodesmith_tests::moto::{Moto, moto};

const REGION: &str = "eu-west-1";
const H: i64 = 3600 * 1000;

async fn eu_at(m: &Moto, endpoint: &str) -> SdkConfig {
    m.sdk_config_at(endpoint)
        .await
        .to_builder()
        .region(aws_config::Region::new(REGION))
        .build()
}

fn m5_large_on_demand(c: &Catalog) -> Vec<f64> {
    let t = c.instance_types.iter().find(|t| t.name == "m5.large").unwrap();
    t.offerings
        .iter()
        .filter(|o| o.capacity_type == "on-demand")
        .map(|o| o.price)
        .collect()
}

#[tokio::test]
async fn a_regions_prices_are_read_page_by_page_at_its_price_list_endpoint() {
    let m = moto().await;
    let proxy = FaultProxy::start(m.endpoint()).await;
    let conf = eu_at(&m, proxy.endpoint()).await;
    let prices = PriceList::for_sdk(&conf)
        .unwrap()
        .on_demand_prices(REGION)
        .await
        .unwrap();
    assert_eq!(prices.get("m5.large"), Some(&0.107));
    assert_eq!(prices.get("c5.large"), Some(&0.096));
    // Bare metal is priced by its own query (dedicated tenancy in the Price List).
    assert!(
        prices.get("m5.metal").is_some_and(|p| *p > 4.0),
        "{:?}",
        prices.get("m5.metal")
    );
    assert!(prices.len() > 1000, "{} types", prices.len());
    // More than a thousand products at 100 a page: every page was asked for.
    assert!(proxy.calls("GetProducts") >= 12, "{} calls", proxy.calls("GetProducts"));

    // The fake refuses what the API refuses.
    let pricing_at = |region: &str| {
        aws_sdk_pricing::Client::from_conf(
            aws_sdk_pricing::config::Builder::from(&conf)
                .region(aws_config::Region::new(region.to_string()))
                .build(),
        )
    };
    assert_eq!(endpoint_region(REGION), "eu-central-1");
    let no_endpoint = pricing_at(REGION).get_products().service_code("AmazonEC2").send().await;
    assert!(no_endpoint.is_err(), "the Price List API has no endpoint in eu-west-1");
    let api = pricing_at("eu-central-1");
    let code = |e: aws_sdk_pricing::error::SdkError<_>| {
        aws_sdk_pricing::error::ProvideErrorMetadata::code(&e)
            .unwrap_or_default()
            .to_string()
    };
    let bad_type = Filter::builder()
        .r#type(FilterType::from("PREFIX"))
        .field("regionCode")
        .value(REGION)
        .build()
        .unwrap();
    let e = api
        .get_products()
        .service_code("AmazonEC2")
        .filters(bad_type)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "ValidationException");
    let e = api
        .get_products()
        .service_code("AmazonEC2")
        .max_results(101)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "ValidationException");
    let region_filter = |r: &str| {
        Filter::builder()
            .r#type(FilterType::TermMatch)
            .field("regionCode")
            .value(r)
            .build()
            .unwrap()
    };
    let first = api
        .get_products()
        .service_code("AmazonEC2")
        .filters(region_filter(REGION))
        .max_results(10)
        .send()
        .await
        .unwrap();
    assert_eq!(first.price_list().len(), 10);
    let token = first.next_token().unwrap().to_string();
    // A page token belongs to its query.
    let e = api
        .get_products()
        .service_code("AmazonEC2")
        .filters(region_filter("us-east-1"))
        .max_results(10)
        .next_token(token)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InvalidNextTokenException");
}

#[tokio::test]
async fn a_fallback_is_stated_retried_hourly_and_the_last_good_prices_outlive_a_failure() {
    let m = moto().await;
    let proxy = FaultProxy::start(m.endpoint()).await;
    let conf = eu_at(&m, proxy.endpoint()).await;
    let dynamo = aws_sdk_dynamodb::Client::new(&conf);
    state::create_table(&dynamo, "nodesmith-prices").await.unwrap();
    let st = StateStore::new(dynamo, "nodesmith-prices");
    let ec2 = aws_sdk_ec2::Client::new(&conf);
    let sources = OnDemandSources::new(PriceList::for_sdk(&conf)).unwrap();
    let deny = |times| {
        proxy.fail_dynamo_next(
            "GetProducts",
            times,
            400,
            "AccessDeniedException",
            "User is not authorized to perform: pricing:GetProducts",
        )
    };

    // The API refuses: the bundled us-east-1 table stands in, and says so.
    deny(100);
    let t0 = state::now_ms();
    assert_eq!(
        refresh::refresh(&ec2, &st, &sources, t0).await.unwrap(),
        Due::Everything
    );
    assert!(
        m5_large_on_demand(&st.get_catalog().await.unwrap().unwrap())
            .iter()
            .all(|p| *p == 0.096)
    );
    let s = st.price_source().await.unwrap().unwrap();
    assert_eq!((s.origin, s.region.as_str()), (Origin::BundledTable, "us-east-1"));
    assert!(
        s.fallback.as_deref().is_some_and(|w| w.contains("AccessDenied")),
        "{s:?}"
    );

    // An hour on, the API answers: the catalog is rebuilt with the region's prices.
    deny(0);
    assert_eq!(
        refresh::refresh(&ec2, &st, &sources, t0 + H).await.unwrap(),
        Due::Everything
    );
    assert!(
        m5_large_on_demand(&st.get_catalog().await.unwrap().unwrap())
            .iter()
            .all(|p| *p == 0.107)
    );
    let s = st.price_source().await.unwrap().unwrap();
    assert!(s.is_live_for(REGION), "{s:?}");
    assert_eq!(s.read_ms, Some(t0 + H));
    // Live prices: back to the twelve-hour rebuild.
    assert_eq!(
        refresh::refresh(&ec2, &st, &sources, t0 + 2 * H).await.unwrap(),
        Due::SpotPrices
    );

    // The API fails at the next rebuild: the region's last good prices stay, stated.
    deny(100);
    assert_eq!(
        refresh::refresh(&ec2, &st, &sources, t0 + 13 * H).await.unwrap(),
        Due::Everything
    );
    assert!(
        m5_large_on_demand(&st.get_catalog().await.unwrap().unwrap())
            .iter()
            .all(|p| *p == 0.107)
    );
    let s = st.price_source().await.unwrap().unwrap();
    assert_eq!(s.origin, Origin::PriceListApi);
    assert_eq!((s.read_ms, s.checked_ms), (Some(t0 + H), t0 + 13 * H));
    assert!(s.fallback.is_some());
}
