//! The provision function end to end on the local stack: pending pods in the
//! Kubernetes API test server, a batch of references from SQS, NodeClaims in
//! moto's DynamoDB and launch requests on moto's SQS — through the real
//! kube-rs and AWS SDK clients.

use std::time::Duration;

use aws_lambda_events::sqs::SqsEvent;
use nodesmith::kubernetes::KubeCluster;
use nodesmith::kubernetes::retry::RetryPolicy;
use nodesmith::messages::LaunchRequest;
use nodesmith::provisioning::{ProvisionConfig, ProvisionOutcome, Provisioner};
use nodesmith::resources::CPU;
use nodesmith::state::{self, StateStore};
use nodesmith::zonal_shift::ZonalShifts;
use nodesmith_tests::fault_proxy::FaultProxy;
use nodesmith_tests::kube_server::KubeServer;
use nodesmith_tests::moto::{Moto, moto};
use nodesmith_tests::sqs;
use serde_json::{Value, json};

const TABLE: &str = "nodesmith";

struct Stack {
    moto: Moto,
    kube: KubeServer,
    store: StateStore,
    sqs: aws_sdk_sqs::Client,
    launch_queue: String,
    dlq: String,
}

impl Drop for Stack {
    /// The provisioner runs as the functions: a call their ClusterRole does
    /// not grant fails the test, even if the code shrugged it off.
    fn drop(&mut self) {
        let denials = self.kube.denials();
        if !std::thread::panicking() && !denials.is_empty() {
            panic!("the functions' RBAC refused calls: {denials:#?}");
        }
    }
}

fn pool(cpu_limit: Option<&str>) -> Value {
    let mut spec = json!({
        "template": {"spec": {
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
            "requirements": [
                {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                {"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["m5", "c5"]}
            ]
        }}
    });
    if let Some(l) = cpu_limit {
        spec["limits"] = json!({"cpu": l});
    }
    json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"}, "spec": spec})
}

fn node_class() -> Value {
    json!({"apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "default"}, "spec": {
        "role": "KarpenterNodeRole",
        "amiSelectorTerms": [{"alias": "al2023@latest"}],
        "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": "demo"}}],
        "securityGroupSelectorTerms": [{"tags": {"karpenter.sh/discovery": "demo"}}]
    }})
}

fn pod(name: &str, cpu: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": {"containers": [{"name": "c", "image": "app", "resources": {"requests": {"cpu": cpu, "memory": "512Mi"}}}]}})
}

async fn stack(cpu_limit: Option<&str>, pods: &[(&str, &str)]) -> Stack {
    let m = moto().await;
    let conf = m.sdk_config().await;
    let dynamo = aws_sdk_dynamodb::Client::new(&conf);
    state::create_table(&dynamo, TABLE).await.unwrap();
    let sqs_client = aws_sdk_sqs::Client::new(&conf);
    let launch_queue = sqs::create_queue(&sqs_client, "launch").await;
    let dlq = sqs::create_queue(&sqs_client, "pending-pods-dlq").await;
    let kube = KubeServer::start().await;
    kube.apply(&pool(cpu_limit)).unwrap();
    kube.apply(&node_class()).unwrap();
    for (name, cpu) in pods {
        kube.apply(&pod(name, cpu)).unwrap();
    }
    // No nodes yet: the scheduler marks every pod Unschedulable, as a cluster would.
    kube.schedule();
    Stack {
        moto: m,
        kube,
        store: StateStore::new(dynamo, TABLE),
        sqs: sqs_client,
        launch_queue,
        dlq,
    }
}

impl Stack {
    fn provisioner(&self, holder: &str, dead_letter: bool) -> Provisioner<KubeCluster> {
        self.provisioner_with(holder, dead_letter, |_| {})
    }

