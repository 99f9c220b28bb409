//! An annotated fn nobody calls still gets rustc's `dead_code` warning.
#![deny(dead_code)]

use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "item:<id>")]
async fn never_called(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
