use lock_runtime::{distributed_lock, LockError};

#[derive(Debug)]
pub struct ShopError;

impl From<LockError> for ShopError {
    fn from(_: LockError) -> Self {
        ShopError
    }
}

#[distributed_lock(key = "stock:<product_id>")]
async fn deduct_stock(product_id: u64) -> Result<u64, ShopError> {
    tokio::task::yield_now().await;
    Ok(product_id)
}

fn assert_send<T: Send + 'static>(_: T) {}

fn main() {
    assert_send(deduct_stock(1));
}
