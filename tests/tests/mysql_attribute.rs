//! `#[distributed_lock]` exactly as users write it, with the process-wide
//! client on MariaDB: the attribute is backend-blind, so the same function
//! locks through a table. One test: the global client is installed once per
//! process, and its connections belong to the runtime that made them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use lock_runtime::{LockClient, LockError, distributed_lock, fencing_token};
use lock_tests::MariaDb;

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

/// Stock kept outside the lock's knowledge: a read-modify-write that
/// oversells unless the attribute's lock excludes concurrent calls.
struct Shop {
    stock: AtomicU32,
    inside: AtomicUsize,
}

#[distributed_lock(key = "stock:<product_id>", ttl = "30s", wait = "20s")]
async fn deduct_stock(shop: &Shop, product_id: u64, qty: u32) -> Result<u32, ShopError> {
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
async fn audit(product_id: u64) -> Result<Option<u64>, LockError> {
    let _ = product_id;
    Ok(fencing_token())
}

#[test]
fn the_attribute_locks_through_the_table() {
    let server = MariaDb::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(lock_tests::bounded(
        "the_attribute_locks_through_the_table",
        async {
            let client = LockClient::mysql(&server.url()).await.expect("connect");
            lock_runtime::init(client).expect("installed once");
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
            assert_eq!(sold, 100, "120 orders for 100 items: exactly 100 sold");
            assert_eq!(shop.stock.load(Ordering::SeqCst), 0);
            // Released on every path: nothing is left in the table.
            let left = server.value("SELECT COUNT(*) FROM distributed_locks").await;
            assert_eq!(left.as_deref(), Some("0"), "no row left behind");
            // Outside any lock, the fenced function takes its own lock.
            let token = tokio::time::timeout(Duration::from_secs(10), audit(8))
                .await
                .expect("in time")
                .expect("lock");
            assert_eq!(token, Some(1));
        },
    ));
}
