//! On-demand prices of the cluster's region, on the real path: the `sweep`
//! binary in eu-west-1 refreshes the catalog with prices read from the AWS
//! Price List API (moto's server with the Price List patch, reached by the
//! real SDK client at a Price List endpoint), a plan solved with that catalog
//! costs eu-west-1's $/h, and `nodesmith status` says where the prices came
//! from. When the Price List API refuses (the fault proxy), the bundled
//! us-east-1 table stands in and `nodesmith status` says so and why.

use std::collections::BTreeMap;

use aws_config::SdkConfig;
use nodesmith::catalog::Catalog;
use nodesmith::scheduling::{SolveInput, SolveOptions, solve};
use nodesmith::state::{self, StateStore};
use nodesmith_tests::fault_proxy::FaultProxy;
use nodesmith_tests::kube_server::{Function, KubeServer};
use nodesmith_tests::lambda_runtime::invoke;
use nodesmith_tests::moto::{Moto, moto};
use serde_json::{Value, json};

const REGION: &str = "eu-west-1";
const TABLE: &str = "nodesmith-prices";
/// eu-west-1's published Linux on-demand price of an m5.large (us-east-1's is 0.096).
const EU_M5_LARGE: f64 = 0.107;
const US_M5_LARGE: f64 = 0.096;

async fn eu(m: &Moto) -> SdkConfig {
    m.sdk_config()
        .await
        .to_builder()
        .region(aws_config::Region::new(REGION))
        .build()
}

/// The environment of a function or the CLI in eu-west-1, calling AWS at `endpoint`.
fn env_at(endpoint: &str, kube: &KubeServer) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = nodesmith_tests::moto::child_env(endpoint)
        .into_iter()
        .chain(kube.env_for(Function::Sweep))
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    env.insert("AWS_REGION".into(), REGION.into());
    env.insert("NODESMITH_TABLE".into(), TABLE.into());
    env.insert("NODESMITH_CLUSTER_NAME".into(), "demo".into());
    env
}

async fn sweep_once(env: &BTreeMap<String, String>) {
    let event = json!({"version": "0", "source": "aws.scheduler", "detail-type": "Scheduled Event", "detail": {}});
    let done = invoke("sweep", env, &event).await.unwrap();
    assert_eq!(done.path, "req-1/response", "{}", done.body);
}

async fn status(env: &BTreeMap<String, String>) -> Value {
    let out = tokio::process::Command::new(nodesmith_tests::binary("nodesmith"))
        .args(["status", "--output", "json"])
        .env_remove("KUBECONFIG")
        .envs(env)
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"))
}

fn on_demand(c: &Catalog, name: &str) -> Vec<f64> {
    let t = c.instance_types.iter().find(|t| t.name == name).unwrap();
    t.offerings
        .iter()
        .filter(|o| o.capacity_type == "on-demand")
        .map(|o| o.price)
        .collect()
}

/// The $/h of the plan for one pod that needs an on-demand m5.large.
fn planned_price(catalog: &Catalog) -> f64 {
    let pool: nodesmith::apis::NodePool = serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"},
        "spec": {"template": {"spec": {
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
            "requirements": [
                {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["m5.large"]},
                {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}
            ]
        }}}
    }))
    .unwrap();
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "web", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}
    }))
    .unwrap();
    let (pods, pools) = ([pod], [pool]);
    let input = SolveInput {
        pods: &pods,
        node_pools: &pools,
        ..SolveInput::new(catalog)
    };
    let plan = solve(&input, &SolveOptions::default());
    assert_eq!(plan.node_claims.len(), 1, "{:?}", plan.unschedulable);
    plan.node_claims[0].price
}

#[tokio::test]
async fn a_region_gets_its_own_on_demand_prices_from_the_price_list_api() {
    let m = moto().await;
    let conf = eu(&m).await;
    state::create_table(&aws_sdk_dynamodb::Client::new(&conf), TABLE)
        .await
        .unwrap();
    let store = StateStore::new(aws_sdk_dynamodb::Client::new(&conf), TABLE);
    // A pass-through proxy: it counts the Price List pages read.
    let proxy = FaultProxy::start(m.endpoint()).await;
    let kube = KubeServer::start().await;
    let env = env_at(proxy.endpoint(), &kube);

    sweep_once(&env).await;
    let catalog = store.get_catalog().await.unwrap().expect("the sweep stored a catalog");
    assert_eq!(catalog.region, REGION);
    let m5 = on_demand(&catalog, "m5.large");
    assert!(
        !m5.is_empty() && m5.iter().all(|p| *p == EU_M5_LARGE),
        "eu-west-1's m5.large price, not us-east-1's {US_M5_LARGE}: {m5:?}"
    );
    // The Price List answers in pages of 100: every page was read.
    assert!(
        proxy.calls("GetProducts") > 2,
        "{} GetProducts calls",
        proxy.calls("GetProducts")
    );
    let us = nodesmith::catalog::ec2::PriceTable::bundled().unwrap();
    let repriced = catalog
        .instance_types
        .iter()
        .filter(|t| {
            let od = on_demand(&catalog, &t.name);
            !od.is_empty() && us.prices.get(&t.name).is_some_and(|p| od[0] != *p)
        })
        .count();
    assert!(repriced > 300, "only {repriced} types got eu-west-1 prices");
    assert_eq!(planned_price(&catalog), EU_M5_LARGE, "the plan's $/h");

    let v = status(&env).await;
    let prices = &v["onDemandPrices"];
    assert_eq!(prices["source"], "priceListApi", "{v}");
    assert_eq!(prices["region"], REGION, "{v}");
    assert_eq!(prices["fallback"], Value::Null, "{v}");
    assert!(prices["ageSeconds"].as_i64().is_some_and(|s| s < 600), "{v}");
}

#[tokio::test]
async fn when_the_price_list_api_fails_the_bundled_table_stands_in_and_status_says_so() {
    let m = moto().await;
    let conf = eu(&m).await;
    state::create_table(&aws_sdk_dynamodb::Client::new(&conf), TABLE)
        .await
        .unwrap();
    let store = StateStore::new(aws_sdk_dynamodb::Client::new(&conf), TABLE);
    let proxy = FaultProxy::start(m.endpoint()).await;
    // The role may not read prices (a JSON-protocol error, as the Price List API answers).
    proxy.fail_dynamo_next(
        "GetProducts",
        100,
        400,
        "AccessDeniedException",
        "User is not authorized to perform: pricing:GetProducts",
    );
    let kube = KubeServer::start().await;
    let env = env_at(proxy.endpoint(), &kube);

    sweep_once(&env).await;
    let catalog = store.get_catalog().await.unwrap().expect("the sweep stored a catalog");
    assert_eq!(catalog.region, REGION);
    let m5 = on_demand(&catalog, "m5.large");
    assert!(
        !m5.is_empty() && m5.iter().all(|p| *p == US_M5_LARGE),
        "the bundled table's price: {m5:?}"
    );
    assert!(proxy.failed("GetProducts") >= 1);

    let v = status(&env).await;
    let prices = &v["onDemandPrices"];
    assert_eq!(prices["source"], "bundledTable", "{v}");
    assert_eq!(prices["region"], "us-east-1", "{v}");
    let why = prices["fallback"].as_str().unwrap_or_default();
    assert!(why.contains("AccessDenied"), "{v}");
    assert_eq!(prices["ageSeconds"], Value::Null, "{v}");
}
