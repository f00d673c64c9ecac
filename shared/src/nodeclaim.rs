//! The NodeClaim: one node nodesmith has decided to launch, and its lifecycle.
//! This is the state kept in DynamoDB (one item per claim).

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::apis::Taint;
use crate::apis::nodepool::NodeSelectorRequirementWithMinValues;
use crate::requirements::{Requirement, Requirements};
use crate::resources::Resources;

/// How many instance types a claim keeps, cheapest first: CreateFleet is sent
/// at most this many (as Karpenter's AWS provider does), so a type past them
/// is never launched, and a claim item stays a few kilobytes however many
/// types fit its pods.
pub const MAX_INSTANCE_TYPE_OPTIONS: usize = 60;

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
    /// Annotations the node gets (the NodePool template's, as Karpenter
    /// copies them onto its NodeClaim and Node).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The pool's `terminationGracePeriod` when it was made (Karpenter
    /// copies it onto the NodeClaim): how long its termination may take.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period: Option<crate::apis::NillableDuration>,
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
    /// The capacity reservation the instance launched into (`reserved` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_reservation: Option<ReservationRef>,
    /// The AMI the instance was launched from, when launch knew it (the
    /// NodeClaim object's `status.imageID`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,
    /// The Kubernetes node name once registered.
    #[serde(default)]
    pub node_name: Option<String>,
    /// Hash of the NodePool template it was made from (drift detection).
    #[serde(default)]
    pub nodepool_hash: Option<String>,
    /// Hash of the EC2NodeClass it was launched with (drift detection).
    #[serde(default)]
    pub nodeclass_hash: Option<String>,
    /// Why it was launched, when it replaces disrupted nodes (the reason):
    /// its Node is annotated so consolidation leaves it alone for a while.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replacement_for: Option<String>,
    /// When it was created and reached each later phase.
    #[serde(default)]
    pub timestamps: Timestamps,
    /// The last CreateFleet call launch made for it, written before the call, so a
    /// retry repeats that very request (same ClientToken) and EC2 answers with
    /// the first call's fleet instead of launching a second instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_attempt: Option<LaunchAttempt>,
    /// Version for optimistic concurrency; bumped on every write.
    #[serde(default)]
    pub version: u64,
}

/// One CreateFleet request of a claim's launch, as sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LaunchAttempt {
    /// 1 for the first request, one more for each request after an answer without an instance.
    pub number: u32,
    /// The ClientToken (a function of the claim and `number` only).
    pub client_token: String,
    /// spot or on-demand.
    pub capacity_type: String,
    /// The overrides sent, in order.
    pub overrides: Vec<AttemptOverride>,
    /// Tags the instance gets.
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// EC2 answered without an instance: the next request is a new attempt.
    #[serde(default)]
    pub concluded: bool,
    /// The CreateFleet `Context` sent (a repeat must send the same request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
}

impl LaunchAttempt {
    /// Drops what only a repeat of the request needs (overrides, tags,
    /// context), keeping which request it was (number, token, capacity type).
    pub fn settle(&mut self) {
        self.overrides = Vec::new();
        self.tags = BTreeMap::new();
        self.context = None;
    }
}

