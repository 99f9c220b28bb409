//! Fair locks (`fair = true`): waiters get the lock in the order they
//! started waiting, on one `redis-server`, on a master found through Redis
//! Sentinel and on a Redis Cluster (where the line is read from the server
//! to know each waiter is in it), a dead
//! waiter is skipped within the configured bound, and a waiter whose wait
//! runs out leaves the line; the same on MariaDB, where the line is rows of
//! the members table, and on PostgreSQL, with the same layout. The
//! in-process backend hands out in order too; a Redlock refuses fair locks.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError};
use lock_tests::monitor::Monitor;
use lock_tests::{Cluster, MariaDb, Postgres, RedisServer, Replicated, eventually, start_masters};

/// A client, and a way to read the fair lock's line on the server.
struct Fixture {
    locks: LockClient,
    /// The Redis server that holds key `k`'s lock and line.
    server_of: Box<dyn Fn(&str) -> ::redis::Connection + Send>,
    /// The MariaDB whose table holds the locks, on that backend.
    mariadb: Option<MariaDb>,
    /// The PostgreSQL whose table holds the locks, on that backend.
    postgres: Option<Postgres>,
    _servers: Vec<Box<dyn std::any::Any + Send>>,
}

/// The line's order is what most tests here check, so their clients keep
/// a place for a waiter that makes no attempt for 30 s, and wait 10 s for
/// an answer. At the defaults (2 s, 1 s), a waiter starved of CPU (a loaded
/// CI machine) loses its place by design, or a release is not answered in
/// time, and the test would fail for the starvation, not for the line.
/// The place's bound itself is tested with a monitor in the dead-waiter
/// tests.
fn patient() -> lock_runtime::LockClientBuilder {
    LockClient::builder()
        .fair_waiter_timeout(Duration::from_secs(30))
        .command_timeout(Duration::from_secs(10))
}

async fn redis() -> Fixture {
    redis_with(patient()).await
}

async fn redis_with(builder: lock_runtime::LockClientBuilder) -> Fixture {
    let server = RedisServer::start();
    let url = server.url();
    Fixture {
        locks: builder.connect(&url).await.expect("connect"),
        server_of: Box::new(move |_| {
            ::redis::Client::open(url.as_str())
                .and_then(|c| c.get_connection())
                .expect("admin connection")
        }),
        mariadb: None,
        postgres: None,
        _servers: vec![Box::new(server)],
    }
}

async fn sentinel() -> Fixture {
    let group = Replicated::start_named(1);
    let url = group.master.url();
    Fixture {
        locks: patient()
            .replica_acks(1)
            .sentinel(lock_tests::sentinel::MASTER_NAME, group.sentinel_urls())
            .await
            .expect("connect through the test sentinels"),
        server_of: Box::new(move |_| {
            ::redis::Client::open(url.as_str())
                .and_then(|c| c.get_connection())
                .expect("admin connection")
        }),
        mariadb: None,
        postgres: None,
        _servers: vec![Box::new(group)],
    }
}

async fn mysql() -> Fixture {
    let server = MariaDb::start();
    Fixture {
        locks: patient().mysql(&server.url()).await.expect("mysql client"),
        server_of: Box::new(|_| unreachable!("no Redis server on MariaDB")),
        mariadb: Some(server),
        postgres: None,
        _servers: Vec::new(),
    }
}

async fn postgres() -> Fixture {
    let server = Postgres::start();
    Fixture {
        locks: patient().postgres(&server.url()).await.expect("postgres client"),
        server_of: Box::new(|_| unreachable!("no Redis server on PostgreSQL")),
        mariadb: None,
        postgres: Some(server),
        _servers: Vec::new(),
    }
}

async fn cluster() -> Fixture {
    let cluster = Cluster::start(3, 0);
    let locks = patient().cluster(cluster.urls()).await.expect("cluster client");
    let urls = cluster.urls();
    let masters: Vec<usize> = (0..64)
        .map(|i| cluster.master_of(&format!("lock:{{q{i}}}")))
        .collect();
    Fixture {
        locks,
        server_of: Box::new(move |key| {
            let index: usize = key.trim_start_matches('q').parse().unwrap_or(0);
            ::redis::Client::open(urls[masters[index % 64]].as_str())
                .and_then(|c| c.get_connection())
                .expect("admin connection")
        }),
        mariadb: None,
        postgres: None,
        _servers: vec![Box::new(cluster)],
    }
}

