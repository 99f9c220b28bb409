//! The lock client, its builder, and the process-wide client the attribute
//! uses.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::admin::LockAdmin;
use crate::backend::AnyBackend;
use crate::backend::Failure;
use crate::backend::memory::MemoryBackend;
use crate::backend::redis::cluster::{ClusterLink, cluster_builder};
use crate::backend::redis::redlock::RedlockBackend;
use crate::backend::redis::sentinel::SentinelLink;
use crate::backend::redis::{
    RedisBackend, Topology, open_url, plain_at_tls_port, redact_error, startup_failure,
};
use crate::backend::startup::when_ready;
use crate::config::ClientConfig;
use crate::election::Election;
use crate::entropy::Entropy;
use crate::error::LockError;
use crate::guard::LockRequest;
use crate::key::validate_prefix;
use crate::redact::{escape_userinfo, redact_url};
use crate::shared::ClientInner;
use crate::timing::{MAX_TIMEOUT, ttl_problem};
use crate::waiter::Notifier;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};

/// A handle to one lock backend. Cheap to clone; clones share connections.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// use lock_runtime::LockClient;
/// let client = LockClient::connect("redis://127.0.0.1/").await?;
/// let guard = client.lock("report:daily").acquire().await?;
/// // ... only one holder at a time runs here ...
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct LockClient {
    pub(crate) inner: Arc<ClientInner>,
}

impl LockClient {
    /// Connects to one Redis node: `redis://[user:password@]host[:port][/db]`
    /// or `redis+unix:///path/to/socket`. The connection re-establishes
    /// itself after the server restarts.
    ///
    /// An unparsable URL or an unreachable server is an error that names the
    /// node, with any password redacted.
    pub async fn connect(url: &str) -> Result<LockClient, LockError> {
        LockClient::builder().connect(url).await
    }

    /// Locks kept in this process: the same semantics as Redis (leases,
    /// renewal, owner checks, fencing tokens, release wake-ups) for a single
    /// process. Not distributed: another process never sees these locks. For
    /// single-process services, and for testing code that takes locks.
    pub fn in_memory() -> LockClient {
        LockClientBuilder {
            config: ClientConfig::default(),
        }
        .build_in_memory()
    }

    /// Redlock over independent Redis masters: a lock is held while a
    /// majority (`N/2+1`) of them hold it, so it survives a minority of
    /// masters failing. Use 3 or 5 masters that are not replicas of one
    /// another. Fencing tokens are not available (see the README).
    pub async fn redlock<S: AsRef<str>>(urls: impl IntoIterator<Item = S>) -> Result<LockClient, LockError> {
        LockClient::builder().redlock(urls).await
    }

    /// Redis Cluster, reached through any of its nodes (`urls` are seeds).
    /// A lock lives on the master that owns its key's slot; the library's
    /// hash tag keeps the lock, its fence counter and its release channel in
    /// one slot, and release notifications use sharded pub/sub.
    pub async fn cluster<S: AsRef<str>>(urls: impl IntoIterator<Item = S>) -> Result<LockClient, LockError> {
        LockClient::builder().cluster(urls).await
    }

    /// The master that the Sentinels at `sentinel_urls` name `master_name`
    /// (`redis://host:26379` each). Commands go to the current master;
    /// after a failover, the first command that fails on the old master
    /// makes the client ask Sentinel again, so new locks go to the new
    /// master. The master is reached with the credentials of the first
    /// sentinel URL. Pair it with
    /// [`replica_acks`](LockClientBuilder::replica_acks) so that a lock
    /// survives the failover that promotes its replica.
    pub async fn sentinel<S: AsRef<str>>(
        master_name: &str,
        sentinel_urls: impl IntoIterator<Item = S>,
    ) -> Result<LockClient, LockError> {
        LockClient::builder().sentinel(master_name, sentinel_urls).await
    }

    /// A MySQL 8 or MariaDB 10.6+ database:
    /// `mysql://user:password@host:port/database`. Each held lock is a row
    /// of the table `distributed_locks` (see
    /// [`mysql_table`](LockClientBuilder::mysql_table)), created if missing;
    /// every expiry is judged by the database's clock. Waiters in other
    /// processes see a release by polling (see
    /// [`poll_interval`](LockClientBuilder::poll_interval)); waiters in this
    /// process are woken at once. Every kind of lock (exclusive,
    /// `read`/`write`, `permits`, `fair`, segments, all-or-nothing sets),
    /// with fencing tokens. Needs the `mysql` feature.
    #[cfg(feature = "mysql")]
    pub async fn mysql(url: &str) -> Result<LockClient, LockError> {
        LockClient::builder().mysql(url).await
    }

    /// A PostgreSQL 13+ database:
    /// `postgres://user:password@host:port/database`. Each lock is a lease,
    /// a row of the table `distributed_locks` (see
    /// [`postgres_table`](LockClientBuilder::postgres_table)), created if
    /// missing; every expiry is judged by the database's clock. A lease is
    /// not tied to a connection, so a pooler in between cannot free it.
    /// Waiters hear releases by `LISTEN`/`NOTIFY` on one more connection
    /// per client; waiters in this process are woken at once. Every kind
    /// of lock (exclusive, `read`/`write`, `permits`, `fair`, segments,
    /// all-or-nothing sets), with fencing tokens. Needs the `postgres`
    /// feature.
    #[cfg(feature = "postgres")]
    pub async fn postgres(url: &str) -> Result<LockClient, LockError> {
        LockClient::builder().postgres(url).await
    }

