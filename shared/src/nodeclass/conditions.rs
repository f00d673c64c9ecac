//! An EC2NodeClass's status from what its selectors resolve to (pure), in
//! Karpenter v1's shape: `subnets`, `securityGroups`, `amis` (with the
//! requirements of the instance types each serves), `instanceProfile`, and the
//! conditions `SubnetsReady`, `SecurityGroupsReady`, `AMIsReady`,
//! `InstanceProfileReady` and `Ready` (True only when all four are), and
//! `LaunchSucceeded` once EC2 refused one of its launches for good. A
//! condition keeps its `lastTransitionTime` while its status stays, so a class
//! whose resolution does not change computes the same status run after run and
//! the sweep writes nothing.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;

use super::ami::AmiKey;
use super::placementgroup::PLACEMENT_GROUP_NOT_FOUND;
use super::resolved::{
    AMI_NOT_FOUND, NO_AMIS, NO_SECURITY_GROUPS, NO_SUBNETS, ResolvedClass, SECURITY_GROUPS_NOT_FOUND, SUBNETS_NOT_FOUND,
};
use crate::apis::ec2nodeclass::condition_types::{
    AMIS_READY, CAPACITY_RESERVATIONS_READY, INSTANCE_PROFILE_READY, LAUNCH_SUCCEEDED, PLACEMENT_GROUP_READY, READY,
    SECURITY_GROUPS_READY, SUBNETS_READY,
};
use crate::apis::ec2nodeclass::{
    AmiStatus, Condition, EC2NodeClassStatus, SecurityGroupStatus, StatusRequirement, SubnetStatus,
};
use crate::labels;

/// The reason of `Ready=False` for a class that fails validation.
pub const VALIDATION_FAILED: &str = "ValidationFailed";
/// The reason of `LaunchSucceeded=False`.
pub const LAUNCH_REFUSED: &str = "LaunchRefused";
/// The reason of `InstanceProfileReady=False`.
pub const INSTANCE_PROFILE_NOT_FOUND: &str = "InstanceProfileNotFound";

/// `True` or `False`, with the reason and message of a False.
type Outcome = Result<(), (String, String)>;

