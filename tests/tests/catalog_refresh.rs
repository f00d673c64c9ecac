//! The live catalog in a region other than us-east-1, with moto in eu-west-1:
//! the sweep's refresh builds it from EC2 into the state table (types every
//! 12 h, spot prices every hour), `provision`'s pre-solve step builds it when
//! none is stored, and a zonal-spread deployment solved with it launches into
//! eu-west-1's zones. The built-in us-east-1 snapshot would place it in zones
//! this region does not have.

use std::collections::{BTreeMap, BTreeSet};

use aws_config::SdkConfig;
use aws_sdk_ec2::types::{ResourceType, Tag, TagSpecification};
use nodesmith::apis::ec2nodeclass::{AmiSelectorTerm, EC2NodeClassSpec, SelectorTerm};
use nodesmith::catalog::Catalog;
use nodesmith::catalog_refresh::{self as refresh, Due, OnDemandSources};
use nodesmith::kubernetes::KubeCluster;
use nodesmith::labels;
use nodesmith::launch::{LaunchOutcome, Launcher};
use nodesmith::messages::LaunchRequest;
use nodesmith::scheduling::{SolveInput, SolveOptions, solve};
use nodesmith::state::{self, StateStore};
use nodesmith_tests::kube_server::KubeServer;
use nodesmith_tests::moto::{Moto, moto};

const REGION: &str = "eu-west-1";
const ZONES: [&str; 3] = ["eu-west-1a", "eu-west-1b", "eu-west-1c"];
const TABLE: &str = "nodesmith-state";
const CLUSTER: &str = "demo";
const H: i64 = 3600 * 1000;

async fn eu(m: &Moto) -> SdkConfig {
    m.sdk_config()
        .await
        .to_builder()
        .region(aws_config::Region::new(REGION))
        .build()
}

async fn table(conf: &SdkConfig) -> StateStore {
    state::create_table(&aws_sdk_dynamodb::Client::new(conf), TABLE)
        .await
        .unwrap();
    StateStore::new(aws_sdk_dynamodb::Client::new(conf), TABLE)
}

fn zones_of(c: &Catalog) -> BTreeSet<String> {
    c.instance_types
        .iter()
        .flat_map(|t| t.offerings.iter().map(|o| o.zone.clone()))
        .collect()
}

#[tokio::test]
async fn the_sweep_refresh_builds_the_regions_catalog_on_its_cadence() {
    let m = moto().await;
    let conf = eu(&m).await;
    let st = table(&conf).await;
    let ec2 = aws_sdk_ec2::Client::new(&conf);
    m.seed_spot_prices(&[("m5.large", "eu-west-1a", 0.04), ("m5.large", "eu-west-1b", 0.041)]);
    let prices = OnDemandSources::bundled_only().unwrap();
    let t0 = state::now_ms();
    assert_eq!(refresh::refresh(&ec2, &st, &prices, t0).await.unwrap(), Due::Everything);
    let c = st.get_catalog().await.unwrap().unwrap();
    assert_eq!(c.region, REGION);
    let want: BTreeSet<String> = ZONES.iter().map(|z| z.to_string()).collect();
    assert_eq!(zones_of(&c), want, "eu-west-1's zones, not the built-in us-east-1 ones");
    let m5 = c.instance_types.iter().find(|t| t.name == "m5.large").unwrap();
    let spot: BTreeMap<&str, f64> = m5
        .offerings
        .iter()
        .filter(|o| o.capacity_type == "spot")
        .map(|o| (o.zone.as_str(), o.price))
        .collect();
    assert_eq!(spot, BTreeMap::from([("eu-west-1a", 0.04), ("eu-west-1b", 0.041)]));
    assert_eq!(m5.labels.get(labels::ARCH).map(String::as_str), Some("amd64"));
    let resolved = c.resolve(None);
    let it = resolved.iter().find(|t| t.name == "m5.large").unwrap();
    let region = it.requirements.get(labels::REGION).unwrap();
    assert!(region.has(REGION) && !region.has("us-east-1"), "{region:?}");

    // Fresh: nothing; an hour on: spot prices only; twelve hours on: everything.
    assert_eq!(
        refresh::refresh(&ec2, &st, &prices, t0 + 60_000).await.unwrap(),
        Due::Nothing
    );
    m.seed_spot_prices(&[("m5.large", "eu-west-1a", 0.05)]);
    assert_eq!(
        refresh::refresh(&ec2, &st, &prices, t0 + H).await.unwrap(),
        Due::SpotPrices
    );
    let c = st.get_catalog().await.unwrap().unwrap();
    let m5 = c.instance_types.iter().find(|t| t.name == "m5.large").unwrap();
    assert!(
        m5.offerings
            .iter()
            .any(|o| o.zone == "eu-west-1a" && o.capacity_type == "spot" && o.price == 0.05),
        "{m5:?}"
    );
    assert_eq!(
        refresh::refresh(&ec2, &st, &prices, t0 + 12 * H).await.unwrap(),
        Due::Everything
    );
}

