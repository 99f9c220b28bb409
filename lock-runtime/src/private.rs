//! The attribute's one entry point: the top layer, above the public client,
//! because it reads the global client.

use std::future::Future;

use crate::client;
use crate::spec::{LockOutput, LockSpec};
use crate::with_lock;

/// Runs `body` with the lock `key` held on the global client, as
/// `#[distributed_lock]` expands to; lock failures become the function's
/// error type.
pub async fn run_locked<F>(spec: &LockSpec, key: String, body: F) -> F::Output
where
    F: Future,
    F::Output: LockOutput,
{
    #[cfg(feature = "testing")]
    if let Some(client) = crate::testing::scoped_client() {
        return as_output(with_lock::run_with(&client.inner, key, spec, body).await);
    }
    let client = match client::global() {
        Ok(client) => client,
        Err(e) => return LockOutput::from_lock_error(e),
    };
    as_output(with_lock::run_with(&client.inner, key, spec, body).await)
}

/// [`run_locked`] for `keys = [...]`: every key, all or none.
pub async fn run_locked_all<F>(spec: &LockSpec, keys: Vec<String>, body: F) -> F::Output
where
    F: Future,
    F::Output: LockOutput,
{
    #[cfg(feature = "testing")]
    if let Some(client) = crate::testing::scoped_client() {
        return as_output(with_lock::run_with_all(&client.inner, keys, spec, body).await);
    }
    let client = match client::global() {
        Ok(client) => client,
        Err(e) => return LockOutput::from_lock_error(e),
    };
    as_output(with_lock::run_with_all(&client.inner, keys, spec, body).await)
}

/// The body's output, or the lock's failure as the function's own error.
fn as_output<T: LockOutput>(result: Result<T, crate::error::LockError>) -> T {
    result.unwrap_or_else(LockOutput::from_lock_error)
}
