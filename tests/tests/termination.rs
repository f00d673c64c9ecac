//! Deletion as Karpenter does it, on the local stack (moto, the Kubernetes
//! API test server, strict kubelets) through the real sweep: a deleted
//! NodePool's nodes, a node an interruption drained, and a Node deleted with
//! the real `kubectl` are drained, then their instances terminated, their
//! Nodes and claims gone.

use crate::local_stack::{self, Stack, ec2_event, event, pods_on, taint_keys, web_pdb};
use nodesmith::nodeclaim::NodeClaim;
use serde_json::json;

const FINALIZER: &str = "karpenter.sh/termination";

/// EC2's state of the instance.
async fn state(s: &Stack, id: &str) -> String {
    s.instance_states().await.get(id).cloned().unwrap_or_default()
}

/// The claim's instance is terminated, its Node, claim and records gone.
async fn terminated(s: &Stack, claim: &NodeClaim) {
    let node = claim.node_name.as_deref().unwrap();
    let id = claim.instance_id.as_deref().unwrap();
    assert!(
        matches!(state(s, id).await.as_str(), "shutting-down" | "terminated"),
        "the instance is terminated: {}",
        state(s, id).await
    );
    assert!(s.kube.node(node).is_none(), "the Node is gone: {:?}", s.kube.node(node));
    assert_eq!(
        s.store.get_node_claim(&claim.name).await.unwrap(),
        None,
        "the claim is gone"
    );
    assert!(s.store.drains().await.unwrap().is_empty());
    assert!(s.store.terminations().await.unwrap().is_empty());
}

#[tokio::test]
async fn deleting_a_node_pool_drains_and_terminates_its_nodes() {
    let s = Stack::new("64", 2).await;
    let claim = s.running_node().await;
    let node = claim.node_name.clone().unwrap();
    s.kube.delete("karpenter.sh/v1", "NodePool", "", "default").unwrap();

    // One run begins the termination and drains the node (no budget, no
    // replacement); the next finds the drain complete and terminates it.
    let sweeper = s.sweeper(local_stack::fast());
    let report = sweeper.run().await.unwrap();
    assert_eq!(report.terminations.begun, vec![claim.name.clone()], "{report:?}");
    assert!(pods_on(&s.kube, &node).is_empty(), "the pods were evicted");
    assert!(
        s.kube.node(&node).is_some(),
        "the Node stays until the instance is terminated"
    );
    let report = sweeper.run().await.unwrap();
    assert_eq!(report.terminations.terminated, vec![claim.name.clone()], "{report:?}");
    terminated(&s, &claim).await;
    assert!(s.claims().await.is_empty(), "no replacement: {:?}", s.claims().await);
}

#[tokio::test]
async fn a_node_an_interruption_drained_is_terminated_once_drained() {
    let s = Stack::new("64", 2).await;
    let claim = s.running_node().await;
    let node = claim.node_name.clone().unwrap();
    let instance = claim.instance_id.clone().unwrap();
    let warning = ec2_event(
        "spot-drained",
        "EC2 Spot Instance Interruption Warning",
        jiff::Timestamp::now(),
        json!({"instance-id": instance}),
    );
    let out = s.interrupter(|_| {}).handle(&event(vec![warning])).await;
    assert_eq!(out.tainted, vec![node.clone()], "{out:?}");
    assert!(pods_on(&s.kube, &node).is_empty(), "interrupt drained the node itself");

    // Today the node stays, empty and tainted, until EC2 takes it.
    let report = s.sweeper(local_stack::fast()).run().await.unwrap();
    assert_eq!(report.terminations.terminated, vec![claim.name.clone()], "{report:?}");
    terminated(&s, &claim).await;
}

#[tokio::test]
async fn a_node_an_interruption_cannot_drain_is_terminated_at_its_deadline() {
    let s = Stack::new("64", 2).await;
    let claim = s.running_node().await;
    let node = claim.node_name.clone().unwrap();
    let instance = claim.instance_id.clone().unwrap();
    s.kube.apply(&web_pdb()).unwrap();
    let now = jiff::Timestamp::now();
    let warning = ec2_event(
        "spot-held",
        "EC2 Spot Instance Interruption Warning",
        now,
        json!({"instance-id": instance}),
    );
    s.interrupter(|_| {}).handle(&event(vec![warning])).await;
    let sweeper = s.sweeper(local_stack::fast());
    sweeper.run_at(now).await.unwrap();
    assert_eq!(pods_on(&s.kube, &node).len(), 2, "the PDB holds before the deadline");
    assert_eq!(state(&s, &instance).await, "running");
    assert!(s.kube.node(&node).is_some());

    // Past the notice's two minutes the instance is terminated whatever the drain says.
    let later = now + jiff::SignedDuration::from_secs(121);
    let report = sweeper.run_at(later).await.unwrap();
    assert_eq!(report.terminations.terminated, vec![claim.name.clone()], "{report:?}");
    terminated(&s, &claim).await;
}

#[tokio::test]
async fn kubectl_delete_node_drains_it_within_pdbs_then_terminates_it() {
    let s = Stack::new("64", 2).await;
    let claim = s.running_node().await;
    let node = claim.node_name.clone().unwrap();
    let instance = claim.instance_id.clone().unwrap();
    let finalizers = s.kube.node(&node).unwrap().metadata.finalizers.unwrap_or_default();
    assert_eq!(
        finalizers,
        vec![FINALIZER.to_string()],
        "registration adds Karpenter's finalizer"
    );
    s.kube.apply(&web_pdb()).unwrap();

    let kubectl = s.kubectl("termination");
    let out = kubectl.ok(&["delete", "node", &node, "--wait=false"]).await;
    assert!(out.contains(&format!("node \"{node}\" deleted")), "{out}");
    // The finalizer holds the Node, marked for deletion, with its pods.
    let marked = kubectl.json(&["get", "node", &node]).await;
    assert!(marked["metadata"]["deletionTimestamp"].is_string(), "{marked}");
    assert_eq!(pods_on(&s.kube, &node).len(), 2);

    // The sweep drains it gracefully: the PDB holds the pods, the instance runs.
    let sweeper = s.sweeper(local_stack::fast());
    let report = sweeper.run().await.unwrap();
    assert_eq!(report.terminations.begun, vec![claim.name.clone()], "{report:?}");
    assert!(report.terminations.terminated.is_empty(), "{report:?}");
    assert_eq!(pods_on(&s.kube, &node).len(), 2, "the PDB holds the pods");
    assert_eq!(state(&s, &instance).await, "running");
    assert!(taint_keys(&s.kube.node(&node).unwrap()).contains(&"karpenter.sh/disrupted".to_string()));

    // The budget lifted: the pods are evicted, the instance terminated, then the Node goes.
    s.kube
        .delete("policy/v1", "PodDisruptionBudget", "default", "web")
        .unwrap();
    sweeper.run().await.unwrap();
    assert!(pods_on(&s.kube, &node).is_empty(), "the pods were evicted");
    assert!(kubectl.json(&["get", "node", &node]).await["metadata"]["deletionTimestamp"].is_string());
    let report = sweeper.run().await.unwrap();
    assert_eq!(report.terminations.terminated, vec![claim.name.clone()], "{report:?}");
    terminated(&s, &claim).await;
    let gone = kubectl.run(&["get", "node", &node], None).await;
    assert!(!gone.ok && gone.stderr.contains("NotFound"), "{gone:?}");
    let _ = std::fs::remove_dir_all(&kubectl.dir);
}
