//! W2: 64 tasks, each on its own key, against two floors in rotating
//! rounds: the hand-written pair on a bare multiplexed connection, and the
//! same pair on a `redis::aio::ConnectionManager`, which reconnects after a
//! lost connection as the library's does (and as a hand-written lock kept
//! in service would need to). Their difference is what reconnection costs
//! per command; their spread from run to run is how far this machine
//! moves a ratio that no code changed (docs/benchmarks.md).

use redis::aio::{ConnectionLike, ConnectionManager};

use super::*;

/// Runs `pair` on `W2_TASKS` tasks, each with its own key, until either
/// bound is reached; returns (pairs, elapsed, latencies).
pub(crate) async fn independent_keys<F, Fut>(pair: F) -> Result<(usize, Duration, Vec<Duration>), Error>
where
    F: Fn(usize, usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<(), Error>> + Send,
{
    let done = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let tasks: Vec<_> = (0..W2_TASKS)
        .map(|task| {
            let (pair, done, stop) = (pair.clone(), Arc::clone(&done), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    pair(task, i).await?;
                    latencies.push(t.elapsed());
                    i += 1;
                    if done.fetch_add(1, Ordering::Relaxed) + 1 >= W2_MAX_PAIRS / W2_ROUNDS
                        || start.elapsed() >= W2_MAX_TIME / W2_ROUNDS as u32
                    {
                        stop.store(true, Ordering::Relaxed);
                    }
                }
                Ok::<_, Error>(latencies)
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await??);
    }
    Ok((done.load(Ordering::Relaxed), start.elapsed(), latencies))
}

/// One side's figures summed over its rounds, with what it cost the
/// server and this process.
struct Side {
    report: Report,
    server: Duration,
    client: Duration,
}

impl Side {
    fn new(workload: &'static str) -> Self {
        Side {
            report: Report {
                workload,
                ..Report::default()
            },
            server: Duration::ZERO,
            client: Duration::ZERO,
        }
    }

    /// Runs one round of `pair` on this side; returns its pairs per second.
    async fn round<F, Fut>(&mut self, stats: &mut MultiplexedConnection, pair: F) -> Result<f64, Error>
    where
        F: Fn(usize, usize) -> Fut + Clone + Send + 'static,
        Fut: std::future::Future<Output = Result<(), Error>> + Send,
    {
        let (server_before, client_before) = (server_cpu(stats).await?, cpu_time());
        let (ops, elapsed, latencies) = independent_keys(pair).await?;
        // What each side costs the server: Redis is one core, and its CPU
        // time per pair is the ceiling on how many pairs it can serve. And
        // what each costs the client (this process, every thread).
        self.client += cpu_time() - client_before;
        self.server += server_cpu(stats).await? - server_before;
        self.report.ops += ops;
        self.report.elapsed += elapsed;
        self.report.latencies.extend(latencies);
        Ok(ops as f64 / elapsed.as_secs_f64())
    }

    fn finish(mut self) -> Report {
        let per_pair = |cpu: Duration| cpu.as_secs_f64() * 1e6 / self.report.ops as f64;
        let extra = [
            ("server_cpu_us_per_pair", per_pair(self.server)),
            ("client_cpu_us_per_pair", per_pair(self.client)),
        ];
        self.report.extra.extend(extra);
        self.report
    }

    /// One round of the floor's pairs on `conn`, each pair with a holder of
    /// its own.
    async fn floor_round<C>(
        &mut self,
        stats: &mut MultiplexedConnection,
        conn: &C,
        release: &Arc<redis::Script>,
        tag: &'static str,
        round: usize,
    ) -> Result<f64, Error>
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        let (conn, release) = (conn.clone(), Arc::clone(release));
        self.round(stats, move |task, i| {
            let (mut conn, release) = (conn.clone(), Arc::clone(&release));
            async move {
                floor_pair(
                    &mut conn,
                    &release,
                    &format!("w2{tag}:{task}"),
                    &format!("floor:{round}:{task}:{i}"),
                )
                .await
            }
        })
        .await
    }
}

/// W2 and its two floors, in rotating rounds. Returns (floor, floor on
/// a connection manager, library); the library's report carries the median
/// of the per-round throughput ratios against each.
pub(crate) async fn w2_independent_keys(url: &str) -> Result<(Report, Report, Report), Error> {
    let bare = raw_connection(url).await?;
    let managed = ConnectionManager::new(redis::Client::open(url)?).await?;
    let release = Arc::new(redis::Script::new(COMPARE_AND_DELETE));
    let locks = LockClient::connect(url).await?;
    let mut floor = Side::new("W2 floor, 64 tasks x own key");
    let mut managed_floor = Side::new("W2 floor on a ConnectionManager, 64 tasks x own key");
    let mut library = Side::new("W2 64 tasks x own key");
    let (mut to_floor, mut to_managed) = (Vec::new(), Vec::new());
    let mut stats = raw_connection(url).await?;
    for round in 0..W2_ROUNDS {
        // Over the three rounds each side runs first, second and third once.
        let mut pairs_per_s = [0.0; 3];
        for side in turn_order::<3>(round) {
            pairs_per_s[side] = match side {
                0 => floor.floor_round(&mut stats, &bare, &release, "f", round).await?,
                1 => {
                    managed_floor
                        .floor_round(&mut stats, &managed, &release, "m", round)
                        .await?
                }
                _ => {
                    let locks = locks.clone();
                    library
                        .round(&mut stats, move |task, _| {
                            let locks = locks.clone();
                            async move {
                                locks
                                    .lock(format!("w2:{task}"))
                                    .acquire()
                                    .await?
                                    .release()
                                    .await?;
                                Ok(())
                            }
                        })
                        .await?
                }
            };
        }
        let [f, m, l] = pairs_per_s;
        to_floor.push(l / f);
        to_managed.push(l / m);
    }
    let mut library = library.finish();
    library.extra.extend([
        ("median_round_ratio_to_floor", median(to_floor)),
        ("median_round_ratio_to_managed_floor", median(to_managed)),
    ]);
    Ok((floor.finish(), managed_floor.finish(), library))
}