    /// A ZooKeeper ensemble: `host:port[,host:port…][/chroot]`, or every
    /// member as `tcp+tls://host:port` (the `zookeeper-tls` feature; see
    /// `LockClientBuilder::tls_root_certificate`). Each lock
    /// is a queue of ephemeral sequential nodes under `/distributed-locks`
    /// (see [`zookeeper_root`](LockClientBuilder::zookeeper_root)): the
    /// first in line holds it, each waiter watches only the one before it,
    /// and a holder's node goes with its session, so a crashed holder is
    /// let go when the ensemble expires its session (see
    /// [`zookeeper_session_timeout`](LockClientBuilder::zookeeper_session_timeout)).
    /// Mutual exclusion among live sessions rests on the ensemble's
    /// consensus, not on clocks. A lease is trusted for at most the session
    /// timeout past the last answered request, so a `ttl` longer than that
    /// is shortened to it. Every kind of lock (a queue is `fair` anyway),
    /// with fencing tokens (the lock node's creation zxid). Needs the
    /// `zookeeper` feature.
    #[cfg(feature = "zookeeper")]
    pub async fn zookeeper(connect: &str) -> Result<LockClient, LockError> {
        LockClient::builder().zookeeper(connect).await
    }

    /// An etcd 3.4+ cluster: its members' client endpoints,
    /// `http://host:port` (or `host:port`). Each lock is a line of keys
    /// under `/distributed-locks` (see
    /// [`etcd_root`](LockClientBuilder::etcd_root)), each put with this
    /// client's one lease: the key with the lowest create revision holds
    /// it, each waiter watches only the key before its own, and a crashed
    /// holder's keys go with its lease (see
    /// [`etcd_lease_ttl`](LockClientBuilder::etcd_lease_ttl)). Mutual
    /// exclusion among live clients rests on the cluster's consensus, not
    /// on clocks. A lock's lease is trusted for at most two thirds of the
    /// etcd lease past an attempt or a renewal, so a longer `ttl` is
    /// shortened to that. Every kind of lock (a line is `fair` anyway),
    /// with fencing tokens (the key's create revision). Needs the `etcd`
    /// feature. `https://` endpoints (all or none) speak TLS, with the `tls`
    /// feature: the cluster is verified against the system's roots or
    /// [`tls_root_certificate`](LockClientBuilder::tls_root_certificate);
    /// see also [`etcd_client_certificate`](LockClientBuilder::etcd_client_certificate)
    /// and [`etcd_user`](LockClientBuilder::etcd_user).
    #[cfg(feature = "etcd")]
    pub async fn etcd(endpoints: &[&str]) -> Result<LockClient, LockError> {
        LockClient::builder().etcd(endpoints).await
    }

    /// Options: key prefix, default ttl and wait, retry backoff, command
    /// timeout.
    pub fn builder() -> LockClientBuilder {
        LockClientBuilder {
            config: ClientConfig::default(),
        }
    }

    /// An operator's view of this client's locks: list, inspect, free by
    /// force (what `lockctl` does). Not for a service's own code paths: a
    /// forced unlock breaks the holder's mutual exclusion by design.
    pub fn admin(&self) -> LockAdmin<'_> {
        LockAdmin::new(&self.inner)
    }

    /// The election `name` among this service's replicas: campaign to lead
    /// it, or read who leads ([`Election`]). Owned: it keeps a handle of
    /// this client. An election's data never collides with a lock's, even
    /// one of the same name.
    pub fn election(&self, name: impl Into<String>) -> Election {
        Election::new(Arc::clone(&self.inner), name.into())
    }

    /// Starts a lock request for `key` (the name without prefix, as the
    /// attribute would render it).
    pub fn lock(&self, key: impl Into<String>) -> LockRequest<'_> {
        LockRequest::new(&self.inner, key.into())
    }

    /// Starts a request for every lock of `keys` at once, all or none (at
    /// most 64). The keys are sorted and deduplicated, and taken in that
    /// order, so two calls naming the same keys in any order never
    /// deadlock: on one node (and on Sentinel, Redlock and in-process) in
    /// one script, all at once; on a cluster slot by slot, releasing what it
    /// took if a later slot's keys cannot be had within `wait`. Each key is
    /// the same exclusive lock [`lock`](Self::lock) takes. Inside a body
    /// that holds some of the keys, those re-enter and the rest are a new
    /// acquisition.
    pub fn lock_all<I, S>(&self, keys: I) -> LockRequest<'_>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        LockRequest::new_all(&self.inner, keys.into_iter().map(Into::into).collect())
    }
}

/// Builds a [`LockClient`] with non-default options.
#[derive(Debug, Clone)]
#[must_use]
pub struct LockClientBuilder {
    pub(crate) config: ClientConfig,
}

