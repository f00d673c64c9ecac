//! Disruption on the local stack (moto, the Kubernetes API test server,
//! strict kubelets): expiry, drift and emptiness carried out across sweep
//! runs — taint, replacements launched through `launch` and Initialized
//! before the drain, PDBs and do-not-disrupt honoured, termination — with
//! every step resumed from DynamoDB. Most passes run the `Sweeper` in-process;
//! the real `sweep` binary runs the expiry walk and the interrupted run.

use crate::launch_fixtures;

use std::collections::BTreeMap;

use crate::launch_fixtures::{CLUSTER, DISCOVERY, TABLE};
use crate::local_stack::{Stack, fast, pods_on, taint_keys};
use nodesmith::nodeclaim::{NodeClaim, Phase};
use nodesmith::state::{DisruptionRecord, DisruptionStep};
use nodesmith_tests::kube_server::Fault;
use nodesmith_tests::lambda_runtime::invoke;
use serde_json::{Value, json};

const DISRUPTED: &str = "karpenter.sh/disrupted";

/// The stack's pool with these requirements, `disruption` block and extra template spec fields.
fn pool(capacity: &[&str], sizes: Option<&[&str]>, disruption: Value, spec_extra: Value) -> Value {
    let mut reqs = vec![
        json!({"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["m5", "c5"]}),
        json!({"key": "karpenter.sh/capacity-type", "operator": "In", "values": capacity}),
    ];
    if let Some(s) = sizes {
        reqs.push(json!({"key": "karpenter.k8s.aws/instance-size", "operator": "In", "values": s}));
    }
    let mut spec = json!({
        "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
        "requirements": reqs,
    });
    if let (Some(o), Some(extra)) = (spec.as_object_mut(), spec_extra.as_object()) {
        o.extend(extra.clone());
    }
    json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"}, "spec": {
        "template": {"metadata": {"labels": {"team": "web"}}, "spec": spec},
        "disruption": disruption,
        "limits": {"cpu": "64"}
    }})
}

/// A pod a ReplicaSet owns (voluntary disruption only moves controlled pods).
fn web_pod(name: &str, cpu: &str, annotations: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
        "labels": {"app": "web"}, "annotations": annotations,
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "rs-web", "controller": true}]},
        "spec": {"containers": [{"name": "c", "image": "web", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]}})
}

/// The stack with `pool` and controlled pods `web-0`, `web-1` (900m each, one node).
async fn stack(pool: Value, annotations: Value) -> Stack {
    let s = Stack::new("64", 0).await;
    s.kube.apply(&pool).unwrap();
    for i in 0..2 {
        s.kube
            .apply(&web_pod(&format!("web-{i}"), "900m", annotations.clone()))
            .unwrap();
    }
    s.kube.schedule();
    s
}

/// The stack with an on-demand pool that never consolidates, and its one running node.
async fn one_node() -> (Stack, NodeClaim) {
    let s = stack(
        pool(&["on-demand"], None, json!({"consolidateAfter": "Never"}), json!({})),
        json!({}),
    )
    .await;
    let old = s.running_node().await;
    (s, old)
}

/// EC2's description of one instance.
async fn instance(s: &Stack, id: &str) -> aws_sdk_ec2::types::Instance {
    let d = s.ec2.describe_instances().instance_ids(id).send().await.unwrap();
    d.reservations()[0].instances()[0].clone()
}

/// The instances of the replacements a walk saw.
async fn replacement_instances(s: &Stack, w: &Walk) -> Vec<aws_sdk_ec2::types::Instance> {
    let claims = s.claims().await;
    let mut out = Vec::new();
    for r in &w.replacements {
        let id = claim_of(&claims, r).and_then(|c| c.instance_id.clone()).unwrap();
        out.push(instance(s, &id).await);
    }
    out
}

/// A sweeper that also resolves classes (drift by AMI, subnets, security groups).
async fn resolving_sweeper(s: &Stack) -> nodesmith::sweep::Sweeper<nodesmith::kubernetes::KubeCluster> {
    let conf = s.m.sdk_config().await;
    s.sweeper(fast())
        .with_resolution(aws_sdk_ssm::Client::new(&conf), aws_sdk_eks::Client::new(&conf))
}

async fn records(s: &Stack) -> Vec<DisruptionRecord> {
    s.store.disruptions().await.unwrap()
}

/// Messages of the events with this reason.
fn events(s: &Stack, reason: &str) -> Vec<String> {
    s.kube
        .events()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        // The node's or pod's own (a node's disruption events are on its NodeClaim too).
        .filter(|e| e.involved_object.kind.as_deref() != Some("NodeClaim"))
        .filter_map(|e| e.message)
        .collect()
}

/// `node` is untainted and a `DisruptionBlocked` event names pod `web-0`'s do-not-disrupt.
fn held_by_do_not_disrupt(s: &Stack, node: &str) {
    assert!(!taint_keys(&s.kube.node(node).unwrap()).contains(&DISRUPTED.to_string()));
    let blocked = events(s, "DisruptionBlocked");
    assert!(
        blocked
            .iter()
            .any(|m| m.contains("default/web-0") && m.contains("do-not-disrupt")),
        "{blocked:?}"
    );
}

/// Backdates a Node's creation (a delete and re-create would leave a Node
/// holding the termination finalizer marked for deletion).
fn age(s: &Stack, node: &str, hours: i64) {
    let by = std::time::Duration::from_secs(u64::try_from(hours).unwrap() * 3600);
    s.kube.age_node(node, by).unwrap();
}

/// Marks every bound pod Running and Ready (PDBs count healthy pods).
fn run_pods(s: &Stack) {
    for p in s.kube.pods() {
        if p.spec.as_ref().and_then(|sp| sp.node_name.as_ref()).is_none() {
            continue;
        }
        let mut v = serde_json::to_value(&p).unwrap();
        v["metadata"].as_object_mut().unwrap().remove("resourceVersion");
        v["status"] = json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]});
        s.kube.apply(&v).unwrap();
    }
}

fn claim_of<'a>(claims: &'a [NodeClaim], name: &str) -> Option<&'a NodeClaim> {
    claims.iter().find(|c| c.name == name)
}

/// What one walk saw.
struct Walk {
    /// Replacements the record named.
    replacements: Vec<String>,
    /// Each replacement's phase when the old node first lost a pod.
    at_first_eviction: Vec<Option<Phase>>,
    /// Runs taken.
    runs: usize,
}

