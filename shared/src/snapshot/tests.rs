//! The snapshot as the solver's one input, and what-if solves over one compilation.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;

use super::*;
use crate::scheduling::compile::COMPILATIONS;
use crate::scheduling::fixtures::{self, catalog, default_pool, managed_node, merge, pod};
use crate::scheduling::{PlacementFailure, Plan, Rejection, SolveOptions, TargetKind};

fn now() -> Timestamp {
    "2026-03-01T12:00:00Z".parse().unwrap()
}

fn node(name: &str) -> Node {
    managed_node(name)
}

/// A pod of a ReplicaSet running on `node`.
fn web(name: &str, node: &str, cpu: &str) -> Pod {
    pod(
        name,
        cpu,
        "1Gi",
        json!({"metadata": {"labels": {"app": "web"}, "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": "u", "controller": true}]},
            "spec": {"nodeName": node}}),
    )
}

/// A DaemonSet's pod on `node`: it never moves.
fn daemon(node: &str) -> Pod {
    let mut v = serde_json::to_value(pod(&format!("agent-{node}"), "100m", "100Mi", json!({}))).unwrap();
    merge(
        &mut v,
        json!({"metadata": {"ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "d", "controller": true}]},
            "spec": {"nodeName": node}}),
    );
    serde_json::from_value(v).unwrap()
}

/// Four managed nodes: n1 and n2 lightly used (1 cpu of web each plus an
/// agent), n3 and n4 with 2 cpu of web each.
fn cluster() -> Snapshot {
    let mut s = Snapshot::new(Arc::new(catalog()), now());
    s.node_pools = vec![default_pool()];
    s.nodes = vec![
        ExistingNode {
            node: node("n1"),
            pods: vec![web("web-a", "n1", "1"), daemon("n1")],
        },
        ExistingNode {
            node: node("n2"),
            pods: vec![web("web-b", "n2", "1"), daemon("n2")],
        },
        ExistingNode {
            node: node("n3"),
            pods: vec![web("web-c", "n3", "2")],
        },
        ExistingNode {
            node: node("n4"),
            pods: vec![web("web-d", "n4", "2")],
        },
    ];
    s
}

fn moved_to(plan: &Plan) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = plan
        .existing
        .iter()
        .flat_map(|e| e.pods.iter().map(|p| (p.to_string(), e.name.clone())))
        .collect();
    out.extend(
        plan.node_claims
            .iter()
            .flat_map(|c| c.pods.iter().map(|p| (p.to_string(), c.node_pool.clone()))),
    );
    out.sort();
    out
}

#[test]
fn what_if_two_nodes_are_removed_places_their_pods_on_the_rest_without_recompiling() {
    let s = cluster();
    let before = COMPILATIONS.with(|c| c.get());
    let compiled = s.compile();

    // Nothing pending: the plan is empty.
    let plain = compiled.solve(&SolveOptions::default());
    assert!(plain.node_claims.is_empty() && plain.existing.is_empty() && plain.unschedulable.is_empty());

    // n1 and n2 gone, existing capacity only: their web pods move to n3/n4,
    // their DaemonSet pods go with them.
    let what_if = SolveOptions {
        new_claims: false,
        ..SolveOptions::without(["n1", "n2"])
    };
    let plan = compiled.solve(&what_if);
    assert!(plan.unschedulable.is_empty(), "{:?}", plan.unschedulable);
    assert!(plan.node_claims.is_empty());
    let moves = moved_to(&plan);
    assert_eq!(moves.len(), 2, "{moves:?}");
    for (pod, target) in &moves {
        assert!(pod.starts_with("default/web-"), "{pod}");
        assert!(target == "n3" || target == "n4", "{pod} went to {target}");
    }
    assert!(plan.existing.iter().all(|e| e.kind == TargetKind::Node));

    // A third question of the same compilation: with three nodes gone, n4's
    // 2 free cpu take the largest pod first (first-fit-decreasing) and the
    // other two need new capacity, which this what-if forbids.
    let three = SolveOptions {
        new_claims: false,
        ..SolveOptions::without(["n1", "n2", "n3"])
    };
    let plan = compiled.solve(&three);
    assert_eq!(moved_to(&plan), [("default/web-c".to_string(), "n4".to_string())]);
    assert_eq!(plan.unschedulable.len(), 2, "{plan:#?}");
    for u in &plan.unschedulable {
        assert!(u.reason.needs_new_capacity(), "{}", u.reason);
        assert!(
            matches!(&u.reason, PlacementFailure::Pools(r) if r[0].why == Rejection::NewClaimsForbidden),
            "{:?}",
            u.reason
        );
    }

    let after = COMPILATIONS.with(|c| c.get());
    assert_eq!(after - before, 1, "three solves, one compilation");
}

