//! A client's settings, as the builder collected them. Data only: the layers
//! below the client read what they need from it.

use std::sync::Arc;
use std::time::Duration;

/// `WAIT replicas timeout`: how many replicas must acknowledge a lock's
/// write, and how long to wait for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplicaAcks {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
}

/// The default time a write waits for its replicas' acknowledgements.
pub(crate) const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_millis(100);

/// Where ZooKeeper locks live unless the builder names another root.
#[cfg(feature = "zookeeper")]
pub(crate) const DEFAULT_ROOT: &str = "/distributed-locks";

/// The ZooKeeper session timeout asked of the ensemble unless the builder
/// says otherwise; the server may grant a different one (between 2 and 20
/// of its ticks).
#[cfg(feature = "zookeeper")]
pub(crate) const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// Where etcd locks live unless the builder names another root.
#[cfg(feature = "etcd")]
pub(crate) const DEFAULT_ETCD_ROOT: &str = "/distributed-locks";

/// The etcd lease ttl asked of the cluster unless the builder says
/// otherwise.
#[cfg(feature = "etcd")]
pub(crate) const DEFAULT_ETCD_LEASE_TTL: Duration = Duration::from_secs(10);

/// How long construction waits for a server that is still starting,
/// unless the builder says otherwise: long enough for a server started
/// beside the service (a JVM, a database's recovery), short enough that a
/// wrong address is reported soon.
pub(crate) const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(10);

/// A ZooKeeper `digest` identity (`user:password`).
#[cfg(feature = "zookeeper")]
#[derive(Clone)]
pub(crate) struct ZooKeeperIdentity {
    pub(crate) user: String,
    pub(crate) password: String,
}

#[cfg(feature = "zookeeper")]
impl std::fmt::Debug for ZooKeeperIdentity {
    // By hand: the password never shows.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZooKeeperIdentity")
            .field("user", &self.user)
            .field("password", &"***")
            .finish()
    }
}

/// An etcd user (etcd's own authentication, `etcdctl user add`).
#[cfg(feature = "etcd")]
#[derive(Clone)]
pub(crate) struct EtcdUser {
    pub(crate) name: String,
    pub(crate) password: String,
}

#[cfg(feature = "etcd")]
impl std::fmt::Debug for EtcdUser {
    // By hand: the password never shows.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdUser")
            .field("name", &self.name)
            .field("password", &"***")
            .finish()
    }
}

/// A client certificate and its private key (PEM), for servers that ask
/// clients for one (mutual TLS).
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
#[derive(Clone)]
// Nothing sets one without TLS to a backend that shows it (the builder's
// methods need `tls` with etcd, or `zookeeper-tls`).
#[cfg_attr(
    not(any(all(feature = "tls", feature = "etcd"), feature = "zookeeper-tls")),
    allow(dead_code)
)]
pub(crate) struct ClientCertificate {
    pub(crate) certificate: Arc<[u8]>,
    pub(crate) key: Arc<[u8]>,
}

#[cfg(any(feature = "etcd", feature = "zookeeper"))]
impl std::fmt::Debug for ClientCertificate {
    // By hand: the private key never shows.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCertificate")
            .field("certificate", &format_args!("{} bytes", self.certificate.len()))
            .field("key", &"***")
            .finish()
    }
}

