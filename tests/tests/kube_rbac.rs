//! RBAC for nodesmith's functions and its forwarder. The Kubernetes API test
//! server holds each function's identity (the token `nodesmith-<function>`)
//! to its own ClusterRole of `infra/k8s/lambda-rbac.yaml`, as EKS does once
//! the stack's access entries put each role in its own group
//! `nodesmith:<function>` (an EKS token, or `nodesmith-lambda`, is in all four
//! groups), and the forwarder's ServiceAccount (the token
//! `nodesmith-forwarder`) to what `infra/k8s/forwarder.yaml` binds to it; the
//! test's admin is not restricted. And statically: each ClusterRole grants
//! exactly the calls its own code makes (the adapter's methods,
//! `shared/src/kubernetes/kube_cluster.rs`, that the function's files call;
//! the forwarder, `infra/forwarder/src`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Event, Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchParams};
use nodesmith::apis::nodeclaim::NodeClaimObject;
use nodesmith::apis::{EC2NodeClass, NodePool};
use nodesmith::kubernetes::events::{EventSpec, node_name_ref};
use nodesmith::kubernetes::{Cluster, EvictionOutcome, KubeCluster, NodeUpdate};
use nodesmith_tests::kube_server::{Identity, KubeServer, NodeRegistration};
use serde_json::{Value, json};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A (API group, resource[/subresource], verb) triple.
type Permission = (String, String, String);

fn perm(group: &str, resource: &str, verb: &str) -> Permission {
    (group.to_string(), resource.to_string(), verb.to_string())
}

fn pod_json(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "web", "resources": {"requests": {"cpu": "100m"}}}]}})
}

fn class_json() -> Value {
    json!({"apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "default"}, "spec": {
        "role": "NodeRole", "amiSelectorTerms": [{"alias": "al2023@latest"}],
        "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": "demo"}}],
        "securityGroupSelectorTerms": [{"tags": {"karpenter.sh/discovery": "demo"}}]}})
}

/// A server with node `n1` running pod `web-1`, namespace `team-a` and
/// EC2NodeClass `default`.
async fn seeded() -> KubeServer {
    let server = KubeServer::start().await;
    server
        .register_node(&NodeRegistration {
            name: "n1".into(),
            instance_id: "i-n1".into(),
            instance_type: "m5.xlarge".into(),
            zone: "us-east-1a".into(),
            capacity_type: "on-demand".into(),
            capacity: BTreeMap::from([
                ("cpu".into(), "4".into()),
                ("memory".into(), "16Gi".into()),
                ("pods".into(), "58".into()),
            ]),
            ..Default::default()
        })
        .unwrap();
    server.apply(&pod_json("web-1")).unwrap();
    server
        .apply(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}))
        .unwrap();
    server.apply(&class_json()).unwrap();
    assert_eq!(server.schedule().bound.len(), 1);
    server
}

/// The error is a 403 Forbidden Status with exactly this message.
fn forbidden<T: std::fmt::Debug>(r: Result<T, kube::Error>, message: &str) {
    match r {
        Err(kube::Error::Api(s)) => {
            assert_eq!((s.code, s.reason.as_str()), (403, "Forbidden"), "{s:?}");
            assert_eq!(s.message, message);
        }
        other => panic!("expected 403 Forbidden ({message}), got {other:?}"),
    }
}

/// What the functions may not do, each refused with kube-apiserver's message.
async fn refused_calls(client: kube::Client) -> Vec<Result<(), kube::Error>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let p: Pod = serde_json::from_value(pod_json("intruder")).unwrap();
    let created = pods.create(&PostParams::default(), &p).await.map(drop);
    let classes: Api<EC2NodeClass> = Api::all(client.clone());
    let patched = classes
        .patch(
            "default",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"role": "AdminRole"}})),
        )
        .await
        .map(drop);
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let deleted = namespaces.delete("team-a", &DeleteParams::default()).await.map(drop);
    vec![created, patched, deleted]
}

const USER: &str = "User \"nodesmith-lambda\"";

#[tokio::test]
async fn the_functions_are_refused_what_their_cluster_role_does_not_grant() {
    let server = seeded().await;
    let [created, patched, deleted]: [_; 3] = refused_calls(server.lambda_client()).await.try_into().unwrap();
    forbidden(
        created,
        &format!(
            "pods is forbidden: {USER} cannot create resource \"pods\" in API group \"\" in the namespace \"default\""
        ),
    );
    forbidden(
        patched,
        &format!(
            "ec2nodeclasses.karpenter.k8s.aws \"default\" is forbidden: {USER} cannot patch resource \"ec2nodeclasses\" in API group \"karpenter.k8s.aws\" at the cluster scope"
        ),
    );
    forbidden(
        deleted,
        // As kube-apiserver words it: a Namespace is in its own namespace.
        &format!(
            "namespaces \"team-a\" is forbidden: {USER} cannot delete resource \"namespaces\" in API group \"\" in the namespace \"team-a\""
        ),
    );
    // Refused before anything was read or written.
    assert!(server.pod("default", "intruder").is_none());
    let classes: Api<EC2NodeClass> = Api::all(server.client());
    assert_eq!(
        classes.get("default").await.unwrap().spec.role.as_deref(),
        Some("NodeRole")
    );
    let namespaces: Api<Namespace> = Api::all(server.client());
    assert!(namespaces.get_opt("team-a").await.unwrap().is_some());

    let denials = server.denials();
    assert_eq!(denials.len(), 3, "{denials:#?}");
    assert!(
        denials[0].starts_with("POST /api/v1/namespaces/default/pods"),
        "{denials:#?}"
    );
    assert!(
        denials[1].contains("cannot patch resource \"ec2nodeclasses\""),
        "{denials:#?}"
    );
    assert!(
        denials[2].contains("cannot delete resource \"namespaces\""),
        "{denials:#?}"
    );
    assert!(server.lambda_permissions_used().is_empty());
}

