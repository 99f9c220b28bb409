//! A fencing token guarding a write. Holder A takes the lock, but its write
//! is slow to arrive (a GC pause, a congested network): it reaches storage
//! after A's lease ended and B wrote. The lock alone cannot stop that late
//! write; storage that refuses tokens older than the newest it has seen can.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use lock_runtime::{LockError, distributed_lock, fencing_token};

/// Storage that remembers the highest token it has accepted.
#[derive(Default)]
struct Storage {
    newest_token: Mutex<u64>,
    document: Mutex<String>,
}

impl Storage {
    fn write(&self, token: u64, text: &str) -> Result<(), String> {
        let mut newest = self.newest_token.lock().unwrap_or_else(PoisonError::into_inner);
        if token < *newest {
            return Err(format!(
                "refused write with token {token}: storage has seen token {newest}"
            ));
        }
        *newest = token;
        *self.document.lock().unwrap_or_else(PoisonError::into_inner) = text.to_owned();
        Ok(())
    }
}

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
            Err(refusal) => println!("{text:>9}: {refusal}"),
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
    let document = storage
        .document
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    println!("\nThe document holds {document:?}: A's late write could not overwrite B's.");
    Ok(())
}