/// What every lock call of one client shares.
#[derive(Debug, Clone)]
pub(crate) struct ClientConfig {
    pub(crate) prefix: String,
    pub(crate) default_ttl: Duration,
    pub(crate) default_wait: Duration,
    pub(crate) retry_min: Duration,
    pub(crate) retry_max: Duration,
    pub(crate) command_timeout: Duration,
    pub(crate) node_timeout: Duration,
    /// Connect on first use instead of at construction.
    pub(crate) lazy: bool,
    /// At construction, how long a server that refuses connections or is
    /// not serving yet is waited for.
    pub(crate) startup_timeout: Duration,
    /// After each acquire and renewal, `WAIT` for this many replicas to
    /// acknowledge the write (0: don't), for at most `ack_timeout`.
    pub(crate) replica_acks: u32,
    pub(crate) ack_timeout: Duration,
    /// How long a fair lock's waiter stays in line without an attempt (a
    /// live waiter attempts at least every 200 ms): a dead one is skipped
    /// after this.
    pub(crate) fair_waiter_timeout: Duration,
    /// A PEM root certificate that `rediss://` servers are verified against
    /// instead of the system's roots (feature `tls`).
    pub(crate) tls_root: Option<Arc<[u8]>>,
    /// Where no server announces releases (MySQL): how often a waiter
    /// looks again, jittered to `[d/2, d]`, capped by the lease in the way.
    pub(crate) poll_interval: Duration,
    /// The MySQL or PostgreSQL backend's table.
    #[cfg(any(feature = "mysql", feature = "postgres"))]
    pub(crate) table: String,
    /// The PostgreSQL backend's most connections at once.
    #[cfg(feature = "postgres")]
    pub(crate) pool_size: usize,
    /// The ZooKeeper node under which every lock's queue lives.
    #[cfg(feature = "zookeeper")]
    pub(crate) zookeeper_root: String,
    /// The session timeout asked of a ZooKeeper ensemble.
    #[cfg(feature = "zookeeper")]
    pub(crate) session_timeout: Duration,
    /// Who a ZooKeeper session authenticates as, the only identity that
    /// may change the lock nodes it creates; `None`: no authentication,
    /// open nodes.
    #[cfg(feature = "zookeeper")]
    pub(crate) zookeeper_identity: Option<ZooKeeperIdentity>,
    /// With an identity: anyone may read the lock nodes.
    #[cfg(feature = "zookeeper")]
    pub(crate) zookeeper_readable_by_anyone: bool,
    /// The certificate the ZooKeeper client shows a `tcp+tls://` ensemble.
    #[cfg(feature = "zookeeper")]
    pub(crate) zookeeper_client_certificate: Option<ClientCertificate>,
    /// The key prefix under which every etcd lock's line lives.
    #[cfg(feature = "etcd")]
    pub(crate) etcd_root: String,
    /// The ttl of the etcd lease each client keeps.
    #[cfg(feature = "etcd")]
    pub(crate) etcd_lease_ttl: Duration,
    /// Who the etcd client authenticates as, if anyone.
    #[cfg(feature = "etcd")]
    pub(crate) etcd_user: Option<EtcdUser>,
    /// The certificate the etcd client shows the cluster, if asked to.
    #[cfg(feature = "etcd")]
    pub(crate) etcd_client_certificate: Option<ClientCertificate>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            prefix: "lock:".into(),
            default_ttl: Duration::from_secs(30),
            default_wait: Duration::ZERO,
            retry_min: Duration::from_millis(2),
            retry_max: Duration::from_millis(50),
            command_timeout: Duration::from_secs(1),
            node_timeout: Duration::from_millis(50),
            lazy: false,
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
            replica_acks: 0,
            ack_timeout: DEFAULT_ACK_TIMEOUT,
            fair_waiter_timeout: Duration::from_secs(2),
            tls_root: None,
            poll_interval: Duration::from_millis(50),
            #[cfg(any(feature = "mysql", feature = "postgres"))]
            table: "distributed_locks".into(),
            #[cfg(feature = "postgres")]
            pool_size: 16,
            #[cfg(feature = "zookeeper")]
            zookeeper_root: DEFAULT_ROOT.into(),
            #[cfg(feature = "zookeeper")]
            session_timeout: DEFAULT_SESSION_TIMEOUT,
            #[cfg(feature = "zookeeper")]
            zookeeper_identity: None,
            #[cfg(feature = "zookeeper")]
            zookeeper_readable_by_anyone: false,
            #[cfg(feature = "zookeeper")]
            zookeeper_client_certificate: None,
            #[cfg(feature = "etcd")]
            etcd_root: DEFAULT_ETCD_ROOT.into(),
            #[cfg(feature = "etcd")]
            etcd_lease_ttl: DEFAULT_ETCD_LEASE_TTL,
            #[cfg(feature = "etcd")]
            etcd_user: None,
            #[cfg(feature = "etcd")]
            etcd_client_certificate: None,
        }
    }
}

impl ClientConfig {
    /// The `WAIT` every acquire and renewal ends with, if any.
    pub(crate) fn replica_acks(&self) -> Option<ReplicaAcks> {
        (self.replica_acks > 0).then_some(ReplicaAcks {
            replicas: self.replica_acks,
            timeout: self.ack_timeout,
        })
    }
}
