//! Locks in Redis: the scripts and their replies, over one node's
//! connection or a cluster's.
//!
//! Two connections per node, not a pool, on purpose: every command of one
//! acquisition and its compensating release travel in order on the first, so
//! a release can never overtake the acquire it undoes; the renewals travel
//! on the second (the renewal lane), so that they never wait behind
//! acquisitions (#57).

use std::future::Future;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};
use redis::{Cmd, ErrorKind, RedisError, RedisResult, Script, ServerErrorKind, Value};

use self::call::ScriptCall;
use self::cluster::ClusterLink;
use self::sentinel::SentinelLink;
use super::contract::{
    AcquireReply, AcquireRequest, Backend, Failure, HandOver, LeaderRecord, RenewItem, Renewal,
    recorded_value,
};
use super::lane::on_renewal_thread;
use super::startup::tls_refused;
use super::tls;
use crate::config::{ClientConfig, ReplicaAcks};
use crate::error::LockError;
use crate::key::LockKey;
use crate::redact::{redact_secrets, redact_url, unparsed_hint};
use crate::spec::Kind;
use crate::timing::{WRITER_CLAIM, millis, millis_up};

/// A script from `scripts/`, with the prelude every script shares in front.
macro_rules! script {
    ($file:literal) => {
        ::std::sync::LazyLock::new(|| {
            ::redis::Script::new(concat!(
                include_str!("scripts/prelude.lua"),
                include_str!(concat!("scripts/", $file))
            ))
        })
    };
}

pub(crate) mod admin;
mod call;
pub(crate) mod cluster;
mod coalesce;
pub(crate) mod redlock;
pub(crate) mod sentinel;

use coalesce::{Coalescer, Op};

/// The bytes of the uncontended `SET`'s words besides its key and holder:
/// `SET`, `NX`, `PX` and the lease in milliseconds (at most 20 digits).
const SET_WORDS: usize = 3 + 2 + 2 + 20;

static ACQUIRE: LazyLock<Script> = script!("acquire.lua");
static ACQUIRE_SHARED: LazyLock<Script> = script!("acquire_shared.lua");
static ACQUIRE_SEGMENT: LazyLock<Script> = script!("acquire_segment.lua");
static ACQUIRE_MANY: LazyLock<Script> = script!("acquire_many.lua");
static ACQUIRE_FAIR: LazyLock<Script> = script!("acquire_fair.lua");
static RELEASE_MANY: LazyLock<Script> = script!("release_many.lua");
static RELEASE: LazyLock<Script> = script!("release.lua");
static RELEASE_SEGMENTS: LazyLock<Script> = script!("release_segments.lua");
static RENEW_MANY: LazyLock<Script> = script!("renew_many.lua");
static HAND_OVER: LazyLock<Script> = script!("hand_over.lua");
static KEEP: LazyLock<Script> = script!("keep.lua");
static PROCLAIM: LazyLock<Script> = script!("proclaim.lua");
static LEADER: LazyLock<Script> = script!("leader.lua");
/// Without the prelude: it reads no lock.
static ACCESS: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("scripts/access.lua")));

/// Every command a lock call sends or its scripts run, on every topology:
/// its ACL name, and its words for `access.lua` (`k` a key under the lock
/// prefix, `c` a channel), as many as the command takes (fewer crash a
/// Redis 7.0 asked about them). The least-privilege ACL in
/// docs/backends.md grants exactly these, with [`ONE_NODE_COMMANDS`] or
/// [`CLUSTER_COMMANDS`]; a script that starts to run a new command adds it
/// here, and `check_access` then asks the ACL for it.
const COMMANDS: [(&str, &str); 21] = [
    ("ping", "PING"),
    ("evalsha", "EVALSHA 0 1 k"),
    ("script|load", "SCRIPT LOAD return"),
    ("set", "SET k v"),
    ("get", "GET k"),
    ("mget", "MGET k"),
    ("exists", "EXISTS k"),
    ("type", "TYPE k"),
    ("pttl", "PTTL k"),
    ("pexpire", "PEXPIRE k 1"),
    ("append", "APPEND k v"),
    ("incr", "INCR k"),
    ("del", "DEL k"),
    ("time", "TIME"),
    ("zadd", "ZADD k 1 m"),
    ("zcard", "ZCARD k"),
    ("zrange", "ZRANGE k 0 0"),
    ("zrangebyscore", "ZRANGEBYSCORE k 0 0"),
    ("zscore", "ZSCORE k m"),
    ("zrem", "ZREM k m"),
    ("zremrangebyscore", "ZREMRANGEBYSCORE k 0 0"),
];

/// Release notices on one node (or a Sentinel's master).
const ONE_NODE_COMMANDS: [(&str, &str); 3] = [
    ("publish", "PUBLISH c m"),
    ("subscribe", "SUBSCRIBE c"),
    ("unsubscribe", "UNSUBSCRIBE c"),
];

/// Commands the client does without when refused: the eviction-policy
/// check's (which then warns that it could not verify the policy, rather
/// than leave a refusal in the server's ACL log at every start).
const OPTIONAL_COMMANDS: [(&str, &str); 1] = [("config|get", "CONFIG GET maxmemory-policy")];

/// How the redis crate confirms the master a Sentinel named: `ROLE`, or
/// `INFO replication` where `ROLE` is refused. Either is enough.
const SENTINEL_MASTER_CHECKS: [(&str, &str); 2] = [("role", "ROLE"), ("info", "INFO REPLICATION")];

/// Release notices on a cluster go to the slot's shard; the client learns
/// the slots and follows a slot being migrated.
const CLUSTER_COMMANDS: [(&str, &str); 5] = [
    ("spublish", "SPUBLISH c m"),
    ("ssubscribe", "SSUBSCRIBE c"),
    ("sunsubscribe", "SUNSUBSCRIBE c"),
    ("cluster|slots", "CLUSTER SLOTS"),
    ("asking", "ASKING"),
];

/// What a connection to Redis must offer: the redis crate's async
/// connection, cheap to clone (clones share the connection), that can wait
/// for the replicas of the master that holds a key.
pub(crate) trait Connection: ConnectionLike + Clone + Send + Sync + 'static {
    /// `WAIT replicas timeout` on the connection that wrote `redis_key`:
    /// how many replicas acknowledged this connection's writes so far. A
    /// connection to one master sends it as it is.
    fn wait_for_replicas(
        &self,
        redis_key: &str,
        acks: ReplicaAcks,
    ) -> impl Future<Output = RedisResult<i64>> + Send {
        let _ = redis_key;
        let mut conn = self.clone();
        async move { wait_command(acks).query_async(&mut conn).await }
    }
}

