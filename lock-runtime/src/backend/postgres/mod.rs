//! Locks as leases in a PostgreSQL table.
//!
//! One row per lock, keyed by the lock's full name, with its holder, its
//! expiry and its fencing counter. Every decision is one statement on the
//! server, judged by the server's clock (`clock_timestamp()`), never the
//! client's:
//! - acquire: an upsert that takes a missing, expired or already-own row,
//!   and otherwise reports what is left of the holder's lease;
//! - renew, release: `UPDATE` / `DELETE … WHERE name = $1 AND holder = $2`;
//! - the watchdog's renewals of many leases: one `UPDATE … FROM unnest(…)`.
//!
//! Unlike `pg_advisory_lock`, a lease is not tied to a session: a pooled
//! connection recycled, or a transaction-mode pooler in between, cannot
//! free it, and it carries a fencing token.
//!
//! Waiters hear releases: each release statement `NOTIFY`s the table's
//! channel, and one connection per client `LISTEN`s there (`listen`).
//!
//! The files, bottom-up: `sql` the statements, `listen` the release
//! listener, `table` the client and how one operation runs; this file each
//! kind's attempt and the dispatch of every operation.
//!
//! The driver is `tokio-postgres`, through `deadpool-postgres`'s pool,
//! which keeps each connection's prepared statements: after the first use
//! an operation is one round trip.

use std::collections::HashSet;
use std::time::Duration;

use deadpool_postgres::PoolError;

pub(crate) use self::table::PostgresBackend;
use self::table::{as_micros, held, micros};
use super::contract::{AcquireReply, AcquireRequest, Backend, Failure, RenewItem, Renewal};
use crate::key::LockKey;
use crate::spec::Kind;

// Bottom-up: each file uses only those declared before it.
mod sql;

mod listen;

mod table;

pub(crate) use self::listen::Releases;

/// Why this backend cannot take a lock of `kind`, if it cannot.
pub(crate) fn unsupported(kind: Kind) -> Option<&'static str> {
    match kind {
        Kind::Exclusive | Kind::Segments(_) => None,
        Kind::Read | Kind::Write => Some("read-write locks on PostgreSQL (not built yet)"),
        Kind::Permits(_) => Some("permits on PostgreSQL (not built yet)"),
        Kind::Fair => Some("fair locks on PostgreSQL (not built yet)"),
    }
}

/// What one acquisition statement found.
enum Taken {
    /// The row is ours, with its fence counter.
    Ours(u64),
    /// Another holder's, with this much of its lease left.
    Held(Duration),
}

impl PostgresBackend {
    /// Starts the connection that hears releases and tells `releases`
    /// (a client's waiters); it lives as long as this backend.
    pub(crate) fn listen(&self, releases: std::sync::Arc<dyn Releases>) {
        let task = tokio::spawn(listen::listen(
            (*self.config).clone(),
            self.sql.listen.clone(),
            self.timeout,
            releases,
        ));
        let mut slot = self
            .listener
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(old) = slot.replace(task) {
            old.abort();
        }
    }

    /// One try at the row `name`, on `client` (a pooled connection, or a
    /// transaction on one).
    async fn take(
        &self,
        client: &impl deadpool_postgres::GenericClient,
        name: &str,
        holder: &str,
        ttl_us: i64,
        step: i64,
    ) -> Result<Taken, PoolError> {
        let statement = client.prepare_cached(&self.sql.acquire).await?;
        let row = client
            .query_opt(&statement, &[&name, &holder, &ttl_us, &step])
            .await?;
        Ok(match row {
            Some(row) if row.try_get::<_, bool>(0)? => {
                Taken::Ours(u64::try_from(row.try_get::<_, i64>(1)?).unwrap_or(0))
            }
            Some(row) => Taken::Held(micros(row.try_get(1)?)),
            // Held by a row this statement's snapshot did not see: look
            // again soon.
            None => Taken::Held(micros(0)),
        })
    }

    async fn acquire_one(&self, req: &AcquireRequest<'_>) -> Result<AcquireReply, Failure> {
        let name = req.key.redis_key.as_str();
        Self::check_name(req.key, name)?;
        let ttl_us = as_micros(req.ttl);
        let step = i64::from(req.fencing);
        self.run(req.key, "acquire", || async {
            let client = self.pool.get().await?;
            Ok(match self.take(&client, name, req.holder, ttl_us, step).await? {
                Taken::Ours(token) => AcquireReply::acquired(req.fencing.then_some(token)),
                Taken::Held(left) => held(left, 0),
            })
        })
        .await
    }

    /// Any free segment of `count`, tried in order.
    async fn acquire_segment(&self, req: &AcquireRequest<'_>, count: u32) -> Result<AcquireReply, Failure> {
        let names: Vec<String> = req.key.segment_keys(count).collect();
        for name in &names {
            Self::check_name(req.key, name)?;
        }
        let ttl_us = as_micros(req.ttl);
        let step = i64::from(req.fencing);
        self.run(req.key, "acquire", || async {
            let client = self.pool.get().await?;
            // The soonest any segment frees.
            let mut soonest = Duration::MAX;
            for (i, name) in (0..count).zip(&names) {
                match self.take(&client, name, req.holder, ttl_us, step).await? {
                    Taken::Ours(token) => {
                        return Ok(AcquireReply::Acquired {
                            token: req.fencing.then_some(token),
                            segment: Some(i),
                        });
                    }
                    Taken::Held(left) => soonest = soonest.min(left),
                }
            }
            Ok(held(soonest, 0))
        })
        .await
    }