#[tokio::test]
async fn verbs_follow_kube_apiserver_and_authorization_comes_before_routing() {
    let server = seeded().await;
    let lambda = server.lambda_client();
    let nodes: Api<Node> = Api::all(lambda.clone());
    forbidden(
        nodes.watch(&WatchParams::default(), "0").await.map(drop),
        &format!("nodes is forbidden: {USER} cannot watch resource \"nodes\" in API group \"\" at the cluster scope"),
    );
    let pods: Api<Pod> = Api::namespaced(lambda.clone(), "default");
    forbidden(
        pods.delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
            .map(drop),
        &format!(
            "pods is forbidden: {USER} cannot deletecollection resource \"pods\" in API group \"\" in the namespace \"default\""
        ),
    );
    // The pod's status is not the pod.
    forbidden(
        pods.patch_status(
            "web-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Failed"}})),
        )
        .await
        .map(drop),
        &format!(
            "pods \"web-1\" is forbidden: {USER} cannot patch resource \"pods/status\" in API group \"\" in the namespace \"default\""
        ),
    );
    // A resource the server does not even serve is refused, not missing.
    let secret = http::Request::get("/api/v1/namespaces/default/secrets/token")
        .body(Vec::new())
        .unwrap();
    forbidden(
        lambda.request::<Value>(secret).await,
        &format!(
            "secrets \"token\" is forbidden: {USER} cannot get resource \"secrets\" in API group \"\" in the namespace \"default\""
        ),
    );
    assert_eq!(server.denials().len(), 4, "{:#?}", server.denials());
    assert_eq!(server.pods().len(), 1);
    // Discovery and the version are open to every identity.
    assert_eq!(lambda.apiserver_version().await.unwrap().major, "1");
    assert!(!lambda.list_api_groups().await.unwrap().groups.is_empty());
    assert!(!lambda.list_core_api_versions().await.unwrap().versions.is_empty());
    assert_eq!(server.denials().len(), 4);
}

#[tokio::test]
async fn eks_tokens_are_the_functions_and_other_tokens_the_admin() {
    let server = seeded().await;
    let eks =
        nodesmith::kubernetes::client::client_for(server.url(), None, Some("k8s-aws-v1.aHR0cHM6Ly9zdHM")).unwrap();
    for r in refused_calls(eks).await {
        match r {
            Err(kube::Error::Api(s)) => assert_eq!((s.code, s.reason.as_str()), (403, "Forbidden"), "{s:?}"),
            other => panic!("expected 403 Forbidden, got {other:?}"),
        }
    }
    assert_eq!(server.denials().len(), 3);
    // The kubeconfig's token is the admin's, as is no token at all.
    let kubeconfig = nodesmith::kubernetes::client::client_for(server.url(), None, Some("nodesmith-test")).unwrap();
    let pods: Api<Pod> = Api::namespaced(kubeconfig, "default");
    let p: Pod = serde_json::from_value(pod_json("by-kubeconfig")).unwrap();
    pods.create(&PostParams::default(), &p).await.unwrap();
    assert_eq!(server.denials().len(), 3);
}

#[tokio::test]
async fn the_admin_is_not_restricted() {
    let server = seeded().await;
    for r in refused_calls(server.client()).await {
        r.unwrap();
    }
    assert!(server.pod("default", "intruder").is_some());
    let classes: Api<EC2NodeClass> = Api::all(server.client());
    assert_eq!(
        classes.get("default").await.unwrap().spec.role.as_deref(),
        Some("AdminRole")
    );
    let namespaces: Api<Namespace> = Api::all(server.client());
    assert!(namespaces.get_opt("team-a").await.unwrap().is_none());
    assert!(server.denials().is_empty());
    assert!(
        server.lambda_permissions_used().is_empty(),
        "the admin is not the functions"
    );
}