/// Sweeps until `old` is replaced; the walk and the detail its disruption record first gave.
async fn drift_walk(
    s: &Stack,
    old: &NodeClaim,
    sweeper: &nodesmith::sweep::Sweeper<nodesmith::kubernetes::KubeCluster>,
) -> (Walk, Option<String>) {
    let detail = std::cell::RefCell::new(None);
    let w = walk(s, old, || async {
        let report = sweeper.run().await.unwrap();
        assert!(report.disruption.failed.is_empty(), "{:?}", report.disruption.failed);
        if let Some(r) = records(s).await.into_iter().find(|r| r.claim == old.name) {
            detail.borrow_mut().get_or_insert(r.detail);
        }
    })
    .await;
    (w, detail.into_inner())
}

/// Sweeps (with launches and kubelets between runs) until `old`'s claim is
/// gone; `sweep` runs one pass.
async fn walk<F, Fut>(s: &Stack, old: &NodeClaim, mut sweep: F) -> Walk
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let node = old.node_name.clone().unwrap();
    let before = pods_on(&s.kube, &node).len();
    let mut w = Walk {
        replacements: vec![],
        at_first_eviction: vec![],
        runs: 0,
    };
    for _ in 0..12 {
        sweep().await;
        w.runs += 1;
        if let Some(r) = records(s).await.into_iter().find(|r| r.claim == old.name)
            && !r.replacements.is_empty()
        {
            w.replacements = r.replacements.clone();
        }
        let claims = s.claims().await;
        if w.at_first_eviction.is_empty() && pods_on(&s.kube, &node).len() < before {
            w.at_first_eviction = w
                .replacements
                .iter()
                .map(|n| claim_of(&claims, n).map(|c| c.phase))
                .collect();
        }
        if claim_of(&claims, &old.name).is_none() {
            return w;
        }
        s.launch_all().await;
        s.kubelet_step().await;
    }
    panic!(
        "{} not disrupted after {} runs: {:?}",
        old.name,
        w.runs,
        records(s).await
    );
}

/// Asserts the old node is gone for good: instance terminated, Node and record deleted.
async fn assert_gone(s: &Stack, old: &NodeClaim) {
    let node = old.node_name.as_deref().unwrap();
    assert!(s.kube.node(node).is_none(), "the Node is deleted");
    let states = s.instance_states().await;
    let id = old.instance_id.as_deref().unwrap();
    assert!(
        matches!(states.get(id).map(String::as_str), Some("terminated" | "shutting-down")),
        "{states:?}"
    );
    assert!(records(s).await.is_empty(), "no record left");
    assert!(s.store.drains().await.unwrap().is_empty(), "no drain left");
}

fn env(s: &Stack, budget: &str) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> =
        s.m.env()
            .into_iter()
            .chain(s.kube.env_for(nodesmith_tests::kube_server::Function::Sweep))
            .map(|(k, v)| (k.to_string(), v))
            .collect();
    env.insert("NODESMITH_TABLE".into(), TABLE.into());
    env.insert("NODESMITH_CLUSTER_NAME".into(), CLUSTER.into());
    env.insert("NODESMITH_LAUNCH_QUEUE_URL".into(), s.launch_queue.clone());
    env.insert("NODESMITH_PENDING_QUEUE_URL".into(), s.pending_queue.clone());
    env.insert("NODESMITH_LIVENESS_GRACE".into(), "0s".into());
    env.insert("NODESMITH_SWEEP_BUDGET".into(), budget.into());
    env
}

/// One run of the real binary; its answer.
async fn binary(s: &Stack, budget: &str) -> Value {
    let event = json!({"version": "0", "source": "aws.scheduler", "detail-type": "Scheduled Event", "detail": {}});
    let run = invoke("sweep", &env(s, budget), &event).await.unwrap();
    assert_eq!(run.path, "req-1/response", "{}\n{}", run.body, run.logs);
    serde_json::from_str(&run.body).unwrap()
}

const EXPIRING: &str = "1h";

fn expiring_pool() -> Value {
    pool(
        &["on-demand"],
        None,
        json!({"consolidateAfter": "Never"}),
        json!({"expireAfter": EXPIRING, "terminationGracePeriod": "10m"}),
    )
}

#[tokio::test]
async fn an_expired_node_is_replaced_first_then_drained_and_terminated_by_the_binary() {
    let s = stack(expiring_pool(), json!({})).await;
    let old = s.running_node().await;
    let node = old.node_name.clone().unwrap();
    age(&s, &node, 2);

    let w = walk(&s, &old, || async {
        let out = binary(&s, "60s").await;
        assert_eq!(out["disruption"]["failed"], json!([]), "{out}");
    })
    .await;
    assert_eq!(w.replacements.len(), 1, "one replacement for two pods");
    assert_eq!(
        w.at_first_eviction,
        vec![Some(Phase::Initialized)],
        "the replacement is Initialized before the drain evicts"
    );
    assert_gone(&s, &old).await;
    let launching = events(&s, "DisruptionLaunching");
    assert!(
        launching
            .iter()
            .any(|m| m.contains("Expired") && m.contains(&w.replacements[0])),
        "{launching:?}"
    );
    assert!(!events(&s, "DisruptionWaitingReadiness").is_empty());
    assert_eq!(
        events(&s, "DisruptionTerminating"),
        vec!["Disrupting Node: Expired".to_string()]
    );
    // Each on the NodeClaim too, as Karpenter records them.
    let on_claim: Vec<(String, String)> = s
        .kube
        .events()
        .into_iter()
        .filter(|e| {
            e.involved_object.kind.as_deref() == Some("NodeClaim") && e.involved_object.name == Some(old.name.clone())
        })
        .filter_map(|e| Some((e.reason?, e.message?)))
        .collect();
    for (reason, message) in [
        ("DisruptionTerminating", "Disrupting NodeClaim: Expired".to_string()),
        (
            "DisruptionLaunching",
            format!("Launching NodeClaim: Expired (nodeclaim/{})", w.replacements[0]),
        ),
    ] {
        assert!(
            on_claim.contains(&(reason.to_string(), message)),
            "{reason}: {on_claim:?}"
        );
    }
    assert_eq!(events(&s, "Evicted").len(), 2, "both pods evicted");
    let replacement = s.store.get_node_claim(&w.replacements[0]).await.unwrap().unwrap();
    assert_eq!(replacement.phase, Phase::Initialized);
}

