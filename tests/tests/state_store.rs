//! The state store against moto's DynamoDB through the real SDK.

use std::collections::BTreeMap;

use nodesmith::catalog::{Catalog, InstanceTypeInfo, Offering};
use nodesmith::disruption::Reason;
use nodesmith::nodeclaim::{NodeClaim, Phase};
use nodesmith::resources::Resources;
use nodesmith::state::{self, DisruptionRecord, DisruptionStep, OfferingKey, StateError, StateStore};
use nodesmith_tests::moto::moto;

async fn store(m: &nodesmith_tests::moto::Moto) -> StateStore {
    let client = aws_sdk_dynamodb::Client::new(&m.sdk_config().await);
    state::create_table(&client, "nodesmith").await.unwrap();
    StateStore::new(client, "nodesmith")
}

fn claim(name: &str) -> NodeClaim {
    NodeClaim {
        instance_type_options: vec!["m5.large".into(), "m5.xlarge".into()],
        ..NodeClaim::pending(name, "default", "default")
    }
}

#[tokio::test]
async fn nodeclaim_writes_are_conditional_on_version() {
    let m = moto().await;
    let st = store(&m).await;
    let c = st.create_node_claim(&claim("default-a")).await.unwrap();
    assert_eq!(c.version, 1);
    assert!(
        matches!(st.create_node_claim(&claim("default-a")).await, Err(StateError::AlreadyExists(n)) if n == "default-a")
    );

    // Two writers read version 1; the first wins, the second gets a typed conflict.
    let mut first = c.clone();
    first.advance(Phase::Launched, jiff::Timestamp::now()).unwrap();
    first.instance_id = Some("i-0001".into());
    let first = st.update_node_claim(&first).await.unwrap();
    assert_eq!(first.version, 2);
    let mut second = c.clone();
    second.advance(Phase::Terminating, jiff::Timestamp::now()).unwrap();
    match st.update_node_claim(&second).await {
        Err(StateError::Conflict {
            name,
            expected: 1,
            found: Some(2),
        }) => assert_eq!(name, "default-a"),
        other => panic!("expected a conflict, got {other:?}"),
    }
    let stored = st.get_node_claim("default-a").await.unwrap().unwrap();
    assert_eq!(stored.phase, Phase::Launched);
    assert_eq!(stored.version, 2);

    assert!(matches!(
        st.delete_node_claim("default-a", 1).await,
        Err(StateError::Conflict { .. })
    ));
    st.delete_node_claim("default-a", 2).await.unwrap();
    assert_eq!(st.get_node_claim("default-a").await.unwrap(), None);
    assert!(matches!(
        st.update_node_claim(&stored).await,
        Err(StateError::Conflict { found: None, .. })
    ));
}

#[tokio::test]
async fn disruption_writes_are_conditional_on_version() {
    let m = moto().await;
    let st = store(&m).await;
    let record = DisruptionRecord {
        claim: "default-a".into(),
        node: "ip-10-0-1-5.ec2.internal".into(),
        reason: Reason::Expired,
        detail: "expireAfter 720h passed".into(),
        step: DisruptionStep::Tainted,
        replacements: vec![],
        grace_ms: Some(60_000),
        force_from_ms: None,
        started_ms: 1,
        version: 0,
    };
    let first = st.begin_disruption(&record).await.unwrap().unwrap();
    assert_eq!(first.version, 1);
    // A second sweep deciding the same disruption finds it recorded and leaves it.
    assert_eq!(st.begin_disruption(&record).await.unwrap(), None);

    let launching = DisruptionRecord {
        step: DisruptionStep::Launching,
        replacements: vec!["default-b".into()],
        ..first.clone()
    };
    let launching = st.update_disruption(&launching).await.unwrap();
    assert_eq!(launching.version, 2);
    // A writer that read version 1 is refused, and the stored record is the first writer's.
    let stale = DisruptionRecord {
        step: DisruptionStep::Draining,
        ..first.clone()
    };
    assert!(matches!(
        st.update_disruption(&stale).await,
        Err(StateError::Stale { expected: 1, .. })
    ));
    assert_eq!(st.disruptions().await.unwrap(), vec![launching.clone()]);

    assert!(matches!(
        st.end_disruption("default-a", 1).await,
        Err(StateError::Stale { .. })
    ));
    st.end_disruption("default-a", 2).await.unwrap();
    assert!(st.disruptions().await.unwrap().is_empty());
}

