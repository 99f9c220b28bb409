//! Where locks live. Each backend implements [`Backend`]; [`AnyBackend`]
//! dispatches to the one a client was built with, statically, so a lock
//! operation costs no allocation for a boxed future.

use std::time::Duration;

use crate::error::LockError;
use crate::key::LockKey;
use crate::spec::{Kind, LockOptions};

mod contract;
#[cfg(feature = "etcd")]
pub(crate) mod etcd;
#[cfg(any(
    feature = "postgres",
    feature = "mysql",
    feature = "etcd",
    feature = "zookeeper"
))]
mod glob;
pub(crate) mod lane;
#[cfg(any(feature = "mysql", feature = "postgres"))]
mod members;
pub(crate) mod memory;
#[cfg(feature = "mysql")]
pub(crate) mod mysql;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(any(feature = "zookeeper", feature = "etcd"))]
mod queue;
pub(crate) mod redis;
#[cfg(feature = "testing")]
pub(crate) mod sim;
pub(crate) mod startup;
pub(crate) mod tls;
#[cfg(any(feature = "mysql", feature = "postgres"))]
mod unanswered;
#[cfg(feature = "zookeeper")]
pub(crate) mod zookeeper;

pub(crate) use self::redis::admin::Found;
use self::redis::cluster::ClusterLink;
use self::redis::redlock::{self, RedlockBackend};
use self::redis::sentinel::SentinelLink;
pub(crate) use contract::{
    AcquireReply, AcquireRequest, Backend, Failure, HandOver, LeaderChange, LeaderRecord, RenewItem, Renewal,
};

/// The backend a client was built with.
#[derive(Debug)]
#[allow(
    clippy::large_enum_variant,
    reason = "one per client, behind its Arc; which variant is largest depends on the backends built"
)]
pub(crate) enum AnyBackend {
    Redis(redis::RedisBackend),
    Memory(memory::MemoryBackend),
    Redlock(RedlockBackend),
    Cluster(redis::RedisBackend<ClusterLink>),
    Sentinel(redis::RedisBackend<SentinelLink>),
    #[cfg(feature = "mysql")]
    Mysql(mysql::MysqlBackend),
    #[cfg(feature = "postgres")]
    Postgres(postgres::PostgresBackend),
    #[cfg(feature = "zookeeper")]
    ZooKeeper(zookeeper::ZooKeeperBackend),
    #[cfg(feature = "etcd")]
    Etcd(etcd::EtcdBackend),
    #[cfg(feature = "testing")]
    Sim(sim::SimBackend),
}

impl AnyBackend {
    /// Whether renewals run on the renewal thread (`lane.rs`): on every
    /// backend that talks to a server. In-process and simulated leases
    /// are renewed on the caller's runtime, whose clock (paused in tests)
    /// their leases follow.
    pub(crate) fn renews_apart(&self) -> bool {
        #[cfg(feature = "testing")]
        if let AnyBackend::Sim(_) = self {
            return false;
        }
        !matches!(self, AnyBackend::Memory(_))
    }

    /// Whether fencing tokens can be issued: not by a Redlock, whose
    /// per-master counters are not monotonic under faults.
    pub(crate) fn supports_fencing(&self) -> bool {
        !matches!(self, AnyBackend::Redlock(_))
    }

    /// The sorted `keys` of a set split into the groups one script can take
    /// at once, in the order to take them: one group, except on a cluster,
    /// where a script reaches one slot, so a group per slot, by slot number.
    /// Every caller takes a given set's groups in the same order, so two
    /// sets cannot each hold a group the other waits for.
    pub(crate) fn groups(&self, keys: Vec<LockKey>) -> Vec<Vec<LockKey>> {
        match self {
            AnyBackend::Cluster(_) => {
                let mut by_slot: std::collections::BTreeMap<u16, Vec<LockKey>> =
                    std::collections::BTreeMap::new();
                for key in keys {
                    by_slot.entry(key.slot()).or_default().push(key);
                }
                by_slot.into_values().collect()
            }
            // A ZooKeeper lock is a queue of its own: a set is taken queue
            // by queue, in the sorted order.
            #[cfg(feature = "zookeeper")]
            AnyBackend::ZooKeeper(_) => keys.into_iter().map(|k| vec![k]).collect(),
            #[cfg(feature = "etcd")]
            AnyBackend::Etcd(_) => keys.into_iter().map(|k| vec![k]).collect(),
            _ => vec![keys],
        }
    }