    fn provisioner_with(
        &self,
        holder: &str,
        dead_letter: bool,
        configure: impl FnOnce(&mut ProvisionConfig),
    ) -> Provisioner<KubeCluster> {
        self.provisioner_through(holder, dead_letter, configure, self.store.clone(), self.sqs.clone())
    }

    /// [`Self::provisioner_with`] on other clients (e.g. through a fault proxy).
    fn provisioner_through(
        &self,
        holder: &str,
        dead_letter: bool,
        configure: impl FnOnce(&mut ProvisionConfig),
        store: StateStore,
        sqs: aws_sdk_sqs::Client,
    ) -> Provisioner<KubeCluster> {
        let cluster = KubeCluster::from_client(self.kube.lambda_client()).with_retry(RetryPolicy {
            attempts: 3,
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(5),
        });
        let mut config = ProvisionConfig::new(&self.launch_queue);
        config.holder = holder.into();
        config.lease_wait = Duration::from_secs(30);
        if dead_letter {
            config.dead_letter_queue_url = Some(self.dlq.clone());
        }
        configure(&mut config);
        Provisioner::new(cluster, store, sqs, config)
    }

    /// A fault proxy in front of moto, and the SDK configuration through it.
    async fn proxy(&self) -> (FaultProxy, aws_config::SdkConfig) {
        let proxy = FaultProxy::start(self.moto.endpoint()).await;
        let conf = self.moto.sdk_config_at(proxy.endpoint()).await;
        (proxy, conf)
    }

    async fn drain_queue(&self, url: &str) -> Vec<String> {
        sqs::drain(&self.sqs, url).await
    }
}

fn event(messages: &[(&str, String)]) -> SqsEvent {
    sqs::event(messages.iter().map(|(id, body)| (*id, body.clone())))
}

fn reference(name: &str) -> String {
    json!({"namespace": "default", "name": name, "uid": format!("uid-{name}"), "resourceVersion": "1"}).to_string()
}

fn refs(names: &[&str]) -> SqsEvent {
    let msgs: Vec<(&str, String)> = names.iter().map(|n| (*n, reference(n))).collect();
    event(&msgs)
}

fn pods_in(outcome: &ProvisionOutcome) -> usize {
    outcome
        .created
        .iter()
        .map(|c| c.resources.get("pods").units_ceil() as usize)
        .sum()
}

#[tokio::test]
async fn a_batch_becomes_nodeclaims_and_one_launch_request_each() {
    let names = ["web-0", "web-1", "web-2", "web-3", "web-4", "web-5"];
    let s = stack(None, &names.iter().map(|n| (*n, "1")).collect::<Vec<_>>()).await;
    let out = s.provisioner("a", false).handle(&refs(&names)).await;
    assert!(out.failed.is_empty(), "{out:?}");
    assert!(!out.created.is_empty());
    assert!(out.unschedulable.is_empty(), "{:?}", out.unschedulable);
    // Every pod is on exactly one new claim (the claim's `pods` resource counts them, DaemonSets aside).
    assert!(pods_in(&out) >= names.len(), "{out:?}");

    let stored = s.store.in_flight_node_claims().await.unwrap();
    assert_eq!(stored.len(), out.created.len());
    for c in &stored {
        assert_eq!(c.node_pool, "default");
        assert!(!c.instance_type_options.is_empty());
        assert!(
            c.instance_type_options
                .iter()
                .all(|t| t.starts_with("m5.") || t.starts_with("c5.")),
            "{:?}",
            c.instance_type_options
        );
        assert!(
            c.requirements
                .iter()
                .any(|r| r.key == "karpenter.sh/capacity-type" && r.values == ["on-demand"])
        );
    }
    let mut launched: Vec<String> = s
        .drain_queue(&s.launch_queue)
        .await
        .iter()
        .map(|b| LaunchRequest::parse(b).unwrap().node_claim)
        .collect();
    launched.sort();
    let mut names: Vec<String> = stored.iter().map(|c| c.name.clone()).collect();
    names.sort();
    assert_eq!(launched, names);
}

