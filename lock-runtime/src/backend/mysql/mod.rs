//! Locks as rows of a MySQL / MariaDB table: the seeds' unique-row lock,
//! made safe.
//!
//! One row per held lock, keyed by the lock's full name. Every decision is
//! taken by one statement on the server, judged by the server's clock
//! (`NOW(6)`), never the client's:
//! - acquire: `INSERT … ON DUPLICATE KEY UPDATE` inserts the row, or takes
//!   over a row whose expiry has passed (or is already this holder's);
//! - renew, release: `UPDATE` / `DELETE` … `WHERE name = ? AND holder = ?`.
//!
//! The fencing counter lives in the row. A key that was ever fenced keeps
//! its row after release (holder empty, expiry in the past) so that the
//! counter keeps growing across holders, as the Redis layout keeps its
//! `:fence` key; a key never fenced leaves no row behind.
//!
//! Shared locks (read-write, permits) and fair locks' lines are rows of a
//! second table (`shared.rs`, `fair.rs`). The files, bottom-up: `sql` the
//! statements, `table` the client and how one operation runs, `shared` and
//! `fair` their kinds' attempts, `admin` what `lockctl` reads and frees;
//! this file the exclusive lock and the dispatch of every operation.
//!
//! The driver is `mysql_async`: a tokio-native implementation of the
//! protocol with its own connection pool and per-connection statement
//! cache, which serves MySQL 8 and MariaDB alike. (`sqlx` would bring a
//! query macro layer and an `Any` driver this backend does not use.)

use std::collections::HashSet;
use std::time::Duration;

use mysql_async::TxOpts;
use mysql_async::prelude::Queryable;

use self::shared::is_member;
use self::sql::{GATE_LEFT, RENEWAL_SIZES, Renewals};
pub(crate) use self::table::MysqlBackend;
use self::table::{LANE_CONNECTIONS, as_micros, conflict, held, micros};
use super::contract::{
    AcquireReply, AcquireRequest, Backend, Failure, LeaderRecord, RenewItem, Renewal, recorded_value,
};
use crate::error::LockError;
use crate::key::LockKey;
use crate::spec::Kind;

// Bottom-up: each file uses only those declared before it.
mod sql;

mod table;

mod shared;

mod fair;

mod admin;

impl MysqlBackend {
    /// A lock found held by a shared lock's gate is another kind of lock:
    /// a conflict, not something to wait for.
    async fn unless_gate(&self, key: &LockKey, reply: AcquireReply) -> Result<AcquireReply, Failure> {
        match reply {
            AcquireReply::Held { pttl: Some(left), .. } if left >= GATE_LEFT => {
                Err(conflict(key, self.gate_found(key).await?))
            }
            other => Ok(other),
        }
    }

    /// One attempt made of several statements, in a transaction (the
    /// driver rolls it back if the future is dropped half-way); another
    /// kind of lock found on the name is a conflict. (An enum rather than
    /// a closure: an async closure borrowing the transaction would make
    /// the caller's future not `Send`.)
    async fn attempt_in_transaction(
        &self,
        req: &AcquireRequest<'_>,
        body: Body,
    ) -> Result<AcquireReply, Failure> {
        let outcome = self
            .run(req.key, "acquire", || async {
                let mut attempt = self.attempt(req.holder).await?;
                let mut tx = attempt.connection().start_transaction(TxOpts::default()).await?;
                let reply = match body {
                    Body::Shared { permits } => self.admit_in(&mut tx, req, permits).await?,
                    Body::Fair => self.fair_in(&mut tx, req).await?,
                };
                tx.commit().await?;
                attempt.answered();
                Ok(reply)
            })
            .await?;
        outcome.map_err(|found| conflict(req.key, found))
    }

    /// A side of a read-write lock (`permits` 0) or a permit of a semaphore.
    async fn acquire_shared(&self, req: &AcquireRequest<'_>, permits: u32) -> Result<AcquireReply, Failure> {
        let name = req.key.redis_key.as_str();
        Self::check_name(req.key, name)?;
        self.attempt_in_transaction(req, Body::Shared { permits }).await
    }

