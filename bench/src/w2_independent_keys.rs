//! W2: 64 tasks, each on its own key, against the floor in alternating
//! rounds.

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

/// W2 and its floor, in alternating rounds. Returns (floor, library); the
/// library's report carries the median of the per-round throughput ratios.
pub(crate) async fn w2_independent_keys(url: &str) -> Result<(Report, Report), Error> {
    let conn = raw_connection(url).await?;
    let release = Arc::new(redis::Script::new(COMPARE_AND_DELETE));
    let locks = LockClient::connect(url).await?;
    let mut floor = Report {
        workload: "W2 floor, 64 tasks x own key",
        ..Report::default()
    };
    let mut library = Report {
        workload: "W2 64 tasks x own key",
        ..Report::default()
    };
    let mut ratios = Vec::new();
    // What each side costs the server: Redis is one core, and its CPU time
    // per pair is the ceiling on how many pairs it can serve.
    let (mut f_cpu, mut l_cpu) = (Duration::ZERO, Duration::ZERO);
    // And what each costs the client (this process, every thread).
    let (mut f_client, mut l_client) = (Duration::ZERO, Duration::ZERO);
    let mut stats = conn.clone();
    for round in 0..W2_ROUNDS {
        let (conn, release) = (conn.clone(), Arc::clone(&release));
        let cpu_before = server_cpu(&mut stats).await?;
        let client_before = cpu_time();
        let (f_ops, f_elapsed, f_latencies) = independent_keys(move |task, i| {
            let (mut conn, release) = (conn.clone(), Arc::clone(&release));
            async move {
                floor_pair(
                    &mut conn,
                    &release,
                    &format!("w2f:{task}"),
                    &format!("floor:{round}:{task}:{i}"),
                )
                .await
            }
        })
        .await?;
        let cpu_between = server_cpu(&mut stats).await?;
        let client_between = cpu_time();
        f_client += client_between - client_before;
        f_cpu += cpu_between - cpu_before;
        let locks = locks.clone();
        let (l_ops, l_elapsed, l_latencies) = independent_keys(move |task, _| {
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
        .await?;
        l_cpu += server_cpu(&mut stats).await? - cpu_between;
        l_client += cpu_time() - client_between;
        ratios.push((l_ops as f64 / l_elapsed.as_secs_f64()) / (f_ops as f64 / f_elapsed.as_secs_f64()));
        for (report, ops, elapsed, latencies) in [
            (&mut floor, f_ops, f_elapsed, f_latencies),
            (&mut library, l_ops, l_elapsed, l_latencies),
        ] {
            report.ops += ops;
            report.elapsed += elapsed;
            report.latencies.extend(latencies);
        }
    }
    ratios.sort_by(f64::total_cmp);
    for (report, server, client) in [(&mut floor, f_cpu, f_client), (&mut library, l_cpu, l_client)] {
        let per_pair = |cpu: Duration| cpu.as_secs_f64() * 1e6 / report.ops as f64;
        let extra = [
            ("server_cpu_us_per_pair", per_pair(server)),
            ("client_cpu_us_per_pair", per_pair(client)),
        ];
        report.extra.extend(extra);
    }
    library
        .extra
        .push(("median_round_ratio_to_floor", ratios[ratios.len() / 2]));
    Ok((floor, library))
}
