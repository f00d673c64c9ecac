//! Table tests, one or more per constraint family: each asserts the plan a
//! wrong solver would get wrong.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use serde_json::json;

use super::fixtures::{catalog, default_pool, pod, pool};
use super::*;
use crate::catalog::Catalog;
use crate::labels;
use crate::nodeclaim::Phase;

struct Case {
    catalog: Catalog,
    pools: Vec<NodePool>,
    pods: Vec<Pod>,
    nodes: Vec<ExistingNode>,
    claims: Vec<NodeClaim>,
    daemon_sets: Vec<DaemonSet>,
    pvs: Vec<PersistentVolume>,
    pvcs: Vec<PersistentVolumeClaim>,
    scs: Vec<StorageClass>,
    unavailable: Vec<OfferingKey>,
    shifted_zones: std::collections::BTreeSet<String>,
    classes: Vec<crate::apis::EC2NodeClass>,
    namespaces: Vec<k8s_openapi::api::core::v1::Namespace>,
    improve: bool,
}

impl Case {
    fn input(&self) -> SolveInput<'_> {
        SolveInput {
            pods: &self.pods,
            nodes: &self.nodes,
            node_claims: &self.claims,
            node_pools: &self.pools,
            node_classes: &self.classes,
            daemon_sets: &self.daemon_sets,
            persistent_volumes: &self.pvs,
            persistent_volume_claims: &self.pvcs,
            storage_classes: &self.scs,
            namespaces: &self.namespaces,
            catalog: &self.catalog,
            unavailable: &self.unavailable,
            shifted_zones: &self.shifted_zones,
        }
    }
    fn new(pods: Vec<Pod>) -> Self {
        Case {
            catalog: catalog(),
            pools: vec![default_pool()],
            pods,
            nodes: vec![],
            claims: vec![],
            daemon_sets: vec![],
            pvs: vec![],
            pvcs: vec![],
            scs: vec![],
            unavailable: vec![],
            shifted_zones: Default::default(),
            classes: vec![],
            namespaces: vec![],
            improve: true,
        }
    }
    fn pools(mut self, pools: Vec<NodePool>) -> Self {
        self.pools = pools;
        self
    }
    fn solve(&self) -> Plan {
        let options = SolveOptions {
            improve: self.improve,
            ..SolveOptions::default()
        };
        let plan = solve(&self.input(), &options);
        check_accounting(&self.pods, &plan);
        plan
    }
}

/// Every pending pod appears exactly once.
fn check_accounting(pods: &[Pod], plan: &Plan) {
    let mut seen: Vec<String> = plan
        .node_claims
        .iter()
        .flat_map(|c| c.pods.iter().map(|p| p.to_string()))
        .collect();
    seen.extend(plan.existing.iter().flat_map(|e| e.pods.iter().map(|p| p.to_string())));
    seen.extend(plan.unschedulable.iter().map(|u| u.pod.to_string()));
    seen.sort();
    let mut want: Vec<String> = pods.iter().map(|p| PodRef::of(p).to_string()).collect();
    want.sort();
    assert_eq!(seen, want, "every pod exactly once");
}

fn claim_of<'a>(plan: &'a Plan, pod: &str) -> &'a NewNodeClaim {
    plan.node_claims
        .iter()
        .find(|c| c.pods.iter().any(|p| p.name == pod))
        .unwrap_or_else(|| panic!("{pod} not on a new claim: {plan:#?}"))
}

fn pods(prefix: &str, n: usize, cpu: &str, mem: &str, extra: serde_json::Value) -> Vec<Pod> {
    (0..n)
        .map(|i| pod(&format!("{prefix}-{i}"), cpu, mem, extra.clone()))
        .collect()
}

fn app(app: &str) -> serde_json::Value {
    json!({"metadata": {"labels": {"app": app}}})
}

fn with(mut a: serde_json::Value, b: serde_json::Value) -> serde_json::Value {
    fixtures::merge(&mut a, b);
    a
}

fn node(name: &str, zone: &str, cpu: &str, mem: &str, extra: serde_json::Value) -> Node {
    let mut v = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "topology.kubernetes.io/zone": zone,
            "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux",
            "node.kubernetes.io/instance-type": "m.xlarge"}},
        "status": {"allocatable": {"cpu": cpu, "memory": mem, "pods": "50"}, "capacity": {"cpu": cpu, "memory": mem, "pods": "50"}}
    });
    fixtures::merge(&mut v, extra);
    serde_json::from_value(v).unwrap()
}

fn running(name: &str, node: &str, cpu: &str, extra: serde_json::Value) -> Pod {
    pod(name, cpu, "100Mi", with(json!({"spec": {"nodeName": node}}), extra))
}

// ---------- requests ----------

#[test]
fn effective_requests_count_init_containers_sidecars_overhead_and_a_pod_slot() {
    let p = pod(
        "x",
        "1",
        "1Gi",
        json!({"spec": {
            "initContainers": [
                {"name": "sidecar", "image": "i", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}},
                {"name": "init", "image": "i", "resources": {"requests": {"cpu": "1200m", "memory": "3Gi"}}}
            ],
            "overhead": {"cpu": "100m"}
        }}),
    );
    let m = pod::PodModel::from_pod(&p).unwrap();
    // cpu: max(1200m + 500m sidecar, 1 + 500m) + 100m = 1800m; memory: max(3Gi, 1Gi) = 3Gi.
    assert_eq!(m.requests.get("cpu").milli(), 1800);
    assert_eq!(m.requests.get("memory").to_k8s_string("memory"), "3Gi");
    assert_eq!(m.requests.get("pods").milli(), 1000);
}

