use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::disruption::Reason;
use crate::nodeclaim::Phase;
use crate::scheduling::ExistingNode;
use crate::scheduling::fixtures::{catalog, default_pool, managed_node, pod as fixture_pod, pool};
use crate::state::DisruptionStep;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn now() -> Result<Timestamp, jiff::Error> {
    "2026-11-28T12:00:00Z".parse()
}

/// A controlled 1-cpu pod bound to `node`.
fn bound(name: &str, node: &str) -> k8s_openapi::api::core::v1::Pod {
    fixture_pod(
        name,
        "1",
        "1Gi",
        json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "rs", "controller": true}]},
               "spec": {"nodeName": node}}),
    )
}

/// One managed node `n1` (annotated with `annotations`) running one pod, its claim, the default pool.
fn input(annotations: serde_json::Value) -> Result<NodeInput, Box<dyn std::error::Error>> {
    let mut node = serde_json::to_value(managed_node("n1"))?;
    node["metadata"]["annotations"] = annotations;
    let mut snapshot = Snapshot::new(Arc::new(catalog()), now()?);
    snapshot.node_pools = vec![pool(
        "default",
        "template:\n  spec:\n    nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}\ndisruption:\n  consolidateAfter: Never",
    )];
    snapshot.nodes = vec![ExistingNode {
        node: serde_json::from_value(node)?,
        pods: vec![bound("web-0", "n1")],
    }];
    let claim = NodeClaim {
        phase: Phase::Initialized,
        node_name: Some("n1".into()),
        ..NodeClaim::pending("default-abcde", "default", "default")
    };
    Ok(NodeInput {
        snapshot,
        claims: vec![claim],
        records: Vec::new(),
        options: DecideOptions::default(),
    })
}

#[test]
fn subjects_are_named_as_kubectl_names_them() {
    let pod = |ns: &str, n: &str| {
        Subject::Pod(PodRef {
            namespace: ns.into(),
            name: n.into(),
        })
    };
    for (text, want) in [
        ("node/ip-10-0-1-5", Ok(Subject::Node("ip-10-0-1-5".into()))),
        ("no/n1", Ok(Subject::Node("n1".into()))),
        ("pod/web/api-0", Ok(pod("web", "api-0"))),
        ("pod/api-0", Ok(pod("default", "api-0"))),
        ("pods/web/api-0", Ok(pod("web", "api-0"))),
        ("node/", Err(BadSubject("node/".into()))),
        ("deployment/web", Err(BadSubject("deployment/web".into()))),
        ("ip-10-0-1-5", Err(BadSubject("ip-10-0-1-5".into()))),
        ("pod/a/b/c", Err(BadSubject("pod/a/b/c".into()))),
    ] {
        assert_eq!(text.parse::<Subject>(), want, "{text}");
    }
}

#[test]
fn a_node_is_explained_by_the_rule_the_pass_applies_to_it() -> TestResult {
    let rotate = |extra: serde_json::Value| {
        let mut a = json!({crate::labels::ROTATE_ANNOTATION: "2026-11-28T11:00:00Z"});
        crate::scheduling::fixtures::merge(&mut a, extra);
        a
    };
    // Marked for rotation: drift takes it (its pod fits nowhere else: a replacement first).
    let e = node("n1", &input(rotate(json!({})))?);
    assert_eq!(e.verdict, "would be disrupted by the next sweep: Drifted", "{e:?}");
    assert!(e.details.iter().any(|d| d.starts_with("replacement first: ")), "{e:?}");
    assert_eq!(e.not_evaluated.len(), 2, "what needs EC2 is said to be left out");
    // The same, but the node says do-not-disrupt.
    let e = node("n1", &input(rotate(json!({"karpenter.sh/do-not-disrupt": "true"})))?);
    assert_eq!(e.verdict, "held: node has karpenter.sh/do-not-disrupt", "{e:?}");
    // Nothing wants it: consolidation is off for the pool.
    let e = node("n1", &input(json!({}))?);
    assert_eq!(e.verdict, "held: consolidateAfter is Never", "{e:?}");
    // A disruption in progress is reported as it stands.
    let mut i = input(json!({}))?;
    i.records.push(DisruptionRecord {
        claim: "default-abcde".into(),
        node: "n1".into(),
        reason: Reason::Expired,
        detail: "older than expireAfter 720h".into(),
        step: DisruptionStep::Launching,
        replacements: vec!["default-fghij".into()],
        grace_ms: None,
        force_from_ms: None,
        started_ms: 0,
        version: 0,
    });
    let e = node("n1", &i);
    assert_eq!(e.verdict, "being disrupted: Expired (older than expireAfter 720h)");
    assert_eq!(
        e.details[1..],
        ["step Launching".to_string(), "replacements: default-fghij".to_string()]
    );
    // Not nodesmith's, or not there.
    let mut i = input(json!({}))?;
    i.claims.clear();
    assert_eq!(
        node("n1", &i).verdict,
        "not a nodesmith node: nodesmith never disrupts it"
    );
    assert_eq!(node("n9", &i).verdict, "no such node");
    Ok(())
}

#[test]
fn a_pending_pod_is_explained_by_the_solve() -> TestResult {
    let mut snapshot = Snapshot::new(Arc::new(catalog()), now()?);
    snapshot.node_pools = vec![default_pool()];
    snapshot.pods = vec![
        fixture_pod("small", "1", "1Gi", json!({})),
        fixture_pod("huge", "4000", "1Gi", json!({})),
    ];
    let plan = snapshot.compile().solve(&SolveOptions::default());
    let of = |n: &str| PodRef {
        namespace: "default".into(),
        name: n.into(),
    };
    let small = &snapshot.pods[0];
    let e = pod(&of("small"), &snapshot, &plan, Some(small));
    assert_eq!(e.verdict, "needs a new node: NodePool default", "{e:?}");
    assert!(e.details[0].starts_with("cheapest: "), "{e:?}");
    let e = pod(&of("huge"), &snapshot, &plan, Some(&snapshot.pods[1]));
    assert!(e.verdict.starts_with("cannot be scheduled: "), "{e:?}");
    let bound = bound("small", "n1");
    assert_eq!(
        pod(&of("small"), &snapshot, &plan, Some(&bound)).verdict,
        "not pending: bound to node n1"
    );
    assert_eq!(pod(&of("gone"), &snapshot, &plan, None).verdict, "no such pod");
    // Unbound, but not among the pods nodesmith solves for (not marked Unschedulable yet).
    let waiting = fixture_pod("waiting", "1", "1Gi", json!({}));
    let e = pod(&of("waiting"), &snapshot, &plan, Some(&waiting));
    assert!(
        e.verdict
            .starts_with("not pending for nodesmith: the kube-scheduler has not marked it Unschedulable"),
        "{e:?}"
    );
    Ok(())
}
