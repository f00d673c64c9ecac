//! Durable state in one DynamoDB table: NodeClaims, leases, unavailable
//! offerings, the catalog snapshot and idempotency records.
//!
//! # Table schema
//!
//! One table, composite key `pk` (S, partition) + `sk` (S, sort); every kind
//! of item lives under its own fixed partition so one Query lists it.
//!
//! | item | `pk` | `sk` | other attributes |
//! |---|---|---|---|
//! | NodeClaim | `NODECLAIM` | claim name | `version` (N), `phase` (S), `instanceId` (S, once launched), `packed` (B, the claim as JSON deflated against a preset dictionary: `packing`; items written before hold `body` (S, the JSON) and `nodePool` (S)) |
//! | lease | `LEASE` | lease name | `holder` (S), `version` (N, the fencing token), `leaseUntil` (N, epoch ms), `expiresAt` (N, epoch s; set on a launch lease whose launch failed, so the item of a claim that never launches goes) |
//! | unavailable offering | `UNAVAILABLE` | `<capacity type>#<zone>#<instance type>` | `reason` (S), `expiresAt` (N, epoch s) |
//! | catalog head | `CATALOG` | `HEAD` | `generation` (S, sha256 of the JSON), `parts` (N), `retired` (L of M: `generation`, `parts`, `at` epoch ms; generations replaced less than [`RETIRED_GRACE_MS`] ago, whose parts are kept for readers of the old head) |
//! | catalog part | `CATALOG` | `PART#<generation>#<index, 4 digits>` | `data` (B, a slice of the catalog JSON) |
//! | processed message | `PROCESSED` | idempotency key | `expiresAt` (N, epoch s) |
//! | drain in progress | `DRAIN` | claim name | `node` (S), `reason` (S), `startedAt` (N, epoch ms), `deadline`, `forceFrom` (N, epoch ms, optional), `expiresAt` (N, epoch s) |
//! | marker | `MARKER` | marker name (`last-solve`) | `at` (N, epoch ms; only moves forward) |
//! | nomination | `NOMINATION` | `Node#<node name>` or `NodeClaim#<claim name>` | `target` (S), `kind` (S, `Node` or `NodeClaim`), `pod` (S, one of its pods), `pods` (N), `until` (N, epoch ms; only moves forward), `expiresAt` (N, epoch s, an hour after `until`) |
//! | cost counter | `COST` | `DAY#<yyyy-mm-dd>` (UTC) | per function: `<fn>NanoUsd`, `<fn>Invocations`, `<fn>FleetNanoUsdPerHour` (N, added to atomically); `expiresAt` (N, epoch s, the day + 400 days) |
//!
//! - GSI `byInstanceId`: partition key `instanceId` (S), projection ALL. Only
//!   launched NodeClaims carry the attribute, so the index is sparse.
//! - TTL attribute: `expiresAt`. DynamoDB deletes expired items lazily (up to
//!   days later), so every read filters expired items itself.
//! - NodeClaims are written with a condition on `version` (optimistic
//!   concurrency); a lost race is [`StateError::Conflict`].
//! - The catalog is split into parts of at most [`catalog::PART_BYTES`] since
//!   an item holds at most 400 KB; the head is written last, so a reader never
//!   sees a half-written generation.

mod catalog;
mod costs;
mod disruptions;
mod drains;
mod idempotency;
mod item;
mod leases;
mod markers;
mod nodeclaims;
mod nominations;
mod offerings;
pub mod packing;
mod prices;
mod table;
mod terminations;

