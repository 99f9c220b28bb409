use lock_runtime::{distributed_lock, LockError};

#[derive(Debug)]
pub struct ShopError;

impl From<LockError> for ShopError {
    fn from(_: LockError) -> Self {
        ShopError
    }
}

#[distributed_lock(key = "user:<user>")]
async fn greet(user: impl std::fmt::Display, times: impl Into<u32>) -> Result<u32, ShopError> {
    let _ = user.to_string();
    Ok(times.into())
}

fn main() {
    let _ = greet("ann", 2_u8);
}
