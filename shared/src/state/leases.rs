//! Leases: mutual exclusion with expiry, and a fencing token that grows on
//! every acquisition so a stale holder's fenced writes fail.

use std::future::Future;
use std::time::Duration;

use super::item::{self, get_i64, get_s, n, s};
use super::{PK_LEASE, StateError, StateStore};
use crate::deadline::Deadline;

/// A held lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The lease's name (e.g. `provision`, `sweep`, `launch/<nodeclaim>`).
    pub name: String,
    /// Who holds it.
    pub holder: String,
    /// Fencing token: bumped on every acquisition, never reused.
    pub version: u64,
    /// Held until this time (epoch ms) unless renewed.
    pub until_ms: i64,
}

/// How soon a waiter first reads again a lease another holds.
const POLL: Duration = Duration::from_millis(200);

/// The longest pause between a waiter's reads: in a storm twenty waiters
/// polling every 200 ms for 20 s made over a thousand strongly consistent
/// reads of one item; a holder's release is still seen within a second.
const POLL_MAX: Duration = Duration::from_secs(1);

/// The pause before a waiter's next read after `polls` reads found the lease
/// held (pure, before jitter): 200 ms doubling to at most a second.
pub fn poll_pause(polls: u32) -> Duration {
    (POLL * 2u32.saturating_pow(polls.saturating_sub(1).min(8))).min(POLL_MAX)
}

/// How many times a write that met a DynamoDB transaction is tried in all.
pub(super) const CONFLICT_TRIES: u32 = 5;

/// A holder identity for one invocation: `prefix` (the function) and a fresh
/// random part, so two invocations of one container never pass for each
/// other (a lease already held by its holder is taken again at once).
pub fn invocation_holder(prefix: &str) -> String {
    format!("{prefix}-{:016x}", random_u64())
}

/// A fresh random number from the standard library's per-process random
/// hashing keys and a counter (enough for identities and jitter, no crate).
fn random_u64() -> u64 {
    use std::hash::BuildHasher;
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    std::hash::RandomState::new().hash_one((COUNTER.fetch_add(1, Ordering::Relaxed), super::now_ms()))
}

/// `base` scaled by a random factor in [0.5, 1.5): writers that met each
/// other do not meet again in lockstep.
pub(super) fn jitter(base: Duration) -> Duration {
    base.mul_f64(0.5 + (random_u64() % 1000) as f64 / 1000.0)
}

/// The pause before try `attempt` (1-based) of a write that met a
/// transaction: 25 ms doubling, jittered.
pub(super) fn conflict_backoff(attempt: u32) -> Duration {
    jitter(Duration::from_millis(25) * 2u32.pow(attempt.min(6)))
}

/// Whether a lease read at `now_ms` is free to take: no item, or expired (pure).
pub fn is_free(stored: Option<&Lease>, now_ms: i64) -> bool {
    stored.is_none_or(|l| l.until_ms <= now_ms)
}

/// When to try again after a renewal failed for a reason other than losing
/// the lease (pure): soon (a tenth of `ttl`, never after half the time left)
/// while the lease held until `until_ms` has not expired at `now_ms`; None
/// once it has, since then it may have been taken.
pub fn renewal_retry(until_ms: i64, now_ms: i64, ttl: Duration) -> Option<Duration> {
    let left = until_ms - now_ms;
    if left <= 0 {
        return None;
    }
    Some((ttl / 10).min(Duration::from_millis(left as u64 / 2)))
}

/// True when DynamoDB refused a single-item write because a transaction on
/// the item was under way (`TransactionConflictException`).
fn transaction_under_way<E, R>(e: &aws_sdk_dynamodb::error::SdkError<E, R>) -> bool
where
    E: aws_sdk_dynamodb::error::ProvideErrorMetadata,
{
    e.as_service_error().and_then(|s| s.code()) == Some("TransactionConflictException")
}

