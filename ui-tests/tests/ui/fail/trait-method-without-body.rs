use lock_runtime::{distributed_lock, LockError};

#[derive(Debug)]
pub struct ShopError;

impl From<LockError> for ShopError {
    fn from(_: LockError) -> Self {
        ShopError
    }
}

pub trait Inventory {
    #[distributed_lock(key = "stock:<product_id>")]
    async fn deduct_stock(&self, product_id: u64) -> Result<u64, ShopError>;
}
fn main() {}
