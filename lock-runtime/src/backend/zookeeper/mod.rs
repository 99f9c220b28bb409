//! Locks as ZooKeeper queues: the seeds' ephemeral sequential nodes.
//!
//! A lock `K` is the node `<root>/<K encoded>`, a container the server
//! deletes once it is empty. Each contender creates an ephemeral sequential
//! child named after its holder id (`<holder>_0000000042`); the child with
//! the lowest sequence number holds the lock, and every other contender
//! watches only the child just before its own, so a release wakes exactly
//! one waiter (no herd). A child lives as long as the session that created
//! it: a holder that dies is let go when the ensemble expires its session,
//! judged by the ensemble, never by clocks compared across machines.
//!
//! The runtime's leases map onto sessions this way:
//! - a lease is never trusted longer than the session timeout past the last
//!   request the ensemble answered (the session cannot have expired before
//!   then): [`ZooKeeperBackend::lease_cap`];
//! - a renewal confirms the child still exists and belongs to this session;
//!   an expired session, or a child deleted by an operator, is `Gone`, and a
//!   connection that is down leaves the lease unconfirmed until its
//!   deadline;
//! - a fixed lease (`renew(false)`) is deleted by this client when its ttl
//!   passes, as a Redis key would expire.
//!
//! The fencing token is the child's creation zxid: every write the ensemble
//! commits gets a larger one, so tokens grow per key, across sessions and
//! across leader changes.
//!
//! The client is `zookeeper-client`: an async implementation of the
//! protocol with one-shot watchers as futures, container nodes and
//! session-state tracking, which the lock needs and which it keeps up to
//! date with ZooKeeper 3.5–3.9.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use zookeeper_client as zk;

use super::contract::{
    AcquireReply, AcquireRequest, Backend, Failure, LeaderChange, LeaderRecord, RenewItem, Renewal,
};
use super::queue::{InTheWay, in_the_way};
use super::startup;
use crate::config::{ClientCertificate, ZooKeeperIdentity};
use crate::error::LockError;
use crate::key::LockKey;
use crate::spec::Kind;

mod admin;

/// Characters a lock name keeps in its node's name; everything else
/// (`/`, `%`, spaces, non-ASCII) is percent-encoded, so any key is one
/// valid node name.
const KEPT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b':')
    .remove(b'@')
    .remove(b'{')
    .remove(b'}')
    .remove(b'#')
    .remove(b'!')
    .remove(b'+')
    .remove(b'=')
    .remove(b',')
    .remove(b'~');

/// Why this backend cannot take a lock of `kind`, if it cannot.
pub(crate) fn unsupported(kind: Kind) -> Option<&'static str> {
    match kind {
        // A ZooKeeper lock is a queue: exclusive and fair are one thing,
        // readers and permit holders are let in by where they stand, and a
        // segment is the first free queue of N.
        Kind::Exclusive | Kind::Fair | Kind::Read | Kind::Write | Kind::Permits(_) | Kind::Segments(_) => {
            None
        }
    }
}

/// Why a ZooKeeper lock cannot be kept held after its holder let go
/// (`hold_at_least`): its node is ephemeral, so it ends with the session
/// that made it, and a node that outlives its session (a TTL node) needs
/// the server's `zookeeper.extendedTypesEnabled`, is reaped only by the
/// server's container sweep (once a minute by default), and would take a
/// new place in the lock's queue behind the waiters.
pub(crate) const NO_HOLD: &str = "`hold_at_least` on ZooKeeper (a lock node is ephemeral and ends with its session; a node that outlives it, a TTL node, needs the server's `zookeeper.extendedTypesEnabled` and would lose its place in the queue); use Redis, PostgreSQL, MySQL or etcd for such jobs";

/// How a connect string names a member served over TLS (the ZooKeeper
/// client's syntax).
const TLS_SCHEME: &str = "tcp+tls://";

/// What the ZooKeeper client is given for TLS; nothing can be without the
/// feature.
#[cfg(feature = "zookeeper-tls")]
type Tls = super::tls::ZooKeeperTls;
#[cfg(not(feature = "zookeeper-tls"))]
type Tls = std::convert::Infallible;

/// The TLS settings for `members`, all `tcp+tls://`.
#[cfg(feature = "zookeeper-tls")]
fn tls_options(
    members: &[Member<'_>],
    root_pem: Option<&[u8]>,
    certificate: Option<&ClientCertificate>,
) -> Result<Tls, String> {
    // The ZooKeeper client would panic on a host a certificate cannot
    // name: refused here instead.
    for member in members {
        if rustls::pki_types::ServerName::try_from(member.host.to_owned()).is_err() {
            return Err(format!(
                "`{}` is not a host name or an IP address a certificate can name",
                member.host
            ));
        }
    }
    super::tls::zookeeper_tls(root_pem, certificate)
}

#[cfg(not(feature = "zookeeper-tls"))]
fn tls_options(
    _members: &[Member<'_>],
    _root_pem: Option<&[u8]>,
    _certificate: Option<&ClientCertificate>,
) -> Result<Tls, String> {
    Err("`tcp+tls://` members need TLS support: enable lock-runtime's `zookeeper-tls` feature".into())
}

/// What a member said to a client that got no session from it.
enum Said {
    /// Something waiting cannot mend: why.
    Refused(String),
    /// It let the client in: the session failed for another reason.
    LetIn,
    /// No answer, or nothing that tells.
    Nothing,
}

/// Whether the ZooKeeper server at `host:port` answers a plain client: a
/// four-letter word (`srvr`) gets text back, from a server not serving
/// yet, or with the word not allowed ("not in the whitelist"), while a
/// port that speaks TLS only closes on it or answers with a TLS record.
#[cfg(feature = "tls")]
async fn answers_plain(host: &str, port: u16, within: Duration) -> bool {
    let answer = super::tls::first_byte_answered(host, port, b"srvr".to_vec(), within).await;
    answer.is_some_and(|byte| byte.is_ascii_alphabetic())
}

#[cfg(not(feature = "tls"))]
async fn answers_plain(_host: &str, _port: u16, _within: Duration) -> bool {
    false
}

/// A member of a connect string.
#[derive(Debug, PartialEq)]
struct Member<'a> {
    host: &'a str,
    port: u16,
    tls: bool,
}

/// The members of `connect`, read as the ZooKeeper client reads them (its
/// parser is not public): split at every comma, untrimmed; a chroot only
/// after the last member; an IPv6 address in brackets; port 2181 when
/// none is given. `None` for a string the client would refuse itself.
fn members(connect: &str) -> Option<Vec<Member<'_>>> {
    let last = connect.split(',').count() - 1;
    connect
        .split(',')
        .enumerate()
        .map(|(i, member)| {
            let (address, tls) = match member.strip_prefix(TLS_SCHEME) {
                Some(address) => (address, true),
                None => (member.strip_prefix("tcp://").unwrap_or(member), false),
            };
            let address = match address.find('/') {
                Some(chroot) if i == last => &address[..chroot],
                _ => address,
            };
            let (host, port) = match address.strip_prefix('[') {
                Some(bracketed) => {
                    let end = bracketed.rfind(']')?;
                    let after = &bracketed[end + 1..];
                    let port = if after.is_empty() {
                        after
                    } else {
                        after.strip_prefix(':')?
                    };
                    (&bracketed[..end], port)
                }
                None => address.rsplit_once(':').unwrap_or((address, "")),
            };
            let port = match port {
                "" => 2181,
                port => port.parse().ok().filter(|p| *p != 0)?,
            };
            (!host.is_empty()).then_some(Member { host, port, tls })
        })
        .collect()
}

