//! What the local cloud holds at one moment, and whether it has converged:
//! the demo's view, and the invariants the crash, duplicate-delivery and
//! fault tests hold after every step (every pod running, no leaked
//! instance, no NodeClaim with two instances).

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_ec2::types::Filter;
use k8s_openapi::api::core::v1::{Node, Pod};
use nodesmith::nodeclaim::NodeClaim;

/// An instance EC2 has for the cluster.
#[derive(Clone, Debug)]
pub struct InstanceView {
    /// The instance id.
    pub id: String,
    /// Its type.
    pub instance_type: String,
    /// Its state (`pending`, `running`, `shutting-down`, `terminated`…).
    pub state: String,
    /// Its `karpenter.sh/nodeclaim` tag.
    pub claim: Option<String>,
    /// Price per hour of its offering (type, zone, capacity type) in the catalog moto was seeded from.
    pub price: f64,
}

impl InstanceView {
    /// Its vCPUs (0 for a type the built-in catalog does not know).
    pub fn cpu(&self) -> u64 {
        nodesmith::catalog::builtin()
            .ok()
            .and_then(|c| c.instance_types.iter().find(|t| t.name == self.instance_type))
            .and_then(|t| t.labels.get("karpenter.k8s.aws/instance-cpu"))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// Pending or running.
    pub fn live(&self) -> bool {
        self.state == "running" || self.state == "pending"
    }
}

/// The catalog price of an offering (0 when the catalog has none).
pub fn offering_price(instance_type: &str, zone: &str, capacity_type: &str) -> f64 {
    nodesmith::catalog::builtin()
        .ok()
        .and_then(|c| c.instance_types.iter().find(|t| t.name == instance_type))
        .and_then(|t| {
            t.offerings
                .iter()
                .find(|o| o.zone == zone && o.capacity_type == capacity_type)
        })
        .map_or(0.0, |o| o.price)
}

/// What the cloud holds at one moment.
#[derive(Clone, Debug, Default)]
pub struct World {
    /// Pods (of the workloads looked at).
    pub pods: Vec<Pod>,
    /// Every Node.
    pub nodes: Vec<Node>,
    /// Every NodeClaim in the state table.
    pub claims: Vec<NodeClaim>,
    /// Every instance tagged for the cluster.
    pub instances: Vec<InstanceView>,
}

impl World {
    /// Pods running.
    pub fn running(&self) -> usize {
        self.pods.iter().filter(|p| pod_running(p)).count()
    }

    /// The NodeClaims' names.
    pub fn claim_names(&self) -> BTreeSet<String> {
        self.claims.iter().map(|c| c.name.clone()).collect()
    }

    /// No disruption in flight: no node tainted `karpenter.sh/disrupted`, every claim has a Ready node.
    pub fn settled(&self) -> bool {
        !self.nodes.iter().any(|n| has_taint(n, "karpenter.sh/disrupted"))
            && self.nodes.len() == self.claims.len()
            && self.nodes.iter().all(node_ready)
    }

    /// Nodes no inflate pod is bound to.
    pub fn empty_nodes(&self) -> Vec<String> {
        let used: BTreeSet<&str> = self
            .pods
            .iter()
            .filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()))
            .collect();
        self.nodes
            .iter()
            .filter_map(|n| n.metadata.name.clone())
            .filter(|n| !used.contains(n.as_str()))
            .collect()
    }

    /// Nodes Ready.
    pub fn ready_nodes(&self) -> usize {
        self.nodes.iter().filter(|n| node_ready(n)).count()
    }

    /// Live instances tagged for the cluster that no NodeClaim names.
    pub fn leaked(&self) -> Vec<String> {
        let claims = self.claim_names();
        self.instances
            .iter()
            .filter(|i| i.live())
            .filter(|i| !i.claim.as_ref().is_some_and(|c| claims.contains(c)))
            .map(|i| i.id.clone())
            .collect()
    }

    /// The live instances' price per hour.
    pub fn cost_per_hour(&self) -> f64 {
        self.instances.iter().filter(|i| i.live()).map(|i| i.price).sum()
    }
}

