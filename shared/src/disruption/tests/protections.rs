//! Protections: a pool-wide do-not-disrupt written onto its nodes,
//! do-not-disrupt durations on pods and nodes, and drift and expiry going
//! past do-not-disrupt pods and PDBs when a terminationGracePeriod bounds them.

use super::*;

/// One pass as the sweep decides it: a pool's terminationGracePeriod bounds drift and expiry.
fn run_bounded(s: &Snapshot) -> Decisions {
    let options = DecideOptions {
        grace_period_bounds_eventual: true,
        ..DecideOptions::default()
    };
    decide(s, &options)
}

/// A drifted node `n` with `pods` beside a spare node, in a pool with `extra`
/// spec lines, and the decisions of one pass.
fn drift_with(extra: &str, node_extra: Value, pods: Vec<Pod>, pdbs: Vec<PodDisruptionBudget>) -> Decisions {
    let p = pool_with(&format!(
        "{extra}disruption:\n  consolidationPolicy: WhenEmpty\n  budgets: [{{nodes: '100%'}}]\n"
    ));
    let mut stamp = stamped(&p, Some("0000000000000000"), crate::apis::NODEPOOL_HASH_VERSION);
    merge(&mut stamp, node_extra);
    let mut s = snapshot(
        p,
        vec![
            (node("n", 1.0, stamp), pods),
            (node("spare", 1.0, json!({})), vec![web("w-9", "spare", "other", 1.0)]),
        ],
    );
    s.pod_disruption_budgets = pdbs;
    run_bounded(&s)
}

fn annotated(name: &str, value: &str, started: Option<f64>) -> Pod {
    let mut p = web(name, "n", "web", 6.0);
    merge_meta(&mut p, json!({"annotations": {"karpenter.sh/do-not-disrupt": value}}));
    if let Some(h) = started {
        let mut v = serde_json::to_value(&p).unwrap();
        merge(&mut v, json!({"status": {"startTime": ago(h)}}));
        p = serde_json::from_value(v).unwrap();
    }
    p
}

#[test]
fn a_pool_wide_do_not_disrupt_annotation_reaches_the_claim_and_the_node() {
    let p = pool(
        "default",
        "template:\n  metadata:\n    labels: {team: web}\n    annotations: {karpenter.sh/do-not-disrupt: 'true', example.com/owner: ops}\n  spec:\n    nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}\n    terminationGracePeriod: 1h\n",
    );
    let mut s = snapshot(p.clone(), vec![]);
    s.pods = vec![pod("p", "1", "1Gi", json!({}))];
    let plan = s.compile().solve(&crate::scheduling::SolveOptions::default());
    let claim = s.node_claim(&plan.node_claims[0]);
    assert_eq!(
        claim.termination_grace_period,
        crate::apis::NillableDuration::parse("1h").ok()
    );
    let update = crate::registration::registration_update(&claim, Some(s.catalog.as_ref()));
    assert_eq!(
        update
            .annotations
            .get("karpenter.sh/do-not-disrupt")
            .map(String::as_str),
        Some("true"),
        "{update:?}"
    );
    assert_eq!(
        update.annotations.get("example.com/owner").map(String::as_str),
        Some("ops")
    );
    assert_eq!(update.labels.get("team").map(String::as_str), Some("web"));

    // The node as registration leaves it is protected from drift.
    let written = json!({"metadata": {"annotations": update.annotations}});
    let d = drift_with("", written, vec![web("w-0", "n", "web", 1.0)], vec![]);
    assert!(decided(&d).is_empty(), "{d:#?}");
    assert_eq!(held(&d, "n"), Some(Held::DoNotDisruptNode));
}

