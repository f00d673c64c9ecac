//! `nodesmith explain`: why a node is or is not being disrupted right now,
//! and why a pod is pending, from the live cluster and the state table,
//! through the same pure decisions the sweep and `provision` take (as
//! `simulate` does offline). What needs EC2 (drift by live resolution, EC2
//! status checks) is not evaluated, and the answer says so.

use std::fmt;
use std::str::FromStr;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;

use crate::disruption::{self, DecideOptions, Decisions};
use crate::kubernetes::{Cluster, ClusterError};
use crate::nodeclaim::NodeClaim;
use crate::scheduling::{Plan, PodRef, SolveOptions};
use crate::snapshot::Snapshot;
use crate::snapshot::live::{self, SnapshotError};
use crate::state::{DisruptionRecord, StateError, StateStore};
use crate::sweep::SweepConfig;

/// What to explain: `node/NAME`, `pod/NAMESPACE/NAME` or `pod/NAME` (namespace `default`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// A node.
    Node(String),
    /// A pod.
    Pod(PodRef),
}

/// A subject that is neither `node/NAME` nor `pod/[NAMESPACE/]NAME`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot explain {0:?}: name node/NAME, pod/NAMESPACE/NAME or pod/NAME")]
pub struct BadSubject(pub String);

impl FromStr for Subject {
    type Err = BadSubject;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadSubject(s.to_string());
        let parts: Vec<&str> = s.split('/').collect();
        if parts.iter().any(|p| p.trim().is_empty()) {
            return Err(bad());
        }
        match parts.as_slice() {
            ["node" | "nodes" | "no", name] => Ok(Subject::Node(name.to_string())),
            ["pod" | "pods" | "po", name] => Ok(Subject::Pod(PodRef {
                namespace: "default".into(),
                name: name.to_string(),
            })),
            ["pod" | "pods" | "po", namespace, name] => Ok(Subject::Pod(PodRef {
                namespace: namespace.to_string(),
                name: name.to_string(),
            })),
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Subject::Node(n) => write!(f, "node/{n}"),
            Subject::Pod(p) => write!(f, "pod/{}/{}", p.namespace, p.name),
        }
    }
}

/// The answer.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Explanation {
    /// What was asked about, as given back (`node/NAME`, `pod/NS/NAME`).
    pub subject: String,
    /// One line: what happens to it now.
    pub verdict: String,
    /// Why, one fact a line.
    pub details: Vec<String>,
    /// What this answer could not look at.
    pub not_evaluated: Vec<String>,
}

impl Explanation {
    fn new(subject: &Subject, verdict: impl Into<String>) -> Self {
        Explanation {
            subject: subject.to_string(),
            verdict: verdict.into(),
            details: Vec::new(),
            not_evaluated: Vec::new(),
        }
    }

    /// The explanation as text for a terminal.
    pub fn to_text(&self) -> String {
        let mut out = format!("{}: {}\n", self.subject, self.verdict);
        for d in &self.details {
            out.push_str(&format!("  - {d}\n"));
        }
        for n in &self.not_evaluated {
            out.push_str(&format!("  (not evaluated: {n})\n"));
        }
        out
    }
}

/// What a node's answer is drawn from.
#[derive(Debug, Clone)]
pub struct NodeInput {
    /// The cluster as the sweep's disruption pass reads it.
    pub snapshot: Snapshot,
    /// Every claim in the table.
    pub claims: Vec<NodeClaim>,
    /// Disruptions in progress.
    pub records: Vec<DisruptionRecord>,
    /// How the pass is decided (consolidation and repair settings, nominations, receiving nodes).
    pub options: DecideOptions,
}

/// Why `node` is or is not being disrupted (pure).
pub fn node(name: &str, input: &NodeInput) -> Explanation {
    let subject = Subject::Node(name.to_string());
    let Some(claim) = input.claims.iter().find(|c| c.node_name.as_deref() == Some(name)) else {
        let known = input
            .snapshot
            .nodes
            .iter()
            .any(|n| n.node.metadata.name.as_deref() == Some(name));
        let verdict = if known {
            "not a nodesmith node: nodesmith never disrupts it"
        } else {
            "no such node"
        };
        return Explanation::new(&subject, verdict);
    };
    let mut out = Explanation::new(&subject, "");
    out.details.push(format!(
        "NodeClaim {} of NodePool {}, phase {:?}",
        claim.name, claim.node_pool, claim.phase
    ));
    out.not_evaluated = vec![
        "drift by live resolution (AMI, subnets, security groups; the sweep resolves them)".into(),
        "EC2 status checks (node repair by them)".into(),
    ];
    if let Some(r) = input.records.iter().find(|r| r.node == name) {
        out.verdict = format!("being disrupted: {} ({})", r.reason.as_str(), r.detail);
        out.details.push(format!("step {:?}", r.step));
        if !r.replacements.is_empty() {
            out.details.push(format!("replacements: {}", r.replacements.join(", ")));
        }
        return out;
    }
    let decisions: Decisions = disruption::decide(&input.snapshot, &input.options);
    if let Some(c) = decisions.decisions.iter().find(|c| c.nodes.iter().any(|n| n == name)) {
        out.verdict = format!("would be disrupted by the next sweep: {}", c.reason.as_str());
        out.details.push(format!(
            "with {} other node(s); {} pod(s) move",
            c.nodes.len() - 1,
            c.moves.len()
        ));
        match c.replacements.as_slice() {
            [] => out
                .details
                .push("no replacement: its pods fit on the other nodes".into()),
            rs => out.details.extend(rs.iter().map(|r| {
                format!(
                    "replacement first: {} {} in {} (${:.4}/h)",
                    r.capacity_type, r.instance_type, r.zone, r.price
                )
            })),
        }
        if c.savings_per_hour > 0.0 {
            out.details.push(format!("saves ${:.4}/h", c.savings_per_hour));
        }
        return out;
    }
    let held: Vec<String> = decisions
        .blocked
        .iter()
        .filter(|b| b.node == name)
        .map(|b| b.rule.to_string())
        .collect();
    if let Some(first) = held.first() {
        out.verdict = format!("held: {first}");
        out.details
            .extend(held.iter().skip(1).map(|h| format!("also held: {h}")));
        return out;
    }
    out.verdict = "nothing to do: no method wants it this pass".into();
    out.details.push(
        "not unhealthy, not expired, not drifted, not empty, and no cheaper placement of its pods was found".into(),
    );
    out
}

