//! Where `launch` gets the EC2NodeClass: from the cluster, read when it
//! launches, never from the queue message. A message that carries a class
//! (so could choose the instance profile) is refused; a class edited after
//! the claim was written is the one launched with; a claim whose class was
//! deleted is given up with its reason, not retried.

use std::collections::BTreeMap;

use crate::launch_fixtures::*;
use nodesmith::apis::EC2NodeClass;
use nodesmith::apis::ec2nodeclass::EC2NodeClassSpec;
use nodesmith::launch::{LaunchError, LaunchOutcome, batch};
use nodesmith::messages::{LaunchRequest, PendingMessage, RequestError};
use nodesmith::nodeclaim::Phase;
use nodesmith_tests::kube_server::KubeServer;
use nodesmith_tests::moto::{Moto, moto};
use nodesmith_tests::sqs;

fn event(bodies: &[(&str, String)]) -> aws_lambda_events::sqs::SqsEvent {
    sqs::event(bodies.iter().map(|(id, b)| (*id, b.clone())))
}

/// A class that names its instance profile as is (no role).
fn with_profile(profile: &str) -> EC2NodeClassSpec {
    EC2NodeClassSpec {
        role: None,
        instance_profile: Some(profile.into()),
        ..node_class("al2023@latest")
    }
}

/// Every instance profile any launch template names (moto is reset for each
/// test, so these are the templates this test's launches made).
async fn every_template_profile(m: &Moto) -> Vec<String> {
    let ec2 = aws_sdk_ec2::Client::new(&m.sdk_config().await);
    let lts = ec2.describe_launch_templates().max_results(200).send().await.unwrap();
    let mut out = Vec::new();
    for lt in lts.launch_templates() {
        let v = ec2
            .describe_launch_template_versions()
            .launch_template_id(lt.launch_template_id().unwrap())
            .send()
            .await
            .unwrap();
        for version in v.launch_template_versions() {
            if let Some(p) = version
                .launch_template_data()
                .and_then(|d| d.iam_instance_profile())
                .and_then(|p| p.name())
            {
                out.push(p.to_string());
            }
        }
    }
    out
}

fn tag<'a>(i: &'a aws_sdk_ec2::types::Instance, key: &str) -> Option<&'a str> {
    i.tags().iter().find(|t| t.key() == Some(key)).and_then(|t| t.value())
}

