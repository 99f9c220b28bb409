//! Locks as leases in a PostgreSQL table.
//!
//! One row per lock, keyed by the lock's full name, with its holder, its
//! expiry and its fencing counter. Every decision is one statement on the
//! server, judged by the server's clock (`clock_timestamp()`), never the
//! client's:
//! - acquire: a plain insert when no fencing is asked (a lock with no row,
//!   the common case); if a row is there, an upsert that takes a missing,
//!   expired or already-own row, and otherwise reports what is left of the
//!   holder's lease;
//! - renew, of one lease or of many (the watchdog's): one
//!   `UPDATE … SET expires_at = greatest(…) FROM unnest(…)` (a lease only
//!   lengthens: a renewal sent before an extension may land after it);
//! - release: a plain `DELETE … WHERE name = $1 AND holder = $2` of a row
//!   never fenced; if none went, the statement that also frees a fenced row
//!   and keeps its counter.
//!
//! Unlike `pg_advisory_lock`, a lease is not tied to a session: a pooled
//! connection recycled, or a transaction-mode pooler in between, cannot
//! free it, and it carries a fencing token.
//!
//! Waiters hear releases: each release statement `NOTIFY`s the table's
//! channel, and one connection per client `LISTEN`s there (`listen`).
//!
//! The files, bottom-up: `sql` the statements, `listen` the release
//! listener, `table` the client and how one operation runs, `shared` and
//! `fair` those kinds' attempts, `admin` what `lockctl` asks; this file the
//! exclusive attempt and the dispatch of every operation.
//!
//! The driver is `tokio-postgres`, through `deadpool-postgres`'s pool,
//! which keeps each connection's prepared statements: after the first use
//! an operation is one round trip.

use std::collections::HashSet;
use std::time::Duration;

use deadpool_postgres::{Object, PoolError};

use self::shared::{gate_kind, is_member};
pub(crate) use self::table::PostgresBackend;
use self::table::{Connector, as_micros, conflict, held, micros};
use super::contract::{
    AcquireReply, AcquireRequest, Backend, Failure, HandOver, LeaderRecord, RenewItem, Renewal,
    recorded_value,
};
use crate::error::LockError;
use crate::key::LockKey;
use crate::spec::Kind;

// Bottom-up: each file uses only those declared before it.
mod sql;

mod listen;

mod table;

mod shared;

mod fair;

mod admin;

pub(crate) use self::listen::Releases;

/// What one acquisition statement found.
enum Taken {
    /// The row is ours, with its fence counter.
    Ours(u64),
    /// Another holder's, with this much of its lease left; with that
    /// holder's id when the row is not yet marked as waited for (see
    /// [`PostgresBackend::mark`]).
    Held(Duration, Option<String>),
    /// A shared lock's gate (its marker): another kind of lock.
    Gate(String),
}