    /// An acquire answered within the call, by the in-process backend: it
    /// needs no timer around it and no future to await. `None` for the
    /// backends behind a network.
    pub(crate) fn acquire_at_once(&self, req: &AcquireRequest<'_>) -> Option<Result<AcquireReply, Failure>> {
        match self {
            AnyBackend::Memory(memory) => Some(memory.acquire_now(req)),
            _ => None,
        }
    }

    /// Whether releases are announced by a server (in-process, only local
    /// wake-ups exist).
    pub(crate) fn announces_releases(&self) -> bool {
        match self {
            AnyBackend::Memory(_) => false,
            #[cfg(feature = "testing")]
            AnyBackend::Sim(_) => false,
            #[cfg(feature = "mysql")]
            AnyBackend::Mysql(_) => false,
            // Each waiter's own watch tells it, not an announcement.
            #[cfg(feature = "zookeeper")]
            AnyBackend::ZooKeeper(_) => false,
            #[cfg(feature = "etcd")]
            AnyBackend::Etcd(_) => false,
            _ => true,
        }
    }

    /// Whether other processes' releases can only be seen by polling (no
    /// server announces them): waiters then poll at the client's
    /// `poll_interval`, jittered.
    pub(crate) fn polls_for_releases(&self) -> bool {
        #[cfg(feature = "mysql")]
        if let AnyBackend::Mysql(_) = self {
            return true;
        }
        false
    }

    /// The lease a lock of `ttl` gets: no longer than this backend can
    /// vouch for between two confirmations (ZooKeeper: the session
    /// timeout).
    pub(crate) fn lease_for(&self, ttl: Duration) -> Duration {
        match self {
            #[cfg(feature = "zookeeper")]
            AnyBackend::ZooKeeper(b) => ttl.min(b.lease_cap()),
            #[cfg(feature = "etcd")]
            AnyBackend::Etcd(b) => ttl.min(b.lease_cap()),
            _ => ttl,
        }
    }

    /// The lease to ask the server for when it grants a lock: at least the
    /// call's `hold_at_least` ([`LockOptions::granted_lease`]). On etcd, a
    /// renewed lock's key lives on this client's lease until the release
    /// moves it to one of its own ([`keep`](Self::keep)), so only a fixed
    /// lease (which this client deletes when it ends) is asked longer.
    pub(crate) fn granted_lease(&self, opts: &LockOptions) -> Duration {
        match self {
            #[cfg(feature = "etcd")]
            AnyBackend::Etcd(_) if opts.renew => opts.ttl,
            _ => opts.granted_lease(),
        }
    }

