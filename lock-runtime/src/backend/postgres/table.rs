//! The lock table's client: the pool, the statements, and how one
//! operation is run (within the command timeout, creating the table when
//! missing) and how its failures are classified.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod};
use tokio_postgres::error::SqlState;

use super::sql::{MAX_NAME_BYTES, MemberStatements, Statements};
use crate::backend::contract::{AcquireReply, Failure};
use crate::backend::lane::on_renewal_thread;
use crate::backend::startup::{self, tls_refused};
use crate::backend::unanswered::{Answering, Attempt, Unanswered};
use crate::error::LockError;
use crate::key::LockKey;
use crate::redact::{redact_secrets, redact_url, unparsed_hint};

/// A PostgreSQL lock table.
pub(crate) struct PostgresBackend {
    pub(super) pool: Pool,
    /// The renewal lane: a pool of its own for renewals and the `keep` of a
    /// `hold_at_least`, so that they never queue behind acquisitions and
    /// releases for a connection (issue 57). Its connections are made on
    /// the renewal thread (`backend/lane.rs`), where their tasks then run.
    pub(super) lane: Pool,
    /// Where the pool connects, for the release listener's connection.
    /// Boxed: read once, and it would double the size of every client's
    /// backend.
    pub(super) config: Box<tokio_postgres::Config>,
    /// How connections are opened: plain, or TLS.
    pub(super) connector: Connector,
    /// The release listener's task, aborted with the backend.
    pub(super) listener: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    pub(super) sql: Statements,
    /// Boxed: read only by shared and fair locks, and it would double the
    /// size of every client's backend.
    pub(super) members: Box<MemberStatements>,
    pub(super) table: String,
    /// `host:port/db`, no credentials: what messages name.
    pub(super) node: String,
    /// The URL as given, only to scrub its secrets from driver messages.
    pub(super) url: String,
    pub(super) timeout: Duration,
    /// Acquisition attempts dropped before their answer (see
    /// `backend/unanswered.rs`).
    pub(super) unanswered: Arc<Unanswered>,
}

impl fmt::Debug for PostgresBackend {
    // By hand: the pool's configuration holds the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("node", &self.node)
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

/// How a client's connections are opened.
#[derive(Clone)]
pub(super) enum Connector {
    /// In plain text: the URL's `sslmode` is `disable` or `prefer` (which,
    /// with no TLS offered, libpq would also end in plain text).
    Plain,
    /// Over TLS, the server verified: the URL says `sslmode=require`.
    #[cfg(feature = "tls")]
    Tls(tokio_postgres_rustls::MakeRustlsConnect),
}

impl Connector {
    /// The connector the URL asks for. A URL that requires TLS gets it or
    /// an error now, never a plain connection at its first lock.
    fn for_url(config: &tokio_postgres::Config, tls_root: Option<&[u8]>) -> Result<Self, String> {
        if config.get_ssl_mode() != tokio_postgres::config::SslMode::Require {
            return Ok(Connector::Plain);
        }
        #[cfg(feature = "tls")]
        {
            crate::backend::tls::postgres_connector(tls_root).map(Connector::Tls)
        }
        #[cfg(not(feature = "tls"))]
        {
            let _ = tls_root;
            Err("the URL requires TLS (sslmode=require): enable lock-runtime's `tls` feature".into())
        }
    }