#[test]
fn what_if_with_new_capacity_respects_the_price_ceiling() {
    let s = cluster();
    let compiled = s.compile();
    let removed = ["n1", "n2", "n3", "n4"];
    // All four nodes gone: 6 cpu of web needs new capacity.
    let open = compiled.solve(&SolveOptions::without(removed));
    assert!(open.unschedulable.is_empty(), "{:?}", open.unschedulable);
    assert!(!open.node_claims.is_empty());
    // Below the cheapest type's price nothing can be bought: the reason says so.
    let capped = compiled.solve(&SolveOptions {
        price_below: Some(0.01),
        ..SolveOptions::without(removed)
    });
    assert_eq!(capped.unschedulable.len(), 4, "{capped:#?}");
    assert!(capped.unschedulable.iter().all(|u| {
        matches!(&u.reason, PlacementFailure::Pools(r) if r.iter().all(|p| p.why == Rejection::PriceCeiling))
    }));
    // A ceiling between types keeps only the cheaper ones.
    let mid = compiled.solve(&SolveOptions {
        price_below: Some(0.1),
        ..SolveOptions::without(removed)
    });
    assert!(mid.unschedulable.is_empty(), "{:?}", mid.unschedulable);
    for c in &mid.node_claims {
        for t in &c.instance_type_options {
            let cheapest = s
                .catalog
                .instance_types
                .iter()
                .find(|i| &i.name == t)
                .and_then(|i| i.offerings.iter().map(|o| o.price).reduce(f64::min))
                .unwrap();
            assert!(cheapest < 0.1, "{t} costs {cheapest}");
        }
    }
}

#[test]
fn removed_nodes_free_their_pools_limits() {
    let mut s = cluster();
    // The pool is at its limit of four nodes: nothing new can open...
    s.node_pools = vec![fixtures::pool(
        "default",
        "limits: {nodes: 4}\ntemplate:\n  spec:\n    nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}",
    )];
    s.pods = vec![pod("big", "3500m", "1Gi", json!({}))];
    let compiled = s.compile();
    let plan = compiled.solve(&SolveOptions::default());
    assert_eq!(plan.unschedulable.len(), 1);
    assert!(matches!(&plan.unschedulable[0].reason, PlacementFailure::Pools(r) if r[0].why == Rejection::Limits));
    // ...until one node is taken away in a what-if.
    let plan = compiled.solve(&SolveOptions::without(["n4"]));
    assert!(plan.unschedulable.is_empty(), "{:?}", plan.unschedulable);
    let pods: BTreeSet<String> = moved_to(&plan).into_iter().map(|(p, _)| p).collect();
    assert!(
        pods.contains("default/big") && pods.contains("default/web-d"),
        "{pods:?}"
    );
}

#[test]
fn a_planned_node_becomes_a_claim_created_now() {
    let mut s = cluster();
    s.nodes.clear();
    s.pods = vec![pod("p", "1", "1Gi", json!({}))];
    let plan = s.compile().solve(&SolveOptions::default());
    let claim = s.node_claim(&plan.node_claims[0]);
    assert_eq!(claim.timestamps.created, Some(now()));
    // Stamped with the pool's drift hash; no EC2NodeClass in this snapshot, no class hash.
    assert_eq!(claim.nodepool_hash, Some(default_pool().hash()));
    assert_eq!(claim.nodeclass_hash, None);
    s.node_classes = vec![serde_json::from_value(json!({
        "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "default"},
        "spec": {"role": "KarpenterNodeRole-test", "amiSelectorTerms": [{"alias": "al2023@latest"}],
                 "subnetSelectorTerms": [{"tags": {"k": "v"}}], "securityGroupSelectorTerms": [{"tags": {"k": "v"}}]}
    }))
    .unwrap()];
    let claim = s.node_claim(&plan.node_claims[0]);
    assert_eq!(claim.nodeclass_hash, Some(s.node_classes[0].hash()));
    assert_eq!(claim.phase, crate::nodeclaim::Phase::Pending);
    let types = claim.requirements().get(crate::labels::INSTANCE_TYPE).cloned().unwrap();
    assert!(plan.node_claims[0].instance_type_options.iter().all(|t| types.has(t)));
}

