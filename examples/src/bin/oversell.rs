//! The oversell demo: product 42 has 7 units in stock; three servers each
//! take three orders of one unit at the same moment. Without a lock, the
//! servers' read-modify-write of the stock races and more is sold than
//! exists. With `#[distributed_lock]`, exactly 7 are sold and 2 are refused.
//!
//! ```sh
//! cargo run -p lock-examples --bin oversell                     # in-process
//! REDIS_URL=redis://127.0.0.1/ cargo run -p lock-examples --bin oversell
//! REDIS_URL=redis://127.0.0.1/ cargo run -p lock-examples --bin oversell -- --processes
//! ```

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use lock_examples::ShopError;
use lock_runtime::{LockClient, distributed_lock};
use redis::AsyncCommands;

const PRODUCT: u64 = 42;
const INITIAL_STOCK: i64 = 7;
const SERVERS: usize = 3;
const ORDERS_PER_SERVER: usize = 3;
/// How long the stock read takes: a database round trip, which is exactly
/// the window in which an unprotected read-modify-write races.
const READ_LATENCY: Duration = Duration::from_millis(20);

/// Where the stock count lives: shared memory in one process, or Redis.
#[derive(Clone)]
enum Stock {
    Local(Arc<AtomicI64>),
    Redis(redis::aio::MultiplexedConnection),
}

impl Stock {
    fn key(product_id: u64) -> String {
        format!("oversell:stock:{product_id}")
    }

    /// The value is taken at once and handed back after the round trip, as
    /// a database read is: by the time the caller sees it, it may be stale.
    async fn read(&self, product_id: u64) -> Result<i64, ShopError> {
        let value = match self {
            Stock::Local(n) => n.load(Ordering::SeqCst),
            Stock::Redis(conn) => conn
                .clone()
                .get::<_, Option<i64>>(Stock::key(product_id))
                .await?
                .unwrap_or(0),
        };
        tokio::time::sleep(READ_LATENCY).await;
        Ok(value)
    }

    async fn write(&self, product_id: u64, value: i64) -> Result<(), ShopError> {
        match self {
            Stock::Local(n) => n.store(value, Ordering::SeqCst),
            Stock::Redis(conn) => {
                conn.clone()
                    .set::<_, _, ()>(Stock::key(product_id), value)
                    .await?
            }
        }
        Ok(())
    }
}

/// Sells `qty` units if they are in stock: `Ok(true)` sold, `Ok(false)`
/// refused. A read-modify-write: correct only if no one else runs it for the
/// same product at the same time.
async fn deduct_stock_unlocked(stock: &Stock, product_id: u64, qty: i64) -> Result<bool, ShopError> {
    let available = stock.read(product_id).await?;
    if available < qty {
        return Ok(false);
    }
    stock.write(product_id, available - qty).await?;
    Ok(true)
}

/// The same, with the lock held across every server for this product.
#[distributed_lock(key = "stock:<product_id>", ttl = "10s", wait = "5s")]
async fn deduct_stock(stock: &Stock, product_id: u64, qty: i64) -> Result<bool, ShopError> {
    deduct_stock_unlocked(stock, product_id, qty).await
}

/// One server taking its orders concurrently; returns (sold, refused).
async fn serve(stock: Stock, locked: bool) -> Result<(usize, usize), ShopError> {
    let orders = (0..ORDERS_PER_SERVER).map(|_| {
        let stock = stock.clone();
        async move {
            if locked {
                deduct_stock(&stock, PRODUCT, 1).await
            } else {
                deduct_stock_unlocked(&stock, PRODUCT, 1).await
            }
        }
    });
    let mut tally = (0, 0);
    for sold in futures_util::future::join_all(orders).await {
        if sold? {
            tally.0 += 1;
        } else {
            tally.1 += 1;
        }
    }
    Ok(tally)
}