#[test]
fn pod_level_resources_are_the_pods_requests_where_set() {
    // Two containers asking 250m each, the pod 2 cpu for both (Kubernetes 1.32+):
    // cpu is the pod's, memory still the containers' sum, plus overhead.
    let p = pod(
        "x",
        "250m",
        "1Gi",
        json!({"spec": {
            "containers": [
                {"name": "a", "image": "i", "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}}},
                {"name": "b", "image": "i", "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}}}
            ],
            "resources": {"requests": {"cpu": "2"}},
            "overhead": {"cpu": "100m"}
        }}),
    );
    let m = pod::PodModel::from_pod(&p).unwrap();
    assert_eq!(m.requests.get("cpu").milli(), 2100);
    assert_eq!(m.requests.get("memory").to_k8s_string("memory"), "2Gi");
    // A pod-level limit alone is the request, as for containers.
    let limited = pod(
        "y",
        "250m",
        "1Gi",
        json!({"spec": {"resources": {"limits": {"memory": "3Gi"}}}}),
    );
    let m = pod::PodModel::from_pod(&limited).unwrap();
    assert_eq!(m.requests.get("memory").to_k8s_string("memory"), "3Gi");
    // The plan sizes the node for it.
    let plan = Case::new(vec![p]).solve();
    assert_eq!(claim_of(&plan, "x").instance_type, "c.xlarge", "2.1 cpu does not fit 2");
}

#[test]
fn requests_default_to_limits() {
    let p = pod(
        "x",
        "1",
        "1Gi",
        json!({"spec": {"containers": [{"name": "c", "image": "i", "resources": {"limits": {"cpu": "3", "memory": "2Gi"}}}]}}),
    );
    let m = pod::PodModel::from_pod(&p).unwrap();
    assert_eq!(m.requests.get("cpu").milli(), 3000);
    // A 3-cpu pod needs a 4-cpu type.
    let plan = Case::new(vec![p]).solve();
    assert_eq!(claim_of(&plan, "x").instance_type, "c.xlarge");
}

#[test]
fn bad_quantity_names_the_field() {
    let p = pod("x", "lots", "1Gi", json!({}));
    let e = pod::PodModel::from_pod(&p).unwrap_err();
    assert_eq!(e.path, "spec.containers[0].resources.requests.cpu");
    let plan = Case::new(vec![p]).solve();
    assert!(
        plan.unschedulable[0]
            .reason
            .to_string()
            .contains("spec.containers[0].resources.requests.cpu"),
        "{plan:?}"
    );
}

// ---------- basic packing and pricing ----------

#[test]
fn packs_small_pods_onto_the_cheapest_spot_type() {
    let plan = Case::new(pods("p", 3, "500m", "512Mi", json!({}))).solve();
    assert_eq!(plan.node_claims.len(), 1);
    let c = &plan.node_claims[0];
    assert_eq!(c.instance_type, "c.large");
    assert_eq!(c.capacity_type, "spot");
    assert_eq!(c.price, 0.03);
    assert_eq!(c.instance_type_options.first().map(String::as_str), Some("c.large"));
    assert!(
        !c.instance_type_options.contains(&"g.xlarge".to_string()),
        "no GPU types for pods that do not ask"
    );
    assert!(c.name.starts_with("default-") && c.name.len() == "default-".len() + 5);
    assert_eq!(c.labels.get(labels::HOSTNAME), Some(&c.name));
    for k in [
        labels::INSTANCE_TYPE,
        labels::ZONE,
        labels::REGION,
        labels::CAPACITY_TYPE,
        labels::NODEPOOL,
        labels::ARCH,
        labels::OS,
    ] {
        assert!(c.labels.contains_key(k), "label {k} missing");
    }
    assert_eq!(c.requests.get("cpu").milli(), 1500);
    assert_eq!(c.requests.get("pods").milli(), 3000);
}

#[test]
fn on_demand_only_pool_launches_on_demand() {
    let p = pool(
        "od",
        "template:\n  spec:\n    nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}\n    requirements:\n      - {key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}",
    );
    let plan = Case::new(pods("p", 1, "1", "1Gi", json!({}))).pools(vec![p]).solve();
    assert_eq!(plan.node_claims[0].capacity_type, "on-demand");
    assert_eq!(plan.node_claims[0].price, 0.08);
}

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

fn capacity_pool(types: &str) -> NodePool {
    pool(
        "res",
        &format!(
            "template:\n  spec:\n    nodeClassRef: {{group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}}\n    requirements:\n      - {{key: karpenter.sh/capacity-type, operator: In, values: [{types}]}}"
        ),
    )
}

#[test]
fn reserved_capacity_is_used_first_and_never_beyond_its_room() {
    let mut case = Case::new(pods("p", 5, "3500m", "1Gi", json!({}))).pools(vec![capacity_pool("reserved, on-demand")]);
    case.classes = vec![reserving_class(2)];
    let plan = case.solve();
    let reserved: Vec<&NewNodeClaim> = plan
        .node_claims
        .iter()
        .filter(|c| c.capacity_type == "reserved")
        .collect();
    assert_eq!(reserved.len(), 2, "{:#?}", plan.node_claims);
    for c in &reserved {
        assert_eq!((c.instance_type.as_str(), c.zone.as_str()), ("m.xlarge", "test-zone-b"));
        assert_eq!(c.labels[labels::aws::CAPACITY_RESERVATION_ID], "cr-1");
        assert_eq!(c.labels[labels::aws::CAPACITY_RESERVATION_TYPE], "default");
        assert!(c.price < 0.001, "reserved capacity is paid for already: {}", c.price);
    }
    let rest: Vec<&NewNodeClaim> = plan
        .node_claims
        .iter()
        .filter(|c| c.capacity_type != "reserved")
        .collect();
    assert_eq!(rest.len(), 3);
    assert!(
        rest.iter()
            .all(|c| c.capacity_type == "on-demand" && !c.labels.contains_key(labels::aws::CAPACITY_RESERVATION_ID))
    );

    // A pool that does not allow reserved capacity never uses it.
    let mut case = Case::new(pods("p", 2, "3500m", "1Gi", json!({}))).pools(vec![capacity_pool("on-demand")]);
    case.classes = vec![reserving_class(2)];
    assert!(case.solve().node_claims.iter().all(|c| c.capacity_type == "on-demand"));
    // A reservation out of room is not offered.
    let mut case = Case::new(pods("p", 1, "3500m", "1Gi", json!({}))).pools(vec![capacity_pool("reserved, on-demand")]);
    case.classes = vec![reserving_class(0)];
    assert_eq!(case.solve().node_claims[0].capacity_type, "on-demand");
}

#[test]
fn pods_select_or_avoid_reserved_capacity_by_its_labels() {
    let pool = || vec![capacity_pool("reserved, spot, on-demand")];
    let selector = |key: &str, op: &str, values: &[&str]| {
        json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": key, "operator": op, "values": values}]}]}}}}})
    };
    let mut pinned = pods(
        "pin",
        1,
        "1",
        "1Gi",
        selector(labels::aws::CAPACITY_RESERVATION_ID, "In", &["cr-1"]),
    );
    let avoid = pods(
        "avoid",
        1,
        "1",
        "1Gi",
        selector(labels::aws::CAPACITY_RESERVATION_ID, "DoesNotExist", &[]),
    );
    let blocks = pods(
        "block",
        1,
        "1",
        "1Gi",
        selector(labels::aws::CAPACITY_RESERVATION_TYPE, "In", &["capacity-block"]),
    );
    pinned.extend(avoid);
    pinned.extend(blocks);
    let mut case = Case::new(pinned).pools(pool());
    case.classes = vec![reserving_class(5)];
    let plan = case.solve();
    let pin = claim_of(&plan, "pin-0");
    assert_eq!(
        (pin.capacity_type.as_str(), pin.instance_type.as_str()),
        ("reserved", "m.xlarge")
    );
    let avoid = claim_of(&plan, "avoid-0");
    assert_eq!(avoid.capacity_type, "spot", "{avoid:?}");
    assert!(
        plan.unschedulable.iter().any(|u| u.pod.name == "block-0"),
        "no capacity block is selected: {:?}",
        plan.unschedulable
    );
}

#[test]
fn unavailable_offerings_are_skipped() {
    let mut case = Case::new(pods(
        "p",
        1,
        "1",
        "1Gi",
        json!({"spec": {"nodeSelector": {"topology.kubernetes.io/zone": "test-zone-a"}}}),
    ));
    case.unavailable = vec![OfferingKey::new("c.large", "test-zone-a", "spot")];
    let plan = case.solve();
    let c = &plan.node_claims[0];
    assert!(!(c.instance_type == "c.large" && c.capacity_type == "spot"), "{c:?}");
    assert_eq!(c.instance_type, "a.large");
}

#[test]
fn too_big_pod_is_unschedulable_with_the_resource_named() {
    let plan = Case::new(pods("huge", 1, "900", "1Gi", json!({}))).solve();
    assert_eq!(plan.node_claims.len(), 0);
    assert_eq!(
        plan.unschedulable[0].reason.to_string(),
        "no instance type in NodePool default fits 900 cpu"
    );
}

#[test]
fn no_pools_means_unschedulable() {
    let plan = Case::new(pods("p", 1, "1", "1Gi", json!({}))).pools(vec![]).solve();
    assert_eq!(plan.unschedulable[0].reason.to_string(), "no NodePool");
}

// ---------- extended resources / accelerators ----------

#[test]
fn gpu_pods_get_gpu_types_and_others_never_do() {
    let gpu = pod(
        "gpu",
        "1",
        "1Gi",
        json!({"spec": {"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}}]}}),
    );
    let plain = pods("big", 1, "3500m", "14Gi", json!({}));
    let mut all = vec![gpu];
    all.extend(plain);
    let plan = Case::new(all).solve();
    assert_eq!(claim_of(&plan, "gpu").instance_type, "g.xlarge");
    let big = claim_of(&plan, "big-0");
    assert_eq!(big.instance_type, "m.xlarge");
    assert!(!big.instance_type_options.contains(&"g.xlarge".to_string()));
}

#[test]
fn pool_that_lists_gpu_types_may_use_them() {
    let p = pool(
        "gpu",
        "template:\n  spec:\n    nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}\n    requirements:\n      - {key: node.kubernetes.io/instance-type, operator: In, values: [g.xlarge]}",
    );
    let plan = Case::new(pods("p", 1, "1", "1Gi", json!({}))).pools(vec![p]).solve();
    assert_eq!(claim_of(&plan, "p-0").instance_type, "g.xlarge");
}

// ---------- node selection ----------

#[test]
fn node_selector_pins_architecture_and_zone() {
    let plan = Case::new(pods("p", 2, "1", "1Gi", json!({"spec": {"nodeSelector": {"kubernetes.io/arch": "arm64", "topology.kubernetes.io/zone": "test-zone-b"}}}))).solve();
    let c = claim_of(&plan, "p-0");
    assert_eq!(c.instance_type, "a.large");
    assert_eq!(c.zone, "test-zone-b");
    assert_eq!(c.instance_type_options, vec!["a.large"]);
}

#[test]
fn node_selector_on_a_label_no_pool_defines_is_unschedulable() {
    let plan = Case::new(pods(
        "p",
        1,
        "1",
        "1Gi",
        json!({"spec": {"nodeSelector": {"team": "a"}}}),
    ))
    .solve();
    assert!(
        plan.unschedulable[0]
            .reason
            .to_string()
            .contains("incompatible with NodePool default requirements"),
        "{plan:?}"
    );
    let p = pool(
        "team",
        "template:\n  metadata: {labels: {team: a}}\n  spec:\n    nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}",
    );
    let plan = Case::new(pods(
        "p",
        1,
        "1",
        "1Gi",
        json!({"spec": {"nodeSelector": {"team": "a"}}}),
    ))
    .pools(vec![default_pool(), p])
    .solve();
    assert_eq!(claim_of(&plan, "p-0").node_pool, "team");
    assert_eq!(claim_of(&plan, "p-0").labels.get("team").map(String::as_str), Some("a"));
}

#[test]
fn label_values_a_pod_would_put_on_a_node_must_be_valid_labels() {
    // The pool lets pods choose `team` (Exists): a value from the pod's
    // affinity lands in the new node's labels, so it must be a valid label.
    let p = pool(
        "teams",
        "template:\n  spec:\n    nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}\n    requirements: [{key: team, operator: Exists}]",
    );
    let affinity = |values: serde_json::Value| {
        json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "team", "operator": "In", "values": values}]}
        ]}}}}})
    };
    let bad = [
        (
            "inject",
            affinity(json!(["a,dedicated=payments"])),
            "a,dedicated=payments",
        ),
        ("long", affinity(json!(["x".repeat(64)])), "xxxxxxxx"),
        ("chars", affinity(json!(["a b"])), "\"a b\""),
        (
            "selector",
            json!({"spec": {"nodeSelector": {"team": "a\n--node-labels=x=y"}}}),
            "--node-labels",
        ),
    ];
    for (name, extra, named) in bad {
        let plan = Case::new(vec![pod(name, "1", "1Gi", extra)])
            .pools(vec![p.clone()])
            .solve();
        assert!(plan.node_claims.is_empty(), "{name}: {plan:?}");
        let why = plan.unschedulable[0].reason.to_string();
        assert!(why.contains(named) && why.contains("label value"), "{name}: {why}");
    }
    // An empty value is a valid label; a valid value is planned.
    for (v, want) in [("", ""), ("web-1", "web-1")] {
        let plan = Case::new(vec![pod("ok", "1", "1Gi", affinity(json!([v])))])
            .pools(vec![p.clone()])
            .solve();
        assert!(plan.unschedulable.is_empty(), "{v:?}: {plan:?}");
        assert_eq!(claim_of(&plan, "ok").labels.get("team").map(String::as_str), Some(want));
    }
}

