use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus, PodCondition, PodStatus, Taint as K8sTaint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::*;
use crate::apis::{Taint, TaintEffect};
use crate::nodeclaim::Timestamps;
use crate::resources::Resources;

fn at(s: &str) -> Timestamp {
    s.parse().unwrap()
}

const NOW: &str = "2026-01-01T01:00:00Z";

fn mins_ago(m: i64) -> Timestamp {
    at(NOW) - SignedDuration::from_secs(m * 60)
}

fn secs_ago(s: i64) -> Timestamp {
    at(NOW) - SignedDuration::from_secs(s)
}

fn claim(name: &str, phase: Phase, instance: Option<&str>, created: Timestamp) -> NodeClaim {
    NodeClaim {
        phase,
        instance_id: instance.map(Into::into),
        provider_id: instance.map(|i| format!("aws:///us-east-1a/{i}")),
        instance_type: instance.map(|_| "m5.large".into()),
        zone: instance.map(|_| "us-east-1a".into()),
        capacity_type: instance.map(|_| "on-demand".into()),
        timestamps: Timestamps {
            created: Some(created),
            launched: instance.map(|_| created),
            ..Default::default()
        },
        ..NodeClaim::pending(name, "default", "default")
    }
}

fn jiff_to_time(t: Timestamp) -> Time {
    Time(t)
}

/// The node with every label registration gives it for `c`.
fn labelled(mut n: Node, c: &NodeClaim) -> Node {
    n.metadata.labels = Some(registration::registration_update(c, None).labels);
    n
}

fn node(name: &str, instance: &str, created: Timestamp, labels: &[(&str, &str)], taints: &[&str], ready: bool) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            creation_timestamp: Some(jiff_to_time(created)),
            labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            // Registration adds it; a Node without it is written again.
            finalizers: Some(vec![crate::labels::TERMINATION_FINALIZER.to_string()]),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(format!("aws:///us-east-1a/{instance}")),
            taints: Some(
                taints
                    .iter()
                    .map(|k| K8sTaint {
                        key: k.to_string(),
                        effect: "NoSchedule".into(),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            allocatable: Some(BTreeMap::from([("cpu".to_string(), Quantity("2".into()))])),
            ..Default::default()
        }),
    }
}

fn instance(id: &str, claim: Option<&str>, state: InstanceState, launched: Timestamp) -> Instance {
    let mut tags = BTreeMap::from([
        ("kubernetes.io/cluster/demo".to_string(), "owned".to_string()),
        (labels::NODEPOOL.to_string(), "default".to_string()),
        (crate::ec2::instances::LAUNCHED_BY_TAG.to_string(), "demo".to_string()),
    ]);
    if let Some(c) = claim {
        tags.insert(labels::NODECLAIM.to_string(), c.to_string());
    }
    Instance {
        id: id.into(),
        instance_type: "m5.large".into(),
        zone: Some("us-east-1a".into()),
        subnet_id: None,
        image_id: None,
        security_group_ids: BTreeSet::new(),
        state,
        capacity_type: "on-demand".into(),
        capacity_reservation: None,
        launch_time: Some(launched),
        tags,
    }
}

fn run(claims: &[NodeClaim], nodes: &[Node], instances: &[Instance]) -> Vec<Action> {
    plan(
        &Observed {
            now: at(NOW),
            claims,
            nodes,
            instances,
            catalog: None,
        },
        &LifecycleConfig::default(),
    )
}

/// A compact view of an action for table tests.
fn short(a: &Action) -> String {
    match a {
        Action::Register { claim, node, .. } => format!("register {claim} {node}"),
        Action::Initialize { claim, node } => format!("initialize {claim} {node}"),
        Action::Remove {
            claim,
            reason,
            instance,
            node,
        } => format!(
            "remove {claim} {} instance={} node={}",
            reason.as_str(),
            instance.as_deref().unwrap_or("-"),
            node.as_deref().unwrap_or("-")
        ),
        Action::CollectInstance { instance, node } => {
            format!("collect-instance {instance} node={}", node.as_deref().unwrap_or("-"))
        }
        Action::CollectNode { node } => format!("collect-node {node}"),
        Action::Relaunch { claim } => format!("relaunch {claim}"),
        Action::Adopt { claim } => format!(
            "adopt {} {} {}",
            claim.name,
            claim.instance_id.as_deref().unwrap_or("-"),
            claim.node_name.as_deref().unwrap_or("-")
        ),
        Action::HoldCollection { instance, .. } => format!("hold-collection {instance}"),
    }
}