#[tokio::test]
async fn a_message_cannot_choose_the_instance_profile() {
    let m = moto().await;
    world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let l = launcher(&m, m.endpoint(), &kube).await;
    pending(
        &kube,
        &st,
        &claim("forge-1", &["m5.large"], &["on-demand"]),
        &with_profile("NodesProfile"),
    )
    .await;

    // Someone who may send to the launch queue names the claim with their own class.
    let mut chosen = with_profile("ChosenProfile");
    chosen.tags = BTreeMap::from([("owner".to_string(), "someone-else".to_string())]);
    let forged =
        serde_json::json!({"nodeClaim": "forge-1", "nodeClassName": "default", "nodeClass": chosen}).to_string();
    let (resp, results) = batch::handle(&l, &event(&[("forged", forged)])).await;
    assert_eq!(resp.batch_item_failures.len(), 1, "refused: {results:?}");
    match &results[0].result {
        Err(LaunchError::Request(e @ RequestError::CarriesClass { field: "nodeClass" })) => {
            assert!(e.to_string().contains("`nodeClass`"), "{e}")
        }
        other => panic!("expected the class field to be refused, got {other:?}"),
    }
    assert!(instances_of(&m, "forge-1").await.is_empty());
    assert_eq!(
        st.get_node_claim("forge-1").await.unwrap().unwrap().phase,
        Phase::Pending
    );

    // The message that names the claim only: launched with the cluster's class.
    let body = LaunchRequest::new("forge-1").to_body().unwrap();
    assert_eq!(body, r#"{"nodeClaim":"forge-1"}"#);
    let (resp, results) = batch::handle(&l, &event(&[("claim-only", body)])).await;
    assert!(resp.batch_item_failures.is_empty(), "{results:?}");
    assert!(
        matches!(results[0].result, Ok(LaunchOutcome::Launched(_))),
        "{results:?}"
    );
    let launched = instances_of(&m, "forge-1").await;
    assert_eq!(launched.len(), 1);
    assert_eq!(tag(&launched[0], "owner"), None);
    assert_eq!(every_template_profile(&m).await, vec!["NodesProfile".to_string()]);
}

#[tokio::test]
async fn a_class_edited_after_the_claim_was_written_is_the_one_launched_with() {
    let m = moto().await;
    world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let l = launcher(&m, m.endpoint(), &kube).await;
    let before = with_profile("ProfileBefore");
    let mut c = claim("edit-1", &["m5.large"], &["on-demand"]);
    // Stamped as the solver stamps it, from the class it saw.
    c.nodeclass_hash = Some(EC2NodeClass::new("default", before.clone()).hash());
    let req = pending(&kube, &st, &c, &before).await;

    let mut after = with_profile("ProfileAfter");
    after.tags = BTreeMap::from([("team".to_string(), "edited".to_string())]);
    put_class(&kube, "default", &after);

    let LaunchOutcome::Launched(got) = l.launch(&req).await.unwrap() else {
        panic!("expected a launch")
    };
    let launched = instances_of(&m, "edit-1").await;
    assert_eq!(launched.len(), 1);
    assert_eq!(every_template_profile(&m).await, vec!["ProfileAfter".to_string()]);
    assert_eq!(tag(&launched[0], "team"), Some("edited"));
    assert_eq!(
        got.nodeclass_hash,
        Some(EC2NodeClass::new("default", after.clone()).hash()),
        "the claim carries the hash of the class it was launched with, so the node is not drifted at once"
    );
    assert_eq!(
        st.get_node_claim("edit-1").await.unwrap().unwrap().nodeclass_hash,
        got.nodeclass_hash
    );
}

#[tokio::test]
async fn a_claim_whose_class_was_deleted_is_given_up_with_the_reason() {
    let m = moto().await;
    world(&m).await;
    let kube = KubeServer::start().await;
    let st = store(&m).await;
    let client = aws_sdk_sqs::Client::new(&m.sdk_config().await);
    let pending_queue = sqs::create_queue(&client, "pending-pods").await;
    let l = launcher_with(&m, m.endpoint(), &kube, Some(pending_queue.clone())).await;
    let req = pending(
        &kube,
        &st,
        &claim("orphan-1", &["m5.large"], &["on-demand"]),
        &node_class("al2023@latest"),
    )
    .await;
    kube.delete("karpenter.k8s.aws/v1", "EC2NodeClass", "", "default")
        .unwrap();

    let (resp, results) = batch::handle(&l, &event(&[("m0", req.to_body().unwrap())])).await;
    assert!(resp.batch_item_failures.is_empty(), "handled, not retried: {results:?}");
    assert_eq!(
        results[0].result.as_ref().unwrap(),
        &LaunchOutcome::ClassGone {
            node_claim: "orphan-1".into(),
            node_class: "default".into(),
        }
    );
    assert_eq!(st.get_node_claim("orphan-1").await.unwrap(), None);
    assert!(instances_of(&m, "orphan-1").await.is_empty());
    let asked: Vec<PendingMessage> = sqs::drain(&client, &pending_queue)
        .await
        .iter()
        .map(|b| PendingMessage::parse(b).unwrap())
        .collect();
    let reasons: Vec<(String, Option<String>)> = asked
        .iter()
        .filter_map(|p| match p {
            PendingMessage::Solve(s) => Some((s.reason.clone(), s.node_claim.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        reasons,
        vec![("launch-class-gone".to_string(), Some("orphan-1".to_string()))],
        "its pods are solved again at once"
    );
    // A redelivery finds nothing to do.
    assert_eq!(l.launch(&req).await.unwrap(), LaunchOutcome::Gone("orphan-1".into()));
}

#[tokio::test]
async fn a_claim_whose_class_fails_validation_is_given_up_with_the_reason() {
    let m = moto().await;
    let (kube, st, l) = launching(&m).await;
    // Both role and instanceProfile: Karpenter's CRD refuses it; a cluster
    // without those rules may still hold it.
    let invalid = EC2NodeClassSpec {
        instance_profile: Some("some-profile".into()),
        ..node_class("al2023@latest")
    };
    let req = pending(&kube, &st, &claim("invalid-1", &["m5.large"], &["on-demand"]), &invalid).await;
    let (resp, results) = batch::handle(&l, &event(&[("m0", req.to_body().unwrap())])).await;
    assert!(resp.batch_item_failures.is_empty(), "handled, not retried: {results:?}");
    match results[0].result.as_ref().unwrap() {
        LaunchOutcome::NotLaunchable { node_claim, reason } => {
            assert_eq!(node_claim, "invalid-1");
            assert!(
                reason.contains("exactly one of ['role', 'instanceProfile']"),
                "{reason}"
            );
        }
        other => panic!("expected NotLaunchable, got {other:?}"),
    }
    assert_eq!(st.get_node_claim("invalid-1").await.unwrap(), None);
    assert!(instances_of(&m, "invalid-1").await.is_empty());
}