impl StateStore {
    /// Waits up to `wait` for the lease: it is read (strongly consistent)
    /// after pauses growing from 200 ms to a second ([`poll_pause`]) and
    /// written only when free or expired, so a waiter
    /// never writes the item a live holder's fenced transactions check (a
    /// write there would cancel them). `Ok(None)` when it is still held then.
    pub async fn acquire_lease_within(
        &self,
        name: &str,
        holder: &str,
        ttl: std::time::Duration,
        wait: std::time::Duration,
    ) -> Result<Option<Lease>, StateError> {
        let deadline = super::now_ms() + wait.as_millis() as i64;
        let mut polls = 0;
        loop {
            polls += 1;
            let now = super::now_ms();
            if is_free(self.read_lease(name).await?.as_ref(), now) {
                // Another waiter may win the race to the write: then it is held again.
                if let Some(lease) = self.acquire_lease(name, holder, ttl.as_millis() as i64, now).await? {
                    return Ok(Some(lease));
                }
            }
            let left = deadline - super::now_ms();
            if left <= 0 {
                return Ok(None);
            }
            tokio::time::sleep(jitter(poll_pause(polls)).min(Duration::from_millis(left as u64))).await;
        }
    }

    /// Takes the lease for `ttl_ms` if it is free, expired, or already ours.
    /// `Ok(None)` means someone else holds it (or was writing under it at
    /// that instant: DynamoDB refuses a write to an item in a transaction).
    pub async fn acquire_lease(
        &self,
        name: &str,
        holder: &str,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<Option<Lease>, StateError> {
        let until = now_ms + ttl_ms;
        let res = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(item::key(PK_LEASE, name)))
            .update_expression("SET holder = :h, leaseUntil = :u ADD version :one")
            .condition_expression("attribute_not_exists(pk) OR leaseUntil <= :now OR holder = :h")
            .expression_attribute_values(":h", s(holder))
            .expression_attribute_values(":u", n(until))
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":now", n(now_ms))
            .return_values(aws_sdk_dynamodb::types::ReturnValue::AllNew)
            .send()
            .await;
        match res {
            Ok(out) => {
                let attrs = out.attributes().cloned().unwrap_or_default();
                let version = get_i64(&attrs, "lease", "version")?;
                Ok(Some(Lease {
                    name: name.to_string(),
                    holder: get_s(&attrs, "lease", "holder")?.to_string(),
                    version: version as u64,
                    until_ms: until,
                }))
            }
            Err(e) if item::condition_failed(&e) || transaction_under_way(&e) => Ok(None),
            Err(e) => Err(self.dynamo("UpdateItem", e)),
        }
    }

    /// Extends a held lease; `LeaseLost` if it expired and was taken, or was released.
    pub async fn renew_lease(&self, lease: &Lease, ttl_ms: i64, now_ms: i64) -> Result<Lease, StateError> {
        let until = now_ms + ttl_ms;
        self.guarded_lease_write(lease, "SET leaseUntil = :u", until, now_ms)
            .await?;
        Ok(Lease {
            until_ms: until,
            ..lease.clone()
        })
    }

    /// Takes the lease `name` for one invocation (as
    /// [`invocation_holder`]`(holder)`, waiting up to `wait` while another
    /// holds it), runs `work` with it while renewing it, then releases it
    /// by `release_by` ([`Self::release_lease_by`]).
    /// `Ok(None)`: another held it all along.
    pub async fn with_lease<T, Fut: Future<Output = T>>(
        &self,
        name: &str,
        holder: &str,
        ttl: std::time::Duration,
        wait: std::time::Duration,
        release_by: Deadline,
        work: impl FnOnce(Lease) -> Fut,
    ) -> Result<Option<T>, StateError> {
        let holder = invocation_holder(holder);
        let Some(lease) = self.acquire_lease_within(name, &holder, ttl, wait).await? else {
            return Ok(None);
        };
        let out = self.while_holding(&lease, ttl, work(lease.clone())).await;
        self.release_lease_by(&lease, release_by).await;
        Ok(Some(out))
    }

    /// Releases `lease` unless `by` comes first. A release not made (failed,
    /// or still waiting at `by`, when it is dropped) leaves the lease to
    /// expire by itself, as a holder that died would: an invocation that
    /// waited on it instead would be ended by Lambda at its timeout.
    pub async fn release_lease_by(&self, lease: &Lease, by: Deadline) {
        match by.within(self.release_lease(lease, super::now_ms())).await {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                tracing::warn!(lease = %lease.name, error = %crate::telemetry::causes(&e), "could not release the lease; it expires by itself");
            }
            None => {
                tracing::warn!(lease = %lease.name, "the deadline came before the lease was released; it expires by itself");
            }
        }
    }

    /// Runs `work` while renewing `lease` every third of `ttl`: a holder that
    /// dies frees the lease within `ttl`, a live one keeps it for as long as it
    /// works. Renewal is a task of its own, so it goes on while `work` waits or
    /// computes (work that computes long must leave the runtime's thread, see
    /// `capacity::off_task`); a renewal that fails is tried again until the
    /// lease would have expired, and only then, or when the lease is lost,
    /// renewal stops (writes fenced by the lease then fail). It never stops `work`.
    pub async fn while_holding<T>(&self, lease: &Lease, ttl: std::time::Duration, work: impl Future<Output = T>) -> T {
        let renewal = AbortOnDrop(tokio::spawn(self.clone().keep(lease.clone(), ttl)));
        // On the heap: a solve's future is large, and a debug build's stack is not.
        let out = Box::pin(work).await;
        drop(renewal);
        out
    }

    async fn keep(self, lease: Lease, ttl: std::time::Duration) {
        let mut current = lease;
        let mut pause = ttl / 3;
        loop {
            tokio::time::sleep(pause).await;
            let now = super::now_ms();
            match self.renew_lease(&current, ttl.as_millis() as i64, now).await {
                Ok(l) => {
                    current = l;
                    pause = ttl / 3;
                }
                Err(e @ StateError::LeaseLost { .. }) => {
                    tracing::warn!(lease = %current.name, error = %crate::telemetry::causes(&e), "the lease was lost; fenced writes will fail");
                    return;
                }
                Err(e) => match renewal_retry(current.until_ms, super::now_ms(), ttl) {
                    Some(p) => {
                        tracing::info!(lease = %current.name, error = %crate::telemetry::causes(&e), retry_ms = p.as_millis() as u64, "cannot renew the lease yet; trying again");
                        pause = jitter(p);
                    }
                    None => {
                        tracing::warn!(lease = %current.name, error = %crate::telemetry::causes(&e), "cannot renew the lease and it has expired; fenced writes will fail");
                        return;
                    }
                },
            }
        }
    }

    /// Gives a held lease up at once (the token stays, so the next holder gets a higher one).
    pub async fn release_lease(&self, lease: &Lease, now_ms: i64) -> Result<(), StateError> {
        self.guarded_lease_write(lease, "SET leaseUntil = :u", 0, now_ms).await
    }

    async fn guarded_lease_write(
        &self,
        lease: &Lease,
        update: &str,
        until: i64,
        now_ms: i64,
    ) -> Result<(), StateError> {
        let res = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(item::key(PK_LEASE, &lease.name)))
            .update_expression(update)
            .condition_expression("holder = :h AND version = :v AND leaseUntil > :now")
            .expression_attribute_values(":h", s(&lease.holder))
            .expression_attribute_values(":v", n(lease.version))
            .expression_attribute_values(":u", n(until))
            .expression_attribute_values(":now", n(now_ms))
            .send()
            .await;
        match res {
            Ok(_) => Ok(()),
            Err(e) if item::condition_failed(&e) => Err(StateError::LeaseLost {
                name: lease.name.clone(),
                holder: lease.holder.clone(),
                version: lease.version,
            }),
            Err(e) => Err(self.dynamo("UpdateItem", e)),
        }
    }

    /// Deletes a held lease item. Only for leases whose fencing token is never
    /// used again (per-NodeClaim launch leases once the claim has left Pending):
    /// the next acquisition starts again from token 1.
    pub async fn delete_lease(&self, lease: &Lease, now_ms: i64) -> Result<(), StateError> {
        let res = self
            .client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(item::key(PK_LEASE, &lease.name)))
            .condition_expression("holder = :h AND version = :v AND leaseUntil > :now")
            .expression_attribute_values(":h", s(&lease.holder))
            .expression_attribute_values(":v", n(lease.version))
            .expression_attribute_values(":now", n(now_ms))
            .send()
            .await;
        match res {
            Ok(_) => Ok(()),
            Err(e) if item::condition_failed(&e) => Err(StateError::LeaseLost {
                name: lease.name.clone(),
                holder: lease.holder.clone(),
                version: lease.version,
            }),
            Err(e) => Err(self.dynamo("DeleteItem", e)),
        }
    }

    /// The lease as stored (holder, token, expiry), whether or not it is live.
    pub async fn read_lease(&self, name: &str) -> Result<Option<Lease>, StateError> {
        let out = self.read_item(PK_LEASE, name).await?;
        let Some(it) = out.as_ref() else { return Ok(None) };
        Ok(Some(Lease {
            name: name.to_string(),
            holder: get_s(it, "lease", "holder")?.to_string(),
            version: get_i64(it, "lease", "version")? as u64,
            until_ms: get_i64(it, "lease", "leaseUntil")?,
        }))
    }

    /// Lets DynamoDB's TTL delete the lease item `name` at `expires_at_secs`
    /// (epoch s): for a lease whose item would otherwise outlive what it
    /// guards (a launch lease of a claim that failed and may never launch).
    /// Only the TTL attribute is written; an item already gone stays gone.
    pub async fn expire_lease_item(&self, name: &str, expires_at_secs: i64) -> Result<(), StateError> {
        let res = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(item::key(PK_LEASE, name)))
            .update_expression("SET #ttl = :e")
            .condition_expression("attribute_exists(pk)")
            .expression_attribute_names("#ttl", super::TTL_ATTRIBUTE)
            .expression_attribute_values(":e", n(expires_at_secs))
            .send()
            .await;
        match res {
            Ok(_) => Ok(()),
            Err(e) if item::condition_failed(&e) => Ok(()),
            Err(e) => Err(self.dynamo("UpdateItem", e)),
        }
    }
}

