//! A lock client in its own OS process, driven by the integration tests.
//!
//! - `lock-worker count <url> <key> <counter-key> <n>`: `n` times, under the
//!   lock, read the counter with GET and write it back plus one with SET.
//! - `lock-worker hold <url> <key> <ttl-ms>`: take the lock, print `HELD`,
//!   and keep it until killed; `hold-renewed` the same with lease renewal.
//! - `lock-worker pause <url> <witness-url> <key> <ttl-ms>`: take the lock
//!   with a fencing token, print `PAUSING`, stop itself (SIGSTOP) before its
//!   write, and once continued write the token to the witness's fenced and
//!   unfenced registers (keys `<key>:fenced`, `<key>:unfenced`).
//! - `lock-worker wait <url> <key>`: wait up to 30 s for the lock, then print
//!   the wall-clock time it was acquired (ns since the epoch) and release it.
//! - `lock-worker witness <lock-url> <witness-url> <key> <tasks> <ms> <lock>
//!   <ttl-ms> <max-body-ms>`: `tasks` tasks take `lock` on `key` for `ms`
//!   milliseconds, each body reporting to the witness (see
//!   `lock_tests::witness`). `lock` is `library`, or a deliberately broken
//!   lock the checker must catch: `del-release` (released by a plain DEL, no
//!   owner check), `no-deadline` (the body ignores its lease running out) or
//!   `blind-renew` (renews with a plain SET, never noticing it lost the lock).
//! - `lock-worker fence <url> <key> <n>`: `n` times, take the lock with a
//!   fencing token and, under the lock, append the token to the list
//!   `fence-log`: the list's order is the acquisition order.

use std::time::Duration;

use lock_runtime::{LockClient, LockError};

use redis::AsyncCommands;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        [_, "count", url, key, counter, n] => count(url, key, counter, n.parse()?).await,
        [_, "hold", url, key, ttl_ms] => hold(url, key, ttl_ms.parse()?, false).await,
        [_, "hold-renewed", url, key, ttl_ms] => hold(url, key, ttl_ms.parse()?, true).await,
        [_, "pause", url, witness_url, key, ttl_ms] => pause(url, witness_url, key, ttl_ms.parse()?).await,
        [_, "wait", url, key] => wait(url, key).await,
        [_, "fence", url, key, n] => fence(url, key, n.parse()?).await,
        [
            _,
            "witness",
            url,
            witness_url,
            key,
            tasks,
            ms,
            lock,
            ttl_ms,
            max_body_ms,
        ] => {
            let run = WitnessRun {
                url: (*url).to_owned(),
                key: (*key).to_owned(),
                duration: Duration::from_millis(ms.parse()?),
                ttl: Duration::from_millis(ttl_ms.parse()?),
                max_body: Duration::from_millis(max_body_ms.parse()?),
                lock: (*lock).to_owned(),
            };
            witness(run, witness_url, tasks.parse()?).await
        }
        _ => Err("usage: lock-worker count|hold|wait|fence URL KEY ...".into()),
    }
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

