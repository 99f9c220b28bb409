//! Measures the lock's hot paths against the physical floor: the same Redis
//! operations sent with the `redis` crate directly, in the same run. Release
//! mode only:
//!
//! ```sh
//! cargo run --release -p lock-bench                 # starts its own redis-server
//! cargo run --release -p lock-bench -- --pin        # redis on CPU 1, the bench on CPU 0
//! cargo run --release -p lock-bench -- --url redis://127.0.0.1:6379/
//! ```
//!
//! Prints one JSON line per workload as it finishes, then a markdown table
//! and each target as a ratio.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lock_runtime::LockClient;
use lock_tests::{RedisServer, commands_between};
use nix::sched::{CpuSet, sched_setaffinity};
use nix::unistd::Pid;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;

type Error = Box<dyn std::error::Error + Send + Sync>;

const SEQUENTIAL_PAIRS: usize = 20_000;
const W2_TASKS: usize = 64;
const W2_MAX_PAIRS: usize = 200_000;
const W2_MAX_TIME: Duration = Duration::from_secs(10);
/// W2 and its floor run in alternating rounds, each a third of the budget,
/// so that both see the same machine: on two shared cores, back-to-back
/// single runs differed by 20%.
const W2_ROUNDS: usize = 3;
const W3_TASKS: usize = 16;
const W3_INCREMENTS: usize = 125;
const W5_NESTED: usize = 1_000_000;
const W6_LOCKS: usize = 10_000;
const W6_TTL: Duration = Duration::from_secs(3);
const W6_HOLD: Duration = Duration::from_secs(10);

/// Owner-checked delete: the floor's release, as any Redis lock must do it.
const COMPARE_AND_DELETE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

#[derive(Default)]
struct Report {
    workload: &'static str,
    ops: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
    extra: Vec<(&'static str, f64)>,
}

impl Report {
    fn percentile_us(&self, p: f64) -> f64 {
        percentile_us(&self.latencies, p)
    }

    fn per_second(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }

    fn extra(&self, name: &str) -> f64 {
        self.extra
            .iter()
            .find(|(k, _)| *k == name)
            .map_or(f64::NAN, |(_, v)| *v)
    }

    fn json(&self) -> String {
        let mut fields = vec![
            format!("\"workload\":\"{}\"", self.workload),
            format!("\"ops\":{}", self.ops),
            format!("\"ops_per_s\":{:.0}", self.per_second()),
        ];
        if !self.latencies.is_empty() {
            fields.push(format!("\"p50_us\":{:.1}", self.percentile_us(0.50)));
            fields.push(format!("\"p99_us\":{:.1}", self.percentile_us(0.99)));
        }
        fields.extend(self.extra.iter().map(|(k, v)| format!("\"{k}\":{v:.2}")));
        format!("{{{}}}", fields.join(","))
    }
}

fn percentile_us(latencies: &[Duration], p: f64) -> f64 {
    if latencies.is_empty() {
        return f64::NAN;
    }
    let mut sorted = latencies.to_vec();
    sorted.sort_unstable();
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index].as_secs_f64() * 1e6
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    if let [_, flag, url, tasks, increments] = args.as_slice()
        && flag == "--w3-worker"
    {
        return w3_worker(url, tasks.parse()?, increments.parse()?).await;
    }
    let given_url = args
        .iter()
        .position(|a| a == "--url")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let pin = args.iter().any(|a| a == "--pin");
    let server = given_url.is_none().then(RedisServer::start);
    let url = given_url.unwrap_or_else(|| server.as_ref().map(RedisServer::url).unwrap_or_default());
    if pin {
        pin_cpus(server.as_ref())?;
    }