    fn manager(&self, config: tokio_postgres::Config) -> Manager {
        let recycling = || ManagerConfig {
            // Fast recycling: a connection goes back to the pool as it is,
            // and one whose server side closed is dropped when next taken.
            // A verified recycle would cost a round trip per operation.
            recycling_method: RecyclingMethod::Fast,
        };
        match self {
            Connector::Plain => Manager::from_config(config, tokio_postgres::NoTls, recycling()),
            #[cfg(feature = "tls")]
            Connector::Tls(tls) => Manager::from_config(config, tls.clone(), recycling()),
        }
    }
}

/// Whether `name` can name a table without quoting trouble.
fn table_problem(name: &str) -> Option<String> {
    // 55: the members table's name, `<name>_members`, must fit
    // PostgreSQL's 63.
    let ok =
        !name.is_empty() && name.len() <= 55 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    (!ok).then(|| format!("the PostgreSQL table name `{name}` must be 1 to 55 ASCII letters, digits or `_`"))
}

/// An error that a plain retry can get past: the server going away or
/// coming back, a conflict with another transaction, a full server.
fn transient_state(state: &SqlState) -> bool {
    let code = state.code();
    // Class 08: connection exceptions.
    code.starts_with("08")
        || [
            SqlState::T_R_SERIALIZATION_FAILURE,
            SqlState::T_R_DEADLOCK_DETECTED,
            SqlState::LOCK_NOT_AVAILABLE,
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::TOO_MANY_CONNECTIONS,
            SqlState::QUERY_CANCELED,
        ]
        .contains(state)
}

/// An error without an SQLSTATE that waiting cannot mend: TLS that fails
/// (`sslmode=require` to a server without TLS), authentication the client
/// cannot answer (no password given), an unusable configuration. The
/// driver's error kinds are private; its message starts with the kind's.
fn lasting(e: &tokio_postgres::Error) -> bool {
    const KINDS: [&str; 4] = [
        "error performing TLS handshake",
        "authentication error",
        "invalid configuration",
        "invalid connection string",
    ];
    e.code().is_none() && KINDS.iter().any(|kind| e.to_string().starts_with(kind))
}

/// A server that is shutting down or crashed: its connections are gone.
fn closing_state(state: &SqlState) -> bool {
    [SqlState::ADMIN_SHUTDOWN, SqlState::CRASH_SHUTDOWN].contains(state)
}

/// What went wrong, for a message: tokio-postgres shows a server's error as
/// "db error" and keeps its SQLSTATE and text underneath.
pub(super) fn describe(e: &PoolError) -> String {
    let db = match e {
        PoolError::Backend(e) => e.as_db_error(),
        _ => None,
    };
    match db {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => startup::with_causes(e),
    }
}

/// The table is missing, or is an earlier version's without a column:
/// create or migrate it, then run the statement again.
fn missing_table(e: &PoolError) -> bool {
    matches!(e, PoolError::Backend(e)
        if e.code() == Some(&SqlState::UNDEFINED_TABLE) || e.code() == Some(&SqlState::UNDEFINED_COLUMN))
}

impl Drop for PostgresBackend {
    fn drop(&mut self) {
        let listener = self
            .listener
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(task) = listener.take() {
            task.abort();
        }
    }
}

impl PostgresBackend {
    /// Parses `url` (`postgres://user:password@host:port/database`) and
    /// builds the pool; connects nothing yet.
    pub(crate) fn new(
        url: &str,
        table: &str,
        pool_size: usize,
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
        if pool_size == 0 {
            return Err(invalid("the pool size must be at least 1".into()));
        }
        let config: tokio_postgres::Config = url.parse().map_err(|e: tokio_postgres::Error| {
            invalid(format!(
                "{}{}",
                redact_secrets(&e.to_string(), url),
                unparsed_hint(url)
            ))
        })?;
        let connector = Connector::for_url(&config, tls_root).map_err(&invalid)?;
        let Some(db) = config.get_dbname().map(str::to_owned) else {
            return Err(invalid(
                "the URL names no database; give one, `postgres://user:password@host:port/database`".into(),
            ));
        };
        let host = match config.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
            Some(tokio_postgres::config::Host::Unix(path)) => path.display().to_string(),
            None => "localhost".into(),
        };
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let node = format!("{host}:{port}/{db}");
        let pool = |size: usize| {
            Pool::builder(connector.manager(config.clone()))
                .max_size(size)
                .runtime(deadpool_postgres::Runtime::Tokio1)
                .build()
                .map_err(|e| invalid(e.to_string()))
        };
        // Two: a watchdog's batch is one statement, and two go out at once.
        let (pool, lane) = (pool(pool_size)?, pool(2)?);
        Ok(PostgresBackend {
            pool,
            lane,
            config: Box::new(config),
            connector,
            listener: std::sync::Mutex::new(None),
            sql: Statements::new(table),
            members: Box::new(MemberStatements::new(table)),
            table: table.to_owned(),
            node,
            url: url.to_owned(),
            timeout,
            unanswered: Arc::default(),
        })
    }

    pub(crate) fn node(&self) -> &str {
        &self.node
    }

