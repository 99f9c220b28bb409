//! WS under load (#57): leases held and renewed while other work floods
//! the same client, and how many leases one core keeps renewed.
//!
//! - WSF: 100,000 leases (ttl 3 s) held for `FLOOD_HOLD` while 100,000
//!   other tasks each take and release a key of their own as fast as the
//!   client lets them. Every held lease must still be held at the end; the
//!   renewal lag (from when a lease's renewal fell due to the server's
//!   confirmation) is read from the library's own metric.
//! - WSG, WSM: the same on PostgreSQL and MariaDB, at a database's
//!   scale: 2,000 held leases (ttl 3 s) under 1,000 flooding tasks, on a
//!   server the bench starts, with the client's default pool.
//! - WSB: 10,000 leases (ttl 3 s) held for `BUSY_HOLD` while the
//!   caller's runtime is kept busy: `BUSY_TASKS` tasks that each compute
//!   for `BUSY_SLICE` between yields (a service doing blocking work on its
//!   runtime). Renewals must not wait for their turn behind them.
//! - WSC: 1,000,000 leases (ttl 30 s) taken and held through three
//!   renewal rounds: the client's CPU per second of holding them, so the
//!   leases one core keeps renewed, and the memory per lease.

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

use super::*;

const FLOOD_HELD: usize = 100_000;
const FLOOD_TASKS: usize = 100_000;
const FLOOD_TTL: Duration = Duration::from_secs(3);
const FLOOD_HOLD: Duration = Duration::from_secs(15);
const BUSY_HELD: usize = 10_000;
const BUSY_TASKS: usize = 8;
const BUSY_SLICE: Duration = Duration::from_millis(100);
const BUSY_HOLD: Duration = Duration::from_secs(10);
const CAPACITY_HELD: usize = 1_000_000;
const CAPACITY_TTL: Duration = Duration::from_secs(30);
const CAPACITY_HOLD: Duration = Duration::from_secs(30);
/// The library's histogram of renewal lags (README, "Observability").
const LAG: &str = "distributed_lock_renewal_lag_seconds";

/// The renewal lags the library reports, when this bench could install
/// its recorder (not with `--recorder`, which installs Prometheus's).
pub(crate) struct Lags(Option<Snapshotter>);

impl Lags {
    pub(crate) fn install() -> Lags {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        Lags(recorder.install().ok().map(|()| snapshotter))
    }

    /// The lags recorded since the last call, in seconds, sorted.
    fn take(&self) -> Vec<f64> {
        let Some(snapshotter) = &self.0 else {
            return Vec::new();
        };
        let mut lags: Vec<f64> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| key.key().name() == LAG)
            .flat_map(|(.., value)| match value {
                DebugValue::Histogram(values) => values.into_iter().map(|v| v.into_inner()).collect(),
                _ => Vec::new(),
            })
            .collect();
        lags.sort_by(f64::total_cmp);
        lags
    }
}

