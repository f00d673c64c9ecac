//! The instance catalog: EC2 instance types, their labels, allocatable
//! resources and priced offerings (zone × capacity type).
//!
//! Raw facts ([`InstanceTypeInfo`]) are kept per type; [`Catalog::resolve`]
//! turns them into schedulable [`InstanceType`]s for one EC2NodeClass's
//! kubelet settings, since allocatable depends on them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::apis::KubeletConfiguration;
use crate::apis::ec2nodeclass::{CapacityReservationStatus, RESERVATION_DEFAULT};
use crate::labels;
use crate::quantity::Quantity;
use crate::requirements::{Requirement, Requirements};
use crate::resources::Resources;

/// One place and way an instance type can be bought.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Offering {
    /// Availability zone name.
    pub zone: String,
    /// `spot` or `on-demand` (or `reserved`).
    pub capacity_type: String,
    /// Price per hour in USD.
    pub price: f64,
    /// False when recently out of capacity (or not offered).
    #[serde(default = "yes")]
    pub available: bool,
    /// The capacity reservation behind a `reserved` offering.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<Reservation>,
}

fn yes() -> bool {
    true
}

/// An EC2 capacity reservation (ODCR or capacity block) an EC2NodeClass
/// selects, as a `reserved` offering of its instance type and zone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reservation {
    /// The reservation id, `cr-...`.
    pub id: String,
    /// `default` (an ODCR) or `capacity-block`.
    pub reservation_type: String,
    /// Instances it can still take.
    pub available: u32,
}

/// Reserved capacity is paid for whether used or not, so it is priced as
/// almost free (a tiny fraction of on-demand keeps the cheaper types first).
pub const RESERVED_PRICE_FACTOR: f64 = 1e-7;

impl Offering {
    /// A plain (unreserved) offering.
    pub fn new(zone: &str, capacity_type: &str, price: f64) -> Offering {
        Offering {
            zone: zone.to_string(),
            capacity_type: capacity_type.to_string(),
            price,
            available: true,
            reservation: None,
        }
    }
}

/// Requirements on the keys an offering decides: zone, capacity type and the
/// capacity-reservation labels (which only reserved nodes carry), looked up
/// once for checking many offerings.
#[derive(Debug, Clone, Copy)]
pub struct OfferingRequirements<'r> {
    zone: Option<&'r Requirement>,
    capacity_type: Option<&'r Requirement>,
    reservation_id: Option<&'r Requirement>,
    reservation_type: Option<&'r Requirement>,
}

impl<'r> OfferingRequirements<'r> {
    /// The offering keys' requirements in `reqs`.
    pub fn of(reqs: &'r Requirements) -> Self {
        OfferingRequirements {
            zone: reqs.get(labels::ZONE),
            capacity_type: reqs.get(labels::CAPACITY_TYPE),
            reservation_id: reqs.get(labels::aws::CAPACITY_RESERVATION_ID),
            reservation_type: reqs.get(labels::aws::CAPACITY_RESERVATION_TYPE),
        }
    }

    /// True when they say anything about capacity reservations.
    pub fn constrains_reservation(&self) -> bool {
        self.reservation_id.is_some() || self.reservation_type.is_some()
    }

    /// True when a node in `zone` satisfies the zone requirement.
    pub fn allows_zone(&self, zone: &str) -> bool {
        self.zone.is_none_or(|r| r.has(zone))
    }

    /// True when a node of `capacity_type` satisfies the capacity-type requirement.
    pub fn allows_capacity_type(&self, capacity_type: &str) -> bool {
        self.capacity_type.is_none_or(|r| r.has(capacity_type))
    }

    /// True when a node bought as `o` satisfies them.
    pub fn allow(&self, o: &Offering) -> bool {
        let on = |req: Option<&Requirement>, value: Option<&str>| {
            req.is_none_or(|r| match value {
                Some(v) => r.has(v),
                None => r.allows_absent(),
            })
        };
        let res = o.reservation.as_ref();
        on(self.zone, Some(&o.zone))
            && on(self.capacity_type, Some(&o.capacity_type))
            && on(self.reservation_id, res.map(|r| r.id.as_str()))
            && on(self.reservation_type, res.map(|r| r.reservation_type.as_str()))
    }
}

/// The label keys whose value depends on the offering, not the instance type.
pub const OFFERING_KEYS: [&str; 4] = [
    labels::ZONE,
    labels::CAPACITY_TYPE,
    labels::aws::CAPACITY_RESERVATION_ID,
    labels::aws::CAPACITY_RESERVATION_TYPE,
];

