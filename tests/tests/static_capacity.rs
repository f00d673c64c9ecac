//! Static capacity (NodePool `replicas`) on the local stack: the sweep
//! launches the pool's replicas through the capacity door (claims written,
//! launch requests queued, `launch` runs them on moto), launches nothing
//! more once at the count, and replaces a replica whose instance is lost.

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
