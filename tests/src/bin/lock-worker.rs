//! A lock client in its own OS process, driven by the integration tests.
//!
//! - `lock-worker count <url> <key> <counter-key> <n>`: `n` times, under the
//!   lock, read the counter with GET and write it back plus one with SET.
//! - `lock-worker transfers <url> <accounts> <tasks> <n>`: `tasks` tasks
//!   each make `n` transfers between random accounts (balances at
//!   `balance:<i>`), locking both with `lock_all`.
//! - `lock-worker hold <url> <key> <ttl-ms>`: take the lock, print `HELD`,
//!   and keep it until killed; `hold-renewed` the same with lease renewal.
//! - `lock-worker lead <target> <election> <ttl-ms> <value>`: campaign,
//!   print `ELECTED <epoch>`, and lead (renewed) until killed.
//! - `lock-worker pause <url> <witness-dir> <key> <ttl-ms>`: take the lock
//!   with a fencing token, print `PAUSING`, stop itself (SIGSTOP: a failpoint
//!   at a named point of its body, between check and write) and once
//!   continued write the token to the checker's fenced and unfenced registers
//!   (keys `<key>:fenced`, `<key>:unfenced`).
//! - `lock-worker act-until-lost <url> <witness-dir> <key> <ttl-ms>`: run
//!   a renewed lock's body with `run()` that prints `HELD <token>`, writes
//!   its token to the checker's unfenced register `<key>:acts` (which takes
//!   any write, and counts the stale ones), has itself stopped (SIGSTOP)
//!   while it waits for its next write and, once continued, writes every
//!   20 ms; once `run()` reports the
//!   lease lost, print `LOST` and exit. It shows whether a body ever acts
//!   after its lease could have ended.
//! - `lock-worker job <url> <key> <ttl-ms> <hold-ms>`: a scheduled job's
//!   process: `try_run` an empty body on `key` with `hold_at_least`, print
//!   `RAN` or `SKIPPED`, and exit at once.
//! - `lock-worker job-killed <url> <key> <ttl-ms> <hold-ms>`: the same job
//!   whose body prints `RUNNING` and never ends: the test kills it there.
//! - `lock-worker ticks <url> <log> <lag-ms> <first-ms> <period-ms> <ticks>
//!   <hold-ms> <wait-ms>`: a scheduled job's replica: tick `k` (0 to
//!   `ticks` - 1) is due at `first-ms` (ms since the epoch) + `k` ×
//!   `period-ms`, and this replica fires `lag-ms` after that (its clock is
//!   behind). Each tick, in a task of its own, `try_run`s the job on key
//!   `tick:<k>` with `hold_at_least` of `hold-ms` (none when 0: the broken
//!   variant) and a `wait` of `wait-ms`; the body appends `<k> <ms since
//!   the epoch>` to the file `log` (the checker's record, kept apart from
//!   what the lock says) and works 20 ms. Prints a line per tick, `T <k>
//!   ran|skipped|error <late-ms>` (how late it fired), then exits.
//! - `lock-worker wait <url> <key>`: wait up to 30 s for the lock, then print
//!   the wall-clock time it was acquired (ns since the epoch) and release it.
//! - `lock-worker witness <target> <witness-dir> <keys> <tasks> <ms> <lock>
//!   <ttl-ms> <max-body-ms>`: `tasks` tasks take `lock` on one of the
//!   comma-separated `keys` at random for `ms` milliseconds, each body
//!   reporting to the run's checker board in `witness-dir` (see
//!   `lock_tests::witness`). `target` is a Redis URL, `redlock=` followed by
//!   comma-separated URLs, or `sentinel=<master name>@` followed by
//!   comma-separated sentinel URLs. `lock` is `library` (the exclusive lock),
//!   `library-rw` (one writer in four, the rest readers),
//!   `library-permits-N`, `library-segments-N` (any free one of N segments,
//!   each segment checked as its own exclusive lock), `library-transfer`
//!   (two keys at once with `lock_all`), or `library-run` / `library-run-fixed` (the exclusive
//!   lock, renewed or fixed, with each body run by `run()`, which must drop
//!   it when the lease is lost), or `library-election` (each task a
//!   candidate in one of the `keys` as elections, with `Election::run`:
//!   each term is a body, its epoch the fencing token); or a control that lies to the checker, which must catch
//!   it: `library-rw-writers-read` (writers take the read lock),
//!   `library-permits-N-checked-M` (N permits where the checker allows M),
//!   `library-segments-N-unsplit` (segments reported as the one lock they
//!   split), `library-transfer-first-only` (only the first of the two keys is
//!   locked), `library-run-detached` (a `run()` body whose work goes on in
//!   a task the runner cannot stop), `library-election-detached` (the
//!   same for a leader's term, see below); or a deliberately broken lock the checker must catch: `del-release` (released by a plain DEL, no owner
//!   check), `no-deadline` (the body ignores its lease running out) or
//!   `blind-renew` (renews with a plain SET, never noticing it lost the lock).
//!   Prints one JSON line of counts, errors and the worst lateness of this
//!   process's assumption monitor. `LOCK_WORKER_COMMAND_TIMEOUT_MS` sets the
//!   client's command timeout, `LOCK_WORKER_REPLICA_ACKS` its
//!   `replica_acks`, `LOCK_WORKER_WAIT_MS` each call's `wait` (3 s unless
//!   set); `LOCK_WORKER_LONG_BODY_PERCENT` makes that
//!   share of the library's bodies last 0.5–2.5 s instead.
//! - `lock-worker fence <url> <key> <n>`: `n` times, take the lock with a
//!   fencing token and, under the lock, append the token to the list
//!   `fence-log`: the list's order is the acquisition order. With a
//!   `mysql://` URL, to the table `fence_log` (`id` auto-increment, `token`).
//!
//! Wherever a `<url>` or `<target>` is taken, a `mysql://` URL runs the
//! same on the MySQL backend, and `zookeeper=<connect string>` on
//! ZooKeeper (`LOCK_WORKER_SESSION_TIMEOUT_MS` sets the session timeout
//! asked; `fence` appends its tokens to the file `LOCK_WORKER_FENCE_FILE`),
//! and `etcd=<endpoint>,<endpoint>…` on etcd (`LOCK_WORKER_ETCD_LEASE_TTL_S`
//! sets the lease ttl asked).

use std::time::Duration;

use lock_runtime::{LockClient, LockError};
use lock_tests::lab::{Tally, TermRequest, term_request};
use lock_tests::witness::Share;

