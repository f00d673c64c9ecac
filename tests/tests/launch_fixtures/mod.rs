//! A cluster's AWS side in moto for the launch tests: VPC, tagged subnets and
//! security group, an EKS cluster, the state table and a Pending NodeClaim;
//! its EC2NodeClass is in a Kubernetes API test server, where `launch` reads it.

// Compiled into three test executables (aws, kube, stack); each uses only some of these.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use aws_config::SdkConfig;
use aws_config::retry::RetryConfig;
use aws_sdk_ec2::types::{ResourceType, Tag, TagSpecification};
use nodesmith::apis::ec2nodeclass::{AmiSelectorTerm, EC2NodeClassSpec, SelectorTerm};
use nodesmith::apis::{Taint, TaintEffect};
use nodesmith::kubernetes::KubeCluster;
use nodesmith::kubernetes::retry::RetryPolicy;
use nodesmith::launch::{LaunchConfig, Launcher};
use nodesmith::messages::LaunchRequest;
use nodesmith::nodeclaim::NodeClaim;
use nodesmith::state::{self, StateStore};
use nodesmith_tests::kube_server::KubeServer;
use nodesmith_tests::moto::Moto;

pub const CLUSTER: &str = "demo";
pub const TABLE: &str = "nodesmith-state";
pub const DISCOVERY: &str = "karpenter.sh/discovery";

/// What the fixture made.
pub struct World {
    /// The best subnet per zone (the one with the most free IPs).
    pub best_subnets: BTreeMap<String, String>,
    pub security_group: String,
}

/// Fast SDK retries so throttling tests do not sleep for seconds.
pub fn fast_retries(conf: SdkConfig) -> SdkConfig {
    conf.to_builder()
        .retry_config(
            RetryConfig::standard()
                .with_max_attempts(4)
                .with_initial_backoff(Duration::from_millis(20)),
        )
        .build()
}

fn tag(k: &str, v: &str) -> Tag {
    Tag::builder().key(k).value(v).build()
}

/// Creates the cluster's AWS resources in moto.
pub async fn world(m: &Moto) -> World {
    let conf = m.sdk_config().await;
    let ec2 = aws_sdk_ec2::Client::new(&conf);
    let vpc = ec2.create_vpc().cidr_block("10.0.0.0/16").send().await.unwrap();
    let vpc_id = vpc.vpc().unwrap().vpc_id().unwrap().to_string();
    let mut best = BTreeMap::new();
    // Two subnets in 1b: the /20 has more free IPs and must be chosen.
    let subnets = [
        ("us-east-1a", "10.0.1.0/24", true),
        ("us-east-1b", "10.0.2.0/24", true),
        ("us-east-1b", "10.0.16.0/20", true),
        ("us-east-1c", "10.0.3.0/24", true),
        ("us-east-1c", "10.0.64.0/18", false), // not tagged: never used
    ];
    let mut ids = Vec::new();
    for (zone, cidr, tagged) in subnets {
        let mut req = ec2
            .create_subnet()
            .vpc_id(&vpc_id)
            .cidr_block(cidr)
            .availability_zone(zone);
        if tagged {
            req = req.tag_specifications(
                TagSpecification::builder()
                    .resource_type(ResourceType::Subnet)
                    .tags(tag(DISCOVERY, CLUSTER))
                    .build(),
            );
        }
        let id = req
            .send()
            .await
            .unwrap()
            .subnet()
            .unwrap()
            .subnet_id()
            .unwrap()
            .to_string();
        ids.push(id.clone());
        if tagged && cidr != "10.0.2.0/24" {
            best.insert(zone.to_string(), id);
        }
    }
    let sg = discovered_security_group(&ec2, &vpc_id, "demo-nodes").await;
    let eks = aws_sdk_eks::Client::new(&conf);
    eks.create_cluster()
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
    state::create_table(&aws_sdk_dynamodb::Client::new(&conf), TABLE)
        .await
        .unwrap();
    // The node role the classes name, as a real account has it (nodesmith never makes roles).
    node_role(&conf, "KarpenterNodeRole-demo").await;
    World {
        best_subnets: best,
        security_group: sg,
    }
}

