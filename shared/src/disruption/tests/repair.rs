//! Node repair: each watched condition at and within its toleration, EC2
//! status checks, the 20% cap, the setting that turns it off, and its place
//! before expiry; forceful past budgets, do-not-disrupt and PDBs.

use super::*;
use crate::disruption::repair::{Health, RepairOptions, health, over_cap};

/// A condition of `type_` in `status` since `hours` ago (None: no transition time).
fn condition(type_: &str, status: &str, hours: Option<f64>) -> Value {
    let mut c = json!({"type": type_, "status": status});
    if let Some(h) = hours {
        c["lastTransitionTime"] = json!(ago(h));
    }
    c
}

/// A node `name` with these conditions (and a Ready one unless given).
fn with_conditions(name: &str, conditions: Vec<Value>) -> Node {
    node(name, 24.0, json!({"status": {"conditions": conditions}}))
}

fn not_ready(name: &str, hours: f64) -> Node {
    with_conditions(name, vec![condition("Ready", "Unknown", Some(hours))])
}

fn ready(name: &str) -> Node {
    with_conditions(name, vec![condition("Ready", "True", Some(20.0))])
}

const MIN: f64 = 1.0 / 60.0;

#[test]
fn health_table() {
    let o = RepairOptions::default();
    // (conditions, EC2 impaired since (hours ago), want: 0 healthy, 1 tolerated, 2 due)
    let cases: Vec<(Vec<Value>, Option<Option<f64>>, u8)> = vec![
        (vec![], None, 0),
        (vec![condition("Ready", "True", Some(5.0))], None, 0),
        (vec![condition("Ready", "False", Some(29.0 * MIN))], None, 1),
        (vec![condition("Ready", "False", Some(30.0 * MIN))], None, 2),
        (vec![condition("Ready", "Unknown", Some(29.0 * MIN))], None, 1),
        (vec![condition("Ready", "Unknown", Some(31.0 * MIN))], None, 2),
        (
            vec![condition("AcceleratedHardwareReady", "False", Some(9.0 * MIN))],
            None,
            1,
        ),
        (
            vec![condition("AcceleratedHardwareReady", "False", Some(10.0 * MIN))],
            None,
            2,
        ),
        // The monitoring agent's conditions count only when False (Karpenter's policies).
        (
            vec![condition("AcceleratedHardwareReady", "Unknown", Some(5.0))],
            None,
            0,
        ),
        (vec![condition("StorageReady", "False", Some(29.0 * MIN))], None, 1),
        (vec![condition("StorageReady", "False", Some(30.0 * MIN))], None, 2),
        (vec![condition("NetworkingReady", "False", Some(29.0 * MIN))], None, 1),
        (vec![condition("NetworkingReady", "False", Some(30.0 * MIN))], None, 2),
        (vec![condition("KernelReady", "False", Some(29.0 * MIN))], None, 1),
        (vec![condition("KernelReady", "False", Some(30.0 * MIN))], None, 2),
        (
            vec![condition("ContainerRuntimeReady", "False", Some(29.0 * MIN))],
            None,
            1,
        ),
        (
            vec![condition("ContainerRuntimeReady", "False", Some(30.0 * MIN))],
            None,
            2,
        ),
        (vec![condition("ContainerRuntimeReady", "True", Some(30.0))], None, 0),
        (vec![condition("SomethingElse", "False", Some(30.0))], None, 0),
        // No transition time: how long is unknown, so the toleration is over (as in Karpenter).
        (vec![condition("Ready", "False", None)], None, 2),
        // The problem whose toleration ends first decides.
        (
            vec![
                condition("Ready", "False", Some(5.0 * MIN)),
                condition("AcceleratedHardwareReady", "False", Some(11.0 * MIN)),
            ],
            None,
            2,
        ),
        // EC2 status checks: 2 minutes, or at once when EC2 does not say since when.
        (vec![], Some(Some(1.0 * MIN)), 1),
        (vec![], Some(Some(2.0 * MIN)), 2),
        (vec![], Some(None), 2),
    ];
    for (i, (conditions, impaired, want)) in cases.into_iter().enumerate() {
        let n = with_conditions("n", conditions.clone());
        let impaired = impaired.map(|s| s.map(|h| ago(h).parse().unwrap()));
        let got = match health(&n, impaired, &o, now()) {
            Health::Healthy => 0,
            Health::Tolerated(_) => 1,
            Health::Due(_) => 2,
        };
        assert_eq!(got, want, "case {i}: {conditions:?} impaired {impaired:?}");
    }
}

