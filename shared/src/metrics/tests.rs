use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use serde_json::json;

use super::*;
use crate::apis::nodepool::NodePoolSpec;
use crate::kubernetes::NodeUpdate;
use crate::lifecycle::Removal;
use crate::quantity::Quantity;
use crate::telemetry::value;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn claim(name: &str, pool: &str, capacity_type: &str, node: Option<&str>, price: f64) -> NodeClaim {
    let mut c = NodeClaim::pending(name, pool, "default");
    c.instance_id = Some(format!("i-{name}"));
    c.capacity_type = Some(capacity_type.into());
    c.price = Some(price);
    c.node_name = node.map(str::to_string);
    c
}

fn node(name: &str, cpu: &str) -> Result<Node, serde_json::Error> {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "status": {"capacity": {"cpu": cpu, "memory": "8Gi", "pods": "29"}}
    }))
}

fn pool(name: &str, limits: serde_json::Value) -> Result<NodePool, serde_json::Error> {
    let spec: NodePoolSpec = serde_json::from_value(json!({
        "template": {"spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}}},
        "limits": limits,
    }))?;
    Ok(NodePool::new(name, spec))
}

fn register(claim: &str, node: &str) -> Action {
    Action::Register {
        claim: claim.into(),
        node: node.into(),
        update: NodeUpdate::default(),
    }
}

fn remove(claim: &str, node: Option<&str>) -> Action {
    Action::Remove {
        claim: claim.into(),
        reason: Removal::InstanceGone,
        instance: None,
        node: node.map(str::to_string),
    }
}

#[test]
fn the_fleet_is_priced_counted_by_pool_and_capacity_type_and_measured_against_limits() -> TestResult {
    let a = claim("a", "general", "spot", Some("n-a"), 0.1);
    let b = claim("b", "general", "on-demand", Some("n-b"), 0.4);
    let c = claim("c", "gpu", "spot", None, 1.0);
    let mut planned = NodeClaim::pending("d", "gpu", "default");
    planned.price = Some(9.0);
    let nodes = [node("n-a", "2")?, node("n-b", "4")?];
    let pools = [pool("general", json!({"cpu": "100"}))?, pool("gpu", json!({}))?];
    let claims = [&a, &b, &c, &planned];
    let series = fleet(&claims, &pools, &crate::mirror::pool_resources(&claims, &nodes));
    // A planned claim has no instance yet: it costs nothing and counts nowhere.
    assert_eq!(value(&series, "FleetUsdPerHour", &[]), Some(1.5));
    assert_eq!(value(&series, "karpenter_cluster_state_node_count", &[]), Some(2.0));
    let by = |pool, ct| value(&series, "NodeClaims", &[("nodepool", pool), ("capacity_type", ct)]);
    assert_eq!(by("general", "spot"), Some(1.0));
    assert_eq!(by("general", "on-demand"), Some(1.0));
    assert_eq!(by("gpu", "spot"), Some(1.0));
    assert_eq!(by("gpu", "on-demand"), None);
    let usage = |pool, r| {
        value(
            &series,
            "karpenter_nodepools_usage",
            &[("nodepool", pool), ("resource_type", r)],
        )
    };
    assert_eq!(usage("general", "cpu"), Some(6.0));
    assert_eq!(usage("general", "nodes"), Some(2.0));
    assert_eq!(
        usage("general", "memory"),
        Some(2.0 * Quantity::from_mib(8192).as_f64())
    );
    assert_eq!(
        usage("gpu", "nodes"),
        Some(0.0),
        "a pool without nodes shows zero, not nothing"
    );
    let limit = |pool, r| {
        value(
            &series,
            "karpenter_nodepools_limit",
            &[("nodepool", pool), ("resource_type", r)],
        )
    };
    assert_eq!(limit("general", "cpu"), Some(100.0));
    assert_eq!(limit("gpu", "cpu"), None, "no limit, no series");
    Ok(())
}

#[test]
fn a_runs_changes_are_counted_by_the_pool_of_the_claim_they_touched() {
    let claims = [
        claim("a", "general", "spot", Some("n-a"), 0.1),
        claim("b", "general", "on-demand", Some("n-b"), 0.4),
        claim("c", "gpu", "spot", None, 1.0),
        claim("d", "gpu", "spot", Some("n-d"), 1.0),
    ];
    let series = sweep_changes(
        &claims,
        &[
            register("a", "n-a"),
            register("b", "n-b"),
            remove("c", None),
            // An action naming a claim the run did not read counts nowhere.
            remove("zz", None),
        ],
        &[
            ("n-b".to_string(), Reason::Underutilized),
            ("n-d".to_string(), Reason::Drifted),
        ],
        &["n-b".to_string()],
        // A claim terminated twice over (its drain and a deletion) counts once.
        &["b".to_string()],
    );
    assert_eq!(
        value(&series, "karpenter_nodes_created_total", &[("nodepool", "general")]),
        Some(2.0)
    );
    let terminated = |pool, ct| {
        value(
            &series,
            "karpenter_nodeclaims_terminated_total",
            &[("nodepool", pool), ("capacity_type", ct)],
        )
    };
    assert_eq!(terminated("general", "on-demand"), Some(1.0));
    assert_eq!(terminated("gpu", "spot"), Some(1.0));
    assert_eq!(terminated("general", "spot"), None);
    // Only b had a Node.
    assert_eq!(
        value(&series, "karpenter_nodes_terminated_total", &[("nodepool", "general")]),
        Some(1.0)
    );
    assert_eq!(
        value(&series, "karpenter_nodes_terminated_total", &[("nodepool", "gpu")]),
        None
    );
    let disrupted = |pool, reason| {
        value(
            &series,
            "karpenter_nodeclaims_disrupted_total",
            &[("nodepool", pool), ("reason", reason)],
        )
    };
    assert_eq!(disrupted("general", "underutilized"), Some(1.0));
    assert_eq!(disrupted("gpu", "drifted"), Some(1.0));
}

#[test]
fn decisions_are_labelled_as_karpenter_labels_them() {
    let d = |reason, replace, nodes| DecisionTaken { reason, replace, nodes };
    let series = decisions(&[
        d(Reason::Underutilized, true, 1),
        d(Reason::Underutilized, false, 3),
        d(Reason::Underutilized, false, 2),
        d(Reason::Empty, false, 4),
        d(Reason::Drifted, true, 1),
    ]);
    let got = |decision, reason, ct| {
        value(
            &series,
            "karpenter_voluntary_disruption_decisions_total",
            &[("decision", decision), ("reason", reason), ("consolidation_type", ct)],
        )
    };
    assert_eq!(got("replace", "underutilized", "single"), Some(1.0));
    assert_eq!(got("delete", "underutilized", "multi"), Some(2.0));
    assert_eq!(got("delete", "empty", "empty"), Some(1.0));
    assert_eq!(got("replace", "drifted", "none"), Some(1.0));
    assert_eq!(series.len(), 4);
}

#[test]
fn eligible_nodes_count_each_reason_zero_included_and_replacements_count_by_reason() {
    use crate::disruption::NodeState;
    let since = Some(jiff::Timestamp::UNIX_EPOCH);
    let state = |drifted: bool, consolidatable: bool, empty: bool| NodeState {
        drifted: drifted.then(|| "NodePool changed".to_string()),
        consolidatable_since: if consolidatable { since } else { None },
        empty,
    };
    let states = BTreeMap::from([
        ("a".to_string(), state(true, true, true)),
        ("b".to_string(), state(false, true, false)),
        ("c".to_string(), state(false, false, true)),
    ]);
    let series = eligible(&states);
    let got = |r| {
        value(
            &series,
            "karpenter_voluntary_disruption_eligible_nodes",
            &[("reason", r)],
        )
    };
    assert_eq!(
        (got("drifted"), got("underutilized"), got("empty")),
        (Some(1.0), Some(2.0), Some(1.0))
    );
    let none = eligible(&BTreeMap::new());
    assert_eq!(none.len(), 3, "zeros too: the gauge falls back");
    let series = replacements_created(&[
        ("general".into(), Reason::Drifted),
        ("general".into(), Reason::Drifted),
        ("gpu".into(), Reason::Underutilized),
    ]);
    let created = |p, r| {
        value(
            &series,
            "karpenter_nodeclaims_created_total",
            &[("nodepool", p), ("reason", r)],
        )
    };
    assert_eq!(created("general", "drifted"), Some(2.0));
    assert_eq!(created("gpu", "underutilized"), Some(1.0));
    // Startup durations: EMF's 100 values a metric at most.
    let pods: Vec<(String, f64)> = (0..250).map(|i| (format!("web/p-{i}"), f64::from(i))).collect();
    let series = startup(&pods);
    let sizes: Vec<usize> = series.iter().map(|s| s.metrics[0].samples.len()).collect();
    assert_eq!(sizes, [100, 100, 50]);
    assert!(startup(&[]).is_empty());
    // A consolidation cut by its deadline counts once; one that tried every node does not.
    let coverage = |unexamined| {
        Some(crate::disruption::Coverage {
            candidates: 5,
            unexamined,
        })
    };
    let series = consolidation_timeouts(coverage(2));
    assert_eq!(
        value(
            &series,
            "karpenter_voluntary_disruption_consolidation_timeouts_total",
            &[("consolidation_type", "single")]
        ),
        Some(1.0)
    );
    assert!(consolidation_timeouts(coverage(0)).is_empty() && consolidation_timeouts(None).is_empty());
}

/// (function, metric name) → (unit, label names).
type Emitted = BTreeMap<(&'static str, &'static str), (&'static str, BTreeSet<&'static str>)>;

/// What each function's metrics code emits, from samples that fill every labelled series.
fn emitted() -> Result<Emitted, Box<dyn std::error::Error>> {
    let claims = [
        claim("a", "general", "spot", Some("n-a"), 0.1),
        claim("b", "general", "on-demand", Some("n-b"), 0.4),
    ];
    let refs: Vec<&NodeClaim> = claims.iter().collect();
    let nodes = [node("n-a", "2")?, node("n-b", "2")?];
    let pools = [pool("general", json!({"cpu": "100"}))?];
    let sweep = crate::sweep::SweepReport {
        series: [
            sweep_changes(
                &claims,
                &[register("a", "n-a"), remove("b", Some("n-b"))],
                &[("n-a".to_string(), Reason::Empty)],
                &[],
                &[],
            ),
            fleet(&refs, &pools, &crate::mirror::pool_resources(&refs, &nodes)),
            decisions(&[DecisionTaken {
                reason: Reason::Drifted,
                replace: true,
                nodes: 1,
            }]),
            replacements_created(&[("general".into(), Reason::Drifted)]),
            startup(&[("web/a".into(), 3.0)]),
            eligible(&BTreeMap::new()),
            consolidation_timeouts(Some(crate::disruption::Coverage {
                candidates: 3,
                unexamined: 1,
            })),
        ]
        .concat(),
        ..Default::default()
    };
    let provision = crate::provisioning::ProvisionOutcome {
        created: claims.to_vec(),
        solve: Some((Duration::from_millis(40), 12)),
        ..Default::default()
    };
    let interrupt = crate::interruption::handler::InterruptOutcome {
        received: vec!["spot_interrupted".into()],
        replacements: claims.to_vec(),
        ..Default::default()
    };
    let launch = crate::launch::batch::metrics(&[crate::launch::batch::RecordResult {
        message_id: None,
        result: Ok(crate::launch::LaunchOutcome::NoCapacity {
            node_claim: "a".into(),
            tried: Vec::new(),
        }),
    }]);
    let metered = crate::metering::Metered::new(
        &crate::metering::Invocation {
            duration: Duration::from_millis(100),
            init: None,
            memory_mb: 512,
        },
        &crate::usage::Usage::default(),
        0.0,
    );
    let mut out = BTreeMap::new();
    for (function, series) in [
        ("sweep", sweep.metrics()),
        ("provision", provision.metrics()),
        ("interrupt", interrupt.metrics()),
        ("launch", launch),
    ] {
        // Every function's shell also publishes its metering.
        for s in series.iter().chain(&metered.series()) {
            for m in &s.metrics {
                let now = (m.unit, s.labels.keys().copied().collect());
                if let Some(before) = out.insert((function, m.name), now.clone()) {
                    assert_eq!(before, now, "{function} emits {} two ways", m.name);
                }
            }
        }
    }
    Ok(out)
}

#[test]
fn every_metric_emitted_is_catalogued_with_its_unit_and_labels_and_every_catalogued_one_is_emitted() -> TestResult {
    let emitted = emitted()?;
    for ((function, name), (unit, labels)) in &emitted {
        let d = def(name).ok_or_else(|| format!("{function} emits {name}, which the catalogue lacks"))?;
        assert!(
            d.functions.contains(function),
            "{name}: the catalogue does not say {function} emits it"
        );
        assert_eq!(*unit, d.unit, "{name}'s unit");
        assert_eq!(
            labels,
            &d.labels.iter().copied().collect::<BTreeSet<_>>(),
            "{name}'s labels"
        );
    }
    for d in CATALOG {
        for f in d.functions {
            assert!(emitted.contains_key(&(*f, d.name)), "{f} never emits {}", d.name);
        }
        assert!(d.functions.iter().all(|f| FUNCTIONS.contains(f)), "{}", d.name);
        assert_eq!(d.karpenter, d.name.starts_with("karpenter_"), "{}", d.name);
    }
    let names: BTreeSet<&str> = CATALOG.iter().map(|d| d.name).collect();
    assert_eq!(names.len(), CATALOG.len(), "a name catalogued twice");
    Ok(())
}
