//! The local stack the lifecycle and interruption tests share: moto (DynamoDB,
//! SQS, EC2) and the Kubernetes API test server with strict kubelets, driven
//! through provision → launch → kubelets → sweep. Used by the `stack` test
//! executable (`tests/stack.rs`): lifecycle, interruption and the binaries' tests.

// Shared by several test modules, and not every item is used by each set of them.
#![allow(dead_code)]

use std::time::Duration;

use aws_lambda_events::sqs::SqsEvent;
use k8s_openapi::api::core::v1::Node;
use nodesmith::ec2::Instances;
use nodesmith::interruption::handler::{InterruptConfig, Interrupter};
use nodesmith::kubernetes::KubeCluster;
use nodesmith::kubernetes::retry::RetryPolicy;
use nodesmith::launch::batch;
use nodesmith::lifecycle::LifecycleConfig;
use nodesmith::nodeclaim::{NodeClaim, Phase};
use nodesmith::provisioning::{ProvisionConfig, ProvisionOutcome, Provisioner};
use nodesmith::state::StateStore;
use nodesmith::sweep::{SweepConfig, Sweeper};
use nodesmith_tests::kube_server::{KubeServer, KubeletTiming, Kubelets};
use nodesmith_tests::moto::{Moto, moto};
use nodesmith_tests::sqs;
use serde_json::json;

use crate::launch_fixtures::{CLUSTER, DISCOVERY, launcher_with, store, world};

/// Lifecycle settings for tests: every wait in seconds or less.
pub fn fast() -> LifecycleConfig {
    LifecycleConfig {
        launch_timeout: Duration::from_secs(60),
        registration_timeout: Duration::from_secs(60),
        relaunch_after: Duration::from_secs(60),
        leak_window: Duration::from_secs(60),
        liveness_grace: Duration::ZERO,
        batch_window: Duration::ZERO,
        resolve_every: Duration::from_secs(60),
        ..LifecycleConfig::default()
    }
}

pub struct Stack {
    pub m: Moto,
    pub kube: KubeServer,
    pub store: StateStore,
    pub sqs: aws_sdk_sqs::Client,
    pub ec2: aws_sdk_ec2::Client,
    pub launch_queue: String,
    pub pending_queue: String,
    pub kubelets: Kubelets,
}

impl Drop for Stack {
    /// Every test on the stack runs nodesmith as the functions: a call their
    /// ClusterRole does not grant fails the test, even if the code shrugged it off.
    fn drop(&mut self) {
        let denials = self.kube.denials();
        if !std::thread::panicking() && !denials.is_empty() {
            panic!("the functions' RBAC refused calls: {denials:#?}");
        }
    }
}

/// An SQS event of these bodies (message ids `m0`, `m1`, ...).
pub fn event(bodies: Vec<String>) -> SqsEvent {
    sqs::event(bodies.into_iter().enumerate().map(|(i, b)| (format!("m{i}"), b)))
}

pub fn pod_ref(name: &str) -> String {
    json!({"namespace": "default", "name": name, "uid": format!("uid-{name}"), "resourceVersion": "1"}).to_string()
}