/// The status `facts` call for, given the class's `previous` status and
/// `generation`, at `now` (pure).
pub fn compute(
    facts: &ResolvedClass,
    previous: Option<&EC2NodeClassStatus>,
    generation: Option<i64>,
    now: Timestamp,
) -> EC2NodeClassStatus {
    let mut subnets: Vec<SubnetStatus> = facts
        .subnets
        .iter()
        .map(|s| SubnetStatus {
            id: s.id.clone(),
            zone: s.zone.clone(),
            zone_id: s.zone_id.clone(),
        })
        .collect();
    // By zone and id, not by free IPs (which move all the time and would mean a write a run).
    subnets.sort_by(|a, b| (&a.zone, &a.id).cmp(&(&b.zone, &b.id)));
    subnets.dedup();
    let security_groups: Vec<SecurityGroupStatus> = facts
        .security_groups
        .iter()
        .map(|g| SecurityGroupStatus {
            id: g.id.clone(),
            name: Some(g.name.clone()).filter(|n| !n.is_empty()),
        })
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let amis = amis(&facts.amis, &facts.ami_names);

    let found = |ok: bool, reason: &str, message: &str| -> Outcome {
        if ok {
            Ok(())
        } else {
            Err((reason.to_string(), message.to_string()))
        }
    };
    let ami_outcome = match &facts.ami_problem {
        Some((reason, message)) => Err((reason.clone(), message.clone())),
        None => found(!amis.is_empty(), AMI_NOT_FOUND, NO_AMIS),
    };
    let placement = facts.placement_group_problem.as_ref().map(|why| {
        (
            PLACEMENT_GROUP_READY,
            Err((PLACEMENT_GROUP_NOT_FOUND.to_string(), why.clone())),
        )
    });
    let placement = placement.or_else(|| facts.placement_group.as_ref().map(|_| (PLACEMENT_GROUP_READY, Ok(()))));
    let dependents: Vec<(&str, Outcome)> = vec![
        (SUBNETS_READY, found(!subnets.is_empty(), SUBNETS_NOT_FOUND, NO_SUBNETS)),
        (
            SECURITY_GROUPS_READY,
            found(
                !security_groups.is_empty(),
                SECURITY_GROUPS_NOT_FOUND,
                NO_SECURITY_GROUPS,
            ),
        ),
        (AMIS_READY, ami_outcome),
        (
            INSTANCE_PROFILE_READY,
            match &facts.missing_profile {
                Some(name) => Err((
                    INSTANCE_PROFILE_NOT_FOUND.to_string(),
                    format!("instance profile {name} does not exist in IAM"),
                )),
                None => found(
                    facts.instance_profile.is_some(),
                    INSTANCE_PROFILE_NOT_FOUND,
                    "neither role nor instanceProfile is set",
                ),
            },
        ),
    ]
    .into_iter()
    .chain(placement)
    .collect();
    let failed: Vec<&(String, String)> = dependents.iter().filter_map(|(_, o)| o.as_ref().err()).collect();
    // Ready names the first failing dependent's reason, and every failure's
    // message; a class that fails validation is never Ready (launch refuses it).
    let ready: Outcome = match (&facts.invalid, failed.first()) {
        (Some(why), _) => Err((VALIDATION_FAILED.to_string(), why.clone())),
        (None, None) => Ok(()),
        (None, Some((reason, _))) => Err((
            reason.clone(),
            failed.iter().map(|(_, m)| m.as_str()).collect::<Vec<_>>().join("; "),
        )),
    };
    let old = previous.map(|p| p.conditions.as_slice()).unwrap_or_default();
    // Listed for classes that select reservations: selecting none is not a fault.
    let reservations_read = facts
        .capacity_reservations
        .as_ref()
        .map(|_| (CAPACITY_RESERVATIONS_READY, Ok(())));
    let last_launch = facts.last_launch.as_ref().map(|o| {
        let refused = o.clone().map_err(|message| (LAUNCH_REFUSED.to_string(), message));
        (LAUNCH_SUCCEEDED, refused)
    });
    let conditions = dependents
        .iter()
        .chain(reservations_read.as_ref())
        .chain(last_launch.as_ref())
        .chain(std::iter::once(&(READY, ready)))
        .map(|(t, o)| condition(t, o, old, generation, now))
        .collect();
    let mut capacity_reservations: Vec<_> = facts.capacity_reservations.iter().flatten().cloned().collect();
    capacity_reservations.sort();
    EC2NodeClassStatus {
        subnets,
        security_groups,
        amis,
        instance_profile: facts.instance_profile.clone(),
        capacity_reservations,
        conditions,
    }
}

/// What `LaunchSucceeded=False` says of a refusal with EC2's `code` and `message` (pure).
pub fn refusal_message(code: &str, message: &str) -> String {
    format!("EC2 refused the latest launch: {code}: {message}")
}

/// One condition; its transition time is kept while its status stays (pure).
fn condition(type_: &str, outcome: &Outcome, old: &[Condition], generation: Option<i64>, now: Timestamp) -> Condition {
    let (status, reason, message) = match outcome {
        Ok(()) => ("True", type_.to_string(), String::new()),
        Err((r, m)) => ("False", r.clone(), m.clone()),
    };
    let last_transition_time = old
        .iter()
        .find(|c| c.type_ == type_ && c.status == status && !c.last_transition_time.is_empty())
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string());
    Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason,
        message,
        last_transition_time,
        observed_generation: generation,
    }
}

