//! Karpenter v1.14's EC2NodeClass fields reach EC2 or are refused by name:
//! cpuOptions, connectionTracking, ipPrefixCount, an EBS
//! volumeInitializationRate and placementGroupSelector shape the launch
//! template moto receives; networkInterfaces (EFA), a capacity reservation
//! term's instanceMatchCriteria and a kubelet field nodesmith does not read
//! are named in the class's Ready condition and the class is not launched
//! from; a placement group that does not exist is PlacementGroupReady=False.

use crate::launch_fixtures::*;
use nodesmith::apis::EC2NodeClass;
use nodesmith::apis::ec2nodeclass::{EC2NodeClassSpec, EC2NodeClassStatus};
use nodesmith::launch::LaunchOutcome;
use nodesmith::nodeclass::conditions;
use nodesmith_tests::moto::{Moto, moto};

/// The fixture's class with `extra` merged into its spec (as a user's
/// manifest would carry them: JSON, whatever the Rust type knows).
fn class_with(extra: serde_json::Value) -> EC2NodeClassSpec {
    let mut spec = serde_json::to_value(node_class("al2023@latest")).unwrap();
    for (k, v) in extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    serde_json::from_value(spec).unwrap()
}

/// The class's status as the sweep computes it, from what moto resolves.
async fn status_of(m: &Moto, spec: &EC2NodeClassSpec) -> EC2NodeClassStatus {
    let conf = m.sdk_config().await;
    let ec2 = aws_sdk_ec2::Client::new(&conf);
    let ssm = aws_sdk_ssm::Client::new(&conf);
    let class = EC2NodeClass::new("default", spec.clone());
    let facts = nodesmith::nodeclass::resolve(&ec2, &ssm, CLUSTER, "1.33", &class)
        .await
        .unwrap();
    conditions::compute(&facts, None, Some(1), jiff::Timestamp::now())
}

fn condition<'a>(s: &'a EC2NodeClassStatus, t: &str) -> Option<&'a nodesmith::apis::ec2nodeclass::Condition> {
    s.conditions.iter().find(|c| c.type_ == t)
}

#[tokio::test]
async fn the_launch_template_carries_cpu_options_connection_tracking_prefixes_volume_rate_and_placement_group() {
    let m = moto().await;
    let (kube, st, l) = launching(&m).await;
    let ec2 = aws_sdk_ec2::Client::new(&m.sdk_config().await);
    let group = ec2
        .create_placement_group()
        .group_name("training")
        .strategy(aws_sdk_ec2::types::PlacementStrategy::Cluster)
        .send()
        .await
        .unwrap()
        .placement_group()
        .and_then(|g| g.group_id())
        .unwrap()
        .to_string();
    let volume = ec2
        .create_volume()
        .availability_zone("us-east-1a")
        .size(20)
        .send()
        .await
        .unwrap();
    let snapshot = ec2
        .create_snapshot()
        .volume_id(volume.volume_id().unwrap())
        .send()
        .await
        .unwrap()
        .snapshot_id()
        .unwrap()
        .to_string();
    let spec = class_with(serde_json::json!({
        "cpuOptions": {"nestedVirtualization": "enabled"},
        "connectionTracking": {"tcpEstablishedTimeout": 3600, "udpStreamTimeout": 120, "udpTimeout": 45},
        "ipPrefixCount": 2,
        "placementGroupSelector": {"name": "training"},
        "blockDeviceMappings": [{
            "deviceName": "/dev/xvda", "rootVolume": true,
            "ebs": {"snapshotID": snapshot, "volumeInitializationRate": 200, "volumeType": "gp3"}
        }],
    }));
    let req = pending(&kube, &st, &claim("shaped-1", &["m5.large"], &["on-demand"]), &spec).await;
    let outcome = l.launch(&req).await.unwrap();
    assert!(matches!(outcome, LaunchOutcome::Launched(_)), "{outcome:?}");

    let lts = ec2.describe_launch_templates().send().await.unwrap();
    assert_eq!(lts.launch_templates().len(), 1, "{lts:?}");
    let data = template_data(&ec2, lts.launch_templates()[0].launch_template_name().unwrap()).await;
    assert_eq!(
        data.cpu_options()
            .and_then(|c| c.nested_virtualization())
            .map(|n| n.as_str()),
        Some("enabled"),
        "{data:?}"
    );
    let nic = data
        .network_interfaces()
        .first()
        .unwrap_or_else(|| panic!("no interface: {data:?}"));
    assert_eq!(nic.device_index(), Some(0));
    assert_eq!(nic.ipv4_prefix_count(), Some(2));
    let ct = nic.connection_tracking_specification().unwrap();
    assert_eq!(
        (ct.tcp_established_timeout(), ct.udp_stream_timeout(), ct.udp_timeout()),
        (Some(3600), Some(120), Some(45))
    );
    assert!(!nic.groups().is_empty(), "the groups move onto the interface: {nic:?}");
    assert!(
        data.security_group_ids().is_empty(),
        "EC2 refuses groups in both places"
    );
    assert_eq!(data.placement().and_then(|p| p.group_id()), Some(group.as_str()));
    let ebs = data.block_device_mappings()[0].ebs().unwrap();
    assert_eq!(ebs.snapshot_id(), Some(snapshot.as_str()));
    assert_eq!(ebs.volume_initialization_rate(), Some(200));

    let status = status_of(&m, &spec).await;
    let pg = condition(&status, "PlacementGroupReady").unwrap_or_else(|| panic!("{status:?}"));
    assert_eq!(pg.status, "True");
    assert_eq!(condition(&status, "Ready").unwrap().status, "True", "{status:?}");
}