impl Stack {
    /// A cluster with one pool (m5/c5, on-demand, `cpu_limit`), its class, and
    /// `pods` pending pods of 900m each (two fit on one 2-vCPU node); nodes
    /// join at once and are Ready after 200 ms.
    pub async fn new(cpu_limit: &str, pods: usize) -> Stack {
        let m = moto().await;
        world(&m).await;
        let conf = m.sdk_config().await;
        let client = aws_sdk_sqs::Client::new(&conf);
        let urls = [
            sqs::create_queue(&client, "launch").await,
            sqs::create_queue(&client, "pending-pods").await,
        ];
        let kube = KubeServer::start().await;
        kube.apply(
            &json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"}, "spec": {
                "template": {
                    "metadata": {"labels": {"team": "web"}},
                    "spec": {
                        "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
                        "requirements": [
                            {"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["m5", "c5"]},
                            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}
                        ]
                    }
                },
                "limits": {"cpu": cpu_limit}
            }}),
        )
        .unwrap();
        kube.apply(&json!({"apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "default"}, "spec": {
            "role": "KarpenterNodeRole-demo",
            "amiSelectorTerms": [{"alias": "al2023@latest"}],
            "subnetSelectorTerms": [{"tags": {DISCOVERY: "*"}}],
            "securityGroupSelectorTerms": [{"tags": {DISCOVERY: CLUSTER}}]
        }}))
        .unwrap();
        for i in 0..pods {
            kube.apply(&web_pod(&format!("web-{i}"))).unwrap();
        }
        kube.schedule();
        Stack {
            store: store(&m).await,
            ec2: aws_sdk_ec2::Client::new(&conf),
            m,
            kube,
            sqs: client,
            launch_queue: urls[0].clone(),
            pending_queue: urls[1].clone(),
            kubelets: Kubelets::new(KubeletTiming::millis(0, 0)),
        }
    }

    pub fn cluster(&self) -> KubeCluster {
        KubeCluster::from_client(self.kube.lambda_client()).with_retry(RetryPolicy {
            attempts: 3,
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(5),
        })
    }

    pub fn provisioner(&self) -> Provisioner<KubeCluster> {
        let mut config = ProvisionConfig::new(&self.launch_queue);
        config.lease_wait = Duration::from_secs(30);
        Provisioner::new(self.cluster(), self.store.clone(), self.sqs.clone(), config)
    }

    pub fn sweeper(&self, lifecycle: LifecycleConfig) -> Sweeper<KubeCluster> {
        Sweeper::new(
            self.cluster(),
            self.store.clone(),
            Instances::new(self.ec2.clone(), CLUSTER),
            self.sqs.clone(),
            self.sweep_config(lifecycle),
        )
    }

    /// The configuration of [`Stack::sweeper`], for a sweeper over other clients (a proxy's).
    pub fn sweep_config(&self, lifecycle: LifecycleConfig) -> SweepConfig {
        let mut config = SweepConfig::from_lookup(|_| None).unwrap();
        config.lifecycle = lifecycle;
        config.pending_queue_url = Some(self.pending_queue.clone());
        config.launch_queue_url = Some(self.launch_queue.clone());
        // The budget stays the default (60 s), far above what a sweep here
        // takes: with a short one, a loaded machine left steps to the next
        // sweep, and a test counting on one sweep failed.
        // A sweep that died frees the lease within a second here.
        config.lease = Duration::from_secs(1);
        config
    }

    /// What the forwarder would send for these pods, handled by `provision`.
    pub async fn provision(&self, pods: &[&str]) -> ProvisionOutcome {
        self.provisioner()
            .handle(&event(pods.iter().map(|p| pod_ref(p)).collect()))
            .await
    }

    /// Runs `launch` on every queued launch request.
    pub async fn launch_all(&self) {
        let bodies = self.drain(&self.launch_queue).await;
        let launcher = launcher_with(&self.m, self.m.endpoint(), &self.kube, Some(self.pending_queue.clone())).await;
        let (response, results) = batch::handle(&launcher, &event(bodies)).await;
        assert!(response.batch_item_failures.is_empty(), "{results:?}");
    }

    /// Receives and deletes everything on a queue.
    pub async fn drain(&self, url: &str) -> Vec<String> {
        sqs::drain(&self.sqs, url).await
    }

    /// Everything waiting on the pending-pods queue (solve requests), handled by `provision`.
    pub async fn provision_queued(&self) -> (Vec<String>, ProvisionOutcome) {
        let bodies = self.drain(&self.pending_queue).await;
        let outcome = self.provisioner().handle(&event(bodies.clone())).await;
        (bodies, outcome)
    }

    pub async fn kubelet_step(&self) {
        let report = self
            .kubelets
            .step(&self.kube, &self.ec2, nodesmith::catalog::builtin().unwrap())
            .await
            .unwrap();
        assert!(report.refused.is_empty(), "a kubelet refused to start: {report:?}");
    }

    pub async fn claims(&self) -> Vec<NodeClaim> {
        self.store.list_node_claims().await.unwrap()
    }

    /// Every Node.
    pub async fn nodes(&self) -> Vec<Node> {
        self.kube.nodes()
    }

    /// States of the instances EC2 knows, by id.
    pub async fn instance_states(&self) -> std::collections::BTreeMap<String, String> {
        let out = self.ec2.describe_instances().send().await.unwrap();
        out.reservations()
            .iter()
            .flat_map(|r| r.instances())
            .map(|i| {
                (
                    i.instance_id().unwrap_or_default().to_string(),
                    i.state()
                        .and_then(|s| s.name())
                        .map(|n| n.as_str().to_string())
                        .unwrap_or_default(),
                )
            })
            .collect()
    }
}

