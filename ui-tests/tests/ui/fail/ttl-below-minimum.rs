//! A lease too short to work in would fail every call at run time: it is
//! refused here instead.
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "blink:<id>", ttl = "3ms")]
async fn blink(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
