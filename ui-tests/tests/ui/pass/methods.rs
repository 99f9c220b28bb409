use lock_runtime::{distributed_lock, LockError};

#[derive(Debug)]
pub struct ShopError;

impl From<LockError> for ShopError {
    fn from(_: LockError) -> Self {
        ShopError
    }
}

use std::sync::Arc;

pub struct Shop {
    id: u64,
    sold: u32,
}

impl Shop {
    #[distributed_lock(key = "shop:<self.id>")]
    async fn read(&self) -> Result<u32, ShopError> {
        Ok(self.sold)
    }

    #[distributed_lock(key = "shop:<self.id>:sell", renew = false, fencing = true)]
    async fn sell(&mut self, qty: u32) -> Result<u32, ShopError> {
        self.sold += qty;
        Ok(self.sold)
    }

    #[distributed_lock(key = "shop:<self.id>", wait = "1m30s")]
    async fn shared(self: Arc<Self>) -> Result<u32, ShopError> {
        Ok(self.sold)
    }
}

fn main() {
    let mut shop = Shop { id: 1, sold: 0 };
    let _ = shop.read();
    let _ = shop.sell(1);
    let _ = Arc::new(shop).shared();
}