struct RunResult {
    sold: usize,
    refused: usize,
    left: i64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, mode] = args.as_slice()
        && flag == "--server"
    {
        return server_process(mode == "locked").await;
    }
    let redis_url = std::env::var("REDIS_URL").ok();
    let processes = args.iter().any(|a| a == "--processes");
    if processes && redis_url.is_none() {
        return Err("--processes needs a shared Redis: set REDIS_URL=redis://host:port/".into());
    }

    println!(
        "Oversell demo: product {PRODUCT} starts with {INITIAL_STOCK} in stock; \
         {SERVERS} servers each take {ORDERS_PER_SERVER} orders of 1 unit at the same moment."
    );
    let (stock, setting) = match &redis_url {
        Some(url) => {
            lock_runtime::init(LockClient::connect(url).await?)?;
            let conn = redis::Client::open(url.as_str())?
                .get_multiplexed_async_connection()
                .await?;
            let how = if processes {
                "3 OS processes"
            } else {
                "3 tasks in this process"
            };
            (
                Stock::Redis(conn),
                format!("Redis at REDIS_URL, servers are {how}"),
            )
        }
        None => {
            lock_runtime::init(LockClient::in_memory())?;
            // The three servers share this process's lock table and stock.
            (
                Stock::Local(Arc::new(AtomicI64::new(0))),
                "the in-process backend, servers are 3 tasks in this process \
                 (set REDIS_URL to use Redis; add --processes for 3 OS processes)"
                    .to_owned(),
            )
        }
    };
    println!("Locks and stock: {setting}.\n");

    let mut rows = Vec::new();
    for locked in [false, true] {
        stock.write(PRODUCT, INITIAL_STOCK).await?;
        let (sold, refused) = if processes {
            run_processes(locked)?
        } else {
            let servers = (0..SERVERS).map(|_| tokio::spawn(serve(stock.clone(), locked)));
            let mut total = (0, 0);
            for server in futures_util::future::join_all(servers).await {
                let (sold, refused) = server??;
                total = (total.0 + sold, total.1 + refused);
            }
            total
        };
        let left = stock.read(PRODUCT).await?;
        rows.push((locked, RunResult { sold, refused, left }));
    }

    println!("| run                        | sold | refused | stock left | oversold |");
    println!("|----------------------------|------|---------|------------|----------|");
    for (locked, r) in &rows {
        let run = if *locked {
            "with #[distributed_lock]"
        } else {
            "without a lock"
        };
        let oversold = (r.sold as i64 - INITIAL_STOCK).max(0);
        println!(
            "| {run:<26} | {:>4} | {:>7} | {:>10} | {oversold:>8} |",
            r.sold, r.refused, r.left
        );
    }
    println!();
    if let [(_, unlocked), (_, locked)] = rows.as_slice() {
        let oversold = unlocked.sold as i64 - INITIAL_STOCK;
        if oversold > 0 {
            println!(
                "Without a lock, {} orders were accepted for {INITIAL_STOCK} units: the servers read the \
                 same stock and each wrote back its own count, so {oversold} units were sold that do not \
                 exist, and the stock still shows {}.",
                unlocked.sold, unlocked.left
            );
        } else {
            println!("Without a lock, this time the orders happened not to overlap; run it again.");
        }
        println!(
            "With the lock, the read and the write of each order ran alone: {} sold, {} refused, {} left.",
            locked.sold, locked.refused, locked.left
        );
    }
    Ok(())
}

/// Runs the three servers as OS processes against Redis, started together.
fn run_processes(locked: bool) -> Result<(usize, usize), Box<dyn std::error::Error>> {
    let exe = std::env::current_exe()?;
    let mode = if locked { "locked" } else { "unlocked" };
    let mut children = Vec::new();
    for _ in 0..SERVERS {
        let mut child = Command::new(&exe)
            .args(["--server", mode])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let mut ready = String::new();
        BufReader::new(child.stdout.as_mut().ok_or("no stdout")?).read_line(&mut ready)?;
        if ready.trim() != "ready" {
            return Err(format!("server did not start: {ready:?}").into());
        }
        children.push(child);
    }
    // Release all three at once, so their orders overlap.
    for child in &mut children {
        writeln!(child.stdin.as_mut().ok_or("no stdin")?, "go")?;
    }
    let mut total = (0, 0);
    for child in children {
        let output = child.wait_with_output()?;
        if !output.status.success() {
            return Err("a server process failed".into());
        }
        let text = String::from_utf8(output.stdout)?;
        let mut numbers = text.split_whitespace().filter_map(|w| w.parse::<usize>().ok());
        let (Some(sold), Some(refused)) = (numbers.next(), numbers.next()) else {
            return Err(format!("unexpected server output {text:?}").into());
        };
        total = (total.0 + sold, total.1 + refused);
    }
    Ok(total)
}

/// One server as an OS process: connects, says `ready`, waits for `go`,
/// takes its orders and prints `<sold> <refused>`.
async fn server_process(locked: bool) -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL")?;
    lock_runtime::init(LockClient::connect(&url).await?)?;
    let stock = Stock::Redis(
        redis::Client::open(url.as_str())?
            .get_multiplexed_async_connection()
            .await?,
    );
    println!("ready");
    let mut go = String::new();
    std::io::stdin().read_line(&mut go)?;
    let (sold, refused) = serve(stock, locked).await?;
    println!("{sold} {refused}");
    Ok(())
}
