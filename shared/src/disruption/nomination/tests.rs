//! Table tests of nominations in a disruption pass: nominated nodes are
//! spared, pods that fit nowhere hold nothing back, and the what-ifs keep
//! the room pending pods were given (on nodes and on in-flight claims).

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};

use super::{Nomination, live, records, window};
use crate::disruption::{DecideOptions, Decisions, Held, Reason, decide};
use crate::nodeclaim::{NodeClaim, Phase};
use crate::scheduling::fixtures::{catalog, managed_node, merge, pod, pool};
use crate::scheduling::{ExistingNode, ExistingPlacement, Plan, PodRef, TargetKind};
use crate::snapshot::Snapshot;
use crate::state::NominationRecord;

const NOW: &str = "2026-03-01T12:00:00Z";

fn now() -> Timestamp {
    NOW.parse().unwrap()
}

/// Pool `default`: consolidation of empty and underused nodes at once,
/// every node at a time; `types`: the instance types it may launch.
fn consolidating(types: &[&str]) -> crate::apis::NodePool {
    pool(
        "default",
        &format!(
            "template:\n  spec:\n    nodeClassRef: {{group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}}\n    requirements:\n      - {{key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}}\n      - {{key: node.kubernetes.io/instance-type, operator: In, values: [{}]}}\ndisruption:\n  consolidationPolicy: WhenEmptyOrUnderutilized\n  consolidateAfter: 0s\n  budgets: [{{nodes: '100%'}}]\n",
            types.join(", ")
        ),
    )
}

/// A managed m.xlarge (4 cpu, 0.20/h), a day old.
fn node(name: &str) -> Node {
    let mut v = serde_json::to_value(managed_node(name)).unwrap();
    merge(
        &mut v,
        json!({"metadata": {"creationTimestamp": "2026-02-28T12:00:00Z"}}),
    );
    serde_json::from_value(v).unwrap()
}

/// A ReplicaSet pod asking `cpu`; `extra` merged in (e.g. a `nodeName`).
fn web(name: &str, cpu: &str, extra: Value) -> Pod {
    let mut p = pod(
        name,
        cpu,
        "1Gi",
        json!({"metadata": {"creationTimestamp": "2026-03-01T10:00:00Z", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "u", "controller": true}]}}),
    );
    let mut v = serde_json::to_value(&p).unwrap();
    merge(&mut v, extra);
    p = serde_json::from_value(v).unwrap();
    p
}

fn on(node: &str) -> Value {
    json!({"spec": {"nodeName": node}})
}

fn snapshot(types: &[&str], nodes: Vec<(Node, Vec<Pod>)>, pending: Vec<Pod>) -> Snapshot {
    let mut s = Snapshot::new(Arc::new(catalog()), now());
    s.node_pools = vec![consolidating(types)];
    s.nodes = nodes
        .into_iter()
        .map(|(node, pods)| ExistingNode { node, pods })
        .collect();
    s.pods = pending;
    s
}

fn decided(d: &Decisions) -> Vec<(Reason, String)> {
    d.decisions
        .iter()
        .flat_map(|x| x.nodes.iter().map(move |n| (x.reason, n.clone())))
        .collect()
}

fn held(d: &Decisions, node: &str) -> Option<Held> {
    d.blocked.iter().find(|b| b.node == node).map(|b| b.rule.clone())
}

#[test]
fn the_window_is_twice_the_batch_maximum_and_at_least_ten_seconds() {
    assert_eq!(window(Duration::from_secs(10)), Duration::from_secs(20));
    assert_eq!(window(Duration::from_secs(2)), Duration::from_secs(10));
    assert_eq!(window(Duration::ZERO), Duration::from_secs(10));
}

