use lock_runtime::{distributed_lock, LockError};

#[derive(Debug)]
pub struct ShopError;

impl From<LockError> for ShopError {
    fn from(_: LockError) -> Self {
        ShopError
    }
}

use std::rc::Rc;

#[distributed_lock(key = "stock:<product_id>")]
async fn deduct_stock(product_id: u64) -> Result<u64, ShopError> {
    let local = Rc::new(product_id);
    tokio::task::yield_now().await;
    Ok(*local)
}

fn assert_send<T: Send>(_: T) {}

fn check() {
    assert_send(deduct_stock(1));
}
fn main() {}