impl PostgresBackend {
    /// Starts the connection that hears releases and tells `releases`
    /// (a client's waiters); it lives as long as this backend.
    pub(crate) fn listen(&self, releases: std::sync::Arc<dyn Releases>) {
        let config = (*self.config).clone();
        let listen = self.sql.listen.clone();
        let task = match &self.connector {
            Connector::Plain => tokio::spawn(listen::listen(
                config,
                tokio_postgres::NoTls,
                listen,
                self.timeout,
                releases,
            )),
            #[cfg(feature = "tls")]
            Connector::Tls(tls) => tokio::spawn(listen::listen(
                config,
                tls.clone(),
                listen,
                self.timeout,
                releases,
            )),
        };
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
            // What is left is -1 for a gate alone (its expiry is infinite).
            Some(row) if row.try_get::<_, i64>(1)? < 0 => Taken::Gate(row.try_get(2)?),
            Some(row) => {
                let unmarked = (!row.try_get::<_, bool>(3)?)
                    .then(|| row.try_get(2))
                    .transpose()?;
                Taken::Held(micros(row.try_get(1)?), unmarked)
            }
            // Held by a row this statement's snapshot did not see: look
            // again soon.
            None => Taken::Held(micros(0), None),
        })
    }

    /// Marks the row `name` as waited for while `seen` holds it, so that
    /// its release is announced; then how long to wait: `left`, or nothing
    /// when `seen` no longer holds it (its release may have gone
    /// unannounced: look again at once).
    async fn mark(
        &self,
        client: &impl deadpool_postgres::GenericClient,
        name: &str,
        seen: &str,
        left: Duration,
    ) -> Result<Duration, PoolError> {
        let statement = client.prepare_cached(&self.sql.mark).await?;
        let marked = client.query_opt(&statement, &[&name, &seen]).await?.is_some();
        Ok(if marked { left } else { micros(0) })
    }

    async fn acquire_one(&self, req: &AcquireRequest<'_>) -> Result<AcquireReply, Failure> {
        let name = req.key.redis_key.as_str();
        Self::check_name(req.key, name)?;
        let ttl_us = as_micros(req.ttl);
        let step = i64::from(req.fencing);
        self.run(req.key, "acquire", || async {
            let mut attempt = self.attempt(req.holder).await?;
            let client = &*attempt.connection();
            // The first attempt, which most often finds the lock free, and
            // not a fenced one, whose row outlives its holders.
            let taken_free = req.first && !req.fencing && {
                let statement = client.prepare_cached(&self.sql.take_free).await?;
                client.execute(&statement, &[&name, &req.holder, &ttl_us]).await? == 1
            };
            let reply = if taken_free {
                Ok(AcquireReply::acquired(None))
            } else {
                match self.take(client, name, req.holder, ttl_us, step).await? {
                    Taken::Ours(token) => Ok(AcquireReply::acquired(req.fencing.then_some(token))),
                    Taken::Held(left, None) => Ok(held(left, 0)),
                    Taken::Held(left, Some(seen)) => Ok(held(self.mark(client, name, &seen, left).await?, 0)),
                    Taken::Gate(marker) => Err(marker),
                }
            };
            attempt.answered();
            Ok(reply)
        })
        .await?
        .map_err(|marker| conflict(req.key, gate_kind(&marker)))
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
            let mut attempt = self.attempt(req.holder).await?;
            let client = &*attempt.connection();
            // The soonest any segment frees.
            let mut soonest = Duration::MAX;
            let mut outcome = None;
            for (i, name) in (0..count).zip(&names) {
                match self.take(client, name, req.holder, ttl_us, step).await? {
                    Taken::Ours(token) => {
                        outcome = Some(Ok(AcquireReply::Acquired {
                            token: req.fencing.then_some(token),
                            segment: Some(i),
                        }));
                        break;
                    }
                    Taken::Held(left, None) => soonest = soonest.min(left),
                    // Every segment's release must be announced: a waiter
                    // takes whichever frees first.
                    Taken::Held(left, Some(seen)) => {
                        soonest = soonest.min(self.mark(client, name, &seen, left).await?);
                    }
                    Taken::Gate(marker) => {
                        outcome = Some(Err(marker));
                        break;
                    }
                }
            }
            attempt.answered();
            Ok(outcome.unwrap_or_else(|| Ok(held(soonest, 0))))
        })
        .await?
        .map_err(|marker| conflict(req.key, gate_kind(&marker)))
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
            let mut attempt = self.attempt(req.holder).await?;
            let reply = self
                .take_set(attempt.connection(), &set, req.holder, ttl_us)
                .await?;
            attempt.answered();
            Ok(reply)
        })
        .await?
        .map_err(|(i, marker)| conflict(set[i], gate_kind(&marker)))
    }

    /// `acquire_set`'s attempt on `client`.
    async fn take_set(
        &self,
        client: &mut Object,
        set: &[&LockKey],
        holder: &str,
        ttl_us: i64,
    ) -> Result<Result<AcquireReply, (usize, String)>, PoolError> {
        // Rolled back when dropped uncommitted (this future dropped
        // half-way included), before the connection is reused.
        let tx = client.transaction().await?;
        for (i, key) in set.iter().enumerate() {
            match self.take(&tx, &key.redis_key, holder, ttl_us, 0).await? {
                Taken::Ours(_) => {}
                Taken::Held(left, unmarked) => {
                    tx.rollback().await?;
                    // Marked outside the rolled-back transaction, or
                    // the mark would go with it.
                    let wait = match unmarked {
                        Some(seen) => self.mark(&*client, &key.redis_key, &seen, left).await?,
                        None => left,
                    };
                    return Ok(Ok(held(wait, i)));
                }
                Taken::Gate(marker) => {
                    tx.rollback().await?;
                    return Ok(Err((i, marker)));
                }
            }
        }
        tx.commit().await?;
        Ok(Ok(AcquireReply::acquired(None)))
    }

    /// Gives the exclusive lock `key` from `from` to `to` (a waiter of this
    /// client) with a lease of `ttl` from now, if `from` still holds it.
    pub(crate) async fn hand_over(
        &self,
        key: &LockKey,
        from: &str,
        to: &str,
        ttl: Duration,
        fencing: bool,
    ) -> Result<HandOver, Failure> {
        let name = key.redis_key.as_str();
        let ttl_us = as_micros(ttl);
        let step = i64::from(fencing);
        // Like a release, behind any attempt of `from` still on its way.
        self.after_unanswered(from).await;
        self.run(key, "hand over", || async {
            let client = self.pool.get().await?;
            let statement = client.prepare_cached(&self.sql.hand_over).await?;
            let row = client
                .query_opt(&statement, &[&name, &from, &to, &ttl_us, &step])
                .await?;
            Ok(match row {
                Some(row) => HandOver::Handed {
                    token: fencing.then_some(u64::try_from(row.try_get::<_, i64>(0)?).unwrap_or(0)),
                },
                None => HandOver::NotHeld,
            })
        })
        .await
    }

    /// Sets the exclusive lock's lease to end `left` from now by the
    /// database's clock, if `holder` still has it (`AnyBackend::keep`),
    /// then sweeps rows such locks left behind (`sweep` in `sql.rs`): on
    /// its own, because a failed sweep must not fail the keep.
    pub(crate) async fn keep(&self, key: &LockKey, holder: &str, left: Duration) -> Result<bool, Failure> {
        let name = key.redis_key.as_str();
        let left_us = as_micros(left + Duration::from_nanos(999));
        self.after_unanswered(holder).await;
        let kept = self
            .run(key, "keep", || async {
                let client = self.lane.get().await?;
                let statement = client.prepare_cached(&self.sql.keep).await?;
                Ok(client
                    .query_opt(&statement, &[&name, &holder, &left_us])
                    .await?
                    .is_some())
            })
            .await?;
        let swept = self
            .run(key, "sweep", || async {
                let client = self.pool.get().await?;
                let statement = client.prepare_cached(&self.sql.sweep).await?;
                client.execute(&statement, &[]).await?;
                Ok(())
            })
            .await;
        if let Err(failure) = swept {
            tracing::debug!(error = %failure.error, "sweeping expired lock rows failed; the next keep sweeps them");
        }
        Ok(kept)
    }

    /// Renews `items` with `sql` (`renew_many` of either table) in one
    /// statement: the (name, holder) of each lease still held.
    async fn renew_batch(
        &self,
        items: &[&RenewItem<'_>],
        sql: &str,
    ) -> Result<HashSet<(String, String)>, Failure> {
        let Some(first) = items.first() else {
            return Ok(HashSet::new());
        };
        let names: Vec<&str> = items.iter().map(|i| i.key.redis_key.as_str()).collect();
        let holders: Vec<&str> = items.iter().map(|i| i.holder).collect();
        let ttls: Vec<i64> = items.iter().map(|i| as_micros(i.ttl)).collect();
        self.run(first.key, "renew", || async {
            let client = self.lane.get().await?;
            let statement = client.prepare_cached(sql).await?;
            let rows = client.query(&statement, &[&names, &holders, &ttls]).await?;
            rows.iter()
                .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
                .collect::<Result<_, tokio_postgres::Error>>()
                .map_err(PoolError::Backend)
        })
        .await
    }

    /// Releases `names` (each with the channel its waiters watch), and
    /// announces each one that someone waits for.
    ///
    /// With `plain_first` (a held lock's release, not fenced), each name is
    /// first deleted by the plain statement, which frees a row never
    /// fenced, and the whole release runs only for the names it did not
    /// free (fenced rows, or rows no longer this holder's). The undoing of
    /// an attempt (`release_many`, `release_segments`) skips it: most of
    /// the names it is given are not the holder's, and the plain
    /// statement would only add a round trip.
    async fn release_names(
        &self,
        key: &LockKey,
        names: &[&str],
        channels: &[&str],
        holder: &str,
        plain_first: bool,
    ) -> Result<bool, Failure> {
        self.after_unanswered(holder).await;
        self.run(key, "release", || async {
            let client = self.pool.get().await?;
            let client = &client;
            // One statement a name, sent together: the connection
            // pipelines them, so several cost about one round trip.
            let mut rest: Vec<(&str, &str)> = names.iter().copied().zip(channels.iter().copied()).collect();
            let mut released = false;
            if plain_first {
                let plain = client.prepare_cached(&self.sql.release_unfenced).await?;
                let plain = &plain;
                let freed =
                    futures_util::future::try_join_all(rest.iter().map(|(name, channel)| async move {
                        let row = client
                            .query_opt(plain, &[name, &holder, channel, &self.sql.channel])
                            .await?;
                        Ok::<_, tokio_postgres::Error>(row.is_some())
                    }))
                    .await?;
                released = freed.contains(&true);
                rest = rest
                    .into_iter()
                    .zip(freed)
                    .filter(|(_, freed)| !freed)
                    .map(|(r, _)| r)
                    .collect();
            }
            if rest.is_empty() {
                return Ok(released);
            }
            let whole = client.prepare_cached(&self.sql.release).await?;
            let whole = &whole;
            let rows = futures_util::future::try_join_all(rest.iter().map(|(name, channel)| async move {
                client
                    .query_one(whole, &[name, &holder, channel, &self.sql.channel])
                    .await
            }))
            .await?;
            for row in rows {
                released |= row.try_get::<_, i64>(0)? > 0;
            }
            Ok(released)
        })
        .await
    }

    /// Releases a lock taken with a fencing token: its row stays, freed,
    /// so the plain delete is not tried.
    pub(crate) async fn release_fenced(&self, key: &LockKey, holder: &str) -> Result<bool, Failure> {
        self.release_holder(key, holder, false).await
    }

    async fn release_holder(&self, key: &LockKey, holder: &str, plain_first: bool) -> Result<bool, Failure> {
        if is_member(holder) {
            self.after_unanswered(holder).await;
            return self.release_member(key, holder).await;
        }
        let released = self
            .release_names(
                key,
                &[key.redis_key.as_str()],
                &[key.channel.as_str()],
                holder,
                plain_first,
            )
            .await?;
        if !released && holder.starts_with("f:") {
            // A fair lock's waiter that stops waiting gives up its place.
            return self.leave_line(key, holder).await;
        }
        Ok(released)
    }
}