/// Creates an IAM role EC2 instances may assume.
pub async fn node_role(conf: &SdkConfig, name: &str) {
    let trust = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"ec2.amazonaws.com"},"Action":"sts:AssumeRole"}]}"#;
    aws_sdk_iam::Client::new(conf)
        .create_role()
        .role_name(name)
        .assume_role_policy_document(trust)
        .send()
        .await
        .unwrap();
}

/// A launcher whose AWS clients go to `endpoint` (moto or a proxy in front of
/// it) and which reads EC2NodeClasses from `kube`.
pub async fn launcher(m: &Moto, endpoint: &str, kube: &KubeServer) -> Launcher {
    launcher_with(m, endpoint, kube, None).await
}

/// A launcher that asks for solves on `pending_queue_url` when it gives a claim up.
pub async fn launcher_with(m: &Moto, endpoint: &str, kube: &KubeServer, pending_queue_url: Option<String>) -> Launcher {
    launcher_configured(
        m,
        endpoint,
        kube,
        LaunchConfig {
            pending_queue_url,
            ..launch_config()
        },
    )
    .await
}

/// The fixtures' launch settings: this table and cluster, the default lease and reserve.
pub fn launch_config() -> LaunchConfig {
    LaunchConfig {
        table: TABLE.into(),
        cluster_name: CLUSTER.into(),
        pending_queue_url: None,
        lease_ms: nodesmith::launch::LAUNCH_LEASE_MS,
        stack: None,
        reserve: nodesmith::launch::batch::LAUNCH_RESERVE,
    }
}

/// A launcher with `config`, its AWS calls sent to `endpoint`.
pub async fn launcher_configured(m: &Moto, endpoint: &str, kube: &KubeServer, config: LaunchConfig) -> Launcher {
    let conf = fast_retries(m.sdk_config_at(endpoint).await);
    // As the launch function: held to its own ClusterRole.
    let as_launch = nodesmith_tests::kube_server::Identity::Function(nodesmith_tests::kube_server::Function::Launch);
    let cluster = KubeCluster::from_client(kube.client_as(as_launch)).with_retry(RetryPolicy {
        attempts: 3,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
    });
    Launcher::new(&conf, cluster, config)
}

/// Takes and frees a claim's launch lease as if its holder's time had run out.
pub async fn expire_lease(st: &StateStore, claim: &str) {
    let later = state::now_ms() + 11 * 60 * 1000;
    let lease = st
        .acquire_lease(&format!("launch/{claim}"), "test-clock", 1000, later)
        .await
        .unwrap()
        .expect("an expired lease can be taken");
    st.release_lease(&lease, later).await.unwrap();
}

/// The store, straight to moto.
pub async fn store(m: &Moto) -> StateStore {
    StateStore::new(aws_sdk_dynamodb::Client::new(&m.sdk_config().await), TABLE)
}

/// An EC2NodeClass spec selecting the fixture's subnets and security group.
pub fn node_class(alias: &str) -> EC2NodeClassSpec {
    let discovery = BTreeMap::from([(DISCOVERY.to_string(), CLUSTER.to_string())]);
    EC2NodeClassSpec {
        ami_selector_terms: vec![AmiSelectorTerm {
            alias: Some(alias.into()),
            ..Default::default()
        }],
        subnet_selector_terms: vec![SelectorTerm {
            tags: BTreeMap::from([(DISCOVERY.to_string(), "*".to_string())]),
            ..Default::default()
        }],
        security_group_selector_terms: vec![SelectorTerm {
            tags: discovery,
            ..Default::default()
        }],
        role: Some("KarpenterNodeRole-demo".into()),
        tags: BTreeMap::from([("team".to_string(), "platform".to_string())]),
        ..Default::default()
    }
}

/// A Pending NodeClaim.
pub fn claim(name: &str, types: &[&str], capacity_types: &[&str]) -> NodeClaim {
    let req = serde_json::from_value(
        serde_json::json!({"key": "karpenter.sh/capacity-type", "operator": "In", "values": capacity_types}),
    )
    .unwrap();
    NodeClaim {
        requirements: vec![req],
        instance_type_options: types.iter().map(|t| t.to_string()).collect(),
        labels: BTreeMap::from([("workload".to_string(), "web".to_string())]),
        taints: vec![Taint::new("dedicated", Some("web"), TaintEffect::NoSchedule)],
        startup_taints: vec![Taint::new(
            "node.cilium.io/agent-not-ready",
            Some("true"),
            TaintEffect::NoExecute,
        )],
        ..NodeClaim::pending(name, "default", "default")
    }
}

