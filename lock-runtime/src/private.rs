//! The attribute's one entry point: the top layer, above the public client,
//! because it reads the global client.

use std::borrow::Cow;
use std::future::Future;

use crate::client::{self, LockClient};
use crate::error::LockError;
use crate::guard;
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
    let ran = async { with_lock::run_with(&client_in_scope()?.inner, key, spec, body).await }.await;
    ran.unwrap_or_else(LockOutput::from_lock_error)
}

/// [`run_locked`] for `keys = [...]`: every key, all or none.
pub async fn run_locked_all<F>(spec: &LockSpec, keys: Vec<String>, body: F) -> F::Output
where
    F: Future,
    F::Output: LockOutput,
{
    let ran = async { with_lock::run_with_all(&client_in_scope()?.inner, keys, spec, body).await }.await;
    ran.unwrap_or_else(LockOutput::from_lock_error)
}

/// [`run_locked`] with `on_busy = "skip"`: a lock another holder still has
/// after `wait` returns the function's "did not run" (`Ok(())`, `Ok(None)`).
pub async fn run_locked_or_skip<F>(spec: &LockSpec, key: String, body: F) -> F::Output
where
    F: Future,
    F::Output: LockOutput + SkipOutput,
{
    let ran = async {
        let client = client_in_scope()?;
        let ran = with_lock::run_with(&client.inner, key, spec, body).await;
        guard::busy_is_none(&client.inner, spec, ran).await
    };
    skipped_or_output(ran.await)
}

/// [`run_locked_or_skip`] for `keys = [...]`.
pub async fn run_locked_all_or_skip<F>(spec: &LockSpec, keys: Vec<String>, body: F) -> F::Output
where
    F: Future,
    F::Output: LockOutput + SkipOutput,
{
    let ran = async {
        let client = client_in_scope()?;
        let ran = with_lock::run_with_all(&client.inner, keys, spec, body).await;
        guard::busy_is_none(&client.inner, spec, ran).await
    };
    skipped_or_output(ran.await)
}

/// The client a locked function uses: the one `testing::with_client`
/// scoped around it, else the global one (borrowed: no reference count
/// touched per call).
fn client_in_scope() -> Result<Cow<'static, LockClient>, LockError> {
    #[cfg(feature = "testing")]
    if let Some(client) = crate::testing::scoped_client() {
        return Ok(Cow::Owned(client));
    }
    client::global().map(Cow::Borrowed)
}

/// The body's output, the function's "did not run", or the lock's failure.
fn skipped_or_output<T: LockOutput + SkipOutput>(result: Result<Option<T>, LockError>) -> T {
    match result {
        Ok(Some(output)) => output,
        Ok(None) => T::skipped(),
        Err(e) => T::from_lock_error(e),
    }
}
