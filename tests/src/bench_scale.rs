//! The scale harness behind `scripts/bench-scale` (`nodesmith-local bench-scale`):
//! seeds moto and the Kubernetes API test server directly with a cluster of N
//! nodes and P pods per node, then runs the real function code once per
//! scenario and prints one JSON line per scenario.
//!
//! The cluster: three NodePools (on-demand m5/c5, spot m5/r5, on-demand r5),
//! three zones, one EC2 instance per node (RunInstances in batches, then the
//! claim tag per instance), a registered Ready Node, an Initialized claim in
//! the state table, P pods bound to it (five PDB-covered apps among fifty),
//! and one pod of a DaemonSet on every node. About 1% more instances have a
//! Launched claim and an unregistered Node, for the sweep to register.
//!
//! Scenarios share one cluster and run in the order given, so a later one
//! sees what an earlier one changed (the sweep's drains, provision's claims).
//! The burst is the exception: it plays pending pods through a whole local
//! cloud (forwarder, functions as processes, kubelets), first and on its own.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use aws_lambda_events::sqs::SqsEvent;
use futures::StreamExt;
use jiff::{SignedDuration, Timestamp};
use nodesmith::apis::ec2nodeclass::EC2NodeClass;
use nodesmith::apis::nodepool::NodePool;
use nodesmith::ec2::Instances;
use nodesmith::interruption::handler::{InterruptConfig, Interrupter};
use nodesmith::kubernetes::KubeCluster;
use nodesmith::labels;
use nodesmith::nodeclaim::{NodeClaim, Phase};
use nodesmith::provisioning::{ProvisionConfig, Provisioner};
use nodesmith::requirements::{Requirement, Requirements};
use nodesmith::state::StateStore;
use nodesmith::sweep::{SweepConfig, Sweeper};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::capacity_units::{self, Consumed};
use crate::fault_proxy::FaultProxy;
use crate::kube_server::{KubeServer, NodeRegistration, bind_json};
use crate::local_cloud::aws::{self, DISCOVERY, TABLE};
use crate::local_cloud::burst::{self, BurstOptions};
use crate::local_cloud::{LocalCloud, Settings};
use crate::moto::{ZONES, moto};

const CLUSTER: &str = "bench";
/// Concurrent seeding calls to moto (one Python process).
const SEED_CONCURRENCY: usize = 8;
/// Instances per RunInstances call while seeding.
const RUN_BATCH: usize = 250;
/// Apps the pods belong to; the first [`PDB_APPS`] have a PodDisruptionBudget.
const APPS: usize = 50;
const PDB_APPS: usize = 5;
/// Spot warnings of the storm scenario.
const STORM: usize = 200;

/// A scenario of the harness.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// One sweep over the whole cluster.
    Sweep,
    /// 1,000 pending pods through one provision invocation.
    Provision,
    /// A batch of 10 spot interruption warnings through one interrupt invocation.
    Interrupt,
    /// 200 spot interruption warnings through 20 concurrent invocations of 10.
    Storm,
    /// One full claim list, as every sweep and solve reads it: its read units and item sizes.
    Claims,
    /// One whole-cluster pod list, as every solve reads it: the pages fetched
    /// and only scanned (the server's share), then read through the adapter.
    Pods,
}

impl Scenario {
    /// The scenario of a name (`sweep`, `provision`, `interrupt`, `storm`).
    pub fn parse(name: &str) -> Option<Scenario> {
        match name {
            "sweep" => Some(Scenario::Sweep),
            "provision" => Some(Scenario::Provision),
            "interrupt" => Some(Scenario::Interrupt),
            "storm" => Some(Scenario::Storm),
            "claims" => Some(Scenario::Claims),
            "pods" => Some(Scenario::Pods),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Scenario::Sweep => "sweep",
            Scenario::Provision => "provision",
            Scenario::Interrupt => "interrupt",
            Scenario::Storm => "storm",
            Scenario::Claims => "claims",
            Scenario::Pods => "pods",
        }
    }
}

/// What to seed and run.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Registered, initialized nodes.
    pub nodes: usize,
    /// Application pods bound to each node (plus one DaemonSet pod).
    pub pods_per_node: usize,
    /// Scenarios, run in this order on the same cluster.
    pub scenarios: Vec<Scenario>,
    /// The burst, if asked for: played through a whole local cloud of its
    /// own (the function binaries beside this one), before the seeding.
    pub burst: Option<BurstOptions>,
    /// The build profile the binary was made with, printed on every line.
    pub profile: &'static str,
}

/// The burst's name in `--scenario`.
pub const BURST: &str = "burst";

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            nodes: 5_000,
            pods_per_node: 30,
            scenarios: vec![
                Scenario::Claims,
                Scenario::Sweep,
                Scenario::Provision,
                Scenario::Interrupt,
                Scenario::Storm,
            ],
            burst: Some(BurstOptions {
                pods: 20_000,
                deployments: 100,
                // As long as any other scenario may take.
                timeout: Duration::from_secs(900),
            }),
            profile: if cfg!(debug_assertions) { "debug" } else { "optimised" },
        }
    }
}

/// One node of the seeded cluster.
struct Seed {
    pool: &'static str,
    capacity_type: &'static str,
    instance_type: &'static str,
    zone: &'static str,
    cpu: &'static str,
    memory: &'static str,
}

/// The mix: half general on-demand, 40% spot, 10% memory on-demand; zones round-robin.
fn seed_of(n: usize) -> Seed {
    let zone = ZONES[n % ZONES.len()];
    let flip = (n / ZONES.len()).is_multiple_of(2);
    let (pool, capacity_type, instance_type, cpu, memory) = match n % 10 {
        0..=4 if flip => ("general", "on-demand", "m5.xlarge", "4", "16Gi"),
        0..=4 => ("general", "on-demand", "c5.2xlarge", "8", "16Gi"),
        5..=8 if flip => ("spot", "spot", "m5.2xlarge", "8", "32Gi"),
        5..=8 => ("spot", "spot", "r5.xlarge", "4", "32Gi"),
        _ => ("memory", "on-demand", "r5.xlarge", "4", "32Gi"),
    };
    Seed {
        pool,
        capacity_type,
        instance_type,
        zone,
        cpu,
        memory,
    }
}