#[tokio::test]
async fn a_run_cut_short_after_the_taint_and_one_failing_mid_termination_are_resumed_by_the_binary() {
    let s = stack(expiring_pool(), json!({})).await;
    let old = s.running_node().await;
    let node = old.node_name.clone().unwrap();
    age(&s, &node, 2);

    // The budget is spent at once: the disruption is recorded and the node tainted, nothing more.
    let out = binary(&s, "1ms").await;
    assert_eq!(out["disruption"]["started"][0]["node"], json!(node), "{out}");
    assert_eq!(out["disruption"]["launched"], json!([]), "{out}");
    let r = records(&s).await;
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].step, DisruptionStep::Tainted);
    assert!(taint_keys(&s.kube.node(&node).unwrap()).contains(&DISRUPTED.to_string()));
    assert!(s.drain(&s.launch_queue).await.is_empty(), "no replacement yet");

    // The next run resumes; deleting the Node fails for one whole run once the drain is over.
    let mut faulted = false;
    let mut terminating_seen = false;
    for _ in 0..12 {
        let r = records(&s).await;
        if !faulted && r.first().is_some_and(|r| r.step == DisruptionStep::Draining) {
            s.kube.inject(
                Fault::new(500, 5)
                    .on(http::Method::DELETE)
                    .path(&format!("/nodes/{node}")),
            );
            faulted = true;
        }
        let out = binary(&s, "60s").await;
        let r = records(&s).await;
        if r.first().is_some_and(|r| r.step == DisruptionStep::Terminating) {
            // Cut short after the instance was terminated: the Node is still there.
            terminating_seen = true;
            assert!(s.kube.node(&node).is_some(), "{out}");
            assert_ne!(out["disruption"]["failed"], json!([]), "{out}");
        }
        if s.store.get_node_claim(&old.name).await.unwrap().is_none() {
            break;
        }
        s.launch_all().await;
        s.kubelet_step().await;
    }
    assert!(faulted && terminating_seen, "the fault hit the termination");
    assert_gone(&s, &old).await;
}

#[tokio::test]
async fn an_ec2nodeclass_change_drifts_the_node_which_is_replaced() {
    let (s, old) = one_node().await;
    let sweeper = s.sweeper(fast());
    sweeper.run().await.unwrap();
    assert!(records(&s).await.is_empty(), "nothing drifted yet");

    s.kube.apply(&json!({"apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "default"}, "spec": {
        "role": "KarpenterNodeRole-demo",
        "amiSelectorTerms": [{"alias": "al2023@latest"}],
        "subnetSelectorTerms": [{"tags": {DISCOVERY: "*"}}],
        "securityGroupSelectorTerms": [{"tags": {DISCOVERY: CLUSTER}}],
        "tags": {"team": "web"}
    }})).unwrap();
    let w = walk(&s, &old, || async {
        let report = sweeper.run().await.unwrap();
        assert!(report.disruption.failed.is_empty(), "{:?}", report.disruption.failed);
    })
    .await;
    assert_eq!(w.at_first_eviction, vec![Some(Phase::Initialized)]);
    assert_gone(&s, &old).await;
    assert_eq!(
        events(&s, "DisruptionTerminating"),
        vec!["Disrupting Node: Drifted".to_string()]
    );
}

#[tokio::test]
async fn a_requirement_change_drifts_the_node_onto_an_allowed_instance_family() {
    let (s, old) = one_node().await;
    let node = s.kube.node(old.node_name.as_deref().unwrap()).unwrap();
    let family = node.metadata.labels.as_ref().unwrap()["karpenter.k8s.aws/instance-family"].clone();
    let other = if family == "m5" { "c5" } else { "m5" };
    // The node's family is no longer allowed: its label stops satisfying the pool.
    let mut narrowed = pool(&["on-demand"], None, json!({"consolidateAfter": "Never"}), json!({}));
    narrowed["spec"]["template"]["spec"]["requirements"][0]["values"] = json!([other]);
    s.kube.apply(&narrowed).unwrap();
    let sweeper = s.sweeper(fast());
    let w = walk(&s, &old, || async {
        let report = sweeper.run().await.unwrap();
        assert!(report.disruption.failed.is_empty(), "{:?}", report.disruption.failed);
    })
    .await;
    assert_gone(&s, &old).await;
    let replacement = s.store.get_node_claim(&w.replacements[0]).await.unwrap().unwrap();
    assert!(
        replacement
            .instance_type
            .as_deref()
            .is_some_and(|t| t.starts_with(&format!("{other}."))),
        "{replacement:?}"
    );
}

/// A stack whose on-demand pool of `size` nodes (never consolidated) runs one
/// node per pod `names` asking `cpu`; every claim Initialized.
async fn one_node_per_pod(size: &str, names: &[&str], cpu: &str) -> (Stack, Vec<NodeClaim>) {
    let s = Stack::new("64", 0).await;
    s.kube
        .apply(&pool(
            &["on-demand"],
            Some(&[size]),
            json!({"consolidateAfter": "Never"}),
            json!({}),
        ))
        .unwrap();
    for n in names {
        s.kube.apply(&web_pod(n, cpu, json!({}))).unwrap();
    }
    s.kube.schedule();
    let claims = s.launched(names).await;
    assert_eq!(claims.len(), names.len(), "{claims:?}");
    let sweeper = s.sweeper(fast());
    for _ in 0..4 {
        s.kubelet_step().await;
        sweeper.run().await.unwrap();
    }
    let claims = s.claims().await;
    assert!(claims.iter().all(|c| c.phase == Phase::Initialized), "{claims:?}");
    (s, claims)
}