/// A pod's annotation value and when it started (hours ago; None: no startTime).
type PodAsk = Option<(&'static str, Option<f64>)>;

#[test]
fn do_not_disrupt_durations_on_pods_and_nodes() {
    let w0 = PodRef::of(&web("w-0", "n", "web", 1.0));
    // (what, node annotation, pod annotation and start (hours ago), held?)
    let cases: Vec<(&str, Option<&str>, PodAsk, Option<Held>)> = vec![
        (
            "pod true",
            None,
            Some(("true", Some(100.0))),
            Some(Held::DoNotDisruptPod(w0.clone())),
        ),
        (
            "pod 4h, started 1h ago",
            None,
            Some(("4h", Some(1.0))),
            Some(Held::DoNotDisruptPod(w0.clone())),
        ),
        ("pod 4h, started 5h ago", None, Some(("4h", Some(5.0))), None),
        (
            "pod 1h30m, started 1h ago",
            None,
            Some(("1h30m", Some(1.0))),
            Some(Held::DoNotDisruptPod(w0.clone())),
        ),
        // No startTime: counted from its creation, 6h ago.
        ("pod 4h, created 6h ago", None, Some(("4h", None)), None),
        (
            "pod 8h, created 6h ago",
            None,
            Some(("8h", None)),
            Some(Held::DoNotDisruptPod(w0.clone())),
        ),
        ("pod false", None, Some(("false", Some(1.0))), None),
        ("pod 0s", None, Some(("0s", Some(1.0))), None),
        ("pod unreadable", None, Some(("a while", Some(1.0))), None),
        // The node was created 1h ago.
        ("node true", Some("true"), None, Some(Held::DoNotDisruptNode)),
        ("node 4h", Some("4h"), None, Some(Held::DoNotDisruptNode)),
        ("node 30m", Some("30m"), None, None),
        ("node false", Some("false"), None, None),
    ];
    for (what, node_ann, pod_ann, want) in cases {
        let node_extra = match node_ann {
            Some(v) => json!({"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": v}}}),
            None => json!({}),
        };
        let pod = match pod_ann {
            Some((v, started)) => annotated("w-0", v, started),
            None => web("w-0", "n", "web", 1.0),
        };
        let d = drift_with("", node_extra, vec![pod], vec![]);
        assert_eq!(held(&d, "n"), want, "{what}: {d:#?}");
        assert_eq!(
            decided(&d).contains(&(Reason::Drifted, "n".to_string())),
            want.is_none(),
            "{what}"
        );
    }
}

#[test]
fn a_termination_grace_period_lets_drift_and_expiry_past_do_not_disrupt_pods_and_pdbs() {
    let tgp = "    terminationGracePeriod: 1h\n";
    let dnd = || vec![annotated("w-0", "true", Some(1.0))];
    let blocking = || vec![pdb("web", "web", json!(0))];
    let plain = || vec![web("w-0", "n", "web", 1.0)];
    // Without one, both hold drift (today's rule).
    let d = drift_with("", json!({}), dnd(), vec![]);
    assert!(matches!(held(&d, "n"), Some(Held::DoNotDisruptPod(_))), "{d:#?}");
    let d = drift_with("", json!({}), plain(), blocking());
    assert!(matches!(held(&d, "n"), Some(Held::Pdb { .. })), "{d:#?}");
    // With one, drift goes ahead: the drain ends by the deadline anyway.
    for (what, pods, pdbs) in [("do-not-disrupt pod", dnd(), vec![]), ("PDB", plain(), blocking())] {
        let d = drift_with(tgp, json!({}), pods, pdbs);
        assert_eq!(decided(&d), [(Reason::Drifted, "n".to_string())], "{what}: {d:#?}");
    }
    // The node's own annotation still holds it (Karpenter's node-level control).
    let d = drift_with(
        tgp,
        json!({"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "true"}}}),
        plain(),
        vec![],
    );
    assert_eq!(held(&d, "n"), Some(Held::DoNotDisruptNode));

    // Expiry: a blocking PDB holds it without a grace period, not with one.
    let expiring = |extra: &str| {
        let mut s = snapshot(
            pool_with(&format!(
                "    expireAfter: 1h\n{extra}disruption:\n  consolidationPolicy: WhenEmpty\n"
            )),
            vec![
                (node("n", 2.0, json!({})), plain()),
                (node("spare", 0.5, json!({})), vec![]),
            ],
        );
        s.pod_disruption_budgets = blocking();
        run_bounded(&s)
    };
    assert!(matches!(held(&expiring(""), "n"), Some(Held::Pdb { .. })));
    assert_eq!(decided(&expiring(tgp)), [(Reason::Expired, "n".to_string())]);

    // Consolidation is never bounded that way: the PDB still holds it.
    let s = {
        let mut s = snapshot(
            pool_with(&format!(
                "{tgp}disruption:\n  consolidationPolicy: WhenEmptyOrUnderutilized\n  consolidateAfter: 0s\n"
            )),
            vec![
                (node("n", 2.0, json!({})), plain()),
                (node("spare", 2.0, json!({})), vec![web("w-9", "spare", "other", 1.0)]),
            ],
        );
        s.pod_disruption_budgets = blocking();
        s
    };
    let d = run_bounded(&s);
    assert!(
        !decided(&d).contains(&(Reason::Underutilized, "n".to_string())),
        "{d:#?}"
    );
}
