//! ARC zonal shift through the real SDK client against moto's server (the
//! ARC patch in tests/moto/server.py): the zones ARC shifts the cluster away
//! from are read with GetManagedResource on the cluster's ARN; an applied,
//! unexpired shift or an applied autoshift counts, an expired, cancelled or
//! unapplied one does not, and an unreadable answer counts as no shift.

use std::collections::BTreeSet;

use aws_sdk_arczonalshift::error::ProvideErrorMetadata;
use jiff::{SignedDuration, Timestamp};
use nodesmith::zonal_shift::{ZonalShiftError, ZonalShifts, zone_names};
use nodesmith_tests::moto::{REGION, moto};
use serde_json::json;

fn ids(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn the_clusters_active_zonal_shifts_are_read_from_arc() {
    let m = moto().await;
    let arc = aws_sdk_arczonalshift::Client::new(&m.sdk_config().await);
    let arn = format!("arn:aws:eks:{REGION}:123456789012:cluster/demo");
    let reader = ZonalShifts::new(arc.clone(), &arn);
    let now = Timestamp::now();

    // A cluster without zonal shift enabled is no ARC resource: refused as
    // ARC refuses it, and planned as if no zone were shifted.
    let ZonalShiftError::Read { source, .. } = reader.read().await.unwrap_err();
    assert_eq!(source.code(), Some("ResourceNotFoundException"), "{source:?}");
    assert!(reader.away_from(now).await.is_empty());

    m.seed_arc("arc-resource", &json!({"arn": arn})).unwrap();
    assert!(reader.away_from(now).await.is_empty(), "registered, nothing shifted");

    // moto's us-east-1: a = use1-az6, b = use1-az1, c = use1-az2, d = use1-az4.
    let shift = |away: &str, extra: serde_json::Value| {
        let mut spec = json!({"resource": arn, "awayFrom": away});
        if let (Some(o), serde_json::Value::Object(e)) = (spec.as_object_mut(), extra) {
            o.extend(e);
        }
        m.seed_arc("zonal-shift", &spec).unwrap();
    };
    shift("use1-az1", json!({"expiresIn": 3600}));
    shift(
        "use1-az2",
        json!({"expiryTime": (now - SignedDuration::from_secs(60)).to_string()}),
    );
    shift("use1-az4", json!({"status": "CANCELED"}));
    shift("use1-az6", json!({"appliedStatus": "NOT_APPLIED"}));
    let raw = reader.read().await.unwrap();
    assert_eq!(raw.len(), 2, "ARC lists the active shifts only: {raw:?}");
    assert_eq!(reader.away_from(now).await, ids(&["use1-az1"]));
    // Read again past its expiry (the clock passed in), it no longer counts.
    assert!(reader.away_from(now + SignedDuration::from_hours(2)).await.is_empty());

    // An autoshift lasts while ARC keeps it.
    m.seed_arc("autoshift", &json!({"resource": arn, "awayFrom": "use1-az2"}))
        .unwrap();
    assert_eq!(
        reader.away_from(now + SignedDuration::from_hours(2)).await,
        ids(&["use1-az2"])
    );

    // Another resource's shifts are not the cluster's.
    let other = format!("arn:aws:eks:{REGION}:123456789012:cluster/other");
    assert!(ZonalShifts::new(arc, &other).away_from(now).await.is_empty());

    // The ids become the zone names offerings use, by the classes' subnets.
    let class: nodesmith::apis::EC2NodeClass = serde_json::from_value(json!({
        "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "default"},
        "spec": {"role": "r", "amiSelectorTerms": [{"alias": "al2023@latest"}],
                 "subnetSelectorTerms": [{"id": "subnet-1"}], "securityGroupSelectorTerms": [{"id": "sg-1"}]},
        "status": {"subnets": [{"id": "subnet-1", "zone": "us-east-1b", "zoneID": "use1-az1"},
                               {"id": "subnet-2", "zone": "us-east-1c", "zoneID": "use1-az2"}]}
    }))
    .unwrap();
    assert_eq!(
        zone_names(&reader.away_from(now).await, &[class], &[]),
        ids(&["us-east-1b", "us-east-1c"])
    );
}

#[tokio::test]
async fn the_fake_refuses_what_arc_refuses() {
    let m = moto().await;
    let arn = format!("arn:aws:eks:{REGION}:123456789012:cluster/demo");
    let err = |c: &str, spec: serde_json::Value| {
        assert!(m.seed_arc(c, &spec).is_err(), "{c} {spec} was accepted");
    };
    err("zonal-shift", json!({"resource": arn, "awayFrom": "use1-az1"}));
    m.seed_arc("arc-resource", &json!({"arn": arn})).unwrap();
    err("zonal-shift", json!({"resource": arn, "awayFrom": "euw1-az1"}));
    err(
        "zonal-shift",
        json!({"resource": arn, "awayFrom": "use1-az1", "status": "PAUSED"}),
    );
    let arc = aws_sdk_arczonalshift::Client::new(&m.sdk_config().await);
    let short = arc
        .get_managed_resource()
        .resource_identifier("arn")
        .send()
        .await
        .unwrap_err();
    assert_eq!(short.code(), Some("ValidationException"), "{short:?}");
}
