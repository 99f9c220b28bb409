//! Declarative, reentrant distributed locks for async Rust.
//!
//! ```no_run
//! use lock_runtime::{LockClient, LockError};
//!
//! # async fn demo() -> Result<(), LockError> {
//! let client = LockClient::connect("redis://127.0.0.1/").await?;
//! let total = client
//!     .lock("stock:42")
//!     .wait(std::time::Duration::from_secs(5))
//!     .run(async { 7 })
//!     .await?;
//! assert_eq!(total, 7);
//! # Ok(()) }
//! ```
//!
//! A lock is held by one *holder*: the body of one outermost lock call. Code
//! nested inside that body re-enters the same lock without a round trip; two
//! branches of one task that run side by side, or a spawned task, are
//! different holders and exclude each other. The lock is released on every
//! way out of the body (return, `?`, panic, a dropped future), and a body
//! whose lease can no longer be trusted is cancelled before it expires on the
//! server.
//!
//! See the README for the guarantees and what is not guaranteed.

mod acquire;
mod backend;
mod client;
mod config;
mod entry;
mod error;
mod guard;
mod guards;
mod holder;
mod key;
mod lease;
mod spec;
mod timing;
mod waiter;
mod watchdog;
mod with_lock;

pub use client::{LockClient, LockClientBuilder, init};
pub use error::{BoxError, LockError, LostReason};
pub use guard::{LockGuard, LockRequest};
#[doc(inline)]
#[doc = include_str!("attribute.md")]
pub use lock_macros::distributed_lock;

/// The fencing token of the innermost lock held around the running code, or
/// `None` outside a locked body or when the lock was taken without
/// `fencing = true`.
pub fn fencing_token() -> Option<u64> {
    holder::innermost_token()
}

/// What `#[distributed_lock]` expands to. Not a public API: no stability is
/// promised for anything in here.
#[doc(hidden)]
pub mod __private {
    use std::future::Future;

    pub use crate::spec::{KeyArg, KeyPart, LockOutput, LockSpec, key_part};
    pub use std::format;

    /// The single entry point of the attribute's expansion.
    pub async fn run_locked<F>(spec: &LockSpec, key: String, body: F) -> F::Output
    where
        F: Future,
        F::Output: LockOutput,
    {
        let client = match crate::client::global() {
            Ok(client) => &client.inner,
            Err(e) => return LockOutput::from_lock_error(e),
        };
        match crate::with_lock::run_with(client, key, spec, body).await {
            Ok(output) => output,
            Err(e) => LockOutput::from_lock_error(e),
        }
    }
}

/// Compiles (and, where marked, runs) every example in the README.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
