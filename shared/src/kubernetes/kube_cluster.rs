//! [`Cluster`] over kube-rs: rate-limited, transient failures retried with
//! backoff, read-modify-write conflicts (409) retried from a fresh read.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Mutex;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Event, Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams};
use serde::de::DeserializeOwned;
use serde_json::json;

use super::client::ClientSource;
use super::cluster::{Cluster, ClusterError, EvictionOutcome, NodeUpdate};
use super::decode;
use super::events::EventSpec;
use super::pages::{ListHead, ListText, Paged, joined, read_page, unreadable_page};
use super::pods;
use super::retry::{DEFAULT_BURST, DEFAULT_QPS, RateLimiter, RetryPolicy, is_transient};
use crate::apis::nodeclaim::NodeClaimObject;
use crate::apis::{EC2NodeClass, NodePool};
use crate::settings::{SettingError, SettingProblem, Settings};

/// Names the EKS cluster the functions manage.
pub const CLUSTER_NAME_ENV: &str = "NODESMITH_CLUSTER_NAME";
/// Overrides the cluster with a plain API server URL (local tests).
pub const KUBE_URL_ENV: &str = "NODESMITH_KUBE_URL";
/// The bearer token sent to [`KUBE_URL_ENV`]'s server, if any (the local test
/// server takes `nodesmith-lambda` as the functions' RBAC identity).
pub const KUBE_TOKEN_ENV: &str = "NODESMITH_KUBE_TOKEN";
/// Requests per second each invocation's client may send (Karpenter's
/// setting of the same name and default, 200).
pub const KUBE_QPS_ENV: &str = "KUBE_CLIENT_QPS";
/// The client's burst above [`KUBE_QPS_ENV`] (Karpenter's name and default, 300).
pub const KUBE_BURST_ENV: &str = "KUBE_CLIENT_BURST";

/// Objects asked for per list request (client-go's pager asks for 500).
pub const LIST_PAGE_SIZE: u32 = 500;

/// How many times a paged list starts again after its continue token expired.
const LIST_RESTARTS: usize = 3;

/// The Kubernetes adapter used by the functions.
pub struct KubeCluster {
    source: ClientSource,
    limiter: RateLimiter,
    retry: RetryPolicy,
    /// Objects (uid, resourceVersion) already given a `FailedToDecode` Event
    /// by this adapter: one per version, not one per solve.
    undecodable_reported: Mutex<BTreeSet<(String, String)>>,
}

/// What one attempt of a read-modify-write produced.
enum Step<T> {
    Done(T),
    Conflict,
}

impl KubeCluster {
    /// An adapter over any client source, with default rate limit and retries.
    pub fn new(source: ClientSource) -> Self {
        KubeCluster {
            source,
            limiter: RateLimiter::default(),
            retry: RetryPolicy::default(),
            undecodable_reported: Mutex::default(),
        }
    }

    /// An adapter over one fixed client.
    pub fn from_client(client: kube::Client) -> Self {
        Self::new(ClientSource::Fixed(client))
    }

    /// An adapter for an EKS cluster, authenticated with the SDK config's credentials.
    pub fn for_eks(config: aws_config::SdkConfig, cluster: &str) -> Self {
        Self::new(ClientSource::Eks(Box::new(super::client::EksClients::new(
            config, cluster,
        ))))
    }

    /// The adapter a function builds at start-up: a plain URL from
    /// `NODESMITH_KUBE_URL` when set (local runs against the test server),
    /// with the bearer token in `NODESMITH_KUBE_TOKEN` if that is set, else
    /// the EKS cluster named by `NODESMITH_CLUSTER_NAME`.
    pub fn from_env(config: aws_config::SdkConfig) -> Result<Self, super::client::ClientError> {
        Self::from_settings(config, &Settings::from_env())
    }

