//! The launch path against moto with the real SDK: instances, tags, launch
//! templates, user data, idempotency.

use std::collections::BTreeMap;

use crate::launch_fixtures::*;
use base64::Engine;
use nodesmith::labels;
use nodesmith::launch::{LaunchError, LaunchOutcome};
use nodesmith::nodeclaim::Phase;
use nodesmith::nodeclass::userdata::{NODECONFIG_TYPE, parse_mime};
use nodesmith_tests::kube_server::KubeServer;
use nodesmith_tests::moto::moto;

fn tags_of(i: &aws_sdk_ec2::types::Instance) -> BTreeMap<String, String> {
    i.tags()
        .iter()
        .map(|t| {
            (
                t.key().unwrap_or_default().to_string(),
                t.value().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

async fn template_user_data(m: &nodesmith_tests::moto::Moto) -> Vec<(String, String, String)> {
    let ec2 = aws_sdk_ec2::Client::new(&m.sdk_config().await);
    // Every page, of EC2's largest size: moto cuts a listing at MaxResults (15 unless
    // asked) and gives no NextToken.
    let lts: Vec<aws_sdk_ec2::types::LaunchTemplate> = ec2
        .describe_launch_templates()
        .max_results(200)
        .into_paginator()
        .items()
        .send()
        .collect::<Result<Vec<_>, _>>()
        .await
        .unwrap();
    let mut out = Vec::new();
    for lt in &lts {
        let name = lt.launch_template_name().unwrap().to_string();
        let data = template_data(&ec2, &name).await;
        let ud = base64::engine::general_purpose::STANDARD
            .decode(data.user_data().unwrap_or_default())
            .unwrap();
        out.push((
            name,
            data.image_id().unwrap().to_string(),
            String::from_utf8(ud).unwrap(),
        ));
    }
    out
}

#[tokio::test]
async fn al2023_launch_creates_a_tagged_instance_from_a_hashed_template() {
    let m = moto().await;
    let w = world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let l = launcher(&m, m.endpoint(), &kube).await;
    let req = pending(
        &kube,
        &st,
        &claim("default-a1", &["m5.large", "m5.xlarge"], &["spot", "on-demand"]),
        &node_class("al2023@latest"),
    )
    .await;

    let got = l.launch(&req).await.unwrap();
    let LaunchOutcome::Launched(c) = got else {
        panic!("expected a launch, got {got:?}")
    };
    assert_eq!(c.phase, Phase::Launched);
    assert_eq!(c.capacity_type.as_deref(), Some("spot"));
    let id = c.instance_id.clone().unwrap();

    let found = instances_of(&m, "default-a1").await;
    assert_eq!(found.len(), 1);
    let i = &found[0];
    assert_eq!(i.instance_id(), Some(id.as_str()));
    assert_eq!(i.instance_type().map(|t| t.as_str()), c.instance_type.as_deref());
    assert!(["m5.large", "m5.xlarge"].contains(&c.instance_type.as_deref().unwrap()));
    let zone = c.zone.clone().unwrap();
    assert_eq!(
        i.subnet_id(),
        w.best_subnets.get(&zone).map(String::as_str),
        "most free IPs in {zone}"
    );
    assert_eq!(c.provider_id, Some(format!("aws:///{zone}/{id}")));
    assert_eq!(
        i.image_id(),
        Some("ami-0a1b2c3d4e5f60001"),
        "the al2023 x86_64 AMI from SSM"
    );
    let tags = tags_of(i);
    for (k, v) in [
        ("kubernetes.io/cluster/demo", "owned"),
        ("eks:eks-cluster-name", "demo"),
        ("karpenter.sh/nodepool", "default"),
        ("karpenter.sh/nodeclaim", "default-a1"),
        ("karpenter.k8s.aws/ec2nodeclass", "default"),
        ("team", "platform"),
    ] {
        assert_eq!(tags.get(k).map(String::as_str), Some(v), "tag {k} in {tags:?}");
    }
    // The fleet request carries the cluster's and the pool's tags too: the
    // stack's IAM policy lets launch create a fleet only so tagged.
    let ec2 = aws_sdk_ec2::Client::new(&m.sdk_config().await);
    let fleets = ec2.describe_fleets().send().await.unwrap();
    assert!(!fleets.fleets().is_empty());
    for f in fleets.fleets() {
        let ft: BTreeMap<String, String> = f
            .tags()
            .iter()
            .map(|t| (t.key().unwrap_or("").to_string(), t.value().unwrap_or("").to_string()))
            .collect();
        for k in [
            "kubernetes.io/cluster/demo",
            "eks:eks-cluster-name",
            "karpenter.sh/nodepool",
        ] {
            assert_eq!(ft.get(k), tags.get(k), "fleet tag {k} in {ft:?}");
        }
    }

    let lts = template_user_data(&m).await;
    // One template per capacity type the claim allows: the node's capacity-type label differs.
    assert_eq!(lts.len(), 2);
    let mut cts: Vec<bool> = lts
        .iter()
        .map(|(_, _, ud)| ud.contains("karpenter.sh/capacity-type=spot"))
        .collect();
    cts.sort();
    assert_eq!(cts, vec![false, true]);
    let (name, image, ud) = lts
        .iter()
        .find(|(_, _, ud)| ud.contains("karpenter.sh/capacity-type=spot"))
        .unwrap();
    assert!(name.starts_with("nodesmith/"), "{name}");
    assert_eq!(image, "ami-0a1b2c3d4e5f60001");
    let parts = parse_mime(ud).unwrap();
    let nc: serde_json::Value =
        serde_yaml_ng::from_str(&parts.iter().find(|p| p.content_type == NODECONFIG_TYPE).unwrap().body).unwrap();
    assert_eq!(nc["kind"], "NodeConfig");
    assert_eq!(nc["spec"]["cluster"]["name"], "demo");
    let eks = aws_sdk_eks::Client::new(&m.sdk_config().await);
    let cl = eks.describe_cluster().name("demo").send().await.unwrap();
    let cl = cl.cluster().unwrap();
    assert_eq!(nc["spec"]["cluster"]["apiServerEndpoint"], cl.endpoint().unwrap());
    assert_eq!(
        nc["spec"]["cluster"]["certificateAuthority"],
        cl.certificate_authority().unwrap().data().unwrap()
    );
    assert_eq!(nc["spec"]["cluster"]["cidr"], "172.20.0.0/16");
    let flags = nc["spec"]["kubelet"]["flags"][0].as_str().unwrap();
    assert!(
        flags.contains("karpenter.sh/nodepool=default") && flags.contains("workload=web"),
        "{flags}"
    );
    assert!(
        !flags.contains("karpenter.sh/nodeclaim"),
        "shared user data names no claim: {flags}"
    );
    let taints = nc["spec"]["kubelet"]["config"]["registerWithTaints"]
        .as_array()
        .unwrap();
    assert_eq!(taints.len(), 3, "taints, startup taints and the unregistered taint");
    assert!(
        taints.contains(&serde_json::json!({"key": labels::UNREGISTERED_TAINT_KEY, "effect": "NoExecute"})),
        "{taints:?}"
    );

    // The record is durable and findable by instance id.
    let stored = st.node_claim_by_instance(&id).await.unwrap().unwrap();
    assert_eq!(stored.name, "default-a1");
    assert_eq!(
        stored.version, 3,
        "created, the CreateFleet attempt written, the launch recorded"
    );
    let attempt = stored.launch_attempt.unwrap();
    assert_eq!((attempt.number, attempt.concluded), (1, false));
}

#[tokio::test]
async fn bottlerocket_on_graviton_gets_the_arm64_ami_and_toml_user_data() {
    let m = moto().await;
    world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let l = launcher(&m, m.endpoint(), &kube).await;
    let mut class = node_class("bottlerocket@latest");
    class.user_data = Some("[settings.host-containers.admin]\nenabled = true\n".into());
    let req = pending(&kube, &st, &claim("br-1", &["m6g.large"], &["on-demand"]), &class).await;
    let LaunchOutcome::Launched(c) = l.launch(&req).await.unwrap() else {
        panic!("no launch")
    };
    assert_eq!(c.capacity_type.as_deref(), Some("on-demand"));
    let i = &instances_of(&m, "br-1").await[0];
    assert_eq!(i.image_id(), Some("ami-0a1b2c3d4e5f60005"), "bottlerocket arm64");
    let (_, _, ud) = &template_user_data(&m).await[0];
    let doc: toml_edit::DocumentMut = ud.parse().unwrap();
    assert_eq!(doc["settings"]["kubernetes"]["cluster-name"].as_str(), Some("demo"));
    assert_eq!(
        doc["settings"]["kubernetes"]["node-labels"]["karpenter.sh/nodepool"].as_str(),
        Some("default")
    );
    assert!(
        doc["settings"]["kubernetes"]["node-labels"]
            .get("karpenter.sh/nodeclaim")
            .is_none(),
        "shared user data names no claim"
    );
    assert_eq!(
        doc["settings"]["host-containers"]["admin"]["enabled"].as_bool(),
        Some(true)
    );
}

#[tokio::test]
async fn redelivered_and_concurrent_requests_launch_exactly_once() {
    let m = moto().await;
    world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let l = launcher(&m, m.endpoint(), &kube).await;
    let class = node_class("al2023@latest");
    let a = pending(&kube, &st, &claim("dup-a", &["m5.large"], &["on-demand"]), &class).await;
    let b = pending(&kube, &st, &claim("dup-b", &["m5.large"], &["on-demand"]), &class).await;

    // Three deliveries of the same request, one after another.
    let first = l.launch(&a).await.unwrap();
    assert!(matches!(first, LaunchOutcome::Launched(_)), "{first:?}");
    for _ in 0..2 {
        assert!(matches!(l.launch(&a).await.unwrap(), LaunchOutcome::AlreadyLaunched(_)));
    }
    // Two deliveries at once: one launches, the other is told the claim is busy or done.
    let l2 = launcher(&m, m.endpoint(), &kube).await;
    let (x, y) = tokio::join!(l.launch(&b), l2.launch(&b));
    let launched = [&x, &y]
        .iter()
        .filter(|r| matches!(r, Ok(LaunchOutcome::Launched(_))))
        .count();
    assert_eq!(launched, 1, "{x:?} {y:?}");
    for r in [&x, &y] {
        assert!(
            matches!(
                r,
                Ok(LaunchOutcome::Launched(_)) | Ok(LaunchOutcome::AlreadyLaunched(_)) | Err(LaunchError::Busy(_))
            ),
            "{r:?}"
        );
    }
    // SQS redelivers the busy one later: nothing more happens.
    assert!(matches!(l.launch(&b).await.unwrap(), LaunchOutcome::AlreadyLaunched(_)));

    assert_eq!(
        st.read_lease("launch/dup-a").await.unwrap(),
        None,
        "lease items of launched claims are removed"
    );
    assert_eq!(instances_of(&m, "dup-a").await.len(), 1);
    assert_eq!(instances_of(&m, "dup-b").await.len(), 1);
    // One template serves both claims: user data and template tags name no claim.
    assert_eq!(template_user_data(&m).await.len(), 1);
}

#[tokio::test]
async fn an_instance_launched_before_a_crash_is_recorded_not_launched_again() {
    let m = moto().await;
    world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let l = launcher(&m, m.endpoint(), &kube).await;
    let req = pending(
        &kube,
        &st,
        &claim("crash-1", &["m5.large"], &["on-demand"]),
        &node_class("al2023@latest"),
    )
    .await;
    // As if a previous invocation's CreateFleet succeeded and it died before recording.
    let ec2 = aws_sdk_ec2::Client::new(&m.sdk_config().await);
    let tags = aws_sdk_ec2::types::TagSpecification::builder()
        .resource_type(aws_sdk_ec2::types::ResourceType::Instance)
        .tags(
            aws_sdk_ec2::types::Tag::builder()
                .key("karpenter.sh/nodeclaim")
                .value("crash-1")
                .build(),
        )
        .tags(
            aws_sdk_ec2::types::Tag::builder()
                .key("eks:eks-cluster-name")
                .value("demo")
                .build(),
        )
        .build();
    let run = ec2
        .run_instances()
        .image_id("ami-0a1b2c3d4e5f60001")
        .instance_type(aws_sdk_ec2::types::InstanceType::M5Large)
        .min_count(1)
        .max_count(1)
        .tag_specifications(tags)
        .send()
        .await
        .unwrap();
    let earlier = run.instances()[0].instance_id().unwrap().to_string();
    let got = l.launch(&req).await.unwrap();
    let LaunchOutcome::Recovered(c) = got else {
        panic!("expected recovery, got {got:?}")
    };
    assert_eq!(c.instance_id.as_deref(), Some(earlier.as_str()));
    assert_eq!(instances_of(&m, "crash-1").await.len(), 1);
}

#[tokio::test]
async fn a_claim_that_is_gone_is_not_launched_and_bad_selectors_are_named() {
    let m = moto().await;
    world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let l = launcher(&m, m.endpoint(), &kube).await;
    let class = node_class("al2023@latest");
    let req = nodesmith::messages::LaunchRequest::new("never-made");
    assert_eq!(l.launch(&req).await.unwrap(), LaunchOutcome::Gone("never-made".into()));

    let mut nowhere = class.clone();
    nowhere.subnet_selector_terms[0].tags = BTreeMap::from([("no-such-tag".to_string(), "x".to_string())]);
    let req = pending(&kube, &st, &claim("lost-1", &["m5.large"], &["on-demand"]), &nowhere).await;
    // Fails at once, for good: a retry would find the same nothing.
    let got = l.launch(&req).await.unwrap();
    assert_eq!(
        got,
        LaunchOutcome::NotLaunchable {
            node_claim: "lost-1".into(),
            reason: "SubnetsNotFound: subnetSelectorTerms select no subnets".into(),
        }
    );
    assert_eq!(st.get_node_claim("lost-1").await.unwrap(), None, "the claim is deleted");
    assert!(instances_of(&m, "lost-1").await.is_empty());

    let mut no_groups = class.clone();
    no_groups.security_group_selector_terms[0].tags = BTreeMap::from([("no-such-tag".to_string(), "x".to_string())]);
    let req = pending(&kube, &st, &claim("lost-2", &["m5.large"], &["on-demand"]), &no_groups).await;
    let got = l.launch(&req).await.unwrap();
    assert!(
        matches!(&got, LaunchOutcome::NotLaunchable { reason, .. } if reason.starts_with("SecurityGroupsNotFound:")),
        "{got:?}"
    );
    let mut no_ami = class.clone();
    no_ami.ami_family = Some("AL2023".into());
    no_ami.ami_selector_terms = vec![nodesmith::apis::ec2nodeclass::AmiSelectorTerm {
        name: Some("no-such-image-*".into()),
        ..Default::default()
    }];
    let req = pending(&kube, &st, &claim("lost-3", &["m5.large"], &["on-demand"]), &no_ami).await;
    let got = l.launch(&req).await.unwrap();
    assert!(
        matches!(&got, LaunchOutcome::NotLaunchable { reason, .. } if reason.starts_with("AMINotFound:")),
        "{got:?}"
    );
    assert!(st.list_node_claims().await.unwrap().is_empty());
}

#[tokio::test]
async fn gpu_types_get_the_nvidia_ami_in_their_own_template() {
    let m = moto().await;
    world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let proxy = nodesmith_tests::fault_proxy::FaultProxy::start(m.endpoint()).await;
    let l = launcher(&m, proxy.endpoint(), &kube).await;
    let req = pending(
        &kube,
        &st,
        &claim("gpu-1", &["g5.xlarge", "m5.large"], &["on-demand"]),
        &node_class("al2023@latest"),
    )
    .await;
    assert!(matches!(l.launch(&req).await.unwrap(), LaunchOutcome::Launched(_)));
    let mut images: Vec<String> = template_user_data(&m)
        .await
        .into_iter()
        .map(|(_, image, _)| image)
        .collect();
    images.sort();
    assert_eq!(
        images,
        vec!["ami-0a1b2c3d4e5f60001", "ami-0a1b2c3d4e5f60003"],
        "standard and nvidia AL2023"
    );
    let fleet = &proxy.fleets()[0];
    let mut types: Vec<&str> = fleet.overrides.iter().map(|o| o.instance_type.as_str()).collect();
    types.sort();
    types.dedup();
    assert_eq!(
        types,
        vec!["g5.xlarge", "m5.large"],
        "one CreateFleet over both templates"
    );
}

/// The `--node-labels` of an AL2023 user data document, in order.
fn node_labels_flag(ud: &str) -> Vec<(String, String)> {
    let parts = parse_mime(ud).unwrap();
    let nc: serde_json::Value =
        serde_yaml_ng::from_str(&parts.iter().find(|p| p.content_type == NODECONFIG_TYPE).unwrap().body).unwrap();
    let flag = nc["spec"]["kubelet"]["flags"][0].as_str().unwrap();
    flag.strip_prefix("--node-labels=")
        .unwrap()
        .split(',')
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k.to_string(), v.to_string())
        })
        .collect()
}

#[tokio::test]
async fn a_solved_claim_launches_with_known_labels_only_and_the_unregistered_taint() {
    use nodesmith::scheduling::{SolveInput, SolveOptions, solve};
    let m = moto().await;
    world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let l = launcher(&m, m.endpoint(), &kube).await;
    let pool: nodesmith::apis::NodePool = serde_json::from_value(serde_json::json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"},
        "spec": {"template": {
            "metadata": {"labels": {"team": "web", "node-restriction.kubernetes.io/tier": "gold"}},
            "spec": {
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
                "requirements": [
                    {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["m5.large", "m5.xlarge"]},
                    {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}
                ]
            }
        }}
    }))
    .unwrap();
    pool.validate().unwrap();
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-0", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "web", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}
    }))
    .unwrap();
    let (pools, pods) = ([pool], [pod]);
    let input = SolveInput {
        pods: &pods,
        node_pools: &pools,
        ..SolveInput::new(nodesmith::catalog::builtin().unwrap())
    };
    let plan = solve(&input, &SolveOptions::default());
    let planned = &plan.node_claims[0];
    assert!(
        planned.labels.contains_key(labels::INSTANCE_TYPE) && planned.labels.contains_key(labels::HOSTNAME),
        "the plan predicts the node's labels: {planned:?}"
    );
    let claim = planned.to_node_claim(jiff::Timestamp::now());
    let req = pending(&kube, &st, &claim, &node_class("al2023@latest")).await;
    let LaunchOutcome::Launched(c) = l.launch(&req).await.unwrap() else {
        panic!("no launch")
    };

    let lts = template_user_data(&m).await;
    assert_eq!(lts.len(), 1, "one AMI, one capacity type");
    let (_, _, ud) = &lts[0];
    let given = node_labels_flag(ud);
    let keys: Vec<&str> = given.iter().map(|(k, _)| k.as_str()).collect();
    // Predictions would mislabel the node for ever when CreateFleet picks another
    // option, and the kubelet refuses to start on a label it may not set.
    for k in [labels::INSTANCE_TYPE, labels::ZONE, labels::HOSTNAME, labels::NODECLAIM] {
        assert!(!keys.contains(&k), "{k} in user data: {given:?}");
    }
    for k in &keys {
        assert!(
            !k.starts_with("karpenter.k8s.aws/instance-"),
            "{k} in user data: {given:?}"
        );
        assert!(labels::kubelet_may_set(k), "the kubelet refuses {k}: {given:?}");
    }
    for (k, v) in [
        ("team", "web"),
        (labels::NODEPOOL, "default"),
        (labels::EC2NODECLASS, "default"),
        (labels::CAPACITY_TYPE, "on-demand"),
    ] {
        assert!(
            given.contains(&(k.to_string(), v.to_string())),
            "{k}={v} not in {given:?}"
        );
    }
    // Known before launch, but not the kubelet's to set: applied at registration.
    assert!(!keys.contains(&"node-restriction.kubernetes.io/tier"), "{given:?}");
    assert_eq!(
        c.labels.get("node-restriction.kubernetes.io/tier").map(String::as_str),
        Some("gold")
    );
    let parts = parse_mime(ud).unwrap();
    let nc: serde_json::Value =
        serde_yaml_ng::from_str(&parts.iter().find(|p| p.content_type == NODECONFIG_TYPE).unwrap().body).unwrap();
    let taints = nc["spec"]["kubelet"]["config"]["registerWithTaints"]
        .as_array()
        .unwrap();
    assert!(
        taints.contains(&serde_json::json!({"key": labels::UNREGISTERED_TAINT_KEY, "effect": "NoExecute"})),
        "{taints:?}"
    );
}

