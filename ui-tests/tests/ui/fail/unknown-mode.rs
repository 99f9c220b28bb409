//! A mode other than read or write: the error lists both.
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "report:<id>", mode = "exclusive")]
async fn work(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
