//! Takes and releases a lock on the Redis at `REDIS_URL`, or on a throwaway
//! `redis-server` started for the run when `REDIS_URL` is unset.

use std::time::Duration;

use lock_runtime::LockClient;

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
    let locks = LockClient::connect(&url).await?;
    let sold = locks
        .lock("stock:42")
        .wait(Duration::from_secs(5))
        .run(async { 1 })
        .await?;
    println!("sold {sold} unit of product 42 while holding lock `stock:42`");
    Ok(())
}
