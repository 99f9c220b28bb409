//! Locks as etcd queues: keys attached to one lease per client.
//!
//! A lock `K` is the key range `<root>/<K encoded>/`. Each contender puts
//! a key `<root>/<K encoded>/<side><lease>:<slot>` (see `Entries`), whose
//! value is its holder id, with this client's lease, in a
//! transaction that creates it only if it is missing (so an attempt whose
//! reply was lost finds its own key again, never a second one) and reads
//! the whole line in the same round trip. The line is ordered by create
//! revision, which the cluster assigns and which only grows; the key with
//! the lowest holds the lock, and each waiter watches only the key just
//! before its own, from the revision it read the line at, so a release
//! wakes exactly one waiter and no deletion between the read and the watch
//! is missed.
//!
//! The runtime's leases map onto the etcd lease this way:
//! - the client holds one lease, kept alive by the shared watchdog (every
//!   renewal batch sends one keep-alive before it confirms its keys) and by
//!   the attempts of waiters, which come at least every third of it;
//! - a lock's lease is never longer than two thirds of the etcd lease: an
//!   attempt keeps the etcd lease alive whenever its last confirmation is
//!   a third old, so from any attempt's start the etcd lease has at least
//!   that much left ([`EtcdBackend::lease_cap`]);
//! - a renewal confirms that the key still exists on this lease; a lease
//!   the cluster says is gone (expired, or revoked by an operator) is
//!   `Gone`, and a cluster that does not answer leaves it unconfirmed
//!   until its deadline.
//!
//! The fencing token is the key's create revision: every change the
//! cluster commits gets a larger revision, so tokens grow per lock across
//! clients, leases and leader changes.
//!
//! The client is `etcd-client`, the kept Rust client of the etcd v3 API
//! (leases, transactions, watches over gRPC).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use etcd_client as etcd;
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};

use super::contract::{
    AcquireReply, AcquireRequest, Backend, Failure, LeaderChange, LeaderRecord, RenewItem, Renewal,
    recorded_value,
};
use super::queue::{InTheWay, in_the_way};
use crate::config::{ClientCertificate, EtcdUser};
use crate::error::LockError;
use crate::key::LockKey;
use crate::spec::Kind;

/// Characters a lock name cannot keep in its key: `/` would make one lock's
/// range hold another's (`a/` holds `a/b/…`), and `%` is the escape.
const ESCAPED: &AsciiSet = &CONTROLS.add(b'/').add(b'%');

/// The suffix that turns a line's name into its tombstones' range
/// (`<root>/<lock>%gone/<key>`): `%g` is no escape, so no lock's line is
/// named so, and the range is in no lock's line.
const TOMBSTONES: &str = "%gone";

/// The suffix that turns an election's line (`<root>/<lock>`) into the key
/// of its record (`<root>/<lock>%leader`): like [`TOMBSTONES`], no escape,
/// so in no lock's line and no lock's name.
const LEADER_RECORD: &str = "%leader";

/// How long a tombstone stays. etcd answers or drops a request within its
/// deadline (the command timeout) and an election or two: a put not
/// applied after this long will not be.
const TOMBSTONE_LIFE: Duration = Duration::from_secs(30);

/// The most operations etcd takes in one transaction (its default
/// `--max-txn-ops`): a renewal batch is split into transactions this big.
const MAX_TXN_OPS: usize = 128;

/// Why this backend cannot take a lock of `kind`, if it cannot.
pub(crate) fn unsupported(kind: Kind) -> Option<&'static str> {
    match kind {
        // As on ZooKeeper, a lock is a queue: exclusive and fair are one
        // thing, readers and permit holders are let in by where they stand,
        // and a segment is the first free queue of N.
        Kind::Exclusive | Kind::Fair | Kind::Read | Kind::Write | Kind::Permits(_) | Kind::Segments(_) => {
            None
        }
    }
}

/// Whether `root` can be the start of every lock key.
pub(crate) fn root_problem(root: &str) -> Option<String> {
    let ok = !root.is_empty() && !root.ends_with('/') && !root.chars().any(char::is_control);
    (!ok).then(|| {
        format!(
            "the etcd root `{root}` must be a key prefix like `/distributed-locks`, without a trailing `/`"
        )
    })
}

/// The client's etcd lease.
#[derive(Debug, Clone)]
struct Lease {
    id: i64,
    /// When the last keep-alive the cluster answered was sent: the lease
    /// lives at least its ttl past this.
    confirmed_at: Instant,
    /// The keep-alive stream, opened on first use; taken out while in use,
    /// so that an exchange cut short (a timeout) drops it rather than leave
    /// its answer to be read as the next one's.
    keeper: Arc<tokio::sync::Mutex<Option<(etcd::LeaseKeeper, etcd::LeaseKeepAliveStream)>>>,
}

mod admin;

/// A key of ours: in line, or holding.
struct Entry {
    /// The lock's name, `P{K}`.
    lock: String,
    /// The key: `<line>/<side><lease id>:<slot>`.
    path: String,
    /// Its slot in the lock's line, this client's to reuse once the key
    /// is gone.
    slot: u32,
    /// Set while waiting: resolves when the key before ours is deleted.
    watch: Option<etcd::WatchStream>,
    /// A fixed lease: when this client deletes the key.
    expires: Option<Instant>,
    /// A put of the key may still be on its way to the cluster: an attempt
    /// sent it and was cut short, or got no answer. Its give-back then
    /// leaves a tombstone (see [`Doomed`]).
    unanswered: bool,
}

/// A key of ours to delete, and its slot. With `tombstone`, a put of it
/// may still be on its way, and two requests keep no order: the put could
/// be applied after the delete and put the key back, on a lease this
/// client keeps alive, for good. So the delete also puts the key's
/// tombstone (`tombstone_of`), which every put of the key is conditional
/// on; the slot is freed when the tombstone goes, [`TOMBSTONE_LIFE`] later.
struct Doomed {
    path: String,
    slot: u32,
    tombstone: bool,
}

impl Doomed {
    fn of(entry: Entry) -> Doomed {
        Doomed {
            path: entry.path,
            slot: entry.slot,
            tombstone: entry.unanswered,
        }
    }
}

/// Keys a removal has forgotten and not yet seen deleted: dropped with
/// them (the removal cut short), it hands them to a background deletion.
struct Unconfirmed<'a> {
    backend: &'a EtcdBackend,
    doomed: Option<Vec<Doomed>>,
}

impl Drop for Unconfirmed<'_> {
    fn drop(&mut self) {
        if let Some(doomed) = self.doomed.take() {
            self.backend.delete_in_background(doomed, Duration::ZERO);
        }
    }
}

/// Where the tombstone of the key `path` (`<line>/<name>`) goes.
fn tombstone_of(path: &str) -> String {
    match path.rsplit_once('/') {
        Some((line, name)) => format!("{line}{TOMBSTONES}/{name}"),
        None => format!("{path}{TOMBSTONES}"),
    }
}

/// This client's keys, by holder id (a set's locks share one), and the
/// slots taken in each line.
///
/// A key is named by the client's lease and a slot number, not by the
/// holder id: etcd keeps every key ever deleted in its index until the
/// history is compacted, and reading a line walks all of them, so a new
/// name per acquisition would make every read of a busy line slower than
/// the last. The holder id is the key's value. A slot is reused only once
/// its key's deletion was confirmed, and only this client writes under its
/// lease's names, so a key's name is its owner.
#[derive(Default)]
struct Entries {
    by_holder: HashMap<String, Vec<Entry>>,
    /// Per line (`<root>/<lock>`), the slots in use.
    slots: HashMap<String, std::collections::BTreeSet<u32>>,
}

impl Entries {
    fn find(&mut self, lock: &str, holder: &str) -> Option<&mut Entry> {
        self.by_holder
            .get_mut(holder)?
            .iter_mut()
            .find(|e| e.lock == lock)
    }

    fn remove(&mut self, lock: &str, holder: &str) -> Option<Entry> {
        let list = self.by_holder.get_mut(holder)?;
        let i = list.iter().position(|e| e.lock == lock)?;
        let entry = list.swap_remove(i);
        if list.is_empty() {
            self.by_holder.remove(holder);
        }
        Some(entry)
    }