    /// [`KubeCluster::from_env`] with the variables read through `get`.
    pub fn from_lookup(
        config: aws_config::SdkConfig,
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, super::client::ClientError> {
        Self::from_settings(config, &Settings::new(get))
    }

    /// [`KubeCluster::from_env`] from any settings.
    pub fn from_settings(
        config: aws_config::SdkConfig,
        settings: &Settings<impl Fn(&str) -> Option<String>>,
    ) -> Result<Self, super::client::ClientError> {
        // Karpenter's rate: a sweep at thousands of nodes sends thousands of
        // requests (a taint per disruption, an eviction per pod); beyond the
        // cluster's share, priority and fairness answers 429 and we back off.
        let qps = settings.parsed(KUBE_QPS_ENV, DEFAULT_QPS)?;
        let burst = settings.parsed(KUBE_BURST_ENV, DEFAULT_BURST)?;
        let rated = |cluster: Self| cluster.with_rate_limit(f64::from(qps.get()), burst.get());
        if let Some(url) = settings.optional(KUBE_URL_ENV) {
            let token = settings.optional(KUBE_TOKEN_ENV);
            return Ok(rated(Self::from_client(super::client::client_for(
                &url,
                None,
                token.as_deref(),
            )?)));
        }
        let name = settings.optional(CLUSTER_NAME_ENV).ok_or_else(|| {
            SettingError::new(
                CLUSTER_NAME_ENV,
                SettingProblem::MissingEither {
                    meaning: "the EKS cluster",
                    instead: "NODESMITH_KUBE_URL (a plain API server URL)",
                },
            )
        })?;
        Ok(rated(Self::for_eks(config, &name)))
    }

    /// Replaces the retry policy.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Replaces the rate limit.
    pub fn with_rate_limit(mut self, qps: f64, burst: u32) -> Self {
        self.limiter = RateLimiter::new(qps, burst);
        self
    }

    /// Replaces the status subresource of the cluster-scoped `object` named
    /// `name` (a `kind` for logs); false when it does not exist.
    async fn replace_status<K>(&self, kind: &str, name: &str, object: &K) -> Result<bool, ClusterError>
    where
        K: kube::Resource<Scope = kube::core::ClusterResourceScope, DynamicType = ()>
            + serde::Serialize
            + DeserializeOwned
            + Clone
            + std::fmt::Debug,
    {
        self.call(&format!("replace status of {kind} {name}"), |c| async move {
            get_opt(
                Api::<K>::all(c)
                    .replace_status(name, &PostParams::default(), object)
                    .await,
            )
            .map(|o| o.is_some())
        })
        .await
    }

    /// One cluster-scoped object of kind `K` by name; None when it does not exist.
    async fn get<K>(&self, kind: &str, name: &str) -> Result<Option<K>, ClusterError>
    where
        K: kube::Resource<Scope = kube::core::ClusterResourceScope, DynamicType = ()>
            + DeserializeOwned
            + Clone
            + std::fmt::Debug,
    {
        self.call(&format!("get {kind} {name}"), |c| async move {
            get_opt(Api::<K>::all(c).get(name).await)
        })
        .await
    }

    /// Runs one API call with rate limiting and retries of transient failures.
    async fn call<T, F, Fut>(&self, op: &str, f: F) -> Result<T, ClusterError>
    where
        F: Fn(kube::Client) -> Fut,
        Fut: Future<Output = Result<T, kube::Error>>,
    {
        self.call_limited(op, true, f).await
    }

    /// [`KubeCluster::call`], taking a token of the rate limit only when
    /// `limited` (a list's further pages ride on its first page's token).
    async fn call_limited<T, F, Fut>(&self, op: &str, limited: bool, f: F) -> Result<T, ClusterError>
    where
        F: Fn(kube::Client) -> Fut,
        Fut: Future<Output = Result<T, kube::Error>>,
    {
        let attempts = self.retry.attempts.max(1);
        let mut attempt = 0;
        let mut reauthenticated = false;
        loop {
            if limited {
                self.limiter.acquire().await;
            }
            let client = self.source.client().await?;
            match f(client).await {
                Ok(v) => return Ok(v),
                // A rejected token (clock skew, revoked session): mint a new one, once.
                Err(kube::Error::Api(s)) if s.code == 401 && !reauthenticated => {
                    tracing::warn!(op, "the API server rejected our credentials; re-authenticating");
                    self.source.invalidate().await;
                    reauthenticated = true;
                }
                Err(e) if is_transient(&e) && attempt + 1 < attempts => {
                    let delay = self.retry.delay(attempt);
                    tracing::debug!(op, attempt, ?delay, error = %crate::telemetry::causes(&e), "transient Kubernetes API failure; retrying");
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
                Err(e) => return Err(ClusterError::from_kube(op, e)),
            }
        }
    }

    /// Repeats a read-modify-write while the server answers 409 Conflict.
    async fn with_conflict_retry<T, F, Fut>(&self, op: &str, f: F) -> Result<T, ClusterError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<Step<T>, ClusterError>>,
    {
        let attempts = self.retry.attempts.max(1);
        for attempt in 0..attempts {
            match f().await? {
                Step::Done(v) => return Ok(v),
                Step::Conflict => {
                    tracing::debug!(op, attempt, "conflict; re-reading and retrying");
                    tokio::time::sleep(self.retry.delay(attempt)).await;
                }
            }
        }
        Err(ClusterError::Api {
            op: op.to_string(),
            code: 409,
            reason: "Conflict".into(),
            message: format!("still conflicting after {attempts} attempts"),
        })
    }

    /// Lists every object, [`LIST_PAGE_SIZE`] per request as client-go's pager
    /// does (a whole cluster's pods in one answer is more than a function's
    /// memory), each page retried on its own. A continue token the server has
    /// compacted away (410) starts the list again, a few times. Each page is
    /// read into objects on a blocking thread while the next one is fetched
    /// (at 155,000 pods the reading is a third of the list's time, and the
    /// fetching mostly waits on the server). Managed fields are dropped as
    /// pages are read: nothing reads them, and they are often half an object.
    /// The list takes one token of the rate limit, as an informer's list is
    /// one request: its pages follow one another, never two in flight, and
    /// at 310 pages a token each held a 155,000-pod read to the limit's pace.
    async fn list_all<K>(&self, op: &str, lp: ListParams) -> Result<Vec<K>, ClusterError>
    where
        K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
    {
        Ok(self.list_pages(op, lp, |_| ()).await?.into_vec())
    }

    /// [`Self::list_all`], its pages kept apart ([`Paged`]) and each object
    /// `trimmed` as its page is read.
    async fn list_pages<K>(&self, op: &str, lp: ListParams, trimmed: fn(&mut K)) -> Result<Paged<K>, ClusterError>
    where
        K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
    {
        let mut restarts = 0;
        'list: loop {
            let mut items = Vec::new();
            let mut token: Option<String> = None;
            let mut reading: Option<tokio::task::JoinHandle<Result<Vec<K>, ClusterError>>> = None;
            loop {
                let mut page_params = lp.clone().limit(LIST_PAGE_SIZE);
                if let Some(t) = &token {
                    page_params = page_params.continue_token(t);
                }
                let page = self
                    .call_limited(op, token.is_none(), |c| {
                        let lp = page_params.clone();
                        async move { Api::<K>::all(c).list_text(&lp).await }
                    })
                    .await;
                let text = match page {
                    Err(e) if e.code() == Some(410) && token.is_some() && restarts < LIST_RESTARTS => {
                        restarts += 1;
                        tracing::info!(
                            op,
                            restarts,
                            "the list's continue token expired; listing again from the start"
                        );
                        continue 'list;
                    }
                    other => other?,
                };
                // Only the list's metadata now (the items are skipped over, not built).
                let head: ListHead = serde_json::from_str(&text).map_err(|e| unreadable_page(op, &e))?;
                let op_owned = op.to_string();
                let previous = reading.replace(tokio::task::spawn_blocking(move || {
                    read_page::<K>(&op_owned, &text, trimmed)
                }));
                if let Some(previous) = previous {
                    items.push(joined(op, previous.await)?);
                }
                match head.metadata.continue_.filter(|t| !t.is_empty()) {
                    Some(t) => token = Some(t),
                    None => {
                        if let Some(last) = reading {
                            items.push(joined(op, last.await)?);
                        }
                        return Ok(Paged::new(items));
                    }
                }
            }
        }
    }

    /// Reads each listed object on its own: those that do not read as `K`
    /// are logged, given a Warning Event (once per version) and left out.
    async fn keep_readable<K>(&self, raw: Vec<decode::Raw<K>>) -> Vec<K>
    where
        K: kube::Resource<DynamicType = ()> + DeserializeOwned,
    {
        let (api_version, kind) = (K::api_version(&()), K::kind(&()));
        let values = raw.into_iter().map(|r| r.value).collect();
        let (good, bad) = decode::decode_each::<K>(values, &api_version, &kind);
        for u in bad {
            let name = u.object.name.clone().unwrap_or_default();
            tracing::error!(kind = %kind, name = %name, error = %u.error, "cannot read this object; it is left out until fixed");
            let version = (
                u.object.uid.clone().unwrap_or_else(|| name.clone()),
                u.object.resource_version.clone().unwrap_or_default(),
            );
            let first = self
                .undecodable_reported
                .lock()
                .map(|mut seen| seen.insert(version))
                .unwrap_or(true);
            if first && let Err(e) = self.emit_event(&EventSpec::failed_to_decode(u.object, &u.error)).await {
                tracing::warn!(error = %crate::telemetry::causes(&e), "FailedToDecode event not recorded");
            }
        }
        good
    }

    /// Sets a node's taints, guarded by the resourceVersion read with them.
    async fn edit_taints(&self, node: &str, add: bool) -> Result<bool, ClusterError> {
        let op = format!("{} node {node}", if add { "taint" } else { "untaint" });
        self.with_conflict_retry(&op, || async {
            let Some(current) = self.node(node).await? else {
                return Err(ClusterError::Api {
                    op: op.clone(),
                    code: 404,
                    reason: "NotFound".into(),
                    message: format!("node {node:?} not found"),
                });
            };
            let mut taints = current.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
            let has = taints.iter().any(|t| t.key == pods::DISRUPTED_TAINT_KEY);
            if has == add {
                return Ok(Step::Done(false));
            }
            if add {
                taints.push(pods::disrupted_taint());
            } else {
                taints.retain(|t| t.key != pods::DISRUPTED_TAINT_KEY);
            }
            // Merge patches replace lists whole; the resourceVersion makes that safe.
            let patch =
                json!({"metadata": {"resourceVersion": current.metadata.resource_version}, "spec": {"taints": taints}});
            let result = self
                .call(&op, |c| {
                    let patch = patch.clone();
                    async move {
                        Api::<Node>::all(c)
                            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
                            .await
                    }
                })
                .await;
            match result {
                Ok(_) => Ok(Step::Done(true)),
                Err(e) if e.code() == Some(409) => Ok(Step::Conflict),
                Err(e) => Err(e),
            }
        })
        .await
    }
}

fn get_opt<T>(r: Result<T, kube::Error>) -> Result<Option<T>, kube::Error> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether a 429 on eviction comes from a PodDisruptionBudget (as opposed to throttling).
fn is_pdb_refusal(s: &kube::core::Status) -> bool {
    s.code == 429
        && (s
            .details
            .as_ref()
            .is_some_and(|d| d.causes.iter().any(|c| c.reason == "DisruptionBudget"))
            || s.message.contains("disruption budget"))
}

impl Cluster for KubeCluster {
    async fn pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>, ClusterError> {
        self.call(&format!("get pod {namespace}/{name}"), |c| async move {
            get_opt(Api::<Pod>::namespaced(c, namespace).get(name).await)
        })
        .await
    }