/// What, the claims, nodes and instances seen, and the actions wanted.
type Case = (
    &'static str,
    Vec<NodeClaim>,
    Vec<Node>,
    Vec<Instance>,
    Vec<&'static str>,
);

#[test]
fn each_claim_phase_and_what_the_world_says() {
    let running = |id: &str, c: &str| instance(id, Some(c), InstanceState::Running, mins_ago(2));
    let registered = claim("c", Phase::Registered, Some("i-1"), mins_ago(2));
    let reg_node =
        |taints: &[&str], ready: bool| labelled(node("ip-1", "i-1", mins_ago(1), &[], taints, ready), &registered);
    let cases: Vec<Case> = vec![
        (
            "young pending claim: wait for launch",
            vec![claim("c", Phase::Pending, None, secs_ago(20))],
            vec![],
            vec![],
            vec![],
        ),
        (
            "pending for two minutes (its launch request lost, or its launch died): ask again",
            vec![claim("c", Phase::Pending, None, mins_ago(2))],
            vec![],
            vec![],
            vec!["relaunch c"],
        ),
        (
            "pending for two minutes with a tagged instance (crash after CreateFleet): ask again, launch adopts it",
            vec![claim("c", Phase::Pending, None, mins_ago(2))],
            vec![],
            vec![running("i-9", "c")],
            vec!["relaunch c"],
        ),
        (
            "pending past the launch timeout, nothing launched",
            vec![claim("c", Phase::Pending, None, mins_ago(6))],
            vec![],
            vec![],
            vec!["remove c launch-timeout instance=- node=-"],
        ),
        (
            "pending past the launch timeout with a tagged instance (crash after CreateFleet)",
            vec![claim("c", Phase::Pending, None, mins_ago(6))],
            vec![],
            vec![running("i-9", "c")],
            vec!["remove c launch-timeout instance=i-9 node=-"],
        ),
        (
            "launched, instance running, no node yet",
            vec![claim("c", Phase::Launched, Some("i-1"), mins_ago(5))],
            vec![],
            vec![running("i-1", "c")],
            vec![],
        ),
        (
            "launched, no node after the registration timeout",
            vec![claim("c", Phase::Launched, Some("i-1"), mins_ago(16))],
            vec![],
            vec![running("i-1", "c")],
            vec!["remove c registration-timeout instance=i-1 node=-"],
        ),
        (
            "launched, node appeared: register",
            vec![claim("c", Phase::Launched, Some("i-1"), mins_ago(2))],
            vec![node(
                "ip-1",
                "i-1",
                mins_ago(1),
                &[],
                &["karpenter.sh/unregistered"],
                false,
            )],
            vec![running("i-1", "c")],
            vec!["register c ip-1"],
        ),
        (
            "registered, node not ready: wait",
            vec![registered.clone()],
            vec![reg_node(&[], false)],
            vec![running("i-1", "c")],
            vec![],
        ),
        (
            "registered, node ready but still not-ready tainted: wait",
            vec![registered.clone()],
            vec![reg_node(&["node.kubernetes.io/not-ready"], true)],
            vec![running("i-1", "c")],
            vec![],
        ),
        (
            "registered, node ready and clean: initialize",
            vec![registered.clone()],
            vec![reg_node(&[], true)],
            vec![running("i-1", "c")],
            vec!["initialize c ip-1"],
        ),
        (
            "registered claim whose node lost a registration label: register again",
            vec![registered.clone()],
            vec![node("ip-1", "i-1", mins_ago(1), &[], &[], true)],
            vec![running("i-1", "c")],
            vec!["register c ip-1"],
        ),
        (
            "instance terminated behind our back (not listed any more)",
            vec![registered.clone()],
            vec![reg_node(&[], true)],
            vec![],
            vec!["remove c instance-gone instance=i-1 node=ip-1"],
        ),
        (
            "instance shutting down",
            vec![claim("c", Phase::Launched, Some("i-1"), mins_ago(2))],
            vec![],
            vec![instance("i-1", Some("c"), InstanceState::ShuttingDown, mins_ago(2))],
            vec!["remove c instance-gone instance=i-1 node=-"],
        ),
        (
            "just launched and not listed yet: EC2 is eventually consistent",
            vec![claim("c", Phase::Launched, Some("i-1"), secs_ago(10))],
            vec![],
            vec![],
            vec![],
        ),
        (
            "node deleted behind our back",
            vec![registered.clone()],
            vec![],
            vec![running("i-1", "c")],
            vec!["remove c node-gone instance=i-1 node=-"],
        ),
        (
            "draining claims with their node and instance belong to disruption",
            vec![claim("c", Phase::Draining, Some("i-1"), mins_ago(30))],
            vec![node("ip-1", "i-1", mins_ago(29), &[], &[], true)],
            vec![running("i-1", "c")],
            vec![],
        ),
        (
            "a drained claim whose instance the cloud took is removed",
            vec![claim("c", Phase::Draining, Some("i-1"), mins_ago(30))],
            vec![node("ip-1", "i-1", mins_ago(29), &[], &[], true)],
            vec![],
            vec!["remove c instance-gone instance=i-1 node=ip-1"],
        ),
        (
            "a claim left terminating is finished",
            vec![claim("c", Phase::Terminating, Some("i-1"), mins_ago(30))],
            vec![],
            vec![running("i-1", "c")],
            vec!["remove c terminating instance=i-1 node=-"],
        ),
    ];
    for (what, claims, nodes, instances, want) in cases {
        let got: Vec<String> = run(&claims, &nodes, &instances).iter().map(short).collect();
        assert_eq!(got, want, "{what}");
    }
}

