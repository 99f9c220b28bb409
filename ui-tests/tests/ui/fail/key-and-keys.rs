//! One key or several, not both.
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "account:<from>", keys = ["account:<from>", "account:<to>"])]
async fn transfer(from: u64, to: u64) -> Result<u64, LockError> {
    Ok(from + to)
}

fn main() {}
