//! The README's quick start: deducts stock under `#[distributed_lock]` on the
//! Redis at `REDIS_URL`, or on a throwaway `redis-server` started for the run
//! when `REDIS_URL` is unset.

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
    let (url, _server) = match std::env::var("REDIS_URL") {
        Ok(url) => (url, None),
        Err(_) => {
            let server = lock_tests::RedisServer::start();
            println!("REDIS_URL is unset: started redis-server on {}", server.url());
            (server.url(), Some(server))
        }
    };
    lock_runtime::init(LockClient::connect(&url).await?)?;
    for qty in [1, 9] {
        match deduct_stock(42, qty).await {
            Ok(left) => println!("deducted {qty}: {left} left"),
            Err(ShopError::OutOfStock) => println!("deducting {qty}: out of stock"),
            Err(ShopError::Lock(e)) => println!("deducting {qty}: {e}"),
        }
    }
    Ok(())
}
