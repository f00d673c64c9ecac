//! The `interrupt` handler on the local stack: moto (DynamoDB, SQS, EC2) and
//! the Kubernetes API test server with strict kubelets. A node is launched,
//! registered and filled by provision → launch → kubelets → sweep, then
//! interruption events arrive as SQS records.

mod launch_fixtures;

use std::time::Duration;

use aws_lambda_events::sqs::{SqsEvent, SqsMessage};
use k8s_openapi::api::core::v1::Node;
use launch_fixtures::{CLUSTER, DISCOVERY, launcher_with, store, world};
use nodesmith::ec2::Instances;
use nodesmith::kubernetes::retry::RetryPolicy;
use nodesmith::kubernetes::{Cluster, KubeCluster};
use nodesmith::launch::batch;
use nodesmith::lifecycle::LifecycleConfig;
use nodesmith::nodeclaim::{NodeClaim, Phase};
use nodesmith::provisioning::{Outcome, ProvisionConfig, Provisioner};
use nodesmith::state::StateStore;
use nodesmith::sweep::{SweepConfig, Sweeper};
use nodesmith_tests::kube_server::{KubeServer, KubeletTiming, Kubelets};
use nodesmith_tests::moto::{Moto, moto};
use serde_json::json;

/// Lifecycle settings for tests: every wait in seconds or less.
fn fast() -> LifecycleConfig {
    LifecycleConfig {
        launch_timeout: Duration::from_secs(60),
        registration_timeout: Duration::from_secs(60),
        leak_window: Duration::from_secs(60),
        liveness_grace: Duration::ZERO,
        batch_window: Duration::ZERO,
        resolve_every: Duration::from_secs(60),
    }
}

struct Stack {
    m: Moto,
    kube: KubeServer,
    store: StateStore,
    sqs: aws_sdk_sqs::Client,
    ec2: aws_sdk_ec2::Client,
    launch_queue: String,
    pending_queue: String,
    kubelets: Kubelets,
}

fn event(bodies: Vec<String>) -> SqsEvent {
    let mut e = SqsEvent::default();
    e.records = bodies
        .into_iter()
        .enumerate()
        .map(|(i, body)| {
            let mut m = SqsMessage::default();
            m.message_id = Some(format!("m{i}"));
            m.body = Some(body);
            m
        })
        .collect();
    e
}

fn pod_ref(name: &str) -> String {
    json!({"namespace": "default", "name": name, "uid": format!("uid-{name}"), "resourceVersion": "1"}).to_string()
}

impl Stack {
    /// A cluster with one pool (m5/c5, on-demand, `cpu_limit`), its class, and
    /// `pods` pending pods of 900m each (two fit on one 2-vCPU node); nodes
    /// join at once and are Ready after 200 ms.
    async fn new(cpu_limit: &str, pods: usize) -> Stack {
        let m = moto().await;
        world(&m).await;
        let conf = m.sdk_config().await;
        let sqs = aws_sdk_sqs::Client::new(&conf);
        let mut urls = Vec::new();
        for q in ["launch", "pending-pods"] {
            let url = sqs.create_queue().queue_name(q).send().await.unwrap();
            urls.push(url.queue_url().unwrap().to_string());
        }
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
            let n = format!("web-{i}");
            kube.apply(&json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": n, "namespace": "default", "uid": format!("uid-{n}"), "labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "web", "resources": {"requests": {"cpu": "900m", "memory": "1Gi"}}}]}}))
                .unwrap();
        }
        kube.schedule();
        Stack {
            store: store(&m).await,
            ec2: aws_sdk_ec2::Client::new(&conf),
            m,
            kube,
            sqs,
            launch_queue: urls[0].clone(),
            pending_queue: urls[1].clone(),
            kubelets: Kubelets::new(KubeletTiming::millis(0, 0)),
        }
    }

    fn cluster(&self) -> KubeCluster {
        KubeCluster::from_client(self.kube.client()).with_retry(RetryPolicy {
            attempts: 3,
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(5),
        })
    }

    fn provisioner(&self) -> Provisioner<KubeCluster> {
        let mut config = ProvisionConfig::new(&self.launch_queue);
        config.lease_wait = Duration::from_secs(30);
        Provisioner::new(self.cluster(), self.store.clone(), self.sqs.clone(), config)
    }

    fn sweeper(&self, lifecycle: LifecycleConfig) -> Sweeper<KubeCluster> {
        let mut config = SweepConfig::from_lookup(|_| None).unwrap();
        config.lifecycle = lifecycle;
        config.pending_queue_url = Some(self.pending_queue.clone());
        config.budget = Duration::from_secs(2);
        Sweeper::new(
            self.cluster(),
            self.store.clone(),
            Instances::new(self.ec2.clone(), CLUSTER),
            self.sqs.clone(),
            config,
        )
    }

    /// What the forwarder would send for these pods, handled by `provision`.
    async fn provision(&self, pods: &[&str]) -> Outcome {
        self.provisioner()
            .handle(&event(pods.iter().map(|p| pod_ref(p)).collect()))
            .await
    }

    /// Runs `launch` on every queued launch request.
    async fn launch_all(&self) {
        let bodies = self.drain(&self.launch_queue).await;
        let launcher = launcher_with(&self.m, self.m.endpoint(), Some(self.pending_queue.clone())).await;
        let (response, results) = batch::handle(&launcher, &event(bodies)).await;
        assert!(response.batch_item_failures.is_empty(), "{results:?}");
    }

    async fn drain(&self, url: &str) -> Vec<String> {
        let mut bodies = Vec::new();
        loop {
            let got = self
                .sqs
                .receive_message()
                .queue_url(url)
                .max_number_of_messages(10)
                .send()
                .await
                .unwrap();
            if got.messages().is_empty() {
                return bodies;
            }
            for msg in got.messages() {
                bodies.push(msg.body().unwrap_or_default().to_string());
                self.sqs
                    .delete_message()
                    .queue_url(url)
                    .receipt_handle(msg.receipt_handle().unwrap())
                    .send()
                    .await
                    .unwrap();
            }
        }
    }

    async fn kubelet_step(&self) {
        let report = self
            .kubelets
            .step(&self.kube, &self.ec2, nodesmith::catalog::builtin().unwrap())
            .await
            .unwrap();
        assert!(report.refused.is_empty(), "a kubelet refused to start: {report:?}");
    }

    async fn claims(&self) -> Vec<NodeClaim> {
        self.store.list_node_claims().await.unwrap()
    }
}