impl PostgresBackend {
    /// Writes the election record of `key`'s leader `holder`
    /// (`AnyBackend::proclaim`). `Ok(false)`: it no longer leads.
    pub(crate) async fn proclaim(&self, key: &LockKey, holder: &str, value: &str) -> Result<bool, Failure> {
        if value.contains('\0') {
            return Err(Failure::permanent(LockError::InvalidRequest {
                key: key.name.clone(),
                reason: "PostgreSQL text cannot hold a NUL character, so a leader's value on it cannot"
                    .into(),
            }));
        }
        let name = key.redis_key.as_str();
        self.run(key, "proclaim", || async {
            let client = self.pool.get().await?;
            let statement = client.prepare_cached(&self.sql.proclaim).await?;
            Ok(client
                .query_opt(&statement, &[&name, &holder, &value])
                .await?
                .is_some())
        })
        .await
    }

    /// Who leads the election `key` (`AnyBackend::leader`).
    pub(crate) async fn leader(&self, key: &LockKey) -> Result<Option<LeaderRecord>, Failure> {
        let name = key.redis_key.as_str();
        let row = self
            .run(key, "leader", || async {
                let client = self.pool.get().await?;
                let statement = client.prepare_cached(&self.sql.leader).await?;
                Ok(client.query_opt(&statement, &[&name]).await?)
            })
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let read = || -> Result<LeaderRecord, tokio_postgres::Error> {
            let holder: String = row.try_get(0)?;
            let epoch: i64 = row.try_get(1)?;
            let record: Option<String> = row.try_get(2)?;
            let left: i64 = row.try_get(3)?;
            let value = record.and_then(|record| recorded_value(&record, &holder));
            Ok(LeaderRecord {
                epoch: u64::try_from(epoch).unwrap_or(0),
                value,
                left: (left >= 0).then(|| micros(left)),
                holder,
            })
        };
        // Its shape only in the message: the record holds the leader's value.
        read()
            .map(Some)
            .map_err(|e| self.failure(Some(key), PoolError::Backend(e)))
    }
}