use redis::AsyncCommands;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    exit_after_limit(&args);
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        [_, "count", url, key, counter, n] => count(url, key, counter, n.parse()?).await,
        [_, "transfers", url, accounts, tasks, n] => {
            transfers(url, accounts.parse()?, tasks.parse()?, n.parse()?).await
        }
        [_, "hold", url, key, ttl_ms] => hold(url, key, ttl_ms.parse()?, false).await,
        [_, "hold-renewed", url, key, ttl_ms] => hold(url, key, ttl_ms.parse()?, true).await,
        [_, "lead", target, election, ttl_ms, value] => lead(target, election, ttl_ms.parse()?, value).await,
        [_, "pause", url, witness_dir, key, ttl_ms] => pause(url, witness_dir, key, ttl_ms.parse()?).await,
        [_, "act-until-lost", url, witness_dir, key, ttl_ms] => {
            act_until_lost(url, witness_dir, key, ttl_ms.parse()?).await
        }
        [_, "wait", url, key] => wait(url, key).await,
        [_, "job", url, key, ttl_ms, hold_ms] => {
            job(url, key, ttl_ms.parse()?, hold_ms.parse()?, false).await
        }
        [_, "job-killed", url, key, ttl_ms, hold_ms] => {
            job(url, key, ttl_ms.parse()?, hold_ms.parse()?, true).await
        }
        [
            _,
            "ticks",
            url,
            log,
            lag_ms,
            first_ms,
            period_ms,
            ticks,
            hold_ms,
            wait_ms,
        ] => {
            let schedule = Schedule {
                wait: Duration::from_millis(wait_ms.parse()?),
                lag: Duration::from_millis(lag_ms.parse()?),
                first: std::time::UNIX_EPOCH + Duration::from_millis(first_ms.parse()?),
                period: Duration::from_millis(period_ms.parse()?),
                ticks: ticks.parse()?,
                hold: Duration::from_millis(hold_ms.parse()?),
            };
            replica_ticks(url, log, schedule).await
        }
        [_, "fence", url, key, n] => fence(url, key, n.parse()?).await,
        [
            _,
            "witness",
            url,
            witness_dir,
            keys,
            tasks,
            ms,
            lock,
            ttl_ms,
            max_body_ms,
        ] => {
            let run = WitnessRun {
                url: (*url).to_owned(),
                keys: keys.split(',').map(str::to_owned).collect(),
                duration: Duration::from_millis(ms.parse()?),
                ttl: Duration::from_millis(ttl_ms.parse()?),
                max_body: Duration::from_millis(max_body_ms.parse()?),
                lock: (*lock).to_owned(),
                stopped: stop_on_eof(),
            };
            witness(run, witness_dir, tasks.parse()?).await
        }
        _ => Err("usage: lock-worker count|hold|wait|fence URL KEY ...".into()),
    }
}

