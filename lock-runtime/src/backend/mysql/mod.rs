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
//! The driver is `mysql_async`: a tokio-native implementation of the
//! protocol with its own connection pool and per-connection statement
//! cache, which serves MySQL 8 and MariaDB alike. (`sqlx` would bring a
//! query macro layer and an `Any` driver this backend does not use.)

use std::fmt;
use std::future::Future;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Opts, OptsBuilder, Pool, PoolConstraints, PoolOpts, TxOpts};

use self::fair::FairStatements;
use self::shared::{GATE_LEFT, SharedStatements, is_member};
use super::contract::{AcquireReply, AcquireRequest, Backend, Failure, RenewItem, Renewal};
use crate::error::LockError;
use crate::key::LockKey;
use crate::redact::{redact_secrets, redact_url};
use crate::spec::Kind;

mod fair;
mod shared;

/// The longest full lock name (prefix, key, segment suffix) the table's
/// `name` column holds, in bytes.
pub(crate) const MAX_NAME_BYTES: usize = 2048;

/// What a freed, fenced row's expiry is set to: long past, so any clock
/// finds it free.
const FREED: &str = "'2000-01-01 00:00:00'";

/// The statements, rendered once for the client's table name.
#[derive(Debug)]
struct Statements {
    create: String,
    acquire: String,
    renew: String,
    extend: String,
    still_held: String,
    delete: String,
    free_fenced: String,
}

impl Statements {
    fn new(table: &str) -> Self {
        let t = format!("`{table}`");
        Statements {
            create: format!(
                "CREATE TABLE IF NOT EXISTS {t} (\
                 name VARBINARY({MAX_NAME_BYTES}) NOT NULL PRIMARY KEY, \
                 holder VARBINARY(255) NOT NULL, \
                 expires_at DATETIME(6) NOT NULL, \
                 fence BIGINT UNSIGNED NOT NULL DEFAULT 0\
                 ) ENGINE=InnoDB"
            ),
            // Parameters: name, holder, ttl µs, fence step (0 or 1), then
            // holder, fence step, holder, holder, holder, ttl µs again for
            // the update.
            //
            // The update's assignments run left to right and each sees the
            // ones before it, so the order is the logic. On a live row of
            // another holder nothing changes (0 rows affected) and
            // `LAST_INSERT_ID(x)` hands back what is left of its lease, in
            // µs, in the reply's OK packet. Otherwise the counter moves
            // only on a takeover of an expired row (judged on the old
            // expiry) and is handed back the same way, the holder changes
            // on a takeover and stays on an "already mine", and the expiry
            // moves exactly when the holder is now ours. One statement,
            // one round trip, whatever it finds.
            acquire: format!(
                "INSERT INTO {t} (name, holder, expires_at, fence) \
                 VALUES (?, ?, NOW(6) + INTERVAL ? MICROSECOND, LAST_INSERT_ID(?)) \
                 ON DUPLICATE KEY UPDATE \
                 fence = IF(expires_at > NOW(6) AND holder <> ?, \
                   fence + 0 * LAST_INSERT_ID(TIMESTAMPDIFF(MICROSECOND, NOW(6), expires_at)), \
                   LAST_INSERT_ID(IF(expires_at <= NOW(6), fence + ?, fence))), \
                 holder = IF(expires_at <= NOW(6) OR holder = ?, ?, holder), \
                 expires_at = IF(holder = ?, NOW(6) + INTERVAL ? MICROSECOND, expires_at)"
            ),
            renew: format!(
                "UPDATE {t} SET expires_at = NOW(6) + INTERVAL ? MICROSECOND \
                 WHERE name = ? AND holder = ? AND expires_at > NOW(6)"
            ),
            extend: format!(
                "UPDATE {t} SET expires_at = GREATEST(expires_at, NOW(6) + INTERVAL ? MICROSECOND) \
                 WHERE name = ? AND holder = ? AND expires_at > NOW(6)"
            ),
            still_held: format!("SELECT 1 FROM {t} WHERE name = ? AND holder = ? AND expires_at > NOW(6)"),
            delete: format!("DELETE FROM {t} WHERE name = ? AND holder = ? AND fence = 0"),
            free_fenced: format!(
                "UPDATE {t} SET holder = '', expires_at = {FREED} WHERE name = ? AND holder = ?"
            ),
        }
    }
}

