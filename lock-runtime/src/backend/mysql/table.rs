//! The lock table's client: the pool, the statements, and how one
//! operation is run (within the command timeout, creating the tables when
//! missing) and how its failures are classified.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder, Pool, PoolConstraints, PoolOpts};

use super::sql::{FairStatements, MAX_NAME_BYTES, SharedStatements, Statements};
use crate::backend::contract::{AcquireReply, Failure};
use crate::backend::lane::on_renewal_thread;
use crate::backend::unanswered::{Answering, Attempt, Unanswered};
use crate::backend::{startup, tls};
use crate::error::LockError;
use crate::key::LockKey;
use crate::redact::{redact_secrets, redact_url, unparsed_hint};

/// A MySQL / MariaDB lock table.
pub(crate) struct MysqlBackend {
    pub(super) pool: Pool,
    /// The renewal lane: a pool of its own for renewals and the `keep` of a
    /// `hold_at_least`, so that they never queue behind acquisitions and
    /// releases for a connection (issue 57: under a flood of acquisitions
    /// renewals waited past their leases). Its connections are made on the
    /// renewal thread (`backend/lane.rs`), which reads their replies.
    pub(super) lane: Pool,
    pub(super) sql: Statements,
    /// Boxed: read only by shared locks, and it would double the size of
    /// every client's backend.
    pub(super) shared: Box<SharedStatements>,
    pub(super) fair: Box<FairStatements>,
    pub(super) table: String,
    /// `host:port/db`, no credentials: what messages name.
    pub(super) node: String,
    /// The URL as given, only to scrub its secrets from driver messages.
    pub(super) url: String,
    /// Whether the URL asked for no TLS: a refusal may then be a server
    /// that requires it.
    pub(super) without_tls: bool,
    pub(super) timeout: Duration,
    /// Acquisition attempts dropped before their answer (see
    /// `backend/unanswered.rs`).
    pub(super) unanswered: Arc<Unanswered>,
    /// What settling a dropped attempt needs (see `Answering for Conn`).
    pub(super) settling: Settling,
}

