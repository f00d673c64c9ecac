//! NodeClaim items: conditional create, versioned update, list, lookup by instance id.

use std::borrow::Cow;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{AttributeValue, ConditionCheck, Put, TransactWriteItem};

use super::item::{self, Item, get_i64, get_s, n, s};
use super::leases::{CONFLICT_TRIES, Lease, conflict_backoff};
use super::packing;
use super::{INSTANCE_INDEX, PK_LEASE, PK_NODECLAIM, StateError, StateStore};
use crate::apis::nodepool::NodeSelectorRequirementWithMinValues;
use crate::labels;
use crate::nodeclaim::NodeClaim;
use crate::requirements::Operator;

/// DynamoDB allows 100 actions per transaction; one is the lease check.
const CLAIMS_PER_TRANSACTION: usize = 99;

/// How many times a claim is read again after a conflicting write.
const ADVANCE_TRIES: usize = 3;

/// How one fenced transaction ended, when not in an error.
enum Fenced {
    /// Every item was written.
    Written,
    /// Cancelled for a conflict with another write (nothing written), as an error.
    Conflict(StateError),
}

/// What [`StateStore::advance_node_claim`] found and did.
#[derive(Debug, Clone, PartialEq)]
pub enum Advance {
    /// The claim moved on; as stored now.
    Moved(NodeClaim),
    /// The claim was left as it is (its step declined, or others kept
    /// writing it); as last read.
    Left(NodeClaim),
    /// No such claim.
    Gone,
}

impl Advance {
    /// The claim as stored, unless it is gone.
    pub fn claim(self) -> Option<NodeClaim> {
        match self {
            Advance::Moved(c) | Advance::Left(c) => Some(c),
            Advance::Gone => None,
        }
    }
}

/// Which version of a claim [`StateStore::remove_node_claim`] may remove.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionCheck {
    /// Only the version the caller read: a claim written since is kept (the
    /// caller decided on what it read).
    IfUnchanged,
    /// Whatever was written since (its capacity is gone whatever it says).
    Regardless,
}

/// True for the requirement that names the claim's instance-type options:
/// `In` exactly the options (sorted, as the requirement keeps them).
fn names_the_options(r: &NodeSelectorRequirementWithMinValues, sorted_options: &[&String]) -> bool {
    r.key == labels::INSTANCE_TYPE
        && r.operator == Operator::In
        && !sorted_options.is_empty()
        && r.values.iter().eq(sorted_options.iter().copied())
}

/// The attribute holding the claim, packed ([`packing`]); items written
/// before packing hold it as JSON text in `body`.
pub const PACKED: &str = "packed";

/// The item for a claim at a given version (pure). The instance-type
/// requirement that names the options is stored without its values (they are
/// the options: each name is stored once); [`from_item`] puts them back.
pub fn to_item(claim: &NodeClaim, version: u64) -> Result<Item, StateError> {
    let mut c = claim.clone();
    c.version = version;
    let mut sorted: Vec<&String> = claim.instance_type_options.iter().collect();
    sorted.sort();
    sorted.dedup();
    if let Some(r) = c.requirements.iter_mut().find(|r| names_the_options(r, &sorted)) {
        r.values = Vec::new();
    }
    let body = serde_json::to_string(&c).map_err(|e| StateError::Corrupt {
        what: "nodeclaim",
        key: claim.name.clone(),
        reason: format!("cannot serialise: {e}"),
    })?;
    let packed = packing::pack(&body).map_err(|e| StateError::Corrupt {
        what: "nodeclaim",
        key: claim.name.clone(),
        reason: format!("cannot pack: {}", crate::telemetry::causes(&e)),
    })?;
    let mut it = item::key(PK_NODECLAIM, &claim.name);
    it.insert("version".into(), n(version));
    it.insert("phase".into(), s(format!("{:?}", claim.phase)));
    if let Some(id) = &claim.instance_id {
        it.insert("instanceId".into(), s(id));
    }
    it.insert(PACKED.into(), AttributeValue::B(Blob::new(packed)));
    Ok(it)
}

