use lock_runtime::{distributed_lock, LockError};

#[derive(Debug)]
pub struct ShopError;

impl From<LockError> for ShopError {
    fn from(_: LockError) -> Self {
        ShopError
    }
}

pub trait Inventory {
    fn deduct(&self, product_id: u64) -> impl std::future::Future<Output = Result<u64, ShopError>>;
    async fn restock(&self, product_id: u64) -> Result<u64, ShopError>;
}

pub struct Warehouse;

impl Inventory for Warehouse {
    #[distributed_lock(key = "stock:<product_id>")]
    async fn deduct(&self, product_id: u64) -> Result<u64, ShopError> {
        Ok(product_id)
    }

    #[distributed_lock(key = "stock:<product_id>")]
    async fn restock(&self, product_id: u64) -> Result<u64, ShopError> {
        Ok(product_id)
    }
}

fn main() {
    let _ = Warehouse.deduct(1);
    let _ = Warehouse.restock(1);
}
