//! Reserved capacity (`capacityReservationSelectorTerms`, Karpenter 1.6+):
//! claims that allow `reserved` launch into the selected ODCRs and capacity
//! blocks first, through a template that targets the reservation, and fall
//! back to the claim's other capacity types when a reservation is full. moto
//! has no capacity reservations: `tests/moto/server.py` adds them, and
//! refuses a launch into a full or mismatched reservation as EC2 does.

use std::collections::BTreeMap;

use crate::launch_fixtures::*;
use nodesmith::apis::ec2nodeclass::{EC2NodeClassSpec, SelectorTerm};
use nodesmith::launch::LaunchOutcome;
use nodesmith::nodeclaim::{NodeClaim, ReservationRef};
use nodesmith::state::OfferingKey;
use nodesmith_tests::fault_proxy::FaultProxy;
use nodesmith_tests::kube_server::KubeServer;
use nodesmith_tests::moto::{Moto, moto};

/// The fixture's class, selecting the reservations tagged `team=ml`.
fn reserving_class() -> EC2NodeClassSpec {
    EC2NodeClassSpec {
        capacity_reservation_selector_terms: vec![SelectorTerm {
            tags: BTreeMap::from([("team".to_string(), "ml".to_string())]),
            ..Default::default()
        }],
        ..node_class("al2023@latest")
    }
}

async fn available(ec2: &aws_sdk_ec2::Client, id: &str) -> i32 {
    ec2.describe_capacity_reservations()
        .capacity_reservation_ids(id)
        .send()
        .await
        .unwrap()
        .capacity_reservations()[0]
        .available_instance_count()
        .unwrap()
}

fn launched(outcome: LaunchOutcome) -> NodeClaim {
    match outcome {
        LaunchOutcome::Launched(c) => c,
        other => panic!("no launch: {other:?}"),
    }
}

async fn setup() -> (
    Moto,
    KubeServer,
    nodesmith::state::StateStore,
    FaultProxy,
    aws_sdk_ec2::Client,
) {
    let m = moto().await;
    world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let proxy = FaultProxy::start(m.endpoint()).await;
    let ec2 = aws_sdk_ec2::Client::new(&m.sdk_config().await);
    (m, kube, st, proxy, ec2)
}

#[tokio::test]
async fn claims_fill_the_selected_reservation_first_then_fall_back_to_on_demand() {
    let (m, kube, st, proxy, ec2) = setup().await;
    let ml = capacity_reservation(&ec2, "m5.large", "us-east-1b", 1, "ml").await;
    // Not selected by the class (another team's): never used.
    let other = capacity_reservation(&ec2, "m5.large", "us-east-1a", 5, "data").await;
    let l = launcher(&m, proxy.endpoint(), &kube).await;
    let class = reserving_class();

    let first = claim("res-1", &["m5.large", "c5.large"], &["reserved", "on-demand"]);
    let c = launched(l.launch(&pending(&kube, &st, &first, &class).await).await.unwrap());
    assert_eq!(c.capacity_type.as_deref(), Some("reserved"));
    assert_eq!(c.zone.as_deref(), Some("us-east-1b"));
    assert_eq!(
        c.capacity_reservation,
        Some(ReservationRef {
            id: ml.clone(),
            reservation_type: "default".into(),
        })
    );
    let i = &instances_of(&m, "res-1").await[0];
    assert_eq!(
        i.capacity_reservation_id(),
        Some(ml.as_str()),
        "EC2 put it in the reservation"
    );
    assert_eq!(available(&ec2, &ml).await, 0);
    // One on-demand call with the reservation's only offering; its template targets it.
    let fleets = proxy.fleets();
    assert_eq!(fleets.len(), 1, "{fleets:?}");
    assert_eq!(
        (fleets[0].capacity_type.as_str(), fleets[0].overrides.len()),
        ("on-demand", 1)
    );
    let lt = ec2.describe_launch_templates().send().await.unwrap();
    let mut targets = Vec::new();
    for t in lt.launch_templates() {
        let data = template_data(&ec2, t.launch_template_name().unwrap()).await;
        if let Some(id) = data
            .capacity_reservation_specification()
            .and_then(|s| s.capacity_reservation_target())
            .and_then(|t| t.capacity_reservation_id())
        {
            targets.push(id.to_string());
        }
    }
    assert_eq!(targets, vec![ml.clone()]);

    // The reservation is full now: the next claim is on-demand, outside it.
    let second = claim("res-2", &["m5.large"], &["reserved", "on-demand"]);
    let c = launched(l.launch(&pending(&kube, &st, &second, &class).await).await.unwrap());
    assert_eq!(c.capacity_type.as_deref(), Some("on-demand"));
    assert_eq!(c.capacity_reservation, None);
    assert_eq!(instances_of(&m, "res-2").await[0].capacity_reservation_id(), None);
    assert_eq!(
        available(&ec2, &other).await,
        5,
        "an unselected reservation is never used"
    );

    // A claim that does not allow reserved capacity never uses it.
    let third = capacity_reservation(&ec2, "m5.large", "us-east-1c", 1, "ml").await;
    let od = claim("od-1", &["m5.large"], &["on-demand"]);
    let c = launched(l.launch(&pending(&kube, &st, &od, &class).await).await.unwrap());
    assert_eq!(c.capacity_type.as_deref(), Some("on-demand"));
    assert_eq!(available(&ec2, &third).await, 1);
}

