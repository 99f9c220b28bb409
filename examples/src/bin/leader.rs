//! A leader's epoch guarding a write. Replica A is elected, sends a write
//! that is slow to arrive (a GC pause, a congested network), and its term
//! ends before the write lands (here it resigns; a lost lease ends it the
//! same way). Replica B is elected with a greater epoch and writes at once;
//! A's write arrives after it (here it waits for B's, so that the order
//! does not depend on timing).
//! Storage that refuses epochs older than the newest it has seen keeps B's
//! write when A's arrives; a follower asks who leads.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use lock_runtime::{LockClient, LockError};

/// Storage that remembers the highest epoch it has accepted.
#[derive(Default)]
struct Storage {
    newest_epoch: Mutex<u64>,
    schedule: Mutex<String>,
}

impl Storage {
    fn write(&self, epoch: u64, text: &str) -> Result<(), String> {
        let mut newest = self.newest_epoch.lock().unwrap_or_else(PoisonError::into_inner);
        if epoch < *newest {
            return Err(format!(
                "refused write with epoch {epoch}: storage has seen epoch {newest}"
            ));
        }
        *newest = epoch;
        *self.schedule.lock().unwrap_or_else(PoisonError::into_inner) = text.to_owned();
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let locks = match std::env::var("REDIS_URL") {
        Ok(url) => {
            println!("elections on Redis (REDIS_URL)\n");
            LockClient::connect(&url).await?
        }
        Err(_) => {
            println!("elections in this process (set REDIS_URL to use Redis)\n");
            LockClient::in_memory()
        }
    };
    // Every replica builds the same election; here two tasks of one
    // process stand in for two replicas.
    let election = locks.election("scheduler").ttl(Duration::from_secs(5));
    let storage = Arc::new(Storage::default());

    let a = election.campaign("replica-a").await?;
    let epoch_a = a.epoch();
    println!("replica-a: leads with epoch {epoch_a}, sends its write");
    let (b_wrote, a_arrives) = tokio::sync::oneshot::channel::<()>();
    let slow_write = {
        let storage = Arc::clone(&storage);
        tokio::spawn(async move {
            let _ = a_arrives.await;
            match storage.write(epoch_a, "replica-a's plan") {
                Ok(()) => println!("replica-a: write with epoch {epoch_a} accepted"),
                Err(refusal) => println!("replica-a: {refusal}"),
            }
        })
    };
    a.resign().await?;

    let b = election.campaign("replica-b").await?;
    let epoch_b = b.epoch();
    println!("replica-b: leads with epoch {epoch_b}, writes");
    match storage.write(epoch_b, "replica-b's plan") {
        Ok(()) => println!("replica-b: write with epoch {epoch_b} accepted"),
        Err(refusal) => println!("replica-b: {refusal}"),
    }
    let _ = b_wrote.send(());
    let _ = slow_write.await;

    if let Some(leader) = election.leader().await? {
        println!("a follower asks: {} leads, epoch {}", leader.value, leader.epoch);
    }
    b.resign().await?;
    let schedule = storage
        .schedule
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    println!("\nStorage holds {schedule:?}: replica-a's late write could not overwrite it.");
    Ok(())
}