/// One entry per image with the requirements of the instance types it serves:
/// its architectures, and the NVIDIA GPU manufacturer when the image serves
/// only GPU types (`In`) or only the others (`NotIn`) (pure).
fn amis(by_key: &BTreeMap<AmiKey, String>, names: &BTreeMap<String, String>) -> Vec<AmiStatus> {
    // First key per image keeps the order stable: amd64 before arm64, standard before NVIDIA.
    let mut order: Vec<&String> = Vec::new();
    let mut keys: BTreeMap<&String, Vec<&AmiKey>> = BTreeMap::new();
    for (k, id) in by_key {
        if !keys.contains_key(id) {
            order.push(id);
        }
        keys.entry(id).or_default().push(k);
    }
    order
        .into_iter()
        .map(|id| {
            let ks = keys.get(id).map(Vec::as_slice).unwrap_or_default();
            let arches: BTreeSet<String> = ks.iter().map(|k| k.arch.clone()).collect();
            let mut requirements = vec![StatusRequirement {
                key: labels::ARCH.into(),
                operator: "In".into(),
                values: arches.into_iter().collect(),
            }];
            let gpu = |operator: &str| StatusRequirement {
                key: labels::aws::GPU_MANUFACTURER.into(),
                operator: operator.into(),
                values: vec!["nvidia".into()],
            };
            match (ks.iter().any(|k| k.nvidia), ks.iter().any(|k| !k.nvidia)) {
                (true, false) => requirements.push(gpu("In")),
                (false, true) => requirements.push(gpu("NotIn")),
                _ => {}
            }
            AmiStatus {
                id: id.clone(),
                name: names.get(id).cloned(),
                requirements,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nodeclass::securitygroup::SecurityGroup;
    use crate::nodeclass::subnet::Subnet;

    fn key(arch: &str, nvidia: bool) -> AmiKey {
        AmiKey {
            arch: arch.into(),
            nvidia,
        }
    }

    fn ready_facts() -> ResolvedClass {
        ResolvedClass {
            subnets: vec![
                Subnet {
                    id: "subnet-b".into(),
                    zone: "us-east-1b".into(),
                    available_ips: 10,
                    zone_id: Some("use1-az2".into()),
                },
                Subnet {
                    id: "subnet-a".into(),
                    zone: "us-east-1a".into(),
                    available_ips: 250,
                    zone_id: Some("use1-az1".into()),
                },
            ],
            security_groups: vec![SecurityGroup {
                id: "sg-1".into(),
                name: "nodes".into(),
            }],
            amis: BTreeMap::from([
                (key("amd64", false), "ami-std".to_string()),
                (key("amd64", true), "ami-gpu".to_string()),
                (key("arm64", false), "ami-arm".to_string()),
            ]),
            ami_names: BTreeMap::from([("ami-std".to_string(), "al2023-x86_64".to_string())]),
            instance_profile: Some("demo_0123".into()),
            ami_problem: None,
            capacity_reservations: None,
            invalid: None,
            missing_profile: None,
            last_launch: None,
            placement_group: None,
            placement_group_problem: None,
        }
    }

    #[test]
    fn a_named_profile_iam_does_not_have_is_not_ready() {
        let facts = ResolvedClass {
            missing_profile: Some("nodes".into()),
            ..ready_facts()
        };
        let s = compute(&facts, None, Some(1), at("2026-01-01T00:00:00Z"));
        let profile = s.conditions.iter().find(|c| c.type_ == "InstanceProfileReady").unwrap();
        assert_eq!(
            (profile.status.as_str(), profile.reason.as_str()),
            ("False", "InstanceProfileNotFound")
        );
        assert_eq!(profile.message, "instance profile nodes does not exist in IAM");
        let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "InstanceProfileNotFound")
        );
    }

    #[test]
    fn a_class_that_fails_validation_is_not_ready_whatever_it_resolves_to() {
        let facts = ResolvedClass {
            invalid: Some("EC2NodeClass default: spec: must specify exactly one of ['role', 'instanceProfile']".into()),
            ..ready_facts()
        };
        let s = compute(&facts, None, Some(1), at("2026-01-01T00:00:00Z"));
        let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "ValidationFailed")
        );
        assert!(ready.message.contains("exactly one of"), "{}", ready.message);
        assert_eq!(s.subnets.len(), 2, "what it resolves to is still shown");
    }

    #[test]
    fn a_refused_launch_is_a_condition_of_its_own_that_leaves_ready_alone() {
        let now = Timestamp::UNIX_EPOCH;
        let unknown = compute(&ready_facts(), None, Some(1), now);
        assert!(unknown.conditions.iter().all(|c| c.type_ != LAUNCH_SUCCEEDED));
        let refused = ResolvedClass {
            last_launch: Some(Err(refusal_message("InvalidAMIID.NotFound", "no such image"))),
            ..ready_facts()
        };
        let s = compute(&refused, None, Some(1), now);
        let c = s.conditions.iter().find(|c| c.type_ == LAUNCH_SUCCEEDED).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            (
                "False",
                LAUNCH_REFUSED,
                "EC2 refused the latest launch: InvalidAMIID.NotFound: no such image"
            )
        );
        assert_eq!(s.conditions.iter().find(|c| c.type_ == READY).unwrap().status, "True");
        let recovered = ResolvedClass {
            last_launch: Some(Ok(())),
            ..ready_facts()
        };
        let s = compute(&recovered, Some(&s), Some(1), now);
        let c = s.conditions.iter().find(|c| c.type_ == LAUNCH_SUCCEEDED).unwrap();
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", LAUNCH_SUCCEEDED));
    }

    #[test]
    fn selected_reservations_are_listed_with_their_condition() {
        let r = |id: &str| crate::apis::ec2nodeclass::CapacityReservationStatus {
            id: id.into(),
            instance_type: "m5.large".into(),
            availability_zone: "us-east-1a".into(),
            instance_match_criteria: Some("targeted".into()),
            reservation_type: Some("default".into()),
            state: Some("active".into()),
            available_instance_count: Some(3),
            ..Default::default()
        };
        let facts = ResolvedClass {
            capacity_reservations: Some(vec![r("cr-2"), r("cr-1")]),
            ..ready_facts()
        };
        let s = compute(&facts, None, Some(1), at("2026-01-01T00:00:00Z"));
        let ids: Vec<&str> = s.capacity_reservations.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["cr-1", "cr-2"]);
        assert_eq!(s.capacity_reservations[0].available_instance_count, Some(3));
        assert!(summary(&s).contains(&(
            "CapacityReservationsReady".into(),
            "True".into(),
            "CapacityReservationsReady".into()
        )));
        let none = compute(&ready_facts(), None, Some(1), at("2026-01-01T00:00:00Z"));
        assert!(none.capacity_reservations.is_empty());
        assert!(!summary(&none).iter().any(|c| c.0 == "CapacityReservationsReady"));
    }

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    /// (type, status, reason) of every condition.
    fn summary(s: &EC2NodeClassStatus) -> Vec<(String, String, String)> {
        s.conditions
            .iter()
            .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
            .collect()
    }

    fn all(status: &str, reasons: [&str; 5]) -> Vec<(String, String, String)> {
        [
            SUBNETS_READY,
            SECURITY_GROUPS_READY,
            AMIS_READY,
            INSTANCE_PROFILE_READY,
            READY,
        ]
        .iter()
        .zip(reasons)
        .map(|(t, r)| {
            let st = if r == *t { "True" } else { status };
            (t.to_string(), st.to_string(), r.to_string())
        })
        .collect()
    }

    #[test]
    fn what_resolves_is_written_in_karpenters_shape() {
        let s = compute(&ready_facts(), None, Some(3), at("2026-01-01T00:00:00Z"));
        assert_eq!(
            serde_json::to_value(&s).unwrap(),
            serde_json::json!({
                "subnets": [
                    {"id": "subnet-a", "zone": "us-east-1a", "zoneID": "use1-az1"},
                    {"id": "subnet-b", "zone": "us-east-1b", "zoneID": "use1-az2"}
                ],
                "securityGroups": [{"id": "sg-1", "name": "nodes"}],
                "amis": [
                    {"id": "ami-std", "name": "al2023-x86_64", "requirements": [
                        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
                        {"key": "karpenter.k8s.aws/instance-gpu-manufacturer", "operator": "NotIn", "values": ["nvidia"]}
                    ]},
                    {"id": "ami-gpu", "requirements": [
                        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
                        {"key": "karpenter.k8s.aws/instance-gpu-manufacturer", "operator": "In", "values": ["nvidia"]}
                    ]},
                    {"id": "ami-arm", "requirements": [
                        {"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]},
                        {"key": "karpenter.k8s.aws/instance-gpu-manufacturer", "operator": "NotIn", "values": ["nvidia"]}
                    ]}
                ],
                "instanceProfile": "demo_0123",
                "conditions": [
                    {"type": "SubnetsReady", "status": "True", "reason": "SubnetsReady", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 3},
                    {"type": "SecurityGroupsReady", "status": "True", "reason": "SecurityGroupsReady", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 3},
                    {"type": "AMIsReady", "status": "True", "reason": "AMIsReady", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 3},
                    {"type": "InstanceProfileReady", "status": "True", "reason": "InstanceProfileReady", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 3},
                    {"type": "Ready", "status": "True", "reason": "Ready", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 3}
                ]
            })
        );
    }

    #[test]
    fn an_image_serving_every_variant_of_an_arch_has_no_gpu_requirement() {
        let by_key = BTreeMap::from([
            (key("amd64", false), "ami-1".to_string()),
            (key("amd64", true), "ami-1".to_string()),
        ]);
        let got = amis(&by_key, &BTreeMap::new());
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].requirements.len(), 1, "{got:?}");
        assert_eq!(got[0].requirements[0].values, vec!["amd64"]);
    }

    /// A table row: name, how the facts differ from ready ones, the conditions, Ready's message.
    type Case = (
        &'static str,
        Box<dyn Fn(&mut ResolvedClass)>,
        Vec<(String, String, String)>,
        &'static str,
    );

    #[test]
    fn conditions_follow_what_matches_nothing() {
        let t0 = at("2026-01-01T00:00:00Z");
        let cases: Vec<Case> = vec![
            (
                "all ready",
                Box::new(|_| {}),
                all(
                    "True",
                    [
                        SUBNETS_READY,
                        SECURITY_GROUPS_READY,
                        AMIS_READY,
                        INSTANCE_PROFILE_READY,
                        READY,
                    ],
                ),
                "",
            ),
            (
                "no subnets",
                Box::new(|f| f.subnets.clear()),
                all(
                    "False",
                    [
                        SUBNETS_NOT_FOUND,
                        SECURITY_GROUPS_READY,
                        AMIS_READY,
                        INSTANCE_PROFILE_READY,
                        SUBNETS_NOT_FOUND,
                    ],
                ),
                NO_SUBNETS,
            ),
            (
                "no security groups",
                Box::new(|f| f.security_groups.clear()),
                all(
                    "False",
                    [
                        SUBNETS_READY,
                        SECURITY_GROUPS_NOT_FOUND,
                        AMIS_READY,
                        INSTANCE_PROFILE_READY,
                        SECURITY_GROUPS_NOT_FOUND,
                    ],
                ),
                NO_SECURITY_GROUPS,
            ),
            (
                "no AMIs",
                Box::new(|f| f.amis.clear()),
                all(
                    "False",
                    [
                        SUBNETS_READY,
                        SECURITY_GROUPS_READY,
                        AMI_NOT_FOUND,
                        INSTANCE_PROFILE_READY,
                        AMI_NOT_FOUND,
                    ],
                ),
                NO_AMIS,
            ),
            (
                "an unsupported alias",
                Box::new(|f| {
                    f.amis.clear();
                    f.ami_problem = Some(("AMISelectorInvalid".into(), "alias family \"al2\"".into()));
                }),
                all(
                    "False",
                    [
                        SUBNETS_READY,
                        SECURITY_GROUPS_READY,
                        "AMISelectorInvalid",
                        INSTANCE_PROFILE_READY,
                        "AMISelectorInvalid",
                    ],
                ),
                "alias family \"al2\"",
            ),
            (
                "no subnets nor AMIs: Ready names the first, says both",
                Box::new(|f| {
                    f.subnets.clear();
                    f.amis.clear();
                }),
                all(
                    "False",
                    [
                        SUBNETS_NOT_FOUND,
                        SECURITY_GROUPS_READY,
                        AMI_NOT_FOUND,
                        INSTANCE_PROFILE_READY,
                        SUBNETS_NOT_FOUND,
                    ],
                ),
                "subnetSelectorTerms select no subnets; amiSelectorTerms select no AMI",
            ),
            (
                "no instance profile",
                Box::new(|f| f.instance_profile = None),
                all(
                    "False",
                    [
                        SUBNETS_READY,
                        SECURITY_GROUPS_READY,
                        AMIS_READY,
                        INSTANCE_PROFILE_NOT_FOUND,
                        INSTANCE_PROFILE_NOT_FOUND,
                    ],
                ),
                "neither role nor instanceProfile is set",
            ),
        ];
        for (name, edit, want, ready_message) in cases {
            let mut f = ready_facts();
            edit(&mut f);
            let s = compute(&f, None, Some(1), t0);
            assert_eq!(summary(&s), want, "{name}");
            let ready = s.conditions.iter().find(|c| c.type_ == READY).unwrap();
            assert_eq!(ready.message, ready_message, "{name}");
        }
    }

    #[test]
    fn transition_times_stay_while_statuses_stay() {
        let t0 = at("2026-01-01T00:00:00Z");
        let t1 = at("2026-01-01T00:01:00Z");
        let t2 = at("2026-01-01T00:02:00Z");
        let first = compute(&ready_facts(), None, Some(1), t0);
        let again = compute(&ready_facts(), Some(&first), Some(1), t1);
        assert_eq!(again, first, "nothing changed: the same status, so no write");

        let mut broken = ready_facts();
        broken.subnets.clear();
        let second = compute(&broken, Some(&again), Some(1), t1);
        let time = |s: &EC2NodeClassStatus, t: &str| {
            s.conditions
                .iter()
                .find(|c| c.type_ == t)
                .unwrap()
                .last_transition_time
                .clone()
        };
        assert_eq!(time(&second, SUBNETS_READY), "2026-01-01T00:01:00Z");
        assert_eq!(time(&second, READY), "2026-01-01T00:01:00Z");
        assert_eq!(time(&second, AMIS_READY), "2026-01-01T00:00:00Z", "unchanged: kept");
        assert!(second.subnets.is_empty());

        // Still broken, with another generation: times kept, generation moves on.
        let third = compute(&broken, Some(&second), Some(2), t2);
        assert_eq!(time(&third, SUBNETS_READY), "2026-01-01T00:01:00Z");
        assert!(third.conditions.iter().all(|c| c.observed_generation == Some(2)));

        let healed = compute(&ready_facts(), Some(&third), Some(2), t2);
        assert_eq!(time(&healed, SUBNETS_READY), "2026-01-01T00:02:00Z");
        assert_eq!(time(&healed, SECURITY_GROUPS_READY), "2026-01-01T00:00:00Z");
    }

    #[test]
    fn free_ips_moving_change_nothing() {
        let t0 = at("2026-01-01T00:00:00Z");
        let first = compute(&ready_facts(), None, Some(1), t0);
        let mut f = ready_facts();
        f.subnets[0].available_ips = 3;
        f.subnets.reverse();
        assert_eq!(compute(&f, Some(&first), Some(1), t0), first);
    }
}