/// An exclusive lock's holder id (`<32 hex digits>:<n>`); every other kind's
/// carries a letter and `:` in front (`holder.rs`).
fn is_exclusive_holder(holder: &str) -> bool {
    holder.as_bytes().get(1) != Some(&b':')
}

fn wait_command(acks: ReplicaAcks) -> redis::Cmd {
    let mut cmd = redis::cmd("WAIT");
    cmd.arg(acks.replicas).arg(millis(acks.timeout));
    cmd
}

impl Connection for ConnectionManager {}

impl Connection for SentinelLink {}

impl Connection for ClusterLink {
    /// Left to itself, the cluster client sends `WAIT` to every master; the
    /// write to wait for is on the master of the key's slot.
    async fn wait_for_replicas(&self, redis_key: &str, acks: ReplicaAcks) -> RedisResult<i64> {
        let route = Route::with_slot(Slot::for_key(redis_key), SlotAddr::Master);
        let reply = self
            .connection()
            .await?
            .route_command(
                wait_command(acks),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
            )
            .await?;
        Ok(redis::from_redis_value(reply)?)
    }
}

/// How releases are announced, and where their subscriptions connect.
#[derive(Clone)]
pub(crate) enum Topology {
    /// One node: PUBLISH, heard on a pub/sub connection to that node.
    Single(redis::Client),
    /// A cluster: SPUBLISH to the shard that owns the lock's slot, heard by
    /// SSUBSCRIBE through a RESP3 cluster client of its own (built from
    /// these seed URLs), which follows slots as they move.
    Cluster {
        urls: Vec<String>,
        timeout: Duration,
        tls_root: Option<std::sync::Arc<[u8]>>,
    },
    /// A master found through Sentinel: PUBLISH, heard on a pub/sub
    /// connection to whichever node is master when it connects.
    Sentinel(SentinelLink),
}

/// Says which kind only: the client and the seed URLs carry credentials.
impl std::fmt::Debug for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Topology::Single(_) => "Single",
            Topology::Cluster { .. } => "Cluster",
            Topology::Sentinel(_) => "Sentinel",
        })
    }
}

pub(crate) struct RedisBackend<C = ConnectionManager> {
    /// Acquisitions and releases: the undo of an attempt whose reply was
    /// lost travels after the attempt it undoes.
    conn: C,
    /// The renewal lane: renewals, and the `keep` of a `hold_at_least`
    /// release (so that a renewal sent before it cannot land after it).
    /// The same connection on a Redlock's master and a Sentinel's
    /// (`one_connection`). On `conn` a renewal queued behind every acquisition
    /// pipelined before it, and a burst of acquisitions made held leases
    /// miss their deadlines (100,000 tasks taking locks lost leases that
    /// were held on a healthy server). Nothing sent here can overtake what
    /// it depends on: a lease is renewed or kept only after its
    /// acquisition's reply came back.
    lane: C,
    /// Exclusive releases, coalesced while calls are out. None on a
    /// cluster, whose keys of one call would have to share a slot.
    coalescer: Option<Arc<Coalescer<C>>>,
    topology: Topology,
    node: String,
    /// `WAIT` for replicas after every acquire and renewal.
    acks: Option<ReplicaAcks>,
}

impl<C> std::fmt::Debug for RedisBackend<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl<C: Connection> RedisBackend<C> {
    /// `conn` for acquisitions and releases, `lane` a second connection to
    /// the same server for renewals.
    pub(crate) fn new(conn: C, lane: C, topology: Topology, node: String) -> Self {
        let coalescer = match topology {
            Topology::Single(_) | Topology::Sentinel(_) => Some(Coalescer::new(conn.clone())),
            Topology::Cluster { .. } => None,
        };
        RedisBackend {
            conn,
            lane,
            coalescer,
            topology,
            node,
            acks: None,
        }
    }

    /// Everything on the one connection, the renewal lane included. For a
    /// Redlock's master: a grant counts once a majority answered, and a
    /// slower master may still be about to apply the acquisition, so a
    /// held lease's renewal or `keep` must travel behind it there. For a
    /// Sentinel's master: two connections could follow a failover at
    /// different times, and renew on the old master.
    pub(crate) fn one_connection(mut self) -> Self {
        self.lane = self.conn.clone();
        self
    }

    /// `WAIT` for `acks` after every acquire and renewal.
    pub(crate) fn with_replica_acks(mut self, acks: Option<ReplicaAcks>) -> Self {
        self.acks = acks;
        self
    }

    pub(crate) fn node(&self) -> &str {
        &self.node
    }

    pub(crate) fn topology(&self) -> &Topology {
        &self.topology
    }
}

impl RedisBackend {
    /// Connects, authenticates and checks that the node answers `PING`, so
    /// that a wrong password or an unreachable server fails here, not at the
    /// first lock.
    /// One attempt: the caller waits for a server still starting
    /// (`startup::when_ready`), which the failure's `transient` tells.
    pub(crate) async fn connect(url: &str, config: &ClientConfig) -> Result<Self, Failure> {
        let (client, node) = open_url(url, config.tls_root.as_deref()).map_err(Failure::permanent)?;
        let conn = match ConnectionManager::new_with_config(client.clone(), manager_config(config)).await {
            Ok(conn) => conn,
            Err(e) => {
                let failure = startup_failure(&node, e, &[url]);
                let seed = [(&client, node.as_str())];
                return Err(plain_at_tls_port(&seed, failure, config.command_timeout).await);
            }
        };
        // Connected on the renewal thread, where its replies are read.
        let lane = on_renewal_thread(ConnectionManager::new_with_config(
            client.clone(),
            manager_config(config),
        ))
        .await
        .map_err(|e| startup_failure(&node, e, &[url]))?;
        let backend = RedisBackend::new(conn, lane, Topology::Single(client.clone()), node)
            .with_replica_acks(config.replica_acks());
        backend.verify(&[url]).await?;
        let readable = backend.check_access(&config.prefix, &[url]).await?;
        backend.check_eviction_policy(readable).await;
        Ok(backend)
    }

    /// A node connected on first use: nothing is sent now, and only an
    /// unusable URL is an error.
    pub(crate) fn connect_lazily(url: &str, config: &ClientConfig) -> Result<Self, LockError> {
        let (client, node) = open_url(url, config.tls_root.as_deref())?;
        let connect = || {
            ConnectionManager::new_lazy_with_config(client.clone(), manager_config(config))
                .map_err(|e| connect_error(&node, e, &[url]))
        };
        let (conn, lane) = (connect()?, connect()?);
        Ok(
            RedisBackend::new(conn, lane, Topology::Single(client.clone()), node)
                .with_replica_acks(config.replica_acks()),
        )
    }