    /// One attempt at a fair lock.
    async fn acquire_fair(&self, req: &AcquireRequest<'_>) -> Result<AcquireReply, Failure> {
        let name = req.key.redis_key.as_str();
        Self::check_name(req.key, name)?;
        self.attempt_in_transaction(req, Body::Fair).await
    }

    /// One try at the row `name`.
    async fn take(
        &self,
        q: &mut impl Queryable,
        name: &str,
        holder: &str,
        ttl_us: u64,
        step: u64,
    ) -> Result<Taken, mysql_async::Error> {
        let reply = q
            .exec_iter(
                self.sql.acquire.as_str(),
                (
                    name, holder, ttl_us, step, holder, step, holder, holder, holder, ttl_us,
                ),
            )
            .await?;
        // 1: inserted, 2: updated (taken over, or already ours and
        // lengthened), 0: someone else's live row, left as it was.
        let value = reply.last_insert_id().unwrap_or(0);
        let taken = if reply.affected_rows() > 0 {
            Taken::Ours(value)
        } else {
            Taken::Held(micros(value))
        };
        reply.drop_result().await?;
        Ok(taken)
    }

    async fn acquire_one(&self, req: &AcquireRequest<'_>) -> Result<AcquireReply, Failure> {
        let name = req.key.redis_key.as_str();
        Self::check_name(req.key, name)?;
        let ttl_us = as_micros(req.ttl);
        let step = u64::from(req.fencing);
        self.run(req.key, "acquire", || async {
            let mut attempt = self.attempt(req.holder).await?;
            let taken = self
                .take(attempt.connection(), name, req.holder, ttl_us, step)
                .await?;
            attempt.answered();
            Ok(match taken {
                Taken::Ours(token) => AcquireReply::acquired(req.fencing.then_some(token)),
                Taken::Held(left) => held(left, 0),
            })
        })
        .await
    }

    /// Any free segment of `count`, tried in order.
    async fn acquire_segment(&self, req: &AcquireRequest<'_>, count: u32) -> Result<AcquireReply, Failure> {
        let names: Vec<String> = req.key.segment_keys(count).collect();
        if let Some(last) = names.last() {
            Self::check_name(req.key, last)?;
        }
        let ttl_us = as_micros(req.ttl);
        let step = u64::from(req.fencing);
        self.run(req.key, "acquire", || async {
            let mut attempt = self.attempt(req.holder).await?;
            // The soonest any segment frees.
            let mut soonest = Duration::MAX;
            let mut taken = None;
            for (i, name) in (0..count).zip(&names) {
                match self
                    .take(attempt.connection(), name, req.holder, ttl_us, step)
                    .await?
                {
                    Taken::Ours(token) => {
                        taken = Some(AcquireReply::Acquired {
                            token: req.fencing.then_some(token),
                            segment: Some(i),
                        });
                        break;
                    }
                    Taken::Held(left) => soonest = soonest.min(left),
                }
            }
            attempt.answered();
            Ok(taken.unwrap_or_else(|| held(soonest, 0)))
        })
        .await
    }

    /// Every lock of a set or none, in one transaction: a row that is held
    /// rolls back the rows taken before it.
    async fn acquire_set(&self, req: &AcquireRequest<'_>) -> Result<AcquireReply, Failure> {
        let set: Vec<&LockKey> = std::iter::once(req.key).chain(req.also).collect();
        for key in &set {
            Self::check_name(key, &key.redis_key)?;
        }
        let ttl_us = as_micros(req.ttl);
        self.run(req.key, "acquire", || async {
            let mut attempt = self.attempt(req.holder).await?;
            // The driver's transaction: rolled back if this future is
            // dropped half-way, before the connection is reused.
            let mut tx = attempt.connection().start_transaction(TxOpts::default()).await?;
            let mut in_the_way = None;
            for (i, key) in set.iter().enumerate() {
                if let Taken::Held(left) = self.take(&mut tx, &key.redis_key, req.holder, ttl_us, 0).await? {
                    in_the_way = Some(held(left, i));
                    break;
                }
            }
            let reply = match in_the_way {
                Some(held) => {
                    tx.rollback().await?;
                    held
                }
                None => {
                    tx.commit().await?;
                    AcquireReply::acquired(None)
                }
            };
            attempt.answered();
            Ok(reply)
        })
        .await
    }

