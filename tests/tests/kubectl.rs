//! The Kubernetes API test server, driven by the real `kubectl` binary (found
//! on PATH; a missing kubectl fails these tests rather than skipping them).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use kube::api::{Api, DynamicObject, ListParams};
use kube::core::{ApiResource, GroupVersionKind};
use nodesmith_tests::kube_server::{Function, Identity, KubeServer, NodeRegistration};
use nodesmith_tests::kubectl::{Kubectl, header, row};
use serde_json::{Value, json};

/// The example manifest's style: a NodePool, an EC2NodeClass and a Deployment.
const MANIFEST: &str = r#"
apiVersion: karpenter.sh/v1
kind: NodePool
metadata:
  name: default
spec:
  template:
    spec:
      nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}
      requirements:
        - {key: karpenter.sh/capacity-type, operator: In, values: ["spot", "on-demand"]}
  disruption:
    consolidationPolicy: WhenEmptyOrUnderutilized
    consolidateAfter: 30s
---
apiVersion: karpenter.k8s.aws/v1
kind: EC2NodeClass
metadata:
  name: default
spec:
  role: KarpenterNodeRole
  amiSelectorTerms: [{alias: al2023@latest}]
  subnetSelectorTerms: [{tags: {karpenter.sh/discovery: test}}]
  securityGroupSelectorTerms: [{tags: {karpenter.sh/discovery: test}}]
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: inflate
spec:
  replicas: 3
  selector: {matchLabels: {app: inflate}}
  template:
    metadata: {labels: {app: inflate}}
    spec:
      terminationGracePeriodSeconds: 0
      containers:
        - name: inflate
          image: public.ecr.aws/eks-distro/kubernetes/pause:3.7
          resources:
            requests: {cpu: 100m, memory: 256Mi}
"#;

/// A server with a kubeconfig for it in a fresh directory.
struct Cluster {
    server: KubeServer,
    dir: PathBuf,
    kubectl: Kubectl,
}

static DIRS: AtomicUsize = AtomicUsize::new(0);

