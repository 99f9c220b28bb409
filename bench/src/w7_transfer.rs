//! W7: a two-account transfer. `lock_all` (one script for both keys)
//! against the same two exclusive locks taken by hand, one after the other
//! in sorted order, on the same server in the same run: one task in
//! sequence (latency), and 8 tasks over 10 accounts (throughput).

use super::*;

const ACCOUNTS: usize = 10;
const TASKS: usize = 8;
const TRANSFERS_PER_TASK: usize = 250;

/// Both ways of locking two accounts, each as W1 and as a contended run.
pub(crate) async fn w7_transfer(url: &str) -> Result<Vec<Report>, Error> {
    let locks = LockClient::connect(url).await?;
    let mut reports = Vec::new();
    for by_hand in [false, true] {
        let mut latencies = Vec::with_capacity(SEQUENTIAL_PAIRS);
        let start = Instant::now();
        for i in 0..SEQUENTIAL_PAIRS {
            let (from, to) = (i % ACCOUNTS, (i + 1) % ACCOUNTS);
            let t = Instant::now();
            transfer(&locks, from, to, by_hand).await?;
            latencies.push(t.elapsed());
        }
        reports.push(Report {
            workload: if by_hand {
                "W7 one task: two locks by hand, sorted"
            } else {
                "W7 one task: lock_all of two keys"
            },
            ops: SEQUENTIAL_PAIRS,
            elapsed: start.elapsed(),
            latencies,
            ..Report::default()
        });
        let start = Instant::now();
        let tasks: Vec<_> = (0..TASKS)
            .map(|task| {
                let locks = locks.clone();
                tokio::spawn(async move {
                    let mut latencies = Vec::with_capacity(TRANSFERS_PER_TASK);
                    for i in 0..TRANSFERS_PER_TASK {
                        // Every pair, in both directions, spread over tasks.
                        let from = (task * 7 + i * 3) % ACCOUNTS;
                        let to = (from + 1 + (i * 5 + task) % (ACCOUNTS - 1)) % ACCOUNTS;
                        let t = Instant::now();
                        transfer(&locks, from, to, by_hand).await?;
                        latencies.push(t.elapsed());
                    }
                    Ok::<_, Error>(latencies)
                })
            })
            .collect();
        let mut latencies = Vec::new();
        for task in tasks {
            latencies.extend(task.await??);
        }
        reports.push(Report {
            workload: if by_hand {
                "W7 8 tasks, 10 accounts: two locks by hand, sorted"
            } else {
                "W7 8 tasks, 10 accounts: lock_all of two keys"
            },
            ops: TASKS * TRANSFERS_PER_TASK,
            elapsed: start.elapsed(),
            latencies,
            ..Report::default()
        });
    }
    Ok(reports)
}

/// Locks accounts `from` and `to` and releases them: with `lock_all`, or
/// (`by_hand`) with two guards taken in sorted order and released together.
async fn transfer(locks: &LockClient, from: usize, to: usize, by_hand: bool) -> Result<(), Error> {
    let (a, b) = (format!("acct:{}", from.min(to)), format!("acct:{}", from.max(to)));
    let wait = Duration::from_secs(30);
    if by_hand {
        let first = locks.lock(a).wait(wait).acquire().await?;
        let second = locks.lock(b).wait(wait).acquire().await?;
        let (x, y) = tokio::join!(second.release(), first.release());
        x?;
        y?;
    } else {
        locks
            .lock_all([a, b])
            .wait(wait)
            .acquire()
            .await?
            .release()
            .await?;
    }
    Ok(())
}