    // `--only W2` runs the workloads whose names start with W2 (profiling).
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let wanted = |name: &str| only.as_deref().is_none_or(|o| name.starts_with(o));
    let mut reports = Vec::new();
    macro_rules! run {
        ($name:literal, $workload:expr) => {{
            if wanted($name) {
                let report = $workload.await?;
                println!("{}", report.json());
                reports.push(report);
            }
        }};
    }
    run!("W0", w0_round_trip(&url));
    run!("W0", w0_pairs(&url));
    run!("W1", w1_uncontended(&url));
    run!("W1", w1_in_process());
    if wanted("W2") {
        let (w2_floor, w2) = w2_independent_keys(&url).await?;
        for report in [w2_floor, w2] {
            println!("{}", report.json());
            reports.push(report);
        }
    }
    run!("W3", w3_contended(&url));
    run!("W3", w3_processes(&url));
    if wanted("W4") {
        for report in w4_scale_out().await? {
            println!("{}", report.json());
            reports.push(report);
        }
    }
    run!("W5", w5_reentry(&url, server.as_ref()));
    run!("W6", w6_watchdog(&url, server.as_ref()));
    summarise(&reports);
    Ok(())
}

/// Redis on CPU 1, this process on CPU 0: no core shared between them.
fn pin_cpus(server: Option<&RedisServer>) -> Result<(), Error> {
    let on = |cpu: usize| -> Result<CpuSet, Error> {
        let mut set = CpuSet::new();
        set.set(cpu)?;
        Ok(set)
    };
    sched_setaffinity(Pid::from_raw(0), &on(0)?)?;
    if let Some(server) = server {
        sched_setaffinity(server.pid(), &on(1)?)?;
    }
    Ok(())
}

async fn raw_connection(url: &str) -> Result<MultiplexedConnection, Error> {
    Ok(redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?)
}

/// W0: one GET: the single round trip every ratio for handoffs is taken
/// against.
async fn w0_round_trip(url: &str) -> Result<Report, Error> {
    let mut conn = raw_connection(url).await?;
    let mut latencies = Vec::with_capacity(SEQUENTIAL_PAIRS);
    let start = Instant::now();
    for _ in 0..SEQUENTIAL_PAIRS {
        let t = Instant::now();
        let _: Option<String> = conn.get("w0:rtt").await?;
        latencies.push(t.elapsed());
    }
    Ok(Report {
        workload: "W0 round trip (GET)",
        ops: SEQUENTIAL_PAIRS,
        elapsed: start.elapsed(),
        latencies,
        ..Report::default()
    })
}

/// The floor's acquire + release: SET NX PX, then compare-and-delete.
async fn floor_pair(
    conn: &mut MultiplexedConnection,
    release: &redis::Script,
    key: &str,
    holder: &str,
) -> Result<(), Error> {
    let set: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg(holder)
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(conn)
        .await?;
    if set.is_none() {
        return Err(format!("floor key {key} was not free").into());
    }
    let _: i64 = release.key(key).arg(holder).invoke_async(conn).await?;
    Ok(())
}

/// W0: the W1 shape with no library logic.
async fn w0_pairs(url: &str) -> Result<Report, Error> {
    let mut conn = raw_connection(url).await?;
    let release = redis::Script::new(COMPARE_AND_DELETE);
    let mut latencies = Vec::with_capacity(SEQUENTIAL_PAIRS);
    let start = Instant::now();
    for i in 0..SEQUENTIAL_PAIRS {
        let t = Instant::now();
        floor_pair(&mut conn, &release, "w0", &format!("floor:{i}")).await?;
        latencies.push(t.elapsed());
    }
    Ok(Report {
        workload: "W0 floor pair (SET NX PX + compare-and-delete)",
        ops: SEQUENTIAL_PAIRS,
        elapsed: start.elapsed(),
        latencies,
        ..Report::default()
    })
}

/// W1: one task, one key, sequential acquire + release through the library.
async fn w1_uncontended(url: &str) -> Result<Report, Error> {
    w1_on(
        &LockClient::connect(url).await?,
        "W1 uncontended acquire+release",
        SEQUENTIAL_PAIRS,
    )
    .await
}

async fn w1_on(locks: &LockClient, workload: &'static str, pairs: usize) -> Result<Report, Error> {
    let mut latencies = Vec::with_capacity(pairs);
    let start = Instant::now();
    for _ in 0..pairs {
        let t = Instant::now();
        locks.lock("w1").acquire().await?.release().await?;
        latencies.push(t.elapsed());
    }
    Ok(Report {
        workload,
        ops: pairs,
        elapsed: start.elapsed(),
        latencies,
        ..Report::default()
    })
}