/// Why `pod` is pending, from one solve of the pending pods (pure).
/// `live`: the pod as the cluster has it (None: there is none).
pub fn pod(pod: &PodRef, snapshot: &Snapshot, plan: &Plan, live: Option<&Pod>) -> Explanation {
    let subject = Subject::Pod(pod.clone());
    let Some(live) = live else {
        return Explanation::new(&subject, "no such pod");
    };
    if let Some(node) = live.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
        return Explanation::new(&subject, format!("not pending: bound to node {node}"));
    }
    if !snapshot.pods.iter().any(|p| &PodRef::of(p) == pod) {
        return Explanation::new(
            &subject,
            "not pending for nodesmith: the kube-scheduler has not marked it Unschedulable (yet), or it is another scheduler's, or finished",
        );
    }
    if let Some(u) = plan.unschedulable.iter().find(|u| &u.pod == pod) {
        return Explanation::new(&subject, format!("cannot be scheduled: {}", u.reason));
    }
    if let Some(e) = plan.existing.iter().find(|e| e.pods.contains(pod)) {
        let mut out = Explanation::new(&subject, format!("fits on existing capacity: {:?} {}", e.kind, e.name));
        out.details
            .push("the scheduler binds it there once the node is ready; no new node is needed".into());
        return out;
    }
    if let Some(c) = plan.node_claims.iter().find(|c| c.pods.contains(pod)) {
        let mut out = Explanation::new(&subject, format!("needs a new node: NodePool {}", c.node_pool));
        out.details.push(format!(
            "cheapest: {} {} in {} (${:.4}/h), {} instance type(s) would do",
            c.capacity_type,
            c.instance_type,
            c.zone,
            c.price,
            c.instance_type_options.len()
        ));
        out.details
            .push(format!("with {} other pending pod(s)", c.pods.len() - 1));
        out.details.push(
            "provision launches it when the forwarder's batch reaches it (or at the sweep's next safety-net solve)"
                .into(),
        );
        return out;
    }
    Explanation::new(&subject, "pending, but the solve placed it nowhere and gave no reason")
}

/// Why an explanation could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// The state table could not be read.
    #[error("cannot read the state table")]
    State(#[from] StateError),
    /// The cluster could not be read.
    #[error("cannot read the cluster")]
    Snapshot(#[from] SnapshotError),
    /// A pod could not be read.
    #[error("cannot read the pod")]
    Cluster(#[from] ClusterError),
    /// The sweep's settings in the environment are wrong.
    #[error(transparent)]
    Settings(#[from] crate::settings::SettingError),
}

/// Reads what [`node`] needs, as the sweep's disruption pass reads it, with
/// its settings from the environment (Karpenter's defaults when unset).
pub async fn gather_node<C: Cluster>(
    store: &StateStore,
    cluster: &C,
    now: Timestamp,
) -> Result<NodeInput, ExplainError> {
    let config = SweepConfig::from_env()?;
    let claims = store.list_node_claims().await?;
    let in_flight = claims.iter().filter(|c| c.phase.holds_capacity()).cloned().collect();
    let snapshot = live::read_with_claims(cluster, store, now, in_flight).await?;
    let records = store.disruptions().await?;
    let nominations = store.live_nominations(now.as_millisecond()).await?;
    let options = crate::sweep::disrupt::pass_options(&config, &records, &claims, &nominations, now);
    Ok(NodeInput {
        snapshot,
        claims,
        records,
        options,
    })
}

/// Explains `subject` from the live cluster and table at `now`.
pub async fn explain<C: Cluster>(
    store: &StateStore,
    cluster: &C,
    subject: &Subject,
    now: Timestamp,
) -> Result<Explanation, ExplainError> {
    match subject {
        Subject::Node(name) => Ok(node(name, &gather_node(store, cluster, now).await?)),
        Subject::Pod(p) => {
            let found = cluster.pod(&p.namespace, &p.name).await?;
            let snapshot = live::read_launchable(cluster, store, now).await?;
            let plan = snapshot.compile().solve(&SolveOptions::default());
            Ok(pod(p, &snapshot, &plan, found.as_ref()))
        }
    }
}

#[cfg(test)]
mod tests;