/// The claim an item holds; the `version` attribute is authoritative (pure).
pub fn from_item(it: &Item) -> Result<NodeClaim, StateError> {
    let body = match it.get(PACKED) {
        Some(AttributeValue::B(packed)) => Cow::Owned(packing::unpack(packed.as_ref()).map_err(|e| {
            item::corrupt(
                it,
                "nodeclaim",
                format!("attribute {PACKED}: {}", crate::telemetry::causes(&e)),
            )
        })?),
        Some(_) => {
            return Err(item::corrupt(
                it,
                "nodeclaim",
                format!("attribute {PACKED} is not binary"),
            ));
        }
        // Written before bodies were packed.
        None => Cow::Borrowed(get_s(it, "nodeclaim", "body")?),
    };
    let version = get_i64(it, "nodeclaim", "version")?;
    let mut claim: NodeClaim = serde_json::from_str(&body)
        .map_err(|e| item::corrupt(it, "nodeclaim", format!("body is not a NodeClaim: {e}")))?;
    claim.version =
        u64::try_from(version).map_err(|_| item::corrupt(it, "nodeclaim", format!("negative version {version}")))?;
    // An `In` without values is one stored by `to_item` (a real one names at
    // least one type); items written before keep their values and read as they are.
    if !claim.instance_type_options.is_empty()
        && let Some(r) = claim
            .requirements
            .iter_mut()
            .find(|r| r.key == labels::INSTANCE_TYPE && r.operator == Operator::In && r.values.is_empty())
    {
        let mut values = claim.instance_type_options.clone();
        values.sort();
        values.dedup();
        r.values = values;
    }
    Ok(claim)
}

/// A claim item this release cannot read (written by a newer release, or
/// damaged): left as it is, and what it names is not collected as a leak.
#[derive(Debug)]
pub struct UnreadableClaim {
    /// The claim's name (the item's sort key).
    pub name: String,
    /// The instance the item records, if any.
    pub instance_id: Option<String>,
    /// Why it cannot be read.
    pub error: StateError,
}

/// Every claim item, each read on its own.
#[derive(Debug, Default)]
pub struct ClaimListing {
    /// The claims this release can read, by name.
    pub claims: Vec<NodeClaim>,
    /// The items it cannot.
    pub unreadable: Vec<UnreadableClaim>,
}

/// Reads each item on its own, so one bad item does not hide the others (pure).
pub fn read_items(items: &[Item]) -> ClaimListing {
    let mut out = ClaimListing::default();
    for it in items {
        match from_item(it) {
            Ok(c) => out.claims.push(c),
            Err(error) => {
                let text = |attr: &str| match it.get(attr) {
                    Some(AttributeValue::S(v)) => Some(v.clone()),
                    _ => None,
                };
                out.unreadable.push(UnreadableClaim {
                    name: text("sk").unwrap_or_default(),
                    instance_id: text("instanceId"),
                    error,
                });
            }
        }
    }
    out
}