/// Aborts a spawned task when dropped (the renewal ends with the work, even
/// when the work's future is dropped half-way).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(until_ms: i64) -> Lease {
        Lease {
            name: "provision".into(),
            holder: "h".into(),
            version: 1,
            until_ms,
        }
    }

    #[test]
    fn a_lease_is_free_when_absent_or_expired() {
        assert!(is_free(None, 10));
        assert!(is_free(Some(&lease(10)), 10));
        assert!(!is_free(Some(&lease(11)), 10));
    }

    #[test]
    fn a_failed_renewal_is_retried_soon_until_the_lease_would_expire() {
        let ttl = Duration::from_secs(15);
        assert_eq!(renewal_retry(20_000, 5_000, ttl), Some(Duration::from_millis(1500)));
        // Close to expiry: within half the time left.
        assert_eq!(renewal_retry(20_000, 19_000, ttl), Some(Duration::from_millis(500)));
        assert_eq!(renewal_retry(20_000, 20_000, ttl), None);
        assert_eq!(renewal_retry(20_000, 25_000, ttl), None);
    }

    #[test]
    fn a_waiter_reads_a_held_lease_less_often_the_longer_it_waits() {
        let pauses: Vec<u128> = (1..=6).map(|p| poll_pause(p).as_millis()).collect();
        assert_eq!(pauses, [200, 400, 800, 1000, 1000, 1000]);
        assert_eq!(poll_pause(u32::MAX), POLL_MAX);
        // A 20 s wait reads the lease about 23 times, not a hundred.
        let mut waited = Duration::ZERO;
        let reads = (1..).take_while(|&p| {
            waited += poll_pause(p);
            waited < Duration::from_secs(20)
        });
        assert!(reads.count() < 25);
    }

    #[test]
    fn invocation_holders_are_unique_and_jitter_stays_in_its_band() {
        let a = invocation_holder("provision");
        let b = invocation_holder("provision");
        assert_ne!(a, b);
        assert!(a.starts_with("provision-"), "{a}");
        for _ in 0..100 {
            let j = jitter(Duration::from_millis(200));
            assert!(
                j >= Duration::from_millis(100) && j < Duration::from_millis(300),
                "{j:?}"
            );
        }
    }
}