impl Cluster {
    async fn start() -> Self {
        let server = KubeServer::start().await;
        let dir = std::env::temp_dir().join(format!(
            "nodesmith-kubectl-{}-{}",
            std::process::id(),
            DIRS.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        server.write_kubeconfig(&dir.join("kubeconfig")).unwrap();
        let kubectl = Kubectl {
            kubeconfig: dir.join("kubeconfig"),
            dir: dir.clone(),
        };
        Cluster { server, dir, kubectl }
    }

    fn node(&self, name: &str) {
        let reg = NodeRegistration {
            name: name.into(),
            instance_id: format!("i-{name}"),
            instance_type: "m5.large".into(),
            zone: "us-east-1a".into(),
            capacity_type: "on-demand".into(),
            capacity: BTreeMap::from([
                ("cpu".into(), "2".into()),
                ("memory".into(), "8Gi".into()),
                ("pods".into(), "29".into()),
            ]),
            ..Default::default()
        };
        self.server.register_node(&reg).unwrap();
    }
}

impl std::ops::Deref for Cluster {
    type Target = Kubectl;

    fn deref(&self) -> &Kubectl {
        &self.kubectl
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn names(list: &Value) -> Vec<String> {
    let mut v: Vec<String> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    v.sort();
    v
}

fn pods_of(list: &Value) -> Vec<&Value> {
    list["items"].as_array().unwrap().iter().collect()
}

const NODE: &str = "ip-10-0-1-1.ec2.internal";

/// The manifest applied, the controllers run once: three pending `inflate` pods.
async fn with_inflate() -> Cluster {
    let c = Cluster::start().await;
    let out = c.apply(MANIFEST).await;
    assert!(out.contains("deployment.apps/inflate created"), "{out}");
    c.server.reconcile();
    c
}

/// `with_inflate`, with one Node the pods are bound to.
async fn with_inflate_running() -> Cluster {
    let c = with_inflate().await;
    c.node(NODE);
    assert_eq!(c.server.schedule().bound.len(), 3);
    c.server.reconcile();
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_creates_owned_replica_sets_and_pods_and_get_filters_them() {
    let c = with_inflate().await;
    assert_eq!(names(&c.json(&["get", "nodepools"]).await), ["default"]);
    assert_eq!(names(&c.json(&["get", "ec2nc"]).await), ["default"]);
    let ns = names(&c.json(&["get", "ns"]).await);
    assert_eq!(ns, ["default", "kube-node-lease", "kube-public", "kube-system"]);

    let rs = c.json(&["get", "rs"]).await;
    let rs = pods_of(&rs);
    assert_eq!(rs.len(), 1);
    let hash = rs[0]["metadata"]["labels"]["pod-template-hash"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(rs[0]["metadata"]["name"], format!("inflate-{hash}"));
    let deploy = c.json(&["get", "deploy", "inflate"]).await;
    assert_eq!(
        rs[0]["metadata"]["ownerReferences"][0]["uid"],
        deploy["metadata"]["uid"]
    );
    assert_eq!(rs[0]["metadata"]["ownerReferences"][0]["controller"], true);

    let pods = c.json(&["get", "pods", "-l", "app=inflate"]).await;
    assert_eq!(pods_of(&pods).len(), 3);
    for p in pods_of(&pods) {
        let name = p["metadata"]["name"].as_str().unwrap();
        let suffix = name.strip_prefix(&format!("inflate-{hash}-")).unwrap();
        assert_eq!(suffix.len(), 5, "{name}");
        assert_eq!(p["metadata"]["ownerReferences"][0]["uid"], rs[0]["metadata"]["uid"]);
        assert_eq!(p["metadata"]["labels"]["pod-template-hash"], hash.as_str());
        assert_eq!(p["status"]["phase"], "Pending");
    }
    assert!(pods_of(&c.json(&["get", "pods", "-l", "app=other"]).await).is_empty());
    assert_eq!(
        pods_of(
            &c.json(&["get", "pods", "-A", "--field-selector", "status.phase=Pending"])
                .await
        )
        .len(),
        3
    );

    c.node(NODE);
    c.server.schedule();
    c.server.reconcile();
    let on_node = format!("spec.nodeName={NODE}");
    assert_eq!(
        pods_of(&c.json(&["get", "pods", "--field-selector", &on_node]).await).len(),
        3
    );
    assert!(
        pods_of(
            &c.json(&["get", "pods", "--field-selector", "status.phase=Pending"])
                .await
        )
        .is_empty()
    );
    let deploy = c.json(&["get", "deployment", "inflate"]).await;
    assert_eq!(deploy["status"]["readyReplicas"], 3);
    assert_eq!(deploy["status"]["updatedReplicas"], 3);
    assert_eq!(deploy["status"]["observedGeneration"], 1);
    // Server-side tables: the columns kubectl users know.
    let wide = c.ok(&["get", "pods", "-o", "wide"]).await;
    let rows: Vec<&str> = wide.lines().filter(|l| l.starts_with("inflate-")).collect();
    assert_eq!(rows.len(), 3, "{wide}");
    assert!(
        wide.starts_with("NAME") && wide.lines().next().unwrap().contains("NODE"),
        "{wide}"
    );
    assert!(
        rows.iter()
            .all(|r| r.contains("1/1") && r.contains("Running") && r.contains(NODE)),
        "{wide}"
    );
    let out = c.ok(&["get", "deploy"]).await;
    assert!(
        out.lines().any(|l| l.starts_with("inflate") && l.contains("3/3")),
        "{out}"
    );
    let out = c.ok(&["get", "no"]).await;
    assert!(out.lines().any(|l| l.starts_with(NODE) && l.contains("Ready")), "{out}");
    let out = c.ok(&["get", "pod", rows[0].split_whitespace().next().unwrap()]).await;
    assert!(out.contains("STATUS") && out.contains("Running"), "{out}");
    let yaml = c.ok(&["get", "deploy", "inflate", "-o", "yaml"]).await;
    assert!(yaml.contains("readyReplicas: 3"), "{yaml}");

    // Applying again changes what changed; the generation follows the spec.
    let out = c.apply(&MANIFEST.replace("replicas: 3", "replicas: 4")).await;
    assert!(out.contains("nodepool.karpenter.sh/default unchanged"), "{out}");
    assert!(out.contains("deployment.apps/inflate configured"), "{out}");
    c.server.reconcile();
    let deploy = c.json(&["get", "deploy", "inflate"]).await;
    assert_eq!(
        (
            deploy["metadata"]["generation"].as_i64(),
            deploy["status"]["replicas"].as_i64()
        ),
        (Some(2), Some(4))
    );

    // As on a real cluster, a namespace must exist before objects go in it.
    let r = c
        .run(
            &["apply", "-n", "nowhere", "-f", "-"],
            Some(&MANIFEST[MANIFEST.find("apiVersion: apps/v1").unwrap()..]),
        )
        .await;
    assert!(!r.ok && r.stderr.contains("namespaces \"nowhere\" not found"), "{r:?}");
    // kubectl's typed writes (`create namespace`) send protobuf: refused, with a clear 415.
    let r = c.run(&["create", "namespace", "nowhere"], None).await;
    assert!(!r.ok && r.stderr.contains("UnsupportedMediaType"), "{r:?}");
    c.apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: nowhere}\n")
        .await;
    let r = c
        .run(
            &["apply", "-n", "nowhere", "-f", "-"],
            Some(&MANIFEST[MANIFEST.find("apiVersion: apps/v1").unwrap()..]),
        )
        .await;
    assert!(r.ok, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_through_the_scale_subresource_adds_and_removes_pods() {
    let c = with_inflate_running().await;
    let out = c.ok(&["scale", "deployment/inflate", "--replicas=5"]).await;
    assert!(out.contains("deployment.apps/inflate scaled"), "{out}");
    c.server.reconcile();
    let pods = c.json(&["get", "pods", "-l", "app=inflate"]).await;
    assert_eq!(pods_of(&pods).len(), 5);
    let pending = c.json(&["get", "pods", "--field-selector", "spec.nodeName="]).await;
    assert_eq!(pods_of(&pending).len(), 2);
    let deploy = c.json(&["get", "deploy", "inflate"]).await;
    assert_eq!(
        (
            deploy["status"]["replicas"].as_i64(),
            deploy["status"]["readyReplicas"].as_i64()
        ),
        (Some(5), Some(3))
    );

    // Down to two: the unscheduled pods go first.
    c.ok(&["scale", "deploy", "inflate", "--replicas=2"]).await;
    let report = c.server.reconcile();
    assert_eq!(report.pods_deleted.len(), 3, "{report:?}");
    let pods = c.json(&["get", "pods"]).await;
    assert_eq!(pods_of(&pods).len(), 2);
    assert!(pods_of(&pods).iter().all(|p| p["spec"]["nodeName"] == NODE));
    let deploy = c.json(&["get", "deploy", "inflate"]).await;
    assert_eq!(deploy["spec"]["replicas"], 2);
    assert_eq!(deploy["status"]["availableReplicas"], 2);

    // A ReplicaSet scales the same way; its Deployment sets it back.
    let rs = names(&c.json(&["get", "rs"]).await).remove(0);
    c.ok(&["scale", "rs", &rs, "--replicas=0"]).await;
    c.server.reconcile();
    assert_eq!(c.json(&["get", "rs", &rs]).await["spec"]["replicas"], 2);
    // A stale precondition is refused.
    let r = c
        .run(
            &["scale", "deploy/inflate", "--current-replicas=7", "--replicas=1"],
            None,
        )
        .await;
    assert!(!r.ok, "{r:?}");
    assert_eq!(c.json(&["get", "deploy", "inflate"]).await["spec"]["replicas"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patch_merge_json_and_strategic() {
    let c = with_inflate_running().await;
    c.ok(&[
        "patch",
        "deployment",
        "inflate",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"replicas":1}}"#,
    ])
    .await;
    c.ok(&[
        "patch",
        "node",
        NODE,
        "--type",
        "json",
        "-p",
        r#"[{"op":"add","path":"/metadata/labels/team","value":"a"}]"#,
    ])
    .await;
    c.ok(&[
        "patch",
        "deploy",
        "inflate",
        "-p",
        r#"{"metadata":{"labels":{"tier":"web"}}}"#,
    ])
    .await;
    let deploy = c.json(&["get", "deploy", "inflate"]).await;
    assert_eq!(deploy["spec"]["replicas"], 1);
    assert_eq!(deploy["metadata"]["labels"]["tier"], "web");
    assert_eq!(c.json(&["get", "node", NODE]).await["metadata"]["labels"]["team"], "a");
    assert_eq!(pods_of(&c.json(&["get", "nodes", "-l", "team=a"]).await).len(), 1);
    // A failing JSON patch test is a conflict and changes nothing.
    let r = c
        .run(&["patch", "node", NODE, "--type", "json", "-p", r#"[{"op":"test","path":"/metadata/labels/team","value":"b"},{"op":"remove","path":"/metadata/labels/team"}]"#], None)
        .await;
    assert!(!r.ok, "{r:?}");
    assert_eq!(c.json(&["get", "node", NODE]).await["metadata"]["labels"]["team"], "a");
    c.server.reconcile();
    assert_eq!(pods_of(&c.json(&["get", "pods"]).await).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_node_pod_and_deployment_with_their_events() {
    let c = with_inflate_running().await;
    let pod = names(&c.json(&["get", "pods"]).await).remove(0);
    let uid = c.json(&["get", "pod", &pod]).await["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    c.server
        .apply(&json!({"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": format!("{pod}.1"), "namespace": "default"},
            "involvedObject": {"kind": "Pod", "namespace": "default", "name": pod, "uid": uid, "apiVersion": "v1"},
            "reason": "Nominated", "message": "Pod should schedule on a test node", "type": "Normal",
            "source": {"component": "test"}, "count": 1,
            "firstTimestamp": "2025-01-01T00:00:00Z", "lastTimestamp": "2025-01-01T00:00:00Z"}))
        .unwrap();
    let out = c.ok(&["describe", "pod", &pod]).await;
    assert!(out.contains(&format!("Node:           {NODE}/")), "{out}");
    assert!(out.contains("Controlled By:  ReplicaSet/inflate-"), "{out}");
    assert!(out.contains("Pod should schedule on a test node"), "{out}");
    let out = c.ok(&["describe", "node", NODE]).await;
    assert!(out.contains("Non-terminated Pods:          (3 in total)"), "{out}");
    assert!(
        out.contains("ProviderID:                   aws:///us-east-1a/i-"),
        "{out}"
    );
    let out = c.ok(&["describe", "deploy", "inflate"]).await;
    assert!(
        out.contains("3 desired | 3 updated | 3 total | 3 available | 0 unavailable"),
        "{out}"
    );
    let out = c.ok(&["get", "events"]).await;
    assert!(out.contains(&format!("{pod}.1")), "{out}");
    let events = c
        .json(&["get", "ev", "-A", "--field-selector", "reason=Nominated"])
        .await;
    assert_eq!(pods_of(&events).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cordon_and_drain_evict_deployment_pods_which_come_back_pending() {
    let c = with_inflate_running().await;
    // A DaemonSet pod on the node, which drain leaves with --ignore-daemonsets.
    let ds = c
        .server
        .apply(&json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent", "namespace": "kube-system"},
            "spec": {"selector": {"matchLabels": {"app": "agent"}}, "template": {"metadata": {"labels": {"app": "agent"}},
                "spec": {"containers": [{"name": "a", "image": "agent"}]}}}}))
        .unwrap();
    c.server
        .apply(&json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "agent-x", "namespace": "kube-system", "labels": {"app": "agent"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": ds["metadata"]["uid"], "controller": true}]},
            "spec": {"nodeName": NODE, "containers": [{"name": "a", "image": "agent"}]}, "status": {"phase": "Running"}}))
        .unwrap();
    let before = names(&c.json(&["get", "pods"]).await);

    c.ok(&["cordon", NODE]).await;
    assert_eq!(c.json(&["get", "node", NODE]).await["spec"]["unschedulable"], true);
    assert!(c.ok(&["get", "nodes"]).await.contains("Ready,SchedulingDisabled"));
    let r = c
        .run(
            &[
                "drain",
                NODE,
                "--ignore-daemonsets",
                "--delete-emptydir-data",
                "--force",
                "--timeout=30s",
            ],
            None,
        )
        .await;
    assert!(r.ok, "{r:?}");
    assert!(r.stdout.contains(&format!("node/{NODE} drained")), "{r:?}");
    assert!(
        r.stderr
            .contains("ignoring DaemonSet-managed Pods: kube-system/agent-x"),
        "{r:?}"
    );
    assert!(c.json(&["get", "pods"]).await["items"].as_array().unwrap().is_empty());
    assert!(c.server.pod("kube-system", "agent-x").is_some());

    // The ReplicaSet replaces them; the cordoned node takes none.
    c.server.reconcile();
    c.server.schedule();
    let pods = c.json(&["get", "pods", "-l", "app=inflate"]).await;
    assert_eq!(pods_of(&pods).len(), 3);
    for p in pods_of(&pods) {
        assert!(!before.contains(&p["metadata"]["name"].as_str().unwrap().to_string()));
        assert_eq!(p["status"]["phase"], "Pending");
        assert!(p["spec"]["nodeName"].is_null());
    }
    c.ok(&["uncordon", NODE]).await;
    assert_eq!(c.server.schedule().bound.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_waits_on_a_disruption_budget_that_allows_nothing() {
    let c = with_inflate_running().await;
    c.apply("apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: inflate}\nspec:\n  minAvailable: 3\n  selector: {matchLabels: {app: inflate}}\n").await;
    let pdb = c.json(&["get", "pdb", "inflate"]).await;
    assert_eq!(pdb["status"]["disruptionsAllowed"], 0);
    let r = c
        .run(&["drain", NODE, "--ignore-daemonsets", "--timeout=3s"], None)
        .await;
    assert!(!r.ok, "{r:?}");
    assert!(
        r.stderr
            .contains("Cannot evict pod as it would violate the pod's disruption budget"),
        "{r:?}"
    );
    assert_eq!(pods_of(&c.json(&["get", "pods"]).await).len(), 3);
    assert!(c.server.count_requests(&http::Method::POST, "/eviction") >= 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_node_deletes_its_pods_and_their_replica_set_recreates_them() {
    let c = with_inflate_running().await;
    let before = names(&c.json(&["get", "pods"]).await);
    let out = c.ok(&["delete", "node", NODE]).await;
    assert!(out.contains(&format!("node \"{NODE}\" deleted")), "{out}");
    let report = c.server.reconcile();
    let mut collected: Vec<String> = report
        .collected
        .iter()
        .map(|p| p.trim_start_matches("default/").to_string())
        .collect();
    collected.sort();
    assert_eq!(collected, before);
    assert_eq!(report.pods_created.len(), 3);
    let pods = c.json(&["get", "pods"]).await;
    assert_eq!(pods_of(&pods).len(), 3);
    assert!(
        pods_of(&pods).iter().all(|p| p["spec"]["nodeName"].is_null()
            && !before.contains(&p["metadata"]["name"].as_str().unwrap().to_string()))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_deployment_collects_its_replica_sets_and_pods() {
    let c = with_inflate_running().await;
    let out = c.ok(&["delete", "deployment", "inflate"]).await;
    assert!(out.contains("deployment.apps \"inflate\" deleted"), "{out}");
    c.server.reconcile();
    c.server.reconcile();
    assert!(c.json(&["get", "rs"]).await["items"].as_array().unwrap().is_empty());
    assert!(c.json(&["get", "pods"]).await["items"].as_array().unwrap().is_empty());
    let r = c.run(&["get", "deploy", "inflate"], None).await;
    assert!(!r.ok && r.stderr.contains("not found"), "{r:?}");
}

/// A NodeClaim as Karpenter writes one (labels, spec), created by the test as the admin.
const NODECLAIM: &str = r#"
apiVersion: karpenter.sh/v1
kind: NodeClaim
metadata:
  name: default-x7k2p
  labels:
    karpenter.sh/nodepool: default
    karpenter.sh/capacity-type: spot
    node.kubernetes.io/instance-type: m5.large
    topology.kubernetes.io/zone: us-east-1a
spec:
  nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}
  requirements:
    - {key: karpenter.sh/capacity-type, operator: In, values: ["spot"]}
    - {key: node.kubernetes.io/instance-type, operator: In, values: ["m5.large"], minValues: 1}
  taints: [{key: example.com/gpu, effect: NoSchedule}]
  expireAfter: 720h
  terminationGracePeriod: 48h
  resources: {requests: {cpu: 100m, memory: 256Mi, pods: "1"}}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn karpenter_kinds_print_karpenters_columns_and_nodeclaims_are_served_strictly() {
    let c = Cluster::start().await;
    c.apply(&MANIFEST[..MANIFEST.find("---\napiVersion: apps/v1").unwrap()])
        .await;
    let condition = |t: &str, s: &str| json!({"type": t, "status": s, "reason": t, "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"});
    // The admin writes the statuses (as the sweep would).
    let pool_status = json!({"status": {"nodes": 1, "resources": {"cpu": "2", "memory": "8Gi", "pods": "29", "nodes": "1"},
        "conditions": [condition("Ready", "True")]}});
    let class_status = json!({"status": {"conditions": [condition("Ready", "True")]}});
    for (kind, st) in [("nodepool", &pool_status), ("ec2nodeclass", &class_status)] {
        c.ok(&[
            "patch",
            kind,
            "default",
            "--subresource=status",
            "--type=merge",
            "-p",
            &st.to_string(),
        ])
        .await;
    }
    let out = c.apply(NODECLAIM).await;
    assert!(out.contains("nodeclaim.karpenter.sh/default-x7k2p created"), "{out}");
    let claim_status = json!({"status": {"nodeName": NODE, "providerID": "aws:///us-east-1a/i-0123456789abcdef0",
        "imageID": "ami-0123456789abcdef0", "capacity": {"cpu": "2", "memory": "8Gi"},
        "allocatable": {"cpu": "1930m", "memory": "7Gi"}, "lastPodEventTime": "2026-01-01T00:00:00Z",
        "conditions": [condition("Launched", "True"), condition("Registered", "True"), condition("Ready", "True")]}});
    c.ok(&[
        "patch",
        "nodeclaim",
        "default-x7k2p",
        "--subresource=status",
        "--type=merge",
        "-p",
        &claim_status.to_string(),
    ])
    .await;

    // Karpenter's columns; priority-1 columns only with -o wide.
    let out = c.ok(&["get", "nodepools"]).await;
    assert_eq!(header(&out), ["NAME", "NODECLASS", "NODES", "READY", "AGE"], "{out}");
    let r = row(&out, "default");
    assert_eq!(
        (r["NODECLASS"], r["NODES"], r["READY"]),
        ("default", "1", "True"),
        "{out}"
    );
    let out = c.ok(&["get", "nodepools", "-o", "wide"]).await;
    assert_eq!(
        header(&out),
        ["NAME", "NODECLASS", "NODES", "READY", "AGE", "WEIGHT", "CPU", "MEMORY"],
        "{out}"
    );
    let r = row(&out, "default");
    assert_eq!((r["WEIGHT"], r["CPU"], r["MEMORY"]), ("", "2", "8Gi"), "{out}");

    let out = c.ok(&["get", "ec2nodeclass"]).await;
    assert_eq!(header(&out), ["NAME", "READY", "AGE"], "{out}");
    assert_eq!(row(&out, "default")["READY"], "True", "{out}");
    let out = c.ok(&["get", "ec2ncs", "-o", "wide"]).await;
    assert_eq!(row(&out, "default")["ROLE"], "KarpenterNodeRole", "{out}");

    let out = c.ok(&["get", "nodeclaims"]).await;
    assert_eq!(
        header(&out),
        ["NAME", "TYPE", "CAPACITY", "ZONE", "NODE", "READY", "AGE"],
        "{out}"
    );
    let r = row(&out, "default-x7k2p");
    assert_eq!(
        (r["TYPE"], r["CAPACITY"], r["ZONE"], r["NODE"], r["READY"]),
        ("m5.large", "spot", "us-east-1a", NODE, "True"),
        "{out}"
    );
    let out = c.ok(&["get", "nodeclaim", "default-x7k2p", "-o", "wide"]).await;
    let r = row(&out, "default-x7k2p");
    assert_eq!(
        (r["IMAGEID"], r["ID"], r["NODEPOOL"], r["NODECLASS"], r["DRIFTED"]),
        (
            "ami-0123456789abcdef0",
            "aws:///us-east-1a/i-0123456789abcdef0",
            "default",
            "default",
            ""
        ),
        "{out}"
    );
    // The status came through the status subresource and reads back whole.
    let got = c.json(&["get", "nodeclaim", "default-x7k2p"]).await;
    assert_eq!(got["status"], claim_status["status"]);
    assert_eq!(got["spec"]["resources"]["requests"]["cpu"], "100m");

    // `kubectl get karpenter`: the category names all three kinds.
    let out = c.ok(&["get", "karpenter"]).await;
    for name in [
        "nodepool.karpenter.sh/default",
        "nodeclaim.karpenter.sh/default-x7k2p",
        "ec2nodeclass.karpenter.k8s.aws/default",
    ] {
        assert!(out.lines().any(|l| l.starts_with(name)), "{name} in:\n{out}");
    }

    // What Karpenter's NodeClaim schema refuses is refused, naming the field.
    let bad = NODECLAIM
        .replace("name: default-x7k2p", "name: bad")
        .replace("effect: NoSchedule", "effect: Sometimes");
    let r = c.run(&["apply", "-f", "-"], Some(&bad)).await;
    assert!(!r.ok && r.stderr.contains("spec.taints[0].effect"), "{r:?}");
    let bad = NODECLAIM.replace("name: default-x7k2p", "name: bad").replace(
        "  nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}\n",
        "",
    );
    let r = c.run(&["apply", "-f", "-"], Some(&bad)).await;
    assert!(!r.ok && r.stderr.contains("spec.nodeClassRef: Required value"), "{r:?}");
    assert_eq!(names(&c.json(&["get", "nodeclaims"]).await), ["default-x7k2p"]);

    // RBAC as for the other kinds: the sweep, which mirrors the claims, may
    // list NodeClaims; provision may not. (kubectl sends no bearer token over
    // plain HTTP, so the function's own client asks, as the functions do.)
    let sweep = c.server.client_as(Identity::Function(Function::Sweep));
    let ar = |kind: &str, plural: &str| {
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("karpenter.sh", "v1", kind), plural)
    };
    let claims: Api<DynamicObject> = Api::all_with(sweep.clone(), &ar("NodeClaim", "nodeclaims"));
    assert_eq!(claims.list(&ListParams::default()).await.unwrap().items.len(), 1);
    let provision = c.server.client_as(Identity::Function(Function::Provision));
    let claims: Api<DynamicObject> = Api::all_with(provision, &ar("NodeClaim", "nodeclaims"));
    match claims.list(&ListParams::default()).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "{s:?}"),
        other => panic!("expected 403, got {other:?}"),
    }
    let pools: Api<DynamicObject> = Api::all_with(sweep, &ar("NodePool", "nodepools"));
    assert_eq!(pools.list(&ListParams::default()).await.unwrap().items.len(), 1);
}
