//! Test support: real servers on free loopback ports (`server`), links
//! that fail on demand (`proxy`), clusters (`cluster`), the fault suite's
//! checker (`witness`, `monitor`, `lab`, `report`), and the workloads and
//! helpers the tests share (here).

use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub mod certificates;
pub mod cluster;
pub mod etcd;
pub mod lab;
pub mod load;
pub mod mariadb;
pub mod monitor;
pub mod postgres;
pub mod proxy;
pub mod report;
pub mod secrets;
pub mod sentinel;
pub mod server;
pub mod witness;
pub mod zookeeper;

pub use certificates::{make_certificates, make_certificates_for, make_client_certificate};
pub use cluster::Cluster;
pub use etcd::Etcd;
pub use mariadb::MariaDb;
pub use postgres::Postgres;
pub use proxy::Proxy;
pub use sentinel::Replicated;
pub use server::{
    LOCK_USER, LOCK_USER_CLUSTER_RULES, LOCK_USER_PASSWORD, LOCK_USER_REDLOCK_RULES, LOCK_USER_RULES,
    LOCK_USER_SENTINEL_MASTER_RULES, LOCK_USER_SENTINEL_RULES, RIVAL, RedisServer, RivalLock,
    commands_between, free_port, percent_encode, redis_server_binary, start_masters,
};
pub use zookeeper::ZooKeeper;

/// The `redis-server` behind the process-wide client that
/// `#[distributed_lock]` functions use in tests: started once, on a thread
/// that lives as long as the process (so the server dies with the process).
pub fn install_global_client() -> &'static RedisServer {
    static GLOBAL: OnceLock<&'static RedisServer> = OnceLock::new();
    GLOBAL.get_or_init(|| {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("global-lock-client".into())
            .spawn(move || {
                let server: &'static RedisServer = Box::leak(Box::new(RedisServer::start()));
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime for the global client");
                runtime.block_on(async move {
                    let client = lock_runtime::LockClient::connect(&server.url())
                        .await
                        .expect("connect");
                    lock_runtime::init(client).expect("the global client is installed once");
                    ready_tx.send(server).expect("installer waits");
                    // Drive the client's connection for the rest of the process.
                    std::future::pending::<()>().await;
                });
            })
            .expect("spawn the global client thread");
        ready_rx.recv().expect("global client installed")
    })
}

/// The longest any test of the suite may run: the longest tier-1 fault
/// scenario takes about 100 s on this machine.
pub const TEST_LIMIT: Duration = Duration::from_secs(300);

/// Runs a test's body under a time limit of its own ([`TEST_LIMIT`]), so
/// that a test waiting on something that never happens fails with its name
/// instead of hanging the suite (a stuck CI job names nothing).
pub async fn bounded<F: std::future::Future>(test: &str, body: F) -> F::Output {
    match tokio::time::timeout(TEST_LIMIT, body).await {
        Ok(output) => output,
        Err(_) => panic!(
            "test `{test}` was still waiting after {TEST_LIMIT:?}: something it waits for (a grant, a release, a lost lease, a server's answer) never happened"
        ),
    }
}

/// Kills process `pid` if it is still running after [`TEST_LIMIT`], so a
/// test that reads a child's output (an example, a worker) cannot hang on a
/// child that waits forever; dropping the returned value calls it off.
#[must_use = "dropping the limit calls it off at once"]
pub fn kill_after_limit(pid: u32, what: &str) -> ChildLimit {
    kill_after(pid, what, TEST_LIMIT)
}

fn kill_after(pid: u32, what: &str, limit: Duration) -> ChildLimit {
    let (cancel, cancelled) = std::sync::mpsc::channel::<()>();
    let what = what.to_owned();
    std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = cancelled.recv_timeout(limit) {
            eprintln!("`{what}` was still running after {limit:?}: killed it");
            if let Ok(pid) = i32::try_from(pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    });
    ChildLimit { _cancel: cancel }
}