#[tokio::test]
async fn instance_index_finds_launched_claims_and_listing_sees_all() {
    let m = moto().await;
    let st = store(&m).await;
    for n in ["p-1", "p-2", "p-3"] {
        st.create_node_claim(&claim(n)).await.unwrap();
    }
    let mut c = st.get_node_claim("p-2").await.unwrap().unwrap();
    c.advance(Phase::Launched, jiff::Timestamp::now()).unwrap();
    c.instance_id = Some("i-0abc".into());
    st.update_node_claim(&c).await.unwrap();
    let mut t = st.get_node_claim("p-3").await.unwrap().unwrap();
    t.advance(Phase::Terminating, jiff::Timestamp::now()).unwrap();
    st.update_node_claim(&t).await.unwrap();

    assert_eq!(
        st.node_claim_by_instance("i-0abc").await.unwrap().map(|c| c.name),
        Some("p-2".to_string())
    );
    assert_eq!(st.node_claim_by_instance("i-none").await.unwrap(), None);
    let all: Vec<String> = st
        .list_node_claims()
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(all, vec!["p-1", "p-2", "p-3"]);
    let live: Vec<String> = st
        .in_flight_node_claims()
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(live, vec!["p-1", "p-2"]);
}

#[tokio::test]
async fn leases_are_exclusive_under_concurrent_acquirers_and_fence_stale_holders() {
    let m = moto().await;
    let st = store(&m).await;
    let now = 1_000_000;
    // Eight acquirers race for the same lease at the same instant: exactly one wins.
    let tries = (0..8).map(|i| {
        let st = st.clone();
        async move {
            st.acquire_lease("provision", &format!("holder-{i}"), 30_000, now)
                .await
                .unwrap()
        }
    });
    let won: Vec<_> = futures::future::join_all(tries).await.into_iter().flatten().collect();
    assert_eq!(won.len(), 1, "{won:?}");
    let a = won[0].clone();
    assert_eq!(a.version, 1);

    // Re-acquiring as the same holder is fine; renewing extends.
    let a = st.renew_lease(&a, 30_000, now + 10_000).await.unwrap();
    assert_eq!(a.until_ms, now + 40_000);
    assert_eq!(
        st.acquire_lease("provision", "other", 30_000, now + 39_999)
            .await
            .unwrap(),
        None
    );

    // After expiry another holder takes it with a higher fencing token; the old holder is fenced.
    let b = st
        .acquire_lease("provision", "other", 30_000, now + 40_000)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(b.version, 2);
    assert!(matches!(
        st.renew_lease(&a, 30_000, now + 40_001).await,
        Err(StateError::LeaseLost { version: 1, .. })
    ));
    match st
        .create_node_claims_fenced(&a, &[claim("stale-1")], now + 40_001)
        .await
    {
        Err(StateError::LeaseLost { .. }) => {}
        other => panic!("stale holder wrote: {other:?}"),
    }
    assert_eq!(st.get_node_claim("stale-1").await.unwrap(), None);

    let made = st
        .create_node_claims_fenced(&b, &[claim("fresh-1"), claim("fresh-2")], now + 40_001)
        .await
        .unwrap();
    assert_eq!(made.iter().map(|c| c.version).collect::<Vec<_>>(), vec![1, 1]);
    assert!(matches!(
        st.create_node_claims_fenced(&b, &[claim("fresh-3"), claim("fresh-1")], now + 40_002).await,
        Err(StateError::AlreadyExists(n)) if n == "fresh-1"
    ));
    assert_eq!(
        st.get_node_claim("fresh-3").await.unwrap(),
        None,
        "a failed transaction writes nothing"
    );

    st.release_lease(&b, now + 40_003).await.unwrap();
    let c = st
        .acquire_lease("provision", "third", 30_000, now + 40_004)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(c.version, 3);
    assert_eq!(
        st.read_lease("provision").await.unwrap().map(|l| l.holder),
        Some("third".to_string())
    );
    assert!(
        matches!(
            st.delete_lease(&b, now + 40_005).await,
            Err(StateError::LeaseLost { .. })
        ),
        "only the holder deletes"
    );
    st.delete_lease(&c, now + 40_005).await.unwrap();
    assert_eq!(st.read_lease("provision").await.unwrap(), None);
}

