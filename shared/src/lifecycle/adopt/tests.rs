use std::collections::{BTreeMap, BTreeSet};

use jiff::SignedDuration;
use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus, Taint as K8sTaint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::*;
use crate::ec2::instances::LAUNCHED_BY_TAG;

const NOW: &str = "2026-01-01T12:00:00Z";

fn now() -> Timestamp {
    NOW.parse().unwrap()
}

fn mins_ago(m: i64) -> Timestamp {
    now() - SignedDuration::from_secs(m * 60)
}

fn config() -> LifecycleConfig {
    LifecycleConfig {
        stack: Some("blue".into()),
        ..LifecycleConfig::default()
    }
}

/// An instance of pool `default`, class `default`, tagged with `claim` and launched by stack `stack`.
fn instance(id: &str, claim: &str, stack: Option<&str>, state: InstanceState, launched: Timestamp) -> Instance {
    let mut tags = BTreeMap::from([
        ("kubernetes.io/cluster/demo".to_string(), "owned".to_string()),
        (LAUNCHED_BY_TAG.to_string(), "demo".to_string()),
        (labels::NODEPOOL.to_string(), "default".to_string()),
        (labels::EC2NODECLASS.to_string(), "default".to_string()),
        (labels::NODECLAIM.to_string(), claim.to_string()),
    ]);
    if let Some(s) = stack {
        tags.insert(STACK_TAG.to_string(), s.to_string());
    }
    Instance {
        id: id.into(),
        instance_type: "m5.large".into(),
        zone: Some("us-east-1a".into()),
        subnet_id: None,
        image_id: None,
        security_group_ids: BTreeSet::new(),
        state,
        capacity_type: "spot".into(),
        capacity_reservation: None,
        launch_time: Some(launched),
        tags,
    }
}

fn ours(id: &str, claim: &str, state: InstanceState, launched: Timestamp) -> Instance {
    instance(id, claim, Some("blue"), state, launched)
}

#[derive(Clone, Copy)]
enum Joined {
    /// The kubelet registered it; nodesmith has not (`unregistered` taint on).
    Unregistered,
    /// Registered by nodesmith, not Ready.
    NotReady,
    /// Registered and Ready, not yet marked initialized.
    Ready,
    /// Registered, Ready and initialized.
    Initialized,
}

