//! What the runtime reports through the `metrics` facade (README,
//! "Observability"). Every function here is a no-op without the `metrics`
//! feature; with it and no recorder installed, the facade hands out no-op
//! handles.
//!
//! The `lock` label is the key *template* (`stock:<product_id>`), or the
//! name a programmatic call gave, never the rendered key: one series per
//! template, however many keys it renders.

use std::time::Duration;

use crate::error::LostReason;

/// The `lock` label of a programmatic call that gave no `.name(...)`.
pub(crate) const PROGRAMMATIC: &str = "programmatic";

/// How an entry into a lock ended (`outcome` of `distributed_lock_acquire_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    Acquired,
    Reentered,
    Timeout,
    /// Busy, and the call skips rather than wait (`on_busy = "skip"`).
    Skipped,
    Error,
}

/// What one lease's renewal found (`outcome` of `distributed_lock_renewals_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RenewalOutcome {
    /// The server lengthened the lease.
    Renewed,
    /// The lock was gone or someone else's: the lease is lost.
    Lost,
    /// Too few Redlock masters answered either way; retried.
    Unconfirmed,
    /// No reply, or an error; retried until the lease's deadline.
    Failed,
}

#[cfg(feature = "metrics")]
mod names {
    pub(super) const ACQUIRE: &str = "distributed_lock_acquire_total";
    pub(super) const WAIT: &str = "distributed_lock_wait_seconds";
    pub(super) const HOLD: &str = "distributed_lock_hold_seconds";
    pub(super) const RENEWALS: &str = "distributed_lock_renewals_total";
    pub(super) const RENEWAL_LAG: &str = "distributed_lock_renewal_lag_seconds";
    pub(super) const LOST: &str = "distributed_lock_lost_total";
    pub(super) const HELD: &str = "distributed_lock_held";
    pub(super) const SKIPPED: &str = "distributed_lock_skipped_total";
}

/// Gives each metric its unit and description, for exporters that show
/// them. Harmless when called again, or when no recorder is installed (the
/// descriptions are then dropped).
pub(crate) fn describe() {
    #[cfg(feature = "metrics")]
    {
        use metrics::Unit;
        metrics::describe_counter!(
            names::ACQUIRE,
            "Lock calls by how they ended: acquired, reentered, timeout, error"
        );
        metrics::describe_histogram!(
            names::WAIT,
            Unit::Seconds,
            "Time from a lock call to holding the lock (acquired calls)"
        );
        metrics::describe_histogram!(
            names::HOLD,
            Unit::Seconds,
            "Time from acquiring a lock to releasing it"
        );
        metrics::describe_counter!(
            names::RENEWALS,
            "Lease renewals by outcome: renewed, lost, unconfirmed, failed"
        );
        metrics::describe_histogram!(
            names::RENEWAL_LAG,
            Unit::Seconds,
            "How late a renewal was confirmed, from when it fell due (the most overdue lease of each batch)"
        );
        metrics::describe_counter!(
            names::LOST,
            "Locks lost while held, by reason: expired, taken_over, lease_ended"
        );
        metrics::describe_gauge!(names::HELD, "Locks this process holds now");
        metrics::describe_counter!(
            names::SKIPPED,
            "Calls that skipped their body because another holder had the lock (`on_busy = \"skip\"`, `try_run`, `try_acquire`)"
        );
    }
}