impl StateStore {
    /// Creates a NodeClaim (version 1); fails with `AlreadyExists` if the name is taken.
    pub async fn create_node_claim(&self, claim: &NodeClaim) -> Result<NodeClaim, StateError> {
        let it = to_item(claim, 1)?;
        let res = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(it))
            .condition_expression("attribute_not_exists(pk)")
            .send()
            .await;
        match res {
            Ok(_) => Ok(NodeClaim {
                version: 1,
                ..claim.clone()
            }),
            Err(e) if item::condition_failed(&e) => Err(StateError::AlreadyExists(claim.name.clone())),
            Err(e) => Err(self.dynamo("PutItem", e)),
        }
    }

    /// Creates NodeClaims only while `lease` is still held (fencing): each
    /// transaction checks the lease item's holder, token and expiry beside
    /// the conditional puts, so a solver whose lease was taken over writes
    /// nothing. A transaction DynamoDB cancels for a `TransactionConflict`
    /// (another write met one of its items; nothing was written) is tried
    /// again after a jittered pause, a few times.
    pub async fn create_node_claims_fenced(
        &self,
        lease: &Lease,
        claims: &[NodeClaim],
        now_ms: i64,
    ) -> Result<Vec<NodeClaim>, StateError> {
        let started = std::time::Instant::now();
        let mut out = Vec::with_capacity(claims.len());
        for chunk in claims.chunks(CLAIMS_PER_TRANSACTION) {
            let mut attempt = 1;
            loop {
                // A later try checks the lease at the time it is made.
                let now = now_ms + started.elapsed().as_millis() as i64;
                match self.fenced_transaction(lease, chunk, now).await? {
                    Fenced::Written => break,
                    Fenced::Conflict(_) if attempt < CONFLICT_TRIES => {
                        tracing::info!(lease = %lease.name, attempt, "claim write met another write; trying again");
                        tokio::time::sleep(conflict_backoff(attempt)).await;
                        attempt += 1;
                    }
                    Fenced::Conflict(e) => return Err(e),
                }
            }
            out.extend(chunk.iter().map(|c| NodeClaim {
                version: 1,
                ..c.clone()
            }));
        }
        Ok(out)
    }

    /// One fenced transaction for `chunk`.
    async fn fenced_transaction(&self, lease: &Lease, chunk: &[NodeClaim], now_ms: i64) -> Result<Fenced, StateError> {
        let check = ConditionCheck::builder()
            .table_name(&self.table)
            .set_key(Some(item::key(PK_LEASE, &lease.name)))
            .condition_expression("holder = :h AND version = :v AND leaseUntil > :now")
            .expression_attribute_values(":h", s(&lease.holder))
            .expression_attribute_values(":v", n(lease.version))
            .expression_attribute_values(":now", n(now_ms))
            .build()
            .map_err(|e| self.dynamo("TransactWriteItems", e))?;
        let mut req = self
            .client
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().condition_check(check).build());
        for c in chunk {
            let put = Put::builder()
                .table_name(&self.table)
                .set_item(Some(to_item(c, 1)?))
                .condition_expression("attribute_not_exists(pk)")
                .build()
                .map_err(|e| self.dynamo("TransactWriteItems", e))?;
            req = req.transact_items(TransactWriteItem::builder().put(put).build());
        }
        let e = match req.send().await {
            Ok(_) => return Ok(Fenced::Written),
            Err(e) => e,
        };
        let reasons: Vec<Option<String>> = e
            .as_service_error()
            .and_then(|se| match se {
                aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError::TransactionCanceledException(t) => {
                    Some(t.cancellation_reasons().iter().map(|r| r.code().map(str::to_string)).collect())
                }
                _ => None,
            })
            .unwrap_or_default();
        let is = |r: Option<&Option<String>>, code: &str| r.and_then(|c| c.as_deref()) == Some(code);
        if is(reasons.first(), "ConditionalCheckFailed") {
            return Err(StateError::LeaseLost {
                name: lease.name.clone(),
                holder: lease.holder.clone(),
                version: lease.version,
            });
        }
        if let Some(i) = (1..reasons.len()).find(|i| is(reasons.get(*i), "ConditionalCheckFailed")) {
            return Err(StateError::AlreadyExists(chunk[i - 1].name.clone()));
        }
        if reasons.iter().any(|r| is(Some(r), "TransactionConflict")) {
            return Ok(Fenced::Conflict(self.dynamo("TransactWriteItems", e)));
        }
        Err(self.dynamo("TransactWriteItems", e))
    }
    /// Reads one NodeClaim (strongly consistent).
    pub async fn get_node_claim(&self, name: &str) -> Result<Option<NodeClaim>, StateError> {
        let out = self.read_item(PK_NODECLAIM, name).await?;
        out.as_ref().map(from_item).transpose()
    }

    /// Writes `claim` if the table still has `claim.version`; returns it at the next version.
    pub async fn update_node_claim(&self, claim: &NodeClaim) -> Result<NodeClaim, StateError> {
        let next = claim.version + 1;
        if self.put_at_version(to_item(claim, next)?, claim.version).await? {
            return Ok(NodeClaim {
                version: next,
                ..claim.clone()
            });
        }
        Err(self.conflict(&claim.name, claim.version).await?)
    }

    /// Moves claim `name` on, version-checked: `step` sees the claim as
    /// stored and returns it moved on, or None to leave it. A write that
    /// conflicts reads the claim again and asks `step` again. The one way a
    /// stored claim changes phase outside `launch`.
    pub async fn advance_node_claim(
        &self,
        name: &str,
        step: impl Fn(&NodeClaim) -> Option<NodeClaim>,
    ) -> Result<Advance, StateError> {
        let mut last = None;
        for _ in 0..ADVANCE_TRIES {
            let Some(current) = self.get_node_claim(name).await? else {
                return Ok(Advance::Gone);
            };
            let Some(next) = step(&current) else {
                return Ok(Advance::Left(current));
            };
            match self.update_node_claim(&next).await {
                Ok(stored) => return Ok(Advance::Moved(stored)),
                Err(StateError::Conflict { .. }) => last = Some(current),
                Err(e) => return Err(e),
            }
        }
        Ok(last.map_or(Advance::Gone, Advance::Left))
    }

    /// Removes a claim, version-checked as `removal` says; a claim already
    /// gone counts as removed.
    pub async fn remove_node_claim(&self, claim: &NodeClaim, removal: VersionCheck) -> Result<(), StateError> {
        match self.delete_node_claim(&claim.name, claim.version).await {
            Ok(()) | Err(StateError::Conflict { found: None, .. }) => Ok(()),
            Err(StateError::Conflict { found: Some(v), .. }) if removal == VersionCheck::Regardless => {
                match self.delete_node_claim(&claim.name, v).await {
                    Ok(()) | Err(StateError::Conflict { found: None, .. }) => Ok(()),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// Deletes a NodeClaim if the table still has `version`.
    pub async fn delete_node_claim(&self, name: &str, version: u64) -> Result<(), StateError> {
        if self.delete_at_version(PK_NODECLAIM, name, version).await? {
            return Ok(());
        }
        Err(self.conflict(name, version).await?)
    }

    /// The conflict a refused versioned write of claim `name` met, with the version found now.
    async fn conflict(&self, name: &str, expected: u64) -> Result<StateError, StateError> {
        let found = self.get_node_claim(name).await?.map(|c| c.version);
        Ok(StateError::Conflict {
            name: name.to_string(),
            expected,
            found,
        })
    }

    /// Every claim item in the table, each read on its own; those this
    /// release cannot read are logged and listed apart.
    pub async fn read_node_claims(&self) -> Result<ClaimListing, StateError> {
        let listing = read_items(&self.query_partition(PK_NODECLAIM, None).await?);
        for u in &listing.unreadable {
            tracing::error!(node_claim = %u.name, instance_id = ?u.instance_id, error = %crate::telemetry::causes(&u.error), "cannot read this NodeClaim item; it is left as it is and out of every decision");
        }
        Ok(listing)
    }

    /// Every NodeClaim in the table this release can read, by name (see
    /// [`StateStore::read_node_claims`] for the others).
    pub async fn list_node_claims(&self) -> Result<Vec<NodeClaim>, StateError> {
        Ok(self.read_node_claims().await?.claims)
    }

    /// NodeClaims whose capacity exists or is on its way (everything but Terminating):
    /// what the solver must count against NodePool limits and reuse.
    pub async fn in_flight_node_claims(&self) -> Result<Vec<NodeClaim>, StateError> {
        Ok(self
            .list_node_claims()
            .await?
            .into_iter()
            .filter(|c| c.phase.holds_capacity())
            .collect())
    }

    /// The NodeClaim that launched `instance_id`, through the GSI (eventually consistent).
    pub async fn node_claim_by_instance(&self, instance_id: &str) -> Result<Option<NodeClaim>, StateError> {
        let out = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(INSTANCE_INDEX)
            .key_condition_expression("instanceId = :i")
            .expression_attribute_values(":i", AttributeValue::S(instance_id.to_string()))
            .send()
            .await
            .map_err(|e| self.dynamo("Query", e))?;
        out.items().first().map(from_item).transpose()
    }
}

#[cfg(test)]
mod tests {

    use std::collections::BTreeMap;

    use super::*;
    use crate::nodeclaim::{AttemptOverride, LaunchAttempt, Phase};
    use crate::resources::Resources;

    fn claim() -> NodeClaim {
        NodeClaim {
            instance_type_options: vec!["m5.large".into()],
            phase: Phase::Launched,
            instance_id: Some("i-123".into()),
            version: 3,
            ..NodeClaim::pending("default-x1", "default", "default")
        }
    }

    #[test]
    fn item_round_trips_and_version_attribute_wins() {
        let it = to_item(&claim(), 4).unwrap();
        assert_eq!(it.get("instanceId"), Some(&s("i-123")));
        assert_eq!(it.get("phase"), Some(&s("Launched")));
        let back = from_item(&it).unwrap();
        assert_eq!(back, NodeClaim { version: 4, ..claim() });
    }

    #[test]
    fn pending_claims_stay_out_of_the_instance_index() {
        let c = NodeClaim {
            instance_id: None,
            phase: Phase::Pending,
            ..claim()
        };
        assert!(!to_item(&c, 1).unwrap().contains_key("instanceId"));
    }

    #[test]
    fn an_item_a_newer_release_wrote_is_set_aside_and_the_others_read() {
        let good = to_item(&claim(), 1).unwrap();
        let mut newer = to_item(
            &NodeClaim {
                instance_id: Some("i-new".into()),
                ..NodeClaim::pending("default-x2", "default", "default")
            },
            2,
        )
        .unwrap();
        let mut body = body_of(&newer);
        body["phase"] = serde_json::json!("Repairing");
        body["repair"] = serde_json::json!({"policy": "reboot"});
        newer = with_body(newer, &body);
        let unknown_field_only = to_item(&NodeClaim::pending("default-x3", "default", "default"), 1).unwrap();
        let mut body = body_of(&unknown_field_only);
        body["repair"] = serde_json::json!({"policy": "reboot"});
        let unknown_field_only = with_body(unknown_field_only, &body);

        let listing = read_items(&[good, newer, unknown_field_only]);
        let names: Vec<&str> = listing.claims.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            ["default-x1", "default-x3"],
            "a field it does not know is ignored"
        );
        assert_eq!(listing.unreadable.len(), 1);
        let u = &listing.unreadable[0];
        assert_eq!(u.name, "default-x2");
        assert_eq!(u.instance_id.as_deref(), Some("i-new"));
        assert!(u.error.to_string().contains("Repairing"), "{}", u.error);
    }

    /// An item's size as DynamoDB counts it: names plus values (UTF-8 bytes;
    /// a number counted at its text length, an upper bound).
    fn item_bytes(it: &Item) -> usize {
        it.iter()
            .map(|(k, v)| {
                k.len()
                    + match v {
                        AttributeValue::S(s) | AttributeValue::N(s) => s.len(),
                        AttributeValue::B(b) => b.as_ref().len(),
                        _ => 0,
                    }
            })
            .sum()
    }

    /// A claim as the solver makes it for a small pod that fits `types`
    /// instance types, cheapest first.
    fn wide_claim(types: usize) -> NodeClaim {
        use crate::requirements::{Requirement, Requirements};
        use crate::scheduling::NewNodeClaim;
        let names: Vec<String> = (0..types)
            .map(|i| format!("c{}g{}.{}xlarge", i % 9, i / 9, i % 48))
            .collect();
        let mut requirements = Requirements::default();
        requirements.add(Requirement::in_values(
            crate::labels::CAPACITY_TYPE,
            &["spot", "on-demand"],
        ));
        requirements.add(Requirement::in_values(crate::labels::NODEPOOL, &["default"]));
        let planned = NewNodeClaim {
            name: "default-x7k2q".into(),
            node_pool: "default".into(),
            node_class: "default".into(),
            requirements,
            instance_type_options: names.clone(),
            instance_type: names[0].clone(),
            zone: "us-east-1a".into(),
            capacity_type: "spot".into(),
            price: 0.0123,
            allocatable: Resources::new(),
            labels: BTreeMap::new(),
            template_labels: BTreeMap::from([("team".to_string(), "web".to_string())]),
            taints: Vec::new(),
            startup_taints: Vec::new(),
            pods: Vec::new(),
            requests: Resources::new(),
        };
        planned.to_node_claim(jiff::Timestamp::UNIX_EPOCH)
    }

    /// The CreateFleet request launch writes before its call: every kept
    /// option in three zones, spot and on-demand.
    fn attempt_for(c: &NodeClaim) -> LaunchAttempt {
        let overrides = c
            .instance_type_options
            .iter()
            .take(60)
            .flat_map(|t| {
                ["us-east-1a", "us-east-1b", "us-east-1c"].map(|z| AttemptOverride {
                    instance_type: t.clone(),
                    zone: z.into(),
                    subnet_id: "subnet-0123456789abcdef0".into(),
                    template: "nodesmith-0f3c9a1b2d4e5f60718293a4b5c6d7e8f9012345".into(),
                    price: Some(0.0456),
                    capacity_reservation: None,
                })
            })
            .collect();
        LaunchAttempt {
            number: 1,
            client_token: "nodesmith-default-x7k2q-1-0123456789abcdef".into(),
            capacity_type: "spot".into(),
            overrides,
            tags: (0..8)
                .map(|i| (format!("karpenter.sh/tag-{i}"), format!("value-{i}")))
                .collect(),
            concluded: false,
            context: None,
        }
    }

    fn launched(mut c: NodeClaim) -> NodeClaim {
        c.launch_attempt = Some(attempt_for(&c));
        c.launched(
            crate::nodeclaim::LaunchedInstance {
                instance_id: "i-0123456789abcdef0".into(),
                instance_type: c.instance_type_options[0].clone(),
                zone: "us-east-1a".into(),
                capacity_type: "spot".into(),
                price: Some(0.0123),
                capacity_reservation: None,
                image_id: None,
            },
            jiff::Timestamp::UNIX_EPOCH,
        )
        .unwrap();
        c
    }

    #[test]
    fn a_claim_for_a_pod_that_fits_800_types_is_a_small_item_and_reads_back_whole() {
        let pending = wide_claim(800);
        let created = to_item(&pending, 1).unwrap();
        assert!(
            item_bytes(&created) < 8 * 1024,
            "created: {} bytes",
            item_bytes(&created)
        );
        assert_eq!(
            from_item(&created).unwrap(),
            NodeClaim {
                version: 1,
                ..pending.clone()
            }
        );

        let claim = launched(pending);
        let it = to_item(&claim, 3).unwrap();
        // Packed, 60 options fit in half a KB (about 2 KB as text): a list of
        // 5,000 such claims reads about 600 units, not 2,500.
        assert!(item_bytes(&it) < 512, "launched: {} bytes", item_bytes(&it));
        let back = from_item(&it).unwrap();
        assert_eq!(
            back,
            NodeClaim {
                version: 3,
                ..claim.clone()
            }
        );
        assert_eq!(
            back.requirements(),
            claim.requirements(),
            "the instance-type requirement is read back"
        );
        assert_eq!(back.instance_type_options.len(), 60, "the cheapest 60 are kept");
        let a = back.launch_attempt.expect("which request launched it is kept");
        assert_eq!(
            (a.number, a.client_token.as_str()),
            (1, "nodesmith-default-x7k2q-1-0123456789abcdef")
        );
    }

    #[test]
    fn an_item_written_before_compaction_reads_as_written() {
        // The old shape: every option twice (field and requirement), the whole
        // request kept after launch, hundreds of options.
        let mut old = wide_claim(60);
        old.instance_type_options = (0..800).map(|i| format!("old{i}.large")).collect();
        let mut sorted = old.instance_type_options.clone();
        sorted.sort();
        for r in old
            .requirements
            .iter_mut()
            .filter(|r| r.key == crate::labels::INSTANCE_TYPE)
        {
            r.values = sorted.clone();
        }
        old.launch_attempt = Some(attempt_for(&old));
        old.phase = Phase::Launched;
        old.version = 9;
        let body = serde_json::to_string(&old).unwrap();
        assert!(body.contains("\"overrides\":[{"), "the old shape");
        let mut it = item::key(super::super::PK_NODECLAIM, &old.name);
        it.insert("version".into(), n(9));
        it.insert("body".into(), s(body));
        assert_eq!(from_item(&it).unwrap(), old);
    }

    #[test]
    fn corrupt_body_is_named() {
        let packed = to_item(&claim(), 1).unwrap();
        let mut unpacked = packed.clone();
        unpacked.remove(PACKED);
        unpacked.insert("body".into(), s("{not json"));
        let mut damaged = packed.clone();
        damaged.insert(PACKED.into(), AttributeValue::B(Blob::new(vec![1, 0xff, 0xff])));
        let mut text = packed.clone();
        text.insert(PACKED.into(), s("{}"));
        let cases = [
            ("text body", unpacked, "body is not a NodeClaim"),
            (
                "packed, not json",
                with_body(packed, &serde_json::json!("x")),
                "body is not a NodeClaim",
            ),
            ("damaged", damaged, "attribute packed: the packed body does not inflate"),
            ("not binary", text, "attribute packed is not binary"),
        ];
        for (what, it, expected) in cases {
            let e = from_item(&it).unwrap_err().to_string();
            assert!(
                e.contains("corrupt nodeclaim item default-x1") && e.contains(expected),
                "{what}: {e}"
            );
        }
    }

    /// The JSON a packed item holds.
    fn body_of(it: &Item) -> serde_json::Value {
        let packed = it.get(PACKED).and_then(|v| v.as_b().ok()).expect("a packed body");
        serde_json::from_str(&packing::unpack(packed.as_ref()).unwrap()).unwrap()
    }

    /// `it` holding `body` instead, packed as this release packs.
    fn with_body(mut it: Item, body: &serde_json::Value) -> Item {
        let packed = packing::pack(&body.to_string()).unwrap();
        it.insert(PACKED.into(), AttributeValue::B(Blob::new(packed)));
        it
    }
}