#[tokio::test]
async fn fifty_claims_of_one_pool_share_a_constant_number_of_templates() {
    let m = moto().await;
    world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let l = launcher(&m, m.endpoint(), &kube).await;
    let class = node_class("al2023@latest");
    let mut counts = Vec::new();
    let mut took = Vec::new();
    for i in 0..50 {
        let name = format!("many-{i:02}");
        let req = pending(
            &kube,
            &st,
            &claim(&name, &["m5.large", "m5.xlarge"], &["spot", "on-demand"]),
            &class,
        )
        .await;
        let started = std::time::Instant::now();
        let got = l.launch(&req).await.unwrap();
        took.push(started.elapsed());
        assert!(matches!(got, LaunchOutcome::Launched(_)), "{got:?}");
        // Each instance still carries its claim's name, as a tag.
        let tags = tags_of(&instances_of(&m, &name).await[0]);
        assert_eq!(tags.get(labels::NODECLAIM), Some(&name));
        if [0, 9, 49].contains(&i) {
            counts.push(template_user_data(&m).await.len());
        }
    }
    println!("launch templates after 1, 10 and 50 claims: {counts:?}");
    // Measured, never asserted: launch() from the claim to its record, on moto (debug build).
    took.sort();
    println!(
        "launch latency over 50 claims: min {:?}, median {:?}, p90 {:?}",
        took[0],
        took[took.len() / 2],
        took[took.len() * 9 / 10]
    );
    assert_eq!(
        counts,
        vec![2, 2, 2],
        "one template per capacity type, whatever the claim count"
    );
}