#[test]
fn required_node_affinity_terms_are_ored() {
    let aff = json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["s390x"]}]},
        {"matchExpressions": [{"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["r"]}]}
    ]}}}}});
    let plan = Case::new(pods("p", 1, "1", "1Gi", aff)).solve();
    assert_eq!(claim_of(&plan, "p-0").instance_type, "r.large");
}

#[test]
fn gt_lt_and_not_in_requirements_filter_types() {
    let aff = json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [
            {"key": "karpenter.k8s.aws/instance-cpu", "operator": "Gt", "values": ["2"]},
            {"key": "karpenter.k8s.aws/instance-family", "operator": "NotIn", "values": ["c"]}
        ]}
    ]}}}}});
    let plan = Case::new(pods("p", 1, "1", "1Gi", aff)).solve();
    let c = claim_of(&plan, "p-0");
    assert_eq!(c.instance_type, "m.xlarge");
    assert!(
        c.instance_type_options
            .iter()
            .all(|t| !t.starts_with("c.") && !t.ends_with(".large")),
        "{:?}",
        c.instance_type_options
    );
}

#[test]
fn preferred_node_affinity_is_honoured_then_relaxed() {
    let pref = |zone: &str| {
        json!({"spec": {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 10, "preference": {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": [zone]}]}}
        ]}}}})
    };
    let plan = Case::new(pods("p", 1, "1", "1Gi", pref("test-zone-c"))).solve();
    assert_eq!(claim_of(&plan, "p-0").zone, "test-zone-c");
    let plan = Case::new(pods("p", 1, "1", "1Gi", pref("nowhere"))).solve();
    assert_eq!(plan.node_claims.len(), 1, "an impossible preference is dropped");
}

// ---------- taints ----------

#[test]
fn tainted_pool_only_takes_tolerating_pods_and_startup_taints_are_ignored() {
    let tainted = pool(
        "gpu",
        "weight: 50\ntemplate:\n  spec:\n    nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}\n    taints: [{key: dedicated, value: ml, effect: NoSchedule}]\n    startupTaints: [{key: init, effect: NoSchedule}]",
    );
    let tol = json!({"spec": {"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]}});
    // The tolerating pod is bigger, so it is placed first and opens the weighted pool.
    let mut all = pods("tol", 1, "3", "1Gi", tol);
    all.extend(pods("plain", 1, "1", "1Gi", json!({})));
    let plan = Case::new(all).pools(vec![default_pool(), tainted]).solve();
    let t = claim_of(&plan, "tol-0");
    assert_eq!(t.node_pool, "gpu");
    assert_eq!(t.taints.len(), 1);
    assert_eq!(claim_of(&plan, "plain-0").node_pool, "default");
    assert_ne!(t.name, claim_of(&plan, "plain-0").name);
}

#[test]
fn prefer_no_schedule_taint_is_avoided_then_tolerated() {
    let soft = pool(
        "soft",
        "weight: 90\ntemplate:\n  spec:\n    nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}\n    taints: [{key: spare, effect: PreferNoSchedule}]",
    );
    // The heavier pool is avoided while another pool can take the pod ...
    let plan = Case::new(pods("p", 1, "1", "1Gi", json!({})))
        .pools(vec![soft.clone(), default_pool()])
        .solve();
    assert_eq!(claim_of(&plan, "p-0").node_pool, "default");
    // ... and used when it is the only one.
    let plan = Case::new(pods("p", 1, "1", "1Gi", json!({}))).pools(vec![soft]).solve();
    assert_eq!(claim_of(&plan, "p-0").node_pool, "soft");
}

// ---------- pools: weight, limits, minValues ----------

#[test]
fn higher_weight_pool_first() {
    let low = pool(
        "low",
        "weight: 1\ntemplate:\n  spec:\n    nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}",
    );
    let high = pool(
        "high",
        "weight: 90\ntemplate:\n  spec:\n    nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}\n    requirements: [{key: karpenter.k8s.aws/instance-family, operator: In, values: [m]}]",
    );
    let plan = Case::new(pods("p", 1, "1", "1Gi", json!({})))
        .pools(vec![low, high])
        .solve();
    let c = claim_of(&plan, "p-0");
    assert_eq!(c.node_pool, "high");
    assert_eq!(c.instance_type, "m.large");
}

#[test]
fn limits_are_never_exceeded_and_count_existing_nodes() {
    let limited = pool(
        "default",
        "template:\n  spec:\n    nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}\n    requirements: [{key: karpenter.k8s.aws/instance-family, operator: In, values: [c]}]\nlimits: {cpu: \"4\"}",
    );
    // 4 pods of 1.5 cpu: one c.xlarge (4 cpu) takes two; the limit allows no more.
    let plan = Case::new(pods("p", 4, "1500m", "1Gi", json!({})))
        .pools(vec![limited.clone()])
        .solve();
    let cpu: i64 = plan
        .node_claims
        .iter()
        .map(|c| plan_capacity_cpu(&c.instance_type_options))
        .sum();
    assert!(cpu <= 4000, "{plan:#?}");
    assert_eq!(plan.unschedulable.len(), 2);
    assert!(
        plan.unschedulable[0].reason.to_string().contains("limits exceeded"),
        "{:?}",
        plan.unschedulable
    );
    // An existing 2-cpu node of the pool leaves room for 2 more cpu only.
    let mut case = Case::new(pods("p", 2, "1500m", "1Gi", json!({}))).pools(vec![limited]);
    case.nodes = vec![ExistingNode {
        node: node(
            "n1",
            "test-zone-a",
            "2",
            "4Gi",
            json!({"metadata": {"labels": {"karpenter.sh/nodepool": "default"}}}),
        ),
        pods: vec![running("busy", "n1", "2", json!({}))],
    }];
    let plan = case.solve();
    assert_eq!(plan.node_claims.len(), 1);
    assert_eq!(plan.node_claims[0].instance_type_options, vec!["c.large"]);
    assert_eq!(plan.unschedulable.len(), 1);
}

fn plan_capacity_cpu(options: &[String]) -> i64 {
    let cat = catalog();
    options
        .iter()
        .map(|o| {
            cat.instance_types
                .iter()
                .find(|t| &t.name == o)
                .unwrap()
                .capacity
                .get("cpu")
                .milli()
        })
        .max()
        .unwrap_or(0)
}

#[test]
fn min_values_keeps_enough_families_open() {
    let p = pool(
        "default",
        "template:\n  spec:\n    nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}\n    requirements: [{key: karpenter.k8s.aws/instance-family, operator: Exists, minValues: 3}]",
    );
    let plan = Case::new(pods("p", 1, "1", "1Gi", json!({})))
        .pools(vec![p.clone()])
        .solve();
    let fams: std::collections::BTreeSet<&str> = plan.node_claims[0]
        .instance_type_options
        .iter()
        .map(|t| t.split('.').next().unwrap())
        .collect();
    assert!(fams.len() >= 3, "{fams:?}");
    // A pod that only m and r types fit (in memory) cannot keep 3 families open.
    let plan = Case::new(pods("p", 1, "1", "15Gi", json!({}))).pools(vec![p]).solve();
    assert_eq!(plan.unschedulable.len(), 1, "{plan:?}");
}

// ---------- topology spread ----------

fn zones_of(plan: &Plan, prefix: &str) -> std::collections::BTreeMap<String, usize> {
    let mut m = std::collections::BTreeMap::new();
    for c in &plan.node_claims {
        for p in &c.pods {
            if p.name.starts_with(prefix) {
                *m.entry(c.zone.clone()).or_insert(0) += 1;
            }
        }
    }
    m
}

fn spread(key: &str, skew: i32, when: &str, app: &str) -> serde_json::Value {
    json!({"metadata": {"labels": {"app": app}}, "spec": {"topologySpreadConstraints": [
        {"maxSkew": skew, "topologyKey": key, "whenUnsatisfiable": when, "labelSelector": {"matchLabels": {"app": app}}}
    ]}})
}

#[test]
fn zonal_spread_balances_across_zones() {
    let plan = Case::new(pods(
        "web",
        6,
        "500m",
        "512Mi",
        spread(labels::ZONE, 1, "DoNotSchedule", "web"),
    ))
    .solve();
    let z = zones_of(&plan, "web");
    assert_eq!(z.len(), 3, "{z:?}");
    assert!(z.values().all(|n| *n == 2), "{z:?}");
}

#[test]
fn zonal_spread_counts_running_pods() {
    let mut case = Case::new(pods(
        "web",
        2,
        "500m",
        "512Mi",
        spread(labels::ZONE, 1, "DoNotSchedule", "web"),
    ));
    case.nodes = vec![ExistingNode {
        node: node("n1", "test-zone-a", "1", "1Gi", json!({})),
        pods: vec![running("old", "n1", "1", app("web"))],
    }];
    let plan = case.solve();
    let z = zones_of(&plan, "web");
    assert_eq!(z.get("test-zone-a"), None, "zone a already has one: {z:?}");
    assert_eq!(z.len(), 2);
}

#[test]
fn node_affinity_policy_honor_limits_the_domains() {
    let mut extra = spread(labels::ZONE, 1, "DoNotSchedule", "web");
    fixtures::merge(
        &mut extra,
        json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["test-zone-a", "test-zone-b"]}]}]}}}}}),
    );
    let plan = Case::new(pods("web", 4, "500m", "512Mi", extra)).solve();
    let z = zones_of(&plan, "web");
    assert_eq!(
        z,
        [("test-zone-a".to_string(), 2), ("test-zone-b".to_string(), 2)].into()
    );
}

