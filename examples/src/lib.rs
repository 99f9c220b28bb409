//! What the examples share: choosing the backend, and the shop's error.

use lock_runtime::LockClient;

/// Installs the global lock client: Redis at `REDIS_URL` when it is set,
/// the in-process backend otherwise. Returns a line saying which.
pub async fn install_client() -> Result<String, lock_runtime::LockError> {
    match std::env::var("REDIS_URL") {
        Ok(url) => {
            lock_runtime::init(LockClient::connect(&url).await?)?;
            Ok("locks on Redis (REDIS_URL)".to_owned())
        }
        Err(_) => {
            lock_runtime::init(LockClient::in_memory())?;
            Ok("locks in this process (set REDIS_URL to use Redis)".to_owned())
        }
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