    /// Like [`connect`](Self::connect), but a node that does not answer now
    /// is kept, to be connected on first use: a Redlock must start with a
    /// minority of its masters down. The second value says whether it
    /// answered. An unusable URL is still an error.
    pub(crate) async fn connect_tolerant(
        url: &str,
        config: &ClientConfig,
    ) -> Result<(Self, bool), LockError> {
        match Self::connect(url, config).await {
            Ok(backend) => Ok((backend, true)),
            // Down, unreachable or still starting: kept for later. A wrong
            // password is not tolerated: waiting cannot mend it.
            Err(f) if f.transient => Ok((Self::connect_lazily(url, config)?, false)),
            Err(f) => Err(f.error),
        }
    }

    /// The server's `run_id` and whether it runs in cluster mode: what a
    /// Redlock needs to know that its masters are independent.
    pub(crate) async fn identity(&self) -> Result<(String, bool), LockError> {
        let info: String = redis::cmd("INFO")
            .arg("server")
            .arg("cluster")
            .query_async(&mut self.conn.clone())
            .await
            .map_err(|e| LockError::backend(&self.node, None, e))?;
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(|v| v.trim().to_owned())
        };
        let run_id = field("run_id").unwrap_or_default();
        Ok((run_id, field("cluster_enabled").as_deref() == Some("1")))
    }
}