    /// Frees the slot of a key (or of its tombstone) whose deletion was
    /// confirmed.
    fn free(&mut self, path: &str, slot: u32) {
        let Some(line) = path.rsplit_once('/').map(|(line, _)| line) else {
            return;
        };
        let line = line.strip_suffix(TOMBSTONES).unwrap_or(line);
        if let Some(used) = self.slots.get_mut(line) {
            used.remove(&slot);
            if used.is_empty() {
                self.slots.remove(line);
            }
        }
    }
}

/// A holder id's side: `r:`, `w:`, `p:`, `f:`, or none (exclusive); the
/// line's order reads it from the key's name.
fn side_of(holder: &str) -> &'static str {
    ["r:", "w:", "p:", "f:"]
        .into_iter()
        .find(|side| holder.starts_with(side))
        .unwrap_or("")
}

/// A segmented lock's waiter: a watch on each segment's holder, and when
/// it set them.
struct SegmentWait {
    since: Instant,
    watches: Vec<etcd::WatchStream>,
}

/// What a look at a lock's line found.
struct Line {
    /// Keys in create-revision order: `(create revision, holder id)`.
    keys: Vec<(i64, String)>,
    /// The revision the line was read at: a watch from the next one sees
    /// every change after the read.
    revision: i64,
}

/// An etcd cluster's locks.
pub(crate) struct EtcdBackend {
    endpoints: Vec<String>,
    node: String,
    root: String,
    /// The lease ttl asked of the cluster, in whole seconds.
    asked_ttl: Duration,
    timeout: Duration,
    /// How the driver connects: timeouts, and the user and TLS settings
    /// [`secured`](Self::secured) adds. Holds the password: never shown
    /// (the `Debug` below leaves it out).
    options: etcd::ConnectOptions,
    /// Who the client authenticates as, for messages.
    user: Option<String>,
    /// Whether the client speaks TLS (`https://` endpoints).
    tls: bool,
    /// Whether the last failure was a member closing the connection on
    /// us: at start-up, what a TLS-only member does to a plain client.
    closed_on_us: std::sync::atomic::AtomicBool,
    /// Boxed: the client is large, and every backend shares one enum.
    client: tokio::sync::OnceCell<Box<etcd::Client>>,
    /// Set when the cluster refused the token as old: the next request
    /// authenticates again first (see [`token_outdated`]).
    token_outdated: std::sync::atomic::AtomicBool,
    /// Held while the token is renewed: one authentication (costly to the
    /// cluster) for all the requests refused at once.
    renewing_token: tokio::sync::Mutex<()>,
    /// Shared with the tasks that finish unanswered deletions: they stop
    /// once the lease their keys are on has ended.
    lease: Arc<Mutex<Option<Lease>>>,
    /// One grant at a time after a lease ended.
    granting: tokio::sync::Mutex<()>,
    entries: Arc<Mutex<Entries>>,
    segment_waits: Mutex<HashMap<String, SegmentWait>>,
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("endpoints", &self.endpoints)
            .field("root", &self.root)
            .field("lease_ttl", &self.asked_ttl)
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// What went wrong, for the retry loop: `(transient, reconnecting)`.
///
/// A member that is down, has no leader or does not answer in time costs
/// time within `wait`, never an error (DESIGN §11): the client moves to
/// another endpoint by itself. Only the request's own fault or the
/// cluster's configuration (permissions, a bad key) is final.
fn classify(e: &etcd::Error) -> (bool, bool) {
    use tonic::Code;
    match e {
        etcd::Error::GRpcStatus(status) => match status.code() {
            Code::InvalidArgument
            | Code::PermissionDenied
            | Code::Unauthenticated
            | Code::Unimplemented
            | Code::OutOfRange
            | Code::AlreadyExists
            | Code::FailedPrecondition => (false, false),
            // `Unavailable` (no leader, a member shutting down),
            // `DeadlineExceeded`, `Unknown` (a member stopped mid-call),
            // `NotFound` (our lease, just expired: a new one is granted).
            _ => (true, false),
        },
        etcd::Error::TransportError(_) | etcd::Error::IoError(_) => (true, true),
        etcd::Error::LeaseKeepAliveError(_) | etcd::Error::WatchError(_) => (true, false),
        _ => (false, false),
    }
}

/// Whether `e` is the other end closing the connection (reset, or an end
/// of stream mid-exchange).
fn closed_by_peer(e: &etcd::Error) -> bool {
    use std::io::ErrorKind;
    let mut cause: Option<&(dyn std::error::Error + 'static)> = match e {
        etcd::Error::GRpcStatus(status) => Some(status),
        other => Some(other),
    };
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                ErrorKind::ConnectionReset | ErrorKind::UnexpectedEof | ErrorKind::BrokenPipe
            )
        {
            return true;
        }
        cause = c.source();
    }
    false
}

/// `(host, port)` of an endpoint, `http://host:port` or `host:port`.
fn host_and_port(endpoint: &str) -> Option<(&str, u16)> {
    let authority = endpoint.strip_prefix("http://").unwrap_or(endpoint);
    let authority = authority.split('/').next()?;
    let (host, port) = authority.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Some((host, port.parse().ok()?))
}

