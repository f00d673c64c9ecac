//! The EC2NodeClass status on the local stack (moto, the Kubernetes API test
//! server): the sweep resolves the class and writes what it found through the
//! status subresource, once per change; a class whose subnets match nothing
//! turns `Ready=False`, a claim launched for it fails at once with that reason
//! (deleted, not redelivered), and provisioning stops using its pool.

use crate::launch_fixtures;

use crate::launch_fixtures::{CLUSTER, DISCOVERY, launcher_with};
use crate::local_stack::{Stack, event, fast};
use nodesmith::apis::EC2NodeClass;
use nodesmith::apis::ec2nodeclass::Condition;
use nodesmith::kubernetes::Cluster;
use nodesmith::launch::{LaunchOutcome, batch};
use nodesmith::nodeclass::profile;
use nodesmith::sweep::Sweeper;
use nodesmith_tests::kubectl::Kubectl;

/// The class as the API serves it (a list through the cluster adapter).
async fn read_class(s: &Stack) -> EC2NodeClass {
    let classes = s.cluster().node_classes().await.unwrap();
    classes
        .into_iter()
        .find(|c| c.metadata.name.as_deref() == Some("default"))
        .unwrap()
}

fn condition<'a>(c: &'a EC2NodeClass, t: &str) -> &'a Condition {
    c.condition(t)
        .unwrap_or_else(|| panic!("no {t} condition: {:?}", c.status))
}

async fn sweeper(s: &Stack) -> Sweeper<nodesmith::kubernetes::KubeCluster> {
    let conf = s.m.sdk_config().await;
    s.sweeper(fast())
        .with_resolution(aws_sdk_ssm::Client::new(&conf), aws_sdk_eks::Client::new(&conf))
}

/// Every subnet carrying the discovery tag.
async fn tagged_subnets(s: &Stack) -> Vec<String> {
    let out = s.ec2.describe_subnets().send().await.unwrap();
    let mut ids: Vec<String> = out
        .subnets()
        .iter()
        .filter(|sn| sn.tags().iter().any(|t| t.key() == Some(DISCOVERY)))
        .filter_map(|sn| sn.subnet_id().map(str::to_string))
        .collect();
    ids.sort();
    ids
}

