//! The attribute's one entry point: the top layer, above the public client,
//! because it reads the global client.

use std::future::Future;
use std::sync::Arc;

use crate::client::{self, LockClient};
use crate::error::LockError;
use crate::guard;
use crate::shared::ClientInner;
use crate::spec::{LockOutput, LockSpec, SkipOutput};
use crate::with_lock;

/// Runs `body` with the lock `key` held on the global client, as
/// `#[distributed_lock]` expands to; lock failures become the function's
/// error type.
pub async fn run_locked<F>(spec: &LockSpec, key: String, body: F) -> F::Output
where
    F: Future,
    F::Output: LockOutput,
{
    let client = match client_in_scope() {
        Ok(client) => client,
        Err(e) => return LockOutput::from_lock_error(e),
    };
    as_output(with_lock::run_with(&client, key, spec, body).await)
}

/// [`run_locked`] for `keys = [...]`: every key, all or none.
pub async fn run_locked_all<F>(spec: &LockSpec, keys: Vec<String>, body: F) -> F::Output
where
    F: Future,
    F::Output: LockOutput,
{
    let client = match client_in_scope() {
        Ok(client) => client,
        Err(e) => return LockOutput::from_lock_error(e),
    };
    as_output(with_lock::run_with_all(&client, keys, spec, body).await)
}

/// [`run_locked`] with `on_busy = "skip"`: a lock another holder still has
/// after `wait` returns the function's "did not run" (`Ok(())`, `Ok(None)`).
pub async fn run_locked_or_skip<F>(spec: &LockSpec, key: String, body: F) -> F::Output
where
    F: Future,
    F::Output: LockOutput + SkipOutput,
{
    let client = match client_in_scope() {
        Ok(client) => client,
        Err(e) => return LockOutput::from_lock_error(e),
    };
    let ran = with_lock::run_with(&client, key, spec, body).await;
    skipped_or_output(guard::busy_is_none(&client, spec, ran).await)
}

/// [`run_locked_or_skip`] for `keys = [...]`.
pub async fn run_locked_all_or_skip<F>(spec: &LockSpec, keys: Vec<String>, body: F) -> F::Output
where
    F: Future,
    F::Output: LockOutput + SkipOutput,
{
    let client = match client_in_scope() {
        Ok(client) => client,
        Err(e) => return LockOutput::from_lock_error(e),
    };
    let ran = with_lock::run_with_all(&client, keys, spec, body).await;
    skipped_or_output(guard::busy_is_none(&client, spec, ran).await)
}

/// The client a locked function uses: the one `testing::with_client`
/// scoped around it, else the global one.
fn client_in_scope() -> Result<Arc<ClientInner>, LockError> {
    #[cfg(feature = "testing")]
    if let Some(client) = crate::testing::scoped_client() {
        return Ok(client.inner);
    }
    client::global().map(|client: &LockClient| Arc::clone(&client.inner))
}

/// The body's output, or the lock's failure as the function's own error.
fn as_output<T: LockOutput>(result: Result<T, LockError>) -> T {
    result.unwrap_or_else(LockOutput::from_lock_error)
}

/// The body's output, the function's "did not run", or the lock's failure.
fn skipped_or_output<T: LockOutput + SkipOutput>(result: Result<Option<T>, LockError>) -> T {
    match result {
        Ok(Some(output)) => output,
        Ok(None) => T::skipped(),
        Err(e) => T::from_lock_error(e),
    }
}
