//! A constant key in a set would serialise every call.
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(keys = ["ledger", "account:<to>"])]
async fn transfer(from: u64, to: u64) -> Result<u64, LockError> {
    Ok(from + to)
}

fn main() {}