#[test]
fn tolerations_and_the_switch_are_settings_with_karpenter_s_defaults() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        crate::settings::Settings::new(move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()))
    };
    assert_eq!(
        RepairOptions::from_settings(&env(&[])).unwrap(),
        RepairOptions::default()
    );
    let o = RepairOptions::from_settings(&env(&[
        ("NODESMITH_NODE_REPAIR", "false"),
        ("NODESMITH_REPAIR_READY_TOLERATION", "5m"),
        ("NODESMITH_REPAIR_STATUS_CHECK_TOLERATION", "10m"),
    ]))
    .unwrap();
    assert!(!o.enabled);
    let ready: Vec<_> = o.policies.iter().filter(|p| p.condition == "Ready").collect();
    assert_eq!(ready.len(), 2);
    assert!(
        ready
            .iter()
            .all(|p| p.toleration == std::time::Duration::from_secs(300))
    );
    assert_eq!(o.status_check_toleration, std::time::Duration::from_secs(600));
    assert!(RepairOptions::from_settings(&env(&[("NODESMITH_NODE_REPAIR", "maybe")])).is_err());
    assert!(RepairOptions::from_settings(&env(&[("NODESMITH_REPAIR_KERNEL_TOLERATION", "soon")])).is_err());
}

#[test]
fn the_cap_is_twenty_percent_rounded_up() {
    // (unhealthy, nodes, over the cap?)
    for (unhealthy, total, want) in [
        (0, 0, false),
        (1, 1, false),
        (1, 3, false),
        (1, 5, false),
        (2, 5, true),
        (2, 6, false),
        (3, 6, true),
        (2, 10, false),
        (3, 10, true),
        (20, 100, false),
        (21, 100, true),
    ] {
        assert_eq!(over_cap(unhealthy, total), want, "{unhealthy} of {total}");
    }
}

#[test]
fn an_unhealthy_node_is_replaced_past_budgets_do_not_disrupt_and_pdbs() {
    let mut sick = not_ready("sick", 1.0);
    sick.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert("karpenter.sh/do-not-disrupt".into(), "true".into());
    let mut s = snapshot(
        pool_with("disruption:\n  consolidationPolicy: WhenEmpty\n  budgets: [{nodes: '0'}]\n"),
        vec![
            (sick, vec![web("w-0", "sick", "web", 2.0)]),
            (ready("a"), vec![web("w-1", "a", "web", 2.0)]),
            (ready("b"), vec![web("w-2", "b", "other", 2.0)]),
            (ready("c"), vec![web("w-3", "c", "other", 2.0)]),
            (ready("d"), vec![web("w-4", "d", "other", 2.0)]),
        ],
    );
    s.pod_disruption_budgets = vec![pdb("web", "web", json!(0))];
    let d = run(&s);
    assert_eq!(decided(&d), [(Reason::Unhealthy, "sick".to_string())], "{d:#?}");
    assert_eq!(d.decisions[0].reason.as_str(), "Unhealthy");
}

#[test]
fn a_node_within_its_toleration_stays() {
    let s = snapshot(
        pool_with("disruption:\n  consolidationPolicy: WhenEmpty\n"),
        vec![
            (not_ready("sick", 0.25), vec![web("w-0", "sick", "web", 2.0)]),
            (ready("a"), vec![web("w-1", "a", "web", 2.0)]),
        ],
    );
    assert!(decided(&run(&s)).is_empty());
}

#[test]
fn no_node_of_a_pool_is_repaired_while_more_than_a_fifth_is_unhealthy() {
    // (due, tolerated, healthy nodes, repaired?)
    for (due, tolerated, healthy, want) in [
        (1, 0, 4, true),
        (2, 0, 3, false),
        (1, 1, 3, false),
        (2, 0, 8, true),
        (3, 0, 7, false),
    ] {
        let mut nodes = Vec::new();
        for i in 0..due {
            nodes.push((not_ready(&format!("due-{i}"), 2.0), vec![]));
        }
        for i in 0..tolerated {
            nodes.push((not_ready(&format!("soon-{i}"), 0.1), vec![]));
        }
        for i in 0..healthy {
            let n = format!("ok-{i}");
            let p = web(&format!("w-{i}"), &n, "web", 2.0);
            nodes.push((ready(&n), vec![p]));
        }
        let s = snapshot(pool_with("disruption:\n  consolidateAfter: Never\n"), nodes);
        let d = run(&s);
        let repaired: Vec<_> = decided(&d)
            .into_iter()
            .filter(|(r, _)| *r == Reason::Unhealthy)
            .collect();
        if want {
            assert_eq!(repaired.len(), due, "{due}/{tolerated}/{healthy}: {d:#?}");
        } else {
            assert!(repaired.is_empty(), "{due}/{tolerated}/{healthy}: {d:#?}");
            for i in 0..due {
                let h = held(&d, &format!("due-{i}"));
                assert!(
                    matches!(&h, Some(Held::RepairCapped { pool, unhealthy, total })
                        if pool == "default" && *unhealthy == due + tolerated && *total == due + tolerated + healthy),
                    "{h:?}"
                );
                assert!(h.unwrap().to_string().contains("more than 20%"));
            }
        }
    }
}

