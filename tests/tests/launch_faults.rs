//! Capacity errors and throttling injected by the fault proxy, parsed by the
//! real SDK: fallback over offerings, spot → on-demand, unavailable offerings
//! recorded, backoff and retry.

use crate::launch_fixtures::*;
use base64::Engine;
use nodesmith::launch::LaunchOutcome;
use nodesmith::state::{self, OfferingKey};
use nodesmith_tests::fault_proxy::FaultProxy;
use nodesmith_tests::kube_server::KubeServer;
use nodesmith_tests::moto::{ZONES, moto};
use nodesmith_tests::sqs;

#[tokio::test]
async fn spot_capacity_errors_everywhere_fall_back_to_on_demand() {
    let m = moto().await;
    world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let proxy = FaultProxy::start(m.endpoint()).await;
    for t in ["m5.large", "c5.large"] {
        for z in ZONES {
            proxy.no_capacity(t, z, Some("spot"));
        }
    }
    let l = launcher(&m, proxy.endpoint(), &kube).await;
    let req = pending(
        &kube,
        &st,
        &claim("fb-1", &["m5.large", "c5.large"], &["spot", "on-demand"]),
        &node_class("al2023@latest"),
    )
    .await;

    let LaunchOutcome::Launched(c) = l.launch(&req).await.unwrap() else {
        panic!("no launch")
    };
    assert_eq!(c.capacity_type.as_deref(), Some("on-demand"));
    assert_eq!(instances_of(&m, "fb-1").await.len(), 1);

    let fleets = proxy.fleets();
    assert_eq!(fleets.len(), 2, "{fleets:?}");
    assert_eq!(
        (
            fleets[0].capacity_type.as_str(),
            fleets[0].overrides.len(),
            fleets[0].failed
        ),
        ("spot", 6, 6)
    );
    assert_eq!(
        (
            fleets[1].capacity_type.as_str(),
            fleets[1].overrides.len(),
            fleets[1].failed
        ),
        ("on-demand", 6, 0)
    );
    assert_ne!(fleets[0].client_token, fleets[1].client_token);

    let marked = marked_unavailable(&st).await;
    let mut want: Vec<OfferingKey> = ["m5.large", "c5.large"]
        .iter()
        .flat_map(|t| ZONES.iter().map(move |z| OfferingKey::new(t, z, "spot")))
        .collect();
    want.sort();
    assert_eq!(marked, want);
}

#[tokio::test]
async fn failed_offerings_are_dropped_and_the_rest_launch_in_the_same_call() {
    let m = moto().await;
    world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let proxy = FaultProxy::start(m.endpoint()).await;
    for z in ZONES {
        proxy.no_capacity("m5.large", z, None);
    }
    let l = launcher(&m, proxy.endpoint(), &kube).await;
    let req = pending(
        &kube,
        &st,
        &claim("fb-2", &["m5.large", "m5.xlarge"], &["spot"]),
        &node_class("al2023@latest"),
    )
    .await;
    let LaunchOutcome::Launched(c) = l.launch(&req).await.unwrap() else {
        panic!("no launch")
    };
    assert_eq!(c.instance_type.as_deref(), Some("m5.xlarge"));
    assert_eq!(c.capacity_type.as_deref(), Some("spot"));
    let fleets = proxy.fleets();
    assert_eq!(fleets.len(), 1);
    assert_eq!(fleets[0].failed, 3);
    let marked = st.unavailable_offerings(state::now_secs()).await.unwrap();
    assert_eq!(marked.len(), 3, "m5.large spot in every zone: {marked:?}");
    assert!(
        marked
            .iter()
            .all(|u| u.key.instance_type == "m5.large" && u.reason == "InsufficientInstanceCapacity")
    );

    // The next claim skips the marked offerings without asking EC2 for them.
    let req = pending(
        &kube,
        &st,
        &claim("fb-3", &["m5.large", "m5.xlarge"], &["spot"]),
        &node_class("al2023@latest"),
    )
    .await;
    l.launch(&req).await.unwrap();
    let last = proxy.fleets().pop().unwrap();
    assert!(
        last.overrides.iter().all(|o| o.instance_type == "m5.xlarge"),
        "{last:?}"
    );
}