#[test]
fn a_nominated_node_is_spared_and_a_pod_that_fits_nowhere_nominates_nothing() {
    let fits = web(
        "fits",
        "1",
        json!({"spec": {"nodeSelector": {"kubernetes.io/hostname": "a"}}}),
    );
    let huge = web("huge", "100", json!({}));
    let s = snapshot(
        &["m.xlarge"],
        vec![(node("a"), vec![]), (node("b"), vec![]), (node("c"), vec![])],
        vec![fits, huge],
    );
    let d = decide(&s, &DecideOptions::default());
    assert_eq!(
        decided(&d),
        [(Reason::Empty, "b".to_string()), (Reason::Empty, "c".to_string())],
        "{d:#?}"
    );
    let Some(Held::Nominated(n)) = held(&d, "a") else {
        panic!("a is held by its nomination: {:?}", d.blocked)
    };
    assert_eq!((n.pod.as_str(), n.pods, n.until), ("default/fits", 1, None));
    assert_eq!(
        Held::Nominated(n).to_string(),
        "node is nominated for pending pod default/fits"
    );
    assert_eq!(
        d.blocked.len(),
        1,
        "the pod that fits nowhere holds nothing: {:?}",
        d.blocked
    );
    assert!(
        d.decisions.iter().all(|x| x.moves.is_empty()),
        "pending pods are not moves"
    );
}

#[test]
fn a_pending_pod_that_fits_nowhere_holds_nothing_back() {
    let s = snapshot(
        &["m.xlarge"],
        vec![(node("a"), vec![]), (node("b"), vec![])],
        vec![web("huge", "100", json!({}))],
    );
    let d = decide(&s, &DecideOptions::default());
    assert_eq!(
        decided(&d),
        [(Reason::Empty, "a".to_string()), (Reason::Empty, "b".to_string())]
    );
    assert!(d.blocked.is_empty(), "{:?}", d.blocked);
}

#[test]
fn a_removal_that_would_strand_a_pending_pod_on_a_node_is_refused() {
    // p (3 cpu) fits only on b (1 of 4 used). Without p, a's 3-cpu pod would
    // move to b and a would go; then p would fit nowhere. The pool launches
    // only a's own type, so a cannot be replaced either.
    let s = snapshot(
        &["m.xlarge"],
        vec![
            (node("a"), vec![web("w-a", "3", on("a"))]),
            (node("b"), vec![web("w-b", "1", on("b"))]),
        ],
        vec![web("p", "3", json!({}))],
    );
    let d = decide(&s, &DecideOptions::default());
    assert_eq!(decided(&d), [], "{d:#?}");
    assert!(matches!(held(&d, "b"), Some(Held::Nominated(_))), "{:?}", d.blocked);
    assert!(
        matches!(held(&d, "a"), Some(Held::Unconsolidatable(_))),
        "{:?}",
        d.blocked
    );
}

/// A Launched m.xlarge claim of the default pool with no node yet.
fn in_flight(name: &str) -> NodeClaim {
    NodeClaim {
        resources: crate::resources::Resources::parse([("cpu", "1"), ("pods", "1")]).unwrap(),
        instance_type_options: vec!["m.xlarge".into()],
        phase: Phase::Launched,
        zone: Some("test-zone-a".into()),
        capacity_type: Some("on-demand".into()),
        ..NodeClaim::pending(name, "default", "default")
    }
}

#[test]
fn pending_pods_keep_the_room_they_were_given_on_an_in_flight_claim() {
    // p (3500m) fits only on the in-flight claim; without it, a's 3-cpu pod
    // would move there and a would go.
    let mut s = snapshot(
        &["m.xlarge"],
        vec![(node("a"), vec![web("w-a", "3", on("a"))])],
        vec![web("p", "3500m", json!({}))],
    );
    s.node_claims = vec![in_flight("default-infl1")];
    let d = decide(&s, &DecideOptions::default());
    assert_eq!(decided(&d), [], "{d:#?}");
    assert!(
        matches!(held(&d, "a"), Some(Held::Unconsolidatable(_))),
        "{:?}",
        d.blocked
    );
    // Without the pending pod, a goes onto the claim.
    s.pods.clear();
    let d = decide(&s, &DecideOptions::default());
    assert_eq!(decided(&d), [(Reason::Underutilized, "a".to_string())]);
    assert_eq!(d.decisions[0].moves[0].to, "default-infl1");
}