/// The Node of instance `id`, as registration leaves it.
fn node(id: &str, claim: &str, joined: Joined) -> Node {
    let mut labels = BTreeMap::from([
        (labels::NODEPOOL.to_string(), "default".to_string()),
        (labels::NODECLAIM.to_string(), claim.to_string()),
        (labels::INSTANCE_TYPE.to_string(), "m5.large".to_string()),
        (labels::CAPACITY_TYPE.to_string(), "spot".to_string()),
        (labels::ZONE.to_string(), "us-east-1a".to_string()),
        (labels::EC2NODECLASS.to_string(), "default".to_string()),
        (labels::REGISTERED.to_string(), "true".to_string()),
        ("team".to_string(), "web".to_string()),
    ]);
    if matches!(joined, Joined::Initialized) {
        labels.insert(labels::INITIALIZED.to_string(), "true".to_string());
    }
    let mut taints = vec![K8sTaint {
        key: "dedicated".into(),
        value: Some("web".into()),
        effect: "NoSchedule".into(),
        ..Default::default()
    }];
    if matches!(joined, Joined::Unregistered) {
        taints.push(K8sTaint {
            key: labels::UNREGISTERED_TAINT_KEY.into(),
            effect: "NoExecute".into(),
            ..Default::default()
        });
    }
    let ready = !matches!(joined, Joined::Unregistered | Joined::NotReady);
    Node {
        metadata: ObjectMeta {
            name: Some(format!("ip-{id}")),
            creation_timestamp: Some(Time(mins_ago(100))),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([
                (labels::NODEPOOL_HASH_ANNOTATION.to_string(), "pool-hash".to_string()),
                (
                    labels::EC2NODECLASS_HASH_ANNOTATION.to_string(),
                    "class-hash".to_string(),
                ),
            ])),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(format!("aws:///us-east-1a/{id}")),
            taints: Some(taints),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

fn judged(claims: &[NodeClaim], nodes: &[Node], instances: &[Instance], config: &LifecycleConfig) -> Vec<String> {
    let seen = Observed {
        now: now(),
        claims,
        nodes,
        instances,
        catalog: None,
    };
    judge(&seen, config)
        .into_iter()
        .map(|(id, fate)| match fate {
            Fate::Adopt(c) => format!("{id} adopt {} {:?}", c.name, c.phase),
            Fate::Collect { node, why } => format!("{id} collect {} node={}", why.as_str(), node.unwrap_or_default()),
            Fate::HeldBack { why, .. } => format!("{id} held {}", why.as_str()),
            Fate::Keep(w) => format!("{id} keep {w:?}"),
        })
        .collect()
}

#[test]
fn each_claimless_instance_is_adopted_collected_or_kept() {
    use InstanceState::{Pending, Running, ShuttingDown, Stopped};
    let launched = |name: &str, id: &str| NodeClaim {
        phase: Phase::Initialized,
        instance_id: Some(id.into()),
        ..NodeClaim::pending(name, "default", "default")
    };
    // (what, instance, its node, the fate wanted; none: not judged at all)
    let cases: Vec<(&str, Instance, Option<Joined>, Option<&str>)> = vec![
        (
            "registered, Ready and initialized: adopted as it was",
            ours("i-01", "default-a", Running, mins_ago(120)),
            Some(Joined::Initialized),
            Some("i-01 adopt default-a Initialized"),
        ),
        (
            "registered and Ready, initialization not recorded: adopted, initialized next run",
            ours("i-02", "default-b", Running, mins_ago(120)),
            Some(Joined::Ready),
            Some("i-02 adopt default-b Registered"),
        ),
        (
            "an older release's instance (no stack tag) is this stack's",
            instance("i-03", "default-c", None, Running, mins_ago(120)),
            Some(Joined::Initialized),
            Some("i-03 adopt default-c Initialized"),
        ),
        (
            "another stack's instance is never touched, Node or not",
            instance("i-04", "default-d", Some("green"), Running, mins_ago(120)),
            None,
            None,
        ),
        (
            "inside the leak window",
            ours("i-05", "default-e", Running, mins_ago(0)),
            None,
            Some("i-05 keep Young"),
        ),
        (
            "already shutting down",
            ours("i-06", "default-f", ShuttingDown, mins_ago(120)),
            None,
            Some("i-06 keep ShuttingDown"),
        ),
        (
            "stopped: serves nothing",
            ours("i-07", "default-g", Stopped, mins_ago(120)),
            Some(Joined::NotReady),
            Some("i-07 collect not-running node=ip-i-07"),
        ),
        (
            "registered but not Ready: it may come back",
            ours("i-08", "default-h", Running, mins_ago(120)),
            Some(Joined::NotReady),
            Some("i-08 keep NotReady"),
        ),
        (
            "Ready Node, instance still pending in EC2's eyes",
            ours("i-09", "default-i", Pending, mins_ago(120)),
            Some(Joined::Initialized),
            Some("i-09 keep NotReady"),
        ),
        (
            "joined, never registered, inside the registration timeout",
            ours("i-10", "default-j", Running, mins_ago(5)),
            Some(Joined::Unregistered),
            Some("i-10 keep Joining"),
        ),
        (
            "joined, never registered, past the registration timeout",
            ours("i-11", "default-k", Running, mins_ago(20)),
            Some(Joined::Unregistered),
            Some("i-11 collect never-joined node=ip-i-11"),
        ),
        (
            "no Node yet, inside the registration timeout",
            ours("i-12", "default-l", Running, mins_ago(5)),
            None,
            Some("i-12 keep Joining"),
        ),
        (
            "no Node past the registration timeout: never joined, or gone",
            ours("i-13", "default-m", Running, mins_ago(20)),
            None,
            Some("i-13 collect never-joined node="),
        ),
        (
            "a second instance of a claim that recorded another: a double launch",
            ours("i-14", "default-dup", Running, mins_ago(2)),
            Some(Joined::Unregistered),
            Some("i-14 collect duplicate node=ip-i-14"),
        ),
        (
            "a double launch whose Node is registered is never collected",
            ours("i-15", "default-dup", Running, mins_ago(120)),
            Some(Joined::Initialized),
            Some("i-15 keep NameTaken"),
        ),
        (
            "tagged with a Pending claim: its launch is in flight",
            ours("i-16", "default-pending", Running, mins_ago(120)),
            None,
            None,
        ),
        (
            "named by a claim",
            ours("i-17", "default-x", Running, mins_ago(120)),
            Some(Joined::Initialized),
            None,
        ),
        (
            "not launched by nodesmith (Karpenter's, left by a migration)",
            Instance {
                tags: BTreeMap::from([(labels::NODEPOOL.to_string(), "default".to_string())]),
                ..ours("i-18", "default-r", Running, mins_ago(120))
            },
            None,
            None,
        ),
    ];
    let claims = vec![
        launched("default-dup", "i-99"),
        NodeClaim::pending("default-pending", "default", "default"),
        launched("default-x", "i-17"),
    ];
    // Each case alone (the cap is no matter with one instance), then all at once.
    let mut wanted = Vec::new();
    let (mut instances, mut nodes) = (Vec::new(), Vec::new());
    for (what, i, joined, want) in cases {
        let claim = i.node_claim().unwrap_or_default().to_string();
        let n: Vec<Node> = joined.map(|j| node(&i.id, &claim, j)).into_iter().collect();
        let got = judged(&claims, &n, std::slice::from_ref(&i), &config());
        assert_eq!(got, want.map(String::from).into_iter().collect::<Vec<_>>(), "{what}");
        wanted.extend(want.map(String::from));
        instances.push(i);
        nodes.extend(n);
    }
    // 16 live instances of this stack: the cap (10%, rounded up) is two.
    let all = judged(&claims, &nodes, &instances, &config());
    let collected: Vec<&String> = all.iter().filter(|f| f.contains(" collect ")).collect();
    assert_eq!(collected.len(), 2, "{all:#?}");
    let held: Vec<&String> = all.iter().filter(|f| f.contains(" held ")).collect();
    assert_eq!(held.len(), 2, "{all:#?}");
    assert_eq!(all.len(), wanted.len());
}

#[test]
fn a_stack_without_identity_owns_only_untagged_instances() {
    let untagged = instance("i-1", "default-a", None, InstanceState::Running, mins_ago(60));
    let tagged = instance("i-2", "default-b", Some("blue"), InstanceState::Running, mins_ago(60));
    assert_eq!(owner(&untagged, None), Owner::ThisStack);
    assert_eq!(owner(&tagged, None), Owner::OtherStack);
    assert_eq!(owner(&tagged, Some("blue")), Owner::ThisStack);
    assert_eq!(owner(&tagged, Some("green")), Owner::OtherStack);
    let mut karpenter = untagged.clone();
    karpenter.tags.remove(LAUNCHED_BY_TAG);
    assert_eq!(owner(&karpenter, None), Owner::NotNodesmith);
}

#[test]
fn a_run_terminates_a_tenth_of_the_fleet_oldest_first() {
    for (fleet, percent, cap) in [
        (0, 10, 1),
        (1, 10, 1),
        (10, 10, 1),
        (11, 10, 2),
        (100, 10, 10),
        (5, 0, 1),
        (5, 100, 5),
        (5, 250, 5),
    ] {
        assert_eq!(termination_cap(fleet, percent), cap, "{fleet} at {percent}%");
    }
    // A wiped table with 30 nodes whose Nodes are gone: three a run, the oldest.
    let instances: Vec<Instance> = (0..30)
        .map(|k| {
            ours(
                &format!("i-{k:02}"),
                &format!("c-{k}"),
                InstanceState::Running,
                mins_ago(100 - k),
            )
        })
        .collect();
    let got = judged(&[], &[], &instances, &config());
    let collected: Vec<&String> = got.iter().filter(|f| f.contains(" collect ")).collect();
    assert_eq!(
        collected,
        [
            "i-00 collect never-joined node=",
            "i-01 collect never-joined node=",
            "i-02 collect never-joined node="
        ]
    );
    assert_eq!(got.iter().filter(|f| f.contains(" held never-joined")).count(), 27);
}

#[test]
fn an_adopted_claim_is_rebuilt_from_the_instance_and_its_node() {
    let i = ours("i-1", "default-a", InstanceState::Running, mins_ago(120));
    let n = node("i-1", "default-a", Joined::Initialized);
    let c = rebuilt_claim(&i, &n, now(), crate::catalog::builtin().ok()).unwrap();
    assert_eq!(
        (c.name.as_str(), c.node_pool.as_str(), c.node_class.as_str()),
        ("default-a", "default", "default")
    );
    assert_eq!(c.phase, Phase::Initialized);
    assert_eq!(c.instance_id.as_deref(), Some("i-1"));
    assert_eq!(c.provider_id.as_deref(), Some("aws:///us-east-1a/i-1"));
    assert_eq!(c.node_name.as_deref(), Some("ip-i-1"));
    assert_eq!(
        (
            c.instance_type.as_deref(),
            c.zone.as_deref(),
            c.capacity_type.as_deref()
        ),
        (Some("m5.large"), Some("us-east-1a"), Some("spot"))
    );
    assert!(c.price.is_some_and(|p| p > 0.0), "priced from the catalog: {c:?}");
    assert_eq!(c.nodepool_hash.as_deref(), Some("pool-hash"));
    assert_eq!(c.nodeclass_hash.as_deref(), Some("class-hash"));
    assert_eq!(c.timestamps.launched, Some(mins_ago(120)));
    // The pool's own label and taint; what the instance decides is left to registration.
    assert_eq!(c.labels, BTreeMap::from([("team".to_string(), "web".to_string())]));
    assert_eq!(
        c.taints.iter().map(|t| t.key.as_str()).collect::<Vec<_>>(),
        ["dedicated"]
    );
    // Registration's write is already on the Node: the lifecycle does not write it again.
    let update = crate::registration::registration_update(&c, None);
    let on_node = n.metadata.labels.as_ref().unwrap();
    assert!(
        update.labels.iter().all(|(k, v)| on_node.get(k) == Some(v)),
        "{update:?}"
    );
}