pub use catalog::{PART_BYTES, RETIRED_GRACE_MS};
pub use costs::{COST_TTL_DAYS, CostEntry, DayCost, FunctionCost, day_key};
pub use disruptions::{DisruptionRecord, DisruptionStep, Reason, UnknownReason};
pub use drains::DrainRecord;
pub use leases::{Lease, invocation_holder};
pub use markers::{LAST_SOLVE, Refusal};
pub use nodeclaims::{
    Advance, ClaimListing, PACKED as PACKED_CLAIM_ATTRIBUTE, UnreadableClaim, VersionCheck,
    from_item as node_claim_from_item, to_item as node_claim_item,
};
pub use nominations::NominationRecord;
pub use offerings::{OfferingKey, UNAVAILABLE_TTL_SECS, UnavailableOffering};
pub use table::{TTL_ATTRIBUTE, create_table};
pub use terminations::{PK_TERMINATION, TerminationRecord};

use aws_sdk_dynamodb::Client;

/// Partition of NodeClaim items.
pub const PK_NODECLAIM: &str = "NODECLAIM";
/// Partition of lease items.
pub const PK_LEASE: &str = "LEASE";
/// Partition of unavailable-offering items.
pub const PK_UNAVAILABLE: &str = "UNAVAILABLE";
/// Partition of the catalog snapshot.
pub const PK_CATALOG: &str = "CATALOG";
/// Partition of idempotency records.
pub const PK_PROCESSED: &str = "PROCESSED";
/// Partition of drains in progress (interruptions).
pub const PK_DRAIN: &str = "DRAIN";
/// Partition of disruptions in progress (the sweep's expiry, drift, emptiness).
pub const PK_DISRUPTION: &str = "DISRUPTION";
/// Partition of markers (when something last happened).
pub const PK_MARKER: &str = "MARKER";
/// Partition of nominations (nodes and claims the last solve gave pending pods).
pub const PK_NOMINATION: &str = "NOMINATION";
/// Partition of the per-day cost counters.
pub const PK_COST: &str = "COST";
/// The GSI on instance id.
pub const INSTANCE_INDEX: &str = "byInstanceId";

/// What can go wrong reading or writing state.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Someone else wrote the NodeClaim since it was read.
    #[error("nodeclaim {name}: version conflict (expected version {expected}, the table has {found:?})")]
    Conflict {
        /// The claim.
        name: String,
        /// The version the writer read.
        expected: u64,
        /// The version in the table, if the item still exists.
        found: Option<u64>,
    },
    /// A NodeClaim with this name exists already.
    #[error("nodeclaim {0} already exists")]
    AlreadyExists(String),
    /// A version-checked write of a record other than a claim lost to another writer.
    #[error("{what} {key}: version {expected} is no longer current")]
    Stale {
        /// The kind of record.
        what: &'static str,
        /// Its key.
        key: String,
        /// The version the write expected.
        expected: u64,
    },
    /// The lease is no longer held by this holder (expired and taken, or released).
    #[error("lease {name} lost by {holder} (fencing token {version})")]
    LeaseLost {
        /// The lease.
        name: String,
        /// Who thought it held it.
        holder: String,
        /// The fencing token it held.
        version: u64,
    },
    /// An item in the table is not what this code wrote.
    #[error("corrupt {what} item {key}: {reason}")]
    Corrupt {
        /// Kind of item.
        what: &'static str,
        /// Its sort key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A DynamoDB call failed.
    #[error("dynamodb {op} on table {table}")]
    Dynamo {
        /// The operation.
        op: &'static str,
        /// The table.
        table: String,
        /// The SDK's error (or what was left undone).
        #[source]
        source: BoxError,
    },
}

/// A cause kept as it came (the SDK's errors are a type per operation).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Which sort keys of a partition a Query reads.
#[derive(Clone, Copy)]
enum SortKeys<'a> {
    /// Those that begin with this.
    Prefix(&'a str),
    /// Those from the first to the second, both included.
    Between(&'a str, &'a str),
}

/// The state store: a DynamoDB client and the table name.
#[derive(Debug, Clone)]
pub struct StateStore {
    client: Client,
    table: String,
    /// The catalog last read, by generation: a warm container reads only the
    /// head item again, not the whole catalog (about 2 MB, 540 read units).
    catalog: std::sync::Arc<std::sync::Mutex<Option<(String, crate::catalog::Catalog)>>>,
}