    async fn pods(&self) -> Result<Paged<Pod>, ClusterError> {
        self.list_pages::<Pod>("list pods", ListParams::default(), pods::trim_unread)
            .await
    }

    async fn pending_pods(&self) -> Result<Vec<Pod>, ClusterError> {
        let pods: Vec<Pod> = self
            .list_all(
                "list pending pods",
                ListParams::default().fields("spec.nodeName=,status.phase=Pending"),
            )
            .await?;
        Ok(pods.into_iter().filter(pods::is_provisionable).collect())
    }

    async fn pods_on_node(&self, node: &str) -> Result<Vec<Pod>, ClusterError> {
        self.list_all(
            &format!("list pods on node {node}"),
            ListParams::default().fields(&format!("spec.nodeName={node}")),
        )
        .await
    }

    async fn nodes(&self) -> Result<Vec<Node>, ClusterError> {
        self.list_all("list nodes", ListParams::default()).await
    }

    async fn node(&self, name: &str) -> Result<Option<Node>, ClusterError> {
        self.call(&format!("get node {name}"), |c| async move {
            get_opt(Api::<Node>::all(c).get(name).await)
        })
        .await
    }

    async fn daemon_sets(&self) -> Result<Vec<DaemonSet>, ClusterError> {
        self.list_all("list daemonsets", ListParams::default()).await
    }