/// One override of a [`LaunchAttempt`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttemptOverride {
    /// Instance type.
    pub instance_type: String,
    /// Availability zone.
    pub zone: String,
    /// Subnet in that zone.
    pub subnet_id: String,
    /// Launch template name.
    pub template: String,
    /// Hourly price, when the catalog knew it.
    #[serde(default)]
    pub price: Option<f64>,
    /// The capacity reservation the override's template targets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_reservation: Option<ReservationRef>,
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
            annotations: BTreeMap::new(),
            termination_grace_period: None,
            taints: Vec::new(),
            startup_taints: Vec::new(),
            phase: Phase::Pending,
            instance_id: None,
            provider_id: None,
            instance_type: None,
            zone: None,
            capacity_type: None,
            price: None,
            capacity_reservation: None,
            image_id: None,
            node_name: None,
            nodepool_hash: None,
            nodeclass_hash: None,
            replacement_for: None,
            timestamps: Timestamps::default(),
            launch_attempt: None,
            version: 0,
        }
    }

    /// The claim's requirements as the algebra's type (entries that do not
    /// parse are skipped: they were written by nodesmith itself).
    pub fn requirements(&self) -> Requirements {
        self.requirements
            .iter()
            .filter_map(|r| {
                let min = r.min_values.and_then(|m| usize::try_from(m).ok());
                Requirement::new(&r.key, r.operator, &r.values)
                    .ok()
                    .map(|q| q.with_min_values(min))
            })
            .collect()
    }

    /// Stores requirements in their manifest form.
    pub fn set_requirements(&mut self, reqs: &Requirements) {
        self.requirements = reqs
            .iter()
            .map(|r| {
                let (key, operator, values) = r.to_manifest();
                NodeSelectorRequirementWithMinValues {
                    key,
                    operator,
                    values,
                    min_values: r.min_values.map(|m| m as i64),
                }
            })
            .collect();
    }

    /// Moves to `next` at `at` if the lifecycle allows it.
    pub fn advance(&mut self, next: Phase, at: Timestamp) -> Result<(), InvalidTransition> {
        if !self.phase.can_move_to(next) {
            return Err(InvalidTransition {
                name: self.name.clone(),
                from: self.phase,
                to: next,
            });
        }
        self.phase = next;
        self.timestamps.set(next, at);
        Ok(())
    }

    /// Pending → Launched: records the instance CreateFleet returned.
    pub fn launched(&mut self, instance: LaunchedInstance, at: Timestamp) -> Result<(), InvalidTransition> {
        self.advance(Phase::Launched, at)?;
        self.provider_id = Some(format!("aws:///{}/{}", instance.zone, instance.instance_id));
        self.instance_id = Some(instance.instance_id);
        self.instance_type = Some(instance.instance_type);
        self.zone = Some(instance.zone);
        self.capacity_type = Some(instance.capacity_type);
        self.price = instance.price;
        self.capacity_reservation = instance.capacity_reservation;
        self.image_id = instance.image_id;
        // Launched: no request is ever repeated, so only its identity is kept
        // (the overrides alone made a claim item tens of kilobytes).
        if let Some(a) = self.launch_attempt.as_mut() {
            a.settle();
        }
        Ok(())
    }

    /// Launched → Registered: a Node with the claim's providerID exists.
    pub fn registered(&mut self, node_name: &str, at: Timestamp) -> Result<(), InvalidTransition> {
        self.advance(Phase::Registered, at)?;
        self.node_name = Some(node_name.to_string());
        Ok(())
    }

    /// How long the claim has existed at `now` (zero when its creation time is unknown or later).
    pub fn age(&self, now: Timestamp) -> jiff::SignedDuration {
        self.timestamps
            .created
            .map(|c| now.duration_since(c))
            .filter(|d| d.is_positive())
            .unwrap_or_default()
    }
}

/// A new claim name `<pool>-<5 lowercase alphanumerics>` (Karpenter's form) that is
/// not in `taken`, which it joins. The suffix is a hash of `seed` (unique per
/// solve: lease holder, fencing token, time), the pool and a counter, so names
/// never repeat across solves and never follow from the pods (pure).
pub fn generate_name(pool: &str, seed: &str, taken: &mut std::collections::BTreeSet<String>) -> String {
    use sha2::{Digest, Sha256};
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    for counter in 0u64.. {
        let digest = Sha256::new()
            .chain_update(seed.as_bytes())
            .chain_update([0])
            .chain_update(pool.as_bytes())
            .chain_update(counter.to_le_bytes())
            .chain_update((taken.len() as u64).to_le_bytes())
            .finalize();
        let suffix: String = digest
            .iter()
            .take(5)
            .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
            .collect();
        let name = format!("{pool}-{suffix}");
        if taken.insert(name.clone()) {
            return name;
        }
    }
    // 2^64 hashes all taken: unreachable in any real table.
    format!("{pool}-{}", taken.len())
}

/// What CreateFleet launched for a claim.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchedInstance {
    /// EC2 instance id.
    pub instance_id: String,
    /// Instance type EC2 chose among the overrides.
    pub instance_type: String,
    /// Availability zone it runs in.
    pub zone: String,
    /// spot or on-demand.
    pub capacity_type: String,
    /// Hourly price of that offering, when known.
    pub price: Option<f64>,
    /// The capacity reservation it runs in, if reserved.
    pub capacity_reservation: Option<ReservationRef>,
    /// The AMI it was launched from, when known.
    pub image_id: Option<String>,
}

