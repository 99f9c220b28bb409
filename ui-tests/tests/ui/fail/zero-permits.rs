//! A semaphore of no permits could never be held.
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "pool:<id>", permits = 0)]
async fn work(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
