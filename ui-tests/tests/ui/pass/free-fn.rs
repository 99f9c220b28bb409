use lock_runtime::{distributed_lock, LockError};

#[derive(Debug)]
pub struct ShopError;

impl From<LockError> for ShopError {
    fn from(_: LockError) -> Self {
        ShopError
    }
}

#[distributed_lock(key = "stock:<product_id>", ttl = "30s", wait = "5s")]
async fn deduct_stock(product_id: u64, qty: u32) -> Result<u32, ShopError> {
    if qty == 0 {
        return Err(ShopError);
    }
    Ok(u32::try_from(product_id).map_err(|_| ShopError)? - qty)
}

fn main() {
    let _ = deduct_stock(42, 1);
}