#[tokio::test]
async fn provision_builds_a_missing_catalog_outside_us_east_1_only() {
    let m = moto().await;
    let prices = OnDemandSources::bundled_only().unwrap();
    // us-east-1 with nothing stored: the built-in snapshot stands in, nothing is built.
    let us = m.sdk_config().await;
    let st_us = table(&us).await;
    refresh::ensure_for_solving(&aws_sdk_ec2::Client::new(&us), &st_us, &prices)
        .await
        .unwrap();
    assert!(st_us.get_catalog().await.unwrap().is_none());
    // eu-west-1 (its own table): built before the solve.
    let conf = eu(&m).await;
    let st = StateStore::new(aws_sdk_dynamodb::Client::new(&conf), "nodesmith-eu");
    state::create_table(&aws_sdk_dynamodb::Client::new(&conf), "nodesmith-eu")
        .await
        .unwrap();
    refresh::ensure_for_solving(&aws_sdk_ec2::Client::new(&conf), &st, &prices)
        .await
        .unwrap();
    assert_eq!(st.get_catalog().await.unwrap().unwrap().region, REGION);
}

/// A cluster's AWS side in eu-west-1: a subnet per zone, a security group, EKS, the node role.
async fn eu_world(conf: &SdkConfig) -> BTreeMap<String, String> {
    let ec2 = aws_sdk_ec2::Client::new(conf);
    let vpc = ec2.create_vpc().cidr_block("10.1.0.0/16").send().await.unwrap();
    let vpc = vpc.vpc().unwrap().vpc_id().unwrap().to_string();
    let tagged = |rt: ResourceType| {
        TagSpecification::builder()
            .resource_type(rt)
            .tags(Tag::builder().key("karpenter.sh/discovery").value(CLUSTER).build())
            .build()
    };
    let mut subnets = BTreeMap::new();
    let mut ids = Vec::new();
    for (i, z) in ZONES.iter().enumerate() {
        let s = ec2
            .create_subnet()
            .vpc_id(&vpc)
            .cidr_block(format!("10.1.{i}.0/24"))
            .availability_zone(*z)
            .tag_specifications(tagged(ResourceType::Subnet))
            .send()
            .await
            .unwrap();
        let id = s.subnet().unwrap().subnet_id().unwrap().to_string();
        ids.push(id.clone());
        subnets.insert(id, z.to_string());
    }
    ec2.create_security_group()
        .group_name("nodes")
        .description("nodes")
        .vpc_id(&vpc)
        .tag_specifications(tagged(ResourceType::SecurityGroup))
        .send()
        .await
        .unwrap();
    aws_sdk_eks::Client::new(conf)
        .create_cluster()
        .name(CLUSTER)
        .version("1.33")
        .role_arn("arn:aws:iam::123456789012:role/eks")
        .resources_vpc_config(
            aws_sdk_eks::types::VpcConfigRequest::builder()
                .set_subnet_ids(Some(ids))
                .build(),
        )
        .send()
        .await
        .unwrap();
    let trust = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"ec2.amazonaws.com"},"Action":"sts:AssumeRole"}]}"#;
    aws_sdk_iam::Client::new(conf)
        .create_role()
        .role_name("KarpenterNodeRole-demo")
        .assume_role_policy_document(trust)
        .send()
        .await
        .unwrap();
    subnets
}