/// How a dropped attempt's connection is settled: another connection of
/// the pool, and the pattern (`%`table`%`) that a statement of this lock
/// table's matches in the process list.
#[derive(Clone)]
pub(crate) struct Settling {
    pool: Pool,
    ours: String,
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

/// MySQL 8's refusal of a plain connection while `require_secure_transport`
/// is on. MariaDB answers 1045, "access denied", as for a wrong password.
const INSECURE_TRANSPORT: u16 = 3159;

/// Whether `name` can name a table without quoting trouble.
fn table_problem(name: &str) -> Option<String> {
    // 56: the members table's name, `<name>_members`, must fit MySQL's 64.
    let ok =
        !name.is_empty() && name.len() <= 56 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    (!ok).then(|| format!("the MySQL table name `{name}` must be 1 to 56 ASCII letters, digits or `_`"))
}

/// The renewal lane's connections at most: a watchdog batch's statements
/// run this many at a time.
pub(super) const LANE_CONNECTIONS: usize = 4;

/// A pool of at most `max` connections.
fn pool_opts(max: usize) -> PoolOpts {
    // No session reset when a connection goes back to the pool: a reset
    // would drop the prepared statements, costing two more round trips per
    // operation, and every statement here leaves the session as it found
    // it (the driver rolls back a transaction a dropped operation left
    // open).
    //
    // Idle connections stay a minute: the driver's default closes every
    // connection above the pool's minimum as soon as it is idle, which
    // made each operation a new connection.
    PoolOpts::default()
        .with_reset_connection(false)
        .with_inactive_connection_ttl(Duration::from_secs(60))
        .with_constraints(PoolConstraints::new(1, max).unwrap_or_default())
}

impl MysqlBackend {
    /// Parses `url` (`mysql://user:password@host:port/database`) and builds
    /// the pool; connects nothing yet.
    pub(crate) fn new(
        url: &str,
        table: &str,
        timeout: Duration,
        tls_root: Option<&[u8]>,
    ) -> Result<Self, LockError> {
        let redacted = redact_url(url);
        let invalid = |reason: String| LockError::InvalidConfig {
            node: redacted.clone(),
            reason,
        };
        if let Some(problem) = table_problem(table) {
            return Err(invalid(problem));
        }
        let opts = Opts::from_url(url).map_err(|e| {
            invalid(format!(
                "{}{}",
                redact_secrets(&e.to_string(), url),
                unparsed_hint(url)
            ))
        })?;
        let Some(db) = opts.db_name().map(str::to_owned) else {
            return Err(invalid(
                "the URL names no database; give one, `mysql://user:password@host:port/database`".into(),
            ));
        };
        let node = format!("{}:{}/{db}", opts.ip_or_hostname(), opts.tcp_port());
        let ssl = opts
            .ssl_opts()
            .map(|asked| tls::mysql_ssl_opts(asked, tls_root))
            .transpose()
            .map_err(&invalid)?;
        let without_tls = ssl.is_none();
        let opts = OptsBuilder::from_opts(opts)
            .ssl_opts(ssl)
            // Expiries are compared on the server only, but DATETIME is a
            // wall time: UTC keeps it free of daylight-saving jumps.
            // READ COMMITTED: the lock statements need no gap locks.
            // (`setup` runs again after any session reset.)
            .setup(vec![
                "SET time_zone = '+00:00'",
                "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
            ])
            // The address given, always: not a Unix socket the server
            // names when it is on this host (a proxy or tunnel in the URL
            // would be bypassed, silently).
            .prefer_socket(false);
        let pool = Pool::new(opts.clone().pool_opts(pool_opts(64)));
        let lane = Pool::new(opts.pool_opts(pool_opts(LANE_CONNECTIONS)));
        Ok(MysqlBackend {
            pool: pool.clone(),
            lane,
            sql: Statements::new(table),
            shared: Box::new(SharedStatements::new(table)),
            fair: Box::new(FairStatements::new(table)),
            table: table.to_owned(),
            node,
            url: url.to_owned(),
            without_tls,
            timeout,
            unanswered: Arc::default(),
            settling: Settling {
                pool,
                ours: format!("%`{table}%"),
            },
        })
    }

    pub(crate) fn node(&self) -> &str {
        &self.node
    }

    /// Connects, and creates the table if it is missing: a wrong password
    /// or a missing grant fails here, at start-up. One attempt: a server
    /// that refuses connections, is shutting down or does not answer is
    /// `transient`, to be waited for (`startup::when_ready`).
    pub(crate) async fn verify(&self) -> Result<(), Failure> {
        let lane = self.lane.clone();
        let result = tokio::time::timeout(self.timeout, async {
            let mut conn = self.pool.get_conn().await?;
            self.create_tables(&mut conn).await?;
            on_renewal_thread(async move { lane.get_conn().await.map(drop) }).await
        })
        .await;
        match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(self.startup_failure(e)),
            Err(_) => Err(startup::no_answer(&self.node, self.timeout)),
        }
    }

