//! A Kubernetes API test server: plain HTTP on 127.0.0.1, an in-memory store,
//! and enough of the API for the real kube-rs client and the real `kubectl`:
//! core/v1 namespaces, pods, nodes, events, PVs, PVCs; apps/v1 Deployments,
//! ReplicaSets (both with the `/scale` subresource) and DaemonSets;
//! policy/v1 PDBs and the `pods/eviction` subresource (PDBs enforced with
//! 429); storage.k8s.io/v1 StorageClasses; the NodePool, EC2NodeClass and
//! NodeClaim CRDs. It answers API discovery (`/api`, `/apis`, see [`discovery`]) and
//! the OpenAPI v3 that `kubectl apply` consults, and writes a kubeconfig
//! ([`KubeServer::write_kubeconfig`]). Lists take label and field selectors;
//! writes bump a global resourceVersion and answer 409 on stale versions;
//! every watch streams JSON lines. The namespaces `default`, `kube-system`,
//! `kube-public` and `kube-node-lease` exist from the start, and creating an
//! object in a namespace that does not exist is a 404, as on a real cluster
//! ([`KubeServer::apply`], the test's own seeding, creates the namespace).
//!
//! Tests drive it with [`KubeServer`]: seed objects, run the [`scheduler`]
//! step and the [`workloads`] controllers (Deployments, ReplicaSets, garbage
//! collection of dependents and of pods bound to deleted Nodes) one pass at
//! a time or in the background, register nodes by hand or run
//! [`kubelet::Kubelets`] for EC2 instances in moto, inject faults, break
//! watches.
//!
//! Simplifications, on purpose: strategic-merge and apply patches are applied
//! as JSON merge patches (lists replaced whole); lists are not paginated,
//! watches send no bookmarks; `kubectl get` tables come from the server for
//! pods, nodes, Deployments and the custom resources (their CRD's printer
//! columns) only ([`table`]; other kinds print `NAME` and `AGE`); request bodies are JSON only (kubectl's typed writes such as
//! `kubectl create namespace` send protobuf and get 415: use `kubectl apply`);
//! deletes and evictions remove objects without finalizers at once (no
//! graceful termination; dependents go on the next controller pass, whatever
//! the propagation policy), while an object with `metadata.finalizers` is
//! kept with `deletionTimestamp` set until a write removes its last finalizer
//! (a write that adds one to it is a 422, as on a real cluster); deleting a
//! namespace deletes its objects at once;
//! status is a separate subresource only for the NodePool, EC2NodeClass and
//! NodeClaim CRDs (`/status` writes change only their status, writes of the object
//! never do, and a create drops it); for other kinds a write of the object
//! can change its status; objects are not validated beyond being JSON with a name; a PDB's
//! expected pods are the pods its selector matches; binding a pod also makes
//! it Running and Ready; see [`workloads`] for the controllers' own.
//!
//! Authentication and RBAC as on EKS, for nodesmith's functions and its
//! forwarder (see [`rbac`]): a request whose bearer token is
//! `nodesmith-<function>` is that function's group `nodesmith:<function>`,
//! held to its own ClusterRole of `infra/k8s/lambda-rbac.yaml`; an EKS token
//! (`k8s-aws-v1.…`) or `nodesmith-lambda` is in all four groups (the union of
//! the roles); the token `nodesmith-forwarder` is the
//! ServiceAccount `system:serviceaccount:nodesmith:nodesmith-forwarder`, held
//! to what `infra/k8s/forwarder.yaml` binds to it (403 `Forbidden` beyond
//! either, recorded in [`KubeServer::denials`]); any other request, with no
//! token or the kubeconfig's `nodesmith-test`, is the test's cluster admin
//! and may do anything. [`KubeServer::client`] is the admin, for seeding and
//! inspecting; [`KubeServer::env_for`] is one function (as the local cloud
//! runs each), [`KubeServer::lambda_client`] and [`KubeServer::env`] all of
//! them; [`KubeServer::client_as`] and [`KubeServer::write_kubeconfig_as`]
//! with [`Identity::Forwarder`] are the forwarder.

pub mod api;
pub mod discovery;
pub mod disruption;
pub mod kubelet;
pub mod rbac;
pub mod resources;
pub mod scheduler;
pub mod schema;
pub mod selectors;
pub mod store;
pub mod table;
pub mod workloads;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::http::{Method, Uri};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

pub use kubelet::{
    KubeletLoop, KubeletReport, KubeletTiming, KubeletUserData, Kubelets, NodeRegistration, Refusal,
    kubelet_flags_from_user_data,
};
pub use rbac::{Function, FunctionIdentity, Identity, Permission};
use resources::{DEPLOYMENTS, NAMESPACES, NODES, PODS, REPLICASETS, Resource};
pub use scheduler::ScheduleReport;
use store::{Store, now_rfc3339};
pub use workloads::ReconcileReport;

/// Answers matching requests with an error status instead of serving them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// Only requests with this method (any when None).
    pub method: Option<Method>,
    /// Only requests whose path contains this (any when empty).
    pub path_contains: String,
    /// The HTTP status to answer with (409, 429, 500, 503 ...).
    pub status: u16,
    /// How many requests to fail before the fault clears itself.
    pub times: usize,
}