/// W1 on the in-process backend: what the library's own logic costs per
/// pair, with no network in the way.
async fn w1_in_process() -> Result<Report, Error> {
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

/// Runs `pair` on `W2_TASKS` tasks, each with its own key, until either
/// bound is reached; returns (pairs, elapsed, latencies).
async fn independent_keys<F, Fut>(pair: F) -> Result<(usize, Duration, Vec<Duration>), Error>
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
async fn w2_independent_keys(url: &str) -> Result<(Report, Report), Error> {
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
    for round in 0..W2_ROUNDS {
        let (conn, release) = (conn.clone(), Arc::clone(&release));
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
    library
        .extra
        .push(("median_round_ratio_to_floor", ratios[ratios.len() / 2]));
    Ok((floor, library))
}

/// W3: 16 tasks increment one counter under one lock (GET, then SET + 1).
/// Handoff = from the moment the holder starts its release to the moment
/// the next holder has the lock.
async fn w3_contended(url: &str) -> Result<Report, Error> {
    w3_on(
        LockClient::connect(url).await?,
        url,
        "W3 16 tasks x 1 key, increments",
    )
    .await
}

/// W3 with any client; the counter lives on the Redis at `data_url`.
async fn w3_on(locks: LockClient, data_url: &str, workload: &'static str) -> Result<Report, Error> {
    let mut data = raw_connection(data_url).await?;
    let _: () = data.set("w3:counter", 0).await?;
    // (release started, by which task); the next holder reads it.
    let last_release: Arc<std::sync::Mutex<Option<(Instant, usize)>>> = Arc::default();
    let start = Instant::now();
    let tasks: Vec<_> = (0..W3_TASKS)
        .map(|task| {
            let (locks, mut data, last_release) = (locks.clone(), data.clone(), Arc::clone(&last_release));
            tokio::spawn(async move {
                let (mut any, mut cross) = (Vec::new(), Vec::new());
                for _ in 0..W3_INCREMENTS {
                    let guard = locks.lock("w3").wait(Duration::from_secs(30)).acquire().await?;
                    let acquired = Instant::now();
                    if let Some((released, by)) = *last_release.lock().unwrap_or_else(|e| e.into_inner()) {
                        let handoff = acquired.saturating_duration_since(released);
                        any.push(handoff);
                        if by != task {
                            cross.push(handoff);
                        }
                    }
                    let value: u64 = data.get("w3:counter").await?;
                    let _: () = data.set("w3:counter", value + 1).await?;
                    *last_release.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), task));
                    guard.release().await?;
                }
                Ok::<_, Error>((any, cross))
            })
        })
        .collect();
    let (mut any, mut cross) = (Vec::new(), Vec::new());
    for task in tasks {
        let (a, c) = task.await??;
        any.extend(a);
        cross.extend(c);
    }
    let elapsed = start.elapsed();
    let counter: u64 = data.get("w3:counter").await?;
    Ok(Report {
        workload,
        ops: W3_TASKS * W3_INCREMENTS,
        elapsed,
        latencies: any,
        extra: vec![
            ("cross_task_handoff_p50_us", percentile_us(&cross, 0.5)),
            ("cross_task_handoff_p99_us", percentile_us(&cross, 0.99)),
            ("cross_task_handoffs", cross.len() as f64),
            ("final_counter", counter as f64),
        ],
    })
}

