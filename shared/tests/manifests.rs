//! The v1 API types read every bundled example and reject malformed manifests
//! with an error naming the file, document and field path.

use std::path::PathBuf;

use nodesmith::apis::manifest::{Object, load_paths, parse_documents};
use nodesmith::apis::nodepool::ConsolidationPolicy;
use nodesmith::apis::{NillableDuration, NodePool};

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

#[test]
fn every_example_parses() {
    let (docs, warnings) = load_paths(&[examples()]).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    let pools: Vec<&NodePool> = docs
        .iter()
        .filter_map(|d| match &d.object {
            Object::NodePool(p) => Some(p),
            _ => None,
        })
        .collect();
    assert_eq!(pools.len(), 5, "one pool in 01, 02, 04 and two in 03");
    let deployments = docs
        .iter()
        .filter(|d| matches!(d.object, Object::Deployment(_)))
        .count();
    assert_eq!(deployments, 6);
    // Files are read in sorted order, documents in file order.
    let files: Vec<&str> = docs.iter().map(|d| d.file.rsplit('/').next().unwrap()).collect();
    let mut sorted = files.clone();
    sorted.sort();
    assert_eq!(files, sorted);
}

#[test]
fn karpenter_defaults_are_applied() {
    let text = std::fs::read_to_string(examples().join("03-guard-rails-and-gpu.yaml")).unwrap();
    let (docs, _) = parse_documents("03.yaml", &text).unwrap();
    let Object::NodePool(pool) = &docs[0].object else {
        panic!("first document is a NodePool")
    };
    let spec = &pool.spec;
    assert_eq!(
        spec.template.spec.expire_after,
        NillableDuration::parse("720h").unwrap()
    );
    assert_eq!(
        spec.disruption.consolidation_policy,
        ConsolidationPolicy::WhenEmptyOrUnderutilized
    );
    assert_eq!(
        spec.disruption.consolidate_after,
        NillableDuration::parse("0s").unwrap()
    );
    assert_eq!(spec.disruption.budgets.len(), 1);
    assert_eq!(spec.disruption.budgets[0].nodes, "10%");
    assert_eq!(pool.weight(), 0);
    let Object::NodePool(gpu) = &docs[1].object else {
        panic!("second document is a NodePool")
    };
    assert_eq!(gpu.weight(), 10);
    assert_eq!(gpu.spec.limits["cpu"].to_string(), "900");
    let reqs = gpu.requirements().unwrap();
    assert!(reqs.get("node.kubernetes.io/instance-type").unwrap().has("g5.xlarge"));
    assert!(reqs.get("karpenter.sh/nodepool").unwrap().has("specialist-compute"));
}

const POOL_HEAD: &str = "apiVersion: karpenter.sh/v1\nkind: NodePool\nmetadata: {name: p}\nspec:\n";
const CLASS_HEAD: &str = "apiVersion: karpenter.k8s.aws/v1\nkind: EC2NodeClass\nmetadata: {name: c}\nspec:\n";
const TEMPLATE: &str =
    "  template:\n    spec:\n      nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}\n";