/// A lock call ended; `waited` is how long it took, recorded for acquired
/// calls.
pub(crate) fn entered(lock: &'static str, outcome: Entry, waited: Duration) {
    #[cfg(feature = "metrics")]
    {
        let keys = recording::keys_of(lock);
        let index = match outcome {
            Entry::Acquired => 0,
            Entry::Reentered => 1,
            Entry::Timeout => 2,
            Entry::Error => 3,
            Entry::Skipped => {
                recording::count(&keys.skipped, 1);
                return;
            }
        };
        recording::count(&keys.acquire[index], 1);
        if outcome == Entry::Acquired {
            recording::observe(&keys.wait, waited);
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (lock, outcome, waited);
}

/// A lease began: one more lock held.
pub(crate) fn lease_started() {
    #[cfg(feature = "metrics")]
    recording::held(1.0);
}

/// A lease ended after `held` (released, or given up after a loss).
pub(crate) fn lease_ended(lock: &'static str, held: Duration) {
    #[cfg(feature = "metrics")]
    {
        recording::held(-1.0);
        recording::observe(&recording::keys_of(lock).hold, held);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (lock, held);
}

/// A held lease was lost.
pub(crate) fn lost(lock: &'static str, reason: LostReason) {
    #[cfg(feature = "metrics")]
    {
        let index = match reason {
            LostReason::Expired => 0,
            LostReason::TakenOver => 1,
            LostReason::LeaseEnded => 2,
        };
        recording::count(&recording::keys_of(lock).lost[index], 1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (lock, reason);
}

/// `count` leases' renewals ended with `outcome`.
pub(crate) fn renewals(outcome: RenewalOutcome, count: usize) {
    #[cfg(feature = "metrics")]
    {
        if count == 0 {
            return;
        }
        let key = match outcome {
            RenewalOutcome::Renewed => &recording::RENEWED,
            RenewalOutcome::Lost => &recording::RENEWAL_LOST,
            RenewalOutcome::Unconfirmed => &recording::UNCONFIRMED,
            RenewalOutcome::Failed => &recording::FAILED,
        };
        recording::count(key, count as u64);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (outcome, count);
}

/// A batch of renewals was confirmed `lag` after its most overdue lease
/// fell due: what eats into the two thirds of a ttl a lease has left then.
pub(crate) fn renewal_lag(lag: Duration) {
    #[cfg(feature = "metrics")]
    recording::observe(&recording::RENEWAL_LAG, lag);
    #[cfg(not(feature = "metrics"))]
    let _ = lag;
}

/// Recording without building a key per call: the facade's macros would
/// allocate a label list and hash the key on every call, even with no
/// recorder installed. The keys of a lock name are built once, the first
/// time the name is seen, and kept for the life of the process (names are
/// templates, so there are few); the others are built at compile time.
#[cfg(feature = "metrics")]
mod recording {
    use std::cell::Cell;
    use std::collections::HashMap;
    use std::sync::{Mutex, PoisonError};
    use std::time::Duration;

    use metrics::{Key, Label, Level, Metadata};

    use super::names;

    static METADATA: Metadata<'static> = Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

    macro_rules! renewals {
        ($($name:ident = $outcome:literal),*) => {$(
            pub(super) static $name: Key = {
                static LABELS: [Label; 1] = [Label::from_static_parts("outcome", $outcome)];
                Key::from_static_parts(names::RENEWALS, &LABELS)
            };
        )*};
    }
    renewals!(
        RENEWED = "renewed",
        RENEWAL_LOST = "lost",
        UNCONFIRMED = "unconfirmed",
        FAILED = "failed"
    );
    static HELD: Key = Key::from_static_name(names::HELD);
    pub(super) static RENEWAL_LAG: Key = Key::from_static_name(names::RENEWAL_LAG);

    /// The keys of one lock name's series.
    pub(super) struct NameKeys {
        /// By outcome: acquired, reentered, timeout, error.
        pub(super) acquire: [Key; 4],
        pub(super) wait: Key,
        pub(super) hold: Key,
        /// By reason: expired, taken_over, lease_ended.
        pub(super) lost: [Key; 3],
        pub(super) skipped: Key,
    }

    impl NameKeys {
        fn new(lock: &'static str) -> Self {
            let lock_label = || Label::from_static_parts("lock", lock);
            let pair = |name: &'static str, label: &'static str, value: &'static str| {
                Key::from_parts(name, vec![lock_label(), Label::from_static_parts(label, value)])
            };
            NameKeys {
                acquire: ["acquired", "reentered", "timeout", "error"]
                    .map(|o| pair(names::ACQUIRE, "outcome", o)),
                wait: Key::from_parts(names::WAIT, vec![lock_label()]),
                hold: Key::from_parts(names::HOLD, vec![lock_label()]),
                lost: ["expired", "taken_over", "lease_ended"].map(|r| pair(names::LOST, "reason", r)),
                skipped: Key::from_parts(names::SKIPPED, vec![lock_label()]),
            }
        }
    }

    thread_local! {
        /// The last name this thread recorded, and its keys: a lock is
        /// usually entered, held and released under one name in a row.
        static LAST: Cell<Option<(&'static str, &'static NameKeys)>> = const { Cell::new(None) };
    }

    pub(super) fn keys_of(lock: &'static str) -> &'static NameKeys {
        // By content: one name written twice (a `const`, say) may sit at two
        // addresses, and a miss here costs a lock and a hash.
        if let Some((name, keys)) = LAST.get()
            && name == lock
        {
            return keys;
        }
        static ALL: Mutex<Option<HashMap<&'static str, &'static NameKeys>>> = Mutex::new(None);
        let keys = *ALL
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert_with(HashMap::new)
            .entry(lock)
            .or_insert_with(|| Box::leak(Box::new(NameKeys::new(lock))));
        LAST.set(Some((lock, keys)));
        keys
    }

    pub(super) fn count(key: &Key, n: u64) {
        metrics::with_recorder(|r| r.register_counter(key, &METADATA).increment(n));
    }

    pub(super) fn observe(key: &Key, value: Duration) {
        metrics::with_recorder(|r| r.register_histogram(key, &METADATA).record(value));
    }

    pub(super) fn held(delta: f64) {
        metrics::with_recorder(|r| r.register_gauge(&HELD, &METADATA).increment(delta));
    }
}