#[test]
fn node_affinity_policy_honor_ignores_zones_of_nodes_the_pod_cannot_use() {
    // Team a's pool makes nodes in zones a and b; another team's existing node
    // is in zone c. Pods that select team a never reach zone c, so under the
    // default nodeAffinityPolicy (Honor) zone c is no domain of their spread.
    let team_a = pool(
        "team-a",
        "template:\n  metadata:\n    labels: {team: a}\n  spec:\n    nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}\n    requirements:\n      - {key: topology.kubernetes.io/zone, operator: In, values: [test-zone-a, test-zone-b]}",
    );
    let mut extra = spread(labels::ZONE, 1, "DoNotSchedule", "web");
    fixtures::merge(&mut extra, json!({"spec": {"nodeSelector": {"team": "a"}}}));
    let mut case = Case::new(pods("web", 6, "500m", "512Mi", extra)).pools(vec![team_a, default_pool()]);
    case.nodes = vec![ExistingNode {
        node: node(
            "other",
            "test-zone-c",
            "4",
            "8Gi",
            json!({"metadata": {"labels": {"team": "b"}}}),
        ),
        pods: vec![],
    }];
    let plan = case.solve();
    assert!(plan.unschedulable.is_empty(), "{:?}", plan.unschedulable);
    assert_eq!(
        zones_of(&plan, "web"),
        [("test-zone-a".to_string(), 3), ("test-zone-b".to_string(), 3)].into()
    );
}

#[test]
fn anti_affinity_namespace_selectors_match_namespaces_by_their_labels() {
    // A database in namespace "payments" (labelled tier=critical) runs on n1;
    // the pending pod in "web" must not share a node with any app=db pod in a
    // critical namespace.
    let ns = |name: &str, tier: &str| -> k8s_openapi::api::core::v1::Namespace {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": {"tier": tier}}})).unwrap()
    };
    let mut db = running("db-0", "n1", "500m", json!({}));
    db.metadata.namespace = Some("payments".into());
    db.metadata.labels = Some([("app".to_string(), "db".to_string())].into());
    let anti = |selector: serde_json::Value| {
        json!({"metadata": {"namespace": "web"}, "spec": {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "db"}}, "namespaceSelector": selector}]}}}})
    };
    let solve = |selector: serde_json::Value, tier: &str| {
        let mut case = Case::new(pods("p", 1, "500m", "512Mi", anti(selector)));
        case.nodes = vec![ExistingNode {
            node: node("n1", "test-zone-a", "4", "8Gi", json!({})),
            pods: vec![db.clone()],
        }];
        case.namespaces = vec![ns("payments", tier), ns("web", "public")];
        case.solve()
    };
    let critical = json!({"matchLabels": {"tier": "critical"}});
    let plan = solve(critical.clone(), "critical");
    assert!(plan.existing.is_empty(), "n1 runs a critical db: {plan:?}");
    assert_eq!(plan.node_claims.len(), 1);
    // The database's namespace is not critical: n1 is fine.
    let plan = solve(critical, "public");
    assert_eq!(plan.existing.len(), 1, "{plan:?}");
    // `{}` selects every namespace.
    let plan = solve(json!({}), "public");
    assert!(plan.existing.is_empty(), "{plan:?}");
}

#[test]
fn min_domains_forces_spreading_before_skew_allows_stacking() {
    // maxSkew 2 would allow 2 pods in one zone; minDomains 3 with 3 zones keeps
    // the minimum real, but with minDomains 4 (more than exist) the global
    // minimum is 0, so at most 2 per zone.
    let mut extra = spread(labels::ZONE, 2, "DoNotSchedule", "web");
    extra["spec"]["topologySpreadConstraints"][0]["minDomains"] = json!(4);
    let plan = Case::new(pods("web", 7, "500m", "512Mi", extra)).solve();
    let z = zones_of(&plan, "web");
    assert!(z.values().all(|n| *n <= 2), "{z:?}");
    assert_eq!(plan.unschedulable.len(), 1, "the seventh pod has no domain left");
}

