//! ARC zonal shift: the zones AWS Application Recovery Controller is shifting
//! the cluster's traffic away from, read with `arc-zonal-shift:GetManagedResource`
//! on the cluster's ARN (EKS registers clusters with ARC), as Karpenter does
//! behind `ENABLE_ZONAL_SHIFT`. While a shift is active no new capacity is
//! planned in that zone, by provisioning or by consolidation's replacements
//! (the solver drops its offerings: [`crate::scheduling::SolveInput::shifted_zones`]).
//!
//! Reading ARC never blocks capacity: an unreadable answer is logged and
//! counts as no shift. ARC names zones by id (`use1-az1`), offerings by name
//! (`us-east-1a`); the EC2NodeClasses' resolved subnets map one to the other.

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_arczonalshift::error::SdkError;
use aws_sdk_arczonalshift::operation::get_managed_resource::GetManagedResourceError;
use aws_sdk_arczonalshift::types::{AppliedStatus, AutoshiftAppliedStatus};
use jiff::Timestamp;

use k8s_openapi::api::core::v1::ObjectReference;

use crate::apis::{EC2NodeClass, NodePool};
use crate::kubernetes::EventSpec;
use crate::kubernetes::events::EventType;
use crate::scheduling::ExistingNode;
use crate::settings::{SettingError, Settings};

/// Karpenter's switch for zonal shift handling (off by default, as Karpenter's).
pub const ENABLE_SETTING: &str = "ENABLE_ZONAL_SHIFT";
/// The cluster's ARN, ARC's identifier of the managed resource.
pub const CLUSTER_ARN_SETTING: &str = "NODESMITH_CLUSTER_ARN";

/// One shift ARC reports on the resource, as plain data.
#[derive(Debug, Clone, PartialEq)]
pub struct Shift {
    /// The zone id traffic is moved away from (`use1-az1`).
    pub away_from: String,
    /// ARC applies it now (`APPLIED`; with overlapping shifts only one applies).
    pub applied: bool,
    /// When it ends; `None` for an autoshift, which lasts while ARC keeps it.
    pub expires: Option<Timestamp>,
}

/// The zone ids shifted away from at `now`: applied shifts that have not
/// expired (Karpenter's test; ARC lists only active shifts, but an answer
/// read a while ago may hold one that ended since) (pure).
pub fn active(shifts: &[Shift], now: Timestamp) -> BTreeSet<String> {
    shifts
        .iter()
        .filter(|s| s.applied && s.expires.is_none_or(|e| e > now))
        .map(|s| s.away_from.clone())
        .collect()
}

/// Zone names by zone id, from the classes' resolved subnets and the nodes'
/// `topology.k8s.aws/zone-id` labels (pure).
pub fn zone_ids(classes: &[EC2NodeClass], nodes: &[ExistingNode]) -> BTreeMap<String, String> {
    let mut by_id: BTreeMap<String, String> = BTreeMap::new();
    for s in classes
        .iter()
        .filter_map(|c| c.status.as_ref())
        .flat_map(|st| st.subnets.iter())
    {
        if let Some(id) = &s.zone_id {
            by_id.insert(id.clone(), s.zone.clone());
        }
    }
    for n in nodes {
        let labels = n.node.metadata.labels.as_ref();
        let zone = labels.and_then(|l| l.get(crate::labels::ZONE));
        let id = labels.and_then(|l| l.get(crate::labels::ZONE_ID));
        if let (Some(zone), Some(id)) = (zone, id) {
            by_id.insert(id.clone(), zone.clone());
        }
    }
    by_id
}

/// The zone names of the shifted zone `ids`, by the classes' resolved subnets
/// and the nodes' `topology.k8s.aws/zone-id` labels; a value that already is
/// a zone name stays (pure).
pub fn zone_names(ids: &BTreeSet<String>, classes: &[EC2NodeClass], nodes: &[ExistingNode]) -> BTreeSet<String> {
    if ids.is_empty() {
        return BTreeSet::new();
    }
    let by_id = zone_ids(classes, nodes);
    let names: BTreeSet<&str> = classes
        .iter()
        .filter_map(|c| c.status.as_ref())
        .flat_map(|st| st.subnets.iter())
        .map(|s| s.zone.as_str())
        .collect();
    ids.iter()
        .filter_map(|id| by_id.get(id).cloned().or(names.get(id.as_str()).map(|n| n.to_string())))
        .collect()
}

