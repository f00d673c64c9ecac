//! CreateFleet (`instant`): building the overrides, reading the answer, and
//! deciding what to do about capacity errors. Decisions are pure.

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::{
    DefaultTargetCapacityType, FleetLaunchTemplateConfigRequest, FleetLaunchTemplateOverridesRequest,
    FleetLaunchTemplateSpecificationRequest, FleetOnDemandAllocationStrategy, FleetType, OnDemandOptionsRequest,
    ResourceType, SpotAllocationStrategy, SpotOptionsRequest, Tag, TagSpecification,
    TargetCapacitySpecificationRequest,
};
use sha2::{Digest, Sha256};

use super::errors::LaunchError;
use crate::catalog::Catalog;
use crate::labels::{CAPACITY_ON_DEMAND, CAPACITY_RESERVED, CAPACITY_SPOT};
use crate::nodeclaim::{AttemptOverride, LaunchAttempt, NodeClaim, ReservationRef};
use crate::nodeclass::subnet::Subnet;
use crate::state::OfferingKey;

/// Karpenter sends at most this many instance types to one CreateFleet.
pub const MAX_INSTANCE_TYPES: usize = 60;

/// One override: an offering, the subnet in its zone and the template for its AMI.
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    /// Instance type, zone, capacity type.
    pub offering: OfferingKey,
    /// The subnet used in that zone.
    pub subnet_id: String,
    /// The launch template (by AMI and capacity type).
    pub template: String,
    /// Hourly price, when the catalog knows it.
    pub price: Option<f64>,
    /// The capacity reservation of a `reserved` offering (its template targets it).
    pub reservation: Option<ReservationRef>,
}

/// What may be launched for one NodeClaim.
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    /// Instance types, cheapest first.
    pub instance_types: &'a [String],
    /// Zones the claim allows (None: any).
    pub zones: Option<&'a BTreeSet<String>>,
    /// Capacity types the claim allows.
    pub capacity_types: &'a [String],
    /// The subnet chosen per zone.
    pub subnets: &'a BTreeMap<String, Subnet>,
    /// The launch template per (instance type, capacity type); offerings without one are skipped.
    pub templates: &'a BTreeMap<(String, String), String>,
    /// The catalog: when present, only offerings it lists as available are used.
    pub catalog: Option<&'a Catalog>,
}

/// Every offering that may be tried, minus the unavailable ones (pure).
pub fn candidates(scope: &Scope, unavailable: &BTreeSet<OfferingKey>) -> Vec<Override> {
    let mut out = Vec::new();
    for t in scope.instance_types.iter().take(MAX_INSTANCE_TYPES) {
        let info = scope
            .catalog
            .and_then(|c| c.instance_types.iter().find(|i| &i.name == t));
        if scope.catalog.is_some() && info.is_none() {
            continue;
        }
        for (zone, subnet) in scope.subnets {
            if scope.zones.is_some_and(|z| !z.contains(zone)) {
                continue;
            }
            for ct in scope.capacity_types {
                let key = OfferingKey::new(t, zone, ct);
                if unavailable.contains(&key) {
                    continue;
                }
                let Some(template) = scope.templates.get(&(t.clone(), ct.clone())) else {
                    continue;
                };
                let price = match info {
                    Some(i) => match i
                        .offerings
                        .iter()
                        .find(|o| &o.zone == zone && &o.capacity_type == ct && o.available)
                    {
                        Some(o) => Some(o.price),
                        None => continue,
                    },
                    None => None,
                };
                out.push(Override {
                    offering: key,
                    subnet_id: subnet.id.clone(),
                    template: template.clone(),
                    price,
                    reservation: None,
                });
            }
        }
    }
    out
}

/// The capacity type to ask for: reserved capacity first (it is paid for
/// already), then spot, then on-demand, as allowed and possible (pure).
pub fn capacity_type(cands: &[Override]) -> Option<&'static str> {
    [CAPACITY_RESERVED, CAPACITY_SPOT, CAPACITY_ON_DEMAND]
        .into_iter()
        .find(|ct| cands.iter().any(|c| c.offering.capacity_type == *ct))
}