use nodesmith::interruption::handler::{InterruptConfig, Interrupter};

fn taint_keys(n: &Node) -> Vec<String> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|t| t.key)
        .collect()
}

fn pods_on(kube: &KubeServer, node: &str) -> Vec<String> {
    kube.pods()
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .filter_map(|p| p.metadata.name.clone())
        .collect()
}

fn ec2_event(id: &str, detail_type: &str, time: jiff::Timestamp, detail: serde_json::Value) -> String {
    json!({"version": "0", "id": id, "detail-type": detail_type, "source": "aws.ec2", "account": "123456789012",
        "time": nodesmith::interruption::rfc3339(&time), "region": "us-east-1", "resources": [], "detail": detail})
    .to_string()
}

impl Stack {
    fn interrupter(&self, configure: impl FnOnce(&mut InterruptConfig)) -> Interrupter<KubeCluster> {
        let mut config = InterruptConfig::new(&self.launch_queue, &self.pending_queue);
        config.drain_budget = Duration::ZERO;
        configure(&mut config);
        Interrupter::new(self.cluster(), self.store.clone(), self.sqs.clone(), config)
    }

    /// Provisions and launches for these pods; returns the claims.
    async fn launched(&self, pods: &[&str]) -> Vec<NodeClaim> {
        let outcome = self.provision(pods).await;
        assert!(outcome.failed.is_empty() && !outcome.created.is_empty(), "{outcome:?}");
        self.launch_all().await;
        self.claims().await
    }