/// The figures of a run's renewal lags: how many batches, and their p50,
/// p99 and max in milliseconds.
fn lag_figures(lags: &[f64]) -> [(&'static str, f64); 4] {
    [
        ("renewal_batches", lags.len() as f64),
        ("renewal_lag_p50_ms", quantile_ms(lags, 0.50)),
        ("renewal_lag_p99_ms", quantile_ms(lags, 0.99)),
        ("renewal_lag_max_ms", quantile_ms(lags, 1.0)),
    ]
}

/// `p` of sorted `values`, in milliseconds; NaN for none.
fn quantile_ms(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let at = ((values.len() - 1) as f64 * p).round() as usize;
    values[at] * 1e3
}

/// Takes `count` leases of `ttl` named `prefix:<i>`, a thousand at a time
/// (all at once would measure their futures, not what a held lease keeps).
async fn hold(
    locks: &LockClient,
    prefix: &str,
    count: usize,
    ttl: Duration,
) -> Result<Vec<lock_runtime::LockGuard>, Error> {
    let mut guards = Vec::with_capacity(count);
    for start in (0..count).step_by(1_000) {
        let acquires = (start..(start + 1_000).min(count))
            .map(|i| locks.lock(format!("{prefix}:{i}")).ttl(ttl).acquire());
        for guard in futures_util::future::join_all(acquires).await {
            guards.push(guard?);
        }
    }
    Ok(guards)
}

/// Releases `guards`; counts those whose lease had been lost and those
/// whose release failed (no answer within the command timeout, say):
/// figures of the workload, not reasons to stop the bench (WSM stopped at
/// a release with no answer, its figures unprinted).
async fn release_counting_lost(guards: Vec<lock_runtime::LockGuard>) -> (usize, usize) {
    let (mut lost, mut failed) = (0, 0);
    let mut guards = guards.into_iter();
    loop {
        let chunk: Vec<_> = guards.by_ref().take(10_000).collect();
        if chunk.is_empty() {
            break;
        }
        for result in futures_util::future::join_all(chunk.into_iter().map(|g| g.release())).await {
            match result {
                Ok(()) => {}
                Err(lock_runtime::LockError::NotHeld { .. }) => lost += 1,
                Err(_) => failed += 1,
            }
        }
    }
    (lost, failed)
}

/// WSF: held leases renewed under an acquisition flood.
pub(crate) async fn ws_flood(url: &str, lags: &Lags) -> Result<Report, Error> {
    let locks = LockClient::connect(url).await?;
    flood_on(
        &locks,
        (FLOOD_HELD, FLOOD_TASKS),
        "WSF 100k leases held under 100k tasks taking and releasing",
        lags,
    )
    .await
}

/// Held leases and flooding tasks on the servers the bench starts (the
/// databases, ZooKeeper, etcd): WSF's shape, scaled to one such server.
const SMALL_FLOOD: (usize, usize) = (2_000, 1_000);

/// WSG: WSF's shape on a PostgreSQL the bench starts.
pub(crate) async fn ws_flood_postgres(lags: &Lags) -> Result<Report, Error> {
    let server = tokio::task::block_in_place(lock_tests::Postgres::start);
    // Dropped before `server`, in reverse order of declaration.
    let locks = LockClient::postgres(&server.url()).await?;
    let workload = "WSG PostgreSQL 2k leases held under 1k tasks taking and releasing";
    flood_on(&locks, SMALL_FLOOD, workload, lags).await
}

/// WSM: WSF's shape on a MariaDB the bench starts.
pub(crate) async fn ws_flood_mysql(lags: &Lags) -> Result<Report, Error> {
    let server = tokio::task::block_in_place(lock_tests::MariaDb::start);
    // Dropped before `server`, in reverse order of declaration.
    let locks = LockClient::mysql(&server.url()).await?;
    let workload = "WSM MariaDB 2k leases held under 1k tasks taking and releasing";
    flood_on(&locks, SMALL_FLOOD, workload, lags).await
}

/// WSZ: WSF's shape on a ZooKeeper the bench starts.
pub(crate) async fn ws_flood_zookeeper(lags: &Lags) -> Result<Report, Error> {
    let server = tokio::task::block_in_place(lock_tests::ZooKeeper::start);
    // Dropped before `server`, in reverse order of declaration.
    let locks = LockClient::zookeeper(&server.connect_string()).await?;
    let workload = "WSZ ZooKeeper 2k leases held under 1k tasks taking and releasing";
    flood_on(&locks, SMALL_FLOOD, workload, lags).await
}

/// WSE: WSF's shape on an etcd the bench starts.
pub(crate) async fn ws_flood_etcd(lags: &Lags) -> Result<Report, Error> {
    let server = tokio::task::block_in_place(lock_tests::Etcd::start);
    // Dropped before `server`, in reverse order of declaration.
    let endpoints = server.endpoints();
    let endpoints: Vec<&str> = endpoints.iter().map(String::as_str).collect();
    let locks = LockClient::etcd(&endpoints).await?;
    let workload = "WSE etcd 2k leases held under 1k tasks taking and releasing";
    flood_on(&locks, SMALL_FLOOD, workload, lags).await
}

/// `held` leases (ttl 3 s) held for `FLOOD_HOLD` while `tasks` other tasks
/// each take and release a key of their own in a loop.
async fn flood_on(
    locks: &LockClient,
    (held, tasks): (usize, usize),
    workload: &'static str,
    lags: &Lags,
) -> Result<Report, Error> {
    let guards = hold(locks, "wsf-held", held, FLOOD_TTL).await?;
    lags.take();
    let stop = Arc::new(AtomicBool::new(false));
    let pairs = Arc::new(AtomicUsize::new(0));
    // A flood lease lost before its release: renewed (or released) too late.
    let flood_lost = Arc::new(AtomicUsize::new(0));
    // An acquisition that failed: with this many in flight, a reply can
    // take longer than the command timeout. Counted; the task goes on.
    let flood_errors = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let flood: Vec<_> = (0..tasks)
        .map(|task| {
            let (locks, stop, pairs, flood_lost, flood_errors) = (
                locks.clone(),
                Arc::clone(&stop),
                Arc::clone(&pairs),
                Arc::clone(&flood_lost),
                Arc::clone(&flood_errors),
            );
            tokio::spawn(async move {
                let key = format!("wsf-flood:{task}");
                while !stop.load(Ordering::Relaxed) {
                    let guard = match locks.lock(key.as_str()).ttl(FLOOD_TTL).acquire().await {
                        Ok(guard) => guard,
                        Err(_) => {
                            flood_errors.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                    };
                    match guard.release().await {
                        Ok(()) => {}
                        Err(lock_runtime::LockError::NotHeld { .. }) => {
                            flood_lost.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => {
                            flood_errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    pairs.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<_, Error>(())
            })
        })
        .collect();
    tokio::time::sleep(FLOOD_HOLD).await;
    let still_held = guards.iter().filter(|g| g.is_held()).count();
    let flood_pairs = pairs.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    for task in flood {
        task.await??;
    }
    let lags = lags.take();
    let (lost_by_release, release_errors) = release_counting_lost(guards).await;
    Ok(Report {
        workload,
        ops: held,
        elapsed: started.elapsed(),
        extra: vec![
            ("flood_pairs_per_s", flood_pairs as f64 / FLOOD_HOLD.as_secs_f64()),
            ("still_held", still_held as f64),
            ("lost_by_release", lost_by_release as f64),
            ("release_errors", release_errors as f64),
            ("flood_lost", flood_lost.load(Ordering::Relaxed) as f64),
            ("flood_errors", flood_errors.load(Ordering::Relaxed) as f64),
            ("renewal_lag_bound_ms", FLOOD_TTL.as_secs_f64() * 1e3 / 6.0),
        ]
        .into_iter()
        .chain(lag_figures(&lags))
        .collect(),
        ..Report::default()
    })
}

/// WSB: held leases renewed while the caller's runtime computes.
pub(crate) async fn ws_busy_runtime(url: &str, lags: &Lags) -> Result<Report, Error> {
    let locks = LockClient::connect(url).await?;
    let guards = hold(&locks, "wsb", BUSY_HELD, FLOOD_TTL).await?;
    lags.take();
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let busy: Vec<_> = (0..BUSY_TASKS)
        .map(|_| {
            let stop = Arc::clone(&stop);
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let slice = Instant::now();
                    while slice.elapsed() < BUSY_SLICE {
                        std::hint::spin_loop();
                    }
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    tokio::time::sleep(BUSY_HOLD).await;
    stop.store(true, Ordering::Relaxed);
    for task in busy {
        task.await?;
    }
    let still_held = guards.iter().filter(|g| g.is_held()).count();
    let lags = lags.take();
    let (lost_by_release, release_errors) = release_counting_lost(guards).await;
    Ok(Report {
        workload: "WSB 10k leases held while 8 tasks compute 100 ms between yields",
        ops: BUSY_HELD,
        elapsed: started.elapsed(),
        extra: vec![
            ("still_held", still_held as f64),
            ("lost_by_release", lost_by_release as f64),
            ("release_errors", release_errors as f64),
        ]
        .into_iter()
        .chain(lag_figures(&lags))
        .collect(),
        ..Report::default()
    })
}

/// How many `PEXPIRE`s the server has run, in scripts or not.
async fn expires(conn: &mut MultiplexedConnection) -> Result<u64, Error> {
    let stats = w1_accounting::command_stats(conn).await?;
    Ok(stats.get("pexpire").map_or(0, |&(calls, _)| calls))
}

/// WSC: a million leases of ttl 30 s held through three renewal rounds.
pub(crate) async fn ws_capacity(url: &str, lags: &Lags) -> Result<Report, Error> {
    let locks = LockClient::connect(url).await?;
    let resident_before = resident_bytes();
    let acquired = Instant::now();
    let guards = hold(&locks, "wsc", CAPACITY_HELD, CAPACITY_TTL).await?;
    let acquire_time = acquired.elapsed();
    let resident_held = resident_bytes();
    lags.take();
    // While the leases are only held, the server runs nothing but their
    // renewals, and each renewal one `PEXPIRE` (two only when its lease is
    // already longer, which a watchdog's renewal never finds).
    let mut server = floor::raw_connection(url).await?;
    let (server_before, expires_before) =
        (floor::server_cpu(&mut server).await?, expires(&mut server).await?);
    let cpu_before = cpu_time();
    tokio::time::sleep(CAPACITY_HOLD).await;
    let cpu = cpu_time() - cpu_before;
    let server_cpu = floor::server_cpu(&mut server).await? - server_before;
    let renewals = expires(&mut server).await? - expires_before;
    let still_held = guards.iter().filter(|g| g.is_held()).count();
    let lags = lags.take();
    let (lost_by_release, release_errors) = release_counting_lost(guards).await;
    let cores_used = cpu.as_secs_f64() / CAPACITY_HOLD.as_secs_f64();
    Ok(Report {
        workload: "WSC 1M leases of ttl 30s held for 30s",
        ops: CAPACITY_HELD,
        elapsed: CAPACITY_HOLD,
        extra: vec![
            ("acquire_all_s", acquire_time.as_secs_f64()),
            ("client_cpu_ms_per_s", cores_used * 1e3),
            ("leases_per_core", CAPACITY_HELD as f64 / cores_used),
            (
                "client_bytes_per_held_lock",
                (resident_held - resident_before) / CAPACITY_HELD as f64,
            ),
            ("renewals", renewals as f64),
            (
                "server_us_per_renewal",
                server_cpu.as_secs_f64() * 1e6 / renewals.max(1) as f64,
            ),
            ("still_held", still_held as f64),
            ("lost_by_release", lost_by_release as f64),
            ("release_errors", release_errors as f64),
        ]
        .into_iter()
        .chain(lag_figures(&lags))
        .collect(),
        ..Report::default()
    })
}