#[tokio::test]
async fn ten_empty_nodes_under_a_30_percent_budget_go_three_at_a_time() {
    // One 1500m pod per 2-vCPU node: ten nodes.
    let names: Vec<String> = (0..10).map(|i| format!("web-{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let (s, _) = one_node_per_pod("large", &refs, "1500m").await;
    let sweeper = s.sweeper(fast());
    // The pods finish; the nodes are empty and consolidation is allowed.
    for n in &names {
        s.kube.delete("v1", "Pod", "default", n).unwrap();
    }
    s.kube
        .apply(&pool(
            &["on-demand"],
            Some(&["large"]),
            json!({"consolidateAfter": "0s", "budgets": [{"nodes": "30%"}]}),
            json!({}),
        ))
        .unwrap();
    let mut per_pass = Vec::new();
    while !s.claims().await.is_empty() && per_pass.len() < 8 {
        let before = s.claims().await.len();
        let report = sweeper.run().await.unwrap();
        assert!(report.disruption.failed.is_empty(), "{:?}", report.disruption.failed);
        let removed = before - s.claims().await.len();
        assert!(
            removed <= (before * 3).div_ceil(10),
            "{removed} of {before}: over the budget"
        );
        per_pass.push(removed);
    }
    // ceil(30 % of what is left): 10 → 3, 7 → 3, 4 → 2, 2 → 1, 1 → 1.
    assert_eq!(per_pass, vec![3, 3, 2, 1, 1]);
    assert!(s.nodes().await.is_empty());
    assert_eq!(events(&s, "DisruptionTerminating").len(), 10);
}

#[tokio::test]
async fn a_pdb_holds_the_drain_until_replacement_pods_are_ready() {
    let (s, old) = one_node().await;
    let node = old.node_name.clone().unwrap();
    run_pods(&s);
    // A NodePool template label changes: drift by hash.
    let mut drifted = pool(&["on-demand"], None, json!({"consolidateAfter": "Never"}), json!({}));
    drifted["spec"]["template"]["metadata"]["labels"]["tier"] = json!("front");
    s.kube.apply(&drifted).unwrap();
    let sweeper = s.sweeper(fast());
    let mut replacement_node = None;
    for _ in 0..8 {
        sweeper.run().await.unwrap();
        // A PDB arrives once the node is being disrupted (a PDB allowing no
        // eviction at decision time keeps the node from being chosen at all).
        if !records(&s).await.is_empty() && s.kube.pods().len() == 2 {
            s.kube
                .apply(&json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web", "namespace": "default"},
                    "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}}))
                .unwrap();
        }
        if records(&s)
            .await
            .first()
            .is_some_and(|r| r.step == DisruptionStep::Draining)
        {
            let r = records(&s).await.remove(0);
            let c = s.store.get_node_claim(&r.replacements[0]).await.unwrap().unwrap();
            replacement_node = c.node_name.clone();
            break;
        }
        s.launch_all().await;
        s.kubelet_step().await;
    }
    let replacement_node = replacement_node.expect("the drain began once the replacement was Initialized");
    // The PDB allows no eviction: the drain waits, run after run, without force.
    for _ in 0..2 {
        sweeper.run().await.unwrap();
    }
    assert_eq!(
        pods_on(&s.kube, &node).len(),
        2,
        "no pod evicted while the PDB forbids it"
    );
    assert_eq!(records(&s).await[0].step, DisruptionStep::Draining);
    assert_eq!(
        s.store.get_node_claim(&old.name).await.unwrap().unwrap().phase,
        Phase::Draining
    );
    // The ReplicaSet's new pods become ready on the replacement: the PDB allows evictions.
    for n in ["web-2", "web-3"] {
        let mut p = web_pod(n, "900m", json!({}));
        p["spec"]["nodeName"] = json!(replacement_node);
        s.kube.apply(&p).unwrap();
    }
    run_pods(&s);
    for _ in 0..3 {
        sweeper.run().await.unwrap();
        if s.store.get_node_claim(&old.name).await.unwrap().is_none() {
            break;
        }
    }
    assert_gone(&s, &old).await;
    assert_eq!(events(&s, "Evicted").len(), 2);
}

#[tokio::test]
async fn a_do_not_disrupt_pod_blocks_drift_with_an_event_until_it_goes() {
    let s = stack(
        pool(&["on-demand"], None, json!({"consolidateAfter": "Never"}), json!({})),
        json!({"karpenter.sh/do-not-disrupt": "true"}),
    )
    .await;
    let old = s.running_node().await;
    let node = old.node_name.clone().unwrap();
    let mut drifted = pool(&["on-demand"], None, json!({"consolidateAfter": "Never"}), json!({}));
    drifted["spec"]["template"]["metadata"]["labels"]["tier"] = json!("front");
    s.kube.apply(&drifted).unwrap();
    let sweeper = s.sweeper(fast());
    for _ in 0..2 {
        let report = sweeper.run().await.unwrap();
        assert!(report.disruption.started.is_empty(), "{:?}", report.disruption);
        assert!(report.disruption.blocked.iter().any(|(n, _)| *n == node));
    }
    assert!(records(&s).await.is_empty());
    held_by_do_not_disrupt(&s, &node);
    // The annotation goes: the next pass disrupts.
    for i in 0..2 {
        let mut p = serde_json::to_value(s.kube.pod("default", &format!("web-{i}")).unwrap()).unwrap();
        p["metadata"].as_object_mut().unwrap().remove("resourceVersion");
        p["metadata"]["annotations"] = json!({});
        s.kube.apply(&p).unwrap();
    }
    let report = sweeper.run().await.unwrap();
    assert_eq!(report.disruption.started.len(), 1, "{:?}", report.disruption);
    assert!(taint_keys(&s.kube.node(&node).unwrap()).contains(&DISRUPTED.to_string()));
}

/// Takes the discovery tag off `claim`'s instance's subnet (the class's spec
/// is unchanged, only what it resolves to); the subnet's id.
async fn deselect_subnet_of(s: &Stack, claim: &NodeClaim) -> String {
    let subnet = instance(s, claim.instance_id.as_deref().unwrap())
        .await
        .subnet_id()
        .unwrap()
        .to_string();
    s.ec2
        .delete_tags()
        .resources(&subnet)
        .tags(aws_sdk_ec2::types::Tag::builder().key(DISCOVERY).build())
        .send()
        .await
        .unwrap();
    subnet
}

#[tokio::test]
async fn a_subnet_no_longer_selected_drifts_the_node_by_live_resolution() {
    let (s, old) = one_node().await;
    let sweeper = resolving_sweeper(&s).await;
    // Resolved as launched: the AMI behind the alias, the subnet and the
    // security groups all still match.
    let report = sweeper.run().await.unwrap();
    assert!(report.disruption.started.is_empty(), "{:?}", report.disruption.started);
    assert!(records(&s).await.is_empty(), "nothing drifted yet");

    // The node's subnet loses its discovery tag: the class's spec (and hash)
    // is unchanged, only what it resolves to.
    let subnet = deselect_subnet_of(&s, &old).await;

    let (w, detail) = drift_walk(&s, &old, &sweeper).await;
    assert_eq!(detail.as_deref(), Some("Drifted (SubnetDrift) by nodesmith's sweep"));
    assert_eq!(w.at_first_eviction, vec![Some(Phase::Initialized)]);
    assert_gone(&s, &old).await;
    assert_eq!(
        events(&s, "DisruptionTerminating"),
        vec!["Disrupting Node: Drifted".to_string()]
    );
    for i in replacement_instances(&s, &w).await {
        assert_ne!(
            i.subnet_id(),
            Some(subnet.as_str()),
            "the replacement is launched in a selected subnet"
        );
    }
}

/// Issue 32: a sweep lists the cluster's instances once; drift by live
/// resolution uses that list rather than reading every instance again (at
/// thousands of instances one list is most of a sweep). Counted at a proxy
/// in front of EC2.
#[tokio::test]
async fn a_sweep_lists_the_instances_once_for_liveness_and_drift() {
    use nodesmith::ec2::Instances;
    use nodesmith::sweep::Sweeper;
    use nodesmith_tests::fault_proxy::FaultProxy;
    let (s, old) = one_node().await;
    let proxy = FaultProxy::start(s.m.endpoint()).await;
    let direct = s.m.sdk_config().await;
    let counted = s.m.sdk_config_at(proxy.endpoint()).await;
    let config = s.sweep_config(fast());
    let sweeper = Sweeper::new(
        s.cluster(),
        s.store.clone(),
        Instances::new(aws_sdk_ec2::Client::new(&counted), CLUSTER),
        s.sqs.clone(),
        config,
    )
    .with_resolution(aws_sdk_ssm::Client::new(&direct), aws_sdk_eks::Client::new(&direct));
    // The node's subnet is no longer selected, so drift needs its instance's facts.
    deselect_subnet_of(&s, &old).await;
    let report = sweeper.run().await.unwrap();
    assert_eq!(
        report.disruption.started.len(),
        1,
        "the node drifted by its subnet: {report:?}"
    );
    let owned = format!("tag:kubernetes.io/cluster/{CLUSTER}");
    let lists = proxy
        .forms("DescribeInstances")
        .iter()
        .filter(|form| form.iter().any(|(_, v)| *v == owned))
        .count();
    assert_eq!(lists, 1, "one sweep listed the cluster's instances {lists} times");
}

#[tokio::test]
async fn a_new_ami_behind_the_alias_drifts_the_node_by_live_resolution() {
    let (s, old) = one_node().await;
    let launched_from = instance(&s, old.instance_id.as_deref().unwrap())
        .await
        .image_id()
        .unwrap()
        .to_string();
    let sweeper = resolving_sweeper(&s).await;
    sweeper.run().await.unwrap();
    assert!(records(&s).await.is_empty(), "nothing drifted yet");

    // A new al2023 release: only the public parameter behind the alias moves.
    let newer = "ami-0a1b2c3d4e5f60003";
    assert_eq!(
        launched_from, "ami-0a1b2c3d4e5f60001",
        "launched from the x86_64 standard alias"
    );
    s.m.set_public_parameter(
        "/aws/service/eks/optimized-ami/1.33/amazon-linux-2023/x86_64/standard/recommended/image_id",
        newer,
    );
    let (w, detail) = drift_walk(&s, &old, &sweeper).await;
    assert_eq!(detail.as_deref(), Some("Drifted (AMIDrift) by nodesmith's sweep"));
    assert_gone(&s, &old).await;
    for i in replacement_instances(&s, &w).await {
        assert_eq!(i.image_id(), Some(newer), "the replacement runs the new AMI");
    }
}

#[tokio::test]
async fn a_security_group_newly_selected_drifts_spot_nodes_by_live_resolution() {
    let s = stack(
        pool(&["spot"], None, json!({"consolidateAfter": "Never"}), json!({})),
        json!({}),
    )
    .await;
    // moto has no spot prices of its own: the sweep's catalog refresh reads these.
    let catalog = nodesmith::catalog::builtin().unwrap();
    s.m.seed_spot_prices(&nodesmith_tests::local_cloud::aws::spot_prices(catalog));
    let old = s.running_node().await;
    let groups_of = |i: &aws_sdk_ec2::types::Instance| {
        let mut ids: Vec<String> = i
            .security_groups()
            .iter()
            .filter_map(|g| g.group_id().map(str::to_string))
            .collect();
        ids.sort();
        ids
    };
    let sweeper = resolving_sweeper(&s).await;
    // A spot instance runs in its launch template's groups: nothing drifted.
    sweeper.run().await.unwrap();
    assert!(records(&s).await.is_empty(), "nothing drifted yet");

    // A second group gains the discovery tag: the class now selects two.
    let selected = s.ec2.describe_security_groups().send().await.unwrap();
    let first = selected
        .security_groups()
        .iter()
        .find(|g| g.tags().iter().any(|t| t.key() == Some(DISCOVERY)))
        .unwrap();
    let second = launch_fixtures::discovered_security_group(&s.ec2, first.vpc_id().unwrap(), "more-nodes").await;
    let mut want = vec![first.group_id().unwrap().to_string(), second];
    want.sort();

    let (w, detail) = drift_walk(&s, &old, &sweeper).await;
    assert_eq!(
        detail.as_deref(),
        Some("Drifted (SecurityGroupDrift) by nodesmith's sweep")
    );
    assert_gone(&s, &old).await;
    assert!(!w.replacements.is_empty());
    for i in replacement_instances(&s, &w).await {
        assert_eq!(groups_of(&i), want, "the replacement runs in both groups");
    }
}

/// Three xlarge nodes, each left with one 500m pod of a ReplicaSet (the big
/// pods that sized them finished), consolidation enabled; the old claims.
async fn three_underused(annotations: &[Value], pdb: Option<Value>) -> (Stack, Vec<NodeClaim>) {
    let (s, claims) = one_node_per_pod("xlarge", &["big-0", "big-1", "big-2"], "3000m").await;
    for (i, c) in claims.iter().enumerate() {
        s.kube.delete("v1", "Pod", "default", &format!("big-{i}")).unwrap();
        let mut p = web_pod(
            &format!("web-{i}"),
            "500m",
            annotations.get(i).cloned().unwrap_or(json!({})),
        );
        p["spec"]["nodeName"] = json!(c.node_name.clone().unwrap());
        s.kube.apply(&p).unwrap();
    }
    run_pods(&s);
    if let Some(p) = pdb {
        s.kube.apply(&p).unwrap();
    }
    s.kube
        .apply(&pool(
            &["on-demand"],
            Some(&["large", "xlarge"]),
            json!({"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "0s", "budgets": [{"nodes": "100%"}]}),
            json!({}),
        ))
        .unwrap();
    (s, claims)
}

/// The built-in catalog's price of the offering a claim launched as.
fn price(c: &NodeClaim) -> f64 {
    let catalog = nodesmith::catalog::builtin().unwrap();
    let t = catalog
        .instance_types
        .iter()
        .find(|t| Some(&t.name) == c.instance_type.as_ref())
        .unwrap();
    t.offerings
        .iter()
        .find(|o| Some(&o.zone) == c.zone.as_ref() && Some(&o.capacity_type) == c.capacity_type.as_ref())
        .map(|o| o.price)
        .unwrap()
}

/// Evicted pods come back pending, as their ReplicaSet recreates them, and are scheduled.
fn recreate_evicted(s: &Stack) {
    for i in 0..3 {
        let name = format!("web-{i}");
        if s.kube.pod("default", &name).is_none() {
            s.kube.apply(&web_pod(&name, "500m", json!({}))).unwrap();
        }
    }
    s.kube.schedule();
    run_pods(s);
}

#[tokio::test]
async fn three_underused_nodes_are_consolidated_into_one_cheaper_node() {
    let (s, old) = three_underused(&[], None).await;
    let old_price: f64 = old.iter().map(price).sum();
    let sweeper = s.sweeper(fast());
    for _ in 0..12 {
        let report = sweeper.run().await.unwrap();
        assert!(report.disruption.failed.is_empty(), "{:?}", report.disruption.failed);
        s.launch_all().await;
        s.kubelet_step().await;
        recreate_evicted(&s);
        let claims = s.claims().await;
        if old.iter().all(|o| claim_of(&claims, &o.name).is_none()) {
            break;
        }
    }
    let claims = s.claims().await;
    assert_eq!(claims.len(), 1, "one node replaces three: {claims:?}");
    let new = &claims[0];
    assert_eq!(new.replacement_for.as_deref(), Some("Underutilized"));
    assert!(price(new) < old_price, "{} for {old_price}", price(new));
    assert!(
        !new.instance_type.as_deref().unwrap().ends_with(".xlarge"),
        "{:?}",
        new.instance_type
    );
    let node = new.node_name.clone().unwrap();
    let annotations = s.kube.node(&node).unwrap().metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations.get("nodesmith/disruption-replacement").map(String::as_str),
        Some("Underutilized")
    );
    let mut on_new = pods_on(&s.kube, &node);
    on_new.sort();
    assert_eq!(on_new, ["web-0", "web-1", "web-2"]);
    for o in &old {
        assert_gone(&s, o).await;
    }
    let terminating = events(&s, "DisruptionTerminating");
    assert_eq!(terminating.len(), 3, "{terminating:?}");
    assert!(
        terminating.iter().all(|m| m.contains("Underutilized")),
        "{terminating:?}"
    );
}

#[tokio::test]
async fn a_pdb_that_allows_no_eviction_blocks_consolidation() {
    let pdb = json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web", "namespace": "default"},
        "spec": {"minAvailable": 3, "selector": {"matchLabels": {"app": "web"}}}});
    let (s, old) = three_underused(&[], Some(pdb)).await;
    let sweeper = s.sweeper(fast());
    for _ in 0..2 {
        let report = sweeper.run().await.unwrap();
        assert!(report.disruption.started.is_empty(), "{:?}", report.disruption);
        s.launch_all().await;
    }
    assert!(records(&s).await.is_empty());
    assert_eq!(s.claims().await.len(), 3);
    assert!(
        old.iter()
            .all(|c| s.kube.node(c.node_name.as_deref().unwrap()).is_some())
    );
    let blocked = events(&s, "DisruptionBlocked");
    assert!(
        blocked.iter().any(|m| m.contains("PodDisruptionBudget default/web")),
        "{blocked:?}"
    );
}

#[tokio::test]
async fn a_do_not_disrupt_pod_keeps_its_node_while_the_others_consolidate_onto_it() {
    let dnd = json!({"karpenter.sh/do-not-disrupt": "true"});
    let (s, old) = three_underused(&[dnd], None).await;
    let kept = old[0].node_name.clone().unwrap();
    let sweeper = s.sweeper(fast());
    for _ in 0..10 {
        sweeper.run().await.unwrap();
        s.launch_all().await;
        s.kubelet_step().await;
        recreate_evicted(&s);
        if s.claims().await.len() == 1 {
            break;
        }
    }
    let claims = s.claims().await;
    assert_eq!(claims.len(), 1, "{claims:?}");
    assert_eq!(claims[0].name, old[0].name, "the protected node stays");
    held_by_do_not_disrupt(&s, &kept);
    let mut pods = pods_on(&s.kube, &kept);
    pods.sort();
    assert_eq!(pods, ["web-0", "web-1", "web-2"], "the others' pods fit on it");
}

/// One sweep over three empty nodes consolidated together reads the claim
/// partition and the drain partition a fixed few times, not once per step of
/// every disruption (issue 32: three full claim lists per sweep and the whole
/// drain partition re-read at every step): the claims at the run's start and
/// for disruption, not again for launch templates when none is orphaned.
/// Counted at a proxy in front of DynamoDB.
#[tokio::test]
async fn a_sweep_reads_claims_and_drains_a_few_times_not_at_every_step() {
    use nodesmith::ec2::Instances;
    use nodesmith::state::StateStore;
    use nodesmith::sweep::Sweeper;
    use nodesmith_tests::fault_proxy::FaultProxy;
    let names = ["web-0", "web-1", "web-2"];
    let (s, _) = one_node_per_pod("large", &names, "1500m").await;
    for n in names {
        s.kube.delete("v1", "Pod", "default", n).unwrap();
    }
    s.kube
        .apply(&pool(
            &["on-demand"],
            Some(&["large"]),
            json!({"consolidateAfter": "0s", "budgets": [{"nodes": "100%"}]}),
            json!({}),
        ))
        .unwrap();
    let proxy = FaultProxy::start(s.m.endpoint()).await;
    let conf = s.m.sdk_config().await;
    let dynamo = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&conf)
            .endpoint_url(proxy.endpoint())
            .build(),
    );
    let config = s.sweep_config(fast());
    let sweeper = Sweeper::new(
        s.cluster(),
        StateStore::new(dynamo, TABLE),
        Instances::new(s.ec2.clone(), CLUSTER),
        s.sqs.clone(),
        config,
    );
    let report = sweeper.run().await.unwrap();
    assert!(report.disruption.failed.is_empty(), "{:?}", report.disruption.failed);
    assert_eq!(report.disruption.terminated.len(), 3, "{report:?}");
    let claim_lists = proxy.calls_matching("Query", r#""S":"NODECLAIM""#);
    let drain_reads = proxy.calls_matching("Query", r#""S":"DRAIN""#);
    assert!(
        claim_lists <= 2 && drain_reads <= 4,
        "one sweep listed the claims {claim_lists} times and the drains {drain_reads} times"
    );
}

/// `nodesmith rotate ARGS --table TABLE --output json` against the stack, as its admin.
async fn rotate(s: &Stack, args: &[&str]) -> (std::process::ExitStatus, Value, String) {
    cli(s, "rotate", args).await
}

/// `nodesmith COMMAND ARGS --table TABLE --output json` against the stack,
/// as its admin through a kubeconfig (as a user runs it): exit status, the
/// JSON printed, stderr.
async fn cli(s: &Stack, command: &str, args: &[&str]) -> (std::process::ExitStatus, Value, String) {
    let args = [args, &["--output", "json"]].concat();
    let (status, stdout, stderr) = cli_raw(s, command, &args).await;
    let json = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    (status, json, stderr)
}

/// `nodesmith COMMAND ARGS --table TABLE`: exit status, stdout and stderr as text.
async fn cli_raw(s: &Stack, command: &str, args: &[&str]) -> (std::process::ExitStatus, String, String) {
    use nodesmith::kubernetes::kube_cluster::{KUBE_TOKEN_ENV, KUBE_URL_ENV};
    let kubectl = s.kubectl(command);
    let out = tokio::process::Command::new(nodesmith_tests::binary("nodesmith"))
        .arg(command)
        .args(args)
        .args(["--table", TABLE])
        .env_remove("NODESMITH_TABLE")
        .env_remove(KUBE_URL_ENV)
        .env_remove(KUBE_TOKEN_ENV)
        .env("KUBECONFIG", &kubectl.kubeconfig)
        .envs(s.m.env())
        .output()
        .await
        .unwrap();
    let _ = std::fs::remove_dir_all(&kubectl.dir);
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status, text(&out.stdout), text(&out.stderr))
}

#[tokio::test]
async fn nodesmith_rotate_replaces_a_node_then_a_pools_nodes_one_at_a_time_replacement_first() {
    // Two nodes, a 1500m pod on each; the budget lets one node go at a time
    // (a disruption block is not part of the pool's hash: nothing drifts).
    let (s, old) = one_node_per_pod("large", &["web-0", "web-1"], "1500m").await;
    s.kube.schedule();
    s.kube
        .apply(&pool(
            &["on-demand"],
            Some(&["large"]),
            json!({"consolidateAfter": "Never", "budgets": [{"nodes": "1"}]}),
            json!({}),
        ))
        .unwrap();
    let (first, second) = (&old[0], &old[1]);
    let first_node = first.node_name.clone().unwrap();

    let (status, _, stderr) = rotate(&s, &["--node", "ip-10-9-9-9.ec2.internal"]).await;
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("node ip-10-9-9-9.ec2.internal is not a registered nodesmith node"),
        "{stderr}"
    );

    // One node: marked once; asking again keeps the first request.
    let (status, out, stderr) = rotate(&s, &["--node", &first_node]).await;
    assert!(status.success(), "{stderr}");
    let asked = &out["rotations"];
    assert_eq!(asked.as_array().map(Vec::len), Some(1), "{out}");
    assert_eq!(
        (&asked[0]["node"], &asked[0]["nodeClaim"], &asked[0]["alreadyRequested"]),
        (&json!(first_node), &json!(first.name), &json!(false))
    );
    let (_, again, _) = rotate(&s, &["--node", &first_node]).await;
    assert_eq!(again["rotations"][0]["alreadyRequested"], json!(true), "{again}");
    assert_eq!(again["rotations"][0]["requestedAt"], asked[0]["requestedAt"]);

    let sweeper = s.sweeper(fast());
    let decided = std::cell::Cell::new(0.0);
    let w = walk(&s, first, || async {
        let report = sweeper.run().await.unwrap();
        assert!(report.disruption.failed.is_empty(), "{:?}", report.disruption.failed);
        assert!(
            records(&s).await.iter().all(|r| r.claim == first.name),
            "only the node asked for is disrupted"
        );
        let labels = [
            ("decision", "replace"),
            ("reason", "drifted"),
            ("consolidation_type", "none"),
        ];
        let metric = "karpenter_voluntary_disruption_decisions_total";
        let n = nodesmith::telemetry::value(&report.metrics(), metric, &labels).unwrap_or_default();
        decided.set(decided.get() + n);
    })
    .await;
    assert_eq!(w.at_first_eviction, vec![Some(Phase::Initialized)], "replacement first");
    assert_eq!(decided.get(), 1.0, "one decision, counted as Karpenter counts it");
    assert_gone(&s, first).await;
    assert_eq!(
        events(&s, "DisruptionTerminating"),
        vec!["Disrupting Node: Drifted".to_string()]
    );
    assert!(claim_of(&s.claims().await, &second.name).is_some());

    // The pool: its two nodes now (the other one and the replacement), one
    // at a time. The evicted pod is not re-created (no controller here): the
    // workload comes back as it would, one pod per node.
    for p in s.kube.pods() {
        s.kube
            .delete("v1", "Pod", "default", p.metadata.name.as_deref().unwrap())
            .unwrap();
    }
    for n in ["web-0", "web-1"] {
        s.kube.apply(&web_pod(n, "1500m", json!({}))).unwrap();
    }
    s.kube.schedule();
    let live: Vec<String> = s.claims().await.iter().filter_map(|c| c.node_name.clone()).collect();
    assert!(live.iter().all(|n| pods_on(&s.kube, n).len() == 1), "one pod a node");
    let (status, out, stderr) = rotate(&s, &["--pool", "default"]).await;
    assert!(status.success(), "{stderr}");
    let marked: Vec<String> = out["rotations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["nodeClaim"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(marked.len(), 2, "{out}");
    assert!(marked.contains(&second.name) && w.replacements.iter().all(|r| marked.contains(r)));
    let mut runs = 0;
    while s.claims().await.iter().any(|c| marked.contains(&c.name)) {
        runs += 1;
        assert!(runs <= 24, "not rotated after {runs} runs: {:?}", records(&s).await);
        let report = sweeper.run().await.unwrap();
        assert!(report.disruption.failed.is_empty(), "{:?}", report.disruption.failed);
        assert!(records(&s).await.len() <= 1, "over the budget: {:?}", records(&s).await);
        s.launch_all().await;
        s.kubelet_step().await;
    }
    // New nodes only, not marked: the rotation is over. (The first drain's
    // pod is not re-created here, so the second rotated node's pod fits on
    // the first replacement and needs none of its own.)
    let claims = s.claims().await;
    assert!(
        !claims.is_empty() && claims.iter().all(|c| !marked.contains(&c.name)),
        "{claims:?}"
    );
    for c in &claims {
        let node = s.kube.node(c.node_name.as_deref().unwrap()).unwrap();
        let annotations = node.metadata.annotations.unwrap_or_default();
        assert!(!annotations.contains_key("nodesmith/rotate-requested"), "{}", c.name);
    }
    assert_eq!(events(&s, "DisruptionTerminating").len(), 3);
}

#[tokio::test]
async fn nodesmith_explain_says_which_rule_holds_a_node_and_why_a_pod_is_pending() {
    let (s, old) = one_node().await;
    let node = old.node_name.clone().unwrap();
    let explain = |subject: String| {
        let s = &s;
        async move {
            let (status, out, stderr) = cli(s, "explain", &[&subject]).await;
            assert!(status.success(), "{subject}: {stderr}");
            out["verdict"].as_str().unwrap_or_default().to_string()
        }
    };
    // The pool never consolidates, and nothing else wants the node.
    assert_eq!(explain(format!("node/{node}")).await, "held: consolidateAfter is Never");
    // Asked to rotate, behind a PDB that allows no eviction: the PDB holds it.
    s.kube.apply(&crate::local_stack::web_pdb()).unwrap();
    let (status, _, stderr) = rotate(&s, &["--node", &node]).await;
    assert!(status.success(), "{stderr}");
    let held = explain(format!("node/{node}")).await;
    assert!(
        held.starts_with("held: PodDisruptionBudget default/web does not allow evicting pod default/web-"),
        "{held}"
    );
    // Pods: one bound, one no node could hold, one nodesmith does not know.
    assert_eq!(
        explain("pod/default/web-0".into()).await,
        format!("not pending: bound to node {node}")
    );
    s.kube.apply(&web_pod("huge", "1000", json!({}))).unwrap();
    // Pending only once the kube-scheduler marks it Unschedulable (as for Karpenter).
    let waiting = explain("pod/default/huge".into()).await;
    assert!(
        waiting.starts_with("not pending for nodesmith: the kube-scheduler"),
        "{waiting}"
    );
    s.kube.schedule();
    let huge = explain("pod/default/huge".into()).await;
    assert!(huge.starts_with("cannot be scheduled: "), "{huge}");
    assert_eq!(explain("pod/default/nope".into()).await, "no such pod");
    let (status, _, stderr) = cli(&s, "explain", &["deployment/web"]).await;
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("name node/NAME, pod/NAMESPACE/NAME or pod/NAME"),
        "{stderr}"
    );
}