/// The NodePools: name, instance families, capacity type.
const POOLS: [(&str, &[&str], &str); 3] = [
    ("general", &["m5", "c5"], "on-demand"),
    ("spot", &["m5", "r5"], "spot"),
    ("memory", &["r5"], "on-demand"),
];

/// The requirements and instance-type options a solve gives a claim of a
/// pool: its families in the built-in catalog, cheapest offering first, as
/// many as a claim keeps.
fn claim_requirements(
    pool: &str,
    families: &[&str],
    capacity_type: &str,
) -> Result<(Requirements, Vec<String>), String> {
    let mut reqs = Requirements::default();
    reqs.add(Requirement::in_values(labels::aws::FAMILY, families));
    reqs.add(Requirement::in_values(labels::CAPACITY_TYPE, &[capacity_type]));
    reqs.add(Requirement::in_values(labels::NODEPOOL, &[pool]));
    let catalog = nodesmith::catalog::builtin::builtin().map_err(|e| e.to_string())?;
    let mut priced: Vec<(f64, String)> = catalog
        .resolve(None)
        .into_iter()
        .filter(|t| {
            t.labels
                .get(labels::aws::FAMILY)
                .is_some_and(|f| families.contains(&f.as_str()))
        })
        .filter_map(|t| t.cheapest_offering(&reqs).map(|o| (o.price, t.name.clone())))
        .collect();
    priced.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
    let options: Vec<String> = priced
        .into_iter()
        .map(|(_, name)| name)
        .take(nodesmith::nodeclaim::MAX_INSTANCE_TYPE_OPTIONS)
        .collect();
    reqs.add(Requirement::in_values(labels::INSTANCE_TYPE, &options));
    Ok((reqs, options))
}

fn pool_json(name: &str, families: &[&str], capacity_type: &str) -> Value {
    json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name}, "spec": {
        "template": {"spec": {
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
            "requirements": [
                {"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": families},
                {"key": labels::CAPACITY_TYPE, "operator": "In", "values": [capacity_type]}
            ]
        }},
        "disruption": {"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "0s"}
    }})
}

