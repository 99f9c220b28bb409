//! The one way this crate finishes work that its owner dropped unfinished:
//! a release whose future was cancelled, an acquisition that may hold the
//! lock but was abandoned, a subscription nobody waits on any more.
//!
//! `Drop` cannot await and must not block, so the work is spawned on the
//! runtime that was current when the guard was made (captured then: at drop
//! time there may be none, or another). Failures are logged, because nobody
//! is left to hear them. Without a runtime, nothing is spawned: a lock then
//! frees by its TTL, which is the documented floor.

use std::future::Future;

use tokio::runtime::Handle;

use crate::error::LockError;

/// Work a [`DropGuard`] finishes when its owner is dropped.
pub(crate) trait Cleanup: Send + Sync + 'static {
    /// Called synchronously in `Drop`: whether the asynchronous part is
    /// still needed. Bookkeeping that must not wait for a task goes here.
    fn needed(&mut self) -> bool {
        true
    }

    /// The asynchronous part, run from a spawned task.
    fn run(&self) -> impl Future<Output = Result<(), LockError>> + Send + '_;

    /// What failed, for the log line.
    fn describe(&self) -> String;
}

/// Owns `work`; dropped while armed, it spawns `work` on the runtime
/// captured at creation. [`disarm`](Self::disarm) or
/// [`into_inner`](Self::into_inner) once the work is done or handed on.
#[derive(Debug)]
pub(crate) struct DropGuard<W: Cleanup> {
    /// Always `Some` until `into_inner` or `drop` take it.
    work: Option<W>,
    armed: bool,
    runtime: Option<Handle>,
}

impl<W: Cleanup> DropGuard<W> {
    pub(crate) fn new(work: W) -> Self {
        DropGuard {
            work: Some(work),
            armed: true,
            runtime: Handle::try_current().ok(),
        }
    }

    /// Nothing happens at drop any more.
    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }

    /// Disarms and hands the work back.
    pub(crate) fn into_inner(mut self) -> W {
        self.armed = false;
        self.work
            .take()
            .expect("the work stays until the guard is consumed")
    }
}

impl<W: Cleanup> std::ops::Deref for DropGuard<W> {
    type Target = W;

    fn deref(&self) -> &W {
        self.work
            .as_ref()
            .expect("the work stays until the guard is consumed")
    }
}

impl<W: Cleanup> std::ops::DerefMut for DropGuard<W> {
    fn deref_mut(&mut self) -> &mut W {
        self.work
            .as_mut()
            .expect("the work stays until the guard is consumed")
    }
}

impl<W: Cleanup> Drop for DropGuard<W> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Some(mut work) = self.work.take() else {
            return;
        };
        if !work.needed() {
            return;
        }
        let Some(runtime) = &self.runtime else {
            return;
        };
        // A runtime that is shutting down drops the task unrun.
        runtime.spawn(async move {
            if let Err(error) = work.run().await {
                tracing::warn!(%error, "{} failed in the background", work.describe());
            }
        });
    }
}