    /// Connects, and creates the table if it is missing: a wrong password
    /// or a missing grant fails here, at start-up.
    /// One attempt: a server that refuses connections, is starting up or
    /// shutting down, or does not answer is `transient`, to be waited for
    /// (`startup::when_ready`).
    pub(crate) async fn verify(&self) -> Result<(), Failure> {
        let lane = self.lane.clone();
        let result = tokio::time::timeout(self.timeout, async {
            self.create_table().await?;
            on_renewal_thread(async move { lane.get().await.map(drop) }).await
        })
        .await;
        match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(self.startup_failure(e)),
            Err(_) => Err(startup::no_answer(&self.node, self.timeout)),
        }
    }

    /// A start-up failure: refused credentials, a missing database and
    /// missing grants are the configuration's fault, and so is TLS that
    /// fails (a certificate that does not verify, a server without TLS):
    /// all are `InvalidConfig`, at once. The rest is classified as for a
    /// lock call.
    fn startup_failure(&self, e: PoolError) -> Failure {
        let message = redact_secrets(&describe(&e), &self.url);
        let state = match &e {
            PoolError::Backend(e) => e.code().cloned(),
            _ => None,
        };
        let invalid = |reason: String| {
            Failure::permanent(LockError::InvalidConfig {
                node: self.node.clone(),
                reason,
            })
        };
        match state {
            Some(state) if state == SqlState::INSUFFICIENT_PRIVILEGE => invalid(format!(
                "{message}; the user needs CREATE on the schema (or an existing table), and SELECT, INSERT, UPDATE and DELETE on the lock table"
            )),
            Some(state) if state == SqlState::INVALID_CATALOG_NAME => {
                invalid(format!("{message}; the URL's database must exist"))
            }
            // Refused by the password, or by `pg_hba.conf` (whose words
            // say why: no entry for this host, user or encryption).
            Some(state)
                if [
                    SqlState::INVALID_PASSWORD,
                    SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
                ]
                .contains(&state) =>
            {
                invalid(message)
            }
            _ if matches!(&e, PoolError::Backend(inner) if tls_refused(inner) || lasting(inner)) => {
                invalid(message)
            }
            _ => self.failure(None, e),
        }
    }

    pub(super) fn failure(&self, key: Option<&LockKey>, e: PoolError) -> Failure {
        let (transient, reconnecting) = match &e {
            // No connection to be had in time, or one could not be made
            // (refused, reset, unreachable: the server is down).
            PoolError::Timeout(_) => (true, false),
            PoolError::Backend(e) => match e.code() {
                Some(state) => (transient_state(state), closing_state(state)),
                // No SQLSTATE: the connection failed or closed under the
                // request, which may or may not have been applied.
                None => (true, true),
            },
            PoolError::Closed | PoolError::NoRuntimeSpecified | PoolError::PostCreateHook(_) => {
                (false, false)
            }
        };
        Failure {
            error: LockError::backend(
                &self.node,
                key.map(|k| k.name.as_str()),
                redact_secrets(&describe(&e), &self.url),
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

    /// Runs `work` within the command timeout, creating the table once if
    /// the server says it is missing (a table dropped under a running
    /// service, or a lazily built client) and running it again.
    pub(super) async fn run<T, F, Fut>(&self, key: &LockKey, what: &str, work: F) -> Result<T, Failure>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, PoolError>>,
    {
        let attempt = async {
            match work().await {
                Err(e) if missing_table(&e) => {
                    self.create_table().await?;
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

    /// A pooled connection for one acquisition attempt of `holder`: see
    /// `backend/unanswered.rs` for why it is watched.
    pub(super) async fn attempt<'a>(&'a self, holder: &'a str) -> Result<Attempt<'a, Object>, PoolError> {
        Ok(self.unanswered.attempt(self.pool.get().await?, &(), holder))
    }

    /// Waits (at most the command timeout) for `holder`'s attempts dropped
    /// unanswered, so that a give-back sent next lands after them.
    pub(super) async fn after_unanswered(&self, holder: &str) {
        self.unanswered.settled(holder, self.timeout).await;
    }

    /// The lock table and the members table, if missing.
    ///
    /// Two clients creating one at once can both pass `IF NOT EXISTS`, and
    /// the later then fails on the catalog: on its unique index if it waited
    /// for the other's transaction, or with "type already exists" if that
    /// committed between its look for the table and its look for the
    /// table's row type. Neither says the table is there (a type of that
    /// name alone fails the same way), so the creation runs once more: by
    /// then the other's table is visible and `IF NOT EXISTS` passes, while
    /// a true clash fails again and is reported.
    async fn create_table(&self) -> Result<(), PoolError> {
        let client = self.pool.get().await?;
        for create in [&self.sql.create, &self.members.create] {
            let created = match client.batch_execute(create).await {
                Err(e) if lost_creation_race(&e) => client.batch_execute(create).await,
                other => other,
            };
            created.map_err(PoolError::Backend)?;
        }
        // A table made before releases were announced only to waiters
        // (before 2026-11-27) has no `waiting` column. Looked for first:
        // ALTER TABLE needs the table's owner and locks out every lock
        // call while it runs, even when there is nothing to add.
        // Likewise a table made before elections (before 2026-11-29) has
        // no `record` column. Only elections use it: a client whose role
        // may not alter the table still starts, and an election's
        // statement then fails with the server's "column does not exist"
        // until the table's owner adds it (docs/api.md gives the
        // statement).
        let columns = [
            ("waiting", &self.sql.has_waiting, &self.sql.add_waiting, true),
            ("record", &self.sql.has_record, &self.sql.add_record, false),
        ];
        for (column, has, add, needed) in columns {
            let added = match client.batch_execute(has).await {
                Err(e) if e.code() == Some(&SqlState::UNDEFINED_COLUMN) => {
                    tracing::info!(table = %self.sql.channel, column, "adding a column to a lock table made by an earlier version");
                    client.batch_execute(add).await
                }
                other => other,
            };
            match added {
                Err(e) if !needed && e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => {
                    tracing::warn!(table = %self.sql.channel, column, error = %e, "cannot add the column elections need to a lock table made by an earlier version");
                }
                other => other.map_err(PoolError::Backend)?,
            }
        }
        Ok(())
    }

    pub(super) fn check_name(key: &LockKey, name: &str) -> Result<(), Failure> {
        if name.len() > MAX_NAME_BYTES {
            return Err(Failure::permanent(LockError::InvalidKey {
                key: key.name.clone(),
                reason: format!(
                    "with its prefix the lock's name is {} bytes; the PostgreSQL backend takes {MAX_NAME_BYTES}",
                    name.len()
                ),
            }));
        }
        if name.contains('\0') {
            return Err(Failure::permanent(LockError::InvalidKey {
                key: key.name.clone(),
                reason: "PostgreSQL text cannot hold a NUL character".into(),
            }));
        }
        Ok(())
    }
}

/// Whether a creation failed because another made the same name meanwhile.
fn lost_creation_race(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|state| {
        [
            SqlState::UNIQUE_VIOLATION,
            SqlState::DUPLICATE_TABLE,
            SqlState::DUPLICATE_OBJECT,
        ]
        .contains(state)
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

/// A lease length as the microseconds it is sent as.
pub(super) fn as_micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// A remaining lease the server reported (µs); under 1 ms counts as 1 ms,
/// so the caller looks again soon.
pub(super) fn micros(left: i64) -> Duration {
    Duration::from_micros(u64::try_from(left).unwrap_or(0)).max(Duration::from_millis(1))
}

/// What one attempt found: a reply, or (`Err`) the kind of lock that holds
/// the name instead.
pub(super) type Attempted = Result<AcquireReply, &'static str>;

/// `key` is a lock of another kind (`found`): refused, never waited for.
pub(super) fn conflict(key: &LockKey, found: &str) -> Failure {
    Failure::permanent(LockError::KeyConflict {
        key: key.name.clone(),
        redis_key: key.redis_key.clone(),
        found_type: found.into(),
    })
}

impl Answering for Object {
    type Context = ();

    async fn answer_pending(self, (): ()) {
        // An empty query: answered after the dropped attempt's statements
        // (and the rollback of its transaction, queued when that was
        // dropped), or failed with the connection. Either way they are done.
        // Bounded, so that a server that stops answering does not keep this
        // task (and the connection's place in the pool).
        let _ = tokio::time::timeout(Duration::from_secs(60), self.batch_execute("")).await;
    }
}
