//! Snapshots from manifests, and the simulate output, with a hand-made catalog.

use std::path::PathBuf;
use std::sync::Arc;

use super::*;
use crate::apis::manifest::{load_paths, parse_documents};
use crate::scheduling::fixtures;

fn now() -> Timestamp {
    "2026-01-01T00:00:00Z".parse().unwrap()
}

fn from_docs(docs: &[crate::apis::manifest::Document], w: &mut Vec<Warning>) -> Result<Snapshot, ManifestError> {
    Snapshot::from_manifests(docs, Arc::new(fixtures::catalog()), now(), w)
}

fn scenario(text: &str) -> Snapshot {
    let (docs, mut w) = parse_documents("test.yaml", text).unwrap();
    from_docs(&docs, &mut w).unwrap()
}

const POOL: &str = "apiVersion: karpenter.sh/v1\nkind: NodePool\nmetadata: {name: default}\nspec:\n  template:\n    spec:\n      nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}\n";

#[test]
fn workloads_expand_into_named_pods() {
    let s = scenario(&format!(
        "{POOL}---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: web, namespace: shop}}\nspec:\n  replicas: 3\n  selector: {{matchLabels: {{app: web}}}}\n  template:\n    metadata: {{labels: {{app: web}}}}\n    spec: {{containers: [{{name: c, image: i}}]}}\n---\napiVersion: batch/v1\nkind: Job\nmetadata: {{name: batch}}\nspec:\n  parallelism: 2\n  template:\n    spec: {{restartPolicy: Never, containers: [{{name: c, image: i}}]}}\n---\napiVersion: apps/v1\nkind: StatefulSet\nmetadata: {{name: db}}\nspec:\n  serviceName: db\n  selector: {{matchLabels: {{app: db}}}}\n  template:\n    metadata: {{labels: {{app: db}}}}\n    spec: {{containers: [{{name: c, image: i}}]}}\n  volumeClaimTemplates:\n    - metadata: {{name: data}}\n      spec: {{accessModes: [ReadWriteOnce]}}\n"
    ));
    let names: Vec<String> = s
        .pods
        .iter()
        .map(|p| crate::scheduling::PodRef::of(p).to_string())
        .collect();
    assert_eq!(
        names,
        vec![
            "shop/web-0",
            "shop/web-1",
            "shop/web-2",
            "default/batch-0",
            "default/batch-1",
            "default/db-0"
        ]
    );
    assert_eq!(s.pods[0].metadata.labels.as_ref().unwrap().get("app").unwrap(), "web");
    assert_eq!(
        s.persistent_volume_claims[0].metadata.name.as_deref(),
        Some("data-db-0")
    );
    assert_eq!(s.node_pools.len(), 1);
}

#[test]
fn bound_pods_run_on_their_node_and_daemons_land_on_nodes_they_fit() {
    let s = scenario(&format!(
        "{POOL}---\napiVersion: v1\nkind: Node\nmetadata: {{name: n1, labels: {{kubernetes.io/arch: amd64}}}}\nstatus: {{allocatable: {{cpu: '4', memory: 8Gi, pods: '20'}}}}\n---\napiVersion: v1\nkind: Node\nmetadata: {{name: n2}}\nspec: {{taints: [{{key: k, effect: NoSchedule}}]}}\nstatus: {{allocatable: {{cpu: '4', memory: 8Gi, pods: '20'}}}}\n---\napiVersion: v1\nkind: Pod\nmetadata: {{name: r}}\nspec: {{nodeName: n1, containers: [{{name: c, image: i}}]}}\n---\napiVersion: apps/v1\nkind: DaemonSet\nmetadata: {{name: agent, namespace: kube-system}}\nspec:\n  selector: {{matchLabels: {{app: agent}}}}\n  template:\n    metadata: {{labels: {{app: agent}}}}\n    spec: {{containers: [{{name: a, image: i, resources: {{requests: {{cpu: '1'}}}}}}]}}\n"
    ));
    assert!(s.pods.is_empty());
    let n1: Vec<String> = s.nodes[0]
        .pods
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(n1, vec!["r", "agent-n1"]);
    assert!(s.nodes[1].pods.is_empty(), "the daemon does not tolerate n2's taint");
}

