//! The state table is a cache that can be lost: on the local cloud, a fleet
//! of Running pods on nodesmith's nodes survives a wipe of every item in the
//! table. The sweep re-adopts its own registered, Ready nodes (their claims
//! rebuilt from the instance and the Node) instead of collecting them,
//! leaves another stack's instance alone, and goes on managing the adopted
//! nodes: one emptied afterwards is consolidated away.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use nodesmith_tests::local_cloud::census::{self, World, pod_running};
use nodesmith_tests::local_cloud::{LocalCloud, Settings, aws, default_objects};
use serde_json::{Value, json};

const APPS: [&str; 2] = ["web", "api"];

/// A Deployment of `replicas` pause pods of 1 CPU held to one zone, so the
/// two apps get nodes of their own.
fn pinned(app: &str, replicas: usize, zone: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": app, "namespace": "default"}, "spec": {
        "replicas": replicas,
        "selector": {"matchLabels": {"app": app}},
        "template": {"metadata": {"labels": {"app": app}}, "spec": {
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {"topology.kubernetes.io/zone": zone},
            "containers": [{"name": "app", "image": "public.ecr.aws/eks-distro/kubernetes/pause:3.7",
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]
        }}
    }})
}

async fn observe(cloud: &LocalCloud) -> World {
    census::observe(cloud, |a| APPS.contains(&a)).await.unwrap()
}

/// Sweeps (each once the functions are quiet) until `goal` holds, at most `limit` sweeps.
async fn sweep_until(cloud: &LocalCloud, limit: usize, what: &str, goal: impl Fn(&World) -> bool) -> World {
    for _ in 0..limit {
        let w = observe(cloud).await;
        if goal(&w) {
            return w;
        }
        cloud.quiet(Duration::from_secs(30)).await;
        let answer = cloud.sweep().await.unwrap();
        assert!(answer.result.is_ok(), "the sweep failed: {:?}", answer.result);
    }
    let w = observe(cloud).await;
    assert!(goal(&w), "{what}: not reached after {limit} sweeps: {w:#?}");
    w
}

/// Deletes every item of the state table (claims, leases, catalog, records).
async fn wipe(cloud: &LocalCloud) -> usize {
    let ddb = aws_sdk_dynamodb::Client::new(&cloud.sdk);
    let mut keys: Vec<BTreeMap<String, AttributeValue>> = Vec::new();
    let mut pages = ddb.scan().table_name(aws::TABLE).into_paginator().send();
    while let Some(page) = pages.next().await {
        for item in page.unwrap().items() {
            keys.push(["pk", "sk"].iter().map(|k| (k.to_string(), item[*k].clone())).collect());
        }
    }
    for key in &keys {
        ddb.delete_item()
            .table_name(aws::TABLE)
            .set_key(Some(key.clone().into_iter().collect()))
            .send()
            .await
            .unwrap();
    }
    keys.len()
}

/// An instance another nodesmith stack of the same cluster launched (tagged
/// as nodesmith tags, with that stack's identity), whose claim this stack's
/// table never had.
async fn other_stacks_instance(cloud: &LocalCloud) -> String {
    let cluster = &cloud.settings.cluster;
    let tags = [
        (format!("kubernetes.io/cluster/{cluster}"), "owned".to_string()),
        ("eks:eks-cluster-name".to_string(), cluster.clone()),
        ("nodesmith/launched-by".to_string(), cluster.clone()),
        ("nodesmith/stack".to_string(), "another-stack".to_string()),
        ("karpenter.sh/nodepool".to_string(), "default".to_string()),
        ("karpenter.sh/nodeclaim".to_string(), "default-other".to_string()),
    ];
    nodesmith_tests::moto::run_tagged_instance(&aws_sdk_ec2::Client::new(&cloud.sdk), &tags).await
}

fn states(w: &World) -> BTreeMap<String, String> {
    w.instances.iter().map(|i| (i.id.clone(), i.state.clone())).collect()
}