#[tokio::test]
async fn the_adapter_as_the_functions_may_do_everything_it_does() {
    let server = seeded().await;
    let cluster = KubeCluster::from_client(server.lambda_client());
    // Every read.
    assert_eq!(cluster.pods().await.unwrap().len(), 1);
    assert!(cluster.pending_pods().await.unwrap().is_empty());
    assert_eq!(cluster.pods_on_node("n1").await.unwrap().len(), 1);
    assert_eq!(cluster.nodes().await.unwrap().len(), 1);
    assert!(cluster.daemon_sets().await.unwrap().is_empty());
    assert!(cluster.pod_disruption_budgets().await.unwrap().is_empty());
    assert!(cluster.persistent_volumes().await.unwrap().is_empty());
    assert!(cluster.persistent_volume_claims().await.unwrap().is_empty());
    assert!(cluster.storage_classes().await.unwrap().is_empty());
    assert_eq!(cluster.namespaces().await.unwrap().len(), 5);
    assert!(cluster.node_pools().await.unwrap().is_empty());
    assert_eq!(cluster.node_classes().await.unwrap().len(), 1);
    // Every write.
    let mut class = cluster.node_class("default").await.unwrap().unwrap();
    class.status = Some(serde_json::from_value(json!({"instanceProfile": "p"})).unwrap());
    assert!(cluster.replace_node_class_status(&class).await.unwrap());
    let update = NodeUpdate {
        labels: BTreeMap::from([("team".into(), "web".into())]),
        ..Default::default()
    };
    assert!(cluster.update_node("n1", &update).await.unwrap());
    assert!(cluster.taint_disrupted("n1").await.unwrap());
    assert!(cluster.untaint_disrupted("n1").await.unwrap());
    cluster
        .emit_event(&EventSpec::disrupting(node_name_ref("n1"), "Underutilized"))
        .await
        .unwrap();
    let web = server.pod("default", "web-1").unwrap();
    assert_eq!(cluster.evict(&web).await.unwrap(), EvictionOutcome::Evicted);
    server.apply(&pod_json("web-2")).unwrap();
    let web2 = server.pod("default", "web-2").unwrap();
    assert!(cluster.delete_pod(&web2).await.unwrap());
    assert!(cluster.delete_node("n1", None).await.unwrap());
    // The mirror: NodeClaim objects and NodePool status.
    let mut claim = nodesmith::nodeclaim::NodeClaim::pending("default-a1b2c", "default", "default");
    claim.timestamps.created = Some(jiff::Timestamp::now());
    let object = nodesmith::mirror::object(&claim, None, None);
    assert!(cluster.create_node_claim_object(&object).await.unwrap());
    let listed = cluster.node_claim_objects().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        cluster
            .node_claim_object("default-a1b2c")
            .await
            .unwrap()
            .map(|o| o.metadata.uid),
        Some(listed[0].metadata.uid.clone())
    );
    assert!(cluster.replace_node_claim_object(&listed[0]).await.unwrap().is_some());
    assert!(cluster.release_node_claim_object("default-a1b2c").await.unwrap());
    assert!(cluster.node_claim_objects().await.unwrap().is_empty());
    server
        .apply(&json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"},
            "spec": {"template": {"spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}}}}}))
        .unwrap();
    let mut pool = cluster.node_pools().await.unwrap().remove(0);
    assert_eq!(
        cluster.node_pool("default").await.unwrap().map(|p| p.metadata.uid),
        Some(pool.metadata.uid.clone())
    );
    assert!(cluster.node_pool("absent").await.unwrap().is_none());
    pool.status = Some(serde_json::from_value(json!({"nodes": 0})).unwrap());
    assert!(cluster.replace_node_pool_status(&pool).await.unwrap());

    assert!(server.denials().is_empty(), "{:#?}", server.denials());
    // Every grant was exercised: the roles hold nothing this adapter does not use.
    let union: BTreeSet<Permission> = ["provision", "launch", "interrupt", "sweep"]
        .iter()
        .flat_map(|f| cluster_role_grants("lambda-rbac.yaml", &format!("nodesmith-{f}")))
        .collect();
    assert_eq!(server.lambda_permissions_used(), union);
    // No function reads one pod by name, so no role grants it.
    assert_eq!(cluster.pod("default", "web-1").await.unwrap_err().code(), Some(403));
}

const FORWARDER: &str = "User \"system:serviceaccount:nodesmith:nodesmith-forwarder\"";

#[tokio::test]
async fn the_forwarder_may_list_and_watch_pods_and_nodes_and_is_refused_everything_else() {
    let server = seeded().await;
    let fw = server.client_as(Identity::Forwarder);
    // What it does: list and watch pods, everywhere or in a namespace.
    let pods: Api<Pod> = Api::all(fw.clone());
    assert_eq!(pods.list(&ListParams::default()).await.unwrap().items.len(), 1);
    drop(pods.watch(&WatchParams::default(), "0").await.unwrap());
    let in_default: Api<Pod> = Api::namespaced(fw.clone(), "default");
    assert_eq!(in_default.list(&ListParams::default()).await.unwrap().items.len(), 1);
    assert!(server.denials().is_empty(), "{:#?}", server.denials());

    // Its Node watch: list and watch nodesmith's Nodes, never change one.
    let nodes: Api<Node> = Api::all(fw.clone());
    nodes.list(&ListParams::default()).await.unwrap();
    drop(nodes.watch(&WatchParams::default(), "0").await.unwrap());
    assert!(server.denials().is_empty(), "{:#?}", server.denials());
    forbidden(
        nodes
            .patch(
                "n1",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"labels": {"x": "y"}}})),
            )
            .await
            .map(drop),
        &format!(
            "nodes \"n1\" is forbidden: {FORWARDER} cannot patch resource \"nodes\" in API group \"\" at the cluster scope"
        ),
    );
    let p: Pod = serde_json::from_value(pod_json("intruder")).unwrap();
    forbidden(
        in_default.create(&PostParams::default(), &p).await.map(drop),
        &format!(
            "pods is forbidden: {FORWARDER} cannot create resource \"pods\" in API group \"\" in the namespace \"default\""
        ),
    );
    // Reading one pod by name is not listing them: its role has no `get`.
    forbidden(
        in_default.get("web-1").await.map(drop),
        &format!(
            "pods \"web-1\" is forbidden: {FORWARDER} cannot get resource \"pods\" in API group \"\" in the namespace \"default\""
        ),
    );
    forbidden(
        in_default.delete("web-1", &DeleteParams::default()).await.map(drop),
        &format!(
            "pods \"web-1\" is forbidden: {FORWARDER} cannot delete resource \"pods\" in API group \"\" in the namespace \"default\""
        ),
    );
    let secret = http::Request::get("/api/v1/namespaces/nodesmith/secrets/token")
        .body(Vec::new())
        .unwrap();
    forbidden(
        fw.request::<Value>(secret).await,
        &format!(
            "secrets \"token\" is forbidden: {FORWARDER} cannot get resource \"secrets\" in API group \"\" in the namespace \"nodesmith\""
        ),
    );
    assert!(server.pod("default", "intruder").is_none());
    assert!(server.pod("default", "web-1").is_some());

    // Recorded as the forwarder's, not the functions'.
    let denials = server.denials_of(Identity::Forwarder);
    assert_eq!(denials.len(), 5, "{denials:#?}");
    assert!(denials.iter().all(|d| d.contains(FORWARDER)), "{denials:#?}");
    assert_eq!(server.denials(), denials);
    assert!(server.denials_of(Identity::Lambda).is_empty());
    let pods = |verb: &str| perm("", "pods", verb);
    let nodes = |verb: &str| perm("", "nodes", verb);
    assert_eq!(
        server.permissions_used(Identity::Forwarder),
        BTreeSet::from([pods("list"), pods("watch"), nodes("list"), nodes("watch")])
    );
    assert!(server.lambda_permissions_used().is_empty());
}

#[tokio::test]
async fn the_forwarder_kubeconfig_is_the_forwarder_and_the_functions_token_is_not() {
    let server = seeded().await;
    let dir = std::env::temp_dir().join(format!("nodesmith-kube-rbac-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("forwarder.kubeconfig");
    server.write_kubeconfig_as(&path, Identity::Forwarder).unwrap();
    // As the forwarder binary builds its client from KUBECONFIG.
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    nodesmith::transport::install_crypto_provider();
    let fw = kube::Client::try_from(config).unwrap();
    let pods: Api<Pod> = Api::all(fw.clone());
    assert_eq!(pods.list(&ListParams::default()).await.unwrap().items.len(), 1);
    let namespaces: Api<Namespace> = Api::all(fw);
    forbidden(
        namespaces.list(&ListParams::default()).await.map(drop),
        &format!(
            "namespaces is forbidden: {FORWARDER} cannot list resource \"namespaces\" in API group \"\" at the cluster scope"
        ),
    );
    // The functions may list nodes, and their grants are theirs alone.
    let nodes: Api<Node> = Api::all(server.lambda_client());
    assert_eq!(nodes.list(&ListParams::default()).await.unwrap().items.len(), 1);
    assert_eq!(server.denials_of(Identity::Forwarder).len(), 1);
    assert!(server.denials_of(Identity::Lambda).is_empty());
    assert_eq!(
        server.permissions_used(Identity::Forwarder),
        BTreeSet::from([perm("", "pods", "list")])
    );
    assert_eq!(
        server.lambda_permissions_used(),
        BTreeSet::from([perm("", "nodes", "list")])
    );
}

// ---- The static check: the ClusterRole is exactly what the adapter calls. ----

/// One Kubernetes call the scan found: the fn it is in, the object type, the kube-rs method.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Call {
    in_fn: String,
    kind: String,
    method: String,
}

/// A type's (API group, plural), from its `kube::Resource` impl.
fn gr<K: kube::Resource<DynamicType = ()>>() -> (String, String) {
    (K::group(&()).to_string(), K::plural(&()).to_string())
}

/// The object types the adapter may name, by the name it uses.
fn kinds() -> BTreeMap<&'static str, (String, String)> {
    BTreeMap::from([
        ("Pod", gr::<Pod>()),
        ("Node", gr::<Node>()),
        ("Event", gr::<Event>()),
        ("DaemonSet", gr::<DaemonSet>()),
        ("PodDisruptionBudget", gr::<PodDisruptionBudget>()),
        ("PersistentVolume", gr::<PersistentVolume>()),
        ("PersistentVolumeClaim", gr::<PersistentVolumeClaim>()),
        ("StorageClass", gr::<StorageClass>()),
        ("Namespace", gr::<Namespace>()),
        ("NodePool", gr::<NodePool>()),
        ("EC2NodeClass", gr::<EC2NodeClass>()),
        ("NodeClaimObject", gr::<NodeClaimObject>()),
    ])
}

