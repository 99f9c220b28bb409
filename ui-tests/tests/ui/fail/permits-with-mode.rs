//! A semaphore is not a read-write lock: both arguments are named.
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "pool:<id>", mode = "read", permits = 4)]
async fn work(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
