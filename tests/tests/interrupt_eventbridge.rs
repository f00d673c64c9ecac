//! End to end through EventBridge and the real binary: events are put on
//! moto's default bus, whose rules are `template.yaml`'s (same patterns,
//! target the interruption queue); moto delivers matches to SQS; the batch
//! read from the queue is handed to the `interrupt` binary under the local
//! Lambda Runtime API, against moto and the Kubernetes API test server with
//! strict kubelets. What the binary does not fail is deleted from the queue,
//! as Lambda's SQS poller does.

use crate::launch_fixtures;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::launch_fixtures::TABLE;
use crate::local_stack::{Stack, pods_on, taint_keys};
use nodesmith::nodeclaim::Phase;
use nodesmith::state::OfferingKey;
use nodesmith_tests::eventbridge::{self, put_event};
use nodesmith_tests::lambda_runtime::{Invocation, invoke};
use serde_json::{Value, json};

/// The stack with the interruption queue behind the template's rules.
struct Bus {
    s: Stack,
    eb: eventbridge::Client,
    queue: String,
}

/// What one delivery did.
struct Delivery {
    /// The bodies handed to the binary.
    bodies: Vec<String>,
    /// Its answer and logs.
    run: Invocation,
    /// Message ids it gave back.
    failed: Vec<String>,
}

impl Bus {
    async fn new() -> Bus {
        let s = Stack::new("64", 2).await;
        let eb = eventbridge::client(&s.m).await;
        let queue = s
            .sqs
            .create_queue()
            .queue_name("interruption")
            .send()
            .await
            .unwrap()
            .queue_url()
            .unwrap()
            .to_string();
        let attrs = s
            .sqs
            .get_queue_attributes()
            .queue_url(&queue)
            .attribute_names(aws_sdk_sqs::types::QueueAttributeName::QueueArn)
            .send()
            .await
            .unwrap();
        let arn = attrs
            .attributes()
            .and_then(|a| a.get(&aws_sdk_sqs::types::QueueAttributeName::QueueArn))
            .unwrap()
            .clone();
        let rules = eventbridge::repo_template_rules().unwrap();
        assert_eq!(rules.len(), 5, "{rules:?}");
        eventbridge::route_to_queue(&eb, &rules, &arn).await.unwrap();
        Bus { s, eb, queue }
    }

    fn env(&self, extra: &[(&str, &str)]) -> BTreeMap<String, String> {
        let mut env: BTreeMap<String, String> = self
            .s
            .m
            .env()
            .into_iter()
            .chain(self.s.kube.env_for(nodesmith_tests::kube_server::Function::Interrupt))
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        env.insert("NODESMITH_TABLE".into(), TABLE.into());
        env.insert("NODESMITH_LAUNCH_QUEUE_URL".into(), self.s.launch_queue.clone());
        env.insert("NODESMITH_PENDING_QUEUE_URL".into(), self.s.pending_queue.clone());
        env.insert("NODESMITH_INTERRUPT_DRAIN_BUDGET".into(), "0".into());
        env.insert("NODESMITH_INTERRUPTION_QUEUE_URL".into(), self.queue.clone());
        for (k, v) in extra {
            env.insert(k.to_string(), v.to_string());
        }
        env
    }

    async fn put(&self, source: &str, detail_type: &str, detail: Value, time: jiff::Timestamp) -> String {
        put_event(&self.eb, source, detail_type, &detail, time).await.unwrap()
    }

    /// Everything visible on the queue (at least one message), as one SQS batch.
    async fn receive(&self) -> Vec<aws_sdk_sqs::types::Message> {
        let mut got = Vec::new();
        loop {
            let out = self
                .s
                .sqs
                .receive_message()
                .queue_url(&self.queue)
                .max_number_of_messages(10)
                .wait_time_seconds(if got.is_empty() { 5 } else { 0 })
                .send()
                .await
                .unwrap();
            if out.messages().is_empty() {
                assert!(!got.is_empty(), "nothing reached the interruption queue");
                return got;
            }
            got.extend(out.messages().iter().cloned());
        }
    }