#[tokio::test]
async fn the_sweep_writes_the_class_status_and_a_class_matching_no_subnet_fails_fast() {
    let s = Stack::new("64", 2).await;
    let sweeper = sweeper(&s).await;
    let subnets = tagged_subnets(&s).await;
    assert_eq!(subnets.len(), 4, "the fixture tags four subnets");

    // 1. Resolved and written back: what will be launched, and Ready.
    let report = sweeper.run().await.unwrap();
    assert_eq!(
        report.classes.written,
        vec!["default".to_string()],
        "{:?}",
        report.classes
    );
    let class = read_class(&s).await;
    let status = class.status.clone().expect("a status");
    let mut got: Vec<String> = status.subnets.iter().map(|sn| sn.id.clone()).collect();
    got.sort();
    assert_eq!(got, subnets);
    assert!(
        status.subnets.iter().all(|sn| sn.zone.starts_with("us-east-1")),
        "{status:?}"
    );
    assert_eq!(status.security_groups.len(), 1, "{status:?}");
    assert_eq!(status.security_groups[0].name.as_deref(), Some("demo-nodes"));
    let amis: Vec<(&str, Option<&str>)> = status.amis.iter().map(|a| (a.id.as_str(), a.name.as_deref())).collect();
    assert_eq!(
        amis,
        vec![
            (
                "ami-0a1b2c3d4e5f60001",
                Some("amazon-eks-node-al2023-x86_64-standard-1.33-v20261101")
            ),
            (
                "ami-0a1b2c3d4e5f60003",
                Some("amazon-eks-node-al2023-x86_64-nvidia-1.33-v20261101")
            ),
            (
                "ami-0a1b2c3d4e5f60002",
                Some("amazon-eks-node-al2023-arm64-standard-1.33-v20261101")
            ),
        ],
        "the alias's images: amd64, amd64 with NVIDIA GPUs, arm64 (no arm64 NVIDIA one is published)"
    );
    assert_eq!(
        status.instance_profile,
        Some(profile::profile_name(CLUSTER, "default", "KarpenterNodeRole-demo"))
    );
    for t in [
        "SubnetsReady",
        "SecurityGroupsReady",
        "AMIsReady",
        "InstanceProfileReady",
        "Ready",
    ] {
        assert_eq!(condition(&class, t).status, "True", "{t}: {:?}", status.conditions);
    }
    assert_eq!(condition(&class, "Ready").observed_generation, Some(1));
    assert_eq!(
        class.spec.role.as_deref(),
        Some("KarpenterNodeRole-demo"),
        "the spec is untouched"
    );

    // 2. Nothing changed: nothing written.
    let writes = |s: &Stack| {
        s.kube
            .count_requests(&http::Method::PUT, "/ec2nodeclasses/default/status")
    };
    let before = writes(&s);
    let report = sweeper.run().await.unwrap();
    assert!(report.classes.written.is_empty(), "{:?}", report.classes);
    assert_eq!(writes(&s), before);
    assert_eq!(read_class(&s).await.status, Some(status.clone()));

    // 3. The subnets lose their discovery tag. A claim provisioned before the
    //    sweep notices fails at once, naming what matched nothing.
    for id in &subnets {
        s.ec2
            .delete_tags()
            .resources(id)
            .tags(aws_sdk_ec2::types::Tag::builder().key(DISCOVERY).build())
            .send()
            .await
            .unwrap();
    }
    // (The sweeps above asked for solves for the pending pods: gone.)
    s.drain(&s.pending_queue).await;
    let outcome = s.provision(&["web-0", "web-1"]).await;
    assert_eq!(outcome.created.len(), 1, "the class still reads Ready: {outcome:?}");
    let claim = outcome.created[0].name.clone();
    let bodies = s.drain(&s.launch_queue).await;
    assert_eq!(bodies.len(), 1);
    let launcher = launcher_with(&s.m, s.m.endpoint(), &s.kube, Some(s.pending_queue.clone())).await;
    let (response, results) = batch::handle(&launcher, &event(bodies)).await;
    assert!(
        response.batch_item_failures.is_empty(),
        "a class that matches nothing is not retried: {results:?}"
    );
    match &results[0].result {
        Ok(LaunchOutcome::NotLaunchable { node_claim, reason }) => {
            assert_eq!(node_claim, &claim);
            assert!(reason.contains("SubnetsNotFound"), "{reason}");
            assert!(reason.contains("subnetSelectorTerms select no subnets"), "{reason}");
        }
        other => panic!("expected NotLaunchable, got {other:?}"),
    }
    assert!(
        s.claims().await.is_empty(),
        "the claim is deleted, not left to time out"
    );
    assert!(
        s.drain(&s.pending_queue).await.is_empty(),
        "no solve is asked for: it would pick the same class again"
    );
    assert!(s.instance_states().await.is_empty(), "nothing launched");

    // 4. The next sweep says why the class cannot launch.
    let report = sweeper.run().await.unwrap();
    assert_eq!(report.classes.written, vec!["default".to_string()]);
    let class = read_class(&s).await;
    let ready = condition(&class, "Ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str(), ready.message.as_str()),
        ("False", "SubnetsNotFound", "subnetSelectorTerms select no subnets")
    );
    let subnets_ready = condition(&class, "SubnetsReady");
    assert_eq!(
        (subnets_ready.status.as_str(), subnets_ready.reason.as_str()),
        ("False", "SubnetsNotFound")
    );
    assert_eq!(condition(&class, "AMIsReady").status, "True");
    assert_eq!(
        condition(&class, "AMIsReady").last_transition_time,
        status
            .conditions
            .iter()
            .find(|c| c.type_ == "AMIsReady")
            .unwrap()
            .last_transition_time,
        "an unchanged condition keeps its transition time"
    );
    let now = class.status.clone().unwrap();
    assert!(now.subnets.is_empty(), "{now:?}");
    assert_eq!(now.security_groups, status.security_groups);

    // 5. Provisioning no longer uses the pool: the pods stay pending, no claim.
    let outcome = s.provision(&["web-0", "web-1"]).await;
    assert!(outcome.created.is_empty(), "{outcome:?}");
    assert_eq!(outcome.unschedulable.len(), 2, "{outcome:?}");
    assert!(s.drain(&s.launch_queue).await.is_empty());

    // 6. `kubectl get ec2nodeclass -o yaml` explains it.
    let dir = std::env::temp_dir().join(format!("nodesmith-status-kubectl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    s.kube.write_kubeconfig(&kubeconfig).unwrap();
    let kubectl = Kubectl {
        kubeconfig,
        dir: dir.clone(),
    };
    let yaml = kubectl.ok(&["get", "ec2nodeclass", "default", "-o", "yaml"]).await;
    for want in [
        "reason: SubnetsNotFound",
        "message: subnetSelectorTerms select no subnets",
        "type: Ready",
        "instanceProfile: demo_",
        "id: ami-0a1b2c3d4e5f60001",
        "name: demo-nodes",
    ] {
        assert!(yaml.contains(want), "{want} not in:\n{yaml}");
    }
    let _ = std::fs::remove_dir_all(&dir);

    // 7. The tags come back: Ready again.
    for id in &subnets {
        s.ec2
            .create_tags()
            .resources(id)
            .tags(aws_sdk_ec2::types::Tag::builder().key(DISCOVERY).value(CLUSTER).build())
            .send()
            .await
            .unwrap();
    }
    sweeper.run().await.unwrap();
    let class = read_class(&s).await;
    assert_eq!(condition(&class, "Ready").status, "True");
    assert_eq!(class.status.unwrap().subnets.len(), 4);
    let outcome = s.provision(&["web-0", "web-1"]).await;
    assert_eq!(outcome.created.len(), 1, "{outcome:?}");
}

#[tokio::test]
async fn a_status_write_changes_only_the_status_and_a_spec_write_keeps_it() {
    let s = Stack::new("64", 0).await;
    let cluster = s.cluster();
    let mut class = read_class(&s).await;
    assert!(class.status.is_none());
    let mut status = nodesmith::apis::ec2nodeclass::EC2NodeClassStatus {
        instance_profile: Some("written-by-test".into()),
        ..Default::default()
    };
    class.status = Some(status.clone());
    // A changed spec sent through /status is ignored.
    class.spec.role = Some("SomeoneElse".into());
    assert!(cluster.replace_node_class_status(&class).await.unwrap());
    let stored = read_class(&s).await;
    assert_eq!(stored.status, Some(status.clone()));
    assert_eq!(stored.spec.role.as_deref(), Some("KarpenterNodeRole-demo"));
    assert_eq!(
        stored.metadata.generation,
        Some(1),
        "a status write is no new generation"
    );

    // A stale resourceVersion is refused.
    status.instance_profile = Some("stale".into());
    class.status = Some(status);
    let e = cluster.replace_node_class_status(&class).await.unwrap_err();
    assert_eq!(e.code(), Some(409), "{e}");

    // A write of the object (as `kubectl apply` of the manifest) keeps the status.
    let mut v = serde_json::to_value(&stored).unwrap();
    v["spec"]["role"] = "OtherRole".into();
    v["status"] = serde_json::json!({"instanceProfile": "from-a-spec-write"});
    v["metadata"].as_object_mut().unwrap().remove("resourceVersion");
    let client = s.kube.client();
    let req = http::Request::put("/apis/karpenter.k8s.aws/v1/ec2nodeclasses/default")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&v).unwrap())
        .unwrap();
    let _: serde_json::Value = client.request(req).await.unwrap();
    let after = read_class(&s).await;
    assert_eq!(after.spec.role.as_deref(), Some("OtherRole"));
    assert_eq!(after.metadata.generation, Some(2));
    assert_eq!(
        after.status.and_then(|st| st.instance_profile).as_deref(),
        Some("written-by-test")
    );

    // Unknown classes: Ok(false).
    let mut gone = stored.clone();
    gone.metadata.name = Some("gone".into());
    gone.metadata.resource_version = None;
    assert!(!cluster.replace_node_class_status(&gone).await.unwrap());
}

