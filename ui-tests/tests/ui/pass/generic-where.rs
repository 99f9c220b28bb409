use lock_runtime::{distributed_lock, LockError};

#[derive(Debug)]
pub struct ShopError;

impl From<LockError> for ShopError {
    fn from(_: LockError) -> Self {
        ShopError
    }
}

use std::fmt::Display;

#[distributed_lock(key = "item:<id>")]
async fn update<K, V>(id: K, value: V) -> Result<String, ShopError>
where
    K: Display + Send,
    V: Into<String>,
{
    Ok(format!("{id}={}", value.into()))
}

fn main() {
    let _ = update(7_u32, "x");
}
