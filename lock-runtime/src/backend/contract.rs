//! What a backend does for a lock: the operations every backend implements
//! and the answers they give. The backends build on this file; nothing in
//! it knows any of them.

use std::time::Duration;

use crate::error::LockError;
use crate::key::LockKey;
use crate::spec::Kind;

/// One acquisition attempt.
#[derive(Debug)]
pub(crate) struct AcquireRequest<'a> {
    pub(crate) key: &'a LockKey,
    /// The holder id; a read-write lock's carries its side (`r:` or `w:`).
    pub(crate) holder: &'a str,
    pub(crate) kind: Kind,
    /// The other exclusive locks of an all-or-nothing set, after `key` in
    /// sorted order and on the same node (the same slot on a cluster);
    /// empty for a single lock.
    pub(crate) also: &'a [LockKey],
    pub(crate) ttl: Duration,
    /// A fair lock's waiter keeps its place this long without an attempt.
    pub(crate) waiter_timeout: Duration,
    pub(crate) fencing: bool,
    /// The first attempt of an acquisition, which most often finds the lock
    /// free: a backend may try a cheaper command first.
    pub(crate) first: bool,
    /// The caller will wait if the lock is held: the backend should make
    /// sure the holder's release is announced.
    pub(crate) waiting: bool,
    /// A watchdog will renew the lease; otherwise it is a fixed lease,
    /// which ends at `ttl` (ZooKeeper: this client deletes the lock then).
    pub(crate) renew: bool,
}

/// An acquisition's request, owned, for a request that runs on after its
/// caller has its answer or gave up: a Redlock's requests to masters that
/// had not answered when a majority had, a simulated request on its way.
pub(crate) struct OwnedAcquireRequest {
    key: LockKey,
    holder: String,
    kind: Kind,
    also: Vec<LockKey>,
    ttl: Duration,
    waiter_timeout: Duration,
    fencing: bool,
    first: bool,
    waiting: bool,
    renew: bool,
}

impl OwnedAcquireRequest {
    pub(crate) fn new(req: &AcquireRequest<'_>) -> Self {
        OwnedAcquireRequest {
            key: req.key.clone(),
            holder: req.holder.to_owned(),
            kind: req.kind,
            also: req.also.to_vec(),
            ttl: req.ttl,
            waiter_timeout: req.waiter_timeout,
            fencing: req.fencing,
            first: req.first,
            waiting: req.waiting,
            renew: req.renew,
        }
    }

    pub(crate) fn borrowed(&self) -> AcquireRequest<'_> {
        AcquireRequest {
            key: &self.key,
            holder: &self.holder,
            kind: self.kind,
            also: &self.also,
            ttl: self.ttl,
            waiter_timeout: self.waiter_timeout,
            fencing: self.fencing,
            first: self.first,
            waiting: self.waiting,
            renew: self.renew,
        }
    }
}

/// What an acquisition attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    /// The lock is ours, with a fencing token when one was asked for, and
    /// which segment of a segmented lock.
    Acquired {
        token: Option<u64>,
        segment: Option<u32>,
    },
    /// Other holders have it; `pttl` is what is left of the shortest lease
    /// in the way, `None` when the key has no expiry at all. `claimed`: a
    /// writer's claim now holds new readers back, or a fair lock's waiter
    /// has a place in line: either must be withdrawn if the caller stops
    /// waiting.
    Held {
        pttl: Option<Duration>,
        claimed: bool,
        /// Which lock of a set is in the way: 0 for `key`, `i` for
        /// `also[i - 1]`.
        blocked_by: usize,
    },
}

impl AcquireReply {
    /// Acquired, with nothing but an optional token to report.
    pub(crate) fn acquired(token: Option<u64>) -> Self {
        AcquireReply::Acquired { token, segment: None }
    }
}

/// What handing a lock to a waiter found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HandOver {
    /// The waiter holds it now, with a fencing token when one was asked for.
    Handed { token: Option<u64> },
    /// The lock was no longer the giver's: nothing was written.
    NotHeld,
}

/// Who leads an election, as its store has it (`AnyBackend::leader`): the
/// holder of the election's lock, the epoch of its term (the lock's fencing
/// token) and the value it proclaimed; `value` is `None` between its
/// election and its first proclamation landing (one round trip). `left` is
/// what the store says is left of the term's lease when it answered, if it
/// says (an observer reads again when it runs out: an expiry announces
/// nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeaderRecord {
    pub(crate) holder: String,
    pub(crate) epoch: u64,
    pub(crate) value: Option<String>,
    pub(crate) left: Option<Duration>,
}

