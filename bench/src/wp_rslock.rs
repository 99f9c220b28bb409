//! WP: rslock 0.10, the Redlock crate Rust users reach for, as a peer on
//! the same servers in the same run: W1, W2 and W3 on the bench's node, and
//! W1 and W3 on the 3 masters W4 uses.
//!
//! rslock retries a refused lock after a random pause of up to its retry
//! delay (200 ms by default, which would make W3 a measure of that
//! default); the peer runs with 1 ms, the floor's own retry pause, and
//! `acquire_no_guard`, which loops until it has the lock.

use rslock::LockManager;

use super::*;

/// A lease long enough for every body here; rslock has no renewal.
const TTL: Duration = Duration::from_secs(30);

/// rslock over `urls` (one node, or Redlock masters), retrying every 0–1 ms.
pub(crate) fn rslock(urls: Vec<String>) -> Rslock {
    let mut manager = LockManager::new(urls);
    manager.set_retry(3, Duration::from_millis(1));
    Rslock(Arc::new(manager))
}

#[derive(Clone)]
pub(crate) struct Rslock(Arc<LockManager>);

impl Locker for Rslock {
    type Guard = rslock::Lock;

    async fn take(&self, key: &str) -> Result<Self::Guard, Error> {
        Ok(self.0.acquire_no_guard(key.as_bytes(), TTL).await?)
    }

    async fn give(&self, guard: Self::Guard) -> Result<(), Error> {
        self.0.unlock(&guard).await;
        Ok(())
    }
}

/// W1's shape with any [`Locker`]: one task, one key, pairs one after
/// another.
pub(crate) async fn w1_locker<L: Locker>(
    locker: &L,
    workload: &'static str,
    pairs: usize,
) -> Result<Report, Error> {
    let mut latencies = Vec::with_capacity(pairs);
    let start = Instant::now();
    for _ in 0..pairs {
        let t = Instant::now();
        let guard = locker.take("w1").await?;
        locker.give(guard).await?;
        latencies.push(t.elapsed());
    }
    Ok(Report {
        workload,
        ops: pairs,
        elapsed: start.elapsed(),
        latencies,
        ..Report::default()
    })
}

/// WP on the bench's node: W1, W2 (64 tasks, own keys) and W3.
pub(crate) async fn wp_rslock(url: &str) -> Result<Vec<Report>, Error> {
    let peer = rslock(vec![url.to_owned()]);
    let w1 = w1_locker(&peer, "WP1 rslock acquire+release", SEQUENTIAL_PAIRS).await?;
    let (pairs, elapsed, latencies) = {
        let peer = peer.clone();
        independent_keys(move |task, _| {
            let peer = peer.clone();
            async move {
                let guard = peer.take(&format!("w2:rslock:{task}")).await?;
                peer.give(guard).await
            }
        })
        .await?
    };
    let w2 = Report {
        workload: "WP2 rslock 64 tasks x own key",
        ops: pairs,
        elapsed,
        latencies,
        ..Report::default()
    };
    let w3 = w3_locker(peer, url, "WP3 rslock 16 tasks x 1 key, increments").await?;
    Ok(vec![w1, w2, w3])
}