#[tokio::test]
async fn the_sweep_deletes_templates_no_class_uses_any_more() {
    use nodesmith::apis::EC2NodeClass;
    use nodesmith::launch::gc;
    let m = moto().await;
    world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let l = launcher(&m, m.endpoint(), &kube).await;
    let ec2 = aws_sdk_ec2::Client::new(&m.sdk_config().await);
    let before = node_class("al2023@latest");
    let req = pending(&kube, &st, &claim("gc-1", &["m5.large"], &["on-demand"]), &before).await;
    l.launch(&req).await.unwrap();
    let mut after = before.clone();
    after.tags.insert("cost-center".into(), "42".into());
    let req = pending(&kube, &st, &claim("gc-2", &["m5.large"], &["on-demand"]), &after).await;
    l.launch(&req).await.unwrap();
    let names = |v: Vec<(String, String, String)>| v.into_iter().map(|(n, _, _)| n).collect::<Vec<_>>();
    let all = names(template_user_data(&m).await);
    assert_eq!(all.len(), 2, "the class changed: a second template");
    // A template nobody made through nodesmith stays whatever it is.
    ec2.create_launch_template()
        .launch_template_name("someone-elses")
        .launch_template_data(
            aws_sdk_ec2::types::RequestLaunchTemplateData::builder()
                .image_id("ami-1")
                .build(),
        )
        .send()
        .await
        .unwrap();

    let classes = [EC2NodeClass::new("default", after.clone())];
    let now = jiff::Timestamp::now();
    let young = gc::collect_templates(&ec2, &st, CLUSTER, &classes, now, gc::TEMPLATE_GRACE)
        .await
        .unwrap();
    assert!(
        young.is_empty(),
        "a fresh template may be in use by a launch: {young:?}"
    );
    let later = now + jiff::SignedDuration::from_hours(1);
    let deleted = gc::collect_templates(&ec2, &st, CLUSTER, &classes, later, gc::TEMPLATE_GRACE)
        .await
        .unwrap();
    assert_eq!(deleted.len(), 1, "{deleted:?}");
    let left = names(template_user_data(&m).await);
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(
        left.contains(&"someone-elses".to_string()) && !left.contains(&deleted[0]),
        "{left:?}"
    );
    // Once the class is gone, its template goes too; a second pass finds nothing more.
    let gone = gc::collect_templates(&ec2, &st, CLUSTER, &[], later, gc::TEMPLATE_GRACE)
        .await
        .unwrap();
    assert_eq!(gone.len(), 1);
    assert_eq!(names(template_user_data(&m).await), vec!["someone-elses".to_string()]);
    assert!(
        gc::collect_templates(&ec2, &st, CLUSTER, &[], later, gc::TEMPLATE_GRACE)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn templates_of_an_ami_the_alias_moved_past_are_collected() {
    use nodesmith::apis::EC2NodeClass;
    use nodesmith::apis::ec2nodeclass::{AmiStatus, EC2NodeClassStatus};
    use nodesmith::launch::gc;
    let m = moto().await;
    let (kube, st, l) = launching(&m).await;
    let ec2 = aws_sdk_ec2::Client::new(&m.sdk_config().await);
    let spec = node_class("al2023@latest");
    let req = pending(&kube, &st, &claim("ami-1", &["m5.large"], &["on-demand"]), &spec).await;
    l.launch(&req).await.unwrap();
    // A new release behind the alias: the next launch makes a template for it.
    let newer = "ami-0a1b2c3d4e5f60003";
    m.set_public_parameter(
        "/aws/service/eks/optimized-ami/1.33/amazon-linux-2023/x86_64/standard/recommended/image_id",
        newer,
    );
    let req = pending(&kube, &st, &claim("ami-2", &["m5.large"], &["on-demand"]), &spec).await;
    l.launch(&req).await.unwrap();
    let templates = gc::owned_templates(&ec2, CLUSTER).await.unwrap();
    let mut images: Vec<Option<&str>> = templates.iter().map(|t| t.image_id.as_deref()).collect();
    images.sort();
    assert_eq!(
        images,
        [Some("ami-0a1b2c3d4e5f60001"), Some(newer)],
        "one template per AMI, tagged with it"
    );

    // The class's status (the sweep's) lists only the new AMI: the old template goes.
    let mut class = EC2NodeClass::new("default", spec.clone());
    class.status = Some(EC2NodeClassStatus {
        amis: vec![AmiStatus {
            id: newer.into(),
            ..Default::default()
        }],
        ..Default::default()
    });
    let later = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1);
    let deleted = gc::collect_templates(
        &ec2,
        &st,
        CLUSTER,
        std::slice::from_ref(&class),
        later,
        gc::TEMPLATE_GRACE,
    )
    .await
    .unwrap();
    assert_eq!(deleted.len(), 1, "{deleted:?}");
    let left = gc::owned_templates(&ec2, CLUSTER).await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].image_id.as_deref(), Some(newer));
}