    /// Hands `messages` to the binary, deletes what it did not fail.
    async fn run(&self, messages: Vec<aws_sdk_sqs::types::Message>, extra: &[(&str, &str)]) -> Delivery {
        let records: Vec<Value> = messages
            .iter()
            .map(|m| {
                json!({"messageId": m.message_id(), "receiptHandle": m.receipt_handle(), "body": m.body(),
                    "eventSource": "aws:sqs", "awsRegion": "us-east-1", "attributes": {}, "messageAttributes": {}})
            })
            .collect();
        let run = invoke("interrupt", &self.env(extra), &json!({"Records": records}))
            .await
            .unwrap();
        assert_eq!(run.path, "req-1/response", "{}\n{}", run.body, run.logs);
        let resp: Value = serde_json::from_str(&run.body).unwrap();
        let failed: Vec<String> = resp["batchItemFailures"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|f| f["itemIdentifier"].as_str().map(str::to_string))
            .collect();
        for m in &messages {
            if !failed.iter().any(|f| Some(f.as_str()) == m.message_id()) {
                self.s
                    .sqs
                    .delete_message()
                    .queue_url(&self.queue)
                    .receipt_handle(m.receipt_handle().unwrap())
                    .send()
                    .await
                    .unwrap();
            }
        }
        Delivery {
            bodies: messages.iter().filter_map(|m| m.body().map(str::to_string)).collect(),
            run,
            failed,
        }
    }