#[tokio::test]
async fn redelivery_and_concurrent_invocations_add_no_capacity() {
    let names = ["api-0", "api-1", "api-2", "api-3"];
    let s = stack(None, &names.iter().map(|n| (*n, "1500m")).collect::<Vec<_>>()).await;
    let batch = refs(&names);
    let first = s.provisioner("a", false).handle(&batch).await;
    assert!(first.failed.is_empty() && !first.created.is_empty(), "{first:?}");
    // Delivered again three times, twice at once: the pods sit on in-flight claims now.
    let again = s.provisioner("b", false).handle(&batch).await;
    let (pc, pd) = (s.provisioner("c", false), s.provisioner("d", false));
    let (x, y) = tokio::join!(pc.handle(&batch), pd.handle(&batch));
    for o in [&again, &x, &y] {
        assert!(o.failed.is_empty(), "{o:?}");
        assert!(o.created.is_empty(), "a redelivered batch created {:?}", o.created);
        assert_eq!(o.placed_on_existing, names.len());
    }
    assert_eq!(
        s.store.in_flight_node_claims().await.unwrap().len(),
        first.created.len()
    );
    assert_eq!(s.drain_queue(&s.launch_queue).await.len(), first.created.len());
}

#[tokio::test]
async fn two_first_deliveries_at_once_respect_the_pool_limit() {
    // 8 pods of 1 CPU but the pool may only have 4 CPUs of nodes.
    let names: Vec<String> = (0..8).map(|i| format!("job-{i}")).collect();
    let pods: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "1")).collect();
    let s = stack(Some("4"), &pods).await;
    let half_a: Vec<&str> = names[..4].iter().map(String::as_str).collect();
    let half_b: Vec<&str> = names[4..].iter().map(String::as_str).collect();
    let (pa, pb) = (s.provisioner("a", false), s.provisioner("b", false));
    let (ea, eb) = (refs(&half_a), refs(&half_b));
    let (a, b) = tokio::join!(pa.handle(&ea), pb.handle(&eb));
    assert!(a.failed.is_empty() && b.failed.is_empty(), "{a:?} {b:?}");
    let claims = s.store.in_flight_node_claims().await.unwrap();
    // Whichever option CreateFleet grants, the pool stays within its limit.
    let catalog = nodesmith::catalog::builtin().unwrap();
    let largest_cpu = |name: &String| {
        catalog
            .instance_types
            .iter()
            .find(|t| &t.name == name)
            .map(|t| t.capacity.get(CPU).milli())
            .unwrap()
    };
    let cpu: i64 = claims
        .iter()
        .map(|c| c.instance_type_options.iter().map(largest_cpu).max().unwrap())
        .sum();
    assert!(
        cpu <= 4000,
        "claims {:?} may hold {cpu}m CPU, over the 4-CPU limit",
        claims.iter().map(|c| &c.instance_type_options).collect::<Vec<_>>()
    );
    assert!(
        !a.unschedulable.is_empty() || !b.unschedulable.is_empty(),
        "some pods must wait for the limit"
    );
}

