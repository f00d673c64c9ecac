//! Table tests: which nodes left their reservation, how they are relabelled,
//! and when a capacity block's nodes are drained.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::json;

use super::*;
use crate::ec2::{Instance, InstanceState};
use crate::nodeclaim::{NodeClaim, Phase, ReservationRef};

const NOW: &str = "2026-03-01T12:00:00Z";

fn now() -> Timestamp {
    NOW.parse().unwrap()
}

fn mins(m: i64) -> Timestamp {
    now().checked_add(SignedDuration::from_mins(m)).unwrap()
}

fn reservation(id: &str, kind: &str) -> ReservationRef {
    ReservationRef {
        id: id.into(),
        reservation_type: kind.into(),
    }
}

/// An Initialized m.xlarge claim in zone a on instance `i-<name>`, in `reservation` if given.
fn claim(name: &str, phase: Phase, reservation: Option<ReservationRef>) -> NodeClaim {
    let reserved = reservation.is_some();
    let mut labels = BTreeMap::from([(
        labels::CAPACITY_TYPE.to_string(),
        if reserved { "reserved" } else { "on-demand" }.to_string(),
    )]);
    if let Some(r) = &reservation {
        labels.insert(labels::aws::CAPACITY_RESERVATION_ID.into(), r.id.clone());
        labels.insert(
            labels::aws::CAPACITY_RESERVATION_TYPE.into(),
            r.reservation_type.clone(),
        );
    }
    NodeClaim {
        phase,
        instance_id: Some(format!("i-{name}")),
        instance_type: Some("m.xlarge".into()),
        zone: Some("test-zone-a".into()),
        capacity_type: Some(if reserved { "reserved" } else { "on-demand" }.into()),
        price: Some(if reserved { 0.00000002 } else { 0.20 }),
        capacity_reservation: reservation,
        node_name: Some(format!("n-{name}")),
        labels,
        ..NodeClaim::pending(name, "default", "default")
    }
}

/// The claim's instance as EC2 reports it: in `reservation`, or on `lifecycle` (on-demand, spot).
fn instance(name: &str, state: InstanceState, reservation: Option<&str>, lifecycle: &str) -> Instance {
    Instance {
        id: format!("i-{name}"),
        instance_type: "m.xlarge".into(),
        zone: Some("test-zone-a".into()),
        subnet_id: None,
        image_id: None,
        security_group_ids: BTreeSet::new(),
        state,
        capacity_type: if reservation.is_some() { "reserved" } else { lifecycle }.into(),
        capacity_reservation: reservation.map(|id| self::reservation(id, "default")),
        launch_time: None,
        tags: BTreeMap::new(),
    }
}

/// The claim's Node, with the capacity-type label `ct` and the reservation labels when `reserved`.
fn node(name: &str, ct: &str, reserved: bool) -> Node {
    let mut labels = json!({"karpenter.sh/capacity-type": ct});
    if reserved {
        labels["karpenter.k8s.aws/capacity-reservation-id"] = json!("cr-1");
        labels["karpenter.k8s.aws/capacity-reservation-type"] = json!("default");
    }
    serde_json::from_value(json!({
        "metadata": {"name": format!("n-{name}"), "labels": labels},
        "spec": {"providerID": format!("aws:///test-zone-a/i-{name}")}
    }))
    .unwrap()
}