/// Running pods by name, with the node each runs on.
fn running_pods(w: &World) -> BTreeMap<String, String> {
    w.pods
        .iter()
        .filter(|p| pod_running(p))
        .filter_map(|p| Some((p.metadata.name.clone()?, p.spec.as_ref()?.node_name.clone()?)))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wiped_state_table_leaves_every_pod_running_and_the_nodes_managed() {
    let started = Instant::now();
    let mut settings = Settings::from_lookup(|_| None, nodesmith_tests::bin_dir()).unwrap();
    settings.manual_sweep = true;
    settings.kubelet_join = Duration::from_millis(500);
    settings.kubelet_ready = Duration::from_millis(500);
    // Short, so today's collection of claimless instances shows within a sweep or two.
    settings.leak_grace = Duration::from_secs(2);
    let cloud = LocalCloud::start(settings).await.unwrap();
    let zones = nodesmith_tests::moto::ZONES;
    // No consolidation until the fleet is adopted: nothing moves but what the wipe causes.
    let mut pool = default_objects(&cloud.settings.cluster, &cloud.world.node_role)[0].clone();
    pool["spec"]["disruption"] =
        json!({"consolidationPolicy": "WhenEmpty", "consolidateAfter": "Never", "budgets": [{"nodes": "100%"}]});
    cloud.kube.apply(&pool).unwrap();
    cloud.kube.apply(&pinned("web", 2, zones[0])).unwrap();
    cloud.kube.apply(&pinned("api", 2, zones[1])).unwrap();
    let before = sweep_until(&cloud, 30, "every pod running on initialized nodes", |w| {
        w.pods.len() == 4
            && w.running() == 4
            && w.settled()
            && w.claims
                .iter()
                .all(|c| c.phase == nodesmith::nodeclaim::Phase::Initialized)
    })
    .await;
    let pods_before = running_pods(&before);
    let claims_before: BTreeSet<(String, Option<String>, Option<String>)> = before
        .claims
        .iter()
        .map(|c| (c.name.clone(), c.instance_id.clone(), c.node_name.clone()))
        .collect();
    assert!(claims_before.len() >= 2, "a node per zone: {claims_before:?}");
    let foreign = other_stacks_instance(&cloud).await;

    // The table is lost.
    let wiped = wipe(&cloud).await;
    assert!(wiped >= claims_before.len(), "{wiped} items wiped");
    assert!(observe(&cloud).await.claims.is_empty());

    // Sweeps past the leak window: nothing is terminated, every pod runs on
    // where it ran, and the claims come back from the instances and Nodes.
    let mut adopted = None;
    for sweep in 0..4 {
        tokio::time::sleep(cloud.settings.leak_grace).await;
        cloud.quiet(Duration::from_secs(30)).await;
        let answer = cloud.sweep().await.unwrap();
        assert!(answer.result.is_ok(), "the sweep failed: {:?}", answer.result);
        let w = observe(&cloud).await;
        let terminated: Vec<String> = states(&w)
            .iter()
            .filter(|(_, s)| s.as_str() != "running")
            .map(|(i, s)| format!("{i} {s}"))
            .collect();
        assert!(
            terminated.is_empty(),
            "sweep {sweep} after the wipe: instances not running: {terminated:?}"
        );
        assert_eq!(
            running_pods(&w),
            pods_before,
            "sweep {sweep} after the wipe: the pods moved or stopped"
        );
        assert_eq!(
            states(&w).get(&foreign).map(String::as_str),
            Some("running"),
            "another stack's instance is never touched"
        );
        let rebuilt: BTreeSet<(String, Option<String>, Option<String>)> = w
            .claims
            .iter()
            .filter(|c| c.phase == nodesmith::nodeclaim::Phase::Initialized)
            .map(|c| (c.name.clone(), c.instance_id.clone(), c.node_name.clone()))
            .collect();
        if rebuilt == claims_before {
            adopted = Some(w);
        }
    }
    let adopted = adopted.expect("the claims were rebuilt, Initialized, with their instances and nodes");
    assert!(
        !adopted
            .claims
            .iter()
            .any(|c| c.instance_id.as_deref() == Some(foreign.as_str())),
        "another stack's instance is not adopted"
    );
    let adopted_events = cloud
        .kube
        .events()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Adopted"))
        .count();
    assert_eq!(adopted_events, claims_before.len(), "one Adopted event per node");

    // Still managed: api scaled to zero leaves its node empty, and
    // consolidation removes that adopted node; web's pods keep running.
    let api_nodes: BTreeSet<String> = pods_before
        .iter()
        .filter(|(p, _)| p.starts_with("api"))
        .map(|(_, n)| n.clone())
        .collect();
    let api_instances: BTreeSet<String> = adopted
        .claims
        .iter()
        .filter(|c| c.node_name.as_ref().is_some_and(|n| api_nodes.contains(n)))
        .filter_map(|c| c.instance_id.clone())
        .collect();
    assert!(!api_instances.is_empty());
    pool["spec"]["disruption"]["consolidateAfter"] = json!("0s");
    cloud.kube.apply(&pool).unwrap();
    cloud.kube.apply(&pinned("api", 0, zones[1])).unwrap();
    let end = sweep_until(&cloud, 20, "api's emptied node consolidated", |w| {
        let live: BTreeSet<String> = w.instances.iter().filter(|i| i.live()).map(|i| i.id.clone()).collect();
        w.pods.len() == 2
            && w.running() == 2
            && api_instances.iter().all(|i| !live.contains(i))
            && !w
                .nodes
                .iter()
                .any(|n| n.metadata.name.as_ref().is_some_and(|n| api_nodes.contains(n)))
    })
    .await;
    let consolidated = cloud
        .kube
        .events()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("DisruptionTerminating"))
        .count();
    assert!(consolidated >= 1, "the adopted node was removed by disruption");
    assert_eq!(
        states(&end).get(&foreign).map(String::as_str),
        Some("running"),
        "another stack's instance is never touched"
    );
    let denials = cloud.kube.denials();
    cloud.stop().await;
    assert!(denials.is_empty(), "RBAC refused calls: {denials:#?}");
    eprintln!("table wipe test took {:.1} s", started.elapsed().as_secs_f64());
}
