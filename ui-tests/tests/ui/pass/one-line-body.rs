//! A body that is one expression raises no warning: the expansion does not
//! wrap it in braces of its own (`unused_braces`).
#![deny(warnings)]

use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "item:<id>")]
async fn one_line(id: u64) -> Result<u64, LockError> { Ok(id) }

fn main() {
    let _ = one_line(1);
}