/// W3 across 4 OS processes x 4 tasks (this binary re-executed), started
/// together; increments/s and the final counter.
async fn w3_processes(url: &str) -> Result<Report, Error> {
    const PROCESSES: usize = 4;
    const TASKS: usize = 4;
    let mut data = raw_connection(url).await?;
    let _: () = data.set("w3p:counter", 0).await?;
    let exe = std::env::current_exe()?;
    let increments = W3_TASKS * W3_INCREMENTS / (PROCESSES * TASKS);
    let mut children = Vec::new();
    for _ in 0..PROCESSES {
        let mut child = Command::new(&exe)
            .args(["--w3-worker", url, &TASKS.to_string(), &increments.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let mut ready = String::new();
        BufReader::new(child.stdout.as_mut().ok_or("no stdout")?).read_line(&mut ready)?;
        children.push(child);
    }
    let start = Instant::now();
    for child in &mut children {
        writeln!(child.stdin.as_mut().ok_or("no stdin")?, "go")?;
    }
    for child in children {
        if !child.wait_with_output()?.status.success() {
            return Err("a W3 worker process failed".into());
        }
    }
    let elapsed = start.elapsed();
    let counter: u64 = data.get("w3p:counter").await?;
    Ok(Report {
        workload: "W3 4 processes x 4 tasks x 1 key",
        ops: PROCESSES * TASKS * increments,
        elapsed,
        extra: vec![("final_counter", counter as f64)],
        ..Report::default()
    })
}

async fn w3_worker(url: &str, tasks: usize, increments: usize) -> Result<(), Error> {
    let locks = LockClient::connect(url).await?;
    let data = raw_connection(url).await?;
    println!("ready");
    let mut go = String::new();
    std::io::stdin().read_line(&mut go)?;
    let workers: Vec<_> = (0..tasks)
        .map(|_| {
            let (locks, mut data) = (locks.clone(), data.clone());
            tokio::spawn(async move {
                for _ in 0..increments {
                    let guard = locks.lock("w3p").wait(Duration::from_secs(60)).acquire().await?;
                    let value: u64 = data.get("w3p:counter").await?;
                    let _: () = data.set("w3p:counter", value + 1).await?;
                    guard.release().await?;
                }
                Ok::<_, Error>(())
            })
        })
        .collect();
    for w in workers {
        w.await??;
    }
    Ok(())
}

/// W4: the W1 shape on Redlock (3 and 5 masters) and on a cluster of 3
/// masters + 3 replicas, and W3 on 3 masters; all started here.
async fn w4_scale_out() -> Result<Vec<Report>, Error> {
    const PAIRS: usize = 5_000;
    let three = lock_tests::start_masters(3);
    let five = lock_tests::start_masters(5);
    let cluster = lock_tests::Cluster::start(3, 1);
    let urls = |masters: &[RedisServer]| masters.iter().map(RedisServer::url).collect::<Vec<_>>();
    let redlock3 = LockClient::redlock(urls(&three)).await?;
    let redlock5 = LockClient::redlock(urls(&five)).await?;
    let clustered = LockClient::cluster(cluster.urls()).await?;
    let data = RedisServer::start();
    Ok(vec![
        w1_on(&redlock3, "W4 Redlock N=3 acquire+release", PAIRS).await?,
        w1_on(&redlock5, "W4 Redlock N=5 acquire+release", PAIRS).await?,
        w1_on(&clustered, "W4 Cluster acquire+release", PAIRS).await?,
        w3_on(
            redlock3,
            &data.url(),
            "W4 Redlock N=3, 16 tasks x 1 key, increments",
        )
        .await?,
    ])
}

/// W5: nested acquire + release inside a held lock: no command at all.
async fn w5_reentry(url: &str, server: Option<&RedisServer>) -> Result<Report, Error> {
    let locks = LockClient::connect(url).await?;
    let (elapsed, sent) = locks
        .lock("w5")
        .run(async {
            let before = server.map(RedisServer::command_calls);
            let start = Instant::now();
            for _ in 0..W5_NESTED {
                locks.lock("w5").run(async {}).await?;
            }
            let elapsed = start.elapsed();
            let after = server.map(RedisServer::command_calls);
            let sent = before
                .zip(after)
                .map(|(b, a)| commands_between(&b, &a).values().sum::<u64>());
            Ok::<_, lock_runtime::LockError>((elapsed, sent))
        })
        .await??;
    Ok(Report {
        workload: "W5 nested re-entry",
        ops: W5_NESTED,
        elapsed,
        extra: vec![
            ("ns_per_pair", elapsed.as_nanos() as f64 / W5_NESTED as f64),
            ("commands_sent", sent.map_or(f64::NAN, |n| n as f64)),
        ],
        ..Report::default()
    })
}

fn cpu_time() -> Duration {
    nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF).map_or(Duration::ZERO, |u| {
        let tv = |t: nix::sys::time::TimeVal| Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1000);
        tv(u.user_time()) + tv(u.system_time())
    })
}