/// kube-rs `Api` methods: (subresource, verb).
fn verb_of(method: &str) -> Option<(Option<&'static str>, &'static str)> {
    Some(match method {
        "get" | "get_opt" => (None, "get"),
        // A list page as text (`kubernetes/pages.rs`): a LIST like `list`.
        "list" | "list_text" => (None, "list"),
        "watch" => (None, "watch"),
        "create" => (None, "create"),
        "replace" => (None, "update"),
        "patch" => (None, "patch"),
        "delete" => (None, "delete"),
        "delete_collection" => (None, "deletecollection"),
        "evict" => (Some("eviction"), "create"),
        "get_status" => (Some("status"), "get"),
        "replace_status" => (Some("status"), "update"),
        "patch_status" => (Some("status"), "patch"),
        _ => return None,
    })
}

/// 1-based line of a byte offset.
fn line_of(src: &str, at: usize) -> usize {
    src[..at].matches('\n').count() + 1
}

/// The identifier at the start of `s`.
fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// Where the parenthesis opened at `open` closes.
fn closing(src: &str, open: usize) -> Option<usize> {
    let mut depth = 0;
    for (i, c) in src[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return Some(open + i);
                }
            }
            _ => {}
        }
    }
    None
}

/// A fn of the source: name, generic parameters, the element type of a
/// `Vec<T>` it returns, and its byte range.
struct Func {
    name: String,
    generics: Vec<String>,
    returns_vec_of: Option<String>,
    start: usize,
    end: usize,
}

fn functions(src: &str) -> Vec<Func> {
    let starts: Vec<usize> = src
        .match_indices("fn ")
        .map(|(i, _)| i)
        .filter(|&i| i == 0 || src[..i].ends_with(|c: char| c.is_whitespace()))
        .collect();
    let mut out = Vec::new();
    for (k, &start) in starts.iter().enumerate() {
        let end = starts.get(k + 1).copied().unwrap_or(src.len());
        let name = ident(&src[start + 3..]).to_string();
        let after = &src[start + 3 + name.len()..end];
        let generics = match after.strip_prefix('<') {
            Some(g) => g[..g.find('>').unwrap_or(0)]
                .split(',')
                .map(|p| ident(p.trim()).to_string())
                .filter(|p| !p.is_empty())
                .collect(),
            None => Vec::new(),
        };
        let signature = &after[..after.find('{').unwrap_or(after.len())];
        let returns_vec_of = signature
            .split_once("->")
            .and_then(|(_, ret)| ret.split_once("Vec<"))
            .map(|(_, t)| ident(t).to_string());
        out.push(Func {
            name,
            generics,
            returns_vec_of,
            start,
            end,
        });
    }
    out
}

/// Every Kubernetes call in `src`: `Api::<T>::all(..)` or
/// `Api::<T>::namespaced(..)` followed by `.method(`, and calls of generic
/// helpers (`self.list_all(..)`) with the element type of the enclosing fn's
/// `Vec<T>` (or a turbofish). Anything else touching the API is an error, so
/// a call the scan does not understand cannot pass unseen.
fn scan(src: &str) -> Result<Vec<Call>, String> {
    let fns = functions(src);
    let fn_at = |at: usize| fns.iter().find(|f| f.start <= at && at < f.end);
    for pat in [
        "Api<",
        ".request(",
        ".request::<",
        ".request_text(",
        ".request_events(",
        "Api::all(",
        "Api::namespaced(",
    ] {
        if let Some(at) = src.find(pat) {
            return Err(format!(
                "line {}: `{pat}` is a Kubernetes call the scan does not understand; write it as `Api::<T>::all(c).method(..)`",
                line_of(src, at)
            ));
        }
    }
    let mut calls = Vec::new();
    // Generic helpers: fn name → the methods they call on their type parameter.
    let mut helpers: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (at, _) in src.match_indices("Api::") {
        let rest = &src[at + "Api::".len()..];
        let Some(t) = rest.strip_prefix("<") else {
            return Err(format!("line {}: `Api::` without a type", line_of(src, at)));
        };
        let kind = ident(t).to_string();
        let Some(open) = t[kind.len()..]
            .strip_prefix(">::")
            .and_then(|c| {
                ["all(", "namespaced("]
                    .iter()
                    .find(|p| c.starts_with(**p))
                    .map(|p| p.len() - 1)
            })
            .map(|n| at + "Api::<".len() + kind.len() + ">::".len() + n)
        else {
            return Err(format!(
                "line {}: `Api::<{kind}>` not followed by ::all( or ::namespaced(",
                line_of(src, at)
            ));
        };
        let close = closing(src, open).ok_or_else(|| format!("line {}: unclosed call", line_of(src, at)))?;
        let after = src[close + 1..].trim_start();
        let method = after.strip_prefix('.').map(ident).unwrap_or("");
        if method.is_empty() {
            return Err(format!(
                "line {}: `Api::<{kind}>` not followed by a method call",
                line_of(src, at)
            ));
        }
        let Some(f) = fn_at(at) else {
            return Err(format!("line {}: a call outside any fn", line_of(src, at)));
        };
        if f.generics.contains(&kind) {
            helpers.entry(f.name.clone()).or_default().push(method.to_string());
        } else {
            calls.push(Call {
                in_fn: f.name.clone(),
                kind,
                method: method.to_string(),
            });
        }
    }
    // A helper called from a fn generic over the same type makes that fn a
    // helper too (`list_all` over `list_pages`): followed until none is left.
    let mut pending: Vec<(String, Vec<String>)> = helpers.into_iter().collect();
    let mut followed = BTreeSet::new();
    while let Some((helper, methods)) = pending.pop() {
        if !followed.insert((helper.clone(), methods.clone())) {
            continue;
        }
        let pat = format!("self.{helper}");
        for (at, _) in src.match_indices(&pat) {
            let rest = &src[at + pat.len()..];
            if rest.starts_with(|c: char| c.is_alphanumeric() || c == '_') {
                continue; // another fn whose name starts with this one's
            }
            let turbofish = rest.strip_prefix("::<").map(|t| ident(t).to_string());
            let f = fn_at(at).ok_or_else(|| format!("line {}: a call outside any fn", line_of(src, at)))?;
            let kind = turbofish.or_else(|| f.returns_vec_of.clone()).ok_or_else(|| {
                format!(
                    "line {}: cannot tell which type `{helper}` lists in fn {}: return `Vec<T>` or write `{helper}::<T>`",
                    line_of(src, at),
                    f.name
                )
            })?;
            if f.generics.contains(&kind) {
                pending.push((f.name.clone(), methods.clone()));
                continue;
            }
            for m in &methods {
                calls.push(Call {
                    in_fn: f.name.clone(),
                    kind: kind.clone(),
                    method: m.clone(),
                });
            }
        }
    }
    Ok(calls)
}