/// Creates or replaces the EC2NodeClass `name` in the cluster.
pub fn put_class(kube: &KubeServer, name: &str, spec: &EC2NodeClassSpec) {
    kube.apply(&serde_json::json!({
        "apiVersion": "karpenter.k8s.aws/v1",
        "kind": "EC2NodeClass",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .unwrap();
}

/// Puts the claim's EC2NodeClass in the cluster as `class`, stores the claim,
/// and returns the request to launch it (its name only).
pub async fn pending(kube: &KubeServer, st: &StateStore, c: &NodeClaim, class: &EC2NodeClassSpec) -> LaunchRequest {
    put_class(kube, &c.node_class, class);
    st.create_node_claim(c).await.unwrap();
    LaunchRequest::new(&c.name)
}

/// Live instances tagged with a claim.
pub async fn instances_of(m: &Moto, claim: &str) -> Vec<aws_sdk_ec2::types::Instance> {
    let ec2 = aws_sdk_ec2::Client::new(&m.sdk_config().await);
    let out = ec2
        .describe_instances()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("tag:karpenter.sh/nodeclaim")
                .values(claim)
                .build(),
        )
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("instance-state-name")
                .values("pending")
                .values("running")
                .build(),
        )
        .send()
        .await
        .unwrap();
    out.reservations().iter().flat_map(|r| r.instances().to_vec()).collect()
}

/// A security group in `vpc_id` carrying the cluster's discovery tag; its id.
pub async fn discovered_security_group(ec2: &aws_sdk_ec2::Client, vpc_id: &str, name: &str) -> String {
    ec2.create_security_group()
        .group_name(name)
        .description("nodes")
        .vpc_id(vpc_id)
        .tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::SecurityGroup)
                .tags(tag(DISCOVERY, CLUSTER))
                .build(),
        )
        .send()
        .await
        .unwrap()
        .group_id()
        .unwrap()
        .to_string()
}

/// The newest version's data of launch template `name`.
pub async fn template_data(ec2: &aws_sdk_ec2::Client, name: &str) -> aws_sdk_ec2::types::ResponseLaunchTemplateData {
    let v = ec2
        .describe_launch_template_versions()
        .launch_template_name(name)
        .send()
        .await
        .unwrap();
    v.launch_template_versions()[0].launch_template_data().unwrap().clone()
}

/// Offerings the state table holds as unavailable now, sorted.
pub async fn marked_unavailable(st: &StateStore) -> Vec<nodesmith::state::OfferingKey> {
    let mut keys: Vec<_> = st
        .unavailable_offerings(state::now_secs())
        .await
        .unwrap()
        .into_iter()
        .map(|u| u.key)
        .collect();
    keys.sort();
    keys
}

/// An on-demand capacity reservation made through the real API, tagged
/// `team=<team>`; its id.
pub async fn capacity_reservation(
    ec2: &aws_sdk_ec2::Client,
    instance_type: &str,
    zone: &str,
    count: i32,
    team: &str,
) -> String {
    ec2.create_capacity_reservation()
        .instance_type(instance_type)
        .instance_platform(aws_sdk_ec2::types::CapacityReservationInstancePlatform::LinuxUnix)
        .availability_zone(zone)
        .instance_count(count)
        .instance_match_criteria(aws_sdk_ec2::types::InstanceMatchCriteria::Targeted)
        .tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::CapacityReservation)
                .tags(tag("team", team))
                .build(),
        )
        .send()
        .await
        .unwrap()
        .capacity_reservation()
        .and_then(|r| r.capacity_reservation_id())
        .unwrap()
        .to_string()
}

/// The fixture's world in `m`, a Kubernetes API test server, the state table
/// and a launcher talking to moto directly.
pub async fn launching(m: &Moto) -> (KubeServer, StateStore, Launcher) {
    world(m).await;
    let kube = KubeServer::start().await;
    let st = store(m).await;
    let l = launcher(m, m.endpoint(), &kube).await;
    (kube, st, l)
}