/// Bound to a node and Running.
pub fn pod_running(p: &Pod) -> bool {
    p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()
        && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// The Node's Ready condition is True.
pub fn node_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The Node carries a taint with `key`.
pub fn has_taint(n: &Node, key: &str) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == key))
}

/// Every instance tagged for `cluster` (any state), every page of them: a
/// first page alone (moto's holds 100) left a burst's other instances out of
/// its double-launch and leak checks.
pub async fn instances(ec2: &aws_sdk_ec2::Client, cluster: &str) -> Result<Vec<InstanceView>, String> {
    let reservations: Vec<aws_sdk_ec2::types::Reservation> = ec2
        .describe_instances()
        .filters(
            Filter::builder()
                .name(format!("tag:kubernetes.io/cluster/{cluster}"))
                .values("owned")
                .build(),
        )
        .into_paginator()
        .items()
        .send()
        .collect::<Result<_, _>>()
        .await
        .map_err(|e| format!("{e:?}"))?;
    Ok(reservations
        .iter()
        .flat_map(|r| r.instances())
        .map(|i| InstanceView {
            price: offering_price(
                i.instance_type().map(|t| t.as_str()).unwrap_or_default(),
                i.placement().and_then(|p| p.availability_zone()).unwrap_or_default(),
                if i.instance_lifecycle().is_some_and(|l| l.as_str() == "spot") {
                    "spot"
                } else {
                    "on-demand"
                },
            ),
            id: i.instance_id().unwrap_or_default().to_string(),
            instance_type: i.instance_type().map(|t| t.as_str().to_string()).unwrap_or_default(),
            state: i
                .state()
                .and_then(|s| s.name())
                .map(|n| n.as_str().to_string())
                .unwrap_or_default(),
            claim: i
                .tags()
                .iter()
                .find(|t| t.key() == Some("karpenter.sh/nodeclaim"))
                .and_then(|t| t.value().map(str::to_string)),
        })
        .collect())
}

/// The pods whose `app` label `app` accepts.
pub fn observe_pods(cloud: &super::LocalCloud, app: impl Fn(&str) -> bool) -> Vec<Pod> {
    cloud
        .kube
        .pods()
        .into_iter()
        .filter(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app"))
                .is_some_and(|a| app(a))
        })
        .collect()
}

/// What the cloud holds now, counting only the pods whose `app` label `app` accepts.
pub async fn observe(cloud: &super::LocalCloud, app: impl Fn(&str) -> bool) -> Result<World, String> {
    let pods = observe_pods(cloud, app);
    let store = nodesmith::state::StateStore::new(aws_sdk_dynamodb::Client::new(&cloud.sdk), super::aws::TABLE);
    let claims = store
        .list_node_claims()
        .await
        .map_err(|e| format!("listing NodeClaims: {e}"))?;
    let instances = instances(&aws_sdk_ec2::Client::new(&cloud.sdk), &cloud.settings.cluster)
        .await
        .map_err(|e| format!("DescribeInstances: {e}"))?;
    Ok(World {
        pods,
        nodes: cloud.kube.nodes(),
        claims,
        instances,
    })
}

/// Every instance ever seen, with the NodeClaim it was tagged for.
#[derive(Clone, Debug, Default)]
pub struct Ledger(BTreeMap<String, Option<String>>);

impl Ledger {
    /// Notes the instances of `world`.
    pub fn note(&mut self, world: &World) {
        self.note_instances(&world.instances);
    }

    /// Notes `instances`.
    pub fn note_instances(&mut self, instances: &[InstanceView]) {
        for i in instances {
            self.0.entry(i.id.clone()).or_insert_with(|| i.claim.clone());
        }
    }

    /// Instances ever seen.
    pub fn launched(&self) -> usize {
        self.0.len()
    }

    /// NodeClaims that ever had more than one instance.
    pub fn double_launches(&self) -> Vec<String> {
        let mut by_claim: BTreeMap<&str, usize> = BTreeMap::new();
        for c in self.0.values().flatten() {
            *by_claim.entry(c).or_default() += 1;
        }
        by_claim
            .into_iter()
            .filter(|(_, n)| *n > 1)
            .map(|(c, _)| c.to_string())
            .collect()
    }
}
