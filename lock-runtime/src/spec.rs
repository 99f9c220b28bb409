//! What a lock call asks for: the static spec the macro emits, and the
//! options resolved against the client's defaults.

use std::time::Duration;

use crate::config::ClientConfig;
use crate::error::LockError;
use crate::key::LockKey;
use crate::timing::{FOREVER, ttl_problem};

/// The attribute's arguments, fixed at compile time. Emitted by
/// `#[distributed_lock]` as a `static`; `None` means "the client's default".
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct LockSpec {
    ttl: Option<Duration>,
    wait: Option<Duration>,
    renew: bool,
    fencing: bool,
}

impl LockSpec {
    /// The defaults: client ttl and wait, renewal on, no fencing.
    pub const DEFAULT: LockSpec = LockSpec {
        ttl: None,
        wait: None,
        renew: true,
        fencing: false,
    };

    /// Sets the lease length.
    #[must_use]
    pub const fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Sets how long to wait for a held lock.
    #[must_use]
    pub const fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Turns the watchdog on or off.
    #[must_use]
    pub const fn renew(mut self, renew: bool) -> Self {
        self.renew = renew;
        self
    }

    /// Asks for a fencing token.
    #[must_use]
    pub const fn fencing(mut self, fencing: bool) -> Self {
        self.fencing = fencing;
        self
    }

    pub(crate) fn resolve(&self, config: &ClientConfig) -> LockOptions {
        LockOptions {
            ttl: self.ttl.unwrap_or(config.default_ttl),
            // Any longer wait means "until the lock is free".
            wait: self.wait.unwrap_or(config.default_wait).min(FOREVER),
            renew: self.renew,
            fencing: self.fencing,
        }
    }
}

/// One call's options with every default filled in.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LockOptions {
    pub(crate) ttl: Duration,
    pub(crate) wait: Duration,
    pub(crate) renew: bool,
    pub(crate) fencing: bool,
}

impl LockOptions {
    /// Refuses, before any I/O, a call whose lease could not work: the same
    /// bounds the attribute checks at compile time.
    pub(crate) fn check(&self, key: &LockKey) -> Result<(), LockError> {
        match ttl_problem(self.ttl) {
            Some(reason) => Err(LockError::InvalidRequest {
                key: key.name.clone(),
                reason,
            }),
            None => Ok(()),
        }
    }
}

/// What an annotated function may return: something that can carry a
/// [`LockError`] when the body never ran or was cancelled.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`#[distributed_lock]` requires the function to return `Result<T, E>` where `E: From<LockError>`, found `{Self}`",
    label = "this return type cannot carry a `LockError`",
    note = "return `Result<T, E>` and add `impl From<lock_runtime::LockError> for E`, or use `Result<T, lock_runtime::LockError>`"
)]
pub trait LockOutput {
    /// Wraps a lock failure in the function's return type.
    fn from_lock_error(error: LockError) -> Self;
}

impl<T, E: From<LockError>> LockOutput for Result<T, E> {
    fn from_lock_error(error: LockError) -> Self {
        Err(E::from(error))
    }
}

/// What a key placeholder may name: anything `Display`.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used in a lock key because it does not implement `Display`",
    label = "used in this key template",
    note = "implement `std::fmt::Display` for it, or name a field that does, e.g. `<order.id>`"
)]
pub trait KeyPart {
    /// The value as it is rendered into the key.
    fn as_key_part(&self) -> &dyn std::fmt::Display;
}

impl<T: std::fmt::Display> KeyPart for T {
    fn as_key_part(&self) -> &dyn std::fmt::Display {
        self
    }
}

/// A placeholder's value, ready for `format!`. Always `Display`, so a
/// placeholder of the wrong type is reported once, by `KeyPart`.
#[doc(hidden)]
#[derive(Clone, Copy)]
pub struct KeyArg<'a>(&'a dyn std::fmt::Display);

impl std::fmt::Debug for KeyArg<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("KeyArg").field(&self.0.to_string()).finish()
    }
}

impl std::fmt::Display for KeyArg<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Checks a placeholder's type and borrows it for rendering.
#[doc(hidden)]
pub fn key_part<T: KeyPart>(value: &T) -> KeyArg<'_> {
    KeyArg(value.as_key_part())
}
