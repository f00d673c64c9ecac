use super::*;
use crate::apis::nodepool::NodePoolSpec;
use serde_json::json;

fn at(s: &str) -> Result<Timestamp, jiff::Error> {
    s.parse()
}

fn launched(name: &str, node: Option<&str>) -> Result<NodeClaim, jiff::Error> {
    let mut c = NodeClaim::pending(name, "default", "default");
    c.timestamps.created = Some(at("2026-11-28T10:00:00Z")?);
    c.timestamps.launched = Some(at("2026-11-28T10:00:05Z")?);
    c.phase = Phase::Launched;
    c.instance_id = Some(format!("i-{name}"));
    c.provider_id = Some(format!("aws:///us-east-1a/i-{name}"));
    c.instance_type = Some("m5.large".into());
    c.zone = Some("us-east-1a".into());
    c.capacity_type = Some("spot".into());
    if let Some(n) = node {
        c.phase = Phase::Registered;
        c.node_name = Some(n.into());
        c.timestamps.registered = Some(at("2026-11-28T10:00:40Z")?);
    }
    Ok(c)
}

fn node(name: &str, cpu: &str, memory: &str) -> Result<Node, serde_json::Error> {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "status": {"capacity": {"cpu": cpu, "memory": memory, "pods": "29"},
                   "allocatable": {"cpu": cpu, "memory": memory, "pods": "29"}}
    }))
}

fn pool(name: &str, class: &str) -> Result<NodePool, serde_json::Error> {
    let spec: NodePoolSpec = serde_json::from_value(json!({
        "template": {"spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": class},
                              "expireAfter": "24h"}}
    }))?;
    Ok(NodePool::new(name, spec))
}

fn statuses(o: &NodeClaimObject) -> Vec<(String, String, String)> {
    o.status
        .iter()
        .flat_map(|s| s.conditions.iter())
        .map(|c| (c.type_.clone(), c.status.clone(), c.message.clone()))
        .collect()
}

fn triple(t: &str, s: &str, m: &str) -> (String, String, String) {
    (t.into(), s.into(), m.into())
}

#[test]
fn a_claim_is_shown_as_karpenter_shows_its_nodeclaim() -> Result<(), Box<dyn std::error::Error>> {
    let claim = launched("default-abc12", Some("ip-10-0-1-5.ec2.internal"))?;
    let n = node("ip-10-0-1-5.ec2.internal", "2", "8Gi")?;
    let o = object(&claim, Some(&n), Some(&pool("default", "default")?));
    let labels = o.metadata.labels.clone().unwrap_or_default();
    for (k, v) in [
        (labels::NODEPOOL, "default"),
        (labels::INSTANCE_TYPE, "m5.large"),
        (labels::ZONE, "us-east-1a"),
        (labels::CAPACITY_TYPE, "spot"),
        (MANAGED_BY_LABEL, MANAGED_BY),
    ] {
        assert_eq!(labels.get(k).map(String::as_str), Some(v), "label {k}");
    }
    assert_eq!(
        o.metadata.finalizers,
        Some(vec![labels::TERMINATION_FINALIZER.to_string()])
    );
    assert_eq!(o.spec.node_class_ref.name, "default");
    assert_eq!(o.spec.expire_after, crate::apis::NillableDuration::parse("24h")?);
    let status = o.status.clone().unwrap_or_default();
    assert_eq!(status.node_name.as_deref(), Some("ip-10-0-1-5.ec2.internal"));
    assert_eq!(status.provider_id.as_deref(), Some("aws:///us-east-1a/i-default-abc12"));
    assert_eq!(status.capacity.get("cpu"), Some(&Quantity::from_units(2)));
    assert_eq!(
        statuses(&o),
        vec![
            triple("Launched", "True", ""),
            triple("Registered", "True", ""),
            triple("Initialized", "Unknown", ""),
            triple("Ready", "Unknown", "Initialized=Unknown"),
        ]
    );
    let registered = status.conditions.iter().find(|c| c.type_ == "Registered");
    assert_eq!(
        registered.map(|c| c.last_transition_time.as_str()),
        Some("2026-11-28T10:00:40Z")
    );
    Ok(())
}

#[test]
fn each_phase_shows_its_conditions() -> Result<(), Box<dyn std::error::Error>> {
    let pending = {
        let mut c = NodeClaim::pending("p", "default", "default");
        c.timestamps.created = Some(at("2026-11-28T10:00:00Z")?);
        c
    };
    let mut initialized = launched("i", Some("n"))?;
    initialized.phase = Phase::Initialized;
    initialized.timestamps.initialized = Some(at("2026-11-28T10:01:00Z")?);
    let mut draining_unregistered = launched("d", None)?;
    draining_unregistered.phase = Phase::Draining;
    draining_unregistered.timestamps.draining = Some(at("2026-11-28T10:02:00Z")?);
    let table = [
        (
            &pending,
            vec![
                triple("Launched", "Unknown", ""),
                triple("Registered", "Unknown", ""),
                triple("Initialized", "Unknown", ""),
                triple("Ready", "Unknown", "Launched=Unknown"),
            ],
        ),
        (
            &initialized,
            vec![
                triple("Launched", "True", ""),
                triple("Registered", "True", ""),
                triple("Initialized", "True", ""),
                triple("Ready", "True", ""),
            ],
        ),
        // Drained before it ever registered: Registered stays Unknown.
        (
            &draining_unregistered,
            vec![
                triple("Launched", "True", ""),
                triple("Registered", "Unknown", ""),
                triple("Initialized", "Unknown", ""),
                triple("Ready", "Unknown", "Registered=Unknown"),
                triple("DisruptionReason", "True", "the node is drained, then terminated"),
            ],
        ),
    ];
    for (claim, want) in table {
        assert_eq!(statuses(&object(claim, None, None)), want, "{}", claim.name);
    }
    Ok(())
}

