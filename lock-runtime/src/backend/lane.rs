//! The renewal thread: where a client's renewals run when its backend talks
//! to a server, apart from the caller's tasks.
//!
//! On the caller's runtime a renewal waits its turn behind every task that
//! is ready, at each step (the timer's wake, the reply's arrival): 100,000
//! tasks taking locks on one core put renewals up to a second behind their
//! due time, a third of a 3 s lease (`lock-bench`, WSF). A thread of its own
//! is scheduled by the kernel as soon as it has work. One per process,
//! shared by every client, started on first use; it runs only renewals,
//! the watchdog's timers and, on Redis, the reading of the renewal lane's
//! connection as made at start-up (a lazily made one, or one the driver
//! makes again after a failure, is read on the runtime that first used it).
//!
//! Hand-written because tokio offers no priority among tasks; a runtime of
//! one worker thread is the smallest unit the kernel schedules apart.

use std::future::Future;
use std::sync::LazyLock;

use tokio::runtime::{Builder, Handle};

/// A current-thread runtime driven by a thread of its own, which blocks on
/// it for the life of the process.
/// Built on that thread: a runtime dropped in an async context panics, and
/// here nothing is dropped but on the thread's own stack.
static RENEWALS: LazyLock<Option<Handle>> = LazyLock::new(|| {
    let (handle_tx, handle_rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("lock-renewals".into())
        .spawn(move || {
            let Ok(runtime) = Builder::new_current_thread().enable_all().build() else {
                return;
            };
            if handle_tx.send(runtime.handle().clone()).is_ok() {
                runtime.block_on(std::future::pending::<()>());
            }
        })
        .ok()?;
    handle_rx.recv().ok()
});

/// The renewal thread's runtime; `None` if it could not be started (the
/// caller's runtime is used then, as without it).
pub(crate) fn renewal_runtime() -> Option<Handle> {
    RENEWALS.clone()
}

/// Runs `work` on the renewal thread and waits for it there; on the
/// caller's task if that thread could not be started. Whatever `work`
/// connects (a Redis connection's reader task) then lives on that thread.
pub(crate) async fn on_renewal_thread<F>(work: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let Some(runtime) = renewal_runtime() else {
        return work.await;
    };
    match runtime.spawn(work).await {
        Ok(output) => output,
        // The task panicked: carry the panic on, as running it here would.
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}
