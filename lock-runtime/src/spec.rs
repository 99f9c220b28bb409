//! What a lock call asks for: the static spec the macro emits, and the
//! options resolved against the client's defaults.

use std::time::Duration;

use crate::config::ClientConfig;
use crate::error::LockError;
use crate::key::LockKey;
use crate::timing::{FOREVER, ttl_problem};

/// The most segments one lock may have: each is a Redis key that every
/// attempt reads.
pub(crate) const MAX_SEGMENTS: u32 = 1024;

/// Which side of a read-write lock a call takes (`mode = "read"` or
/// `mode = "write"` in the attribute).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LockMode {
    /// Shared with other readers; excludes writers.
    Read,
    /// Excludes readers and other writers.
    Write,
}

/// What kind of lock a call takes, resolved from its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// One holder at a time.
    Exclusive,
    /// A reader of a read-write lock.
    Read,
    /// The writer of a read-write lock.
    Write,
    /// One of at most `n` holders (a semaphore).
    Permits(u32),
    /// Any one free segment of `n` exclusive locks.
    Segments(u32),
    /// An exclusive lock handed to its waiters in the order they came.
    Fair,
}

impl Kind {
    /// The kind as a user would name it.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Kind::Exclusive => "exclusive lock",
            Kind::Read => "read lock",
            Kind::Write => "write lock",
            Kind::Permits(_) => "permit (`permits`)",
            Kind::Segments(_) => "segmented lock (`segments`)",
            Kind::Fair => "fair lock (`fair`)",
        }
    }

    /// Readers and permit holders share the lock, so a fencing token would
    /// not order anything.
    fn shared(self) -> bool {
        matches!(self, Kind::Read | Kind::Permits(_))
    }
}

/// The attribute's arguments, fixed at compile time. Emitted by
/// `#[distributed_lock]` as a `static`; `None` means "the client's default".
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct LockSpec {
    ttl: Option<Duration>,
    wait: Option<Duration>,
    renew: bool,
    fencing: bool,
    mode: Option<LockMode>,
    permits: Option<u32>,
    segments: Option<u32>,
    fair: bool,
    /// Busy after `wait` means "skip the body", not `Timeout`
    /// (`on_busy = "skip"`, `try_run`, `try_acquire`).
    skip: bool,
    /// After the body, the lock stays held until this long after it was
    /// granted (`hold_at_least`).
    hold_at_least: Option<Duration>,
    /// The `lock` label of the call's metrics: the attribute's key template.
    name: Option<&'static str>,
}

impl LockSpec {
    /// The defaults: client ttl and wait, renewal on, no fencing, an
    /// exclusive lock.
    pub const DEFAULT: LockSpec = LockSpec {
        ttl: None,
        wait: None,
        renew: true,
        fencing: false,
        mode: None,
        permits: None,
        segments: None,
        fair: false,
        skip: false,
        hold_at_least: None,
        name: None,
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

    /// Takes one side of a read-write lock.
    #[must_use]
    pub const fn mode(mut self, mode: LockMode) -> Self {
        self.mode = Some(mode);
        self
    }

    /// Makes the lock a semaphore of `n` permits.
    #[must_use]
    pub const fn permits(mut self, n: u32) -> Self {
        self.permits = Some(n);
        self
    }

    /// Hands the lock to its waiters in the order they came.
    #[must_use]
    pub const fn fair(mut self, fair: bool) -> Self {
        self.fair = fair;
        self
    }

    /// Splits the lock into `n` segments, of which a call holds one.
    #[must_use]
    pub const fn segments(mut self, n: u32) -> Self {
        self.segments = Some(n);
        self
    }

    /// Makes a lock still held by another after `wait` a skip rather than
    /// a `Timeout`; `wait` then defaults to zero, not to the client's
    /// `default_wait`.
    #[must_use]
    pub const fn skip_when_busy(mut self, skip: bool) -> Self {
        self.skip = skip;
        self
    }

    /// Keeps the lock held after the body until `hold` after it was
    /// granted, by the lock server's clock (`hold_at_least`).
    #[must_use]
    pub const fn hold_at_least(mut self, hold: Duration) -> Self {
        self.hold_at_least = Some(hold);
        self
    }

    /// Whether a busy lock skips the call (`on_busy = "skip"`).
    pub(crate) fn skips(&self) -> bool {
        self.skip
    }

    /// Names the lock in metrics (the attribute passes its key template).
    #[must_use]
    pub const fn name(mut self, name: &'static str) -> Self {
        self.name = Some(name);
        self
    }

    /// The `lock` label of the call's metrics.
    pub(crate) fn metric_name(&self) -> &'static str {
        match self.name {
            Some(name) => name,
            None => crate::telemetry::PROGRAMMATIC,
        }
    }

    /// The call's options with the client's defaults filled in, checked
    /// before any I/O: the same bounds and combinations the attribute
    /// checks at compile time.
    pub(crate) fn resolve(&self, config: &ClientConfig, key: &LockKey) -> Result<LockOptions, LockError> {
        let opts = LockOptions {
            ttl: self.ttl.unwrap_or(config.default_ttl),
            // Any longer wait means "until the lock is free". A call that
            // skips a busy lock tries once unless it says otherwise: a
            // scheduled job on another replica is not worth waiting for.
            wait: self.wait.unwrap_or(self.default_wait(config)).min(FOREVER),
            renew: self.renew,
            fencing: self.fencing,
            skip: self.skip,
            hold_at_least: self.hold_at_least,
            name: self.metric_name(),
            kind: self.kind().map_err(|reason| LockError::InvalidRequest {
                key: key.name.clone(),
                reason,
            })?,
        };
        opts.check(key)?;
        Ok(opts)
    }