/// A capacity reservation an instance is launched into: what its launch
/// template targets, and the node's `karpenter.k8s.aws/capacity-reservation-{id,type}` labels.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReservationRef {
    /// The reservation id.
    pub id: String,
    /// `default` or `capacity-block`.
    pub reservation_type: String,
}

impl ReservationRef {
    /// True for a capacity block (bought in the `capacity-block` market).
    pub fn capacity_block(&self) -> bool {
        self.reservation_type == crate::apis::ec2nodeclass::RESERVATION_CAPACITY_BLOCK
    }
}

/// When a claim was created and reached each later phase (RFC 3339 in JSON).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Timestamps {
    /// Written by the solver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<Timestamp>,
    /// CreateFleet returned an instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launched: Option<Timestamp>,
    /// Its Node appeared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registered: Option<Timestamp>,
    /// Its Node became Ready without startup taints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialized: Option<Timestamp>,
    /// Its drain began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draining: Option<Timestamp>,
    /// Its instance termination began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminating: Option<Timestamp>,
}

impl Timestamps {
    /// When the claim entered `phase` (`Pending`: when it was created).
    pub fn get(&self, phase: Phase) -> Option<Timestamp> {
        match phase {
            Phase::Pending => self.created,
            Phase::Launched => self.launched,
            Phase::Registered => self.registered,
            Phase::Initialized => self.initialized,
            Phase::Draining => self.draining,
            Phase::Terminating => self.terminating,
        }
    }

