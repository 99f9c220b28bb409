//! The one way into a lock, for the attribute, `LockRequest::run` and
//! `LockRequest::acquire` alike: resolve the call's options, check them and
//! the key before any I/O, then re-enter a lock the running code is nested
//! inside, or acquire it.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::acquire;
use crate::error::LockError;
use crate::holder;
use crate::key::LockKey;
use crate::lease::{self, Lease};
use crate::lease_state::LeaseState;
use crate::shared::ClientInner;
use crate::spec::{Kind, LockOptions, LockSpec};
use crate::telemetry::{self, Entry};

/// How a call got its lock.
pub(crate) enum Entered {
    /// The running code is nested inside a body that holds this lock: it is
    /// the same holder, and the enclosing call owns the release.
    Reentered(Arc<LeaseState>),
    /// A new acquisition, released when this lease is.
    Acquired(Lease),
}

pub(crate) async fn enter(
    client: &Arc<ClientInner>,
    name: String,
    spec: &LockSpec,
) -> Result<Entered, LockError> {
    match LockKey::new(&client.config.prefix, name) {
        Ok(key) => enter_key(client, key, spec).await,
        Err(error) => {
            telemetry::entered(spec.metric_name(), Entry::Error, Duration::ZERO);
            Err(error)
        }
    }
}

/// [`enter`] for a key the caller built: an election's
/// (`LockKey::election`), which no lock name renders to.
pub(crate) async fn enter_key(
    client: &Arc<ClientInner>,
    key: LockKey,
    spec: &LockSpec,
) -> Result<Entered, LockError> {
    let entered = enter_one(client, key, spec).await;
    // The wait comes from the acquisition, which already read the clock:
    // an entry adds no clock read of its own.
    let (outcome, waited) = match &entered {
        Ok(Entered::Reentered(_)) => (Entry::Reentered, Duration::ZERO),
        Ok(Entered::Acquired(lease)) => (Entry::Acquired, lease.state().waited),
        Err(error) => (failed(error, spec), Duration::ZERO),
    };
    telemetry::entered(spec.metric_name(), outcome, waited);
    entered
}

/// How a failed entry counts in metrics: a busy lock is a timeout, or a
/// skip for a call that skips (`is_skip`).
fn failed(error: &LockError, spec: &LockSpec) -> Entry {
    match error {
        LockError::Timeout { .. } if spec.skips() && is_skip(error) => Entry::Skipped,
        LockError::Timeout { .. } => Entry::Timeout,
        _ => Entry::Error,
    }
}

/// Whether a skipping call's failure is a skip: the lock was busy for the
/// whole `wait`, and not with a key that never expires (written by
/// something else, it would be skipped on every run without a word). A
/// lock this task holds through a guard never gets here: the acquisition
/// reports `WouldDeadlock`.
pub(crate) fn is_skip(error: &LockError) -> bool {
    matches!(error, LockError::Timeout { no_expiry: false, .. })
}

async fn enter_one(client: &Arc<ClientInner>, key: LockKey, spec: &LockSpec) -> Result<Entered, LockError> {
    let opts = spec.resolve(&client.config, &key)?;
    if let Some(held) = holder::find(client, &key) {
        may_reenter(held.kind, opts.kind, &key)?;
        // Only a longer lease costs a round trip; a shorter one never
        // shortens the lease the enclosing call holds.
        lease::extend(client, &held, opts.ttl).await?;
        return Ok(Entered::Reentered(held));
    }
    // Boxed: the acquisition's future nests the backend's, and a body that
    // awaits another locked call would otherwise nest all of it again, past
    // the compiler's type-layout depth after two levels. Two allocations
    // per acquisition, each small enough for the allocator's cache (this
    // box and the state it drives, `acquire::start`); re-entry above stays
    // free.
    let opts = capped(client, opts);
    Box::pin(acquire::acquire(client, key, &opts))
        .await
        .map(Entered::Acquired)
}

/// How a call for several keys got them: some re-entered (held around the
/// call), the rest acquired together.
pub(crate) struct EnteredAll {
    pub(crate) reentered: Vec<Arc<LeaseState>>,
    pub(crate) acquired: Vec<Lease>,
}

/// The most keys one call may lock at once (the attribute's bound too).
pub(crate) const MAX_KEYS: usize = 64;