impl LockClientBuilder {
    /// The prefix of every Redis key this client writes (default `lock:`).
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.config.prefix = prefix.into();
        self
    }

    /// The lease length when a call does not give one (default 30 s).
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.config.default_ttl = ttl;
        self
    }

    /// How long to wait for a held lock when a call does not say (default 0:
    /// try once). `Duration::MAX` waits until the lock is free.
    pub fn default_wait(mut self, wait: Duration) -> Self {
        self.config.default_wait = wait;
        self
    }

    /// The pause between attempts on a held lock starts at `min` and doubles
    /// up to `max`; each pause is jittered and never outlasts the holder's
    /// remaining lease (defaults 2 ms and 50 ms).
    pub fn retry_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.config.retry_min = min;
        self.config.retry_max = max;
        self
    }

    /// How long one command may go unanswered before the attempt counts as
    /// failed (default 1 s). Waiting for a lock never overruns its `wait` by
    /// more than this.
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.config.command_timeout = timeout;
        self
    }

    /// After each acquire and each renewal, wait until `replicas` replicas
    /// of the lock's master acknowledged the write (`WAIT`), for at most the
    /// [`replica_ack_timeout`](Self::replica_ack_timeout) (default 100 ms).
    /// An acquisition acknowledged by fewer is released and retried within
    /// the call's `wait`, then fails with [`LockError::NotReplicated`]; a
    /// renewal that falls short counts as
    /// unconfirmed and is retried until the lease's deadline. For one node
    /// with replicas, Sentinel and Cluster (each master's own replicas); it
    /// narrows, and does not close, the window in which a failover loses a
    /// lock (see the README).
    pub fn replica_acks(mut self, replicas: u32) -> Self {
        self.config.replica_acks = replicas;
        self
    }

    /// How long a write waits for its replicas with
    /// [`replica_acks`](Self::replica_acks) (default 100 ms).
    pub fn replica_ack_timeout(mut self, timeout: Duration) -> Self {
        self.config.ack_timeout = timeout;
        self
    }

    /// Fair locks (`fair = true`): how long a waiter keeps its place in line
    /// without an attempt (default 2 s). A live waiter attempts at least
    /// every 200 ms; a waiter whose process died is skipped after this, so
    /// the line never stalls on it. From 250 ms to 1 h.
    pub fn fair_waiter_timeout(mut self, timeout: Duration) -> Self {
        self.config.fair_waiter_timeout = timeout;
        self
    }

    /// Redlock only: how long each master may take to answer one request
    /// (default 50 ms). Keep it small against the ttl: a slow master then
    /// costs one timeout, not the lease.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.config.node_timeout = timeout;
        self
    }

    /// Connect on first use rather than now, for services that must start
    /// while Redis is down: construction then sends nothing and fails only
    /// on an unusable URL, and the first lock call connects (failing like
    /// any call while the server is unreachable). Without it (the default),
    /// construction connects, authenticates and checks that every node
    /// answers, so a wrong password fails at start-up. A lazy Redlock skips
    /// its start-up checks (masters answering, independent, not clustered).
    pub fn lazy(mut self) -> Self {
        self.config.lazy = true;
        self
    }

    /// How long construction waits for a server that refuses connections
    /// or answers but is not serving yet (Redis `LOADING`, PostgreSQL
    /// "starting up", etcd without a leader, ZooKeeper not running, a
    /// Sentinel that names no master, a Redlock with fewer than a majority
    /// answering) before it fails with what the server last said (default
    /// 10 s; `Duration::ZERO` fails at the first error). A service often
    /// starts beside its servers. What waiting cannot mend fails at once:
    /// an unusable URL, refused credentials or grants, a certificate that
    /// does not verify. Lock calls have their own `wait` for servers that
    /// go away later; with [`lazy`](Self::lazy) nothing is waited for at
    /// construction.
    pub fn startup_timeout(mut self, timeout: Duration) -> Self {
        self.config.startup_timeout = timeout;
        self
    }

    /// Verify `rediss://` servers, PostgreSQL servers reached with
    /// `sslmode=require`, MySQL servers reached with `require_ssl=true` and
    /// etcd members reached at `https://` endpoints against this PEM root
    /// certificate (your own CA) instead of the system's roots; ZooKeeper
    /// members given as `tcp+tls://host:port` (the `zookeeper-tls`
    /// feature) are verified against it alone, and need it. Needs the
    /// `tls` feature.
    #[cfg(feature = "tls")]
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.config.tls_root = Some(pem.into().into());
        self
    }

    /// Where no server announces releases (the MySQL backend), how often a
    /// waiter looks again for a lock another process holds: each pause is
    /// jittered to `[d/2, d]` and never outlasts the holder's remaining
    /// lease (default 50 ms). Shorter hands a lock over sooner and costs
    /// the database more queries per waiter. Releases in this process wake
    /// its waiters at once whatever this is.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.config.poll_interval = interval;
        self
    }

    /// The MySQL backend's table (default `distributed_locks`): 1 to 56
    /// ASCII letters, digits or `_`. Shared locks (read-write, permits)
    /// also use `<table>_members`.
    #[cfg(feature = "mysql")]
    pub fn mysql_table(mut self, table: impl Into<String>) -> Self {
        self.config.table = table.into();
        self
    }

    /// The PostgreSQL backend's table (default `distributed_locks`): 1 to
    /// 55 ASCII letters, digits or `_`. Shared and fair locks also use
    /// `<table>_members`.
    #[cfg(feature = "postgres")]
    pub fn postgres_table(mut self, table: impl Into<String>) -> Self {
        self.config.table = table.into();
        self
    }

    /// The most connections the PostgreSQL backend opens at once for
    /// acquisitions and releases (default 16): each operation takes one
    /// for a round trip, so a few serve many locks. Renewals have two
    /// more of their own, so that they never wait behind acquisitions.
    #[cfg(feature = "postgres")]
    pub fn pool_size(mut self, connections: usize) -> Self {
        self.config.pool_size = connections;
        self
    }

    /// The ZooKeeper node under which lock queues live (default
    /// `/distributed-locks`; created if missing): an absolute path.
    #[cfg(feature = "zookeeper")]
    pub fn zookeeper_root(mut self, root: impl Into<String>) -> Self {
        self.config.zookeeper_root = root.into();
        self
    }

    /// The session timeout asked of the ZooKeeper ensemble (default 10 s;
    /// the servers grant between 2 and 20 ticks). A crashed holder's locks
    /// are free this long after its last word; a lease is trusted at most
    /// this long past the last answered request, so a connection cut stops
    /// a body before its session could have expired.
    #[cfg(feature = "zookeeper")]
    pub fn zookeeper_session_timeout(mut self, timeout: Duration) -> Self {
        self.config.session_timeout = timeout;
        self
    }

    /// Authenticates the ZooKeeper session as `user` (the `digest` scheme,
    /// `user:password`) and creates every lock node (the root and any
    /// missing parent, each lock's queue, each holder's and waiter's node)
    /// with an ACL that gives every permission to that identity alone,
    /// named by its digest: another client of the ensemble, authenticated
    /// otherwise (one showing the same TLS client certificate too) or not
    /// at all, can neither delete, change nor join a lock's queue, nor list
    /// it unless [`zookeeper_readable_by_anyone`](Self::zookeeper_readable_by_anyone).
    /// Every client of one root must use the same identity. At start-up the
    /// client checks that it may create nodes under the root: a root owned
    /// by another identity, or a different password (ZooKeeper takes any
    /// digest password and makes another identity of it), is
    /// `InvalidConfig`.
    #[cfg(feature = "zookeeper")]
    pub fn zookeeper_digest(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.config.zookeeper_identity = Some(crate::config::ZooKeeperIdentity {
            user: user.into(),
            password: password.into(),
        });
        self
    }

    /// With [`zookeeper_digest`](Self::zookeeper_digest): lets anyone read
    /// (list and get) the lock nodes, for monitoring; writing, deleting and
    /// joining a queue stay the identity's alone. Without an identity,
    /// nodes are open to all anyway.
    #[cfg(feature = "zookeeper")]
    pub fn zookeeper_readable_by_anyone(mut self, readable: bool) -> Self {
        self.config.zookeeper_readable_by_anyone = readable;
        self
    }

    /// The certificate and private key (PEM) the ZooKeeper client shows an
    /// ensemble that asks for one (`ssl.clientAuth=need`, ZooKeeper's
    /// default on its `secureClientPort`). Needs `tcp+tls://` members and
    /// the `zookeeper-tls` feature. A certificate or key that does not
    /// parse, or a key that is not the certificate's, is `InvalidConfig`;
    /// the key never shows in an error or a `Debug`.
    #[cfg(feature = "zookeeper-tls")]
    pub fn zookeeper_client_certificate(
        mut self,
        certificate_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.config.zookeeper_client_certificate = Some(crate::config::ClientCertificate {
            certificate: certificate_pem.into().into(),
            key: key_pem.into().into(),
        });
        self
    }

    /// The etcd key prefix under which lock lines live (default
    /// `/distributed-locks`), without a trailing `/`.
    #[cfg(feature = "etcd")]
    pub fn etcd_root(mut self, root: impl Into<String>) -> Self {
        self.config.etcd_root = root.into();
        self
    }

    /// The ttl of the lease each etcd client keeps (default 10 s; whole
    /// seconds, at least 2). A crashed holder's locks are free this long
    /// after its last keep-alive; a lock's lease is at most two thirds of
    /// it, so a connection cut stops a body before the etcd lease could
    /// have expired.
    #[cfg(feature = "etcd")]
    pub fn etcd_lease_ttl(mut self, ttl: Duration) -> Self {
        self.config.etcd_lease_ttl = ttl;
        self
    }

    /// Authenticates to etcd as `name` (etcd's users and roles, enabled
    /// with `etcdctl auth enable`). The user's roles need `readwrite` on
    /// the prefix `<etcd_root>/` (`etcdctl role grant-permission ROLE
    /// --prefix=true readwrite /distributed-locks/`); at start-up the
    /// client checks that grant without writing anything, and a user
    /// refused, unknown or without it is `InvalidConfig`. The cluster's
    /// tokens expire (`--auth-token-ttl`, and on a member's restart): the
    /// client authenticates again when a request is refused for an
    /// expired token, so a lock outlives its token.
    #[cfg(feature = "etcd")]
    pub fn etcd_user(mut self, name: impl Into<String>, password: impl Into<String>) -> Self {
        self.config.etcd_user = Some(crate::config::EtcdUser {
            name: name.into(),
            password: password.into(),
        });
        self
    }

    /// The certificate and private key (PEM) the etcd client shows a
    /// cluster started with `--client-cert-auth` (mutual TLS). Needs
    /// `https://` endpoints and the `tls` feature. A certificate or key
    /// that does not parse is `InvalidConfig`; the key never shows in an
    /// error or a `Debug`.
    #[cfg(all(feature = "etcd", feature = "tls"))]
    pub fn etcd_client_certificate(
        mut self,
        certificate_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.config.etcd_client_certificate = Some(crate::config::ClientCertificate {
            certificate: certificate_pem.into().into(),
            key: key_pem.into().into(),
        });
        self
    }

    fn check(&self, node: &str) -> Result<(), LockError> {
        let invalid = |reason: String| LockError::InvalidConfig {
            node: node.to_owned(),
            reason,
        };
        validate_prefix(&self.config.prefix).map_err(invalid)?;
        let c = &self.config;
        if let Some(problem) = ttl_problem(c.default_ttl) {
            return Err(invalid(format!("default ttl: {problem}")));
        }
        for (what, timeout) in [
            ("command timeout", c.command_timeout),
            ("node timeout", c.node_timeout),
            ("replica acknowledgement timeout", c.ack_timeout),
            ("fair waiter timeout", c.fair_waiter_timeout),
            ("poll interval", c.poll_interval),
            #[cfg(feature = "zookeeper")]
            ("ZooKeeper session timeout", c.session_timeout),
        ] {
            if timeout < Duration::from_millis(1) || timeout > MAX_TIMEOUT {
                return Err(invalid(format!(
                    "the {what} must be between 1ms and 1h, got {timeout:?}"
                )));
            }
        }
        if c.startup_timeout > MAX_TIMEOUT {
            return Err(invalid(format!(
                "the start-up timeout must be at most 1h, got {:?}",
                c.startup_timeout
            )));
        }
        if c.fair_waiter_timeout < Duration::from_millis(250) {
            return Err(invalid(format!(
                "the fair waiter timeout must be at least 250ms (a live waiter attempts every 200ms), got {:?}",
                c.fair_waiter_timeout
            )));
        }
        if c.replica_acks > 0 && c.ack_timeout >= c.command_timeout {
            return Err(invalid(format!(
                "the replica acknowledgement timeout ({:?}) must be shorter than the command timeout ({:?}), which bounds the `WAIT` that uses it",
                c.ack_timeout, c.command_timeout
            )));
        }
        if c.retry_min.is_zero() || c.retry_min > c.retry_max || c.retry_max > MAX_TIMEOUT {
            return Err(invalid(format!(
                "retry backoff needs 0 < min <= max <= 1h, got min {:?} and max {:?}",
                c.retry_min, c.retry_max
            )));
        }
        Ok(())
    }

    /// Connects to one Redis node; see [`LockClient::connect`].
    pub async fn connect(self, url: &str) -> Result<LockClient, LockError> {
        let url = &escape_userinfo(url);
        self.check(&redact_url(url))?;
        let backend = if self.config.lazy {
            RedisBackend::connect_lazily(url, &self.config)?
        } else {
            let (_, node) = open_url(url, self.config.tls_root.as_deref())?;
            when_ready(&node, self.config.startup_timeout, || {
                RedisBackend::connect(url, &self.config)
            })
            .await?
        };
        let node = backend.node().to_owned();
        let notifier = Notifier::over(vec![backend.topology().clone()], self.config.command_timeout);
        Ok(self.build(AnyBackend::Redis(backend), notifier, node))
    }

    /// A Redlock client over `urls`; see [`LockClient::redlock`].
    ///
    /// Refused: no URL, an unusable URL, the same master twice (by address,
    /// or two addresses reaching one server), a master in cluster mode, or
    /// fewer than a majority of masters answering now. An even number of
    /// masters, or fewer than 3, is allowed with a warning: it adds no
    /// fault tolerance.
    pub async fn redlock<S: AsRef<str>>(
        self,
        urls: impl IntoIterator<Item = S>,
    ) -> Result<LockClient, LockError> {
        let urls: Vec<String> = urls
            .into_iter()
            .map(|u| escape_userinfo(u.as_ref()).into_owned())
            .collect();
        let name = seeds_name("redlock", &urls);
        let invalid = |reason: String| LockError::InvalidConfig {
            node: name.clone(),
            reason,
        };
        self.check(&name)?;
        if urls.is_empty() {
            return Err(invalid("a Redlock needs at least one master URL".into()));
        }
        if self.config.lazy {
            let nodes = urls
                .iter()
                .map(|url| RedisBackend::connect_lazily(url, &self.config))
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(self.build_redlock(nodes, name));
        }
        let masters = when_ready(&name, self.config.startup_timeout, || {
            redlock_masters(&self.config, &urls, &name)
        })
        .await?;
        let mut nodes = Vec::with_capacity(masters.len());
        for (node, answered) in masters {
            if !answered {
                tracing::warn!(
                    node = node.node(),
                    "Redlock master not reachable; it will be retried on use"
                );
            }
            nodes.push(node);
        }
        if urls.len() < 3 || urls.len().is_multiple_of(2) {
            tracing::warn!(
                masters = urls.len(),
                "a Redlock of fewer than 3, or an even number of, masters tolerates no more failures than the next smaller odd number"
            );
        }
        Ok(self.build_redlock(nodes, name))
    }

    fn build_redlock(self, nodes: Vec<RedisBackend>, name: String) -> LockClient {
        let backend = RedlockBackend::new(nodes, self.config.node_timeout);
        // Every master, each on a connection of its own: see
        // `waiter::open_subscriptions`.
        let notifier = Notifier::over(
            backend.nodes().iter().map(|n| n.topology().clone()).collect(),
            self.config.command_timeout,
        );
        self.build(AnyBackend::Redlock(backend), notifier, name)
    }

    /// A Redis Cluster client; see [`LockClient::cluster`].
    pub async fn cluster<S: AsRef<str>>(
        self,
        urls: impl IntoIterator<Item = S>,
    ) -> Result<LockClient, LockError> {
        let urls: Vec<String> = urls
            .into_iter()
            .map(|u| escape_userinfo(u.as_ref()).into_owned())
            .collect();
        let name = seeds_name("cluster", &urls);
        self.check(&name)?;
        let invalid = |reason: String| LockError::InvalidConfig {
            node: name.clone(),
            reason,
        };
        if urls.is_empty() {
            return Err(invalid("a cluster client needs at least one seed URL".into()));
        }
        let opened = self.open_urls(&urls)?;
        let opened: Vec<(&redis::Client, &str)> = opened.iter().map(|(c, node)| (c, node.as_str())).collect();
        let timeout = self.config.command_timeout;
        let tls_root = self.config.tls_root.clone();
        let seeds: Vec<&str> = urls.iter().map(String::as_str).collect();
        let client = cluster_builder(&urls, timeout, tls_root.as_deref())
            .build()
            .map_err(|e| invalid(redact_error(e, &seeds)))?;
        let (link, lane) = (ClusterLink::new(client.clone()), ClusterLink::new(client));
        let topology = Topology::Cluster {
            urls: urls.clone(),
            timeout,
            tls_root,
        };
        let notifier = Notifier::over(vec![topology.clone()], self.config.command_timeout);
        let backend = RedisBackend::new(link.clone(), lane.clone(), topology, name.clone())
            .with_replica_acks(self.config.replica_acks());
        if !self.config.lazy {
            // Reaches the seeds, learns the slots, then checks the
            // credentials on a node with `PING` (which connects the
            // renewal lane too).
            when_ready(&name, self.config.startup_timeout, || async {
                if let Err(e) = link.connection().await {
                    let failure = startup_failure(&name, e, &seeds);
                    return Err(plain_at_tls_port(&opened, failure, timeout).await);
                }
                backend.verify(&seeds).await?;
                backend.check_access(&self.config.prefix, &seeds).await
            })
            .await?;
        }
        Ok(self.build(AnyBackend::Cluster(backend), notifier, name))
    }

    /// Every URL of a Cluster's seeds or a Sentinel group, opened (nothing
    /// sent), each with its name for messages.
    fn open_urls(&self, urls: &[String]) -> Result<Vec<(redis::Client, String)>, LockError> {
        urls.iter()
            .map(|url| open_url(url, self.config.tls_root.as_deref()))
            .collect()
    }

    /// A client for the master that Sentinel names `master_name`; see
    /// [`LockClient::sentinel`].
    pub async fn sentinel<S: AsRef<str>>(
        self,
        master_name: &str,
        sentinel_urls: impl IntoIterator<Item = S>,
    ) -> Result<LockClient, LockError> {
        let urls: Vec<String> = sentinel_urls
            .into_iter()
            .map(|u| escape_userinfo(u.as_ref()).into_owned())
            .collect();
        let name = format!("{}/{master_name}", seeds_name("sentinel", &urls));
        self.check(&name)?;
        let invalid = |reason: String| LockError::InvalidConfig {
            node: name.clone(),
            reason,
        };
        if urls.is_empty() {
            return Err(invalid(
                "a Sentinel client needs at least one sentinel URL".into(),
            ));
        }
        let opened = self.open_urls(&urls)?;
        let infos: Vec<_> = opened
            .iter()
            .map(|(c, _)| c.get_connection_info().clone())
            .collect();
        let opened: Vec<(&redis::Client, &str)> = opened.iter().map(|(c, node)| (c, node.as_str())).collect();
        let seeds: Vec<&str> = urls.iter().map(String::as_str).collect();
        let tls = urls.iter().any(|url| url.starts_with("rediss://"));
        let sentinel = if tls {
            tls_sentinel_client(&infos, master_name, self.config.tls_root.as_deref())
        } else {
            // The master is reached with the credentials of the first
            // sentinel URL (Sentinel deployments usually share one
            // password). An owned name suits both of `build`'s signatures
            // (with and without the crate's TLS feature).
            let master = SentinelNodeConnectionInfo::default()
                .set_redis_connection_info(infos[0].redis_settings().clone());
            SentinelClient::build(
                infos,
                String::from(master_name),
                Some(master),
                SentinelServerType::Master,
            )
        }
        .map_err(|e| invalid(redact_error(e, &seeds)))?;
        let link = SentinelLink::new(sentinel, self.config.command_timeout);
        let backend = RedisBackend::new(link.clone(), link.clone(), Topology::Sentinel(link), name.clone())
            .with_replica_acks(self.config.replica_acks())
            .one_connection();
        if !self.config.lazy {
            // Asks Sentinel for the master, connects, checks the credentials.
            let readable = when_ready(&name, self.config.startup_timeout, || async {
                let checked = async {
                    backend.verify(&seeds).await?;
                    backend.check_access(&self.config.prefix, &seeds).await
                };
                match checked.await {
                    // A plain sentinel URL to a port that speaks TLS only.
                    Err(failure) => {
                        Err(plain_at_tls_port(&opened, failure, self.config.command_timeout).await)
                    }
                    readable => readable,
                }
            })
            .await?;
            backend.check_eviction_policy(readable).await;
        }
        let notifier = Notifier::over(vec![backend.topology().clone()], self.config.command_timeout);
        Ok(self.build(AnyBackend::Sentinel(backend), notifier, name))
    }

    /// A MySQL / MariaDB client; see [`LockClient::mysql`].
    #[cfg(feature = "mysql")]
    pub async fn mysql(self, url: &str) -> Result<LockClient, LockError> {
        use crate::backend::mysql::MysqlBackend;
        let url = &escape_userinfo(url);
        self.check(&redact_url(url))?;
        let c = &self.config;
        let backend = MysqlBackend::new(url, &c.table, c.command_timeout, c.tls_root.as_deref())?;
        if !self.config.lazy {
            when_ready(backend.node(), self.config.startup_timeout, || backend.verify()).await?;
        }
        let node = backend.node().to_owned();
        Ok(self.build(AnyBackend::Mysql(backend), Notifier::local(), node))
    }

    /// A PostgreSQL client; see [`LockClient::postgres`].
    #[cfg(feature = "postgres")]
    pub async fn postgres(self, url: &str) -> Result<LockClient, LockError> {
        use crate::backend::postgres::PostgresBackend;
        let url = &escape_userinfo(url);
        self.check(&redact_url(url))?;
        let c = &self.config;
        let backend = PostgresBackend::new(
            url,
            &c.table,
            c.pool_size,
            c.command_timeout,
            c.tls_root.as_deref(),
        )?;
        if !c.lazy {
            when_ready(backend.node(), c.startup_timeout, || backend.verify()).await?;
        }
        let notifier = Notifier::local();
        backend.listen(Arc::new(Announcements(Arc::downgrade(&notifier))));
        let node = backend.node().to_owned();
        Ok(self.build(AnyBackend::Postgres(backend), notifier, node))
    }

    /// A ZooKeeper client; see [`LockClient::zookeeper`].
    #[cfg(feature = "zookeeper")]
    pub async fn zookeeper(self, connect: &str) -> Result<LockClient, LockError> {
        use crate::backend::zookeeper::ZooKeeperBackend;
        self.check(connect)?;
        let c = &self.config;
        let backend = ZooKeeperBackend::new(
            connect,
            &c.zookeeper_root,
            c.session_timeout,
            c.command_timeout,
            c.zookeeper_identity.clone(),
            c.zookeeper_readable_by_anyone,
        )?
        .secured(c.tls_root.as_deref(), c.zookeeper_client_certificate.as_ref())?;
        if !c.lazy {
            when_ready(backend.node(), c.startup_timeout, || backend.verify()).await?;
        }
        let node = backend.node().to_owned();
        Ok(self.build(AnyBackend::ZooKeeper(backend), Notifier::local(), node))
    }

    /// An etcd client; see [`LockClient::etcd`].
    #[cfg(feature = "etcd")]
    pub async fn etcd(self, endpoints: &[&str]) -> Result<LockClient, LockError> {
        use crate::backend::etcd::EtcdBackend;
        let node = format!("etcd({})", endpoints.join(", "));
        self.check(&node)?;
        let c = &self.config;
        let backend = EtcdBackend::new(endpoints, &c.etcd_root, c.etcd_lease_ttl, c.command_timeout)?
            .secured(
                c.etcd_user.as_ref(),
                c.etcd_client_certificate.as_ref(),
                c.tls_root.as_deref(),
            )?;
        if !c.lazy {
            when_ready(backend.node(), c.startup_timeout, || backend.verify()).await?;
        }
        let node = backend.node().to_owned();
        Ok(self.build(AnyBackend::Etcd(backend), Notifier::local(), node))
    }

    /// An in-process client with these options; see
    /// [`LockClient::in_memory`].
    pub fn in_memory(self) -> Result<LockClient, LockError> {
        self.check(IN_MEMORY)?;
        Ok(self.build_in_memory())
    }

    fn build_in_memory(self) -> LockClient {
        self.build(
            AnyBackend::Memory(MemoryBackend::default()),
            Notifier::local(),
            IN_MEMORY.into(),
        )
    }

    fn build(self, backend: AnyBackend, notifier: Arc<Notifier>, node: String) -> LockClient {
        self.build_with(backend, notifier, node, Entropy::Os)
    }

    pub(crate) fn build_with(
        self,
        backend: AnyBackend,
        notifier: Arc<Notifier>,
        node: String,
        entropy: Entropy,
    ) -> LockClient {
        // For exporters that show units and help texts: a recorder
        // installed before the first client hears them.
        crate::telemetry::describe();
        LockClient {
            inner: Arc::new(ClientInner::new(backend, self.config, notifier, node, entropy)),
        }
    }
}

