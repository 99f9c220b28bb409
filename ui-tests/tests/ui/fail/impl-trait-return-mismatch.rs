//! A body that returns the wrong type under an `impl Trait` return type:
//! the error still names the declared return type.
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "item:<id>")]
async fn describe(id: u64) -> Result<impl std::fmt::Display, LockError> {
    if id == 0 {
        return Ok("zero");
    }
    "not a result"
}

fn main() {}
