//! Table tests per method and for budgets, and property tests over random
//! clusters: no decision exceeds a budget, removes a do-not-disrupt node for
//! a voluntary reason, or evicts more than a PDB allows.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::budgets::{Ledger, PoolBudgets};
use super::*;
use crate::apis::NodePool;
use crate::labels;
use crate::scheduling::ExistingNode;
use crate::scheduling::fixtures::{catalog, managed_node, merge, pod, pool};

const NOW: &str = "2026-03-01T12:00:00Z";

fn now() -> Timestamp {
    NOW.parse().unwrap()
}

fn ago(hours: f64) -> String {
    let secs = (hours * 3600.0) as i64;
    now()
        .checked_sub(jiff::SignedDuration::from_secs(secs))
        .unwrap()
        .to_string()
}

/// A pool `default` with extra spec YAML lines under `spec:` (indented two spaces).
fn pool_with(extra: &str) -> NodePool {
    pool(
        "default",
        &format!(
            "template:\n  spec:\n    nodeClassRef: {{group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}}\n    requirements:\n      - {{key: karpenter.sh/capacity-type, operator: In, values: [spot, on-demand]}}\n{extra}"
        ),
    )
}

/// A managed m.xlarge (0.20/h on-demand) of pool `default`, `age` hours old.
fn node(name: &str, age: f64, extra: Value) -> Node {
    let mut v = serde_json::to_value(managed_node(name)).unwrap();
    merge(&mut v, json!({"metadata": {"creationTimestamp": ago(age)}}));
    merge(&mut v, extra);
    serde_json::from_value(v).unwrap()
}

/// A ReplicaSet pod on `node`, created `age` hours ago.
fn web(name: &str, node: &str, app: &str, age: f64) -> Pod {
    pod(
        name,
        "500m",
        "1Gi",
        json!({"metadata": {"labels": {"app": app}, "creationTimestamp": ago(age), "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": app, "uid": "u", "controller": true}]},
            "spec": {"nodeName": node}}),
    )
}

fn daemon(node: &str) -> Pod {
    pod(
        &format!("agent-{node}"),
        "100m",
        "100Mi",
        json!({"metadata": {"ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "d", "controller": true}]},
            "spec": {"nodeName": node}}),
    )
}

fn snapshot(pool: NodePool, nodes: Vec<(Node, Vec<Pod>)>) -> Snapshot {
    let mut s = Snapshot::new(Arc::new(catalog()), now());
    s.node_pools = vec![pool];
    s.nodes = nodes
        .into_iter()
        .map(|(node, pods)| ExistingNode { node, pods })
        .collect();
    s
}

fn run(s: &Snapshot) -> Decisions {
    decide(s, &DecideOptions::default())
}

/// (reason, node) of every decided node.
fn decided(d: &Decisions) -> Vec<(Reason, String)> {
    d.decisions
        .iter()
        .flat_map(|x| x.nodes.iter().map(move |n| (x.reason, n.clone())))
        .collect()
}

fn held(d: &Decisions, node: &str) -> Option<Held> {
    d.blocked.iter().find(|b| b.node == node).map(|b| b.rule.clone())
}

fn pdb(name: &str, app: &str, max_unavailable: Value) -> PodDisruptionBudget {
    serde_json::from_value(json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"maxUnavailable": max_unavailable, "selector": {"matchLabels": {"app": app}}}}))
    .unwrap()
}

mod protections;
mod repair;
mod reserved;

#[test]
fn expiration_table() {
    // (expireAfter line, node age in hours, expired?)
    let cases: &[(&str, f64, bool)] = &[
        ("", 721.0, true),
        ("", 719.0, false),
        ("    expireAfter: Never\n", 10_000.0, false),
        ("    expireAfter: 1h\n", 1.0, true),
        ("    expireAfter: 1h\n", 0.99, false),
    ];
    for (extra, age, want) in cases {
        // Only expiry here: consolidation would merge the two half-empty nodes.
        let s = snapshot(
            pool_with(&format!("{extra}disruption:\n  consolidationPolicy: WhenEmpty\n")),
            vec![
                (node("old", *age, json!({})), vec![web("w-0", "old", "web", 1.0)]),
                (node("other", 0.0, json!({})), vec![web("w-9", "other", "web", 1.0)]),
            ],
        );
        let got = decided(&run(&s));
        let expect = if *want {
            vec![(Reason::Expired, "old".to_string())]
        } else {
            vec![]
        };
        assert_eq!(got, expect, "expireAfter {extra:?} age {age}");
    }
}