/// Whether `root` can be the parent of every lock node.
pub(crate) fn root_problem(root: &str) -> Option<String> {
    let ok = root.starts_with('/')
        && root.len() > 1
        && !root.ends_with('/')
        && root[1..].split('/').all(|part| {
            !part.is_empty() && part != "." && part != ".." && !part.chars().any(char::is_control)
        });
    (!ok).then(|| {
        format!("the ZooKeeper root `{root}` must be an absolute node path like `/distributed-locks`, without a trailing `/`")
    })
}

/// A lock child this process created: in line, or holding.
#[derive(Debug)]
struct Child {
    /// The lock's name, `P{K}`.
    lock: String,
    /// The child's full path.
    path: String,
    /// The session that created it (and whose end deletes it).
    session: i64,
    czxid: i64,
    /// Set while waiting: fires when the child before ours changes.
    watcher: Option<zk::OneshotWatcher>,
    /// A fixed lease: when this client deletes the child.
    expires: Option<Instant>,
}

/// The children of this process, by holder id (a set's locks share one).
type Children = HashMap<String, Vec<Child>>;

/// A segmented lock's waiter: the holders of every segment it found taken,
/// watched, and when it set the watches.
struct SegmentWait {
    since: Instant,
    watchers: Vec<zk::OneshotWatcher>,
}

/// A ZooKeeper ensemble's locks.
pub(crate) struct ZooKeeperBackend {
    connect: String,
    root: String,
    asked_timeout: Duration,
    /// The granted session timeout, in ms (the asked one until connected).
    granted_ms: AtomicU64,
    timeout: Duration,
    /// Shared, not cloned per operation: a client clone copies its chroot
    /// and session credentials.
    session: Mutex<Option<Arc<zk::Client>>>,
    /// One connect at a time after a session ended.
    connecting: tokio::sync::Mutex<()>,
    children: Arc<Mutex<Children>>,
    /// Segmented locks' waiters, by holder id.
    segment_waits: Mutex<HashMap<String, SegmentWait>>,
    /// `<queue>/<holder>_` for each create whose answer never came: it may
    /// still land, after we looked, as a child nobody knows. Swept when the
    /// holder is done with the queue ([`ZooKeeperBackend::sweep_unanswered`]).
    /// A segment a call lost is not swept (the call may queue there again,
    /// and a late sweep would delete that child): its mark stays, and a
    /// late child there lives until the session ends or the call, looking
    /// again, drops it.
    unanswered: Mutex<std::collections::HashSet<String>>,
    /// The identity the session authenticates as, if any.
    identity: Option<ZooKeeperIdentity>,
    /// TLS to `tcp+tls://` members.
    #[cfg_attr(not(feature = "zookeeper-tls"), allow(dead_code))]
    tls: Option<Tls>,
    /// The ACL of every node this client creates; empty: open to anyone.
    acl: Vec<zk::Acl>,
}

/// The ACL that gives every permission to the digest identity `user` with
/// `password`, and reading to anyone when `readable_by_anyone`.
///
/// The identity is named, not given as the `auth` scheme ("the creator"):
/// that would name every identity of the creating session, a TLS client
/// certificate's (`x509`) too, so that any client showing the same
/// certificate could delete a lock's node.
fn digest_acl(identity: &ZooKeeperIdentity, readable_by_anyone: bool) -> Vec<zk::Acl> {
    use base64::Engine;
    use sha1::Digest;
    let hash = sha1::Sha1::digest(format!("{}:{}", identity.user, identity.password));
    let id = format!(
        "{}:{}",
        identity.user,
        base64::engine::general_purpose::STANDARD.encode(hash)
    );
    let mut acl = vec![zk::Acl::new(zk::Permission::ALL, zk::AuthId::new("digest", &id))];
    if readable_by_anyone {
        acl.push(zk::Acl::new(zk::Permission::READ, zk::AuthId::anyone()));
    }
    acl
}

impl fmt::Debug for ZooKeeperBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZooKeeperBackend")
            .field("connect", &self.connect)
            .field("root", &self.root)
            .field("session_timeout", &self.lease_cap())
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

/// What went wrong, for the retry loop: `(transient, reconnecting)`.
///
/// Only the request's own fault or the ensemble's configuration is final.
/// Everything else is a member or the connection failing (DESIGN §11: it
/// costs time within `wait`, never an error): the client reports a reset,
/// an EOF or a silent connection as `Custom` with the transport's error,
/// fails the requests that were in flight with it, and moves to another
/// member by itself. A session that ended, or hosts all refused, needs a
/// new session.
fn classify(e: &zk::Error) -> (bool, bool) {
    use zk::Error as E;
    match e {
        E::SessionExpired | E::ClientClosed | E::SessionMoved | E::NoHosts => (true, true),
        E::BadArguments(_)
        | E::NoAuth
        | E::AuthFailed
        | E::InvalidAcl
        | E::QuotaExceeded
        | E::Unimplemented
        | E::MarshallingError
        | E::UnmarshalError { .. }
        | E::UnexpectedError(_)
        | E::UnexpectedErrorCode(_)
        | E::ReconfigDisabled
        | E::NoChildrenForEphemerals
        | E::BadVersion
        | E::NodeExists
        | E::NotEmpty
        | E::NoNode
        | E::NoWatcher
        | E::RuntimeInconsistent => (false, false),
        // `ConnectionLoss`, `Timeout`, `Throttled`, `NotReadOnly`, `Custom`
        // (the transport's own errors) and whatever a later client adds.
        _ => (true, false),
    }
}

/// A child of ours to delete: its path, or the queue and name prefix to
/// find it by.
enum Doomed {
    Known(String),
    Search { queue: String, prefix: String },
}

impl Doomed {
    /// Deletes it, retrying until the ensemble answers: unlike a Redis key,
    /// a child outlives a failed release for as long as its session lives,
    /// and would keep the lock, and every waiter behind it, that long.
    /// Stops when the session ends (the child goes with it). Whether a
    /// child was there.
    async fn delete(self, client: Arc<zk::Client>) -> bool {
        let mut pause = Duration::from_millis(10);
        let mut retry = async |e: zk::Error| {
            if client.state().is_terminated() {
                return false;
            }
            tracing::debug!(error = %e, "ZooKeeper lock release not confirmed yet; retrying");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
            true
        };
        let paths = match self {
            Doomed::Known(path) => vec![path],
            Doomed::Search { queue, prefix } => loop {
                match client.list_children(&queue).await {
                    Ok(names) => {
                        break names
                            .into_iter()
                            .filter(|n| n.starts_with(&prefix))
                            .map(|n| format!("{queue}/{n}"))
                            .collect();
                    }
                    Err(zk::Error::NoNode | zk::Error::SessionExpired | zk::Error::ClientClosed) => {
                        return false;
                    }
                    Err(e) => {
                        if !retry(e).await {
                            return false;
                        }
                    }
                }
            },
        };
        let mut existed = false;
        for path in paths {
            loop {
                match client.delete(&path, None).await {
                    Ok(()) => existed = true,
                    Err(zk::Error::NoNode | zk::Error::SessionExpired | zk::Error::ClientClosed) => {}
                    Err(e) => {
                        if retry(e).await {
                            continue;
                        }
                    }
                }
                break;
            }
        }
        existed
    }
}