/// The permissions `calls` need; unknown types and methods are errors naming them.
fn permissions(calls: &[Call]) -> Result<BTreeSet<Permission>, String> {
    let kinds = kinds();
    let mut out = BTreeSet::new();
    for c in calls {
        let (group, plural) = kinds.get(c.kind.as_str()).ok_or_else(|| {
            format!(
                "fn {} calls the API for the type {}, which the scan does not know: add it to the table in kinds()",
                c.in_fn, c.kind
            )
        })?;
        let (sub, verb) = verb_of(&c.method).ok_or_else(|| {
            format!(
                "fn {} calls Api::<{}>::{}, a method the scan does not know: add it to the table in verb_of()",
                c.in_fn, c.kind, c.method
            )
        })?;
        let resource = match sub {
            Some(s) => format!("{plural}/{s}"),
            None => plural.clone(),
        };
        out.insert(perm(group, &resource, verb));
    }
    Ok(out)
}

fn yaml_documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| <Value as serde::Deserialize>::deserialize(d).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .collect()
}

fn lambda_rbac() -> Vec<Value> {
    yaml_documents(&repo().join("infra/k8s/lambda-rbac.yaml"))
}

/// What the ClusterRole `name` of `infra/k8s/<file>` grants, with no wildcard anywhere.
fn cluster_role_grants(file: &str, name: &str) -> BTreeSet<Permission> {
    let doc = yaml_documents(&repo().join("infra/k8s").join(file))
        .into_iter()
        .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{file} defines the ClusterRole {name}"));
    let role: ClusterRole = serde_json::from_value(doc).unwrap();
    let mut out = BTreeSet::new();
    for rule in role.rules.unwrap_or_default() {
        assert!(rule.non_resource_urls.is_none(), "no non-resource rules: {rule:?}");
        assert!(
            rule.resource_names.is_none(),
            "the code names no fixed objects: {rule:?}"
        );
        for g in rule.api_groups.iter().flatten() {
            for r in rule.resources.iter().flatten() {
                for v in &rule.verbs {
                    for x in [g, r, v] {
                        assert!(!x.contains('*'), "a wildcard in {rule:?}");
                    }
                    out.insert(perm(g, r, v));
                }
            }
        }
    }
    out
}

fn kube_cluster_source() -> String {
    let path = repo().join("shared/src/kubernetes/kube_cluster.rs");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The source files each function's code runs through to reach the
/// cluster (the adapter's `Cluster` methods), relative to `shared/src`.
/// Every file that calls the adapter is one function's or [`NOT_A_FUNCTION`]'s,
/// so a new call site cannot go unassigned.
const FUNCTION_SOURCES: [(&str, &[&str]); 4] = [
    ("provision", &["provisioning/mod.rs", "snapshot/live.rs", "joining.rs"]),
    ("launch", &["launch/mod.rs", "mirror/write.rs"]),
    (
        "interrupt",
        &[
            "interruption/handler.rs",
            "snapshot/live.rs",
            "draining.rs",
            "kubernetes/drain.rs",
            "kubernetes/cluster.rs",
        ],
    ),
    (
        "sweep",
        &[
            "sweep/mod.rs",
            "sweep/classes.rs",
            "sweep/disrupt.rs",
            "sweep/mirror.rs",
            "mirror/write.rs",
            "sweep/termination.rs",
            "sweep/replicas.rs",
            "sweep/reservations.rs",
            "snapshot/live.rs",
            "draining.rs",
            "kubernetes/drain.rs",
            "kubernetes/cluster.rs",
            "launch/gc.rs",
        ],
    ),
];

/// Files that call the adapter but run in no function (the CLI's status,
/// rotate and explain, with the user's own kubeconfig).
const NOT_A_FUNCTION: [&str; 3] = ["status.rs", "rotation.rs", "explain.rs"];

/// The names of the `Cluster` methods `KubeCluster` implements.
fn cluster_methods(src: &str) -> BTreeSet<String> {
    let start = src
        .find("impl Cluster for KubeCluster")
        .expect("kube_cluster.rs implements Cluster");
    let body = &src[start..];
    word_at(body, "fn")
        .into_iter()
        .map(|at| ident(body[at + 2..].trim_start()).to_string())
        .filter(|n| !n.is_empty())
        .collect()
}

/// The permissions each `Cluster` method of the adapter needs: its own calls
/// and those of the private helpers it calls (`self.edit_taints(..)`).
fn permissions_by_method(src: &str) -> BTreeMap<String, BTreeSet<Permission>> {
    let calls = scan(src).unwrap_or_else(|e| panic!("kube_cluster.rs: {e}"));
    let fns = functions(src);
    let direct = |name: &str| -> BTreeSet<Permission> {
        let mine: Vec<Call> = calls.iter().filter(|c| c.in_fn == name).cloned().collect();
        permissions(&mine).unwrap_or_else(|e| panic!("kube_cluster.rs: {e}"))
    };
    let methods = cluster_methods(src);
    let mut out = BTreeMap::new();
    for m in &methods {
        let f = fns
            .iter()
            .rfind(|f| &f.name == m)
            .unwrap_or_else(|| panic!("no fn {m}"));
        let body = &src[f.start..f.end];
        let mut perms = direct(m);
        for helper in fns.iter().filter(|h| !methods.contains(&h.name)) {
            if body.contains(&format!("self.{}(", helper.name)) || body.contains(&format!("self.{}::<", helper.name)) {
                perms.extend(direct(&helper.name));
            }
        }
        out.insert(m.clone(), perms);
    }
    out
}

/// The part of a file before its unit tests.
fn without_tests(src: &str) -> &str {
    src.find("#[cfg(test)]").map_or(src, |i| &src[..i])
}

/// The adapter methods `src` calls on a cluster (`cluster.m(`,
/// `self.cluster.m(`, `self.kube.m(`, a line break allowed before the dot).
fn adapter_calls(src: &str, methods: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for receiver in ["cluster", "kube"] {
        for at in word_at(src, receiver) {
            let rest = src[at + receiver.len()..].trim_start();
            let Some(rest) = rest.strip_prefix('.') else { continue };
            let m = ident(rest);
            if methods.contains(m) && rest[m.len()..].starts_with('(') {
                out.insert(m.to_string());
            }
        }
    }
    out
}

fn shared_source(rel: &str) -> String {
    let path = repo().join("shared/src").join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every `.rs` file under `shared/src`, relative to it.
fn shared_files() -> Vec<String> {
    fn walk(dir: &Path, base: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, base, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p.strip_prefix(base).unwrap().to_string_lossy().replace('\\', "/"));
            }
        }
    }
    let base = repo().join("shared/src");
    let mut out = Vec::new();
    walk(&base, &base, &mut out);
    out.sort();
    out
}

