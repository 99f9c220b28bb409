//! The scheduled-job demo: three replicas of a service, each an OS process
//! with its own `tokio-cron-scheduler`, run the same every-second job.
//! Their clocks are set apart: the middle one's is 300 ms behind the
//! first's and the last one's 600 ms, so each fires that much later for
//! the same scheduled second (±300 ms around the middle). For 30 ticks,
//! each tick's runs are counted three ways, side by side:
//!
//! - without a lock: every replica runs every tick;
//! - `on_busy = "skip"` alone: a replica skips a tick another one is
//!   running, but the job takes 50 ms, so a replica firing 300 ms later
//!   most often finds the lock released and runs the tick again;
//! - `on_busy = "skip"` with `hold_at_least`: the lock stays held after
//!   the run, and every tick runs exactly once.
//!
//! ```sh
//! REDIS_URL=redis://127.0.0.1/ cargo run -p lock-examples --bin scheduled
//! REDIS_URL=redis://127.0.0.1/ cargo run -p lock-examples --bin scheduled -- --ticks 10
//! ```

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_examples::ShopError;
use lock_runtime::{LockClient, Tick, distributed_lock};
use redis::AsyncCommands;
use tokio_cron_scheduler::{Job, JobScheduler};

/// How far behind the first replica's clock each replica's clock is.
const CLOCK_LAGS_MS: [u64; 3] = [0, 300, 600];
/// What one run of the job does: 50 ms of work.
const WORK: Duration = Duration::from_millis(50);
/// The counters outlive the demo by this long, then Redis drops them.
const COUNTERS_KEPT_S: i64 = 600;

/// The ways the job is run, in the table's order.
const WAYS: [&str; 3] = ["no-lock", "skip", "skip-hold"];

/// One run of the job: its work, then the count of runs of its tick.
async fn work(
    redis: &redis::aio::MultiplexedConnection,
    demo: u64,
    way: &str,
    tick: Tick,
) -> Result<(), ShopError> {
    tokio::time::sleep(WORK).await;
    let counter = format!("scheduled:{demo}:{way}:{tick}");
    let mut redis = redis.clone();
    redis.incr::<_, _, ()>(&counter, 1).await?;
    redis.expire::<_, ()>(&counter, COUNTERS_KEPT_S).await?;
    Ok(())
}

/// The job with no lock.
async fn report_unlocked(
    redis: &redis::aio::MultiplexedConnection,
    demo: u64,
    tick: Tick,
) -> Result<(), ShopError> {
    work(redis, demo, "no-lock", tick).await
}

/// The job on one replica per tick, but released as soon as it is done.
#[distributed_lock(key = "scheduled:<demo>:skip:<tick>", ttl = "30s", on_busy = "skip")]
async fn report_skip(
    redis: &redis::aio::MultiplexedConnection,
    demo: u64,
    tick: Tick,
) -> Result<(), ShopError> {
    work(redis, demo, "skip", tick).await
}