/// One CreateFleet call.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetPlan {
    /// spot, on-demand or reserved.
    pub capacity_type: &'static str,
    /// Reserved capacity bought as a capacity block (EC2 takes one market per call).
    pub capacity_block: bool,
    /// Overrides by launch template, in candidate order.
    pub overrides: BTreeMap<String, Vec<Override>>,
    /// Idempotency token ([`client_token`]): a retry of the same attempt sends
    /// the same request with the same token, and EC2 answers with the first
    /// call's fleet instead of launching again.
    pub client_token: String,
    /// The EC2NodeClass's `context` (a reserved-capacity or Outposts context), sent as CreateFleet's `Context`.
    pub context: Option<String>,
}

/// The ClientToken of a claim's `attempt`th CreateFleet request: a function of
/// the claim (its name and creation time, so a later claim of the same name
/// never gets an earlier one's fleet) and the attempt number only, never of
/// what the request holds (pure). At most 64 ASCII characters, as EC2 allows.
pub fn client_token(claim: &NodeClaim, attempt: u32) -> String {
    let mut h = Sha256::new();
    h.update(b"nodesmith/createfleet/v1|");
    h.update(claim.name.as_bytes());
    h.update(b"|");
    if let Some(created) = claim.timestamps.created {
        h.update(created.to_string().as_bytes());
    }
    h.update(format!("|{attempt}").as_bytes());
    hex::encode(h.finalize())[..64].to_string()
}

/// The call for `capacity_type` over `cands`, carrying `client_token` (pure).
/// Reserved capacity goes to ODCRs first, capacity blocks only when no ODCR
/// is a candidate, since one call buys in one market.
pub fn plan(client_token: String, cands: &[Override], capacity_type: &'static str) -> FleetPlan {
    let of_type = || cands.iter().filter(move |c| c.offering.capacity_type == capacity_type);
    let capacity_block = capacity_type == CAPACITY_RESERVED
        && of_type().all(|c| c.reservation.as_ref().is_some_and(ReservationRef::capacity_block));
    let mut overrides: BTreeMap<String, Vec<Override>> = BTreeMap::new();
    for c in of_type().filter(|c| {
        c.reservation
            .as_ref()
            .is_none_or(|r| r.capacity_block() == capacity_block)
    }) {
        overrides.entry(c.template.clone()).or_default().push(c.clone());
    }
    FleetPlan {
        capacity_type,
        capacity_block,
        overrides,
        client_token,
        context: None,
    }
}

fn static_capacity_type(ct: &str) -> &'static str {
    match ct {
        CAPACITY_SPOT => CAPACITY_SPOT,
        CAPACITY_RESERVED => CAPACITY_RESERVED,
        _ => CAPACITY_ON_DEMAND,
    }
}

impl FleetPlan {
    /// The plan sent with the class's `context` (pure).
    pub fn with_context(mut self, context: Option<String>) -> FleetPlan {
        self.context = context;
        self
    }

    /// The plan as the claim's attempt `number`, with the instance tags it sends (pure).
    pub fn to_attempt(&self, number: u32, tags: &BTreeMap<String, String>) -> LaunchAttempt {
        LaunchAttempt {
            number,
            client_token: self.client_token.clone(),
            capacity_type: self.capacity_type.to_string(),
            overrides: self
                .overrides
                .values()
                .flatten()
                .map(|c| AttemptOverride {
                    instance_type: c.offering.instance_type.clone(),
                    zone: c.offering.zone.clone(),
                    subnet_id: c.subnet_id.clone(),
                    template: c.template.clone(),
                    price: c.price,
                    capacity_reservation: c.reservation.clone(),
                })
                .collect(),
            tags: tags.clone(),
            concluded: false,
            context: self.context.clone(),
        }
    }

    /// The very plan a stored attempt sent (pure).
    pub fn from_attempt(a: &LaunchAttempt) -> FleetPlan {
        let ct = static_capacity_type(&a.capacity_type);
        let cands: Vec<Override> = a
            .overrides
            .iter()
            .map(|o| Override {
                offering: OfferingKey::new(&o.instance_type, &o.zone, ct),
                subnet_id: o.subnet_id.clone(),
                template: o.template.clone(),
                price: o.price,
                reservation: o.capacity_reservation.clone(),
            })
            .collect();
        plan(a.client_token.clone(), &cands, ct).with_context(a.context.clone())
    }