/// What a handshake that TLS refused says, and what mends it.
fn tls_failed(error: &(dyn std::error::Error + 'static)) -> String {
    format!(
        "TLS to the etcd cluster failed: {}; give the cluster's CA with `tls_root_certificate`, and a client certificate with `etcd_client_certificate` if the cluster asks for one (`--client-cert-auth`)",
        super::startup::with_causes(error)
    )
}

/// Whether the cluster refused the token as issued before the last change
/// of its users, roles or permissions ("revision of auth store is old").
/// The token is renewed by authenticating again, which the driver does
/// by itself only for a token refused as invalid or expired. (A JWT
/// carries the revision it was signed at and is refused until it expires;
/// a simple token only by a request in flight across the change.)
fn token_outdated(e: &etcd::Error) -> bool {
    matches!(e, etcd::Error::GRpcStatus(s) if s.message().contains("revision of auth store is old"))
}

/// Whether the cluster said our lease does not exist (expired or revoked).
fn lease_not_found(e: &etcd::Error) -> bool {
    matches!(e, etcd::Error::GRpcStatus(s) if s.code() == tonic::Code::NotFound)
}

impl EtcdBackend {
    pub(crate) fn new(
        endpoints: &[&str],
        root: &str,
        lease_ttl: Duration,
        timeout: Duration,
    ) -> Result<Self, LockError> {
        let node = format!("etcd({})", endpoints.join(", "));
        let invalid = |reason: String| LockError::InvalidConfig {
            node: node.clone(),
            reason,
        };
        if let Some(problem) = root_problem(root) {
            return Err(invalid(problem));
        }
        if endpoints.is_empty() || endpoints.iter().any(|e| e.trim().is_empty()) {
            return Err(invalid(
                "give at least one endpoint, `host:port`, `http://host:port` or `https://host:port`, and no empty one".into(),
            ));
        }
        // etcd grants whole seconds; asking less than 2 s leaves a
        // keep-alive no time to arrive in.
        if lease_ttl < Duration::from_secs(2) {
            return Err(invalid(format!(
                "the etcd lease ttl must be at least 2s (etcd grants whole seconds), got {lease_ttl:?}"
            )));
        }
        Ok(EtcdBackend {
            endpoints: endpoints.iter().map(|e| (*e).to_owned()).collect(),
            node,
            root: root.to_owned(),
            asked_ttl: Duration::from_secs(lease_ttl.as_secs()),
            timeout,
            options: etcd::ConnectOptions::new()
                .with_connect_timeout(timeout)
                .with_timeout(timeout)
                // A member cut off from the others fails requests at once
                // instead of holding them: the client tries another.
                .with_require_leader(true),
            user: None,
            tls: false,
            closed_on_us: std::sync::atomic::AtomicBool::new(false),
            client: tokio::sync::OnceCell::new(),
            token_outdated: std::sync::atomic::AtomicBool::new(false),
            renewing_token: tokio::sync::Mutex::new(()),
            lease: Arc::new(Mutex::new(None)),
            granting: tokio::sync::Mutex::new(()),
            entries: Arc::new(Mutex::new(Entries::default())),
            segment_waits: Mutex::new(HashMap::new()),
        })
    }

    /// The same backend authenticating as `user`, and speaking TLS when
    /// its endpoints are `https://` (verified against `root_pem` or the
    /// system's roots, showing `certificate` when given). Mixed schemes, a
    /// certificate without `https://`, and PEM that does not parse are
    /// refused here, before any connection.
    pub(crate) fn secured(
        mut self,
        user: Option<&EtcdUser>,
        certificate: Option<&ClientCertificate>,
        root_pem: Option<&[u8]>,
    ) -> Result<Self, LockError> {
        let invalid = |reason: String| LockError::InvalidConfig {
            node: self.node.clone(),
            reason,
        };
        let https = self
            .endpoints
            .iter()
            .filter(|e| e.starts_with("https://"))
            .count();
        if https > 0 && self.endpoints.iter().any(|e| e.starts_with("http://")) {
            return Err(invalid(
                "give every endpoint as `https://` or none: the client speaks TLS to all members or to none"
                    .into(),
            ));
        }
        if https == 0 && certificate.is_some() {
            return Err(invalid(
                "a client certificate is shown over TLS only: give the endpoints as `https://host:port`"
                    .into(),
            ));
        }
        if https > 0 {
            self.options = super::tls::etcd_with_tls(self.options, root_pem, certificate).map_err(invalid)?;
            self.tls = true;
        }
        if let Some(user) = user {
            if user.name.is_empty() {
                return Err(invalid("the etcd user name is empty".into()));
            }
            // The cluster's tokens expire (`--auth-token-ttl`, a member's
            // restart): a refused token is renewed and the request sent
            // again, once.
            self.options = self
                .options
                .with_user(user.name.clone(), user.password.clone())
                .with_auto_token_refresh(true);
            self.user = Some(user.name.clone());
        }
        Ok(self)
    }

    pub(crate) fn node(&self) -> &str {
        &self.node
    }

    /// The longest a lock's lease is trusted from an attempt's or a
    /// renewal's start: two thirds of the etcd lease, since an attempt
    /// sends a keep-alive only once the last confirmation is a third old.
    pub(crate) fn lease_cap(&self) -> Duration {
        self.asked_ttl * 2 / 3
    }

    /// Connects and takes a lease now: unreachable endpoints or a refusing
    /// cluster fail at start-up.
    /// One attempt: a cluster without a leader, or members that refuse
    /// connections, is `transient`, to be waited for
    /// (`startup::when_ready`).
    pub(crate) async fn verify(&self) -> Result<(), Failure> {
        let ready = async {
            self.lease_id().await?;
            self.access_check().await
        };
        self.closed_on_us
            .store(false, std::sync::atomic::Ordering::Relaxed);
        match tokio::time::timeout(self.timeout * 3, ready).await {
            Ok(Err(failure))
                if failure.transient && self.closed_on_us.load(std::sync::atomic::Ordering::Relaxed) =>
            {
                // A plain client that a member closed on: a member that
                // speaks only TLS, or one going down. Only the first
                // answers a TLS hello.
                for endpoint in &self.endpoints {
                    if let Some((host, port)) = host_and_port(endpoint)
                        && super::tls::answers_tls(host, port, self.timeout).await
                    {
                        let host = if host.contains(':') {
                            format!("[{host}]")
                        } else {
                            host.to_owned()
                        };
                        return Err(Failure {
                            error: LockError::InvalidConfig {
                                node: self.node.clone(),
                                reason: format!(
                                    "the member at `{endpoint}` speaks TLS only: give its endpoint as `https://{host}:{port}`"
                                ),
                            },
                            transient: false,
                            reconnecting: false,
                        });
                    }
                }
                Err(failure)
            }
            Ok(result) => result,
            Err(_) => Err(Failure {
                error: LockError::backend(
                    &self.node,
                    None,
                    format!("no lease granted within {}ms", (self.timeout * 3).as_millis()),
                ),
                transient: true,
                reconnecting: false,
            }),
        }
    }

    /// Whether this client may read and write every key under the root,
    /// asked without writing anything: etcd checks the permissions of both
    /// branches of a transaction before it evaluates its condition, and
    /// this one's (a create revision below zero) never holds. On a cluster
    /// without authentication every request is allowed.
    async fn access_check(&self) -> Result<(), Failure> {
        // Two keys: etcd refuses a transaction that puts and deletes one.
        let (put, delete) = (
            format!("{}/%access-check/put", self.root),
            format!("{}/%access-check/delete", self.root),
        );
        let line = format!("{}/", self.root);
        let never = etcd::Compare::create_revision(put.as_str(), etcd::CompareOp::Less, 0);
        let txn = etcd::Txn::new().when([never]).and_then([
            etcd::TxnOp::get(
                line,
                Some(etcd::GetOptions::new().with_prefix().with_count_only()),
            ),
            etcd::TxnOp::put(put, "", None),
            etcd::TxnOp::delete(delete, None),
        ]);
        let mut client = self.client().await?;
        client
            .txn(txn)
            .await
            .map(drop)
            .map_err(|e| self.failure(None, &e))
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn segment_waits(&self) -> std::sync::MutexGuard<'_, HashMap<String, SegmentWait>> {
        self.segment_waits.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn current_lease(&self) -> Option<Lease> {
        self.lease.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    async fn client(&self) -> Result<etcd::Client, Failure> {
        let connect = || async {
            etcd::Client::connect(&self.endpoints, Some(self.options.clone()))
                .await
                .map(Box::new)
        };
        let client = self
            .client
            .get_or_try_init(connect)
            .await
            .map(|client| (**client).clone())
            .map_err(|e| self.failure(None, &e))?;
        if self.token_outdated.load(Ordering::Relaxed) {
            let _renewing = self.renewing_token.lock().await;
            // Every clone of the client shares its token: renewed once.
            if self.token_outdated.swap(false, Ordering::Relaxed)
                && let Err(e) = client.refresh_token().await
            {
                self.token_outdated.store(true, Ordering::Relaxed);
                return Err(self.failure(None, &e));
            }
        }
        Ok(client)
    }

    fn failure(&self, key: Option<&LockKey>, e: &etcd::Error) -> Failure {
        if !self.tls && closed_by_peer(e) {
            self.closed_on_us
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        if let Some(reason) = self.refusal(e) {
            return Failure {
                error: LockError::InvalidConfig {
                    node: self.node.clone(),
                    reason,
                },
                transient: false,
                reconnecting: false,
            };
        }
        if token_outdated(e) {
            // Tried again at once, as after a broken connection: the next
            // request authenticates first.
            self.token_outdated.store(true, Ordering::Relaxed);
            return Failure {
                error: LockError::backend(&self.node, key.map(|k| k.name.as_str()), e.to_string()),
                transient: true,
                reconnecting: true,
            };
        }
        let (transient, reconnecting) = classify(e);
        Failure {
            error: LockError::backend(&self.node, key.map(|k| k.name.as_str()), e.to_string()),
            transient,
            reconnecting,
        }
    }

    /// Why the cluster refuses this client, if that is what `e` says:
    /// credentials, grants or a certificate, which waiting cannot mend.
    fn refusal(&self, e: &etcd::Error) -> Option<String> {
        use tonic::Code;
        let root = &self.root;
        let user = self.user.as_deref().unwrap_or_default();
        match e {
            // tonic reports a refused handshake as `Unavailable` with the
            // rustls error among its causes.
            // (the driver's error does not name the status as its source).
            etcd::Error::GRpcStatus(status) if super::startup::tls_refused(status) => {
                Some(tls_failed(status))
            }
            _ if super::startup::tls_refused(e) => Some(tls_failed(e)),
            etcd::Error::GRpcStatus(status) => {
                let said = status.message();
                match status.code() {
                    Code::InvalidArgument if said.contains("authentication failed") => Some(format!(
                        "etcd refused user `{user}`: {said} (`etcd_user` gives the user and its password)"
                    )),
                    Code::InvalidArgument if said.contains("user name is empty") => Some(format!(
                        "this etcd cluster requires authentication: give a user with `etcd_user` ({said})"
                    )),
                    Code::FailedPrecondition if said.contains("authentication is not enabled") => {
                        Some(format!(
                            "`etcd_user` was given but this etcd cluster does not authenticate ({said}); enable it (`etcdctl auth enable`) or drop the user"
                        ))
                    }
                    Code::PermissionDenied => Some(format!(
                        "etcd user `{user}` may not read and write the lock keys: {said}; grant one of its roles readwrite on the prefix `{root}/` (`etcdctl role grant-permission ROLE --prefix=true readwrite {root}/`)"
                    )),
                    _ => None,
                }
            }
            etcd::Error::InvalidArgs(said) => Some(said.clone()),
            _ => None,
        }
    }

    /// The lease has ended: forget it and every key on it.
    fn lease_ended(&self, id: i64) {
        let mut lease = self.lease.lock().unwrap_or_else(PoisonError::into_inner);
        if lease.as_ref().is_some_and(|l| l.id == id) {
            *lease = None;
            *self.entries() = Entries::default();
        }
    }

    /// The client's lease, granted if there is none, and kept alive if its
    /// last confirmation is a third of its ttl old.
    async fn lease_id(&self) -> Result<i64, Failure> {
        loop {
            if let Some(lease) = self.current_lease() {
                if lease.confirmed_at.elapsed() < self.asked_ttl / 3 {
                    return Ok(lease.id);
                }
                if self.keep_alive(&lease).await? {
                    return Ok(lease.id);
                }
                continue;
            }
            let _one = self.granting.lock().await;
            if self.current_lease().is_some() {
                continue;
            }
            let mut client = self.client().await?;
            let sent = Instant::now();
            let ttl = i64::try_from(self.asked_ttl.as_secs()).unwrap_or(i64::MAX);
            let granted = client
                .lease_grant(ttl, None)
                .await
                .map_err(|e| self.failure(None, &e))?;
            let lease = Lease {
                id: granted.id(),
                confirmed_at: sent,
                keeper: Arc::new(tokio::sync::Mutex::new(None)),
            };
            *self.lease.lock().unwrap_or_else(PoisonError::into_inner) = Some(lease.clone());
            return Ok(lease.id);
        }
    }

    /// Sends one keep-alive for `lease`: `Ok(true)` if the cluster answered
    /// that it lives, `Ok(false)` if it has ended (then it is forgotten).
    async fn keep_alive(&self, lease: &Lease) -> Result<bool, Failure> {
        let mut slot = lease.keeper.lock().await;
        let client = self.client().await?;
        let sent = Instant::now();
        let alive = match slot.take() {
            Some(mut stream) => {
                let exchange = async {
                    stream.0.keep_alive().await?;
                    stream.1.message().await
                };
                match exchange.await {
                    Ok(Some(reply)) => {
                        let alive = reply.ttl() > 0;
                        if alive {
                            *slot = Some(stream);
                        }
                        alive
                    }
                    Ok(None) => {
                        return Err(Failure {
                            error: LockError::backend(&self.node, None, "the lease keep-alive stream ended"),
                            transient: true,
                            reconnecting: true,
                        });
                    }
                    Err(e) => return Err(self.failure(None, &e)),
                }
            }
            // Opening the stream is itself a keep-alive exchange: the
            // driver sends one and reads its answer.
            None => match client.lease_client().keep_alive(lease.id).await {
                Ok(stream) => {
                    *slot = Some(stream);
                    true
                }
                // The driver's word for an answer of ttl 0 (it has no
                // error variant of its own for it).
                Err(etcd::Error::LeaseKeepAliveError(message)) if message == "lease not found" => false,
                Err(e) => return Err(self.failure(None, &e)),
            },
        };
        if alive {
            let mut current = self.lease.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(l) = current.as_mut().filter(|l| l.id == lease.id) {
                l.confirmed_at = l.confirmed_at.max(sent);
            }
        } else {
            self.lease_ended(lease.id);
        }
        Ok(alive)
    }

    /// `<root>/<name encoded>/`: the lock's line.
    fn queue(&self, key: &LockKey) -> String {
        format!("{}/{}/", self.root, utf8_percent_encode(&key.redis_key, ESCAPED))
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
                    &self.node,
                    Some(&key.name),
                    format!("no answer to {what} within {}ms", self.timeout.as_millis()),
                ),
                transient: true,
                reconnecting: false,
            }),
        }
    }

    /// Puts our key in `queue` on `lease` unless it is there already (only
    /// `only_if_empty`: unless the line has anyone in it), and reads the
    /// line, in one transaction.
    ///
    /// An empty line, the common case, is taken by a put alone: our key is
    /// then the line, created at the transaction's revision, and the read
    /// is left out (it is most of the work the cluster would do). Otherwise
    /// a nested transaction puts our key if it is missing and reads the
    /// line, still in the one round trip.
    async fn join(
        &self,
        key: &LockKey,
        queue: &str,
        ours: &str,
        holder: &str,
        lease: i64,
        only_if_empty: bool,
    ) -> Result<Line, Failure> {
        let mut client = self.client().await?;
        let empty = etcd::Compare::create_revision(queue, etcd::CompareOp::Equal, 0).with_prefix();
        let unburied = etcd::Compare::create_revision(tombstone_of(ours), etcd::CompareOp::Equal, 0);
        let read = etcd::TxnOp::get(
            queue,
            Some(
                etcd::GetOptions::new()
                    .with_prefix()
                    .with_keys_only()
                    .with_sort(etcd::SortTarget::Create, etcd::SortOrder::Ascend),
            ),
        );
        let put = etcd::TxnOp::put(ours, holder, Some(etcd::PutOptions::new().with_lease(lease)));
        let otherwise = if only_if_empty {
            read
        } else {
            let absent = etcd::Compare::create_revision(ours, etcd::CompareOp::Equal, 0);
            etcd::TxnOp::txn(
                etcd::Txn::new()
                    .when([absent, unburied.clone()])
                    .and_then([put.clone(), read.clone()])
                    .or_else([read]),
            )
        };
        let txn = etcd::Txn::new()
            .when([empty, unburied])
            .and_then([put])
            .or_else([otherwise]);
        // Unanswered until the cluster answers; if it never does (a
        // timeout, or the attempt is cut short), the put may be applied
        // later, and the key's give-back buries it.
        let unanswered_before = self
            .with_entry(key, holder, |e| std::mem::replace(&mut e.unanswered, true))
            .unwrap_or(false);
        let reply = match client.txn(txn).await {
            Ok(reply) => reply,
            Err(e) if lease_not_found(&e) => {
                self.lease_ended(lease);
                return Err(self.failure(Some(key), &e));
            }
            Err(e) => return Err(self.failure(Some(key), &e)),
        };
        if !unanswered_before {
            self.with_entry(key, holder, |e| e.unanswered = false);
        }
        let revision = reply.header().map_or(0, etcd::ResponseHeader::revision);
        if reply.succeeded() {
            return Ok(Line {
                keys: vec![(revision, ours[queue.len()..].to_owned())],
                revision,
            });
        }
        let mut keys = Vec::new();
        collect_line(&reply.op_responses(), queue, &mut keys);
        Ok(Line { keys, revision })
    }

    /// `<root>/<election>%leader`: the record of who leads the election
    /// `key`, `<holder id>\n<value>`.
    fn record_of(&self, key: &LockKey) -> String {
        let queue = self.queue(key);
        format!("{}{LEADER_RECORD}", queue.trim_end_matches('/'))
    }

    /// Writes the election record of `key`'s leader `holder`
    /// (`AnyBackend::proclaim`), in a transaction that finds the leader's
    /// key still there with its holder id (a key of the line that exists
    /// heads it: the holder's). The record is on this client's lease, so
    /// it ends with it; it names its term, so a record an earlier term left
    /// is never read as the current leader's. `Ok(false)`: it no longer
    /// leads.
    pub(crate) async fn proclaim(&self, key: &LockKey, holder: &str, value: &str) -> Result<bool, Failure> {
        let (Some(path), Some(lease)) = (
            self.with_entry(key, holder, |e| e.path.clone()),
            self.current_lease().map(|lease| lease.id),
        ) else {
            return Ok(false);
        };
        let mut client = self.client().await?;
        let ours = etcd::Compare::value(path, etcd::CompareOp::Equal, holder);
        let put = etcd::TxnOp::put(
            self.record_of(key),
            format!("{holder}\n{value}"),
            Some(etcd::PutOptions::new().with_lease(lease)),
        );
        let txn = etcd::Txn::new().when([ours]).and_then([put]);
        self.bounded(key, "a proclamation", async {
            match client.txn(txn).await {
                Ok(reply) => Ok(reply.succeeded()),
                Err(e) => Err(self.failure(Some(key), &e)),
            }
        })
        .await
    }

    /// Who leads the election `key` (`AnyBackend::leader`): the head of its
    /// line (its value the holder id, its create revision the term's
    /// fencing token) and the record, read in one transaction. No lease is
    /// read: the head lives as long as its client's etcd lease.
    pub(crate) async fn leader(&self, key: &LockKey) -> Result<Option<LeaderRecord>, Failure> {
        self.leader_at(key).await.map(|(found, _)| found)
    }

    /// [`leader`](Self::leader) for an observer, with a watch of the line
    /// and the record from the revision after the read: it resolves at the
    /// first change (a candidate joins or leaves, the leader proclaims) or
    /// when the watch ends. None if the watch could not be set: the
    /// observer then reads by its clock.
    pub(crate) async fn leader_watched(
        &self,
        key: &LockKey,
    ) -> Result<(Option<LeaderRecord>, Option<LeaderChange>), Failure> {
        let (found, revision) = self.leader_at(key).await?;
        let from = || etcd::WatchOptions::new().with_start_revision(revision + 1);
        let watched = self
            .bounded(key, "a watch of who leads", async {
                let mut client = self.client().await?;
                let fail = |e: etcd::Error| self.failure(Some(key), &e);
                let mut watch = client
                    .watch(self.queue(key), Some(from().with_prefix()))
                    .await
                    .map_err(fail)?;
                watch
                    .watch(self.record_of(key), Some(from()))
                    .await
                    .map_err(fail)?;
                Ok(watch)
            })
            .await;
        // A watch that ends without an event leaves the observer to its
        // clock: waking it would have it read and watch again at once, as
        // fast as the store answers.
        let change = watched.ok().map(|watch| -> LeaderChange {
            Box::pin(async move {
                if !fired(watch).await {
                    std::future::pending::<()>().await;
                }
            })
        });
        Ok((found, change))
    }

    /// [`leader`](Self::leader), and the revision it was read at.
    async fn leader_at(&self, key: &LockKey) -> Result<(Option<LeaderRecord>, i64), Failure> {
        let mut client = self.client().await?;
        let head = etcd::TxnOp::get(
            self.queue(key),
            Some(
                etcd::GetOptions::new()
                    .with_prefix()
                    .with_sort(etcd::SortTarget::Create, etcd::SortOrder::Ascend)
                    .with_limit(1),
            ),
        );
        let record = etcd::TxnOp::get(self.record_of(key), None);
        let txn = etcd::Txn::new().and_then([head, record]);
        let reply = self
            .bounded(key, "a read of who leads", async {
                client.txn(txn).await.map_err(|e| self.failure(Some(key), &e))
            })
            .await?;
        let revision = reply.header().map_or(0, etcd::ResponseHeader::revision);
        let found = |i: usize| match reply.op_responses().get(i) {
            Some(etcd::TxnOpResponse::Get(got)) => got.kvs().first().cloned(),
            _ => None,
        };
        let Some(head) = found(0) else {
            return Ok((None, revision));
        };
        let holder = String::from_utf8_lossy(head.value()).into_owned();
        let value =
            found(1).and_then(|record| recorded_value(&String::from_utf8_lossy(record.value()), &holder));
        let record = LeaderRecord {
            epoch: head.create_revision().unsigned_abs(),
            holder,
            value,
            left: None,
        };
        Ok((Some(record), revision))
    }

    /// A watch on `key` (or every key under it, with `prefix`) from
    /// `revision`, for deletions only.
    async fn watch_deletion(
        &self,
        key: &str,
        prefix: bool,
        revision: i64,
    ) -> Result<etcd::WatchStream, etcd::Error> {
        let mut client = self
            .client()
            .await
            .map_err(|f| etcd::Error::WatchError(f.error.to_string()))?;
        let mut options = etcd::WatchOptions::new()
            .with_start_revision(revision)
            .with_filters([etcd::WatchFilterType::NoPut]);
        if prefix {
            options = options.with_prefix();
        }
        client.watch(key, Some(options)).await
    }

    /// The key `holder` has or will have in `key`'s line on `lease`: its
    /// entry's, or a new one in the lowest free slot. `line` is `key`'s, as
    /// [`queue`](Self::queue) gives it: the caller has it already, and it
    /// is an encoding and an allocation per attempt.
    fn key_for(&self, key: &LockKey, kind: Kind, line: &str, holder: &str, lease: i64) -> String {
        let mut entries = self.entries();
        if let Some(entry) = entries.find(&key.redis_key, holder) {
            return entry.path.clone();
        }
        let used = entries
            .slots
            .entry(line.trim_end_matches('/').to_owned())
            .or_default();
        let slot = (0..).find(|s| !used.contains(s)).unwrap_or(u32::MAX);
        used.insert(slot);
        let path = match kind {
            // A permit's key names how many permits its holder counts on,
            // so that an operator's look at the line can tell holders from
            // waiters (see `admin.rs`).
            Kind::Permits(n) => format!("{line}p:{n}:{lease:x}:{slot}"),
            _ => format!("{line}{}{lease:x}:{slot}", side_of(holder)),
        };
        entries
            .by_holder
            .entry(holder.to_owned())
            .or_default()
            .push(Entry {
                lock: key.redis_key.clone(),
                path: path.clone(),
                slot,
                watch: None,
                expires: None,
                unanswered: false,
            });
        path
    }

    fn with_entry<T>(&self, key: &LockKey, holder: &str, f: impl FnOnce(&mut Entry) -> T) -> Option<T> {
        self.entries().find(&key.redis_key, holder).map(f)
    }

    fn forget(&self, key: &LockKey, holder: &str) -> Option<Entry> {
        self.entries().remove(&key.redis_key, holder)
    }

    /// Forgets an entry whose key this attempt did not write, and frees its
    /// slot; or, if an earlier attempt's put of it got no answer, buries
    /// the key instead (that put may still come).
    fn drop_unwritten(&self, key: &LockKey, holder: &str) {
        let mut entries = self.entries();
        let Some(entry) = entries.remove(&key.redis_key, holder) else {
            return;
        };
        if entry.unanswered {
            drop(entries);
            self.delete_in_background(vec![Doomed::of(entry)], Duration::ZERO);
        } else {
            entries.free(&entry.path, entry.slot);
        }
    }

    fn held(&self, claimed: bool) -> AcquireReply {
        AcquireReply::Held {
            // A waiter attempts again within a third of the etcd lease,
            // which keeps the lease (and its place in line) alive.
            pttl: Some(self.asked_ttl / 3),
            claimed,
            blocked_by: 0,
        }
    }

    /// One acquisition attempt on one queue.
    async fn attempt(&self, req: &AcquireRequest<'_>) -> Result<AcquireReply, Failure> {
        let key = req.key;
        let lease = self.lease_id().await?;
        let queue = self.queue(key);
        let ours = self.key_for(key, req.kind, &queue, req.holder, lease);
        let line = self.join(key, &queue, &ours, req.holder, lease, false).await?;
        let name = &ours[queue.len()..];
        let Some(mine) = line.keys.iter().position(|(_, n)| n == name) else {
            // Deleted between the put and the read cannot happen in one
            // transaction: our key is missing only if its lease ended.
            self.forget(key, req.holder);
            return Err(Failure {
                error: LockError::backend(&self.node, Some(&key.name), "our key in the lock's line is gone"),
                transient: true,
                reconnecting: false,
            });
        };
        let token = line.keys[mine].0;
        let ahead: Vec<&str> = line.keys[..mine].iter().map(|(_, n)| n.as_str()).collect();
        let watched = match in_the_way(req.kind, &ahead) {
            InTheWay::Nothing => {
                if !req.renew {
                    self.expire_at(key, req.holder, Instant::now() + req.ttl);
                }
                return Ok(AcquireReply::acquired(
                    req.fencing.then_some(token.unsigned_abs()),
                ));
            }
            InTheWay::Entry(before) => Some(format!("{queue}{before}")),
            InTheWay::Count => None,
        };
        if !req.waiting {
            // Not waiting: leave the line now, in this attempt.
            self.remove(&[key], req.holder).await?;
            return Ok(self.held(false));
        }
        let watch = match watched {
            Some(before) => self.watch_deletion(&before, false, line.revision + 1).await,
            // Permits: any holder ahead that leaves frees one, so the
            // whole line is watched (a herd of at most this lock's permit
            // waiters).
            None => self.watch_deletion(&queue, true, line.revision + 1).await,
        }
        .map_err(|e| self.failure(Some(key), &e))?;
        self.with_entry(key, req.holder, |e| e.watch = Some(watch));
        Ok(self.held(true))
    }

    /// One attempt at a segmented lock: the first of `count` queues that is
    /// empty (our key is put only into an empty line, in the transaction
    /// that finds it empty), or whose head is our key already. A waiter
    /// watches every segment's holder and tries again when any goes.
    async fn attempt_segments(&self, req: &AcquireRequest<'_>, count: u32) -> Result<AcquireReply, Failure> {
        let lease = self.lease_id().await?;
        let mut heads = Vec::new();
        let mut revision = 0;
        for i in 0..count {
            let segment = req.key.segment(i);
            let queue = self.queue(&segment);
            let ours = self.key_for(&segment, req.kind, &queue, req.holder, lease);
            let line = self
                .join(&segment, &queue, &ours, req.holder, lease, true)
                .await?;
            match line.keys.first() {
                Some((token, head)) if *head == ours[queue.len()..] => {
                    self.segment_waits().remove(req.holder);
                    if !req.renew {
                        self.expire_at(&segment, req.holder, Instant::now() + req.ttl);
                    }
                    return Ok(AcquireReply::Acquired {
                        token: req.fencing.then_some(token.unsigned_abs()),
                        segment: Some(i),
                    });
                }
                // The line was not empty, so nothing was put: the slot is
                // free again.
                Some((_, head)) => {
                    heads.push(format!("{queue}{head}"));
                    self.drop_unwritten(&segment, req.holder);
                }
                // Emptied between the compare and the read cannot happen in
                // one transaction; an empty line means our put was refused
                // (our lease just ended).
                None => self.drop_unwritten(&segment, req.holder),
            }
            revision = revision.max(line.revision);
        }
        if !req.waiting || heads.len() < usize::try_from(count).unwrap_or(usize::MAX) {
            return Ok(self.held(false));
        }
        let mut watches = Vec::with_capacity(heads.len());
        for head in heads {
            watches.push(
                self.watch_deletion(&head, false, revision + 1)
                    .await
                    .map_err(|e| self.failure(Some(req.key), &e))?,
            );
        }
        let now = Instant::now();
        let stale = self.asked_ttl + self.timeout;
        let mut waits = self.segment_waits();
        waits.retain(|_, w| now.duration_since(w.since) < stale);
        waits.insert(req.holder.to_owned(), SegmentWait { since: now, watches });
        // Nothing of ours waits in a line: nothing to give back.
        Ok(self.held(false))
    }

    /// A fixed lease: delete the key when its ttl has passed, unless it was
    /// released (or extended) by then.
    fn expire_at(&self, key: &LockKey, holder: &str, at: Instant) {
        // Only later than an end already set, as on the server.
        self.with_entry(key, holder, |e| e.expires = e.expires.max(Some(at)));
        let Some((client, lease_id, runtime)) = self.for_a_task() else {
            return;
        };
        let (entries, lease) = (Arc::downgrade(&self.entries), Arc::downgrade(&self.lease));
        let (lock, holder) = (key.redis_key.clone(), holder.to_owned());
        runtime.spawn(async move {
            let mut at = at;
            loop {
                tokio::time::sleep_until(at).await;
                let Some(entries) = entries.upgrade() else {
                    return;
                };
                let doomed = {
                    let mut live = entries.lock().unwrap_or_else(PoisonError::into_inner);
                    let Some(entry) = live.find(&lock, &holder) else {
                        return;
                    };
                    match entry.expires {
                        Some(later) if later > Instant::now() => {
                            at = later;
                            continue;
                        }
                        _ => {}
                    }
                    live.remove(&lock, &holder)
                };
                // Our own key, by its name: never another holder's.
                if let Some(entry) = doomed {
                    delete_until_done(
                        client,
                        lease,
                        lease_id,
                        vec![Doomed::of(entry)],
                        Arc::downgrade(&entries),
                    )
                    .await;
                }
                return;
            }
        });
    }

    /// Deletes our keys of `keys`, in one transaction. Whether any was
    /// there. Only keys this holder's entries name are deleted, and a
    /// key's name is this client's own (its lease and slot), so this can
    /// only ever delete this holder's own keys.
    ///
    /// Unlike a Redis key, a key left behind by a release that got no
    /// answer lives as long as the client's lease, which the client's
    /// other locks keep alive: it would keep the lock, and every waiter
    /// behind it, that long. So an unanswered deletion is handed to a task
    /// that keeps at it until the cluster answers or the lease ends; a key
    /// this process knew of counts as released. So is one whose removal is
    /// itself dropped unfinished (an attempt cut short while it left the
    /// line): its entry is forgotten already, and nobody else would.
    async fn remove(&self, keys: &[&LockKey], holder: &str) -> Result<bool, Failure> {
        let Some(first) = keys.first() else {
            return Ok(false);
        };
        let doomed: Vec<Doomed> = keys
            .iter()
            .filter_map(|key| self.forget(key, holder))
            .map(Doomed::of)
            .collect();
        if doomed.is_empty() {
            // Never ours here, or gone with an ended lease.
            return Ok(false);
        }
        let Some(lease_id) = self.current_lease().map(|l| l.id) else {
            // The lease ended, and our keys with it.
            return Ok(false);
        };
        let mut unconfirmed = Unconfirmed {
            backend: self,
            doomed: Some(doomed),
        };
        let doomed = unconfirmed.doomed.as_deref().unwrap_or_default();
        let attempt = async {
            let mut client = self.client().await?;
            if let [only] = doomed
                && !only.tombstone
            {
                // One key, the common case: a plain delete, no transaction.
                let reply = client
                    .delete(only.path.as_str(), None)
                    .await
                    .map_err(|e| self.failure(Some(first), &e))?;
                return Ok(reply.deleted() > 0);
            }
            let mut any = false;
            for chunk in doomed.chunks(MAX_TXN_OPS / 2) {
                let reply = client
                    .txn(etcd::Txn::new().and_then(deletion(chunk, lease_id)))
                    .await
                    .map_err(|e| self.failure(Some(first), &e))?;
                any |= reply
                    .op_responses()
                    .iter()
                    .any(|op| matches!(op, etcd::TxnOpResponse::Delete(d) if d.deleted() > 0));
            }
            Ok::<bool, Failure>(any)
        };
        let answer = tokio::time::timeout(self.timeout, attempt).await;
        let doomed = unconfirmed.doomed.take().unwrap_or_default();
        match answer {
            Ok(Ok(any)) => {
                let buried = freed(&mut self.entries(), &doomed);
                if !buried.is_empty() {
                    self.delete_in_background(buried, TOMBSTONE_LIFE);
                }
                Ok(any)
            }
            Ok(Err(failure)) if !failure.transient => Err(failure),
            _ => {
                self.delete_in_background(doomed, Duration::ZERO);
                // Ours until now, whatever the retry finds.
                Ok(true)
            }
        }
    }

    /// Keeps the lock held after its holder let go (`hold_at_least`): its
    /// key moves, in one transaction that checks it is still the holder's
    /// on this client's lease, to a lease of its own of `left` rounded up
    /// to whole seconds (etcd's unit; the cluster raises a shorter one to
    /// its minimum, about 2 s by default), which the cluster expires,
    /// deleting the key, with no one keeping it alive. A put keeps the
    /// key's create revision: it stays first in its line, and the waiter
    /// behind it still watches it. The key's slot is reused only once the
    /// key is seen gone.
    ///
    /// If an acquire's put of the key may still be on its way
    /// (`unanswered`), the same transaction puts the key's tombstone on
    /// this client's lease, so that the put cannot bring the key back
    /// once its own lease ends; the tombstone goes, and the slot is freed,
    /// [`TOMBSTONE_LIFE`] after that. If the transaction gets no answer,
    /// the key is deleted `left` from now instead, by this client, as a
    /// release that got no answer is.
    pub(crate) async fn keep(&self, key: &LockKey, holder: &str, left: Duration) -> Result<bool, Failure> {
        let (Some((path, unanswered)), Some(lease_id)) = (
            self.with_entry(key, holder, |e| (e.path.clone(), e.unanswered)),
            self.current_lease().map(|l| l.id),
        ) else {
            return Ok(false);
        };
        let secs = i64::try_from(left.as_secs() + u64::from(left.subsec_nanos() > 0))
            .unwrap_or(i64::MAX)
            .max(1);
        let attempt = async {
            let mut client = self.client().await?;
            let own = client
                .lease_grant(secs, None)
                .await
                .map_err(|e| self.failure(Some(key), &e))?;
            let mut ops = vec![etcd::TxnOp::put(
                path.as_str(),
                holder,
                Some(etcd::PutOptions::new().with_lease(own.id())),
            )];
            if unanswered {
                let on_ours = etcd::PutOptions::new().with_lease(lease_id);
                ops.push(etcd::TxnOp::put(tombstone_of(&path), "", Some(on_ours)));
            }
            let moved = etcd::Txn::new()
                .when([
                    etcd::Compare::value(path.as_str(), etcd::CompareOp::Equal, holder),
                    etcd::Compare::lease(path.as_str(), etcd::CompareOp::Equal, lease_id),
                ])
                .and_then(ops);
            let reply = client.txn(moved).await.map_err(|e| self.failure(Some(key), &e))?;
            Ok::<_, Failure>((reply.succeeded(), own.ttl()))
        };
        let answer = tokio::time::timeout(self.timeout, attempt).await;
        let Some(entry) = self.forget(key, holder) else {
            // The lease ended meanwhile, and the key with it.
            return Ok(false);
        };
        match answer {
            Ok(Ok((true, granted))) => {
                let granted = Duration::from_secs(granted.unsigned_abs());
                if unanswered {
                    let tombstone = Doomed {
                        path: tombstone_of(&entry.path),
                        slot: entry.slot,
                        tombstone: false,
                    };
                    self.delete_in_background(vec![tombstone], granted + TOMBSTONE_LIFE);
                } else {
                    self.free_slot_when_gone(entry.path, entry.slot, granted);
                }
                Ok(true)
            }
            // No longer this holder's key on this lease: ours by its name,
            // so deleted as any key of ours.
            Ok(Ok((false, _))) => {
                self.delete_in_background(vec![Doomed::of(entry)], Duration::ZERO);
                Ok(false)
            }
            Ok(Err(failure)) => {
                self.delete_in_background(vec![Doomed::of(entry)], left);
                Err(failure)
            }
            Err(_) => {
                self.delete_in_background(vec![Doomed::of(entry)], left);
                Err(Failure {
                    error: LockError::backend(&self.node, Some(&key.name), "etcd did not answer in time"),
                    transient: true,
                    reconnecting: false,
                })
            }
        }
    }

    /// Frees the slot of a kept key (`keep`) once the key is gone: looked
    /// for when its lease should have ended, then every second, as long as
    /// this client's lease is the one the key was named after (a new lease
    /// starts with no slots taken, and names its keys anew).
    fn free_slot_when_gone(&self, path: String, slot: u32, after: Duration) {
        let Some((client, lease_id, runtime)) = self.for_a_task() else {
            return;
        };
        let (lease, entries) = (Arc::downgrade(&self.lease), Arc::downgrade(&self.entries));
        runtime.spawn(async move {
            tokio::time::sleep(after).await;
            let mut kv = client.kv_client();
            loop {
                if !still_on_lease(&lease, lease_id) {
                    return;
                }
                let gone = kv
                    .get(path.as_str(), Some(etcd::GetOptions::new().with_count_only()))
                    .await
                    .is_ok_and(|reply| reply.count() == 0);
                if gone {
                    break;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            if let Some(entries) = entries.upgrade()
                && still_on_lease(&lease, lease_id)
            {
                entries
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .free(&path, slot);
            }
        });
    }

    /// What a task that acts on this client's keys after the caller
    /// returns needs: the client, the lease the keys are named after, and
    /// a runtime. `None` where there is none (called from `Drop`, no
    /// runtime: the lease's expiry deletes the keys).
    fn for_a_task(&self) -> Option<(etcd::Client, i64, tokio::runtime::Handle)> {
        Some((
            (**self.client.get()?).clone(),
            self.current_lease()?.id,
            tokio::runtime::Handle::try_current().ok()?,
        ))
    }

    /// Deletes `doomed` (keys of ours, with their slots) from a task,
    /// `after` from now: see [`delete_until_done`].
    fn delete_in_background(&self, doomed: Vec<Doomed>, after: Duration) {
        // Called from `Drop` too, where there may be no runtime: then the
        // lease's expiry deletes the keys.
        let Some((client, lease_id, runtime)) = self.for_a_task() else {
            return;
        };
        let (lease, entries) = (Arc::downgrade(&self.lease), Arc::downgrade(&self.entries));
        runtime.spawn(async move {
            tokio::time::sleep(after).await;
            delete_until_done(client, lease, lease_id, doomed, entries).await;
        });
    }

    /// Resolves when the key before ours is deleted (or the watch ends):
    /// the waiter's turn may have come. At once if no watch is set.
    pub(crate) async fn turn(&self, key: &LockKey, holder: &str) {
        let watch = self.with_entry(key, holder, |e| e.watch.take()).flatten();
        if let Some(watch) = watch {
            fired(watch).await;
            return;
        }
        let segments = self.segment_waits().remove(holder);
        if let Some(wait) = segments
            && !wait.watches.is_empty()
        {
            let changes = wait.watches.into_iter().map(|w| Box::pin(fired(w)));
            futures_util::future::select_all(changes).await;
        }
    }

    /// Keeps the lease alive, then confirms that each key is still there
    /// on it, in as few transactions as etcd allows.
    async fn confirm(&self, items: &[(&LockKey, &str, Duration)]) -> Result<Vec<bool>, Failure> {
        let Some(lease) = self.current_lease() else {
            return Ok(vec![false; items.len()]);
        };
        if !self.keep_alive(&lease).await? {
            return Ok(vec![false; items.len()]);
        }
        // Each item's key, if this client has one for it.
        let paths: Vec<Option<String>> = items
            .iter()
            .map(|(key, holder, ttl)| {
                self.with_entry(key, holder, |e| {
                    // A fixed lease's end only moves later, as on the server.
                    e.expires = e.expires.map(|ends| ends.max(Instant::now() + *ttl));
                    e.path.clone()
                })
            })
            .collect();
        let mut client = self.client().await?;
        let mut found = Vec::with_capacity(items.len());
        for (chunk, paths) in items.chunks(MAX_TXN_OPS).zip(paths.chunks(MAX_TXN_OPS)) {
            // An item without a key reads the root's own name, which no
            // lock ever has.
            let reads: Vec<etcd::TxnOp> = paths
                .iter()
                .map(|path| etcd::TxnOp::get(path.clone().unwrap_or_else(|| self.root.clone()), None))
                .collect();
            let reply = client
                .txn(etcd::Txn::new().and_then(reads))
                .await
                .map_err(|e| self.failure(Some(chunk[0].0), &e))?;
            for (op, (_, holder, _)) in reply.op_responses().iter().zip(chunk) {
                found.push(match op {
                    etcd::TxnOpResponse::Get(got) => got
                        .kvs()
                        .first()
                        .is_some_and(|kv| kv.lease() == lease.id && kv.value() == holder.as_bytes()),
                    _ => false,
                });
            }
        }
        Ok(found)
    }
}

/// Deletes `doomed` (keys of ours on the lease `lease_id`, with their
/// slots), retrying until the cluster answers, that lease ends (taking them
/// with it), or the client is gone (`lease` no longer upgrades); frees the
/// slots of the keys it saw deleted. The tombstones it leaves are deleted
/// the same way [`TOMBSTONE_LIFE`] later.
async fn delete_until_done(
    client: etcd::Client,
    lease: std::sync::Weak<Mutex<Option<Lease>>>,
    lease_id: i64,
    doomed: Vec<Doomed>,
    entries: std::sync::Weak<Mutex<Entries>>,
) {
    let mut pause = Duration::from_millis(10);
    let mut doomed = doomed;
    while !doomed.is_empty() {
        let mut buried = Vec::new();
        for chunk in doomed.chunks(MAX_TXN_OPS / 2) {
            loop {
                if !still_on_lease(&lease, lease_id) {
                    return;
                }
                match client
                    .kv_client()
                    .txn(etcd::Txn::new().and_then(deletion(chunk, lease_id)))
                    .await
                {
                    Ok(_) => {
                        if let Some(entries) = entries.upgrade() {
                            let mut entries = entries.lock().unwrap_or_else(PoisonError::into_inner);
                            buried.extend(freed(&mut entries, chunk));
                        }
                        break;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "etcd lock release not confirmed yet; retrying");
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_secs(1));
                    }
                }
            }
        }
        if !buried.is_empty() {
            tokio::time::sleep(TOMBSTONE_LIFE).await;
        }
        doomed = buried;
    }
}

