//! Running a body with a lock held: the one path shared by the attribute and
//! the programmatic API.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use futures_util::FutureExt;

use crate::entry::{self, Entered, EnteredAll};
use crate::error::LockError;
use crate::error::LostReason;
use crate::holder;
use crate::lease::Lease;
use crate::lease_state::LeaseState;
use crate::shared::ClientInner;
use crate::spec::LockSpec;

/// Runs `body` while holding the lock `name`; releases it on every way out.
///
/// - Nested inside a body that already holds `name` on this client, the call
///   re-enters: no round trip (unless it asks for a longer lease, which
///   extends it), and the lock stays until the outermost call ends.
/// - Return or `?`: the release is awaited before the result is handed back.
/// - Panic: the release is awaited, then the panic resumes with its payload.
/// - This future dropped (timeout, `select!`): the lease's `Drop` sends the
///   release from a spawned task.
/// - Lease lost while the body runs: the body is dropped before the lease's
///   validity deadline and the call returns [`LockError::Lost`].
pub(crate) async fn run_with<F: Future>(
    client: &Arc<ClientInner>,
    name: String,
    spec: &LockSpec,
    body: F,
) -> Result<F::Output, LockError> {
    let lease = match entry::enter(client, name, spec).await? {
        // The enclosing call watches the lease and releases it; its
        // cancellation also drops this nested body. The scope makes this
        // lock the innermost again, for `fencing_token()`.
        Entered::Reentered(held) => return Ok(holder::scope(client, held, body).await),
        Entered::Acquired(lease) => lease,
    };
    let state = Arc::clone(lease.state());
    let outcome = {
        let body = std::pin::pin!(holder::scope(
            client,
            Arc::clone(&state),
            AssertUnwindSafe(body).catch_unwind()
        ));
        let lost = std::pin::pin!(async { (state.lost().await, 0) });
        guarded(body, std::slice::from_ref(&state), lost).await
        // The body is dropped here, before the release below is sent.
    };

    let released = lease.release().await;
    match outcome {
        Ok(Ok(output)) => {
            if let Err(e) = released {
                // The body's result must not be lost to a failed release; an
                // unanswered one is sent again in the background
                // (`lease.rs`), else the key frees itself at its TTL.
                tracing::warn!(key = %state.key.name, lock = state.name, holder = %state.holder, error = %e, "release failed after the body finished");
            }
            Ok(output)
        }
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err((reason, _)) => {
            tracing::warn!(key = %state.key.name, lock = state.name, holder = %state.holder, %reason, "lock lost; body cancelled");
            Err(LockError::Lost {
                key: state.key.name.clone(),
                reason,
            })
        }
    }
}

/// [`run_with`] for several keys, all or none: the body runs once every key
/// is held (re-entered or acquired), and is cancelled when any lease this
/// call acquired is lost. Every acquired lease is released on the way out.
pub(crate) async fn run_with_all<F: Future>(
    client: &Arc<ClientInner>,
    names: Vec<String>,
    spec: &LockSpec,
    body: F,
) -> Result<F::Output, LockError> {
    let EnteredAll { reentered, acquired } = entry::enter_all(client, names, spec).await?;
    let states: Vec<_> = reentered
        .into_iter()
        .chain(acquired.iter().map(|lease| Arc::clone(lease.state())))
        .collect();
    let body = holder::scope_all(client, states, AssertUnwindSafe(body).catch_unwind());
    if acquired.is_empty() {
        // Every key re-entered: the enclosing calls watch and release them.
        return match body.await {
            Ok(output) => Ok(output),
            Err(panic) => std::panic::resume_unwind(panic),
        };
    }
    let outcome = {
        let watched: Vec<_> = acquired.iter().map(|lease| Arc::clone(lease.state())).collect();
        let lost = futures_util::future::select_all(watched.iter().map(|state| Box::pin(state.lost())));
        let lost = std::pin::pin!(async {
            let (reason, i, _) = lost.await;
            (reason, i)
        });
        guarded(std::pin::pin!(body), &watched, lost).await
    };
    let released = futures_util::future::join_all(acquired.into_iter().map(Lease::release)).await;
    match outcome {
        Ok(Ok(output)) => {
            for error in released.into_iter().filter_map(Result::err) {
                tracing::warn!(lock = spec.metric_name(), error = %error, "release failed after the body finished");
            }
            Ok(output)
        }
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err((reason, state)) => {
            tracing::warn!(key = %state.key.name, lock = state.name, holder = %state.holder, %reason, "lock lost; body cancelled");
            Err(LockError::Lost {
                key: state.key.name.clone(),
                reason,
            })
        }
    }
}

/// Polls `body` while every lease of `leases` can be trusted; the first
/// lease lost ends it, with that lease's reason (`lost` resolves with it and
/// its index). Each poll looks at the clock before the body may run: a
/// process that was stopped past a deadline wakes with every timer due at
/// once, and the body must not get one more step before the loss is seen.
///
/// Takes the futures pinned by the caller rather than owning them: nested
/// locked calls nest these futures, and a copy of the body in each level's
/// state would double its size per level.
fn guarded<'a, F: Future, L: Future<Output = (LostReason, usize)>>(
    mut body: Pin<&'a mut F>,
    leases: &'a [Arc<LeaseState>],
    mut lost: Pin<&'a mut L>,
) -> impl Future<Output = Result<F::Output, (LostReason, Arc<LeaseState>)>> + 'a {
    std::future::poll_fn(move |cx| {
        for state in leases {
            if let Some(reason) = state.lost_now() {
                return Poll::Ready(Err((reason, Arc::clone(state))));
            }
        }
        if let Poll::Ready((reason, i)) = lost.as_mut().poll(cx) {
            return Poll::Ready(Err((reason, Arc::clone(&leases[i]))));
        }
        body.as_mut().poll(cx).map(Ok)
    })
}