impl Fault {
    /// Fails the next `times` requests of any kind with `status`.
    pub fn new(status: u16, times: usize) -> Self {
        Fault {
            method: None,
            path_contains: String::new(),
            status,
            times,
        }
    }

    /// Restricts the fault to one method.
    pub fn on(mut self, method: Method) -> Self {
        self.method = Some(method);
        self
    }

    /// Restricts the fault to paths containing `s`.
    pub fn path(mut self, s: &str) -> Self {
        self.path_contains = s.to_string();
        self
    }
}

/// A request the server saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestRecord {
    /// The HTTP method.
    pub method: Method,
    /// Path and query.
    pub uri: String,
    /// The Authorization header, if any (tests check how clients authenticate).
    pub authorization: Option<String>,
    /// When it arrived (the scale harness times steps by it).
    pub at: std::time::Instant,
}

/// State shared between the server's handlers and the test's handle.
pub struct Shared {
    store: Mutex<Store>,
    faults: Mutex<Vec<Fault>>,
    requests: Mutex<Vec<RequestRecord>>,
    touch_after_get: Mutex<Vec<(String, usize)>>,
    watch_breaker: tokio::sync::watch::Sender<u64>,
    /// Each restricted identity's rules (from its manifest).
    policies: BTreeMap<rbac::Identity, rbac::Policy>,
    denials: Mutex<Vec<(rbac::Identity, String)>>,
    used: Mutex<BTreeMap<rbac::Identity, BTreeSet<Permission>>>,
    /// Bytes of every response body whose size was known when it was sent
    /// (not watch streams): what the scale harness reports as bytes read.
    response_bytes: std::sync::atomic::AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking test thread must not wedge every other request.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// The store, locked.
    pub fn lock_store(&self) -> MutexGuard<'_, Store> {
        lock(&self.store)
    }

    fn record_request(&self, method: &Method, uri: &Uri, headers: &axum::http::HeaderMap) {
        let authorization = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        lock(&self.requests).push(RequestRecord {
            method: method.clone(),
            uri: uri.to_string(),
            authorization,
            at: std::time::Instant::now(),
        });
    }

    /// Authorizes a request before anything is read or written: the admin
    /// and non-resource paths always pass; the functions and the forwarder
    /// pass what their manifests' roles grant, and a refusal is recorded and
    /// answered with a 403 `Forbidden` Status naming the user.
    #[allow(clippy::result_large_err)] // the error is the response to send
    fn authorize(
        &self,
        identity: rbac::Identity,
        method: &Method,
        uri: &Uri,
        query: &std::collections::HashMap<String, String>,
    ) -> Result<(), axum::response::Response> {
        let Some(policy) = self.policies.get(&identity) else {
            return Ok(());
        };
        let rbac::Attributes::Resource(r) = rbac::attributes(method, uri.path(), query) else {
            return Ok(());
        };
        if policy.allows(&r) {
            lock(&self.used)
                .entry(identity)
                .or_default()
                .insert((r.group.clone(), r.resource_path(), r.verb.clone()));
            return Ok(());
        }
        let message = rbac::forbidden_message(&identity.user().name, &r);
        lock(&self.denials).push((identity, format!("{method} {uri}: {message}")));
        tracing::warn!(%method, %uri, "kubernetes test server: {message}");
        Err(api::status(
            403,
            "Forbidden",
            &message,
            Some(json!({"name": r.name, "group": r.group, "kind": r.resource})),
        ))
    }

    /// Whether a GET of `path` should be followed by a concurrent write.
    fn take_touch(&self, path: &str) -> bool {
        let mut t = lock(&self.touch_after_get);
        let Some(i) = t.iter().position(|(p, n)| *n > 0 && path.contains(p.as_str())) else {
            return false;
        };
        t[i].1 -= 1;
        t.retain(|(_, n)| *n > 0);
        true
    }

    fn take_fault(&self, method: &Method, path: &str) -> Option<u16> {
        let mut faults = lock(&self.faults);
        let i = faults.iter().position(|f| {
            f.times > 0 && f.method.as_ref().is_none_or(|m| m == method) && path.contains(&f.path_contains)
        })?;
        faults[i].times -= 1;
        let code = faults[i].status;
        faults.retain(|f| f.times > 0);
        Some(code)
    }
}

/// Adds a response's body size, when known, to the server's byte count.
async fn count_response_bytes(
    axum::extract::State(shared): axum::extract::State<Arc<Shared>>,
    response: axum::response::Response,
) -> axum::response::Response {
    use axum::body::HttpBody;
    if let Some(n) = response.body().size_hint().exact() {
        shared.response_bytes.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }
    response
}

/// Sets a pod as bound to a node and running/ready (the kubelet's part is instant here).
pub fn bind_json(pod: &mut Value, node: &str) {
    let now = now_rfc3339();
    json_patch::merge(
        pod,
        &json!({
            "spec": {"nodeName": node},
            "status": {"phase": "Running", "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
                {"type": "Ready", "status": "True", "lastTransitionTime": now}
            ]}
        }),
    );
}

