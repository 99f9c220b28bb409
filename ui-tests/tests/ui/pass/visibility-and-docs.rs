use lock_runtime::{distributed_lock, LockError};

#[derive(Debug)]
pub struct ShopError;

impl From<LockError> for ShopError {
    fn from(_: LockError) -> Self {
        ShopError
    }
}

mod shop {
    use super::{distributed_lock, ShopError};

    /// Deducts stock; documented.
    #[distributed_lock(key = "stock:<product_id>")]
    #[allow(clippy::unused_async)]
    pub(crate) async fn deduct_stock(product_id: u64) -> Result<u64, ShopError> {
        Ok(product_id)
    }
}

fn main() {
    let _ = shop::deduct_stock(1);
}