/// A MySQL / MariaDB lock table.
pub(crate) struct MysqlBackend {
    pool: Pool,
    sql: Statements,
    /// Boxed: read only by shared locks, and it would double the size of
    /// every client's backend.
    shared: Box<SharedStatements>,
    fair: Box<FairStatements>,
    table: String,
    /// `host:port/db`, no credentials: what messages name.
    node: String,
    /// The URL as given, only to scrub its secrets from driver messages.
    url: String,
    timeout: Duration,
}

impl fmt::Debug for MysqlBackend {
    // By hand: the pool's options hold the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlBackend")
            .field("node", &self.node)
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

/// Whether `name` can name a table without quoting trouble.
pub(crate) fn table_problem(name: &str) -> Option<String> {
    // 56: the members table's name, `<name>_members`, must fit MySQL's 64.
    let ok =
        !name.is_empty() && name.len() <= 56 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    (!ok).then(|| format!("the MySQL table name `{name}` must be 1 to 56 ASCII letters, digits or `_`"))
}

impl MysqlBackend {
    /// Parses `url` (`mysql://user:password@host:port/database`) and builds
    /// the pool; connects nothing yet.
    pub(crate) fn new(url: &str, table: &str, timeout: Duration) -> Result<Self, LockError> {
        let redacted = redact_url(url);
        let invalid = |reason: String| LockError::InvalidConfig {
            node: redacted.clone(),
            reason,
        };
        if let Some(problem) = table_problem(table) {
            return Err(invalid(problem));
        }
        let opts = Opts::from_url(url).map_err(|e| invalid(redact_secrets(&e.to_string(), url)))?;
        let Some(db) = opts.db_name().map(str::to_owned) else {
            return Err(invalid(
                "the URL names no database; give one, `mysql://user:password@host:port/database`".into(),
            ));
        };
        let node = format!("{}:{}/{db}", opts.ip_or_hostname(), opts.tcp_port());
        let opts = OptsBuilder::from_opts(opts)
            // Expiries are compared on the server only, but DATETIME is a
            // wall time: UTC keeps it free of daylight-saving jumps.
            // READ COMMITTED: the lock statements need no gap locks.
            // (`setup` runs again after any session reset.)
            .setup(vec![
                "SET time_zone = '+00:00'",
                "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
            ])
            // No session reset when a connection goes back to the pool:
            // a reset would drop the prepared statements, costing two more
            // round trips per operation, and every statement here leaves
            // the session as it found it (the driver rolls back a
            // transaction a dropped operation left open).
            //
            // Idle connections stay a minute: the driver's default closes
            // every connection above the pool's minimum as soon as it is
            // idle, which made each operation a new connection.
            .pool_opts(
                PoolOpts::default()
                    .with_reset_connection(false)
                    .with_inactive_connection_ttl(Duration::from_secs(60))
                    .with_constraints(PoolConstraints::new(1, 64).unwrap_or_default()),
            )
            // The address given, always: not a Unix socket the server
            // names when it is on this host (a proxy or tunnel in the URL
            // would be bypassed, silently).
            .prefer_socket(false);
        Ok(MysqlBackend {
            pool: Pool::new(opts),
            sql: Statements::new(table),
            shared: Box::new(SharedStatements::new(table)),
            fair: Box::new(FairStatements::new(table)),
            table: table.to_owned(),
            node,
            url: url.to_owned(),
            timeout,
        })
    }

    pub(crate) fn node(&self) -> &str {
        &self.node
    }

    /// Connects, and creates the table if it is missing: a wrong password
    /// or a missing grant fails here, at start-up.
    pub(crate) async fn verify(&self) -> Result<(), LockError> {
        let result = tokio::time::timeout(self.timeout, async {
            let mut conn = self.pool.get_conn().await?;
            self.create_tables(&mut conn).await
        })
        .await;
        match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(self.config_error(e)),
            Err(_) => Err(LockError::backend(
                &self.node,
                None,
                format!("no answer within {}ms", self.timeout.as_millis()),
            )),
        }
    }

