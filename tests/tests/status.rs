//! `nodesmith status` on the real path: the `nodesmith` binary reads claims,
//! disruptions and cost counters from moto's DynamoDB and pods from the
//! Kubernetes API test server, and prints the report as JSON.

use std::process::Output;

use jiff::civil::date;
use nodesmith::disruption::Reason;
use nodesmith::nodeclaim::{NodeClaim, Phase};
use nodesmith::state::{self, CostEntry, DisruptionRecord, DisruptionStep, StateStore};
use nodesmith_tests::kube_server::KubeServer;
use nodesmith_tests::moto::moto;
use serde_json::{Value, json};

const TABLE: &str = "nodesmith-status";
const NOW: &str = "2026-11-24T12:30:00Z";

async fn run(args: &[&str], env: &[(&'static str, String)]) -> Output {
    // tokio's Command: the test server answers on this test's runtime meanwhile.
    tokio::process::Command::new(nodesmith_tests::binary("nodesmith"))
        .args(args)
        .env_remove("NODESMITH_TABLE")
        .env_remove("KUBECONFIG")
        .envs(env.iter().cloned())
        .output()
        .await
        .unwrap()
}

fn claim(name: &str, phase: Phase, price: Option<f64>, node: Option<&str>) -> NodeClaim {
    let mut c = NodeClaim {
        phase,
        price,
        instance_type: price.map(|_| "m6g.large".to_string()),
        zone: price.map(|_| "us-east-1b".to_string()),
        capacity_type: price.map(|_| "spot".to_string()),
        node_name: node.map(String::from),
        ..NodeClaim::pending(name, "default", "default")
    };
    c.timestamps.created = Some("2026-11-24T12:00:00Z".parse().unwrap());
    c
}

fn pod(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "web", "uid": format!("uid-{name}")},
        "spec": {"containers": [{"name": "c", "image": "app", "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}}]}})
}

#[tokio::test]
async fn status_reports_claims_pods_disruptions_and_costs_as_json() {
    let m = moto().await;
    let dynamo = aws_sdk_dynamodb::Client::new(&m.sdk_config().await);
    state::create_table(&dynamo, TABLE).await.unwrap();
    let store = StateStore::new(dynamo, TABLE);
    store
        .create_node_claim(&claim(
            "default-a",
            Phase::Initialized,
            Some(0.0385),
            Some("ip-10-0-1-5"),
        ))
        .await
        .unwrap();
    store
        .create_node_claim(&claim("default-b", Phase::Pending, None, None))
        .await
        .unwrap();
    store
        .create_node_claim(&claim("default-c", Phase::Terminating, Some(0.5), None))
        .await
        .unwrap();
    store
        .begin_disruption(&DisruptionRecord {
            claim: "default-a".into(),
            node: "ip-10-0-1-5".into(),
            reason: Reason::Drifted,
            detail: "the NodePool's template changed".into(),
            step: DisruptionStep::Launching,
            replacements: vec!["default-b".into()],
            grace_ms: None,
            force_from_ms: None,
            started_ms: "2026-11-24T12:20:00Z"
                .parse::<jiff::Timestamp>()
                .unwrap()
                .as_millisecond(),
            version: 0,
        })
        .await
        .unwrap();
    let cost = |function: &str, day, nano_usd| CostEntry {
        function: function.into(),
        day,
        nano_usd,
        fleet_delta_nano_usd_per_hour: 0,
    };
    for e in [
        cost("sweep", date(2026, 11, 24), 1_500_000),
        cost("launch", date(2026, 11, 24), 500_000),
        cost("sweep", date(2026, 11, 1), 3_000_000),
        // Last month: in neither sum.
        cost("sweep", date(2026, 10, 31), 9_000_000),
    ] {
        store.add_cost(&e).await.unwrap();
    }

    let kube = KubeServer::start().await;
    kube.apply(&pod("big")).unwrap();
    // No nodes: the scheduler marks "big" Unschedulable with its message.
    kube.schedule();
    // Created after the scheduling pass: no message yet.
    kube.apply(&pod("fresh")).unwrap();
    let scheduler_message = kube.pod("web", "big").unwrap().status.unwrap().conditions.unwrap()[0]
        .message
        .clone()
        .unwrap();

    let mut env = m.env();
    env.extend(kube.env());
    let out = run(&["status", "--table", TABLE, "--output", "json", "--now", NOW], &env).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"));

    assert_eq!(v["generatedAt"], NOW);
    let claims = v["nodeClaims"].as_array().unwrap();
    assert_eq!(claims.len(), 3);
    assert_eq!(
        claims[0],
        json!({"name": "default-a", "nodePool": "default", "instanceType": "m6g.large", "zone": "us-east-1b",
            "capacityType": "spot", "phase": "Initialized", "ageSeconds": 1800, "node": "ip-10-0-1-5", "pricePerHour": 0.0385,
            "instanceId": null})
    );
    assert_eq!(claims[1]["phase"], "Pending");
    assert_eq!(claims[1]["pricePerHour"], Value::Null);
    assert_eq!(
        v["pendingPods"],
        json!([
            {"namespace": "web", "name": "big", "reason": scheduler_message},
            {"namespace": "web", "name": "fresh", "reason": "waiting for a solve"},
        ])
    );
    assert_eq!(
        v["disruptions"],
        json!([{"claim": "default-a", "node": "ip-10-0-1-5", "reason": "Drifted", "step": "Launching",
            "replacements": ["default-b"], "ageSeconds": 600}])
    );
    // The Terminating claim is leaving: not in the fleet's price.
    assert_eq!(v["fleet"], json!({"usdPerHour": 0.0385, "liveClaims": 2}));
    assert_eq!(
        v["autoscalerCost"],
        json!({"today": "2026-11-24", "todayUsd": 0.002, "todayInvocations": 2,
            "month": "2026-11", "monthUsd": 0.005, "monthInvocations": 3})
    );

    // Piped without --output: a table, as kubectl prints (scripts ask for JSON).
    let out = run(&["status", "--table", TABLE, "--now", NOW], &env).await;
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(table.starts_with("NODECLAIMS\nNAME "), "{table}");
    assert!(table.contains("FLEET: $0.0385/h over 2 live claims"), "{table}");

    // The table names what is wrong when it cannot be read.
    let out = run(
        &["status", "--table", "no-such-table", "--output", "json", "--now", NOW],
        &env,
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot read the state table") && stderr.contains("no-such-table"),
        "{stderr}"
    );
}

#[tokio::test]
async fn status_without_a_table_says_how_to_name_one() {
    let out = run(&["status", "--output", "json"], &[]).await;
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no state table: pass --table or --stack, or set NODESMITH_TABLE"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
}

/// A stack in moto's CloudFormation with the outputs nodesmith's template
/// has that `--stack` reads: the pending-pods queue (a real queue) and the
/// state table's name.
async fn stack(m: &nodesmith_tests::moto::Moto, name: &str, table: &str) -> String {
    let template = json!({
        "Parameters": {"ForwarderOidcProvider": {"Type": "String", "Default": ""}},
        "Resources": {"PendingPodsQueue": {"Type": "AWS::SQS::Queue", "Properties": {"QueueName": format!("{name}-pending")}}},
        "Outputs": {
            "PendingPodsQueueUrl": {"Value": {"Ref": "PendingPodsQueue"}},
            "StateTableName": {"Value": table},
            "ForwarderIrsaAnnotation": {"Value": "eks.amazonaws.com/role-arn: arn:aws:iam::123456789012:role/fwd"},
        },
    });
    let cfn = aws_sdk_cloudformation::Client::new(&m.sdk_config().await);
    cfn.create_stack()
        .stack_name(name)
        .template_body(template.to_string())
        .send()
        .await
        .unwrap();
    let described = cfn.describe_stacks().stack_name(name).send().await.unwrap();
    described.stacks()[0]
        .outputs()
        .iter()
        .find(|o| o.output_key() == Some("PendingPodsQueueUrl"))
        .and_then(|o| o.output_value())
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn install_and_status_find_what_they_need_in_the_stack() {
    let m = moto().await;
    let dynamo = aws_sdk_dynamodb::Client::new(&m.sdk_config().await);
    state::create_table(&dynamo, TABLE).await.unwrap();
    StateStore::new(dynamo, TABLE)
        .create_node_claim(&claim("default-a", Phase::Pending, None, None))
        .await
        .unwrap();
    let queue = stack(&m, "nodesmith-test", TABLE).await;
    let kube = KubeServer::start().await;
    let mut env = m.env();
    env.extend(kube.env());

    // status: the table from the stack's outputs.
    let out = run(
        &["status", "--stack", "nodesmith-test", "-o", "json", "--now", NOW],
        &env,
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    assert_eq!(v["nodeClaims"][0]["name"], "default-a");

    // install: the in-cluster part with the stack's queue and the image,
    // applied by the real kubectl as a user would pipe it.
    let out = run(
        &[
            "install",
            "--stack",
            "nodesmith-test",
            "--image",
            "registry.example/nodesmith-forwarder:0.1.0",
        ],
        &env,
    )
    .await;
    let manifests = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let dir = std::env::temp_dir().join(format!("nodesmith-install-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    kube.write_kubeconfig(&dir.join("kubeconfig")).unwrap();
    let kubectl = nodesmith_tests::kubectl::Kubectl {
        kubeconfig: dir.join("kubeconfig"),
        dir: dir.clone(),
    };
    let applied = kubectl.run(&["apply", "-f", "-"], Some(&manifests)).await;
    assert!(applied.ok, "{applied:?}\n{manifests}");
    let config = kubectl
        .json(&["-n", "nodesmith", "get", "configmap", "nodesmith-forwarder"])
        .await;
    assert_eq!(config["data"]["QUEUE_URL"], json!(queue));
    let deployment = kubectl
        .json(&["-n", "nodesmith", "get", "deployment", "nodesmith-forwarder"])
        .await;
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["image"],
        "registry.example/nodesmith-forwarder:0.1.0"
    );
    // Pod Identity (no OIDC provider among the parameters): no IRSA annotation.
    let account = kubectl
        .json(&["-n", "nodesmith", "get", "serviceaccount", "nodesmith-forwarder"])
        .await;
    assert!(
        account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].is_null(),
        "{account}"
    );
    let role = kubectl.json(&["get", "clusterrole", "nodesmith-sweep"]).await;
    assert!(role["rules"].as_array().is_some_and(|r| !r.is_empty()), "{role}");
    // Never the CRDs: those come apart, from --crds.
    assert!(!manifests.contains("CustomResourceDefinition"));
    let crds = run(&["install", "--crds"], &[]).await;
    let crds = String::from_utf8_lossy(&crds.stdout);
    assert_eq!(crds.matches("kind: CustomResourceDefinition").count(), 3, "{crds}");

    // A stack that is not there, or not named: said so.
    let out = run(&["install", "--stack", "no-such-stack", "--image", "x"], &env).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot read stack no-such-stack"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&["install", "--image", "x"], &env).await;
    assert_eq!(out.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}