/// A running test server; dropping it stops it.
pub struct KubeServer {
    url: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for KubeServer {
    fn drop(&mut self) {
        // Open watch streams run in their own tasks: end them too.
        self.shared.watch_breaker.send_modify(|g| *g += 1);
        self.task.abort();
    }
}

/// A background scheduler loop; dropping it stops it.
pub struct SchedulerLoop(tokio::task::JoinHandle<()>);

impl Drop for SchedulerLoop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A background loop of the workload controllers; dropping it stops it.
pub struct ControllerLoop(tokio::task::JoinHandle<()>);

impl Drop for ControllerLoop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Namespaces every cluster starts with.
pub const INITIAL_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

fn namespace_json(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}},
        "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}})
}

impl KubeServer {
    /// Starts a server on a free loopback port.
    ///
    /// Panics when no loopback port can be bound or the functions' RBAC
    /// manifest is broken: nothing a test could do about either.
    pub async fn start() -> Self {
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        Self::start_on(addr)
            .await
            .unwrap_or_else(|e| panic!("starting the Kubernetes test server: {e}"))
    }

    /// Starts a server on `addr` (port 0 picks a free one). Fails when the
    /// port cannot be bound, `infra/k8s/lambda-rbac.yaml` does not give the
    /// functions' group its ClusterRole, or `infra/k8s/forwarder.yaml` binds
    /// nothing to the forwarder's ServiceAccount.
    pub async fn start_on(addr: SocketAddr) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let mut store = Store::default();
        for ns in INITIAL_NAMESPACES {
            // A fresh store holds nothing, so this cannot collide.
            let _ = store.create(NAMESPACES, "", namespace_json(ns));
        }
        // nodesmith's CRDs are installed, as in a cluster the stack deployed
        // to: NodePools, EC2NodeClasses and NodeClaims are stored as the API server would.
        for crd in nodesmith::kubernetes::crds::crds() {
            let crd = serde_json::to_value(crd).map_err(std::io::Error::other)?;
            store
                .create(resources::CRDS, "", crd)
                .map_err(|e| std::io::Error::other(format!("installing a CRD: {e:?}")))?;
        }
        let mut policies = BTreeMap::new();
        for identity in rbac::Identity::RESTRICTED {
            if let Some(p) = rbac::Policy::of(identity).map_err(std::io::Error::other)? {
                policies.insert(identity, p);
            }
        }
        let shared = Arc::new(Shared {
            policies,
            denials: Mutex::new(Vec::new()),
            used: Mutex::new(BTreeMap::new()),
            store: Mutex::new(store),
            faults: Mutex::new(Vec::new()),
            requests: Mutex::new(Vec::new()),
            touch_after_get: Mutex::new(Vec::new()),
            watch_breaker: tokio::sync::watch::channel(0).0,
            response_bytes: std::sync::atomic::AtomicU64::new(0),
        });
        let app = Router::new()
            .fallback(api::handle)
            .layer(axum::middleware::map_response_with_state(
                shared.clone(),
                count_response_bytes,
            ))
            .with_state(shared.clone());
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "kubernetes test server stopped");
            }
        });
        Ok(KubeServer {
            url: format!("http://{addr}"),
            shared,
            task,
        })
    }

    /// Writes a kubeconfig for this server to `path`: one cluster, context and
    /// token user named `nodesmith-test`, namespace `default`. The token
    /// [`rbac::ADMIN_TOKEN`] is the cluster admin (any token but the
    /// restricted identities' is).
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        self.write_kubeconfig_as(path, rbac::Identity::Admin)
    }

    /// Writes a kubeconfig like [`KubeServer::write_kubeconfig`] whose user is
    /// `identity` (its user name and token), e.g. for the forwarder binary,
    /// which reads `KUBECONFIG`.
    pub fn write_kubeconfig_as(&self, path: &Path, identity: rbac::Identity) -> std::io::Result<()> {
        let user = identity.user().name;
        let config = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "nodesmith-test", "cluster": {"server": self.url}}],
            "users": [{"name": user, "user": {"token": identity.token()}}],
            "contexts": [{"name": "nodesmith-test",
                "context": {"cluster": "nodesmith-test", "user": user, "namespace": "default"}}],
            "current-context": "nodesmith-test",
        });
        let yaml = serde_yaml_ng::to_string(&config).map_err(std::io::Error::other)?;
        std::fs::write(path, yaml)
    }

    /// The base URL (`http://127.0.0.1:port`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A client config for this server. Transport-level retries are off so
    /// tests see exactly what callers' own retry logic does.
    pub fn config(&self) -> kube::Config {
        let mut c = kube::Config::new(self.url.parse().expect("the server URL is a valid URI"));
        c.default_retry = false;
        c
    }

    /// A kube client talking to this server as the test's cluster admin (no
    /// token): for seeding and inspecting cluster state, never restricted.
    pub fn client(&self) -> kube::Client {
        nodesmith::transport::install_crypto_provider();
        kube::Client::try_from(self.config()).expect("a kube client for a plain-HTTP URL")
    }

    /// A kube client with the functions' identity (token
    /// [`rbac::LAMBDA_TOKEN`]), held to their ClusterRole: what nodesmith's
    /// adapter must use in tests (`KubeCluster::from_client(server.lambda_client())`).
    pub fn lambda_client(&self) -> kube::Client {
        self.client_as(rbac::Identity::Lambda)
    }

    /// A kube client with `identity`'s token, held to its rules (the
    /// forwarder's: `server.client_as(Identity::Forwarder)`).
    pub fn client_as(&self, identity: rbac::Identity) -> kube::Client {
        nodesmith::transport::install_crypto_provider();
        let mut config = self.config();
        config.auth_info.token = Some(identity.token().to_string().into());
        kube::Client::try_from(config).expect("a kube client for a plain-HTTP URL")
    }

    /// Environment for a child process to use this server through
    /// `KubeCluster::from_env` as a principal in every function's group (the
    /// URL and the token [`rbac::LAMBDA_TOKEN`]); a function binary gets its
    /// own identity from [`KubeServer::env_for`].
    pub fn env(&self) -> Vec<(&'static str, String)> {
        use nodesmith::kubernetes::kube_cluster::{KUBE_TOKEN_ENV, KUBE_URL_ENV};
        vec![
            (KUBE_URL_ENV, self.url.clone()),
            (KUBE_TOKEN_ENV, rbac::LAMBDA_TOKEN.to_string()),
        ]
    }

    /// Environment for one function's binary: this server, with that
    /// function's own identity (token [`rbac::FunctionIdentity::token`]), held to its
    /// own ClusterRole as the stack's access entry holds it in EKS.
    pub fn env_for(&self, function: rbac::Function) -> Vec<(&'static str, String)> {
        use nodesmith::kubernetes::kube_cluster::{KUBE_TOKEN_ENV, KUBE_URL_ENV};
        vec![
            (KUBE_URL_ENV, self.url.clone()),
            (KUBE_TOKEN_ENV, function.token().to_string()),
        ]
    }

    /// Every request of a restricted identity refused so far, in order, as
    /// `METHOD path?query: message`; the message names whose (`User "…"
    /// cannot …`). A test of code that runs as the functions or the
    /// forwarder should end with none.
    pub fn denials(&self) -> Vec<String> {
        lock(&self.shared.denials).iter().map(|(_, d)| d.clone()).collect()
    }

    /// The requests of `identity` refused so far, as [`KubeServer::denials`] writes them.
    pub fn denials_of(&self, identity: rbac::Identity) -> Vec<String> {
        let denials = lock(&self.shared.denials);
        denials
            .iter()
            .filter(|(i, _)| *i == identity)
            .map(|(_, d)| d.clone())
            .collect()
    }

    /// The (API group, resource[/subresource], verb) `identity` was allowed
    /// so far (always none for the admin, who is not authorized).
    pub fn permissions_used(&self, identity: rbac::Identity) -> BTreeSet<Permission> {
        lock(&self.shared.used).get(&identity).cloned().unwrap_or_default()
    }

    /// [`KubeServer::permissions_used`] of the functions.
    pub fn lambda_permissions_used(&self) -> BTreeSet<Permission> {
        self.permissions_used(rbac::Identity::Lambda)
    }

    /// The shared state (for handlers and advanced tests).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Creates an object (any served kind), or replaces it when it exists.
    /// Returns the stored object. Errors name what is wrong.
    pub fn apply<K: Serialize>(&self, obj: &K) -> Result<Value, String> {
        let v = serde_json::to_value(obj).map_err(|e| e.to_string())?;
        let api_version = v.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        let kind = v.get("kind").and_then(Value::as_str).unwrap_or("");
        let res = resources::by_kind(api_version, kind)
            .ok_or_else(|| format!("the test server does not serve {api_version}/{kind}"))?;
        let ns = if res.namespaced {
            store::namespace_of(&v).to_string()
        } else {
            String::new()
        };
        let ns = if res.namespaced && ns.is_empty() {
            "default".to_string()
        } else {
            ns
        };
        let name = store::name_of(&v).to_string();
        let mut store = self.shared.lock_store();
        if res.namespaced && store.get(NAMESPACES, "", &ns).is_none() {
            store
                .create(NAMESPACES, "", namespace_json(&ns))
                .map_err(|e| format!("{e:?}"))?;
        }
        if !name.is_empty() && store.get(res, &ns, &name).is_some() {
            let mut v = v;
            if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("resourceVersion");
            }
            return store.update(res, &ns, &name, v).map_err(|e| format!("{e:?}"));
        }
        store.create(res, &ns, v).map_err(|e| format!("{e:?}"))
    }

    fn typed<K: DeserializeOwned>(v: Option<Value>) -> Option<K> {
        v.and_then(|v| serde_json::from_value(v).ok())
    }

    /// A pod by namespace and name.
    pub fn pod(&self, ns: &str, name: &str) -> Option<Pod> {
        Self::typed(self.shared.lock_store().get(PODS, ns, name).cloned())
    }

    /// Every pod.
    pub fn pods(&self) -> Vec<Pod> {
        self.shared
            .lock_store()
            .list(PODS, None)
            .into_iter()
            .filter_map(|v| serde_json::from_value(v).ok())
            .collect()
    }

    /// How many pods satisfy `which` (asked of their JSON in place: a census
    /// of tens of thousands of pods that copies none).
    pub fn count_pods(&self, which: impl Fn(&Value) -> bool) -> usize {
        self.shared.lock_store().count(PODS, which)
    }

    /// Every node.
    pub fn nodes(&self) -> Vec<Node> {
        self.shared
            .lock_store()
            .list(NODES, None)
            .into_iter()
            .filter_map(|v| serde_json::from_value(v).ok())
            .collect()
    }

    /// A node by name.
    pub fn node(&self, name: &str) -> Option<Node> {
        Self::typed(self.shared.lock_store().get(NODES, "", name).cloned())
    }

    /// Every core/v1 Event.
    pub fn events(&self) -> Vec<Event> {
        self.shared
            .lock_store()
            .list(resources::EVENTS, None)
            .into_iter()
            .filter_map(|v| serde_json::from_value(v).ok())
            .collect()
    }

    /// Deletes an object by apiVersion, kind, namespace and name.
    pub fn delete(&self, api_version: &str, kind: &str, ns: &str, name: &str) -> Result<Value, String> {
        let res = resources::by_kind(api_version, kind)
            .ok_or_else(|| format!("the test server does not serve {api_version}/{kind}"))?;
        self.shared
            .lock_store()
            .delete(res, ns, name)
            .map_err(|e| format!("{e:?}"))
    }

    /// Makes a node `by` older (its `creationTimestamp` moves back): the
    /// test server's clock for ages, so expiry is reached without sleeping.
    pub fn age_node(&self, name: &str, by: Duration) -> Result<Node, String> {
        let v = self
            .shared
            .lock_store()
            .backdate(NODES, "", name, by)
            .map_err(|e| format!("{e:?}"))?;
        serde_json::from_value(v).map_err(|e| e.to_string())
    }

    /// Fails matching requests (see [`Fault`]).
    pub fn inject(&self, fault: Fault) {
        lock(&self.shared.faults).push(fault);
    }

    /// After each of the next `times` GETs of an object whose path contains
    /// `path`, another writer modifies it (an annotation changes), so a write
    /// based on what was read carries a stale resourceVersion and gets 409.
    pub fn modify_after_get(&self, path: &str, times: usize) {
        lock(&self.shared.touch_after_get).push((path.to_string(), times));
    }

    /// Bytes of the response bodies sent so far (watch streams not counted).
    pub fn response_bytes(&self) -> u64 {
        self.shared.response_bytes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Every request seen so far.
    pub fn requests(&self) -> Vec<RequestRecord> {
        lock(&self.shared.requests).clone()
    }

    /// How many requests had this method and a path+query containing `s`.
    pub fn count_requests(&self, method: &Method, s: &str) -> usize {
        lock(&self.shared.requests)
            .iter()
            .filter(|r| r.method == method && r.uri.contains(s))
            .count()
    }

    /// Ends every open watch stream (clients reconnect from their last resourceVersion).
    pub fn break_watches(&self) {
        self.shared.watch_breaker.send_modify(|g| *g += 1);
    }

    /// Keeps at most the last `changes` changes for watches and paged lists
    /// (a guard on memory, and a way to compact at once): older ones are
    /// dropped, and a watch or a continued list from before them gets 410.
    pub fn set_history_limit(&self, changes: usize) {
        self.shared.lock_store().set_history_limit(changes);
    }

    /// Keeps changes for `retention` (etcd's compaction interval as
    /// kube-apiserver sets it; five minutes by default).
    pub fn set_retention(&self, retention: Duration) {
        self.shared.lock_store().set_retention(retention);
    }

    /// Moves the server's compaction clock on by `by` (changes older than the
    /// retention are compacted), so a test reaches compaction without sleeping.
    pub fn advance_compaction_clock(&self, by: Duration) {
        self.shared.lock_store().advance_clock(by);
    }

    /// How many changes the server keeps now.
    pub fn history_len(&self) -> usize {
        self.shared.lock_store().history_len()
    }

    /// Forgets watch history and ends open watches: reconnecting clients get
    /// 410 Gone and must re-list, as after an etcd compaction.
    pub fn expire_watch_history(&self) {
        self.shared.lock_store().compact();
        self.break_watches();
    }

    /// Registers a Node as a kubelet would. A node of that name that already
    /// exists is left as it is (taints or labels others added stay), as a
    /// restarted kubelet finds its Node and does not recreate it.
    pub fn register_node(&self, reg: &NodeRegistration) -> Result<Node, String> {
        let existing = self.shared.lock_store().get(NODES, "", &reg.name).cloned();
        let v = match existing {
            Some(v) => v,
            None => self.apply(&reg.to_node())?,
        };
        serde_json::from_value(v).map_err(|e| e.to_string())
    }

    /// Registers a Node for every running EC2 instance and makes it Ready at
    /// once: one step of fresh [`Kubelets`] with [`KubeletTiming::instant`].
    /// Nodes already there are left as they are (and made Ready). Any kubelet
    /// refusing to start is an error naming its instance and reason.
    pub async fn register_ec2_instances(
        &self,
        ec2: &aws_sdk_ec2::Client,
        catalog: &nodesmith::catalog::Catalog,
    ) -> Result<Vec<Node>, String> {
        let report = Kubelets::new(KubeletTiming::instant()).step(self, ec2, catalog).await?;
        if !report.refused.is_empty() {
            let why: Vec<String> = report
                .refused
                .iter()
                .map(|r| format!("{}: {}", r.instance_id, r.reason))
                .collect();
            return Err(format!("kubelets refused to start: {}", why.join("; ")));
        }
        report
            .registered
            .iter()
            .map(|name| self.node(name).ok_or_else(|| format!("node {name} vanished")))
            .collect()
    }

    /// One scheduling pass over every pending pod.
    pub fn schedule(&self) -> ScheduleReport {
        schedule(&self.shared)
    }

    /// One pass of the workload controllers and garbage collectors (see [`workloads`]).
    pub fn reconcile(&self) -> ReconcileReport {
        workloads::reconcile(&mut self.shared.lock_store())
    }

    /// Runs [`KubeServer::reconcile`] every `period` until the handle is dropped.
    pub fn spawn_controllers(&self, period: Duration) -> ControllerLoop {
        let shared = self.shared.clone();
        ControllerLoop(tokio::spawn(async move {
            let mut seen = None;
            loop {
                // A pass only when something the controllers read has moved:
                // with thousands of pods a pass is costly, and it holds the store.
                let shared = shared.clone();
                seen = off_runtime(move || {
                    let mut store = shared.lock_store();
                    if seen != Some(fingerprint(&store, WORKLOAD_INPUTS)) {
                        workloads::reconcile(&mut store);
                        return Some(fingerprint(&store, WORKLOAD_INPUTS));
                    }
                    seen
                })
                .await;
                tokio::time::sleep(period).await;
            }
        }))
    }

    /// Runs [`KubeServer::schedule`] every `period` until the handle is dropped.
    pub fn spawn_scheduler(&self, period: Duration) -> SchedulerLoop {
        let shared = self.shared.clone();
        SchedulerLoop(tokio::spawn(async move {
            let mut seen = None;
            let mut remarks = RemarkAllowance::new();
            let mut left = false;
            loop {
                // As kube-scheduler: pods are retried when what they wait on
                // changes (see `scheduler_inputs`), not on a clock; messages
                // left to write wait for a full allowance (a pass reads every
                // pod, so not one pass per few messages).
                let shared = shared.clone();
                let allowance = (left && remarks.full(), remarks.now());
                let pass = off_runtime(move || {
                    let mut store = shared.lock_store();
                    if seen != Some(scheduler_inputs(&store)) || allowance.0 {
                        let report = schedule_in(&mut store, allowance.1);
                        return (Some(scheduler_inputs(&store)), Some(report));
                    }
                    (seen, None)
                })
                .await;
                seen = pass.0;
                if let Some(report) = pass.1 {
                    remarks.spend(report.remarked);
                    left = report.remarks_left > 0;
                }
                tokio::time::sleep(period).await;
            }
        }))
    }
}