    /// Why this backend cannot keep a lock held after its holder let go
    /// (`hold_at_least`), if it cannot.
    pub(crate) fn cannot_hold(&self) -> Option<&'static str> {
        match self {
            #[cfg(feature = "zookeeper")]
            AnyBackend::ZooKeeper(_) => Some(zookeeper::NO_HOLD),
            _ => None,
        }
    }

    /// Sets the exclusive lock `key`'s lease to end `left` from now by the
    /// server's clock, whether that shortens or lengthens it, if `holder`
    /// still has it: the release of a lock with `hold_at_least`. Nothing
    /// is announced: the lock is still held. `Ok(false)`: it was no longer
    /// this holder's.
    pub(crate) async fn keep(&self, key: &LockKey, holder: &str, left: Duration) -> Result<bool, Failure> {
        match self {
            AnyBackend::Redis(b) => b.keep(key, holder, left).await,
            AnyBackend::Cluster(b) => b.keep(key, holder, left).await,
            AnyBackend::Sentinel(b) => b.keep(key, holder, left).await,
            AnyBackend::Redlock(b) => Box::pin(b.keep(key, holder, left)).await,
            AnyBackend::Memory(b) => Ok(b.keep(key, holder, left)),
            #[cfg(feature = "testing")]
            AnyBackend::Sim(b) => Box::pin(b.keep(key, holder, left)).await,
            #[cfg(feature = "mysql")]
            AnyBackend::Mysql(b) => Box::pin(b.keep(key, holder, left)).await,
            #[cfg(feature = "postgres")]
            AnyBackend::Postgres(b) => Box::pin(b.keep(key, holder, left)).await,
            #[cfg(feature = "etcd")]
            AnyBackend::Etcd(b) => Box::pin(b.keep(key, holder, left)).await,
            // Refused before the lock was taken (`cannot_hold`).
            #[cfg(feature = "zookeeper")]
            AnyBackend::ZooKeeper(b) => Box::pin(b.release(key, holder)).await,
        }
    }

    /// Whether an exclusive lock can be handed from its holder to a waiter
    /// in one owner-checked call ([`hand_over`](Self::hand_over)): on a
    /// Redis node, a Sentinel's master or a cluster, and on a Redlock (one
    /// call per master, handed once a majority handed it), unless every
    /// write must wait for replicas (a handed lock would have to wait too),
    /// and on PostgreSQL.
    pub(crate) fn hands_over(&self) -> bool {
        match self {
            AnyBackend::Redis(b) => b.hands_over(),
            AnyBackend::Cluster(b) => b.hands_over(),
            AnyBackend::Sentinel(b) => b.hands_over(),
            AnyBackend::Redlock(b) => b.hands_over(),
            #[cfg(feature = "postgres")]
            AnyBackend::Postgres(_) => true,
            #[cfg(feature = "testing")]
            AnyBackend::Sim(_) => true,
            _ => false,
        }
    }

    /// Whether a handoff is several calls (a Redlock's, one per master)
    /// that an attempt of the waiter's could meet half done.
    pub(crate) fn hands_over_in_parts(&self) -> bool {
        matches!(self, AnyBackend::Redlock(_))
    }

    /// Gives the exclusive lock `key` from `from` to `to`, with `to`'s lease
    /// of `ttl` (and a fencing token) starting now, if `from` still has it.
    pub(crate) async fn hand_over(
        &self,
        key: &LockKey,
        from: &str,
        to: &str,
        ttl: Duration,
        fencing: bool,
    ) -> Result<HandOver, Failure> {
        match self {
            AnyBackend::Redis(b) => b.hand_over(key, from, to, ttl, fencing).await,
            AnyBackend::Cluster(b) => b.hand_over(key, from, to, ttl, fencing).await,
            AnyBackend::Sentinel(b) => b.hand_over(key, from, to, ttl, fencing).await,
            AnyBackend::Redlock(b) => Box::pin(b.hand_over(key, from, to, ttl, fencing)).await,
            #[cfg(feature = "postgres")]
            AnyBackend::Postgres(b) => Box::pin(b.hand_over(key, from, to, ttl, fencing)).await,
            #[cfg(feature = "testing")]
            AnyBackend::Sim(b) => Box::pin(b.hand_over(key, from, to, ttl, fencing)).await,
            // Never offered: `hands_over` is false here.
            _ => Ok(HandOver::NotHeld),
        }
    }

    /// Releases a lease the lock's holder took, telling the backend
    /// whether it was taken with a fencing token: on PostgreSQL a fenced
    /// lock's row outlives its holders, and its release skips the plain
    /// delete tried first for an unfenced one. The same as `release`
    /// everywhere else.
    pub(crate) async fn release_lease(
        &self,
        key: &LockKey,
        holder: &str,
        fenced: bool,
    ) -> Result<bool, Failure> {
        #[cfg(feature = "postgres")]
        if let (AnyBackend::Postgres(b), true) = (self, fenced) {
            return Box::pin(b.release_fenced(key, holder)).await;
        }
        let _ = fenced;
        self.release(key, holder).await
    }

    /// Whether each waiter is told of its own turn by the backend
    /// ([`turn`](Self::turn)) rather than by release announcements.
    pub(crate) fn queues_waiters(&self) -> bool {
        #[cfg(feature = "zookeeper")]
        if let AnyBackend::ZooKeeper(_) = self {
            return true;
        }
        #[cfg(feature = "etcd")]
        if let AnyBackend::Etcd(_) = self {
            return true;
        }
        false
    }

    /// Resolves when `holder`'s turn for `key` may have come (ZooKeeper:
    /// the node before its own changed); at once on other backends.
    pub(crate) async fn turn(&self, key: &LockKey, holder: &str) {
        #[cfg(feature = "zookeeper")]
        if let AnyBackend::ZooKeeper(b) = self {
            Box::pin(b.turn(key, holder)).await;
        }
        #[cfg(feature = "etcd")]
        if let AnyBackend::Etcd(b) = self {
            Box::pin(b.turn(key, holder)).await;
        }
        let _ = (key, holder);
    }

    /// The lock keys matching the Redis glob `pattern`, per node (per
    /// master of a cluster or a Redlock).
    pub(crate) async fn scan_keys(&self, pattern: &str) -> Result<Vec<(String, Vec<String>)>, LockError> {
        match self {
            AnyBackend::Redis(b) => b.scan_keys(pattern).await,
            AnyBackend::Cluster(b) => b.scan_keys(pattern).await,
            AnyBackend::Sentinel(b) => b.scan_keys(pattern).await,
            AnyBackend::Redlock(b) => {
                let mut all = Vec::new();
                for node in b.nodes() {
                    all.extend(node.scan_keys(pattern).await?);
                }
                Ok(all)
            }
            AnyBackend::Memory(_) => Err(no_admin()),
            #[cfg(feature = "testing")]
            AnyBackend::Sim(_) => Err(no_admin()),
            #[cfg(feature = "mysql")]
            AnyBackend::Mysql(b) => b.scan_keys(pattern).await,
            #[cfg(feature = "postgres")]
            AnyBackend::Postgres(b) => b.scan_keys(pattern).await,
            #[cfg(feature = "zookeeper")]
            AnyBackend::ZooKeeper(b) => Box::pin(b.scan_keys(pattern)).await,
            #[cfg(feature = "etcd")]
            AnyBackend::Etcd(b) => Box::pin(b.scan_keys(pattern)).await,
        }
    }

    /// The lock `key` on each node that has it; on a Redlock, only on the
    /// master named `only` when given.
    pub(crate) async fn inspect(
        &self,
        key: &LockKey,
        only: Option<&str>,
    ) -> Result<Vec<(String, Found)>, LockError> {
        let on =
            |node: &str, found: Option<Found>| found.map(|f| vec![(node.to_owned(), f)]).unwrap_or_default();
        match self {
            AnyBackend::Redis(b) => Ok(on(b.node(), b.inspect(key).await?)),
            AnyBackend::Cluster(b) => Ok(on(b.node(), b.inspect(key).await?)),
            AnyBackend::Sentinel(b) => Ok(on(b.node(), b.inspect(key).await?)),
            AnyBackend::Redlock(b) => {
                let mut all = Vec::new();
                for node in b
                    .nodes()
                    .iter()
                    .filter(|n| only.is_none_or(|name| n.node() == name))
                {
                    all.extend(on(node.node(), node.inspect(key).await?));
                }
                Ok(all)
            }
            AnyBackend::Memory(_) => Err(no_admin()),
            #[cfg(feature = "testing")]
            AnyBackend::Sim(_) => Err(no_admin()),
            #[cfg(feature = "mysql")]
            AnyBackend::Mysql(b) => Ok(on(b.node(), b.inspect(key).await?)),
            #[cfg(feature = "postgres")]
            AnyBackend::Postgres(b) => Ok(on(b.node(), b.inspect(key).await?)),
            #[cfg(feature = "zookeeper")]
            AnyBackend::ZooKeeper(b) => Ok(on(b.node(), Box::pin(b.inspect(key)).await?)),
            #[cfg(feature = "etcd")]
            AnyBackend::Etcd(b) => Ok(on(b.node(), Box::pin(b.inspect(key)).await?)),
        }
    }

    /// Frees the lock `key` whatever holds it: how many nodes had it.
    pub(crate) async fn force_unlock(&self, key: &LockKey) -> Result<usize, LockError> {
        match self {
            AnyBackend::Redis(b) => Ok(usize::from(b.force_unlock(key).await?)),
            AnyBackend::Cluster(b) => Ok(usize::from(b.force_unlock(key).await?)),
            AnyBackend::Sentinel(b) => Ok(usize::from(b.force_unlock(key).await?)),
            AnyBackend::Redlock(b) => {
                let mut freed = 0;
                for node in b.nodes() {
                    freed += usize::from(node.force_unlock(key).await?);
                }
                Ok(freed)
            }
            AnyBackend::Memory(_) => Err(no_admin()),
            #[cfg(feature = "testing")]
            AnyBackend::Sim(_) => Err(no_admin()),
            #[cfg(feature = "mysql")]
            AnyBackend::Mysql(b) => Ok(usize::from(b.force_unlock(key).await?)),
            #[cfg(feature = "postgres")]
            AnyBackend::Postgres(b) => Ok(usize::from(b.force_unlock(key).await?)),
            #[cfg(feature = "zookeeper")]
            AnyBackend::ZooKeeper(b) => Ok(usize::from(Box::pin(b.force_unlock(key)).await?)),
            #[cfg(feature = "etcd")]
            AnyBackend::Etcd(b) => Ok(usize::from(Box::pin(b.force_unlock(key)).await?)),
        }
    }

    /// The client has the lock `key` in hand (a guard, a body): on a
    /// simulated server, the start of a hold the test kit checks against
    /// the server's leases. Nothing elsewhere.
    pub(crate) fn hold_began(&self, key: &LockKey, holder: &str, kind: Kind) {
        #[cfg(feature = "testing")]
        if let AnyBackend::Sim(b) = self {
            b.server.hold_began(key, holder, kind);
        }
        let _ = (key, holder, kind);
    }

    /// The client let go of the lock `key`: the end of a hold.
    pub(crate) fn hold_ended(&self, key: &LockKey, holder: &str) {
        #[cfg(feature = "testing")]
        if let AnyBackend::Sim(b) = self {
            b.server.hold_ended(key, holder);
        }
        let _ = (key, holder);
    }

    /// Why this backend cannot hold an election, if it cannot: a Redlock
    /// has no fencing tokens, so a term would have no epoch.
    pub(crate) fn cannot_elect(&self) -> Option<&'static str> {
        match self {
            AnyBackend::Redlock(_) => Some(
                "an election on a Redlock (its masters' fence counters are not monotonic under faults, so a term would have no epoch)",
            ),
            _ => None,
        }
    }

    /// Whether this backend keeps elections' records (who leads, with what
    /// value: [`proclaim`](Self::proclaim), [`leader`](Self::leader)).
    /// Every backend that can hold an election does (a Redlock cannot),
    /// but the simulated server (not yet).
    pub(crate) fn keeps_leaders(&self) -> bool {
        #[cfg(feature = "testing")]
        if let AnyBackend::Sim(_) = self {
            return false;
        }
        self.cannot_elect().is_none()
    }

    /// Records `value` as what `holder`, the leader of the election `key`,
    /// leads with. `Ok(false)`: it no longer leads.
    pub(crate) async fn proclaim(&self, key: &LockKey, holder: &str, value: &str) -> Result<bool, Failure> {
        match self {
            AnyBackend::Redis(b) => b.proclaim(key, holder, value).await,
            AnyBackend::Cluster(b) => b.proclaim(key, holder, value).await,
            AnyBackend::Sentinel(b) => b.proclaim(key, holder, value).await,
            AnyBackend::Memory(b) => Ok(b.proclaim(key, holder, value)),
            #[cfg(feature = "mysql")]
            AnyBackend::Mysql(b) => b.proclaim(key, holder, value).await,
            #[cfg(feature = "postgres")]
            AnyBackend::Postgres(b) => b.proclaim(key, holder, value).await,
            #[cfg(feature = "zookeeper")]
            AnyBackend::ZooKeeper(b) => b.proclaim(key, holder, value).await,
            #[cfg(feature = "etcd")]
            AnyBackend::Etcd(b) => b.proclaim(key, holder, value).await,
            _ => Err(Failure::permanent(self.no_election(key))),
        }
    }

    /// Who leads the election `key` now, as the store has it.
    pub(crate) async fn leader(&self, key: &LockKey) -> Result<Option<LeaderRecord>, Failure> {
        match self {
            AnyBackend::Redis(b) => b.leader(key).await,
            AnyBackend::Cluster(b) => b.leader(key).await,
            AnyBackend::Sentinel(b) => b.leader(key).await,
            AnyBackend::Memory(b) => Ok(b.leader(key)),
            #[cfg(feature = "mysql")]
            AnyBackend::Mysql(b) => b.leader(key).await,
            #[cfg(feature = "postgres")]
            AnyBackend::Postgres(b) => b.leader(key).await,
            #[cfg(feature = "zookeeper")]
            AnyBackend::ZooKeeper(b) => b.leader(key).await,
            #[cfg(feature = "etcd")]
            AnyBackend::Etcd(b) => b.leader(key).await,
            _ => Err(Failure::permanent(self.no_election(key))),
        }
    }

    /// [`leader`](Self::leader) for an observer, with what tells it the
    /// next change where the store can watch (ZooKeeper, etcd). The other
    /// stores' observers are woken by the releases they announce, and by
    /// their clock.
    pub(crate) async fn leader_watched(
        &self,
        key: &LockKey,
    ) -> Result<(Option<LeaderRecord>, Option<LeaderChange>), Failure> {
        match self {
            #[cfg(feature = "zookeeper")]
            AnyBackend::ZooKeeper(b) => b
                .leader_watched(key)
                .await
                .map(|(found, change)| (found, Some(change))),
            #[cfg(feature = "etcd")]
            AnyBackend::Etcd(b) => b.leader_watched(key).await,
            _ => self.leader(key).await.map(|found| (found, None)),
        }
    }

    fn no_election(&self, key: &LockKey) -> LockError {
        LockError::Unsupported {
            key: key.name.clone(),
            feature: self
                .cannot_elect()
                .unwrap_or(
                    "an election's record (who leads, with what value; not yet on the simulated server)",
                )
                .to_owned(),
        }
    }

    /// Why this backend cannot take a lock of `kind`, if it cannot.
    pub(crate) fn unsupported(&self, kind: Kind) -> Option<&'static str> {
        match self {
            AnyBackend::Redlock(_) => redlock::unsupported(kind),
            #[cfg(feature = "zookeeper")]
            AnyBackend::ZooKeeper(_) => zookeeper::unsupported(kind),
            #[cfg(feature = "etcd")]
            AnyBackend::Etcd(_) => etcd::unsupported(kind),
            _ => None,
        }
    }
}