/// How many waiters stand in the line of fair lock `key`.
fn line_length(f: &Fixture, key: &str) -> i64 {
    if let Some(postgres) = &f.postgres {
        let rows = tokio::task::block_in_place(|| {
            postgres.sql(&format!(
                "SELECT count(*) FROM distributed_locks_members WHERE name = 'lock:{{{key}}}'"
            ))
        });
        return rows.first().and_then(|c| c.parse().ok()).expect("a count");
    }
    if let Some(mariadb) = &f.mariadb {
        let rows = mariadb.block_on_sql(&format!(
            "SELECT COUNT(*) FROM distributed_locks_members WHERE name = 'lock:{{{key}}}'"
        ));
        let count = rows
            .into_iter()
            .next()
            .and_then(|r| r.into_iter().next().flatten());
        return count.and_then(|c| c.parse().ok()).expect("a count");
    }
    let mut conn = (f.server_of)(key);
    ::redis::cmd("ZCARD")
        .arg(format!("lock:{{{key}}}:line"))
        .query(&mut conn)
        .expect("ZCARD")
}

macro_rules! on_redis_backends {
    ($($behaviour:ident),+ $(,)?) => {
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    lock_tests::bounded(stringify!($behaviour), async move {
                        super::$behaviour(super::redis().await).await;
                    })
                    .await
                }
            )+
        }
        mod sentinel {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    lock_tests::bounded(stringify!($behaviour), async move {
                        super::$behaviour(super::sentinel().await).await;
                    })
                    .await
                }
            )+
        }
        mod cluster {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    lock_tests::bounded(stringify!($behaviour), async move {
                        super::$behaviour(super::cluster().await).await;
                    })
                    .await
                }
            )+
        }
    };
}

on_redis_backends!(
    a_held_fair_lock_is_refused_to_everyone_else,
    waiters_get_the_lock_in_arrival_order,
    a_waiter_whose_wait_runs_out_leaves_the_line,
    a_foreign_value_at_a_fair_locks_key_is_a_conflict_left_alone,
);

/// The fair-lock behaviours that read no Redis key, on MariaDB.
mod mysql {
    macro_rules! on_mysql {
        ($($behaviour:ident),+ $(,)?) => {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    lock_tests::bounded(stringify!($behaviour), async move {
                        super::$behaviour(super::mysql().await).await;
                    })
                    .await
                }
            )+
        };
    }
    on_mysql!(
        a_held_fair_lock_is_refused_to_everyone_else,
        waiters_get_the_lock_in_arrival_order,
        a_waiter_whose_wait_runs_out_leaves_the_line,
    );

    /// A waiter whose process died (a place in line that no attempt
    /// renews, queued before everyone) delays the next waiter by at most
    /// the configured bound plus a poll. A starved trial runs again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dead_waiter_is_skipped_within_the_bound() {
        lock_tests::bounded("mysql::a_dead_waiter_is_skipped_within_the_bound", async move {
            const BOUND: std::time::Duration = std::time::Duration::from_millis(500);
            let server = lock_tests::MariaDb::start();
            let locks = lock_runtime::LockClient::builder()
                .fair_waiter_timeout(BOUND)
                .mysql(&server.url())
                .await
                .expect("mysql client");
            super::dead_waiter_trials(&locks, BOUND, |key| {
                let corpse = format!("f:{}:1", "d".repeat(32));
                server.block_on_sql(&format!(
                    "INSERT INTO distributed_locks_members (name, member, expires_at, queued_at) \
                     VALUES ('lock:{{{key}}}', '{corpse}', NOW(6) + INTERVAL 500000 MICROSECOND, '2001-01-01')"
                ));
            }, |key| {
                server.block_on_sql(&format!(
                    "SELECT COUNT(*) FROM distributed_locks_members WHERE name = 'lock:{{{key}}}'"
                ))[0][0].as_deref() == Some("2")
            })
            .await;
        })
        .await
    }
}