    async fn pod_disruption_budgets(&self) -> Result<Vec<PodDisruptionBudget>, ClusterError> {
        self.list_all("list poddisruptionbudgets", ListParams::default()).await
    }

    async fn persistent_volumes(&self) -> Result<Vec<PersistentVolume>, ClusterError> {
        self.list_all("list persistentvolumes", ListParams::default()).await
    }

    async fn persistent_volume_claims(&self) -> Result<Vec<PersistentVolumeClaim>, ClusterError> {
        self.list_all("list persistentvolumeclaims", ListParams::default())
            .await
    }

    async fn storage_classes(&self) -> Result<Vec<StorageClass>, ClusterError> {
        self.list_all("list storageclasses", ListParams::default()).await
    }

    async fn namespaces(&self) -> Result<Vec<Namespace>, ClusterError> {
        self.list_all("list namespaces", ListParams::default()).await
    }

    async fn node_pools(&self) -> Result<Vec<NodePool>, ClusterError> {
        self.list_all("list nodepools", ListParams::default()).await
    }

    async fn node_classes(&self) -> Result<Vec<EC2NodeClass>, ClusterError> {
        self.list_all("list ec2nodeclasses", ListParams::default()).await
    }

    async fn usable_node_pools(&self) -> Result<Vec<NodePool>, ClusterError> {
        let raw = self.list_all("list nodepools", ListParams::default()).await?;
        Ok(self.keep_readable(raw).await)
    }

