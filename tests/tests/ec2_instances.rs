//! The EC2 instances adapter (`nodesmith::ec2::Instances`) against moto, with
//! the real SDK client; the fault proxy counts calls and injects what moto
//! does not do.

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_ec2::types::{InstanceType, ResourceType, Tag, TagSpecification};
use nodesmith::apis::EC2NodeClass;
use nodesmith::ec2::instances::{NOT_FOUND_CODE, TERMINATE_BATCH};
use nodesmith::ec2::{InstanceState, Instances, InstancesError, Termination};
use nodesmith::nodeclaim::NodeClaim;
use nodesmith::nodeclass::template::instance_tags;
use nodesmith_tests::fault_proxy::FaultProxy;
use nodesmith_tests::moto::{Moto, moto};

const CLUSTER: &str = "demo";
/// An AMI the moto harness seeds.
const AMI: &str = "ami-0a1b2c3d4e5f60001";
/// An id moto has never issued.
const UNKNOWN: &str = "i-0123456789abcdef0";

async fn ec2(m: &Moto) -> aws_sdk_ec2::Client {
    aws_sdk_ec2::Client::new(&m.sdk_config().await)
}

/// The tags launch puts on a claim's instance in `cluster`.
fn claim_tags(cluster: &str, claim: &str) -> BTreeMap<String, String> {
    let class = EC2NodeClass::new("default", Default::default());
    instance_tags(cluster, &NodeClaim::pending(claim, "default", "default"), &class)
}

/// Runs `count` instances in one reservation with these tags; their ids.
async fn run(ec2: &aws_sdk_ec2::Client, tags: &BTreeMap<String, String>, count: i32) -> Vec<String> {
    let spec = tags.iter().fold(
        TagSpecification::builder().resource_type(ResourceType::Instance),
        |b, (k, v)| b.tags(Tag::builder().key(k).value(v).build()),
    );
    let out = ec2
        .run_instances()
        .image_id(AMI)
        .instance_type(InstanceType::M5Large)
        .min_count(count)
        .max_count(count)
        .tag_specifications(spec.build())
        .send()
        .await
        .unwrap();
    out.instances()
        .iter()
        .map(|i| i.instance_id().unwrap().to_string())
        .collect()
}

async fn terminate_directly(ec2: &aws_sdk_ec2::Client, ids: &[String]) {
    ec2.terminate_instances()
        .set_instance_ids(Some(ids.to_vec()))
        .send()
        .await
        .unwrap();
}

/// How many `InstanceId.N` parameters each recorded call carried.
fn ids_per_call(proxy: &FaultProxy, action: &str) -> Vec<usize> {
    proxy
        .forms(action)
        .iter()
        .map(|f| f.iter().filter(|(k, _)| k.starts_with("InstanceId.")).count())
        .collect()
}

#[tokio::test]
async fn find_by_claim_finds_only_the_live_tagged_instance_of_this_cluster() {
    let m = moto().await;
    let ec2 = ec2(&m).await;
    let terminated = run(&ec2, &claim_tags(CLUSTER, "c-1"), 1).await;
    terminate_directly(&ec2, &terminated).await;
    let other_cluster = run(&ec2, &claim_tags("other", "c-1"), 1).await;
    let other_claim = run(&ec2, &claim_tags(CLUSTER, "c-2"), 1).await;
    let mine = run(&ec2, &claim_tags(CLUSTER, "c-1"), 1).await;

    let instances = Instances::new(ec2.clone(), CLUSTER);
    let found = instances
        .find_by_claim("c-1")
        .await
        .unwrap()
        .expect("the claim's instance");
    assert_eq!(found.id, mine[0]);
    assert_eq!(found.node_claim(), Some("c-1"));
    assert_eq!(found.node_pool(), Some("default"));
    assert_eq!(found.instance_type, "m5.large");
    assert!(matches!(found.state, InstanceState::Pending | InstanceState::Running));
    assert!(found.zone.is_some() && found.launch_time.is_some(), "{found:?}");

    assert_eq!(
        instances.find_by_claim("c-2").await.unwrap().map(|i| i.id),
        Some(other_claim[0].clone())
    );
    assert_eq!(instances.find_by_claim("c-3").await.unwrap(), None);
    let theirs = Instances::new(ec2.clone(), "other");
    assert_eq!(
        theirs.find_by_claim("c-1").await.unwrap().map(|i| i.id),
        Some(other_cluster[0].clone()),
        "the other cluster sees its own"
    );

    // Once terminated, the claim has no instance.
    terminate_directly(&ec2, &mine).await;
    assert_eq!(instances.find_by_claim("c-1").await.unwrap(), None);
}