fn pod_json(name: &str, app: &str, owner: (&str, &str), cpu: &str, memory: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"), "labels": {"app": app},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": owner.0, "name": owner.1, "uid": format!("uid-{}", owner.1), "controller": true}]},
        "spec": {"containers": [{"name": "c", "image": app, "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}})
}

/// The seeded cluster and the clients the functions use (through the counting proxy).
struct Bench {
    kube: KubeServer,
    proxy: FaultProxy,
    store: StateStore,
    sqs: aws_sdk_sqs::Client,
    world: aws::World,
    /// Spot instances with a registered node, for the interruption warnings.
    spot_instances: Vec<String>,
    pods: usize,
}

fn err(step: &str) -> impl Fn(String) -> String + '_ {
    move |e| format!("{step}: {e}")
}

/// Seeds the cluster; progress goes to `log`.
async fn seed(options: &BenchOptions, log: &mut dyn FnMut(String)) -> Result<(Bench, Vec<crate::moto::Moto>), String> {
    let m = moto().await;
    let direct = m.sdk_config().await;
    let world = aws::create(&direct, CLUSTER, 30).await.map_err(|e| e.to_string())?;
    let proxy = FaultProxy::start(m.endpoint()).await;
    proxy.count_units();
    let counted = m.sdk_config_at(proxy.endpoint()).await;
    let kube = KubeServer::start().await;
    // Watches are not used here: old versions only cost memory.
    kube.set_history_limit(1_000);
    let class = kube
        .apply(&json!({"apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "default"}, "spec": {
            "role": world.node_role,
            "amiSelectorTerms": [{"alias": "al2023@latest"}],
            "subnetSelectorTerms": [{"tags": {DISCOVERY: CLUSTER}}],
            "securityGroupSelectorTerms": [{"tags": {DISCOVERY: CLUSTER}}]
        }}))
        .map_err(err("EC2NodeClass"))?;
    let class: EC2NodeClass = serde_json::from_value(class).map_err(|e| e.to_string())?;
    let mut pool_hash = BTreeMap::new();
    let mut pool_requirements = BTreeMap::new();
    for (name, families, ct) in POOLS {
        pool_requirements.insert(name, claim_requirements(name, families, ct)?);
        let v = kube.apply(&pool_json(name, families, ct)).map_err(err("NodePool"))?;
        let pool: NodePool = serde_json::from_value(v).map_err(|e| e.to_string())?;
        pool_hash.insert(name, pool.hash());
    }
    kube.apply(&json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "node-agent", "namespace": "default", "uid": "uid-node-agent"},
        "spec": {"selector": {"matchLabels": {"app": "node-agent"}}, "template": {"metadata": {"labels": {"app": "node-agent"}},
            "spec": {"containers": [{"name": "c", "image": "agent", "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]}}}}))
        .map_err(err("DaemonSet"))?;
    for a in 0..PDB_APPS {
        kube.apply(&json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": format!("app-{a}"), "namespace": "default"},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": format!("app-{a}")}}}}))
            .map_err(err("PodDisruptionBudget"))?;
    }

    // Instances: registered nodes, then ~1% more whose nodes have not registered.
    let unregistered = (options.nodes / 100).clamp(1, 50);
    let total = options.nodes + unregistered;
    let started = Instant::now();
    let ec2 = aws_sdk_ec2::Client::new(&direct);
    let mut groups: BTreeMap<(&str, &str, &str), Vec<usize>> = BTreeMap::new();
    for n in 0..total {
        let s = seed_of(n);
        groups.entry((s.pool, s.instance_type, s.zone)).or_default().push(n);
    }
    let mut ids = vec![String::new(); total];
    for ((pool, instance_type, zone), nodes) in &groups {
        for chunk in nodes.chunks(RUN_BATCH) {
            let tag = |k: &str, v: &str| aws_sdk_ec2::types::Tag::builder().key(k).value(v).build();
            let tags = aws_sdk_ec2::types::TagSpecification::builder()
                .resource_type(aws_sdk_ec2::types::ResourceType::Instance)
                .tags(tag(&nodesmith::ec2::instances::owned_tag_key(CLUSTER), "owned"))
                .tags(tag(nodesmith::ec2::instances::CLUSTER_NAME_TAG, CLUSTER))
                .tags(tag(nodesmith::ec2::instances::LAUNCHED_BY_TAG, CLUSTER))
                .tags(tag(labels::NODEPOOL, pool))
                .tags(tag(labels::EC2NODECLASS, "default"))
                .build();
            let count = i32::try_from(chunk.len()).map_err(|e| e.to_string())?;
            let out = ec2
                .run_instances()
                .image_id(crate::moto::SEEDED_AMI)
                .instance_type(aws_sdk_ec2::types::InstanceType::from(*instance_type))
                .placement(
                    aws_sdk_ec2::types::Placement::builder()
                        .availability_zone(*zone)
                        .build(),
                )
                .min_count(count)
                .max_count(count)
                .tag_specifications(tags)
                .send()
                .await
                .map_err(|e| format!("RunInstances: {e:?}"))?;
            for (n, i) in chunk.iter().zip(out.instances()) {
                ids[*n] = i.instance_id().unwrap_or_default().to_string();
            }
        }
    }
    log(format!(
        "{total} instances run in {:.1} s",
        started.elapsed().as_secs_f64()
    ));

    let claim_name = |n: usize| format!("{}-{n:05}", seed_of(n).pool);
    let started = Instant::now();
    let tagged: Vec<Result<(), String>> = futures::stream::iter(0..total)
        .map(|n| {
            let (ec2, id, name) = (ec2.clone(), ids[n].clone(), claim_name(n));
            async move {
                ec2.create_tags()
                    .resources(id)
                    .tags(
                        aws_sdk_ec2::types::Tag::builder()
                            .key(labels::NODECLAIM)
                            .value(name)
                            .build(),
                    )
                    .send()
                    .await
                    .map(|_| ())
                    .map_err(|e| format!("CreateTags: {e:?}"))
            }
        })
        .buffer_unordered(SEED_CONCURRENCY)
        .collect()
        .await;
    tagged.into_iter().collect::<Result<Vec<()>, String>>()?;
    log(format!("claim tags in {:.1} s", started.elapsed().as_secs_f64()));

    // Claims, written straight to the table (not through the proxy: seeding is not measured).
    let seed_store = StateStore::new(aws_sdk_dynamodb::Client::new(&direct), TABLE);
    let two_hours_ago = Timestamp::now()
        .checked_sub(SignedDuration::from_hours(2))
        .map_err(|e| e.to_string())?;
    let class_hash = class.hash();
    let started = Instant::now();
    let claims: Vec<NodeClaim> = (0..total)
        .map(|n| {
            let s = seed_of(n);
            let registered = n < options.nodes;
            let mut c = NodeClaim::pending(claim_name(n), s.pool, "default");
            // What a solve writes: the pool's requirements and the cheapest options.
            if let Some((reqs, types)) = pool_requirements.get(s.pool) {
                c.set_requirements(reqs);
                c.instance_type_options = types.clone();
            }
            c.labels.insert(labels::NODEPOOL.into(), s.pool.into());
            let pods = options.pods_per_node as i64;
            for (resource, quantity) in [
                ("cpu", format!("{}m", 100 * (pods + 1))),
                ("memory", format!("{}Mi", 256 * pods + 128)),
                ("pods", (pods + 1).to_string()),
            ] {
                if let Ok(q) = nodesmith::quantity::Quantity::parse(&quantity) {
                    c.resources.set(resource, q);
                }
            }
            c.phase = if registered {
                Phase::Initialized
            } else {
                Phase::Launched
            };
            c.instance_id = Some(ids[n].clone());
            c.provider_id = Some(format!("aws:///{}/{}", s.zone, ids[n]));
            c.instance_type = Some(s.instance_type.to_string());
            c.zone = Some(s.zone.to_string());
            c.capacity_type = Some(s.capacity_type.to_string());
            c.price = Some(crate::local_cloud::census::offering_price(
                s.instance_type,
                s.zone,
                s.capacity_type,
            ));
            c.node_name = registered.then(|| node_name(n));
            c.nodepool_hash = pool_hash.get(s.pool).cloned();
            c.nodeclass_hash = Some(class_hash.clone());
            c.timestamps.created = Some(two_hours_ago);
            c.timestamps.launched = Some(two_hours_ago);
            if registered {
                c.timestamps.registered = Some(two_hours_ago);
                c.timestamps.initialized = Some(two_hours_ago);
            }
            c
        })
        .collect();
    let written: Vec<Result<NodeClaim, String>> = futures::stream::iter(claims.iter())
        .map(|c| {
            let store = seed_store.clone();
            async move { store.create_node_claim(c).await.map_err(|e| e.to_string()) }
        })
        .buffer_unordered(SEED_CONCURRENCY)
        .collect()
        .await;
    written.into_iter().collect::<Result<Vec<_>, String>>()?;
    log(format!(
        "{total} claims written in {:.1} s",
        started.elapsed().as_secs_f64()
    ));

    // Nodes and pods, straight into the test server's store.
    let catalog = nodesmith::catalog::builtin().ok();
    let started = Instant::now();
    let mut pods = 0;
    let mut spot_instances = Vec::new();
    for n in 0..total {
        let s = seed_of(n);
        let registered = n < options.nodes;
        let mut node_labels = BTreeMap::from([
            (labels::NODEPOOL.to_string(), s.pool.to_string()),
            (labels::EC2NODECLASS.to_string(), "default".to_string()),
        ]);
        let mut taints = Vec::new();
        if registered {
            node_labels.insert(labels::REGISTERED.to_string(), "true".to_string());
            node_labels.insert(labels::INITIALIZED.to_string(), "true".to_string());
        } else {
            taints.push(format!("{}=:NoExecute", labels::UNREGISTERED_TAINT_KEY));
        }
        let reg = NodeRegistration {
            name: node_name(n),
            instance_id: ids[n].clone(),
            instance_type: s.instance_type.to_string(),
            zone: s.zone.to_string(),
            capacity_type: s.capacity_type.to_string(),
            arch: "amd64".to_string(),
            labels: node_labels,
            taints,
            capacity: BTreeMap::from([
                ("cpu".to_string(), s.cpu.to_string()),
                ("memory".to_string(), s.memory.to_string()),
                ("pods".to_string(), "58".to_string()),
            ]),
            allocatable: BTreeMap::new(),
        };
        if !registered {
            kube.register_node(&reg).map_err(err("Node"))?;
            continue;
        }
        // A registered Node carries what the sweep's registration writes, so
        // the sweep finds it joined (and does not register it again).
        let update = nodesmith::registration::registration_update(&claims[n], catalog);
        let mut node = reg.to_node();
        let meta = &mut node["metadata"];
        for (k, v) in &update.labels {
            meta["labels"][k] = json!(v);
        }
        for (k, v) in &update.annotations {
            meta["annotations"][k] = json!(v);
        }
        meta["finalizers"] = json!(update.finalizers);
        kube.apply(&node).map_err(err("Node"))?;
        if s.capacity_type == "spot" {
            spot_instances.push(ids[n].clone());
        }
        let mut agent = pod_json(
            &format!("node-agent-{n:05}"),
            "node-agent",
            ("DaemonSet", "node-agent"),
            "100m",
            "128Mi",
        );
        bind_json(&mut agent, &node_name(n));
        kube.apply(&agent).map_err(err("Pod"))?;
        for p in 0..options.pods_per_node {
            let app = format!("app-{}", (n * options.pods_per_node + p) % APPS);
            let mut pod = pod_json(
                &format!("{app}-{n:05}-{p:02}"),
                &app,
                ("ReplicaSet", &app),
                "100m",
                "256Mi",
            );
            bind_json(&mut pod, &node_name(n));
            kube.apply(&pod).map_err(err("Pod"))?;
        }
        pods += options.pods_per_node + 1;
    }
    log(format!(
        "{} nodes ({unregistered} unregistered) and {pods} pods in {:.1} s",
        total,
        started.elapsed().as_secs_f64()
    ));
    let bench = Bench {
        kube,
        store: StateStore::new(aws_sdk_dynamodb::Client::new(&counted), TABLE),
        sqs: aws_sdk_sqs::Client::new(&counted),
        proxy,
        world,
        spot_instances,
        pods,
    };
    Ok((bench, vec![m]))
}