/// What each function's code calls, as permissions.
fn needed_by_function() -> BTreeMap<&'static str, BTreeSet<Permission>> {
    let src = kube_cluster_source();
    let by_method = permissions_by_method(&src);
    let methods: BTreeSet<String> = by_method.keys().cloned().collect();
    let mut out = BTreeMap::new();
    for (function, files) in FUNCTION_SOURCES {
        let mut needed = BTreeSet::new();
        for f in files {
            let called = adapter_calls(without_tests(&shared_source(f)), &methods);
            assert!(
                !called.is_empty(),
                "{f} is listed for {function} but calls no adapter method"
            );
            for m in called {
                needed.extend(by_method[&m].iter().cloned());
            }
        }
        out.insert(function, needed);
    }
    out
}

#[test]
fn every_file_that_calls_the_adapter_belongs_to_a_function() {
    let methods = cluster_methods(&kube_cluster_source());
    let assigned: BTreeSet<&str> = FUNCTION_SOURCES
        .iter()
        .flat_map(|(_, files)| files.iter().copied())
        .chain(NOT_A_FUNCTION)
        .collect();
    let mut callers = Vec::new();
    for f in shared_files() {
        if f == "kubernetes/kube_cluster.rs" {
            continue;
        }
        if !adapter_calls(without_tests(&shared_source(&f)), &methods).is_empty() {
            callers.push(f.clone());
            assert!(
                assigned.contains(f.as_str()),
                "shared/src/{f} calls the Kubernetes adapter: list it under the functions that run it (FUNCTION_SOURCES)"
            );
        }
    }
    // The scan finds the call sites it must, so it cannot pass by finding nothing.
    for known in [
        "launch/mod.rs",
        "sweep/classes.rs",
        "interruption/handler.rs",
        "snapshot/live.rs",
    ] {
        assert!(
            callers.iter().any(|c| c == known),
            "the scan missed {known}: {callers:?}"
        );
    }
}

/// The adapter's one request outside `Api`'s typed methods, a list page as
/// text (read into objects off the runtime's thread), is a LIST of the
/// `Api`'s own resource and nothing else, so the scan may count `list_text`
/// as `list`.
#[test]
fn a_list_page_as_text_is_the_only_raw_request() {
    let path = repo().join("shared/src/kubernetes/pages.rs");
    let src = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(src.matches(".request_text(").count(), 1, "one raw request");
    assert!(
        src.contains("Request::new(self.resource_url()).list(lp)"),
        "a LIST of the Api's resource"
    );
    for other in [
        ".request(",
        ".request::<",
        ".request_events(",
        ".request_stream(",
        ".send(",
        "Api::<",
    ] {
        assert!(!src.contains(other), "pages.rs calls the API otherwise: {other}");
    }
}

#[test]
fn each_function_cluster_role_is_exactly_what_its_own_code_calls() {
    let src = kube_cluster_source();
    let by_method = permissions_by_method(&src);
    // The scan sees the calls it must, so it cannot pass by finding nothing.
    for (method, known) in [
        ("taint_disrupted", perm("", "nodes", "patch")),
        ("delete_node", perm("", "nodes", "delete")),
        ("pods", perm("", "pods", "list")),
        ("evict", perm("", "pods/eviction", "create")),
        ("emit_event", perm("", "events", "create")),
        ("node_pools", perm("karpenter.sh", "nodepools", "list")),
        ("node_class", perm("karpenter.k8s.aws", "ec2nodeclasses", "get")),
        (
            "replace_node_class_status",
            perm("karpenter.k8s.aws", "ec2nodeclasses/status", "update"),
        ),
    ] {
        assert!(
            by_method[method].contains(&known),
            "the scan missed {known:?} in {method}: {by_method:#?}"
        );
    }
    let needed = needed_by_function();
    for (function, used) in &needed {
        let granted = cluster_role_grants("lambda-rbac.yaml", &format!("nodesmith-{function}"));
        let missing: Vec<_> = used.difference(&granted).collect();
        let extra: Vec<_> = granted.difference(used).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "infra/k8s/lambda-rbac.yaml's nodesmith-{function} must grant exactly what {function}'s code calls.\n\
             called but not granted: {missing:?}\ngranted but never called: {extra:?}"
        );
    }
    // What least privilege is for: only the functions that drain delete pods.
    let deleters: Vec<&str> = needed
        .iter()
        .filter(|(_, u)| u.contains(&perm("", "pods", "delete")))
        .map(|(f, _)| *f)
        .collect();
    assert_eq!(deleters, ["interrupt", "sweep"]);
}

#[test]
fn each_function_group_is_bound_to_its_own_role_and_nothing_binds_cluster_admin() {
    let mut by_group: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut roles = BTreeSet::new();
    for d in lambda_rbac() {
        match d["kind"].as_str() {
            Some("ClusterRole") => {
                roles.insert(d["metadata"]["name"].as_str().unwrap().to_string());
            }
            Some("ClusterRoleBinding") => {
                let b: ClusterRoleBinding = serde_json::from_value(d).unwrap();
                assert_eq!(b.role_ref.kind, "ClusterRole");
                for s in b.subjects.unwrap_or_default() {
                    assert_eq!(s.kind, "Group", "{s:?}");
                    by_group.entry(s.name).or_default().push(b.role_ref.name.clone());
                }
            }
            other => panic!("lambda-rbac.yaml holds only ClusterRoles and their bindings, not {other:?}"),
        }
    }
    let expected: BTreeMap<String, Vec<String>> = FUNCTION_SOURCES
        .iter()
        .map(|(f, _)| (format!("nodesmith:{f}"), vec![format!("nodesmith-{f}")]))
        .collect();
    assert_eq!(
        by_group, expected,
        "one group per function, bound to its own ClusterRole only"
    );
    assert_eq!(roles, expected.values().flatten().cloned().collect());
    let dir = repo().join("infra/k8s");
    let mut bindings = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        for d in yaml_documents(&path) {
            if !d["kind"].as_str().is_some_and(|k| k.ends_with("RoleBinding")) {
                continue;
            }
            bindings += 1;
            let role = d["roleRef"]["name"].as_str().unwrap_or("");
            assert!(
                role != "cluster-admin" && !role.starts_with("system:"),
                "{} binds {role}",
                path.display()
            );
            for s in d["subjects"].as_array().into_iter().flatten() {
                let name = s["name"].as_str().unwrap_or("");
                assert!(!name.starts_with("system:"), "{} binds {name}", path.display());
            }
        }
    }
    assert!(
        bindings >= 5,
        "expected the four functions' and the forwarder's bindings"
    );
}