/// How a many-node client names itself in messages: `kind(url, url, ...)`,
/// passwords redacted.
fn seeds_name(kind: &str, urls: &[String]) -> String {
    let urls: Vec<String> = urls.iter().map(|u| redact_url(u)).collect();
    format!("{kind}({})", urls.join(", "))
}

/// How an in-process client names its "node" in messages.
const IN_MEMORY: &str = "in-memory";

static GLOBAL: OnceLock<LockClient> = OnceLock::new();

/// Installs the client that `#[distributed_lock]` functions use. Call it once
/// at start-up; a second call fails with [`LockError::AlreadyInitialized`].
pub fn init(client: LockClient) -> Result<(), LockError> {
    GLOBAL.set(client).map_err(|_| LockError::AlreadyInitialized)
}

pub(crate) fn global() -> Result<&'static LockClient, LockError> {
    GLOBAL.get().ok_or(LockError::NotInitialized)
}

/// The PostgreSQL backend's heard releases, passed to the client's waiters.
#[cfg(feature = "postgres")]
struct Announcements(std::sync::Weak<Notifier>);

#[cfg(feature = "postgres")]
impl crate::backend::postgres::Releases for Announcements {
    fn released(&self, channel: &str, holder: &str) {
        let Some(notifier) = self.0.upgrade() else {
            return;
        };
        if holder.starts_with("f:") {
            // A fair lock's release names no one: the line's waiters here
            // look again, and the first in line gets it.
            notifier.wake_line(channel);
        } else {
            notifier.released_by(channel, holder);
        }
    }

