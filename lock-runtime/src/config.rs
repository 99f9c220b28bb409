//! A client's settings, as the builder collected them. Data only: the layers
//! below the client read what they need from it.

use std::sync::Arc;
use std::time::Duration;

/// What every lock call of one client shares.
#[derive(Debug, Clone)]
pub(crate) struct ClientConfig {
    pub(crate) prefix: String,
    pub(crate) default_ttl: Duration,
    pub(crate) default_wait: Duration,
    pub(crate) retry_min: Duration,
    pub(crate) retry_max: Duration,
    pub(crate) command_timeout: Duration,
    pub(crate) node_timeout: Duration,
    /// Connect on first use instead of at construction.
    pub(crate) lazy: bool,
    /// A PEM root certificate that `rediss://` servers are verified against
    /// instead of the system's roots (feature `tls`).
    pub(crate) tls_root: Option<Arc<[u8]>>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            prefix: "lock:".into(),
            default_ttl: Duration::from_secs(30),
            default_wait: Duration::ZERO,
            retry_min: Duration::from_millis(2),
            retry_max: Duration::from_millis(50),
            command_timeout: Duration::from_secs(1),
            node_timeout: Duration::from_millis(50),
            lazy: false,
            tls_root: None,
        }
    }
}
