//! Table tests of the pure report and its renderers.

use std::collections::BTreeMap;

use jiff::civil::date;
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodSpec, PodStatus};

use super::*;
use crate::nodeclaim::Phase;
use crate::state::{DisruptionStep, FunctionCost};

fn at(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn claim(name: &str, phase: Phase, price: Option<f64>) -> NodeClaim {
    let mut c = NodeClaim {
        phase,
        price,
        instance_type: price.map(|_| "m6g.large".to_string()),
        zone: price.map(|_| "us-east-1a".to_string()),
        capacity_type: price.map(|_| "spot".to_string()),
        instance_id: price.map(|_| format!("i-{name}")),
        ..NodeClaim::pending(name, "default", "default")
    };
    c.timestamps.created = Some(at("2026-11-24T10:00:00Z"));
    c
}

fn day(d: Date, sweep_nano: i64, sweep_n: i64, launch_nano: i64) -> DayCost {
    DayCost {
        day: d,
        functions: BTreeMap::from([
            (
                "sweep".to_string(),
                FunctionCost {
                    nano_usd: sweep_nano,
                    invocations: sweep_n,
                    fleet_delta_nano_usd_per_hour: 0,
                },
            ),
            (
                "launch".to_string(),
                FunctionCost {
                    nano_usd: launch_nano,
                    invocations: 1,
                    fleet_delta_nano_usd_per_hour: 96_000_000,
                },
            ),
        ]),
    }
}

fn input() -> StatusInput {
    StatusInput {
        now: at("2026-11-24T12:30:00Z"),
        claims: vec![
            claim("default-b", Phase::Initialized, Some(0.0385)),
            claim("default-a", Phase::Registered, Some(0.077)),
            claim("default-c", Phase::Pending, None),
            claim("default-d", Phase::Terminating, Some(1.0)),
        ],
        pending_pods: vec![
            PendingPodStatus {
                namespace: "web".into(),
                name: "b".into(),
                message: None,
            },
            PendingPodStatus {
                namespace: "web".into(),
                name: "a".into(),
                message: Some("0/3 nodes are available: 3 Insufficient cpu.".into()),
            },
        ],
        disruptions: vec![DisruptionRecord {
            claim: "default-b".into(),
            node: "ip-10-0-0-2".into(),
            reason: crate::disruption::Reason::Empty,
            detail: String::new(),
            step: DisruptionStep::Launching,
            replacements: vec!["default-e".into()],
            grace_ms: None,
            force_from_ms: None,
            started_ms: at("2026-11-24T12:25:00Z").as_millisecond(),
            version: 2,
        }],
        costs: vec![
            // Last month: outside both sums.
            day(date(2026, 10, 31), 9_000_000, 1000, 0),
            day(date(2026, 11, 1), 1_000_000, 1440, 5_000),
            day(date(2026, 11, 24), 500_000, 750, 2_000),
        ],
        price_source: Some(PriceSource {
            origin: Origin::PriceListApi,
            region: "eu-west-1".into(),
            read_ms: Some(at("2026-11-24T10:30:00Z").as_millisecond()),
            checked_ms: at("2026-11-24T12:25:00Z").as_millisecond(),
            fallback: Some("Price List GetProducts for eu-west-1: throttled".into()),
        }),
    }
}

#[test]
fn the_report_sorts_prices_and_sums() {
    let r = report(&input());
    let names: Vec<&str> = r.node_claims.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["default-a", "default-b", "default-c", "default-d"]);
    assert_eq!(r.node_claims[0].age_seconds, Some(9000));
    assert_eq!(r.node_claims[0].phase, "Registered");
    assert_eq!(r.node_claims[2].price_per_hour, None);
    // Terminating capacity is leaving: not in the fleet's price.
    assert_eq!(r.fleet.live_claims, 3);
    assert!(
        (r.fleet.usd_per_hour - 0.1155).abs() < 1e-12,
        "{}",
        r.fleet.usd_per_hour
    );

    let pods: Vec<(&str, &str)> = r
        .pending_pods
        .iter()
        .map(|p| (p.name.as_str(), p.reason.as_str()))
        .collect();
    assert_eq!(
        pods,
        [
            ("a", "0/3 nodes are available: 3 Insufficient cpu."),
            ("b", WAITING_FOR_A_SOLVE)
        ]
    );
    assert_eq!(r.disruptions[0].age_seconds, 300);
    assert_eq!(r.disruptions[0].step, "Launching");

    let c = &r.autoscaler_cost;
    assert_eq!(c.today, date(2026, 11, 24));
    assert_eq!(c.month, "2026-11");
    assert!((c.today_usd - 0.000502).abs() < 1e-12, "{}", c.today_usd);
    assert_eq!(c.today_invocations, 751);
    assert!((c.month_usd - 0.001507).abs() < 1e-12, "{}", c.month_usd);
    assert_eq!(c.month_invocations, 751 + 1441);
}

