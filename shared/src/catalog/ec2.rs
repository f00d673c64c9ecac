//! The catalog from the EC2 API: DescribeInstanceTypes and
//! DescribeInstanceTypeOfferings (availability zones) for facts and zones,
//! DescribeSpotPriceHistory for spot prices, and a [`Pricing`] source for
//! on-demand prices (by default the bundled price table).
//!
//! SDK types are mapped to [`Ec2Facts`] here and nowhere else; everything
//! after that is the same pure path the built-in snapshot takes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;

use aws_sdk_ec2::Client;
use aws_sdk_ec2::error::DisplayErrorContext;
use aws_sdk_ec2::types::{InstanceTypeInfo as SdkInstanceType, LocationType};

use super::builtin::{CatalogSnapshot, SnapshotType};
use super::facts::{Device, Ec2Facts, gbps_to_mbps, kube_arch};
use super::{Catalog, CatalogError};

/// The bundled on-demand price table (us-east-1, Linux, shared tenancy).
pub const BUNDLED_PRICES_JSON: &str = include_str!("../../data/ec2-on-demand-prices-us-east-1.json");

/// A source of on-demand prices per instance type for a region.
pub trait Pricing {
    /// On-demand price per hour in USD by instance type name.
    fn on_demand_prices(&self, region: &str)
    -> impl Future<Output = Result<HashMap<String, f64>, CatalogError>> + Send;
}

/// On-demand prices from a static table (by default the bundled us-east-1 one).
#[derive(Debug, Clone, PartialEq)]
pub struct PriceTable {
    /// The region the table was taken in.
    pub region: String,
    /// Price per hour by instance type.
    pub prices: HashMap<String, f64>,
}

impl PriceTable {
    /// Parses a table of the form `{"region": ..., "prices": {"m5.large": 0.096}}`.
    pub fn parse(text: &str) -> Result<PriceTable, CatalogError> {
        #[derive(serde::Deserialize)]
        struct Raw {
            region: String,
            prices: HashMap<String, f64>,
        }
        let de = &mut serde_json::Deserializer::from_str(text);
        let raw: Raw = serde_path_to_error::deserialize(de).map_err(|e| CatalogError::Field {
            path: e.path().to_string(),
            message: e.inner().to_string(),
        })?;
        if let Some((name, p)) = raw.prices.iter().find(|(_, p)| !p.is_finite() || **p < 0.0) {
            return Err(CatalogError::Field {
                path: format!("prices.{name}"),
                message: format!("invalid price {p}"),
            });
        }
        Ok(PriceTable {
            region: raw.region,
            prices: raw.prices,
        })
    }

    /// The bundled us-east-1 table.
    pub fn bundled() -> Result<PriceTable, CatalogError> {
        PriceTable::parse(BUNDLED_PRICES_JSON).map_err(|e| CatalogError::Builtin(Box::new(e)))
    }
}

impl Pricing for PriceTable {
    /// The table's prices; for another region they stand in as an
    /// approximation (the relative order of types is what bin-packing needs).
    fn on_demand_prices(
        &self,
        region: &str,
    ) -> impl Future<Output = Result<HashMap<String, f64>, CatalogError>> + Send {
        if region != self.region {
            tracing::warn!(region, table = %self.region, "no on-demand price table for this region; using the bundled one");
        }
        std::future::ready(Ok(self.prices.clone()))
    }
}

fn ec2_error<E: std::error::Error + 'static>(operation: &'static str) -> impl Fn(E) -> CatalogError {
    move |e| CatalogError::Ec2 {
        operation,
        message: DisplayErrorContext(e).to_string(),
    }
}

/// Every instance type's facts (all pages).
pub async fn describe_instance_types(client: &Client) -> Result<Vec<Ec2Facts>, CatalogError> {
    let mut pages = client
        .describe_instance_types()
        .max_results(100)
        .into_paginator()
        .send();
    let mut out = Vec::new();
    while let Some(page) = pages.next().await {
        let page = page.map_err(ec2_error("DescribeInstanceTypes"))?;
        for t in page.instance_types() {
            if let Some(f) = facts_from_sdk(t) {
                out.push(f);
            }
        }
    }
    Ok(out)
}

/// Zones offering each instance type (all pages).
pub async fn describe_zones(client: &Client) -> Result<BTreeMap<String, BTreeSet<String>>, CatalogError> {
    let mut pages = client
        .describe_instance_type_offerings()
        .location_type(LocationType::AvailabilityZone)
        .max_results(1000)
        .into_paginator()
        .send();
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    while let Some(page) = pages.next().await {
        let page = page.map_err(ec2_error("DescribeInstanceTypeOfferings"))?;
        for o in page.instance_type_offerings() {
            if let (Some(t), Some(z)) = (o.instance_type(), o.location()) {
                out.entry(t.as_str().to_string()).or_default().insert(z.to_string());
            }
        }
    }
    Ok(out)
}