/// What is measured around one scenario.
#[derive(Serialize)]
struct Figures {
    scenario: &'static str,
    nodes: usize,
    pods: usize,
    profile: &'static str,
    wall_ms: u128,
    rss_before_mb: u64,
    peak_rss_mb: u64,
    rss_note: &'static str,
    /// The function's own process (sweep, provision, interrupt), as Lambda's
    /// "Max Memory Used" counts it.
    function_memory: Option<FunctionMemory>,
    kube_requests: usize,
    kube_response_bytes: u64,
    dynamodb_calls: BTreeMap<String, usize>,
    /// Read and write units as DynamoDB would bill them, computed at the proxy
    /// from the items each call carried (see `capacity_units`): the total and
    /// by action and partition.
    dynamodb_consumed: Consumed,
    dynamodb_consumed_by_call: BTreeMap<String, Consumed>,
    /// Milliseconds of `wall_ms` during which some AWS call waited for moto:
    /// the local double's pace (moto is one Python process), not nodesmith's.
    aws_wait_ms: u128,
    /// Milliseconds the calls of each AWS action waited for moto, summed over
    /// concurrent calls (so they may add up to more than `aws_wait_ms`).
    aws_upstream_ms: BTreeMap<String, u128>,
    aws_other_calls: BTreeMap<String, usize>,
    outcome: Value,
}

const DYNAMODB_ACTIONS: &[&str] = &[
    "GetItem",
    "PutItem",
    "UpdateItem",
    "DeleteItem",
    "Query",
    "Scan",
    "BatchGetItem",
    "BatchWriteItem",
    "TransactWriteItems",
    "TransactGetItems",
];