#[tokio::test]
async fn selected_reservations_reach_the_status_the_plan_the_launch_and_the_node() {
    let s = Stack::new("64", 4).await;
    let sweeper = sweeper(&s).await;
    let cr = launch_fixtures::capacity_reservation(&s.ec2, "m5.large", "us-east-1a", 1, "ml").await;
    // The pool allows reserved capacity; the class selects the team's reservations.
    let mut pool = s.cluster().node_pools().await.unwrap().remove(0);
    pool.spec.template.spec.requirements[1].values = vec!["reserved".into(), "on-demand".into()];
    pool.metadata.resource_version = None;
    s.kube.apply(&serde_json::to_value(&pool).unwrap()).unwrap();
    let mut class = read_class(&s).await;
    class.spec.capacity_reservation_selector_terms = vec![nodesmith::apis::ec2nodeclass::SelectorTerm {
        tags: [("team".to_string(), "ml".to_string())].into(),
        ..Default::default()
    }];
    class.metadata.resource_version = None;
    s.kube.apply(&serde_json::to_value(&class).unwrap()).unwrap();

    // 1. The sweep lists the reservation, with its room, in the status.
    sweeper.run().await.unwrap();
    let class = read_class(&s).await;
    let listed = &class.status.as_ref().unwrap().capacity_reservations;
    assert_eq!(listed.len(), 1, "{:?}", class.status);
    assert_eq!(
        (
            listed[0].id.as_str(),
            listed[0].instance_type.as_str(),
            listed[0].availability_zone.as_str()
        ),
        (cr.as_str(), "m5.large", "us-east-1a")
    );
    assert_eq!(listed[0].available_instance_count, Some(1));
    assert_eq!(condition(&class, "CapacityReservationsReady").status, "True");

    // 2. Four 900m pods need two 2-vCPU nodes: one planned into the reservation.
    s.drain(&s.pending_queue).await;
    let outcome = s.provision(&["web-0", "web-1", "web-2", "web-3"]).await;
    assert_eq!(outcome.created.len(), 2, "{outcome:?}");

    // 3. One launched into it, one on-demand; the node joins with the reservation's labels.
    s.launch_all().await;
    let claims = s.claims().await;
    let mut types: Vec<&str> = claims.iter().filter_map(|c| c.capacity_type.as_deref()).collect();
    types.sort();
    assert_eq!(types, ["on-demand", "reserved"], "{claims:?}");
    let reserved: Vec<_> = claims
        .into_iter()
        .filter(|c| c.capacity_type.as_deref() == Some("reserved"))
        .collect();
    let instance_id = reserved[0].instance_id.clone().unwrap();
    let described = s
        .ec2
        .describe_instances()
        .instance_ids(&instance_id)
        .send()
        .await
        .unwrap();
    assert_eq!(
        described.reservations()[0].instances()[0].capacity_reservation_id(),
        Some(cr.as_str())
    );
    s.kubelet_step().await;
    sweeper.run().await.unwrap();
    let node = s
        .nodes()
        .await
        .into_iter()
        .find(|n| {
            n.spec
                .as_ref()
                .and_then(|sp| sp.provider_id.as_deref())
                .is_some_and(|p| p.ends_with(&instance_id))
        })
        .expect("the reserved node joined");
    let labels = node.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels.get("karpenter.sh/capacity-type").map(String::as_str),
        Some("reserved")
    );
    assert_eq!(
        labels
            .get("karpenter.k8s.aws/capacity-reservation-id")
            .map(String::as_str),
        Some(cr.as_str())
    );
    assert_eq!(
        labels
            .get("karpenter.k8s.aws/capacity-reservation-type")
            .map(String::as_str),
        Some("default")
    );
    // 4. The status says it is full now.
    let class = read_class(&s).await;
    assert_eq!(
        class.status.unwrap().capacity_reservations[0].available_instance_count,
        Some(0)
    );
}