#[test]
fn registered_node_carrying_every_registration_label_is_left_alone_once_initialized() {
    let c = claim("c", Phase::Initialized, Some("i-1"), mins_ago(5));
    let update = registration::registration_update(&c, None);
    let mut labels: Vec<(&str, &str)> = update.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    labels.push((crate::labels::INITIALIZED, "true"));
    let n = node("ip-1", "i-1", mins_ago(4), &labels, &[], true);
    let i = instance("i-1", Some("c"), InstanceState::Running, mins_ago(5));
    assert!(
        run(
            std::slice::from_ref(&c),
            std::slice::from_ref(&n),
            std::slice::from_ref(&i)
        )
        .is_empty()
    );
    // Its initialized label removed by someone: put back.
    let bare: Vec<(&str, &str)> = update.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let n2 = node("ip-1", "i-1", mins_ago(4), &bare, &[], true);
    let got: Vec<String> = run(std::slice::from_ref(&c), &[n2], std::slice::from_ref(&i))
        .iter()
        .map(short)
        .collect();
    assert_eq!(got, vec!["initialize c ip-1"]);
    // A Node registered without Karpenter's termination finalizer (adopted, or
    // registered by an older release) is registered again: the write adds it.
    let mut bare = n.clone();
    bare.metadata.finalizers = None;
    let got: Vec<String> = run(std::slice::from_ref(&c), &[bare], std::slice::from_ref(&i))
        .iter()
        .map(short)
        .collect();
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0].starts_with("register c"), "{got:?}");
}

