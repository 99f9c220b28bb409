//! The segmented lock: one hot product, 1,000 units, 10 workers ordering one
//! unit at a time. With one lock on the product, the orders run one after
//! another. Split the stock into N segments, each with its own share of the
//! units and its own lock (`segments = N`), and N orders run at once; an
//! order that lands on a sold-out segment tries again and gets another.
//! Every segment's read-modify-write still runs alone, so nothing is
//! oversold at any N.
//!
//! ```sh
//! cargo run --release -p lock-examples --bin segmented                  # in-process
//! REDIS_URL=redis://127.0.0.1/ cargo run --release -p lock-examples --bin segmented
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lock_examples::ShopError;
use lock_runtime::{LockClient, distributed_lock, segment};
use redis::AsyncCommands;

const PRODUCT: u64 = 42;
const UNITS: i64 = 1_000;
const WORKERS: usize = 10;
/// What an order spends in the stock store between reading the count and
/// writing it back: the window in which an unprotected update races.
const STORE_LATENCY: Duration = Duration::from_millis(1);

/// Each segment's share of the stock: counters in this process, or Redis
/// keys `segmented:stock:<product>#<segment>`.
#[derive(Clone)]
enum Stock {
    Local(Arc<Vec<AtomicI64>>),
    Redis(redis::aio::MultiplexedConnection),
}

impl Stock {
    fn key(product: u64, segment: u32) -> String {
        format!("segmented:stock:{product}#{segment}")
    }

    /// Splits `UNITS` over `segments` shares (the first ones get the
    /// remainder).
    async fn fill(&mut self, product: u64, segments: u32) -> Result<(), ShopError> {
        let n = i64::from(segments);
        let share = |i: u32| UNITS / n + i64::from(i64::from(i) < UNITS % n);
        match self {
            Stock::Local(counters) => {
                for (i, counter) in counters.iter().enumerate() {
                    let i = u32::try_from(i).unwrap_or(u32::MAX);
                    counter.store(if i < segments { share(i) } else { 0 }, Ordering::SeqCst);
                }
            }
            Stock::Redis(conn) => {
                for i in 0..segments {
                    conn.set::<_, _, ()>(Stock::key(product, i), share(i)).await?;
                }
            }
        }
        Ok(())
    }

    async fn read(&self, product: u64, segment: u32) -> Result<i64, ShopError> {
        let value = match self {
            Stock::Local(counters) => counters[segment as usize].load(Ordering::SeqCst),
            Stock::Redis(conn) => conn
                .clone()
                .get::<_, Option<i64>>(Stock::key(product, segment))
                .await?
                .unwrap_or(0),
        };
        tokio::time::sleep(STORE_LATENCY).await;
        Ok(value)
    }

    async fn write(&self, product: u64, segment: u32, value: i64) -> Result<(), ShopError> {
        match self {
            Stock::Local(counters) => counters[segment as usize].store(value, Ordering::SeqCst),
            Stock::Redis(conn) => {
                conn.clone()
                    .set::<_, _, ()>(Stock::key(product, segment), value)
                    .await?;
            }
        }
        Ok(())
    }
}

/// What one order found.
enum Order {
    Sold,
    /// The segment it was given had nothing left.
    SegmentSoldOut(u32),
}

/// Takes one unit from the segment this call holds.
async fn take_one(stock: &Stock, product: u64) -> Result<Order, ShopError> {
    let segment = segment().unwrap_or(0);
    let left = stock.read(product, segment).await?;
    if left < 1 {
        return Ok(Order::SegmentSoldOut(segment));
    }
    stock.write(product, segment, left - 1).await?;
    Ok(Order::Sold)
}

/// One function per segment count: the count is part of the lock's
/// definition, fixed at compile time like the rest of the attribute.
macro_rules! segmented_order {
    ($name:ident, $segments:literal) => {
        #[distributed_lock(key = "stock:<product>", segments = $segments, ttl = "10s", wait = "10s")]
        async fn $name(stock: &Stock, product: u64) -> Result<Order, ShopError> {
            take_one(stock, product).await
        }
    };
}

segmented_order!(order_1, 1);
segmented_order!(order_2, 2);
segmented_order!(order_5, 5);
segmented_order!(order_10, 10);

async fn order(stock: &Stock, product: u64, segments: u32) -> Result<Order, ShopError> {
    match segments {
        1 => order_1(stock, product).await,
        2 => order_2(stock, product).await,
        5 => order_5(stock, product).await,
        _ => order_10(stock, product).await,
    }
}

/// One run: `WORKERS` tasks order until every segment is sold out.
async fn run(stock: &Stock, segments: u32) -> Result<(u64, Duration), Box<dyn std::error::Error>> {
    let sold = Arc::new(AtomicU64::new(0));
    let sold_out: Arc<Vec<AtomicBool>> = Arc::new((0..segments).map(|_| AtomicBool::new(false)).collect());
    let started = Instant::now();
    let workers = (0..WORKERS).map(|_| {
        let (stock, sold, sold_out) = (stock.clone(), Arc::clone(&sold), Arc::clone(&sold_out));
        tokio::spawn(async move {
            while !sold_out.iter().all(|s| s.load(Ordering::SeqCst)) {
                match order(&stock, PRODUCT, segments).await? {
                    Order::Sold => {
                        sold.fetch_add(1, Ordering::SeqCst);
                    }
                    Order::SegmentSoldOut(i) => sold_out[i as usize].store(true, Ordering::SeqCst),
                }
            }
            Ok::<(), ShopError>(())
        })
    });
    for worker in futures_util::future::join_all(workers).await {
        worker??;
    }
    Ok((sold.load(Ordering::SeqCst), started.elapsed()))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let redis_url = std::env::var("REDIS_URL").ok();
    let (mut stock, setting) = match &redis_url {
        Some(url) => {
            lock_runtime::init(LockClient::connect(url).await?)?;
            let conn = redis::Client::open(url.as_str())?
                .get_multiplexed_async_connection()
                .await?;
            (Stock::Redis(conn), "Redis at REDIS_URL")
        }
        None => {
            lock_runtime::init(LockClient::in_memory())?;
            let counters = (0..10).map(|_| AtomicI64::new(0)).collect();
            (
                Stock::Local(Arc::new(counters)),
                "the in-process backend (set REDIS_URL to use Redis)",
            )
        }
    };
    println!(
        "Segmented lock: product {PRODUCT} has {UNITS} units; {WORKERS} workers order one unit at a time \
         ({}ms in the stock store per order). Locks and stock: {setting}.\n",
        STORE_LATENCY.as_millis()
    );
    println!("| segments | sold | oversold | orders/s |");
    println!("|----------|------|----------|----------|");
    for segments in [1, 2, 5, 10] {
        stock.fill(PRODUCT, segments).await?;
        let (sold, took) = run(&stock, segments).await?;
        let mut left = 0;
        for i in 0..segments {
            left += stock.read(PRODUCT, i).await?;
        }
        // Sold beyond the stock, or a segment driven below zero.
        let oversold = (i64::try_from(sold)? - UNITS).max(0) + (-left).max(0);
        let rate = sold as f64 / took.as_secs_f64();
        println!("| {segments:>8} | {sold:>4} | {oversold:>8} | {rate:>8.0} |");
    }
    Ok(())
}