fn calls_since(before: &BTreeMap<String, usize>, after: &BTreeMap<String, usize>) -> BTreeMap<String, usize> {
    after
        .iter()
        .map(|(a, n)| (a.clone(), n - before.get(a).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

fn cluster(kube: &KubeServer) -> KubeCluster {
    KubeCluster::from_client(kube.lambda_client())
}

/// Counts of values by the name of their variant (the text before `(` or `{`).
fn kinds<T: std::fmt::Debug>(items: &[T]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for i in items {
        let s = format!("{i:?}");
        let kind = s.split(['(', '{', ' ']).next().unwrap_or_default().to_string();
        *out.entry(kind).or_insert(0) += 1;
    }
    out
}

/// The seeded Node of index `n`.
fn node_name(n: usize) -> String {
    format!("ip-node-{n:05}.ec2.internal")
}

/// Spot interruption warnings for `instances`, as SQS records.
fn spot_warnings<'a>(instances: impl Iterator<Item = &'a String>, now: Timestamp) -> Vec<(String, String)> {
    instances
        .enumerate()
        .map(|(i, id)| {
            let body = json!({"version": "0", "id": format!("warning-{id}"), "detail-type": "EC2 Spot Instance Interruption Warning",
                "source": "aws.ec2", "account": "123456789012", "time": nodesmith::interruption::rfc3339(&now),
                "region": "us-east-1", "resources": [], "detail": {"instance-id": id, "instance-action": "terminate"}});
            (format!("m{i}"), body.to_string())
        })
        .collect()
}

/// An interrupt function with its own Kubernetes client.
fn interrupter(bench: &Bench) -> Interrupter<KubeCluster> {
    interrupt_function(
        cluster(&bench.kube),
        bench.store.clone(),
        bench.sqs.clone(),
        &bench.world.launch.url,
        &bench.world.pending.url,
    )
}

/// The interrupt function over these clients and queues.
fn interrupt_function(
    cluster: KubeCluster,
    store: StateStore,
    sqs: aws_sdk_sqs::Client,
    launch_queue_url: &str,
    pending_queue_url: &str,
) -> Interrupter<KubeCluster> {
    Interrupter::new(
        cluster,
        store,
        sqs,
        InterruptConfig::new(launch_queue_url, pending_queue_url),
    )
}

/// A node PATCH (the interrupt scenarios' only node writes: taints).
fn is_taint(r: &crate::kube_server::RequestRecord) -> bool {
    r.method == http::Method::PATCH && r.uri.starts_with("/api/v1/nodes/")
}

/// A pod eviction.
fn is_eviction(r: &crate::kube_server::RequestRecord) -> bool {
    r.method == http::Method::POST && r.uri.contains("/eviction")
}

/// Every page of a list at `path`, as the adapter asks for them, only
/// scanned for the continue token: (pages, bytes).
async fn fetch_pages(client: &kube::Client, path: &str) -> Result<(usize, usize), String> {
    /// What a page is read for; serde skips the items without building them.
    #[derive(serde::Deserialize)]
    struct Page {
        metadata: PageMeta,
    }
    #[derive(serde::Deserialize)]
    struct PageMeta {
        #[serde(rename = "continue", default)]
        continue_: String,
    }
    let limit = nodesmith::kubernetes::kube_cluster::LIST_PAGE_SIZE;
    let (mut pages, mut bytes, mut next) = (0, 0, String::new());
    loop {
        let token: String = form_urlencoded::byte_serialize(next.as_bytes()).collect();
        let uri = format!("{path}?limit={limit}&continue={token}");
        let request = http::Request::get(uri).body(Vec::new()).map_err(|e| e.to_string())?;
        let text = client.request_text(request).await.map_err(|e| e.to_string())?;
        let page: Page = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        pages += 1;
        bytes += text.len();
        if page.metadata.continue_.is_empty() {
            return Ok((pages, bytes));
        }
        next = page.metadata.continue_;
    }
}

/// The middle value (the lower of the two middle ones), if any.
fn median(mut values: Vec<u128>) -> Option<u128> {
    values.sort_unstable();
    values.get(values.len().saturating_sub(1) / 2).copied()
}

async fn run_scenario(bench: &Bench, options: &BenchOptions, scenario: Scenario) -> Result<Value, String> {
    let calls_before = bench.proxy.all_calls();
    let units_before = bench.proxy.consumed_units();
    let upstream_before = bench.proxy.upstream_time();
    let busy_before = bench.proxy.upstream_busy();
    let requests_before = bench.kube.requests().len();
    let bytes_before = bench.kube.response_bytes();
    let rss_before_mb = crate::memory_mb("self", "VmRSS:");
    // Resets VmHWM to the current RSS (Linux 4.0+), so the peak is this scenario's.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let started = Instant::now();
    let mut function = None;
    let outcome = match scenario {
        Scenario::Sweep => {
            let answer = in_own_process(bench, &FunctionRun::new(scenario, bench, None)).await?;
            function = Some(answer.memory);
            answer.outcome
        }
        Scenario::Provision => {
            let pending = 1_000;
            let mut refs = Vec::new();
            for i in 0..pending {
                let app = format!("burst-{}", i % 10);
                let name = format!("{app}-{i:04}");
                let mut pod = pod_json(&name, &app, ("ReplicaSet", &app), "500m", "1Gi");
                // As the scheduler leaves a pod no node can take.
                pod["status"] = json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]});
                let made = bench.kube.apply(&pod).map_err(err("Pod"))?;
                // The reference names the pod the server made (its uid, not the one sent).
                refs.push(
                    json!({"namespace": "default", "name": name, "uid": made["metadata"]["uid"], "resourceVersion": made["metadata"]["resourceVersion"]})
                        .to_string(),
                );
            }
            let event = crate::sqs::event(refs.into_iter().enumerate().map(|(i, b)| (format!("m{i}"), b)));
            let answer = in_own_process(bench, &FunctionRun::new(scenario, bench, Some(event))).await?;
            function = Some(answer.memory);
            let mut outcome = answer.outcome;
            outcome["pending_pods"] = json!(pending);
            outcome
        }
        Scenario::Interrupt => {
            let warnings = spot_warnings(bench.spot_instances.iter().rev().take(10), Timestamp::now());
            let sent = warnings.len();
            let event = crate::sqs::event(warnings);
            let (spawned, spawned_at) = (Instant::now(), Timestamp::now());
            let answer = in_own_process(bench, &FunctionRun::new(scenario, bench, Some(event))).await?;
            function = Some(answer.memory);
            // When the child began handling, on this process's clock.
            let t0 = spawned + answer.handle_started.duration_since(spawned_at).unsigned_abs();
            let drains = bench.store.drains().await.map_err(|e| e.to_string())?;
            // When the last node was tainted (a node PATCH: the only node
            // writes here) and the first pod evicted, from the test server's log.
            let requests = bench.kube.requests();
            let since = |r: &crate::kube_server::RequestRecord| r.at.saturating_duration_since(t0).as_millis();
            let seen = &requests[requests_before..];
            let mut outcome = answer.outcome;
            outcome["warnings"] = json!(sent);
            outcome["last_taint_ms"] = json!(seen.iter().filter(|r| is_taint(r)).map(since).max());
            outcome["first_eviction_ms"] = json!(seen.iter().filter(|r| is_eviction(r)).map(since).min());
            outcome["drain_records_after"] = json!(drains.len());
            outcome
        }
        Scenario::Claims => {
            let claims = bench.store.list_node_claims().await.map_err(|e| e.to_string())?;
            json!({"claims": claims.len()})
        }
        Scenario::Pods => {
            let fetching = Instant::now();
            let (pages, bytes) = fetch_pages(&bench.kube.lambda_client(), "/api/v1/pods").await?;
            let fetched_ms = fetching.elapsed().as_millis();
            let reading = Instant::now();
            let pods = nodesmith::kubernetes::Cluster::pods(&cluster(&bench.kube))
                .await
                .map_err(|e| e.to_string())?;
            json!({
                "pods": pods.len(),
                "pages": pages,
                "bytes": bytes,
                // Served and sent by the test server, scanned but not parsed.
                "fetched_ms": fetched_ms,
                // The same through the adapter: fetched and parsed into typed pods.
                "read_ms": reading.elapsed().as_millis(),
            })
        }
        Scenario::Storm => {
            // The first spot nodes (the interrupt scenario takes the last
            // ones), ten warnings per invocation as the queue's batch size,
            // all invocations at once as Lambda runs them.
            let warnings = spot_warnings(bench.spot_instances.iter().take(STORM), Timestamp::now());
            let sent = warnings.len();
            let batches: Vec<SqsEvent> = warnings.chunks(10).map(|b| crate::sqs::event(b.to_vec())).collect();
            let invocations = batches.len();
            let t0 = Instant::now();
            let outcomes = futures::future::join_all(batches.iter().map(|b| async move {
                // Each invocation its own client (and rate limit), as in Lambda.
                interrupter(bench).handle(b).await
            }))
            .await;
            let requests = bench.kube.requests();
            let since = |r: &crate::kube_server::RequestRecord| r.at.saturating_duration_since(t0).as_millis();
            let seen = &requests[requests_before..];
            // Per node: when it was tainted, and when its first pod was evicted
            // (the seeded pods are named `<app>-<node index>-<pod index>`).
            let mut tainted_at: BTreeMap<String, u128> = BTreeMap::new();
            let mut first_eviction_at: BTreeMap<String, u128> = BTreeMap::new();
            for r in seen {
                if is_taint(r) {
                    let node = r
                        .uri
                        .trim_start_matches("/api/v1/nodes/")
                        .split('?')
                        .next()
                        .unwrap_or_default();
                    tainted_at.entry(node.to_string()).or_insert_with(|| since(r));
                } else if is_eviction(r) {
                    let node = r
                        .uri
                        .rsplit('/')
                        .nth(1)
                        .and_then(|pod| pod.rsplit('-').nth(1))
                        .and_then(|n| n.parse::<usize>().ok())
                        .map(node_name);
                    if let Some(node) = node {
                        first_eviction_at.entry(node).or_insert_with(|| since(r));
                    }
                }
            }
            let drains = bench.store.drains().await.map_err(|e| e.to_string())?;
            let sum = |f: fn(&nodesmith::interruption::handler::InterruptOutcome) -> usize| {
                outcomes.iter().map(f).sum::<usize>()
            };
            json!({
                "warnings": sent,
                "invocations": invocations,
                "tainted": sum(|o| o.tainted.len()),
                "nodes_tainted": tainted_at.len(),
                "last_taint_ms": tainted_at.values().max(),
                "evictions": seen.iter().filter(|r| is_eviction(r)).count(),
                "nodes_with_an_eviction": first_eviction_at.len(),
                "last_first_eviction_ms": first_eviction_at.values().max(),
                "median_first_eviction_ms": median(first_eviction_at.values().copied().collect()),
                "drain_records_after": drains.len(),
                "drained": sum(|o| o.drained.len()),
                "replacements": sum(|o| o.replacements.len()),
                "handed_to_provision": sum(|o| o.handed_to_provision.len()),
                "failed_messages": sum(|o| o.failed.len()),
                "slowest_invocation_ms": t0.elapsed().as_millis(),
            })
        }
    };
    let wall_ms = started.elapsed().as_millis();
    let peak_rss_mb = crate::memory_mb("self", "VmHWM:");
    let mut calls = calls_since(&calls_before, &bench.proxy.all_calls());
    let units: BTreeMap<String, Consumed> = bench
        .proxy
        .consumed_units()
        .into_iter()
        .map(|(label, c)| {
            let since = units_before.get(&label).map_or(c, |b| c.since(b));
            (label, since)
        })
        .filter(|(_, c)| c.calls > 0)
        .collect();
    let dynamodb_calls: BTreeMap<String, usize> = DYNAMODB_ACTIONS
        .iter()
        .filter_map(|a| calls.remove(*a).map(|n| (a.to_string(), n)))
        .collect();
    let figures = Figures {
        scenario: scenario.name(),
        nodes: options.nodes,
        pods: bench.pods,
        profile: options.profile,
        wall_ms,
        rss_before_mb,
        peak_rss_mb,
        rss_note: if function.is_some() {
            "the harness process: the Kubernetes test server and the proxy (the function ran in its own process, moto in another)"
        } else {
            "the harness process: nodesmith's code plus the Kubernetes test server and the proxy (moto is another process)"
        },
        function_memory: function,
        kube_requests: bench.kube.requests().len() - requests_before,
        kube_response_bytes: bench.kube.response_bytes() - bytes_before,
        dynamodb_calls,
        dynamodb_consumed: capacity_units::total(&units),
        dynamodb_consumed_by_call: units,
        aws_wait_ms: bench.proxy.upstream_busy().saturating_sub(busy_before).as_millis(),
        aws_upstream_ms: bench
            .proxy
            .upstream_time()
            .into_iter()
            .map(|(action, d)| {
                let before = upstream_before.get(&action).copied().unwrap_or_default();
                (action, d.saturating_sub(before).as_millis())
            })
            .filter(|(_, ms)| *ms > 0)
            .collect(),
        aws_other_calls: calls,
        outcome,
    };
    serde_json::to_value(&figures).map_err(|e| e.to_string())
}

