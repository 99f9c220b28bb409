//! Which tasks hold a lock through a [`LockGuard`](crate::LockGuard).
//!
//! A guard is not a scope: code that runs after `acquire()` in the same task
//! is not nested in anything, so structural re-entry cannot see it. Without
//! this table, a second `acquire()` of the same key in that task would wait
//! for its own guard until its `wait` ran out. With it, that call fails at
//! once with `WouldDeadlock`.
//!
//! A guard counts as held by the task that took it, even if it was moved to
//! another task since: then the taking task's second call fails at once
//! instead of waiting, which is a spurious error but never two holders.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use std::thread::ThreadId;

use crate::key::LockKey;

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

/// Per client: the guards alive, by Redis key, with the task that took each.
#[derive(Debug, Default)]
pub(crate) struct GuardTable {
    held: Mutex<HashMap<String, Vec<Caller>>>,
    /// Guards alive, so that a call with none alive skips the lock.
    count: AtomicUsize,
}

impl GuardTable {
    /// Whether the running task took a guard on `key` that is still alive.
    pub(crate) fn held_by_this_task(&self, key: &LockKey) -> bool {
        if self.count.load(Ordering::Acquire) == 0 {
            return false;
        }
        let task = caller();
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.get(&key.redis_key)
            .is_some_and(|tasks| tasks.contains(&task))
    }

    /// Records a guard the running task took on `key`, until the mark drops.
    pub(crate) fn mark(self: &Arc<Self>, key: &LockKey) -> GuardMark {
        let task = caller();
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.entry(key.redis_key.clone()).or_default().push(task);
        self.count.fetch_add(1, Ordering::AcqRel);
        GuardMark {
            table: Arc::clone(self),
            redis_key: key.redis_key.clone(),
            task,
        }
    }
}

/// One live guard's entry in its client's [`GuardTable`].
#[derive(Debug)]
pub(crate) struct GuardMark {
    table: Arc<GuardTable>,
    redis_key: String,
    task: Caller,
}

impl Drop for GuardMark {
    fn drop(&mut self) {
        let mut held = self.table.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(tasks) = held.get_mut(&self.redis_key) {
            if let Some(i) = tasks.iter().position(|t| *t == self.task) {
                tasks.swap_remove(i);
                self.table.count.fetch_sub(1, Ordering::AcqRel);
            }
            if tasks.is_empty() {
                held.remove(&self.redis_key);
            }
        }
    }
}
