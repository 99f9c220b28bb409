//! `impl Trait` in the return type, inside `Result` and as a whole `Result`.
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "item:<id>")]
async fn describe(id: u64) -> Result<impl std::fmt::Display, LockError> {
    Ok(id)
}

#[distributed_lock(key = "items:<shop>")]
async fn first(shop: u32, ids: Vec<u64>) -> Result<Option<impl std::fmt::Debug + Send>, LockError> {
    Ok(ids.first().copied())
}

fn main() {
    let _ = describe(1);
    let _ = first(1, vec![2]);
}