/// Raw facts about an instance type, independent of kubelet settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceTypeInfo {
    /// The instance type name, e.g. m5.large.
    pub name: String,
    /// Labels every node of this type carries (well-known and
    /// `karpenter.k8s.aws/*`), without zone or capacity type.
    pub labels: BTreeMap<String, String>,
    /// Raw capacity: cpu, memory (after the VM overhead), pods, ephemeral-storage
    /// and extended resources such as nvidia.com/gpu.
    pub capacity: Resources,
    /// Explicit allocatable (catalog files may give it); computed when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocatable: Option<Resources>,
    /// vCPUs, for kubelet podsPerCore and kube-reserved.
    pub vcpus: i64,
    /// Pods by ENI limits (the default maxPods).
    pub eni_max_pods: i64,
    /// Offerings by zone and capacity type.
    pub offerings: Vec<Offering>,
}

/// An instance type ready for scheduling under one EC2NodeClass.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceType {
    /// The instance type name.
    pub name: String,
    /// What a node of this type offers: its labels as `In` requirements,
    /// plus zone and capacity type over all its offerings.
    pub requirements: Requirements,
    /// Labels (without zone and capacity type).
    pub labels: BTreeMap<String, String>,
    /// Capacity as the node reports it.
    pub capacity: Resources,
    /// What pods may request: capacity minus kube/system reserved and eviction thresholds.
    pub allocatable: Resources,
    /// Offerings by zone and capacity type.
    pub offerings: Vec<Offering>,
}

impl InstanceType {
    /// The cheapest available offering that satisfies `reqs` (zone, capacity
    /// type, reservation), preferring reserved, then spot, then on-demand when
    /// several are allowed, as nodesmith's launches do.
    pub fn cheapest_offering(&self, reqs: &Requirements) -> Option<&Offering> {
        let wanted = OfferingRequirements::of(reqs);
        let ok = |o: &&Offering| o.available && wanted.allow(o);
        let cheapest = |ct: &str| {
            self.offerings
                .iter()
                .filter(ok)
                .filter(|o| o.capacity_type == ct)
                .min_by(|a, b| a.price.total_cmp(&b.price).then_with(|| a.zone.cmp(&b.zone)))
        };
        cheapest(labels::CAPACITY_RESERVED)
            .or_else(|| cheapest(labels::CAPACITY_SPOT))
            .or_else(|| cheapest(labels::CAPACITY_ON_DEMAND))
            .or_else(|| {
                self.offerings
                    .iter()
                    .filter(ok)
                    .min_by(|a, b| a.price.total_cmp(&b.price).then_with(|| a.zone.cmp(&b.zone)))
            })
    }
}

/// One offering: where and how an instance type is bought (unavailable
/// offerings are keyed by it).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OfferingKey {
    /// Instance type, e.g. m5.large.
    pub instance_type: String,
    /// Availability zone.
    pub zone: String,
    /// spot or on-demand.
    pub capacity_type: String,
}

impl OfferingKey {
    /// An offering key.
    pub fn new(instance_type: &str, zone: &str, capacity_type: &str) -> Self {
        OfferingKey {
            instance_type: instance_type.into(),
            zone: zone.into(),
            capacity_type: capacity_type.into(),
        }
    }
}

/// All instance types of a region.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Catalog {
    /// The region.
    pub region: String,
    /// Instance types, sorted by name.
    pub instance_types: Vec<InstanceTypeInfo>,
}

impl Catalog {
    /// Schedulable instance types for one EC2NodeClass's kubelet settings.
    pub fn resolve(&self, kubelet: Option<&KubeletConfiguration>) -> Vec<InstanceType> {
        self.resolve_with(kubelet, false)
    }

    /// Every type under kubelet settings, and with instance-store RAID0 when `raid0`.
    pub fn resolve_with(&self, kubelet: Option<&KubeletConfiguration>, raid0: bool) -> Vec<InstanceType> {
        self.resolve_for(kubelet, raid0, &[])
    }

    /// Every type for one EC2NodeClass: its kubelet settings, instance-store
    /// policy and the capacity reservations it selects (as `reserved` offerings).
    pub fn resolve_for(
        &self,
        kubelet: Option<&KubeletConfiguration>,
        raid0: bool,
        reservations: &[CapacityReservationStatus],
    ) -> Vec<InstanceType> {
        self.instance_types
            .iter()
            .map(|i| {
                let mine: Vec<&CapacityReservationStatus> =
                    reservations.iter().filter(|r| r.instance_type == i.name).collect();
                i.resolve_reserved(&self.region, kubelet, raid0, &mine)
            })
            .collect()
    }
}

