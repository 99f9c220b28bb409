//! Running a body with a lock held: the one path shared by the attribute and
//! the programmatic API.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt;

use crate::entry::{self, Entered};
use crate::error::LockError;
use crate::holder;
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
        tokio::select! {
            biased;
            finished = body => Ok(finished),
            reason = state.lost() => Err(reason),
        }
        // The body is dropped here, before the release below is sent.
    };

    let released = lease.release().await;
    match outcome {
        Ok(Ok(output)) => {
            if let Err(e) = released {
                // The body's result must not be lost to a failed release; the
                // key frees itself at its TTL.
                tracing::warn!(key = %state.key.name, error = %e, "release failed after the body finished");
            }
            Ok(output)
        }
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(reason) => {
            tracing::warn!(key = %state.key.name, %reason, "lock lost; body cancelled");
            Err(LockError::Lost {
                key: state.key.name.clone(),
                reason,
            })
        }
    }
}