impl<C: Connection> RedisBackend<C> {
    /// Lock keys always carry a TTL, so every eviction policy but
    /// `noeviction` (the `volatile-*` ones first) may delete a held lock under
    /// memory pressure, and a second holder then gets in. That is a deployment
    /// choice the library cannot undo, so it says so once, at connect.
    /// `readable`: whether the ACL lets the user read it
    /// ([`check_access`](Self::check_access)).
    pub(crate) async fn check_eviction_policy(&self, readable: bool) {
        if !readable {
            tracing::warn!(
                node = %self.node,
                "could not verify the eviction policy (CONFIG GET is refused by the ACL, or renamed away); lock servers need `maxmemory-policy noeviction`"
            );
            return;
        }
        let reply: Result<Vec<String>, RedisError> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("maxmemory-policy")
            .query_async(&mut self.conn.clone())
            .await;
        match reply.as_deref() {
            Ok([_, policy]) if policy != "noeviction" => tracing::warn!(
                node = %self.node,
                policy = %policy,
                "maxmemory-policy `{policy}` can evict held locks under memory pressure, letting a second holder in; set `maxmemory-policy noeviction` on lock servers"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(
                node = %self.node,
                error = %e,
                "could not verify the eviction policy (CONFIG GET refused); lock servers need `maxmemory-policy noeviction`"
            ),
        }
    }

    /// `PING`: the first command that needs the connection's credentials
    /// (and the first a loading server refuses).
    /// Both connections: on a Sentinel's master or a cluster, this is what
    /// connects them, the renewal lane on the renewal thread.
    pub(crate) async fn verify(&self, urls: &[&str]) -> Result<(), Failure> {
        let ping = |mut conn: C| async move { redis::cmd("PING").query_async::<Value>(&mut conn).await };
        ping(self.conn.clone())
            .await
            .map_err(|e| startup_failure(&self.node, e, urls))?;
        on_renewal_thread(ping(self.lane.clone()))
            .await
            .map_err(|e| startup_failure(&self.node, e, urls))?;
        Ok(())
    }

    /// Asks the server's ACL whether the client's user may run every
    /// command a lock call sends, on keys and channels under `prefix`
    /// (`access.lua`; nothing is written). A missing grant is
    /// `InvalidConfig` at start-up, naming what to grant, rather than a
    /// refusal at the first contended lock in production, or, for
    /// SUBSCRIBE, waiters silently slowed to polling. A server too old to
    /// be asked (before 7.0) passes. Says whether the user may read the
    /// eviction policy ([`OPTIONAL_COMMANDS`]).
    pub(crate) async fn check_access(&self, prefix: &str, urls: &[&str]) -> Result<bool, Failure> {
        let key = format!("{prefix}{{%access-check}}");
        let channel = format!("{key}:released");
        let commands = self.commands();
        let mut call = ScriptCall::new(&ACCESS, 2, 2 + commands.len());
        call.arg(&key).arg(&channel);
        for (_, words) in commands.iter().chain(&OPTIONAL_COMMANDS) {
            call.arg(*words);
        }
        let user = urls
            .first()
            .map_or_else(|| "default".to_owned(), |url| user_of(url));
        let refusal = |missing: String, grant: String| {
            Failure::permanent(LockError::InvalidConfig {
                node: self.node.clone(),
                reason: format!(
                    "the server's ACL refuses user `{user}` what a lock needs: {missing}; grant it with `ACL SETUSER {user} {grant}` (docs/backends.md gives the least a lock client needs)"
                ),
            })
        };
        let reply: Option<Vec<String>> = match call.invoke(&mut self.conn.clone()).await {
            Ok(reply) => reply,
            // The check itself is refused: the server's words name what
            // (the command, or the keys under the prefix).
            Err(e) if e.code() == Some("NOPERM") => {
                return Err(refusal(
                    redact_error(e, urls),
                    format!("+evalsha +script|load ~{prefix}*"),
                ));
            }
            Err(e) => return Err(startup_failure(&self.node, e, urls)),
        };
        let (optional, mut refused): (Vec<String>, Vec<String>) = reply
            .unwrap_or_default()
            .into_iter()
            .partition(|words| OPTIONAL_COMMANDS.iter().any(|(_, w)| w == words));
        // One way to confirm a Sentinel's master is enough; refused both,
        // the first is named.
        let confirms = |words: &String| SENTINEL_MASTER_CHECKS.iter().any(|(_, w)| w == words);
        if refused.iter().filter(|words| confirms(words)).count() < SENTINEL_MASTER_CHECKS.len() {
            refused.retain(|words| !confirms(words));
        } else {
            refused.retain(|words| words != SENTINEL_MASTER_CHECKS[1].1);
        }
        if refused.is_empty() {
            return Ok(optional.is_empty());
        }
        let names: Vec<&str> = refused
            .iter()
            .filter_map(|words| commands.iter().find(|(_, w)| w == words).map(|(name, _)| *name))
            .collect();
        let listed = names
            .iter()
            .map(|name| format!("`{name}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let mut grant: Vec<String> = names.iter().map(|name| format!("+{name}")).collect();
        // The script's keys were let through, its channel was not asked
        // about: a refused notice may be the channel's.
        let notices = refused
            .iter()
            .any(|words| words.split(' ').any(|word| word == "c"));
        if notices {
            grant.push(format!("&{prefix}*"));
        }
        let on = if notices {
            format!(" (on channels under `{prefix}`, the command or the channel is not granted)")
        } else {
            String::new()
        };
        Err(refusal(
            format!("it may not run {listed}{on} (or the server renamed them away)"),
            grant.join(" "),
        ))
    }

    /// The commands `check_access` asks about: [`COMMANDS`], and those of
    /// this topology and configuration.
    fn commands(&self) -> Vec<(&'static str, &'static str)> {
        let mut commands = COMMANDS.to_vec();
        match self.topology {
            Topology::Single(_) => commands.extend(ONE_NODE_COMMANDS),
            Topology::Sentinel(_) => {
                commands.extend(ONE_NODE_COMMANDS);
                commands.extend(SENTINEL_MASTER_CHECKS);
            }
            Topology::Cluster { .. } => commands.extend(CLUSTER_COMMANDS),
        }
        if self.acks.is_some() {
            commands.push(("wait", "WAIT 0 0"));
        }
        commands
    }

    fn failure(&self, key: &LockKey, e: RedisError) -> Failure {
        let transient = transient(&e);
        let reconnecting = e.is_unrecoverable_error() && !e.is_timeout();
        Failure {
            error: LockError::backend(&self.node, Some(&key.name), e),
            transient,
            reconnecting,
        }
    }

    fn unexpected(&self, key: &LockKey, what: &str, reply: &Value) -> Failure {
        Failure::permanent(LockError::backend(
            &self.node,
            Some(&key.name),
            format!("unexpected reply to {what}: {reply:?}"),
        ))
    }
}

impl<C: Connection> Backend for RedisBackend<C> {
    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<AcquireReply, Failure> {
        // Every kind but a lone exclusive lock, and the wait for replicas,
        // is boxed: held inline, the largest of their futures set the size
        // of every acquisition's (2.4 KB against 3.2 KB with them), which
        // is copied and allocated on each call.
        let acquired = match req.kind {
            Kind::Exclusive if !req.also.is_empty() => Box::pin(self.acquire_set(req)).await?,
            Kind::Exclusive => self.acquire_exclusive(req).await?,
            Kind::Read | Kind::Write => Box::pin(self.acquire_shared(req, 0)).await?,
            Kind::Permits(n) => Box::pin(self.acquire_shared(req, n)).await?,
            Kind::Segments(n) => Box::pin(self.acquire_segment(req, n)).await?,
            Kind::Fair => Box::pin(self.acquire_fair(req)).await?,
        };
        match acquired {
            AcquireReply::Acquired { segment, .. } => match self.acks {
                None => Ok(acquired),
                Some(acks) => Box::pin(self.replicated(req, segment, acks, acquired)).await,
            },
            held @ AcquireReply::Held { .. } => Ok(held),
        }
    }

    async fn release_many(&self, keys: &[LockKey], holder: &str) -> Result<bool, Failure> {
        let Some(first) = keys.first() else {
            return Ok(false);
        };
        let mut invocation = RELEASE_MANY.prepare_invoke();
        for key in keys {
            invocation.key(&key.redis_key);
        }
        for key in keys {
            invocation.key(&key.channel);
        }
        let released: i64 = invocation
            .arg(holder)
            .arg(self.announce())
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| self.failure(first, e))?;
        Ok(released > 0)
    }

    async fn release_segments(&self, key: &LockKey, count: u32, holder: &str) -> Result<bool, Failure> {
        let mut invocation = RELEASE_SEGMENTS.prepare_invoke();
        for segment in key.segment_keys(count) {
            invocation.key(segment);
        }
        let released: i64 = invocation
            .key(&key.channel)
            .arg(holder)
            .arg(self.announce())
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| self.failure(key, e))?;
        Ok(released > 0)
    }

    /// On the acquisitions' connection, held leases' releases included:
    /// the undo of an attempt travels after it, and on the renewal lane,
    /// read on the renewal thread, every release's reply cost its caller a
    /// wake-up from another thread (W2, 64 tasks on their own keys:
    /// 0.83–0.87× the floor there against 0.98–0.99× here).
    async fn release(&self, key: &LockKey, holder: &str) -> Result<bool, Failure> {
        // Every exclusive release is `release_one.lua` alone, or
        // `coalesced.lua` with others;
        // `release.lua` is for the kinds with lines and sorted sets.
        if is_exclusive_holder(holder) {
            let op = Op {
                key: &key.redis_key,
                channel: &key.channel,
                holder,
            };
            let released = match &self.coalescer {
                Some(coalescer) => coalescer.run(op).await,
                None => coalesce::send_alone(&mut self.conn.clone(), op, self.announce()).await,
            }
            .map_err(|e| self.failure(key, e))?;
            return Ok(released == 1);
        }
        let mut invocation = RELEASE.key(&key.redis_key);
        invocation.key(&key.channel);
        if holder.starts_with("f:") {
            invocation.key(key.line_key()).key(key.alive_key());
        }
        let released: i64 = invocation
            .arg(holder)
            .arg(self.announce())
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| self.failure(key, e))?;
        Ok(released == 1)
    }

    async fn renew(&self, key: &LockKey, holder: &str, ttl: Duration) -> Result<bool, Failure> {
        // The watchdog's batch script, with one lease.
        let renewed: Vec<i64> = ScriptCall::new(&RENEW_MANY, 1, 2)
            .arg(&key.redis_key)
            .arg(holder)
            .arg(millis(ttl))
            .invoke(&mut self.lane.clone())
            .await
            .map_err(|e| self.failure(key, e))?;
        let renewed = renewed == [1];
        if renewed && let Some(acks) = self.acks {
            let acked = self
                .lane
                .wait_for_replicas(&key.redis_key, acks)
                .await
                .map_err(|e| self.failure(key, e))?;
            if acked < i64::from(acks.replicas) {
                // Unconfirmed, like a renewal that got no reply: the caller
                // may retry until the lease's deadline.
                return Err(Failure {
                    error: self.not_replicated(key, acked, acks),
                    transient: true,
                    reconnecting: false,
                });
            }
        }
        Ok(renewed)
    }

    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Result<Vec<Renewal>, Failure> {
        if let Topology::Cluster { .. } = self.topology {
            return self.renew_per_slot(items).await;
        }
        self.renew_batch(items).await
    }
}