/// [`plan`] with no disruption pass known, as launch calls it.
fn plan_without_states(
    claims: &[&NodeClaim],
    nodes: &[Node],
    pools: &[NodePool],
    existing: &[NodeClaimObject],
) -> Plan {
    let facts = Facts {
        claims,
        nodes,
        pools,
        states: None,
    };
    plan(&facts, existing, Timestamp::UNIX_EPOCH)
}

#[test]
fn drifted_and_consolidatable_follow_the_pass_and_keep_their_times() -> Result<(), Box<dyn std::error::Error>> {
    let a = launched("a", Some("node-a"))?;
    let nodes = [node("node-a", "2", "8Gi")?];
    let pools = [pool("default", "default")?];
    let (t1, t2) = (at("2026-11-28T11:00:00Z")?, at("2026-11-28T11:05:00Z")?);
    let conditions = |o: &NodeClaimObject| -> Vec<(String, String, String, String)> {
        o.status
            .iter()
            .flat_map(|s| s.conditions.iter())
            .filter(|c| c.type_ == "Drifted" || c.type_ == "Consolidatable")
            .map(|c| {
                (
                    c.type_.clone(),
                    c.status.clone(),
                    c.message.clone(),
                    c.last_transition_time.clone(),
                )
            })
            .collect()
    };
    let with = |states: Option<&BTreeMap<String, NodeState>>, existing: &[NodeClaimObject], now| {
        let facts = Facts {
            claims: &[&a],
            nodes: &nodes,
            pools: &pools,
            states,
        };
        plan(&facts, existing, now)
    };
    let state = |drifted: Option<&str>, since: Option<Timestamp>| {
        BTreeMap::from([(
            "node-a".to_string(),
            NodeState {
                drifted: drifted.map(String::from),
                consolidatable_since: since,
                empty: false,
            },
        )])
    };
    // A pass finds the node drifted and consolidatable since 10:30.
    let since = at("2026-11-28T10:30:00Z")?;
    let both = state(Some("NodePool default changed"), Some(since));
    let created = with(Some(&both), &[], t1).create;
    let want = vec![
        (
            "Drifted".into(),
            "True".into(),
            "NodePool default changed".into(),
            "2026-11-28T11:00:00Z".into(),
        ),
        (
            "Consolidatable".into(),
            "True".into(),
            String::new(),
            "2026-11-28T10:30:00Z".into(),
        ),
    ];
    assert_eq!(created.iter().map(conditions).collect::<Vec<_>>(), [want]);
    // The next pass finds the same: the drift keeps its time, nothing is written.
    assert!(with(Some(&both), &created, t2).is_empty());
    // A run without a pass keeps what the object shows.
    assert!(with(None, &created, t2).is_empty());
    // No longer drifted nor consolidatable (a pod landed): both cleared, as Karpenter does.
    let p = with(Some(&state(None, None)), &created, t2);
    assert_eq!(p.status.len(), 1, "{p:?}");
    assert!(conditions(&p.status[0]).is_empty(), "{p:?}");
    // A node the pass did not see (not registered yet): neither.
    let p = with(Some(&BTreeMap::new()), &[], t2);
    assert!(conditions(&p.create[0]).is_empty());
    Ok(())
}