#[test]
fn node_taints_policy_decides_whether_tainted_domains_count() {
    // Pools make nodes in zones a and b only; an existing tainted node is in zone c.
    let ab = pool(
        "default",
        "template:\n  spec:\n    nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}\n    requirements: [{key: topology.kubernetes.io/zone, operator: In, values: [test-zone-a, test-zone-b]}]",
    );
    let tainted = || ExistingNode {
        node: node(
            "n-c",
            "test-zone-c",
            "1",
            "1Gi",
            json!({"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}}),
        ),
        pods: vec![],
    };
    let run = |policy: &str| {
        let mut extra = spread(labels::ZONE, 1, "DoNotSchedule", "web");
        extra["spec"]["topologySpreadConstraints"][0]["nodeTaintsPolicy"] = json!(policy);
        let mut case = Case::new(pods("web", 4, "500m", "512Mi", extra)).pools(vec![ab.clone()]);
        case.nodes = vec![tainted()];
        case.solve()
    };
    // Ignore (the default): empty zone c counts, so only one pod per zone a/b.
    assert_eq!(run("Ignore").unschedulable.len(), 2);
    // Honor: the untolerated node's zone is not a domain; a and b take two each.
    let plan = run("Honor");
    assert!(plan.unschedulable.is_empty(), "{:?}", plan.unschedulable);
    assert_eq!(
        zones_of(&plan, "web"),
        [("test-zone-a".to_string(), 2), ("test-zone-b".to_string(), 2)].into()
    );
}

#[test]
fn preferred_pod_affinity_is_honoured_when_possible() {
    let pref = json!({"spec": {"affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 10, "podAffinityTerm": {"topologyKey": labels::ZONE, "labelSelector": {"matchLabels": {"app": "db"}}}}]}}}});
    let mut case = Case::new(pods("a", 1, "1", "1Gi", pref.clone()));
    case.nodes = vec![ExistingNode {
        node: node("n1", "test-zone-c", "1", "1Gi", json!({})),
        pods: vec![running("db", "n1", "1", app("db"))],
    }];
    assert_eq!(zones_of(&case.solve(), "a"), [("test-zone-c".to_string(), 1)].into());
    // Nothing to be near: relaxed, still scheduled.
    assert!(
        Case::new(pods("a", 1, "1", "1Gi", pref))
            .solve()
            .unschedulable
            .is_empty()
    );
}

#[test]
fn hostname_spread_and_schedule_anyway() {
    let plan = Case::new(pods(
        "h",
        4,
        "100m",
        "100Mi",
        spread(labels::HOSTNAME, 1, "DoNotSchedule", "h"),
    ))
    .solve();
    assert_eq!(plan.node_claims.len(), 4);
    // ScheduleAnyway is honoured when possible too ...
    let plan = Case::new(pods(
        "s",
        3,
        "100m",
        "100Mi",
        spread(labels::HOSTNAME, 1, "ScheduleAnyway", "s"),
    ))
    .solve();
    assert_eq!(plan.node_claims.len(), 3);
    // ... and relaxed when the pool cannot make more nodes.
    let one = pool(
        "default",
        "template:\n  spec:\n    nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}\nlimits: {nodes: \"1\"}",
    );
    let plan = Case::new(pods(
        "s",
        3,
        "100m",
        "100Mi",
        spread(labels::HOSTNAME, 1, "ScheduleAnyway", "s"),
    ))
    .pools(vec![one.clone()])
    .solve();
    assert_eq!(plan.node_claims.len(), 1);
    assert!(plan.unschedulable.is_empty());
    let plan = Case::new(pods(
        "h",
        3,
        "100m",
        "100Mi",
        spread(labels::HOSTNAME, 1, "DoNotSchedule", "h"),
    ))
    .pools(vec![one])
    .solve();
    assert_eq!(plan.unschedulable.len(), 2);
}

#[test]
fn capacity_type_and_custom_label_spread() {
    let plan = Case::new(pods(
        "c",
        4,
        "500m",
        "512Mi",
        spread(labels::CAPACITY_TYPE, 1, "DoNotSchedule", "c"),
    ))
    .solve();
    let mut by_ct = std::collections::BTreeMap::new();
    for c in &plan.node_claims {
        *by_ct.entry(c.capacity_type.clone()).or_insert(0) += c.pods.len();
    }
    assert_eq!(by_ct, [("on-demand".to_string(), 2), ("spot".to_string(), 2)].into());
    let racks = pool(
        "default",
        "template:\n  spec:\n    nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}\n    requirements: [{key: example.com/rack, operator: In, values: [r1, r2]}]",
    );
    let plan = Case::new(pods(
        "r",
        4,
        "500m",
        "512Mi",
        spread("example.com/rack", 1, "DoNotSchedule", "r"),
    ))
    .pools(vec![racks])
    .solve();
    let mut by_rack = std::collections::BTreeMap::new();
    for c in &plan.node_claims {
        *by_rack
            .entry(c.labels.get("example.com/rack").cloned().unwrap_or_default())
            .or_insert(0) += c.pods.len();
    }
    assert_eq!(by_rack, [("r1".to_string(), 2), ("r2".to_string(), 2)].into());
}

#[test]
fn match_label_keys_split_groups() {
    let mk = |name: &str, ver: &str| {
        pod(
            name,
            "500m",
            "512Mi",
            json!({"metadata": {"labels": {"app": "w", "ver": ver}}, "spec": {"topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": labels::ZONE, "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "w"}}, "matchLabelKeys": ["ver"]}]}}),
        )
    };
    // Per version, one pod per zone; both versions may share a zone.
    let plan = Case::new(vec![
        mk("a-0", "1"),
        mk("a-1", "1"),
        mk("a-2", "1"),
        mk("b-0", "2"),
        mk("b-1", "2"),
        mk("b-2", "2"),
    ])
    .solve();
    assert!(zones_of(&plan, "a-").values().all(|n| *n == 1));
    assert!(zones_of(&plan, "b-").values().all(|n| *n == 1));
}

// ---------- pod affinity and anti-affinity ----------

fn term(kind: &str, key: &str, app: &str) -> serde_json::Value {
    json!({"spec": {"affinity": {kind: {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": key, "labelSelector": {"matchLabels": {"app": app}}}]}}}})
}

#[test]
fn hostname_anti_affinity_one_pod_per_node() {
    let plan = Case::new(pods(
        "a",
        3,
        "100m",
        "100Mi",
        with(app("a"), term("podAntiAffinity", labels::HOSTNAME, "a")),
    ))
    .solve();
    assert_eq!(plan.node_claims.len(), 3);
    assert!(plan.node_claims.iter().all(|c| c.pods.len() == 1));
}

#[test]
fn zonal_anti_affinity_at_most_one_per_zone() {
    let plan = Case::new(pods(
        "a",
        4,
        "100m",
        "100Mi",
        with(app("a"), term("podAntiAffinity", labels::ZONE, "a")),
    ))
    .solve();
    assert_eq!(zones_of(&plan, "a").len(), 3);
    assert_eq!(plan.unschedulable.len(), 1, "{plan:#?}");
    assert!(
        plan.unschedulable[0]
            .reason
            .to_string()
            .contains("pod anti-affinity on topology.kubernetes.io/zone"),
        "{:?}",
        plan.unschedulable
    );
}

#[test]
fn zonal_self_affinity_keeps_pods_together() {
    let plan = Case::new(pods(
        "a",
        10,
        "1",
        "1Gi",
        with(app("a"), term("podAffinity", labels::ZONE, "a")),
    ))
    .solve();
    assert_eq!(zones_of(&plan, "a").len(), 1, "{plan:#?}");
    assert!(plan.node_claims.len() > 1);
}

#[test]
fn affinity_to_a_running_pod_follows_its_zone() {
    let mut case = Case::new(pods("a", 2, "1", "1Gi", term("podAffinity", labels::ZONE, "db")));
    case.nodes = vec![ExistingNode {
        node: node("n1", "test-zone-b", "1", "1Gi", json!({})),
        pods: vec![running("db", "n1", "1", app("db"))],
    }];
    let plan = case.solve();
    assert_eq!(zones_of(&plan, "a"), [("test-zone-b".to_string(), 2)].into());
    // Without the running pod nothing matches: unschedulable.
    let plan = Case::new(pods("a", 1, "1", "1Gi", term("podAffinity", labels::ZONE, "db"))).solve();
    assert_eq!(plan.unschedulable.len(), 1);
}

#[test]
fn inverse_anti_affinity_of_running_pods() {
    let mut case = Case::new(pods("w", 1, "100m", "100Mi", app("web")));
    case.nodes = vec![ExistingNode {
        node: node("n1", "test-zone-a", "4", "8Gi", json!({})),
        pods: vec![running(
            "guard",
            "n1",
            "100m",
            with(app("guard"), term("podAntiAffinity", labels::HOSTNAME, "web")),
        )],
    }];
    let plan = case.solve();
    assert!(
        plan.existing.is_empty(),
        "the running pod's anti-affinity keeps web off n1: {plan:?}"
    );
    assert_eq!(plan.node_claims.len(), 1);
    // A pod the term does not match goes onto the node.
    let mut case2 = Case::new(pods("o", 1, "100m", "100Mi", app("other")));
    case2.nodes = case.nodes.clone();
    let plan = case2.solve();
    assert_eq!(plan.existing[0].name, "n1");
}

#[test]
fn preferred_anti_affinity_is_relaxed_when_it_cannot_hold() {
    let pref = json!({"metadata": {"labels": {"app": "p"}}, "spec": {"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 50, "podAffinityTerm": {"topologyKey": labels::ZONE, "labelSelector": {"matchLabels": {"app": "p"}}}}]}}}});
    let plan = Case::new(pods("p", 5, "100m", "100Mi", pref)).solve();
    assert!(plan.unschedulable.is_empty());
    assert_eq!(zones_of(&plan, "p").len(), 3, "honoured for the first three");
}

// ---------- host ports ----------

#[test]
fn host_ports_conflict() {
    let hp = json!({"spec": {"containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 80, "hostPort": 8080}], "resources": {"requests": {"cpu": "100m"}}}]}});
    let plan = Case::new(pods("h", 2, "100m", "100Mi", hp)).solve();
    assert_eq!(plan.node_claims.len(), 2);
    let udp = json!({"spec": {"containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 80, "hostPort": 8080, "protocol": "UDP"}], "resources": {"requests": {"cpu": "100m"}}}]}});
    let mut all = pods(
        "h",
        1,
        "100m",
        "100Mi",
        json!({"spec": {"containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 80, "hostPort": 8080}], "resources": {"requests": {"cpu": "100m"}}}]}}),
    );
    all.extend(pods("u", 1, "100m", "100Mi", udp));
    assert_eq!(
        Case::new(all).solve().node_claims.len(),
        1,
        "TCP and UDP do not conflict"
    );
}

// ---------- volumes ----------

#[test]
fn bound_volume_pins_the_zone() {
    let mut case = Case::new(pods(
        "v",
        1,
        "100m",
        "100Mi",
        json!({"spec": {"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]}}),
    ));
    case.pvcs = vec![
        serde_json::from_value(
            json!({"metadata": {"name": "data", "namespace": "default"}, "spec": {"volumeName": "pv1"}}),
        )
        .unwrap(),
    ];
    case.pvs = vec![serde_json::from_value(json!({"metadata": {"name": "pv1"}, "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "topology.ebs.csi.aws.com/zone", "operator": "In", "values": ["test-zone-c"]}]}]}}}})).unwrap()];
    let plan = case.solve();
    assert_eq!(claim_of(&plan, "v-0").zone, "test-zone-c");
}

#[test]
fn storage_class_allowed_topologies_and_missing_claims() {
    let mut case = Case::new(pods(
        "v",
        1,
        "100m",
        "100Mi",
        json!({"spec": {"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]}}),
    ));
    case.pvcs = vec![
        serde_json::from_value(
            json!({"metadata": {"name": "data", "namespace": "default"}, "spec": {"storageClassName": "zonal"}}),
        )
        .unwrap(),
    ];
    case.scs = vec![
        serde_json::from_value(
            json!({"metadata": {"name": "zonal"}, "provisioner": "ebs.csi.aws.com", "volumeBindingMode": "WaitForFirstConsumer",
                "allowedTopologies": [{"matchLabelExpressions": [{"key": "topology.kubernetes.io/zone", "values": ["test-zone-b"]}]}]}),
        )
        .unwrap(),
    ];
    assert_eq!(claim_of(&case.solve(), "v-0").zone, "test-zone-b");
    // An Immediate class (the default mode) binds the claim before the pod can
    // run, in a zone of the provisioner's choosing: the pod waits, no node for it.
    for mode in [json!("Immediate"), serde_json::Value::Null] {
        let mut sc = case.scs[0].clone();
        sc.volume_binding_mode = serde_json::from_value(mode).unwrap();
        let mut immediate = Case::new(case.pods.clone());
        immediate.pvcs = case.pvcs.clone();
        immediate.scs = vec![sc];
        let plan = immediate.solve();
        assert!(plan.node_claims.is_empty(), "{plan:?}");
        assert_eq!(
            plan.unschedulable[0].reason.to_string(),
            "persistentvolumeclaim default/data is not bound yet (StorageClass zonal binds Immediate)"
        );
    }
    case.pvcs.clear();
    let plan = case.solve();
    assert_eq!(
        plan.unschedulable[0].reason.to_string(),
        "persistentvolumeclaim default/data not found"
    );
}

// ---------- daemonsets ----------

fn daemonset(cpu: &str, extra: serde_json::Value) -> DaemonSet {
    let mut v = json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent", "namespace": "kube-system"},
        "spec": {"selector": {"matchLabels": {"app": "agent"}}, "template": {"metadata": {"labels": {"app": "agent"}},
        "spec": {"containers": [{"name": "a", "image": "i", "resources": {"requests": {"cpu": cpu}}}]}}}});
    fixtures::merge(&mut v, extra);
    serde_json::from_value(v).unwrap()
}

#[test]
fn daemonset_overhead_is_reserved_on_new_nodes() {
    let mut case = Case::new(pods("p", 1, "1500m", "1Gi", json!({})));
    assert_eq!(claim_of(&case.solve(), "p-0").instance_type, "c.large");
    case.daemon_sets = vec![daemonset("1", json!({}))];
    let plan = case.solve();
    let c = claim_of(&plan, "p-0");
    assert_eq!(c.instance_type, "c.xlarge", "1.5 + 1 cpu no longer fits 2 cpu");
    assert_eq!(c.requests.get("cpu").milli(), 2500);
    // A daemon that only runs on arm64 adds nothing to amd64 nodes.
    case.daemon_sets = vec![daemonset(
        "1",
        json!({"spec": {"template": {"spec": {"nodeSelector": {"kubernetes.io/arch": "arm64"}}}}}),
    )];
    let plan = case.solve();
    assert_eq!(claim_of(&plan, "p-0").instance_type, "c.large");
}

/// A pod or DaemonSet container binding `port` on the host.
fn binds(port: i32) -> serde_json::Value {
    json!({"spec": {"containers": [{"name": "c", "image": "i", "ports": [{"containerPort": port, "hostPort": port}],
        "resources": {"requests": {"cpu": "100m"}}}]}})
}

#[test]
fn daemonset_host_ports_are_taken_on_every_node_it_runs_on() {
    let exporter = |extra| {
        let mut spec = json!({"spec": {"template": binds(9100)}});
        fixtures::merge(&mut spec, extra);
        daemonset("100m", spec)
    };
    let mut v = pods("clash", 1, "100m", "64Mi", binds(9100));
    v.extend(pods("free", 1, "100m", "64Mi", binds(9101)));
    let mut case = Case::new(v);
    case.daemon_sets = vec![exporter(json!({}))];
    let plan = case.solve();
    assert!(
        plan.unschedulable.iter().any(|u| u.pod.name == "clash-0"),
        "node-exporter holds 9100 on every node of the pool: {plan:?}"
    );
    assert!(
        plan.unschedulable[0].reason.to_string().contains("host port"),
        "{}",
        plan.unschedulable[0].reason
    );
    claim_of(&plan, "free-0");
    // An in-flight claim of the pool has the daemon's port taken too.
    case.pods = pods("clash", 1, "100m", "64Mi", binds(9100));
    let mut c = fixtures_claim();
    c.instance_type_options = vec!["m.xlarge".into()];
    case.claims = vec![c];
    let plan = case.solve();
    assert!(plan.existing.is_empty() && plan.node_claims.is_empty(), "{plan:?}");
    // A daemon that does not run on the pool's nodes takes nothing.
    case.daemon_sets = vec![exporter(
        json!({"spec": {"template": {"spec": {"nodeSelector": {"team": "other"}}}}}),
    )];
    case.claims = vec![];
    claim_of(&case.solve(), "clash-0");
}

#[test]
fn daemonset_that_does_not_tolerate_the_pool_taint_adds_nothing() {
    let tainted = pool(
        "t",
        "template:\n  spec:\n    nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}\n    taints: [{key: dedicated, effect: NoSchedule}]",
    );
    let mut case = Case::new(pods(
        "p",
        1,
        "1500m",
        "1Gi",
        json!({"spec": {"tolerations": [{"key": "dedicated", "operator": "Exists"}]}}),
    ))
    .pools(vec![tainted]);
    case.daemon_sets = vec![daemonset("1", json!({}))];
    assert_eq!(claim_of(&case.solve(), "p-0").instance_type, "c.large");
}

// ---------- existing capacity ----------

#[test]
fn existing_nodes_are_used_first_unless_cordoned_tainted_or_full() {
    let n = |extra| ExistingNode {
        node: node("n1", "test-zone-a", "2", "4Gi", extra),
        pods: vec![running("r", "n1", "1", json!({}))],
    };
    let mut case = Case::new(pods("p", 2, "500m", "512Mi", json!({})));
    case.nodes = vec![n(json!({}))];
    let plan = case.solve();
    assert_eq!(plan.existing.len(), 1);
    assert_eq!(plan.existing[0].pods.len(), 2);
    assert!(plan.node_claims.is_empty());
    case.nodes = vec![n(json!({"spec": {"unschedulable": true}}))];
    assert!(case.solve().existing.is_empty());
    case.nodes = vec![n(json!({"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}}))];
    assert!(case.solve().existing.is_empty());
    case.pods = pods("p", 3, "500m", "512Mi", json!({}));
    case.nodes = vec![n(json!({}))];
    let plan = case.solve();
    assert_eq!(plan.existing[0].pods.len(), 2, "only 1 cpu left on n1");
    assert_eq!(plan.node_claims.len(), 1);
}

#[test]
fn an_existing_node_keeps_the_host_ports_its_pods_and_the_solves_own_take() {
    let mut v = pods("web", 2, "100m", "64Mi", binds(9101));
    v.extend(pods("exporter", 1, "100m", "64Mi", binds(9100)));
    let mut case = Case::new(v);
    case.nodes = vec![ExistingNode {
        node: node("n1", "test-zone-a", "4", "8Gi", json!({})),
        pods: vec![running("r", "n1", "1", binds(9100))],
    }];
    let plan = case.solve();
    let on_n1: Vec<&str> = plan
        .existing
        .iter()
        .flat_map(|e| e.pods.iter().map(|p| p.name.as_str()))
        .collect();
    assert_eq!(
        on_n1.len(),
        1,
        "one web pod takes 9101 on n1, the other cannot: {plan:?}"
    );
    assert!(on_n1[0].starts_with("web-"), "{plan:?}");
    claim_of(&plan, "exporter-0");
    assert!(plan.unschedulable.is_empty(), "{plan:?}");
}

#[test]
fn in_flight_claims_take_pods() {
    let mut case = Case::new(pods("p", 1, "500m", "512Mi", json!({})));
    let mut c = fixtures_claim();
    c.instance_type_options = vec!["m.xlarge".into()];
    case.claims = vec![c];
    let plan = case.solve();
    assert_eq!(plan.existing.len(), 1, "{plan:?}");
    assert_eq!(plan.existing[0].kind, TargetKind::NodeClaim);
    assert!(plan.node_claims.is_empty());
}

#[test]
fn in_flight_claims_are_repacked_with_the_pods_they_were_made_for() {
    // The claim was made for these very pods, which are still pending: its
    // recorded requests must not count twice, or a redelivered batch would
    // launch a second node for the same pods.
    let mut case = Case::new(pods("p", 3, "1", "1Gi", json!({})));
    let mut c = fixtures_claim();
    c.instance_type_options = vec!["m.xlarge".into()];
    c.resources = crate::resources::Resources::parse([("cpu", "3"), ("memory", "3Gi"), ("pods", "3")]).unwrap();
    case.claims = vec![c];
    let plan = case.solve();
    assert!(plan.node_claims.is_empty(), "{plan:?}");
    assert_eq!(plan.existing.iter().map(|e| e.pods.len()).sum::<usize>(), 3);
}

#[test]
fn running_replicas_share_one_model_and_move_under_their_own_names() {
    let mut case = Case::new(Vec::new());
    case.nodes = ["n1", "n2", "n3"]
        .into_iter()
        .map(|n| ExistingNode {
            node: node(n, "test-zone-a", "4", "8Gi", json!({})),
            pods: vec![running(&format!("web-on-{n}"), n, "1", app("web"))],
        })
        .collect();
    let compiled = Compiled::new(&case.input());
    assert_eq!(compiled.running.len(), 3);
    assert!(
        compiled
            .running
            .windows(2)
            .all(|w| std::sync::Arc::ptr_eq(&w[0].model, &w[1].model)),
        "three replicas, one model"
    );
    let plan = compiled.solve(&SolveOptions {
        new_claims: false,
        removed: ["n2", "n3"].into_iter().map(String::from).collect(),
        ..SolveOptions::default()
    });
    let moved: Vec<(&str, &str)> = plan
        .existing
        .iter()
        .flat_map(|e| e.pods.iter().map(move |p| (e.name.as_str(), p.name.as_str())))
        .collect();
    assert_eq!(moved, [("n1", "web-on-n2"), ("n1", "web-on-n3")], "{plan:?}");
}

fn fixtures_claim() -> NodeClaim {
    NodeClaim {
        resources: crate::resources::Resources::parse([("cpu", "1"), ("pods", "1")]).unwrap(),
        labels: Default::default(),
        phase: Phase::Launched,
        zone: Some("test-zone-a".into()),
        capacity_type: Some("spot".into()),
        timestamps: Default::default(),
        ..NodeClaim::pending("default-infl1", "default", "default")
    }
}

// ---------- determinism, conversion, cost ----------

#[test]
fn deterministic_and_names_are_stable() {
    let mk = || {
        let mut v = pods(
            "web",
            6,
            "500m",
            "512Mi",
            spread(labels::ZONE, 1, "DoNotSchedule", "web"),
        );
        v.extend(pods("big", 3, "3", "6Gi", json!({})));
        Case::new(v)
    };
    let a = mk().solve();
    let b = mk().solve();
    assert_eq!(a, b);
    let names: std::collections::BTreeSet<&String> = a.node_claims.iter().map(|c| &c.name).collect();
    assert_eq!(names.len(), a.node_claims.len(), "names are unique");
}

#[test]
fn converts_to_a_pending_node_claim() {
    let plan = Case::new(pods(
        "p",
        1,
        "1",
        "1Gi",
        json!({"spec": {"nodeSelector": {"topology.kubernetes.io/zone": "test-zone-b"}}}),
    ))
    .solve();
    let c = &plan.node_claims[0];
    let nc = c.to_node_claim("2026-01-01T00:00:00Z".parse().unwrap());
    assert_eq!(nc.phase, Phase::Pending);
    assert_eq!(nc.name, c.name);
    assert_eq!(nc.instance_type_options, c.instance_type_options);
    let zone = nc.requirements.iter().find(|r| r.key == labels::ZONE).unwrap();
    assert_eq!(zone.values, vec!["test-zone-b"]);
    let it = nc.requirements.iter().find(|r| r.key == labels::INSTANCE_TYPE).unwrap();
    assert_eq!(it.values.len(), c.instance_type_options.len());
    assert_eq!(nc.resources.get("cpu").milli(), 1000);
}

fn labelled_pool() -> NodePool {
    pool(
        "default",
        "template:\n  metadata:\n    labels: {team: web, topology.kubernetes.io/region: test-region}\n  spec:\n    nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}\n    requirements:\n      - {key: karpenter.sh/capacity-type, operator: In, values: [spot, on-demand]}\n      - {key: example.com/tier, operator: In, values: [gold]}\n      - {key: kubernetes.io/arch, operator: In, values: [amd64]}",
    )
}

#[test]
fn node_claim_labels_are_only_what_is_known_before_launch() {
    let plan = Case::new(pods(
        "p",
        1,
        "1",
        "1Gi",
        json!({"spec": {"nodeSelector": {"topology.kubernetes.io/zone": "test-zone-b"}}}),
    ))
    .pools(vec![labelled_pool()])
    .solve();
    let c = &plan.node_claims[0];
    // The plan keeps its prediction (simulate prints it) ...
    assert_eq!(c.labels[labels::INSTANCE_TYPE], c.instance_type);
    assert_eq!(c.labels[labels::HOSTNAME], c.name);
    assert_eq!(c.labels[labels::ZONE], "test-zone-b");
    assert!(c.labels.contains_key(labels::aws::FAMILY));
    // ... the record holds only the pool's labels and what the requirements pin
    // that no instance decides (the zone is pinned, but set from the instance).
    let nc = c.to_node_claim("2026-01-01T00:00:00Z".parse().unwrap());
    let want: BTreeMap<String, String> = [
        ("team", "web"),
        (labels::REGION, "test-region"),
        ("example.com/tier", "gold"),
        (labels::NODEPOOL, "default"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(nc.labels, want);
}

#[test]
fn in_flight_claims_match_pods_by_known_labels_only() {
    let first = Case::new(pods("p", 1, "500m", "512Mi", json!({})))
        .pools(vec![labelled_pool()])
        .solve();
    let planned = &first.node_claims[0];
    assert!(planned.instance_type_options.len() > 1, "{planned:?}");
    let claim = planned.to_node_claim("2026-01-01T00:00:00Z".parse().unwrap());
    let solve_with = |selector: serde_json::Value| {
        let mut case = Case::new(vec![pod(
            "q",
            "100m",
            "100Mi",
            json!({"spec": {"nodeSelector": selector}}),
        )])
        .pools(vec![labelled_pool()]);
        case.claims = vec![claim.clone()];
        case.solve()
    };
    // A template label and a pinned requirement are known: the claim takes the pod.
    let plan = solve_with(json!({"team": "web", "example.com/tier": "gold"}));
    assert_eq!(plan.existing.len(), 1, "{plan:?}");
    assert_eq!(plan.existing[0].name, claim.name);
    // The predicted zone and instance type are not: the claim may launch elsewhere.
    for (k, v) in [
        (labels::ZONE, planned.zone.as_str()),
        (labels::INSTANCE_TYPE, planned.instance_type.as_str()),
    ] {
        let plan = solve_with(json!({ k: v }));
        assert!(plan.existing.is_empty(), "{k}: {plan:?}");
        assert_eq!(plan.node_claims.len(), 1, "{k}");
    }
}

#[test]
fn a_pool_with_restricted_template_labels_is_not_used() {
    let bad = pool(
        "default",
        "template:\n  metadata:\n    labels: {kubernetes.io/team: web}\n  spec:\n    nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}",
    );
    let plan = Case::new(pods("p", 1, "1", "1Gi", json!({}))).pools(vec![bad]).solve();
    assert!(plan.node_claims.is_empty(), "{plan:?}");
    let PlacementFailure::Pools(r) = &plan.unschedulable[0].reason else {
        panic!("{plan:?}")
    };
    assert_eq!(
        r[0].why,
        Rejection::PoolInvalid(
            "spec.template.metadata.labels[\"kubernetes.io/team\"]: label domain \"kubernetes.io\" is restricted"
                .into()
        )
    );
}

#[test]
fn capped_packing_beats_ffd_when_big_types_cost_more_per_cpu() {
    let cat = Catalog {
        region: "test-region".into(),
        instance_types: vec![
            fixtures::instance("s.large", "amd64", 2, 8, 30, 0.20, None),
            fixtures::instance("b.2xlarge", "amd64", 8, 32, 110, 1.00, None),
        ],
    };
    let mut case = Case::new(pods("p", 8, "1", "1Gi", json!({})));
    case.catalog = cat;
    case.improve = false;
    let ffd = case.solve();
    assert_eq!(ffd.node_claims.len(), 1);
    assert!((ffd.total_price() - 1.0).abs() < 1e-9);
    case.improve = true;
    let better = case.solve();
    assert!((better.total_price() - 0.8).abs() < 1e-9, "{better:#?}");
    assert_eq!(better.node_claims.len(), 4);
}

mod anti_affinity;
mod mix;
mod properties;

/// Issue 15, item 1: spot only in two zones, so pods spread over three
/// zones force on-demand nodes in the third. Pods that can run anywhere
/// must not be packed onto those on-demand nodes while spot is there for
/// them, whichever order the pods come in.
#[test]
fn flexible_pods_stay_off_on_demand_nodes_that_spot_could_replace() {
    let mut catalog = Catalog {
        region: "test".into(),
        // Spot is cheaper per cpu the larger the type, on-demand is flat.
        instance_types: [(1i64, 0.03), (2, 0.027), (4, 0.024), (8, 0.021), (16, 0.018)]
            .iter()
            .map(|(cpu, spot)| {
                let mut t = fixtures::instance(
                    &format!("m.{cpu}x"),
                    "amd64",
                    *cpu,
                    4 * cpu,
                    110,
                    0.05 * *cpu as f64,
                    None,
                );
                for z in &fixtures::ZONES[..2] {
                    t.offerings
                        .push(crate::catalog::Offering::new(z, "spot", spot * *cpu as f64));
                }
                t
            })
            .collect(),
    };
    catalog.instance_types.sort_by(|a, b| a.name.cmp(&b.name));
    let spot_and_od = pool(
        "default",
        "template:\n  spec:\n    nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}\n    requirements: [{key: karpenter.sh/capacity-type, operator: In, values: [spot, on-demand]}]",
    );
    let spread = with(
        app("web"),
        json!({"spec": {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": labels::ZONE, "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}]}}),
    );
    for (web, web_cpu, batch, batch_cpu) in WEB_AND_BATCH {
        let mut all = pods("web", web, web_cpu, "1Gi", spread.clone());
        all.extend(pods("batch", batch, batch_cpu, "1Gi", json!({})));
        let mut case = Case::new(all).pools(vec![spot_and_od.clone()]);
        case.catalog = catalog.clone();
        let plan = case.solve();
        check_free_riders_only(&plan, web_cpu);
    }
}

/// Batch pods may share an on-demand node only where they ride free: its
/// type is the one its web pods alone would need.
fn check_free_riders_only(plan: &Plan, web_cpu: &str) {
    assert!(plan.unschedulable.is_empty(), "{plan:#?}");
    let web_milli = |c: &NewNodeClaim| -> i64 {
        let per: i64 = crate::quantity::Quantity::parse(web_cpu)
            .map(|q| q.milli())
            .unwrap_or_default();
        per * c.pods.iter().filter(|p| p.name.starts_with("web")).count() as i64
    };
    let on_demand: Vec<&NewNodeClaim> = plan
        .node_claims
        .iter()
        .filter(|c| c.capacity_type == "on-demand")
        .collect();
    assert!(!on_demand.is_empty());
    for c in on_demand {
        let needed = [1i64, 2, 4, 8, 16]
            .into_iter()
            .find(|cpu| cpu * 1000 >= web_milli(c))
            .unwrap_or(16);
        assert_eq!(
            c.instance_type,
            format!("m.{needed}x"),
            "batch pods grew an on-demand node: {:?}, ${}/h",
            c.pods,
            plan.total_price()
        );
    }
}

/// Web pods (zonal spread) and batch pods (anywhere): count and cpu of each
/// (the first and third went onto on-demand nodes before the fix).
const WEB_AND_BATCH: [(usize, &str, usize, &str); 5] = [
    (3, "2", 60, "500m"),
    (6, "2", 60, "500m"),
    (3, "4", 100, "500m"),
    (6, "3", 90, "250m"),
    (9, "1500m", 200, "250m"),
];

// ---------- ARC zonal shift ----------

fn shifted(zone: &str) -> std::collections::BTreeSet<String> {
    std::collections::BTreeSet::from([zone.to_string()])
}

#[test]
fn a_zonal_shift_places_no_new_capacity_in_the_shifted_zone() {
    // Zone a is the cheapest (ties go to the first name) and spreads use every zone.
    let mut case = Case::new(pods(
        "web",
        6,
        "500m",
        "512Mi",
        spread(labels::ZONE, 1, "ScheduleAnyway", "web"),
    ));
    case.pods.extend(pods("p", 3, "1", "1Gi", json!({})));
    // An uncordoned node in the shifted zone with room takes no pending pod either.
    case.nodes = vec![ExistingNode {
        node: node("old-a", "test-zone-a", "8", "32Gi", json!({})),
        pods: vec![],
    }];
    case.shifted_zones = shifted("test-zone-a");
    let plan = case.solve();
    assert!(plan.unschedulable.is_empty(), "{:?}", plan.unschedulable);
    assert!(
        plan.existing.is_empty(),
        "nothing placed on the node in the shifted zone: {:?}",
        plan.existing
    );
    assert!(!plan.node_claims.is_empty());
    for c in &plan.node_claims {
        assert_ne!(c.zone, "test-zone-a", "{c:?}");
        let zone = c.requirements.get(labels::ZONE).expect("the claim's zones are bounded");
        assert!(
            !zone.has("test-zone-a"),
            "the launch may not try the shifted zone: {zone:?}"
        );
    }
}

#[test]
fn a_pod_that_can_only_run_in_a_shifted_zone_waits_with_the_reason() {
    let mut case = Case::new(pods(
        "pinned",
        1,
        "1",
        "1Gi",
        json!({"spec": {"nodeSelector": {"topology.kubernetes.io/zone": "test-zone-a"}}}),
    ));
    case.pods.extend(pods("free", 1, "1", "1Gi", json!({})));
    case.shifted_zones = shifted("test-zone-a");
    let plan = case.solve();
    assert!(
        plan.node_claims.iter().all(|c| c.zone != "test-zone-a"),
        "{:?}",
        plan.node_claims
    );
    assert_eq!(plan.unschedulable.len(), 1, "{:?}", plan.unschedulable);
    let u = &plan.unschedulable[0];
    assert_eq!(u.pod.name, "pinned-0");
    assert_eq!(
        u.reason,
        PlacementFailure::Pools(vec![PoolRejection {
            pool: "default".into(),
            why: Rejection::ZoneShiftedAway {
                zones: vec!["test-zone-a".into()]
            },
        }])
    );
    assert_eq!(
        u.reason.to_string(),
        "NodePool default: zone test-zone-a is shifted away (ARC zonal shift); no new capacity there until the shift ends"
    );
}
