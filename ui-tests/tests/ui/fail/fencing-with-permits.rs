//! Permit holders run side by side, so a fencing token would order nothing.
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "pool:<id>", permits = 3, fencing = true)]
async fn work(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