    fn set(&mut self, phase: Phase, at: Timestamp) {
        let slot = match phase {
            Phase::Pending => &mut self.created,
            Phase::Launched => &mut self.launched,
            Phase::Registered => &mut self.registered,
            Phase::Initialized => &mut self.initialized,
            Phase::Draining => &mut self.draining,
            Phase::Terminating => &mut self.terminating,
        };
        *slot = Some(at);
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

/// Claims for tests elsewhere in the crate.
#[cfg(test)]
pub(crate) mod fixtures {
    use std::collections::BTreeMap;

    use super::NodeClaim;
    use crate::apis::nodepool::NodeSelectorRequirementWithMinValues;

    /// Claim `default-x` of pool and class `default`, an m5.large labelled
    /// `team=a`, requiring each key to be `In` its values.
    pub fn claim(reqs: Vec<(&str, &[&str])>) -> NodeClaim {
        NodeClaim {
            requirements: reqs
                .into_iter()
                .map(|(k, vs)| {
                    serde_json::from_value::<NodeSelectorRequirementWithMinValues>(
                        serde_json::json!({"key": k, "operator": "In", "values": vs}),
                    )
                    .unwrap()
                })
                .collect(),
            instance_type_options: vec!["m5.large".into()],
            labels: BTreeMap::from([("team".to_string(), "a".to_string())]),
            version: 1,
            ..NodeClaim::pending("default-x", "default", "default")
        }
    }
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

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn lifecycle_moves_forward_only() {
        let mut c = claim();
        c.advance(Phase::Launched, at("2026-01-01T00:00:00Z")).unwrap();
        c.registered("ip-10-0-0-1", at("2026-01-01T00:00:30Z")).unwrap();
        assert!(c.advance(Phase::Pending, at("2026-01-01T00:01:00Z")).is_err());
        assert!(c.advance(Phase::Launched, at("2026-01-01T00:01:00Z")).is_err());
        c.advance(Phase::Initialized, at("2026-01-01T00:01:00Z")).unwrap();
        c.advance(Phase::Draining, at("2026-01-01T00:02:00Z")).unwrap();
        c.advance(Phase::Terminating, at("2026-01-01T00:03:00Z")).unwrap();
        assert!(!c.phase.holds_capacity());
        assert_eq!(c.timestamps.launched, Some(at("2026-01-01T00:00:00Z")));
        assert_eq!(c.timestamps.get(Phase::Registered), Some(at("2026-01-01T00:00:30Z")));
        assert_eq!(c.node_name.as_deref(), Some("ip-10-0-0-1"));
    }

    #[test]
    fn every_illegal_move_is_refused_and_changes_nothing() {
        use Phase::*;
        let all = [Pending, Launched, Registered, Initialized, Draining, Terminating];
        let legal = [
            (Pending, Launched),
            (Pending, Terminating),
            (Launched, Registered),
            (Launched, Draining),
            (Launched, Terminating),
            (Registered, Initialized),
            (Registered, Draining),
            (Registered, Terminating),
            (Initialized, Draining),
            (Initialized, Terminating),
            (Draining, Terminating),
        ];
        for from in all {
            for to in all {
                let mut c = NodeClaim { phase: from, ..claim() };
                let before = c.clone();
                let r = c.advance(to, at("2026-01-01T00:00:00Z"));
                if legal.contains(&(from, to)) {
                    assert!(r.is_ok(), "{from:?} -> {to:?}");
                    assert_eq!(c.phase, to);
                } else {
                    assert_eq!(
                        r,
                        Err(InvalidTransition {
                            name: c.name.clone(),
                            from,
                            to
                        })
                    );
                    assert_eq!(c, before, "{from:?} -> {to:?} changed the claim");
                }
            }
        }
    }

    #[test]
    fn launch_records_the_instance_once() {
        let mut c = claim();
        let i = LaunchedInstance {
            instance_id: "i-1".into(),
            instance_type: "m5.large".into(),
            zone: "us-east-1a".into(),
            capacity_type: "spot".into(),
            price: Some(0.03),
            capacity_reservation: None,
            image_id: Some("ami-1".into()),
        };
        c.launched(i.clone(), at("2026-01-01T00:00:00Z")).unwrap();
        assert_eq!(c.provider_id.as_deref(), Some("aws:///us-east-1a/i-1"));
        assert_eq!(c.instance_type.as_deref(), Some("m5.large"));
        assert_eq!(c.image_id.as_deref(), Some("ami-1"));
        assert!(c.launched(i, at("2026-01-01T00:01:00Z")).is_err());
    }

    #[test]
    fn requirements_round_trip_through_the_manifest_form() {
        let mut reqs = Requirements::new();
        reqs.add(Requirement::in_values(
            "karpenter.sh/capacity-type",
            &["spot", "on-demand"],
        ));
        reqs.add(Requirement::in_values("node.kubernetes.io/instance-type", &["m5.large"]).with_min_values(Some(1)));
        let mut c = claim();
        c.set_requirements(&reqs);
        assert_eq!(c.requirements(), reqs);
    }

    #[test]
    fn generated_names_are_karpenters_form_and_never_taken() {
        let mut taken = std::collections::BTreeSet::from(["default-aaaaa".to_string()]);
        let a = generate_name("default", "holder/1/0", &mut taken);
        let b = generate_name("default", "holder/1/0", &mut taken);
        assert_ne!(a, b, "the same solve never repeats a name");
        for n in [&a, &b] {
            let suffix = n.strip_prefix("default-").unwrap();
            assert_eq!(suffix.len(), 5);
            assert!(
                suffix.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()),
                "{n}"
            );
        }
        // Another solve (another seed) with an empty table starts elsewhere.
        let c = generate_name("default", "holder/2/0", &mut std::collections::BTreeSet::new());
        assert_ne!(c, a);
        // A name already taken is skipped.
        let mut t2 = std::collections::BTreeSet::new();
        let first = generate_name("default", "s", &mut t2.clone());
        t2.insert(first.clone());
        assert_ne!(generate_name("default", "s", &mut t2), first);
    }

    #[test]
    fn age_is_measured_from_creation() {
        let mut c = claim();
        assert_eq!(c.age(at("2026-01-01T00:00:00Z")), jiff::SignedDuration::ZERO);
        c.timestamps.created = Some(at("2026-01-01T00:00:00Z"));
        assert_eq!(c.age(at("2026-01-01T00:02:00Z")), jiff::SignedDuration::from_secs(120));
        assert_eq!(c.age(at("2025-12-31T00:00:00Z")), jiff::SignedDuration::ZERO);
    }

    #[test]
    fn round_trips_as_json_and_reads_the_old_timestamp_map() {
        let mut c = claim();
        c.timestamps.created = Some(at("2026-01-01T00:00:00Z"));
        let s = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<NodeClaim>(&s).unwrap(), c);
        // Items written before timestamps were typed kept a map of RFC 3339 strings.
        let mut v = serde_json::to_value(&c).unwrap();
        v["timestamps"] = serde_json::json!({"created": "2026-01-01T00:00:00Z", "launched": "2026-01-01T00:00:05Z"});
        let old: NodeClaim = serde_json::from_value(v).unwrap();
        assert_eq!(old.timestamps.launched, Some(at("2026-01-01T00:00:05Z")));
    }
}