/// Karpenter's event reason on a NodePool when a zone it launches in is shifted away.
pub const SHIFT_ACTIVE: &str = "ZonalShiftActive";
/// Karpenter's event reason on a NodePool when that zone's shift has ended.
pub const SHIFT_CLEARED: &str = "ZonalShiftCleared";

/// True when the pool may launch in zone `name` (`id`): its requirements
/// allow the zone and its class has a subnet there.
fn pool_reaches(pool: &NodePool, classes: &[EC2NodeClass], id: &str, name: &str) -> bool {
    let class = &pool.spec.template.spec.node_class_ref.name;
    let has_subnet = classes
        .iter()
        .filter(|c| c.metadata.name.as_deref() == Some(class.as_str()))
        .filter_map(|c| c.status.as_ref())
        .flat_map(|st| st.subnets.iter())
        .any(|s| s.zone == name);
    let allowed = pool.requirements().is_ok_and(|r| {
        r.get(crate::labels::ZONE).is_none_or(|z| z.has(name))
            && r.get(crate::labels::ZONE_ID).is_none_or(|z| z.has(id))
    });
    has_subnet && allowed
}

/// The NodePool events for zone ids whose shift `started` or `ended` since
/// the last pass: one per NodePool that may launch in the zone, as Karpenter
/// emits them on a change only (pure).
pub fn pool_events(
    pools: &[NodePool],
    classes: &[EC2NodeClass],
    zones: &BTreeMap<String, String>,
    started: &BTreeSet<String>,
    ended: &BTreeSet<String>,
) -> Vec<EventSpec> {
    let mut out = Vec::new();
    for pool in pools {
        let object = ObjectReference {
            api_version: Some("karpenter.sh/v1".into()),
            kind: Some("NodePool".into()),
            name: pool.metadata.name.clone(),
            uid: pool.metadata.uid.clone(),
            ..Default::default()
        };
        for (ids, active) in [(started, true), (ended, false)] {
            for id in ids {
                let Some(name) = zones.get(id) else { continue };
                if !pool_reaches(pool, classes, id, name) {
                    continue;
                }
                out.push(if active {
                    EventSpec {
                        object: object.clone(),
                        type_: EventType::Warning,
                        reason: SHIFT_ACTIVE.into(),
                        message: format!(
                            "ARC shifts traffic away from zone {name} ({id}): no new nodes of this NodePool there until it ends"
                        ),
                    }
                } else {
                    EventSpec {
                        object: object.clone(),
                        type_: EventType::Normal,
                        reason: SHIFT_CLEARED.into(),
                        message: format!("the zonal shift away from zone {name} ({id}) has ended: new nodes may launch there again"),
                    }
                });
            }
        }
    }
    out
}

/// Why ARC could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ZonalShiftError {
    /// GetManagedResource failed (the cluster is not registered with ARC,
    /// access is denied, the service is unreachable ...).
    #[error("arc-zonal-shift:GetManagedResource {resource}")]
    Read {
        /// The resource asked about.
        resource: String,
        /// The SDK's error.
        #[source]
        source: Box<SdkError<GetManagedResourceError>>,
    },
}

/// Reads ARC's shifts for the cluster.
#[derive(Debug, Clone)]
pub struct ZonalShifts {
    client: aws_sdk_arczonalshift::Client,
    cluster_arn: String,
}

impl ZonalShifts {
    /// A reader for the cluster of that ARN.
    pub fn new(client: aws_sdk_arczonalshift::Client, cluster_arn: impl Into<String>) -> Self {
        ZonalShifts {
            client,
            cluster_arn: cluster_arn.into(),
        }
    }

    /// The cluster's ARN when `ENABLE_ZONAL_SHIFT` is true (then
    /// `NODESMITH_CLUSTER_ARN` is required); `None` when it is off.
    pub fn cluster_arn(settings: &Settings<impl Fn(&str) -> Option<String>>) -> Result<Option<String>, SettingError> {
        if settings.parsed(ENABLE_SETTING, false)? {
            settings.required(CLUSTER_ARN_SETTING).map(Some)
        } else {
            Ok(None)
        }
    }

    /// A reader built from the environment when `ENABLE_ZONAL_SHIFT` is true;
    /// `None` when zonal shift handling is off.
    pub fn from_env(sdk: &aws_config::SdkConfig) -> Result<Option<Self>, SettingError> {
        Ok(Self::cluster_arn(&Settings::from_env())?
            .map(|arn| ZonalShifts::new(aws_sdk_arczonalshift::Client::new(sdk), arn)))
    }