#[test]
fn malformed_manifests_name_the_field() {
    let cases: Vec<(String, &str, &str)> = vec![
        // (document, expected path, expected words in the message)
        (format!("{POOL_HEAD}{TEMPLATE}      requirements:\n        - {{key: a, operator: Maybe, values: [x]}}\n"),
         "spec.template.spec.requirements[0].operator", "unknown variant"),
        (format!("{POOL_HEAD}{TEMPLATE}      requirements:\n        - {{key: a, operator: In}}\n"),
         "spec.template.spec.requirements[0].values", "at least one value"),
        (format!("{POOL_HEAD}{TEMPLATE}      requirements:\n        - {{key: karpenter.k8s.aws/instance-cpu, operator: Gt, values: [\"a\"]}}\n"),
         "spec.template.spec.requirements[0].values", "integer"),
        (format!("{POOL_HEAD}{TEMPLATE}      requirements:\n        - {{key: kubernetes.io/hostname, operator: In, values: [x]}}\n"),
         "spec.template.spec.requirements[0].key", "restricted"),
        (format!("{POOL_HEAD}{TEMPLATE}      requirements:\n        - {{key: a, operator: In, values: [x], minValues: 2}}\n"),
         "spec.template.spec.requirements[0].minValues", "at least that many values"),
        (format!("{POOL_HEAD}  weight: 101\n{TEMPLATE}"), "spec.weight", "between 1 and 100"),
        (format!("{POOL_HEAD}{TEMPLATE}      expireAfter: 30d\n"), "spec.template.spec.expireAfter", "invalid duration"),
        (format!("{POOL_HEAD}{TEMPLATE}      taints: [{{key: a, effect: Sometimes}}]\n"), "spec.template.spec.taints[0].effect", "unknown variant"),
        (format!("{POOL_HEAD}  template:\n    metadata: {{labels: {{karpenter.sh/custom: x}}}}\n    spec:\n      nodeClassRef: {{group: g, kind: k, name: n}}\n"),
         "spec.template.metadata.labels[\"karpenter.sh/custom\"]", "restricted"),
        (format!("{POOL_HEAD}  template:\n    spec: {{}}\n"), "spec.template.spec", "nodeClassRef"),
        (format!("{POOL_HEAD}{TEMPLATE}  disruption:\n    budgets: [{{nodes: \"150%\"}}]\n"), "spec.disruption.budgets[0].nodes", "percentage"),
        (format!("{POOL_HEAD}{TEMPLATE}  disruption:\n    budgets: [{{nodes: \"1\", schedule: \"@daily\"}}]\n"), "spec.disruption.budgets[0]", "'schedule' must be set with 'duration'"),
        (format!("{POOL_HEAD}{TEMPLATE}  disruption:\n    budgets: [{{nodes: \"1\", schedule: \"61 * * * *\", duration: 1h}}]\n"), "spec.disruption.budgets[0].schedule", "out of range"),
        (format!("{POOL_HEAD}{TEMPLATE}  disruption:\n    consolidationPolicy: Always\n"), "spec.disruption.consolidationPolicy", "unknown variant"),
        (format!("{POOL_HEAD}{TEMPLATE}  limits: {{cpu: lots}}\n"), "spec.limits.cpu", "invalid quantity"),
        (format!("{CLASS_HEAD}  role: r\n  amiSelectorTerms: [{{alias: al2023@latest}}]\n  subnetSelectorTerms: [{{id: net-1}}]\n  securityGroupSelectorTerms: [{{tags: {{a: b}}}}]\n"),
         "spec.subnetSelectorTerms[0].id", "subnet-"),
        (format!("{CLASS_HEAD}  amiSelectorTerms: [{{alias: al2023@latest}}]\n  subnetSelectorTerms: [{{tags: {{a: b}}}}]\n  securityGroupSelectorTerms: [{{tags: {{a: b}}}}]\n"),
         "spec", "exactly one of ['role', 'instanceProfile']"),
        (format!("{CLASS_HEAD}  role: r\n  amiSelectorTerms: [{{alias: ubuntu@latest}}]\n  subnetSelectorTerms: [{{tags: {{a: b}}}}]\n  securityGroupSelectorTerms: [{{tags: {{a: b}}}}]\n"),
         "spec.amiSelectorTerms[0].alias", "family@version"),
        (format!("{CLASS_HEAD}  role: r\n  amiSelectorTerms: [{{id: ami-123}}]\n  subnetSelectorTerms: [{{tags: {{a: b}}}}]\n  securityGroupSelectorTerms: [{{tags: {{a: b}}}}]\n"),
         "spec.amiFamily", "required"),
        (format!("{CLASS_HEAD}  role: r\n  amiSelectorTerms: [{{alias: al2023@latest}}]\n  subnetSelectorTerms: [{{tags: {{a: b}}}}]\n  securityGroupSelectorTerms: [{{tags: {{a: b}}}}]\n  kubelet: {{evictionHard: {{memory.free: 1Gi}}}}\n"),
         "spec.kubelet.evictionHard[\"memory.free\"]", "valid keys"),
        (format!("{CLASS_HEAD}  role: r\n  amiSelectorTerms: [{{alias: al2023@latest}}]\n  subnetSelectorTerms: [{{tags: {{a: b}}}}]\n  securityGroupSelectorTerms: [{{tags: {{a: b}}}}]\n  tags: {{karpenter.sh/nodepool: x}}\n"),
         "spec.tags[\"karpenter.sh/nodepool\"]", "restricted"),
        (format!("{CLASS_HEAD}  role: r\n  amiSelectorTerms: [{{alias: al2023@latest}}]\n  subnetSelectorTerms: [{{tags: {{a: b}}}}]\n  securityGroupSelectorTerms: [{{tags: {{a: b}}}}]\n  metadataOptions: {{httpPutResponseHopLimit: 0}}\n"),
         "spec.metadataOptions.httpPutResponseHopLimit", "between 1 and 64"),
        ("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers: [{name: c, resources: {requests: {cpu: many}}}]\n".to_string(),
         "spec.containers[0].resources.requests.cpu", ""),
        ("apiVersion: karpenter.sh/v1beta1\nkind: NodePool\nmetadata: {name: x}\n".to_string(), "apiVersion", "v1 API"),
        ("kind: Pod\n".to_string(), "apiVersion", "required"),
        (format!("{POOL_HEAD}{TEMPLATE}      requirments: []\n"), "spec.template.spec.requirments", "unknown field"),
        (format!("{CLASS_HEAD}  role: r\n  amiSelectorTerms: [{{alias: al2023@latest, version: 2}}]\n  subnetSelectorTerms: [{{tags: {{a: b}}}}]\n  securityGroupSelectorTerms: [{{tags: {{a: b}}}}]\n"),
         "spec.amiSelectorTerms[0].version", "unknown field"),
        ("a: [unclosed\n".to_string(), "a", "invalid YAML"),
    ];
    for (i, (doc, path, words)) in cases.iter().enumerate() {
        // Put a valid document first so the index in the error is checked too.
        let text = format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: ok}}\n---\n{doc}");
        let err = parse_documents("bad.yaml", &text).expect_err(&format!("case {i} should fail:\n{doc}"));
        assert_eq!(err.file, "bad.yaml");
        assert_eq!(err.index, 1, "case {i}: {err}");
        assert_eq!(err.path, *path, "case {i}: {err}");
        assert!(
            err.to_string().contains(words),
            "case {i}: {err:?} should mention {words:?}"
        );
    }
}