    fn missed(&self) {
        if let Some(notifier) = self.0.upgrade() {
            notifier.wake_all();
        }
    }
}

/// One attempt at a Redlock's masters: each connected if it answers (kept
/// to be connected on first use if not), checked to be independent and
/// not clustered. Fewer than a majority answering is worth waiting for at
/// start-up; the rest is the configuration's fault.
async fn redlock_masters(
    config: &ClientConfig,
    urls: &[String],
    name: &str,
) -> Result<Vec<(RedisBackend, bool)>, Failure> {
    let invalid = |reason: String| {
        Failure::permanent(LockError::InvalidConfig {
            node: name.to_owned(),
            reason,
        })
    };
    let mut masters: Vec<(RedisBackend, bool)> = Vec::with_capacity(urls.len());
    for url in urls {
        let (node, answered) = RedisBackend::connect_tolerant(url, config)
            .await
            .map_err(Failure::permanent)?;
        if masters.iter().any(|(n, _)| n.node() == node.node()) {
            return Err(invalid(format!("master `{}` is listed twice", node.node())));
        }
        masters.push((node.one_connection(), answered));
    }
    let mut seen: Vec<(String, &str)> = Vec::new();
    for (node, answered) in &masters {
        let (run_id, clustered) = match node.identity().await {
            Ok(identity) => identity,
            Err(e) => {
                // A master down now is checked by no one; one that answers
                // but may not run INFO (a least-privilege ACL) is said so.
                if *answered {
                    tracing::warn!(
                        node = node.node(),
                        error = %e,
                        "could not check that this Redlock master is a server of its own (INFO failed); list only independent masters"
                    );
                }
                continue;
            }
        };
        if clustered {
            return Err(invalid(format!(
                "master `{}` runs in cluster mode; use `LockClient::cluster` for a Redis Cluster",
                node.node()
            )));
        }
        if let Some((_, other)) = seen.iter().find(|(id, _)| !run_id.is_empty() && *id == run_id) {
            return Err(invalid(format!(
                "`{other}` and `{}` are the same server (run_id {run_id}); Redlock needs independent masters",
                node.node()
            )));
        }
        seen.push((run_id, node.node()));
    }
    let answering = masters.iter().filter(|(_, answered)| *answered).count();
    let quorum = urls.len() / 2 + 1;
    if answering < quorum {
        return Err(Failure {
            error: LockError::backend(
                name,
                None,
                format!(
                    "only {answering} of {} masters answer; a majority ({quorum}) is needed",
                    urls.len()
                ),
            ),
            transient: true,
            reconnecting: false,
        });
    }
    Ok(masters)
}

