//! `on_busy = "skip"` on a function whose success type is neither `()` nor
//! an `Option`: a skipped call would have nothing to return.
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "report:<day>", on_busy = "skip")]
async fn nightly_report(day: u32) -> Result<u64, LockError> {
    Ok(u64::from(day))
}

fn main() {}