#[test]
fn unknown_kinds_are_warnings_not_errors() {
    let (docs, warnings) =
        parse_documents("x.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\n").unwrap();
    assert!(docs.is_empty());
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0].message.contains("ConfigMap"));
}

#[test]
fn the_nodeclass_reference_example_is_valid() {
    let text = format!(
        "{CLASS_HEAD}  role: KarpenterNodeRole\n  amiSelectorTerms: [{{alias: bottlerocket@latest}}]\n  subnetSelectorTerms: [{{tags: {{karpenter.sh/discovery: c}}}}, {{id: subnet-0abc}}]\n  securityGroupSelectorTerms: [{{name: eks-sg}}]\n  kubelet: {{maxPods: 110, evictionHard: {{memory.available: 5%}}, imageGCHighThresholdPercent: 85, imageGCLowThresholdPercent: 80}}\n  blockDeviceMappings: [{{deviceName: /dev/xvda, rootVolume: true, ebs: {{volumeSize: 100Gi, volumeType: gp3}}}}]\n  tags: {{team: a}}\n  associatePublicIPAddress: false\n  instanceStorePolicy: RAID0\n  context: ctx-1\n  detailedMonitoring: true\n"
    );
    let (docs, _) = parse_documents("c.yaml", &text).unwrap();
    let Object::EC2NodeClass(c) = &docs[0].object else {
        panic!("an EC2NodeClass")
    };
    assert_eq!(c.ami_family().as_deref(), Some("Bottlerocket"));
    assert_eq!(c.spec.metadata_options.http_tokens, "required");
    assert_eq!(c.spec.metadata_options.http_put_response_hop_limit, 1);
    let kubelet = c.spec.kubelet.as_ref().unwrap();
    assert_eq!(
        (
            kubelet.image_gc_high_threshold_percent,
            kubelet.image_gc_low_threshold_percent
        ),
        (Some(85), Some(80))
    );
    assert_eq!(c.spec.associate_public_ip_address, Some(false));
    assert_eq!(c.spec.instance_store_policy.as_deref(), Some("RAID0"));
    assert_eq!(c.spec.context.as_deref(), Some("ctx-1"));
}

