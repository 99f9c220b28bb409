//! An empty set of keys would lock nothing.
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(keys = [])]
async fn transfer(from: u64, to: u64) -> Result<u64, LockError> {
    Ok(from + to)
}

fn main() {}
