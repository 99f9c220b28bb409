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

/// How many calls are inside each kind's body at once.
#[derive(Default)]
pub(crate) struct Occupancy {
    readers: AtomicUsize,
    writers: AtomicUsize,
    permits: AtomicUsize,
    segments: [AtomicUsize; 2],
    line: AtomicUsize,
    pair: AtomicUsize,
}

/// Inside `count`'s body while the task yields, checking that at most
/// `most` are (`count` is left as it was).
async fn occupy(count: &AtomicUsize, most: usize, what: &str) {
    let now = count.fetch_add(1, Ordering::SeqCst) + 1;
    assert!(now <= most, "{now} {what} at once (at most {most})");
    tokio::task::yield_now().await;
    count.fetch_sub(1, Ordering::SeqCst);
}

#[distributed_lock(key = "doc:<id>", mode = "read", wait = "20s")]
pub(crate) async fn read_doc(o: &Occupancy, id: u64) -> Result<(), LockError> {
    let _ = id;
    o.readers.fetch_add(1, Ordering::SeqCst);
    assert_eq!(o.writers.load(Ordering::SeqCst), 0, "a reader beside a writer");
    tokio::task::yield_now().await;
    o.readers.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

#[distributed_lock(key = "doc:<id>", mode = "write", wait = "20s")]
pub(crate) async fn write_doc(o: &Occupancy, id: u64) -> Result<(), LockError> {
    let _ = id;
    assert_eq!(o.readers.load(Ordering::SeqCst), 0, "a writer beside a reader");
    occupy(&o.writers, 1, "writers").await;
    assert_eq!(o.readers.load(Ordering::SeqCst), 0, "a writer beside a reader");
    Ok(())
}

#[distributed_lock(key = "pool:<id>", permits = 2, wait = "20s")]
pub(crate) async fn use_pool(o: &Occupancy, id: u64) -> Result<(), LockError> {
    let _ = id;
    occupy(&o.permits, 2, "permit holders").await;
    Ok(())
}

#[distributed_lock(key = "bins:<id>", segments = 2, wait = "20s")]
pub(crate) async fn use_bin(o: &Occupancy, id: u64) -> Result<u32, LockError> {
    let _ = id;
    let i = lock_runtime::segment().expect("inside a segmented body");
    occupy(
        &o.segments[usize::try_from(i).expect("small")],
        1,
        "holders of one segment",
    )
    .await;
    Ok(i)
}

#[distributed_lock(key = "line:<id>", fair = true, wait = "20s")]
pub(crate) async fn in_line(o: &Occupancy, id: u64) -> Result<(), LockError> {
    let _ = id;
    occupy(&o.line, 1, "fair holders").await;
    Ok(())
}

#[distributed_lock(keys = ["account:<from>", "account:<to>"], wait = "20s")]
pub(crate) async fn transfer(o: &Occupancy, from: u64, to: u64) -> Result<(), LockError> {
    let _ = (from, to);
    occupy(&o.pair, 1, "transfers").await;
    Ok(())
}

/// How a probe asks for a lock of one kind.
type Kind = fn(lock_runtime::LockRequest<'_>) -> lock_runtime::LockRequest<'_>;

/// A fixed lease shorter than its body: the body is cancelled.
#[distributed_lock(key = "short:<id>", ttl = "300ms", renew = false)]
pub(crate) async fn outlive_the_lease(id: u64) -> Result<(), LockError> {
    let _ = id;
    std::future::pending::<()>().await;
    Ok(())
}

/// The kinds a backend offers beyond exclusive locks and sets of keys.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Offers {
    pub(crate) read_write: bool,
    pub(crate) permits_and_fair: bool,
    pub(crate) segments: bool,
}

impl Offers {
    /// Every kind.
    pub(crate) const ALL: Offers = Offers {
        read_write: true,
        permits_and_fair: true,
        segments: true,
    };
}

/// Every kind through the attribute and the global client, from 6 tasks
/// at once: never more holders than the kind allows, a lost lease ends
/// the body with `Lost`, and every lock is free afterwards (`locks` is a
/// client of the same backend, to look), for each kind the backend
/// `offers`.
pub(crate) async fn kinds_through_the_attribute(locks: &lock_runtime::LockClient, offers: Offers) {
    let o = Arc::new(Occupancy::default());
    let calls: Vec<_> = (0..6)
        .map(|task| {
            let o = Arc::clone(&o);
            tokio::spawn(async move {
                for round in 0..8 {
                    if !offers.read_write {
                    } else if (task + round) % 4 == 0 {
                        write_doc(&o, 1).await.expect("write lock");
                    } else {
                        read_doc(&o, 1).await.expect("read lock");
                    }
                    if offers.permits_and_fair {
                        use_pool(&o, 1).await.expect("permit");
                        in_line(&o, 1).await.expect("fair lock");
                    }
                    if offers.segments {
                        use_bin(&o, 1).await.expect("segment");
                    }
                    // Opposite orders: all-or-nothing in one sorted order.
                    if task % 2 == 0 {
                        transfer(&o, 1, 2).await.expect("both accounts");
                    } else {
                        transfer(&o, 2, 1).await.expect("both accounts");
                    }
                }
            })
        })
        .collect();
    for call in calls {
        call.await.expect("a task's calls");
    }
    let lost = outlive_the_lease(1).await;
    assert!(matches!(lost, Err(LockError::Lost { .. })), "{lost:?}");
    // Every lock free: all a kind allows get in at once, without waiting.
    use lock_runtime::LockMode;
    let probes: [(&str, u32, Kind); 6] = [
        ("doc:1", 1, |l| l.mode(LockMode::Write)),
        ("pool:1", 2, |l| l.permits(2)),
        ("bins:1", 2, |l| l.segments(2)),
        ("line:1", 1, |l| l.fair(true)),
        ("account:1", 1, |l| l),
        ("short:1", 1, |l| l),
    ];
    for (key, all, kind) in probes {
        let offered = match key {
            "doc:1" => offers.read_write,
            "pool:1" | "line:1" => offers.permits_and_fair,
            "bins:1" => offers.segments,
            _ => true,
        };
        if !offered {
            continue;
        }
        let mut guards = Vec::new();
        for _ in 0..all {
            let (locks, name) = (locks.clone(), key.to_owned());
            // Another task: a holder of its own. A waiter that gave up
            // leaves from a spawned task, so this may wait a little.
            let guard = tokio::spawn(async move {
                kind(locks.lock(name))
                    .wait(std::time::Duration::from_secs(2))
                    .acquire()
                    .await
            })
            .await
            .expect("probe task")
            .unwrap_or_else(|e| panic!("`{key}` left held: {e}"));
            guards.push(guard);
        }
        for guard in guards {
            guard.release().await.expect("release a probe");
        }
    }
}
