//! The programmatic API: `client.lock(key)...acquire().await` and
//! `client.lock(key)...run(body).await`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::admin;
use crate::entry::{self, Entered, EnteredAll};
use crate::error::{LockError, LostReason};
use crate::lease::Lease;
use crate::lease_state::LeaseState;
use crate::shared::ClientInner;
use crate::spec::{LockMode, LockSpec};
use crate::with_lock;

/// A lock request being configured. Nothing is sent until
/// [`acquire`](Self::acquire) or [`run`](Self::run).
#[derive(Debug)]
#[must_use = "a lock request does nothing until `.acquire().await` or `.run(body).await`"]
pub struct LockRequest<'c> {
    client: &'c Arc<ClientInner>,
    names: Names,
    spec: LockSpec,
}

/// What a request locks.
#[derive(Debug)]
enum Names {
    One(String),
    /// All of them or none (`lock_all`).
    All(Vec<String>),
}

impl<'c> LockRequest<'c> {
    pub(crate) fn new(client: &'c Arc<ClientInner>, key: String) -> Self {
        LockRequest {
            client,
            names: Names::One(key),
            spec: LockSpec::DEFAULT,
        }
    }

    pub(crate) fn new_all(client: &'c Arc<ClientInner>, keys: Vec<String>) -> Self {
        LockRequest {
            client,
            names: Names::All(keys),
            spec: LockSpec::DEFAULT,
        }
    }