/// A running [`kill_after_limit`]; dropping it calls the limit off.
#[derive(Debug)]
pub struct ChildLimit {
    _cancel: std::sync::mpsc::Sender<()>,
}

/// Runs `command` to its end, as [`std::process::Command::output`] does,
/// but kills it after [`TEST_LIMIT`] and fails naming `what`.
pub fn output_within_limit(command: &mut std::process::Command, what: &str) -> std::process::Output {
    output_within(command, what, TEST_LIMIT)
}

fn output_within(command: &mut std::process::Command, what: &str, limit: Duration) -> std::process::Output {
    let child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {what}: {e}"));
    let started = Instant::now();
    let kill = kill_after(child.id(), what, limit);
    let output = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("wait for {what}: {e}"));
    drop(kill);
    assert!(
        started.elapsed() < limit,
        "`{what}` did not finish within {limit:?} (killed); stderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Until a waiter on lock `key` (default prefix) has subscribed to its
/// release channel on `server`: from then on it is waiting, and a release
/// reaches it.
pub async fn until_waiting(server: &RedisServer, key: &str) {
    let channel = format!("lock:{{{key}}}:released");
    let subscribed = eventually(Duration::from_secs(10), || {
        let counts: Vec<redis::Value> = server.query(redis::cmd("PUBSUB").arg("NUMSUB").arg(&channel));
        counts
            .get(1)
            .and_then(|n| redis::from_redis_value_ref::<i64>(n).ok())
            .is_some_and(|n| n >= 1)
    })
    .await;
    assert!(subscribed.is_some(), "nobody waits on `{key}` after 10 s");
}

/// Has `locks` open more than one pooled connection (three calls at once),
/// so that a later statement can go out on another connection than one an
/// earlier call dropped (MariaDB, PostgreSQL).
pub async fn open_several_connections(locks: &lock_runtime::LockClient) {
    let call = |key: &'static str| {
        let locks = locks.clone();
        async move { locks.lock(key).run(tokio::task::yield_now()).await }
    };
    let (a, b, c) = tokio::join!(call("w1"), call("w2"), call("w3"));
    a.and(b).and(c).expect("three calls at once");
}

/// A call in another task that takes `key` (a 30 s lease) and holds it
/// until the task is aborted.
pub fn call_holding_until_aborted(
    locks: &lock_runtime::LockClient,
    key: &str,
) -> tokio::task::JoinHandle<Result<(), lock_runtime::LockError>> {
    let (locks, key) = (locks.clone(), key.to_owned());
    tokio::spawn(async move {
        locks
            .lock(key)
            .ttl(std::time::Duration::from_secs(30))
            .run(std::future::pending::<()>())
            .await
    })
}

/// A guard on `key` taken by another task, so that the calling task waits
/// for it like any other holder (in the task that took a guard, a second
/// call for the key fails at once with `WouldDeadlock`).
pub async fn guard_from_another_task(locks: &lock_runtime::LockClient, key: &str) -> lock_runtime::LockGuard {
    guard_with(locks, key, |request| request).await
}

/// Like [`guard_from_another_task`], with the request configured by
/// `configure` (`|l| l.permits(2)`).
pub async fn guard_with<F>(
    locks: &lock_runtime::LockClient,
    key: &str,
    configure: F,
) -> lock_runtime::LockGuard
where
    F: for<'c> Fn(lock_runtime::LockRequest<'c>) -> lock_runtime::LockRequest<'c> + Send + Sync + 'static,
{
    let (locks, key) = (locks.clone(), key.to_owned());
    tokio::spawn(async move { configure(locks.lock(key)).acquire().await })
        .await
        .expect("join the holder's task")
        .expect("the holder takes the lock")
}