#[tokio::test]
async fn list_owned_spans_pages_and_skips_other_clusters_and_terminated_instances() {
    let m = moto().await;
    let ec2 = ec2(&m).await;
    // One reservation each: moto pages DescribeInstances by reservation.
    let mut owned = Vec::new();
    for n in 0..7 {
        owned.extend(run(&ec2, &claim_tags(CLUSTER, &format!("c-{n}")), 1).await);
    }
    let stopped = owned[0].clone();
    ec2.stop_instances().instance_ids(&stopped).send().await.unwrap();
    let mut gone = Vec::new();
    for n in 7..9 {
        gone.extend(run(&ec2, &claim_tags(CLUSTER, &format!("c-{n}")), 1).await);
    }
    terminate_directly(&ec2, &gone).await;
    for n in 0..2 {
        run(&ec2, &claim_tags("other", &format!("o-{n}")), 1).await;
    }
    // Owned by another cluster although it names ours in another tag: not ours.
    let mut foreign = claim_tags("other", "o-x");
    foreign.insert(format!("kubernetes.io/cluster/{CLUSTER}"), "shared".into());
    run(&ec2, &foreign, 1).await;

    let proxy = FaultProxy::start(m.endpoint()).await;
    let client = aws_sdk_ec2::Client::new(&m.sdk_config_at(proxy.endpoint()).await);
    let listed = Instances::new(client, CLUSTER)
        .with_page_size(5)
        .list_owned()
        .await
        .unwrap();

    let ids: BTreeSet<String> = listed.iter().map(|i| i.id.clone()).collect();
    assert_eq!(ids, owned.iter().cloned().collect::<BTreeSet<_>>());
    assert_eq!(listed.len(), 7, "no instance twice");
    let pages = proxy.forms("DescribeInstances");
    assert!(pages.len() >= 2, "several pages: {}", pages.len());
    assert!(
        pages
            .iter()
            .all(|f| f.iter().any(|(k, v)| k == "MaxResults" && v == "5"))
    );
    assert!(pages[1..].iter().all(|f| f.iter().any(|(k, _)| k == "NextToken")));

    let by_id: BTreeMap<&str, _> = listed.iter().map(|i| (i.id.as_str(), i)).collect();
    assert!(matches!(
        by_id[stopped.as_str()].state,
        InstanceState::Stopping | InstanceState::Stopped
    ));
    for (n, id) in owned.iter().enumerate().skip(1) {
        let i = by_id[id.as_str()];
        assert!(
            matches!(i.state, InstanceState::Pending | InstanceState::Running),
            "{i:?}"
        );
        assert_eq!(i.node_claim(), Some(format!("c-{n}").as_str()));
        assert_eq!(i.node_pool(), Some("default"));
        assert_eq!(i.instance_type, "m5.large");
        assert!(i.zone.is_some() && i.launch_time.is_some(), "{i:?}");
    }
}

#[tokio::test]
async fn terminate_twice_succeeds_and_reports_the_second_time_as_gone() {
    let m = moto().await;
    let ec2 = ec2(&m).await;
    let ids = run(&ec2, &claim_tags(CLUSTER, "t-1"), 3).await;
    let instances = Instances::new(ec2.clone(), CLUSTER);

    let first = instances.terminate(&ids).await.unwrap();
    assert_eq!(first.len(), 3);
    assert!(first.values().all(|t| *t == Termination::Terminating), "{first:?}");
    assert!(instances.list_owned().await.unwrap().is_empty());

    let second = instances.terminate(&ids).await.unwrap();
    assert_eq!(second.keys().collect::<Vec<_>>(), first.keys().collect::<Vec<_>>());
    assert!(second.values().all(|t| *t == Termination::AlreadyGone), "{second:?}");
    assert!(instances.terminate(&[]).await.unwrap().is_empty());
}

#[tokio::test]
async fn unknown_ids_are_dropped_and_the_real_ones_terminated() {
    let m = moto().await;
    let ec2 = ec2(&m).await;
    let real = run(&ec2, &claim_tags(CLUSTER, "n-1"), 2).await;
    let proxy = FaultProxy::start(m.endpoint()).await;
    let client = aws_sdk_ec2::Client::new(&m.sdk_config_at(proxy.endpoint()).await);
    let instances = Instances::new(client, CLUSTER);

    // moto, like EC2, fails the whole call naming the unknown id.
    let asked = vec![real[0].clone(), UNKNOWN.to_string(), real[1].clone()];
    let out = instances.terminate(&asked).await.unwrap();
    assert_eq!(out[UNKNOWN], Termination::AlreadyGone);
    assert_eq!(out[&real[0]], Termination::Terminating);
    assert_eq!(out[&real[1]], Termination::Terminating);
    assert_eq!(
        ids_per_call(&proxy, "TerminateInstances"),
        vec![3, 2],
        "retried without it"
    );
    let live = Instances::new(ec2.clone(), CLUSTER).list_owned().await.unwrap();
    assert!(live.is_empty(), "{live:?}");
}