/// Whether the client's lease is still `lease_id`: the keys a task was
/// given are named after it, and a new lease starts with none.
fn still_on_lease(lease: &std::sync::Weak<Mutex<Option<Lease>>>, lease_id: i64) -> bool {
    lease.upgrade().is_some_and(|l| {
        l.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|l| l.id)
            == Some(lease_id)
    })
}

/// One transaction's operations for `doomed`: each key's delete, and the
/// put of its tombstone on `lease_id` where it needs one.
fn deletion(doomed: &[Doomed], lease_id: i64) -> Vec<etcd::TxnOp> {
    let mut ops = Vec::with_capacity(doomed.len());
    for key in doomed {
        ops.push(etcd::TxnOp::delete(key.path.as_str(), None));
        if key.tombstone {
            let put = etcd::PutOptions::new().with_lease(lease_id);
            ops.push(etcd::TxnOp::put(tombstone_of(&key.path), "", Some(put)));
        }
    }
    ops
}

/// Frees the slots of `deleted` keys, but for those a tombstone now keeps:
/// those tombstones are returned, to be deleted in their turn.
fn freed(entries: &mut Entries, deleted: &[Doomed]) -> Vec<Doomed> {
    let mut buried = Vec::new();
    for key in deleted {
        if key.tombstone {
            buried.push(Doomed {
                path: tombstone_of(&key.path),
                slot: key.slot,
                tombstone: false,
            });
        } else {
            entries.free(&key.path, key.slot);
        }
    }
    buried
}