/// Issue 32: a run still reading when the invocation's deadline comes (here
/// EC2's instance list, slow as it is at thousands of instances) ends there
/// with an error instead of being ended by Lambda, and releases its lease,
/// so the next sweep goes on at once.
#[tokio::test]
async fn a_sweep_still_reading_at_the_deadline_is_cut_and_frees_its_lease() {
    let s = a_sweep_cut_at_the_deadline(false).await;
    // The lease (30 s) was released: the next sweep runs now.
    let next = s.sweeper(fast()).run().await.unwrap();
    assert!(!next.skipped, "{next:?}");
}

/// And when the release of its lease after the cut answers late too, the
/// run still answers by the deadline (the lease then expires by itself).
#[tokio::test]
async fn a_sweep_cut_at_the_deadline_answers_by_it_when_its_lease_release_answers_late() {
    a_sweep_cut_at_the_deadline(true).await;
}

/// A sweep whose instance list answers two minutes late (and, if
/// `release_late`, the release of its lease after the cut too), run with
/// 4 s left: it ends with `OutOfTime` and answers by the deadline.
async fn a_sweep_cut_at_the_deadline(release_late: bool) -> Stack {
    use nodesmith::deadline::Deadline;
    use nodesmith::ec2::Instances;
    use nodesmith::state::StateStore;
    use nodesmith::sweep::{SweepError, Sweeper};
    use nodesmith_tests::fault_proxy::FaultProxy;
    use std::time::Duration;
    let (s, _) = one_node().await;
    let proxy = FaultProxy::start(s.m.endpoint()).await;
    proxy.answer_late("DescribeInstances", 1, Duration::from_secs(120));
    if release_late {
        // The lease's acquisition, the first UpdateItem, on time.
        proxy.answer_late_after("UpdateItem", 1, 1, Duration::from_secs(120));
    }
    let conf = s.m.sdk_config_at(proxy.endpoint()).await;
    let mut config = s.sweep_config(fast());
    // Long enough that only a release lets the next sweep in at once, and
    // no renewal comes before the deadline (the late UpdateItem is the release).
    config.lease = Duration::from_secs(30);
    let slow = Sweeper::new(
        s.cluster(),
        StateStore::new(aws_sdk_dynamodb::Client::new(&conf), TABLE),
        Instances::new(aws_sdk_ec2::Client::new(&conf), CLUSTER),
        s.sqs.clone(),
        config,
    );
    let deadline = Deadline::after(Duration::from_secs(4));
    let cut = slow.run_within(deadline).await;
    assert!(matches!(cut, Err(SweepError::OutOfTime)), "{cut:?}");
    // Not a measure of speed: the answer comes by the deadline, not two
    // minutes on with the late answer (which Lambda would have ended).
    assert!(
        deadline.instant() + Duration::from_secs(60) > tokio::time::Instant::now(),
        "answered when the late answer came back, long past the deadline"
    );
    s
}

