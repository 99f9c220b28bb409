//! A fencing token guarding a write. Holder A takes the lock, but its write
//! is slow to arrive (a GC pause, a congested network): it reaches storage
//! after A's lease ended and B wrote. The lock alone cannot stop that late
//! write; storage that refuses tokens older than the newest it has seen can.

use std::sync::Arc;
use std::time::Duration;

use lock_examples::FencedStore as Storage;
use lock_runtime::{LockError, distributed_lock, fencing_token};

/// Takes the lock, then sends the write; `delay` is how long the write
/// takes to reach storage. Returns the in-flight write.
#[distributed_lock(key = "doc:<doc_id>", fencing = true)]
async fn save(
    doc_id: u32,
    storage: Arc<Storage>,
    text: &'static str,
    delay: Duration,
) -> Result<tokio::task::JoinHandle<()>, LockError> {
    let token = fencing_token().expect("fencing = true issues a token");
    println!("{text:>9}: holds doc:{doc_id} with token {token}, sends its write");
    Ok(tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        match storage.write(token, text) {
            Ok(()) => println!("{text:>9}: write with token {token} accepted"),
            Err(newest) => {
                println!("{text:>9}: refused write with token {token}: storage has seen token {newest}")
            }
        }
    }))
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    println!("{}\n", lock_examples::install_client().await?);
    let storage = Arc::new(Storage::default());
    let slow = save(7, Arc::clone(&storage), "holder A", Duration::from_millis(100)).await?;
    let fast = save(7, Arc::clone(&storage), "holder B", Duration::ZERO).await?;
    let _ = tokio::join!(slow, fast);
    let document = storage.contents();
    println!("\nThe document holds {document:?}: A's late write could not overwrite B's.");
    Ok(())
}
