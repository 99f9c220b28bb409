//! A fair lock is one exclusive lock: not segments.
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "stock:<id>", segments = 3, fair = true)]
async fn work(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
