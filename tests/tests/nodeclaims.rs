//! kubectl's view of nodesmith on the local stack (moto, the Kubernetes API
//! test server, strict kubelets) through the real sweep and the real
//! `kubectl`: one NodeClaim object per claim with its node and conditions,
//! NodePool status, a NodeClaim deleted with kubectl drains and terminates
//! its node, and an object whose claim is gone is let go.

use crate::local_stack::{self, Stack, pods_on, web_pdb, web_pod};
use nodesmith::telemetry::value;
use nodesmith_tests::kubectl::{header, row};
use serde_json::{Value, json};

/// The status of condition `t` in an object's JSON.
fn condition(o: &Value, t: &str) -> String {
    o["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == t)
        .and_then(|c| c["status"].as_str())
        .unwrap_or("absent")
        .to_string()
}

#[tokio::test]
async fn kubectl_shows_a_nodeclaim_per_node_and_the_pools_status_and_a_gone_claims_object_goes() {
    let s = Stack::new("64", 2).await;
    // The sweeps that bring the node up also mirror its claim.
    let claim = s.running_node().await;
    let node = claim.node_name.clone().unwrap();
    let kubectl = s.kubectl("nodeclaims");
    let out = kubectl.ok(&["get", "nodeclaims"]).await;
    assert_eq!(
        header(&out),
        ["NAME", "TYPE", "CAPACITY", "ZONE", "NODE", "READY", "AGE"],
        "{out}"
    );
    let r = row(&out, &claim.name);
    assert_eq!(
        (r["TYPE"], r["CAPACITY"], r["ZONE"], r["NODE"], r["READY"]),
        (
            claim.instance_type.as_deref().unwrap(),
            "on-demand",
            claim.zone.as_deref().unwrap(),
            node.as_str(),
            "True"
        ),
        "{out}"
    );
    // What the server stored reads back as written: another run writes nothing.
    let report = s.sweeper(local_stack::fast()).run().await.unwrap();
    let mut started: Vec<String> = report.disruption.pod_startups.iter().map(|(p, _)| p.clone()).collect();
    let m = &report.mirror;
    assert_eq!(
        (m.created, m.updated, m.released, m.pools_written, m.failed.len()),
        (0, 0, 0, 0, 0),
        "{m:?}"
    );
    // The run's metrics say what kubectl shows (docs/metrics.md).
    let series = report.metrics();
    let pool_has = |r| {
        value(
            &series,
            "karpenter_nodepools_usage",
            &[("nodepool", "default"), ("resource_type", r)],
        )
    };
    assert_eq!(pool_has("nodes"), Some(1.0), "{series:?}");
    assert!(pool_has("cpu").is_some_and(|cpu| cpu >= 1.0), "{series:?}");
    assert_eq!(
        value(
            &series,
            "NodeClaims",
            &[("nodepool", "default"), ("capacity_type", "on-demand")]
        ),
        Some(1.0)
    );
    assert_eq!(value(&series, "karpenter_cluster_state_node_count", &[]), Some(1.0));
    assert_eq!(value(&series, "FleetUsdPerHour", &[]), Some(claim.price.unwrap_or(0.0)));
    let o = kubectl.json(&["get", "nodeclaim", &claim.name]).await;
    for t in ["Launched", "Registered", "Initialized", "Ready"] {
        assert_eq!(condition(&o, t), "True", "{t}: {o}");
    }
    assert_eq!(o["status"]["providerID"], json!(claim.provider_id), "{o}");
    // The AMI launch chose, recorded with the claim.
    assert!(
        claim.image_id.as_deref().is_some_and(|i| i.starts_with("ami-")),
        "{claim:?}"
    );
    assert_eq!(o["status"]["imageID"], json!(claim.image_id), "{o}");
    assert_eq!(o["metadata"]["labels"]["karpenter.sh/nodepool"], "default");
    assert_eq!(o["metadata"]["finalizers"], json!(["karpenter.sh/termination"]));
    assert!(o["status"]["capacity"]["cpu"].is_string(), "{o}");
    assert_eq!(o["spec"]["nodeClassRef"]["name"], "default");

    let out = kubectl.ok(&["get", "nodepools", "-o", "wide"]).await;
    let r = row(&out, "default");
    assert_eq!((r["NODES"], r["READY"]), ("1", "True"), "{out}");
    assert_eq!(r["CPU"], o["status"]["capacity"]["cpu"].as_str().unwrap(), "{out}");
    let pool = kubectl.json(&["get", "nodepool", "default"]).await;
    for t in ["ValidationSucceeded", "NodeClassReady", "Ready"] {
        assert_eq!(condition(&pool, t), "True", "{t}: {pool}");
    }
    // Owned by its NodePool, as Karpenter's NodeClaims are.
    let owner = &o["metadata"]["ownerReferences"][0];
    assert_eq!(
        (&owner["kind"], &owner["name"]),
        (&json!("NodePool"), &json!("default")),
        "{o}"
    );
    assert_eq!(owner["uid"], pool["metadata"]["uid"], "{o}");

    // Two more pods on a second node: one more object, the pool counts two.
    let sweeper = s.sweeper(local_stack::fast());
    for pod in ["web-2", "web-3"] {
        s.kube.apply(&web_pod(pod)).unwrap();
    }
    s.kube.schedule();
    let outcome = s.provision(&["web-2", "web-3"]).await;
    assert_eq!(outcome.created.len(), 1, "{outcome:?}");
    let series = outcome.metrics();
    assert_eq!(
        value(
            &series,
            "karpenter_nodeclaims_created_total",
            &[("nodepool", "default"), ("reason", "provisioning")]
        ),
        Some(1.0)
    );
    assert_eq!(value(&series, "karpenter_scheduler_queue_depth", &[]), Some(2.0));
    s.launch_all().await;
    // Launch writes the new claim's object itself: kubectl shows it
    // launched before any sweep has run.
    let o = kubectl.json(&["get", "nodeclaim", &outcome.created[0].name]).await;
    assert_eq!(
        (
            condition(&o, "Launched"),
            condition(&o, "Registered"),
            condition(&o, "Ready")
        ),
        ("True".to_string(), "Unknown".to_string(), "Unknown".to_string()),
        "{o}"
    );
    assert!(
        o["status"]["imageID"].as_str().is_some_and(|i| i.starts_with("ami-")),
        "{o}"
    );
    assert_eq!(
        o["metadata"]["ownerReferences"][0]["uid"], pool["metadata"]["uid"],
        "{o}"
    );
    for _ in 0..3 {
        s.kubelet_step().await;
        let report = sweeper.run().await.unwrap();
        started.extend(report.disruption.pod_startups.iter().map(|(p, _)| p.clone()));
    }
    // The pods bind and start; two seconds on, every pod Ready by now is in a
    // closed window. Each pod's pending → Running time is counted once, by
    // the first run to see it Ready.
    s.kube.schedule();
    s.kubelet_step().await;
    let later = sweeper
        .run_at(jiff::Timestamp::now() + jiff::SignedDuration::from_secs(2))
        .await
        .unwrap();
    started.extend(later.disruption.pod_startups.iter().map(|(p, _)| p.clone()));
    started.sort();
    let counted_twice: Vec<&String> = started.windows(2).filter(|w| w[0] == w[1]).map(|w| &w[0]).collect();
    assert!(counted_twice.is_empty(), "{started:?}");
    for pod in ["default/web-2", "default/web-3"] {
        assert!(started.iter().any(|p| p == pod), "{pod} not counted: {started:?}");
    }
    let claims = s.claims().await;
    assert_eq!(claims.len(), 2, "{claims:?}");
    let listed = kubectl.json(&["get", "nodeclaims"]).await;
    let mut names: Vec<&str> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o["metadata"]["name"].as_str())
        .collect();
    names.sort();
    let mut want: Vec<&str> = claims.iter().map(|c| c.name.as_str()).collect();
    want.sort();
    assert_eq!(names, want);
    assert_eq!(row(&kubectl.ok(&["get", "nodepools"]).await, "default")["NODES"], "2");

    // The first instance goes behind nodesmith's back: the lifecycle removes
    // the claim, and then its object goes too.
    s.ec2
        .terminate_instances()
        .instance_ids(claim.instance_id.clone().unwrap())
        .send()
        .await
        .unwrap();
    let mut terminated = 0.0;
    for _ in 0..3 {
        let series = sweeper.run().await.unwrap().metrics();
        terminated += nodesmith::telemetry::totals(&series)
            .get("karpenter_nodeclaims_terminated_total")
            .copied()
            .unwrap_or_default();
    }
    assert_eq!(s.store.get_node_claim(&claim.name).await.unwrap(), None);
    assert_eq!(terminated, 1.0, "the claim's end is counted once");
    let gone = kubectl.run(&["get", "nodeclaim", &claim.name], None).await;
    assert!(!gone.ok && gone.stderr.contains("NotFound"), "{gone:?}");
    assert_eq!(row(&kubectl.ok(&["get", "nodepools"]).await, "default")["NODES"], "1");
    let _ = std::fs::remove_dir_all(&kubectl.dir);
}

