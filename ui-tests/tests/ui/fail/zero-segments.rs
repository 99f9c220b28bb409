//! A lock of no segments could never be held.
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "stock:<id>", segments = 0)]
async fn work(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