impl<C: Connection> RedisBackend<C> {
    pub(crate) fn hands_over(&self) -> bool {
        self.acks.is_none()
    }

    pub(crate) async fn hand_over(
        &self,
        key: &LockKey,
        from: &str,
        to: &str,
        ttl: Duration,
        fencing: bool,
    ) -> Result<HandOver, Failure> {
        let reply: Value = ScriptCall::new(&HAND_OVER, 2, 6)
            .arg(&key.redis_key)
            .arg(key.fence_key())
            .arg(from)
            .arg(to)
            .arg(millis(ttl))
            .arg(if fencing { "1" } else { "0" })
            .invoke(&mut self.conn.clone())
            .await
            .map_err(|e| self.failure(key, e))?;
        match reply.as_sequence() {
            Some([Value::Int(1), Value::Int(token)]) => Ok(HandOver::Handed {
                token: fencing.then(|| u64::try_from(*token).unwrap_or(0)),
            }),
            Some([Value::Int(0), _]) => Ok(HandOver::NotHeld),
            _ => Err(self.unexpected(key, "hand_over.lua", &reply)),
        }
    }
}

impl<C: Connection> RedisBackend<C> {
    /// Sets the exclusive lock's lease to end `left` from now if `holder`
    /// still has it (`AnyBackend::keep`). Not waited on by replicas: a
    /// replica promoted without it has the longer lease, which keeps the
    /// lock held longer, never shorter.
    pub(crate) async fn keep(&self, key: &LockKey, holder: &str, left: Duration) -> Result<bool, Failure> {
        let kept: i64 = ScriptCall::new(&KEEP, 1, 3)
            .arg(&key.redis_key)
            .arg(holder)
            .arg(millis_up(left))
            .invoke(&mut self.lane.clone())
            .await
            .map_err(|e| self.failure(key, e))?;
        Ok(kept == 1)
    }

    /// Writes the election record of `key`'s leader `holder`
    /// (`AnyBackend::proclaim`). `Ok(false)`: it no longer leads.
    pub(crate) async fn proclaim(&self, key: &LockKey, holder: &str, value: &str) -> Result<bool, Failure> {
        let written: i64 = ScriptCall::new(&PROCLAIM, 2, 4)
            .arg(&key.redis_key)
            .arg(key.record_key())
            .arg(holder)
            .arg(value)
            .invoke(&mut self.conn.clone())
            .await
            .map_err(|e| self.failure(key, e))?;
        Ok(written == 1)
    }

    /// Who leads the election `key` (`AnyBackend::leader`).
    pub(crate) async fn leader(&self, key: &LockKey) -> Result<Option<LeaderRecord>, Failure> {
        let reply: Vec<Value> = ScriptCall::new(&LEADER, 3, 3)
            .arg(&key.redis_key)
            .arg(key.fence_key())
            .arg(key.record_key())
            .invoke(&mut self.conn.clone())
            .await
            .map_err(|e| self.failure(key, e))?;
        if reply.is_empty() {
            return Ok(None);
        }
        let text = |i: usize| {
            reply
                .get(i)
                .and_then(|v| redis::from_redis_value_ref::<String>(v).ok())
        };
        let unexpected = || {
            Failure::permanent(LockError::backend(
                &self.node,
                Some(&key.name),
                // Its shape only: the record holds the leader's value.
                format!("unexpected reply to an election's read ({} items)", reply.len()),
            ))
        };
        let holder = text(0).ok_or_else(unexpected)?;
        let epoch = text(1).and_then(|e| e.parse().ok()).ok_or_else(unexpected)?;
        let value = text(2).and_then(|record| recorded_value(&record, &holder));
        let left = match reply.get(3) {
            Some(Value::Int(ms)) => u64::try_from(*ms).ok().map(Duration::from_millis),
            _ => None,
        };
        Ok(Some(LeaderRecord {
            holder,
            epoch,
            value,
            left,
        }))
    }