#[tokio::test]
async fn kubectl_delete_nodeclaim_drains_its_node_within_pdbs_then_terminates_it() {
    let s = Stack::new("64", 2).await;
    let claim = s.running_node().await;
    let node = claim.node_name.clone().unwrap();
    let instance = claim.instance_id.clone().unwrap();
    s.kube.apply(&web_pdb()).unwrap();
    let kubectl = s.kubectl("nodeclaim-delete");
    let out = kubectl.ok(&["delete", "nodeclaim", &claim.name, "--wait=false"]).await;
    assert!(
        out.contains(&format!("nodeclaim.karpenter.sh \"{}\" deleted", claim.name)),
        "{out}"
    );
    // The finalizer holds the object, marked for deletion.
    let marked = kubectl.json(&["get", "nodeclaim", &claim.name]).await;
    assert!(marked["metadata"]["deletionTimestamp"].is_string(), "{marked}");

    // The sweep drains the node gracefully: the PDB holds, the instance runs.
    let sweeper = s.sweeper(local_stack::fast());
    let report = sweeper.run().await.unwrap();
    assert_eq!(report.terminations.begun, vec![claim.name.clone()], "{report:?}");
    assert_eq!(pods_on(&s.kube, &node).len(), 2, "the PDB holds the pods");
    let states = s.instance_states().await;
    assert_eq!(states.get(&instance).map(String::as_str), Some("running"));
    let drains = s.store.drains().await.unwrap();
    assert_eq!(drains.len(), 1, "{drains:?}");
    assert_eq!(drains[0].reason, "nodeclaim-deleted");
    // The object shows it from the next run (each run mirrors what it read first).
    sweeper.run().await.unwrap();
    assert_eq!(pods_on(&s.kube, &node).len(), 2, "the PDB still holds the pods");
    let o = kubectl.json(&["get", "nodeclaim", &claim.name]).await;
    assert_eq!(condition(&o, "DisruptionReason"), "True", "{o}");

    // The budget lifted: evicted, terminated, and the object goes with the claim.
    s.kube
        .delete("policy/v1", "PodDisruptionBudget", "default", "web")
        .unwrap();
    sweeper.run().await.unwrap();
    assert!(pods_on(&s.kube, &node).is_empty(), "the pods were evicted");
    let report = sweeper.run().await.unwrap();
    assert_eq!(report.terminations.terminated, vec![claim.name.clone()], "{report:?}");
    let states = s.instance_states().await;
    assert!(
        matches!(
            states.get(&instance).map(String::as_str),
            Some("shutting-down" | "terminated")
        ),
        "{states:?}"
    );
    assert!(s.kube.node(&node).is_none(), "the Node is gone");
    assert_eq!(s.store.get_node_claim(&claim.name).await.unwrap(), None);
    let gone = kubectl.run(&["get", "nodeclaim", &claim.name], None).await;
    assert!(!gone.ok && gone.stderr.contains("NotFound"), "{gone:?}");
    let _ = std::fs::remove_dir_all(&kubectl.dir);
}