#[tokio::test]
async fn spot_only_claim_without_capacity_is_given_back_to_the_solver() {
    let m = moto().await;
    world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let proxy = FaultProxy::start(m.endpoint()).await;
    for z in ZONES {
        proxy.fail_offering("m5.large", z, None, "UnfulfillableCapacity");
    }
    let client = aws_sdk_sqs::Client::new(&m.sdk_config().await);
    let pending_queue = sqs::create_queue(&client, "pending-pods").await;
    let l = launcher_with(&m, proxy.endpoint(), &kube, Some(pending_queue.clone())).await;
    let req = pending(
        &kube,
        &st,
        &claim("fb-4", &["m5.large"], &["spot"]),
        &node_class("al2023@latest"),
    )
    .await;
    match l.launch(&req).await.unwrap() {
        LaunchOutcome::NoCapacity { node_claim, tried } => {
            assert_eq!(node_claim, "fb-4");
            assert_eq!(tried.len(), 3);
        }
        other => panic!("expected no capacity, got {other:?}"),
    }
    assert_eq!(
        st.get_node_claim("fb-4").await.unwrap(),
        None,
        "deleted so its pods are solved again"
    );
    assert!(instances_of(&m, "fb-4").await.is_empty());
    assert_eq!(proxy.fleets().len(), 1, "nothing left to try after one call");
    // The pods that waited on the claim are solved again at once, not when some watch event comes.
    assert_eq!(
        sqs::drain(&client, &pending_queue).await,
        vec![r#"{"solve":{"reason":"launch-no-capacity","nodeClaim":"fb-4"}}"#]
    );
}

#[tokio::test]
async fn throttling_is_retried_with_backoff_by_the_sdk() {
    let m = moto().await;
    world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let proxy = FaultProxy::start(m.endpoint()).await;
    proxy.throttle("CreateFleet", 2);
    proxy.throttle("CreateLaunchTemplate", 1);
    proxy.throttle("PutItem", 2); // DynamoDB (JSON protocol): the conditional write recording the launch
    let l = launcher(&m, proxy.endpoint(), &kube).await;
    let req = pending(
        &kube,
        &st,
        &claim("thr-1", &["m5.large"], &["on-demand"]),
        &node_class("al2023@latest"),
    )
    .await;
    let LaunchOutcome::Launched(c) = l.launch(&req).await.unwrap() else {
        panic!("no launch")
    };
    assert_eq!(c.phase, nodesmith::nodeclaim::Phase::Launched);
    assert_eq!((proxy.throttled("CreateFleet"), proxy.calls("CreateFleet")), (2, 3));
    assert_eq!(
        (
            proxy.throttled("CreateLaunchTemplate"),
            proxy.calls("CreateLaunchTemplate")
        ),
        (1, 2)
    );
    assert_eq!(proxy.throttled("PutItem"), 2);
    assert_eq!(instances_of(&m, "thr-1").await.len(), 1);
    assert_eq!(
        st.get_node_claim("thr-1").await.unwrap().unwrap().instance_id,
        c.instance_id
    );
}

#[tokio::test]
async fn throttling_past_the_retry_budget_fails_the_request_for_redelivery() {
    let m = moto().await;
    world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let proxy = FaultProxy::start(m.endpoint()).await;
    proxy.throttle("CreateFleet", 100);
    let l = launcher(&m, proxy.endpoint(), &kube).await;
    let req = pending(
        &kube,
        &st,
        &claim("thr-2", &["m5.large"], &["on-demand"]),
        &node_class("al2023@latest"),
    )
    .await;
    let e = l.launch(&req).await.unwrap_err().to_string();
    assert!(
        e.contains("ec2:CreateFleet") && e.contains("RequestLimitExceeded"),
        "{e}"
    );
    assert_eq!(proxy.calls("CreateFleet"), 4, "max attempts");
    assert_eq!(
        st.get_node_claim("thr-2").await.unwrap().unwrap().phase,
        nodesmith::nodeclaim::Phase::Pending
    );
    // The lease was released: the redelivery is not blocked.
    proxy.throttle("CreateFleet", 0);
    assert!(matches!(l.launch(&req).await.unwrap(), LaunchOutcome::Launched(_)));
    assert_eq!(instances_of(&m, "thr-2").await.len(), 1);
}

#[tokio::test]
async fn public_ip_choice_raid0_and_context_reach_ec2() {
    let m = moto().await;
    world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let proxy = FaultProxy::start(m.endpoint()).await;
    let l = launcher(&m, proxy.endpoint(), &kube).await;
    let mut class = node_class("al2023@latest");
    class.associate_public_ip_address = Some(false);
    class.instance_store_policy = Some("RAID0".into());
    class.context = Some("ctx-reserved-1".into());
    let req = pending(&kube, &st, &claim("ctx-1", &["m5.large"], &["on-demand"]), &class).await;
    let LaunchOutcome::Launched(_) = l.launch(&req).await.unwrap() else {
        panic!("no launch")
    };

    // CreateFleet carried the class's context (moto ignores it: read off the wire).
    let forms = proxy.forms("CreateFleet");
    assert_eq!(forms.len(), 1);
    assert!(
        forms[0].iter().any(|(k, v)| k == "Context" && v == "ctx-reserved-1"),
        "{:?}",
        forms[0]
    );
    // The template describes the primary interface: no public address, the
    // selected groups on it, none on the template itself.
    let ec2 = aws_sdk_ec2::Client::new(&m.sdk_config().await);
    let lts = ec2.describe_launch_templates().send().await.unwrap();
    let name = lts.launch_templates()[0].launch_template_name().unwrap().to_string();
    let data = template_data(&ec2, &name).await;
    assert!(data.security_group_ids().is_empty());
    let nic = &data.network_interfaces()[0];
    assert_eq!(nic.device_index(), Some(0));
    assert_eq!(nic.associate_public_ip_address(), Some(false));
    assert!(!nic.groups().is_empty());
    let ud = base64::engine::general_purpose::STANDARD
        .decode(data.user_data().unwrap_or_default())
        .unwrap();
    assert!(String::from_utf8(ud).unwrap().contains("strategy: RAID0"));
    // The instance runs in the selected groups (through the interface).
    let i = &instances_of(&m, "ctx-1").await[0];
    assert_eq!(
        i.security_groups()
            .iter()
            .filter_map(|g| g.group_id())
            .collect::<Vec<_>>(),
        nic.groups().iter().map(String::as_str).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn a_failed_launch_leaves_its_lease_item_to_expire() {
    let m = moto().await;
    world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let proxy = FaultProxy::start(m.endpoint()).await;
    proxy.throttle("CreateFleet", 100);
    let l = launcher(&m, proxy.endpoint(), &kube).await;
    let req = pending(
        &kube,
        &st,
        &claim("ttl-1", &["m5.large"], &["on-demand"]),
        &node_class("al2023@latest"),
    )
    .await;
    let before = state::now_secs();
    assert!(l.launch(&req).await.is_err());
    // The claim may never launch (the sweep gives it up): its lease item must not stay forever.
    let client = aws_sdk_dynamodb::Client::new(&m.sdk_config().await);
    let item = client
        .get_item()
        .table_name(st.table())
        .key("pk", aws_sdk_dynamodb::types::AttributeValue::S(state::PK_LEASE.into()))
        .key("sk", aws_sdk_dynamodb::types::AttributeValue::S("launch/ttl-1".into()))
        .send()
        .await
        .unwrap()
        .item
        .expect("the released lease item");
    let expires: i64 = item
        .get(state::TTL_ATTRIBUTE)
        .and_then(|v| v.as_n().ok())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {} on {item:?}", state::TTL_ATTRIBUTE));
    assert!(expires > before && expires <= before + 2 * 3600, "{expires}");
    // A redelivery still takes the lease and launches.
    proxy.throttle("CreateFleet", 0);
    assert!(matches!(l.launch(&req).await.unwrap(), LaunchOutcome::Launched(_)));
}

/// The `LaunchFailed` warnings recorded for `claim`, as (involved kind, name, message).
fn launch_failures(kube: &KubeServer) -> Vec<(String, String, String)> {
    kube.events()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("LaunchFailed") && e.type_.as_deref() == Some("Warning"))
        .map(|e| {
            (
                e.involved_object.kind.unwrap_or_default(),
                e.involved_object.name.unwrap_or_default(),
                e.message.unwrap_or_default(),
            )
        })
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// Both warnings of a refused launch, on the class and on `claim`, name EC2's `code`.
fn assert_warned_of(kube: &KubeServer, claim: &str, code: &str) {
    let failures = launch_failures(kube);
    let kinds: Vec<(&str, &str)> = failures.iter().map(|(k, n, _)| (k.as_str(), n.as_str())).collect();
    assert_eq!(
        kinds,
        [("EC2NodeClass", "default"), ("NodeClaim", claim)],
        "{failures:?}"
    );
    assert!(failures.iter().all(|(_, _, m)| m.contains(code)), "{failures:?}");
}

#[tokio::test]
async fn an_ami_ec2_refuses_is_a_warning_on_the_class_and_the_claim_not_only_a_log_line() {
    let m = moto().await;
    world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let proxy = FaultProxy::start(m.endpoint()).await;
    for z in ZONES {
        proxy.fail_offering("m5.large", z, Some("on-demand"), "InvalidAMIID.NotFound");
    }
    let l = launcher(&m, proxy.endpoint(), &kube).await;
    let req = pending(
        &kube,
        &st,
        &claim("bad-ami", &["m5.large"], &["on-demand"]),
        &node_class("al2023@latest"),
    )
    .await;
    let e = l.launch(&req).await.unwrap_err().to_string();
    assert!(e.contains("InvalidAMIID.NotFound"), "{e}");
    assert_warned_of(&kube, "bad-ami", "InvalidAMIID.NotFound");
    assert!(kube.denials().is_empty(), "{:?}", kube.denials());
}

#[tokio::test]
async fn an_iam_denial_of_create_fleet_is_a_warning_on_the_class_and_the_claim() {
    let m = moto().await;
    world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let proxy = FaultProxy::start(m.endpoint()).await;
    proxy.fail_next(
        "CreateFleet",
        1,
        403,
        "UnauthorizedOperation",
        "You are not authorized to perform this operation.",
    );
    let l = launcher(&m, proxy.endpoint(), &kube).await;
    let req = pending(
        &kube,
        &st,
        &claim("denied", &["m5.large"], &["on-demand"]),
        &node_class("al2023@latest"),
    )
    .await;
    let e = l.launch(&req).await.unwrap_err().to_string();
    assert!(e.contains("UnauthorizedOperation"), "{e}");
    assert_warned_of(&kube, "denied", "UnauthorizedOperation");
    // Throttling is not a refusal: no warning for it.
    let kube2 = KubeServer::start().await;
    proxy.throttle("CreateFleet", 100);
    let l2 = launcher(&m, proxy.endpoint(), &kube2).await;
    let req2 = pending(
        &kube2,
        &st,
        &claim("throttled", &["m5.large"], &["on-demand"]),
        &node_class("al2023@latest"),
    )
    .await;
    assert!(l2.launch(&req2).await.is_err());
    assert!(launch_failures(&kube2).is_empty());
}
