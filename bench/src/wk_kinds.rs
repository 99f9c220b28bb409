//! WK: what a kind of lock costs against the exclusive lock, on the same
//! server in the same run. W1 (one task, one key, sequential pairs) for
//! each kind, and W3's shape (16 tasks, one key, a GET round trip in each
//! body) with readers, permits and the exclusive lock.

use super::*;

use lock_runtime::{LockMode, LockRequest};

/// How a request is configured for a kind of lock.
type Kind = fn(LockRequest<'_>) -> LockRequest<'_>;

const W1_KINDS: [(&str, Kind); 5] = [
    ("WK W1 exclusive", |request| request),
    ("WK W1 read lock", |request| request.mode(LockMode::Read)),
    ("WK W1 write lock", |request| request.mode(LockMode::Write)),
    ("WK W1 permit of 4", |request| request.permits(4)),
    ("WK W1 segment of 5", |request| request.segments(5)),
];

const W3_KINDS: [(&str, Kind); 3] = [
    ("WK W3 16 tasks, exclusive", |request| request),
    ("WK W3 16 tasks, readers", |request| request.mode(LockMode::Read)),
    ("WK W3 16 tasks, 16 permits", |request| request.permits(16)),
];

/// Every kind's W1 and W3, with its ratio to the exclusive lock's.
pub(crate) async fn wk_kinds(url: &str) -> Result<Vec<Report>, Error> {
    let locks = LockClient::connect(url).await?;
    let mut reports = Vec::new();
    let mut exclusive_p50 = None;
    for (workload, kind) in W1_KINDS {
        let mut latencies = Vec::with_capacity(SEQUENTIAL_PAIRS);
        let start = Instant::now();
        for _ in 0..SEQUENTIAL_PAIRS {
            let t = Instant::now();
            kind(locks.lock("wk1")).acquire().await?.release().await?;
            latencies.push(t.elapsed());
        }
        let mut report = Report {
            workload,
            ops: SEQUENTIAL_PAIRS,
            elapsed: start.elapsed(),
            latencies,
            ..Report::default()
        };
        let p50 = report.percentile_us(0.5);
        report
            .extra
            .push(("p50_ratio_to_exclusive", p50 / *exclusive_p50.get_or_insert(p50)));
        reports.push(report);
    }
    let mut exclusive_rate = None;
    for (workload, kind) in W3_KINDS {
        let data = raw_connection(url).await?;
        let start = Instant::now();
        let tasks: Vec<_> = (0..W3_TASKS)
            .map(|_| {
                let (locks, mut data) = (locks.clone(), data.clone());
                tokio::spawn(async move {
                    for _ in 0..W3_INCREMENTS {
                        let guard = kind(locks.lock("wk3"))
                            .wait(Duration::from_secs(30))
                            .acquire()
                            .await?;
                        let _: Option<u64> = data.get("wk3:value").await?;
                        guard.release().await?;
                    }
                    Ok::<_, Error>(())
                })
            })
            .collect();
        for task in tasks {
            task.await??;
        }
        let mut report = Report {
            workload,
            ops: W3_TASKS * W3_INCREMENTS,
            elapsed: start.elapsed(),
            ..Report::default()
        };
        let rate = report.per_second();
        report.extra.push((
            "throughput_ratio_to_exclusive",
            rate / *exclusive_rate.get_or_insert(rate),
        ));
        reports.push(report);
    }
    // Fair against unfair handoff: W3 itself, both ways, same server.
    let unfair = w3_with(
        locks.clone(),
        url,
        "WK W3 16 tasks, increments, unfair",
        |request| request,
    )
    .await?;
    let mut fair = w3_with(locks, url, "WK W3 16 tasks, increments, fair", |request| {
        request.fair(true)
    })
    .await?;
    fair.extra.push((
        "throughput_ratio_to_unfair",
        fair.per_second() / unfair.per_second(),
    ));
    reports.push(unfair);
    reports.push(fair);
    Ok(reports)
}