#[tokio::test]
async fn a_reservation_that_fills_before_the_call_is_marked_unavailable_and_the_claim_falls_back() {
    let (m, kube, st, proxy, ec2) = setup().await;
    let ml = capacity_reservation(&ec2, "m5.large", "us-east-1b", 2, "ml").await;
    // Another launch takes the room between the read and the call: EC2 refuses.
    proxy.fail_offering(
        "m5.large",
        "us-east-1b",
        Some("on-demand"),
        "ReservationCapacityExceeded",
    );
    let l = launcher(&m, proxy.endpoint(), &kube).await;
    let req = pending(
        &kube,
        &st,
        &claim("race-1", &["m5.large"], &["reserved", "on-demand"]),
        &reserving_class(),
    )
    .await;
    let c = launched(l.launch(&req).await.unwrap());
    assert_eq!(c.capacity_type.as_deref(), Some("on-demand"));
    assert_ne!(
        c.zone.as_deref(),
        Some("us-east-1b"),
        "the failed offering is not retried"
    );
    let marked = marked_unavailable(&st).await;
    // (The proxy's rule fails on-demand m5.large in 1b too, as it cannot tell
    // the calls apart: the fallback goes to another zone.)
    assert!(
        marked.contains(&OfferingKey::new("m5.large", "us-east-1b", "reserved")),
        "{marked:?}"
    );
    assert_eq!(available(&ec2, &ml).await, 2);
    let fleets = proxy.fleets();
    assert_eq!(fleets.len(), 2, "{fleets:?}");
    assert_eq!(fleets[0].failed, 1);
}

#[tokio::test]
async fn a_capacity_block_is_bought_in_its_own_market() {
    let (m, kube, st, proxy, ec2) = setup().await;
    m.seed_reservation(&serde_json::json!({
        "id": "cr-0b10c000000000001", "type": "m5.large", "zone": "us-east-1a", "count": 1,
        "reservationType": "capacity-block", "endDate": "2099-01-01T00:00:00Z", "tags": {"team": "ml"},
    }));
    let l = launcher(&m, proxy.endpoint(), &kube).await;
    let req = pending(
        &kube,
        &st,
        &claim("blk-1", &["m5.large"], &["reserved", "on-demand"]),
        &reserving_class(),
    )
    .await;
    let c = launched(l.launch(&req).await.unwrap());
    assert_eq!(c.capacity_type.as_deref(), Some("reserved"));
    assert_eq!(
        c.capacity_reservation
            .as_ref()
            .map(|r| (r.id.as_str(), r.reservation_type.as_str())),
        Some(("cr-0b10c000000000001", "capacity-block"))
    );
    assert_eq!(proxy.fleets()[0].capacity_type, "capacity-block");
    assert_eq!(available(&ec2, "cr-0b10c000000000001").await, 0);
}

#[tokio::test]
async fn concurrent_launches_never_put_more_instances_in_a_reservation_than_it_holds() {
    let (m, kube, st, proxy, ec2) = setup().await;
    let ml = capacity_reservation(&ec2, "m5.large", "us-east-1b", 1, "ml").await;
    let class = reserving_class();
    let a = pending(
        &kube,
        &st,
        &claim("par-1", &["m5.large"], &["reserved", "on-demand"]),
        &class,
    )
    .await;
    let b = pending(
        &kube,
        &st,
        &claim("par-2", &["m5.large"], &["reserved", "on-demand"]),
        &class,
    )
    .await;
    let (la, lb) = (
        launcher(&m, proxy.endpoint(), &kube).await,
        launcher(&m, proxy.endpoint(), &kube).await,
    );
    let (ra, rb) = tokio::join!(la.launch(&a), lb.launch(&b));
    let mut types: Vec<String> = [launched(ra.unwrap()), launched(rb.unwrap())]
        .into_iter()
        .map(|c| c.capacity_type.unwrap_or_default())
        .collect();
    types.sort();
    assert_eq!(types, ["on-demand", "reserved"]);
    assert_eq!(available(&ec2, &ml).await, 0);
    for claim in ["par-1", "par-2"] {
        assert_eq!(instances_of(&m, claim).await.len(), 1, "{claim}: exactly one instance");
    }
}
