use std::time::Duration;

/// Boxed cause carried by [`LockError::Backend`], so the public API does not
/// pin a particular Redis client version.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can stop a lock from being taken, held or released.
///
/// Every variant that concerns a lock names its key (the key as the caller
/// rendered it, without the configured prefix).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The lock stayed held by someone else for the whole `wait`.
    #[error("timed out after {} waiting for lock `{key}`{}", fmt_duration(*wait), no_expiry_note(*no_expiry))]
    Timeout {
        /// The lock's key.
        key: String,
        /// The `wait` the call was given (not the time measured, which is a
        /// little longer and differs from call to call).
        wait: Duration,
        /// The lock's Redis key was found without an expiry: something other
        /// than this library wrote it, and it will never free itself.
        no_expiry: bool,
    },

    /// The lease ended while the body was running; the body was cancelled.
    #[error("lock `{key}` was lost while its body ran: {reason}")]
    Lost {
        /// The lock's key.
        key: String,
        /// What ended the lease.
        reason: LostReason,
    },

    /// A release or renewal found the lock no longer held by this holder.
    #[error("lock `{key}` is no longer held by this holder (it expired or was taken over)")]
    NotHeld {
        /// The lock's key.
        key: String,
    },

    /// No global client has been installed.
    #[error(
        "no lock client is initialised: call `lock_runtime::init(LockClient::connect(url).await?)` once at start-up"
    )]
    NotInitialized,

    /// `init` was called a second time.
    #[error("a lock client is already initialised: `lock_runtime::init` may be called only once")]
    AlreadyInitialized,

    /// The rendered key cannot be used as a lock name. Checked before any I/O.
    #[error("invalid lock key `{key}`: {reason}")]
    InvalidKey {
        /// The offending key, with control characters escaped.
        key: String,
        /// Why it was rejected.
        reason: String,
    },

    /// What is stored at the lock's key is not this kind of lock: on every
    /// backend, a lock of another kind (a read-write lock asked for as an
    /// exclusive one); on Redis also a value that will never free itself
    /// (another type, or a string without an expiry). It is left
    /// untouched. (Another library's lock, a string with an expiry, is a
    /// holder like any other: it is waited for.)
    #[error(
        "lock `{key}` conflicts with what is stored at `{redis_key}` (a `{found_type}`, not this kind of lock); it was left untouched"
    )]
    KeyConflict {
        /// The lock's key.
        key: String,
        /// The full stored key (Redis key, row or node name) that holds it.
        redis_key: String,
        /// What was found there: the kind of lock, or on Redis the type
        /// (`string` for a foreign string value).
        found_type: String,
    },

    /// This call's options are unusable (a ttl outside the limits). Checked
    /// before any I/O.
    #[error("invalid lock request for `{key}`: {reason}")]
    InvalidRequest {
        /// The lock's key.
        key: String,
        /// What is wrong, and what is accepted.
        reason: String,
    },

    /// The task asking for the lock already holds it through a
    /// [`LockGuard`](crate::LockGuard): waiting would wait on itself.
    #[error(
        "lock `{key}` is already held by a guard of this task, so waiting for it would wait forever; release that guard first, or take the lock with `.run(..)` so that nested calls re-enter"
    )]
    WouldDeadlock {
        /// The lock's key.
        key: String,
    },

    /// A reader asked for the write lock of a key it holds the read lock
    /// of. Refused at once: the write lock would wait for its own read lock.
    #[error(
        "lock `{key}`: this call holds the read lock and asks for the write lock; upgrading is refused because it would wait for itself (take the write lock from the start, which also lets the body read)"
    )]
    UpgradeRefused {
        /// The lock's key.
        key: String,
    },

    /// The client's configuration (URL, prefix, timeouts) is unusable.
    #[error("invalid lock client configuration for `{node}`: {reason}")]
    InvalidConfig {
        /// The node or setting concerned; passwords are redacted.
        node: String,
        /// What is wrong.
        reason: String,
    },

    /// The backend failed: connection refused or dropped, a protocol error, a
    /// timeout, or a server error.
    #[error("lock server `{node}` failed{}: {source}", key_note(key.as_deref()))]
    Backend {
        /// The node (host:port or socket path), with any password redacted.
        node: String,
        /// The lock concerned, when the failure happened on behalf of one.
        key: Option<String>,
        /// The underlying error.
        #[source]
        source: BoxError,
    },

    /// Too few Redlock masters agreed.
    #[error("lock `{key}`: only {granted} of {needed} required masters granted it ({causes})")]
    QuorumNotReached {
        /// The lock's key.
        key: String,
        /// Masters that granted the lock.
        granted: usize,
        /// Masters needed for a quorum.
        needed: usize,
        /// Per-node causes of refusal.
        causes: String,
    },

    /// Fewer replicas than `replica_acks` asked for acknowledged the lock's
    /// write within the acknowledgement timeout. The lock was released: a
    /// failover could have lost it.
    #[error("lock `{key}` was acknowledged by {acked} of the {wanted} replicas required; it was released")]
    NotReplicated {
        /// The lock's key.
        key: String,
        /// Replicas that acknowledged the write.
        acked: u32,
        /// Replicas required (`replica_acks`).
        wanted: u32,
    },

    /// The backend cannot provide what was asked of it.
    #[error("lock `{key}`: {feature} is not supported by this backend")]
    Unsupported {
        /// The lock's key.
        key: String,
        /// The missing capability.
        feature: String,
    },
}

/// Why a held lease ended before its body finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// The validity deadline passed without a confirmed renewal.
    Expired,
    /// The server reported the lock gone or owned by someone else.
    TakenOver,
    /// A fixed lease (`renew = false`) ran out while the body still ran.
    LeaseEnded,
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LostReason::Expired => "its lease expired before a renewal was confirmed",
            LostReason::TakenOver => "the server no longer holds it for this holder",
            LostReason::LeaseEnded => "its fixed lease (`renew = false`) ran out before the body finished",
        })
    }
}

impl LockError {
    pub(crate) fn backend(node: &str, key: Option<&str>, source: impl Into<BoxError>) -> Self {
        LockError::Backend {
            node: node.to_owned(),
            key: key.map(str::to_owned),
            source: source.into(),
        }
    }
}

fn key_note(key: Option<&str>) -> String {
    key.map(|k| format!(" for lock `{k}`")).unwrap_or_default()
}

fn no_expiry_note(no_expiry: bool) -> &'static str {
    if no_expiry {
        " (the lock's Redis key has no expiry, so it was not written by this library and will never free itself)"
    } else {
        ""
    }
}

/// Renders a duration the way users write it in the attribute: `250ms`, `5s`,
/// `1m30s`.
pub(crate) fn fmt_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 || !ms.is_multiple_of(1000) {
        return format!("{ms}ms");
    }
    let s = ms / 1000;
    match (s / 60, s % 60) {
        (0, s) => format!("{s}s"),
        (m, 0) => format!("{m}m"),
        (m, s) => format!("{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_render_as_written() {
        assert_eq!(fmt_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(fmt_duration(Duration::from_millis(0)), "0ms");
        assert_eq!(fmt_duration(Duration::from_secs(5)), "5s");
        assert_eq!(fmt_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(fmt_duration(Duration::from_secs(120)), "2m");
    }

    #[test]
    fn timeout_message_names_key_and_wait() {
        let e = LockError::Timeout {
            key: "stock:42".into(),
            wait: Duration::from_secs(5),
            no_expiry: false,
        };
        assert_eq!(e.to_string(), "timed out after 5s waiting for lock `stock:42`");
    }
}