impl Backend for PostgresBackend {
    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<AcquireReply, Failure> {
        match req.kind {
            Kind::Read | Kind::Write => self.acquire_shared(req, 0).await,
            Kind::Permits(n) => self.acquire_shared(req, n).await,
            Kind::Fair => self.acquire_fair(req).await,
            Kind::Segments(n) => self.acquire_segment(req, n).await,
            _ if !req.also.is_empty() => self.acquire_set(req).await,
            _ => self.acquire_one(req).await,
        }
    }

    async fn release(&self, key: &LockKey, holder: &str) -> Result<bool, Failure> {
        self.release_holder(key, holder, true).await
    }

    async fn release_many(&self, keys: &[LockKey], holder: &str) -> Result<bool, Failure> {
        let Some(first) = keys.first() else {
            return Ok(false);
        };
        let names: Vec<&str> = keys.iter().map(|k| k.redis_key.as_str()).collect();
        let channels: Vec<&str> = keys.iter().map(|k| k.channel.as_str()).collect();
        self.release_names(first, &names, &channels, holder, false).await
    }

    async fn release_segments(&self, key: &LockKey, count: u32, holder: &str) -> Result<bool, Failure> {
        let names: Vec<String> = key.segment_keys(count).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        // Every segment's waiters watch the lock's channel.
        let channels = vec![key.channel.as_str(); names.len()];
        self.release_names(key, &names, &channels, holder, false).await
    }

    async fn renew(&self, key: &LockKey, holder: &str, ttl: Duration) -> Result<bool, Failure> {
        let renewed = self.renew_many(&[RenewItem { key, holder, ttl }]).await?;
        Ok(renewed == [Renewal::Renewed])
    }

    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Result<Vec<Renewal>, Failure> {
        // Exclusive leases are rows of the lock table, shared ones of the
        // members table: one statement for each that has any.
        let (members, rows): (Vec<&RenewItem<'_>>, Vec<&RenewItem<'_>>) =
            items.iter().partition(|item| is_member(item.holder));
        let mut renewed = self.renew_batch(&rows, &self.sql.renew_many).await?;
        renewed.extend(self.renew_batch(&members, &self.members.renew_many).await?);
        Ok(items
            .iter()
            .map(|item| {
                let key = (item.key.redis_key.clone(), item.holder.to_owned());
                Renewal::from(renewed.contains(&key))
            })
            .collect())
    }
}
