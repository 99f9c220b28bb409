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
//!
//! # Features
//!
//! - `metrics` (default): records the `distributed_lock_*` counters,
//!   histograms and gauge through the [`metrics`](https://docs.rs/metrics)
//!   facade; the application installs the exporter.
//! - `mysql`: `LockClient::mysql` and `LockClientBuilder::mysql`, locks
//!   as rows of a MySQL 8 / MariaDB 10.6+ table, through `mysql_async`.
//! - `zookeeper`: `LockClient::zookeeper` and
//!   `LockClientBuilder::zookeeper`, locks as queues of ephemeral
//!   sequential nodes on a ZooKeeper 3.5+ ensemble, through
//!   `zookeeper-client`.
//! - `postgres`: `LockClient::postgres` and `LockClientBuilder::postgres`,
//!   leases as rows of a PostgreSQL 13+ table, through `tokio-postgres`.
//! - `etcd`: `LockClient::etcd` and `LockClientBuilder::etcd`, locks as
//!   keys on one lease per client on etcd 3.4+, through `etcd-client`
//!   (whose build needs `protoc`).
//! - `testing`: `testing::simulated`, a lock server simulated in the
//!   process on tokio's clock, with injected faults, for testing code that
//!   takes locks without a server (`docs/testing.md`).
//! - `tls`: `rediss://` URLs, PostgreSQL's `sslmode=require`, MySQL's
//!   `require_ssl=true` and `https://` etcd endpoints, through rustls with
//!   its `ring` provider (installed when a TLS connection is opened,
//!   unless the application installed one first).
//! - `zookeeper-tls`: `tcp+tls://` ZooKeeper members (with `tls` and
//!   `zookeeper`). The ZooKeeper client's TLS builds a second rustls
//!   provider, so a program with this feature should install one when it
//!   starts.
//!
//! Redis (one node, Cluster, Sentinel, Redlock) and the in-process backend
//! need no feature.

// Layers, bottom up: each module imports only from the lines above it.
// Errors (and the secrets kept out of them), settings and lease
// arithmetic; the drop guard; metrics.
mod error;
mod redact;
// (rustfmt sorts a run of `mod` lines: a blank line keeps the layers.)

mod config;
mod drop_guard;
mod telemetry;
mod timing;
// Keys and what a call asks for (data only).
mod key;
mod spec;
mod tick;
// Holder ids and jitter, from the OS or a seed.
mod entropy;
// Where locks live.
mod backend;
// One lease's state; guard bookkeeping, handoffs and release
// notifications.
mod lease_state;

mod guards;
mod handoff;
mod waiter;
// One renewal scheduler per client.
mod watchdog;
// What a client's calls share.
mod shared;
// The owner of an acquisition: release on every path, extension.
mod lease;
// Which leases the running code is nested in.
mod holder;
// Taking a lock within a wait; re-entering or taking it; running a body.
mod acquire;
mod entry;
mod with_lock;
// The operator's view, the programmatic API, the public client, the
// attribute's entry point.
mod admin;
mod guard;
// Elections: a lock's entry with a record of who leads beside it.
mod election;

mod client;
#[cfg(feature = "testing")]
pub mod testing;

mod private;

pub use admin::{HeldKind, LockAdmin, LockHolder, LockInfo};
pub use client::{LockClient, LockClientBuilder, init};
pub use election::{Election, Leader, Leadership};
pub use error::{BoxError, LockError, LostReason};
pub use guard::{LockGuard, LockRequest};
pub use holder::{fencing_token, holds, segment};
#[doc(inline)]
#[doc = include_str!("attribute.md")]
pub use lock_macros::distributed_lock;
pub use spec::LockMode;
pub use tick::Tick;

/// Panics unless the running code holds the lock `key`
/// ([`holds`](crate::holds)): inside the body of a lock call on `key`, with
/// the lease still trusted.
#[macro_export]
macro_rules! assert_locked {
    ($key:expr) => {
        assert!(
            $crate::holds($key),
            "the lock `{}` is not held by the running code",
            $key
        )
    };
}

/// What `#[distributed_lock]` expands to. Not a public API: no stability is
/// promised for anything in here.
#[doc(hidden)]
pub mod __private {
    pub use crate::private::{run_locked, run_locked_all, run_locked_all_or_skip, run_locked_or_skip};
    pub use crate::spec::{KeyArg, KeyPart, LockOutput, LockSpec, SkipOutput, key_part};
    pub use std::{format, vec};
}

/// Compiles (and, where marked, runs) every example in the README.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// Compiles every example in the reference pages under `docs/`.
#[cfg(doctest)]
pub mod docs_doctests {
    #[doc = include_str!("../../docs/attribute.md")]
    pub struct Attribute;
    #[doc = include_str!("../../docs/backends.md")]
    pub struct Backends;
    #[doc = include_str!("../../docs/api.md")]
    pub struct Api;
    #[doc = include_str!("../../docs/guarantees.md")]
    pub struct Guarantees;
    #[doc = include_str!("../../docs/operations.md")]
    pub struct Operations;
    #[doc = include_str!("../../docs/fault-suite.md")]
    pub struct FaultSuite;
    #[doc = include_str!("../../docs/benchmarks.md")]
    pub struct Benchmarks;
    #[doc = include_str!("../../docs/contributing.md")]
    pub struct Contributing;
    #[cfg(feature = "testing")]
    #[doc = include_str!("../../docs/testing.md")]
    pub struct Testing;
}