/// One function's run in a process of its own, as Lambda runs it, so its
/// memory is its own (the harness process also holds the test server): what
/// the harness hands `nodesmith-local bench-scale-function` on stdin. The
/// child reaches the test server and the proxy through the environment the
/// functions read (`NODESMITH_KUBE_URL`, `AWS_ENDPOINT_URL`, ...).
#[derive(Serialize, Deserialize)]
pub struct FunctionRun {
    scenario: String,
    launch_queue_url: String,
    pending_queue_url: String,
    event: Option<SqsEvent>,
}

impl FunctionRun {
    fn new(scenario: Scenario, bench: &Bench, event: Option<SqsEvent>) -> Self {
        FunctionRun {
            scenario: scenario.name().to_string(),
            launch_queue_url: bench.world.launch.url.clone(),
            pending_queue_url: bench.world.pending.url.clone(),
            event,
        }
    }
}

/// A function process's memory: its resident set when it started and its peak.
#[derive(Clone, Copy, Serialize, Deserialize)]
pub struct FunctionMemory {
    rss_at_start_mb: u64,
    peak_rss_mb: u64,
}

/// What the child answers: the scenario's outcome, when it began handling
/// (after building its clients) and its memory.
#[derive(Serialize, Deserialize)]
pub struct FunctionAnswer {
    outcome: Value,
    handle_started: Timestamp,
    memory: FunctionMemory,
}