async fn hold(url: &str, key: &str, ttl_ms: u64, renew: bool) -> Result<(), Box<dyn std::error::Error>> {
    let locks = LockClient::connect(url).await?;
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

async fn wait(url: &str, key: &str) -> Result<(), Box<dyn std::error::Error>> {
    let locks = LockClient::connect(url).await?;
    let guard = locks.lock(key).wait(Duration::from_secs(30)).acquire().await?;
    let acquired = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    println!("{}", acquired.as_nanos());
    guard.release().await?;
    Ok(())
}

async fn fence(url: &str, key: &str, n: u32) -> Result<(), Box<dyn std::error::Error>> {
    let locks = LockClient::connect(url).await?;
    let mut data = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    for _ in 0..n {
        let data = &mut data;
        locks
            .lock(key)
            .fencing(true)
            .wait(Duration::from_secs(30))
            .run(async move {
                let token = lock_runtime::fencing_token().ok_or("no fencing token")?;
                data.rpush::<_, _, ()>("fence-log", token).await?;
                Ok::<_, Box<dyn std::error::Error>>(())
            })
            .await??;
    }
    Ok(())
}

#[derive(Clone)]
struct WitnessRun {
    url: String,
    key: String,
    duration: Duration,
    ttl: Duration,
    max_body: Duration,
    lock: String,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

async fn witness(run: WitnessRun, witness_url: &str, tasks: usize) -> Result<(), Box<dyn std::error::Error>> {
    let checker = lock_tests::witness::Witness::connect(witness_url).await?;
    let locks = LockClient::connect(&run.url).await?;
    let raw = redis::Client::open(run.url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let workers: Vec<_> = (0..tasks)
        .map(|task| {
            let (run, checker, locks, raw) = (run.clone(), checker.clone(), locks.clone(), raw.clone());
            tokio::spawn(async move { witness_task(task, run, checker, locks, raw).await })
        })
        .collect();
    let (mut taken, mut lost) = (0u64, 0u64);
    for w in workers {
        let (t, l) = w.await?.map_err(|e| e.to_string())?;
        taken += t;
        lost += l;
    }
    println!("{{\"taken\":{taken},\"lost\":{lost}}}");
    Ok(())
}

/// A body of random length up to `max_body`.
fn body_length(max: Duration) -> Duration {
    use rand::Rng;
    let nanos = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(rand::rng().random_range(0..=nanos))
}

async fn witness_task(
    task: usize,
    run: WitnessRun,
    checker: lock_tests::witness::Witness,
    locks: LockClient,
    mut raw: redis::aio::MultiplexedConnection,
) -> Result<(u64, u64), BoxError> {
    let start = std::time::Instant::now();
    let (mut taken, mut lost) = (0, 0);
    let holder = format!("{}:{task}", std::process::id());
    while start.elapsed() < run.duration {
        let body = body_length(run.max_body);
        match run.lock.as_str() {
            "library" => {
                let outcome = locks
                    .lock(run.key.as_str())
                    .ttl(run.ttl)
                    .fencing(true)
                    .wait(Duration::from_secs(10))
                    .run(async {
                        checker.enter(&run.key).await?;
                        let token = lock_runtime::fencing_token().ok_or("no token")?;
                        checker.write(&run.key, token, true).await?;
                        checker.bump(&run.key).await?;
                        tokio::time::sleep(body).await;
                        checker.exit(&run.key).await?;
                        Ok::<_, BoxError>(())
                    })
                    .await;
                match outcome {
                    Ok(result) => {
                        result?;
                        taken += 1;
                    }
                    Err(LockError::Lost { .. }) => lost += 1,
                    Err(LockError::Timeout { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            broken => {
                // SET NX PX, retried: a lock with its own bug to be caught.
                let acquired: Option<String> = redis::cmd("SET")
                    .arg(&run.key)
                    .arg(&holder)
                    .arg("NX")
                    .arg("PX")
                    .arg(run.ttl.as_millis() as u64)
                    .query_async(&mut raw)
                    .await?;
                if acquired.is_none() {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
                let deadline = std::time::Instant::now() + run.ttl - Duration::from_millis(5);
                checker.enter(&run.key).await?;
                checker.bump(&run.key).await?;
                if broken == "no-deadline" {
                    // Bug: keeps working after the lease ran out.
                    tokio::time::sleep(body).await;
                } else if broken == "blind-renew" {
                    // Bug: renews by overwriting, so a renewal that comes late
                    // takes the lock back from whoever got it meanwhile, and
                    // the holder never learns it had lost it.
                    let until = std::time::Instant::now() + body * 3;
                    while std::time::Instant::now() < until {
                        tokio::time::sleep(body_length(run.ttl * 2)).await;
                        let _: () = redis::cmd("SET")
                            .arg(&run.key)
                            .arg(&holder)
                            .arg("PX")
                            .arg(run.ttl.as_millis() as u64)
                            .query_async(&mut raw)
                            .await?;
                    }
                } else {
                    // Stops in time, like a correct holder...
                    tokio::time::sleep_until(deadline.min(std::time::Instant::now() + body).into()).await;
                }
                checker.exit(&run.key).await?;
                if broken == "del-release" {
                    // ...but its release is slow and has no owner check: it
                    // deletes whoever holds the key by then.
                    tokio::time::sleep(run.ttl / 2).await;
                    let _: i64 = raw.del(&run.key).await?;
                } else {
                    let _: i64 = redis::Script::new(
                        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
                    )
                    .key(&run.key)
                    .arg(&holder)
                    .invoke_async(&mut raw)
                    .await?;
                }
                taken += 1;
            }
        }
    }
    Ok((taken, lost))
}

/// A holder paused between its check and its write (a GC pause, a stalled
/// VM): the lock cannot help it; only a fenced resource can.
async fn pause(
    url: &str,
    witness_url: &str,
    key: &str,
    ttl_ms: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    let locks = LockClient::connect(url).await?;
    let checker = lock_tests::witness::Witness::connect(witness_url).await?;
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
    checker.write(&format!("{key}:fenced"), token, true).await?;
    checker.write(&format!("{key}:unfenced"), token, false).await?;
    println!("WROTE");
    drop(guard);
    Ok(())
}