/// The fair-lock behaviours that read no Redis key, on PostgreSQL.
mod postgres {
    macro_rules! on_postgres {
        ($($behaviour:ident),+ $(,)?) => {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    lock_tests::bounded(stringify!($behaviour), async move {
                        super::$behaviour(super::postgres().await).await;
                    })
                    .await
                }
            )+
        };
    }
    on_postgres!(
        a_held_fair_lock_is_refused_to_everyone_else,
        waiters_get_the_lock_in_arrival_order,
        a_waiter_whose_wait_runs_out_leaves_the_line,
    );
}

/// While one task holds a fair lock, another's try is refused: the
/// script's "already mine" answer (an earlier attempt of the same
/// acquisition applied, its reply lost) is for the holder's own id only.
async fn a_held_fair_lock_is_refused_to_everyone_else(f: Fixture) {
    let held = lock_tests::guard_with(&f.locks, "q1", |l| l.fair(true)).await;
    assert!(
        lock_tests::refused_elsewhere(&f.locks, "q1", |l| l.fair(true)).await,
        "a second holder got a held fair lock"
    );
    held.release().await.expect("release");
    assert!(!lock_tests::refused_elsewhere(&f.locks, "q1", |l| l.fair(true)).await);
}

/// A value this library did not write and that never expires sits at the
/// key: a fair lock names it as a conflict at once instead of waiting for a
/// release that cannot come, and leaves it as it was.
async fn a_foreign_value_at_a_fair_locks_key_is_a_conflict_left_alone(f: Fixture) {
    let mut conn = (f.server_of)("q7");
    let _: () = ::redis::cmd("SET")
        .arg("lock:{q7}")
        .arg("someone else's")
        .query(&mut conn)
        .expect("SET");
    let fair = f
        .locks
        .lock("q7")
        .fair(true)
        .wait(Duration::from_secs(5))
        .acquire()
        .await;
    assert!(
        matches!(&fair, Err(LockError::KeyConflict { found_type, .. }) if found_type == "string"),
        "{fair:?}"
    );
    let left: String = ::redis::cmd("GET")
        .arg("lock:{q7}")
        .query(&mut conn)
        .expect("GET");
    assert_eq!(left, "someone else's");
}

/// 20 trials: a holder keeps the lock while 10 waiters line up one after
/// another (each seen in the line on the server before the next starts);
/// released, the lock passes down the line in that order.
async fn waiters_get_the_lock_in_arrival_order(f: Fixture) {
    const WAITERS: usize = 10;
    for trial in 0..20 {
        let key = format!("q{trial}");
        let holder = lock_tests::guard_with(&f.locks, &key, |l| l.fair(true)).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..WAITERS {
            let (locks, name, order) = (f.locks.clone(), key.clone(), Arc::clone(&order));
            waiters.push(tokio::spawn(async move {
                locks
                    .lock(name)
                    .fair(true)
                    .wait(Duration::from_secs(30))
                    .run(async { order.lock().expect("order").push(i) })
                    .await
            }));
            let queued = eventually(Duration::from_secs(10), || {
                line_length(&f, &key) == i64::try_from(i + 1).expect("few")
            })
            .await;
            assert!(queued.is_some(), "trial {trial}: waiter {i} never stood in line");
        }
        holder.release().await.expect("release");
        for waiter in waiters {
            waiter.await.expect("waiter task").expect("waiter");
        }
        let order = order.lock().expect("order").clone();
        assert_eq!(order, (0..WAITERS).collect::<Vec<_>>(), "trial {trial}");
    }
}

async fn a_waiter_whose_wait_runs_out_leaves_the_line(f: Fixture) {
    let key = "q1";
    let holder = lock_tests::guard_with(&f.locks, key, |l| l.fair(true)).await;
    let gave_up = f
        .locks
        .lock(key)
        .fair(true)
        .wait(Duration::from_millis(300))
        .run(async {})
        .await;
    assert!(matches!(gave_up, Err(LockError::Timeout { .. })), "{gave_up:?}");
    let left = eventually(Duration::from_secs(2), || line_length(&f, key) == 0).await;
    assert!(left.is_some(), "a waiter that gave up kept its place");
    holder.release().await.expect("release");
    f.locks
        .lock(key)
        .fair(true)
        .run(async {})
        .await
        .expect("free for the next");
}

