use super::decide::{FORCE_BEFORE_DEADLINE, Reaction, RebalanceMode, decide};
use super::event::{Kind, classify, is_instance_id, parse, parse_time};
use super::*;
use crate::draining::DrainPolicy;
use crate::nodeclaim::{NodeClaim, Phase};
use proptest::prelude::*;
use serde_json::json;

macro_rules! fixture {
    ($name:literal) => {
        include_str!(concat!("../../tests/fixtures/interruption/", $name, ".json"))
    };
}

/// Every fixture, with the kind, instances and deadline it must classify as.
fn fixtures() -> Vec<(&'static str, &'static str)> {
    vec![
        ("spot-interruption", fixture!("spot-interruption")),
        ("spot-interruption-no-version", fixture!("spot-interruption-no-version")),
        ("rebalance-recommendation", fixture!("rebalance-recommendation")),
        ("state-change-stopping", fixture!("state-change-stopping")),
        ("state-change-stopped", fixture!("state-change-stopped")),
        ("state-change-shutting-down", fixture!("state-change-shutting-down")),
        ("state-change-terminated", fixture!("state-change-terminated")),
        ("state-change-running", fixture!("state-change-running")),
        ("scheduled-change", fixture!("scheduled-change")),
        ("scheduled-change-rfc3339", fixture!("scheduled-change-rfc3339")),
        (
            "capacity-reservation-interruption",
            fixture!("capacity-reservation-interruption"),
        ),
        (
            "capacity-reservation-interruption-alt",
            fixture!("capacity-reservation-interruption-alt"),
        ),
        ("unknown-detail-type", fixture!("unknown-detail-type")),
    ]
}

const I: &str = "i-0a1b2c3d4e5f60718";

fn ts(s: &str) -> jiff::Timestamp {
    s.parse().unwrap()
}

#[test]
fn fixtures_classify_as_documented() {
    let state = |s: &str| Kind::StateChange { state: s.into() };
    let expected: Vec<(&str, Kind, Vec<&str>, Option<&str>)> = vec![
        (
            "spot-interruption",
            Kind::SpotInterruption,
            vec![I],
            Some("2026-03-02T14:22:05Z"),
        ),
        (
            "spot-interruption-no-version",
            Kind::SpotInterruption,
            vec![I],
            Some("2026-03-02T14:22:05Z"),
        ),
        ("rebalance-recommendation", Kind::RebalanceRecommendation, vec![I], None),
        ("state-change-stopping", state("stopping"), vec![I], None),
        ("state-change-stopped", state("stopped"), vec![I], None),
        ("state-change-shutting-down", state("shutting-down"), vec![I], None),
        ("state-change-terminated", state("terminated"), vec![I], None),
        ("state-change-running", state("running"), vec![I], None),
        (
            "scheduled-change",
            Kind::ScheduledChange,
            vec![I, "i-0fedcba9876543210"],
            Some("2026-03-05T22:00:00Z"),
        ),
        (
            "scheduled-change-rfc3339",
            Kind::ScheduledChange,
            vec![I],
            Some("2026-03-06T04:30:00Z"),
        ),
        (
            "capacity-reservation-interruption",
            Kind::CapacityReservationInterruption,
            vec![I],
            Some("2026-03-02T14:32:30Z"),
        ),
        (
            "capacity-reservation-interruption-alt",
            Kind::CapacityReservationInterruption,
            vec![I],
            Some("2026-03-02T14:32:00Z"),
        ),
    ];
    let all = fixtures();
    for (name, kind, ids, deadline) in expected {
        let text = all.iter().find(|(n, _)| *n == name).unwrap().1;
        let e = parse(text);
        assert_eq!(e.kind, kind, "{name}");
        assert_eq!(e.instance_ids, ids, "{name}");
        assert_eq!(e.deadline, deadline.map(ts), "{name}");
        assert!(e.id.is_some() && e.time.is_some(), "{name}");
    }
    let unknown = parse(fixture!("unknown-detail-type"));
    assert!(
        matches!(&unknown.kind, Kind::Unknown { error } if error.contains("EC2 AMI State Change")),
        "{unknown:?}"
    );
}