    /// `release.lua` announces with PUBLISH on one node, SPUBLISH (to the
    /// shard that owns the lock's slot) on a cluster.
    fn announce(&self) -> &'static str {
        match self.topology {
            Topology::Single(_) | Topology::Sentinel(_) => "publish",
            Topology::Cluster { .. } => "spublish",
        }
    }

    async fn acquire_exclusive(&self, req: &AcquireRequest<'_>) -> Result<AcquireReply, Failure> {
        let key = req.key;
        // Uncontended fast path: a native SET NX PX costs the server a
        // fraction of a script call. A refusal (held, foreign, or ours from an
        // unanswered earlier attempt) falls through to the script, which tells
        // those apart.
        if req.first && !req.fencing {
            // `OK` or nil, read as a `Value`: as a `String` it would be
            // allocated on every acquisition to be compared and dropped.
            // The command's buffers are sized up front: grown argument by
            // argument (`redis::cmd`) they were reallocated four times, and
            // with 64 tasks on their own keys (W2) that cost 1.2 µs of the
            // client's 11.7 per pair (10 alternated runs, 2026-11-27).
            let set: Value = Cmd::with_capacity(6, SET_WORDS + key.redis_key.len() + req.holder.len())
                .arg("SET")
                .arg(&key.redis_key)
                .arg(req.holder)
                .arg("NX")
                .arg("PX")
                .arg(millis(req.ttl))
                .query_async(&mut self.conn.clone())
                .await
                .map_err(|e| self.failure(key, e))?;
            match set {
                Value::Okay => return Ok(AcquireReply::acquired(None)),
                Value::SimpleString(ok) if ok == "OK" => return Ok(AcquireReply::acquired(None)),
                Value::Nil => {}
                other => return Err(self.unexpected(key, "SET NX PX", &other)),
            }
        }
        let mut call = ScriptCall::new(&ACQUIRE, 2, 6);
        call.arg(&key.redis_key).arg(key.fence_key());
        let reply: Value = attempt_args(&mut call, req)
            .invoke(&mut self.conn.clone())
            .await
            .map_err(|e| self.failure(key, e))?;
        match reply.as_sequence() {
            Some([Value::Int(1), Value::Int(token)]) => {
                Ok(AcquireReply::acquired(fencing_token(req, *token)))
            }
            Some([Value::Int(0), Value::Int(pttl)]) => Ok(held(*pttl, false, 0)),
            Some([Value::Int(-1), found]) => Err(self.conflict(key, found)),
            _ => Err(self.unexpected(key, "acquire", &reply)),
        }
    }

    /// A fair lock: free and first in line, or wait in line.
    async fn acquire_fair(&self, req: &AcquireRequest<'_>) -> Result<AcquireReply, Failure> {
        let key = req.key;
        let mut call = ScriptCall::new(&ACQUIRE_FAIR, 4, 9);
        call.arg(&key.redis_key)
            .arg(key.fence_key())
            .arg(key.line_key())
            .arg(key.alive_key());
        let reply: Value = attempt_args(&mut call, req)
            .arg(millis(req.waiter_timeout))
            .invoke(&mut self.conn.clone())
            .await
            .map_err(|e| self.failure(key, e))?;
        match reply.as_sequence() {
            Some([Value::Int(1), Value::Int(token)]) => {
                Ok(AcquireReply::acquired(fencing_token(req, *token)))
            }
            Some([Value::Int(0), Value::Int(pttl), Value::Int(queued)]) => Ok(held(*pttl, *queued == 1, 0)),
            Some([Value::Int(-1), found]) => Err(self.conflict(key, found)),
            _ => Err(self.unexpected(key, "fair acquire", &reply)),
        }
    }

    /// Every lock of a set at once, or none.
    async fn acquire_set(&self, req: &AcquireRequest<'_>) -> Result<AcquireReply, Failure> {
        let key = req.key;
        let mut call = ScriptCall::new(&ACQUIRE_MANY, 1 + req.also.len(), 5 + req.also.len());
        call.arg(&key.redis_key);
        for other in req.also {
            call.arg(&other.redis_key);
        }
        let reply: Value = attempt_args(&mut call, req)
            .invoke(&mut self.conn.clone())
            .await
            .map_err(|e| self.failure(key, e))?;
        let in_set = |index: &i64| usize::try_from(*index).ok().filter(|&i| i <= req.also.len());
        match reply.as_sequence() {
            Some([Value::Int(1), Value::Int(_)]) => Ok(AcquireReply::acquired(None)),
            Some([Value::Int(0), Value::Int(pttl), Value::Int(index)]) if in_set(index).is_some() => {
                Ok(held(*pttl, false, in_set(index).unwrap_or(0)))
            }
            Some([Value::Int(-1), found, Value::Int(index)]) => {
                let conflicting = match in_set(index) {
                    Some(i) if i > 0 => &req.also[i - 1],
                    _ => key,
                };
                Err(self.conflict(conflicting, found))
            }
            _ => Err(self.unexpected(key, "set acquire", &reply)),
        }
    }

    /// A side of a read-write lock (`permits` 0) or a permit of a semaphore.
    async fn acquire_shared(&self, req: &AcquireRequest<'_>, permits: u32) -> Result<AcquireReply, Failure> {
        let key = req.key;
        let mut call = ScriptCall::new(&ACQUIRE_SHARED, 2, 8);
        call.arg(&key.redis_key).arg(key.fence_key());
        let reply: Value = attempt_args(&mut call, req)
            .arg(permits)
            .arg(millis(WRITER_CLAIM))
            .invoke(&mut self.conn.clone())
            .await
            .map_err(|e| self.failure(key, e))?;
        match reply.as_sequence() {
            Some([Value::Int(1), Value::Int(token)]) => {
                Ok(AcquireReply::acquired(fencing_token(req, *token)))
            }
            Some([Value::Int(0), Value::Int(pttl), Value::Int(claimed)]) => Ok(held(*pttl, *claimed == 1, 0)),
            Some([Value::Int(-1), found]) => Err(self.conflict(key, found)),
            _ => Err(self.unexpected(key, "acquire", &reply)),
        }
    }

    /// Any free one of `count` segments, all tried by one script.
    async fn acquire_segment(&self, req: &AcquireRequest<'_>, count: u32) -> Result<AcquireReply, Failure> {
        let key = req.key;
        let keys = count as usize * if req.fencing { 2 } else { 1 };
        let mut call = ScriptCall::new(&ACQUIRE_SEGMENT, keys, keys + 5);
        for segment in key.segment_keys(count) {
            call.arg(segment);
        }
        if req.fencing {
            for segment in key.segment_keys(count) {
                call.arg(format!("{segment}:fence"));
            }
        }
        let reply: Value = attempt_args(&mut call, req)
            .arg(count)
            .invoke(&mut self.conn.clone())
            .await
            .map_err(|e| self.failure(key, e))?;
        match reply.as_sequence() {
            Some([Value::Int(1), Value::Int(index), Value::Int(token)]) => match u32::try_from(*index) {
                Ok(segment) if segment < count => Ok(AcquireReply::Acquired {
                    token: fencing_token(req, *token),
                    segment: Some(segment),
                }),
                _ => Err(self.unexpected(key, "segment acquire", &reply)),
            },
            Some([Value::Int(0), Value::Int(pttl)]) => Ok(held(*pttl, false, 0)),
            Some([Value::Int(-1), found]) => Err(self.conflict(key, found)),
            _ => Err(self.unexpected(key, "segment acquire", &reply)),
        }
    }

    fn conflict(&self, key: &LockKey, found: &Value) -> Failure {
        Failure::permanent(LockError::KeyConflict {
            key: key.name.clone(),
            redis_key: key.redis_key.clone(),
            found_type: redis::from_redis_value_ref::<String>(found).unwrap_or_else(|_| "unknown".into()),
        })
    }
}

/// The arguments every acquire script starts with: the holder id, the
/// lease, and the fencing and waiting flags.
fn attempt_args<'s, 'c>(call: &'c mut ScriptCall<'s>, req: &AcquireRequest<'_>) -> &'c mut ScriptCall<'s> {
    let flag = |on: bool| if on { "1" } else { "0" };
    call.arg(req.holder)
        .arg(millis(req.ttl))
        .arg(flag(req.fencing))
        .arg(flag(req.waiting))
}

fn fencing_token(req: &AcquireRequest<'_>, token: i64) -> Option<u64> {
    req.fencing.then(|| u64::try_from(token).unwrap_or(0))
}

/// Held, with the script's `pttl` (-1: no expiry).
fn held(pttl: i64, claimed: bool, blocked_by: usize) -> AcquireReply {
    AcquireReply::Held {
        pttl: u64::try_from(pttl).ok().map(Duration::from_millis),
        claimed,
        blocked_by,
    }
}