    async fn usable_node_classes(&self) -> Result<Vec<EC2NodeClass>, ClusterError> {
        let raw = self.list_all("list ec2nodeclasses", ListParams::default()).await?;
        Ok(self.keep_readable(raw).await)
    }

    async fn node_class(&self, name: &str) -> Result<Option<EC2NodeClass>, ClusterError> {
        self.get::<EC2NodeClass>("ec2nodeclass", name).await
    }

    async fn node_pool(&self, name: &str) -> Result<Option<NodePool>, ClusterError> {
        self.get::<NodePool>("nodepool", name).await
    }

    async fn replace_node_class_status(&self, class: &EC2NodeClass) -> Result<bool, ClusterError> {
        self.replace_status::<EC2NodeClass>("ec2nodeclass", class.name(), class)
            .await
    }

    async fn replace_node_pool_status(&self, pool: &NodePool) -> Result<bool, ClusterError> {
        self.replace_status::<NodePool>("nodepool", pool.name(), pool).await
    }

    async fn node_claim_objects(&self) -> Result<Vec<NodeClaimObject>, ClusterError> {
        let selector = format!("{}={}", crate::labels::MANAGED_BY_LABEL, crate::labels::MANAGED_BY);
        self.list_all("list nodeclaims", ListParams::default().labels(&selector))
            .await
    }

    async fn node_claim_object(&self, name: &str) -> Result<Option<NodeClaimObject>, ClusterError> {
        self.get::<NodeClaimObject>("nodeclaim", name).await
    }

    async fn create_node_claim_object(&self, object: &NodeClaimObject) -> Result<bool, ClusterError> {
        let name = object.metadata.name.clone().unwrap_or_default();
        let created = self
            .call(&format!("create nodeclaim {name}"), |c| async move {
                match Api::<NodeClaimObject>::all(c)
                    .create(&PostParams::default(), object)
                    .await
                {
                    Ok(o) => Ok(Some(o)),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(None),
                    Err(e) => Err(e),
                }
            })
            .await?;
        let Some(mut created) = created else {
            return Ok(false);
        };
        created.status = object.status.clone();
        self.replace_node_claim_object_status(&created).await?;
        Ok(true)
    }

    async fn replace_node_claim_object(
        &self,
        object: &NodeClaimObject,
    ) -> Result<Option<NodeClaimObject>, ClusterError> {
        let name = object.metadata.name.clone().unwrap_or_default();
        self.call(&format!("replace nodeclaim {name}"), |c| {
            let name = name.clone();
            async move {
                get_opt(
                    Api::<NodeClaimObject>::all(c)
                        .replace(&name, &PostParams::default(), object)
                        .await,
                )
            }
        })
        .await
    }

    async fn replace_node_claim_object_status(&self, object: &NodeClaimObject) -> Result<bool, ClusterError> {
        self.replace_status::<NodeClaimObject>("nodeclaim", object.metadata.name.as_deref().unwrap_or_default(), object)
            .await
    }