/// A pod of the `web` app (900m, 1Gi: two fit on one 2-vCPU node).
pub fn web_pod(name: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"), "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "web", "resources": {"requests": {"cpu": "900m", "memory": "1Gi"}}}]}})
}

/// A budget that lets no `app=web` pod go (two must stay available).
pub fn web_pdb() -> serde_json::Value {
    json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web", "namespace": "default"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}})
}

pub fn taint_keys(n: &Node) -> Vec<String> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|t| t.key)
        .collect()
}

pub fn pods_on(kube: &KubeServer, node: &str) -> Vec<String> {
    kube.pods()
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .filter_map(|p| p.metadata.name.clone())
        .collect()
}

pub fn ec2_event(id: &str, detail_type: &str, time: jiff::Timestamp, detail: serde_json::Value) -> String {
    json!({"version": "0", "id": id, "detail-type": detail_type, "source": "aws.ec2", "account": "123456789012",
        "time": nodesmith::interruption::rfc3339(&time), "region": "us-east-1", "resources": [], "detail": detail})
    .to_string()
}

impl Stack {
    pub fn interrupter(&self, configure: impl FnOnce(&mut InterruptConfig)) -> Interrupter<KubeCluster> {
        let mut config = InterruptConfig::new(&self.launch_queue, &self.pending_queue);
        config.drain_budget = Duration::ZERO;
        configure(&mut config);
        Interrupter::new(self.cluster(), self.store.clone(), self.sqs.clone(), config)
    }

    /// The real kubectl as the cluster admin, its caches in a scratch
    /// directory named for `test` (removed by the caller).
    pub fn kubectl(&self, test: &str) -> nodesmith_tests::kubectl::Kubectl {
        let dir = std::env::temp_dir().join(format!("nodesmith-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        self.kube.write_kubeconfig(&dir.join("kubeconfig")).unwrap();
        nodesmith_tests::kubectl::Kubectl {
            kubeconfig: dir.join("kubeconfig"),
            dir,
        }
    }

    /// Provisions and launches for these pods; returns the claims, all Launched.
    pub async fn launched(&self, pods: &[&str]) -> Vec<NodeClaim> {
        let outcome = self.provision(pods).await;
        assert!(outcome.failed.is_empty() && !outcome.created.is_empty(), "{outcome:?}");
        self.launch_all().await;
        let claims = self.claims().await;
        assert!(claims.iter().all(|c| c.phase == Phase::Launched), "{claims:?}");
        claims
    }

    /// One initialized node holding both pods; returns its claim.
    pub async fn running_node(&self) -> NodeClaim {
        let claims = self.launched(&["web-0", "web-1"]).await;
        assert_eq!(claims.len(), 1, "{claims:?}");
        let sweeper = self.sweeper(fast());
        for _ in 0..4 {
            self.kubelet_step().await;
            sweeper.run().await.unwrap();
        }
        let claim = self.store.get_node_claim(&claims[0].name).await.unwrap().unwrap();
        assert_eq!(claim.phase, Phase::Initialized, "{claim:?}");
        self.kube.schedule();
        assert_eq!(pods_on(&self.kube, claim.node_name.as_deref().unwrap()).len(), 2);
        claim
    }
}