/// Several exclusive locks, all or none. The keys are rendered, sorted and
/// deduplicated, so that every call naming the same keys takes them in the
/// same order. Keys held around the call are re-entered; the others are
/// acquired together, as a new acquisition.
pub(crate) async fn enter_all(
    client: &Arc<ClientInner>,
    names: Vec<String>,
    spec: &LockSpec,
) -> Result<EnteredAll, LockError> {
    // A set may be taken group by group, each group's wait counted from
    // its own start: the call's wait is read here (sets are rare).
    let started = Instant::now();
    let entered = enter_set(client, names, spec).await;
    let outcome = match &entered {
        Ok(set) if set.acquired.is_empty() => Entry::Reentered,
        Ok(_) => Entry::Acquired,
        Err(error) => failed(error, spec),
    };
    telemetry::entered(spec.metric_name(), outcome, started.elapsed());
    entered
}

async fn enter_set(
    client: &Arc<ClientInner>,
    names: Vec<String>,
    spec: &LockSpec,
) -> Result<EnteredAll, LockError> {
    let invalid = |key: &str, reason: &str| LockError::InvalidRequest {
        key: key.to_owned(),
        reason: reason.to_owned(),
    };
    if names.is_empty() {
        return Err(invalid("", "`lock_all` needs at least one key"));
    }
    if names.len() > MAX_KEYS {
        return Err(invalid(&names[0], "a call may lock at most 64 keys at once"));
    }
    let mut keys = names
        .into_iter()
        .map(|name| LockKey::new(&client.config.prefix, name))
        .collect::<Result<Vec<_>, _>>()?;
    keys.sort_by(|a, b| a.redis_key.cmp(&b.redis_key));
    keys.dedup_by(|a, b| a.redis_key == b.redis_key);
    let opts = spec.resolve(&client.config, &keys[0])?;
    if opts.kind != Kind::Exclusive {
        return Err(invalid(
            &keys[0].name,
            "several keys take exclusive locks only (no `mode`, `permits` or `segments`)",
        ));
    }
    if opts.fencing {
        return Err(invalid(
            &keys[0].name,
            "several keys have no fencing token: take the lock of the resource you fence on its own",
        ));
    }
    if opts.hold_at_least.is_some() {
        return Err(invalid(
            &keys[0].name,
            "`hold_at_least` keeps one key held after its body: name the job's run in one key",
        ));
    }
    let mut reentered = Vec::new();
    let mut missing = Vec::new();
    for key in keys {
        match holder::find(client, &key) {
            Some(held) => {
                may_reenter(held.kind, opts.kind, &key)?;
                lease::extend(client, &held, opts.ttl).await?;
                reentered.push(held);
            }
            None => missing.push(key),
        }
    }
    let opts = capped(client, opts);
    let acquired = match missing.len() {
        0 => Vec::new(),
        1 => vec![Box::pin(acquire::acquire(client, missing.remove(0), &opts)).await?],
        _ => Box::pin(acquire::acquire_all(client, missing, &opts)).await?,
    };
    Ok(EnteredAll { reentered, acquired })
}

/// An acquisition's options: a lease no longer than the backend can vouch
/// for (ZooKeeper, etcd: their session's or lease's timeout); renewals and
/// deadlines follow from it.
fn capped(client: &ClientInner, opts: LockOptions) -> LockOptions {
    LockOptions {
        ttl: client.backend.lease_for(opts.ttl),
        ..opts
    }
}

/// Whether a call asking for `asked` may re-enter a lease of `held` on the
/// same key. A writer may read; a reader may not write: waiting for the
/// write lock would wait for its own read lock, forever.
fn may_reenter(held: Kind, asked: Kind, key: &LockKey) -> Result<(), LockError> {
    match (held, asked) {
        (Kind::Exclusive, Kind::Exclusive)
        | (Kind::Fair, Kind::Fair)
        | (Kind::Write, Kind::Read | Kind::Write)
        | (Kind::Read, Kind::Read)
        | (Kind::Permits(_), Kind::Permits(_))
        | (Kind::Segments(_), Kind::Segments(_)) => Ok(()),
        (Kind::Read, Kind::Write) => Err(LockError::UpgradeRefused {
            key: key.name.clone(),
        }),
        (held, asked) => Err(LockError::InvalidRequest {
            key: key.name.clone(),
            reason: format!(
                "the call is nested inside a {} of this key and asks for a {}; one key is one kind of lock",
                held.describe(),
                asked.describe()
            ),
        }),
    }
}
