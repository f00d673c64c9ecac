//! Instance profiles: a class's `role` gets a profile nodesmith makes on first
//! use, reuses, replaces when the role changes and the sweep deletes once no
//! class names it, no instance runs with it (EC2, and moto as patched, gives
//! an instance its launch template's profile) and a grace has passed since its
//! last user; `instanceProfile` is used as is. The fault proxy makes
//! CreateFleet as strict as EC2 (moto launches with any profile): a profile IAM
//! does not have is refused, and a new one is refused for its first calls.

use std::collections::BTreeSet;

use crate::launch_fixtures::*;
use jiff::{SignedDuration, Timestamp};
use nodesmith::apis::EC2NodeClass;
use nodesmith::launch::{LaunchOutcome, gc};
use nodesmith::nodeclass::profile::{self, PROFILE_GRACE, PROFILE_PATH};
use nodesmith_tests::fault_proxy::FaultProxy;
use nodesmith_tests::kube_server::KubeServer;
use nodesmith_tests::moto::{Moto, moto};

/// Profiles under nodesmith's path: name → roles.
async fn managed_profiles(m: &Moto) -> Vec<(String, Vec<String>)> {
    let iam = aws_sdk_iam::Client::new(&m.sdk_config().await);
    let out = iam
        .list_instance_profiles()
        .path_prefix(PROFILE_PATH)
        .send()
        .await
        .unwrap();
    let mut v: Vec<(String, Vec<String>)> = out
        .instance_profiles()
        .iter()
        // moto ignores PathPrefix.
        .filter(|p| p.path() == PROFILE_PATH)
        .map(|p| {
            (
                p.instance_profile_name().to_string(),
                p.roles().iter().map(|r| r.role_name().to_string()).collect(),
            )
        })
        .collect();
    v.sort();
    v
}

/// The instance profile every launch template names.
async fn template_profiles(m: &Moto) -> Vec<String> {
    let ec2 = aws_sdk_ec2::Client::new(&m.sdk_config().await);
    let lts = ec2.describe_launch_templates().max_results(200).send().await.unwrap();
    let mut out = Vec::new();
    for lt in lts.launch_templates() {
        let v = ec2
            .describe_launch_template_versions()
            .launch_template_name(lt.launch_template_name().unwrap())
            .send()
            .await
            .unwrap();
        let data = v.launch_template_versions()[0].launch_template_data().unwrap();
        out.push(
            data.iam_instance_profile()
                .and_then(|p| p.name())
                .unwrap_or_default()
                .to_string(),
        );
    }
    out.sort();
    out.dedup();
    out
}

#[tokio::test]
async fn a_role_gets_a_profile_made_on_first_use_reused_replaced_and_collected() {
    let m = moto().await;
    world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let proxy = FaultProxy::start(m.endpoint()).await;
    // EC2 does not see a new profile for its first two CreateFleets.
    proxy.strict_instance_profiles(2);
    let l = launcher(&m, proxy.endpoint(), &kube).await;
    let class = node_class("al2023@latest");
    let req = pending(&kube, &st, &claim("ip-1", &["m5.large"], &["on-demand"]), &class).await;
    let got = l.launch(&req).await.unwrap();
    assert!(matches!(got, LaunchOutcome::Launched(_)), "{got:?}");
    assert_eq!(
        proxy.profile_refusals(),
        2,
        "refused while IAM propagated, then retried"
    );
    let first = profile::profile_name(CLUSTER, "default", "KarpenterNodeRole-demo");
    assert_eq!(
        managed_profiles(&m).await,
        vec![(first.clone(), vec!["KarpenterNodeRole-demo".to_string()])]
    );
    assert_eq!(template_profiles(&m).await, vec![first.clone()]);
    let iam = aws_sdk_iam::Client::new(&m.sdk_config().await);
    let got = iam
        .get_instance_profile()
        .instance_profile_name(&first)
        .send()
        .await
        .unwrap();
    let tags = got.instance_profile().unwrap();
    let tag = |k: &str| tags.tags().iter().find(|t| t.key() == k).map(|t| t.value().to_string());
    assert_eq!(tag("kubernetes.io/cluster/demo").as_deref(), Some("owned"));
    assert_eq!(tag("karpenter.k8s.aws/ec2nodeclass").as_deref(), Some("default"));

    // Reused: a second claim makes nothing new.
    let req = pending(&kube, &st, &claim("ip-2", &["m5.large"], &["on-demand"]), &class).await;
    assert!(matches!(l.launch(&req).await.unwrap(), LaunchOutcome::Launched(_)));
    assert_eq!(managed_profiles(&m).await.len(), 1);

    // The role changes: a new profile; the old one goes once no class uses it.
    node_role(&m.sdk_config().await, "KarpenterNodeRole-demo-v2").await;
    let mut changed = class.clone();
    changed.role = Some("KarpenterNodeRole-demo-v2".into());
    let req = pending(&kube, &st, &claim("ip-3", &["m5.large"], &["on-demand"]), &changed).await;
    assert!(matches!(l.launch(&req).await.unwrap(), LaunchOutcome::Launched(_)));
    let second = profile::profile_name(CLUSTER, "default", "KarpenterNodeRole-demo-v2");
    assert_eq!(managed_profiles(&m).await.len(), 2);
    // The old profile stays while nodes ip-1 and ip-2 run with it (the issue's
    // review: deleting it took their credentials).
    let classes = [EC2NodeClass::new("default", changed.clone())];
    let ec2 = aws_sdk_ec2::Client::new(&m.sdk_config().await);
    let used = gc::profiles_in_use(&ec2, CLUSTER).await.unwrap();
    assert_eq!(used, BTreeSet::from([first.clone(), second.clone()]));
    let later = Timestamp::now() + SignedDuration::from_hours(2);
    let deleted = gc::collect_profiles(&iam, &st, CLUSTER, &classes, &used, later, PROFILE_GRACE)
        .await
        .unwrap();
    assert!(deleted.is_empty(), "nodes run with {first}: {deleted:?}");
    assert_eq!(managed_profiles(&m).await.len(), 2);
}

