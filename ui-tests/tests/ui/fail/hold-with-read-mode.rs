//! A hold after the body keeps an exclusive lock: held readers would hold
//! back the writer, and each other, with no one running.
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "report:<day>", mode = "read", hold_at_least = "1m")]
async fn read_report(day: u32) -> Result<u32, LockError> {
    Ok(day)
}

fn main() {}