/// A node that has just registered for claim `c`, as a real one does: not
/// ready, tainted not-ready, uninitialized, unregistered and with the pool's
/// startup taint, advertising no GPU yet.
fn registering_node(name: &str, instance: &str) -> Node {
    let mut n = node(name);
    n.spec = Some(
        serde_json::from_value(json!({
            "providerID": format!("aws:///test-zone-a/{instance}"),
            "taints": [
                {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
                {"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"},
                {"key": "karpenter.sh/unregistered", "effect": "NoExecute"},
                {"key": "example.com/cni-starting", "effect": "NoSchedule"}
            ]
        }))
        .unwrap(),
    );
    n
}

fn registering_claim(phase: crate::nodeclaim::Phase) -> crate::nodeclaim::NodeClaim {
    crate::nodeclaim::NodeClaim {
        phase,
        instance_id: Some("i-1".into()),
        provider_id: Some("aws:///test-zone-a/i-1".into()),
        instance_type: Some("m.xlarge".into()),
        zone: Some("test-zone-a".into()),
        capacity_type: Some("on-demand".into()),
        instance_type_options: vec!["m.xlarge".into()],
        startup_taints: vec![crate::apis::Taint::new(
            "example.com/cni-starting",
            None,
            crate::apis::TaintEffect::NoSchedule,
        )],
        ..crate::nodeclaim::NodeClaim::pending("default-abcde", "default", "default")
    }
}

#[test]
fn pods_waiting_for_a_registering_node_do_not_launch_a_second_one() {
    use crate::nodeclaim::Phase;
    for phase in [Phase::Launched, Phase::Registered] {
        let claims = vec![registering_claim(phase)];
        let mut s = Snapshot::new(Arc::new(catalog()), now());
        s.node_pools = vec![default_pool()];
        let nodes = live::initializing_as_claimed(vec![registering_node("ip-10-0-0-1", "i-1")], &claims, &s.catalog);
        s.nodes = live::existing_nodes(nodes, Vec::new());
        s.node_claims = live::in_flight(claims, &s.nodes);
        assert!(s.node_claims.is_empty(), "the claim is counted as its node");
        s.pods = (0..3).map(|i| pod(&format!("p{i}"), "1", "1Gi", json!({}))).collect();
        let plan = s.compile().solve(&SolveOptions::default());
        assert!(
            plan.node_claims.is_empty(),
            "{phase:?}: a second node was planned: {plan:?}"
        );
        assert_eq!(plan.existing.len(), 1, "{plan:?}");
        assert_eq!(plan.existing[0].name, "ip-10-0-0-1");
        assert_eq!(plan.existing[0].pods.len(), 3);
    }
}

#[test]
fn an_initialized_node_is_seen_as_it_is() {
    let claims = vec![registering_claim(crate::nodeclaim::Phase::Initialized)];
    let nodes = live::initializing_as_claimed(vec![registering_node("ip-10-0-0-1", "i-1")], &claims, &catalog());
    let taints = nodes[0]
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map_or(0, Vec::len);
    assert_eq!(taints, 4, "an initialized node's taints are real");
}

#[test]
fn registering_nodes_keep_their_template_and_disruption_taints() {
    let mut claim = registering_claim(crate::nodeclaim::Phase::Registered);
    claim.taints = vec![crate::apis::Taint::new(
        "dedicated",
        Some("gpu"),
        crate::apis::TaintEffect::NoSchedule,
    )];
    let mut n = registering_node("ip-10-0-0-1", "i-1");
    n.spec
        .as_mut()
        .unwrap()
        .taints
        .as_mut()
        .unwrap()
        .push(serde_json::from_value(json!({"key": "karpenter.sh/disrupted", "effect": "NoSchedule"})).unwrap());
    n.status.as_mut().unwrap().allocatable.as_mut().unwrap().remove("pods");
    let nodes = live::initializing_as_claimed(vec![n], &[claim], &catalog());
    let keys: BTreeSet<String> = nodes[0]
        .spec
        .as_ref()
        .unwrap()
        .taints
        .as_ref()
        .unwrap()
        .iter()
        .map(|t| t.key.clone())
        .collect();
    assert_eq!(
        keys,
        BTreeSet::from(["dedicated".to_string(), "karpenter.sh/disrupted".to_string()])
    );
    let alloc = nodes[0].status.as_ref().unwrap().allocatable.as_ref().unwrap();
    assert!(
        alloc.contains_key("pods"),
        "missing resources come from the launched type: {alloc:?}"
    );
    assert_eq!(
        alloc["cpu"].0, "4",
        "advertised resources stay as the node reports them"
    );
}

#[test]
fn pools_of_a_class_that_is_not_ready_launch_nothing() {
    let class = |ready: Option<&str>| -> crate::apis::EC2NodeClass {
        let mut v = json!({
            "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "default"},
            "spec": {"role": "R", "amiSelectorTerms": [{"alias": "al2023@latest"}],
                     "subnetSelectorTerms": [{"tags": {"k": "v"}}], "securityGroupSelectorTerms": [{"tags": {"k": "v"}}]}
        });
        if let Some(status) = ready {
            let reason = if status == "True" { "Ready" } else { "SubnetsNotFound" };
            v["status"] = json!({"conditions": [{"type": "Ready", "status": status, "reason": reason,
                "message": "subnetSelectorTerms select no subnets", "lastTransitionTime": "2026-03-01T12:00:00Z"}]});
        }
        serde_json::from_value(v).unwrap()
    };
    for (ready, launches) in [(None, true), (Some("True"), true), (Some("False"), false)] {
        let mut s = cluster();
        s.nodes.clear();
        s.pods = vec![pod("p", "1", "1Gi", json!({}))];
        s.node_classes = vec![class(ready)];
        let left_out = s.without_unready_pools();
        let plan = s.compile().solve(&SolveOptions::default());
        assert_eq!(plan.node_claims.is_empty(), !launches, "Ready={ready:?}: {plan:?}");
        if launches {
            assert!(left_out.is_empty());
        } else {
            assert_eq!(
                left_out,
                vec![(
                    "default".to_string(),
                    "SubnetsNotFound: subnetSelectorTerms select no subnets".to_string()
                )]
            );
            assert_eq!(plan.unschedulable.len(), 1);
        }
    }
}