impl<C: Connection> RedisBackend<C> {
    /// With `replica_acks`, an acquisition counts only once enough replicas
    /// have acknowledged it; one that falls short is released at once (on
    /// the same connection, after the write) and refused. The refusal is
    /// worth retrying within the caller's `wait`: a replica may be
    /// reconnecting (after a failover, say); the last one is reported.
    async fn replicated(
        &self,
        req: &AcquireRequest<'_>,
        segment: Option<u32>,
        acks: ReplicaAcks,
        acquired: AcquireReply,
    ) -> Result<AcquireReply, Failure> {
        let segment_key = segment.map(|i| req.key.segment(i));
        let key = segment_key.as_ref().unwrap_or(req.key);
        // A failed WAIT leaves the acquisition in doubt, like a lost reply:
        // the caller retries with the same holder id, or gives it back.
        let acked = self
            .conn
            .wait_for_replicas(&key.redis_key, acks)
            .await
            .map_err(|e| self.failure(key, e))?;
        if acked >= i64::from(acks.replicas) {
            return Ok(acquired);
        }
        if req.also.is_empty() {
            self.release(key, req.holder).await?;
        } else {
            let set: Vec<LockKey> = std::iter::once(key).chain(req.also).cloned().collect();
            self.release_many(&set, req.holder).await?;
        }
        Err(Failure {
            error: self.not_replicated(key, acked, acks),
            transient: true,
            reconnecting: false,
        })
    }

    fn not_replicated(&self, key: &LockKey, acked: i64, acks: ReplicaAcks) -> LockError {
        LockError::NotReplicated {
            key: key.name.clone(),
            acked: u32::try_from(acked).unwrap_or(0),
            wanted: acks.replicas,
        }
    }

    /// A script may only touch keys of one slot on a cluster: one batch per
    /// slot, all sent at once (the cluster client pipelines them per node).
    async fn renew_per_slot(&self, items: &[RenewItem<'_>]) -> Result<Vec<Renewal>, Failure> {
        let mut by_slot: std::collections::HashMap<Slot, Vec<usize>> = std::collections::HashMap::new();
        for (i, item) in items.iter().enumerate() {
            by_slot
                .entry(Slot::for_key(&item.key.redis_key))
                .or_default()
                .push(i);
        }
        let batches = by_slot.into_values().map(|indices| async move {
            let batch: Vec<RenewItem<'_>> = indices
                .iter()
                .map(|&i| RenewItem {
                    key: items[i].key,
                    holder: items[i].holder,
                    ttl: items[i].ttl,
                })
                .collect();
            (indices, self.renew_batch(&batch).await)
        });
        let mut out = vec![Renewal::Unconfirmed; items.len()];
        for (indices, result) in futures_util::future::join_all(batches).await {
            // A failed slot leaves its leases unconfirmed, to be retried;
            // the other slots' answers stand.
            if let Ok(renewals) = result {
                for (i, renewal) in indices.into_iter().zip(renewals) {
                    out[i] = renewal;
                }
            }
        }
        Ok(out)
    }

    async fn renew_batch(&self, items: &[RenewItem<'_>]) -> Result<Vec<Renewal>, Failure> {
        let Some(first) = items.first() else {
            return Ok(Vec::new());
        };
        let mut invocation = RENEW_MANY.prepare_invoke();
        for item in items {
            invocation
                .key(&item.key.redis_key)
                .arg(item.holder)
                .arg(millis(item.ttl));
        }
        let renewed: Vec<i64> = invocation
            .invoke_async(&mut self.lane.clone())
            .await
            .map_err(|e| self.failure(first.key, e))?;
        if renewed.len() != items.len() {
            return Err(Failure::permanent(LockError::backend(
                &self.node,
                Some(&first.key.name),
                format!(
                    "renewal batch of {} answered {} results",
                    items.len(),
                    renewed.len()
                ),
            )));
        }
        let mut renewals: Vec<Renewal> = renewed.into_iter().map(|r| Renewal::from(r == 1)).collect();
        if let Some(acks) = self.acks {
            // Keys of one batch share a master (one node, or one slot on a
            // cluster): one WAIT covers them all, on the connection that
            // wrote them.
            let acked = self.lane.wait_for_replicas(&first.key.redis_key, acks).await;
            if !acked.is_ok_and(|n| n >= i64::from(acks.replicas)) {
                for renewal in &mut renewals {
                    if *renewal == Renewal::Renewed {
                        *renewal = Renewal::Unconfirmed;
                    }
                }
            }
        }
        Ok(renewals)
    }
}

/// Parses a node's URL: the client, and the node's name for messages.
/// `rediss://` needs the `tls` feature; with it, `tls_root` (PEM) replaces
/// the system's root certificates.
pub(crate) fn open_url(url: &str, tls_root: Option<&[u8]>) -> Result<(redis::Client, String), LockError> {
    let invalid = |reason: String| LockError::InvalidConfig {
        node: redact_url(url),
        reason,
    };
    let client = if url.starts_with("rediss://") {
        tls::open(url, tls_root)
    } else {
        redis::Client::open(url)
    };
    let client = client.map_err(|e| {
        invalid(format!(
            "{}{}",
            redact_secrets(&e.to_string(), url),
            unparsed_hint(url)
        ))
    })?;
    // The redis crate's `#insecure` fragment accepts any certificate when
    // some crate in the build enables its `tls-rustls-insecure`: refused,
    // as MySQL's `verify_ca=false` is, whatever the build.
    if let redis::ConnectionAddr::TcpTls { insecure: true, .. } = client.get_connection_info().addr() {
        return Err(invalid(
            "`#insecure` would accept any certificate from the server; give a private CA with `tls_root_certificate` instead".into(),
        ));
    }
    let node = client.get_connection_info().addr().to_string();
    Ok((client, node))
}

/// Worth trying again: the connection failed or broke, or the server is
/// busy, loading, failing over or without a master.
fn transient(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.kind(),
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ReadOnly
            )
        )
        || e.code() == Some("BUSY")
        // Sentinel names no confirmed master while a failover runs.
        || e.kind() == ErrorKind::MasterNameNotFoundBySentinel
}