// The SQL and ZooKeeper backends' futures, and etcd's, are boxed: held
// inline, the largest variant sets the size of every caller's future,
// whatever the backend. PostgreSQL's and ZooKeeper's tripled the release
// future's size (1,096 to 3,112 bytes) and made an in-process
// acquire+release 1.7x slower (1.3 to 2.2 µs), all of it moving and
// initialising those bytes; etcd's overflowed a thread's stack in debug
// builds. A network round trip dwarfs the one allocation.
impl Backend for AnyBackend {
    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<AcquireReply, Failure> {
        match self {
            AnyBackend::Redis(b) => b.acquire(req).await,
            AnyBackend::Memory(b) => b.acquire(req).await,
            #[cfg(feature = "testing")]
            AnyBackend::Sim(b) => Box::pin(b.acquire(req)).await,
            AnyBackend::Redlock(b) => b.acquire(req).await,
            AnyBackend::Cluster(b) => b.acquire(req).await,
            AnyBackend::Sentinel(b) => b.acquire(req).await,
            #[cfg(feature = "mysql")]
            AnyBackend::Mysql(b) => Box::pin(b.acquire(req)).await,
            #[cfg(feature = "postgres")]
            AnyBackend::Postgres(b) => Box::pin(b.acquire(req)).await,
            #[cfg(feature = "zookeeper")]
            AnyBackend::ZooKeeper(b) => Box::pin(b.acquire(req)).await,
            #[cfg(feature = "etcd")]
            AnyBackend::Etcd(b) => Box::pin(b.acquire(req)).await,
        }
    }

