//! The README's quick start: deducts stock under `#[distributed_lock]` on the
//! Redis at `REDIS_URL`, or in process (`LockClient::in_memory()`) when
//! `REDIS_URL` is unset, as the other examples do.

use lock_runtime::{LockClient, LockError, distributed_lock};

#[derive(Debug)]
enum ShopError {
    Lock(LockError),
    OutOfStock,
}

impl From<LockError> for ShopError {
    fn from(e: LockError) -> Self {
        ShopError::Lock(e)
    }
}

#[distributed_lock(key = "stock:<product_id>", ttl = "30s", wait = "5s")]
async fn deduct_stock(product_id: u64, qty: u32) -> Result<u32, ShopError> {
    let in_stock: u32 = 7;
    println!("  holding lock `stock:{product_id}` while deducting {qty}");
    in_stock.checked_sub(qty).ok_or(ShopError::OutOfStock)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let locks = match std::env::var("REDIS_URL") {
        Ok(url) => LockClient::connect(&url).await?,
        Err(_) => {
            println!("REDIS_URL is unset: locks are kept in this process");
            LockClient::in_memory()
        }
    };
    lock_runtime::init(locks)?;
    for qty in [1, 9] {
        match deduct_stock(42, qty).await {
            Ok(left) => println!("deducted {qty}: {left} left"),
            Err(ShopError::OutOfStock) => println!("deducting {qty}: out of stock"),
            Err(ShopError::Lock(e)) => println!("deducting {qty}: {e}"),
        }
    }
    Ok(())
}
