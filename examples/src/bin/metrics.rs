//! A shop service that shows its locks' metrics: Prometheus scrapes
//! `http://METRICS_ADDR/metrics` (default `127.0.0.1:9000`) while the
//! service sells stock under `#[distributed_lock]`. Any `metrics` exporter
//! works the same way; this one is `metrics-exporter-prometheus`.
//!
//! ```sh
//! REDIS_URL=redis://127.0.0.1/ cargo run -p lock-examples --bin metrics
//! curl -s http://127.0.0.1:9000/metrics | grep distributed_lock
//! ```
//!
//! Each round restocks 3 products with 5 units and lets 8 workers place 3
//! orders each (24 orders, 15 sold, 9 refused) and prints a JSON line; with
//! `--rounds N` it stops selling after N rounds and keeps serving the
//! metrics until it is stopped.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use lock_examples::{ShopError, install_client};
use lock_runtime::distributed_lock;
use metrics_exporter_prometheus::PrometheusBuilder;

const PRODUCTS: u64 = 3;
const STOCK: u32 = 5;
const WORKERS: u64 = 8;
const ORDERS_PER_WORKER: usize = 3;

/// The stock of each product, as a store the service reads and writes.
#[derive(Clone, Default)]
struct Store(Arc<Mutex<HashMap<u64, u32>>>);

impl Store {
    fn get(&self, product_id: u64) -> u32 {
        let stock = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        stock.get(&product_id).copied().unwrap_or(0)
    }

    fn set(&self, product_id: u64, units: u32) {
        let mut stock = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        stock.insert(product_id, units);
    }
}

/// Sells one unit if there is one. The read and the write are a millisecond
/// apart, as with a database: only the lock keeps two orders from selling
/// the same unit.
#[distributed_lock(key = "stock:<product_id>", ttl = "10s", wait = "5s")]
async fn order(store: &Store, product_id: u64) -> Result<bool, ShopError> {
    let units = store.get(product_id);
    tokio::time::sleep(Duration::from_millis(1)).await;
    if units == 0 {
        return Ok(false);
    }
    store.set(product_id, units - 1);
    Ok(true)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr: SocketAddr = std::env::var("METRICS_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:9000".to_owned())
        .parse()?;
    let rounds: Option<u64> = match std::env::args().skip(1).collect::<Vec<_>>().as_slice() {
        [] => None,
        [flag, n] if flag == "--rounds" => Some(n.parse()?),
        _ => return Err("usage: metrics [--rounds N]".into()),
    };
    // The recorder first: metrics recorded before it is installed are lost.
    PrometheusBuilder::new().with_http_listener(addr).install()?;
    let backend = install_client().await?;
    println!("metrics at http://{addr}/metrics; {backend}");

    let store = Store::default();
    let mut round = 0;
    while rounds.is_none_or(|n| round < n) {
        round += 1;
        for product in 0..PRODUCTS {
            store.set(product, STOCK);
        }
        let workers = (0..WORKERS).map(|worker| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut sold = 0;
                for _ in 0..ORDERS_PER_WORKER {
                    if order(&store, worker % PRODUCTS).await? {
                        sold += 1;
                    }
                }
                Ok::<usize, ShopError>(sold)
            })
        });
        let mut sold = 0;
        for worker in futures_util::future::join_all(workers).await {
            sold += worker??;
        }
        let orders = WORKERS as usize * ORDERS_PER_WORKER;
        println!(
            "{{\"round\":{round},\"orders\":{orders},\"sold\":{sold},\"refused\":{}}}",
            orders - sold
        );
    }
    println!("{{\"done\":true,\"rounds\":{round}}}");
    // Keep serving the metrics until stopped.
    std::future::pending::<()>().await;
    Ok(())
}