/// Whether a holder in another task, asking for `key` as `configure` says
/// (`|l| l.mode(LockMode::Read)`), would be refused right now (a probe that
/// gets the lock releases it at once).
pub async fn refused_elsewhere<F>(locks: &lock_runtime::LockClient, key: &str, configure: F) -> bool
where
    F: for<'c> Fn(lock_runtime::LockRequest<'c>) -> lock_runtime::LockRequest<'c> + Send + Sync + 'static,
{
    let configure = std::sync::Arc::new(configure);
    // A probe the server did not answer within the command timeout (a
    // starved machine: seen beside a CPU hog) says nothing either way: it
    // is asked again, a few times, rather than failing the test.
    const UNANSWERED_PROBES: usize = 5;
    for probe in 1.. {
        let (locks, owned, configure) = (locks.clone(), key.to_owned(), configure.clone());
        // A spawned task is a holder of its own, never a re-entry.
        let attempt = tokio::spawn(async move { configure(locks.lock(owned)).acquire().await });
        match attempt.await.expect("probe task") {
            Ok(guard) => {
                guard.release().await.expect("release probe");
                return false;
            }
            Err(lock_runtime::LockError::Timeout { .. }) => return true,
            Err(unanswered @ lock_runtime::LockError::Backend { .. })
                if probe < UNANSWERED_PROBES && unanswered.to_string().contains("no answer") =>
            {
                eprintln!("probe {probe} of `{key}` unanswered, asked again: {unanswered}");
            }
            Err(other) => panic!("probe failed: {other}"),
        }
    }
    unreachable!("the probes above return or panic")
}