    /// The shifts ARC reports on the cluster: its zonal shifts and its autoshifts.
    pub async fn read(&self) -> Result<Vec<Shift>, ZonalShiftError> {
        let out = self
            .client
            .get_managed_resource()
            .resource_identifier(&self.cluster_arn)
            .send()
            .await
            .map_err(|e| ZonalShiftError::Read {
                resource: self.cluster_arn.clone(),
                source: Box::new(e),
            })?;
        let mut shifts: Vec<Shift> = out
            .zonal_shifts()
            .iter()
            .map(|s| Shift {
                away_from: s.away_from().to_string(),
                applied: *s.applied_status() == AppliedStatus::Applied,
                expires: Timestamp::from_second(s.expiry_time().secs()).ok(),
            })
            .collect();
        shifts.extend(out.autoshifts().iter().map(|a| Shift {
            away_from: a.away_from().to_string(),
            applied: *a.applied_status() == AutoshiftAppliedStatus::Applied,
            expires: None,
        }));
        Ok(shifts)
    }

    /// The zone ids shifted away from at `now`; none when ARC cannot be read
    /// (logged): a zonal shift must never stop provisioning altogether.
    pub async fn away_from(&self, now: Timestamp) -> BTreeSet<String> {
        match self.read().await {
            Ok(shifts) => {
                let away = active(&shifts, now);
                if !away.is_empty() {
                    tracing::info!(zone_ids = ?away, "zonal shift active: no new capacity in these zones");
                }
                away
            }
            Err(e) => {
                tracing::warn!(error = %crate::telemetry::causes(&e), "zonal shifts not read; planning as if none were active");
                BTreeSet::new()
            }
        }
    }
}

