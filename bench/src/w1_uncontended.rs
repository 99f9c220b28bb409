//! W1: one task, one key, acquire+release pairs one after another.

use super::*;

/// W1: one task, one key, sequential acquire + release through the library.
pub(crate) async fn w1_uncontended(url: &str) -> Result<Report, Error> {
    w1_on(
        &LockClient::connect(url).await?,
        "W1 uncontended acquire+release",
        SEQUENTIAL_PAIRS,
    )
    .await
}

pub(crate) async fn w1_on(locks: &LockClient, workload: &'static str, pairs: usize) -> Result<Report, Error> {
    let library = Library {
        locks: locks.clone(),
        configure: |request| request,
        // Try once, as an uncontended caller would.
        wait: Duration::ZERO,
    };
    w1_locker(&library, workload, pairs).await
}

/// W1 on the in-process backend: what the library's own logic costs per
/// pair, with no network in the way.
pub(crate) async fn w1_in_process() -> Result<Report, Error> {
    let locks = LockClient::in_memory();
    let pairs = SEQUENTIAL_PAIRS * 10;
    let start = Instant::now();
    for _ in 0..pairs {
        locks.lock("w1m").acquire().await?.release().await?;
    }
    let elapsed = start.elapsed();
    Ok(Report {
        workload: "W1m in-process acquire+release",
        ops: pairs,
        elapsed,
        extra: vec![("ns_per_pair", elapsed.as_nanos() as f64 / pairs as f64)],
        ..Report::default()
    })
}