    /// The capacity type of an instance or error the answer reports with
    /// `lifecycle`: the call's own when it bought reserved capacity, which EC2
    /// reports as on-demand (or capacity-block) (pure).
    pub fn answered_capacity_type(&self, lifecycle: Option<&str>) -> String {
        match (self.capacity_type, lifecycle) {
            (CAPACITY_RESERVED, _) | (_, None) => self.capacity_type.to_string(),
            (_, Some(l)) => l.to_string(),
        }
    }

    /// Every override, in the order sent.
    pub fn candidates(&self) -> impl Iterator<Item = &Override> {
        self.overrides.values().flatten()
    }
}

/// How an EC2 error code is handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The offering has no capacity now: mark it unavailable, try the rest.
    Capacity,
    /// The account's spot limit: every spot offering is out, fall back to on-demand.
    SpotLimit,
    /// Transient (throttling, 5xx): retry later.
    Transient,
    /// Anything else: the request is wrong.
    Fatal,
}

/// Classifies an EC2 error code (pure).
pub fn classify(code: &str) -> ErrorClass {
    match code {
        "InsufficientInstanceCapacity"
        | "UnfulfillableCapacity"
        | "InsufficientCapacity"
        | "Unsupported"
        | "InsufficientFreeAddressesInSubnet"
        | "ReservationCapacityExceeded"
        | "VcpuLimitExceeded" => ErrorClass::Capacity,
        "MaxSpotInstanceCountExceeded" => ErrorClass::SpotLimit,
        "RequestLimitExceeded"
        | "Throttling"
        | "ThrottlingException"
        | "InternalError"
        | "InternalFailure"
        | "ServiceUnavailable"
        | "Unavailable" => ErrorClass::Transient,
        _ => ErrorClass::Fatal,
    }
}

/// An instance CreateFleet launched.
#[derive(Debug, Clone, PartialEq)]
pub struct Launched {
    /// Instance id.
    pub instance_id: String,
    /// Instance type.
    pub instance_type: String,
    /// spot or on-demand.
    pub capacity_type: String,
    /// Zone, if the answer named it.
    pub zone: Option<String>,
    /// Subnet, if the answer named it.
    pub subnet_id: Option<String>,
    /// The capacity reservation it runs in (known from the chosen override).
    pub capacity_reservation: Option<ReservationRef>,
}

/// One error entry of the answer.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetError {
    /// Instance type of the failed override.
    pub instance_type: Option<String>,
    /// Zone of the failed override.
    pub zone: Option<String>,
    /// Subnet of the failed override.
    pub subnet_id: Option<String>,
    /// spot or on-demand.
    pub capacity_type: Option<String>,
    /// EC2 error code.
    pub code: String,
    /// EC2 error message.
    pub message: String,
}

/// What CreateFleet answered.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FleetAnswer {
    /// Launched instances (at most one is asked for).
    pub instances: Vec<Launched>,
    /// Errors, one per failed override.
    pub errors: Vec<FleetError>,
}

/// The ruling on one CreateFleet answer: what the launch does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Ruling {
    /// Done.
    Launched(Launched),
    /// Mark these unavailable (with the EC2 code) and try again with the rest.
    Retry(Vec<(OfferingKey, String)>),
    /// Give up on this request for now (transient); SQS redelivers it.
    Transient(String),
    /// The request is wrong.
    Fatal(String, String),
}

