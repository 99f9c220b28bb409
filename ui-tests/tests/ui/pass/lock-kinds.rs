//! Every kind of lock the attribute takes, on free functions and methods.
use lock_runtime::{distributed_lock, segment, LockError};

#[distributed_lock(key = "report:<id>", mode = "read")]
async fn read_report(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "report:<id>", mode = "write", fencing = true)]
async fn write_report(id: u64) -> Result<u64, LockError> {
    // A writer may read its own key: the read lock re-enters.
    read_report(id).await
}

#[distributed_lock(key = "pool:<name>", permits = 8, ttl = "10s")]
async fn use_connection(name: &str) -> Result<usize, LockError> {
    Ok(name.len())
}

#[distributed_lock(keys = ["account:<from>", "account:<to>"], wait = "5s")]
async fn transfer(from: u64, to: u64, cents: u64) -> Result<u64, LockError> {
    let _ = (from, to);
    Ok(cents)
}

#[distributed_lock(key = "queue:<id>", fair = true, wait = "10s")]
async fn in_turn(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

struct Stock;

impl Stock {
    #[distributed_lock(key = "stock:<sku>", segments = 5, wait = "1s")]
    async fn sell(&self, sku: u64) -> Result<Option<u32>, LockError> {
        let _ = sku;
        Ok(segment())
    }
}

fn main() {
    let _ = (write_report(1), use_connection("db"), Stock.sell(2), transfer(1, 2, 3), in_turn(4));
}