#[test]
fn garbage_collection_spares_live_launches_adopts_registered_nodes_and_collects_leaks() {
    let claims = vec![
        claim("c", Phase::Launched, Some("i-1"), mins_ago(2)),
        // Its launch in flight (i-11 carries its tag), younger than the relaunch delay.
        claim("p", Phase::Pending, None, secs_ago(20)),
    ];
    let instances = vec![
        instance("i-1", Some("c"), InstanceState::Running, mins_ago(2)),
        // Tagged with a claim that recorded another instance: a double launch, collected.
        instance("i-2", Some("c"), InstanceState::Running, mins_ago(2)),
        // Its claim is gone (the table lost it), its Node is registered and
        // Ready: adopted, never collected.
        instance("i-3", Some("gone"), InstanceState::Running, mins_ago(2)),
        // Leaked but inside the leak window.
        instance("i-4", Some("gone"), InstanceState::Running, secs_ago(10)),
        // Tagged with a Pending claim: its launch is in flight, never collected.
        instance("i-11", Some("p"), InstanceState::Running, mins_ago(1)),
        // Not a NodePool's instance (no nodepool tag): never ours to collect.
        Instance {
            tags: BTreeMap::from([("kubernetes.io/cluster/demo".to_string(), "owned".to_string())]),
            ..instance("i-5", None, InstanceState::Running, mins_ago(10))
        },
        // Leaked and already shutting down.
        instance("i-6", Some("gone"), InstanceState::ShuttingDown, mins_ago(10)),
        // Leaked and stopped: terminate it.
        instance("i-7", None, InstanceState::Stopped, mins_ago(10)),
        // Karpenter's (tagged as nodesmith tags, but not launched by it), left
        // running by a migration: never ours to collect.
        Instance {
            tags: {
                let mut t = instance("i-12", Some("karpenter-made"), InstanceState::Running, mins_ago(10)).tags;
                t.remove(crate::ec2::instances::LAUNCHED_BY_TAG);
                t
            },
            ..instance("i-12", Some("karpenter-made"), InstanceState::Running, mins_ago(10))
        },
    ];
    let pool = [(labels::NODEPOOL, "default")];
    let nodes = vec![
        node("ip-1", "i-1", mins_ago(1), &[], &[], true),
        node("ip-3", "i-3", mins_ago(1), &pool, &[], true),
        // A pool's node whose instance is gone and which no claim names.
        node("ip-8", "i-8", mins_ago(5), &pool, &[], true),
        // Same, but just created.
        node("ip-9", "i-9", secs_ago(5), &pool, &[], true),
        // Not a pool's node: never deleted.
        node("ip-10", "i-10", mins_ago(5), &[], &[], true),
    ];
    // No cap here (adopt's tests hold it): what is collected at all.
    let config = LifecycleConfig {
        collect_max_percent: 100,
        ..LifecycleConfig::default()
    };
    let seen = Observed {
        now: at(NOW),
        claims: &claims,
        nodes: &nodes,
        instances: &instances,
        catalog: None,
    };
    let got: Vec<String> = plan(&seen, &config).iter().map(short).collect();
    assert_eq!(
        got,
        vec![
            "register c ip-1",
            "collect-instance i-2 node=-",
            "adopt gone i-3 ip-3",
            "collect-instance i-7 node=-",
            "collect-node ip-8",
        ]
    );
}

#[test]
fn initialization_waits_for_startup_taints_and_extended_resources() {
    let mut c = claim("c", Phase::Registered, Some("i-1"), mins_ago(2));
    c.startup_taints = vec![Taint::new("cni.example.com/not-ready", None, TaintEffect::NoSchedule)];
    c.resources = Resources::parse([("cpu", "1"), ("nvidia.com/gpu", "1")]).unwrap();
    let mut n = node("ip-1", "i-1", mins_ago(1), &[], &["cni.example.com/not-ready"], true);
    assert!(
        registration::not_initialized_because(&n, &c)
            .unwrap()
            .contains("cni.example.com/not-ready")
    );
    n.spec.as_mut().unwrap().taints = Some(vec![]);
    assert!(
        registration::not_initialized_because(&n, &c)
            .unwrap()
            .contains("nvidia.com/gpu")
    );
    n.status
        .as_mut()
        .unwrap()
        .allocatable
        .as_mut()
        .unwrap()
        .insert("nvidia.com/gpu".into(), Quantity("1".into()));
    assert_eq!(registration::not_initialized_because(&n, &c), None);
}

fn pending_pod(since: Timestamp) -> Pod {
    Pod {
        status: Some(PodStatus {
            phase: Some("Pending".into()),
            conditions: Some(vec![PodCondition {
                type_: "PodScheduled".into(),
                status: "False".into(),
                reason: Some("Unschedulable".into()),
                last_transition_time: Some(jiff_to_time(since)),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn pending_pods_are_solved_again_when_nobody_did() {
    let cfg = LifecycleConfig::default();
    let now = at(NOW);
    // (what, pods unschedulable since, last solve, due)
    let cases: Vec<(&str, Vec<Timestamp>, Option<Timestamp>, bool)> = vec![
        ("no pending pods", vec![], None, false),
        ("inside the batch window", vec![secs_ago(5)], None, false),
        ("waited, never solved", vec![secs_ago(30)], None, true),
        (
            "waited, solved before it waited",
            vec![secs_ago(30)],
            Some(secs_ago(40)),
            true,
        ),
        ("waited, solved since", vec![secs_ago(30)], Some(secs_ago(20)), false),
        (
            "still pending long after the last solve",
            vec![mins_ago(10)],
            Some(secs_ago(61)),
            true,
        ),
    ];
    for (what, since, last, want) in cases {
        let pods: Vec<Pod> = since.into_iter().map(pending_pod).collect();
        assert_eq!(solve_due(&pods, last, now, &cfg), want, "{what}");
    }
}