/// Runs a pass that holds the store on the blocking pool: on an async
/// worker, a pass over a burst's 20,000 pods held that worker for its whole
/// length, and with two workers the local Lambda runtime, the fault proxy
/// and the SQS pollers of the same process waited behind it.
async fn off_runtime<T: Send + 'static>(pass: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(pass).await {
        Ok(out) => out,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // The runtime is shutting down: the loop ends with it.
        Err(_) => std::future::pending().await,
    }
}

/// What a scheduling pass can act on, as a fingerprint: the Nodes, each
/// pending pod at its resourceVersion, and each bound pod by whether it still
/// holds its resources. kube-scheduler retries its unschedulable pods when a
/// Node changes or a pod is added, deleted or finishes, not when a kubelet
/// reports on a running pod; in a burst those reports are most of the
/// changes, and each pass over 20,000 pending pods held the store for seconds.
fn scheduler_inputs(store: &Store) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    store.changed_at(NODES).hash(&mut h);
    store.scan(PODS, None, None, None, |p| {
        let bound = p
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty());
        (store::namespace_of(p), store::name_of(p)).hash(&mut h);
        if bound {
            let phase = p.pointer("/status/phase").and_then(Value::as_str);
            matches!(phase, Some("Succeeded" | "Failed")).hash(&mut h);
        } else {
            store::rv_of(p).hash(&mut h);
        }
        true
    });
    h.finish()
}