    /// The lease length (default: the client's, 30 s unless configured):
    /// from 8ms to 24h, as in the attribute; outside that the call fails
    /// with [`LockError::InvalidRequest`] before any I/O.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.spec = self.spec.ttl(ttl);
        self
    }

    /// How long to wait for a held lock (default: the client's, 0 unless
    /// configured, which tries once). `Duration::MAX` waits until the lock
    /// is free.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.spec = self.spec.wait(wait);
        self
    }

    /// Whether the lease is renewed while held (default `true`).
    pub fn renew(mut self, renew: bool) -> Self {
        self.spec = self.spec.renew(renew);
        self
    }

    /// Whether to issue a fencing token (default `false`).
    pub fn fencing(mut self, fencing: bool) -> Self {
        self.spec = self.spec.fencing(fencing);
        self
    }

    /// Takes one side of a read-write lock on the key: many
    /// [`LockMode::Read`] holders at once, or one [`LockMode::Write`]
    /// holder. A writer's body may take the read lock of its key (it
    /// re-enters); a reader's asking for the write lock fails at once with
    /// [`LockError::UpgradeRefused`]. A waiting writer holds new readers
    /// back, so readers cannot starve it.
    pub fn mode(mut self, mode: LockMode) -> Self {
        self.spec = self.spec.mode(mode);
        self
    }

    /// Makes the lock a semaphore: at most `n` holders at once, each with
    /// its own lease. `n` must be at least 1; a nested call on the key
    /// re-enters its permit. Cannot be combined with `mode` or `segments`.
    pub fn permits(mut self, n: u32) -> Self {
        self.spec = self.spec.permits(n);
        self
    }

    /// Hands the lock to its waiters in the order they started waiting
    /// (default `false`). A waiter that stops attempting (its process died)
    /// loses its place after the client's `fair_waiter_timeout`; a waiter
    /// whose `wait` runs out leaves the line at once. Not with `mode`,
    /// `permits`, `segments` or several keys; not on a Redlock client.
    pub fn fair(mut self, fair: bool) -> Self {
        self.spec = self.spec.fair(fair);
        self
    }

    /// Splits the lock into `n` (1 to 1024) exclusive segments `key#0 …
    /// key#(n-1)`; the call holds whichever is free ([`segment`](crate::segment)
    /// says which inside the body, [`LockGuard::segment`] on a guard).
    /// Cannot be combined with `mode` or `permits`.
    pub fn segments(mut self, n: u32) -> Self {
        self.spec = self.spec.segments(n);
        self
    }

    /// Keeps the lock held after the body ends, by any exit path, until
    /// `hold` after it was granted (from 1ms to 7 days), unrenewed: a
    /// scheduled job that finishes early is not run again by a replica
    /// whose clock or scheduler is a little behind. Judged by the lock
    /// server's clock: the server gives the lease at least `hold` when it
    /// grants it, so the hold survives this process exiting or crashing
    /// (on etcd, from the release on: until then the key lives on the
    /// client's lease), and the release sets the lease to end `hold` after
    /// the grant instead of deleting it. A body that runs longer releases as usual.
    /// Exclusive locks of one key only; not on ZooKeeper, whose lock nodes
    /// end with their session (both refused with an error before any I/O).
    /// Only the outermost call's hold counts: a nested call re-enters.
    pub fn hold_at_least(mut self, hold: Duration) -> Self {
        self.spec = self.spec.hold_at_least(hold);
        self
    }

    /// Names the lock in metrics: the `lock` label of every
    /// `distributed_lock_*` series this call records (default
    /// `"programmatic"`). Give a name per kind of resource, like the
    /// attribute's key template (`"stock:<product_id>"`), never a rendered
    /// key: each name is a series of its own.
    pub fn name(mut self, name: &'static str) -> Self {
        self.spec = self.spec.name(name);
        self
    }

    /// Runs `body` with the lock held, exactly as `#[distributed_lock]` does:
    /// structural re-entry, release on every exit path, cancellation when the
    /// lease is lost.
    pub async fn run<F: Future>(self, body: F) -> Result<F::Output, LockError> {
        match self.names {
            Names::One(key) => with_lock::run_with(self.client, key, &self.spec, body).await,
            Names::All(keys) => with_lock::run_with_all(self.client, keys, &self.spec, body).await,
        }
    }

    /// Runs `body` with the lock held, as [`run`](Self::run) does, if the
    /// lock is free: `Ok(None)` when another holder still has it, without
    /// running `body`. Like `try_` methods in std and tokio it does not wait,
    /// unless `.wait(d)` is set on this request (the client's
    /// `default_wait` does not apply). Every other failure (a server that
    /// does not answer within `wait`, a bad key, a lease lost while `body`
    /// runs) is still an `Err`, and so are a lock whose key never expires
    /// (`Timeout` with `no_expiry`: written by something else, it would be
    /// skipped forever) and a lock this task holds through a guard
    /// (`WouldDeadlock`). Counted in `distributed_lock_skipped_total`.
    pub async fn try_run<F: Future>(mut self, body: F) -> Result<Option<F::Output>, LockError> {
        self.spec = self.spec.skip_when_busy(true);
        let (client, spec) = (self.client, self.spec);
        let ran = self.run(body).await;
        busy_is_none(client, &spec, ran).await
    }

    /// Takes the lock, as [`acquire`](Self::acquire) does, if it is free:
    /// `Ok(None)` when another holder still has it. Waits only if
    /// `.wait(d)` is set on this request, as [`try_run`](Self::try_run).
    pub async fn try_acquire(mut self) -> Result<Option<LockGuard>, LockError> {
        self.spec = self.spec.skip_when_busy(true);
        let (client, spec) = (self.client, self.spec);
        let acquired = self.acquire().await;
        busy_is_none(client, &spec, acquired).await
    }

    /// Takes the lock and returns a guard that holds it until
    /// [`LockGuard::release`] or drop. Called inside a body that already holds
    /// this lock, it returns a re-entrant guard whose release leaves the lock
    /// to the enclosing holder.
    ///
    /// A guard is not a scope: a second `acquire()` (or `run`) of the same
    /// key in the task that holds the guard is not nested in anything. If it
    /// would wait, it fails at once with [`LockError::WouldDeadlock`] rather
    /// than wait for itself (with `wait = 0` it is a `Timeout`, as for any
    /// held lock). Use [`run`](Self::run) for calls that should re-enter.
    pub async fn acquire(self) -> Result<LockGuard, LockError> {
        let inner = self.client;
        let key = match self.names {
            Names::One(key) => key,
            Names::All(keys) => return Self::acquire_all(inner, keys, &self.spec).await,
        };
        Ok(match entry::enter(inner, key, &self.spec).await? {
            Entered::Reentered(state) => LockGuard {
                state,
                lease: None,
                others: Vec::new(),
            },
            Entered::Acquired(lease) => {
                inner.guards.mark(lease.state());
                LockGuard {
                    state: Arc::clone(lease.state()),
                    lease: Some(lease),
                    others: Vec::new(),
                }
            }
        })
    }

    async fn acquire_all(
        inner: &Arc<ClientInner>,
        keys: Vec<String>,
        spec: &LockSpec,
    ) -> Result<LockGuard, LockError> {
        let EnteredAll { reentered, acquired } = entry::enter_all(inner, keys, spec).await?;
        let mut parts: Vec<(Arc<LeaseState>, Option<Lease>)> =
            reentered.into_iter().map(|state| (state, None)).collect();
        for lease in acquired {
            inner.guards.mark(lease.state());
            parts.push((Arc::clone(lease.state()), Some(lease)));
        }
        // Sorted by key, as they were taken: the first is the guard's `key`.
        parts.sort_by(|a, b| a.0.key.redis_key.cmp(&b.0.key.redis_key));
        let mut parts = parts.into_iter();
        let Some((state, lease)) = parts.next() else {
            unreachable!("enter_all holds at least one key");
        };
        Ok(LockGuard {
            state,
            lease,
            others: parts.collect(),
        })
    }
}