    async fn launch_queue_depth(&self) -> usize {
        let attrs = self
            .s
            .sqs
            .get_queue_attributes()
            .queue_url(&self.s.launch_queue)
            .attribute_names(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages)
            .send()
            .await
            .unwrap();
        attrs
            .attributes()
            .and_then(|a| a.get(&aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }
}

fn tainted(b: &Bus, node: &str) -> bool {
    b.s.kube
        .node(node)
        .is_some_and(|n| taint_keys(&n).contains(&"karpenter.sh/disrupted".to_string()))
}

#[tokio::test]
async fn spot_warning_through_eventbridge_taints_replaces_before_evicting_and_forces_at_the_deadline() {
    let b = Bus::new().await;
    let claim = b.s.running_node().await;
    let node = claim.node_name.clone().unwrap();
    let instance = claim.instance_id.clone().unwrap();
    b.s.kube.apply(&crate::local_stack::web_pdb()).unwrap();
    let now = jiff::Timestamp::now();
    let spot = "EC2 Spot Instance Interruption Warning";
    b.put(
        "aws.ec2",
        spot,
        json!({"instance-id": instance, "instance-action": "terminate"}),
        now,
    )
    .await;
    // Another account's instance on the shared bus.
    b.put(
        "aws.ec2",
        spot,
        json!({"instance-id": "i-0123456789abcdef0", "instance-action": "terminate"}),
        now,
    )
    .await;
    // Matches the rule, but names no instance nodesmith can read.
    b.put("aws.ec2", spot, json!({"instance-id": 42}), now).await;
    // Matches no rule (the template only subscribes to states that end capacity).
    b.put(
        "aws.ec2",
        "EC2 Instance State-change Notification",
        json!({"instance-id": instance, "state": "running"}),
        now,
    )
    .await;
    // Not an event at all.
    b.s.sqs
        .send_message()
        .queue_url(&b.queue)
        .message_body("this is not json")
        .send()
        .await
        .unwrap();

    let messages = b.receive().await;
    assert_eq!(messages.len(), 4, "the rules let four through: {messages:?}");
    let claims_before = b.s.claims().await.len();
    // Reaction time on the local stack: the batch is visible from here.
    let visible = Instant::now();
    let watch = async {
        let (mut taint_at, mut launch_at) = (None, None);
        while (taint_at.is_none() || launch_at.is_none()) && visible.elapsed() < Duration::from_secs(60) {
            if taint_at.is_none() && tainted(&b, &node) {
                taint_at = Some(visible.elapsed());
            }
            if launch_at.is_none() && b.launch_queue_depth().await > 0 {
                launch_at = Some(visible.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        (taint_at, launch_at)
    };
    let (d, (taint_at, launch_at)) = tokio::join!(b.run(messages, &[]), watch);
    eprintln!(
        "interrupt e2e (cold binary; init = spawn → first Runtime API poll {:?}): message visible → taint applied {:?}, → launch request sent {:?}",
        d.run.init, taint_at, launch_at
    );
    assert!(d.failed.is_empty(), "{:?}\n{}", d.failed, d.run.logs);
    assert!(
        d.run
            .logs
            .contains("acknowledging an interruption message nodesmith does not act on"),
        "{}",
        d.run.logs
    );
    assert!(d.run.logs.contains("not JSON"), "the reason is logged: {}", d.run.logs);
    assert!(
        d.run.logs.contains("not nodesmith's"),
        "the foreign instance is logged: {}",
        d.run.logs
    );
    assert_eq!(d.bodies.len(), 4);

    // Tainted; one replacement written and queued; the PDB keeps both pods in place.
    assert!(tainted(&b, &node));
    let claims = b.s.claims().await;
    assert_eq!(claims.len(), claims_before + 1, "{claims:?}");
    let replacement = claims.iter().find(|c| c.name != claim.name).unwrap().clone();
    assert_eq!(replacement.phase, Phase::Pending);
    assert_eq!(pods_on(&b.s.kube, &node).len(), 2, "the PDB holds the pods");
    let unavailable = b.s.store.unavailable_offerings(now.as_second()).await.unwrap();
    let offering = OfferingKey::new(
        claim.instance_type.as_deref().unwrap(),
        claim.zone.as_deref().unwrap(),
        claim.capacity_type.as_deref().unwrap(),
    );
    assert!(unavailable.iter().any(|u| u.key == offering), "{unavailable:?}");
    assert_eq!(
        b.s.store.get_node_claim(&claim.name).await.unwrap().unwrap().phase,
        Phase::Draining
    );

    // The replacement launches in moto while the old node still holds every pod.
    b.s.launch_all().await;
    let launched = b.s.store.get_node_claim(&replacement.name).await.unwrap().unwrap();
    assert_eq!(launched.phase, Phase::Launched, "{launched:?}");
    assert!(
        !launch_fixtures::instances_of(&b.s.m, &replacement.name)
            .await
            .is_empty()
    );
    assert_eq!(pods_on(&b.s.kube, &node).len(), 2);

    // The deadline nears (the recorded drain is moved to its forcing time),
    // and SQS delivers the warning a second time.
    let mut record = b.s.store.drains().await.unwrap().remove(0);
    record.force_from_ms = Some(jiff::Timestamp::now().as_millisecond() - 1);
    b.s.store.end_drain(&record.claim).await.unwrap();
    b.s.store.begin_drain(&record).await.unwrap();
    let warning = d
        .bodies
        .iter()
        .find(|body| body.contains(&instance) && body.contains(spot))
        .unwrap()
        .clone();
    b.s.sqs
        .send_message()
        .queue_url(&b.queue)
        .message_body(warning)
        .send()
        .await
        .unwrap();
    let again = b.run(b.receive().await, &[]).await;
    assert!(again.failed.is_empty(), "{}", again.run.logs);
    assert!(again.run.logs.contains("already handled"), "{}", again.run.logs);
    assert_eq!(b.s.claims().await.len(), claims_before + 1, "no second replacement");
    assert_eq!(b.launch_queue_depth().await, 0, "no second launch");
    assert!(
        pods_on(&b.s.kube, &node).is_empty(),
        "forced at the deadline: {:?}",
        pods_on(&b.s.kube, &node)
    );
}

#[tokio::test]
async fn rebalance_through_eventbridge_in_each_mode() {
    let b = Bus::new().await;
    let claim = b.s.running_node().await;
    let node = claim.node_name.clone().unwrap();
    let instance = claim.instance_id.clone().unwrap();
    let rebalance = "EC2 Instance Rebalance Recommendation";
    let claims_before = b.s.claims().await.len();

    b.put(
        "aws.ec2",
        rebalance,
        json!({"instance-id": instance}),
        jiff::Timestamp::now(),
    )
    .await;
    let d = b.run(b.receive().await, &[("NODESMITH_REBALANCE", "ignore")]).await;
    assert!(d.failed.is_empty(), "{}", d.run.logs);
    assert!(!tainted(&b, &node));
    assert_eq!(b.s.claims().await.len(), claims_before);

    b.put(
        "aws.ec2",
        rebalance,
        json!({"instance-id": instance}),
        jiff::Timestamp::now(),
    )
    .await;
    let d = b.run(b.receive().await, &[("NODESMITH_REBALANCE", "replace")]).await;
    assert!(d.failed.is_empty(), "{}", d.run.logs);
    assert!(tainted(&b, &node));
    assert_eq!(b.s.claims().await.len(), claims_before + 1);
    assert_eq!(b.launch_queue_depth().await, 1);
    assert_eq!(pods_on(&b.s.kube, &node).len(), 2, "replace mode drains nothing");
    assert!(b.s.store.drains().await.unwrap().is_empty());

    b.put(
        "aws.ec2",
        rebalance,
        json!({"instance-id": instance}),
        jiff::Timestamp::now(),
    )
    .await;
    let d = b.run(b.receive().await, &[("NODESMITH_REBALANCE", "drain")]).await;
    assert!(d.failed.is_empty(), "{}", d.run.logs);
    assert_eq!(b.s.claims().await.len(), claims_before + 1, "not replaced twice");
    assert!(pods_on(&b.s.kube, &node).is_empty(), "drain mode evicts (no PDB here)");
}

#[tokio::test]
async fn scheduled_change_through_eventbridge_replaces_and_drains_before_the_start() {
    let b = Bus::new().await;
    let claim = b.s.running_node().await;
    let node = claim.node_name.clone().unwrap();
    let instance = claim.instance_id.clone().unwrap();
    let start = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(48);
    let health = |category: &str| {
        json!({"service": "EC2", "eventTypeCode": "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
            "eventTypeCategory": category, "startTime": start.strftime("%a, %d %b %Y %H:%M:%S GMT").to_string(),
            "affectedEntities": [{"entityValue": instance}, {"entityValue": "vol-0123456789abcdef0"}]})
    };
    // An issue, not a scheduled change: the rule does not forward it.
    b.put(
        "aws.health",
        "AWS Health Event",
        health("issue"),
        jiff::Timestamp::now(),
    )
    .await;
    b.put(
        "aws.health",
        "AWS Health Event",
        health("scheduledChange"),
        jiff::Timestamp::now(),
    )
    .await;
    let messages = b.receive().await;
    assert_eq!(messages.len(), 1, "{messages:?}");
    let claims_before = b.s.claims().await.len();
    let d = b.run(messages, &[]).await;
    assert!(d.failed.is_empty(), "{}", d.run.logs);
    assert!(tainted(&b, &node));
    assert_eq!(b.s.claims().await.len(), claims_before + 1);
    assert_eq!(b.launch_queue_depth().await, 1);
    assert!(pods_on(&b.s.kube, &node).is_empty(), "drained gracefully (no PDB here)");
}

#[tokio::test]
async fn capacity_reservation_warning_through_eventbridge_taints_replaces_drains_and_marks_the_offering() {
    let b = Bus::new().await;
    let claim = b.s.running_node().await;
    let node = claim.node_name.clone().unwrap();
    let instance = claim.instance_id.clone().unwrap();
    let now = jiff::Timestamp::now();
    let ends = now + jiff::SignedDuration::from_secs(150);
    b.put(
        "aws.ec2",
        "EC2 Capacity Reservation Instance Interruption Warning",
        json!({"instance-id": instance, "instance-action": "terminate",
            "instance-termination-time": nodesmith::interruption::rfc3339(&ends)}),
        now,
    )
    .await;
    let claims_before = b.s.claims().await.len();
    let d = b.run(b.receive().await, &[]).await;
    assert!(d.failed.is_empty(), "{}", d.run.logs);
    assert!(tainted(&b, &node));
    assert_eq!(b.s.claims().await.len(), claims_before + 1);
    assert_eq!(b.launch_queue_depth().await, 1);
    assert!(pods_on(&b.s.kube, &node).is_empty(), "drained (no PDB here)");
    let unavailable = b.s.store.unavailable_offerings(now.as_second()).await.unwrap();
    assert_eq!(unavailable.len(), 1, "{unavailable:?}");
}

#[tokio::test]
async fn state_change_through_eventbridge_removes_the_node_and_claim_and_asks_for_a_solve() {
    let b = Bus::new().await;
    let claim = b.s.running_node().await;
    let node = claim.node_name.clone().unwrap();
    let instance = claim.instance_id.clone().unwrap();
    // Stopped behind nodesmith's back: the capacity is gone.
    b.s.ec2
        .terminate_instances()
        .instance_ids(&instance)
        .send()
        .await
        .unwrap();
    b.put(
        "aws.ec2",
        "EC2 Instance State-change Notification",
        json!({"instance-id": instance, "state": "terminated"}),
        jiff::Timestamp::now(),
    )
    .await;
    let messages = b.receive().await;
    assert_eq!(messages.len(), 1, "{messages:?}");
    let d = b.run(messages, &[]).await;
    assert!(d.failed.is_empty(), "{}", d.run.logs);
    assert!(b.s.kube.node(&node).is_none(), "the Node is deleted");
    assert!(
        b.s.claims().await.iter().all(|c| c.name != claim.name),
        "the claim is cleaned up"
    );
    let asked = b.s.drain(&b.s.pending_queue).await;
    assert!(asked.iter().any(|a| a.contains("\"solve\"")), "{asked:?}");
}

#[tokio::test]
async fn an_event_nodesmith_cannot_read_is_counted_and_logged_with_its_detail_type() {
    let b = Bus::new().await;
    // A detail-type no parser reads, and a body that is not an event at all.
    let foreign = json!({"version": "0", "id": "u-1", "detail-type": "EC2 Fast Launch State-change Notification",
        "source": "aws.ec2", "account": "111122223333", "time": "2026-01-01T00:00:00Z", "region": "us-east-1",
        "resources": [], "detail": {}});
    for body in [foreign.to_string(), "not an event".to_string()] {
        b.s.sqs
            .send_message()
            .queue_url(&b.queue)
            .message_body(body)
            .send()
            .await
            .unwrap();
    }
    let mut messages = b.receive().await;
    while messages.len() < 2 {
        messages.extend(b.receive().await);
    }
    let d = b.run(messages, &[]).await;
    // Acknowledged (a retry reads it no better), but not silently.
    assert!(d.failed.is_empty(), "{}", d.run.logs);
    assert!(
        d.run.logs.contains("EC2 Fast Launch State-change Notification"),
        "{}",
        d.run.logs
    );
    let emf = d
        .run
        .logs
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v.get("InterruptionMessagesUnreadable").is_some())
        .unwrap_or_else(|| panic!("no InterruptionMessagesUnreadable metric in\n{}", d.run.logs));
    assert_eq!(emf["InterruptionMessagesUnreadable"], 2.0, "{emf}");
    assert_eq!(emf["Function"], "interrupt");
    assert_eq!(emf["_aws"]["CloudWatchMetrics"][0]["Namespace"], "nodesmith");
}