/// A case of the table below: its name, the claim, its instance and Node,
/// and whether (Node relabelled, claim demoted).
type Case = (&'static str, NodeClaim, Instance, Node, Option<(bool, bool)>);

#[test]
fn nodes_out_of_their_reservation_are_found_from_ec2_s_word() {
    let catalog = crate::scheduling::fixtures::catalog();
    let odcr = || Some(reservation("cr-1", "default"));
    let running = InstanceState::Running;
    // (case, claim, instance, node, expected (node relabelled, claim demoted))
    let cases: Vec<Case> = vec![
        (
            "expired: claim and Node both move",
            claim("a", Phase::Initialized, odcr()),
            instance("a", running.clone(), None, "on-demand"),
            node("a", "reserved", true),
            Some((true, true)),
        ),
        (
            "still in its reservation",
            claim("a", Phase::Initialized, odcr()),
            instance("a", running.clone(), Some("cr-1"), "on-demand"),
            node("a", "reserved", true),
            None,
        ),
        (
            "the claim was demoted, the Node write failed: the Node alone",
            claim("a", Phase::Initialized, None),
            instance("a", running.clone(), None, "on-demand"),
            node("a", "reserved", true),
            Some((true, false)),
        ),
        (
            "a Node still carrying only a reservation label",
            claim("a", Phase::Initialized, None),
            instance("a", running.clone(), None, "on-demand"),
            node("a", "on-demand", true),
            Some((true, false)),
        ),
        (
            "launched, not registered yet: the claim alone (registration labels from it)",
            claim("a", Phase::Launched, odcr()),
            instance("a", running.clone(), None, "on-demand"),
            node("other", "on-demand", false),
            Some((false, true)),
        ),
        (
            "already on-demand everywhere",
            claim("a", Phase::Initialized, None),
            instance("a", running.clone(), None, "on-demand"),
            node("a", "on-demand", false),
            None,
        ),
        (
            "being drained: it goes anyway",
            claim("a", Phase::Draining, odcr()),
            instance("a", running.clone(), None, "on-demand"),
            node("a", "reserved", true),
            None,
        ),
        (
            "shutting down",
            claim("a", Phase::Initialized, odcr()),
            instance("a", InstanceState::ShuttingDown, None, "on-demand"),
            node("a", "reserved", true),
            None,
        ),
        (
            "EC2 says spot: not ours to relabel",
            claim("a", Phase::Initialized, odcr()),
            instance("a", running.clone(), None, "spot"),
            node("a", "reserved", true),
            None,
        ),
    ];
    for (name, c, i, n, want) in cases {
        let got = left_reservation(&[c], &[n], &[i], Some(&catalog));
        let got = got.first().map(|l| {
            assert_eq!((l.claim.as_str(), l.instance.as_str()), ("a", "i-a"), "{name}");
            assert_eq!(l.on_demand_price, Some(0.20), "{name}: m.xlarge on demand");
            (l.node.is_some(), l.claim_reserved)
        });
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn a_demoted_claim_records_on_demand_at_the_on_demand_price() {
    let c = claim("a", Phase::Initialized, Some(reservation("cr-1", "default")));
    let d = demoted(&c, "i-a", Some(0.20)).expect("demoted");
    assert_eq!(d.capacity_type.as_deref(), Some("on-demand"));
    assert_eq!(d.price, Some(0.20));
    assert_eq!(d.capacity_reservation, None);
    assert_eq!(
        d.labels,
        BTreeMap::from([(labels::CAPACITY_TYPE.to_string(), "on-demand".to_string())])
    );
    assert_eq!(d.phase, Phase::Initialized);
    // Idempotent, and never a claim that moved to another instance.
    assert_eq!(demoted(&d, "i-a", Some(0.20)), None);
    assert_eq!(demoted(&c, "i-other", Some(0.20)), None);
}

#[test]
fn the_relabel_sets_on_demand_and_drops_the_reservation_labels() {
    let u = on_demand_labels();
    assert!(!u.is_satisfied_by(&node("a", "reserved", true)));
    assert!(
        !u.is_satisfied_by(&node("a", "on-demand", true)),
        "a reservation label left"
    );
    assert!(u.is_satisfied_by(&node("a", "on-demand", false)));
}

#[test]
fn a_capacity_block_expires_forty_minutes_before_its_end() {
    // (end, minutes from now; expiring?)
    for (end, want) in [
        (41, false),
        (40, true),
        (35, true),
        (0, true),
        (-5, true),
        (24 * 60, false),
    ] {
        assert_eq!(block_expiring(mins(end), now()), want, "block ending in {end} min");
    }
}

#[test]
fn nodes_of_an_expiring_block_are_drained_before_ec2_reclaims_them() {
    let block = |id: &str| Some(reservation(id, "capacity-block"));
    let mut graceful = claim("grace", Phase::Initialized, block("cr-soon"));
    graceful.termination_grace_period = Some(crate::apis::NillableDuration::Duration(Duration::from_secs(60)));
    let claims = vec![
        claim("soon", Phase::Initialized, block("cr-soon")),
        graceful,
        claim("launched", Phase::Launched, block("cr-soon")),
        claim("later", Phase::Initialized, block("cr-later")),
        claim("odcr", Phase::Initialized, Some(reservation("cr-soon", "default"))),
        claim("draining", Phase::Draining, block("cr-soon")),
        claim("busy", Phase::Initialized, block("cr-soon")),
        claim("unknown", Phase::Initialized, block("cr-gone")),
        claim("plain", Phase::Initialized, None),
    ];
    assert_eq!(
        blocks_in_use(&claims),
        BTreeSet::from(["cr-later".to_string(), "cr-soon".to_string(), "cr-gone".to_string()])
    );
    let ends = BTreeMap::from([("cr-soon".to_string(), mins(35)), ("cr-later".to_string(), mins(120))]);
    let busy = BTreeSet::from(["busy".to_string()]);
    let got: Vec<(String, Option<String>, &str, Option<Timestamp>)> = block_endings(&claims, &ends, &busy, now())
        .into_iter()
        .map(|b| {
            assert_eq!(b.policy.force_from, b.policy.deadline, "{}", b.claim);
            (b.claim, b.node, b.reason, b.policy.deadline)
        })
        .collect();
    assert_eq!(
        got,
        vec![
            // EC2 starts reclaiming 30 minutes before the end: 5 minutes from now.
            (
                "soon".to_string(),
                Some("n-soon".to_string()),
                CAPACITY_BLOCK_EXPIRING,
                Some(mins(5))
            ),
            // A shorter grace period bounds it first.
            (
                "grace".to_string(),
                Some("n-grace".to_string()),
                CAPACITY_BLOCK_EXPIRING,
                Some(mins(1))
            ),
            (
                "launched".to_string(),
                Some("n-launched".to_string()),
                CAPACITY_BLOCK_EXPIRING,
                Some(mins(5))
            ),
        ]
    );
    // A block already past EC2's reclaim: the drain is forced at once.
    let late = BTreeMap::from([("cr-soon".to_string(), mins(10))]);
    let b = &block_endings(&claims[..1], &late, &BTreeSet::new(), now())[0];
    assert!(b.policy.forced_at(now()), "{b:?}");
}