    /// One initialized node holding both pods; returns its claim.
    async fn running_node(&self) -> NodeClaim {
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

#[tokio::test]
async fn spot_interruption_taints_replaces_first_honours_pdbs_then_forces_at_the_deadline() {
    let s = Stack::new("64", 2).await;
    let claim = s.running_node().await;
    let node = claim.node_name.clone().unwrap();
    let instance = claim.instance_id.clone().unwrap();
    // A budget that allows no disruption at all.
    s.kube
        .apply(&json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web", "namespace": "default"},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}}))
        .unwrap();
    let now = jiff::Timestamp::now();
    let warning = ec2_event(
        "spot-1",
        "EC2 Spot Instance Interruption Warning",
        now,
        json!({"instance-id": instance, "instance-action": "terminate"}),
    );
    let garbage = "{\"detail-type\": 5}".to_string();
    let foreign = ec2_event(
        "spot-foreign",
        "EC2 Spot Instance Interruption Warning",
        now,
        json!({"instance-id": "i-0123456789abcdef0"}),
    );
    let h = s.interrupter(|_| {});
    let out = h.handle(&event(vec![warning.clone(), garbage, foreign])).await;
    assert!(out.failed.is_empty(), "{out:?}");
    assert_eq!((out.unknown, out.ignored), (1, 1), "{out:?}");
    assert_eq!(out.tainted, vec![node.clone()]);
    assert_eq!(out.replacements.len(), 1, "{out:?}");

    // Tainted, replacement written and queued, the pods still where they were (PDB).
    let n = s.cluster().node(&node).await.unwrap().unwrap();
    assert!(taint_keys(&n).contains(&"karpenter.sh/disrupted".to_string()));
    let queued = s.drain(&s.launch_queue).await;
    assert_eq!(queued.len(), 1);
    assert!(queued[0].contains(&out.replacements[0].name), "{queued:?}");
    assert_eq!(
        pods_on(&s.kube, &node).len(),
        2,
        "the PDB holds the pods before the deadline nears"
    );
    let stored = s.store.get_node_claim(&claim.name).await.unwrap().unwrap();
    assert_eq!(stored.phase, Phase::Draining);
    let offering = nodesmith::state::OfferingKey::new(
        claim.instance_type.as_deref().unwrap(),
        claim.zone.as_deref().unwrap(),
        claim.capacity_type.as_deref().unwrap(),
    );
    let unavailable = s.store.unavailable_offerings(now.as_second()).await.unwrap();
    assert!(unavailable.iter().any(|u| u.key == offering), "{unavailable:?}");
    let drains = s.store.drains().await.unwrap();
    assert_eq!(drains.len(), 1, "{drains:?}");

    // The same event again: nothing more.
    let again = h.handle(&event(vec![warning])).await;
    assert!(
        again.replacements.is_empty() && again.tainted.is_empty() && again.failed.is_empty(),
        "{again:?}"
    );
    assert!(s.drain(&s.launch_queue).await.is_empty());

    // Later, with the deadline near, any invocation continues the drain and forces it.
    let late = s.interrupter(|_| {});
    let mut forced_store = s.store.drains().await.unwrap().remove(0);
    forced_store.force_from_ms = Some(now.as_millisecond() - 1);
    s.store.end_drain(&forced_store.claim).await.unwrap();
    s.store.begin_drain(&forced_store).await.unwrap();
    let out = late.handle(&event(vec![])).await;
    assert!(out.failed.is_empty(), "{out:?}");
    assert!(
        pods_on(&s.kube, &node).is_empty(),
        "forced at the deadline: {:?}",
        pods_on(&s.kube, &node)
    );

    // The instance terminates: Node and claim go, a solve is requested; no second replacement.
    let gone = ec2_event(
        "state-1",
        "EC2 Instance State-change Notification",
        now,
        json!({"instance-id": instance, "state": "terminated"}),
    );
    let out = h.handle(&event(vec![gone])).await;
    assert_eq!(out.removed, vec![claim.name.clone()], "{out:?}");
    assert!(out.replacements.is_empty());
    assert!(s.cluster().node(&node).await.unwrap().is_none());
    assert!(s.store.get_node_claim(&claim.name).await.unwrap().is_none());
    let asked = s.drain(&s.pending_queue).await;
    assert!(asked.iter().any(|b| b.contains("instance-state-change")), "{asked:?}");
    assert!(s.store.drains().await.unwrap().is_empty());
}

#[tokio::test]
async fn rebalance_recommendations_follow_the_configured_mode() {
    let s = Stack::new("64", 2).await;
    let claim = s.running_node().await;
    let node = claim.node_name.clone().unwrap();
    let instance = claim.instance_id.clone().unwrap();
    let rebalance = |id: &str| {
        ec2_event(
            id,
            "EC2 Instance Rebalance Recommendation",
            jiff::Timestamp::now(),
            json!({"instance-id": instance}),
        )
    };
    let ignore = s.interrupter(|c| c.rebalance = "ignore".parse().unwrap());
    let out = ignore.handle(&event(vec![rebalance("r-1")])).await;
    assert!(
        out.tainted.is_empty() && out.replacements.is_empty() && out.ignored == 1,
        "{out:?}"
    );

    let replace = s.interrupter(|_| {});
    let out = replace.handle(&event(vec![rebalance("r-2")])).await;
    assert_eq!((out.tainted.len(), out.replacements.len()), (1, 1), "{out:?}");
    assert_eq!(pods_on(&s.kube, &node).len(), 2, "replace mode drains nothing");
    assert!(s.store.drains().await.unwrap().is_empty());

    let drain = s.interrupter(|c| c.rebalance = "drain".parse().unwrap());
    let out = drain.handle(&event(vec![rebalance("r-3")])).await;
    assert!(
        out.replacements.is_empty(),
        "a draining claim is not replaced twice: {out:?}"
    );
    assert!(pods_on(&s.kube, &node).is_empty(), "drain mode evicts (no PDB here)");
}