/// Offerings an answer says are out of capacity, with the EC2 code (pure).
/// Real EC2 may launch from one override and report others as failed in the
/// same answer, so this is read whether or not an instance came back.
pub fn capacity_failures(plan: &FleetPlan, answer: &FleetAnswer) -> Vec<(OfferingKey, String)> {
    let all: Vec<&Override> = plan.overrides.values().flatten().collect();
    let zone_of = |e: &FleetError| {
        e.zone.clone().or_else(|| {
            e.subnet_id
                .as_ref()
                .and_then(|s| all.iter().find(|c| &c.subnet_id == s).map(|c| c.offering.zone.clone()))
        })
    };
    let mut mark = Vec::new();
    for e in &answer.errors {
        match classify(&e.code) {
            ErrorClass::Capacity => {
                let ct = plan.answered_capacity_type(e.capacity_type.as_deref());
                match (&e.instance_type, zone_of(e)) {
                    (Some(t), Some(z)) => mark.push((OfferingKey::new(t, &z, &ct), e.code.clone())),
                    // An error without an override names the whole call.
                    _ => mark.extend(all.iter().map(|c| (c.offering.clone(), e.code.clone()))),
                }
            }
            ErrorClass::SpotLimit => mark.extend(
                all.iter()
                    .filter(|c| c.offering.capacity_type == CAPACITY_SPOT)
                    .map(|c| (c.offering.clone(), e.code.clone())),
            ),
            ErrorClass::Transient | ErrorClass::Fatal => {}
        }
    }
    mark.sort();
    mark.dedup();
    mark
}

/// Decides what an answer means for a plan (pure).
pub fn decide(plan: &FleetPlan, answer: &FleetAnswer) -> Ruling {
    if let Some(i) = answer.instances.first() {
        return Ruling::Launched(i.clone());
    }
    for e in &answer.errors {
        match classify(&e.code) {
            ErrorClass::Transient => return Ruling::Transient(format!("{}: {}", e.code, e.message)),
            ErrorClass::Fatal => return Ruling::Fatal(e.code.clone(), e.message.clone()),
            ErrorClass::Capacity | ErrorClass::SpotLimit => {}
        }
    }
    let mark = capacity_failures(plan, answer);
    if mark.is_empty() {
        return Ruling::Transient("CreateFleet returned neither an instance nor an error".into());
    }
    Ruling::Retry(mark)
}

