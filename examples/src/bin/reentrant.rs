//! Nested locked calls re-enter: `transfer` holds `account:<from>`, and the
//! `withdraw` it calls takes the same lock again without waiting for itself.
//! A separate task asking for the same account waits until `transfer` ends.

use std::time::{Duration, Instant};

use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "account:<account>", wait = "2s")]
async fn withdraw(account: u32, cents: u64, started: Instant) -> Result<(), LockError> {
    println!(
        "{:>5.1}ms   withdraw {cents} from {account} (re-entered the lock)",
        ms(started)
    );
    Ok(())
}

#[distributed_lock(key = "account:<account>", wait = "2s")]
async fn deposit(account: u32, cents: u64, started: Instant) -> Result<(), LockError> {
    println!(
        "{:>5.1}ms   deposit {cents} to {account} (a second lock, nested)",
        ms(started)
    );
    Ok(())
}

#[distributed_lock(key = "account:<from>", wait = "2s")]
async fn transfer(from: u32, to: u32, cents: u64, started: Instant) -> Result<(), LockError> {
    println!(
        "{:>5.1}ms transfer {cents} from {from} to {to}: holding account:{from}",
        ms(started)
    );
    withdraw(from, cents, started).await?;
    deposit(to, cents, started).await?;
    tokio::time::sleep(Duration::from_millis(50)).await;
    println!("{:>5.1}ms transfer done", ms(started));
    Ok(())
}

#[distributed_lock(key = "account:<account>", wait = "2s")]
async fn audit(account: u32, started: Instant) -> Result<(), LockError> {
    println!(
        "{:>5.1}ms audit of {account}: got the lock (another task, so it waited)",
        ms(started)
    );
    Ok(())
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    println!("{}\n", lock_examples::install_client().await?);
    let started = Instant::now();
    let transfer = transfer(1, 2, 500, started);
    let audit = async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        println!("{:>5.1}ms audit of 1 asks for account:1", ms(started));
        tokio::spawn(audit(1, started)).await.expect("audit task")
    };
    let (transferred, audited) = tokio::join!(transfer, audit);
    transferred?;
    audited?;
    Ok(())
}
