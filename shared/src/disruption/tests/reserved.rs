//! Consolidation and reserved capacity: a reservation with room is where
//! work goes first (its price is near zero, it is paid for already), whether
//! it is a new reserved node of the replaced node's own type or an existing
//! reserved node with room.

use super::*;

/// A class selecting one ODCR of m.xlarge in zone b with room for `room` instances.
fn reserving_class(room: u32) -> crate::apis::EC2NodeClass {
    serde_yaml_ng::from_str(&format!(
        r#"
apiVersion: karpenter.k8s.aws/v1
kind: EC2NodeClass
metadata: {{name: default}}
spec:
  role: NodeRole
  amiSelectorTerms: [{{alias: al2023@latest}}]
  subnetSelectorTerms: [{{tags: {{discovery: demo}}}}]
  securityGroupSelectorTerms: [{{tags: {{discovery: demo}}}}]
  capacityReservationSelectorTerms: [{{tags: {{team: ml}}}}]
status:
  capacityReservations:
    - {{id: cr-1, instanceType: m.xlarge, availabilityZone: test-zone-b, reservationType: default, state: active, availableInstanceCount: {room}}}
"#
    ))
    .unwrap()
}

/// Only m.xlarge, reserved or on-demand: the replaced node's own type is the only option.
fn m_xlarge_pool() -> NodePool {
    pool_requiring(
        "      - {key: karpenter.sh/capacity-type, operator: In, values: [reserved, on-demand]}\n      - {key: node.kubernetes.io/instance-type, operator: In, values: [m.xlarge]}\n",
        "",
    )
}

fn with_class(mut s: Snapshot, room: u32) -> Snapshot {
    s.node_classes = vec![reserving_class(room)];
    s
}

#[test]
fn an_on_demand_node_moves_into_a_reservation_of_its_own_type() {
    let s = with_class(
        snapshot(
            m_xlarge_pool(),
            vec![(node("a", 2.0, json!({})), vec![sized("a-0", "a", "1")])],
        ),
        1,
    );
    let d = run(&s);
    let cmd = underutilized(&d).unwrap_or_else(|| panic!("not consolidated: {:?}", d.blocked));
    assert_eq!(cmd.nodes, ["a"]);
    let r = &cmd.replacements[0];
    assert_eq!(
        (r.instance_type.as_str(), r.zone.as_str(), r.capacity_type.as_str()),
        ("m.xlarge", "test-zone-b", "reserved"),
        "{r:#?}"
    );
    assert_eq!(r.labels[labels::aws::CAPACITY_RESERVATION_ID], "cr-1");
    // Launched only into the reservation: were it full by then, an on-demand
    // node of the same type would save nothing.
    let ct = r.requirements.get(labels::CAPACITY_TYPE).expect("capacity type pinned");
    assert!(ct.has("reserved") && !ct.has("on-demand"), "{ct:?}");
    assert!(cmd.savings_per_hour > 0.19, "{}", cmd.savings_per_hour);
}

#[test]
fn a_full_reservation_leaves_a_node_of_its_type_alone() {
    let s = with_class(
        snapshot(
            m_xlarge_pool(),
            vec![(node("a", 2.0, json!({})), vec![sized("a-0", "a", "1")])],
        ),
        0,
    );
    let d = run(&s);
    assert!(underutilized(&d).is_none(), "{:?}", d.decisions);
}

#[test]
fn a_paid_node_s_pods_move_onto_a_reserved_node_with_room() {
    let reserved = json!({"metadata": {"labels": {
        "karpenter.sh/capacity-type": "reserved", "topology.kubernetes.io/zone": "test-zone-b",
        "karpenter.k8s.aws/capacity-reservation-id": "cr-1",
        "karpenter.k8s.aws/capacity-reservation-type": "default"}}});
    let s = with_class(
        snapshot(
            m_xlarge_pool(),
            vec![
                (node("paid", 2.0, json!({})), vec![sized("paid-0", "paid", "1")]),
                (node("r", 2.0, reserved), vec![sized("r-0", "r", "1")]),
            ],
        ),
        0,
    );
    let d = run(&s);
    assert_eq!(
        decided(&d),
        [(Reason::Underutilized, "paid".to_string())],
        "{:?}",
        d.blocked
    );
    let cmd = underutilized(&d).unwrap();
    assert!(cmd.replacements.is_empty(), "{:?}", cmd.replacements);
    assert!(cmd.moves.iter().all(|m| m.to == "r"), "{:?}", cmd.moves);
}