/// A Sentinel client whose sentinels are reached over TLS (`rediss://`),
/// and so is the master, verified against `tls_root` when given, else
/// the system's roots: a password must not reach the master in clear text
/// when TLS was asked for. The redis crate takes a CA for the masters only
/// through its builder, which gives every sentinel the first URL's user
/// and password (and the master too, as without TLS).
#[cfg(feature = "tls")]
fn tls_sentinel_client(
    infos: &[redis::ConnectionInfo],
    master_name: &str,
    tls_root: Option<&[u8]>,
) -> redis::RedisResult<SentinelClient> {
    let first = infos[0].redis_settings();
    let same = |info: &redis::ConnectionInfo| {
        let settings = info.redis_settings();
        settings.username() == first.username() && settings.password() == first.password()
    };
    if !infos.iter().all(same) {
        return Err(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "over TLS, give every sentinel URL the same user and password",
        )));
    }
    let mut builder = redis::sentinel::SentinelClientBuilder::new(
        infos.iter().map(|info| info.addr().clone()),
        master_name,
        SentinelServerType::Master,
    )?
    .set_client_to_redis_tls_mode(redis::TlsMode::Secure)
    .set_client_to_redis_db(first.db())
    .set_client_to_redis_protocol(first.protocol());
    if let Some(user) = first.username() {
        builder = builder
            .set_client_to_redis_username(user)
            .set_client_to_sentinel_username(user);
    }
    if let Some(password) = first.password() {
        builder = builder
            .set_client_to_redis_password(password)
            .set_client_to_sentinel_password(password);
    }
    if let Some(pem) = tls_root {
        builder = builder.set_client_to_redis_certificates(crate::backend::tls::tls_certificates(pem));
    }
    builder.build()
}

/// Without the `tls` feature a `rediss://` URL is refused before this.
#[cfg(not(feature = "tls"))]
fn tls_sentinel_client(
    _infos: &[redis::ConnectionInfo],
    _master_name: &str,
    _tls_root: Option<&[u8]>,
) -> redis::RedisResult<SentinelClient> {
    Err(redis::RedisError::from((
        redis::ErrorKind::InvalidClientConfig,
        "`rediss://` needs TLS support: enable lock-runtime's `tls` feature",
    )))
}