    async fn release(&self, key: &LockKey, holder: &str) -> Result<bool, Failure> {
        match self {
            AnyBackend::Redis(b) => b.release(key, holder).await,
            AnyBackend::Memory(b) => b.release(key, holder).await,
            #[cfg(feature = "testing")]
            AnyBackend::Sim(b) => Box::pin(b.release(key, holder)).await,
            AnyBackend::Redlock(b) => b.release(key, holder).await,
            AnyBackend::Cluster(b) => b.release(key, holder).await,
            AnyBackend::Sentinel(b) => b.release(key, holder).await,
            #[cfg(feature = "mysql")]
            AnyBackend::Mysql(b) => Box::pin(b.release(key, holder)).await,
            #[cfg(feature = "postgres")]
            AnyBackend::Postgres(b) => Box::pin(b.release(key, holder)).await,
            #[cfg(feature = "zookeeper")]
            AnyBackend::ZooKeeper(b) => Box::pin(b.release(key, holder)).await,
            #[cfg(feature = "etcd")]
            AnyBackend::Etcd(b) => Box::pin(b.release(key, holder)).await,
        }
    }

    async fn release_many(&self, keys: &[LockKey], holder: &str) -> Result<bool, Failure> {
        match self {
            AnyBackend::Redis(b) => b.release_many(keys, holder).await,
            AnyBackend::Memory(b) => b.release_many(keys, holder).await,
            #[cfg(feature = "testing")]
            AnyBackend::Sim(b) => Box::pin(b.release_many(keys, holder)).await,
            AnyBackend::Redlock(b) => b.release_many(keys, holder).await,
            AnyBackend::Cluster(b) => b.release_many(keys, holder).await,
            AnyBackend::Sentinel(b) => b.release_many(keys, holder).await,
            #[cfg(feature = "mysql")]
            AnyBackend::Mysql(b) => Box::pin(b.release_many(keys, holder)).await,
            #[cfg(feature = "postgres")]
            AnyBackend::Postgres(b) => Box::pin(b.release_many(keys, holder)).await,
            #[cfg(feature = "zookeeper")]
            AnyBackend::ZooKeeper(b) => Box::pin(b.release_many(keys, holder)).await,
            #[cfg(feature = "etcd")]
            AnyBackend::Etcd(b) => Box::pin(b.release_many(keys, holder)).await,
        }
    }