/// A waiter whose process died (its place in line, written as a dead
/// process leaves it, is never renewed) delays the next waiter by at most
/// the configured bound (500 ms here) plus one poll. A trial in which this
/// process was starved longer than the poll proves nothing and runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_waiter_is_skipped_within_the_bound() {
    lock_tests::bounded("a_dead_waiter_is_skipped_within_the_bound", async move {
        const BOUND: Duration = Duration::from_millis(500);
        let f = redis_with(LockClient::builder().fair_waiter_timeout(BOUND)).await;
        let plant = |key: &str| {
            let mut conn = (f.server_of)(key);
            let (secs, micros): (u64, u64) = ::redis::cmd("TIME").query(&mut conn).expect("TIME");
            let now_ms = secs * 1000 + micros / 1000;
            let corpse = format!("f:{}:1", "d".repeat(32));
            let _: () = ::redis::pipe()
                .cmd("ZADD")
                .arg(format!("lock:{{{key}}}:line"))
                .arg(1)
                .arg(&corpse)
                .cmd("ZADD")
                .arg(format!("lock:{{{key}}}:alive"))
                .arg(now_ms + u64::try_from(BOUND.as_millis()).expect("small"))
                .arg(&corpse)
                .query(&mut conn)
                .expect("a dead waiter's place");
        };
        dead_waiter_trials(&f.locks, BOUND, plant, |key| line_length(&f, key) == 2).await;
    })
    .await
}

/// Up to three trials: a holder keeps a fair lock; `plant(key)` writes a
/// dead waiter's place at the head of its line; the next waiter queues
/// behind it (`two_in_line(key)`), and once the holder releases, gets the
/// lock within `bound` plus a poll.
async fn dead_waiter_trials(
    locks: &LockClient,
    bound: Duration,
    plant: impl Fn(&str),
    two_in_line: impl Fn(&str) -> bool,
) {
    for trial in 1..=3 {
        let monitor = Monitor::start();
        let key = format!("dead{trial}");
        let holder = lock_tests::guard_with(locks, &key, |l| l.fair(true)).await;
        plant(&key);
        let next = {
            let (locks, key) = (locks.clone(), key.clone());
            tokio::spawn(async move {
                locks
                    .lock(key)
                    .fair(true)
                    .wait(Duration::from_secs(10))
                    .run(async { Instant::now() })
                    .await
            })
        };
        let queued = eventually(Duration::from_secs(10), || two_in_line(&key)).await;
        assert!(queued.is_some(), "the next waiter never stood in line");
        let released = Instant::now();
        holder.release().await.expect("release");
        let got = next
            .await
            .expect("waiter task")
            .expect("the next waiter gets the lock");
        let delay = got.saturating_duration_since(released);
        if delay <= bound + Duration::from_millis(300) {
            return;
        }
        assert!(
            monitor.worst() > Duration::from_millis(100),
            "trial {trial}: the next waiter came {delay:?} after the release (bound {bound:?})"
        );
        eprintln!("trial {trial} INVALID: starved {:?}", monitor.worst());
    }
    panic!("every trial was starved");
}

/// In-process, a waiter whose wait runs out gives up its place: the next
/// waiter gets the lock at its release, not when that place would have
/// lapsed (30 s here, past the next waiter's 10 s wait).
#[tokio::test(flavor = "current_thread")]
async fn in_process_a_waiter_whose_wait_runs_out_leaves_the_line() {
    lock_tests::bounded(
        "in_process_a_waiter_whose_wait_runs_out_leaves_the_line",
        async move {
            let locks = patient().in_memory().expect("in-process client");
            let holder = locks.lock("q").fair(true).acquire().await.expect("holder");
            // Each waiter is a task of its own: this task holds the lock.
            let waiter = |wait: Duration| {
                let locks = locks.clone();
                tokio::spawn(async move { locks.lock("q").fair(true).wait(wait).run(async {}).await })
            };
            let gave_up = waiter(Duration::from_millis(300)).await.expect("waiter task");
            assert!(matches!(gave_up, Err(LockError::Timeout { .. })), "{gave_up:?}");
            let next = waiter(Duration::from_secs(10));
            // The spawned waiter runs until it waits: it is in line.
            tokio::task::yield_now().await;
            holder.release().await.expect("release");
            let next = next.await.expect("waiter task");
            assert!(
                next.is_ok(),
                "the line waited for a waiter that had gone: {next:?}"
            );
        },
    )
    .await
}