#[test]
fn an_empty_cluster_reports_zeros() {
    let r = report(&StatusInput {
        now: at("2026-01-01T00:00:00Z"),
        claims: vec![],
        pending_pods: vec![],
        disruptions: vec![],
        costs: vec![],
        price_source: None,
    });
    assert_eq!(r.fleet.usd_per_hour, 0.0);
    assert_eq!(r.autoscaler_cost.month, "2026-01");
    assert_eq!(r.autoscaler_cost.month_usd, 0.0);
    let t = to_table(&r);
    assert_eq!(t.matches("(none)").count(), 3, "{t}");
    // An empty float sum is -0.0 in Rust: never shown as "$-0.0000/h".
    assert!(t.contains("FLEET: $0.0000/h over 0 live claims"), "{t}");
    assert!(r.fleet.usd_per_hour.is_sign_positive());
}

#[test]
fn json_keys_are_camel_case() {
    let v = to_json(&report(&input()));
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        [
            "autoscalerCost",
            "disruptions",
            "fleet",
            "generatedAt",
            "nodeClaims",
            "onDemandPrices",
            "pendingPods"
        ]
    );
    assert_eq!(
        v["onDemandPrices"],
        serde_json::json!({"source": "priceListApi", "region": "eu-west-1", "ageSeconds": 7200,
            "checkedSecondsAgo": 300, "fallback": "Price List GetProducts for eu-west-1: throttled"})
    );
    assert_eq!(v["generatedAt"], "2026-11-24T12:30:00Z");
    assert_eq!(v["nodeClaims"][0]["nodePool"], "default");
    assert_eq!(v["nodeClaims"][0]["instanceType"], "m6g.large");
    assert_eq!(v["nodeClaims"][0]["capacityType"], "spot");
    assert_eq!(v["nodeClaims"][0]["pricePerHour"], 0.077);
    assert_eq!(v["nodeClaims"][0]["ageSeconds"], 9000);
    assert_eq!(v["nodeClaims"][2]["node"], serde_json::Value::Null);
    assert_eq!(v["pendingPods"][1]["reason"], WAITING_FOR_A_SOLVE);
    assert_eq!(v["disruptions"][0]["replacements"][0], "default-e");
    assert_eq!(v["fleet"]["liveClaims"], 3);
    assert_eq!(v["autoscalerCost"]["today"], "2026-11-24");
    assert_eq!(v["autoscalerCost"]["monthInvocations"], 2192);
}

#[test]
fn the_table_shows_every_section() {
    let t = to_table(&report(&input()));
    assert!(
        t.contains("NAME       POOL     TYPE       ZONE        CAPACITY  PHASE"),
        "{t}"
    );
    assert!(
        t.contains("default-a  default  m6g.large  us-east-1a  spot      Registered   2h30m"),
        "{t}"
    );
    assert!(t.contains("web/b  waiting for a solve"), "{t}");
    assert!(
        t.contains("default-b  ip-10-0-0-2  Empty   Launching  5m   default-e"),
        "{t}"
    );
    assert!(t.contains("FLEET: $0.1155/h over 3 live claims"), "{t}");
    assert!(t.contains("today (2026-11-24) $0.000502 in 751 invocations"), "{t}");
    assert!(
        t.contains("ON-DEMAND PRICES: AWS Price List API for eu-west-1, read 2h ago; the Price List API failed 5m ago: Price List GetProducts for eu-west-1: throttled"),
        "{t}"
    );
}

