//! Who holds a lock, and which locks the running code is nested inside.
//!
//! A holder id names one outermost acquisition: a random per-process prefix
//! (so ids from different processes and hosts never collide) and a counter.
//! Re-entry is structural: a body runs inside a task-local scope
//! that lists the leases held around it, so only code polled *inside* that
//! body sees them. Sibling branches of one task (`join!`, `select!`) are polled
//! outside each other's scopes and therefore exclude each other, and a spawned
//! task starts with no scope at all.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};

use crate::key::LockKey;
use crate::lease_state::LeaseState;
use crate::shared::ClientInner;
use crate::spec::Kind;

/// 128 random bits from the OS: the chance that two processes share a prefix
/// is negligible, and sharing one would let them release each other's locks.
/// With the `:` that ends it.
static PROCESS_PREFIX: LazyLock<String> = LazyLock::new(|| format!("{:032x}:", rand::random::<u128>()));
static NEXT_HOLDER: AtomicU64 = AtomicU64::new(1);

/// A fresh holder id, `<32 hex digits>:<counter>`; the acquire script checks
/// this shape to tell our values from foreign ones. A side of a read-write
/// lock carries its side in front, `r:<id>` or `w:<id>`, and a permit
/// holder's `p:<id>`, and a fair lock's holder `f:<id>`: the scripts tell
/// them apart by that prefix.
pub(crate) fn new_holder_id(kind: Kind) -> String {
    let n = NEXT_HOLDER.fetch_add(1, Ordering::Relaxed);
    let side = match kind {
        Kind::Read => "r:",
        Kind::Write => "w:",
        Kind::Permits(_) => "p:",
        Kind::Fair => "f:",
        Kind::Exclusive | Kind::Segments(_) => "",
    };
    // Built by hand: `format!` costs several times these copies, on every
    // acquisition.
    let prefix = PROCESS_PREFIX.as_str();
    let mut id = String::with_capacity(side.len() + prefix.len() + 20);
    id.push_str(side);
    id.push_str(prefix);
    id.push_str(itoa::Buffer::new().format(n));
    id
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_ids_are_unique_and_well_formed() {
        let a = new_holder_id(Kind::Exclusive);
        let b = new_holder_id(Kind::Exclusive);
        assert!(new_holder_id(Kind::Write).starts_with("w:"));
        assert_ne!(a, b);
        let (prefix, counter) = a.split_once(':').expect("prefix:counter");
        assert_eq!(prefix.len(), 32);
        assert!(prefix.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(
            counter.parse::<u64>().map(|n| n.to_string()).as_deref(),
            Ok(counter)
        );
    }
}
