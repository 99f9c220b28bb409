//! A locking load for the server-death tests (DESIGN §11): tasks that run
//! bodies on one key back to back, each body checking it is alone, each
//! call allowed a long `wait` so that a server or member that dies and comes
//! back costs time, never an error. The test kills what it likes meanwhile
//! and asks the load whether bodies still run.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lock_runtime::LockClient;

/// The `wait` each call of the load is given: longer than any restart or
/// election the tests cause.
pub const LOAD_WAIT: Duration = Duration::from_secs(30);

/// The lease each call of the load asks for: a release the dead server
/// never got leaves the lock held this long at most.
pub const LOAD_TTL: Duration = Duration::from_secs(3);

/// Tasks locking one key in a loop.
#[derive(Debug)]
pub struct LockingLoad {
    runs: Arc<AtomicUsize>,
    stop: Arc<tokio::sync::Notify>,
    tasks: Vec<tokio::task::JoinHandle<Duration>>,
}

impl LockingLoad {
    /// `per_client` tasks on each of `clients`, all on `key`.
    pub fn start(clients: &[LockClient], per_client: usize, key: &str) -> LockingLoad {
        let runs = Arc::new(AtomicUsize::new(0));
        let inside = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(tokio::sync::Notify::new());
        let mut tasks = Vec::new();
        for locks in clients {
            for _ in 0..per_client {
                tasks.push(tokio::spawn(keep_locking(
                    locks.clone(),
                    key.to_owned(),
                    Arc::clone(&inside),
                    Arc::clone(&runs),
                    Arc::clone(&stop),
                )));
            }
        }
        LockingLoad { runs, stop, tasks }
    }

    /// Bodies run so far.
    pub fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    /// Waits until `more` bodies have run since the call, or `within` has
    /// passed; whether they did.
    pub async fn more_bodies(&self, more: usize, within: Duration) -> bool {
        let target = self.runs() + more;
        crate::eventually(within, || self.runs() >= target)
            .await
            .is_some()
    }

    /// Stops the tasks (each after its current call) and returns the bodies
    /// run and the longest gap between two bodies of one task. Panics, with
    /// the error, if any call failed.
    pub async fn finish(self) -> (usize, Duration) {
        self.stop.notify_waiters();
        let mut longest = Duration::ZERO;
        for task in self.tasks {
            match task.await {
                Ok(gap) => longest = longest.max(gap),
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(e) => panic!("a load task was cancelled: {e}"),
            }
        }
        (self.runs.load(Ordering::SeqCst), longest)
    }
}

/// One task of the load; returns the longest gap between its bodies.
async fn keep_locking(
    locks: LockClient,
    key: String,
    inside: Arc<AtomicUsize>,
    runs: Arc<AtomicUsize>,
    stop: Arc<tokio::sync::Notify>,
) -> Duration {
    let mut last = Instant::now();
    let mut longest = Duration::ZERO;
    let stopped = stop.notified();
    tokio::pin!(stopped);
    stopped.as_mut().enable();
    loop {
        let attempt = locks.lock(key.as_str()).ttl(LOAD_TTL).wait(LOAD_WAIT).run(async {
            assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two bodies at once");
            tokio::task::yield_now().await;
            inside.fetch_sub(1, Ordering::SeqCst);
        });
        tokio::select! {
            () = &mut stopped => return longest,
            outcome = attempt => {
                if let Err(e) = outcome {
                    panic!("a lock call failed through the fault: {e}");
                }
                runs.fetch_add(1, Ordering::SeqCst);
                longest = longest.max(last.elapsed());
                last = Instant::now();
            }
        }
    }
}