    async fn release_names(&self, key: &LockKey, names: &[&str], holder: &str) -> Result<bool, Failure> {
        self.after_unanswered(holder).await;
        self.run(key, "release", || async {
            let conn = &mut self.pool.get_conn().await?;
            let mut any = false;
            for name in names {
                conn.exec_drop(&self.sql.delete, (name, holder)).await?;
                if conn.affected_rows() == 0 {
                    // Fenced (the row keeps its counter), or not ours.
                    conn.exec_drop(&self.sql.free_fenced, (name, holder)).await?;
                }
                any |= conn.affected_rows() > 0;
            }
            Ok(any)
        })
        .await
    }
}

impl MysqlBackend {
    /// Sets the exclusive lock's lease to end `left` from now by the
    /// server's clock, if `holder` still has it (`AnyBackend::keep`), then
    /// sweeps rows such locks left behind (`sweep` in `sql.rs`): on its
    /// own, because a failed sweep must not fail the keep.
    pub(crate) async fn keep(&self, key: &LockKey, holder: &str, left: Duration) -> Result<bool, Failure> {
        let name = key.redis_key.as_str();
        let left_us = as_micros(left + Duration::from_nanos(999));
        self.after_unanswered(holder).await;
        let kept = self
            .run(key, "keep", || async {
                let conn = &mut self.lane.get_conn().await?;
                conn.exec_drop(&self.sql.keep, (left_us, name, holder)).await?;
                if conn.affected_rows() > 0 {
                    return Ok(true);
                }
                // An update that changed nothing (the same microsecond
                // again) counts no row either.
                let held: Option<i64> = conn.exec_first(&self.sql.still_held, (name, holder)).await?;
                Ok(held.is_some())
            })
            .await?;
        let swept = self
            .run(key, "sweep", || async {
                let conn = &mut self.pool.get_conn().await?;
                let names: Vec<Vec<u8>> = conn.query(&self.sql.sweepable).await?;
                conn.exec_batch(&self.sql.sweep, names.iter().map(|name| (name,)))
                    .await
            })
            .await;
        if let Err(failure) = swept {
            tracing::debug!(error = %failure.error, "sweeping expired lock rows failed; the next keep sweeps them");
        }
        Ok(kept)
    }
}

impl MysqlBackend {
    /// Renews `items` on the renewal lane, a statement per table, lease
    /// length and [`RENEWAL_SIZES`]' largest: whether each is still held.
    async fn renew_leases(&self, items: &[RenewItem<'_>]) -> Result<Vec<bool>, Failure> {
        let Some(first) = items.first() else {
            return Ok(Vec::new());
        };
        // The items of one table and lease length, in the batch's order.
        let mut groups: Vec<((bool, Duration), Vec<usize>)> = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let group = (is_member(item.holder), item.ttl);
            match groups.iter_mut().find(|(g, _)| *g == group) {
                Some((_, members)) => members.push(i),
                None => groups.push((group, vec![i])),
            }
        }
        let largest = RENEWAL_SIZES[RENEWAL_SIZES.len() - 1];
        let statements: Vec<(&Renewals, Duration, &[usize])> = groups
            .iter()
            .flat_map(|((member, ttl), indices)| {
                let renewals = if *member {
                    &self.shared.renew
                } else {
                    &self.sql.renew
                };
                indices.chunks(largest).map(move |chunk| (renewals, *ttl, chunk))
            })
            .collect();
        let statements = statements.as_slice();
        self.run(first.key, "renew", || async {
            // Side by side on the lane's connections, each taking every
            // so many: under load each statement waits for the server's
            // CPU beside every other session's, and the lease that waits
            // longest decides.
            let side_by_side = (0..LANE_CONNECTIONS.min(statements.len())).map(|first| async move {
                let conn = &mut self.lane.get_conn().await?;
                let mut answers = Vec::new();
                for &(renewals, ttl, chunk) in statements.iter().skip(first).step_by(LANE_CONNECTIONS) {
                    let leases: Vec<(&str, &str)> = chunk
                        .iter()
                        .map(|&i| (items[i].key.redis_key.as_str(), items[i].holder))
                        .collect();
                    answers.push((chunk, renew_chunk(conn, renewals, ttl, &leases).await?));
                }
                Ok::<_, mysql_async::Error>(answers)
            });
            let answers = futures_util::future::try_join_all(side_by_side).await?;
            let mut renewed = vec![false; items.len()];
            for (chunk, held) in answers.into_iter().flatten() {
                for (&i, held) in chunk.iter().zip(held) {
                    renewed[i] = held;
                }
            }
            Ok(renewed)
        })
        .await
    }
}

