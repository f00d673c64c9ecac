//! Reservations that end, on the local stack (moto, the Kubernetes API test
//! server): a node whose ODCR is cancelled is relabelled on-demand and its
//! claim priced on-demand; a node in a capacity block is drained and
//! terminated from 40 minutes before the block's end, before EC2 reclaims it.

use std::collections::BTreeMap;

use crate::launch_fixtures;
use crate::local_stack::{Stack, fast};
use nodesmith::kubernetes::Cluster;
use nodesmith::nodeclaim::{NodeClaim, Phase};
use nodesmith::sweep::Sweeper;

async fn sweeper(s: &Stack) -> Sweeper<nodesmith::kubernetes::KubeCluster> {
    let conf = s.m.sdk_config().await;
    s.sweeper(fast())
        .with_resolution(aws_sdk_ssm::Client::new(&conf), aws_sdk_eks::Client::new(&conf))
}

fn node_labels(s: &Stack, instance_id: &str) -> Option<BTreeMap<String, String>> {
    s.kube
        .nodes()
        .into_iter()
        .find(|n| {
            n.spec
                .as_ref()
                .and_then(|sp| sp.provider_id.as_deref())
                .is_some_and(|p| p.ends_with(instance_id))
        })
        .map(|n| n.metadata.labels.unwrap_or_default())
}

fn in_reservation<'a>(claims: &'a [NodeClaim], id: &str) -> &'a NodeClaim {
    claims
        .iter()
        .find(|c| c.capacity_reservation.as_ref().is_some_and(|r| r.id == id))
        .unwrap_or_else(|| panic!("no claim in {id}: {claims:#?}"))
}

#[tokio::test]
async fn a_cancelled_reservation_relabels_its_node_and_an_ending_capacity_block_drains_its_node() {
    let s = Stack::new("64", 4).await;
    let sweeper = sweeper(&s).await;
    // An ODCR of m5.large and a capacity block of c5.large ending in two hours, both the team's.
    let odcr = launch_fixtures::capacity_reservation(&s.ec2, "m5.large", "us-east-1a", 1, "ml").await;
    let block = "cr-0b10c000000000002";
    let end = jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::from_hours(2))
        .unwrap();
    s.m.seed_reservation(&serde_json::json!({
        "id": block, "type": "c5.large", "zone": "us-east-1a", "count": 1,
        "reservationType": "capacity-block", "endDate": end.to_string(), "tags": {"team": "ml"},
    }));
    let mut pool = serde_json::to_value(s.cluster().node_pools().await.unwrap().remove(0)).unwrap();
    pool["spec"]["template"]["spec"]["requirements"][1]["values"] = serde_json::json!(["reserved", "on-demand"]);
    // Consolidation stays out of it: the relabelled node is priced, not moved.
    pool["spec"]["disruption"]["consolidateAfter"] = serde_json::json!("Never");
    pool["metadata"]["resourceVersion"] = serde_json::Value::Null;
    s.kube.apply(&pool).unwrap();
    let mut class = serde_json::to_value(s.cluster().node_class("default").await.unwrap().unwrap()).unwrap();
    class["spec"]["capacityReservationSelectorTerms"] = serde_json::json!([{"tags": {"team": "ml"}}]);
    class["metadata"]["resourceVersion"] = serde_json::Value::Null;
    s.kube.apply(&class).unwrap();
    sweeper.run().await.unwrap();

    // Two reserved nodes, one in each reservation, join.
    s.drain(&s.pending_queue).await;
    let outcome = s.provision(&["web-0", "web-1", "web-2", "web-3"]).await;
    assert_eq!(outcome.created.len(), 2, "{outcome:?}");
    s.launch_all().await;
    for _ in 0..2 {
        s.kubelet_step().await;
        sweeper.run().await.unwrap();
    }
    let claims = s.claims().await;
    let (in_odcr, in_block) = (
        in_reservation(&claims, &odcr).clone(),
        in_reservation(&claims, block).clone(),
    );
    let odcr_instance = in_odcr.instance_id.clone().unwrap();
    let block_instance = in_block.instance_id.clone().unwrap();
    assert_eq!(
        node_labels(&s, &odcr_instance).expect("joined")["karpenter.sh/capacity-type"],
        "reserved"
    );

    // The ODCR is cancelled: EC2 runs its instance on outside it.
    s.ec2
        .cancel_capacity_reservation()
        .capacity_reservation_id(&odcr)
        .send()
        .await
        .unwrap();
    // 85 minutes on, the block ends in 35: within Karpenter's 40.
    let later = jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::from_mins(85))
        .unwrap();
    for _ in 0..3 {
        sweeper.run_at(later).await.unwrap();
    }

    let labels = node_labels(&s, &odcr_instance).expect("the ODCR node stays");
    assert_eq!(labels["karpenter.sh/capacity-type"], "on-demand", "{labels:?}");
    assert!(
        !labels.contains_key("karpenter.k8s.aws/capacity-reservation-id")
            && !labels.contains_key("karpenter.k8s.aws/capacity-reservation-type"),
        "{labels:?}"
    );
    let claim = s.store.get_node_claim(&in_odcr.name).await.unwrap().unwrap();
    assert_eq!(claim.capacity_type.as_deref(), Some("on-demand"));
    assert_eq!(claim.capacity_reservation, None);
    assert_eq!(claim.phase, Phase::Initialized);
    assert!(
        claim.price.is_some_and(|p| p > 0.05),
        "priced on-demand now: {:?}",
        claim.price
    );

    // The capacity block's node was drained and terminated ahead of EC2.
    assert_eq!(
        s.instance_states().await.get(&block_instance).map(String::as_str),
        Some("terminated")
    );
    assert!(s.store.get_node_claim(&in_block.name).await.unwrap().is_none());
    assert!(node_labels(&s, &block_instance).is_none(), "its Node is gone");
}
