//! Segments and permits are two kinds of lock: both arguments are named.
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "stock:<id>", permits = 4, segments = 4)]
async fn work(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