#[test]
fn bad_pod_spec_names_document_and_field() {
    let text = format!(
        "{POOL}---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: web}}\nspec:\n  selector: {{matchLabels: {{app: web}}}}\n  template:\n    metadata: {{labels: {{app: web}}}}\n    spec:\n      containers: [{{name: c, image: i}}]\n      tolerations: [{{key: k, operator: Maybe}}]\n"
    );
    let (docs, mut w) = parse_documents("bad.yaml", &text).unwrap();
    let e = from_docs(&docs, &mut w).unwrap_err();
    assert_eq!(
        (e.file.as_str(), e.index, e.path.as_str()),
        ("bad.yaml", 1, "spec.template.spec.tolerations[0].operator")
    );
}

#[test]
fn json_output_follows_the_contract() {
    let s = scenario(&format!(
        "{POOL}---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: inflate}}\nspec:\n  replicas: 3\n  selector: {{matchLabels: {{app: inflate}}}}\n  template:\n    metadata: {{labels: {{app: inflate}}}}\n    spec: {{containers: [{{name: c, image: i, resources: {{requests: {{cpu: 500m, memory: 256Mi}}}}}}]}}\n---\napiVersion: v1\nkind: Pod\nmetadata: {{name: huge}}\nspec: {{containers: [{{name: c, image: i, resources: {{requests: {{cpu: '900'}}}}}}]}}\n"
    ));
    let r = simulate(&s);
    let v = to_json(&r);
    let c = &v["nodeClaims"][0];
    assert_eq!(c["nodePool"], "default");
    assert_eq!(c["instanceType"], "c.large");
    // The pool names no capacity type: on-demand, as Karpenter defaults.
    assert_eq!(c["capacityType"], "on-demand");
    assert_eq!(c["pricePerHour"], 0.08);
    assert_eq!(c["allocatable"]["memory"], "4Gi");
    assert_eq!(c["labels"]["kubernetes.io/hostname"], c["name"]);
    assert_eq!(
        c["pods"],
        serde_json::json!(["default/inflate-0", "default/inflate-1", "default/inflate-2"])
    );
    assert_eq!(v["unschedulable"][0]["pod"], "default/huge");
    assert_eq!(
        v["unschedulable"][0]["reason"],
        "no instance type in NodePool default fits 900 cpu"
    );
    assert_eq!(v["totalPricePerHour"], 0.08);
    assert_eq!(v["stats"]["pendingPods"], 4);
    let table = to_table(&r);
    assert!(table.starts_with("NODECLAIM"), "{table}");
    assert!(
        table.contains("default/huge: no instance type in NodePool default fits 900 cpu"),
        "{table}"
    );
}

#[test]
fn examples_load_as_scenarios() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let (docs, mut w) = load_paths(&[dir]).unwrap();
    let s = from_docs(&docs, &mut w).unwrap();
    assert_eq!(s.pods.len(), 100 + 3 + 3 + 2 + 6 + 3);
}

#[test]
fn the_class_kubelet_caps_every_claim_of_its_pools_even_with_a_catalog_allocatable() {
    // The test catalog gives allocatable explicitly (20-110 pods a type).
    let class = "apiVersion: karpenter.k8s.aws/v1\nkind: EC2NodeClass\nmetadata: {name: default}\nspec:\n  role: R\n  amiSelectorTerms: [{alias: al2023@latest}]\n  subnetSelectorTerms: [{tags: {a: b}}]\n  securityGroupSelectorTerms: [{tags: {a: b}}]\n  kubelet: {maxPods: 10}\n";
    let app = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: tiny}\nspec:\n  replicas: 40\n  selector: {matchLabels: {app: tiny}}\n  template:\n    metadata: {labels: {app: tiny}}\n    spec: {containers: [{name: c, image: i, resources: {requests: {cpu: 10m, memory: 16Mi}}}]}\n";
    let report = simulate(&scenario(&format!("{class}---\n{POOL}---\n{app}")));
    let claims = &report.plan.node_claims;
    assert!(claims.iter().all(|c| c.pods.len() <= 10), "{claims:#?}");
    assert_eq!(claims.iter().map(|c| c.pods.len()).sum::<usize>(), 40);
    assert_eq!(claims.len(), 4);
}

#[test]
fn namespaces_are_read_for_namespace_selectors() {
    let text = format!(
        "{POOL}---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: payments, labels: {{tier: critical}}}}\n"
    );
    let (docs, mut w) = parse_documents("test.yaml", &text).unwrap();
    let s = from_docs(&docs, &mut w).unwrap();
    assert!(w.is_empty(), "a known kind, not ignored: {w:?}");
    assert_eq!(s.namespaces.len(), 1);
    assert_eq!(s.solve_input().namespaces.len(), 1);
}
