//! Static capacity (NodePool `replicas`) on the local stack: the sweep
//! launches the pool's replicas through the capacity door (claims written,
//! launch requests queued, `launch` runs them on moto), launches nothing
//! more once at the count, replaces a replica whose instance is lost, and
//! drains and terminates the surplus when `replicas` is lowered.

use crate::local_stack::{Stack, fast};
use nodesmith::nodeclaim::{NodeClaim, Phase};
use serde_json::json;

fn static_pool(replicas: i64) -> serde_json::Value {
    json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "fixed"}, "spec": {
        "replicas": replicas,
        "template": {"spec": {
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
            "requirements": [
                {"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["m5", "c5"]},
                {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}
            ]
        }}
    }})
}

fn fixed(claims: &[NodeClaim]) -> Vec<&NodeClaim> {
    claims.iter().filter(|c| c.node_pool == "fixed").collect()
}

#[tokio::test]
async fn a_static_pool_keeps_its_replicas_launched_through_the_one_door_and_replaces_a_lost_one() {
    let s = Stack::new("64", 0).await;
    s.kube.apply(&static_pool(2)).unwrap();
    let sweeper = s.sweeper(fast());

    let report = sweeper.run().await.unwrap();
    assert_eq!(report.replicas.launched.len(), 2, "{:?}", report.replicas);
    let claims = s.claims().await;
    assert_eq!(fixed(&claims).len(), 2, "{claims:?}");
    // Launched by `launch` from the queued requests, as provisioning's claims are.
    s.launch_all().await;
    let claims = s.claims().await;
    let launched = fixed(&claims);
    assert!(launched.iter().all(|c| c.phase == Phase::Launched), "{launched:?}");
    let ids: Vec<String> = launched.iter().filter_map(|c| c.instance_id.clone()).collect();
    assert_eq!(ids.len(), 2);

    // At the count: nothing more, run after run.
    for _ in 0..2 {
        s.kubelet_step().await;
        let report = sweeper.run().await.unwrap();
        assert!(report.replicas.launched.is_empty(), "{:?}", report.replicas);
    }
    assert_eq!(fixed(&s.claims().await).len(), 2);

    // A replica lost: its claim goes, and the next sweep launches another.
    s.ec2.terminate_instances().instance_ids(&ids[0]).send().await.unwrap();
    let mut relaunched = Vec::new();
    for _ in 0..4 {
        s.kubelet_step().await;
        let report = sweeper.run().await.unwrap();
        relaunched.extend(report.replicas.launched);
        if !relaunched.is_empty() {
            break;
        }
    }
    assert_eq!(relaunched.len(), 1, "the lost replica is replaced once");
    let claims = s.claims().await;
    let live: Vec<&NodeClaim> = fixed(&claims)
        .into_iter()
        .filter(|c| c.instance_id.as_deref() != Some(ids[0].as_str()) && c.phase.holds_capacity())
        .collect();
    assert_eq!(live.len(), 2, "{claims:?}");
}

#[tokio::test]
async fn a_lowered_replicas_drains_and_terminates_the_surplus_and_launches_nothing() {
    let s = Stack::new("64", 0).await;
    s.kube.apply(&static_pool(2)).unwrap();
    let sweeper = s.sweeper(fast());
    sweeper.run().await.unwrap();
    s.launch_all().await;
    // Both replicas join and are registered and initialized.
    for _ in 0..3 {
        s.kubelet_step().await;
        sweeper.run().await.unwrap();
    }
    let claims = s.claims().await;
    assert!(
        fixed(&claims).iter().all(|c| c.phase == Phase::Initialized),
        "{claims:?}"
    );

    s.kube.apply(&static_pool(1)).unwrap();
    let report = sweeper.run().await.unwrap();
    assert_eq!(report.replicas.surplus.len(), 1, "{:?}", report.replicas);
    assert!(report.replicas.launched.is_empty(), "{:?}", report.replicas);
    let gone = report.replicas.surplus[0].clone();
    let claims = s.claims().await;
    let draining = claims.iter().find(|c| c.name == gone).expect("the surplus claim");
    assert_eq!(draining.phase, Phase::Draining, "{draining:?}");
    let id = draining.instance_id.clone().expect("launched");

    // The drain finishes (nothing to evict), then the instance and the claim go.
    for _ in 0..3 {
        s.kubelet_step().await;
        let report = sweeper.run().await.unwrap();
        assert!(
            report.replicas.launched.is_empty(),
            "no replacement: {:?}",
            report.replicas
        );
        if !s.claims().await.iter().any(|c| c.name == gone) {
            break;
        }
    }
    let claims = s.claims().await;
    assert!(!claims.iter().any(|c| c.name == gone), "{claims:?}");
    assert_eq!(fixed(&claims).len(), 1, "{claims:?}");
    let state = s.instance_states().await.get(&id).cloned();
    assert!(
        matches!(state.as_deref(), Some("terminated" | "shutting-down")),
        "the surplus instance is terminated: {state:?}"
    );
}