/// kube-scheduler's default client rate (`clientConnection.qps` 50, burst
/// 100), applied to the writes that only change the message of a pod already
/// unschedulable ("0/N nodes are available" moves with every Node). Each such
/// write is a new pod version, which the forwarder sends on; at memory speed a
/// burst's 20,000 pending pods were rewritten at every Node change. Binds and
/// a pod's first mark are not held to it: the local cloud's pods would start
/// minutes after the functions placed them.
struct RemarkAllowance {
    tokens: f64,
    at: std::time::Instant,
}

impl RemarkAllowance {
    const PER_SECOND: f64 = 50.0;
    const BURST: f64 = 100.0;

    fn new() -> Self {
        RemarkAllowance {
            tokens: Self::BURST,
            at: std::time::Instant::now(),
        }
    }

    /// How many re-marks may be written now.
    fn now(&mut self) -> usize {
        let now = std::time::Instant::now();
        self.tokens = (self.tokens + now.duration_since(self.at).as_secs_f64() * Self::PER_SECOND).min(Self::BURST);
        self.at = now;
        self.tokens as usize
    }

    /// Whether the allowance is back to its burst.
    fn full(&mut self) -> bool {
        self.now() >= Self::BURST as usize
    }

    /// `written` re-marks were written.
    fn spend(&mut self, written: usize) {
        self.tokens = (self.tokens - written as f64).max(0.0);
    }
}