/// A skipping call's outcome: a skip (`entry::is_skip`) is `None`, traced
/// with the holder found; everything else as it came.
pub(crate) async fn busy_is_none<T>(
    client: &Arc<ClientInner>,
    spec: &LockSpec,
    result: Result<T, LockError>,
) -> Result<Option<T>, LockError> {
    let error = match result {
        Ok(output) => return Ok(Some(output)),
        Err(error) if !entry::is_skip(&error) => return Err(error),
        Err(error) => error,
    };
    // A skip is routine (every replica but one, every run): the holder is
    // read, one round trip, only for a trace someone records.
    if let LockError::Timeout { key, .. } = &error
        && tracing::enabled!(tracing::Level::DEBUG)
    {
        let holders = admin::holders_found(client, key).await;
        tracing::debug!(lock = spec.metric_name(), key = %key, holders = %holders, "lock busy: call skipped");
    }
    Ok(None)
}

/// A held lock. Release it with [`release`](Self::release) to learn whether
/// the release succeeded; dropping it releases in the background.
#[derive(Debug)]
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    state: Arc<LeaseState>,
    /// `None` for a re-entrant guard: the enclosing holder owns the release.
    lease: Option<Lease>,
    /// The other locks of a `lock_all` guard, in key order.
    others: Vec<(Arc<LeaseState>, Option<Lease>)>,
}

impl LockGuard {
    /// The lock's key, as requested (of a `lock_all` guard, the first in
    /// sorted order; [`keys`](Self::keys) lists them all).
    pub fn key(&self) -> &str {
        &self.state.key.name
    }

    /// Every key this guard holds, in the order they were taken.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.states().map(|state| state.key.name.as_str())
    }

    fn states(&self) -> impl Iterator<Item = &Arc<LeaseState>> {
        std::iter::once(&self.state).chain(self.others.iter().map(|(state, _)| state))
    }

    /// Which segment of a segmented lock this guard holds; `None` for any
    /// other kind.
    pub fn segment(&self) -> Option<u32> {
        self.state.segment
    }

    /// The fencing token issued with this lock, if one was requested.
    pub fn fencing_token(&self) -> Option<u64> {
        self.state.token
    }

    /// Whether the lease is still valid by the local clock: not released and
    /// its validity deadline not passed.
    pub fn is_held(&self) -> bool {
        self.states().all(|state| state.is_held())
    }

    /// The validity deadline: until then the server holds the lock for this
    /// holder even if the clocks drift by the allowance. Moves on with every
    /// confirmed renewal. On tokio's clock (`tokio::time::sleep_until`
    /// takes it; `.into_std()` gives a `std::time::Instant`), so a test on
    /// a paused clock sees the test's time.
    pub fn valid_until(&self) -> Instant {
        self.states()
            .map(|state| state.deadline())
            .min()
            .unwrap_or_else(|| self.state.deadline())
    }

    /// Resolves when the lease is lost: the server reported the lock gone or
    /// taken, or no renewal was confirmed before the validity deadline. Race
    /// it against your work (`tokio::select!`) to stop before another holder
    /// can start.
    pub async fn lost(&self) -> LostReason {
        if self.others.is_empty() {
            return self.state.lost().await;
        }
        futures_util::future::select_all(self.states().map(|state| Box::pin(state.lost())))
            .await
            .0
    }

    /// Releases the lock (every lock of a `lock_all` guard). `Err(NotHeld)`
    /// when one had already expired or been taken over; a re-entrant
    /// guard's release is a no-op.
    pub async fn release(self) -> Result<(), LockError> {
        // One lock (the usual guard): no joined futures to allocate.
        if self.others.is_empty() {
            return match self.lease {
                Some(lease) => lease.release().await,
                None => Ok(()),
            };
        }
        let leases = self
            .lease
            .into_iter()
            .chain(self.others.into_iter().filter_map(|(_, lease)| lease));
        let released = futures_util::future::join_all(leases.map(Lease::release)).await;
        released.into_iter().collect()
    }
}
