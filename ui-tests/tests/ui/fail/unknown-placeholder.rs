use lock_runtime::{distributed_lock, LockError};

#[derive(Debug)]
pub struct ShopError;

impl From<LockError> for ShopError {
    fn from(_: LockError) -> Self {
        ShopError
    }
}

#[distributed_lock(key = "stock:<produt_id>")]
async fn deduct_stock(product_id: u64, qty: u32) -> Result<u32, ShopError> {
    Ok(qty + product_id as u32)
}
fn main() {}