/// The latest Linux spot price per (instance type, zone) (all pages).
pub async fn describe_spot_prices(client: &Client) -> Result<BTreeMap<(String, String), f64>, CatalogError> {
    let mut pages = client
        .describe_spot_price_history()
        .product_descriptions("Linux/UNIX")
        .product_descriptions("Linux/UNIX (Amazon VPC)")
        .start_time(aws_smithy_types::DateTime::from(std::time::SystemTime::now()))
        .max_results(1000)
        .into_paginator()
        .send();
    let mut latest: BTreeMap<(String, String), (Option<aws_smithy_types::DateTime>, f64)> = BTreeMap::new();
    while let Some(page) = pages.next().await {
        let page = page.map_err(ec2_error("DescribeSpotPriceHistory"))?;
        for p in page.spot_price_history() {
            let linux = p
                .product_description()
                .is_some_and(|d| d.as_str().starts_with("Linux/UNIX"));
            let (Some(t), Some(z), Some(price)) = (p.instance_type(), p.availability_zone(), p.spot_price()) else {
                continue;
            };
            let Ok(price) = price.parse::<f64>() else {
                tracing::warn!(instance_type = t.as_str(), zone = z, price, "unreadable spot price");
                continue;
            };
            if !linux || !price.is_finite() || price < 0.0 {
                continue;
            }
            let key = (t.as_str().to_string(), z.to_string());
            let ts = p.timestamp().copied();
            match latest.get(&key) {
                Some((seen, _)) if *seen >= ts => {}
                _ => {
                    latest.insert(key, (ts, price));
                }
            }
        }
    }
    Ok(latest.into_iter().map(|(k, (_, p))| (k, p)).collect())
}

/// A snapshot of the region's catalog from the EC2 API and a price source.
pub async fn snapshot(client: &Client, region: &str, pricing: &impl Pricing) -> Result<CatalogSnapshot, CatalogError> {
    let facts = describe_instance_types(client).await?;
    let zones = describe_zones(client).await?;
    let spot = describe_spot_prices(client).await?;
    let on_demand = pricing.on_demand_prices(region).await?;
    let s = assemble(region, facts, &zones, &on_demand, &spot);
    tracing::info!(
        region,
        instance_types = s.instance_types.len(),
        spot_prices = spot.len(),
        "built instance catalog from EC2"
    );
    Ok(s)
}

/// The region's catalog from the EC2 API and a price source.
pub async fn catalog(client: &Client, region: &str, pricing: &impl Pricing) -> Result<Catalog, CatalogError> {
    snapshot(client, region, pricing).await?.to_catalog()
}

/// Joins facts, zones and prices into a snapshot. Keeps Linux-capable types
/// that some zone offers at a known price, as Karpenter only offers what it
/// can price.
pub fn assemble(
    region: &str,
    facts: Vec<Ec2Facts>,
    zones: &BTreeMap<String, BTreeSet<String>>,
    on_demand: &HashMap<String, f64>,
    spot: &BTreeMap<(String, String), f64>,
) -> CatalogSnapshot {
    let mut instance_types: Vec<SnapshotType> = facts
        .into_iter()
        .filter(|f| kube_arch(&f.architectures).is_some())
        .filter_map(|f| {
            let zones: Vec<String> = zones.get(&f.name)?.iter().cloned().collect();
            let on_demand_price = on_demand.get(&f.name).copied();
            let spot_prices: Vec<Option<f64>> = zones
                .iter()
                .map(|z| spot.get(&(f.name.clone(), z.clone())).copied())
                .collect();
            let spot_prices = if spot_prices.iter().any(Option::is_some) {
                spot_prices
            } else {
                vec![]
            };
            let t = SnapshotType {
                facts: f,
                zones,
                on_demand_price,
                spot_prices,
            };
            let priced = (t.on_demand_price.is_some() && t.facts.supports_on_demand())
                || (!t.spot_prices.is_empty() && t.facts.supports_spot());
            priced.then_some(t)
        })
        .collect();
    instance_types.sort_by(|a, b| a.facts.name.cmp(&b.facts.name));
    CatalogSnapshot {
        region: region.to_string(),
        spot_prices_are_estimates: false,
        instance_types,
    }
}

/// Network interfaces of the default network card (pods get addresses there
/// only); the instance's total when EC2 lists no cards.
fn default_card_enis(net: &aws_sdk_ec2::types::NetworkInfo) -> i64 {
    let index = net.default_network_card_index().unwrap_or(0);
    net.network_cards()
        .iter()
        .find(|c| c.network_card_index() == Some(index))
        .and_then(|c| c.maximum_network_interfaces())
        .or(net.maximum_network_interfaces())
        .unwrap_or(0)
        .into()
}