#[test]
fn a_recorded_nomination_spares_its_node_from_voluntary_methods_only_while_pods_are_pending() {
    let until: Timestamp = "2026-03-01T12:00:20Z".parse().unwrap();
    let nomination = Nomination {
        pod: "default/gone".into(),
        pods: 2,
        until: Some(until),
    };
    let mut expiring = consolidating(&["m.xlarge"]);
    expiring.spec.template.spec.expire_after = serde_json::from_value(json!("1h")).unwrap();
    // Some pod is still pending (one that fits nowhere, so this pass nominates nothing itself).
    let mut s = snapshot(
        &["m.xlarge"],
        vec![(node("a"), vec![]), (node("b"), vec![])],
        vec![web("huge", "100", json!({}))],
    );
    let options = DecideOptions {
        nominated: [("a".to_string(), nomination.clone())].into(),
        ..DecideOptions::default()
    };
    let d = decide(&s, &options);
    assert_eq!(decided(&d), [(Reason::Empty, "b".to_string())]);
    assert_eq!(
        held(&d, "a").map(|h| h.to_string()).as_deref(),
        Some("node is nominated for pending pod default/gone and 1 more by provisioning, until 2026-03-01T12:00:20Z")
    );
    // With no pod pending any more (all bound, or gone), the room is no longer
    // wanted: the recorded nomination holds nothing before its expiry.
    let mut none_pending = s.clone();
    none_pending.pods.clear();
    let d = decide(&none_pending, &options);
    assert_eq!(
        decided(&d),
        [(Reason::Empty, "a".to_string()), (Reason::Empty, "b".to_string())]
    );
    // Expiry is forceful: a nomination does not keep an expired node.
    s.node_pools = vec![expiring];
    let d = decide(&s, &options);
    assert!(decided(&d).contains(&(Reason::Expired, "a".to_string())), "{d:#?}");
    assert!(held(&d, "a").is_none());
}

#[test]
fn a_solve_nominates_each_existing_node_and_claim_it_fills_until_the_window_ends() {
    let r = |n: &str| PodRef {
        namespace: "default".into(),
        name: n.into(),
    };
    let plan = Plan {
        node_claims: vec![],
        existing: vec![
            ExistingPlacement {
                name: "node-a".into(),
                kind: TargetKind::Node,
                pods: vec![r("z"), r("y")],
            },
            ExistingPlacement {
                name: "default-infl1".into(),
                kind: TargetKind::NodeClaim,
                pods: vec![r("x")],
            },
            ExistingPlacement {
                name: "node-b".into(),
                kind: TargetKind::Node,
                pods: vec![],
            },
        ],
        unschedulable: vec![],
        warnings: vec![],
    };
    let got = records(&plan, now(), Duration::from_secs(20));
    let until = now().as_millisecond() + 20_000;
    assert_eq!(
        got,
        [
            NominationRecord {
                target: "node-a".into(),
                kind: TargetKind::Node,
                pod: "default/y".into(),
                pods: 2,
                until_ms: until,
            },
            NominationRecord {
                target: "default-infl1".into(),
                kind: TargetKind::NodeClaim,
                pod: "default/x".into(),
                pods: 1,
                until_ms: until,
            },
        ]
    );
    // Live: a claim's nomination follows it to its node; at the window's end it is gone.
    let mut claim = in_flight("default-infl1");
    claim.node_name = Some("node-c".into());
    let at = |ms: i64| Timestamp::from_millisecond(ms).unwrap();
    let nodes: Vec<String> = live(&got, &[claim.clone()], at(until - 1)).into_keys().collect();
    assert_eq!(nodes, ["node-a", "node-c"]);
    assert!(live(&got, &[claim], at(until)).is_empty());
    assert_eq!(
        live(&got, &[], at(until - 1)).into_keys().collect::<Vec<_>>(),
        ["node-a"],
        "a claim with no node yet nominates nothing a pass could take"
    );
}
