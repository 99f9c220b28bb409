use lock_runtime::{distributed_lock, LockError};

#[derive(Debug)]
pub struct ShopError;

impl From<LockError> for ShopError {
    fn from(_: LockError) -> Self {
        ShopError
    }
}

pub struct Order {
    pub id: u64,
    pub shop: String,
}

#[distributed_lock(key = "order:<shop>:<id>:<pair.0>")]
async fn pay(Order { id, shop }: Order, pair: (u8, u8)) -> Result<u64, ShopError> {
    drop(shop);
    Ok(id + u64::from(pair.1))
}

fn main() {
    let _ = pay(Order { id: 1, shop: "s".into() }, (1, 2));
}