/// Polls `check` until it returns true or `timeout` passes; returns how long
/// it took, or `None` on timeout. For waiting on a state the test cannot be
/// signalled about (a key expiring on the server).
pub async fn eventually(timeout: Duration, mut check: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if check() {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    check().then(|| start.elapsed())
}

/// How long a first acquisition of `key` asking for `ttl` is trusted: its
/// deadline's distance from just before the call and from just after it
/// (a starved test only makes the first longer and the second shorter).
/// The guard is released.
pub async fn first_lease(locks: &lock_runtime::LockClient, key: &str, ttl: Duration) -> (Duration, Duration) {
    let asked_at = Instant::now();
    let guard = locks.lock(key).ttl(ttl).acquire().await.expect("acquire");
    let valid_until = guard.valid_until().into_std();
    let seen_at = Instant::now();
    guard.release().await.expect("release");
    (
        valid_until.saturating_duration_since(asked_at),
        valid_until.saturating_duration_since(seen_at),
    )
}

/// How long a nested call's extension is trusted: an outer call on `key`
/// holds `outer` with no watchdog, and a nested call asks for `inner`.
/// Returns how far the lease's deadline after the nested call is from just
/// before the call and from just after it: a starved test only makes the
/// first longer and the second shorter.
pub async fn nested_extension(
    locks: &lock_runtime::LockClient,
    key: &str,
    outer: Duration,
    inner: Duration,
) -> (Duration, Duration) {
    let (asked_at, valid_until, seen_at) = locks
        .lock(key)
        .ttl(outer)
        .renew(false)
        .run(async {
            let asked_at = Instant::now();
            let nested = locks.lock(key).ttl(inner).acquire().await.expect("re-enter");
            (asked_at, nested.valid_until().into_std(), Instant::now())
        })
        .await
        .expect("the outer call");
    (
        valid_until.saturating_duration_since(asked_at),
        valid_until.saturating_duration_since(seen_at),
    )
}

/// Whether the watchdog renewed `guard`'s lease (the server confirmed a
/// renewal, which moves its deadline on) within `within`.
pub async fn renewed(guard: &lock_runtime::LockGuard, within: Duration) -> bool {
    let before = guard.valid_until();
    eventually(within, || guard.valid_until() > before)
        .await
        .is_some()
}

/// A renewal never shortens a lease. Takes `key` on `locks` with a 600 ms
/// lease, has `lengthen` make it a minute long on the server (as a nested
/// call's extension makes it, while a renewal with the old ttl may still be
/// on its way), waits for the watchdog's next confirmed renewal, and checks
/// that `seconds_left`, read on the server, still finds most of the minute.
pub async fn check_a_renewal_keeps_a_longer_lease(
    locks: &lock_runtime::LockClient,
    key: &str,
    lengthen: impl AsyncFnOnce(),
    seconds_left: impl AsyncFnOnce() -> i64,
) {
    let guard = locks
        .lock(key)
        .ttl(Duration::from_millis(600))
        .acquire()
        .await
        .expect("acquire");
    lengthen().await;
    assert!(renewed(&guard, Duration::from_secs(5)).await, "no renewal");
    let left = seconds_left().await;
    assert!(left > 50, "a renewal cut the minute-long lease to {left} s");
    guard.release().await.expect("release");
}

/// Renewals do not queue behind acquisitions for the client's pooled
/// connections (issue 57). The caller keeps the rows of `busy` locked in
/// the server, so that every attempt at one of them waits there, holding a
/// pooled connection (a key each: a client's callers of one key may queue
/// in the client). This takes the lock `held` (a 2 s lease), starts a
/// caller per key of `busy`, waits until `waiting` (how many of their
/// statements the server is running) counts `pool_size`, and then
/// requires two renewals of `held` while they still wait. With the
/// renewals on the same pool they would queue behind the callers for the
/// command timeout, and the lease would end first. Returns `held`'s guard,
/// for the caller to release once the rows are free again (the pool is
/// full until then).
pub async fn check_renewals_pass_a_full_pool(
    locks: &lock_runtime::LockClient,
    busy: &[String],
    pool_size: usize,
    waiting: impl AsyncFn() -> usize,
) -> lock_runtime::LockGuard {
    assert!(busy.len() > pool_size, "more keys than the pool has connections");
    let guard = locks
        .lock("held")
        .ttl(Duration::from_secs(2))
        .acquire()
        .await
        .expect("acquire");
    let callers: Vec<_> = busy
        .iter()
        .map(|key| {
            let (locks, key) = (locks.clone(), key.clone());
            tokio::spawn(async move {
                locks
                    .lock(key)
                    .wait(Duration::from_secs(60))
                    .run(std::future::pending::<()>())
                    .await
            })
        })
        .collect();
    let full_by = Instant::now() + Duration::from_secs(20);
    loop {
        let stuck = waiting().await;
        if stuck >= pool_size {
            break;
        }
        assert!(
            Instant::now() < full_by,
            "only {stuck} of {} callers wait in the server after 20 s",
            callers.len()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for nth in ["first", "second"] {
        assert!(
            renewed(&guard, Duration::from_secs(10)).await,
            "no {nth} renewal in 10 s while the pool's {pool_size} connections wait in the server; lost: {}",
            !guard.is_held()
        );
    }
    assert!(
        waiting().await >= pool_size,
        "the callers stopped waiting before the renewals were seen"
    );
    for caller in &callers {
        caller.abort();
    }
    guard
}

/// The mutual-exclusion workload: `tasks` tasks each increment the Redis
/// counter `counter` `per_task` times under the lock `counter`, by GET, a
/// yield, then SET, which loses updates unless the holders exclude each
/// other; an in-process witness also checks that no two bodies overlap.
/// Returns the counter's final value.
pub async fn increment_under_lock<C>(
    locks: &lock_runtime::LockClient,
    data: C,
    tasks: usize,
    per_task: usize,
) -> u64
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    use redis::AsyncCommands;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    let inside = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..tasks)
        .map(|_| {
            let (locks, mut data, inside) = (locks.clone(), data.clone(), Arc::clone(&inside));
            tokio::spawn(async move {
                for _ in 0..per_task {
                    let data = &mut data;
                    let inside = &inside;
                    locks
                        .lock("counter")
                        .wait(Duration::from_secs(30))
                        .run(async move {
                            assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders at once");
                            let value: Option<u64> = data.get("counter").await?;
                            tokio::task::yield_now().await;
                            let result = data.set::<_, _, ()>("counter", value.unwrap_or(0) + 1).await;
                            inside.fetch_sub(1, Ordering::SeqCst);
                            result
                        })
                        .await
                        .expect("lock")
                        .expect("increment");
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("worker task");
    }
    let mut data = data;
    data.get("counter").await.expect("read the counter")
}

/// A waiter in a task of its own (a separate holder): waits up to 5 s for
/// `key`, releases it, and returns the instant it got it, so that handoff
/// latency can be taken from the release that let it in.
pub fn spawn_waiter(locks: &lock_runtime::LockClient, key: &str) -> tokio::task::JoinHandle<Instant> {
    spawn_waiter_within(locks, key, Duration::from_secs(5))
}

/// [`spawn_waiter`] with a `wait` of the caller's choosing.
pub fn spawn_waiter_within(
    locks: &lock_runtime::LockClient,
    key: &str,
    wait: Duration,
) -> tokio::task::JoinHandle<Instant> {
    let (locks, key) = (locks.clone(), key.to_owned());
    tokio::spawn(async move {
        let guard = locks.lock(key).wait(wait).acquire().await.expect("waiter");
        let acquired = Instant::now();
        guard.release().await.expect("release");
        acquired
    })
}

/// A task of its own acquiring `key` within `wait` and keeping the guard
/// it got, for the caller to look at and release.
pub fn acquiring_task(
    locks: &lock_runtime::LockClient,
    key: &str,
    wait: Duration,
) -> tokio::task::JoinHandle<lock_runtime::LockGuard> {
    let (locks, key) = (locks.clone(), key.to_owned());
    tokio::spawn(async move {
        locks
            .lock(key)
            .wait(wait)
            .acquire()
            .await
            .expect("the task gets the lock")
    })
}

/// Returns once every thread of `pid` is stopped (after a SIGSTOP): the
/// signal is sent at once, but a thread running on another core stops only
/// when the kernel next has it, and a request sent meanwhile can still be
/// answered (CI: an etcd member "paused" answered a read). Read from
/// `/proc/<pid>/task/*/stat`; gives up after 2 s (the process is then
/// taken as stopped, and a test that relies on it says what it saw).
pub fn until_stopped(pid: nix::unistd::Pid) {
    let tasks = format!("/proc/{pid}/task");
    let stopped = || {
        std::fs::read_dir(&tasks).is_ok_and(|threads| {
            threads.flatten().all(|thread| {
                std::fs::read_to_string(thread.path().join("stat")).is_ok_and(|stat| {
                    // The state follows the command name's closing parenthesis.
                    stat.rsplit_once(") ")
                        .is_some_and(|(_, rest)| rest.starts_with('T') || rest.starts_with('t'))
                })
            })
        })
    };
    let give_up = Instant::now() + Duration::from_secs(2);
    while !stopped() && Instant::now() < give_up {
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod limits {
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "test `never_finishes` was still waiting after")]
    async fn a_body_that_never_finishes_fails_naming_its_test() {
        super::bounded("never_finishes", std::future::pending::<()>()).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_finishes_gives_its_output() {
        assert_eq!(super::bounded("finishes", async { 7 }).await, 7);
    }

    #[test]
    #[should_panic(expected = "`a child that never exits` did not finish within")]
    fn a_child_that_never_exits_is_killed_and_named() {
        let mut command = std::process::Command::new("sleep");
        command.arg("600");
        super::output_within(
            &mut command,
            "a child that never exits",
            Duration::from_millis(200),
        );
    }

    #[test]
    fn a_child_that_exits_gives_its_output() {
        let mut command = std::process::Command::new("echo");
        command.arg("done");
        let output = super::output_within(&mut command, "echo", Duration::from_secs(60));
        assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "done");
    }
}
