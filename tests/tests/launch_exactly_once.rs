//! Exactly-once launches when the world misbehaves: the write that records a
//! launch is throttled, EC2's DescribeInstances lags behind a fresh launch,
//! the subnets change between deliveries, and a crash left several instances
//! with the claim's tag. The fault proxy makes moto honour ClientToken as EC2
//! does (same token within the hour → the first call's fleet).

use crate::launch_fixtures::*;
use aws_sdk_ec2::types::{ResourceType, Tag, TagSpecification};
use nodesmith::launch::{LaunchError, LaunchOutcome};
use nodesmith_tests::fault_proxy::FaultProxy;
use nodesmith_tests::kube_server::KubeServer;
use nodesmith_tests::moto::{Moto, moto};

/// A bigger tagged subnet in every zone: "the subnet with most free IPs" changes.
async fn more_subnets(m: &Moto) {
    let ec2 = aws_sdk_ec2::Client::new(&m.sdk_config().await);
    let vpcs = ec2.describe_vpcs().send().await.unwrap();
    let vpc = vpcs
        .vpcs()
        .iter()
        .find(|v| v.cidr_block() == Some("10.0.0.0/16"))
        .and_then(|v| v.vpc_id())
        .unwrap()
        .to_string();
    for (zone, cidr) in [
        ("us-east-1a", "10.0.128.0/19"),
        ("us-east-1b", "10.0.160.0/19"),
        ("us-east-1c", "10.0.192.0/19"),
    ] {
        ec2.create_subnet()
            .vpc_id(&vpc)
            .cidr_block(cidr)
            .availability_zone(zone)
            .tag_specifications(
                TagSpecification::builder()
                    .resource_type(ResourceType::Subnet)
                    .tags(Tag::builder().key(DISCOVERY).value(CLUSTER).build())
                    .build(),
            )
            .send()
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn a_launch_recorded_late_behind_a_lagging_describe_is_not_launched_twice() {
    let m = moto().await;
    world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let proxy = FaultProxy::start(m.endpoint()).await;
    let class = node_class("al2023@latest");
    let req = pending(
        &kube,
        &st,
        &claim("eo-1", &["m5.large", "c5.large"], &["on-demand"]),
        &class,
    )
    .await;

    // 1. CreateFleet launches, then every try of the write that records it is throttled.
    proxy.throttle_matching("PutItem", "\"Launched\"", 4);
    let first = launcher(&m, proxy.endpoint(), &kube).await;
    let r1 = first.launch(&req).await;
    assert!(r1.is_err(), "the record failed: {r1:?}");
    let launched = instances_of(&m, "eo-1").await;
    assert_eq!(launched.len(), 1);
    let id = launched[0].instance_id().unwrap().to_string();

    // 2. A redelivery at once, on another invocation, while DescribeInstances lags:
    //    the lease is still held, so it launches nothing.
    proxy.hide_instances(1);
    let second = launcher(&m, proxy.endpoint(), &kube).await;
    let r2 = second.launch(&req).await;
    assert!(matches!(r2, Err(LaunchError::Busy(_))), "{r2:?}");
    assert_eq!(instances_of(&m, "eo-1").await.len(), 1);

    // 3. Later (the lease ran out), the world has changed (bigger subnets, so the
    //    "best" subnet differs) and DescribeInstances still lags: the delivery
    //    repeats the stored request with the same token and gets the same instance.
    expire_lease(&st, "eo-1").await;
    more_subnets(&m).await;
    proxy.hide_instances(1);
    let r3 = second.launch(&req).await;
    let Ok(LaunchOutcome::Launched(c)) = r3 else {
        panic!("expected the first launch to be recorded, got {r3:?}")
    };
    assert_eq!(c.instance_id.as_deref(), Some(id.as_str()));
    assert_eq!(instances_of(&m, "eo-1").await.len(), 1, "exactly one instance");
    let fleets = proxy.fleets();
    assert_eq!(fleets.len(), 1, "one CreateFleet reached EC2: {fleets:?}");
    assert_eq!(proxy.fleet_replays(), 1, "the retry was answered from the token");
    // A fourth delivery: already launched.
    assert!(matches!(
        second.launch(&req).await,
        Ok(LaunchOutcome::AlreadyLaunched(_))
    ));
}

#[tokio::test]
async fn a_crash_that_left_two_tagged_instances_keeps_the_oldest_and_terminates_the_rest() {
    let m = moto().await;
    world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let l = launcher(&m, m.endpoint(), &kube).await;
    let req = pending(
        &kube,
        &st,
        &claim("eo-2", &["m5.large"], &["on-demand"]),
        &node_class("al2023@latest"),
    )
    .await;
    let ec2 = aws_sdk_ec2::Client::new(&m.sdk_config().await);
    let mut ids = Vec::new();
    for _ in 0..2 {
        let run = ec2
            .run_instances()
            .image_id("ami-0a1b2c3d4e5f60001")
            .instance_type(aws_sdk_ec2::types::InstanceType::M5Large)
            .min_count(1)
            .max_count(1)
            .tag_specifications(
                TagSpecification::builder()
                    .resource_type(ResourceType::Instance)
                    .tags(Tag::builder().key("karpenter.sh/nodeclaim").value("eo-2").build())
                    .tags(Tag::builder().key("eks:eks-cluster-name").value(CLUSTER).build())
                    .build(),
            )
            .send()
            .await
            .unwrap();
        ids.push(run.instances()[0].instance_id().unwrap().to_string());
        // Launch times are whole seconds: the first is the older.
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    }
    let got = l.launch(&req).await.unwrap();
    let LaunchOutcome::Recovered(c) = got else {
        panic!("expected recovery, got {got:?}")
    };
    assert_eq!(c.instance_id.as_deref(), Some(ids[0].as_str()), "the oldest is kept");
    let live: Vec<String> = instances_of(&m, "eo-2")
        .await
        .iter()
        .map(|i| i.instance_id().unwrap().to_string())
        .collect();
    assert_eq!(live, vec![ids[0].clone()], "the other is terminated");
}

#[tokio::test]
async fn each_createfleet_request_is_a_stored_attempt_with_its_own_token() {
    let m = moto().await;
    world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let proxy = FaultProxy::start(m.endpoint()).await;
    for z in nodesmith_tests::moto::ZONES {
        proxy.no_capacity("m5.large", z, Some("spot"));
    }
    let l = launcher(&m, proxy.endpoint(), &kube).await;
    let req = pending(
        &kube,
        &st,
        &claim("eo-3", &["m5.large"], &["spot", "on-demand"]),
        &node_class("al2023@latest"),
    )
    .await;
    let LaunchOutcome::Launched(c) = l.launch(&req).await.unwrap() else {
        panic!("no launch")
    };
    let fleets = proxy.fleets();
    assert_eq!(fleets.len(), 2);
    let stored = st.get_node_claim("eo-3").await.unwrap().unwrap();
    let a = stored.launch_attempt.clone().unwrap();
    assert_eq!(a.number, 2, "spot answered without an instance: a second attempt");
    assert_eq!(a.capacity_type, "on-demand");
    assert_eq!(a.client_token, fleets[1].client_token);
    assert_eq!(
        fleets[0].client_token,
        nodesmith::launch::fleet::client_token(&stored, 1)
    );
    assert_eq!(
        fleets[1].client_token,
        nodesmith::launch::fleet::client_token(&stored, 2)
    );
    assert_eq!(c.instance_id, stored.instance_id);
}