#[tokio::test]
async fn a_placement_group_that_does_not_exist_is_not_ready_and_not_launched_into() {
    let m = moto().await;
    let (kube, st, l) = launching(&m).await;
    let spec = class_with(serde_json::json!({"placementGroupSelector": {"name": "nowhere"}}));
    let status = status_of(&m, &spec).await;
    let pg = condition(&status, "PlacementGroupReady").unwrap_or_else(|| panic!("{status:?}"));
    assert_eq!(
        (pg.status.as_str(), pg.reason.as_str()),
        ("False", "PlacementGroupNotFound")
    );
    assert!(pg.message.contains("nowhere"), "{pg:?}");
    assert_eq!(condition(&status, "Ready").unwrap().status, "False");

    let req = pending(&kube, &st, &claim("nowhere-1", &["m5.large"], &["on-demand"]), &spec).await;
    match l.launch(&req).await {
        Ok(LaunchOutcome::NotLaunchable { reason, .. }) => assert!(reason.contains("nowhere"), "{reason}"),
        other => panic!("expected NotLaunchable, got {other:?}"),
    }
    assert!(instances_of(&m, "nowhere-1").await.is_empty());
}

#[tokio::test]
async fn fields_nodesmith_does_not_build_are_named_in_the_ready_condition_and_not_launched() {
    let m = moto().await;
    let (kube, st, l) = launching(&m).await;
    let spec = class_with(serde_json::json!({
        "networkInterfaces": [
            {"networkCardIndex": 0, "deviceIndex": 0, "interfaceType": "interface"},
            {"networkCardIndex": 1, "deviceIndex": 0, "interfaceType": "efa-only"}
        ],
        "capacityReservationSelectorTerms": [{"instanceMatchCriteria": "open"}],
        "kubelet": {"maxPods": 58, "topologyManagerPolicy": "single-numa-node"},
    }));
    let refused = [
        "spec.networkInterfaces",
        "spec.capacityReservationSelectorTerms[0].instanceMatchCriteria",
        "spec.kubelet.topologyManagerPolicy",
    ];
    let status = status_of(&m, &spec).await;
    let ready = condition(&status, "Ready").unwrap();
    assert_eq!(ready.status, "False", "{status:?}");
    for field in refused {
        assert!(ready.message.contains(field), "{field} not named: {ready:?}");
    }
    assert!(!ready.message.contains("maxPods"), "{ready:?}");

    let req = pending(&kube, &st, &claim("efa-1", &["m5.large"], &["on-demand"]), &spec).await;
    match l.launch(&req).await {
        Ok(LaunchOutcome::NotLaunchable { reason, .. }) => {
            for field in refused {
                assert!(reason.contains(field), "{field} not named: {reason}");
            }
        }
        other => panic!("expected NotLaunchable, got {other:?}"),
    }
    assert!(instances_of(&m, "efa-1").await.is_empty());
}