/// What the workload controllers and garbage collectors read.
const WORKLOAD_INPUTS: &[&Resource] = &[PODS, NODES, DEPLOYMENTS, REPLICASETS];

/// When each of `inputs` last changed.
fn fingerprint(store: &Store, inputs: &[&Resource]) -> Vec<u64> {
    inputs.iter().map(|r| store.changed_at(r)).collect()
}

/// One scheduling pass: bind what fits, mark the rest unschedulable.
fn schedule(shared: &Shared) -> ScheduleReport {
    schedule_in(&mut shared.lock_store(), usize::MAX)
}

/// [`schedule`] on a store already locked, writing at most `remarks` new
/// messages to pods already marked unschedulable.
fn schedule_in(store: &mut Store, remarks: usize) -> ScheduleReport {
    use serde::Deserialize;
    // Read in place: a copy of every pod for each pass cost more than the pass.
    let mut pods: Vec<Pod> = Vec::new();
    store.scan(PODS, None, None, None, |v| {
        pods.extend(Pod::deserialize(v).ok());
        true
    });
    let mut nodes: Vec<Node> = Vec::new();
    store.scan(NODES, None, None, None, |v| {
        nodes.extend(Node::deserialize(v).ok());
        true
    });
    let mut report = ScheduleReport::default();
    for (i, outcome) in scheduler::plan(&pods, &nodes) {
        let pod = &pods[i];
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let Some(current) = store.get(PODS, &ns, &name) else {
            continue;
        };
        if let Err(message) = &outcome {
            // Already says so: nothing to write (nor to copy); a new message
            // for a pod already unschedulable waits past the allowance.
            let unchanged = says_unschedulable(current, message);
            let remark = !unchanged && is_unschedulable(current);
            let held = remark && report.remarked >= remarks;
            if unchanged || held {
                report.remarks_left += usize::from(held);
                report.unschedulable.push(format!("{ns}/{name}"));
                continue;
            }
            report.remarked += usize::from(remark);
        }
        let mut v = current.clone();
        match outcome {
            Ok(node) => {
                bind_json(&mut v, &node);
                if store.update(PODS, &ns, &name, v).is_ok() {
                    report.bound.push((format!("{ns}/{name}"), node));
                }
            }
            Err(message) => {
                mark_unschedulable(&mut v, &message);
                if store.update(PODS, &ns, &name, v).is_ok() {
                    report.unschedulable.push(format!("{ns}/{name}"));
                }
            }
        }
    }
    report
}