#[tokio::test]
async fn a_template_a_waiting_fleet_request_names_is_kept() {
    use nodesmith::apis::EC2NodeClass;
    use nodesmith::launch::gc;
    use nodesmith::nodeclaim::{AttemptOverride, LaunchAttempt};
    let m = moto().await;
    let (kube, st, l) = launching(&m).await;
    let ec2 = aws_sdk_ec2::Client::new(&m.sdk_config().await);
    let before = node_class("al2023@latest");
    let req = pending(&kube, &st, &claim("wait-1", &["m5.large"], &["on-demand"]), &before).await;
    l.launch(&req).await.unwrap();
    let templates = gc::owned_templates(&ec2, CLUSTER).await.unwrap();
    assert_eq!(templates.len(), 1);
    let old = templates[0].name.clone();
    // A claim's CreateFleet request naming that template was sent and not answered yet:
    // a redelivery sends it again as it was.
    let mut waiting = claim("wait-2", &["m5.large"], &["on-demand"]);
    waiting.launch_attempt = Some(LaunchAttempt {
        number: 1,
        client_token: "wait-2-1".into(),
        capacity_type: "on-demand".into(),
        overrides: vec![AttemptOverride {
            instance_type: "m5.large".into(),
            zone: "us-east-1a".into(),
            subnet_id: "subnet-1".into(),
            template: old.clone(),
            price: None,
            capacity_reservation: None,
        }],
        tags: BTreeMap::new(),
        concluded: false,
        context: None,
    });
    st.create_node_claim(&waiting).await.unwrap();
    // The class changes: the template is no longer what the class makes.
    let mut after = before.clone();
    after.tags.insert("cost-center".into(), "42".into());
    let classes = [EC2NodeClass::new("default", after)];
    let later = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1);
    let in_flight = gc::templates_in_flight(&st.list_node_claims().await.unwrap());
    assert_eq!(in_flight, std::collections::BTreeSet::from([old.clone()]));
    let deleted = gc::collect_templates(&ec2, &st, CLUSTER, &classes, later, gc::TEMPLATE_GRACE)
        .await
        .unwrap();
    assert!(deleted.is_empty(), "claim wait-2's request names {old}: {deleted:?}");
    // Once the request is answered (here: the claim given up), the template goes.
    let waiting = st.get_node_claim("wait-2").await.unwrap().unwrap();
    st.delete_node_claim("wait-2", waiting.version).await.unwrap();
    let deleted = gc::collect_templates(&ec2, &st, CLUSTER, &classes, later, gc::TEMPLATE_GRACE)
        .await
        .unwrap();
    assert_eq!(deleted, vec![old]);
}