#[test]
fn the_wide_table_adds_each_claims_instance() {
    let r = report(&input());
    let (narrow, wide) = (to_table(&r), to_wide_table(&r));
    assert!(
        !narrow.contains("INSTANCE") && !narrow.contains("i-default-a"),
        "{narrow}"
    );
    assert!(wide.contains("$/H     INSTANCE\n"), "{wide}");
    assert!(wide.contains("0.0770  i-default-a\n"), "{wide}");
    // Before launch: a dash, as every unknown cell.
    assert!(wide.contains("default-c  default  -"), "{wide}");
    assert!(
        wide.lines().any(|l| l.starts_with("default-c") && l.ends_with(" -")),
        "{wide}"
    );
}

#[test]
fn the_bundled_fallback_and_unknown_prices_are_stated() {
    let mut i = input();
    i.price_source = Some(PriceSource {
        origin: Origin::BundledTable,
        region: "us-east-1".into(),
        read_ms: None,
        checked_ms: at("2026-11-24T12:29:00Z").as_millisecond(),
        fallback: Some("AccessDeniedException".into()),
    });
    let r = report(&i);
    let p = r.on_demand_prices.as_ref().unwrap();
    assert_eq!((p.age_seconds, p.checked_seconds_ago), (None, 60));
    let t = to_table(&r);
    assert!(
        t.contains("ON-DEMAND PRICES: FALLBACK: the bundled us-east-1 table; the Price List API failed 1m ago: AccessDeniedException"),
        "{t}"
    );
    i.price_source = None;
    let r = report(&i);
    assert_eq!(to_json(&r)["onDemandPrices"], serde_json::Value::Null);
    assert!(to_table(&r).contains("ON-DEMAND PRICES: not recorded yet"));
}

#[test]
fn ages_read_like_kubectl() {
    for (s, want) in [
        (-5, "0s"),
        (0, "0s"),
        (59, "59s"),
        (60, "1m"),
        (3599, "59m"),
        (3600, "1h"),
        (3660, "1h1m"),
        (86_400, "1d"),
        (90_000, "1d1h"),
    ] {
        assert_eq!(human_age(s), want, "{s}");
    }
}

fn pod(node: Option<&str>, phase: &str, condition: Option<(&str, Option<&str>)>) -> Pod {
    let mut p = Pod::default();
    p.metadata.namespace = Some("web".into());
    p.metadata.name = Some("p".into());
    p.spec = Some(PodSpec {
        node_name: node.map(String::from),
        ..Default::default()
    });
    p.status = Some(PodStatus {
        phase: Some(phase.into()),
        conditions: condition.map(|(status, message)| {
            vec![PodCondition {
                type_: "PodScheduled".into(),
                status: status.into(),
                reason: Some("Unschedulable".into()),
                message: message.map(String::from),
                ..Default::default()
            }]
        }),
        ..Default::default()
    });
    p
}

#[test]
fn pending_pods_are_unbound_pending_pods_with_the_schedulers_message() {
    let msg = "0/1 nodes are available";
    assert_eq!(
        pending_pod(&pod(None, "Pending", Some(("False", Some(msg))))),
        Some(PendingPodStatus {
            namespace: "web".into(),
            name: "p".into(),
            message: Some(msg.into())
        })
    );
    // Not seen by the scheduler yet, or no message: waiting.
    assert_eq!(pending_pod(&pod(None, "Pending", None)).unwrap().message, None);
    assert_eq!(
        pending_pod(&pod(None, "Pending", Some(("False", Some(" ")))))
            .unwrap()
            .message,
        None
    );
    let mut fresh = pod(None, "Pending", None);
    fresh.status = None;
    assert_eq!(pending_pod(&fresh).unwrap().message, None);
    assert_eq!(pending_pod(&pod(Some("n1"), "Pending", None)), None);
    assert_eq!(pending_pod(&pod(None, "Running", None)), None);
    let mut deleting = pod(None, "Pending", None);
    deleting.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        jiff::Timestamp::UNIX_EPOCH,
    ));
    assert_eq!(pending_pod(&deleting), None);
}
