//! The NodeClaim: one node nodesmith has decided to launch, and its lifecycle.
//! This is the state kept in DynamoDB (one item per claim).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::apis::Taint;
use crate::apis::nodepool::NodeSelectorRequirementWithMinValues;
use crate::resources::Resources;

/// Where a NodeClaim is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Phase {
    /// Decided by the solver; no instance yet.
    Pending,
    /// CreateFleet returned an instance.
    Launched,
    /// The node joined the cluster.
    Registered,
    /// The node is ready and its startup taints are gone.
    Initialized,
    /// Cordoned; its pods are being evicted.
    Draining,
    /// The instance is being terminated.
    Terminating,
}

impl Phase {
    /// True when the claim's capacity exists or is on its way (counts against limits).
    pub fn holds_capacity(self) -> bool {
        !matches!(self, Phase::Terminating)
    }

    /// True for the phases a claim may move to from this one.
    pub fn can_move_to(self, next: Phase) -> bool {
        use Phase::*;
        matches!(
            (self, next),
            (Pending, Launched)
                | (Pending, Terminating)
                | (Launched, Registered)
                | (Launched, Draining)
                | (Launched, Terminating)
                | (Registered, Initialized)
                | (Registered, Draining)
                | (Registered, Terminating)
                | (Initialized, Draining)
                | (Initialized, Terminating)
                | (Draining, Terminating)
        )
    }
}

/// A node nodesmith launches or has launched.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaim {
    /// Unique name; also the node's hostname label.
    pub name: String,
    /// The NodePool it belongs to.
    pub node_pool: String,
    /// The EC2NodeClass it uses.
    pub node_class: String,
    /// What the node must satisfy (pool requirements narrowed by its pods).
    pub requirements: Vec<NodeSelectorRequirementWithMinValues>,
    /// Resources its pods (and daemons) request.
    pub resources: Resources,
    /// Compatible instance types, cheapest first: the CreateFleet overrides.
    pub instance_type_options: Vec<String>,
    /// Labels the node gets.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Taints the node gets.
    #[serde(default)]
    pub taints: Vec<Taint>,
    /// Taints present until the node is initialized.
    #[serde(default)]
    pub startup_taints: Vec<Taint>,
    /// Lifecycle phase.
    pub phase: Phase,
    /// EC2 instance id once launched.
    #[serde(default)]
    pub instance_id: Option<String>,
    /// `aws:///<zone>/<instance-id>` once launched.
    #[serde(default)]
    pub provider_id: Option<String>,
    /// The launched instance type.
    #[serde(default)]
    pub instance_type: Option<String>,
    /// The launched zone.
    #[serde(default)]
    pub zone: Option<String>,
    /// spot or on-demand.
    #[serde(default)]
    pub capacity_type: Option<String>,
    /// Hourly price of the launched offering.
    #[serde(default)]
    pub price: Option<f64>,
    /// The Kubernetes node name once registered.
    #[serde(default)]
    pub node_name: Option<String>,
    /// Hash of the NodePool template it was made from (drift detection).
    #[serde(default)]
    pub nodepool_hash: Option<String>,
    /// Hash of the EC2NodeClass it was launched with (drift detection).
    #[serde(default)]
    pub nodeclass_hash: Option<String>,
    /// Lifecycle timestamps (RFC 3339) keyed by event: created, launched, registered, ...
    #[serde(default)]
    pub timestamps: BTreeMap<String, String>,
    /// Version for optimistic concurrency; bumped on every write.
    #[serde(default)]
    pub version: u64,
}

impl NodeClaim {
    /// A Pending claim with nothing decided beyond its pool and class; set the
    /// other fields with struct update syntax.
    pub fn pending(name: impl Into<String>, node_pool: impl Into<String>, node_class: impl Into<String>) -> Self {
        NodeClaim {
            name: name.into(),
            node_pool: node_pool.into(),
            node_class: node_class.into(),
            requirements: Vec::new(),
            resources: Resources::new(),
            instance_type_options: Vec::new(),
            labels: BTreeMap::new(),
            taints: Vec::new(),
            startup_taints: Vec::new(),
            phase: Phase::Pending,
            instance_id: None,
            provider_id: None,
            instance_type: None,
            zone: None,
            capacity_type: None,
            price: None,
            node_name: None,
            nodepool_hash: None,
            nodeclass_hash: None,
            timestamps: BTreeMap::new(),
            version: 0,
        }
    }

    /// Moves to `next` if the lifecycle allows it.
    pub fn advance(&mut self, next: Phase, at: &str) -> Result<(), InvalidTransition> {
        if !self.phase.can_move_to(next) {
            return Err(InvalidTransition {
                name: self.name.clone(),
                from: self.phase,
                to: next,
            });
        }
        self.phase = next;
        self.timestamps
            .insert(format!("{next:?}").to_lowercase(), at.to_string());
        Ok(())
    }
}

/// A lifecycle move that is not allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("nodeclaim {name}: cannot move from {from:?} to {to:?}")]
pub struct InvalidTransition {
    /// The claim.
    pub name: String,
    /// Its phase.
    pub from: Phase,
    /// The phase asked for.
    pub to: Phase,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim() -> NodeClaim {
        NodeClaim {
            instance_type_options: vec!["m5.large".into()],
            ..NodeClaim::pending("default-abc12", "default", "default")
        }
    }

    #[test]
    fn lifecycle_moves_forward_only() {
        let mut c = claim();
        c.advance(Phase::Launched, "2026-01-01T00:00:00Z").unwrap();
        c.advance(Phase::Registered, "t").unwrap();
        assert!(c.advance(Phase::Pending, "t").is_err());
        assert!(c.advance(Phase::Launched, "t").is_err());
        c.advance(Phase::Initialized, "t").unwrap();
        c.advance(Phase::Draining, "t").unwrap();
        c.advance(Phase::Terminating, "t").unwrap();
        assert!(!c.phase.holds_capacity());
        assert_eq!(
            c.timestamps.get("launched").map(String::as_str),
            Some("2026-01-01T00:00:00Z")
        );
    }

    #[test]
    fn round_trips_as_json() {
        let c = claim();
        let s = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<NodeClaim>(&s).unwrap(), c);
    }
}