    /// Every lock of a set or none, in one transaction: a row that is held
    /// rolls back the rows taken before it. The set is sorted, so two
    /// callers with overlapping sets wait for each other in one order.
    async fn acquire_set(&self, req: &AcquireRequest<'_>) -> Result<AcquireReply, Failure> {
        let set: Vec<&LockKey> = std::iter::once(req.key).chain(req.also).collect();
        for key in &set {
            Self::check_name(key, &key.redis_key)?;
        }
        let ttl_us = as_micros(req.ttl);
        self.run(req.key, "acquire", || async {
            let mut client = self.pool.get().await?;
            // Rolled back when dropped uncommitted (this future dropped
            // half-way included), before the connection is reused.
            let tx = client.transaction().await?;
            for (i, key) in set.iter().enumerate() {
                if let Taken::Held(left) = self.take(&tx, &key.redis_key, req.holder, ttl_us, 0).await? {
                    tx.rollback().await?;
                    return Ok(held(left, i));
                }
            }
            tx.commit().await?;
            Ok(AcquireReply::acquired(None))
        })
        .await
    }

    /// Releases `names` (each with the channel its waiters watch), and
    /// announces each one released.
    async fn release_names(
        &self,
        key: &LockKey,
        names: &[&str],
        channels: &[&str],
        holder: &str,
    ) -> Result<bool, Failure> {
        self.run(key, "release", || async {
            let client = self.pool.get().await?;
            let statement = client.prepare_cached(&self.sql.release).await?;
            let row = client
                .query_one(&statement, &[&names, &holder, &channels, &self.sql.channel])
                .await?;
            Ok(row.try_get::<_, i64>(0)? > 0)
        })
        .await
    }
}

impl Backend for PostgresBackend {
    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<AcquireReply, Failure> {
        match req.kind {
            Kind::Segments(n) => self.acquire_segment(req, n).await,
            _ if !req.also.is_empty() => self.acquire_set(req).await,
            _ => self.acquire_one(req).await,
        }
    }

    async fn release(&self, key: &LockKey, holder: &str) -> Result<bool, Failure> {
        self.release_names(key, &[key.redis_key.as_str()], &[key.channel.as_str()], holder)
            .await
    }

    async fn release_many(&self, keys: &[LockKey], holder: &str) -> Result<bool, Failure> {
        let Some(first) = keys.first() else {
            return Ok(false);
        };
        let names: Vec<&str> = keys.iter().map(|k| k.redis_key.as_str()).collect();
        let channels: Vec<&str> = keys.iter().map(|k| k.channel.as_str()).collect();
        self.release_names(first, &names, &channels, holder).await
    }

    async fn release_segments(&self, key: &LockKey, count: u32, holder: &str) -> Result<bool, Failure> {
        let names: Vec<String> = key.segment_keys(count).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        // Every segment's waiters watch the lock's channel.
        let channels = vec![key.channel.as_str(); names.len()];
        self.release_names(key, &names, &channels, holder).await
    }

    async fn renew(
        &self,
        key: &LockKey,
        holder: &str,
        ttl: Duration,
        extend_only: bool,
    ) -> Result<bool, Failure> {
        if !extend_only {
            let renewed = self.renew_many(&[RenewItem { key, holder, ttl }]).await?;
            return Ok(renewed == [Renewal::Renewed]);
        }
        let name = key.redis_key.as_str();
        self.run(key, "renew", || async {
            let client = self.pool.get().await?;
            let statement = client.prepare_cached(&self.sql.extend).await?;
            // PostgreSQL counts the rows matched, changed or not: an
            // extension that did not extend still says the lock is held.
            Ok(client
                .execute(&statement, &[&as_micros(ttl), &name, &holder])
                .await?
                > 0)
        })
        .await
    }

    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Result<Vec<Renewal>, Failure> {
        let Some(first) = items.first() else {
            return Ok(Vec::new());
        };
        let names: Vec<&str> = items.iter().map(|i| i.key.redis_key.as_str()).collect();
        let holders: Vec<&str> = items.iter().map(|i| i.holder).collect();
        let ttls: Vec<i64> = items.iter().map(|i| as_micros(i.ttl)).collect();
        let renewed: HashSet<(String, String)> = self
            .run(first.key, "renew", || async {
                let client = self.pool.get().await?;
                let statement = client.prepare_cached(&self.sql.renew_many).await?;
                let rows = client.query(&statement, &[&names, &holders, &ttls]).await?;
                rows.iter()
                    .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
                    .collect::<Result<_, tokio_postgres::Error>>()
                    .map_err(PoolError::Backend)
            })
            .await?;
        Ok(items
            .iter()
            .map(|item| {
                let key = (item.key.redis_key.clone(), item.holder.to_owned());
                Renewal::from(renewed.contains(&key))
            })
            .collect())
    }
}