/// Maps one DescribeInstanceTypes entry to facts (the same mapping as
/// `scripts/gen-catalog.py`). None when it has no name.
pub fn facts_from_sdk(t: &SdkInstanceType) -> Option<Ec2Facts> {
    let name = t.instance_type()?.as_str().to_string();
    let proc = t.processor_info();
    let net = t.network_info();
    let storage = t.instance_storage_info();
    let cards: Vec<f64> = net
        .map(|n| {
            n.network_cards()
                .iter()
                .filter_map(|c| c.baseline_bandwidth_in_gbps())
                .collect()
        })
        .unwrap_or_default();
    let gpus = t
        .gpu_info()
        .map(|g| {
            g.gpus()
                .iter()
                .map(|d| Device {
                    name: d.name().unwrap_or_default().to_string(),
                    manufacturer: d.manufacturer().unwrap_or_default().to_string(),
                    count: d.count().unwrap_or(0).into(),
                    memory_mib: d.memory_info().and_then(|m| m.size_in_mib()).map(i64::from),
                    cores: None,
                })
                .collect()
        })
        .unwrap_or_default();
    // Neuron devices (Inferentia, Trainium) carry core counts; older data has
    // only InferenceAcceleratorInfo.
    let neuron: Vec<Device> = t
        .neuron_info()
        .map(|n| {
            n.neuron_devices()
                .iter()
                .map(|d| Device {
                    name: d.name().unwrap_or_default().to_string(),
                    manufacturer: "AWS".to_string(),
                    count: d.count().unwrap_or(0).into(),
                    memory_mib: d.memory_info().and_then(|m| m.size_in_mib()).map(i64::from),
                    cores: d.core_info().and_then(|c| c.count()).map(i64::from),
                })
                .collect()
        })
        .unwrap_or_default();
    let accelerators = if neuron.is_empty() {
        t.inference_accelerator_info()
            .map(|a| {
                a.accelerators()
                    .iter()
                    .map(|d| Device {
                        name: d.name().unwrap_or_default().to_string(),
                        manufacturer: d.manufacturer().unwrap_or_default().to_string(),
                        count: d.count().unwrap_or(0).into(),
                        memory_mib: d.memory_info().and_then(|m| m.size_in_mib()).map(i64::from),
                        cores: None,
                    })
                    .collect()
            })
            .unwrap_or_default()
    } else {
        neuron
    };
    Some(Ec2Facts {
        name,
        vcpus: t.v_cpu_info().and_then(|v| v.default_v_cpus()).unwrap_or(0).into(),
        memory_mib: t.memory_info().and_then(|m| m.size_in_mib()).unwrap_or(0),
        architectures: proc
            .map(|p| {
                p.supported_architectures()
                    .iter()
                    .map(|a| a.as_str().to_string())
                    .collect()
            })
            .unwrap_or_default(),
        cpu_manufacturer: proc
            .and_then(|p| p.manufacturer())
            .filter(|m| !m.is_empty())
            .map(str::to_string),
        clock_ghz: proc.and_then(|p| p.sustained_clock_speed_in_ghz()),
        hypervisor: t.hypervisor().map(|h| h.as_str().to_string()).filter(|h| !h.is_empty()),
        bare_metal: t.bare_metal().unwrap_or(false),
        max_enis: net.map_or(0, default_card_enis),
        ipv4_per_eni: net.and_then(|n| n.ipv4_addresses_per_interface()).unwrap_or(0).into(),
        network_bandwidth_mbps: (!cards.is_empty()).then(|| cards.iter().map(|g| gbps_to_mbps(*g)).sum()),
        ebs_bandwidth_mbps: t
            .ebs_info()
            .and_then(|e| e.ebs_optimized_info())
            .and_then(|o| o.maximum_bandwidth_in_mbps())
            .map(i64::from),
        local_storage_gb: storage.and_then(|s| s.total_size_in_gb()),
        local_nvme: storage.is_some_and(|s| {
            s.total_size_in_gb().is_some()
                && s.nvme_support()
                    .is_some_and(|n| matches!(n.as_str(), "required" | "supported"))
        }),
        gpus,
        accelerators,
        efa_interfaces: match net {
            Some(n) if n.efa_supported() == Some(true) => n
                .efa_info()
                .and_then(|e| e.maximum_efa_interfaces())
                .unwrap_or(0)
                .into(),
            _ => 0,
        },
        encryption_in_transit: net.and_then(|n| n.encryption_in_transit_supported()).unwrap_or(false),
        usage_classes: t
            .supported_usage_classes()
            .iter()
            .map(|u| u.as_str().to_string())
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(name: &str, arch: &str, usage: &[&str]) -> Ec2Facts {
        Ec2Facts {
            name: name.into(),
            vcpus: 2,
            memory_mib: 8192,
            architectures: vec![arch.into()],
            cpu_manufacturer: None,
            clock_ghz: None,
            hypervisor: None,
            bare_metal: false,
            max_enis: 3,
            ipv4_per_eni: 10,
            network_bandwidth_mbps: None,
            ebs_bandwidth_mbps: None,
            local_storage_gb: None,
            local_nvme: false,
            gpus: vec![],
            accelerators: vec![],
            efa_interfaces: 0,
            encryption_in_transit: false,
            usage_classes: usage.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn pods_get_the_default_network_cards_interfaces_only() {
        use aws_sdk_ec2::types::{NetworkCardInfo, NetworkInfo};
        let card = |i: i32, n: i32| {
            NetworkCardInfo::builder()
                .network_card_index(i)
                .maximum_network_interfaces(n)
                .build()
        };
        let two_cards = NetworkInfo::builder()
            .maximum_network_interfaces(15)
            .default_network_card_index(0)
            .network_cards(card(0, 8))
            .network_cards(card(1, 7))
            .build();
        assert_eq!(default_card_enis(&two_cards), 8);
        let second_is_default = NetworkInfo::builder()
            .maximum_network_interfaces(15)
            .default_network_card_index(1)
            .network_cards(card(0, 8))
            .network_cards(card(1, 7))
            .build();
        assert_eq!(default_card_enis(&second_is_default), 7);
        let no_cards = NetworkInfo::builder().maximum_network_interfaces(3).build();
        assert_eq!(default_card_enis(&no_cards), 3);
    }

    #[test]
    fn assemble_joins_prices_and_zones() {
        let zones: BTreeMap<String, BTreeSet<String>> = [
            ("m5.large".to_string(), ["z-b".to_string(), "z-a".to_string()].into()),
            ("mac1.metal".to_string(), ["z-a".to_string()].into()),
            ("odonly.large".to_string(), ["z-a".to_string()].into()),
            ("unpriced.large".to_string(), ["z-a".to_string()].into()),
        ]
        .into();
        let od: HashMap<String, f64> = [
            ("m5.large".to_string(), 0.096),
            ("mac1.metal".to_string(), 1.0),
            ("odonly.large".to_string(), 0.5),
        ]
        .into();
        let spot: BTreeMap<(String, String), f64> = [
            (("m5.large".to_string(), "z-b".to_string()), 0.03),
            (("odonly.large".to_string(), "z-a".to_string()), 0.1),
        ]
        .into();
        let all = vec![
            facts("unpriced.large", "x86_64", &["on-demand", "spot"]),
            facts("m5.large", "x86_64", &["on-demand", "spot"]),
            facts("mac1.metal", "x86_64_mac", &["on-demand"]),
            facts("odonly.large", "arm64", &["on-demand"]),
            facts("nozone.large", "x86_64", &["on-demand"]),
        ];
        let s = assemble("r", all, &zones, &od, &spot);
        assert_eq!(
            s.instance_types
                .iter()
                .map(|t| t.facts.name.as_str())
                .collect::<Vec<_>>(),
            ["m5.large", "odonly.large"]
        );
        let m5 = &s.instance_types[0];
        assert_eq!(m5.zones, ["z-a", "z-b"]);
        assert_eq!(m5.spot_prices, [None, Some(0.03)]);
        let offers: Vec<(String, String, f64)> = m5
            .offerings()
            .unwrap()
            .into_iter()
            .map(|o| (o.zone, o.capacity_type, o.price))
            .collect();
        assert_eq!(
            offers,
            [
                ("z-a".into(), "on-demand".into(), 0.096),
                ("z-b".into(), "on-demand".into(), 0.096),
                ("z-b".into(), "spot".into(), 0.03)
            ]
        );
        // A spot price for a type that does not sell spot is not an offering.
        let odonly = &s.instance_types[1];
        assert!(
            odonly
                .offerings()
                .unwrap()
                .iter()
                .all(|o| o.capacity_type == "on-demand")
        );
        assert!(!s.spot_prices_are_estimates);
    }

    #[test]
    fn price_table_parses_and_rejects_bad_prices() {
        let t = PriceTable::bundled().unwrap();
        assert_eq!(t.region, "us-east-1");
        assert_eq!(t.prices.get("m5.large"), Some(&0.096));
        let e = PriceTable::parse(r#"{"region":"r","prices":{"m5.large":"cheap"}}"#)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("prices.m5.large:"), "{e}");
        let e = PriceTable::parse(r#"{"region":"r","prices":{"m5.large":-1}}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("invalid price"), "{e}");
    }
}