/// In-process, the line is kept in memory: on a one-thread runtime, a
/// waiter spawned and then given one turn has made its first attempt (the
/// in-process backend answers at once) and stands in line before the next
/// starts; released, the lock passes down the line in that order.
#[tokio::test(flavor = "current_thread")]
async fn in_process_waiters_get_the_lock_in_arrival_order() {
    lock_tests::bounded("in_process_waiters_get_the_lock_in_arrival_order", async move {
        let locks = LockClient::in_memory();
        for trial in 0..20 {
            let holder = locks.lock("q").fair(true).acquire().await.expect("holder");
            let order = Arc::new(Mutex::new(Vec::new()));
            let mut waiters = Vec::new();
            for i in 0..10 {
                let (locks, order) = (locks.clone(), Arc::clone(&order));
                waiters.push(tokio::spawn(async move {
                    locks
                        .lock("q")
                        .fair(true)
                        .wait(Duration::from_secs(30))
                        .run(async { order.lock().expect("order").push(i) })
                        .await
                }));
                // The spawned waiter runs until it waits: it is in line.
                tokio::task::yield_now().await;
            }
            holder.release().await.expect("release");
            for waiter in waiters {
                waiter.await.expect("waiter task").expect("waiter");
            }
            let order = order.lock().expect("order").clone();
            assert_eq!(order, (0..10).collect::<Vec<_>>(), "trial {trial}");
        }
    })
    .await
}

/// In-process, waiters that start while the lock is held get it one at a
/// time, each exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_waiters_are_served_one_by_one() {
    lock_tests::bounded("in_process_waiters_are_served_one_by_one", async move {
        let locks = LockClient::in_memory();
        let holder = lock_tests::guard_with(&locks, "q", |l| l.fair(true)).await;
        let inside = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let waiters: Vec<_> = (0..8)
            .map(|_| {
                let (locks, inside) = (locks.clone(), Arc::clone(&inside));
                tokio::spawn(async move {
                    locks
                        .lock("q")
                        .fair(true)
                        .wait(Duration::from_secs(30))
                        .run(async move {
                            assert_eq!(inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst), 0);
                            tokio::task::yield_now().await;
                            inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                        })
                        .await
                })
            })
            .collect();
        holder.release().await.expect("release");
        for waiter in waiters {
            waiter.await.expect("waiter task").expect("waiter");
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_refuses_fair_locks_and_bad_combinations_are_refused() {
    lock_tests::bounded(
        "redlock_refuses_fair_locks_and_bad_combinations_are_refused",
        async move {
            let masters = start_masters(3);
            let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
            let redlock = LockClient::redlock(&urls).await.expect("redlock");
            let refused = redlock.lock("q").fair(true).acquire().await;
            assert!(
                matches!(refused, Err(LockError::Unsupported { .. })),
                "{refused:?}"
            );
            let locks = LockClient::in_memory();
            for attempt in [
                locks.lock("q").fair(true).permits(2).acquire().await,
                locks.lock("q").fair(true).segments(2).acquire().await,
                locks.lock_all(["a", "b"]).fair(true).acquire().await,
            ] {
                assert!(
                    matches!(attempt, Err(LockError::InvalidRequest { .. })),
                    "{attempt:?}"
                );
            }
            let too_short = LockClient::builder()
                .fair_waiter_timeout(Duration::from_millis(100))
                .in_memory();
            assert!(matches!(too_short, Err(LockError::InvalidConfig { .. })));
        },
    )
    .await
}