#[tokio::test]
async fn an_instance_profile_class_uses_the_named_profile_as_is() {
    let m = moto().await;
    world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let proxy = FaultProxy::start(m.endpoint()).await;
    proxy.strict_instance_profiles(0);
    let iam = aws_sdk_iam::Client::new(&m.sdk_config().await);
    iam.create_instance_profile()
        .instance_profile_name("MyNodeProfile")
        .send()
        .await
        .unwrap();
    let l = launcher(&m, proxy.endpoint(), &kube).await;
    let mut class = node_class("al2023@latest");
    class.role = None;
    class.instance_profile = Some("MyNodeProfile".into());
    let req = pending(&kube, &st, &claim("ip-4", &["m5.large"], &["on-demand"]), &class).await;
    assert!(matches!(l.launch(&req).await.unwrap(), LaunchOutcome::Launched(_)));
    assert_eq!(template_profiles(&m).await, vec!["MyNodeProfile".to_string()]);
    assert!(managed_profiles(&m).await.is_empty(), "nothing made");
    assert_eq!(proxy.profile_refusals(), 0);
}

/// The instance profile EC2 shows on a claim's instance (its name: the ARN's last segment).
async fn profile_of_instance(m: &Moto, claim: &str) -> String {
    let instance = instances_of(m, claim).await.remove(0);
    let p = instance
        .iam_instance_profile()
        .expect("EC2 gives an instance its launch template's profile");
    assert!(p.id().is_some_and(|id| !id.is_empty()), "{p:?}");
    let arn = p.arn().expect("the profile's ARN");
    assert!(arn.contains(&format!(":instance-profile{PROFILE_PATH}")), "{arn}");
    arn.rsplit('/').next().unwrap().to_string()
}

#[tokio::test]
async fn a_profile_a_running_instance_uses_outlives_its_class() {
    let m = moto().await;
    world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let l = launcher(&m, m.endpoint(), &kube).await;
    let class = node_class("al2023@latest");
    let req = pending(&kube, &st, &claim("live-1", &["m5.large"], &["on-demand"]), &class).await;
    assert!(matches!(l.launch(&req).await.unwrap(), LaunchOutcome::Launched(_)));
    let first = profile::profile_name(CLUSTER, "default", "KarpenterNodeRole-demo");
    assert_eq!(profile_of_instance(&m, "live-1").await, first);

    // The class's role changes, then the class is deleted: the node running
    // with the old profile keeps it (and so its credentials), hours later too.
    let mut changed = class.clone();
    changed.role = Some("KarpenterNodeRole-demo-v2".into());
    let iam = aws_sdk_iam::Client::new(&m.sdk_config().await);
    let ec2 = aws_sdk_ec2::Client::new(&m.sdk_config().await);
    let later = Timestamp::now() + SignedDuration::from_hours(2);
    for classes in [vec![EC2NodeClass::new("default", changed.clone())], vec![]] {
        let used = gc::profiles_in_use(&ec2, CLUSTER).await.unwrap();
        let deleted = gc::collect_profiles(&iam, &st, CLUSTER, &classes, &used, later, PROFILE_GRACE)
            .await
            .unwrap();
        assert!(deleted.is_empty(), "instance live-1 runs with {first}: {deleted:?}");
    }
    assert_eq!(
        managed_profiles(&m).await,
        vec![(first.clone(), vec!["KarpenterNodeRole-demo".to_string()])]
    );

    // The node goes: the profile stays for the grace after it was last seen in use, then goes.
    let id = instances_of(&m, "live-1").await[0].instance_id().unwrap().to_string();
    ec2.terminate_instances().instance_ids(&id).send().await.unwrap();
    let used = gc::profiles_in_use(&ec2, CLUSTER).await.unwrap();
    assert!(used.is_empty(), "{used:?}");
    let deleted = gc::collect_profiles(&iam, &st, CLUSTER, &[], &used, later, PROFILE_GRACE)
        .await
        .unwrap();
    assert!(deleted.is_empty(), "seen in use just now: {deleted:?}");
    let after_grace = later + SignedDuration::try_from(PROFILE_GRACE).unwrap();
    let deleted = gc::collect_profiles(&iam, &st, CLUSTER, &[], &used, after_grace, PROFILE_GRACE)
        .await
        .unwrap();
    assert_eq!(deleted, vec![first]);
    assert!(managed_profiles(&m).await.is_empty());
}