#[test]
fn malformed_events_name_the_field() {
    let spot = |detail: serde_json::Value| json!({"source": "aws.ec2", "detail-type": "EC2 Spot Instance Interruption Warning", "detail": detail});
    let cases: Vec<(serde_json::Value, &str)> = vec![
        (json!([1, 2]), "not a JSON object"),
        (json!("x"), "not a JSON object"),
        (
            json!({"detail-type": "EC2 Spot Instance Interruption Warning"}),
            "source is missing",
        ),
        (json!({"source": 7, "detail-type": "x"}), "source is a number"),
        (json!({"source": "aws.ec2"}), "detail-type is missing"),
        (
            json!({"source": "aws.ec2", "detail-type": "EC2 Spot Instance Interruption Warning"}),
            "detail is missing",
        ),
        (spot(json!({})), "detail.instance-id is missing"),
        (spot(json!({"instance-id": 5})), "detail.instance-id is a number"),
        (spot(json!({"instance-id": "vol-1"})), "not an EC2 instance id"),
        (
            json!({"source": "aws.ec2", "detail-type": "EC2 Instance State-change Notification", "detail": {"instance-id": I}}),
            "detail.state is missing",
        ),
        (
            json!({"source": "aws.health", "detail-type": "AWS Health Event", "detail": {"service": "RDS", "eventTypeCategory": "scheduledChange"}}),
            "only EC2",
        ),
        (
            json!({"source": "aws.health", "detail-type": "AWS Health Event", "detail": {"service": "EC2", "eventTypeCategory": "issue"}}),
            "only scheduledChange",
        ),
        (
            json!({"source": "aws.health", "detail-type": "AWS Health Event", "detail": {"service": "EC2", "eventTypeCategory": "scheduledChange", "affectedEntities": [{"entityValue": "vol-1"}]}}),
            "no entityValue",
        ),
        (
            json!({"source": "aws.s3", "detail-type": "Object Created"}),
            "source \"aws.s3\"",
        ),
    ];
    for (v, want) in cases {
        let e = classify(&v);
        match &e.kind {
            Kind::Unknown { error } => assert!(error.contains(want), "{v}: {error} lacks {want:?}"),
            k => panic!("{v} classified as {k:?}"),
        }
    }
    assert!(matches!(parse("{not json").kind, Kind::Unknown { error } if error.starts_with("not JSON")));
}