/// A failure connecting or checking the connection at start-up: waited
/// for if a lock call would retry it, unless the credentials were refused
/// or TLS failed (a certificate that does not verify, or a TLS client
/// talking to a plain server), which waiting cannot mend.
pub(crate) fn startup_failure(node: &str, e: RedisError, urls: &[&str]) -> Failure {
    let certificate = seeds_cause(&e).is_some_and(|cause| cause.contains("invalid peer certificate"));
    let handshake = tls_refused(&e) || certificate;
    let waitable = transient(&e) && !handshake;
    let error = match connect_error(node, e, urls) {
        // Waiting cannot mend a certificate: the configuration's fault.
        LockError::Backend { source, .. } if handshake => LockError::InvalidConfig {
            node: node.to_owned(),
            reason: format!(
                "the TLS handshake failed ({source}): the server's certificate is verified against the system's roots, or against `tls_root_certificate` when given"
            ),
        },
        error => error,
    };
    Failure {
        transient: waitable && !matches!(error, LockError::InvalidConfig { .. }),
        error,
        reconnecting: false,
    }
}

/// `failure` as a plain client at a port that speaks TLS only sees it, told
/// apart: such a server closes on the client, as one going down does, and
/// only the first answers a TLS hello. Refused at once, naming the first of
/// `seeds` (the servers the attempt asked, each with its name) that answers
/// one, where it would otherwise be waited for until `startup_timeout`
/// ends. The seeds are asked at once, each for at most `within`.
pub(crate) async fn plain_at_tls_port(
    seeds: &[(&redis::Client, &str)],
    failure: Failure,
    within: Duration,
) -> Failure {
    if !failure.transient {
        return failure;
    }
    let answers = futures_util::future::join_all(seeds.iter().map(|(client, _)| async move {
        match client.get_connection_info().addr() {
            redis::ConnectionAddr::Tcp(host, port) => super::tls::answers_tls(host, *port, within).await,
            _ => false,
        }
    }))
    .await;
    let Some((_, node)) = seeds
        .iter()
        .zip(answers)
        .find_map(|(seed, tls)| tls.then_some(seed))
    else {
        return failure;
    };
    Failure::permanent(LockError::InvalidConfig {
        node: (*node).to_owned(),
        reason: format!(
            "the server at `{node}` speaks TLS only: give its URL as `rediss://` (the `tls` feature)"
        ),
    })
}

/// The ACL user a URL logs in as: a user name counts only beside a
/// password (without one the crate sends no `AUTH`, and the session is
/// `default`'s), and a lone userinfo may be a password written without its
/// `:`, which must not show.
fn user_of(url: &str) -> String {
    redis::IntoConnectionInfo::into_connection_info(url)
        .ok()
        .and_then(|info| {
            let settings = info.redis_settings();
            settings.password().and(settings.username()).map(str::to_owned)
        })
        .unwrap_or_else(|| "default".to_owned())
}

/// A cluster client's first connections fail as one I/O error whose detail
/// is the text of a seed's own error: the only place its cause shows.
fn seeds_cause(e: &RedisError) -> Option<&str> {
    (e.kind() == ErrorKind::Io).then(|| e.detail()).flatten()
}

/// A failure to connect or to answer the first command. Refused credentials
/// are the configuration's fault, and retrying cannot fix them: they are
/// `InvalidConfig`, everything else `Backend`.
pub(crate) fn connect_error(node: &str, e: RedisError, urls: &[&str]) -> LockError {
    const REFUSALS: [&str; 3] = ["NOAUTH", "WRONGPASS", "AuthenticationFailed"];
    // A refused SELECT (a database other than 0) comes as the crate's own
    // error, the server's words in its detail.
    let database = e.to_string().contains("refused to switch database");
    let forbidden = e.code() == Some("NOPERM")
        || seeds_cause(&e).is_some_and(|cause| cause.contains("NOPERM"))
        || (database && e.detail().is_some_and(|detail| detail.contains("no permissions")));
    if database && !forbidden {
        return LockError::InvalidConfig {
            node: node.to_owned(),
            reason: format!(
                "the server refused to switch to the URL's database ({})",
                redact_error(e, urls)
            ),
        };
    }
    if forbidden {
        // The server names the command, key or channel it refused.
        return LockError::InvalidConfig {
            node: node.to_owned(),
            reason: format!(
                "the server's ACL refuses the client's user what a lock needs ({}); docs/backends.md gives the least a lock client needs",
                redact_error(e, urls)
            ),
        };
    }
    let refused = e.kind() == ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"))
        || seeds_cause(&e).is_some_and(|cause| REFUSALS.iter().any(|code| cause.contains(code)));
    if refused {
        return LockError::InvalidConfig {
            node: node.to_owned(),
            reason: format!(
                "the server refused the credentials ({}); give them in the URL, `redis://user:password@host:port`",
                redact_error(e, urls)
            ),
        };
    }
    LockError::backend(node, None, redact_error(e, urls))
}

fn manager_config(config: &ClientConfig) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        // Our own loops retry within the caller's wait; a reconnect that
        // retried on its own would hold every caller hostage to its backoff.
        .set_number_of_retries(0)
        .set_connection_timeout(Some(config.command_timeout))
        .set_response_timeout(Some(config.command_timeout))
}

/// The error's text without the secrets of any of `urls`.
pub(crate) fn redact_error(e: RedisError, urls: &[&str]) -> String {
    urls.iter()
        .fold(e.to_string(), |message, url| redact_secrets(&message, url))
}

/// Built only without the feature: `cargo test -p lock-runtime --lib`
/// (`.ci/run` runs it; the workspace build turns `tls` on for the tests).
#[cfg(all(test, not(feature = "tls")))]
mod without_the_feature {
    use super::open_url;
    use crate::error::LockError;

    #[test]
    fn a_rediss_url_says_to_enable_the_feature_without_its_password() {
        match open_url("rediss://app:Zq7secretWv3@127.0.0.1:6380/", None) {
            Err(LockError::InvalidConfig { node, reason }) => {
                assert!(reason.contains("`tls` feature"), "{reason}");
                assert!(
                    !format!("{node} {reason}").contains("Zq7secretWv3"),
                    "{node} {reason}"
                );
            }
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }
}

#[cfg(all(test, feature = "tls"))]
mod with_the_feature {
    use super::open_url;
    use crate::error::LockError;

    #[test]
    fn insecure_tls_is_refused_without_showing_the_password() {
        match open_url("rediss://app:Zq7secretWv3@127.0.0.1:6380/#insecure", None) {
            Err(LockError::InvalidConfig { node, reason }) => {
                assert!(reason.contains("`#insecure`"), "{reason}");
                assert!(reason.contains("tls_root_certificate"), "{reason}");
                assert!(
                    !format!("{node} {reason}").contains("Zq7secretWv3"),
                    "{node} {reason}"
                );
            }
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
        assert!(open_url("rediss://app:Zq7secretWv3@127.0.0.1:6380/", None).is_ok());
    }
}