    /// A start-up failure: refused credentials and missing grants are the
    /// configuration's fault and fail at once; the rest is classified as
    /// for a lock call.
    fn startup_failure(&self, e: mysql_async::Error) -> Failure {
        match &e {
            mysql_async::Error::Server(s) if matches!(s.code, 1044 | 1045 | 1142 | 1698) => {
                // A server or user that requires TLS refuses a plain
                // connection in the same words as a wrong password.
                let hint = if s.code == 1045 && self.without_tls {
                    "; if the server or the user requires TLS, add `require_ssl=true` to the URL"
                } else {
                    ""
                };
                Failure::permanent(LockError::InvalidConfig {
                    node: self.node.clone(),
                    reason: format!(
                        "{}{hint}; the user needs CREATE (or an existing table), SELECT, INSERT, UPDATE and DELETE on the lock table",
                        redact_secrets(&e.to_string(), &self.url)
                    ),
                })
            }
            // A certificate that does not verify, TLS asked of a server
            // that offers none, or a plain connection refused by a server
            // that requires TLS: waiting cannot mend any of them.
            mysql_async::Error::Io(io) if startup::tls_refused(io) => self.tls_failure(&e),
            #[cfg(feature = "tls")]
            mysql_async::Error::Io(mysql_async::IoError::Tls(_)) => self.tls_failure(&e),
            mysql_async::Error::Driver(mysql_async::DriverError::NoClientSslFlagFromServer) => {
                self.tls_failure(&e)
            }
            mysql_async::Error::Server(s) if s.code == INSECURE_TRANSPORT => self.tls_failure(&e),
            _ => self.failure(None, e),
        }
    }

    fn tls_failure(&self, e: &mysql_async::Error) -> Failure {
        Failure::permanent(LockError::InvalidConfig {
            node: self.node.clone(),
            reason: format!(
                "TLS: {}; a server that requires TLS needs `require_ssl=true` in the URL, and a private CA needs `tls_root_certificate`",
                redact_secrets(&startup::with_causes(e), &self.url)
            ),
        })
    }

    pub(super) fn failure(&self, key: Option<&LockKey>, e: mysql_async::Error) -> Failure {
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

    pub(super) fn timed_out(&self, key: &LockKey, what: &str) -> Failure {
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

    /// A pooled connection for one acquisition attempt of `holder`: see
    /// `backend/unanswered.rs` for why it is watched.
    pub(super) async fn attempt<'a>(
        &'a self,
        holder: &'a str,
    ) -> Result<Attempt<'a, Conn>, mysql_async::Error> {
        Ok(self
            .unanswered
            .attempt(self.pool.get_conn().await?, &self.settling, holder))
    }

    /// Waits (at most the command timeout) for `holder`'s attempts dropped
    /// unanswered, so that a give-back sent next lands after them.
    pub(super) async fn after_unanswered(&self, holder: &str) {
        self.unanswered.settled(holder, self.timeout).await;
    }