#[tokio::test]
async fn a_named_instance_profile_iam_does_not_have_turns_the_class_not_ready() {
    let s = Stack::new("64", 0).await;
    let conf = s.m.sdk_config().await;
    let iam = aws_sdk_iam::Client::new(&conf);
    let sweeper = sweeper(&s).await.with_iam(iam.clone());
    let mut class = read_class(&s).await;
    class.spec.role = None;
    class.spec.instance_profile = Some("team-nodes".into());
    class.metadata.resource_version = None;
    s.kube.apply(&serde_json::to_value(&class).unwrap()).unwrap();

    sweeper.run().await.unwrap();
    let class = read_class(&s).await;
    let profile = condition(&class, "InstanceProfileReady");
    assert_eq!(
        (
            profile.status.as_str(),
            profile.reason.as_str(),
            profile.message.as_str()
        ),
        (
            "False",
            "InstanceProfileNotFound",
            "instance profile team-nodes does not exist in IAM"
        )
    );
    assert_eq!(condition(&class, "Ready").status, "False");
    assert!(!class.may_launch(), "provisioning leaves its pools alone");

    // The platform team creates it: Ready at the next sweep.
    iam.create_instance_profile()
        .instance_profile_name("team-nodes")
        .send()
        .await
        .unwrap();
    sweeper.run().await.unwrap();
    let class = read_class(&s).await;
    assert_eq!(condition(&class, "InstanceProfileReady").status, "True");
    assert_eq!(condition(&class, "Ready").status, "True");
    assert_eq!(class.status.unwrap().instance_profile.as_deref(), Some("team-nodes"));
}