    async fn release_node_claim_object(&self, name: &str) -> Result<bool, ClusterError> {
        let op = format!("release nodeclaim {name}");
        self.with_conflict_retry(&op, || async {
            let current = self.get::<NodeClaimObject>("nodeclaim", name).await?;
            let Some(mut current) = current else {
                return Ok(Step::Done(false));
            };
            let deleting = current.metadata.deletion_timestamp.is_some();
            let finalizers = current.metadata.finalizers.take().unwrap_or_default();
            let kept: Vec<String> = finalizers
                .iter()
                .filter(|f| *f != crate::labels::TERMINATION_FINALIZER)
                .cloned()
                .collect();
            if kept != finalizers {
                current.metadata.finalizers = Some(kept);
                let current = &current;
                let written = self
                    .call(&format!("replace nodeclaim {name}"), |c| async move {
                        get_opt(
                            Api::<NodeClaimObject>::all(c)
                                .replace(name, &PostParams::default(), current)
                                .await,
                        )
                    })
                    .await;
                match written {
                    // Gone once the finalizer came off a deleting object.
                    Ok(_) if deleting => return Ok(Step::Done(true)),
                    Ok(_) => {}
                    Err(e) if e.code() == Some(409) => return Ok(Step::Conflict),
                    Err(e) => return Err(e),
                }
            }
            if !deleting {
                self.call(&format!("delete nodeclaim {name}"), |c| async move {
                    match Api::<NodeClaimObject>::all(c)
                        .delete(name, &DeleteParams::default())
                        .await
                    {
                        Ok(_) => Ok(()),
                        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                        Err(e) => Err(e),
                    }
                })
                .await?;
            }
            Ok(Step::Done(true))
        })
        .await
    }

    async fn taint_disrupted(&self, node: &str) -> Result<bool, ClusterError> {
        self.edit_taints(node, true).await
    }

    async fn untaint_disrupted(&self, node: &str) -> Result<bool, ClusterError> {
        self.edit_taints(node, false).await
    }

    async fn evict(&self, pod: &Pod) -> Result<EvictionOutcome, ClusterError> {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let op = format!("evict pod {ns}/{name}");
        let outcome = self
            .call(&op, |c| {
                let (ns, name) = (ns.clone(), name.clone());
                async move {
                    match Api::<Pod>::namespaced(c, &ns)
                        .evict(&name, &EvictParams::default())
                        .await
                    {
                        Ok(_) => Ok(EvictionOutcome::Evicted),
                        // A PDB's refusal is an answer, not a failure to retry here.
                        Err(kube::Error::Api(s)) if is_pdb_refusal(&s) => {
                            let why = s
                                .details
                                .as_ref()
                                .and_then(|d| d.causes.first())
                                .map(|c| c.message.clone())
                                .filter(|m| !m.is_empty());
                            Ok(EvictionOutcome::Blocked {
                                reason: why.unwrap_or(s.message.clone()),
                            })
                        }
                        Err(kube::Error::Api(s)) if s.code == 404 => Ok(EvictionOutcome::Gone),
                        Err(e) => Err(e),
                    }
                }
            })
            .await?;
        tracing::info!(pod = %format!("{ns}/{name}"), ?outcome, "eviction");
        Ok(outcome)
    }

    async fn update_node(&self, name: &str, update: &NodeUpdate) -> Result<bool, ClusterError> {
        let op = format!("update node {name}");
        self.with_conflict_retry(&op, || async {
            let Some(current) = self.node(name).await? else {
                return Ok(Step::Done(false));
            };
            if update.is_satisfied_by(&current) {
                return Ok(Step::Done(true));
            }
            let taints: Vec<_> = current
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default()
                .into_iter()
                .filter(|t| !update.remove_taints.contains(&t.key))
                .collect();
            // Maps merge key by key; the taint list is replaced whole, which the
            // resourceVersion makes safe against a concurrent writer.
            let mut patch = json!({
                "metadata": {
                    "resourceVersion": current.metadata.resource_version,
                    "labels": update.labels,
                    "annotations": update.annotations,
                },
                "spec": {"taints": taints},
            });
            let had = current.metadata.finalizers.clone().unwrap_or_default();
            let mut finalizers: Vec<String> = had
                .iter()
                .filter(|f| !update.remove_finalizers.contains(f))
                .cloned()
                .collect();
            // None added to a Node being deleted: the API server refuses that.
            let deleting = current.metadata.deletion_timestamp.is_some();
            for f in &update.finalizers {
                if !deleting && !finalizers.contains(f) {
                    finalizers.push(f.clone());
                }
            }
            // The list goes only when it changes: a Node being deleted refuses any
            // write that would add a finalizer, and this one adds none it had.
            if finalizers != had {
                patch["metadata"]["finalizers"] = json!(finalizers);
            }
            // A merge patch removes a key whose value is null.
            for k in &update.remove_labels {
                patch["metadata"]["labels"][k] = serde_json::Value::Null;
            }
            let result = self
                .call(&op, |c| {
                    let patch = patch.clone();
                    async move {
                        Api::<Node>::all(c)
                            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                            .await
                    }
                })
                .await;
            match result {
                Ok(_) => Ok(Step::Done(true)),
                Err(e) if e.code() == Some(409) => Ok(Step::Conflict),
                Err(e) if e.code() == Some(404) => Ok(Step::Done(false)),
                Err(e) => Err(e),
            }
        })
        .await
    }

