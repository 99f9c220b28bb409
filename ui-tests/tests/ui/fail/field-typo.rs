//! A misspelled field: rustc reports it at the key, without a suggestion
//! that would replace the key literal with the field's name.
use lock_runtime::{distributed_lock, LockError};

pub struct Order {
    pub shop: String,
}

#[distributed_lock(key = "order:<order.shp>")]
async fn pay(order: Order) -> Result<String, LockError> {
    Ok(order.shop)
}

fn main() {}