#[tokio::test]
async fn a_launch_ec2_refuses_turns_the_class_launch_succeeded_false_until_one_succeeds() {
    let s = Stack::new("64", 2).await;
    let sweeper = sweeper(&s).await;
    sweeper.run().await.unwrap();
    assert!(
        read_class(&s).await.condition("LaunchSucceeded").is_none(),
        "no launch yet: nothing to say"
    );
    s.drain(&s.pending_queue).await;
    let outcome = s.provision(&["web-0", "web-1"]).await;
    assert_eq!(outcome.created.len(), 1, "{outcome:?}");
    let bodies = s.drain(&s.launch_queue).await;

    // 1. IAM denies CreateFleet: the launch fails, and the next sweep says so on the class.
    let proxy = nodesmith_tests::fault_proxy::FaultProxy::start(s.m.endpoint()).await;
    proxy.fail_next(
        "CreateFleet",
        1,
        403,
        "UnauthorizedOperation",
        "You are not authorized to perform this operation.",
    );
    let denied = launcher_with(&s.m, proxy.endpoint(), &s.kube, Some(s.pending_queue.clone())).await;
    let (response, _) = batch::handle(&denied, &event(bodies.clone())).await;
    assert_eq!(response.batch_item_failures.len(), 1, "redelivered");
    sweeper.run().await.unwrap();
    let class = read_class(&s).await;
    let c = condition(&class, "LaunchSucceeded");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "LaunchRefused"),
        "{c:?}"
    );
    assert!(c.message.contains("UnauthorizedOperation"), "{c:?}");
    assert_eq!(
        condition(&class, "Ready").status,
        "True",
        "a refusal is fixed outside the class: launches go on"
    );

    // 2. The denial is lifted: the redelivered launch succeeds, and the condition follows.
    let launcher = launcher_with(&s.m, s.m.endpoint(), &s.kube, Some(s.pending_queue.clone())).await;
    let (response, results) = batch::handle(&launcher, &event(bodies)).await;
    assert!(response.batch_item_failures.is_empty(), "{results:?}");
    sweeper.run().await.unwrap();
    let class = read_class(&s).await;
    assert_eq!(condition(&class, "LaunchSucceeded").status, "True");
}