/// The keys a transaction's reads found under `queue` (in nested
/// transactions too): `(create revision, holder id)`, in the reads' order.
fn collect_line(ops: &[etcd::TxnOpResponse], queue: &str, keys: &mut Vec<(i64, String)>) {
    for op in ops {
        match op {
            etcd::TxnOpResponse::Get(got) => {
                for kv in got.kvs() {
                    let name = kv.key().get(queue.len()..).unwrap_or_default();
                    keys.push((kv.create_revision(), String::from_utf8_lossy(name).into_owned()));
                }
            }
            etcd::TxnOpResponse::Txn(inner) => collect_line(&inner.op_responses(), queue, keys),
            _ => {}
        }
    }
}

/// Waits for an event on `watch` (of the kinds it asked for), or for the
/// watch to end; true for an event.
async fn fired(mut watch: etcd::WatchStream) -> bool {
    // The first reply only says the watch was created; a cancelled watch
    // (its start revision compacted away) or a broken stream ends the
    // wait too, and the waiter looks again.
    while let Ok(Some(reply)) = watch.message().await {
        if !reply.events().is_empty() {
            return true;
        }
        if reply.canceled() {
            return false;
        }
    }
    false
}

impl Backend for EtcdBackend {
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
        // Bounded inside: an unanswered deletion goes on in a task.
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
        let confirmed = self
            .bounded(key, "renew", self.confirm(&[(key, holder, ttl)]))
            .await?;
        Ok(confirmed.first().copied().unwrap_or(false))
    }

    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Result<Vec<Renewal>, Failure> {
        let Some(first) = items.first() else {
            return Ok(Vec::new());
        };
        let batch: Vec<(&LockKey, &str, Duration)> = items.iter().map(|i| (i.key, i.holder, i.ttl)).collect();
        match self.bounded(first.key, "renew", self.confirm(&batch)).await {
            Ok(found) => Ok(found.into_iter().map(Renewal::from).collect()),
            Err(f) if f.transient => Ok(vec![Renewal::Unconfirmed; items.len()]),
            Err(f) => Err(f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend() -> EtcdBackend {
        EtcdBackend::new(
            &["127.0.0.1:2379"],
            "/distributed-locks",
            Duration::from_secs(10),
            Duration::from_secs(1),
        )
        .expect("valid")
    }

    #[test]
    fn no_lock_name_reaches_into_another_locks_line() {
        let b = backend();
        let a = LockKey::new("lock:", "a".into()).expect("key");
        let ab = LockKey::new("lock:", "a/b".into()).expect("key");
        let (qa, qab) = (b.queue(&a), b.queue(&ab));
        assert_eq!(qa, "/distributed-locks/lock:{a}/");
        assert_eq!(qab, "/distributed-locks/lock:{a%2Fb}/");
        assert!(!qab.starts_with(&qa) && !qa.starts_with(&qab));
        let pct = LockKey::new("lock:", "a%2Fb".into()).expect("key");
        assert_ne!(b.queue(&pct), qab, "the escape is escaped too");
    }

    #[test]
    fn bad_settings_are_refused_with_a_reason() {
        let make = |endpoints: &[&str], root: &str, ttl: u64| {
            EtcdBackend::new(endpoints, root, Duration::from_secs(ttl), Duration::from_secs(1))
        };
        assert!(make(&["127.0.0.1:2379"], "/locks", 10).is_ok());
        for (endpoints, root, ttl) in [
            (&[][..], "/locks", 10),
            (&[" "][..], "/locks", 10),
            (&["127.0.0.1:2379"][..], "", 10),
            (&["127.0.0.1:2379"][..], "/locks/", 10),
            (&["127.0.0.1:2379"][..], "/locks", 1),
        ] {
            let err = make(endpoints, root, ttl).expect_err("refused");
            assert!(matches!(err, LockError::InvalidConfig { .. }), "{err}");
        }
    }

    #[test]
    fn a_member_that_cannot_answer_is_worth_another_attempt_and_a_bad_request_is_not() {
        let status = |code| etcd::Error::GRpcStatus(tonic::Status::new(code, "x"));
        assert_eq!(classify(&status(tonic::Code::Unavailable)), (true, false));
        assert_eq!(classify(&status(tonic::Code::DeadlineExceeded)), (true, false));
        assert_eq!(classify(&status(tonic::Code::NotFound)), (true, false));
        assert!(lease_not_found(&status(tonic::Code::NotFound)));
        assert_eq!(classify(&status(tonic::Code::PermissionDenied)), (false, false));
        assert_eq!(classify(&status(tonic::Code::InvalidArgument)), (false, false));
    }
}