/// Resolves when who leads an election may have changed, as a store that
/// watches tells it (ZooKeeper, etcd): an observer reads again then.
pub(crate) type LeaderChange = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// The value in an election's stored record (`<holder id>\n<value>`, as
/// Redis, the SQL stores and etcd keep it) if the record is `holder`'s: a
/// record names its term, so one an earlier term left is never read as the
/// current leader's.
pub(crate) fn recorded_value(record: &str, holder: &str) -> Option<String> {
    record
        .split_once('\n')
        .filter(|(by, _)| *by == holder)
        .map(|(_, value)| value.to_owned())
}

/// A backend failure, classified for the retry loop.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) error: LockError,
    /// Worth retrying within the caller's wait (connection trouble, a busy or
    /// loading server). A transient failure is also *ambiguous*: the command
    /// may have been applied even though no reply arrived.
    pub(crate) transient: bool,
    /// The connection broke (rather than timing out): the client reconnects
    /// on this error, so an immediate second try is worth it.
    pub(crate) reconnecting: bool,
}

impl Failure {
    pub(crate) fn permanent(error: LockError) -> Self {
        Failure {
            error,
            transient: false,
            reconnecting: false,
        }
    }
}

impl From<Failure> for LockError {
    fn from(f: Failure) -> Self {
        f.error
    }
}

/// The operations a lock needs from wherever it lives. Every operation is
/// owner-checked on the server side: a holder can only ever touch its own
/// lock.
pub(crate) trait Backend {
    /// Takes the lock if it is free (or already this holder's, when an
    /// earlier attempt's reply was lost), setting its lease in the same step.
    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<AcquireReply, Failure>;

    /// Deletes the lock if this holder has it and announces the release;
    /// withdraws a writer's claim too. `Ok(false)`: it was no longer this
    /// holder's.
    async fn release(&self, key: &LockKey, holder: &str) -> Result<bool, Failure>;

    /// Releases every lock of `keys` this holder still has: the undo of a
    /// set's acquisition. `Ok(true)` if any was.
    async fn release_many(&self, keys: &[LockKey], holder: &str) -> Result<bool, Failure>;

    /// Releases whichever of the `count` segments of `key` this holder has:
    /// the undo of a segment acquisition whose reply was lost.
    async fn release_segments(&self, key: &LockKey, count: u32, holder: &str) -> Result<bool, Failure>;

    /// Makes the lease last at least `ttl` from now if this holder still has
    /// the lock. It never shortens a lease: a renewal sent before an
    /// extension may land after it, its reply lost, and the holder counts
    /// on the extension (the simulation's seed 1787).
    async fn renew(&self, key: &LockKey, holder: &str, ttl: Duration) -> Result<bool, Failure>;

    /// Makes each lease last at least its `ttl` from now where its holder
    /// still has it (never shorter, as [`Backend::renew`]), in as few round
    /// trips as the backend allows. One outcome per item.
    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Result<Vec<Renewal>, Failure>;
}

/// What a renewal found for one lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// The lease lasts at least `ttl` from the renewal.
    Renewed,
    /// The lock is gone or someone else has it: the lease is lost.
    Gone,
    /// Not known (Redlock: too few masters answered either way): retry
    /// until the lease's deadline.
    Unconfirmed,
}

impl From<bool> for Renewal {
    fn from(renewed: bool) -> Self {
        if renewed { Renewal::Renewed } else { Renewal::Gone }
    }
}

/// One lease in a watchdog batch.
#[derive(Debug)]
pub(crate) struct RenewItem<'a> {
    pub(crate) key: &'a LockKey,
    pub(crate) holder: &'a str,
    pub(crate) ttl: Duration,
}

#[cfg(test)]
mod tests {
    use super::recorded_value;

    #[test]
    fn a_record_is_read_only_for_the_holder_it_names() {
        assert_eq!(
            recorded_value("a:1\n10.0.0.7:80", "a:1").as_deref(),
            Some("10.0.0.7:80")
        );
        assert_eq!(
            recorded_value("a:1\nline\nbreaks", "a:1").as_deref(),
            Some("line\nbreaks")
        );
        assert_eq!(recorded_value("a:1\n", "a:1").as_deref(), Some(""));
        assert_eq!(recorded_value("a:1\n10.0.0.7:80", "b:2"), None);
        assert_eq!(recorded_value("no holder", "no holder"), None);
    }
}