/// Issue 32: a run whose disruption walks are out of time still registers
/// a node that joined. The invocation's deadline leaves 20 s of the 60-s
/// budget: past the walks' share (39 s), before the drain pass's (54 s).
/// Lifecycle actions go on until then; stopped with the walks, a slow
/// cluster's sweeps registered no node at all.
#[tokio::test]
async fn a_run_past_its_walks_still_registers_a_node_that_joined() {
    use nodesmith::deadline::Deadline;
    use nodesmith::lifecycle::Action;
    use std::time::Duration;
    let s = stack(expiring_pool(), json!({})).await;
    let old = s.running_node().await;
    age(&s, old.node_name.as_deref().unwrap(), 2);
    // A third pod has no room on the full node: a new claim, launched, its Node joined.
    s.kube.apply(&web_pod("web-2", "900m", json!({}))).unwrap();
    s.kube.schedule();
    let outcome = s.provision(&["web-2"]).await;
    assert_eq!(outcome.created.len(), 1, "{outcome:?}");
    s.launch_all().await;
    s.kubelet_step().await;
    let joined = outcome.created[0].name.clone();

    let sweeper = s.sweeper(fast());
    let late = sweeper
        .run_at_within(jiff::Timestamp::now(), Deadline::after(Duration::from_secs(20)))
        .await
        .unwrap();
    assert!(
        late.done
            .iter()
            .any(|a| matches!(a, Action::Register { claim, .. } if *claim == joined)),
        "the joined node is registered: {late:?}"
    );
    assert!(late.deferred.is_empty(), "{late:?}");
    assert_eq!(late.disruption.deferred, 1, "the expired node's walk waits: {late:?}");
    let record = records(&s).await.into_iter().find(|r| r.claim == old.name);
    assert!(record.is_some_and(|r| r.replacements.is_empty()), "begun, not walked");

    // With the whole budget, the same walk goes on: it waited for time alone.
    // Its replacement is launched though the new node has room for the
    // expired node's pods: that room is pending web-2's.
    let next = sweeper.run().await.unwrap();
    assert_eq!(next.disruption.deferred, 0, "{next:?}");
    let record = records(&s).await.into_iter().find(|r| r.claim == old.name);
    assert!(
        record.as_ref().is_some_and(|r| !r.replacements.is_empty()),
        "replacement launched: {record:?} {next:?}"
    );
}
