//! Who holds a lock, and which locks the running code is nested inside.
//!
//! A holder id names one outermost acquisition: a random per-process prefix
//! (so ids from different processes and hosts never collide) and a counter
//! (`entropy.rs`).
//! Re-entry is structural: a body runs inside a task-local scope
//! that lists the leases held around it, so only code polled *inside* that
//! body sees them. Sibling branches of one task (`join!`, `select!`) are polled
//! outside each other's scopes and therefore exclude each other, and a spawned
//! task starts with no scope at all.

use std::future::Future;
use std::sync::Arc;

use crate::key::LockKey;
use crate::lease_state::LeaseState;
use crate::shared::ClientInner;

tokio::task_local! {
    static HELD: Held;
}

/// The leases held around the code being polled, innermost first. An
/// immutable list: entering a body pushes by sharing the parent, so no scope
/// ever sees a sibling's entries.
#[derive(Clone)]
struct Held(Arc<HeldNode>);

struct HeldNode {
    /// Which client took the lease: the same key on another client (another
    /// Redis) is another lock.
    client: Arc<ClientInner>,
    lease: Arc<LeaseState>,
    parent: Option<Held>,
}

impl Held {
    fn iter(&self) -> impl Iterator<Item = &HeldNode> {
        std::iter::successors(Some(self), |h| h.0.parent.as_ref()).map(|h| &*h.0)
    }
}

fn current() -> Option<Held> {
    HELD.try_with(Held::clone).ok()
}

/// The lease on `key` from `client` that the running code is nested inside,
/// if any. Read at poll time, so it reflects where the caller really runs.
pub(crate) fn find(client: &Arc<ClientInner>, key: &LockKey) -> Option<Arc<LeaseState>> {
    HELD.try_with(|held| {
        held.iter()
            .find(|h| Arc::ptr_eq(&h.client, client) && h.lease.is_lock(key))
            .map(|h| Arc::clone(&h.lease))
    })
    .ok()
    .flatten()
}

/// The fencing token of the innermost lock held around the running code, or
/// `None` outside a locked body or when the lock was taken without
/// `fencing = true`.
pub fn fencing_token() -> Option<u64> {
    HELD.try_with(|held| held.0.lease.token).ok().flatten()
}

/// Whether the running code holds the lock `key` (by the name it was taken
/// under, as in `key = "..."` once rendered): inside the body of a lock
/// call on `key`, or of a call that took it with others, on any client, and
/// the lease still trusted. For tests and debug assertions; see
/// [`assert_locked!`](crate::assert_locked).
pub fn holds(key: &str) -> bool {
    HELD.try_with(|held| {
        held.iter().any(|h| {
            let name = h.lease.key.name.as_str();
            // A segment's lease is named `key#i`.
            let of_key = name == key
                || (h.lease.segment.is_some() && name.rsplit_once('#').is_some_and(|(lock, _)| lock == key));
            of_key && h.lease.is_held()
        })
    })
    .unwrap_or(false)
}

/// The segment of the innermost segmented lock (`segments = N`) held around
/// the running code: `Some(i)` for `K#i`, or `None` outside such a body.
pub fn segment() -> Option<u32> {
    HELD.try_with(|held| held.iter().find_map(|h| h.lease.segment))
        .ok()
        .flatten()
}

/// Runs `body` with every lease of `leases`, taken from `client`, added to
/// the leases held around it.
pub(crate) fn scope_all<F: Future>(
    client: &Arc<ClientInner>,
    leases: Vec<Arc<LeaseState>>,
    body: F,
) -> impl Future<Output = F::Output> {
    let mut held = current();
    for lease in leases {
        held = Some(Held(Arc::new(HeldNode {
            client: Arc::clone(client),
            lease,
            parent: held,
        })));
    }
    match held {
        Some(held) => futures_util::future::Either::Left(HELD.scope(held, body)),
        // No lease at all: nothing to add.
        None => futures_util::future::Either::Right(body),
    }
}

/// Runs `body` with `lease`, taken from `client`, added to the leases held
/// around it.
pub(crate) fn scope<F: Future>(
    client: &Arc<ClientInner>,
    lease: Arc<LeaseState>,
    body: F,
) -> impl Future<Output = F::Output> {
    let parent = current();
    let node = HeldNode {
        client: Arc::clone(client),
        lease,
        parent,
    };
    HELD.scope(Held(Arc::new(node)), body)
}
