//! A leader's epoch guarding a write. Replica A is elected, sends a write
//! that is slow to arrive (a GC pause, a congested network), and its term
//! ends before the write lands (here it resigns; a lost lease ends it the
//! same way). Replica B is elected with a greater epoch and writes at once;
//! A's write arrives after it (here it waits for B's, so that the order
//! does not depend on timing).
//! Storage that refuses epochs older than the newest it has seen keeps B's
//! write when A's arrives; a follower asks who leads.

use std::sync::Arc;
use std::time::Duration;

use lock_examples::FencedStore as Storage;
use lock_runtime::LockError;

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let (locks, which) = lock_examples::client().await?;
    println!("{which}\n");
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
                Err(newest) => {
                    println!("replica-a: refused write with epoch {epoch_a}: storage has seen epoch {newest}")
                }
            }
        })
    };
    a.resign().await?;

    let b = election.campaign("replica-b").await?;
    let epoch_b = b.epoch();
    println!("replica-b: leads with epoch {epoch_b}, writes");
    match storage.write(epoch_b, "replica-b's plan") {
        Ok(()) => println!("replica-b: write with epoch {epoch_b} accepted"),
        Err(newest) => {
            println!("replica-b: refused write with epoch {epoch_b}: storage has seen epoch {newest}")
        }
    }
    let _ = b_wrote.send(());
    let _ = slow_write.await;

    if let Some(leader) = election.leader().await? {
        println!("a follower asks: {} leads, epoch {}", leader.value, leader.epoch);
    }
    b.resign().await?;
    let schedule = storage.contents();
    println!("\nStorage holds {schedule:?}: replica-a's late write could not overwrite it.");
    Ok(())
}