/// Renews `leases` (name, holder; at most the largest of
/// [`RENEWAL_SIZES`]) for `ttl` with one statement, and reads which are
/// held only when it changed fewer rows than it named.
async fn renew_chunk(
    conn: &mut mysql_async::Conn,
    statements: &Renewals,
    ttl: Duration,
    leases: &[(&str, &str)],
) -> Result<Vec<bool>, mysql_async::Error> {
    let size = RENEWAL_SIZES
        .iter()
        .position(|&n| n >= leases.len())
        .unwrap_or(RENEWAL_SIZES.len() - 1);
    // The statements' parameters after the ttl: the names, then each
    // lease's name and holder, padded by naming the first leases again (a
    // lease named twice is changed, and counted, once). Made again for the
    // rarely needed read rather than copied for every renewal.
    let named = |first: Option<mysql_async::Value>| {
        let padded: Vec<&(&str, &str)> = leases.iter().cycle().take(RENEWAL_SIZES[size]).collect();
        let mut params: Vec<mysql_async::Value> = Vec::with_capacity(3 * padded.len() + 1);
        params.extend(first);
        params.extend(padded.iter().map(|(name, _)| mysql_async::Value::from(*name)));
        for (name, holder) in &padded {
            params.push((*name).into());
            params.push((*holder).into());
        }
        params
    };
    conn.exec_drop(&statements.lengthen[size], named(Some(as_micros(ttl).into())))
        .await?;
    let distinct: HashSet<&(&str, &str)> = leases.iter().collect();
    if usize::try_from(conn.affected_rows()).is_ok_and(|n| n == distinct.len()) {
        return Ok(vec![true; leases.len()]);
    }
    let held: Vec<(Vec<u8>, Vec<u8>)> = conn.exec(&statements.held[size], named(None)).await?;
    let held: HashSet<(&[u8], &[u8])> = held.iter().map(|(n, h)| (n.as_slice(), h.as_slice())).collect();
    Ok(leases
        .iter()
        .map(|(name, holder)| held.contains(&(name.as_bytes(), holder.as_bytes())))
        .collect())
}

/// Which attempt a transaction runs.
#[derive(Debug, Clone, Copy)]
enum Body {
    /// A side of a read-write lock (`permits` 0) or a permit.
    Shared {
        permits: u32,
    },
    Fair,
}

/// What one acquisition statement found.
enum Taken {
    /// The row is ours, with its fence counter.
    Ours(u64),
    /// Another holder's, with this much of its lease left.
    Held(Duration),
}

impl MysqlBackend {
    /// Writes the election record of `key`'s leader `holder`
    /// (`AnyBackend::proclaim`). `Ok(false)`: it no longer leads.
    pub(crate) async fn proclaim(&self, key: &LockKey, holder: &str, value: &str) -> Result<bool, Failure> {
        let name = key.redis_key.as_str();
        self.run(key, "proclaim", || async {
            let conn = &mut self.pool.get_conn().await?;
            conn.exec_drop(&self.sql.proclaim, (holder, value, name, holder))
                .await?;
            if conn.affected_rows() > 0 {
                return Ok(true);
            }
            // The same record again changes nothing: still the leader?
            let held: Option<i64> = conn.exec_first(&self.sql.still_held, (name, holder)).await?;
            Ok(held.is_some())
        })
        .await
    }