    /// A start-up failure: refused credentials and missing grants are the
    /// configuration's fault.
    fn config_error(&self, e: mysql_async::Error) -> LockError {
        let message = redact_secrets(&e.to_string(), &self.url);
        match &e {
            mysql_async::Error::Server(s) if matches!(s.code, 1044 | 1045 | 1142 | 1698) => {
                LockError::InvalidConfig {
                    node: self.node.clone(),
                    reason: format!(
                        "{message}; the user needs CREATE (or an existing table), SELECT, INSERT, UPDATE and DELETE on the lock table"
                    ),
                }
            }
            _ => LockError::backend(&self.node, None, message),
        }
    }

    fn failure(&self, key: Option<&LockKey>, e: mysql_async::Error) -> Failure {
        use mysql_async::{DriverError, Error};
        let (transient, reconnecting) = match &e {
            Error::Io(_) => (true, true),
            Error::Driver(DriverError::ConnectionClosed) => (true, true),
            Error::Driver(_) => (false, false),
            // Deadlock, lock wait timeout, too many connections, shutting
            // down, query interrupted, connection killed (MariaDB),
            // disconnected for inactivity (MySQL 8).
            Error::Server(s) => (
                matches!(s.code, 1213 | 1205 | 1040 | 1053 | 1317 | 1927 | 4031),
                matches!(s.code, 1053 | 1927 | 4031),
            ),
            Error::Other(_) | Error::Url(_) => (false, false),
        };
        Failure {
            error: LockError::backend(
                &self.node,
                key.map(|k| k.name.as_str()),
                redact_secrets(&e.to_string(), &self.url),
            ),
            transient,
            reconnecting,
        }
    }

    fn timed_out(&self, key: &LockKey, what: &str) -> Failure {
        Failure {
            error: LockError::backend(
                &self.node,
                Some(&key.name),
                format!("no answer to {what} within {}ms", self.timeout.as_millis()),
            ),
            transient: true,
            reconnecting: false,
        }
    }

    /// Runs `work` within the command timeout, creating the table once if
    /// the server says it is missing (a table dropped under a running
    /// service, or a lazily built client) and running it again.
    async fn run<T, F, Fut>(&self, key: &LockKey, what: &str, work: F) -> Result<T, Failure>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, mysql_async::Error>>,
    {
        let attempt = async {
            match work().await {
                Err(mysql_async::Error::Server(s)) if s.code == 1146 => {
                    self.create_tables(&mut self.pool.get_conn().await?).await?;
                    work().await
                }
                other => other,
            }
        };
        match tokio::time::timeout(self.timeout, attempt).await {
            Ok(result) => result.map_err(|e| self.failure(Some(key), e)),
            Err(_) => Err(self.timed_out(key, what)),
        }
    }