/// The zone names shifted away from at `now`, for a snapshot's classes and
/// nodes; none when zonal shift handling is off.
pub async fn shifted_zones(
    reader: Option<&ZonalShifts>,
    now: Timestamp,
    classes: &[EC2NodeClass],
    nodes: &[ExistingNode],
) -> BTreeSet<String> {
    let Some(reader) = reader else {
        return BTreeSet::new();
    };
    let ids = reader.away_from(now).await;
    let names = zone_names(&ids, classes, nodes);
    if names.len() < ids.len() {
        // Until the sweep has resolved a class's subnets (or a node there
        // carries its zone id), a zone id cannot be told by name.
        tracing::warn!(zone_ids = ?ids, zones = ?names, "a shifted zone id matches no known zone; offerings there stay in use");
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn only_applied_unexpired_shifts_are_active() {
        let now = at("2026-11-27T12:00:00Z");
        let shifts = [
            Shift {
                away_from: "use1-az1".into(),
                applied: true,
                expires: Some(at("2026-11-27T13:00:00Z")),
            },
            Shift {
                away_from: "use1-az2".into(),
                applied: true,
                expires: Some(at("2026-11-27T11:59:59Z")),
            },
            Shift {
                away_from: "use1-az3".into(),
                applied: false,
                expires: Some(at("2026-11-27T13:00:00Z")),
            },
            Shift {
                away_from: "use1-az4".into(),
                applied: true,
                expires: None,
            },
        ];
        assert_eq!(
            active(&shifts, now),
            BTreeSet::from(["use1-az1".to_string(), "use1-az4".to_string()])
        );
        assert!(
            active(&shifts[..1], at("2026-11-27T13:00:00Z")).is_empty(),
            "ends at its expiry"
        );
    }

    #[test]
    fn handling_is_off_unless_enabled_and_then_needs_the_cluster_arn() {
        let with = |vars: &'static [(&'static str, &'static str)]| {
            Settings::new(move |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()))
        };
        assert_eq!(
            ZonalShifts::cluster_arn(&with(&[])).unwrap(),
            None,
            "Karpenter's default: off"
        );
        assert_eq!(
            ZonalShifts::cluster_arn(&with(&[(ENABLE_SETTING, "false"), (CLUSTER_ARN_SETTING, "arn")])).unwrap(),
            None
        );
        assert_eq!(
            ZonalShifts::cluster_arn(&with(&[(ENABLE_SETTING, "true"), (CLUSTER_ARN_SETTING, "arn:x")])).unwrap(),
            Some("arn:x".to_string())
        );
        assert_eq!(
            ZonalShifts::cluster_arn(&with(&[(ENABLE_SETTING, "true")]))
                .unwrap_err()
                .name,
            CLUSTER_ARN_SETTING
        );
        assert_eq!(
            ZonalShifts::cluster_arn(&with(&[(ENABLE_SETTING, "yes")]))
                .unwrap_err()
                .name,
            ENABLE_SETTING
        );
    }

    fn class(name: &str, subnets: serde_json::Value) -> EC2NodeClass {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass",
            "metadata": {"name": name},
            "spec": {"role": "r", "amiSelectorTerms": [{"alias": "al2023@latest"}],
                     "subnetSelectorTerms": [{"id": "subnet-1"}], "securityGroupSelectorTerms": [{"id": "sg-1"}]},
            "status": {"subnets": subnets}
        }))
        .unwrap()
    }

    fn pool(name: &str, class: &str, zones: Option<&[&str]>) -> NodePool {
        let reqs = match zones {
            Some(z) => serde_json::json!([{"key": "topology.kubernetes.io/zone", "operator": "In", "values": z}]),
            None => serde_json::json!([]),
        };
        serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name, "uid": format!("uid-{name}")},
            "spec": {"template": {"spec": {
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": class},
                "requirements": reqs}}}
        }))
        .unwrap()
    }

    #[test]
    fn a_shift_beginning_or_ending_is_told_to_each_nodepool_that_launches_there() {
        let classes = [
            class(
                "default",
                serde_json::json!([
                    {"id": "subnet-a", "zone": "us-east-1a", "zoneID": "use1-az6"},
                    {"id": "subnet-b", "zone": "us-east-1b", "zoneID": "use1-az1"},
                    {"id": "subnet-c", "zone": "us-east-1c", "zoneID": "use1-az2"}]),
            ),
            class(
                "narrow",
                serde_json::json!([{"id": "subnet-c", "zone": "us-east-1c", "zoneID": "use1-az2"}]),
            ),
        ];
        let pools = [
            pool("default", "default", None),
            pool("in-c", "default", Some(&["us-east-1c"])),
            pool("narrow", "narrow", None),
        ];
        let zones = zone_ids(&classes, &[]);
        let started = BTreeSet::from(["use1-az1".to_string()]);
        let ended = BTreeSet::from(["use1-az6".to_string()]);
        let got: Vec<(String, String, String)> = pool_events(&pools, &classes, &zones, &started, &ended)
            .into_iter()
            .map(|e| (e.object.name.unwrap_or_default(), e.reason, e.message))
            .collect();
        assert_eq!(
            got,
            [
                (
                    "default".to_string(),
                    SHIFT_ACTIVE.to_string(),
                    "ARC shifts traffic away from zone us-east-1b (use1-az1): no new nodes of this NodePool there until it ends"
                        .to_string()
                ),
                (
                    "default".to_string(),
                    SHIFT_CLEARED.to_string(),
                    "the zonal shift away from zone us-east-1a (use1-az6) has ended: new nodes may launch there again"
                        .to_string()
                ),
            ],
            "in-c and narrow never launch in zones a or b"
        );
        assert!(pool_events(&pools, &classes, &zones, &BTreeSet::new(), &BTreeSet::new()).is_empty());
    }

    #[test]
    fn zone_ids_map_to_names_through_the_classes_subnets() {
        let class: EC2NodeClass = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass",
            "metadata": {"name": "default"},
            "spec": {"role": "r", "amiSelectorTerms": [{"alias": "al2023@latest"}],
                     "subnetSelectorTerms": [{"id": "subnet-1"}], "securityGroupSelectorTerms": [{"id": "sg-1"}]},
            "status": {"subnets": [
                {"id": "subnet-1", "zone": "us-east-1a", "zoneID": "use1-az6"},
                {"id": "subnet-2", "zone": "us-east-1b", "zoneID": "use1-az1"}]}
        }))
        .unwrap();
        let ids = BTreeSet::from(["use1-az1".to_string(), "use1-az9".to_string(), "us-east-1a".to_string()]);
        assert_eq!(
            zone_names(&ids, &[class], &[]),
            BTreeSet::from(["us-east-1a".to_string(), "us-east-1b".to_string()]),
            "az1 is b; an unknown id is dropped; a name stays"
        );
    }
}