fn sequence(name: &str) -> Option<u64> {
    name.rsplit_once('_').and_then(|(_, n)| n.parse().ok())
}

/// A queue's children in line order, with their sequence numbers; names
/// that are not a lock's children are left out.
fn in_order(names: Vec<String>) -> Vec<(u64, String)> {
    let mut line: Vec<(u64, String)> = names
        .into_iter()
        .filter_map(|n| sequence(&n).map(|s| (s, n)))
        .collect();
    line.sort_unstable();
    line
}

/// The record of an election whose line `name` heads: its holder, the
/// node's creation zxid as the epoch, and its data as the value.
fn head_record(name: &str, data: &[u8], stat: &zk::Stat) -> LeaderRecord {
    let holder = name.rsplit_once('_').map_or(name, |(holder, _)| holder);
    LeaderRecord {
        holder: holder.to_owned(),
        epoch: stat.czxid.unsigned_abs(),
        value: (!data.is_empty()).then(|| String::from_utf8_lossy(data).into_owned()),
        left: None,
    }
}

impl ZooKeeperBackend {
    pub(crate) fn new(
        connect: &str,
        root: &str,
        session_timeout: Duration,
        timeout: Duration,
        identity: Option<ZooKeeperIdentity>,
        readable_by_anyone: bool,
    ) -> Result<Self, LockError> {
        let invalid = |reason: String| LockError::InvalidConfig {
            node: connect.to_owned(),
            reason,
        };
        // Not quoted: a user name given as `user:password` holds one.
        if let Some(identity) = &identity
            && (identity.user.is_empty() || identity.user.contains(':'))
        {
            return Err(invalid(
                "the ZooKeeper digest user must be a non-empty name without `:` (the password goes apart)"
                    .into(),
            ));
        }
        if identity.is_none() && readable_by_anyone {
            return Err(invalid(
                "`zookeeper_readable_by_anyone` restricts the nodes of a `zookeeper_digest` identity; without one, every node is open to all".into(),
            ));
        }
        let acl = identity
            .as_ref()
            .map(|identity| digest_acl(identity, readable_by_anyone))
            .unwrap_or_default();
        if let Some(problem) = root_problem(root) {
            return Err(invalid(problem));
        }
        if connect.trim().is_empty() {
            return Err(invalid(
                "the connect string is empty; give `host:port[,host:port…][/chroot]`".into(),
            ));
        }
        Ok(ZooKeeperBackend {
            connect: connect.to_owned(),
            root: root.to_owned(),
            asked_timeout: session_timeout,
            granted_ms: AtomicU64::new(u64::try_from(session_timeout.as_millis()).unwrap_or(u64::MAX)),
            timeout,
            session: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            children: Arc::new(Mutex::new(HashMap::new())),
            segment_waits: Mutex::new(HashMap::new()),
            unanswered: Mutex::new(std::collections::HashSet::new()),
            identity,
            tls: None,
            acl,
        })
    }

    /// TLS for a connect string whose members are `tcp+tls://host:port`
    /// (all of them or none: a secret sent to one plain member is sent in
    /// clear text), with `root_pem` the CA the members are verified
    /// against and `certificate` shown to an ensemble that asks for one.
    pub(crate) fn secured(
        mut self,
        root_pem: Option<&[u8]>,
        certificate: Option<&ClientCertificate>,
    ) -> Result<Self, LockError> {
        let invalid = |reason: String| LockError::InvalidConfig {
            node: self.connect.clone(),
            reason,
        };
        // A string the client cannot read is refused by it, at connect.
        let Some(members) = members(&self.connect) else {
            return Ok(self);
        };
        let secure = members.iter().filter(|m| m.tls).count();
        if secure == 0 {
            if certificate.is_some() {
                return Err(invalid(
                    "a client certificate is shown over TLS only: give the members as `tcp+tls://host:port`"
                        .into(),
                ));
            }
            return Ok(self);
        }
        if secure < members.len() {
            return Err(invalid(
                "give every member as `tcp+tls://` or none (separated by commas alone: a space starts a member's name): the client speaks TLS to all members or to none"
                    .into(),
            ));
        }
        self.tls = Some(tls_options(&members, root_pem, certificate).map_err(invalid)?);
        Ok(self)
    }

    pub(crate) fn node(&self) -> &str {
        &self.connect
    }

    /// The longest a lease is trusted past the last answered request: the
    /// session timeout the ensemble granted (or asked, if shorter).
    pub(crate) fn lease_cap(&self) -> Duration {
        Duration::from_millis(self.granted_ms.load(Ordering::Relaxed)).min(self.asked_timeout)
    }

    /// Opens the session now: an unreachable ensemble or a bad connect
    /// string fails at start-up.
    /// One attempt: an ensemble not serving yet is `transient`, to be
    /// waited for (`startup::when_ready`).
    ///
    /// With an identity, it also makes the root safe to lock under, and
    /// shows this identity may: ZooKeeper accepts any digest password (a
    /// wrong one is another identity), so only a write tells.
    /// - The root is created if missing; one whose ACL lets anyone write,
    ///   create or delete (made before the identity was set) is refused.
    /// - A persistent `owner` node under the root, with the identity's
    ///   ACL, keeps the root from ever being empty: ZooKeeper checks a
    ///   delete against the parent's ACL, and the root's parent (`/`) is
    ///   usually open to all, so an empty root could be deleted and made
    ///   again, open, by anyone.
    /// - A node is created under the root and deleted.
    pub(crate) async fn verify(&self) -> Result<(), Failure> {
        let client = match self.client().await {
            Ok(client) => client,
            Err(failure) if failure.transient => {
                return Err(match self.refusal().await {
                    Some(reason) => Failure::permanent(LockError::InvalidConfig {
                        node: self.connect.clone(),
                        reason,
                    }),
                    None => failure,
                });
            }
            Err(failure) => return Err(failure),
        };
        let Some(identity) = &self.identity else {
            return Ok(());
        };
        let refused = |reason: String| {
            Failure::permanent(LockError::InvalidConfig {
                node: self.connect.clone(),
                reason,
            })
        };
        let probe = async {
            self.make_root(&client).await?;
            let (acls, _) = client.get_acl(&self.root).await?;
            let changes = [
                zk::Permission::WRITE,
                zk::Permission::CREATE,
                zk::Permission::DELETE,
                zk::Permission::ADMIN,
            ];
            let open =
                |acl: &zk::Acl| acl.scheme() == "world" && changes.iter().any(|p| acl.permission().has(*p));
            if acls.iter().any(open) {
                return Ok(false);
            }
            let persistent = zk::CreateMode::Persistent.with_acls(self.acls());
            // No `{` in either name: never a lock's queue.
            match client
                .create(&format!("{}/owner", self.root), &[], &persistent)
                .await
            {
                Ok(_) | Err(zk::Error::NodeExists) => {}
                Err(e) => return Err(e),
            }
            let ephemeral = zk::CreateMode::EphemeralSequential.with_acls(self.acls());
            let prefix = format!("{}/access-check_", self.root);
            let (_, seq) = client.create(&prefix, &[], &ephemeral).await?;
            client
                .delete(&format!("{prefix}{seq}"), None)
                .await
                .map(|()| true)
        };
        match tokio::time::timeout(self.timeout, probe).await {
            Ok(Ok(true)) => Ok(()),
            Ok(Ok(false)) => Err(refused(format!(
                "the lock root `{}` lets anyone change it (it was made before `zookeeper_digest` was set, or by hand): give the secured clients a new root, or set its ACL to their identity",
                self.root
            ))),
            Ok(Err(zk::Error::NoAuth)) => Err(refused(format!(
                "the ZooKeeper identity `{}` may not create nodes under `{}`: its ACL gives that to another identity, or the password differs from the one the root was made with (ZooKeeper takes any digest password as another identity)",
                identity.user, self.root
            ))),
            Ok(Err(e)) => {
                let (transient, reconnecting) = classify(&e);
                Err(Failure {
                    error: LockError::backend(
                        &self.connect,
                        None,
                        format!("cannot check the lock root: {e}"),
                    ),
                    transient,
                    reconnecting,
                })
            }
            Err(_) => Err(startup::no_answer(&self.connect, self.timeout)),
        }
    }