#[test]
fn repair_turned_off_repairs_nothing() {
    let s = snapshot(
        pool_with("disruption:\n  consolidateAfter: Never\n"),
        vec![
            (not_ready("sick", 2.0), vec![web("w-0", "sick", "web", 2.0)]),
            (ready("a"), vec![web("w-1", "a", "web", 2.0)]),
        ],
    );
    let options = DecideOptions {
        repair: RepairOptions {
            enabled: false,
            ..RepairOptions::default()
        },
        ..DecideOptions::default()
    };
    let d = decide(&s, &options);
    assert!(decided(&d).is_empty(), "{d:#?}");
    assert!(
        !d.blocked.iter().any(|b| matches!(b.rule, Held::RepairCapped { .. })),
        "{d:#?}"
    );
}

#[test]
fn repair_comes_before_expiry() {
    let old_and_sick = with_conditions("both", vec![condition("KernelReady", "False", Some(1.0))]);
    let mut old_and_sick = serde_json::to_value(old_and_sick).unwrap();
    merge(
        &mut old_and_sick,
        json!({"metadata": {"creationTimestamp": ago(800.0)}}),
    );
    let s = snapshot(
        pool_with("disruption:\n  consolidateAfter: Never\n"),
        vec![
            (serde_json::from_value(old_and_sick).unwrap(), vec![]),
            (node("old", 800.0, json!({})), vec![]),
            (ready("a"), vec![web("w-1", "a", "web", 2.0)]),
            (ready("b"), vec![web("w-2", "b", "web", 2.0)]),
            (ready("c"), vec![web("w-3", "c", "web", 2.0)]),
        ],
    );
    let d = run(&s);
    assert_eq!(
        decided(&d),
        [
            (Reason::Unhealthy, "both".to_string()),
            (Reason::Expired, "old".to_string())
        ],
        "{d:#?}"
    );
}

#[test]
fn an_impaired_status_check_is_repaired_and_a_disrupting_node_is_not_taken_twice() {
    let mut taken = ready("taken");
    taken.spec.get_or_insert_with(Default::default).taints = Some(vec![
        serde_json::from_value(json!({"key": "karpenter.sh/disrupted", "effect": "NoSchedule"})).unwrap(),
    ]);
    let s = snapshot(
        pool_with("disruption:\n  consolidateAfter: Never\n"),
        vec![
            (ready("impaired"), vec![web("w-0", "impaired", "web", 2.0)]),
            (taken, vec![]),
            (ready("a"), vec![web("w-1", "a", "web", 2.0)]),
            (ready("b"), vec![web("w-2", "b", "web", 2.0)]),
            (ready("c"), vec![web("w-3", "c", "web", 2.0)]),
            (ready("d"), vec![]),
            (ready("e"), vec![]),
            (ready("f"), vec![]),
            (ready("g"), vec![]),
            (ready("h"), vec![]),
        ],
    );
    // Ten nodes, two unhealthy (the one being disrupted counts): within the cap.
    let since: Timestamp = ago(0.5).parse().unwrap();
    let options = DecideOptions {
        impaired: BTreeMap::from([("impaired".to_string(), Some(since)), ("taken".to_string(), None)]),
        ..DecideOptions::default()
    };
    let d = decide(&s, &options);
    assert_eq!(decided(&d), [(Reason::Unhealthy, "impaired".to_string())], "{d:#?}");
    assert_eq!(
        d.decisions[0].moves.len(),
        1,
        "its pod goes to a node with room: {d:#?}"
    );
}

#[test]
fn a_repaired_node_s_pod_that_fits_nowhere_holds_neither_the_repair_nor_other_methods() {
    let big = pod(
        "big",
        "3500m",
        "1Gi",
        json!({"metadata": {"ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "big", "uid": "u", "controller": true}]},
            "spec": {"nodeName": "sick", "nodeSelector": {"example.com/only": "sick"}}}),
    );
    let s = snapshot(
        // A budget for all: the repaired node counts as disrupting against the others'.
        pool_with(
            "disruption:\n  consolidationPolicy: WhenEmpty\n  consolidateAfter: 0s\n  budgets: [{nodes: '100%'}]\n",
        ),
        vec![
            (not_ready("sick", 2.0), vec![big]),
            (ready("idle"), vec![]),
            (ready("a"), vec![web("w-1", "a", "web", 2.0)]),
            (ready("b"), vec![web("w-2", "b", "web", 2.0)]),
            (ready("c"), vec![web("w-3", "c", "web", 2.0)]),
        ],
    );
    let d = run(&s);
    assert_eq!(
        decided(&d),
        [
            (Reason::Unhealthy, "sick".to_string()),
            (Reason::Empty, "idle".to_string())
        ],
        "{d:#?}"
    );
    assert!(d.decisions[0].moves.is_empty(), "{d:#?}");
}
