//! WK: what a kind of lock costs against the exclusive lock, on the same
//! server in the same run. W1 (one task, one key, sequential pairs) for
//! each kind, and W3's shape (16 tasks, one key, a GET round trip in each
//! body) with readers, permits and the exclusive lock.

use super::*;

use lock_runtime::LockMode;

/// A kind of lock, as a request is configured for it.
#[derive(Clone, Copy)]
enum Kind {
    Exclusive,
    Read,
    Write,
    Permits(u32),
    Segments(u32),
}

impl Kind {
    fn configure(self, request: lock_runtime::LockRequest<'_>) -> lock_runtime::LockRequest<'_> {
        match self {
            Kind::Exclusive => request,
            Kind::Read => request.mode(LockMode::Read),
            Kind::Write => request.mode(LockMode::Write),
            Kind::Permits(n) => request.permits(n),
            Kind::Segments(n) => request.segments(n),
        }
    }
}

const W1_KINDS: [(&str, Kind); 5] = [
    ("WK W1 exclusive", Kind::Exclusive),
    ("WK W1 read lock", Kind::Read),
    ("WK W1 write lock", Kind::Write),
    ("WK W1 permit of 4", Kind::Permits(4)),
    ("WK W1 segment of 5", Kind::Segments(5)),
];

const W3_KINDS: [(&str, Kind); 3] = [
    ("WK W3 16 tasks, exclusive", Kind::Exclusive),
    ("WK W3 16 tasks, readers", Kind::Read),
    ("WK W3 16 tasks, 16 permits", Kind::Permits(16)),
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
            kind.configure(locks.lock("wk1"))
                .acquire()
                .await?
                .release()
                .await?;
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
                        let guard = kind
                            .configure(locks.lock("wk3"))
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
    Ok(reports)
}