/// Runs `run` in a child process of this binary and waits for its answer
/// (without holding up the test server, which serves it meanwhile).
async fn in_own_process(bench: &Bench, run: &FunctionRun) -> Result<FunctionAnswer, String> {
    use tokio::io::AsyncWriteExt;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let mut child = tokio::process::Command::new(exe)
        .arg(FUNCTION_COMMAND)
        .envs(bench.kube.env())
        .envs(crate::moto::child_env(bench.proxy.endpoint()))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start the function's process: {e}"))?;
    let input = serde_json::to_vec(run).map_err(|e| e.to_string())?;
    let mut stdin = child.stdin.take().ok_or("the function's process has no stdin")?;
    stdin
        .write_all(&input)
        .await
        .map_err(|e| format!("cannot hand the run over: {e}"))?;
    drop(stdin);
    let out = child.wait_with_output().await.map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("the function's process ended with {}", out.status));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("the function's process answered {e}"))
}

/// The subcommand that runs a [`FunctionRun`] read from stdin.
pub const FUNCTION_COMMAND: &str = "bench-scale-function";

/// The child's side: reads a [`FunctionRun`] from `input`, builds the
/// clients a function builds from its environment, runs the handler and
/// answers with its outcome and this process's memory.
pub async fn run_function(input: &[u8]) -> Result<FunctionAnswer, String> {
    // As the Lambda shell sets up every function's process.
    nodesmith::lambda::small_pages();
    let rss_at_start_mb = crate::memory_mb("self", "VmRSS:");
    let run: FunctionRun = serde_json::from_slice(input).map_err(|e| format!("the run handed over: {e}"))?;
    let config = nodesmith::transport::sdk_defaults().load().await;
    let cluster = KubeCluster::from_env(config.clone()).map_err(|e| e.to_string())?;
    let store = StateStore::new(aws_sdk_dynamodb::Client::new(&config), TABLE);
    let sqs = aws_sdk_sqs::Client::new(&config);
    let event = || {
        run.event
            .clone()
            .ok_or_else(|| format!("{} needs an event", run.scenario))
    };
    let handle_started = Timestamp::now();
    let started = Instant::now();
    let outcome = match Scenario::parse(&run.scenario) {
        Some(Scenario::Sweep) => {
            // The template's budget (NODESMITH_SWEEP_BUDGET), which the target is about.
            let mut sweep = SweepConfig::from_lookup(|k| (k == "NODESMITH_SWEEP_BUDGET").then(|| "45s".to_string()))
                .map_err(|e| e.to_string())?;
            sweep.pending_queue_url = Some(run.pending_queue_url.clone());
            sweep.launch_queue_url = Some(run.launch_queue_url.clone());
            let sweeper = Sweeper::new(
                cluster,
                store,
                Instances::new(aws_sdk_ec2::Client::new(&config), CLUSTER),
                sqs,
                sweep,
            );
            let report = sweeper.run().await.map_err(|e| e.to_string())?;
            json!({
                "handle_ms": started.elapsed().as_millis(),
                "skipped": report.skipped,
                "done": kinds(&report.done),
                "failed": report.failed.len(),
                "deferred": report.deferred.len(),
                "solve_requested": report.solve_requested.is_some(),
                "disruption": {
                    "started": report.disruption.started.len(),
                    "launched": report.disruption.launched.len(),
                    "draining": report.disruption.draining.len(),
                    "terminated": report.disruption.terminated.len(),
                    "abandoned": report.disruption.abandoned.len(),
                    "blocked": report.disruption.blocked.len(),
                    "failed": report.disruption.failed.len(),
                    "deferred": report.disruption.deferred,
                    // Every node consolidation could take, and those its deadline left untried.
                    "consolidation_candidates": report.disruption.consolidation.map(|c| c.candidates),
                    "consolidation_unexamined": report.disruption.consolidation.map(|c| c.unexamined),
                },
                "unreadable_claims": report.unreadable_claims,
            })
        }
        Some(Scenario::Provision) => {
            let provisioner = Provisioner::new(cluster, store, sqs, ProvisionConfig::new(&run.launch_queue_url));
            let outcome = provisioner.handle(&event()?).await;
            json!({
                "handle_ms": started.elapsed().as_millis(),
                "claims_created": outcome.created.len(),
                "placed_on_existing": outcome.placed_on_existing,
                "unschedulable": outcome.unschedulable.len(),
                "gone": outcome.gone,
                "malformed": outcome.malformed,
                "failed_messages": outcome.failed.len(),
                "handed_on": outcome.handed_on,
                "events": format!("{:?}", outcome.events),
            })
        }
        Some(Scenario::Interrupt) => {
            let interrupter = interrupt_function(cluster, store, sqs, &run.launch_queue_url, &run.pending_queue_url);
            let outcome = interrupter.handle(&event()?).await;
            json!({
                "handle_ms": started.elapsed().as_millis(),
                "tainted": outcome.tainted.len(),
                "drained": outcome.drained.len(),
                "replacements": outcome.replacements.len(),
                "handed_to_provision": outcome.handed_to_provision.len(),
                "removed": outcome.removed.len(),
                "failed_messages": outcome.failed.len(),
                "ignored": outcome.ignored,
            })
        }
        _ => return Err(format!("no function runs the scenario {:?} on its own", run.scenario)),
    };
    Ok(FunctionAnswer {
        outcome,
        handle_started,
        memory: FunctionMemory {
            rss_at_start_mb,
            peak_rss_mb: crate::memory_mb("self", "VmHWM:"),
        },
    })
}