    /// Who leads the election `key` (`AnyBackend::leader`).
    pub(crate) async fn leader(&self, key: &LockKey) -> Result<Option<LeaderRecord>, Failure> {
        let name = key.redis_key.as_str();
        type Row = (Vec<u8>, u64, Option<Vec<u8>>, i64);
        let row: Option<Row> = self
            .run(key, "leader", || async {
                let conn = &mut self.pool.get_conn().await?;
                conn.exec_first(&self.sql.leader, (name,)).await
            })
            .await?;
        let Some((holder, epoch, record, left)) = row else {
            return Ok(None);
        };
        let Ok(holder) = String::from_utf8(holder) else {
            return Err(Failure::permanent(LockError::backend(
                &self.node,
                Some(&key.name),
                "an election's lock is held by a holder id that is not UTF-8",
            )));
        };
        let value = record.and_then(|record| recorded_value(std::str::from_utf8(&record).ok()?, &holder));
        Ok(Some(LeaderRecord {
            holder,
            epoch,
            value,
            left: u64::try_from(left).ok().map(micros),
        }))
    }
}

impl Backend for MysqlBackend {
    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<AcquireReply, Failure> {
        let reply = match req.kind {
            Kind::Read | Kind::Write => return self.acquire_shared(req, 0).await,
            Kind::Permits(n) => return self.acquire_shared(req, n).await,
            Kind::Fair => return self.acquire_fair(req).await,
            Kind::Segments(n) => self.acquire_segment(req, n).await?,
            _ if !req.also.is_empty() => self.acquire_set(req).await?,
            _ => self.acquire_one(req).await?,
        };
        let blocked = match reply {
            AcquireReply::Held { blocked_by, .. } => blocked_by,
            AcquireReply::Acquired { .. } => 0,
        };
        let key = blocked.checked_sub(1).map_or(req.key, |i| &req.also[i]);
        self.unless_gate(key, reply).await
    }

    async fn release(&self, key: &LockKey, holder: &str) -> Result<bool, Failure> {
        if is_member(holder) {
            // `release_names` waits on the other paths.
            self.after_unanswered(holder).await;
            return self.release_member(key, holder).await;
        }
        let released = self.release_names(key, &[key.redis_key.as_str()], holder).await?;
        if !released && holder.starts_with("f:") {
            // A fair lock's waiter that stops waiting gives up its place.
            return self.leave_line(key, holder).await;
        }
        Ok(released)
    }

    async fn release_many(&self, keys: &[LockKey], holder: &str) -> Result<bool, Failure> {
        let Some(first) = keys.first() else {
            return Ok(false);
        };
        let names: Vec<&str> = keys.iter().map(|k| k.redis_key.as_str()).collect();
        self.release_names(first, &names, holder).await
    }

    async fn release_segments(&self, key: &LockKey, count: u32, holder: &str) -> Result<bool, Failure> {
        let names: Vec<String> = key.segment_keys(count).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        self.release_names(key, &names, holder).await
    }

    async fn renew(&self, key: &LockKey, holder: &str, ttl: Duration) -> Result<bool, Failure> {
        let renewed = self.renew_leases(&[RenewItem { key, holder, ttl }]).await?;
        Ok(renewed == [true])
    }

    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Result<Vec<Renewal>, Failure> {
        match self.renew_leases(items).await {
            Ok(renewed) => Ok(renewed.into_iter().map(Renewal::from).collect()),
            // Unconfirmed, and retried until the leases' deadlines.
            Err(f) if f.transient => Ok(vec![Renewal::Unconfirmed; items.len()]),
            Err(f) => Err(f),
        }
    }
}
