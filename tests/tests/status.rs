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
        stderr.contains("no state table: pass --table or set NODESMITH_TABLE"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
}