/// Plays a burst through a local cloud started for it: one JSON line of the
/// burst's report, with this process's memory (the test API server's).
async fn run_burst(options: &BurstOptions, profile: &'static str) -> Result<Value, String> {
    // The queues, the relaunch and the forwarder's re-sends as deployed (the
    // local cloud's defaults, for tests, bring a message back after 10 s,
    // relaunch a claim after 5 s and re-send a pending pod after 30 s): a
    // launch batch takes longer than 10 s at this size, each message handed
    // out again while in hand is a second launch invocation, and 20,000 pods
    // re-sent every 30 s are a thousand SQS sends a second.
    let settings = Settings {
        reserved_concurrency: true,
        visibility_timeout: Duration::from_secs(360),
        relaunch_after: Duration::from_secs(30),
        resend_after: Duration::from_secs(300),
        ..Settings::from_lookup(|k| std::env::var(k).ok(), crate::bin_dir()).map_err(|e| e.to_string())?
    };
    let rss_before_mb = crate::memory_mb("self", "VmRSS:");
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let started = Instant::now();
    let cloud = LocalCloud::start(settings).await.map_err(|e| e.to_string())?;
    let report = burst::run(&cloud, options, &mut std::io::stderr()).await;
    cloud.stop().await;
    Ok(json!({
        "scenario": BURST,
        "pods": options.pods,
        "deployments": options.deployments,
        "profile": profile,
        "wall_ms": started.elapsed().as_millis(),
        "rss_before_mb": rss_before_mb,
        "peak_rss_mb": crate::memory_mb("self", "VmHWM:"),
        "rss_note": "this process: the Kubernetes API test server, the kubelets and the harness; the functions' own peaks are in the outcome",
        "outcome": report?,
    }))
}

/// Runs the burst if asked, then seeds the cluster and runs each scenario;
/// one JSON line per scenario on `lines`, progress on `log`. Fails on a
/// seeding error; a scenario's error is its line's `error`.
pub async fn run(
    options: &BenchOptions,
    lines: &mut dyn FnMut(String),
    log: &mut dyn FnMut(String),
) -> Result<(), String> {
    if let Some(b) = &options.burst {
        log(format!(
            "running a burst of {} pods across {} Deployments",
            b.pods, b.deployments
        ));
        let line = run_burst(b, options.profile)
            .await
            .unwrap_or_else(|e| json!({"scenario": BURST, "pods": b.pods, "error": e}));
        lines(line.to_string());
    }
    if options.scenarios.is_empty() {
        return Ok(());
    }
    log(format!(
        "seeding {} nodes x {} pods ({} build: figures of a debug build overstate times)",
        options.nodes, options.pods_per_node, options.profile
    ));
    let started = Instant::now();
    let (bench, _moto) = seed(options, log).await?;
    log(format!("seeded in {:.1} s", started.elapsed().as_secs_f64()));
    for &scenario in &options.scenarios {
        log(format!("running {}", scenario.name()));
        let line = match tokio::time::timeout(Duration::from_secs(900), run_scenario(&bench, options, scenario)).await {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => json!({"scenario": scenario.name(), "nodes": options.nodes, "error": e}),
            Err(_) => {
                json!({"scenario": scenario.name(), "nodes": options.nodes, "error": "did not finish within 900 s"})
            }
        };
        lines(line.to_string());
    }
    let denials = bench.kube.denials();
    if !denials.is_empty() {
        log(format!(
            "the functions' RBAC refused {} calls, e.g. {}",
            denials.len(),
            denials[0]
        ));
    }
    Ok(())
}
