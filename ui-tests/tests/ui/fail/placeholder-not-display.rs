use lock_runtime::{distributed_lock, LockError};

#[derive(Debug)]
pub struct ShopError;

impl From<LockError> for ShopError {
    fn from(_: LockError) -> Self {
        ShopError
    }
}

pub struct Sku(u64);

#[distributed_lock(key = "stock:<sku>")]
async fn deduct_stock(sku: Sku) -> Result<u64, ShopError> {
    Ok(sku.0)
}
fn main() {}
