//! What the examples share: choosing the backend.

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