/// Sets `PodScheduled=False, reason=Unschedulable`; leaves the pod unchanged
/// when the condition already says exactly that (as the scheduler avoids
/// needless writes), so the resourceVersion only moves on real news. A new
/// message keeps the condition's `lastTransitionTime` while its status stays
/// `False`, as kube-scheduler does: the time says since when the pod has been
/// unschedulable, which the sweep compares with the last solve.
fn mark_unschedulable(pod: &mut Value, message: &str) {
    if says_unschedulable(pod, message) {
        return;
    }
    let conds = pod
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let scheduled = conds.iter().find(|c| c.get("type") == Some(&json!("PodScheduled")));
    let since = scheduled
        .filter(|c| c.get("status") == Some(&json!("False")))
        .and_then(|c| c.get("lastTransitionTime").cloned())
        .unwrap_or_else(|| json!(now_rfc3339()));
    let mut conds: Vec<Value> = conds
        .into_iter()
        .filter(|c| c.get("type") != Some(&json!("PodScheduled")))
        .collect();
    conds.push(json!({"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message, "lastTransitionTime": since}));
    json_patch::merge(pod, &json!({"status": {"phase": "Pending", "conditions": conds}}));
}

/// `pod`'s `PodScheduled` condition when it says Unschedulable.
fn unschedulable_condition(pod: &Value) -> Option<&Value> {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|conds| {
            conds
                .iter()
                .find(|c| c.get("type").and_then(Value::as_str) == Some("PodScheduled"))
        })
        .filter(|c| {
            c.get("status").and_then(Value::as_str) == Some("False")
                && c.get("reason").and_then(Value::as_str) == Some("Unschedulable")
        })
}

/// Whether `pod` is marked unschedulable (with any message).
fn is_unschedulable(pod: &Value) -> bool {
    unschedulable_condition(pod).is_some()
}

/// Whether `pod` is marked unschedulable with `message`.
fn says_unschedulable(pod: &Value, message: &str) -> bool {
    unschedulable_condition(pod).is_some_and(|c| c.get("message").and_then(Value::as_str) == Some(message))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scheduled(pod: &Value) -> Value {
        pod["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "PodScheduled")
            .unwrap()
            .clone()
    }

    #[test]
    fn the_scheduler_retries_on_node_and_pending_pod_changes_not_on_a_running_pods_reports() {
        let mut store = Store::default();
        let pod = |name: &str, node: Option<&str>| json!({"metadata": {"name": name, "namespace": "a"}, "spec": {"containers": [], "nodeName": node}, "status": {"phase": "Pending"}});
        store.create(PODS, "a", pod("waiting", None)).unwrap();
        store.create(PODS, "a", pod("running", Some("n1"))).unwrap();
        store.create(NODES, "", json!({"metadata": {"name": "n1"}})).unwrap();
        let mut inputs = scheduler_inputs(&store);
        let mut changed = |store: &Store, what: &str, expected: bool| {
            let now = scheduler_inputs(store);
            assert_eq!(now != inputs, expected, "{what}");
            inputs = now;
        };
        let mut running = store.get(PODS, "a", "running").unwrap().clone();
        running["status"] = json!({"phase": "Running", "podIP": "10.0.0.9"});
        store.update(PODS, "a", "running", running).unwrap();
        changed(&store, "a kubelet's report on a bound pod", false);
        let mut waiting = store.get(PODS, "a", "waiting").unwrap().clone();
        waiting["spec"]["tolerations"] = json!([{"operator": "Exists"}]);
        store.update(PODS, "a", "waiting", waiting).unwrap();
        changed(&store, "a pending pod changed", true);
        store.create(NODES, "", json!({"metadata": {"name": "n2"}})).unwrap();
        changed(&store, "a new Node", true);
        let mut done = store.get(PODS, "a", "running").unwrap().clone();
        done["status"]["phase"] = json!("Succeeded");
        store.update(PODS, "a", "running", done).unwrap();
        changed(&store, "a bound pod finished (its resources are free)", true);
        store.create(PODS, "a", pod("new", None)).unwrap();
        changed(&store, "a new pod", true);
        store.delete(PODS, "a", "running").unwrap();
        changed(&store, "a bound pod deleted", true);
    }

    #[test]
    fn new_messages_for_unschedulable_pods_are_written_at_the_allowance_and_binds_are_not() {
        let mut store = Store::default();
        let pod = |name: &str, cpu: &str| {
            json!({"metadata": {"name": name, "namespace": "a"},
                "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}})
        };
        let node = |name: &str, cpu: &str| json!({"metadata": {"name": name}, "status": {"allocatable": {"cpu": cpu, "pods": "110"}}});
        for name in ["p1", "p2", "p3"] {
            store.create(PODS, "a", pod(name, "4")).unwrap();
        }
        store.create(NODES, "", node("n1", "1")).unwrap();
        let first = schedule_in(&mut store, 0);
        assert_eq!(
            (first.unschedulable.len(), first.remarked),
            (3, 0),
            "first marks are not held back"
        );
        let rv = |store: &Store, name: &str| store::rv_of(store.get(PODS, "a", name).unwrap());
        let before: Vec<u64> = ["p1", "p2", "p3"].iter().map(|n| rv(&store, n)).collect();
        // A second Node changes every message ("0/2 nodes"); one may be written.
        store.create(NODES, "", node("n2", "1")).unwrap();
        store.create(PODS, "a", pod("small", "100m")).unwrap();
        let second = schedule_in(&mut store, 1);
        assert_eq!((second.remarked, second.remarks_left), (1, 2));
        assert_eq!(second.bound.len(), 1, "a bind is not held back");
        let moved = ["p1", "p2", "p3"]
            .iter()
            .zip(&before)
            .filter(|(n, was)| rv(&store, n) != **was)
            .count();
        assert_eq!(moved, 1);
        let third = schedule_in(&mut store, usize::MAX);
        assert_eq!((third.remarked, third.remarks_left), (2, 0));
        assert!(["p1", "p2", "p3"].iter().all(|n| says_unschedulable(
            store.get(PODS, "a", n).unwrap(),
            "0/2 nodes are available: 2 Insufficient resources."
        )));
    }

    #[test]
    fn a_new_unschedulable_message_keeps_the_time_the_pod_became_unschedulable() {
        let old = "2026-01-01T00:00:00Z";
        let mut pod = json!({"status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes", "lastTransitionTime": old}
        ]}});
        mark_unschedulable(&mut pod, "0/4 nodes");
        let c = scheduled(&pod);
        assert_eq!(
            (c["message"].as_str(), c["lastTransitionTime"].as_str()),
            (Some("0/4 nodes"), Some(old))
        );

        // A pod that was scheduled (or never judged) becomes unschedulable now.
        let mut pod = json!({"status": {"conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": old}
        ]}});
        mark_unschedulable(&mut pod, "0/4 nodes");
        assert_ne!(scheduled(&pod)["lastTransitionTime"], json!(old));
        let mut fresh = json!({});
        mark_unschedulable(&mut fresh, "0/1 nodes");
        assert_eq!(scheduled(&fresh)["status"], "False");
        assert!(scheduled(&fresh)["lastTransitionTime"].is_string());
    }
}