    async fn delete_pod(&self, pod: &Pod) -> Result<bool, ClusterError> {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        self.call(&format!("delete pod {ns}/{name}"), |c| {
            let (ns, name) = (ns.clone(), name.clone());
            async move {
                match Api::<Pod>::namespaced(c, &ns)
                    .delete(&name, &DeleteParams::default())
                    .await
                {
                    Ok(_) => Ok(true),
                    Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
                    Err(e) => Err(e),
                }
            }
        })
        .await
    }

    async fn delete_node(&self, name: &str, uid: Option<&str>) -> Result<bool, ClusterError> {
        let params = DeleteParams {
            preconditions: uid.map(|u| kube::api::Preconditions {
                uid: Some(u.to_string()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let params = &params;
        let held = self
            .call(&format!("delete node {name}"), |c| async move {
                match Api::<Node>::all(c).delete(name, params).await {
                    // The object back: finalizers hold it; is ours among them?
                    Ok(answer) => Ok(Some(answer.left().is_some_and(|node| {
                        node.metadata
                            .finalizers
                            .is_some_and(|f| f.iter().any(|f| f == crate::labels::TERMINATION_FINALIZER))
                    }))),
                    Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
                    // The precondition failed: the Node was recreated under this name.
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(None),
                    Err(e) => Err(e),
                }
            })
            .await?;
        match held {
            None => Ok(false),
            // nodesmith deletes a Node only once its capacity is given up: the
            // termination finalizer has nothing left to wait for.
            Some(true) => {
                let release = NodeUpdate {
                    remove_finalizers: vec![crate::labels::TERMINATION_FINALIZER.to_string()],
                    ..NodeUpdate::default()
                };
                self.update_node(name, &release).await?;
                Ok(true)
            }
            Some(false) => Ok(true),
        }
    }

    async fn emit_event(&self, event: &EventSpec) -> Result<(), ClusterError> {
        let ev: Event = event.to_event(jiff::Timestamp::now());
        let ns = ev.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        self.call(
            &format!(
                "record event {} on {}",
                event.reason,
                event.object.name.as_deref().unwrap_or("")
            ),
            |c| {
                let (ev, ns) = (ev.clone(), ns.clone());
                async move {
                    match Api::<Event>::namespaced(c, &ns)
                        .create(&PostParams::default(), &ev)
                        .await
                    {
                        Ok(_) => Ok(()),
                        // The same event from a retried request: already recorded.
                        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                        Err(e) => Err(e),
                    }
                }
            },
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adapter(pairs: &[(&str, &str)]) -> Result<KubeCluster, super::super::client::ClientError> {
        let env: std::collections::BTreeMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        KubeCluster::from_lookup(aws_config::SdkConfig::builder().build(), |k| env.get(k).cloned())
    }

    #[tokio::test]
    async fn the_client_rate_is_karpenters_setting_and_bad_values_are_named() {
        let url = (KUBE_URL_ENV, "http://127.0.0.1:9");
        assert!(adapter(&[url]).is_ok());
        assert!(adapter(&[url, (KUBE_QPS_ENV, "20"), (KUBE_BURST_ENV, "40")]).is_ok());
        for (name, value) in [(KUBE_QPS_ENV, "0"), (KUBE_QPS_ENV, "fast"), (KUBE_BURST_ENV, "-1")] {
            let err = adapter(&[url, (name, value)]).err().expect("refused");
            assert!(err.to_string().contains(name), "{name}={value}: {err}");
        }
    }
}
