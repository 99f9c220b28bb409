use lock_runtime::{distributed_lock, LockError};

#[derive(Debug)]
pub struct ShopError;

impl From<LockError> for ShopError {
    fn from(_: LockError) -> Self {
        ShopError
    }
}

#[tracing::instrument]
#[distributed_lock(key = "stock:<product_id>")]
async fn instrumented_outside(product_id: u64) -> Result<u64, ShopError> {
    Ok(product_id)
}

#[distributed_lock(key = "stock:<product_id>")]
#[tracing::instrument]
async fn instrumented_inside(product_id: u64) -> Result<u64, ShopError> {
    Ok(product_id)
}

fn main() {
    let _ = instrumented_outside(1);
    let _ = instrumented_inside(1);
}