/// The job on one replica per tick, its lock kept 5 s from its grant: far
/// longer than the replicas' spread (600 ms of clocks, and up to 500 ms of
/// the scheduler, which looks for due jobs twice a second).
#[distributed_lock(
    key = "scheduled:<demo>:skip-hold:<tick>",
    ttl = "30s",
    on_busy = "skip",
    hold_at_least = "5s"
)]
async fn report_skip_hold(
    redis: &redis::aio::MultiplexedConnection,
    demo: u64,
    tick: Tick,
) -> Result<(), ShopError> {
    work(redis, demo, "skip-hold", tick).await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Ok(url) = std::env::var("REDIS_URL") else {
        return Err("the replicas share their locks through Redis: set REDIS_URL=redis://host:port/".into());
    };
    if let [flag, lag, demo, ticks] = args.as_slice()
        && flag == "--replica"
    {
        return replica(&url, lag.parse()?, demo.parse()?, ticks.parse()?).await;
    }
    let ticks: u64 = match args.as_slice() {
        [] => 30,
        [flag, n] if flag == "--ticks" => match n.parse() {
            Ok(n) if (1..=600).contains(&n) => n,
            _ => return Err(format!("--ticks takes a number from 1 to 600, not {n:?}").into()),
        },
        _ => return Err("usage: scheduled [--ticks N]".into()),
    };
    println!(
        "Scheduled-job demo: {} replicas (OS processes, each with its own tokio-cron-scheduler) run the \
         same job every second; their clocks are 0, 300 and 600 ms behind the first, so they fire that \
         much later for each scheduled second. {ticks} ticks, the job taking {} ms.\n",
        CLOCK_LAGS_MS.len(),
        WORK.as_millis()
    );
    let demo = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let exe = std::env::current_exe()?;
    let mut replicas = Vec::new();
    for lag in CLOCK_LAGS_MS {
        let args = [lag, demo, ticks].map(|n| n.to_string());
        let mut replica = Command::new(&exe)
            .arg("--replica")
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let mut ready = String::new();
        BufReader::new(replica.stdout.as_mut().ok_or("no stdout")?).read_line(&mut ready)?;
        if ready.trim() != "ready" {
            return Err(format!("a replica did not start: {ready:?}").into());
        }
        replicas.push(replica);
    }
    // Every replica's scheduler runs: the ticks counted start two seconds
    // from now.
    let first = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs() + 2;
    for replica in &mut replicas {
        writeln!(replica.stdin.as_mut().ok_or("no stdin")?, "{first}")?;
    }
    for mut replica in replicas {
        if !replica.wait()?.success() {
            return Err("a replica failed".into());
        }
    }

    let mut redis = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    println!("| tick                 | no lock | on_busy = \"skip\" | skip + hold_at_least |");
    println!("|----------------------|---------|------------------|----------------------|");
    let mut once = [0u64; 3];
    let mut more = [0u64; 3];
    let mut never = [0u64; 3];
    for second in first..first + ticks {
        let tick = Tick::at(UNIX_EPOCH + Duration::from_secs(second));
        let mut runs = [0u64; 3];
        for (i, way) in WAYS.iter().enumerate() {
            let counted: Option<u64> = redis.get(format!("scheduled:{demo}:{way}:{tick}")).await?;
            runs[i] = counted.unwrap_or(0);
            match runs[i] {
                0 => never[i] += 1,
                1 => once[i] += 1,
                _ => more[i] += 1,
            }
        }
        println!("| {tick} | {:>7} | {:>16} | {:>20} |", runs[0], runs[1], runs[2]);
    }
    println!(
        "| ran exactly once     | {:>7} | {:>16} | {:>20} |",
        once[0], once[1], once[2]
    );
    println!(
        "| ran more than once   | {:>7} | {:>16} | {:>20} |",
        more[0], more[1], more[2]
    );
    println!(
        "| never ran            | {:>7} | {:>16} | {:>20} |",
        never[0], never[1], never[2]
    );
    println!(
        "\nWith on_busy = \"skip\" alone, a replica firing 300 ms after the first finds the 50 ms job done \
         and its lock released, and runs the tick again. hold_at_least keeps the lock until 5 s after \
         its grant, by the lock server's clock: the late replicas find it held and skip."
    );
    Ok(())
}

/// One replica: a scheduler that fires the job every second, `lag_ms`
/// after the first replica, for `ticks` ticks from the Unix second the demo
/// sends on stdin once every replica said it is ready.
async fn replica(url: &str, lag_ms: u64, demo: u64, ticks: u64) -> Result<(), Box<dyn std::error::Error>> {
    lock_runtime::init(LockClient::connect(url).await?)?;
    let redis = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    // 0 until the demo says which tick comes first: nothing runs before.
    let first = Arc::new(AtomicU64::new(0));
    let from = Arc::clone(&first);
    let scheduler = JobScheduler::new().await?;
    let job = Job::new_async("* * * * * *", move |_id, _scheduler| {
        let (redis, first) = (redis.clone(), from.load(Ordering::SeqCst));
        Box::pin(async move {
            // The scheduler fires after the second it planned, never
            // before (it looks twice a second): that second is the tick.
            let Ok(fired) = SystemTime::now().duration_since(UNIX_EPOCH) else {
                return;
            };
            let second = fired.as_secs();
            if first == 0 || !(first..first + ticks).contains(&second) {
                return;
            }
            let tick = Tick::at(UNIX_EPOCH + Duration::from_secs(second));
            // This replica's clock is behind: it fires this much later.
            tokio::time::sleep(Duration::from_millis(lag_ms)).await;
            let runs = futures_util::future::join3(
                report_unlocked(&redis, demo, tick),
                report_skip(&redis, demo, tick),
                report_skip_hold(&redis, demo, tick),
            )
            .await;
            if let (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) = runs {
                eprintln!("replica {lag_ms} ms behind, tick {tick}: {e:?}");
            }
        })
    })?;
    scheduler.add(job).await?;
    scheduler.start().await?;
    println!("ready");
    std::io::stdout().flush()?;
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    let start: u64 = line.trim().parse()?;
    first.store(start, Ordering::SeqCst);
    // Until the last tick's slowest run is over.
    let end = UNIX_EPOCH + Duration::from_secs(start + ticks + 2);
    if let Ok(left) = end.duration_since(SystemTime::now()) {
        tokio::time::sleep(left).await;
    }
    Ok(())
}