fn zonal_claims(catalog: &Catalog) -> Vec<nodesmith::nodeclaim::NodeClaim> {
    let pool: nodesmith::apis::NodePool = serde_json::from_value(serde_json::json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"},
        "spec": {"template": {"spec": {
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
            "requirements": [
                {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["m5.large", "m5.xlarge"]},
                {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}
            ]
        }}}
    }))
    .unwrap();
    let pods: Vec<k8s_openapi::api::core::v1::Pod> = (0..3)
        .map(|i| {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("web-{i}"), "namespace": "default", "labels": {"app": "web"}},
                "spec": {
                    "containers": [{"name": "c", "image": "web", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
                    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                        "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}]
                }
            }))
            .unwrap()
        })
        .collect();
    let pools = [pool];
    let input = SolveInput {
        pods: &pods,
        node_pools: &pools,
        ..SolveInput::new(catalog)
    };
    let plan = solve(&input, &SolveOptions::default());
    plan.node_claims
        .iter()
        .map(|c| c.to_node_claim(jiff::Timestamp::now()))
        .collect()
}

fn claim_zones(claims: &[nodesmith::nodeclaim::NodeClaim]) -> BTreeSet<String> {
    claims
        .iter()
        .flat_map(|c| {
            c.requirements
                .iter()
                .filter(|r| r.key == labels::ZONE)
                .flat_map(|r| r.values.clone())
                .collect::<Vec<_>>()
        })
        .collect()
}

#[tokio::test]
async fn a_zonal_spread_deployment_launches_into_eu_west_1s_zones() {
    let m = moto().await;
    let conf = eu(&m).await;
    let st = table(&conf).await;
    let subnets = eu_world(&conf).await;
    let ec2 = aws_sdk_ec2::Client::new(&conf);

    // What the built-in catalog would plan: zones this region does not have.
    let builtin = claim_zones(&zonal_claims(nodesmith::catalog::builtin().unwrap()));
    assert!(
        !builtin.is_empty() && builtin.iter().all(|z| z.starts_with("us-east-1")),
        "{builtin:?}"
    );

    refresh::ensure_for_solving(&ec2, &st, &OnDemandSources::bundled_only().unwrap())
        .await
        .unwrap();
    let catalog = st.get_catalog().await.unwrap().unwrap();
    let claims = zonal_claims(&catalog);
    assert_eq!(claims.len(), 3, "one node per zone: {claims:?}");
    let want: BTreeSet<String> = ZONES.iter().map(|z| z.to_string()).collect();
    assert_eq!(claim_zones(&claims), want);

    let kube = KubeServer::start().await;
    let launcher = Launcher::new(
        &conf,
        KubeCluster::from_client(kube.lambda_client()),
        crate::launch_fixtures::launch_config(),
    );
    let class = EC2NodeClassSpec {
        ami_selector_terms: vec![AmiSelectorTerm {
            alias: Some("al2023@latest".into()),
            ..Default::default()
        }],
        subnet_selector_terms: vec![SelectorTerm {
            tags: BTreeMap::from([("karpenter.sh/discovery".to_string(), CLUSTER.to_string())]),
            ..Default::default()
        }],
        security_group_selector_terms: vec![SelectorTerm {
            tags: BTreeMap::from([("karpenter.sh/discovery".to_string(), CLUSTER.to_string())]),
            ..Default::default()
        }],
        role: Some("KarpenterNodeRole-demo".into()),
        ..Default::default()
    };
    kube.apply(
        &serde_json::json!({"apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass",
        "metadata": {"name": "default"}, "spec": class}),
    )
    .unwrap();
    let mut launched = BTreeSet::new();
    for c in &claims {
        st.create_node_claim(c).await.unwrap();
        let req = LaunchRequest::new(&c.name);
        let got = launcher.launch(&req).await.unwrap();
        let LaunchOutcome::Launched(l) = got else {
            panic!("expected a launch, got {got:?}")
        };
        let zone = l.zone.clone().unwrap();
        let id = l.instance_id.clone().unwrap();
        let i = ec2.describe_instances().instance_ids(&id).send().await.unwrap();
        let i = &i.reservations()[0].instances()[0];
        assert_eq!(
            subnets.get(i.subnet_id().unwrap()),
            Some(&zone),
            "launched in its claim's zone"
        );
        launched.insert(zone);
    }
    assert_eq!(launched, want, "one instance in each eu-west-1 zone");
}