    /// The wait of a call that sets none: the client's, or none at all for
    /// a call that skips a busy lock.
    fn default_wait(&self, config: &ClientConfig) -> Duration {
        if self.skip {
            Duration::ZERO
        } else {
            config.default_wait
        }
    }

    fn kind(&self) -> Result<Kind, String> {
        let kind = match (self.mode, self.permits, self.segments) {
            (Some(_), Some(_), _) => return Err(conflict("permits", "mode")),
            (Some(_), _, Some(_)) => return Err(conflict("segments", "mode")),
            (_, Some(_), Some(_)) => return Err(conflict("segments", "permits")),
            (Some(LockMode::Read), ..) => Kind::Read,
            (Some(LockMode::Write), ..) => Kind::Write,
            (_, Some(0), _) => return Err("`permits` must be at least 1".into()),
            (_, Some(n), _) => Kind::Permits(n),
            (.., Some(n)) if n == 0 || n > MAX_SEGMENTS => {
                return Err(format!("`segments` must be from 1 to {MAX_SEGMENTS}, not {n}"));
            }
            (.., Some(n)) => Kind::Segments(n),
            (None, None, None) if self.fair => Kind::Fair,
            (None, None, None) => Kind::Exclusive,
        };
        if self.fair && kind != Kind::Fair {
            let other = match kind {
                Kind::Permits(_) => "permits",
                Kind::Segments(_) => "segments",
                _ => "mode",
            };
            return Err(conflict("fair", other));
        }
        if self.fencing && kind.shared() {
            return Err(
                "`fencing` cannot be combined with a shared lock (`mode = \"read\"` or `permits`): holders run side by side, so a token would order nothing"
                    .into(),
            );
        }
        Ok(kind)
    }
}

fn conflict(a: &str, b: &str) -> String {
    format!("`{a}` cannot be combined with `{b}`: a lock is one kind")
}

/// One call's options with every default filled in.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LockOptions {
    pub(crate) ttl: Duration,
    pub(crate) wait: Duration,
    pub(crate) renew: bool,
    pub(crate) fencing: bool,
    pub(crate) kind: Kind,
    /// A busy lock after `wait` skips the call (`LockSpec::skip_when_busy`).
    pub(crate) skip: bool,
    /// The lock stays held after the body until this long after its grant.
    pub(crate) hold_at_least: Option<Duration>,
    /// The `lock` label of its metrics.
    pub(crate) name: &'static str,
}

impl LockOptions {
    /// Refuses a call whose lease could not work.
    fn check(&self, key: &LockKey) -> Result<(), LockError> {
        let problem = ttl_problem(self.ttl).or_else(|| self.hold_problem());
        match problem {
            Some(reason) => Err(LockError::InvalidRequest {
                key: key.name.clone(),
                reason,
            }),
            None => Ok(()),
        }
    }

    /// Why `hold_at_least` cannot apply to this call, if it cannot.
    fn hold_problem(&self) -> Option<String> {
        let hold = self.hold_at_least?;
        if let Some(reason) = hold_problem(hold) {
            return Some(reason);
        }
        (self.kind != Kind::Exclusive).then(|| {
            format!(
                "`hold_at_least` keeps an exclusive lock held after its body, not a {}: the lock's other holders or its next in line would be held back with no one running",
                self.kind.describe()
            )
        })
    }

    /// The lease the server gives the lock when it grants it: at least the
    /// hold, so that the lock is held that long after its grant whatever
    /// becomes of this process, even if it never sends another command.
    /// Renewals only ever lengthen a lease; the release shortens it to the
    /// hold's end.
    pub(crate) fn granted_lease(&self) -> Duration {
        match self.hold_at_least {
            Some(hold) => self.ttl.max(hold),
            None => self.ttl,
        }
    }
}

/// The longest `hold_at_least`: a week, for a weekly job; past it, a
/// per-tick key says "once" better than a lock held for days.
pub(crate) const MAX_HOLD: Duration = Duration::from_secs(7 * 24 * 3600);

/// Why `hold` is not a usable `hold_at_least`, if it is not.
pub(crate) fn hold_problem(hold: Duration) -> Option<String> {
    if hold < Duration::from_millis(1) {
        return Some(format!(
            "a hold_at_least of {hold:?} holds nothing; leave it out, or give at least 1ms"
        ));
    }
    (hold > MAX_HOLD).then(|| {
        format!(
            "a hold_at_least of {} is over the 7-day limit; for a job that runs less often, name its run in the key (`Tick`)",
            crate::error::fmt_duration(hold)
        )
    })
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

/// What a function with `on_busy = "skip"` may return: something that says
/// "the body did not run" without an error.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`on_busy = \"skip\"` requires the function to return `Result<(), E>` or `Result<Option<T>, E>`, found `{Self}`",
    label = "a skipped call has nothing to return here",
    note = "return `Result<(), E>` (a skipped call returns `Ok(())`) or `Result<Option<T>, E>` (a skipped call returns `Ok(None)`; the body returns `Ok(Some(..))`)"
)]
pub trait SkipOutput {
    /// What the function returns when the lock was busy.
    fn skipped() -> Self;
}

impl<E> SkipOutput for Result<(), E> {
    fn skipped() -> Self {
        Ok(())
    }
}

impl<T, E> SkipOutput for Result<Option<T>, E> {
    fn skipped() -> Self {
        Ok(None)
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
