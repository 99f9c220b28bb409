//! What the examples share: choosing the backend, and the shop's error.

use lock_runtime::LockClient;

/// A lock client on Redis at `REDIS_URL` when it is set, in process
/// otherwise, with a line saying which.
pub async fn client() -> Result<(LockClient, String), lock_runtime::LockError> {
    match std::env::var("REDIS_URL") {
        Ok(url) => Ok((
            LockClient::connect(&url).await?,
            "locks on Redis (REDIS_URL)".to_owned(),
        )),
        Err(_) => Ok((
            LockClient::in_memory(),
            "locks in this process (set REDIS_URL to use Redis)".to_owned(),
        )),
    }
}

/// Installs [`client`] as the global lock client. Returns a line saying
/// which backend it uses.
pub async fn install_client() -> Result<String, lock_runtime::LockError> {
    let (locks, which) = client().await?;
    lock_runtime::init(locks)?;
    Ok(which)
}

/// Storage that accepts a write only with a fence (a fencing token, a
/// leader's epoch) at least the newest it has accepted.
#[derive(Debug, Default)]
pub struct FencedStore {
    newest: std::sync::Mutex<u64>,
    contents: std::sync::Mutex<String>,
}

impl FencedStore {
    /// Writes `text` under `fence`; refused with the newest fence seen
    /// when `fence` is older.
    pub fn write(&self, fence: u64, text: &str) -> Result<(), u64> {
        let mut newest = self
            .newest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if fence < *newest {
            return Err(*newest);
        }
        *newest = fence;
        *self
            .contents
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = text.to_owned();
        Ok(())
    }

    /// What the last accepted write left.
    pub fn contents(&self) -> String {
        self.contents
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// What a shop order can fail with: the lock, or the stock store.
#[derive(Debug)]
pub enum ShopError {
    /// The lock could not be had, or was lost.
    Lock(lock_runtime::LockError),
    /// The stock store (Redis) failed.
    Store(redis::RedisError),
}

impl From<lock_runtime::LockError> for ShopError {
    fn from(e: lock_runtime::LockError) -> Self {
        ShopError::Lock(e)
    }
}

impl From<redis::RedisError> for ShopError {
    fn from(e: redis::RedisError) -> Self {
        ShopError::Store(e)
    }
}

impl std::fmt::Display for ShopError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShopError::Lock(e) => write!(f, "lock: {e}"),
            ShopError::Store(e) => write!(f, "stock store: {e}"),
        }
    }
}

impl std::error::Error for ShopError {}
