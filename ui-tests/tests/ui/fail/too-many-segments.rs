//! More segments than the bound: each is a key every attempt reads.
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "stock:<id>", segments = 1025)]
async fn work(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
