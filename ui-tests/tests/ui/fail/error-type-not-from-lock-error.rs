use lock_runtime::{distributed_lock, LockError};

#[derive(Debug)]
pub struct ShopError;

impl From<LockError> for ShopError {
    fn from(_: LockError) -> Self {
        ShopError
    }
}

#[derive(Debug)]
pub struct OtherError;

#[distributed_lock(key = "stock:<product_id>")]
async fn deduct_stock(product_id: u64) -> Result<u64, OtherError> {
    Ok(product_id)
}
fn main() {}