#[tokio::test]
async fn malformed_messages_are_dead_lettered_without_failing_the_batch() {
    let s = stack(None, &[("ok-0", "500m")]).await;
    let batch = event(&[
        ("good", reference("ok-0")),
        ("bad-json", "{not json".into()),
        ("bad-schema", r#"{"namespace":"default"}"#.into()),
    ]);
    // Without a dead-letter URL the bad ones are given back (SQS's redrive dead-letters them).
    let out = s.provisioner("a", false).handle(&batch).await;
    let mut failed = out.failed.clone();
    failed.sort();
    assert_eq!(failed, vec!["bad-json", "bad-schema"]);
    assert_eq!(out.malformed, 2);
    assert_eq!(out.response().batch_item_failures.len(), 2);
    // With one, they are sent there with the reason, and nothing is given back.
    let out = s.provisioner("b", true).handle(&batch).await;
    assert!(out.failed.is_empty(), "{out:?}");
    let dead = s.drain_queue(&s.dlq).await;
    assert_eq!(dead.len(), 2);
    assert!(dead.contains(&"{not json".to_string()));
}

#[tokio::test]
async fn pods_that_are_no_longer_pending_are_dropped() {
    let s = stack(None, &[("done-0", "500m")]).await;
    s.kube.delete("v1", "Pod", "default", "done-0").unwrap();
    let stale = event(&[
        ("m1", reference("done-0")),
        (
            "m2",
            json!({"namespace": "default", "name": "never", "uid": "x", "resourceVersion": "1"}).to_string(),
        ),
    ]);
    let out = s.provisioner("a", false).handle(&stale).await;
    assert!(out.failed.is_empty(), "{out:?}");
    assert_eq!(out.gone, 2);
    assert!(out.created.is_empty());
    assert!(s.drain_queue(&s.launch_queue).await.is_empty());
}

#[tokio::test]
async fn a_pod_recreated_under_its_old_name_does_not_stop_provisioning() {
    use nodesmith::nodeclaim::{NodeClaim, Phase};
    use nodesmith::scheduling::SolveOptions;
    // A StatefulSet's db-0 ran before; its claim is still stored (being
    // terminated) under the name a solve would derive from the pool and pod.
    let s = stack(None, &[("db-0", "1")]).await;
    let cluster = KubeCluster::from_client(s.kube.lambda_client());
    let snapshot = nodesmith::snapshot::live::read(&cluster, &s.store, jiff::Timestamp::now())
        .await
        .unwrap();
    let derived = snapshot.compile().solve(&SolveOptions::default()).node_claims[0]
        .name
        .clone();
    let old = NodeClaim {
        phase: Phase::Terminating,
        ..NodeClaim::pending(derived.clone(), "default", "default")
    };
    s.store.create_node_claim(&old).await.unwrap();

    for holder in ["a", "b"] {
        let out = s.provisioner(holder, false).handle(&refs(&["db-0"])).await;
        assert!(out.failed.is_empty(), "provisioning stopped: {out:?}");
        if holder == "a" {
            assert_eq!(out.created.len(), 1, "{out:?}");
            assert_ne!(out.created[0].name, derived);
            assert!(out.created[0].name.starts_with("default-"), "{}", out.created[0].name);
        } else {
            assert!(out.created.is_empty(), "redelivery adds nothing: {out:?}");
        }
    }
    let names: Vec<String> = s
        .store
        .list_node_claims()
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

#[tokio::test]
async fn a_nodepool_or_nodeclass_that_cannot_be_read_is_skipped_with_an_event_and_the_rest_still_solve() {
    let s = stack(None, &[("web-0", "1")]).await;
    // The cluster runs other CRDs than nodesmith's (the test server installs
    // nodesmith's, and stores only what their schemas take): any object goes.
    for (plural, group, kind) in [
        ("nodepools", "karpenter.sh", "NodePool"),
        ("ec2nodeclasses", "karpenter.k8s.aws", "EC2NodeClass"),
    ] {
        s.kube
            .apply(&json!({
                "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {"name": format!("{plural}.{group}")},
                "spec": {"group": group, "scope": "Cluster",
                         "names": {"plural": plural, "kind": kind},
                         "versions": [{"name": "v1", "served": true, "storage": true,
                                       "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
            }))
            .unwrap();
    }
    // What a newer Karpenter CRD accepts and this release cannot read: an
    // enum value it does not know (heaviest pool, so it would be tried first),
    // and a class whose role is not a string. (`Balanced`, once the example,
    // is read since Karpenter 1.14's policy is honoured.)
    let mut balanced = pool(None);
    balanced["metadata"]["name"] = json!("balanced");
    balanced["spec"]["weight"] = json!(100);
    balanced["spec"]["disruption"] = json!({"consolidationPolicy": "WhenIdle", "consolidateAfter": "1m"});
    s.kube.apply(&balanced).unwrap();
    let mut broken = node_class();
    broken["metadata"]["name"] = json!("broken");
    broken["spec"]["role"] = json!(["not", "a", "string"]);
    s.kube.apply(&broken).unwrap();

    let out = s.provisioner("a", false).handle(&refs(&["web-0"])).await;
    assert!(out.failed.is_empty(), "{out:?}");
    assert_eq!(out.created.len(), 1, "{out:?}");
    assert_eq!(out.created[0].node_pool, "default");

    let events = s.kube.events();
    for (kind, name, says) in [("NodePool", "balanced", "WhenIdle"), ("EC2NodeClass", "broken", "role")] {
        let e = events
            .iter()
            .find(|e| {
                e.involved_object.kind.as_deref() == Some(kind) && e.involved_object.name.as_deref() == Some(name)
            })
            .unwrap_or_else(|| panic!("no event on {kind} {name}: {events:#?}"));
        assert_eq!(e.reason.as_deref(), Some("FailedToDecode"));
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert!(e.message.as_deref().unwrap_or_default().contains(says), "{e:?}");
        assert!(e.involved_object.uid.is_some(), "{e:?}");
    }
    // Once per version of the object, not once per solve.
    let again = s.provisioner("b", false).handle(&refs(&["web-0"])).await;
    assert!(again.failed.is_empty(), "{again:?}");
    let provisioner = s.provisioner("c", false);
    provisioner.handle(&refs(&["web-0"])).await;
    provisioner.handle(&refs(&["web-0"])).await;
    let decode_events = |events: &[k8s_openapi::api::core::v1::Event]| {
        events
            .iter()
            .filter(|e| e.reason.as_deref() == Some("FailedToDecode"))
            .count()
    };
    assert!(
        decode_events(&s.kube.events()) <= 2 * 3,
        "one per object per adapter at most"
    );
}

/// Issue 32's burst: the claims and launch requests are written first; the
/// Nominated events come last, within the invocation's cap and deadline,
/// each (pod, claim) once across solves; a batch the deadline leaves no time
/// to solve is handed back to SQS unstarted.
#[tokio::test]
async fn a_burst_writes_its_claims_first_and_its_events_within_the_budget_and_the_deadline() {
    use nodesmith::deadline::Deadline;
    let names: Vec<String> = (0..24).map(|i| format!("burst-{i}")).collect();
    let pods: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "500m")).collect();
    let s = stack(None, &pods).await;
    let all: Vec<&str> = names.iter().map(String::as_str).collect();
    let batch = refs(&all);
    let nominated = |s: &Stack| -> Vec<String> {
        let mut pods: Vec<String> = s
            .kube
            .events()
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("Nominated"))
            .filter_map(|e| e.involved_object.name)
            .collect();
        pods.sort();
        pods
    };
    // One warm container: its provisioner (and what it remembers) serves every
    // invocation. Its launch requests go through a proxy that answers the
    // first batch of them after the deadline has passed.
    let (proxy, conf) = s.proxy().await;
    let late = Duration::from_secs(12);
    proxy.answer_late("SendMessageBatch", 1, late);
    let warm = s.provisioner_through(
        "warm",
        false,
        |c| {
            c.event_budget = 8;
            c.solve_reserve = Duration::ZERO;
        },
        s.store.clone(),
        aws_sdk_sqs::Client::new(&conf),
    );

    // A deadline that leaves the reads and the solve their time, and passes
    // while the plan is written.
    let out = warm.handle_within(&batch, Deadline::after(late)).await;
    assert!(out.failed.is_empty(), "{out:?}");
    assert!(pods_in(&out) >= names.len(), "every pod on a new claim: {out:?}");
    let stored = s.store.in_flight_node_claims().await.unwrap();
    assert_eq!(stored.len(), out.created.len());
    assert_eq!(
        s.drain_queue(&s.launch_queue).await.len(),
        out.created.len(),
        "one launch request per claim"
    );
    assert_eq!(nominated(&s), Vec::<String>::new(), "no event past the deadline");
    assert_eq!(
        (out.events.written, out.events.out_of_time, out.events.over_budget),
        (0, 8, 16)
    );

    // Redeliveries with time to spare: 8 a solve (the cap), never one twice.
    for round in 1..=3 {
        let deadline = Deadline::after(Duration::from_secs(20));
        let out = warm.handle_within(&batch, deadline).await;
        assert!(deadline.remaining() > Duration::ZERO, "returned before the deadline");
        assert!(out.failed.is_empty() && out.created.is_empty(), "{out:?}");
        assert_eq!(out.placed_on_existing, names.len());
        assert_eq!(out.events.written, 8, "round {round}: {:?}", out.events);
        let seen = nominated(&s);
        let mut distinct = seen.clone();
        distinct.dedup();
        assert_eq!((seen.len(), distinct.len()), (8 * round, 8 * round), "{seen:?}");
    }
    let out = warm
        .handle_within(&batch, Deadline::after(Duration::from_secs(20)))
        .await;
    assert_eq!((out.events.written, out.events.duplicates), (0, names.len()));
    assert_eq!(nominated(&s).len(), names.len());

    // A deadline nearer than the solve's reserve: nothing started, all handed back.
    let cold = s.provisioner_with("cold", false, |c| c.solve_reserve = Duration::from_secs(15));
    let out = cold
        .handle_within(&batch, Deadline::after(Duration::from_secs(5)))
        .await;
    assert_eq!(out.handed_on, names.len(), "{out:?}");
    let mut failed = out.failed.clone();
    failed.sort();
    let mut ids: Vec<String> = names.clone();
    ids.sort();
    assert_eq!(failed, ids);
    assert_eq!(out.placed_on_existing, 0, "no solve started");
}

/// Issue 32: a solve still reading the cluster when only the plan's write
/// reserve is left before the deadline is cut there instead of being ended
/// by Lambda: the batch goes back to SQS, nothing is written, the lease is
/// released, and the redelivery solves at once.
#[tokio::test]
async fn a_solve_still_reading_near_the_deadline_hands_its_batch_back_and_frees_the_lease() {
    let s = a_solve_cut_while_reading(false).await;
    // The lease went back: a redelivery that will not wait for it solves now.
    let again = s
        .provisioner_with("again", false, |c| c.lease_wait = Duration::ZERO)
        .handle(&refs(&CUT_PODS))
        .await;
    assert!(again.failed.is_empty(), "{again:?}");
    assert_eq!(pods_in(&again), CUT_PODS.len(), "{again:?}");
}

/// And when the release of the lease after the cut answers late too, the
/// invocation still answers by its deadline (the lease expires by itself).
#[tokio::test]
async fn a_solve_cut_at_the_deadline_answers_by_it_when_its_lease_release_answers_late() {
    a_solve_cut_while_reading(true).await;
}

/// The pending pods of [`a_solve_cut_while_reading`].
const CUT_PODS: [&str; 2] = ["slow-0", "slow-1"];

/// A solve whose in-flight claims' read answers two minutes late (and, if
/// `release_late`, the release of its lease after the cut too), run with 8 s
/// left: its reads are cut 5 s (the plan's write reserve) before the
/// deadline, it answers by the deadline with the batch handed back, and
/// nothing is written.
async fn a_solve_cut_while_reading(release_late: bool) -> Stack {
    use nodesmith::deadline::Deadline;
    let s = stack(None, &[(CUT_PODS[0], "500m"), (CUT_PODS[1], "500m")]).await;
    let (proxy, conf) = s.proxy().await;
    proxy.answer_late("Query", 1, Duration::from_secs(120));
    if release_late {
        // The lease's acquisition, the first UpdateItem, on time.
        proxy.answer_late_after("UpdateItem", 1, 1, Duration::from_secs(120));
    }
    let slow = s.provisioner_through(
        "slow",
        false,
        |c| {
            c.solve_reserve = Duration::ZERO;
            // No renewal before the deadline: a late UpdateItem is the release.
            c.lease_ttl = Duration::from_secs(60);
        },
        StateStore::new(aws_sdk_dynamodb::Client::new(&conf), TABLE),
        s.sqs.clone(),
    );
    let deadline = Deadline::after(Duration::from_secs(8));
    let out = slow.handle_within(&refs(&CUT_PODS), deadline).await;
    // Not a measure of speed: the answer comes by the deadline, not two
    // minutes on with the late answer (which Lambda would have ended).
    assert!(
        deadline.instant() + Duration::from_secs(60) > tokio::time::Instant::now(),
        "answered when the late answer came back, long past the deadline"
    );
    assert_eq!(out.handed_on, CUT_PODS.len(), "{out:?}");
    let mut failed = out.failed.clone();
    failed.sort();
    assert_eq!(failed, CUT_PODS);
    assert!(out.created.is_empty(), "{out:?}");
    assert!(s.store.in_flight_node_claims().await.unwrap().is_empty());
    assert!(s.drain_queue(&s.launch_queue).await.is_empty());
    s
}

#[tokio::test]
async fn a_zonal_shift_keeps_new_claims_out_of_the_shifted_zone_and_says_why_a_pinned_pod_waits() {
    let s = stack(None, &[("web-0", "1"), ("web-1", "1"), ("web-2", "1")]).await;
    let mut pinned = pod("pinned", "1");
    pinned["spec"]["nodeSelector"] = json!({"topology.kubernetes.io/zone": "us-east-1a"});
    s.kube.apply(&pinned).unwrap();
    s.kube.schedule();
    // The sweep has resolved the class: its subnets say which zone id is which zone.
    let mut class = node_class();
    class["status"] = json!({"subnets": [
        {"id": "subnet-a", "zone": "us-east-1a", "zoneID": "use1-az6"},
        {"id": "subnet-b", "zone": "us-east-1b", "zoneID": "use1-az1"},
        {"id": "subnet-c", "zone": "us-east-1c", "zoneID": "use1-az2"}]});
    s.kube.apply(&class).unwrap();
    // ARC shifts the cluster away from us-east-1a (use1-az6).
    let arn = "arn:aws:eks:us-east-1:123456789012:cluster/demo";
    s.moto.seed_arc("arc-resource", &json!({"arn": arn})).unwrap();
    s.moto
        .seed_arc("zonal-shift", &json!({"resource": arn, "awayFrom": "use1-az6"}))
        .unwrap();
    let arc = aws_sdk_arczonalshift::Client::new(&s.moto.sdk_config().await);
    let provisioner = s
        .provisioner("a", false)
        .with_zonal_shift(Some(ZonalShifts::new(arc, arn)));

    let out = provisioner.handle(&refs(&["web-0", "web-1", "web-2", "pinned"])).await;
    assert!(out.failed.is_empty(), "{out:?}");
    assert!(!out.created.is_empty());
    for c in s.store.in_flight_node_claims().await.unwrap() {
        let reqs = c.requirements();
        assert!(
            reqs.get("topology.kubernetes.io/zone")
                .is_some_and(|z| !z.has("us-east-1a")),
            "{} may launch in the shifted zone: {:?}",
            c.name,
            c.requirements
        );
    }
    assert_eq!(out.unschedulable.len(), 1, "{:?}", out.unschedulable);
    let (pod, why) = &out.unschedulable[0];
    assert_eq!(pod, "default/pinned");
    assert!(
        why.contains("zone us-east-1a is shifted away (ARC zonal shift)"),
        "{why}"
    );
}