    /// The ACL of every node this client creates.
    fn acls(&self) -> zk::Acls<'_> {
        if self.acl.is_empty() {
            zk::Acls::anyone_all()
        } else {
            zk::Acls::new(&self.acl)
        }
    }

    fn children(&self) -> std::sync::MutexGuard<'_, Children> {
        self.children.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The live session, opening a new one if there is none or it ended.
    async fn client(&self) -> Result<Arc<zk::Client>, Failure> {
        if let Some(c) = self.live() {
            return Ok(c);
        }
        let _one = self.connecting.lock().await;
        if let Some(c) = self.live() {
            return Ok(c);
        }
        let mut connector = zk::Client::connector();
        connector = connector
            .with_session_timeout(self.asked_timeout)
            .with_fail_eagerly();
        if let Some(identity) = &self.identity {
            let digest = format!("{}:{}", identity.user, identity.password);
            connector = connector.with_auth("digest", digest.as_bytes());
        }
        #[cfg(feature = "zookeeper-tls")]
        if let Some(tls) = &self.tls {
            connector = connector.with_tls(tls.options.clone());
        }
        let connect = connector.connect(&self.connect);
        let bound = self.asked_timeout.max(self.timeout);
        let client = match tokio::time::timeout(bound, connect).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => {
                return Err(Failure {
                    error: LockError::backend(&self.connect, None, format!("cannot open a session: {e}")),
                    transient: !matches!(e, zk::Error::BadArguments(_) | zk::Error::AuthFailed),
                    reconnecting: false,
                });
            }
            Err(_) => {
                return Err(Failure {
                    error: LockError::backend(
                        &self.connect,
                        None,
                        format!("no session within {}ms", bound.as_millis()),
                    ),
                    transient: true,
                    reconnecting: false,
                });
            }
        };
        let granted = u64::try_from(client.session_timeout().as_millis()).unwrap_or(u64::MAX);
        self.granted_ms.store(granted, Ordering::Relaxed);
        let client = Arc::new(client);
        *self.session.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::clone(&client));
        Ok(client)
    }

    /// Why no member gave a session, when waiting cannot mend it: a
    /// certificate refused either way, or a plain client at members that
    /// speak TLS only. The ZooKeeper client reports each as no host
    /// available, as it does a member down or still starting. Told only
    /// when no member let the client in: while one does, waiting may
    /// still get a session. The members are asked at once, within a
    /// bound.
    async fn refusal(&self) -> Option<String> {
        let members = members(&self.connect)?;
        let asked = futures_util::future::join_all(members.iter().map(|m| self.ask(m)));
        let said = tokio::time::timeout(self.timeout * 3, asked).await.ok()?;
        if said.iter().any(|said| matches!(said, Said::LetIn)) {
            return None;
        }
        said.into_iter().find_map(|said| match said {
            Said::Refused(why) => Some(why),
            _ => None,
        })
    }

    /// What `member` says to a client of this configuration.
    async fn ask(&self, member: &Member<'_>) -> Said {
        let (host, port) = (member.host, member.port);
        #[cfg(feature = "zookeeper-tls")]
        if let Some(tls) = &self.tls {
            use super::tls::Handshake;
            return match super::tls::handshake(host, port, Arc::clone(&tls.probe), self.timeout).await {
                Handshake::Refused(why) => Said::Refused(format!("the member `{host}:{port}` {why}")),
                Handshake::Accepted => Said::LetIn,
                Handshake::Unknown => Said::Nothing,
            };
        }
        if !super::tls::answers_tls(host, port, self.timeout).await {
            return Said::Nothing;
        }
        // A port that serves both (`client.portUnification`) answers a
        // plain client too, and is only not serving yet.
        if answers_plain(host, port, self.timeout).await {
            return Said::LetIn;
        }
        let shown = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.to_owned()
        };
        Said::Refused(format!(
            "the member `{shown}:{port}` speaks TLS only: give every member as `tcp+tls://{shown}:{port}` (the `zookeeper-tls` feature)"
        ))
    }

    fn live(&self) -> Option<Arc<zk::Client>> {
        let session = self.session.lock().unwrap_or_else(PoisonError::into_inner);
        session.as_ref().filter(|c| !c.state().is_terminated()).cloned()
    }

    fn failure(&self, key: &LockKey, e: &zk::Error) -> Failure {
        let (transient, reconnecting) = classify(e);
        let said = match e {
            zk::Error::NoAuth => format!(
                "{e}: the lock's nodes belong to another ZooKeeper identity; every client of a root must authenticate as the same one (`zookeeper_digest`)"
            ),
            _ => e.to_string(),
        };
        Failure {
            error: LockError::backend(&self.connect, Some(&key.name), said),
            transient,
            reconnecting,
        }
    }

    /// `<root>/<name encoded>`: the lock's queue.
    fn queue(&self, key: &LockKey) -> String {
        format!("{}/{}", self.root, utf8_percent_encode(&key.redis_key, KEPT))
    }

    /// Runs `work` within the command timeout.
    async fn bounded<T>(
        &self,
        key: &LockKey,
        what: &str,
        work: impl Future<Output = Result<T, Failure>>,
    ) -> Result<T, Failure> {
        match tokio::time::timeout(self.timeout, work).await {
            Ok(result) => result,
            Err(_) => Err(Failure {
                error: LockError::backend(
                    &self.connect,
                    Some(&key.name),
                    format!("no answer to {what} within {}ms", self.timeout.as_millis()),
                ),
                transient: true,
                reconnecting: false,
            }),
        }
    }

    /// Creates our child in `queue`, creating the queue (and the root)
    /// when missing. The queue is a container, so the server may delete it
    /// between our creating it and our child: then we try again.
    ///
    /// A permit holder's child holds its permit count as data: a name in
    /// the line does not tell it, and an operator's tool reads it to tell
    /// holders from waiters (`admin::holding`).
    async fn enqueue(
        &self,
        client: &zk::Client,
        queue: &str,
        holder: &str,
        kind: Kind,
    ) -> Result<(String, i64), zk::Error> {
        let prefix = format!("{queue}/{holder}_");
        // Until the server answers, the create may land at any time; a
        // create cut short (an error, or this future dropped) stays marked,
        // and so does an earlier one's mark.
        let marked_before = !self.unanswered().insert(prefix.clone());
        let child = zk::CreateMode::EphemeralSequential.with_acls(self.acls());
        let container = zk::CreateMode::Container.with_acls(self.acls());
        let data = match kind {
            Kind::Permits(n) => itoa::Buffer::new().format(n).as_bytes().to_vec(),
            _ => Vec::new(),
        };
        for _ in 0..4 {
            match client.create(&prefix, &data, &child).await {
                Ok((stat, seq)) => {
                    if !marked_before {
                        self.unanswered().remove(&prefix);
                    }
                    return Ok((format!("{prefix}{seq}"), stat.czxid));
                }
                Err(zk::Error::NoNode) => {
                    self.make_root(client).await?;
                    match client.create(queue, &[], &container).await {
                        Ok(_) | Err(zk::Error::NodeExists) => {}
                        Err(e) => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Err(zk::Error::NoNode)
    }

    /// Makes the root, and the connect string's chroot when it is
    /// missing: the ZooKeeper client resolves every path under the chroot
    /// and, as ZooKeeper's own client, makes none of it, so a chroot
    /// nobody made would fail every lock with "node not exists". Both get
    /// the lock nodes' ACL.
    async fn make_root(&self, client: &zk::Client) -> Result<(), zk::Error> {
        let persistent = zk::CreateMode::Persistent.with_acls(self.acls());
        match client.mkdir(&self.root, &persistent).await {
            Err(zk::Error::NoNode) if client.path() != "/" => {
                let chroot = client.path().to_owned();
                let unrooted = client.clone().chroot("/").map_err(|_| zk::Error::NoNode)?;
                unrooted.mkdir(&chroot, &persistent).await?;
                client.mkdir(&self.root, &persistent).await
            }
            made => made,
        }
    }

    /// Queues our child for `key` and registers it.
    async fn join(
        &self,
        client: &zk::Client,
        queue: &str,
        key: &LockKey,
        holder: &str,
        kind: Kind,
        session: i64,
    ) -> Result<(String, i64), zk::Error> {
        let (path, czxid) = self.enqueue(client, queue, holder, kind).await?;
        self.register(key, holder, &path, session, czxid);
        Ok((path, czxid))
    }

    /// Records a child of ours (created or adopted) for `key`.
    fn register(&self, key: &LockKey, holder: &str, path: &str, session: i64, czxid: i64) {
        self.children().entry(holder.to_owned()).or_default().push(Child {
            lock: key.redis_key.clone(),
            path: path.to_owned(),
            session,
            czxid,
            watcher: None,
            expires: None,
        });
    }

    /// One acquisition attempt on one queue.
    async fn attempt(&self, req: &AcquireRequest<'_>) -> Result<AcquireReply, Failure> {
        let key = req.key;
        let client = self.client().await?;
        let session = client.session_id().0;
        let queue = self.queue(key);
        let fail = |e: zk::Error| self.failure(key, &e);
        let mut ours = self.find(key, req.holder, session);
        if ours.is_none() && !req.first {
            // An earlier attempt's create may have been applied without
            // our seeing the reply: adopt its child rather than queue twice.
            ours = self
                .adopt(&client, &queue, key, req.holder, session)
                .await
                .map_err(fail)?;
        }
        let (path, czxid) = match ours {
            Some(found) => found,
            None => self
                .join(&client, &queue, key, req.holder, req.kind, session)
                .await
                .map_err(fail)?,
        };
        let name = &path[queue.len() + 1..];
        let mine = sequence(name).unwrap_or(u64::MAX);
        let ours_prefix = format!("{}_", req.holder);
        loop {
            let mut line = self.line(&client, &queue).await.map_err(fail)?;
            self.drop_twins(&client, &queue, &mut line, &ours_prefix, name)
                .await
                .map_err(fail)?;
            if !line.iter().any(|(_, n)| n == name) {
                // Deleted under us (by an operator, or with an old
                // session): forget it; the next attempt queues again.
                self.forget(key, req.holder);
                return Err(Failure {
                    error: LockError::backend(
                        &self.connect,
                        Some(&key.name),
                        "our place in the lock's queue was deleted".to_owned(),
                    ),
                    transient: true,
                    reconnecting: true,
                });
            }
            let ahead: Vec<&str> = line
                .iter()
                .take_while(|(s, _)| *s < mine)
                .map(|(_, n)| n.as_str())
                .collect();
            let before = match in_the_way(req.kind, &ahead) {
                InTheWay::Nothing => {
                    if !req.renew {
                        self.expire_at(key, req.holder, Instant::now() + req.ttl);
                    }
                    return Ok(AcquireReply::acquired(
                        req.fencing.then_some(czxid.unsigned_abs()),
                    ));
                }
                InTheWay::Entry(before) => Some(before.to_owned()),
                InTheWay::Count => None,
            };
            if !req.waiting {
                // Not waiting: leave the line now, in this attempt.
                self.forget(key, req.holder);
                match client.delete(&path, None).await {
                    Ok(()) | Err(zk::Error::NoNode) => {}
                    Err(e) => return Err(fail(e)),
                }
                self.sweep_unanswered(&client, &queue, req.holder);
                return Ok(self.held(false));
            }
            let watcher = match before {
                Some(before) => {
                    let (stat, watcher) = client
                        .check_and_watch_stat(&format!("{queue}/{before}"))
                        .await
                        .map_err(fail)?;
                    if stat.is_none() {
                        // Gone between the listing and the watch: look again.
                        continue;
                    }
                    watcher
                }
                None => {
                    // Permits: any holder ahead that leaves frees one, so
                    // the whole line is watched (a herd of at most the
                    // permit waiters of this lock).
                    let (now, watcher) = client.list_and_watch_children(&queue).await.map_err(fail)?;
                    if now.len() != line.len() {
                        continue;
                    }
                    watcher
                }
            };
            self.with_child(key, req.holder, |c| c.watcher = Some(watcher));
            return Ok(self.held(true));
        }
    }

    /// One attempt at a segmented lock: the first of `count` queues that is
    /// empty, or whose head turns out to be our child. No child waits in a
    /// segment's queue (it would hold a place in one segment while another
    /// frees); a waiter watches every segment's holder instead, and tries
    /// again when any of them goes.
    async fn attempt_segments(&self, req: &AcquireRequest<'_>, count: u32) -> Result<AcquireReply, Failure> {
        let client = self.client().await?;
        let session = client.session_id().0;
        let ours_prefix = format!("{}_", req.holder);
        'look: loop {
            let mut holders = Vec::new();
            // A segment this call already queued in first: an attempt
            // granted too late to use is tried again on the same segment.
            let known = (0..count).find(|&i| self.find(&req.key.segment(i), req.holder, session).is_some());
            let order = known.into_iter().chain((0..count).filter(|&i| Some(i) != known));
            for i in order {
                let segment = req.key.segment(i);
                let queue = self.queue(&segment);
                let fail = |e: zk::Error| self.failure(&segment, &e);
                let line = self.line(&client, &queue).await.map_err(fail)?;
                // Ours already: created by an earlier attempt whose reply
                // was lost (found by name and session), or known here.
                let mut ours = self.find(&segment, req.holder, session);
                if ours.is_none() && line.iter().any(|(_, n)| n.starts_with(&ours_prefix)) {
                    ours = self
                        .adopt(&client, &queue, &segment, req.holder, session)
                        .await
                        .map_err(fail)?;
                }
                let ours = match ours {
                    Some(found) => Some(found),
                    None if line.is_empty() => Some(
                        self.join(&client, &queue, &segment, req.holder, req.kind, session)
                            .await
                            .map_err(fail)?,
                    ),
                    None => None,
                };
                let Some((path, czxid)) = ours else {
                    if let Some((_, head)) = line.first() {
                        holders.push(format!("{queue}/{head}"));
                    }
                    continue;
                };
                // Another contender may have queued first in the same
                // instant: the lowest sequence number holds.
                let mut line = self.line(&client, &queue).await.map_err(fail)?;
                let name = &path[queue.len() + 1..];
                self.drop_twins(&client, &queue, &mut line, &ours_prefix, name)
                    .await
                    .map_err(fail)?;
                match line.first() {
                    Some((_, head)) if path.ends_with(&format!("/{head}")) => {
                        self.segment_waits().remove(req.holder);
                        if !req.renew {
                            self.expire_at(&segment, req.holder, Instant::now() + req.ttl);
                        }
                        return Ok(AcquireReply::Acquired {
                            token: req.fencing.then_some(czxid.unsigned_abs()),
                            segment: Some(i),
                        });
                    }
                    head => {
                        if let Some((_, head)) = head {
                            holders.push(format!("{queue}/{head}"));
                        }
                        self.forget(&segment, req.holder);
                        match client.delete(&path, None).await {
                            Ok(()) | Err(zk::Error::NoNode) => {}
                            Err(e) => return Err(fail(e)),
                        }
                    }
                }
            }
            if holders.len() < usize::try_from(count).unwrap_or(usize::MAX) {
                // A segment was free when we last looked, though not to us.
                continue 'look;
            }
            if !req.waiting {
                return Ok(self.held(false));
            }
            let mut watchers = Vec::with_capacity(holders.len());
            for holder in holders {
                let (stat, watcher) = client
                    .check_and_watch_stat(&holder)
                    .await
                    .map_err(|e| self.failure(req.key, &e))?;
                if stat.is_none() {
                    // Freed since we looked: look again.
                    continue 'look;
                }
                watchers.push(watcher);
            }
            self.keep_segment_wait(req.holder, watchers);
            // Nothing of ours waits in a queue: nothing to give back.
            return Ok(self.held(false));
        }
    }

    /// Deletes from `queue` (and from `line`, its children) every child of
    /// ours but `name`: a create whose answer was lost, landed after an
    /// attempt looked and queued again. It is this call's alone, and ahead
    /// of us it would keep us waiting for ourselves (and everyone behind)
    /// for as long as the session lives.
    async fn drop_twins(
        &self,
        client: &zk::Client,
        queue: &str,
        line: &mut Vec<(u64, String)>,
        ours_prefix: &str,
        name: &str,
    ) -> Result<(), zk::Error> {
        let mut i = 0;
        while i < line.len() {
            if line[i].1.starts_with(ours_prefix) && line[i].1 != name {
                let (_, twin) = line.remove(i);
                match client.delete(&format!("{queue}/{twin}"), None).await {
                    Ok(()) | Err(zk::Error::NoNode) => {}
                    Err(e) => return Err(e),
                }
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// The children of `queue` in sequence order (none if it is missing).
    async fn line(&self, client: &zk::Client, queue: &str) -> Result<Vec<(u64, String)>, zk::Error> {
        match client.list_children(queue).await {
            Ok(names) => Ok(in_order(names)),
            Err(zk::Error::NoNode) => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    fn held(&self, claimed: bool) -> AcquireReply {
        AcquireReply::Held {
            // The longest the child in the way can outlive its holder.
            pttl: Some(self.lease_cap()),
            claimed,
            blocked_by: 0,
        }
    }

    /// Our child for `key` in this session, if we have one.
    fn find(&self, key: &LockKey, holder: &str, session: i64) -> Option<(String, i64)> {
        let mut children = self.children();
        let list = children.get_mut(holder)?;
        let i = list.iter().position(|c| c.lock == key.redis_key)?;
        if list[i].session == session {
            return Some((list[i].path.clone(), list[i].czxid));
        }
        // Created in a session that ended: the child is gone with it.
        list.swap_remove(i);
        None
    }

    async fn adopt(
        &self,
        client: &zk::Client,
        queue: &str,
        key: &LockKey,
        holder: &str,
        session: i64,
    ) -> Result<Option<(String, i64)>, zk::Error> {
        let prefix = format!("{holder}_");
        let names = match client.list_children(queue).await {
            Ok(names) => names,
            Err(zk::Error::NoNode) => return Ok(None),
            Err(e) => return Err(e),
        };
        for name in names.into_iter().filter(|n| n.starts_with(&prefix)) {
            let path = format!("{queue}/{name}");
            if let Some(stat) = client.check_stat(&path).await?
                && stat.ephemeral_owner == session
            {
                self.register(key, holder, &path, session, stat.czxid);
                return Ok(Some((path, stat.czxid)));
            }
        }
        Ok(None)
    }

    fn with_child<T>(&self, key: &LockKey, holder: &str, f: impl FnOnce(&mut Child) -> T) -> Option<T> {
        let mut children = self.children();
        let child = children
            .get_mut(holder)?
            .iter_mut()
            .find(|c| c.lock == key.redis_key)?;
        Some(f(child))
    }

    fn forget(&self, key: &LockKey, holder: &str) -> Option<Child> {
        let mut children = self.children();
        let list = children.get_mut(holder)?;
        let i = list.iter().position(|c| c.lock == key.redis_key)?;
        let child = list.swap_remove(i);
        if list.is_empty() {
            children.remove(holder);
        }
        Some(child)
    }

    /// A fixed lease: delete the child when its ttl has passed, unless it
    /// was released (or extended) by then.
    fn expire_at(&self, key: &LockKey, holder: &str, at: Instant) {
        // Only later than an end already set, as on the server.
        self.with_child(key, holder, |c| c.expires = c.expires.max(Some(at)));
        let Some(client) = self.live() else {
            return;
        };
        let children = Arc::downgrade(&self.children);
        let (lock, holder) = (key.redis_key.clone(), holder.to_owned());
        tokio::spawn(async move {
            let mut at = at;
            loop {
                tokio::time::sleep_until(at).await;
                let Some(children) = children.upgrade() else {
                    return;
                };
                let path = {
                    let mut children = children.lock().unwrap_or_else(PoisonError::into_inner);
                    let Some(list) = children.get_mut(&holder) else {
                        return;
                    };
                    let Some(i) = list.iter().position(|c| c.lock == lock) else {
                        return;
                    };
                    match list[i].expires {
                        Some(later) if later > Instant::now() => {
                            at = later;
                            continue;
                        }
                        _ => {}
                    }
                    let child = list.swap_remove(i);
                    if list.is_empty() {
                        children.remove(&holder);
                    }
                    child.path
                };
                // An owner's delete of its own child; if the session ended
                // the child is gone already.
                let _ = client.delete(&path, None).await;
                return;
            }
        });
    }

    /// For a holder done with `queue`: a create of its whose answer never
    /// came may have landed unseen, or land later still. Looked for now,
    /// and again once it must have landed or failed (its session moved on
    /// or ended); anything under the holder's name there is garbage.
    fn sweep_unanswered(&self, client: &Arc<zk::Client>, queue: &str, holder: &str) {
        if !self.unanswered().remove(&format!("{queue}/{holder}_")) {
            return;
        }
        let search = || Doomed::Search {
            queue: queue.to_owned(),
            prefix: format!("{holder}_"),
        };
        let (now, later) = (search(), search());
        let (client, after) = (Arc::clone(client), self.lease_cap() * 2 + self.timeout);
        tokio::spawn(async move {
            now.delete(Arc::clone(&client)).await;
            tokio::time::sleep(after).await;
            later.delete(client).await;
        });
    }

    /// Deletes our children of `keys`: those this process knows, and any an
    /// attempt whose reply was lost may have left.
    async fn remove(&self, keys: &[&LockKey], holder: &str) -> Result<bool, Failure> {
        if keys.is_empty() {
            return Ok(false);
        }
        let client = self.client().await?;
        let session = client.session_id().0;
        let mut any = false;
        for key in keys {
            let queue = self.queue(key);
            self.sweep_unanswered(&client, &queue, holder);
            let doomed = match self.forget(key, holder) {
                // Deleted with its session already.
                Some(child) if child.session != session => continue,
                Some(child) => Doomed::Known(child.path),
                // An attempt whose reply was lost may have left one.
                None => Doomed::Search {
                    queue,
                    prefix: format!("{holder}_"),
                },
            };
            // The common case, a known child on a healthy session, is one
            // delete awaited here; anything else is handed to a task that
            // keeps at it after the command timeout.
            if let Doomed::Known(path) = &doomed {
                match tokio::time::timeout(self.timeout, client.delete(path, None)).await {
                    Ok(Ok(())) => {
                        any = true;
                        continue;
                    }
                    Ok(Err(zk::Error::NoNode | zk::Error::SessionExpired | zk::Error::ClientClosed)) => {
                        continue;
                    }
                    // Unanswered or refused for now: retried below (a
                    // delete that did land shows as `NoNode` then).
                    _ => {}
                }
            }
            // A known child was ours until now, whatever a retry finds.
            let known = matches!(doomed, Doomed::Known(_));
            let deletion = tokio::spawn(doomed.delete(Arc::clone(&client)));
            any |= known
                || match tokio::time::timeout(self.timeout, deletion).await {
                    Ok(Ok(existed)) => existed,
                    _ => true,
                };
        }
        Ok(any)
    }

    /// Writes what the leader `holder` of the election `key` leads with
    /// (`AnyBackend::proclaim`) as its child's data: the child is the term
    /// (it heads the line for as long as it lives), so no record of an
    /// earlier term can be read as this one's. `Ok(false)`: the child is
    /// gone, and the term with it.
    pub(crate) async fn proclaim(&self, key: &LockKey, holder: &str, value: &str) -> Result<bool, Failure> {
        let client = self.client().await?;
        let Some((path, _)) = self.find(key, holder, client.session_id().0) else {
            return Ok(false);
        };
        self.bounded(key, "a proclamation", async {
            match client.set_data(&path, value.as_bytes(), None).await {
                Ok(_) => Ok(true),
                Err(zk::Error::NoNode) => Ok(false),
                Err(e) => Err(self.failure(key, &e)),
            }
        })
        .await
    }

    /// Who leads the election `key` (`AnyBackend::leader`): the head of its
    /// line, with the head's creation zxid (the term's fencing token) and
    /// data. No lease is read: a head lives as long as its session.
    pub(crate) async fn leader(&self, key: &LockKey) -> Result<Option<LeaderRecord>, Failure> {
        let client = self.client().await?;
        let queue = self.queue(key);
        self.bounded(key, "a read of who leads", async {
            loop {
                let line = self
                    .line(&client, &queue)
                    .await
                    .map_err(|e| self.failure(key, &e))?;
                let Some((_, name)) = line.first() else {
                    return Ok(None);
                };
                match client.get_data(&format!("{queue}/{name}")).await {
                    Ok((data, stat)) => return Ok(Some(head_record(name, &data, &stat))),
                    // The head left between the listing and the read: the
                    // next one is the leader now (bounded by the timeout).
                    Err(zk::Error::NoNode) => {}
                    Err(e) => return Err(self.failure(key, &e)),
                }
            }
        })
        .await
    }

    /// [`leader`](Self::leader) for an observer: the line and the head's
    /// data read with watches, and a future that resolves when either
    /// changes (a candidate joins or leaves, the leader proclaims, the
    /// session breaks). A watch dropped unfired is removed.
    pub(crate) async fn leader_watched(
        &self,
        key: &LockKey,
    ) -> Result<(Option<LeaderRecord>, LeaderChange), Failure> {
        let client = self.client().await?;
        let queue = self.queue(key);
        let fail = |e: zk::Error| self.failure(key, &e);
        self.bounded(key, "a read of who leads", async {
            loop {
                let (names, line_changed) = match client.list_and_watch_children(&queue).await {
                    Ok(listed) => listed,
                    Err(zk::Error::NoNode) => {
                        // No line yet: told when it is made.
                        let (made, making) = client.check_and_watch_stat(&queue).await.map_err(fail)?;
                        if made.is_some() {
                            continue;
                        }
                        let change: LeaderChange = Box::pin(async move {
                            making.changed().await;
                        });
                        return Ok((None, change));
                    }
                    Err(e) => return Err(fail(e)),
                };
                let Some((_, name)) = in_order(names).into_iter().next() else {
                    let change: LeaderChange = Box::pin(async move {
                        line_changed.changed().await;
                    });
                    return Ok((None, change));
                };
                match client.get_and_watch_data(&format!("{queue}/{name}")).await {
                    Ok((data, stat, data_changed)) => {
                        let change: LeaderChange = Box::pin(async move {
                            let line = std::pin::pin!(line_changed.changed());
                            let data = std::pin::pin!(data_changed.changed());
                            futures_util::future::select(line, data).await;
                        });
                        return Ok((Some(head_record(&name, &data, &stat)), change));
                    }
                    // The head left between the listing and the read: list
                    // again (the line's watch fired, and is set anew).
                    Err(zk::Error::NoNode) => {}
                    Err(e) => return Err(fail(e)),
                }
            }
        })
        .await
    }

    /// Resolves when the child before ours changes (or the session does):
    /// the waiter's turn may have come. At once if no watch is set.
    pub(crate) async fn turn(&self, key: &LockKey, holder: &str) {
        let watcher = self.with_child(key, holder, |c| c.watcher.take()).flatten();
        if let Some(watcher) = watcher {
            watcher.changed().await;
            return;
        }
        // A segmented lock's waiter: whichever segment frees first.
        let segments = self.segment_waits().remove(holder);
        if let Some(wait) = segments
            && !wait.watchers.is_empty()
        {
            let changes = wait.watchers.into_iter().map(|w| Box::pin(w.changed()));
            futures_util::future::select_all(changes).await;
        }
    }

    fn unanswered(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        self.unanswered.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn segment_waits(&self) -> std::sync::MutexGuard<'_, HashMap<String, SegmentWait>> {
        self.segment_waits.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps a segmented lock's waiter's watches for its `turn`. A waiter
    /// that stopped waiting never takes them: anything older than a waiter's
    /// longest pause between attempts is dropped (which removes the
    /// watches).
    fn keep_segment_wait(&self, holder: &str, watchers: Vec<zk::OneshotWatcher>) {
        let now = Instant::now();
        let stale = self.lease_cap() * 2 + self.timeout;
        let mut waits = self.segment_waits();
        waits.retain(|_, w| now.duration_since(w.since) < stale);
        waits.insert(holder.to_owned(), SegmentWait { since: now, watchers });
    }

    /// Whether our child still exists in this session.
    async fn confirm(
        &self,
        client: &zk::Client,
        key: &LockKey,
        holder: &str,
        ttl: Duration,
    ) -> Result<bool, Failure> {
        let session = client.session_id().0;
        let Some(path) = self
            .with_child(key, holder, |c| {
                // A fixed lease's end only moves later, as on the server.
                c.expires = c.expires.map(|ends| ends.max(Instant::now() + ttl));
                (c.session == session).then(|| c.path.clone())
            })
            .flatten()
        else {
            return Ok(false);
        };
        match client.check_stat(&path).await {
            Ok(Some(stat)) => Ok(stat.ephemeral_owner == session),
            Ok(None) | Err(zk::Error::NoNode | zk::Error::SessionExpired) => Ok(false),
            Err(e) => Err(self.failure(key, &e)),
        }
    }
}

impl Backend for ZooKeeperBackend {
    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<AcquireReply, Failure> {
        // A set arrives one lock at a time (see `AnyBackend::groups`).
        debug_assert!(req.also.is_empty());
        match req.kind {
            Kind::Segments(count) => {
                self.bounded(req.key, "acquire", self.attempt_segments(req, count))
                    .await
            }
            _ => self.bounded(req.key, "acquire", self.attempt(req)).await,
        }
    }

    async fn release(&self, key: &LockKey, holder: &str) -> Result<bool, Failure> {
        self.remove(&[key], holder).await
    }

    async fn release_many(&self, keys: &[LockKey], holder: &str) -> Result<bool, Failure> {
        let keys: Vec<&LockKey> = keys.iter().collect();
        self.remove(&keys, holder).await
    }

    async fn release_segments(&self, key: &LockKey, count: u32, holder: &str) -> Result<bool, Failure> {
        self.segment_waits().remove(holder);
        let segments: Vec<LockKey> = (0..count).map(|i| key.segment(i)).collect();
        let segments: Vec<&LockKey> = segments.iter().collect();
        self.remove(&segments, holder).await
    }

    async fn renew(&self, key: &LockKey, holder: &str, ttl: Duration) -> Result<bool, Failure> {
        let client = self.client().await?;
        self.bounded(key, "renew", self.confirm(&client, key, holder, ttl))
            .await
    }

    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Result<Vec<Renewal>, Failure> {
        let client = match self.client().await {
            Ok(client) => client,
            Err(f) if f.transient => return Ok(vec![Renewal::Unconfirmed; items.len()]),
            Err(f) => return Err(f),
        };
        // The client pipelines the requests on its one connection: one
        // round trip for the batch.
        let checks = items
            .iter()
            .map(|item| self.confirm(&client, item.key, item.holder, item.ttl));
        let outcomes = futures_util::future::join_all(checks).await;
        Ok(outcomes
            .into_iter()
            .map(|outcome| match outcome {
                Ok(confirmed) => Renewal::from(confirmed),
                Err(_) => Renewal::Unconfirmed,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DEFAULT_ROOT, DEFAULT_SESSION_TIMEOUT};

    fn backend(connect: &str) -> ZooKeeperBackend {
        ZooKeeperBackend::new(
            connect,
            DEFAULT_ROOT,
            DEFAULT_SESSION_TIMEOUT,
            Duration::from_secs(1),
            None,
            false,
        )
        .expect("a usable connect string")
    }

    #[test]
    fn tls_is_for_every_member_or_none() {
        let mixed = backend("tcp+tls://a:2281,b:2181").secured(None, None);
        assert!(
            matches!(&mixed, Err(LockError::InvalidConfig { reason, .. }) if reason.contains("every member")),
            "{mixed:?}"
        );
        assert!(backend("a:2181,tcp://b:2181/chroot").secured(None, None).is_ok());
    }

    #[test]
    fn members_are_read_as_the_zookeeper_client_reads_them() {
        let member = |host, port, tls| Member { host, port, tls };
        assert_eq!(
            members("tcp+tls://zk1.example:2281,tcp+tls://[::1]:2282/app/locks"),
            Some(vec![member("zk1.example", 2281, true), member("::1", 2282, true)])
        );
        assert_eq!(
            members("zk1,tcp://zk2:2182/app"),
            Some(vec![member("zk1", 2181, false), member("zk2", 2182, false)])
        );
        // A chroot only after the last member, as the client reads it.
        assert_eq!(members("zk1:2181/app,zk2:2181"), None);
        assert_eq!(members("[::1"), None);
        assert_eq!(members("zk1:0"), None);
        assert_eq!(members(":2181"), None);
        // Not trimmed: the client would read ` tcp+tls://` as a host.
        assert_eq!(
            members("zk1:2181, tcp+tls://zk2:2281").map(|m| m[1].tls),
            Some(false)
        );
    }

    #[test]
    fn roots_are_absolute_paths() {
        assert!(root_problem("/distributed-locks").is_none());
        assert!(root_problem("/a/b").is_none());
        for bad in ["", "/", "locks", "/a/", "/a//b", "/a/../b", "/a/./b"] {
            assert!(root_problem(bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn any_key_is_one_node_name() {
        let b = ZooKeeperBackend::new(
            "127.0.0.1:2181",
            DEFAULT_ROOT,
            DEFAULT_SESSION_TIMEOUT,
            Duration::from_secs(1),
            None,
            false,
        )
        .expect("valid");
        let key = LockKey::new("lock:", "a/b %c ü..".into()).expect("key");
        let queue = b.queue(&key);
        assert_eq!(queue, "/distributed-locks/lock:{a%2Fb%20%25c%20%C3%BC..}");
        assert_eq!(queue.matches('/').count(), 2);
    }

    #[test]
    fn a_dead_member_is_worth_another_attempt_and_a_bad_request_is_not() {
        // (The client's transport errors, `Custom`, cannot be built outside
        // it: `zookeeper.rs`'s ensemble tests meet them for real.)
        assert_eq!(classify(&zk::Error::ConnectionLoss), (true, false));
        assert_eq!(classify(&zk::Error::SessionExpired), (true, true));
        assert_eq!(classify(&zk::Error::NoHosts), (true, true));
        assert_eq!(classify(&zk::Error::NoAuth), (false, false));
        assert_eq!(classify(&zk::Error::BadArguments(&"bad")), (false, false));
    }

    #[test]
    fn sequence_numbers_come_from_the_name_end() {
        assert_eq!(sequence("0123abcd:7_0000000042"), Some(42));
        assert_eq!(sequence("f:0123abcd:7_0000000001"), Some(1));
        assert_eq!(sequence("junk"), None);
    }
}
