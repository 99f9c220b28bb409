//! W1: one task, one key, acquire+release pairs one after another.

use super::*;

/// W1: one task, one key, sequential acquire + release through the library,
/// in rounds interleaved with the floor's pairs (W0's shape) on a
/// connection of its own, so that the ratios compare the two under the
/// same conditions: the median of the rounds' p50 ratios and of their p99
/// ratios (one stall on this shared VM moves a whole run's p99, and the
/// median of rounds leaves out the one round it fell in), and the p99 of
/// all the library's pairs against the p99 of all the floor's. The rounds
/// alternate which side goes first ([`turn_order`]).
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
    let mut floor_latencies = Vec::with_capacity(SEQUENTIAL_PAIRS);
    let (mut ratios, mut p99_ratios) = (Vec::with_capacity(ROUNDS), Vec::with_capacity(ROUNDS));
    for round in 0..ROUNDS {
        let (mut floor, mut ours) = (Vec::new(), Report::default());
        for side in turn_order::<2>(round) {
            if side == 0 {
                let prefix = format!("floor:{round}:");
                floor = timed_floor_pairs(&mut conn, &release, "w1:floor", &prefix, per_round).await?;
            } else {
                ours = w1_on(&locks, "W1", per_round).await?;
            }
        }
        ratios.push(ours.p50() / percentile_us(&floor, 0.5));
        p99_ratios.push(ours.percentile_us(0.99) / percentile_us(&floor, 0.99));
        library.ops += ours.ops;
        library.elapsed += ours.elapsed;
        library.latencies.extend(ours.latencies);
        floor_latencies.extend(floor);
    }
    let floor_p99 = percentile_us(&floor_latencies, 0.99);
    let p99_ratio = library.percentile_us(0.99) / floor_p99;
    library.extra.extend([
        ("median_round_p50_ratio_to_floor", median(ratios)),
        ("median_round_p99_ratio_to_floor", median(p99_ratios)),
        ("interleaved_floor_p99_us", floor_p99),
        ("p99_ratio_to_interleaved_floor", p99_ratio),
    ]);
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
