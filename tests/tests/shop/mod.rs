//! The attribute's test shop, shared by the per-backend attribute tests
//! (each its own binary: the global client is installed once per process).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use lock_runtime::{LockError, distributed_lock, fencing_token};

#[derive(Debug)]
pub(crate) enum ShopError {
    Lock(LockError),
    OutOfStock,
}

impl From<LockError> for ShopError {
    fn from(e: LockError) -> Self {
        ShopError::Lock(e)
    }
}

/// Stock kept outside the lock's knowledge: a read-modify-write that
/// oversells unless the attribute's lock excludes concurrent calls.
pub(crate) struct Shop {
    stock: AtomicU32,
    inside: AtomicUsize,
}

#[distributed_lock(key = "stock:<product_id>", ttl = "30s", wait = "20s")]
pub(crate) async fn deduct_stock(shop: &Shop, product_id: u64, qty: u32) -> Result<u32, ShopError> {
    assert_eq!(
        shop.inside.fetch_add(1, Ordering::SeqCst),
        0,
        "two calls inside at once"
    );
    let left = shop.stock.load(Ordering::SeqCst);
    tokio::task::yield_now().await;
    let outcome = if left < qty {
        Err(ShopError::OutOfStock)
    } else {
        shop.stock.store(left - qty, Ordering::SeqCst);
        // Re-entry: the nested call on the same key runs at once.
        audit(product_id).await?;
        Ok(left - qty)
    };
    shop.inside.fetch_sub(1, Ordering::SeqCst);
    outcome
}

#[distributed_lock(key = "stock:<product_id>", fencing = true)]
pub(crate) async fn audit(product_id: u64) -> Result<Option<u64>, LockError> {
    let _ = product_id;
    Ok(fencing_token())
}

/// 8 tasks place 15 orders each for one unit of product 7, of which 100
/// are in stock: returns how many sold, and checks the stock is gone.
pub(crate) async fn sell_120_orders_of_100() -> u32 {
    let shop = Arc::new(Shop {
        stock: AtomicU32::new(100),
        inside: AtomicUsize::new(0),
    });
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let shop = Arc::clone(&shop);
            tokio::spawn(async move {
                let mut sold = 0;
                for _ in 0..15 {
                    match deduct_stock(&shop, 7, 1).await {
                        Ok(_) => sold += 1,
                        Err(ShopError::OutOfStock) => {}
                        Err(ShopError::Lock(e)) => panic!("lock failed: {e}"),
                    }
                }
                sold
            })
        })
        .collect();
    let mut sold = 0;
    for call in calls {
        sold += call.await.expect("task");
    }
    assert_eq!(shop.stock.load(Ordering::SeqCst), 0);
    sold
}
