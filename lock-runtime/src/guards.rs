//! Which tasks hold a lock through a [`LockGuard`](crate::LockGuard).
//!
//! A guard is not a scope: code that runs after `acquire()` in the same task
//! is not nested in anything, so structural re-entry cannot see it. Without
//! this table, a second call for the same key in that task would wait for
//! its own guard until its `wait` ran out. With it, a call that found the
//! lock held and is about to wait fails at once with `WouldDeadlock`.
//!
//! A guard counts as held by the task that took it, even if it was moved to
//! another task since: then the taking task's second call fails at once
//! instead of waiting, which is a spurious error but never two holders.
//!
//! Cheap on the fast path: taking a guard pushes one entry; nothing is
//! removed at release (a released lease is dead, and dead entries are swept
//! as the table grows). Only a call that is about to wait reads the table.

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::thread::ThreadId;

use crate::key::LockKey;
use crate::lease_state::LeaseState;

/// Who is calling: a spawned task, or the future a runtime's `block_on`
/// drives (`#[tokio::main]`, `#[tokio::test]`), which is no task and never
/// leaves its thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caller {
    Task(tokio::task::Id),
    Thread(ThreadId),
}

fn caller() -> Caller {
    tokio::task::try_id().map_or_else(|| Caller::Thread(std::thread::current().id()), Caller::Task)
}

/// The table is never swept below this length.
const MIN_SWEEP: usize = 64;

/// Per client: the guards taken, with the task that took each.
#[derive(Debug, Default)]
pub(crate) struct GuardTable {
    entries: Mutex<Entries>,
}

#[derive(Debug, Default)]
struct Entries {
    taken: Vec<(Caller, Weak<LeaseState>)>,
    /// Past this length the table is swept of released leases.
    sweep_above: usize,
}

impl GuardTable {
    /// Records that the running task took a guard on `lease`.
    pub(crate) fn mark(&self, lease: &Arc<LeaseState>) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.taken.len() > entries.sweep_above.max(MIN_SWEEP) {
            entries.taken.retain(|(_, lease)| is_held(lease));
            entries.sweep_above = 2 * entries.taken.len();
        }
        // As in the watchdog's list: a dead `Weak` pins its lease's block,
        // and the guard taken last is usually released by now.
        while entries
            .taken
            .last()
            .is_some_and(|(_, weak)| weak.strong_count() == 0)
        {
            entries.taken.pop();
        }
        entries.taken.push((caller(), Arc::downgrade(lease)));
    }

    /// Whether the running task took a guard on `key` that still holds it.
    pub(crate) fn held_by_this_task(&self, key: &LockKey) -> bool {
        let me = caller();
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries
            .taken
            .iter()
            .any(|(by, lease)| *by == me && lease.upgrade().is_some_and(|l| l.is_live() && l.is_lock(key)))
    }
}

#[cfg(test)]
impl GuardTable {
    /// How many guards the table remembers, released ones included.
    pub(crate) fn len(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .taken
            .len()
    }
}

fn is_held(lease: &Weak<LeaseState>) -> bool {
    lease.upgrade().is_some_and(|l| l.is_live())
}