#[tokio::test]
async fn unavailable_offerings_expire_on_read() {
    let m = moto().await;
    let st = store(&m).await;
    let now = state::now_secs();
    let a = OfferingKey::new("m5.large", "us-east-1a", "spot");
    let b = OfferingKey::new("c5.large", "us-east-1b", "on-demand");
    st.mark_unavailable(
        std::slice::from_ref(&a),
        "InsufficientInstanceCapacity",
        now + state::UNAVAILABLE_TTL_SECS,
    )
    .await
    .unwrap();
    // Already expired, but DynamoDB (and moto) may still return it: the read must drop it.
    st.mark_unavailable(std::slice::from_ref(&b), "InsufficientInstanceCapacity", now - 1)
        .await
        .unwrap();
    let got = st.unavailable_offerings(now).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].key, a);
    assert_eq!(got[0].reason, "InsufficientInstanceCapacity");
    assert!(
        st.unavailable_offerings(now + state::UNAVAILABLE_TTL_SECS)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn idempotency_records_hold_until_they_expire() {
    let m = moto().await;
    let st = store(&m).await;
    assert!(!st.is_processed("msg-1", 100).await.unwrap());
    assert!(st.record_processed("msg-1", 200, 100).await.unwrap());
    assert!(st.is_processed("msg-1", 150).await.unwrap());
    assert!(!st.record_processed("msg-1", 300, 150).await.unwrap());
    assert!(!st.is_processed("msg-1", 200).await.unwrap(), "expired");
    assert!(
        st.record_processed("msg-1", 400, 200).await.unwrap(),
        "expired record is taken over"
    );
}

#[tokio::test]
async fn catalog_snapshot_round_trips_across_parts_and_generations() {
    let m = moto().await;
    let st = store(&m).await;
    assert_eq!(st.get_catalog().await.unwrap(), None);
    // Enough types that the JSON spans several parts.
    let types: Vec<InstanceTypeInfo> = (0..3000)
        .map(|i| InstanceTypeInfo {
            name: format!("x{i}.large"),
            labels: BTreeMap::from([("kubernetes.io/arch".to_string(), "amd64".to_string())]),
            capacity: Resources::new(),
            allocatable: None,
            vcpus: 2,
            eni_max_pods: 29,
            offerings: ["us-east-1a", "us-east-1b"]
                .iter()
                .map(|z| Offering {
                    zone: z.to_string(),
                    capacity_type: "spot".into(),
                    price: (i % 64) as f64 * 0.25,
                    available: true,
                    reservation: None,
                })
                .collect(),
        })
        .collect();
    let big = Catalog {
        region: "us-east-1".into(),
        instance_types: types,
    };
    assert!(serde_json::to_vec(&big).unwrap().len() > state::PART_BYTES * 2);
    let client = aws_sdk_dynamodb::Client::new(&m.sdk_config().await);
    // Each read through a store of its own (a cold container), so the parts are read.
    let cold = || StateStore::new(client.clone(), "nodesmith");
    let g1 = st.put_catalog(&big).await.unwrap();
    // (prices are binary fractions: serde_json's default float parsing may drop a last bit)
    assert!(
        cold().get_catalog().await.unwrap().as_ref() == Some(&big),
        "big catalog did not round-trip"
    );
    let small = Catalog {
        region: "us-east-1".into(),
        instance_types: big.instance_types[..2].to_vec(),
    };
    let g2 = st.put_catalog(&small).await.unwrap();
    assert_ne!(g1, g2);
    let reader = cold();
    assert_eq!(reader.get_catalog().await.unwrap(), Some(small.clone()));

    // A warm store reads only the head again: with the parts gone, the store
    // that wrote them and the store that read them still answer, and a fresh
    // one (a cold container) says the table is damaged.
    let parts = client
        .scan()
        .table_name("nodesmith")
        .send()
        .await
        .unwrap()
        .items()
        .iter()
        .filter(|it| it["sk"].as_s().is_ok_and(|s| s.starts_with(&format!("PART#{g2}#"))))
        .map(|it| (it["pk"].clone(), it["sk"].clone()))
        .collect::<Vec<_>>();
    assert!(!parts.is_empty());
    for (pk, sk) in parts {
        client
            .delete_item()
            .table_name("nodesmith")
            .key("pk", pk)
            .key("sk", sk)
            .send()
            .await
            .unwrap();
    }
    assert_eq!(st.get_catalog().await.unwrap(), Some(small.clone()), "the writer");
    assert_eq!(reader.get_catalog().await.unwrap(), Some(small), "the reader");
    assert!(matches!(cold().get_catalog().await, Err(StateError::Corrupt { .. })));
}

#[tokio::test]
async fn cost_counters_add_up_per_day_and_function_and_read_back_by_range() {
    use jiff::civil::date;
    use nodesmith::state::{COST_TTL_DAYS, CostEntry, FunctionCost};
    let m = moto().await;
    let st = store(&m).await;
    let entry = |function: &str, day, nano_usd, fleet| CostEntry {
        function: function.into(),
        day,
        nano_usd,
        fleet_delta_nano_usd_per_hour: fleet,
    };
    let (nov30, dec1, dec2) = (date(2026, 11, 30), date(2026, 12, 1), date(2026, 12, 2));
    // Concurrent invocations of one day add to one item without losing any.
    let adds: Vec<CostEntry> = (0..10).map(|_| entry("sweep", dec1, 867, 0)).collect();
    futures::future::try_join_all(adds.iter().map(|e| st.add_cost(e)))
        .await
        .unwrap();
    st.add_cost(&entry("launch", dec1, 2_000, 96_000_000)).await.unwrap();
    st.add_cost(&entry("launch", dec1, 1_000, -41_600_000)).await.unwrap();
    st.add_cost(&entry("sweep", nov30, 5, 0)).await.unwrap();
    st.add_cost(&entry("sweep", dec2, 7, 0)).await.unwrap();

    let days = st.costs(dec1, dec1).await.unwrap();
    assert_eq!(days.len(), 1);
    assert_eq!(days[0].day, dec1);
    assert_eq!(
        days[0].functions["sweep"],
        FunctionCost {
            nano_usd: 8_670,
            invocations: 10,
            fleet_delta_nano_usd_per_hour: 0
        }
    );
    assert_eq!(
        days[0].functions["launch"],
        FunctionCost {
            nano_usd: 3_000,
            invocations: 2,
            fleet_delta_nano_usd_per_hour: 54_400_000
        }
    );
    assert_eq!(days[0].nano_usd(), 11_670);
    // Both ends of the range are included; days outside it are not read.
    let all: Vec<_> = st.costs(nov30, dec2).await.unwrap().iter().map(|d| d.day).collect();
    assert_eq!(all, [nov30, dec1, dec2]);
    let tail: Vec<_> = st
        .costs(dec2, date(2026, 12, 31))
        .await
        .unwrap()
        .iter()
        .map(|d| d.day)
        .collect();
    assert_eq!(tail, [dec2]);

    // The counter expires with the table's TTL, 400 days after its day began.
    let item = st
        .client()
        .get_item()
        .table_name(st.table())
        .key("pk", aws_sdk_dynamodb::types::AttributeValue::S("COST".into()))
        .key(
            "sk",
            aws_sdk_dynamodb::types::AttributeValue::S("DAY#2026-12-01".into()),
        )
        .send()
        .await
        .unwrap();
    let day_start = dec1.to_zoned(jiff::tz::TimeZone::UTC).unwrap().timestamp().as_second();
    assert_eq!(
        item.item().unwrap()[state::TTL_ATTRIBUTE].as_n().unwrap(),
        &(day_start + COST_TTL_DAYS * 86_400).to_string()
    );
    // A name that would make odd attribute names is refused before any call.
    assert!(st.add_cost(&entry("Sweep-2", dec1, 1, 0)).await.is_err());
}

#[tokio::test]
async fn the_lambda_meter_counts_each_invocation_in_the_table() {
    let m = moto().await;
    let st = store(&m).await;
    let meter = nodesmith::lambda::Meter::new("launch", Some(st.clone()));
    assert_eq!(meter.run(async { ("launched", 0.096) }).await, "launched");
    assert_eq!(meter.run(async { ("again", 0.0) }).await, "again");
    let today = jiff::Timestamp::now().to_zoned(jiff::tz::TimeZone::UTC).date();
    let days = st.costs(today.yesterday().unwrap(), today).await.unwrap();
    let launch = days
        .iter()
        .filter_map(|d| d.functions.get("launch"))
        .fold((0, 0, 0), |a, f| {
            (
                a.0 + f.invocations,
                a.1 + f.nano_usd,
                a.2 + f.fleet_delta_nano_usd_per_hour,
            )
        });
    assert_eq!(launch.0, 2);
    // Two requests at least; the first also paid for its init phase.
    assert!(launch.1 >= 400, "{launch:?}");
    assert_eq!(launch.2, 96_000_000);
}

/// The parts of one catalog generation in the table.
async fn catalog_parts(m: &nodesmith_tests::moto::Moto, generation: &str) -> usize {
    let client = aws_sdk_dynamodb::Client::new(&m.sdk_config().await);
    client
        .scan()
        .table_name("nodesmith")
        .send()
        .await
        .unwrap()
        .items()
        .iter()
        .filter(|it| {
            it["sk"]
                .as_s()
                .is_ok_and(|s| s.starts_with(&format!("PART#{generation}#")))
        })
        .count()
}

#[tokio::test]
async fn a_replaced_catalog_generation_stays_readable_for_a_while() {
    let m = moto().await;
    let st = store(&m).await;
    let catalog = |n: usize| Catalog {
        region: "us-east-1".into(),
        instance_types: (0..n)
            .map(|i| InstanceTypeInfo {
                name: format!("x{i}.large"),
                labels: BTreeMap::new(),
                capacity: Resources::new(),
                allocatable: None,
                vcpus: 2,
                eni_max_pods: 29,
                offerings: vec![],
            })
            .collect(),
    };
    let t0 = state::now_ms();
    let g1 = st.put_catalog_at(&catalog(1), t0).await.unwrap();
    // A reader (a cold container) read the head naming g1 a moment ago; the sweep
    // stores a new generation before it reads g1's parts.
    let g2 = st.put_catalog_at(&catalog(2), t0 + 1000).await.unwrap();
    assert_ne!(g1, g2);
    assert_eq!(
        catalog_parts(&m, &g1).await,
        1,
        "the reader of {g1} still finds its parts"
    );
    let cold = StateStore::new(aws_sdk_dynamodb::Client::new(&m.sdk_config().await), st.table());
    assert_eq!(cold.get_catalog().await.unwrap(), Some(catalog(2)));
    // Replaced again within the grace: both older generations stay.
    let g3 = st.put_catalog_at(&catalog(3), t0 + 2000).await.unwrap();
    assert_eq!((catalog_parts(&m, &g1).await, catalog_parts(&m, &g2).await), (1, 1));
    // Once no reader can still hold an old head, a write deletes what retired before then.
    let later = t0 + 2000 + state::RETIRED_GRACE_MS;
    let g4 = st.put_catalog_at(&catalog(4), later).await.unwrap();
    assert_eq!(catalog_parts(&m, &g1).await, 0, "{g1} retired a grace ago");
    assert_eq!(catalog_parts(&m, &g2).await, 0, "{g2} retired a grace ago");
    assert_eq!((catalog_parts(&m, &g3).await, catalog_parts(&m, &g4).await), (1, 1));
    assert_eq!(cold.get_catalog().await.unwrap(), Some(catalog(4)));
}

/// A claim for a small pod that fits 800 instance types, made, sent to
/// CreateFleet and launched as launch does it, is a small item at rest and
/// reads back whole (issue 32: claim items were 55-85 KB).
#[tokio::test]
async fn a_claim_that_fits_800_types_is_stored_under_8_kb_and_reads_back_whole() {
    use nodesmith::nodeclaim::{AttemptOverride, LaunchAttempt, LaunchedInstance};
    use nodesmith::requirements::{Requirement, Requirements};
    let m = moto().await;
    let st = store(&m).await;
    let names: Vec<String> = (0..800)
        .map(|i| format!("c{}g{}.{}xlarge", i % 9, i / 9, i % 48))
        .collect();
    let mut requirements = Requirements::default();
    requirements.add(Requirement::in_values(
        nodesmith::labels::CAPACITY_TYPE,
        &["spot", "on-demand"],
    ));
    let planned = nodesmith::scheduling::NewNodeClaim {
        name: "default-w8h3k".into(),
        node_pool: "default".into(),
        node_class: "default".into(),
        requirements,
        instance_type_options: names.clone(),
        instance_type: names[0].clone(),
        zone: "us-east-1a".into(),
        capacity_type: "spot".into(),
        price: 0.0123,
        allocatable: Resources::new(),
        labels: BTreeMap::new(),
        template_labels: BTreeMap::new(),
        taints: Vec::new(),
        startup_taints: Vec::new(),
        pods: Vec::new(),
        requests: Resources::new(),
    };
    let mut c = st
        .create_node_claim(&planned.to_node_claim(jiff::Timestamp::now()))
        .await
        .unwrap();
    let overrides = c
        .instance_type_options
        .iter()
        .flat_map(|t| {
            nodesmith_tests::moto::ZONES.iter().map(|z| AttemptOverride {
                instance_type: t.clone(),
                zone: z.to_string(),
                subnet_id: "subnet-0123456789abcdef0".into(),
                template: "nodesmith-0f3c9a1b2d4e5f60718293a4b5c6d7e8f9012345".into(),
                price: Some(0.0456),
                capacity_reservation: None,
            })
        })
        .collect();
    c.launch_attempt = Some(LaunchAttempt {
        number: 1,
        client_token: "token-1".into(),
        capacity_type: "spot".into(),
        overrides,
        tags: BTreeMap::from([("karpenter.sh/nodepool".to_string(), "default".to_string())]),
        concluded: false,
        context: None,
    });
    let mut c = st.update_node_claim(&c).await.unwrap();
    c.launched(
        LaunchedInstance {
            instance_id: "i-0123456789abcdef0".into(),
            instance_type: names[0].clone(),
            zone: "us-east-1a".into(),
            capacity_type: "spot".into(),
            price: Some(0.0123),
            capacity_reservation: None,
            image_id: None,
        },
        jiff::Timestamp::now(),
    )
    .unwrap();
    let c = st.update_node_claim(&c).await.unwrap();

    let raw = st
        .client()
        .get_item()
        .table_name("nodesmith")
        .key(
            "pk",
            aws_sdk_dynamodb::types::AttributeValue::S(state::PK_NODECLAIM.into()),
        )
        .key("sk", aws_sdk_dynamodb::types::AttributeValue::S(c.name.clone()))
        .send()
        .await
        .unwrap();
    let it = raw.item().unwrap();
    let bytes: usize = it
        .iter()
        .map(|(k, v)| {
            let value = v.as_s().or(v.as_n()).map(String::len);
            k.len() + value.or_else(|_| v.as_b().map(|b| b.as_ref().len())).unwrap_or(0)
        })
        .sum();
    assert!(bytes < 8 * 1024, "stored claim item: {bytes} bytes");
    assert!(it.contains_key(state::PACKED_CLAIM_ATTRIBUTE), "stored packed: {it:?}");
    let back = st.get_node_claim(&c.name).await.unwrap().unwrap();
    assert_eq!(back, c);
    assert_eq!(back.instance_type_options, names[..60], "the cheapest 60, in order");
    assert_eq!(
        back.requirements()
            .get(nodesmith::labels::INSTANCE_TYPE)
            .map(|r| r.values.len()),
        Some(60)
    );
}

/// The meter prices DynamoDB and SQS from every call the SDK makes (through
/// `nodesmith::transport::sdk_defaults`, as in the functions): the real clients
/// against moto, counted where the calls pass.
#[tokio::test]
async fn every_dynamodb_and_sqs_call_is_counted_for_the_meter() {
    let m = moto().await;
    let st = store(&m).await;
    let sqs = aws_sdk_sqs::Client::new(&m.sdk_config().await);
    let queue = sqs
        .create_queue()
        .queue_name("usage")
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    // Whatever came before is not this test's (moto's lock keeps other tests' calls out).
    let _ = nodesmith::usage::take();
    st.create_node_claim(&claim("default-a")).await.unwrap();
    let listed = st.list_node_claims().await.unwrap();
    assert_eq!(listed.len(), 1);
    // 100 KB: two of SQS's 64 KB request units.
    sqs.send_message()
        .queue_url(&queue)
        .message_body("x".repeat(100 * 1024))
        .send()
        .await
        .unwrap();
    let used = nodesmith::usage::take();
    assert!((1.0..=4.0).contains(&used.dynamodb_write_units), "{used:?}");
    assert!((0.5..=4.0).contains(&used.dynamodb_read_units), "{used:?}");
    assert_eq!(used.sqs_requests, 2, "{used:?}");
    let inv = nodesmith::metering::Invocation {
        duration: std::time::Duration::from_millis(100),
        init: None,
        memory_mb: 512,
    };
    let costs = nodesmith::metering::ServiceCosts::of(&inv, &used);
    assert!(costs.dynamodb > 0.0 && costs.sqs > 0.0, "{costs:?}");
}