#[test]
fn the_scan_names_what_it_does_not_know() {
    let e = permissions(&scan("fn f() { Api::<Secret>::all(c).get(n) }").unwrap()).unwrap_err();
    assert!(e.contains("type Secret") && e.contains("add it to the table"), "{e}");
    let e = permissions(&scan("fn f() { Api::<Pod>::namespaced(c, &ns).patch_metadata(n) }").unwrap()).unwrap_err();
    assert!(e.contains("patch_metadata") && e.contains("add it to the table"), "{e}");
    let e = scan("fn f() {\n let pods: Api<Pod> = Api::all(c);\n}").unwrap_err();
    assert!(e.contains("line 2") && e.contains("does not understand"), "{e}");
    let e = scan("fn h<K>() { Api::<K>::all(c).list(&lp) }\nfn g() -> usize { self.h(x) }").unwrap_err();
    assert!(e.contains("cannot tell which type `h` lists in fn g"), "{e}");
    // Helpers take the element type of their caller's Vec<T>, or a turbofish.
    let calls = scan(
        "fn h<K>() { Api::<K>::all(c).list(&lp) }\n\
         fn g() -> Result<Vec<Node>, E> { self.h(x) }\n\
         fn t() -> usize { self.h::<Pod>(x); Api::<Pod>::namespaced(c, &ns)\n  .evict(n) }",
    )
    .unwrap();
    let used = permissions(&calls).unwrap();
    assert_eq!(
        used,
        BTreeSet::from([
            perm("", "nodes", "list"),
            perm("", "pods", "list"),
            perm("", "pods/eviction", "create")
        ])
    );
}

// ---- The same for the forwarder: its ClusterRole is exactly what its code calls. ----

/// Byte offsets where `name` occurs in `src` as a whole identifier.
fn word_at(src: &str, name: &str) -> Vec<usize> {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    src.match_indices(name)
        .map(|(i, _)| i)
        .filter(|&i| !src[..i].ends_with(is_ident) && !src[i + name.len()..].starts_with(is_ident))
        .collect()
}

/// The forwarder's Kubernetes calls in `src`. Its idiom: a binding
/// `let x: Api<T> = Api::all(..);` then `watcher(x, ..)` (kube-rs' watcher
/// lists, then watches, and lists again after a 410) or `x.method(..)`.
/// Anything else touching the API is an error, so a call the scan does not
/// understand cannot pass unseen.
fn scan_forwarder(src: &str) -> Result<Vec<Call>, String> {
    let fns = functions(src);
    let fn_at = |at: usize| fns.iter().find(|f| f.start <= at && at < f.end);
    // kube::Client's raw requests, with or without a turbofish.
    for (at, _) in src.match_indices(".request") {
        let rest = &src[at + ".request".len()..];
        if ["(", "::<", "_text", "_events", "_status", "_stream"]
            .iter()
            .any(|p| rest.starts_with(p))
        {
            return Err(format!(
                "line {}: `.request…` is a Kubernetes call the scan does not understand",
                line_of(src, at)
            ));
        }
    }
    for pat in [
        "reflector(",
        "metadata_watcher(",
        "watch_object(",
        "Controller::",
        "Discovery::",
    ] {
        if let Some(at) = src.find(pat) {
            return Err(format!(
                "line {}: `{pat}` is a Kubernetes call the scan does not understand",
                line_of(src, at)
            ));
        }
    }
    let mut calls = Vec::new();
    let mut watched = 0;
    // The `Api::` of each binding's right-hand side: every other one is an error.
    let mut understood = BTreeSet::new();
    for at in word_at(src, "Api")
        .into_iter()
        .filter(|&at| src[at..].starts_with("Api<"))
    {
        let unknown = || {
            format!(
                "line {}: an `Api<..>` the scan does not understand; write `let x: Api<T> = Api::all(client);`",
                line_of(src, at)
            )
        };
        // Before: `let [mut ]x: `.
        let before = src[..at].trim_end().strip_suffix(':').ok_or_else(unknown)?.trim_end();
        let name_start = before
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(0, |i| i + 1);
        let name = &before[name_start..];
        let head = before[..name_start].trim_end();
        if name.is_empty() || !(head.ends_with("let") || head.ends_with("let mut")) {
            return Err(unknown());
        }
        // After: `T> = Api::all(`.
        let kind = ident(&src[at + "Api<".len()..]);
        let after = src[at + "Api<".len() + kind.len()..]
            .strip_prefix('>')
            .ok_or_else(unknown)?;
        let rhs = after.trim_start().strip_prefix('=').ok_or_else(unknown)?.trim_start();
        if !rhs.starts_with("Api::all(") {
            return Err(unknown());
        }
        understood.insert(src.len() - rhs.len());
        let f = fn_at(at).ok_or_else(|| format!("line {}: a binding outside any fn", line_of(src, at)))?;
        let statement_end = at + src[at..].find(';').ok_or_else(unknown)?;
        for use_at in word_at(&src[..f.end], name).into_iter().filter(|&u| u > statement_end) {
            let call = |method: &str| Call {
                in_fn: f.name.clone(),
                kind: kind.to_string(),
                method: method.to_string(),
            };
            if src[..use_at].ends_with("watcher(") && !src[..use_at].ends_with("_watcher(") {
                calls.extend([call("list"), call("watch")]);
                watched += 1;
            } else if let Some(m) = src[use_at + name.len()..].strip_prefix('.').map(ident)
                && src[use_at + name.len() + 1 + m.len()..].starts_with('(')
            {
                calls.push(call(m));
            } else {
                return Err(format!(
                    "line {}: `{name}` (an Api<{kind}>) used in a way the scan does not understand",
                    line_of(src, use_at)
                ));
            }
        }
    }
    for (at, _) in src.match_indices("Api::") {
        if !understood.contains(&at) {
            return Err(format!(
                "line {}: an `Api::` the scan does not understand; write `let x: Api<T> = Api::all(client);`",
                line_of(src, at)
            ));
        }
    }
    // A watcher of anything but such a binding is not understood either.
    let watchers = word_at(src, "watcher")
        .into_iter()
        .filter(|&at| src[at..].starts_with("watcher("))
        .count();
    if watchers != watched {
        return Err(format!(
            "{watchers} `watcher(` calls, {watched} of an `Api` binding: the scan does not understand the others"
        ));
    }
    Ok(calls)
}

