//! A fair lock is one exclusive lock: not a semaphore.
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "pool:<id>", permits = 3, fair = true)]
async fn work(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