#[test]
fn selected_capacity_reservations_are_planned_as_reserved_offerings() {
    // The class's status lists what its selectors found (the sweep writes it;
    // here, as a user would export it): two instances of room in one ODCR.
    let text = format!(
        "{CLASS_HEAD}  role: KarpenterNodeRole\n  amiSelectorTerms: [{{alias: al2023@latest}}]\n  subnetSelectorTerms: [{{id: subnet-0abc}}]\n  securityGroupSelectorTerms: [{{name: eks-sg}}]\n  capacityReservationSelectorTerms: [{{ownerID: \"012345678901\", tags: {{a: b}}}}]\nstatus:\n  capacityReservations:\n    - {{id: cr-0123456789abcdef0, instanceType: m5.xlarge, availabilityZone: us-east-1a, ownerID: \"012345678901\", reservationType: default, state: active, availableInstanceCount: 2}}\n---\napiVersion: karpenter.sh/v1\nkind: NodePool\nmetadata: {{name: reserved}}\nspec:\n  template:\n    spec:\n      nodeClassRef: {{group: karpenter.k8s.aws, kind: EC2NodeClass, name: c}}\n      requirements:\n        - {{key: karpenter.sh/capacity-type, operator: In, values: [reserved, on-demand]}}\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: app, namespace: default}}\nspec:\n  replicas: 4\n  selector: {{matchLabels: {{app: a}}}}\n  template:\n    metadata: {{labels: {{app: a}}}}\n    spec:\n      containers: [{{name: c, image: i, resources: {{requests: {{cpu: '3', memory: 1Gi}}}}}}]\n"
    );
    let dir = std::env::temp_dir().join(format!("nodesmith-reserved-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("reserved.yaml");
    std::fs::write(&file, &text).unwrap();
    let now = "2026-01-01T00:00:00Z".parse().unwrap();
    let (report, warnings) = nodesmith::simulate::run(&[file], None, now).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    assert!(warnings.is_empty(), "{warnings:?}");
    let claims = &report.plan.node_claims;
    let reserved: Vec<_> = claims.iter().filter(|c| c.capacity_type == "reserved").collect();
    assert_eq!(reserved.len(), 2, "{claims:#?}");
    for c in reserved {
        assert_eq!((c.instance_type.as_str(), c.zone.as_str()), ("m5.xlarge", "us-east-1a"));
        assert_eq!(
            c.labels["karpenter.k8s.aws/capacity-reservation-id"],
            "cr-0123456789abcdef0"
        );
    }
    assert!(
        claims
            .iter()
            .filter(|c| c.capacity_type != "reserved")
            .all(|c| c.capacity_type == "on-demand"),
        "the rest falls back to on-demand: {claims:#?}"
    );
    assert_eq!(report.plan.unschedulable.len(), 0);
}
