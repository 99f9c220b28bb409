//! A lock client in its own OS process, driven by the integration tests.
//!
//! - `lock-worker count <url> <key> <counter-key> <n>`: `n` times, under the
//!   lock, read the counter with GET and write it back plus one with SET.
//! - `lock-worker hold <url> <key> <ttl-ms>`: take the lock, print `HELD`,
//!   and keep it until killed.
//! - `lock-worker wait <url> <key>`: wait up to 30 s for the lock, then print
//!   the wall-clock time it was acquired (ns since the epoch) and release it.
//! - `lock-worker fence <url> <key> <n>`: `n` times, take the lock with a
//!   fencing token and, under the lock, append the token to the list
//!   `fence-log`: the list's order is the acquisition order.

use std::time::Duration;

use lock_runtime::{LockClient, LockError};
use redis::AsyncCommands;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        [_, "count", url, key, counter, n] => count(url, key, counter, n.parse()?).await,
        [_, "hold", url, key, ttl_ms] => hold(url, key, ttl_ms.parse()?).await,
        [_, "wait", url, key] => wait(url, key).await,
        [_, "fence", url, key, n] => fence(url, key, n.parse()?).await,
        _ => Err("usage: lock-worker count|hold|wait|fence URL KEY ...".into()),
    }
}

async fn count(url: &str, key: &str, counter: &str, n: u32) -> Result<(), Box<dyn std::error::Error>> {
    let locks = LockClient::connect(url).await?;
    let mut data = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    for _ in 0..n {
        let data = &mut data;
        locks
            .lock(key)
            .wait(Duration::from_secs(30))
            .run(async move {
                let value: Option<u64> = data.get(counter).await?;
                data.set::<_, _, ()>(counter, value.unwrap_or(0) + 1).await?;
                Ok::<_, redis::RedisError>(())
            })
            .await??;
    }
    Ok(())
}

async fn hold(url: &str, key: &str, ttl_ms: u64) -> Result<(), Box<dyn std::error::Error>> {
    let locks = LockClient::connect(url).await?;
    let guard = locks
        .lock(key)
        .ttl(Duration::from_millis(ttl_ms))
        .renew(false)
        .acquire()
        .await?;
    println!("HELD");
    std::future::pending::<()>().await;
    guard.release().await?;
    Ok::<_, LockError>(()).map_err(Into::into)
}

async fn wait(url: &str, key: &str) -> Result<(), Box<dyn std::error::Error>> {
    let locks = LockClient::connect(url).await?;
    let guard = locks.lock(key).wait(Duration::from_secs(30)).acquire().await?;
    let acquired = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    println!("{}", acquired.as_nanos());
    guard.release().await?;
    Ok(())
}

async fn fence(url: &str, key: &str, n: u32) -> Result<(), Box<dyn std::error::Error>> {
    let locks = LockClient::connect(url).await?;
    let mut data = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    for _ in 0..n {
        let data = &mut data;
        locks
            .lock(key)
            .fencing(true)
            .wait(Duration::from_secs(30))
            .run(async move {
                let token = lock_runtime::fencing_token().ok_or("no fencing token")?;
                data.rpush::<_, _, ()>("fence-log", token).await?;
                Ok::<_, Box<dyn std::error::Error>>(())
            })
            .await??;
    }
    Ok(())
}