/// A worker never outlives its test: a test blocked reading its output or
/// waiting for its exit (a lock never granted, a release never seen) fails
/// by name once the worker gives up, instead of hanging the suite. The
/// limit is the suite's [`lock_tests::TEST_LIMIT`] (or
/// `LOCK_WORKER_LIMIT_MS`) plus a witness run's own length.
fn exit_after_limit(args: &[String]) {
    let run = match args {
        [_, verb, _, _, _, _, ms, ..] if verb == "witness" => {
            ms.parse().map_or(Duration::ZERO, Duration::from_millis)
        }
        _ => Duration::ZERO,
    };
    // `LOCK_WORKER_LIMIT_MS` replaces the suite's limit: the test of this
    // limit cannot wait five minutes.
    let base = std::env::var("LOCK_WORKER_LIMIT_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map_or(lock_tests::TEST_LIMIT, Duration::from_millis);
    let limit = base + run;
    let what = args[1..].join(" ");
    std::thread::spawn(move || {
        // A deadline, not a synchronisation: nothing waits for this sleep.
        std::thread::sleep(limit);
        eprintln!("lock-worker {what}: still running after {limit:?}; giving up");
        std::process::exit(70);
    });
}

async fn count(url: &str, key: &str, counter: &str, n: u32) -> Result<(), Box<dyn std::error::Error>> {
    let locks = LockClient::connect(url).await?;
    let mut data = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    for _ in 0..n {
        let data = &mut data;
        locks
            .lock(key)
            .wait(Duration::from_secs(30))
            .run(async move {
                let value: Option<u64> = data.get(counter).await?;
                data.set::<_, _, ()>(counter, value.unwrap_or(0) + 1).await?;
                Ok::<_, redis::RedisError>(())
            })
            .await??;
    }
    Ok(())
}

/// `tasks` tasks each make `n` transfers of 7 between random accounts of
/// `accounts` (balances at `balance:<i>`), both keys locked with
/// `lock_all`: a read-modify-write of both balances.
async fn transfers(
    url: &str,
    accounts: usize,
    tasks: usize,
    n: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let locks = LockClient::connect(url).await?;
    let data = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let workers: Vec<_> = (0..tasks)
        .map(|_| {
            let (locks, mut data) = (locks.clone(), data.clone());
            tokio::spawn(async move {
                for _ in 0..n {
                    let from = rand::random_range(0..accounts);
                    let to = (from + rand::random_range(1..accounts)) % accounts;
                    let data = &mut data;
                    locks
                        .lock_all([format!("account:{from}"), format!("account:{to}")])
                        .wait(Duration::from_secs(30))
                        .run(async move {
                            let a: i64 = data.get(format!("balance:{from}")).await?;
                            let b: i64 = data.get(format!("balance:{to}")).await?;
                            data.set::<_, _, ()>(format!("balance:{from}"), a - 7).await?;
                            data.set::<_, _, ()>(format!("balance:{to}"), b + 7).await?;
                            Ok::<_, redis::RedisError>(())
                        })
                        .await??;
                }
                Ok::<_, BoxError>(())
            })
        })
        .collect();
    for worker in workers {
        worker.await?.map_err(|e| e.to_string())?;
    }
    Ok(())
}

async fn hold(url: &str, key: &str, ttl_ms: u64, renew: bool) -> Result<(), Box<dyn std::error::Error>> {
    let locks = connect(url).await?;
    let guard = locks
        .lock(key)
        .ttl(Duration::from_millis(ttl_ms))
        .renew(renew)
        .acquire()
        .await?;
    println!("HELD");
    std::future::pending::<()>().await;
    guard.release().await?;
    Ok::<_, LockError>(()).map_err(Into::into)
}

async fn lead(
    target: &str,
    election: &str,
    ttl_ms: u64,
    value: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let locks = connect(target).await?;
    let leadership = locks
        .election(election)
        .ttl(Duration::from_millis(ttl_ms))
        .campaign(value)
        .await?;
    println!("ELECTED {}", leadership.epoch());
    std::future::pending::<()>().await;
    leadership.resign().await?;
    Ok(())
}

/// A scheduled job's process (`job`, `job-killed`): with `until_killed`,
/// its body says it runs and never ends.
async fn job(
    url: &str,
    key: &str,
    ttl_ms: u64,
    hold_ms: u64,
    until_killed: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let locks = connect(url).await?;
    let ran = locks
        .lock(key)
        .ttl(Duration::from_millis(ttl_ms))
        .hold_at_least(Duration::from_millis(hold_ms))
        .try_run(async {
            if until_killed {
                println!("RUNNING");
                std::future::pending::<()>().await;
            }
        })
        .await?;
    println!("{}", if ran.is_some() { "RAN" } else { "SKIPPED" });
    Ok(())
}

/// When a replica fires its job (`ticks`).
struct Schedule {
    wait: Duration,
    lag: Duration,
    first: std::time::SystemTime,
    period: Duration,
    ticks: u32,
    hold: Duration,
}

async fn replica_ticks(url: &str, log: &str, schedule: Schedule) -> Result<(), Box<dyn std::error::Error>> {
    use std::io::Write;
    let locks = connect(url).await?;
    let log = std::sync::Arc::new(std::sync::Mutex::new(
        std::fs::OpenOptions::new().create(true).append(true).open(log)?,
    ));
    let mut runs = Vec::new();
    for k in 0..schedule.ticks {
        let due = schedule.first + schedule.period * k + schedule.lag;
        if let Ok(left) = due.duration_since(std::time::SystemTime::now()) {
            tokio::time::sleep(left).await;
        }
        let late = std::time::SystemTime::now()
            .duration_since(due)
            .unwrap_or_default();
        let (locks, body_log) = (locks.clone(), std::sync::Arc::clone(&log));
        let (hold, wait) = (schedule.hold, schedule.wait);
        // Each tick's call on its own: one that waits does not delay the
        // next tick's firing.
        let run = async move {
            let mut request = locks
                .lock(format!("tick:{k}"))
                .ttl(Duration::from_secs(5))
                .wait(wait);
            if !hold.is_zero() {
                request = request.hold_at_least(hold);
            }
            request
                .try_run(async move {
                    let began = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap_or_default()
                        .as_millis();
                    let written = writeln!(
                        body_log.lock().unwrap_or_else(std::sync::PoisonError::into_inner),
                        "{k} {began}"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    written
                })
                .await
        };
        runs.push(tokio::spawn(async move {
            let said = match run.await {
                Ok(Some(Err(e))) => return Err(e),
                Ok(Some(Ok(()))) => "ran",
                Ok(None) => "skipped",
                Err(e) => {
                    eprintln!("lock-worker ticks: tick {k}: {e}");
                    "error"
                }
            };
            println!("T {k} {said} {}", late.as_millis());
            Ok(())
        }));
    }
    for run in runs {
        run.await??;
    }
    Ok(())
}

async fn wait(url: &str, key: &str) -> Result<(), Box<dyn std::error::Error>> {
    let locks = connect(url).await?;
    let guard = locks.lock(key).wait(Duration::from_secs(30)).acquire().await?;
    let acquired = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    println!("{}", acquired.as_nanos());
    guard.release().await?;
    Ok(())
}

async fn fence(url: &str, key: &str, n: u32) -> Result<(), Box<dyn std::error::Error>> {
    let locks = connect(url).await?;
    let mut log = FenceLog::open(url).await?;
    for _ in 0..n {
        let log = &mut log;
        locks
            .lock(key)
            .fencing(true)
            .wait(Duration::from_secs(30))
            .run(async move {
                let token = lock_runtime::fencing_token().ok_or("no fencing token")?;
                log.append(token).await
            })
            .await??;
    }
    Ok(())
}

/// Where `fence` appends its tokens, on the server it locks on: the Redis
/// list `fence-log`, or the MySQL table `fence_log` (whose auto-increment
/// id is the acquisition order); for ZooKeeper, a file opened for appending
/// (each token one `write`, under the lock, so the file's order is the
/// acquisition order).
enum FenceLog {
    Redis(redis::aio::MultiplexedConnection),
    Mysql(mysql_async::Conn),
    File(std::fs::File),
}

impl FenceLog {
    async fn open(url: &str) -> Result<FenceLog, Box<dyn std::error::Error>> {
        if url.starts_with("zookeeper=") {
            let path =
                std::env::var("LOCK_WORKER_FENCE_FILE").map_err(|_| "LOCK_WORKER_FENCE_FILE is not set")?;
            return Ok(FenceLog::File(
                std::fs::OpenOptions::new().create(true).append(true).open(path)?,
            ));
        }
        Ok(if url.starts_with("mysql://") {
            FenceLog::Mysql(mysql_async::Conn::from_url(url).await?)
        } else {
            FenceLog::Redis(
                redis::Client::open(url)?
                    .get_multiplexed_async_connection()
                    .await?,
            )
        })
    }

    async fn append(&mut self, token: u64) -> Result<(), Box<dyn std::error::Error>> {
        use mysql_async::prelude::Queryable;
        match self {
            FenceLog::Redis(conn) => conn.rpush::<_, _, ()>("fence-log", token).await?,
            FenceLog::Mysql(conn) => {
                conn.exec_drop("INSERT INTO fence_log (token) VALUES (?)", (token,))
                    .await?;
            }
            FenceLog::File(file) => {
                use std::io::Write;
                file.write_all(format!("{token}\n").as_bytes())?;
            }
        }
        Ok(())
    }
}

#[derive(Clone)]
struct WitnessRun {
    url: String,
    keys: Vec<String>,
    /// The longest the run lasts; the controller may end it sooner.
    duration: Duration,
    ttl: Duration,
    max_body: Duration,
    lock: String,
    /// Turns true when the controller ends the run: a run under
    /// faults lasts until the last fault has healed and load has followed
    /// it, which only the controller knows.
    stopped: tokio::sync::watch::Receiver<bool>,
}

impl WitnessRun {
    /// Whether a task started at `start` takes another lock.
    fn going(&self, start: std::time::Instant) -> bool {
        start.elapsed() < self.duration && !*self.stopped.borrow()
    }

    /// Resolves when the run ends: its time is up or the controller ended it.
    async fn ended(&self) {
        let mut stopped = self.stopped.clone();
        tokio::select! {
            () = tokio::time::sleep(self.duration) => {}
            // The sender is never dropped while the value is false.
            _ = stopped.wait_for(|s| *s) => {}
        }
    }
}

/// A watch that turns true when the controller ends the run by closing
/// this worker's standard input ([`lock_tests::lab::Workers::stop`]), if
/// it asked for that with `LOCK_WORKER_STOP_ON_EOF=1`. A thread of its own
/// reads the pipe: the runtime has no standard-input support built in, and
/// one blocking read per run does not need it.
fn stop_on_eof() -> tokio::sync::watch::Receiver<bool> {
    let (tx, rx) = tokio::sync::watch::channel(false);
    if std::env::var_os("LOCK_WORKER_STOP_ON_EOF").is_some_and(|v| v == "1") {
        std::thread::spawn(move || {
            use std::io::Read;
            // Reads to the end: the controller writes nothing, it closes.
            if std::io::stdin().read_to_end(&mut Vec::new()).is_ok() {
                let _ = tx.send(true);
            } else {
                // Unreadable: the run goes by its time alone.
                std::mem::forget(tx);
            }
        });
    } else {
        // No stop will come: `ended` and `going` go by the time alone.
        std::mem::forget(tx);
    }
    rx
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Which kind of lock a witness run takes, and what the checker is told.
/// `library` is the exclusive lock; `library-fair` the fair one (each
/// call's arrival logged for the order check; the control
/// `library-fair-barging` takes the exclusive lock, which lets a newcomer
/// in ahead of waiters, and logs it as fair);
/// `library-rw` one writer in four, the rest readers; `library-permits-N`
/// N permits. The controls lie to the
/// checker: `library-rw-writers-read` takes read locks for its writers,
/// `library-permits-N-checked-M` takes N permits where the checker allows M.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Exclusive,
    Fair {
        honest: bool,
    },
    /// Two keys with `lock_all`; the control locks only the first.
    Transfer {
        first_only: bool,
    },
    ReadWrite {
        writers_read: bool,
    },
    Permits {
        taken: u32,
        checked: u64,
    },
    /// Any free one of `count` segments, checked per segment; the control
    /// reports every segment as the unsplit key.
    Segments {
        count: u32,
        split: bool,
    },
}

impl Kind {
    fn parse(lock: &str) -> Option<Kind> {
        let permits = |spec: &str| -> Option<Kind> {
            let (taken, checked) = match spec.split_once("-checked-") {
                Some((taken, checked)) => (taken.parse().ok()?, checked.parse().ok()?),
                None => (spec.parse().ok()?, spec.parse().ok()?),
            };
            Some(Kind::Permits { taken, checked })
        };
        match lock {
            "library" => Some(Kind::Exclusive),
            "library-fair" => Some(Kind::Fair { honest: true }),
            "library-fair-barging" => Some(Kind::Fair { honest: false }),
            "library-transfer" => Some(Kind::Transfer { first_only: false }),
            "library-transfer-first-only" => Some(Kind::Transfer { first_only: true }),
            "library-rw" => Some(Kind::ReadWrite { writers_read: false }),
            "library-rw-writers-read" => Some(Kind::ReadWrite { writers_read: true }),
            other => match other.strip_prefix("library-segments-") {
                Some(spec) => {
                    let (count, split) = match spec.strip_suffix("-unsplit") {
                        Some(count) => (count, false),
                        None => (spec, true),
                    };
                    Some(Kind::Segments {
                        count: count.parse().ok()?,
                        split,
                    })
                }
                None => permits(other.strip_prefix("library-permits-")?),
            },
        }
    }

    /// The request for one acquisition, and the share the checker is told.
    fn request<'c>(self, locks: &'c LockClient, keys: &[&str]) -> (lock_runtime::LockRequest<'c>, Share) {
        use lock_runtime::LockMode;
        let request = locks.lock(keys[0]);
        match self {
            Kind::Exclusive => (request, Share::EXCLUSIVE),
            Kind::Fair { honest } => (request.fair(honest), Share::EXCLUSIVE),
            Kind::Transfer { first_only: true } => (request, Share::EXCLUSIVE),
            Kind::Transfer { first_only: false } => (locks.lock_all(keys.iter().copied()), Share::EXCLUSIVE),
            Kind::ReadWrite { writers_read } => {
                if rand::random_ratio(1, 4) {
                    let mode = if writers_read {
                        LockMode::Read
                    } else {
                        LockMode::Write
                    };
                    (request.mode(mode), Share::WRITER)
                } else {
                    (request.mode(LockMode::Read), Share::READER)
                }
            }
            Kind::Permits { taken, checked } => (request.permits(taken), Share::permit(checked)),
            Kind::Segments { count, .. } => (request.segments(count), Share::EXCLUSIVE),
        }
    }
}

/// Each call's `wait`: 3 s, or `LOCK_WORKER_WAIT_MS` (the server-death
/// scenarios give their calls longer than a restart takes).
fn call_wait() -> Duration {
    std::env::var("LOCK_WORKER_WAIT_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map_or(Duration::from_secs(3), Duration::from_millis)
}

/// Connects. The client waits up to 30 s (three times the default
/// start-up timeout) for a server that is not ready: a worker started
/// beside a server that has just come back (an etcd member still without a
/// leader) or one starved of CPU (a PostgreSQL server beside a CPU hog took
/// longer than 10 s) is not the fault under test.
async fn connect(target: &str) -> Result<LockClient, LockError> {
    let mut builder = LockClient::builder().startup_timeout(Duration::from_secs(30));
    if let Some(ms) = std::env::var("LOCK_WORKER_COMMAND_TIMEOUT_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
    {
        builder = builder.command_timeout(Duration::from_millis(ms));
    }
    if let Some(acks) = std::env::var("LOCK_WORKER_REPLICA_ACKS")
        .ok()
        .and_then(|n| n.parse().ok())
    {
        builder = builder.replica_acks(acks);
    }
    if target.starts_with("zookeeper=")
        && let Some(ms) = std::env::var("LOCK_WORKER_SESSION_TIMEOUT_MS")
            .ok()
            .and_then(|ms| ms.parse().ok())
    {
        builder = builder.zookeeper_session_timeout(Duration::from_millis(ms));
    }
    if target.starts_with("etcd=")
        && let Some(seconds) = std::env::var("LOCK_WORKER_ETCD_LEASE_TTL_S")
            .ok()
            .and_then(|s| s.parse().ok())
    {
        builder = builder.etcd_lease_ttl(Duration::from_secs(seconds));
    }
    lock_tests::lab::connect(target, builder).await
}

async fn witness(run: WitnessRun, witness_dir: &str, tasks: usize) -> Result<(), Box<dyn std::error::Error>> {
    if matches!(Kind::parse(&run.lock), Some(Kind::Fair { .. })) {
        first_waits::install()?;
    }
    let monitor = lock_tests::monitor::Monitor::start();
    let runtime_monitor = lock_tests::monitor::RuntimeMonitor::start();
    let checker = lock_tests::witness::Witness::open(std::path::Path::new(witness_dir))?;
    let locks = connect(&run.url).await?;
    let raw = match run.lock.as_str() {
        lock if lock.starts_with("library") => None,
        _ => Some(
            redis::Client::open(run.url.as_str())?
                .get_multiplexed_async_connection()
                .await?,
        ),
    };
    let workers: Vec<_> = (0..tasks)
        .map(|task| {
            let (run, checker, locks, raw) = (run.clone(), checker.clone(), locks.clone(), raw.clone());
            tokio::spawn(async move {
                match raw {
                    None => match (RunBody::parse(&run.lock), Candidate::parse(&run.lock)) {
                        (Some(body), _) => run_body_task(task, run, checker, locks, body).await,
                        (None, Some(candidate)) => election_task(task, run, checker, locks, candidate).await,
                        (None, None) => library_task(task, run, checker, locks).await,
                    },
                    Some(raw) => broken_task(task, run, checker, raw).await,
                }
            })
        })
        .collect();
    let mut total = Tally::default();
    for w in workers {
        total.add(w.await?.map_err(|e| e.to_string())?);
    }
    // Either watch starved is starved: a tick on the runtime late by more
    // than the bound is a lock's deadline timer late by as much.
    total.worst_runtime_late = runtime_monitor.worst();
    total.worst_late = monitor.worst().max(total.worst_runtime_late);
    println!("{}", total.to_json());
    Ok(())
}

/// A body of random length up to `max_body`.
fn body_length(max: Duration) -> Duration {
    use rand::Rng;
    let nanos = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(rand::rng().random_range(0..=nanos))
}

fn pick(keys: &[String]) -> &str {
    use rand::Rng;
    &keys[rand::rng().random_range(0..keys.len())]
}

/// A holder id unique within this process.
/// A key of `keys` other than `key` (there are at least two).
fn pick_other<'k>(keys: &'k [String], key: &str) -> &'k str {
    loop {
        let other = pick(keys);
        if other != key || keys.len() < 2 {
            return other;
        }
    }
}

/// On a ZooKeeper target, with `LOCK_WORKER_DIAGNOSE` set or after a
/// stall (`inspect_stall`): prints (to stderr) what stood in the lock's
/// queue when a call on `key` gave up: each child with its age and owning
/// session, to tell a stuck head from a slow line (the backend's own
/// `inspect` does not list a queue).
async fn diagnose(target: &str, key: &str, what: &str) {
    if std::env::var_os("LOCK_WORKER_DIAGNOSE").is_some() {
        list_queue(target, key, what).await;
    }
}

async fn list_queue(target: &str, key: &str, what: &str) {
    let Some(connect) = target.strip_prefix("zookeeper=") else {
        return;
    };
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let queue = format!("/distributed-locks/lock:{{{key}}}");
    // Each member's own view, one connection per member: a member whose
    // data diverged (a delete it never applied) shows a child the others
    // do not, and its clients wait behind it.
    for member in connect.split(',') {
        let look = async {
            let client = zookeeper_client::Client::connect(member).await?;
            let mut children = Vec::new();
            for name in client.list_children(&queue).await? {
                if let Some(stat) = client.check_stat(&format!("{queue}/{name}")).await? {
                    children.push(format!(
                        "{name} age={}ms session={:x} czxid={:x}",
                        i64::try_from(now_ms).unwrap_or(i64::MAX) - stat.ctime,
                        stat.ephemeral_owner,
                        stat.czxid
                    ));
                }
            }
            children.sort();
            Ok::<_, zookeeper_client::Error>(children)
        };
        match tokio::time::timeout(Duration::from_secs(5), look).await {
            Ok(Ok(children)) => eprintln!("DIAGNOSE {key} {what}: member {member}: queue {children:?}"),
            Ok(Err(e)) => eprintln!("DIAGNOSE {key} {what}: member {member}: cannot look: {e}"),
            Err(_) => eprintln!("DIAGNOSE {key} {what}: member {member}: no answer within 5 s"),
        }
    }
}

fn next_holder(task: usize) -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    ((task as u64) << 48) | NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Prints (on stderr) the server's own account of a lock, as `lockctl
/// inspect` gives it, on any backend, after a call on `key` timed out
/// having waited longer than any fault in the scenarios lasts (S3's 20 s):
/// a stall to explain. Shorter waits time out by design.
async fn inspect_stall(locks: &LockClient, target: &str, key: &str) {
    if call_wait() < Duration::from_secs(20) {
        return;
    }
    list_queue(target, key, "stalled").await;
    match tokio::time::timeout(Duration::from_secs(5), locks.admin().inspect(key)).await {
        Ok(Ok(found)) => eprintln!("DIAGNOSE {key} timed out: {found:?}"),
        Ok(Err(e)) => eprintln!("DIAGNOSE {key} timed out: cannot look: {e}"),
        Err(_) => eprintln!("DIAGNOSE {key} timed out: no answer within 5 s"),
    }
}

/// The library's lock, used as a careful user would: the body stops when the
/// lock is lost, and writes through the fenced register when tokens exist.
async fn library_task(
    task: usize,
    run: WitnessRun,
    checker: lock_tests::witness::Witness,
    locks: LockClient,
) -> Result<Tally, BoxError> {
    let start = std::time::Instant::now();
    let mut tally = Tally::default();
    let kind = Kind::parse(&run.lock).ok_or_else(|| format!("unknown lock `{}`", run.lock))?;
    let fencing = !run.url.starts_with("redlock=")
        && matches!(kind, Kind::Exclusive | Kind::Fair { .. } | Kind::Segments { .. });
    let fair = matches!(kind, Kind::Fair { .. });
    let long_percent: u32 = std::env::var("LOCK_WORKER_LONG_BODY_PERCENT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    while run.going(start) {
        let key = pick(&run.keys);
        let body = if rand::random_ratio(long_percent.min(100), 100) {
            // Long enough to need renewals, so that stalls can cost the lock.
            Duration::from_millis(500) + body_length(Duration::from_millis(2000))
        } else {
            body_length(run.max_body)
        };
        // A transfer locks a second key too.
        let keys: Vec<&str> = match kind {
            Kind::Transfer { .. } => vec![key, pick_other(&run.keys, key)],
            _ => vec![key],
        };
        let (request, share) = kind.request(&locks, &keys);
        let holder = next_holder(task);
        let started = lock_tests::witness::now_ns();
        let acquiring = request.ttl(run.ttl).fencing(fencing).wait(call_wait()).acquire();
        let acquired = if fair {
            use tracing::Instrument;
            let acquired = acquiring
                .instrument(tracing::info_span!(first_waits::CALL_SPAN, call = holder))
                .await;
            checker.call(key, holder, started, first_waits::take(holder));
            acquired
        } else {
            acquiring.await
        };
        let guard = match acquired {
            Ok(guard) => guard,
            Err(LockError::Timeout { .. }) => {
                tally.timeouts += 1;
                diagnose(&run.url, key, "timed out").await;
                inspect_stall(&locks, &run.url, key).await;
                continue;
            }
            Err(e) => {
                diagnose(&run.url, key, &e.to_string()).await;
                // Faults make acquisitions fail; the run goes on, and the
                // controller judges the counts.
                tally.errors += 1;
                tally.first_error.get_or_insert_with(|| e.to_string());
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let token = guard.fencing_token().unwrap_or(0);
        let exclusive = share == Share::EXCLUSIVE;
        // A segment is a lock of its own, `key#i`.
        let segment = guard.key().to_owned();
        let keys: Vec<&str> = match kind {
            Kind::Segments { split: true, .. } => vec![segment.as_str()],
            _ => keys,
        };
        let key = keys[0];
        for key in &keys {
            checker.enter_shared(key, holder, token, share);
        }
        let work = async {
            if token != 0 {
                checker.write(key, token, true);
            }
            if exclusive {
                for key in &keys {
                    checker.bump(key).await;
                }
            }
            tokio::time::sleep(body).await;
        };
        tokio::select! {
            biased;
            _ = guard.lost() => {
                for key in &keys {
                    if exclusive {
                        checker.lost(key, holder, token, guard.valid_until().into_std());
                    } else {
                        checker.exit_shared(key, holder, token, share);
                    }
                }
                tally.lost += 1;
            }
            () = work => {
                for key in &keys {
                    checker.exit_shared(key, holder, token, share);
                }
                tally.taken += 1;
            }
        }
        if let Err(e) = guard.release().await
            && !matches!(e, LockError::Lost { .. } | LockError::NotHeld { .. })
        {
            // A release the server could not take (it was down): the lease
            // ends by its ttl (README: "Guarantees").
            tally.release_errors += 1;
            tally.first_error.get_or_insert_with(|| e.to_string());
        }
    }
    Ok(tally)
}

/// The exclusive lock with its body run by `run()`, which must drop the
/// body before the lease's deadline when the lease is lost.
#[derive(Debug, Clone, Copy)]
struct RunBody {
    /// The lease is renewed (`library-run`) or fixed (`library-run-fixed`:
    /// a body longer than the ttl loses it on the lease's own timer).
    renewed: bool,
    /// The control (`library-run-detached`, fixed lease): the body's work
    /// runs in a task of its own, which the runner's drop does not stop,
    /// as if the runner ignored the lost lease.
    detached: bool,
}

impl RunBody {
    fn parse(lock: &str) -> Option<RunBody> {
        match lock {
            "library-run" => Some(RunBody {
                renewed: true,
                detached: false,
            }),
            "library-run-fixed" => Some(RunBody {
                renewed: false,
                detached: false,
            }),
            "library-run-detached" => Some(RunBody {
                renewed: false,
                detached: true,
            }),
            _ => None,
        }
    }
}

/// Tells the checker a body left `key`, however it ends: at its end, or
/// dropped by the runner.
struct ExitOnDrop {
    checker: lock_tests::witness::Witness,
    key: String,
    holder: u64,
    token: u64,
}

impl Drop for ExitOnDrop {
    fn drop(&mut self) {
        self.checker
            .exit_shared(&self.key, self.holder, self.token, Share::EXCLUSIVE);
    }
}

async fn run_body_task(
    task: usize,
    run: WitnessRun,
    checker: lock_tests::witness::Witness,
    locks: LockClient,
    mode: RunBody,
) -> Result<Tally, BoxError> {
    let start = std::time::Instant::now();
    let mut tally = Tally::default();
    let fencing = !run.url.starts_with("redlock=");
    let long_percent: u32 = std::env::var("LOCK_WORKER_LONG_BODY_PERCENT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    while run.going(start) {
        let key = pick(&run.keys).to_owned();
        let length = if rand::random_ratio(long_percent.min(100), 100) {
            Duration::from_millis(500) + body_length(Duration::from_millis(2000))
        } else {
            body_length(run.max_body)
        };
        let holder = next_holder(task);
        let body = {
            let (checker, key) = (checker.clone(), key.clone());
            async move {
                let token = lock_runtime::fencing_token().unwrap_or(0);
                checker.enter_shared(&key, holder, token, Share::EXCLUSIVE);
                let exit = ExitOnDrop {
                    checker: checker.clone(),
                    key: key.clone(),
                    holder,
                    token,
                };
                let work = async move {
                    if token != 0 {
                        checker.write(&key, token, true);
                    }
                    checker.bump(&key).await;
                    tokio::time::sleep(length).await;
                    drop(exit);
                };
                if mode.detached {
                    let _ = tokio::spawn(work).await;
                } else {
                    work.await;
                }
            }
        };
        let outcome = locks
            .lock(key.as_str())
            .ttl(run.ttl)
            .renew(mode.renewed)
            .fencing(fencing)
            .wait(call_wait())
            .run(body)
            .await;
        match outcome {
            Ok(()) => tally.taken += 1,
            Err(LockError::Lost { .. }) => tally.lost += 1,
            Err(LockError::Timeout { .. }) => tally.timeouts += 1,
            Err(e) => {
                tally.errors += 1;
                tally.first_error.get_or_insert_with(|| e.to_string());
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    Ok(tally)
}

/// How a candidate leads: as told (`library-election`), or with each
/// term's work in a task the runner cannot stop (`library-election-detached`:
/// a leader that is not told its term ended, the control).
#[derive(Debug, Clone, Copy)]
struct Candidate {
    detached: bool,
}

impl Candidate {
    fn parse(lock: &str) -> Option<Candidate> {
        match lock {
            "library-election" => Some(Candidate { detached: false }),
            "library-election-detached" => Some(Candidate { detached: true }),
            _ => None,
        }
    }
}

/// One term as the checker sees it: entered when its future starts, left
/// when its work ends or the future is dropped. A term that ends with its
/// leadership no longer held was lost: the checker is told so, with the
/// term's validity deadline (a leader paused past it ends its term there,
/// since it could not be told).
struct Term {
    checker: lock_tests::witness::Witness,
    key: String,
    holder: u64,
    leadership: lock_runtime::Leadership,
    ended: bool,
    counts: std::sync::Arc<TermCounts>,
}

#[derive(Default)]
struct TermCounts {
    ended: std::sync::atomic::AtomicU64,
    lost: std::sync::atomic::AtomicU64,
}

impl Drop for Term {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering;
        let epoch = self.leadership.epoch();
        // Judged by the clock, not by how the work ended: work that ran
        // to its end after the deadline (a leader stopped, then continued)
        // ended a lost term.
        if !self.leadership.is_held() {
            self.counts.lost.fetch_add(1, Ordering::Relaxed);
            let deadline = self.leadership.valid_until().into_std();
            self.checker.lost(&self.key, self.holder, epoch, deadline);
            return;
        }
        if self.ended {
            self.counts.ended.fetch_add(1, Ordering::Relaxed);
        }
        self.checker
            .exit_shared(&self.key, self.holder, epoch, Share::EXCLUSIVE);
    }
}

/// A candidate in the election `run.keys[task % keys]` until the run's
/// time is up, through `Election::run` (which campaigns again after each
/// term). Most terms work for up to `max_body` and are resigned; the
/// share `LOCK_WORKER_LONG_BODY_PERCENT` works 0.5–2.5 s, renewed across
/// faults. The control's terms work 6–8 s each, longer than any stop,
/// so that a term lost in a stop is still working when its successor
/// begins.
async fn election_task(
    task: usize,
    run: WitnessRun,
    checker: lock_tests::witness::Witness,
    locks: LockClient,
    candidate: Candidate,
) -> Result<Tally, BoxError> {
    let mut tally = Tally::default();
    let key = run.keys[task % run.keys.len()].clone();
    let long_percent: u32 = std::env::var("LOCK_WORKER_LONG_BODY_PERCENT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    let counts = std::sync::Arc::new(TermCounts::default());
    let election = locks.election(key.as_str()).ttl(run.ttl).wait(call_wait());
    let lead = |leadership: lock_runtime::Leadership| {
        let (checker, key, counts) = (checker.clone(), key.clone(), std::sync::Arc::clone(&counts));
        let holder = next_holder(task);
        let length = if candidate.detached {
            Duration::from_secs(6) + body_length(Duration::from_secs(2))
        } else if rand::random_ratio(long_percent.min(100), 100) {
            Duration::from_millis(500) + body_length(Duration::from_millis(2000))
        } else {
            body_length(run.max_body)
        };
        async move {
            let epoch = leadership.epoch();
            checker.enter_shared(&key, holder, epoch, Share::EXCLUSIVE);
            let term = Term {
                checker: checker.clone(),
                key: key.clone(),
                holder,
                leadership,
                ended: false,
                counts,
            };
            let work = async move {
                let mut term = term;
                let write = |epoch| {
                    checker.write(&key, epoch, true);
                    checker.write(&lock_tests::lab::unfenced_register(&key), epoch, false);
                };
                write(epoch);
                checker.bump(&key).await;
                let mut ends = tokio::time::Instant::now() + length;
                while tokio::time::Instant::now() < ends {
                    // A poll of the controller's requests, not a
                    // synchronisation: one is taken within 10 ms.
                    tokio::time::sleep_until(
                        ends.min(tokio::time::Instant::now() + Duration::from_millis(10)),
                    )
                    .await;
                    if candidate.detached {
                        continue;
                    }
                    let taken = |request| {
                        std::fs::remove_file(term_request(checker.dir(), std::process::id(), request)).is_ok()
                    };
                    if taken(TermRequest::Hold) {
                        // Works on until `run` drops it, when the term is
                        // lost.
                        ends = tokio::time::Instant::now() + Duration::from_secs(3600);
                    }
                    if taken(TermRequest::Pause) {
                        // The whole process stops here, and runs on from
                        // here when continued: the write below comes
                        // before the runtime can drop this term.
                        nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP)?;
                        write(epoch);
                    }
                }
                term.ended = true;
                drop(term);
                Ok::<(), nix::Error>(())
            };
            if candidate.detached {
                let _ = tokio::spawn(work).await;
            } else {
                let _ = work.await;
            }
        }
    };
    let value = format!("{}:{task}", std::process::id());
    tokio::select! {
        // The run is over: the term in progress, if any, is dropped and
        // resigned.
        () = run.ended() => {}
        result = election.run(value, lead) => match result {
            Err(e) => {
                tally.errors += 1;
                tally.first_error = Some(e.to_string());
            }
            Ok(never) => match never {},
        },
    }
    tally.taken = counts.ended.load(std::sync::atomic::Ordering::Relaxed);
    tally.lost = counts.lost.load(std::sync::atomic::Ordering::Relaxed);
    Ok(tally)
}

/// SET NX PX, retried: a lock with its own bug to be caught.
async fn broken_task(
    task: usize,
    run: WitnessRun,
    checker: lock_tests::witness::Witness,
    mut raw: redis::aio::MultiplexedConnection,
) -> Result<Tally, BoxError> {
    let start = std::time::Instant::now();
    let mut tally = Tally::default();
    let owner = format!("{}:{task}", std::process::id());
    while run.going(start) {
        let key = pick(&run.keys);
        let body = body_length(run.max_body);
        let acquired: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(&owner)
            .arg("NX")
            .arg("PX")
            .arg(run.ttl.as_millis() as u64)
            .query_async(&mut raw)
            .await?;
        if acquired.is_none() {
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        }
        let holder = next_holder(task);
        let deadline = std::time::Instant::now() + run.ttl - Duration::from_millis(5);
        checker.enter(key, holder, 0);
        checker.bump(key).await;
        match run.lock.as_str() {
            "no-deadline" => {
                // Bug: keeps working after the lease ran out.
                tokio::time::sleep(body).await;
            }
            "blind-renew" => {
                // Bug: renews by overwriting, so a renewal that comes late
                // takes the lock back from whoever got it meanwhile, and the
                // holder never learns it had lost it.
                let until = std::time::Instant::now() + body * 3;
                while std::time::Instant::now() < until {
                    tokio::time::sleep(body_length(run.ttl * 2)).await;
                    let _: () = redis::cmd("SET")
                        .arg(key)
                        .arg(&owner)
                        .arg("PX")
                        .arg(run.ttl.as_millis() as u64)
                        .query_async(&mut raw)
                        .await?;
                }
            }
            _ => {
                // Stops in time, like a correct holder...
                tokio::time::sleep_until(deadline.min(std::time::Instant::now() + body).into()).await;
            }
        }
        checker.exit(key, holder, 0);
        if run.lock == "del-release" {
            // ...but its release is slow and has no owner check: it deletes
            // whoever holds the key by then.
            tokio::time::sleep(run.ttl / 2).await;
            let _: i64 = raw.del(key).await?;
        } else {
            let _: i64 = redis::Script::new(
                "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
            )
            .key(key)
            .arg(&owner)
            .invoke_async(&mut raw)
            .await?;
        }
        tally.taken += 1;
    }
    Ok(tally)
}

/// A holder paused between its check and its write (a GC pause, a stalled
/// VM): the lock cannot help it; only a fenced resource can.
async fn act_until_lost(
    url: &str,
    witness_dir: &str,
    key: &str,
    ttl_ms: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    let locks = connect(url).await?;
    let checker = lock_tests::witness::Witness::open(std::path::Path::new(witness_dir))?;
    let register = format!("{key}:acts");
    let outcome = locks
        .lock(key)
        .ttl(Duration::from_millis(ttl_ms))
        .fencing(true)
        .run(async {
            let token = lock_runtime::fencing_token().unwrap_or(0);
            println!("HELD {token}");
            checker.write(&register, token, false);
            // Stopped between two acts, never in the middle of one (an act
            // under way when the process stops lands late whatever the
            // lock does: that is what fencing is for), and while the body
            // waits on a timer: after the stop, that timer and the lease's
            // deadline come due together, and only the order in which the
            // runner looks at them keeps the body from acting.
            std::thread::spawn(|| {
                std::thread::sleep(Duration::from_micros(300));
                let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGSTOP);
            });
            loop {
                tokio::time::sleep(Duration::from_millis(20)).await;
                checker.write(&register, token, false);
            }
        })
        .await;
    match outcome {
        Err(LockError::Lost { .. }) => {
            println!("LOST");
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

async fn pause(
    url: &str,
    witness_dir: &str,
    key: &str,
    ttl_ms: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    let locks = connect(url).await?;
    let checker = lock_tests::witness::Witness::open(std::path::Path::new(witness_dir))?;
    let guard = locks
        .lock(key)
        .ttl(Duration::from_millis(ttl_ms))
        .renew(false)
        .fencing(true)
        .acquire()
        .await?;
    let token = guard.fencing_token().ok_or("no token")?;
    println!("PAUSING {token}");
    nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGSTOP)?;
    checker.write(&format!("{key}:fenced"), token, true);
    checker.write(&format!("{key}:unfenced"), token, false);
    println!("WROTE");
    drop(guard);
    Ok(())
}

/// When each fair call was first told to wait: the library's `waiting for
/// the lock` event (docs/operations.md), inside the span this worker opens
/// around the call. The checker takes the library's word for no more than
/// that an answer found the lock held; the order it judges is what the
/// bodies' entries show.
mod first_waits {
    use std::collections::HashMap;
    use std::sync::{Mutex, PoisonError};

    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id};
    use tracing::{Event, Subscriber};
    use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
    use tracing_subscriber::registry::LookupSpan;

    /// The name of the span around one fair call; its field `call` is the
    /// call's holder id.
    pub(crate) const CALL_SPAN: &str = "witness_call";
    const WAITING: &str = "waiting for the lock";

    static FIRST_WAIT: Mutex<Option<HashMap<u64, u64>>> = Mutex::new(None);

    /// When call `call` was first told to wait, if it was; forgotten after.
    pub(crate) fn take(call: u64) -> Option<u64> {
        FIRST_WAIT
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_mut()?
            .remove(&call)
    }

    /// Installs the process's subscriber: only the call spans and the
    /// library's events reach it, so nothing else pays for it.
    pub(crate) fn install() -> Result<(), tracing::subscriber::SetGlobalDefaultError> {
        let only = tracing_subscriber::filter::filter_fn(|meta| {
            if meta.is_span() {
                meta.name() == CALL_SPAN
            } else {
                meta.target().starts_with("lock_runtime") && meta.fields().field("attempts").is_some()
            }
        });
        tracing::subscriber::set_global_default(
            tracing_subscriber::registry().with(FirstWaits.with_filter(only)),
        )
    }

    struct CallId(u64);

    struct FirstWaits;

    struct CallField(Option<u64>);

    impl Visit for CallField {
        fn record_u64(&mut self, field: &Field, value: u64) {
            if field.name() == "call" {
                self.0 = Some(value);
            }
        }
        fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
    }

    struct IsWaiting(bool);

    impl Visit for IsWaiting {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            if field.name() == "message" {
                self.0 = format!("{value:?}") == WAITING;
            }
        }
    }

    impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for FirstWaits {
        fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
            let mut call = CallField(None);
            attrs.record(&mut call);
            if let (Some(call), Some(span)) = (call.0, ctx.span(id)) {
                span.extensions_mut().insert(CallId(call));
            }
        }

        fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
            let at = lock_tests::witness::now_ns();
            let mut waiting = IsWaiting(false);
            event.record(&mut waiting);
            if !waiting.0 {
                return;
            }
            let Some(scope) = ctx.event_scope(event) else {
                return;
            };
            for span in scope {
                if let Some(CallId(call)) = span.extensions().get::<CallId>() {
                    FIRST_WAIT
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .get_or_insert_with(HashMap::new)
                        .entry(*call)
                        .or_insert(at);
                    return;
                }
            }
        }
    }
}
