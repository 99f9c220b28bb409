//! W1: one task, one key, acquire+release pairs one after another.

use super::*;

/// W1: one task, one key, sequential acquire + release through the library,
/// in rounds interleaved with the floor's pairs (W0's shape) on a
/// connection of its own, so that the ratio compares the two under the
/// same conditions; reports the median of the rounds' p50 ratios.
pub(crate) async fn w1_uncontended(url: &str) -> Result<Report, Error> {
    const ROUNDS: usize = 5;
    let locks = LockClient::connect(url).await?;
    let mut conn = raw_connection(url).await?;
    let release = redis::Script::new(COMPARE_AND_DELETE);
    let per_round = SEQUENTIAL_PAIRS / ROUNDS;
    let mut library = Report {
        workload: "W1 uncontended acquire+release",
        ..Report::default()
    };
    let mut ratios = Vec::with_capacity(ROUNDS);
    for round in 0..ROUNDS {
        let mut floor = Vec::with_capacity(per_round);
        for i in 0..per_round {
            let t = Instant::now();
            floor_pair(&mut conn, &release, "w1:floor", &format!("floor:{round}:{i}")).await?;
            floor.push(t.elapsed());
        }
        let ours = w1_on(&locks, "W1", per_round).await?;
        ratios.push(ours.p50() / percentile_us(&floor, 0.5));
        library.ops += ours.ops;
        library.elapsed += ours.elapsed;
        library.latencies.extend(ours.latencies);
    }
    ratios.sort_by(f64::total_cmp);
    library
        .extra
        .push(("median_round_p50_ratio_to_floor", ratios[ROUNDS / 2]));
    Ok(library)
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
