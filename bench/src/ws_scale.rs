//! WS: scale. 10,000 tasks each locking its own key; 100,000 locks held at
//! once and renewed. What they cost the client in memory and CPU, and the
//! server in round trips.

use super::*;

const WS_TASKS: usize = 10_000;
const WS_RUN: Duration = Duration::from_secs(5);
const WS_HELD: usize = 100_000;
const WS_TTL: Duration = Duration::from_secs(3);
const WS_HOLD: Duration = Duration::from_secs(10);

/// The process's resident memory (`/proc/self/statm`), in bytes.
pub(crate) fn resident_bytes() -> f64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<f64>().ok())
        .map_or(f64::NAN, |pages| pages * 4096.0)
}

/// 10,000 tasks, each acquiring and releasing its own key in a loop for
/// `WS_RUN`: pairs/s, latency, and the client's memory per task.
pub(crate) async fn ws_many_tasks(url: &str) -> Result<Report, Error> {
    let locks = LockClient::connect(url).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let resident_before = resident_bytes();
    let start = Instant::now();
    let tasks: Vec<_> = (0..WS_TASKS)
        .map(|task| {
            let (locks, stop) = (locks.clone(), Arc::clone(&stop));
            tokio::spawn(async move {
                let key = format!("ws:{task}");
                let mut latencies = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    locks.lock(key.as_str()).acquire().await?.release().await?;
                    latencies.push(t.elapsed());
                }
                Ok::<_, Error>(latencies)
            })
        })
        .collect();
    tokio::time::sleep(WS_RUN).await;
    let resident_running = resident_bytes();
    stop.store(true, Ordering::Relaxed);
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await??);
    }
    let elapsed = start.elapsed();
    Ok(Report {
        workload: "WS 10k tasks x own key",
        ops: latencies.len(),
        elapsed,
        latencies,
        extra: vec![(
            "client_bytes_per_task",
            (resident_running - resident_before) / WS_TASKS as f64,
        )],
    })
}

/// 100,000 locks held (ttl 3 s) for 10 s: renewal round trips and client
/// CPU per second, and the client's memory per held lock.
pub(crate) async fn ws_held(url: &str, server: Option<&RedisServer>) -> Result<Report, Error> {
    let locks = LockClient::connect(url).await?;
    let resident_before = resident_bytes();
    let acquired = Instant::now();
    // In chunks: 100,000 acquisitions in flight at once would measure their
    // futures, not what a held lock keeps.
    let mut guards = Vec::with_capacity(WS_HELD);
    for chunk in (0..WS_HELD).collect::<Vec<_>>().chunks(1_000) {
        let acquires = chunk
            .iter()
            .map(|i| locks.lock(format!("wsh:{i}")).ttl(WS_TTL).acquire());
        for guard in futures_util::future::join_all(acquires).await {
            guards.push(guard?);
        }
    }
    let acquire_time = acquired.elapsed();
    let resident_held = resident_bytes();
    let before = server.map(RedisServer::command_calls);
    let cpu_before = cpu_time();
    tokio::time::sleep(WS_HOLD).await;
    let cpu = cpu_time() - cpu_before;
    let after = server.map(RedisServer::command_calls);
    let still_held = guards.iter().filter(|g| g.is_held()).count();
    let round_trips = before.zip(after).map_or(f64::NAN, |(b, a)| {
        commands_between(&b, &a).get("evalsha").copied().unwrap_or(0) as f64
    });
    let released = Instant::now();
    // A lease the watchdog could not renew in time is a figure of this
    // workload (how many were lost), not a reason to stop the bench.
    let mut lost_by_release = 0usize;
    for result in futures_util::future::join_all(guards.into_iter().map(|g| g.release())).await {
        match result {
            Ok(()) => {}
            Err(lock_runtime::LockError::NotHeld { .. }) => lost_by_release += 1,
            Err(e) => return Err(e.into()),
        }
    }
    let release_time = released.elapsed();
    Ok(Report {
        workload: "WS 100k leases held, renewing for 10s",
        ops: WS_HELD,
        elapsed: WS_HOLD,
        extra: vec![
            ("renewal_round_trips_per_s", round_trips / WS_HOLD.as_secs_f64()),
            (
                "client_cpu_ms_per_s",
                cpu.as_secs_f64() * 1e3 / WS_HOLD.as_secs_f64(),
            ),
            (
                "client_bytes_per_held_lock",
                (resident_held - resident_before) / WS_HELD as f64,
            ),
            ("acquire_all_s", acquire_time.as_secs_f64()),
            ("release_all_s", release_time.as_secs_f64()),
            ("still_held", still_held as f64),
            ("lost_by_release", lost_by_release as f64),
        ],
        ..Report::default()
    })
}