impl StateStore {
    /// A store over `table`.
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        StateStore {
            client,
            table: table.into(),
            catalog: Default::default(),
        }
    }

    /// The table name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The DynamoDB client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Every item of one partition (optionally only sort keys with a prefix),
    /// following Query pagination to the end.
    async fn query_partition(&self, pk: &str, sk_prefix: Option<&str>) -> Result<Vec<item::Item>, StateError> {
        self.query_pages(pk, sk_prefix.map(SortKeys::Prefix)).await
    }

    /// Every item of one partition whose sort key lies in `from..=to`.
    async fn query_range(&self, pk: &str, from: &str, to: &str) -> Result<Vec<item::Item>, StateError> {
        self.query_pages(pk, Some(SortKeys::Between(from, to))).await
    }

    /// The item at (`pk`, `sk`), read strongly consistent; None when there is none.
    async fn read_item(&self, pk: &str, sk: &str) -> Result<Option<item::Item>, StateError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(item::key(pk, sk)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.dynamo("GetItem", e))?;
        Ok(out.item)
    }

    /// One partition's items, optionally narrowed by sort key, across pages.
    async fn query_pages(&self, pk: &str, sort_keys: Option<SortKeys<'_>>) -> Result<Vec<item::Item>, StateError> {
        let mut items = Vec::new();
        let mut start: Option<item::Item> = None;
        loop {
            let mut q = self
                .client
                .query()
                .table_name(&self.table)
                .expression_attribute_values(":pk", item::s(pk))
                .consistent_read(true)
                .set_exclusive_start_key(start.take());
            q = match sort_keys {
                Some(SortKeys::Prefix(prefix)) => q
                    .key_condition_expression("pk = :pk AND begins_with(sk, :prefix)")
                    .expression_attribute_values(":prefix", item::s(prefix)),
                Some(SortKeys::Between(from, to)) => q
                    .key_condition_expression("pk = :pk AND sk BETWEEN :from AND :to")
                    .expression_attribute_values(":from", item::s(from))
                    .expression_attribute_values(":to", item::s(to)),
                None => q.key_condition_expression("pk = :pk"),
            };
            let page = q.send().await.map_err(|e| self.dynamo("Query", e))?;
            items.extend(page.items().iter().cloned());
            match page.last_evaluated_key() {
                Some(k) if !k.is_empty() => start = Some(k.clone()),
                _ => return Ok(items),
            }
        }
    }

    /// Puts `it` if the stored item still has `version` (optimistic locking).
    /// Ok(false) when it does not (another writer moved on, or it is gone).
    async fn put_at_version(&self, it: item::Item, version: u64) -> Result<bool, StateError> {
        let res = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(it))
            .condition_expression("version = :v")
            .expression_attribute_values(":v", item::n(version))
            .send()
            .await;
        match res {
            Ok(_) => Ok(true),
            Err(e) if item::condition_failed(&e) => Ok(false),
            Err(e) => Err(self.dynamo("PutItem", e)),
        }
    }

    /// Deletes the item (pk, sk) if it still has `version`. Ok(false) when it does not.
    async fn delete_at_version(&self, pk: &str, sk: &str, version: u64) -> Result<bool, StateError> {
        let res = self
            .client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(item::key(pk, sk)))
            .condition_expression("version = :v")
            .expression_attribute_values(":v", item::n(version))
            .send()
            .await;
        match res {
            Ok(_) => Ok(true),
            Err(e) if item::condition_failed(&e) => Ok(false),
            Err(e) => Err(self.dynamo("DeleteItem", e)),
        }
    }

    fn dynamo<E: std::error::Error + Send + Sync + 'static>(&self, op: &'static str, err: E) -> StateError {
        StateError::Dynamo {
            op,
            table: self.table.clone(),
            source: Box::new(err),
        }
    }
}

/// Milliseconds since the Unix epoch, from the system clock.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

/// Seconds since the Unix epoch, from the system clock.
pub fn now_secs() -> i64 {
    now_ms() / 1000
}