fn forwarder_sources() -> Vec<(PathBuf, String)> {
    let dir = repo().join("infra/forwarder/src");
    let mut out: Vec<(PathBuf, String)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .map(|p| {
            assert!(
                p.extension().is_some_and(|e| e == "rs"),
                "{}: the scan reads only .rs files directly in {}",
                p.display(),
                dir.display()
            );
            let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, text)
        })
        .collect();
    out.sort();
    out
}

#[test]
fn the_forwarder_cluster_role_is_exactly_what_its_code_calls() {
    let mut calls = Vec::new();
    for (path, src) in forwarder_sources() {
        calls.extend(scan_forwarder(&src).unwrap_or_else(|e| panic!("{}: {e}", path.display())));
    }
    let used = permissions(&calls).unwrap_or_else(|e| panic!("infra/forwarder/src: {e}"));
    // The scan sees the pod watch, so it cannot pass by finding nothing.
    assert!(
        used.contains(&perm("", "pods", "watch")),
        "the scan missed the pod watch; it found {calls:#?}"
    );
    let granted = cluster_role_grants("forwarder.yaml", "nodesmith-forwarder");
    let missing: Vec<_> = used.difference(&granted).collect();
    let extra: Vec<_> = granted.difference(&used).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "infra/k8s/forwarder.yaml must grant exactly what infra/forwarder/src calls.\n\
         called but not granted: {missing:?}\ngranted but never called: {extra:?}"
    );
}

#[test]
fn the_forwarder_scan_names_what_it_does_not_know() {
    let scan = |src: &str| scan_forwarder(src).and_then(|c| permissions(&c));
    assert_eq!(
        scan("fn run(c: Client) {\n let api: Api<Pod> = Api::all(c);\n let s = watcher(api, cfg).backoff();\n}")
            .unwrap(),
        BTreeSet::from([perm("", "pods", "list"), perm("", "pods", "watch")])
    );
    assert_eq!(
        scan("fn f(c: Client) { let mut nodes: Api<Node> = Api::all(c); nodes.get(\"n\"); nodes.patch(\"n\", p) }")
            .unwrap(),
        BTreeSet::from([perm("", "nodes", "get"), perm("", "nodes", "patch")])
    );
    for (src, says) in [
        (
            "fn f(c: Client) {\n let p: Api<Pod> = Api::namespaced(c, \"x\");\n}",
            "line 2: an `Api<..>`",
        ),
        ("fn f(api: Api<Pod>) { api.get(\"x\") }", "an `Api<..>`"),
        (
            "fn f(c: Client) { let api: Api<Pod> = Api::all(c); helper(api) }",
            "`api` (an Api<Pod>)",
        ),
        (
            "fn f(c: Client) { let s = watcher(Api::<Pod>::all(c), cfg); }",
            "an `Api::`",
        ),
        ("fn f(c: Client) { c.request::<Value>(r) }", "`.request…`"),
        ("fn f(c: Client) { c.request_text(r) }", "`.request…`"),
        (
            "fn f(c: Client) { let a: Api<Pod> = Api::all(c); let s = watcher(a, x); let t = watcher(b, x); }",
            "2 `watcher(` calls, 1 of",
        ),
    ] {
        let e = scan(src).unwrap_err();
        assert!(e.contains(says), "{src}: {e}");
    }
    let e = scan("fn f(c: Client) { let a: Api<Secret> = Api::all(c); a.list(&lp) }").unwrap_err();
    assert!(e.contains("type Secret"), "{e}");
}

// ---- Each function holds its own ClusterRole, not the others'. ----

/// A client with a function's token (`nodesmith-<function>`), as a function
/// binary run against the server gets it (`KubeServer::env_for`).
fn as_function(server: &KubeServer, function: &str) -> kube::Client {
    nodesmith::kubernetes::client::client_for(server.url(), None, Some(&format!("nodesmith-{function}"))).unwrap()
}

#[tokio::test]
async fn provision_and_launch_may_delete_no_pod_or_node() {
    let server = seeded().await;
    for function in ["provision", "launch"] {
        let client = as_function(&server, function);
        let user = format!("User \"nodesmith-{function}\"");
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        forbidden(
            pods.delete("web-1", &DeleteParams::default()).await.map(drop),
            &format!(
                "pods \"web-1\" is forbidden: {user} cannot delete resource \"pods\" in API group \"\" in the namespace \"default\""
            ),
        );
        let nodes: Api<Node> = Api::all(client.clone());
        forbidden(
            nodes.delete("n1", &DeleteParams::default()).await.map(drop),
            &format!(
                "nodes \"n1\" is forbidden: {user} cannot delete resource \"nodes\" in API group \"\" at the cluster scope"
            ),
        );
        // Provision registers joining Nodes (a patch); launch writes no Node.
        let patched = nodes
            .patch(
                "n1",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"example.com/x": "y"}}})),
            )
            .await
            .map(drop);
        if function == "provision" {
            patched.unwrap();
        } else {
            forbidden(
                patched,
                &format!(
                    "nodes \"n1\" is forbidden: {user} cannot patch resource \"nodes\" in API group \"\" at the cluster scope"
                ),
            );
        }
    }
    // Launch reads one EC2NodeClass and records events; it lists no pods.
    let pods: Api<Pod> = Api::all(as_function(&server, "launch"));
    forbidden(
        pods.list(&ListParams::default()).await.map(drop),
        "pods is forbidden: User \"nodesmith-launch\" cannot list resource \"pods\" in API group \"\" at the cluster scope",
    );
    // Only the sweep writes an EC2NodeClass's status.
    let classes: Api<EC2NodeClass> = Api::all(as_function(&server, "interrupt"));
    let class = classes.get("default").await;
    assert!(class.is_err(), "interrupt does not read classes: {class:?}");
    assert!(server.pod("default", "web-1").is_some());
    let nodes: Api<Node> = Api::all(server.client());
    assert!(nodes.get_opt("n1").await.unwrap().is_some());
}