impl InstanceTypeInfo {
    /// A type known only by its size and offerings, as synthetic catalogs
    /// (benchmarks, property tests) make them: amd64 Linux, allocatable equal
    /// to capacity, `max_pods` pods.
    pub fn synthetic(name: &str, cpu: i64, memory_mib: i64, max_pods: i64, offerings: Vec<Offering>) -> Self {
        let capacity = Resources::from_pairs([
            ("cpu", Quantity::from_units(cpu)),
            ("memory", Quantity::from_mib(memory_mib)),
            ("pods", Quantity::from_units(max_pods)),
        ]);
        let labels = [
            (labels::ARCH, "amd64".to_string()),
            (labels::OS, "linux".to_string()),
            (labels::aws::CPU, cpu.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        InstanceTypeInfo {
            name: name.into(),
            labels,
            allocatable: Some(capacity.clone()),
            capacity,
            vcpus: cpu,
            eni_max_pods: max_pods,
            offerings,
        }
    }

    /// The `reserved` offering a selected reservation of this type adds, when
    /// it has room.
    fn reserved_offering(&self, r: &CapacityReservationStatus) -> Option<Offering> {
        let available = r.available_instance_count.filter(|n| *n > 0)?;
        Some(Offering {
            reservation: Some(Reservation {
                id: r.id.clone(),
                reservation_type: r
                    .reservation_type
                    .clone()
                    .unwrap_or_else(|| RESERVATION_DEFAULT.to_string()),
                available,
            }),
            ..Offering::new(
                &r.availability_zone,
                labels::CAPACITY_RESERVED,
                self.reserved_price(&r.availability_zone),
            )
        })
    }

    /// What a reserved instance of this type in `zone` is priced at: its
    /// on-demand price there (else anywhere) × [`RESERVED_PRICE_FACTOR`].
    pub fn reserved_price(&self, zone: &str) -> f64 {
        let on_demand = |zone: Option<&str>| {
            self.offerings
                .iter()
                .filter(|o| o.capacity_type == labels::CAPACITY_ON_DEMAND && zone.is_none_or(|z| o.zone == z))
                .map(|o| o.price)
                .reduce(f64::min)
        };
        on_demand(Some(zone)).or_else(|| on_demand(None)).unwrap_or(0.0) * RESERVED_PRICE_FACTOR
    }

    /// This type under the given kubelet settings.
    pub fn resolve(&self, region: &str, kubelet: Option<&KubeletConfiguration>) -> InstanceType {
        self.resolve_with(region, kubelet, false)
    }

    /// This type under the given kubelet settings and instance-store policy.
    pub fn resolve_with(&self, region: &str, kubelet: Option<&KubeletConfiguration>, raid0: bool) -> InstanceType {
        self.resolve_reserved(region, kubelet, raid0, &[])
    }

    /// This type with the reservations of it an EC2NodeClass selects (those
    /// with room left become `reserved` offerings).
    fn resolve_reserved(
        &self,
        region: &str,
        kubelet: Option<&KubeletConfiguration>,
        raid0: bool,
        reservations: &[&CapacityReservationStatus],
    ) -> InstanceType {
        let (capacity, allocatable) = match &self.allocatable {
            Some(a) => allocatable::adjust_explicit(self, a, kubelet, raid0),
            None => allocatable::compute_with(self, kubelet, raid0),
        };
        let mut offerings = self.offerings.clone();
        offerings.extend(reservations.iter().filter_map(|r| self.reserved_offering(r)));
        let mut requirements = Requirements::from_labels(self.labels.iter());
        requirements.add(Requirement::in_values(labels::REGION, &[region]));
        let zones: Vec<&str> = offerings.iter().map(|o| o.zone.as_str()).collect();
        let cts: Vec<&str> = offerings.iter().map(|o| o.capacity_type.as_str()).collect();
        requirements.add(Requirement::in_values(labels::ZONE, &zones));
        requirements.add(Requirement::in_values(labels::CAPACITY_TYPE, &cts));
        let mut labels = self.labels.clone();
        labels.insert(labels::REGION.to_string(), region.to_string());
        InstanceType {
            name: self.name.clone(),
            requirements,
            labels,
            capacity,
            allocatable,
            offerings,
        }
    }
}

pub mod allocatable;
pub mod builtin;
pub mod ec2;

pub mod facts;
pub mod file;
pub mod price_list;
pub mod price_source;

pub use builtin::builtin;
pub use facts::{Ec2Facts, instance_type_info};

/// Why a catalog could not be built or read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CatalogError {
    /// A catalog document is not valid JSON or has a wrongly typed field.
    #[error("{path}: {message}")]
    Field {
        /// Where in the document (`instanceTypes[3].capacity.cpu`).
        path: String,
        /// What is wrong there.
        message: String,
    },
    /// EC2 facts about a type cannot make a schedulable instance type.
    #[error("instance type {name}: {message}")]
    Facts {
        /// The instance type.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// The built-in snapshot is corrupt (a build problem, not user input).
    #[error("built-in catalog: {0}")]
    Builtin(Box<CatalogError>),
    /// An EC2 API call failed.
    #[error("EC2 {operation}: {message}")]
    Ec2 {
        /// The API operation.
        operation: &'static str,
        /// The SDK's error, with its cause chain.
        message: String,
    },
}
