//! Leases: mutual exclusion with expiry, and a fencing token that grows on
//! every acquisition so a stale holder's fenced writes fail.

use std::future::Future;

use super::item::{self, get_i64, get_s, n, s};
use super::{PK_LEASE, StateError, StateStore};

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

impl StateStore {
    /// [`StateStore::acquire_lease`] retried every 200 ms for up to `wait` while
    /// someone else holds the lease; `Ok(None)` when it is still held then.
    pub async fn acquire_lease_within(
        &self,
        name: &str,
        holder: &str,
        ttl: std::time::Duration,
        wait: std::time::Duration,
    ) -> Result<Option<Lease>, StateError> {
        let deadline = super::now_ms() + wait.as_millis() as i64;
        loop {
            let lease = self
                .acquire_lease(name, holder, ttl.as_millis() as i64, super::now_ms())
                .await?;
            if lease.is_some() || super::now_ms() >= deadline {
                return Ok(lease);
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }

    /// Takes the lease for `ttl_ms` if it is free, expired, or already ours.
    /// `Ok(None)` means someone else holds it.
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
            Err(e) if item::condition_failed(&e) => Ok(None),
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

    /// Takes the lease `name` (waiting up to `wait` while another holds it),
    /// runs `work` with it while renewing it, then releases it. `Ok(None)`:
    /// another held it all along.
    pub async fn with_lease<T, Fut: Future<Output = T>>(
        &self,
        name: &str,
        holder: &str,
        ttl: std::time::Duration,
        wait: std::time::Duration,
        work: impl FnOnce(Lease) -> Fut,
    ) -> Result<Option<T>, StateError> {
        let Some(lease) = self.acquire_lease_within(name, holder, ttl, wait).await? else {
            return Ok(None);
        };
        let out = self.while_holding(&lease, ttl, work(lease.clone())).await;
        if let Err(e) = self.release_lease(&lease, super::now_ms()).await {
            tracing::warn!(lease = %name, error = %crate::telemetry::causes(&e), "could not release the lease; it expires by itself");
        }
        Ok(Some(out))
    }

    /// Runs `work` while renewing `lease` every third of `ttl`: a holder that
    /// dies frees the lease within `ttl`, a live one keeps it for as long as it
    /// works. A renewal that fails stops renewing (writes fenced by the lease
    /// then fail), it never stops `work`.
    pub async fn while_holding<T>(&self, lease: &Lease, ttl: std::time::Duration, work: impl Future<Output = T>) -> T {
        // On the heap: a solve's future is large, and a debug build's stack is not.
        let work = Box::pin(work);
        tokio::select! {
            t = work => t,
            never = self.keep(lease, ttl) => match never {},
        }
    }

    async fn keep(&self, lease: &Lease, ttl: std::time::Duration) -> std::convert::Infallible {
        let mut current = lease.clone();
        loop {
            tokio::time::sleep(ttl / 3).await;
            match self
                .renew_lease(&current, ttl.as_millis() as i64, super::now_ms())
                .await
            {
                Ok(l) => current = l,
                Err(e) => {
                    tracing::warn!(lease = %lease.name, error = %crate::telemetry::causes(&e), "cannot renew the lease; it expires by itself");
                    std::future::pending::<()>().await;
                }
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
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(item::key(PK_LEASE, name)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.dynamo("GetItem", e))?;
        let Some(it) = out.item() else { return Ok(None) };
        Ok(Some(Lease {
            name: name.to_string(),
            holder: get_s(it, "lease", "holder")?.to_string(),
            version: get_i64(it, "lease", "version")? as u64,
            until_ms: get_i64(it, "lease", "leaseUntil")?,
        }))
    }
}

impl StateStore {
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