/// Calls CreateFleet for a plan; `tags` go on the instance and on the fleet
/// request itself (IAM may allow creating either only when tagged for the
/// cluster).
pub async fn create(
    ec2: &aws_sdk_ec2::Client,
    plan: &FleetPlan,
    tags: &BTreeMap<String, String>,
) -> Result<FleetAnswer, LaunchError> {
    let spot = plan.capacity_type == CAPACITY_SPOT;
    let target = match (plan.capacity_type, plan.capacity_block) {
        (CAPACITY_SPOT, _) => DefaultTargetCapacityType::Spot,
        (CAPACITY_RESERVED, true) => DefaultTargetCapacityType::CapacityBlock,
        _ => DefaultTargetCapacityType::OnDemand,
    };
    let mut req = ec2
        .create_fleet()
        .r#type(FleetType::Instant)
        .client_token(&plan.client_token)
        .set_context(plan.context.clone())
        .target_capacity_specification(
            TargetCapacitySpecificationRequest::builder()
                .total_target_capacity(1)
                .default_target_capacity_type(target)
                .build(),
        )
        .set_tag_specifications(Some(
            [ResourceType::Instance, ResourceType::Fleet]
                .into_iter()
                .map(|rt| {
                    TagSpecification::builder()
                        .resource_type(rt)
                        .set_tags(Some(
                            tags.iter()
                                .map(|(k, v)| Tag::builder().key(k).value(v).build())
                                .collect(),
                        ))
                        .build()
                })
                .collect(),
        ));
    req = if spot {
        req.spot_options(
            SpotOptionsRequest::builder()
                .allocation_strategy(SpotAllocationStrategy::PriceCapacityOptimized)
                .build(),
        )
    } else {
        req.on_demand_options(
            OnDemandOptionsRequest::builder()
                .allocation_strategy(FleetOnDemandAllocationStrategy::LowestPrice)
                .build(),
        )
    };
    for (template, cands) in &plan.overrides {
        let mut config = FleetLaunchTemplateConfigRequest::builder().launch_template_specification(
            FleetLaunchTemplateSpecificationRequest::builder()
                .launch_template_name(template)
                .version("$Latest")
                .build(),
        );
        for c in cands {
            config = config.overrides(
                FleetLaunchTemplateOverridesRequest::builder()
                    .instance_type(c.offering.instance_type.as_str().into())
                    .subnet_id(&c.subnet_id)
                    .availability_zone(&c.offering.zone)
                    .build(),
            );
        }
        req = req.launch_template_configs(config.build());
    }
    let out = match req.send().await {
        Ok(out) => out,
        Err(e) => {
            let (code, message) = (e.code().unwrap_or_default(), e.message().unwrap_or_default());
            if crate::nodeclass::profile::is_profile_refusal(code, message) {
                return Err(LaunchError::ProfileNotReady(format!("{code}: {message}")));
            }
            // A code that says the request is wrong (not throttling, not a
            // server fault, not capacity) is answered the same on every retry.
            if !code.is_empty() && classify(code) == ErrorClass::Fatal {
                return Err(LaunchError::Refused {
                    code: code.to_string(),
                    message: message.to_string(),
                });
            }
            return Err(LaunchError::aws("ec2:CreateFleet", e));
        }
    };
    let mut answer = FleetAnswer::default();
    for i in out.instances() {
        let ov = i.launch_template_and_overrides().and_then(|l| l.overrides());
        for id in i.instance_ids() {
            answer.instances.push(Launched {
                instance_id: id.clone(),
                instance_type: i.instance_type().map(|t| t.as_str().to_string()).unwrap_or_default(),
                capacity_type: plan.answered_capacity_type(i.lifecycle().map(|l| l.as_str())),
                zone: ov.and_then(|o| o.availability_zone()).map(str::to_string),
                subnet_id: ov.and_then(|o| o.subnet_id()).map(str::to_string),
                capacity_reservation: None,
            });
        }
    }
    for e in out.errors() {
        let ov = e.launch_template_and_overrides().and_then(|l| l.overrides());
        answer.errors.push(FleetError {
            instance_type: ov.and_then(|o| o.instance_type()).map(|t| t.as_str().to_string()),
            zone: ov.and_then(|o| o.availability_zone()).map(str::to_string),
            subnet_id: ov.and_then(|o| o.subnet_id()).map(str::to_string),
            capacity_type: e.lifecycle().map(|l| l.as_str().to_string()),
            code: e.error_code().unwrap_or("Unknown").to_string(),
            message: e.error_message().unwrap_or_default().to_string(),
        });
    }
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{InstanceTypeInfo, Offering};
    use crate::resources::Resources;

    fn subnets() -> BTreeMap<String, Subnet> {
        ["a", "b"]
            .iter()
            .map(|z| {
                (
                    z.to_string(),
                    Subnet {
                        id: format!("subnet-{z}"),
                        zone: z.to_string(),
                        available_ips: 100,
                        zone_id: None,
                    },
                )
            })
            .collect()
    }

    fn templates(types: &[&str]) -> BTreeMap<(String, String), String> {
        types
            .iter()
            .flat_map(|t| ["spot", "on-demand"].map(|ct| ((t.to_string(), ct.to_string()), format!("lt-{ct}"))))
            .collect()
    }

    fn keys(c: &[Override]) -> Vec<String> {
        c.iter().map(|c| c.offering.sort_key()).collect()
    }

    #[test]
    fn candidates_cross_types_zones_and_capacity_types_minus_unavailable() {
        let types = vec!["m5.large".to_string(), "c5.large".to_string(), "r5.large".to_string()];
        let cts = vec!["spot".to_string(), "on-demand".to_string()];
        let subnets = subnets();
        let tpl = templates(&["m5.large", "c5.large"]);
        let zones = BTreeSet::from(["a".to_string()]);
        let scope = Scope {
            instance_types: &types,
            zones: Some(&zones),
            capacity_types: &cts,
            subnets: &subnets,
            templates: &tpl,
            catalog: None,
        };
        let unavailable = BTreeSet::from([OfferingKey::new("m5.large", "a", "spot")]);
        assert_eq!(
            keys(&candidates(&scope, &unavailable)),
            vec!["on-demand#a#m5.large", "spot#a#c5.large", "on-demand#a#c5.large"]
        );
        let scope = Scope { zones: None, ..scope };
        assert_eq!(candidates(&scope, &BTreeSet::new()).len(), 8);
    }

    #[test]
    fn catalog_limits_offerings_and_gives_prices() {
        let info = InstanceTypeInfo {
            name: "m5.large".into(),
            labels: BTreeMap::new(),
            capacity: Resources::new(),
            allocatable: None,
            vcpus: 2,
            eni_max_pods: 29,
            offerings: vec![
                Offering {
                    zone: "a".into(),
                    capacity_type: "spot".into(),
                    price: 0.03,
                    available: true,
                    reservation: None,
                },
                Offering {
                    zone: "b".into(),
                    capacity_type: "spot".into(),
                    price: 0.04,
                    available: false,
                    reservation: None,
                },
                Offering {
                    zone: "b".into(),
                    capacity_type: "on-demand".into(),
                    price: 0.096,
                    available: true,
                    reservation: None,
                },
            ],
        };
        let catalog = Catalog {
            region: "r".into(),
            instance_types: vec![info],
        };
        let types = vec!["m5.large".to_string(), "unknown.large".to_string()];
        let cts = vec!["spot".to_string(), "on-demand".to_string()];
        let subnets = subnets();
        let tpl = templates(&["m5.large", "unknown.large"]);
        let scope = Scope {
            instance_types: &types,
            zones: None,
            capacity_types: &cts,
            subnets: &subnets,
            templates: &tpl,
            catalog: Some(&catalog),
        };
        let got = candidates(&scope, &BTreeSet::new());
        assert_eq!(keys(&got), vec!["spot#a#m5.large", "on-demand#b#m5.large"]);
        assert_eq!(
            got.iter().map(|c| c.price).collect::<Vec<_>>(),
            vec![Some(0.03), Some(0.096)]
        );
    }

    fn cand(t: &str, z: &str, ct: &str) -> Override {
        Override {
            offering: OfferingKey::new(t, z, ct),
            subnet_id: format!("subnet-{z}"),
            template: "lt".into(),
            price: None,
            reservation: None,
        }
    }

    fn reserved(t: &str, z: &str, id: &str, capacity_block: bool) -> Override {
        Override {
            template: format!("lt-{id}"),
            reservation: Some(ReservationRef {
                id: id.into(),
                reservation_type: if capacity_block { "capacity-block" } else { "default" }.into(),
            }),
            ..cand(t, z, CAPACITY_RESERVED)
        }
    }

    #[test]
    fn reserved_first_odcrs_before_capacity_blocks_and_round_trips() {
        let cands = vec![
            cand("m5.large", "a", "spot"),
            reserved("m5.large", "a", "cr-1", false),
            reserved("m5.large", "b", "cr-2", true),
        ];
        assert_eq!(capacity_type(&cands), Some(CAPACITY_RESERVED));
        let p = plan("tok".into(), &cands, CAPACITY_RESERVED);
        assert!(!p.capacity_block);
        let ids: Vec<&str> = p
            .candidates()
            .filter_map(|c| c.reservation.as_ref().map(|r| r.id.as_str()))
            .collect();
        assert_eq!(ids, ["cr-1"], "one market per call: the ODCR");
        let blocks = plan("tok".into(), &cands[2..], CAPACITY_RESERVED);
        assert!(blocks.capacity_block);
        let a = blocks.to_attempt(1, &BTreeMap::new());
        let back: LaunchAttempt = serde_json::from_str(&serde_json::to_string(&a).unwrap()).unwrap();
        assert_eq!(FleetPlan::from_attempt(&back), blocks);
        // A reservation out of room is a reserved offering that failed, whatever
        // lifecycle EC2 gives the error.
        let answer = FleetAnswer {
            instances: vec![],
            errors: vec![FleetError {
                capacity_type: Some("on-demand".into()),
                ..err(Some("m5.large"), Some("a"), None, "ReservationCapacityExceeded")
            }],
        };
        assert_eq!(
            decide(&p, &answer),
            Ruling::Retry(vec![(
                OfferingKey::new("m5.large", "a", CAPACITY_RESERVED),
                "ReservationCapacityExceeded".into()
            )])
        );
    }

    #[test]
    fn spot_first_then_on_demand() {
        assert_eq!(
            capacity_type(&[cand("m5.large", "a", "on-demand"), cand("m5.large", "a", "spot")]),
            Some("spot")
        );
        assert_eq!(capacity_type(&[cand("m5.large", "a", "on-demand")]), Some("on-demand"));
        assert_eq!(capacity_type(&[]), None);
    }

    #[test]
    fn plan_takes_one_capacity_type_and_carries_the_token() {
        let cands = vec![
            cand("m5.large", "a", "spot"),
            cand("m5.large", "a", "on-demand"),
            cand("c5.large", "b", "spot"),
        ];
        let p = plan("t".into(), &cands, "spot");
        assert_eq!(p.overrides["lt"].len(), 2);
        assert_eq!(p.client_token, "t");
    }

    #[test]
    fn the_token_depends_on_the_claim_and_the_attempt_only() {
        let created: jiff::Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let mut c = NodeClaim::pending("claim-1", "default", "default");
        c.timestamps.created = Some(created);
        let t = client_token(&c, 1);
        assert_eq!(t.len(), 64);
        assert!(t.bytes().all(|b| b.is_ascii_hexdigit()));
        // Whatever the request holds (subnets, AMIs, unavailable offerings read just
        // before), and whatever else the claim went through, the token is the same.
        let mut moved = c.clone();
        moved.instance_type_options = vec!["c5.large".into()];
        moved.version = 7;
        assert_eq!(client_token(&moved, 1), t);
        assert_ne!(client_token(&c, 2), t, "a new attempt, a new token");
        let other = NodeClaim {
            name: "claim-2".into(),
            ..c.clone()
        };
        assert_ne!(client_token(&other, 1), t);
        let mut later = c.clone();
        later.timestamps.created = Some(created + jiff::SignedDuration::from_secs(60));
        assert_ne!(client_token(&later, 1), t, "a later claim of the same name");
    }

    #[test]
    fn an_attempt_round_trips_to_the_same_request() {
        let cands = vec![
            cand("m5.large", "a", "spot"),
            cand("c5.large", "b", "spot"),
            cand("m5.large", "a", "on-demand"),
        ];
        let p = plan("tok".into(), &cands, "spot");
        let tags = BTreeMap::from([("k".to_string(), "v".to_string())]);
        let a = p.to_attempt(3, &tags);
        assert_eq!((a.number, a.client_token.as_str(), a.concluded), (3, "tok", false));
        assert_eq!(a.overrides.len(), 2);
        let json = serde_json::to_string(&a).unwrap();
        let back: LaunchAttempt = serde_json::from_str(&json).unwrap();
        assert_eq!(FleetPlan::from_attempt(&back), p);
        assert_eq!(back.tags, tags);
        // A repeat sends the same Context as the first call.
        let with = p.clone().with_context(Some("ctx-1".into()));
        let back: LaunchAttempt =
            serde_json::from_str(&serde_json::to_string(&with.to_attempt(3, &tags)).unwrap()).unwrap();
        assert_eq!(FleetPlan::from_attempt(&back).context.as_deref(), Some("ctx-1"));
        assert!(!json.contains("context"), "unset, stored attempts are unchanged");
    }

    #[test]
    fn error_classes() {
        let cases = [
            ("InsufficientInstanceCapacity", ErrorClass::Capacity),
            ("UnfulfillableCapacity", ErrorClass::Capacity),
            ("Unsupported", ErrorClass::Capacity),
            ("MaxSpotInstanceCountExceeded", ErrorClass::SpotLimit),
            ("RequestLimitExceeded", ErrorClass::Transient),
            ("InternalError", ErrorClass::Transient),
            ("InvalidParameterValue", ErrorClass::Fatal),
            ("InvalidLaunchTemplateName.NotFoundException", ErrorClass::Fatal),
        ];
        for (code, want) in cases {
            assert_eq!(classify(code), want, "{code}");
        }
    }

    fn err(t: Option<&str>, z: Option<&str>, subnet: Option<&str>, code: &str) -> FleetError {
        FleetError {
            instance_type: t.map(String::from),
            zone: z.map(String::from),
            subnet_id: subnet.map(String::from),
            capacity_type: Some("spot".into()),
            code: code.into(),
            message: "m".into(),
        }
    }

    #[test]
    fn decisions_from_answers() {
        let cands = vec![cand("m5.large", "a", "spot"), cand("c5.large", "b", "spot")];
        let p = plan("c".into(), &cands, "spot");
        let ice = "InsufficientInstanceCapacity";
        let launched = Launched {
            instance_id: "i-1".into(),
            instance_type: "m5.large".into(),
            capacity_type: "spot".into(),
            zone: None,
            subnet_id: None,
            capacity_reservation: None,
        };
        let cases: Vec<(FleetAnswer, Ruling)> = vec![
            (
                FleetAnswer {
                    instances: vec![launched.clone()],
                    errors: vec![err(Some("c5.large"), Some("b"), None, ice)],
                },
                Ruling::Launched(launched),
            ),
            (
                FleetAnswer {
                    instances: vec![],
                    errors: vec![
                        err(Some("m5.large"), Some("a"), None, ice),
                        err(Some("c5.large"), None, Some("subnet-b"), ice),
                    ],
                },
                Ruling::Retry(vec![
                    (OfferingKey::new("c5.large", "b", "spot"), ice.into()),
                    (OfferingKey::new("m5.large", "a", "spot"), ice.into()),
                ]),
            ),
            (
                FleetAnswer {
                    instances: vec![],
                    errors: vec![err(None, None, None, "MaxSpotInstanceCountExceeded")],
                },
                Ruling::Retry(vec![
                    (
                        OfferingKey::new("c5.large", "b", "spot"),
                        "MaxSpotInstanceCountExceeded".into(),
                    ),
                    (
                        OfferingKey::new("m5.large", "a", "spot"),
                        "MaxSpotInstanceCountExceeded".into(),
                    ),
                ]),
            ),
            (
                FleetAnswer {
                    instances: vec![],
                    errors: vec![err(None, None, None, "UnfulfillableCapacity")],
                },
                Ruling::Retry(vec![
                    (
                        OfferingKey::new("c5.large", "b", "spot"),
                        "UnfulfillableCapacity".into(),
                    ),
                    (
                        OfferingKey::new("m5.large", "a", "spot"),
                        "UnfulfillableCapacity".into(),
                    ),
                ]),
            ),
            (
                FleetAnswer {
                    instances: vec![],
                    errors: vec![err(None, None, None, "InvalidParameterValue")],
                },
                Ruling::Fatal("InvalidParameterValue".into(), "m".into()),
            ),
            (
                FleetAnswer {
                    instances: vec![],
                    errors: vec![err(None, None, None, "InternalError")],
                },
                Ruling::Transient("InternalError: m".into()),
            ),
            (
                FleetAnswer::default(),
                Ruling::Transient("CreateFleet returned neither an instance nor an error".into()),
            ),
        ];
        for (answer, want) in cases {
            assert_eq!(decide(&p, &answer), want, "{answer:?}");
        }
    }

    #[test]
    fn capacity_failures_are_read_even_when_an_instance_came_back() {
        let cands = vec![cand("m5.large", "a", "spot"), cand("c5.large", "b", "spot")];
        let p = plan("c".into(), &cands, "spot");
        let launched = Launched {
            instance_id: "i-1".into(),
            instance_type: "c5.large".into(),
            capacity_type: "spot".into(),
            zone: None,
            subnet_id: None,
            capacity_reservation: None,
        };
        let answer = FleetAnswer {
            instances: vec![launched],
            errors: vec![
                err(Some("m5.large"), Some("a"), None, "InsufficientInstanceCapacity"),
                err(None, None, None, "InvalidParameterValue"),
            ],
        };
        assert_eq!(
            capacity_failures(&p, &answer),
            vec![(
                OfferingKey::new("m5.large", "a", "spot"),
                "InsufficientInstanceCapacity".to_string()
            )]
        );
    }
}