#[tokio::test]
async fn not_found_in_ec2_words_is_retried_without_the_named_ids() {
    let m = moto().await;
    let ec2 = ec2(&m).await;
    let real = run(&ec2, &claim_tags(CLUSTER, "n-2"), 1).await;
    let proxy = FaultProxy::start(m.endpoint()).await;
    let client = aws_sdk_ec2::Client::new(&m.sdk_config_at(proxy.endpoint()).await);
    let instances = Instances::new(client, CLUSTER);

    // EC2's own wording, for an id moto would not reject (a real one, just terminated elsewhere).
    let message = format!("The instance ID '{}' does not exist", real[0]);
    let other = run(&ec2, &claim_tags(CLUSTER, "n-3"), 1).await;
    proxy.fail_next("TerminateInstances", 1, 400, NOT_FOUND_CODE, &message);
    let out = instances.terminate(&[real[0].clone(), other[0].clone()]).await.unwrap();
    assert_eq!(out[&real[0]], Termination::AlreadyGone);
    assert_eq!(out[&other[0]], Termination::Terminating);
    assert_eq!(ids_per_call(&proxy, "TerminateInstances"), vec![2, 1]);

    // A NotFound naming none of the ids sent cannot be narrowed: a typed error, not a loop.
    proxy.fail_next(
        "TerminateInstances",
        1,
        400,
        NOT_FOUND_CODE,
        "The instance ID 'i-0fff' does not exist",
    );
    match instances.terminate(&real).await {
        Err(InstancesError::UnnamedNotFound { sent, .. }) => assert_eq!(sent, 1),
        other => panic!("expected UnnamedNotFound, got {other:?}"),
    }
    // Any other EC2 error is returned with its code.
    proxy.fail_next("TerminateInstances", 1, 400, "UnauthorizedOperation", "not allowed");
    let e = instances.terminate(&real).await.unwrap_err();
    assert_eq!(e.code(), Some("UnauthorizedOperation"));
    assert!(e.to_string().contains("ec2:TerminateInstances"), "{e}");
}

#[tokio::test]
async fn more_than_a_thousand_ids_go_in_batches_of_at_most_a_thousand() {
    let m = moto().await;
    let ec2 = ec2(&m).await;
    let mut ids = run(&ec2, &claim_tags(CLUSTER, "many"), 1001).await;
    assert_eq!(ids.len(), 1001);
    ids.push(ids[0].clone()); // a repeat is terminated once
    let proxy = FaultProxy::start(m.endpoint()).await;
    let client = aws_sdk_ec2::Client::new(&m.sdk_config_at(proxy.endpoint()).await);
    let out = Instances::new(client, CLUSTER).terminate(&ids).await.unwrap();
    assert_eq!(out.len(), 1001);
    assert!(out.values().all(|t| *t == Termination::Terminating));
    assert_eq!(ids_per_call(&proxy, "TerminateInstances"), vec![TERMINATE_BATCH, 1]);
    assert!(Instances::new(ec2, CLUSTER).list_owned().await.unwrap().is_empty());
}

#[tokio::test]
async fn impaired_status_checks_are_read_over_every_page_with_since_when() {
    let m = moto().await;
    let ec2 = ec2(&m).await;
    let ids = run(&ec2, &claim_tags(CLUSTER, "status-a"), 7).await;
    // moto passes every check: the harness fails them (tests/moto/server.py, `impaired`).
    m.seed_impaired(&serde_json::json!({"instanceId": ids[2], "checks": ["system"], "since": "2026-01-01T00:00:00Z"}));
    m.seed_impaired(
        &serde_json::json!({"instanceId": ids[5], "checks": ["instance"], "since": "2026-01-02T00:00:00Z"}),
    );
    m.seed_impaired(&serde_json::json!({"instanceId": ids[6], "checks": ["instance"]}));
    let stopped = ids[6].clone();
    ec2.stop_instances().instance_ids(&stopped).send().await.unwrap();

    let proxy = FaultProxy::start(m.endpoint()).await;
    let client = aws_sdk_ec2::Client::new(&m.sdk_config_at(proxy.endpoint()).await);
    let impaired = Instances::new(client, CLUSTER)
        .with_page_size(5)
        .impaired()
        .await
        .unwrap();

    // Other tests' instances share the account: only ours are checked.
    let mine: BTreeMap<&str, Option<jiff::Timestamp>> = impaired
        .iter()
        .filter(|i| ids.contains(&i.id))
        .map(|i| (i.id.as_str(), i.since))
        .collect();
    let at = |s: &str| Some(s.parse::<jiff::Timestamp>().unwrap());
    assert_eq!(
        mine,
        BTreeMap::from([
            (ids[2].as_str(), at("2026-01-01T00:00:00Z")),
            (ids[5].as_str(), at("2026-01-02T00:00:00Z")),
        ]),
        "a stopped instance has no status checks to fail"
    );
    let pages = proxy.forms("DescribeInstanceStatus");
    assert!(pages.len() >= 2, "several pages: {}", pages.len());
    assert!(
        pages
            .iter()
            .all(|f| f.iter().any(|(k, v)| k == "MaxResults" && v == "5"))
    );
    assert!(pages[1..].iter().all(|f| f.iter().any(|(k, _)| k == "NextToken")));
}
