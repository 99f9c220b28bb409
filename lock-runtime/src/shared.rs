//! What every lock call of one client shares: the backend, the settings,
//! the watchdog, the notifier and the guard table. The public client wraps
//! it; every layer between reads it.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::{AnyBackend, Failure};
use crate::config::ClientConfig;
use crate::entropy::Entropy;
use crate::error::LockError;
use crate::guards::GuardTable;
use crate::key::LockKey;
use crate::waiter::Notifier;
use crate::watchdog::Watchdog;

/// Attempts made at once, one after another, while each meets a broken
/// connection (the first attempt included): an acquisition's, whatever is
/// left of its `wait`, and a release's. After a server restart the client
/// can hold more than one dead connection (the one it used, and one its
/// reconnect opened while the server was still down); each failure
/// replaces one, and a dead server fails each retry fast (refused).
pub(crate) const RECONNECTS_AT_ONCE: u32 = 3;

#[derive(Debug)]
pub(crate) struct ClientInner {
    pub(crate) backend: Arc<AnyBackend>,
    pub(crate) config: ClientConfig,
    pub(crate) watchdog: Watchdog,
    pub(crate) notifier: Arc<Notifier>,
    pub(crate) guards: Arc<GuardTable>,
    /// The node(s) this client talks to, for messages; never with a password.
    pub(crate) node: String,
    /// Where its holder ids and retry jitter come from.
    pub(crate) entropy: Entropy,
}

impl ClientInner {
    /// The failure recorded when an attempt got no answer in time. It is
    /// transient, hence in doubt: the command may still be applied.
    pub(crate) fn timed_out(&self, key: &LockKey, what: &str, budget: Duration) -> Failure {
        let limit = if budget < self.config.command_timeout {
            format!("{}ms left of the wait", budget.as_millis())
        } else {
            format!("{}ms command timeout", budget.as_millis())
        };
        Failure {
            error: LockError::backend(
                &self.node,
                Some(&key.name),
                format!("{what} got no reply within the {limit}"),
            ),
            transient: true,
            reconnecting: false,
        }
    }
}

impl ClientInner {
    pub(crate) fn new(
        backend: AnyBackend,
        config: ClientConfig,
        notifier: Arc<Notifier>,
        node: String,
        entropy: Entropy,
    ) -> Self {
        let backend = Arc::new(backend);
        ClientInner {
            watchdog: Watchdog::new(
                Arc::downgrade(&backend),
                config.command_timeout,
                backend.renews_apart(),
            ),
            backend,
            config,
            notifier,
            guards: Arc::default(),
            node,
            entropy,
        }
    }
}
