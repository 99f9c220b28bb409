//! A flag without its value: the error points at the flag.
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "ledger:<account>", fencing)]
async fn post(account: u64) -> Result<u64, LockError> {
    Ok(account)
}

fn main() {}