    /// Runs `work` within the command timeout, creating the table once if
    /// the server says it is missing (a table dropped under a running
    /// service, or a lazily built client) and running it again.
    pub(super) async fn run<T, F, Fut>(&self, key: &LockKey, what: &str, work: F) -> Result<T, Failure>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, mysql_async::Error>>,
    {
        let attempt = async {
            match work().await {
                // The table is missing (1146), or is an earlier version's
                // without a column (1054): create or migrate it.
                Err(mysql_async::Error::Server(s)) if s.code == 1146 || s.code == 1054 => {
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

    /// The lock table and the shared locks' members table, if missing, and
    /// the columns an earlier version's tables lack.
    pub(super) async fn create_tables(&self, conn: &mut mysql_async::Conn) -> Result<(), mysql_async::Error> {
        for (create, exists) in [
            (&self.sql.create, &self.sql.exists),
            (&self.shared.create, &self.shared.exists),
        ] {
            match conn.query_drop(create).await {
                // 1142, CREATE denied: the server checks the grant before
                // `IF NOT EXISTS`, so a user without it (an operator's
                // `lockctl`, a service given only the rows) is refused
                // even for a table that exists. One that does is enough.
                Err(mysql_async::Error::Server(denied)) if denied.code == 1142 => {
                    if conn.query_drop(exists).await.is_err() {
                        return Err(mysql_async::Error::Server(denied));
                    }
                }
                other => other?,
            }
        }
        // A members table made before fair locks (before 2026-11-24) has no
        // `queued_at`. Looked for first: ALTER TABLE needs the ALTER grant
        // and rebuilds the table, even when there is nothing to add.
        // Likewise a lock table made before elections (before 2026-11-29)
        // has no `record`. Only elections use it: a client without the
        // ALTER grant still starts, and an election's statement then fails
        // with the server's "unknown column" until the column is added
        // (docs/api.md gives the statement).
        let columns = [
            (
                "queued_at",
                &self.shared.has_queued_at,
                &self.shared.add_queued_at,
                true,
            ),
            ("record", &self.sql.has_record, &self.sql.add_record, false),
        ];
        for (column, has, add, needed) in columns {
            let added = match conn.query_drop(has).await {
                Err(mysql_async::Error::Server(s)) if s.code == 1054 => {
                    tracing::info!(
                        column,
                        "adding a column to a lock table made by an earlier version"
                    );
                    match conn.query_drop(add).await {
                        // Another client added it meanwhile.
                        Err(mysql_async::Error::Server(s)) if s.code == 1060 => Ok(()),
                        other => other,
                    }
                }
                other => other,
            };
            match added {
                // 1142: the ALTER command denied to this user.
                Err(mysql_async::Error::Server(s)) if !needed && s.code == 1142 => {
                    tracing::warn!(column, error = %s.message, "cannot add the column elections need to a lock table made by an earlier version");
                }
                other => other?,
            }
        }
        Ok(())
    }

    pub(super) fn check_name(key: &LockKey, name: &str) -> Result<(), Failure> {
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
}

/// What a transaction's attempt found: a reply, or (`Err`) the kind of
/// lock that holds the name instead.
pub(super) type Attempted = Result<AcquireReply, &'static str>;

/// `key` is a lock of another kind (`found`): refused, never waited for.
pub(super) fn conflict(key: &LockKey, found: &str) -> Failure {
    Failure::permanent(LockError::KeyConflict {
        key: key.name.clone(),
        redis_key: key.redis_key.clone(),
        found_type: found.into(),
    })
}

/// The reply for a lock found held, `left` before it frees.
pub(super) fn held(left: Duration, blocked_by: usize) -> AcquireReply {
    AcquireReply::Held {
        pttl: Some(left),
        claimed: false,
        blocked_by,
    }
}

/// A lease length as the `INTERVAL … MICROSECOND` it is sent as.
pub(super) fn as_micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A remaining lease the server reported (µs); under 1 ms counts as 1 ms,
/// so the caller looks again soon.
pub(super) fn micros(left: u64) -> Duration {
    Duration::from_micros(left).max(Duration::from_millis(1))
}

impl Answering for Conn {
    type Context = Settling;

    async fn answer_pending(self, settling: Settling) {
        // The driver cannot be asked for the dropped statement's answer: a
        // statement cut short leaves the connection out of step, marked
        // broken (the pool would close it). So the connection is closed,
        // never reused (a clean one with `COM_QUIT`, which the server reads
        // after anything sent before it, rolling back an open
        // transaction), and the statement is stopped from another
        // connection: `KILL CONNECTION` aborts it if it still runs (rolled
        // back, nothing granted). Once the thread is gone from the process
        // list, nothing sent on the connection can still be applied.
        //
        // Only a thread running a statement on this lock table is killed:
        // after a server restart (or behind a proxy) the id may name
        // another connection, and a connection of another program must
        // never be touched. Bounded, so that a server that stops answering
        // does not keep this task.
        let id = self.id();
        let settle = async {
            let _ = self.disconnect().await;
            let mut other = settling.pool.get_conn().await?;
            let mut killed = false;
            while let Some(running_ours) = other
                .exec_first::<u8, _, _>(
                    "SELECT COALESCE(INFO LIKE ?, 0) FROM information_schema.PROCESSLIST WHERE ID = ?",
                    (settling.ours.as_str(), id),
                )
                .await?
            {
                if running_ours == 1 && !killed {
                    // Fails with "unknown thread" if it is gone already.
                    let _ = other.query_drop(format!("KILL CONNECTION {id}")).await;
                    killed = true;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            Ok::<(), mysql_async::Error>(())
        };
        let _ = tokio::time::timeout(Duration::from_secs(60), settle).await;
    }
}