    /// The lock table and the shared locks' members table, if missing.
    async fn create_tables(&self, conn: &mut mysql_async::Conn) -> Result<(), mysql_async::Error> {
        conn.query_drop(&self.sql.create).await?;
        conn.query_drop(&self.shared.create).await
    }

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
                let conn = &mut self.pool.get_conn().await?;
                let mut tx = conn.start_transaction(TxOpts::default()).await?;
                let reply = match body {
                    Body::Shared { permits } => self.admit_in(&mut tx, req, permits).await?,
                    Body::Fair => self.fair_in(&mut tx, req).await?,
                };
                tx.commit().await?;
                Ok(reply)
            })
            .await?;
        outcome.map_err(|found| conflict(req.key, found))
    }

    fn check_name(key: &LockKey, name: &str) -> Result<(), Failure> {
        if name.len() > MAX_NAME_BYTES {
            return Err(Failure::permanent(LockError::InvalidKey {
                key: key.name.clone(),
                reason: format!(
                    "with its prefix the lock's name is {} bytes; the MySQL table's `name` column holds {MAX_NAME_BYTES}",
                    name.len()
                ),
            }));
        }
        Ok(())
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
            let conn = &mut self.pool.get_conn().await?;
            Ok(match self.take(conn, name, req.holder, ttl_us, step).await? {
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
            let conn = &mut self.pool.get_conn().await?;
            // The soonest any segment frees.
            let mut soonest = Duration::MAX;
            for (i, name) in (0..count).zip(&names) {
                match self.take(conn, name, req.holder, ttl_us, step).await? {
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
    /// rolls back the rows taken before it.
    async fn acquire_set(&self, req: &AcquireRequest<'_>) -> Result<AcquireReply, Failure> {
        let set: Vec<&LockKey> = std::iter::once(req.key).chain(req.also).collect();
        for key in &set {
            Self::check_name(key, &key.redis_key)?;
        }
        let ttl_us = as_micros(req.ttl);
        self.run(req.key, "acquire", || async {
            let conn = &mut self.pool.get_conn().await?;
            // The driver's transaction: rolled back if this future is
            // dropped half-way, before the connection is reused.
            let mut tx = conn.start_transaction(TxOpts::default()).await?;
            for (i, key) in set.iter().enumerate() {
                if let Taken::Held(left) = self.take(&mut tx, &key.redis_key, req.holder, ttl_us, 0).await? {
                    tx.rollback().await?;
                    return Ok(held(left, i));
                }
            }
            tx.commit().await?;
            Ok(AcquireReply::acquired(None))
        })
        .await
    }

    async fn release_names(&self, key: &LockKey, names: &[&str], holder: &str) -> Result<bool, Failure> {
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

/// Which attempt a transaction runs.
#[derive(Debug, Clone, Copy)]
enum Body {
    /// A side of a read-write lock (`permits` 0) or a permit.
    Shared {
        permits: u32,
    },
    Fair,
}

/// What a transaction's attempt found: a reply, or (`Err`) the kind of
/// lock that holds the name instead.
type Attempted = Result<AcquireReply, &'static str>;

/// `key` is a lock of another kind (`found`): refused, never waited for.
fn conflict(key: &LockKey, found: &str) -> Failure {
    Failure::permanent(LockError::KeyConflict {
        key: key.name.clone(),
        redis_key: key.redis_key.clone(),
        found_type: found.into(),
    })
}

/// What one acquisition statement found.
enum Taken {
    /// The row is ours, with its fence counter.
    Ours(u64),
    /// Another holder's, with this much of its lease left.
    Held(Duration),
}

/// The reply for a lock found held, `left` before it frees.
fn held(left: Duration, blocked_by: usize) -> AcquireReply {
    AcquireReply::Held {
        pttl: Some(left),
        claimed: false,
        blocked_by,
    }
}

/// A lease length as the `INTERVAL … MICROSECOND` it is sent as.
fn as_micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A remaining lease the server reported (µs); under 1 ms counts as 1 ms,
/// so the caller looks again soon.
fn micros(left: u64) -> Duration {
    Duration::from_micros(left).max(Duration::from_millis(1))
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

    async fn renew(
        &self,
        key: &LockKey,
        holder: &str,
        ttl: Duration,
        extend_only: bool,
    ) -> Result<bool, Failure> {
        if is_member(holder) {
            return self.renew_member(key, holder, ttl, extend_only).await;
        }
        let statement = if extend_only {
            &self.sql.extend
        } else {
            &self.sql.renew
        };
        let name = key.redis_key.as_str();
        self.run(key, "renew", || async {
            let conn = &mut self.pool.get_conn().await?;
            conn.exec_drop(statement, (as_micros(ttl), name, holder)).await?;
            if conn.affected_rows() > 0 {
                return Ok(true);
            }
            // Nothing changed: not ours, or ours with the expiry already
            // where it was asked to be (an extension that did not extend).
            let held: Option<i64> = conn.exec_first(&self.sql.still_held, (name, holder)).await?;
            Ok(held.is_some())
        })
        .await
    }

    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Result<Vec<Renewal>, Failure> {
        // One statement per lease, concurrently on pooled connections: a
        // multi-row UPDATE could not say which rows it found.
        let renewals = items
            .iter()
            .map(|item| self.renew(item.key, item.holder, item.ttl, false));
        let outcomes = futures_util::future::join_all(renewals).await;
        let mut out = Vec::with_capacity(items.len());
        for outcome in outcomes {
            out.push(match outcome {
                Ok(renewed) => Renewal::from(renewed),
                // One lease's failure is that lease's: unconfirmed, and
                // retried until its deadline.
                Err(f) if f.transient => Renewal::Unconfirmed,
                Err(f) => return Err(f),
            });
        }
        Ok(out)
    }
}