/// AWS's own sample events, verbatim from its documentation: the EC2 User
/// Guide's spot interruption warning, rebalance recommendation and state
/// change, and the AWS Health scheduled change for EC2. The EC2 samples carry
/// `"time": "yyyy-mm-ddThh:mm:ssZ"`; the Health sample's RFC 1123 start time
/// names the wrong day of the week. Neither stops what the event says.
#[test]
fn aws_documented_samples_classify_as_what_they_say() {
    /// One sample and what it must classify as: kind, instances, time, deadline.
    struct Sample(
        &'static str,
        Kind,
        Vec<&'static str>,
        Option<&'static str>,
        Option<&'static str>,
    );
    let cases = vec![
        Sample(
            fixture!("aws-doc-spot-interruption"),
            Kind::SpotInterruption,
            vec!["i-1234567890abcdef0"],
            None,
            None,
        ),
        Sample(
            fixture!("aws-doc-rebalance-recommendation"),
            Kind::RebalanceRecommendation,
            vec!["i-1234567890abcdef0"],
            None,
            None,
        ),
        Sample(
            fixture!("aws-doc-state-change"),
            Kind::StateChange {
                state: "pending".into(),
            },
            vec!["i-abcd1111"],
            Some("2021-11-11T21:29:54Z"),
            None,
        ),
        Sample(
            fixture!("aws-doc-health-scheduled-change"),
            Kind::ScheduledChange,
            vec!["i-12345678"],
            Some("2016-06-05T06:27:57Z"),
            Some("2016-06-05T15:10:09Z"),
        ),
    ];
    for Sample(text, kind, ids, time, deadline) in cases {
        let e = parse(text);
        let name = kind.name();
        assert_eq!(e.kind, kind, "{name}");
        assert_eq!(e.instance_ids, ids, "{name}");
        assert_eq!(e.time, time.map(ts), "{name}");
        assert_eq!(e.deadline, deadline.map(ts), "{name}");
    }
    // Without a readable `time`, a spot warning's notice is counted from when it is handled.
    let spot = parse(fixture!("aws-doc-spot-interruption"));
    let now = ts("2026-03-02T14:20:05Z");
    let claim = claim(Phase::Initialized);
    match decide(&spot, Some(&claim), RebalanceMode::Replace, now) {
        Reaction::Act(steps) => assert_eq!(steps.drain.and_then(|d| d.deadline), Some(ts("2026-03-02T14:22:05Z"))),
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_unreadable_time_is_not_required() {
    for (detail_type, kind) in [
        ("EC2 Spot Instance Interruption Warning", Kind::SpotInterruption),
        ("EC2 Instance Rebalance Recommendation", Kind::RebalanceRecommendation),
    ] {
        let e = classify(
            &json!({"source": "aws.ec2", "detail-type": detail_type, "time": "yesterday", "detail": {"instance-id": I}}),
        );
        assert_eq!((e.kind, e.time, e.deadline), (kind, None, None), "{detail_type}");
    }
}

#[test]
fn dates_in_every_format_aws_sends() {
    assert_eq!(
        parse_time("Sat, 05 Jun 2016 15:10:09 GMT"),
        Some(ts("2016-06-05T15:10:09Z")),
        "AWS's documented Health sample (5 June 2016 was a Sunday)"
    );
    assert_eq!(
        parse_time("Sun, 05 Jun 2016 05:01:10 GMT"),
        Some(ts("2016-06-05T05:01:10Z"))
    );
    assert_eq!(parse_time("05 Jun 2016 15:10:09 GMT"), Some(ts("2016-06-05T15:10:09Z")));
    assert_eq!(parse_time("2026-03-05T22:00:00Z"), Some(ts("2026-03-05T22:00:00Z")));
    assert_eq!(
        parse_time("2026-03-05T23:00:00+01:00"),
        Some(ts("2026-03-05T22:00:00Z"))
    );
    assert_eq!(
        parse_time("Thu, 05 Mar 2026 22:00:00 GMT"),
        Some(ts("2026-03-05T22:00:00Z"))
    );
    assert_eq!(
        parse_time("Thu, 05 Mar 2026 22:00:00 UTC"),
        Some(ts("2026-03-05T22:00:00Z"))
    );
    assert_eq!(parse_time("next week"), None);
    assert!(is_instance_id("i-12345678") && is_instance_id(I));
    assert!(!is_instance_id("i-") && !is_instance_id("i-0A1B2C3D") && !is_instance_id("vol-12345678"));
}

#[test]
fn input_unwraps_arrays_and_sqs_messages() {
    let spot = fixture!("spot-interruption");
    let body = serde_json::to_string(spot).unwrap();
    assert_eq!(read_input(spot).len(), 1);
    assert_eq!(read_input(&format!("[{spot},{spot}]")).len(), 2);
    let sqs = format!(r#"{{"MessageId":"m","Body":{body}}}"#);
    assert_eq!(read_input(&sqs)[0].kind, Kind::SpotInterruption);
    let received = format!(r#"{{"Messages":[{{"Body":{body}}},{{"body":{body}}}]}}"#);
    assert_eq!(read_input(&received).len(), 2);
    assert!(matches!(read_input("garbage")[0].kind, Kind::Unknown { .. }));
}

#[test]
fn contract_output_shape() {
    let e = parse(fixture!("spot-interruption"));
    let v = to_json(&e, RebalanceMode::Replace);
    assert_eq!(v["kind"], "SpotInterruption");
    assert_eq!(v["detailType"], "EC2 Spot Instance Interruption Warning");
    assert_eq!(v["instanceIds"], json!([I]));
    assert_eq!(v["deadline"], "2026-03-02T14:22:05Z");
    assert_eq!(v["time"], "2026-03-02T14:20:05Z");
    let s = to_json(&parse(fixture!("state-change-stopped")), RebalanceMode::Replace);
    assert_eq!((s["state"].as_str(), s["deadline"].is_null()), (Some("stopped"), true));
    let u = to_json(&parse("[]"), RebalanceMode::Replace);
    assert_eq!(u["kind"], "Unknown");
    assert!(u["error"].is_string());
}

fn claim(phase: Phase) -> NodeClaim {
    NodeClaim {
        phase,
        instance_id: Some(I.into()),
        instance_type: Some("m5.large".into()),
        zone: Some("eu-west-1a".into()),
        capacity_type: Some("spot".into()),
        node_name: Some("ip-10-0-0-1.eu-west-1.compute.internal".into()),
        ..NodeClaim::pending("default-abcde", "default", "default")
    }
}

#[test]
fn decisions_per_kind() {
    let now = ts("2026-03-02T14:20:06Z");
    let spot = parse(fixture!("spot-interruption"));
    let Reaction::Act(s) = decide(&spot, Some(&claim(Phase::Initialized)), RebalanceMode::Replace, now) else {
        panic!()
    };
    assert!(s.taint && s.replace && !s.remove);
    assert_eq!(s.mark_unavailable.unwrap().sort_key(), "spot#eu-west-1a#m5.large");
    let policy = s.drain.unwrap();
    assert_eq!(policy.deadline, Some(ts("2026-03-02T14:22:05Z")));
    assert!(!policy.forced_at(now));
    assert!(policy.forced_at(ts("2026-03-02T14:22:05Z") - FORCE_BEFORE_DEADLINE));

    // Not ours: ignored.
    assert!(matches!(
        decide(&spot, None, RebalanceMode::Replace, now),
        Reaction::Ignore { .. }
    ));
    // A second warning for a claim already draining does not replace it again.
    let Reaction::Act(again) = decide(&spot, Some(&claim(Phase::Draining)), RebalanceMode::Replace, now) else {
        panic!()
    };
    assert!(!again.replace && again.taint);

    let rebalance = parse(fixture!("rebalance-recommendation"));
    let c = claim(Phase::Initialized);
    assert!(matches!(
        decide(&rebalance, Some(&c), RebalanceMode::Ignore, now),
        Reaction::Ignore { .. }
    ));
    let Reaction::Act(r) = decide(&rebalance, Some(&c), RebalanceMode::Replace, now) else {
        panic!()
    };
    assert!(r.taint && r.replace && r.drain.is_none() && r.mark_unavailable.is_none());
    let Reaction::Act(d) = decide(&rebalance, Some(&c), RebalanceMode::Drain, now) else {
        panic!()
    };
    assert_eq!(d.drain.map(|p| p.force_from), Some(None));

    let scheduled = parse(fixture!("scheduled-change"));
    let Reaction::Act(h) = decide(&scheduled, Some(&c), RebalanceMode::Replace, now) else {
        panic!()
    };
    assert!(h.replace);
    assert_eq!(
        h.drain,
        Some(DrainPolicy {
            deadline: Some(ts("2026-03-05T22:00:00Z")),
            force_from: None
        })
    );

    let gone = parse(fixture!("state-change-terminated"));
    let Reaction::Act(g) = decide(&gone, Some(&c), RebalanceMode::Replace, now) else {
        panic!()
    };
    assert!(g.remove && !g.replace && g.mark_unavailable.is_none());
    let running = parse(fixture!("state-change-running"));
    assert!(matches!(
        decide(&running, Some(&c), RebalanceMode::Replace, now),
        Reaction::Ignore { .. }
    ));

    let cr = parse(fixture!("capacity-reservation-interruption"));
    let Reaction::Act(k) = decide(&cr, Some(&c), RebalanceMode::Replace, now) else {
        panic!()
    };
    assert_eq!(k.reason, "capacity-reservation-interruption");
    assert_eq!(k.drain.unwrap().deadline, Some(ts("2026-03-02T14:32:30Z")));
    // A spot warning without a time: the notice counts from now.
    let mut untimed = spot.clone();
    untimed.deadline = None;
    let Reaction::Act(u) = decide(&untimed, Some(&c), RebalanceMode::Replace, now) else {
        panic!()
    };
    assert_eq!(u.drain.unwrap().deadline, Some(now + event::NOTICE));
}

#[test]
fn a_termination_grace_period_bounds_interruption_drains() {
    let now = ts("2026-03-02T14:20:06Z");
    let mut c = claim(Phase::Initialized);
    c.termination_grace_period = crate::apis::NillableDuration::parse("1h").ok();
    // A scheduled change days away: the node's own hour bounds the drain.
    let scheduled = parse(fixture!("scheduled-change"));
    let Reaction::Act(h) = decide(&scheduled, Some(&c), RebalanceMode::Replace, now) else {
        panic!()
    };
    assert_eq!(h.drain.unwrap().deadline, Some(ts("2026-03-02T15:20:06Z")));
    // A spot warning's two minutes come first.
    let spot = parse(fixture!("spot-interruption"));
    let Reaction::Act(s) = decide(&spot, Some(&c), RebalanceMode::Replace, now) else {
        panic!()
    };
    assert_eq!(s.drain.unwrap().deadline, Some(ts("2026-03-02T14:22:05Z")));
    // A rebalance drain has no deadline of its own: the hour is it.
    let rebalance = parse(fixture!("rebalance-recommendation"));
    let Reaction::Act(r) = decide(&rebalance, Some(&c), RebalanceMode::Drain, now) else {
        panic!()
    };
    assert_eq!(r.drain.unwrap().deadline, Some(ts("2026-03-02T15:20:06Z")));
}

#[test]
fn rebalance_mode_parses() {
    assert_eq!("ignore".parse(), Ok(RebalanceMode::Ignore));
    assert_eq!("replace".parse(), Ok(RebalanceMode::Replace));
    // Karpenter's default: nothing.
    assert_eq!("".parse(), Ok(RebalanceMode::Ignore));
    assert_eq!(RebalanceMode::default(), RebalanceMode::Ignore);
    assert_eq!("drain".parse(), Ok(RebalanceMode::Drain));
    assert!("always".parse::<RebalanceMode>().is_err());
}

fn arb_json() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        "[ -~]{0,24}".prop_map(serde_json::Value::from),
        prop_oneof![
            Just("aws.ec2"),
            Just("aws.health"),
            Just("EC2 Spot Instance Interruption Warning"),
            Just("AWS Health Event"),
            Just(I),
            Just("2026-03-02T14:20:05Z"),
            Just("scheduledChange"),
            Just("EC2"),
        ]
        .prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            prop::collection::btree_map(
                prop_oneof![
                    Just("source".to_string()),
                    Just("detail-type".to_string()),
                    Just("detail".to_string()),
                    Just("time".to_string()),
                    Just("instance-id".to_string()),
                    Just("state".to_string()),
                    Just("affectedEntities".to_string()),
                    Just("entityValue".to_string()),
                    "[a-z-]{1,10}",
                ],
                inner,
                0..5
            )
            .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Paths to every value inside a JSON document.
fn paths(v: &serde_json::Value, here: Vec<String>, out: &mut Vec<Vec<String>>) {
    out.push(here.clone());
    match v {
        serde_json::Value::Object(m) => {
            for (k, c) in m {
                let mut p = here.clone();
                p.push(k.clone());
                paths(c, p, out);
            }
        }
        serde_json::Value::Array(a) => {
            for (i, c) in a.iter().enumerate() {
                let mut p = here.clone();
                p.push(i.to_string());
                paths(c, p, out);
            }
        }
        _ => {}
    }
}

fn at<'a>(v: &'a mut serde_json::Value, path: &[String]) -> &'a mut serde_json::Value {
    path.iter().fold(v, |v, k| match v {
        serde_json::Value::Object(m) => m.get_mut(k).unwrap(),
        serde_json::Value::Array(a) => &mut a[k.parse::<usize>().unwrap()],
        _ => unreachable!(),
    })
}

/// The classification's invariants: known kinds carry at least one valid
/// instance id; unknown ones a non-empty reason; the JSON output has the
/// contract's keys.
fn check(e: &event::Event) -> Result<(), TestCaseError> {
    match &e.kind {
        Kind::Unknown { error } => prop_assert!(!error.is_empty()),
        _ => {
            prop_assert!(!e.instance_ids.is_empty());
            prop_assert!(e.instance_ids.iter().all(|i| is_instance_id(i)));
        }
    }
    let v = to_json(e, RebalanceMode::Replace);
    for k in [
        "kind",
        "source",
        "detailType",
        "id",
        "time",
        "instanceIds",
        "deadline",
        "action",
    ] {
        prop_assert!(v.get(k).is_some(), "missing {}", k);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_json_never_panics(v in arb_json()) {
        check(&classify(&v))?;
    }

    #[test]
    fn arbitrary_text_never_panics(s in "\\PC{0,64}") {
        for e in read_input(&s) {
            check(&e)?;
        }
    }

    #[test]
    fn mutated_fixtures_classify_as_known_or_unknown(
        which in 0usize..13,
        pick in any::<prop::sample::Index>(),
        mutation in 0u8..4,
        replacement in arb_json(),
    ) {
        let (_, text) = fixtures()[which];
        let mut v: serde_json::Value = serde_json::from_str(text).unwrap();
        let mut all = Vec::new();
        paths(&v, Vec::new(), &mut all);
        let path = pick.get(&all).clone();
        match (mutation, path.split_last()) {
            // Remove the value (from its object or list).
            (0, Some((last, parent))) => match at(&mut v, parent) {
                serde_json::Value::Object(m) => { m.remove(last); }
                serde_json::Value::Array(a) => { a.remove(last.parse::<usize>().unwrap()); }
                _ => {}
            },
            // Replace it with anything.
            (1, _) => *at(&mut v, &path) = replacement,
            // Wrap it in a list (e.g. `resources` or `instance-id` as a list).
            (2, _) => { let x = at(&mut v, &path); *x = serde_json::Value::Array(vec![x.take()]); }
            // Turn it into its string form.
            _ => { let x = at(&mut v, &path); *x = serde_json::Value::String(x.to_string()); }
        }
        check(&classify(&v))?;
    }
}