#[test]
fn expiry_is_forceful_and_moves_every_pod_once() {
    // Budget 0, node and pod do-not-disrupt, a pod without a controller: expiry goes anyway.
    let lonely = pod("lonely", "3", "1Gi", json!({"spec": {"nodeName": "old"}}));
    let mut guarded = web("w-0", "old", "web", 1.0);
    merge_meta(
        &mut guarded,
        json!({"annotations": {"karpenter.sh/do-not-disrupt": "true"}}),
    );
    let s = snapshot(
        pool_with("disruption:\n  budgets: [{nodes: '0'}]\n"),
        vec![
            (
                node(
                    "old",
                    800.0,
                    json!({"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "true"}}}),
                ),
                vec![guarded, lonely, daemon("old")],
            ),
            (node("young", 1.0, json!({})), vec![]),
        ],
    );
    let d = run(&s);
    assert_eq!(decided(&d), [(Reason::Expired, "old".to_string())]);
    let dec = &d.decisions[0];
    let moved: Vec<String> = dec.moves.iter().map(|m| m.pod.to_string()).collect();
    assert_eq!(moved, ["default/lonely", "default/w-0"], "the DaemonSet pod stays");
    // 3.5 cpu fits on `young` (4 cpu): no replacement needed.
    assert!(dec.moves.iter().all(|m| m.to == "young"), "{:?}", dec.moves);
    assert!(dec.replacements.is_empty());
    assert!((dec.savings_per_hour - 0.20).abs() < 1e-9);
    assert!((d.price_before - 0.40).abs() < 1e-9 && (d.price_after - 0.20).abs() < 1e-9);
}

fn merge_meta(p: &mut Pod, meta: Value) {
    let mut v = serde_json::to_value(&*p).unwrap();
    merge(&mut v, json!({"metadata": meta}));
    *p = serde_json::from_value(v).unwrap();
}

#[test]
fn expired_pods_without_room_get_a_replacement() {
    let s = snapshot(
        pool_with(""),
        vec![(
            node("old", 800.0, json!({})),
            vec![web("w-0", "old", "web", 1.0), web("w-1", "old", "web", 1.0)],
        )],
    );
    let d = run(&s);
    let dec = &d.decisions[0];
    assert_eq!(dec.replacements.len(), 1);
    let name = &dec.replacements[0].name;
    assert!(dec.moves.iter().all(|m| &m.to == name));
    assert_eq!(dec.moves.len(), 2);
    assert!(
        (dec.savings_per_hour - (0.20 - dec.replacements[0].price)).abs() < 1e-9,
        "savings net of the replacement"
    );
}

fn stamped(pool: &NodePool, hash: Option<&str>, version: &str) -> Value {
    let hash = hash.map(str::to_string).unwrap_or_else(|| pool.hash());
    json!({"metadata": {"annotations": {
        labels::NODEPOOL_HASH_ANNOTATION: hash, labels::NODEPOOL_HASH_VERSION_ANNOTATION: version}}})
}

#[test]
fn drift_table() {
    let p = pool_with("");
    let current = crate::apis::NODEPOOL_HASH_VERSION;
    // (node extra, pool, drifted?)
    let cases: Vec<(&str, Value, NodePool, bool)> = vec![
        ("same hash", stamped(&p, None, current), p.clone(), false),
        (
            "hash differs",
            stamped(&p, Some("0000000000000000"), current),
            p.clone(),
            true,
        ),
        (
            "hash differs, other version",
            stamped(&p, Some("0000000000000000"), "v0"),
            p.clone(),
            false,
        ),
        ("no annotations", json!({}), p.clone(), false),
        (
            "nodesmith rotate asked for it",
            json!({"metadata": {"annotations": {labels::ROTATE_ANNOTATION: "2026-11-28T12:00:00Z"}}}),
            p.clone(),
            true,
        ),
        (
            "on-demand node, pool now spot only",
            json!({}),
            pool(
                "default",
                "template:\n  spec:\n    nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}\n    requirements:\n      - {key: karpenter.sh/capacity-type, operator: In, values: [spot]}\n",
            ),
            true,
        ),
        (
            "template label added",
            json!({}),
            pool(
                "default",
                "template:\n  metadata: {labels: {team: a}}\n  spec:\n    nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}\n    requirements:\n      - {key: karpenter.sh/capacity-type, operator: In, values: [spot, on-demand]}\n",
            ),
            true,
        ),
    ];
    for (what, extra, pool, want) in cases {
        let s = snapshot(
            pool,
            vec![
                (node("n", 1.0, extra), vec![web("w-0", "n", "web", 1.0)]),
                (node("spare", 1.0, json!({})), vec![web("w-1", "spare", "web", 1.0)]),
            ],
        );
        let mut opts = DecideOptions::default();
        // The budget of 10% of 2 nodes is 1: only `n` is of interest.
        let d = decide(&s, &opts);
        let got = decided(&d).contains(&(Reason::Drifted, "n".to_string()));
        assert_eq!(got, want, "{what}: {d:#?}");
        // The shell's seam: live drift handed in.
        opts.resolved_drift.insert("n".into(), "AMI changed".into());
        if !want {
            assert!(
                decided(&decide(&s, &opts)).contains(&(Reason::Drifted, "n".to_string())),
                "{what}"
            );
        }
    }
}

#[test]
fn voluntary_protections_table() {
    let p = pool_with("disruption:\n  consolidationPolicy: WhenEmpty\n  budgets: [{nodes: '100%'}]\n");
    let drifted = stamped(&p, Some("0000000000000000"), crate::apis::NODEPOOL_HASH_VERSION);
    let mut dnd_pod = web("w-0", "n", "web", 1.0);
    merge_meta(
        &mut dnd_pod,
        json!({"annotations": {"karpenter.sh/do-not-disrupt": "true"}}),
    );
    let mut dnd_node = drifted.clone();
    merge(
        &mut dnd_node,
        json!({"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "true"}}}),
    );
    let bare = pod("bare", "500m", "1Gi", json!({"spec": {"nodeName": "n"}}));
    let cases: Vec<(&str, Value, Vec<Pod>, Held)> = vec![
        (
            "do-not-disrupt pod",
            drifted.clone(),
            vec![dnd_pod],
            Held::DoNotDisruptPod(PodRef::of(&web("w-0", "n", "web", 1.0))),
        ),
        (
            "do-not-disrupt node",
            dnd_node,
            vec![web("w-0", "n", "web", 1.0)],
            Held::DoNotDisruptNode,
        ),
        (
            "no controller",
            drifted,
            vec![bare.clone()],
            Held::NoController(PodRef::of(&bare)),
        ),
    ];
    for (what, extra, pods, want) in cases {
        let s = snapshot(
            p.clone(),
            vec![
                (node("n", 1.0, extra), pods),
                (node("spare", 1.0, json!({})), vec![web("w-9", "spare", "web", 1.0)]),
            ],
        );
        let d = run(&s);
        assert!(decided(&d).is_empty(), "{what}: {d:#?}");
        assert_eq!(held(&d, "n"), Some(want), "{what}");
    }
}

#[test]
fn emptiness_table() {
    // (pool extra, pods on the node (ages in hours), node age, want)
    enum Want {
        Empty,
        Nothing,
        Held(Held),
    }
    let cases: Vec<(&str, &str, Vec<Pod>, Want)> = vec![
        ("only a daemon", "", vec![daemon("n")], Want::Empty),
        (
            "a web pod",
            "disruption:\n  consolidationPolicy: WhenEmpty\n",
            vec![web("w", "n", "web", 5.0)],
            Want::Nothing,
        ),
        (
            "WhenEmpty policy",
            "disruption:\n  consolidationPolicy: WhenEmpty\n",
            vec![],
            Want::Empty,
        ),
        (
            "consolidateAfter not reached",
            "disruption:\n  consolidateAfter: 10h\n",
            vec![],
            Want::Held(Held::ConsolidateAfter {
                remaining_secs: 5 * 3600,
            }),
        ),
        (
            "consolidateAfter counts from the newest pod",
            "disruption:\n  consolidateAfter: 1h\n",
            vec![{
                let mut p = web("done", "n", "web", 0.5);
                let mut v = serde_json::to_value(&p).unwrap();
                merge(&mut v, json!({"status": {"phase": "Succeeded"}}));
                p = serde_json::from_value(v).unwrap();
                p
            }],
            Want::Held(Held::ConsolidateAfter { remaining_secs: 1800 }),
        ),
        (
            "consolidateAfter Never",
            "disruption:\n  consolidateAfter: Never\n",
            vec![],
            Want::Held(Held::ConsolidationDisabled),
        ),
        (
            "Balanced empties empty nodes",
            "disruption:\n  consolidationPolicy: Balanced\n",
            vec![daemon("n")],
            Want::Empty,
        ),
        (
            "a static pool (replicas) keeps its empty nodes",
            "replicas: 1\n",
            vec![daemon("n")],
            Want::Nothing,
        ),
    ];
    for (what, extra, pods, want) in cases {
        let s = snapshot(pool_with(extra), vec![(node("n", 5.0, json!({})), pods)]);
        let d = run(&s);
        match want {
            Want::Empty => {
                assert_eq!(decided(&d), [(Reason::Empty, "n".to_string())], "{what}");
                assert!((d.decisions[0].savings_per_hour - 0.20).abs() < 1e-9);
                assert!(d.decisions[0].moves.is_empty() && d.decisions[0].replacements.is_empty());
            }
            Want::Nothing => assert!(decided(&d).is_empty() && d.blocked.is_empty(), "{what}: {d:#?}"),
            Want::Held(h) => {
                assert!(decided(&d).is_empty(), "{what}");
                assert_eq!(held(&d, "n"), Some(h), "{what}");
            }
        }
    }
}

#[test]
fn a_replacement_waiting_for_its_pods_is_not_taken_for_empty() {
    // `r` replaces `old`, which is tainted and draining: `r` is empty only
    // because the drain has not evicted `old`'s pods yet.
    let s = snapshot(
        budget_pool("[{nodes: \"100%\"}]"),
        vec![
            (
                node(
                    "old",
                    5.0,
                    json!({"spec": {"taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]}}),
                ),
                vec![web("w", "old", "web", 5.0)],
            ),
            (node("r", 0.01, json!({})), vec![daemon("r")]),
            (node("idle", 5.0, json!({})), vec![]),
        ],
    );
    let options = DecideOptions {
        receiving: BTreeMap::from([("r".to_string(), "old".to_string())]),
        ..DecideOptions::default()
    };
    let d = decide(&s, &options);
    assert_eq!(decided(&d), [(Reason::Empty, "idle".to_string())], "{d:#?}");
    assert_eq!(held(&d, "r"), Some(Held::Receiving { from: "old".into() }));
    // Once the disruption is over, an empty replacement is empty like any node.
    assert_eq!(
        decided(&run(&s)),
        [(Reason::Empty, "idle".to_string()), (Reason::Empty, "r".to_string())]
    );
    // Expiry is forceful: it does not wait.
    let expiring = snapshot(
        pool_with("    expireAfter: 1h\n"),
        vec![(node("r", 2.0, json!({})), vec![])],
    );
    assert_eq!(
        decided(&decide(&expiring, &options)),
        [(Reason::Expired, "r".to_string())]
    );
}

#[test]
fn a_node_not_registered_yet_is_no_candidate() {
    // Its kubelet joined but the sweep has not registered it (the
    // `karpenter.sh/unregistered` taint is still on): no claim names it yet,
    // so no method may take it, nor spend a budget on it.
    let unregistered = || {
        node(
            "fresh",
            5.0,
            json!({"spec": {"taints": [{"key": "karpenter.sh/unregistered", "effect": "NoExecute"}]}}),
        )
    };
    let s = snapshot(
        budget_pool("[{nodes: \"1\"}]"),
        vec![(unregistered(), vec![]), (node("idle", 5.0, json!({})), vec![])],
    );
    let d = run(&s);
    assert_eq!(decided(&d), [(Reason::Empty, "idle".to_string())], "{d:#?}");
    assert!(held(&d, "fresh").is_none() && !d.nodes.contains_key("fresh"), "{d:#?}");
    let expiring = snapshot(pool_with("    expireAfter: 1h\n"), vec![(unregistered(), vec![])]);
    assert!(decided(&run(&expiring)).is_empty());
}

#[test]
fn empty_node_without_a_price_saves_nothing() {
    let s = snapshot(
        pool_with(""),
        vec![(
            node(
                "n",
                5.0,
                json!({"metadata": {"labels": {"node.kubernetes.io/instance-type": "unknown.large"}}}),
            ),
            vec![],
        )],
    );
    assert_eq!(held(&run(&s), "n"), Some(Held::NoSaving));
}

fn budget_pool(budgets: &str) -> NodePool {
    pool_with(&format!("disruption:\n  budgets: {budgets}\n"))
}

fn at(t: &str) -> Timestamp {
    t.parse().unwrap()
}

#[test]
fn budget_table() {
    // (budgets, total nodes, reason, moment, allowed)
    let cases: &[(&str, usize, Reason, &str, Option<usize>)] = &[
        ("[{nodes: '10%'}]", 10, Reason::Empty, NOW, Some(1)),
        ("[{nodes: '30%'}]", 10, Reason::Empty, NOW, Some(3)),
        ("[{nodes: '25%'}]", 10, Reason::Empty, NOW, Some(3)),
        ("[{nodes: '10%'}]", 1, Reason::Drifted, NOW, Some(1)),
        ("[{nodes: '0%'}]", 10, Reason::Drifted, NOW, Some(0)),
        ("[{nodes: '5'}]", 10, Reason::Empty, NOW, Some(5)),
        ("[{nodes: '5'}]", 10, Reason::Expired, NOW, None),
        ("[{nodes: '1', reasons: [Drifted]}]", 10, Reason::Empty, NOW, None),
        ("[{nodes: '1', reasons: [Drifted]}]", 10, Reason::Drifted, NOW, Some(1)),
        ("[{nodes: '5'}, {nodes: '2'}]", 10, Reason::Empty, NOW, Some(2)),
        (
            "[{nodes: '5'}, {nodes: '20%', reasons: [Empty]}]",
            10,
            Reason::Empty,
            NOW,
            Some(2),
        ),
        (
            "[{nodes: '5'}, {nodes: '20%', reasons: [Empty]}]",
            10,
            Reason::Drifted,
            NOW,
            Some(5),
        ),
        // A window 09:00-10:00 UTC, at its edges.
        (
            "[{nodes: '0', schedule: '0 9 * * *', duration: 1h}]",
            10,
            Reason::Empty,
            "2026-03-01T08:59:59Z",
            None,
        ),
        (
            "[{nodes: '0', schedule: '0 9 * * *', duration: 1h}]",
            10,
            Reason::Empty,
            "2026-03-01T09:00:00Z",
            Some(0),
        ),
        (
            "[{nodes: '0', schedule: '0 9 * * *', duration: 1h}]",
            10,
            Reason::Empty,
            "2026-03-01T09:59:59Z",
            Some(0),
        ),
        (
            "[{nodes: '0', schedule: '0 9 * * *', duration: 1h}]",
            10,
            Reason::Empty,
            "2026-03-01T10:00:00Z",
            None,
        ),
        // A window across midnight, and a macro.
        (
            "[{nodes: '1', schedule: '0 23 * * *', duration: 2h}]",
            10,
            Reason::Empty,
            "2026-03-02T00:30:00Z",
            Some(1),
        ),
        (
            "[{nodes: '0', schedule: '@daily', duration: 10m}]",
            10,
            Reason::Empty,
            "2026-03-01T00:09:59Z",
            Some(0),
        ),
        (
            "[{nodes: '0', schedule: '@daily', duration: 10m}]",
            10,
            Reason::Empty,
            "2026-03-01T00:10:00Z",
            None,
        ),
        // Weekdays only: 2026-03-01 is a Sunday.
        (
            "[{nodes: '0', schedule: '0 0 * * 1-5', duration: 24h}]",
            10,
            Reason::Empty,
            "2026-03-01T12:00:00Z",
            None,
        ),
        (
            "[{nodes: '0', schedule: '0 0 * * 1-5', duration: 24h}]",
            10,
            Reason::Empty,
            "2026-03-02T12:00:00Z",
            Some(0),
        ),
        // An active window overlapping an always-on budget: the tighter wins.
        (
            "[{nodes: '3'}, {nodes: '1', schedule: '0 9 * * *', duration: 8h}]",
            10,
            Reason::Empty,
            "2026-03-01T12:00:00Z",
            Some(1),
        ),
        (
            "[{nodes: '3'}, {nodes: '1', schedule: '0 9 * * *', duration: 8h}]",
            10,
            Reason::Empty,
            "2026-03-01T17:00:00Z",
            Some(3),
        ),
    ];
    for (budgets, total, reason, t, want) in cases {
        let b = PoolBudgets::new(&budget_pool(budgets));
        assert!(b.error().is_none(), "{budgets}: {:?}", b.error());
        assert_eq!(b.allowed(*reason, *total, at(t)), *want, "{budgets} {reason} at {t}");
    }
}

#[test]
fn bad_budgets_fail_closed_naming_the_field() {
    for (budgets, field) in [
        (
            "[{nodes: '1'}, {nodes: '1', schedule: '61 * * * *', duration: 1h}]",
            "budgets[1].schedule",
        ),
        (
            "[{nodes: '1', schedule: '* * * * * *', duration: 1h}]",
            "budgets[0].schedule",
        ),
        ("[{nodes: 'ten'}]", "budgets[0].nodes"),
        ("[{nodes: '1', schedule: '0 9 * * *'}]", "budgets[0].duration"),
    ] {
        let p = budget_pool(budgets);
        let b = PoolBudgets::new(&p);
        let e = b.error().unwrap_or_else(|| panic!("{budgets} parsed"));
        assert!(
            e.to_string()
                .starts_with(&format!("NodePool default: spec.disruption.{field}:")),
            "{e}"
        );
        assert_eq!(b.allowed(Reason::Empty, 10, now()), Some(0));
        assert_eq!(b.allowed(Reason::Expired, 10, now()), None, "expiry is not budgeted");
        // In a pass: nothing voluntary, the error reported, the node held by it.
        let s = snapshot(p, vec![(node("n", 5.0, json!({})), vec![])]);
        let d = run(&s);
        assert!(decided(&d).is_empty());
        assert_eq!(d.errors.len(), 1);
        assert!(matches!(held(&d, "n"), Some(Held::InvalidBudget(_))), "{d:#?}");
    }
}

#[test]
fn ten_empty_nodes_with_a_30_percent_budget_go_three_per_pass_counting_tainted_ones() {
    let nodes = |tainted: usize| {
        (0..10)
            .map(|i| {
                let name = format!("n{i}");
                let extra = if i < tainted {
                    json!({"spec": {"taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]}})
                } else {
                    json!({})
                };
                (node(&name, 5.0, extra), vec![daemon(&name)])
            })
            .collect::<Vec<_>>()
    };
    let d = run(&snapshot(budget_pool("[{nodes: '30%'}]"), nodes(0)));
    assert_eq!(decided(&d).len(), 3);
    let budget_held = d
        .blocked
        .iter()
        .filter(|b| matches!(b.rule, Held::Budget { .. }))
        .count();
    assert_eq!(budget_held, 7);
    let d = run(&snapshot(budget_pool("[{nodes: '30%'}]"), nodes(1)));
    assert_eq!(decided(&d).len(), 2, "one already disrupting counts");
    // Expired nodes count against the budgets of later reasons.
    let mut ns = nodes(0);
    ns[9].0 = node("n9", 800.0, json!({}));
    let d = run(&snapshot(budget_pool("[{nodes: '30%'}]"), ns));
    let reasons: Vec<Reason> = decided(&d).into_iter().map(|(r, _)| r).collect();
    assert_eq!(reasons, [Reason::Expired, Reason::Empty, Reason::Empty]);
}

#[test]
fn a_pdb_bounds_one_pass() {
    let p = budget_pool("[{nodes: '100%'}]");
    let drifted = stamped(&p, Some("0000000000000000"), crate::apis::NODEPOOL_HASH_VERSION);
    let mut nodes: Vec<(Node, Vec<Pod>)> = (0..3)
        .map(|i| {
            let name = format!("d{i}");
            (
                node(&name, 1.0, drifted.clone()),
                vec![web(&format!("db-{i}"), &name, "db", 1.0)],
            )
        })
        .collect();
    nodes.push((node("spare", 1.0, json!({})), vec![]));
    let mut s = snapshot(p, nodes);
    s.pod_disruption_budgets = vec![pdb("db", "db", json!(1))];
    let d = run(&s);
    let drifted: Vec<(Reason, String)> = decided(&d).into_iter().filter(|(r, _)| *r == Reason::Drifted).collect();
    assert_eq!(drifted, [(Reason::Drifted, "d0".to_string())]);
    for n in ["d1", "d2"] {
        assert!(matches!(held(&d, n), Some(Held::Pdb { .. })), "{n}: {d:#?}");
    }
}

#[test]
fn decisions_are_deterministic() {
    let s = snapshot(
        pool_with(""),
        vec![
            (node("a", 800.0, json!({})), vec![web("w-0", "a", "web", 1.0)]),
            (node("b", 800.0, json!({})), vec![web("w-1", "b", "web", 1.0)]),
            (node("c", 5.0, json!({})), vec![]),
        ],
    );
    assert_eq!(run(&s), run(&s));
}

#[test]
fn ledger_counts_every_reason_against_the_pool() {
    let p = budget_pool("[{nodes: '2'}]");
    let mut l = Ledger::new(now(), [(&p, 10, 0)]);
    assert!(l.take("default", Reason::Expired).is_ok());
    assert!(l.take("default", Reason::Drifted).is_ok());
    assert!(l.take("default", Reason::Empty).is_err());
    l.give_back("default");
    assert!(l.take("default", Reason::Empty).is_ok());
}

/// A random cluster: nodes with random ages, drift, emptiness, protections,
/// and pods of three apps under PDBs.
fn arb_cluster() -> impl Strategy<Value = (Snapshot, BTreeMap<String, usize>)> {
    let node_strategy = (
        0u8..4,                                                                   // 0 young, 1 expired, 2 drifted, 3 plain
        proptest::bool::weighted(0.2),                                            // node do-not-disrupt
        proptest::collection::vec((0u8..3, proptest::bool::weighted(0.1)), 0..4), // pods: app, do-not-disrupt
        proptest::bool::weighted(0.1),                                            // tainted
    );
    (
        proptest::collection::vec(node_strategy, 1..10),
        prop_oneof![Just("10%"), Just("30%"), Just("1"), Just("0"), Just("100%")],
        proptest::collection::vec(0i32..3, 3),
    )
        .prop_map(|(spec, budget, pdb_max)| {
            let p = budget_pool(&format!("[{{nodes: '{budget}'}}]"));
            let drift = stamped(&p, Some("0000000000000000"), crate::apis::NODEPOOL_HASH_VERSION);
            let mut nodes = Vec::new();
            for (i, (kind, dnd, pods, tainted)) in spec.into_iter().enumerate() {
                let name = format!("n{i}");
                let age = if kind == 1 { 800.0 } else { 2.0 };
                let mut extra = if kind == 2 { drift.clone() } else { json!({}) };
                if dnd {
                    merge(
                        &mut extra,
                        json!({"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "true"}}}),
                    );
                }
                if tainted {
                    merge(
                        &mut extra,
                        json!({"spec": {"taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]}}),
                    );
                }
                let pods: Vec<Pod> = pods
                    .into_iter()
                    .enumerate()
                    .map(|(j, (app, pdnd))| {
                        let mut w = web(&format!("p{i}-{j}"), &name, &format!("app{app}"), 1.0);
                        if pdnd {
                            merge_meta(&mut w, json!({"annotations": {"karpenter.sh/do-not-disrupt": "true"}}));
                        }
                        w
                    })
                    .chain(std::iter::once(daemon(&name)))
                    .collect();
                nodes.push((node(&name, age, extra), pods));
            }
            let mut s = snapshot(p, nodes);
            let mut allowed = BTreeMap::new();
            s.pod_disruption_budgets = pdb_max
                .iter()
                .enumerate()
                .map(|(a, m)| {
                    allowed.insert(format!("app{a}"), *m as usize);
                    pdb(&format!("pdb{a}"), &format!("app{a}"), json!(m))
                })
                .collect();
            (s, allowed)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn no_decision_breaks_a_budget_a_protection_or_a_pdb((s, pdb_allowed) in arb_cluster()) {
        let d = run(&s);
        let by_name: BTreeMap<String, &ExistingNode> =
            s.nodes.iter().map(|n| (n.node.metadata.name.clone().unwrap(), n)).collect();
        let total = s.nodes.len();
        let tainted = s.nodes.iter().filter(|n| {
            n.node.spec.as_ref().and_then(|sp| sp.taints.as_ref()).is_some_and(|t| !t.is_empty())
        }).count();
        let budgets = PoolBudgets::new(&s.node_pools[0]);
        let mut disrupting = tainted;
        let mut evicted: BTreeMap<String, usize> = BTreeMap::new();
        let mut seen = BTreeSet::new();
        for dec in &d.decisions {
            disrupting += dec.nodes.len();
            if dec.reason != Reason::Expired {
                // Budget: everything disrupting up to this reason fits its budget.
                let allowed = budgets.allowed(dec.reason, total, s.now).unwrap_or(usize::MAX);
                prop_assert!(disrupting <= allowed, "{} disrupting, {} allowed", disrupting, allowed);
            }
            for n in &dec.nodes {
                let en = by_name[n];
                let ann = en.node.metadata.annotations.clone().unwrap_or_default();
                if dec.reason != Reason::Expired {
                    prop_assert!(!ann.contains_key("karpenter.sh/do-not-disrupt"), "{} is protected", n);
                    prop_assert!(!en.pods.iter().any(|p| crate::kubernetes::pods::has_do_not_disrupt(p, s.now)));
                }
                for p in en.pods.iter().filter(|p| crate::kubernetes::drain::moves_with_node(p)) {
                    let app = p.metadata.labels.as_ref().unwrap()["app"].clone();
                    *evicted.entry(app).or_default() += 1;
                    prop_assert!(seen.insert(PodRef::of(p)));
                    let moves: Vec<&Move> = dec.moves.iter().filter(|m| m.pod == PodRef::of(p)).collect();
                    prop_assert_eq!(moves.len(), 1, "{} moves once", PodRef::of(p));
                    prop_assert!(!d.decisions.iter().any(|x| x.nodes.contains(&moves[0].to)), "onto a removed node");
                }
            }
        }
        for (app, n) in &evicted {
            prop_assert!(*n <= pdb_allowed[app], "{} evicts {} > {}", app, n, pdb_allowed[app]);
        }
    }
}

// ---- Underutilized consolidation ----

use crate::labels::REPLACEMENT_ANNOTATION;
use consolidation::ConsolidationOptions;

/// A ReplicaSet pod of app `web` on `node`, asking `cpu`, created an hour ago.
fn sized(name: &str, node: &str, cpu: &str) -> Pod {
    pod(
        name,
        cpu,
        "1Gi",
        json!({"metadata": {"labels": {"app": "web"}, "creationTimestamp": ago(1.0), "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "u", "controller": true}]},
            "spec": {"nodeName": node}}),
    )
}

/// Node labels overriding the instance type and capacity type.
fn offering(instance_type: &str, capacity_type: &str) -> Value {
    json!({"metadata": {"labels": {"node.kubernetes.io/instance-type": instance_type,
        "karpenter.sh/capacity-type": capacity_type}}})
}

fn underutilized(d: &Decisions) -> Option<&Command> {
    d.decisions.iter().find(|x| x.reason == Reason::Underutilized)
}

const ON_DEMAND_ONLY: &str = "      - {key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}\n";

/// A pool whose requirements are replaced by `reqs` (lines under `requirements:`).
fn pool_requiring(reqs: &str, extra: &str) -> NodePool {
    pool(
        "default",
        &format!(
            "template:\n  spec:\n    nodeClassRef: {{group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}}\n    requirements:\n{reqs}{extra}"
        ),
    )
}

#[test]
fn consolidation_table() {
    enum Want {
        /// Exactly these nodes go, with no new node.
        Delete(&'static [&'static str]),
        /// Exactly these nodes go for one new node of this capacity type.
        Replace(&'static [&'static str], &'static str),
        /// Nothing happens and the node is not reported.
        Nothing,
        /// The node is held by a rule like this one.
        Held(&'static str, fn(&Held) -> bool),
    }
    let one = |n: &str, extra: Value| (node(n, 2.0, extra), vec![sized(&format!("{n}-0"), n, "500m")]);
    let two = |n: &str| {
        (
            node(n, 2.0, json!({})),
            vec![sized(&format!("{n}-0"), n, "500m"), sized(&format!("{n}-1"), n, "500m")],
        )
    };
    let mut dnd_pod = sized("a-0", "a", "500m");
    merge_meta(
        &mut dnd_pod,
        json!({"annotations": {"karpenter.sh/do-not-disrupt": "true"}}),
    );
    let bare = pod("bare", "500m", "1Gi", json!({"spec": {"nodeName": "a"}}));
    let m_only = format!(
        "{ON_DEMAND_ONLY}      - {{key: node.kubernetes.io/instance-type, operator: In, values: [m.xlarge]}}\n"
    );
    let m_and_big = format!(
        "{ON_DEMAND_ONLY}      - {{key: node.kubernetes.io/instance-type, operator: In, values: [m.xlarge, m.4xlarge]}}\n"
    );
    let replacement = |age: f64| {
        (
            node(
                "a",
                age,
                json!({"metadata": {"annotations": {REPLACEMENT_ANNOTATION: "Drifted"}}}),
            ),
            vec![sized("a-0", "a", "500m")],
        )
    };
    let spot_to_spot_3 = ConsolidationOptions {
        spot_to_spot_min_types: 3,
        spot_to_spot: true,
        ..ConsolidationOptions::default()
    };
    let spot_to_spot_on = ConsolidationOptions {
        spot_to_spot: true,
        ..ConsolidationOptions::default()
    };
    let picky = ConsolidationOptions {
        min_saving_per_hour: 0.05,
        ..ConsolidationOptions::default()
    };
    #[allow(clippy::type_complexity)]
    let cases: Vec<(
        &str,
        NodePool,
        Vec<(Node, Vec<Pod>)>,
        Vec<PodDisruptionBudget>,
        ConsolidationOptions,
        Want,
    )> = vec![
        (
            "delete: the pods fit on the other node",
            pool_requiring(&m_only, ""),
            vec![two("a"), two("b")],
            vec![],
            ConsolidationOptions::default(),
            Want::Delete(&["a"]),
        ),
        (
            "replace: one small pod on a big on-demand node",
            pool_with(""),
            vec![one("a", json!({}))],
            vec![],
            ConsolidationOptions::default(),
            Want::Replace(&["a"], "spot"),
        ),
        (
            "multi-node: three underused nodes become one",
            pool_with("disruption:\n  budgets: [{nodes: '100%'}]\n"),
            vec![one("a", json!({})), one("b", json!({})), one("c", json!({}))],
            vec![],
            ConsolidationOptions::default(),
            Want::Replace(&["a", "b", "c"], "spot"),
        ),
        (
            "on-demand stays on-demand when the pool has no spot",
            pool_requiring(ON_DEMAND_ONLY, ""),
            vec![one("a", json!({}))],
            vec![],
            ConsolidationOptions::default(),
            Want::Replace(&["a"], "on-demand"),
        ),
        (
            "WhenEmpty leaves underused nodes alone",
            pool_with("disruption:\n  consolidationPolicy: WhenEmpty\n"),
            vec![one("a", json!({}))],
            vec![],
            ConsolidationOptions::default(),
            Want::Nothing,
        ),
        (
            "consolidateAfter not reached",
            pool_with("disruption:\n  consolidateAfter: 2h\n"),
            vec![one("a", json!({}))],
            vec![],
            ConsolidationOptions::default(),
            Want::Held("a", |h| *h == Held::ConsolidateAfter { remaining_secs: 3600 }),
        ),
        (
            "consolidateAfter Never",
            pool_with("disruption:\n  consolidateAfter: Never\n"),
            vec![one("a", json!({}))],
            vec![],
            ConsolidationOptions::default(),
            Want::Held("a", |h| *h == Held::ConsolidationDisabled),
        ),
        (
            "do-not-disrupt pod",
            pool_with(""),
            vec![(node("a", 2.0, json!({})), vec![dnd_pod])],
            vec![],
            ConsolidationOptions::default(),
            Want::Held("a", |h| matches!(h, Held::DoNotDisruptPod(_))),
        ),
        (
            "do-not-disrupt node",
            pool_with(""),
            vec![one(
                "a",
                json!({"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "true"}}}),
            )],
            vec![],
            ConsolidationOptions::default(),
            Want::Held("a", |h| *h == Held::DoNotDisruptNode),
        ),
        (
            "a pod without a controller",
            pool_with(""),
            vec![(node("a", 2.0, json!({})), vec![bare])],
            vec![],
            ConsolidationOptions::default(),
            Want::Held("a", |h| matches!(h, Held::NoController(_))),
        ),
        (
            "a PDB that allows no eviction",
            pool_with(""),
            vec![one("a", json!({}))],
            vec![pdb("web", "web", json!(0))],
            ConsolidationOptions::default(),
            Want::Held("a", |h| matches!(h, Held::Pdb { .. })),
        ),
        (
            "never the same instance type, never dearer",
            pool_requiring(&m_and_big, ""),
            vec![one("a", json!({}))],
            vec![],
            ConsolidationOptions::default(),
            Want::Held(
                "a",
                |h| matches!(h, Held::Unconsolidatable(w) if w.contains("has no cheaper place")),
            ),
        ),
        (
            "spot-to-spot is off by default (Karpenter's feature gate)",
            pool_with(""),
            vec![one("a", offering("m.xlarge", "spot"))],
            vec![],
            ConsolidationOptions::default(),
            Want::Held(
                "a",
                |h| matches!(h, Held::Unconsolidatable(w) if w.contains("SpotToSpotConsolidation")),
            ),
        ),
        (
            "spot-to-spot needs 15 cheaper types",
            pool_with(""),
            vec![one("a", offering("m.xlarge", "spot"))],
            vec![],
            spot_to_spot_on,
            Want::Held(
                "a",
                |h| matches!(h, Held::Unconsolidatable(w) if w.contains("needs 15 cheaper instance types")),
            ),
        ),
        (
            "spot-to-spot with enough cheaper types",
            pool_with(""),
            vec![one("a", offering("m.xlarge", "spot"))],
            vec![],
            spot_to_spot_3.clone(),
            Want::Replace(&["a"], "spot"),
        ),
        (
            "two spot nodes: one deleted, the other replaced on its own",
            pool_requiring(
                "      - {key: karpenter.sh/capacity-type, operator: In, values: [spot]}\n      - {key: node.kubernetes.io/instance-type, operator: In, values: [c.large, c.xlarge, m.large, m.xlarge, a.large]}\n",
                "disruption:\n  budgets: [{nodes: '100%'}]\n",
            ),
            vec![
                one("a", offering("c.xlarge", "spot")),
                one("b", offering("c.xlarge", "spot")),
            ],
            vec![],
            spot_to_spot_3,
            Want::Replace(&["a", "b"], "spot"),
        ),
        (
            "the saving is under the minimum",
            pool_requiring(ON_DEMAND_ONLY, ""),
            vec![one("a", offering("m.large", "on-demand"))],
            vec![],
            picky,
            Want::Held(
                "a",
                |h| matches!(h, Held::Unconsolidatable(w) if w.contains("less than the minimum")),
            ),
        ),
        (
            "the saving is over the default minimum",
            pool_requiring(ON_DEMAND_ONLY, ""),
            vec![one("a", offering("m.large", "on-demand"))],
            vec![],
            ConsolidationOptions::default(),
            Want::Replace(&["a"], "on-demand"),
        ),
        (
            "a fresh replacement cools down",
            pool_with(""),
            vec![replacement(0.1)],
            vec![],
            ConsolidationOptions::default(),
            Want::Held(
                "a",
                |h| matches!(h, Held::RecentReplacement { remaining_secs } if (500..=540).contains(remaining_secs)),
            ),
        ),
        (
            "an old replacement is a candidate",
            pool_with(""),
            vec![replacement(0.5)],
            vec![],
            ConsolidationOptions::default(),
            Want::Replace(&["a"], "spot"),
        ),
    ];
    for (what, p, nodes, pdbs, opts, want) in cases {
        let mut s = snapshot(p, nodes);
        s.pod_disruption_budgets = pdbs;
        let d = decide(
            &s,
            &DecideOptions {
                consolidation: opts,
                ..DecideOptions::default()
            },
        );
        let u = underutilized(&d);
        assert!(d.price_after <= d.price_before + 1e-9, "{what}: cost rose");
        match want {
            Want::Delete(nodes) => {
                let u = u.unwrap_or_else(|| panic!("{what}: no decision: {d:#?}"));
                assert_eq!(u.nodes, nodes, "{what}: {u:#?}");
                assert!(u.replacements.is_empty(), "{what}: {u:#?}");
                assert!(u.savings_per_hour > 0.0, "{what}");
            }
            Want::Replace(nodes, capacity_type) => {
                let u = u.unwrap_or_else(|| panic!("{what}: no decision: {d:#?}"));
                assert_eq!(u.nodes, nodes, "{what}");
                assert_eq!(u.replacements.len(), 1, "{what}: {u:#?}");
                let r = &u.replacements[0];
                let replaced: BTreeSet<String> = s
                    .nodes
                    .iter()
                    .filter(|n| nodes.contains(&n.node.metadata.name.as_deref().unwrap()))
                    .map(|n| n.node.metadata.labels.as_ref().unwrap()[labels::INSTANCE_TYPE].clone())
                    .collect();
                let price: f64 = s
                    .nodes
                    .iter()
                    .filter(|n| nodes.contains(&n.node.metadata.name.as_deref().unwrap()))
                    .map(|n| candidate::price(&s.catalog, n.node.metadata.labels.as_ref().unwrap()).unwrap())
                    .sum();
                assert_eq!(r.capacity_type, capacity_type, "{what}");
                for t in &r.instance_type_options {
                    assert!(!replaced.contains(t), "{what}: {t} is a replaced node's type");
                    let cheapest = s
                        .catalog
                        .instance_types
                        .iter()
                        .find(|i| &i.name == t)
                        .unwrap()
                        .offerings
                        .iter()
                        .filter(|o| o.capacity_type == capacity_type)
                        .map(|o| o.price)
                        .fold(f64::MAX, f64::min);
                    assert!(
                        cheapest < price,
                        "{what}: option {t} at {cheapest} is not cheaper than {price}"
                    );
                }
                if capacity_type == "spot" {
                    assert!(
                        !r.requirements.get(labels::CAPACITY_TYPE).unwrap().has("on-demand"),
                        "{what}: a spot replacement may fall back to on-demand"
                    );
                }
                assert!(
                    u.savings_per_hour > 0.0 && (u.savings_per_hour - (price - r.price)).abs() < 1e-9,
                    "{what}"
                );
                let evicted: usize = s
                    .nodes
                    .iter()
                    .filter(|n| nodes.contains(&n.node.metadata.name.as_deref().unwrap()))
                    .map(|n| n.pods.len())
                    .sum();
                assert_eq!(u.moves.len(), evicted, "{what}: every pod moves once");
            }
            Want::Nothing => {
                assert!(u.is_none(), "{what}: {d:#?}");
                assert!(d.blocked.is_empty(), "{what}: {d:#?}");
            }
            Want::Held(n, rule) => {
                assert!(u.is_none(), "{what}: {d:#?}");
                let h = held(&d, n).unwrap_or_else(|| panic!("{what}: {n} not held: {d:#?}"));
                assert!(rule(&h), "{what}: held by {h:?}");
            }
        }
    }
}

/// A pod of `node` that is costly to disrupt (Karpenter's eviction cost 10,
/// the most: `pod-deletion-cost` at its maximum).
fn precious(name: &str, node: &str) -> Pod {
    let mut p = sized(name, node, "500m");
    merge_meta(
        &mut p,
        json!({"annotations": {"controller.kubernetes.io/pod-deletion-cost": "2147483647"}}),
    );
    p
}

/// Karpenter's Balanced policy (designs/balanced-consolidation.md): a move
/// goes only when the share of the pool's cost it saves is at least half
/// the share of the pool's disruption cost it causes (k = 2).
#[test]
fn balanced_consolidation_table() {
    let types = |t: &str| {
        format!("{ON_DEMAND_ONLY}      - {{key: node.kubernetes.io/instance-type, operator: In, values: [{t}]}}\n")
    };
    let recent = |name: &str| {
        let mut p = sized(&format!("{name}-0"), name, "500m");
        merge_meta(&mut p, json!({"creationTimestamp": ago(0.1)}));
        (node(name, 2.0, json!({})), vec![p])
    };
    let lone = || vec![(node("a", 2.0, json!({})), vec![sized("a-0", "a", "500m")])];
    let costly_a = || {
        vec![
            (
                node("a", 2.0, json!({})),
                vec![precious("a-0", "a"), precious("a-1", "a")],
            ),
            recent("b"),
            recent("c"),
        ]
    };
    // (what, policy, allowed types, nodes, want: Some(new node's type) to replace,
    //  Some("") to delete, None to keep "a")
    #[allow(clippy::type_complexity)]
    let cases: Vec<(&str, &str, String, Vec<(Node, Vec<Pod>)>, Option<&str>)> = vec![
        (
            // saves 0.12 of 0.20 (60%) for all of the pool's disruption: 0.6 >= 0.5
            "a replacement under half the price goes",
            "Balanced",
            types("m.xlarge, c.large"),
            lone(),
            Some("c.large"),
        ),
        (
            // saves 0.07 of 0.20 (35%) for all of the pool's disruption: 0.35 < 0.5
            "a replacement saving too little stays",
            "Balanced",
            types("m.xlarge, r.large"),
            lone(),
            None,
        ),
        (
            "WhenEmptyOrUnderutilized takes any saving",
            "WhenEmptyOrUnderutilized",
            types("m.xlarge, r.large"),
            lone(),
            Some("r.large"),
        ),
        (
            // a: 1 + 10 + 10 = 21 of 25 (84%) for a third of the cost: 0.40 < 0.5
            "a delete of costly pods stays",
            "Balanced",
            types("m.xlarge"),
            costly_a(),
            None,
        ),
        (
            "WhenEmptyOrUnderutilized deletes costly pods' node",
            "WhenEmptyOrUnderutilized",
            types("m.xlarge"),
            costly_a(),
            Some(""),
        ),
    ];
    for (what, policy, reqs, nodes, want) in cases {
        let s = snapshot(
            pool_requiring(
                &reqs,
                &format!("disruption:\n  consolidationPolicy: {policy}\n  consolidateAfter: 1h\n"),
            ),
            nodes,
        );
        let d = run(&s);
        let u = underutilized(&d);
        match want {
            Some(t) => {
                let u = u.unwrap_or_else(|| panic!("{what}: no decision: {d:#?}"));
                assert_eq!(u.nodes, ["a"], "{what}");
                let got: Vec<&str> = u.replacements.iter().map(|r| r.instance_type.as_str()).collect();
                let want: Vec<&str> = if t.is_empty() { vec![] } else { vec![t] };
                assert_eq!(got, want, "{what}");
            }
            None => {
                assert!(u.is_none(), "{what}: {d:#?}");
                let h = held(&d, "a").unwrap_or_else(|| panic!("{what}: not held: {d:#?}"));
                assert!(
                    matches!(&h, Held::Unconsolidatable(why) if why.contains("score")),
                    "{what}: {h:?}"
                );
            }
        }
    }
}

#[test]
fn a_static_pool_is_never_consolidated() {
    let s = snapshot(
        pool_with("replicas: 3\n"),
        vec![
            (node("a", 2.0, json!({})), vec![sized("a-0", "a", "500m")]),
            (node("b", 2.0, json!({})), vec![sized("b-0", "b", "500m")]),
            (node("c", 2.0, json!({})), vec![]),
        ],
    );
    let d = run(&s);
    assert!(d.decisions.is_empty(), "{d:#?}");
    assert!(d.blocked.is_empty(), "not candidates at all: {d:#?}");
}

#[test]
fn spot_to_spot_launches_from_the_cheapest_allowed_options() {
    let s = snapshot(
        pool_with(""),
        vec![(
            node("a", 2.0, offering("m.xlarge", "spot")),
            vec![sized("a-0", "a", "500m")],
        )],
    );
    let opts = ConsolidationOptions {
        spot_to_spot_min_types: 3,
        spot_to_spot: true,
        ..ConsolidationOptions::default()
    };
    let d = decide(
        &s,
        &DecideOptions {
            consolidation: opts,
            ..DecideOptions::default()
        },
    );
    let r = &underutilized(&d).expect("replaced").replacements[0];
    assert_eq!(r.instance_type_options.len(), 3, "{r:#?}");
}

#[test]
fn consolidation_waits_while_expiry_or_drift_decides() {
    let s = snapshot(
        pool_with(""),
        vec![
            (node("old", 800.0, json!({})), vec![sized("old-0", "old", "500m")]),
            (node("a", 2.0, json!({})), vec![sized("a-0", "a", "500m")]),
        ],
    );
    let d = run(&s);
    assert_eq!(decided(&d), [(Reason::Expired, "old".to_string())]);
}

#[test]
fn consolidation_takes_cheap_to_disrupt_nodes_first() {
    // Both nodes are alike but b's pod has a high priority: a goes.
    let mut vip = sized("b-0", "b", "500m");
    let mut v = serde_json::to_value(&vip).unwrap();
    merge(&mut v, json!({"spec": {"priority": 1_000_000_000}}));
    vip = serde_json::from_value(v).unwrap();
    let m_only = format!(
        "{ON_DEMAND_ONLY}      - {{key: node.kubernetes.io/instance-type, operator: In, values: [m.xlarge]}}\n"
    );
    let s = snapshot(
        pool_requiring(&m_only, ""),
        vec![
            (node("a", 2.0, json!({})), vec![sized("a-0", "a", "500m")]),
            (node("b", 2.0, json!({})), vec![vip]),
        ],
    );
    let d = run(&s);
    assert_eq!(underutilized(&d).expect("a decision").nodes, ["a"]);
}

#[test]
fn a_pass_says_how_many_nodes_consolidation_left_unexamined() {
    let underused = |n: usize| {
        (0..n)
            .map(|i| {
                let name = format!("n{i}");
                (
                    node(&name, 2.0, json!({})),
                    vec![sized(&format!("{name}-0"), &name, "500m")],
                )
            })
            .collect::<Vec<_>>()
    };
    // Without a deadline every node it could take is considered.
    let d = run(&snapshot(pool_with(""), underused(4)));
    assert!(underutilized(&d).is_some(), "{d:#?}");
    assert_eq!(
        d.consolidation,
        Some(Coverage {
            candidates: 4,
            unexamined: 0
        })
    );
    // A deadline already past leaves every one of them untried, and says so.
    let late = DecideOptions {
        deadline: Some(std::time::Instant::now()),
        ..DecideOptions::default()
    };
    let d = decide(&snapshot(pool_with(""), underused(4)), &late);
    assert!(underutilized(&d).is_none(), "{d:#?}");
    assert_eq!(
        d.consolidation,
        Some(Coverage {
            candidates: 4,
            unexamined: 4
        })
    );
    // A pass that expiry decided does not consolidate at all.
    let s = snapshot(
        pool_with(""),
        vec![(node("old", 800.0, json!({})), vec![sized("old-0", "old", "500m")])],
    );
    assert_eq!(run(&s).consolidation, None);
}

#[test]
fn a_budget_bounds_consolidation_and_names_the_reason() {
    let p = pool_with("disruption:\n  budgets: [{nodes: '1', reasons: [Underutilized]}]\n");
    let s = snapshot(
        p,
        (0..4)
            .map(|i| {
                let n = format!("n{i}");
                (node(&n, 2.0, json!({})), vec![sized(&format!("{n}-0"), &n, "500m")])
            })
            .collect(),
    );
    let d = run(&s);
    assert_eq!(underutilized(&d).expect("one").nodes.len(), 1);
    assert!(
        d.blocked.iter().any(|b| matches!(
            &b.rule,
            Held::Budget {
                reason: Reason::Underutilized,
                allowed: 1,
                ..
            }
        )),
        "{d:#?}"
    );
}

#[test]
fn spot_to_spot_replaces_single_nodes_only() {
    use consolidation::ReplacementLimits;
    let s = snapshot(
        pool_with(""),
        vec![
            (node("a", 2.0, offering("c.xlarge", "spot")), vec![]),
            (node("b", 2.0, offering("c.xlarge", "spot")), vec![]),
            (node("c", 2.0, json!({})), vec![]),
        ],
    );
    let names = |ns: &[&str]| ns.iter().map(|n| n.to_string()).collect::<BTreeSet<String>>();
    let claim = |capacity_type: &str, options: usize| crate::scheduling::NewNodeClaim {
        capacity_type: capacity_type.into(),
        instance_type_options: (0..options).map(|i| format!("t{i}")).collect(),
        ..crate::scheduling::fixtures::new_claim()
    };
    let on = |min_types: usize| ConsolidationOptions {
        spot_to_spot_min_types: min_types,
        spot_to_spot: true,
        ..ConsolidationOptions::default()
    };
    let both = ReplacementLimits::of(&s, &names(&["a", "b"]));
    assert!((both.price_below - 0.12).abs() < 1e-9 && both.all_spot && both.nodes == 2);
    assert_eq!(both.exclude_types, names(&["c.xlarge"]));
    assert!(
        both.refuse(&claim("spot", 20), &on(15))
            .unwrap()
            .contains("single nodes only")
    );
    assert_eq!(both.refuse(&claim("on-demand", 1), &on(15)), None);
    let one = ReplacementLimits::of(&s, &names(&["a"]));
    assert!(
        one.refuse(&claim("spot", 20), &ConsolidationOptions::default())
            .unwrap()
            .contains("is off")
    );
    assert_eq!(one.refuse(&claim("spot", 15), &on(15)), None);
    assert!(one.refuse(&claim("spot", 14), &on(15)).unwrap().contains("found 14"));
    let mixed = ReplacementLimits::of(&s, &names(&["a", "c"]));
    assert!(!mixed.all_spot);
    assert_eq!(
        mixed.refuse(&claim("spot", 1), &on(15)),
        None,
        "on-demand to spot is not spot-to-spot"
    );
}

#[test]
fn revalidation_refuses_what_no_longer_pays() {
    use consolidation::{ReplacementLimits, revalidate};
    let limits = ReplacementLimits {
        price_below: 0.20,
        nodes: 1,
        ..ReplacementLimits::default()
    };
    let opts = ConsolidationOptions::default();
    let claim = |price: f64| crate::scheduling::NewNodeClaim {
        price,
        capacity_type: "on-demand".into(),
        ..crate::scheduling::fixtures::new_claim()
    };
    assert_eq!(revalidate(&limits, &[], None, &opts), Ok(()), "a delete");
    assert_eq!(revalidate(&limits, &[claim(0.08)], None, &opts), Ok(()));
    assert!(
        revalidate(&limits, &[claim(0.199)], None, &opts)
            .unwrap_err()
            .contains("less than the minimum")
    );
    assert!(
        revalidate(&limits, &[claim(0.01), claim(0.01)], None, &opts)
            .unwrap_err()
            .contains("2 new nodes")
    );
    assert_eq!(
        revalidate(&limits, &[], Some("pod x cannot be placed"), &opts),
        Err("pod x cannot be placed".into())
    );
}

/// Random underused clusters: m.xlarge nodes (spot or on-demand) holding web
/// pods of random sizes (at most 4000m a node), some nodes with one `solo`
/// pod (solo pods repel each other per host).
fn arb_underused() -> impl Strategy<Value = Snapshot> {
    let node_strategy = (
        proptest::bool::ANY,                                                         // spot
        proptest::collection::vec((0usize..4, proptest::bool::weighted(0.3)), 0..5), // pods: size, solo
    );
    (proptest::collection::vec(node_strategy, 1..9), prop_oneof![Just("20%"), Just("100%"), Just("2")]).prop_map(
        |(spec, budget)| {
            const CPU: [&str; 4] = ["250m", "500m", "750m", "1000m"];
            let p = pool_with(&format!("disruption:\n  budgets: [{{nodes: '{budget}'}}]\n"));
            let nodes = spec
                .into_iter()
                .enumerate()
                .map(|(i, (spot, pods))| {
                    let name = format!("n{i}");
                    let pods = pods
                        .into_iter()
                        .enumerate()
                        .map(|(j, (size, solo))| {
                            let mut p = sized(&format!("p{i}-{j}"), &name, CPU[size]);
                            if solo && j == 0 {
                                let mut v = serde_json::to_value(&p).unwrap();
                                merge(&mut v, json!({"metadata": {"labels": {"app": "solo"}}, "spec": {"affinity": {"podAntiAffinity": {
                                    "requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": labels::HOSTNAME,
                                        "labelSelector": {"matchLabels": {"app": "solo"}}}]}}}}));
                                p = serde_json::from_value(v).unwrap();
                            }
                            p
                        })
                        .collect();
                    let ct = if spot { "spot" } else { "on-demand" };
                    (node(&name, 2.0, offering("m.xlarge", ct)), pods)
                })
                .collect();
            snapshot(p, nodes)
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn consolidation_keeps_every_invariant_and_never_costs_more(s in arb_underused()) {
        let d = run(&s);
        prop_assert!(d.price_after <= d.price_before + 1e-9, "{} > {}", d.price_after, d.price_before);
        let Some(u) = underutilized(&d) else { return Ok(()); };
        prop_assert!(u.replacements.len() <= 1, "one new node per pass: {:?}", u.replacements.len());
        prop_assert!(u.savings_per_hour > 0.0);
        let budgets = PoolBudgets::new(&s.node_pools[0]);
        let allowed = budgets.allowed(Reason::Underutilized, s.nodes.len(), s.now).unwrap();
        prop_assert!(u.nodes.len() <= allowed, "{} nodes, budget {}", u.nodes.len(), allowed);
        let removed: BTreeSet<&str> = u.nodes.iter().map(String::as_str).collect();
        // The cluster after the pass: each remaining node's pods plus the ones moved to it.
        let mut after: BTreeMap<String, Vec<&Pod>> = BTreeMap::new();
        let mut moved = BTreeMap::new();
        for m in &u.moves {
            prop_assert!(!removed.contains(m.to.as_str()), "{} moves onto a removed node", m.pod);
            prop_assert!(moved.insert(m.pod.clone(), m.to.clone()).is_none(), "{} moves twice", m.pod);
        }
        for n in &s.nodes {
            let name = n.node.metadata.name.clone().unwrap();
            for p in &n.pods {
                let to = if removed.contains(name.as_str()) {
                    moved.get(&PodRef::of(p)).cloned()
                } else {
                    Some(name.clone())
                };
                let to = to.ok_or_else(|| TestCaseError::fail(format!("{} is lost", PodRef::of(p))))?;
                after.entry(to).or_default().push(p);
            }
        }
        let alloc_milli = 4000;
        for (host, pods) in &after {
            let cpu: i64 = pods.iter().map(|p| crate::scheduling::pod::effective_requests(p.spec.as_ref().unwrap(), "spec").unwrap().get("cpu").milli()).sum();
            let limit = u.replacements.iter().find(|r| &r.name == host).map_or(alloc_milli, |r| r.allocatable.get("cpu").milli());
            prop_assert!(cpu <= limit, "{} holds {}m of {}m", host, cpu, limit);
            let solo = pods.iter().filter(|p| p.metadata.labels.as_ref().unwrap()["app"] == "solo").count();
            prop_assert!(solo <= 1, "{} holds {} solo pods", host, solo);
        }
        for r in &u.replacements {
            prop_assert!(r.instance_type_options.iter().all(|t| t != "m.xlarge"), "same type offered");
        }
    }
}

/// Nodes in three zones (a fourth choice: no zone label) running pods of two
/// zonally spread apps and a plain one (one pending pod of each spread app,
/// so a solve always has their groups); node numbers to commit away one at a
/// time, and the nodes the last solve names.
fn arb_zonal() -> impl Strategy<Value = (Snapshot, Vec<usize>, Vec<usize>)> {
    let nodes = proptest::collection::vec((0usize..4, proptest::collection::vec(0usize..3, 0..5)), 1..9);
    let picks = || proptest::collection::vec(0usize..9, 0..5);
    (nodes, picks(), picks()).prop_map(|(spec, commits, named)| {
        let zones = ["test-zone-a", "test-zone-b", "test-zone-c"];
        let app_pod = |name: &str, node: Option<&str>, app: usize| {
            let labels = json!({"app": format!("app-{app}")});
            let spread = json!([{"maxSkew": 1, "topologyKey": labels::ZONE, "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": labels}}]);
            let mut spec = json!({"topologySpreadConstraints": if app < 2 { spread } else { json!([]) }});
            if let Some(n) = node {
                spec["nodeName"] = json!(n);
            }
            pod(
                name,
                "250m",
                "256Mi",
                json!({"metadata": {"labels": labels, "creationTimestamp": ago(1.0), "ownerReferences": [
                    {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("app-{app}"), "uid": "u", "controller": true}]},
                    "spec": spec}),
            )
        };
        let nodes = spec
            .into_iter()
            .enumerate()
            .map(|(i, (zone, apps))| {
                let n = format!("n{i}");
                let labels = zones.get(zone).map_or(json!({}), |z| json!({(labels::ZONE): z}));
                let pods = apps
                    .into_iter()
                    .enumerate()
                    .map(|(j, app)| app_pod(&format!("p{i}-{j}"), Some(&n), app))
                    .collect();
                (node(&n, 2.0, json!({"metadata": {"labels": labels}})), pods)
            })
            .collect();
        let mut s = snapshot(pool_with(""), nodes);
        s.pods = (0..2).map(|app| app_pod(&format!("pending-{app}"), None, app)).collect();
        (s, commits, named)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// A solve counts a zonal group's running pods by value from the compiled
    /// snapshot (kept in step by every commit); the counts must be those a
    /// visit of every pod on the entries it keeps finds.
    #[test]
    fn counts_by_value_are_the_counts_of_the_pods_kept((s, commits, named) in arb_zonal()) {
        let compiled_input = s.solve_input();
        let mut compiled = crate::scheduling::Compiled::new(&compiled_input);
        let mut gone: BTreeSet<String> = BTreeSet::new();
        let check = |compiled: &crate::scheduling::Compiled, names: &[usize]| {
            let options = SolveOptions::without(names.iter().map(|i| format!("n{i}")));
            let fast = crate::scheduling::model::Model::counted(compiled, &options, true);
            let walked = crate::scheduling::model::Model::counted(compiled, &options, false);
            (fast.counts.nonzero(), walked.counts.nonzero(), fast.groups.list.len())
        };
        for k in commits {
            let name = format!("n{k}");
            if k >= s.nodes.len() || gone.contains(&name) {
                continue;
            }
            let plan = compiled.solve(&SolveOptions::without([name.as_str()]));
            if plan.unschedulable.is_empty() {
                gone.insert(name);
                compiled.commit(&plan, &gone);
            }
            let (fast, walked, groups) = check(&compiled, &named);
            prop_assert!(groups > 0, "the pending pods own groups");
            prop_assert_eq!(fast, walked, "after committing {:?}", gone);
        }
        // The pending pods held where a solve puts them count as running pods.
        let plan = compiled.solve(&SolveOptions::default());
        compiled.hold_pending(&plan);
        let (fast, walked, _) = check(&compiled, &named);
        prop_assert_eq!(fast, walked, "after holding the pending pods");
    }
}

#[test]
fn zonal_spread_pods_of_a_removed_node_go_to_existing_nodes_with_room() {
    let spread = |name: &str, node: &str| {
        pod(
            name,
            "100m",
            "256Mi",
            json!({"metadata": {"labels": {"app": "spread"}, "creationTimestamp": ago(1.0), "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "spread", "uid": "s", "controller": true}]},
                "spec": {"nodeName": node, "topologySpreadConstraints": [{"maxSkew": 2, "topologyKey": labels::ZONE,
                    "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "spread"}}}]}}),
        )
    };
    let zones = ["test-zone-a", "test-zone-b", "test-zone-c"];
    let nodes: Vec<(Node, Vec<Pod>)> = (0..9)
        .map(|i| {
            let n = format!("n{i}");
            let pods = (0..3).map(|j| spread(&format!("s-{i}-{j}"), &n)).collect();
            (
                node(
                    &n,
                    2.0,
                    json!({"metadata": {"labels": {"topology.kubernetes.io/zone": zones[i % 3]}}}),
                ),
                pods,
            )
        })
        .collect();
    let s = snapshot(pool_with(""), nodes);
    let mut input = s.solve_input();
    input.pods = &[];
    let compiled = crate::scheduling::Compiled::new(&input);
    let plan = compiled.solve(&SolveOptions::without(["n1"]));
    assert!(plan.unschedulable.is_empty(), "{:?}", plan.unschedulable);
    assert!(
        plan.node_claims.is_empty(),
        "{:#?}",
        plan.node_claims.iter().map(|c| (&c.zone, &c.pods)).collect::<Vec<_>>()
    );
}

#[test]
fn a_committed_what_if_is_where_later_solves_start() {
    use crate::scheduling::Compiled;
    let s = snapshot(
        pool_with(""),
        vec![
            (node("a", 2.0, json!({})), vec![sized("big", "a", "3500m")]),
            (node("b", 2.0, json!({})), vec![sized("b-0", "b", "500m")]),
        ],
    );
    let mut input = s.solve_input();
    input.pods = &[];
    let mut compiled = Compiled::new(&input);
    let gone_a = BTreeSet::from(["a".to_string()]);
    let only_existing = |removed: &BTreeSet<String>| SolveOptions {
        removed: removed.clone(),
        new_claims: false,
        ..SolveOptions::default()
    };
    let moved = compiled.solve(&only_existing(&gone_a));
    assert_eq!(moved.existing.len(), 1, "{moved:?}");
    assert_eq!(moved.existing[0].name, "b");
    compiled.commit(&moved, &gone_a);
    // Committed: nothing is pending with a gone, and b is full.
    assert!(compiled.solve(&only_existing(&gone_a)).existing.is_empty());
    // a is retired: a solve that names only b never moves b's pods back onto it.
    let b_only = compiled.solve(&only_existing(&BTreeSet::from(["b".to_string()])));
    assert!(b_only.existing.iter().all(|e| e.name != "a"), "{b_only:?}");
    let both = BTreeSet::from(["a".to_string(), "b".to_string()]);
    let again = compiled.solve(&SolveOptions::without(both.clone()));
    assert_eq!(again.node_claims.len(), 1, "big and b-0 move again together: {again:?}");
    let mut claim_pods = again.node_claims[0].pods.clone();
    claim_pods.sort();
    assert_eq!(
        claim_pods.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
        ["b-0", "big"]
    );
    // A committed new claim is capacity later solves use, as an in-flight claim.
    compiled.commit(&again, &both);
    let after = compiled.solve(&only_existing(&both));
    assert!(after.existing.is_empty() && after.unschedulable.is_empty(), "{after:?}");
    let claim = &again.node_claims[0].name;
    assert!(
        compiled.used_by(claim).is_some_and(|u| u.get("cpu").milli() >= 4000),
        "{:?}",
        compiled.used_by(claim)
    );
}

#[test]
fn consolidation_never_plans_a_replacement_into_a_shifted_zone() {
    // An on-demand m.xlarge in zone b running 500m: a cheaper type replaces it,
    // in zone a (the first of equal prices) unless zone a is shifted away.
    let s = |shift: bool| {
        let mut s = snapshot(
            pool_requiring(ON_DEMAND_ONLY, ""),
            vec![(
                node(
                    "b",
                    2.0,
                    json!({"metadata": {"labels": {"topology.kubernetes.io/zone": "test-zone-b"}}}),
                ),
                vec![sized("b-0", "b", "500m")],
            )],
        );
        if shift {
            s.shifted_zones = BTreeSet::from(["test-zone-a".to_string()]);
        }
        s
    };
    let zones = |d: &Decisions| -> Vec<String> {
        underutilized(d)
            .unwrap_or_else(|| panic!("no consolidation: {d:?}"))
            .replacements
            .iter()
            .map(|c| c.zone.clone())
            .collect()
    };
    assert_eq!(
        zones(&run(&s(false))),
        ["test-zone-a"],
        "the shift is what keeps zone a out"
    );
    let d = run(&s(true));
    assert_eq!(zones(&d), ["test-zone-b"]);
    let c = &underutilized(&d).unwrap().replacements[0];
    assert!(
        c.requirements.get(labels::ZONE).is_some_and(|z| !z.has("test-zone-a")),
        "{c:?}"
    );
}

// ---- Regrouping: what the binary search over prefixes misses ----

/// The pass with consolidation searching as it did before regrouping.
fn run_binary_search_only(s: &Snapshot) -> Decisions {
    let mut ms = methods();
    // The last method is consolidation (`methods`).
    let last = ms.len() - 1;
    ms[last] = &consolidation::BinarySearchOnly;
    decide_with(s, &DecideOptions::default(), &ms)
}

/// What a pass saves per hour.
fn saving(d: &Decisions) -> f64 {
    d.price_before - d.price_after
}

/// An on-demand node of the built-in catalog (`m5.xlarge` or `m5.2xlarge`)
/// in `zone`, with one pod per entry of `cpus`.
fn m5(name: &str, size: &str, zone: &str, cpus: &[&str]) -> (Node, Vec<Pod>) {
    let alloc = match size {
        "m5.xlarge" => json!({"cpu": "3920m", "memory": "14162Mi", "pods": "58"}),
        _ => json!({"cpu": "7910m", "memory": "29317Mi", "pods": "58"}),
    };
    let n = node(
        name,
        2.0,
        json!({"metadata": {"labels": {"node.kubernetes.io/instance-type": size, "topology.kubernetes.io/zone": zone,
            "karpenter.k8s.aws/instance-family": "m5"}},
            "status": {"allocatable": alloc, "capacity": alloc}}),
    );
    let pods = cpus
        .iter()
        .enumerate()
        .map(|(i, cpu)| sized(&format!("{name}-{i}"), name, cpu))
        .collect();
    (n, pods)
}

/// The nodes on the built-in catalog, in an on-demand pool of `families` with
/// budgets of `budget`.
fn on_demand_snapshot(families: &str, budget: &str, nodes: Vec<(Node, Vec<Pod>)>) -> Snapshot {
    let p = pool_requiring(
        &format!(
            "{ON_DEMAND_ONLY}      - {{key: karpenter.k8s.aws/instance-family, operator: In, values: [{families}]}}\n"
        ),
        &format!("disruption:\n  budgets: [{{nodes: '{budget}'}}]\n"),
    );
    let mut catalog = crate::catalog::builtin().unwrap().clone();
    // The pool allows these families only: the rest would only slow the tests.
    catalog
        .instance_types
        .retain(|t| ["m5.", "c5."].iter().any(|f| t.name.starts_with(f)));
    let mut s = snapshot(p, nodes);
    s.catalog = Arc::new(catalog);
    s
}

/// `n` m5.xlarge nodes, each running one 2.2-CPU pod, in an m5-only pool.
fn three_m5_case(n: usize) -> Snapshot {
    let nodes = (0..n)
        .map(|i| m5(&format!("n{i}"), "m5.xlarge", "us-east-1a", &["2200m"]))
        .collect();
    on_demand_snapshot("m5", "100%", nodes)
}

#[test]
fn regrouping_table() {
    /// The nodes that go, and the one instance type their replacement may be.
    struct Merge(&'static [&'static str], &'static str);
    // (what, how many nodes, the merge wanted)
    let cases: Vec<(&str, usize, Option<Merge>)> = vec![
        (
            "three m5.xlarge with one 2.2-CPU pod each go onto one m5.2xlarge, a third cheaper",
            3,
            Some(Merge(&["n0", "n1", "n2"], "m5.2xlarge")),
        ),
        ("two of them stay: an m5.2xlarge costs exactly what they do", 2, None),
    ];
    for (what, n, want) in cases {
        let s = three_m5_case(n);
        let d = run(&s);
        let u = underutilized(&d);
        match want {
            Some(Merge(nodes, instance_type)) => {
                let u = u.unwrap_or_else(|| panic!("{what}: no decision: {:#?}", d.blocked));
                assert_eq!(u.nodes, nodes, "{what}");
                assert_eq!(u.replacements.len(), 1, "{what}: {u:#?}");
                let r = &u.replacements[0];
                assert_eq!(r.instance_type_options, [instance_type], "{what}");
                assert_eq!(r.capacity_type, "on-demand", "{what}");
                assert!((r.price - 0.384).abs() < 1e-9, "{what}: {}", r.price);
                assert!(
                    (u.savings_per_hour - 0.192).abs() < 1e-9,
                    "{what}: {}",
                    u.savings_per_hour
                );
                assert_eq!(u.moves.len(), n, "{what}: every pod moves once");
                assert!(u.moves.iter().all(|m| m.to == r.name), "{what}: {:?}", u.moves);
            }
            None => {
                assert!(u.is_none(), "{what}: {d:#?}");
                let h = held(&d, "n0").unwrap_or_else(|| panic!("{what}: n0 not held: {d:#?}"));
                assert!(matches!(h, Held::Unconsolidatable(_)), "{what}: {h:?}");
            }
        }
    }
}

#[test]
fn regrouping_saves_more_than_the_binary_search_where_it_misses() {
    let s = three_m5_case(3);
    let (new, old) = (run(&s), run_binary_search_only(&s));
    assert!(saving(&old).abs() < 1e-9, "the binary search keeps all three: {old:#?}");
    assert!(
        saving(&new) > saving(&old) + 0.19,
        "regrouping saves {} against {}",
        saving(&new),
        saving(&old)
    );
}

/// Random underused clusters on the built-in catalog: on-demand m5.xlarge and
/// m5.2xlarge nodes in two zones, each running up to three pods of 0.5 to 2.2
/// CPUs (as many as fit), in an m5-only or an m5-and-c5 pool.
fn arb_m5_cluster() -> impl Strategy<Value = Snapshot> {
    let node_strategy = (
        proptest::bool::weighted(0.3),              // m5.2xlarge
        proptest::bool::ANY,                        // zone b
        proptest::collection::vec(0usize..4, 0..4), // pods: size
    );
    (
        proptest::collection::vec(node_strategy, 2..8),
        proptest::bool::ANY,
        prop_oneof![Just("100%"), Just("50%")],
    )
        .prop_map(|(spec, with_c5, budget)| {
            const CPU: [(&str, i64); 4] = [("500m", 500), ("1000m", 1000), ("1500m", 1500), ("2200m", 2200)];
            let nodes = spec
                .into_iter()
                .enumerate()
                .map(|(i, (big, zone_b, sizes))| {
                    let (size, room) = if big { ("m5.2xlarge", 7910) } else { ("m5.xlarge", 3920) };
                    let mut used = 0;
                    let cpus: Vec<&str> = sizes
                        .into_iter()
                        .filter_map(|s| {
                            let (cpu, milli) = CPU[s];
                            used += milli;
                            (used <= room).then_some(cpu)
                        })
                        .collect();
                    let zone = if zone_b { "us-east-1b" } else { "us-east-1a" };
                    m5(&format!("n{i}"), size, zone, &cpus)
                })
                .collect();
            on_demand_snapshot(if with_c5 { "m5, c5" } else { "m5" }, budget, nodes)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn regrouping_never_saves_less_than_the_binary_search(s in arb_m5_cluster()) {
        let (new, old) = (run(&s), run_binary_search_only(&s));
        prop_assert!(new.price_after <= new.price_before + 1e-9, "{} > {}", new.price_after, new.price_before);
        prop_assert!(
            saving(&new) >= saving(&old) - 1e-9,
            "regrouping saves {}/h, the binary search {}/h",
            saving(&new),
            saving(&old)
        );
        if let Some(u) = underutilized(&new) {
            prop_assert!(u.replacements.len() <= 1, "one new node per pass");
        }
    }
}
