//! Fractions are not part of the grammar; the error gives the duration in
//! whole milliseconds.
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "job:<id>", ttl = "1.5s")]
async fn job(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