#[test]
fn the_plan_creates_updates_and_releases_only_what_differs() -> Result<(), Box<dyn std::error::Error>> {
    let a = launched("a", Some("node-a"))?;
    let b = launched("b", None)?;
    let nodes = [node("node-a", "2", "8Gi")?];
    let pools = [pool("default", "default")?];
    // Nothing yet: both created.
    let first = plan_without_states(&[&a, &b], &nodes, &pools, &[]);
    assert_eq!(first.create.len(), 2);
    assert!(first.update.is_empty() && first.status.is_empty() && first.orphans.is_empty());
    // As created (the server keeps what was written): nothing to write.
    let mut written = first.create.clone();
    for o in &mut written {
        o.metadata.resource_version = Some("7".into());
    }
    assert!(plan_without_states(&[&a, &b], &nodes, &pools, &written).is_empty());
    // b registers: a status write only, on the object as read.
    let mut b2 = launched("b", Some("node-b"))?;
    b2.version = 3;
    let p = plan_without_states(&[&a, &b2], &nodes, &pools, &written);
    assert!(p.create.is_empty() && p.update.is_empty() && p.orphans.is_empty());
    assert_eq!(p.status.len(), 1);
    assert_eq!(p.status[0].metadata.resource_version.as_deref(), Some("7"));
    assert_eq!(
        p.status[0].status.as_ref().and_then(|s| s.node_name.as_deref()),
        Some("node-b")
    );
    // A claim gone: its object is an orphan. Someone else's NodeClaim is never touched.
    let mut theirs = written[1].clone();
    theirs.metadata.name = Some("karpenters".into());
    theirs.metadata.labels = Some(BTreeMap::new());
    let p = plan_without_states(&[&a], &nodes, &pools, &[written[0].clone(), written[1].clone(), theirs]);
    assert_eq!(p.orphans, vec!["b".to_string()]);
    assert!(p.create.is_empty() && p.update.is_empty() && p.status.is_empty());
    // A label someone added alone is no change; one of ours removed comes
    // back, and theirs stays. An object being deleted keeps its metadata.
    let mut edited = written[0].clone();
    let labels_of = |o: &NodeClaimObject| o.metadata.labels.clone().unwrap_or_default();
    edited
        .metadata
        .labels
        .get_or_insert_default()
        .insert("example.com/owner".into(), "me".into());
    assert!(plan_without_states(&[&a], &nodes, &pools, std::slice::from_ref(&edited)).is_empty());
    edited.metadata.labels.as_mut().map(|l| l.remove(labels::ZONE));
    let p = plan_without_states(&[&a], &nodes, &pools, std::slice::from_ref(&edited));
    assert_eq!(p.update.len(), 1);
    let relabelled = labels_of(&p.update[0]);
    assert_eq!(relabelled.get(labels::ZONE).map(String::as_str), Some("us-east-1a"));
    assert_eq!(relabelled.get("example.com/owner").map(String::as_str), Some("me"));
    edited.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(
        "2026-11-28T11:00:00Z",
    )?));
    let p = plan_without_states(&[&a], &nodes, &pools, std::slice::from_ref(&edited));
    assert!(p.update.is_empty());
    assert_eq!(deleted_at(&edited), Some(at("2026-11-28T11:00:00Z")?));
    // Once the pool has a uid, each object is owned by it, as Karpenter's are.
    let mut owning = pool("default", "default")?;
    owning.metadata.uid = Some("uid-default".into());
    let p = plan_without_states(&[&a], &nodes, std::slice::from_ref(&owning), &written[..1]);
    assert_eq!(p.update.len(), 1, "{p:?}");
    let refs = p.update[0].metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(
        refs.iter()
            .map(|r| (r.kind.as_str(), r.name.as_str(), r.uid.as_str()))
            .collect::<Vec<_>>(),
        [("NodePool", "default", "uid-default")]
    );
    let mut owned = p.update[0].clone();
    owned.metadata.resource_version = Some("8".into());
    assert!(plan_without_states(&[&a], &nodes, std::slice::from_ref(&owning), &[owned]).is_empty());
    Ok(())
}

#[test]
fn a_pool_status_sums_its_nodes_and_is_ready_only_with_a_ready_class() -> Result<(), Box<dyn std::error::Error>> {
    let now = at("2026-11-28T12:00:00Z")?;
    let p = pool("default", "default")?;
    let (a, b, c) = (
        launched("a", Some("node-a"))?,
        launched("b", Some("node-b"))?,
        launched("c", None)?,
    );
    let claims = [&a, &b, &c];
    let nodes = [node("node-a", "2", "8Gi")?, node("node-b", "4", "16Gi")?];
    let class = EC2NodeClass::new("default", Default::default());
    let resources = pool_resources(&claims, &nodes);
    let s = pool_status(&p, &resources, Some(&class), now);
    assert_eq!(s.nodes, Some(2));
    assert_eq!(s.resources.get("cpu"), Some(&Quantity::from_units(6)));
    assert_eq!(s.resources.get("memory"), Some(&Quantity::parse("24Gi")?));
    assert_eq!(s.resources.get("nodes"), Some(&Quantity::from_units(2)));
    let cond = |s: &NodePoolStatus, t: &str| -> Option<(String, String)> {
        s.conditions
            .iter()
            .filter_map(|c| serde_json::from_value::<Condition>(c.clone()).ok())
            .find(|c| c.type_ == t)
            .map(|c| (c.status, c.last_transition_time))
    };
    assert_eq!(cond(&s, "Ready"), Some(("True".into(), "2026-11-28T12:00:00Z".into())));
    // Unchanged an hour later: the same status, so no write.
    let mut p2 = p.clone();
    p2.status = Some(s.clone());
    assert_eq!(
        pool_status(&p2, &resources, Some(&class), now + jiff::SignedDuration::from_hours(1)),
        s
    );
    // The class gone: NodeClassReady and Ready turn False.
    let s = pool_status(&p2, &resources, None, now);
    assert_eq!(cond(&s, "NodeClassReady").map(|c| c.0), Some("False".into()));
    assert_eq!(cond(&s, "Ready").map(|c| c.0), Some("False".into()));
    assert_eq!(cond(&s, "ValidationSucceeded").map(|c| c.0), Some("True".into()));
    Ok(())
}