    async fn release_segments(&self, key: &LockKey, count: u32, holder: &str) -> Result<bool, Failure> {
        match self {
            AnyBackend::Redis(b) => b.release_segments(key, count, holder).await,
            AnyBackend::Memory(b) => b.release_segments(key, count, holder).await,
            #[cfg(feature = "testing")]
            AnyBackend::Sim(b) => Box::pin(b.release_segments(key, count, holder)).await,
            AnyBackend::Redlock(b) => b.release_segments(key, count, holder).await,
            AnyBackend::Cluster(b) => b.release_segments(key, count, holder).await,
            AnyBackend::Sentinel(b) => b.release_segments(key, count, holder).await,
            #[cfg(feature = "mysql")]
            AnyBackend::Mysql(b) => Box::pin(b.release_segments(key, count, holder)).await,
            #[cfg(feature = "postgres")]
            AnyBackend::Postgres(b) => Box::pin(b.release_segments(key, count, holder)).await,
            #[cfg(feature = "zookeeper")]
            AnyBackend::ZooKeeper(b) => Box::pin(b.release_segments(key, count, holder)).await,
            #[cfg(feature = "etcd")]
            AnyBackend::Etcd(b) => Box::pin(b.release_segments(key, count, holder)).await,
        }
    }

    async fn renew(&self, key: &LockKey, holder: &str, ttl: Duration) -> Result<bool, Failure> {
        match self {
            AnyBackend::Redis(b) => b.renew(key, holder, ttl).await,
            AnyBackend::Memory(b) => b.renew(key, holder, ttl).await,
            #[cfg(feature = "testing")]
            AnyBackend::Sim(b) => Box::pin(b.renew(key, holder, ttl)).await,
            AnyBackend::Redlock(b) => b.renew(key, holder, ttl).await,
            AnyBackend::Cluster(b) => b.renew(key, holder, ttl).await,
            AnyBackend::Sentinel(b) => b.renew(key, holder, ttl).await,
            #[cfg(feature = "mysql")]
            AnyBackend::Mysql(b) => Box::pin(b.renew(key, holder, ttl)).await,
            #[cfg(feature = "postgres")]
            AnyBackend::Postgres(b) => Box::pin(b.renew(key, holder, ttl)).await,
            #[cfg(feature = "zookeeper")]
            AnyBackend::ZooKeeper(b) => Box::pin(b.renew(key, holder, ttl)).await,
            #[cfg(feature = "etcd")]
            AnyBackend::Etcd(b) => Box::pin(b.renew(key, holder, ttl)).await,
        }
    }

    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Result<Vec<Renewal>, Failure> {
        match self {
            AnyBackend::Redis(b) => b.renew_many(items).await,
            AnyBackend::Memory(b) => b.renew_many(items).await,
            #[cfg(feature = "testing")]
            AnyBackend::Sim(b) => Box::pin(b.renew_many(items)).await,
            AnyBackend::Redlock(b) => b.renew_many(items).await,
            AnyBackend::Cluster(b) => b.renew_many(items).await,
            AnyBackend::Sentinel(b) => b.renew_many(items).await,
            #[cfg(feature = "mysql")]
            AnyBackend::Mysql(b) => Box::pin(b.renew_many(items)).await,
            #[cfg(feature = "postgres")]
            AnyBackend::Postgres(b) => Box::pin(b.renew_many(items)).await,
            #[cfg(feature = "zookeeper")]
            AnyBackend::ZooKeeper(b) => Box::pin(b.renew_many(items)).await,
            #[cfg(feature = "etcd")]
            AnyBackend::Etcd(b) => Box::pin(b.renew_many(items)).await,
        }
    }
}