/// W6: 10,000 locks held (ttl 3s) for 10s: renewal traffic and client CPU.
async fn w6_watchdog(url: &str, server: Option<&RedisServer>) -> Result<Report, Error> {
    let locks = LockClient::connect(url).await?;
    let acquires = (0..W6_LOCKS).map(|i| locks.lock(format!("w6:{i}")).ttl(W6_TTL).acquire());
    let guards: Vec<_> = futures_util::future::join_all(acquires)
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let before = server.map(RedisServer::command_calls);
    let cpu_before = cpu_time();
    tokio::time::sleep(W6_HOLD).await;
    let cpu = cpu_time() - cpu_before;
    let after = server.map(RedisServer::command_calls);
    let still_held = guards.iter().filter(|g| g.is_held()).count();
    let round_trips = before
        .zip(after)
        .map(|(b, a)| commands_between(&b, &a).get("evalsha").copied().unwrap_or(0));
    // Each lease falls due once per renewal interval (ttl/3).
    let due = W6_LOCKS as f64 * W6_HOLD.as_secs_f64() / (W6_TTL.as_secs_f64() / 3.0);
    for guard in guards {
        guard.release().await?;
    }
    let round_trips = round_trips.map_or(f64::NAN, |n| n as f64);
    Ok(Report {
        workload: "W6 10k leases renewing for 10s",
        ops: W6_LOCKS,
        elapsed: W6_HOLD,
        extra: vec![
            ("renewal_round_trips_per_s", round_trips / W6_HOLD.as_secs_f64()),
            ("round_trips_per_100_due", round_trips / due * 100.0),
            (
                "client_cpu_ms_per_s",
                cpu.as_secs_f64() * 1e3 / W6_HOLD.as_secs_f64(),
            ),
            ("still_held", still_held as f64),
        ],
        ..Report::default()
    })
}

fn summarise(reports: &[Report]) {
    let find = |prefix: &str| reports.iter().find(|r| r.workload.starts_with(prefix));
    println!("\n| workload | ops | ops/s | p50 µs | p99 µs |");
    println!("|---|---|---|---|---|");
    for r in reports {
        println!(
            "| {} | {} | {:.0} | {:.1} | {:.1} |",
            r.workload,
            r.ops,
            r.per_second(),
            r.percentile_us(0.50),
            r.percentile_us(0.99)
        );
    }
    let (Some(rtt), Some(w0), Some(w1), Some(w2), Some(w3), Some(w3p), Some(w5), Some(w6)) = (
        find("W0 round"),
        find("W0 floor"),
        find("W1 un"),
        find("W2 64"),
        find("W3 16"),
        find("W3 4"),
        find("W5"),
        find("W6"),
    ) else {
        return;
    };
    let rtt_p50 = rtt.percentile_us(0.5);
    let targets = [
        (
            "W1 p50 / W0 p50",
            w1.percentile_us(0.5) / w0.percentile_us(0.5),
            "<= 1.15",
        ),
        (
            "W2 pairs/s / W2 floor pairs/s (median of rounds)",
            w2.extra("median_round_ratio_to_floor"),
            ">= 0.90",
        ),
        (
            "W3 cross-task handoff p50 / W0 round trip p50",
            w3.extra("cross_task_handoff_p50_us") / rtt_p50,
            "<= 3",
        ),
        (
            "W3 cross-task handoff p99 (µs)",
            w3.extra("cross_task_handoff_p99_us"),
            "<= 1000",
        ),
        ("W3 final counter", w3.extra("final_counter"), "== 2000"),
        (
            "W4 Redlock N=3 final counter",
            find("W4 Redlock N=3, 16").map_or(f64::NAN, |r| r.extra("final_counter")),
            "== 2000",
        ),
        (
            "W3 processes final counter",
            w3p.extra("final_counter"),
            "== 2000",
        ),
        ("W5 ns per nested pair", w5.extra("ns_per_pair"), "< 1000"),
        ("W5 commands sent", w5.extra("commands_sent"), "== 0"),
        (
            "W6 round trips per 100 due leases",
            w6.extra("round_trips_per_100_due"),
            "<= 1",
        ),
    ];
    println!("\n| target | measured | goal |\n|---|---|---|");
    for (name, value, goal) in targets {
        println!("| {name} | {value:.2} | {goal} |");
    }
}