/// The in-process backend has no server to inspect: its locks live and die
/// with the process that holds them.
fn no_admin() -> LockError {
    LockError::Unsupported {
        key: String::new(),
        feature: "inspecting locks (the in-process backend keeps them inside its process)".into(),
    }
}

#[cfg(test)]
mod tests {
    /// Every caller's futures are as large as the largest backend future
    /// held inline in them: a backend whose futures are large must box
    /// them in the dispatch above. Bounds with room for compiler changes;
    /// PostgreSQL's and ZooKeeper's inline futures made these 3,616 and
    /// 3,112 bytes, and an in-process pair 1.7x slower.
    #[test]
    fn a_backend_does_not_swell_every_callers_futures() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let locks = crate::LockClient::in_memory();
            let acquire = locks.lock("size").acquire();
            let size = std::mem::size_of_val(&acquire);
            assert!(size <= 3_072, "an acquire's future is {size} bytes");
            let guard = acquire.await.expect("free");
            let release = guard.release();
            let size = std::mem::size_of_val(&release);
            assert!(size <= 1_536, "a release's future is {size} bytes");
            release.await.expect("released");
            // The acquisition itself, boxed once per call: past 1,032
            // bytes glibc serves it outside its small-block cache, by a
            // slow path (about 500 of an in-process pair's 7,500
            // instructions at 2.4 KB). A subscription, a kind other than
            // a lone exclusive lock, the backend's future or the state
            // machine's own arguments held inline each took it past that
            // (4,944 bytes with all of them).
            let key = crate::key::LockKey::new("lock:", "size".into()).expect("a valid key");
            let opts = crate::spec::LockSpec::DEFAULT
                .resolve(&locks.inner.config, &key)
                .expect("valid options");
            let acquisition = crate::acquire::acquire(&locks.inner, key, &opts);
            let size = std::mem::size_of_val(&acquisition);
            assert!(size <= 1_032, "an acquisition's future is {size} bytes");
        });
    }
}
