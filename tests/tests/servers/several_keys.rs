//! Several keys at once (`lock_all`, `keys = [...]`), one body of code over
//! the in-process backend, one `redis-server`, a Redis Cluster (keys spread
//! over slots), a Redlock of three masters, a master found through Redis
//! Sentinel, MariaDB, ZooKeeper, PostgreSQL and etcd: transfers in both
//! directions never deadlock and never lose money; a set is taken whole or
//! not at all; nested calls re-enter what they hold.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use lock_runtime::{LockClient, LockError};
use lock_tests::monitor::Monitor;
use lock_tests::{Cluster, Etcd, MariaDb, Postgres, RedisServer, Replicated, ZooKeeper, start_masters};

/// Two clients on the same locks (two services), and what they need alive.
struct Fixture {
    clients: [LockClient; 2],
    _servers: Servers,
}

#[allow(dead_code, reason = "held only to keep the servers running")]
enum Servers {
    None,
    One(RedisServer),
    Cluster(Cluster),
    Masters(Vec<RedisServer>),
    Sentinel(Replicated),
    Mysql(MariaDb),
    ZooKeeper(ZooKeeper),
    Postgres(Postgres),
    Etcd(Etcd),
}

async fn in_memory() -> Fixture {
    let locks = LockClient::in_memory();
    Fixture {
        clients: [locks.clone(), locks],
        _servers: Servers::None,
    }
}

async fn redis() -> Fixture {
    let server = RedisServer::start();
    let url = server.url();
    let connect = || LockClient::connect(&url);
    Fixture {
        clients: [
            connect().await.expect("connect"),
            connect().await.expect("connect"),
        ],
        _servers: Servers::One(server),
    }
}

async fn cluster() -> Fixture {
    let cluster = Cluster::start(3, 0);
    let connect = || LockClient::cluster(cluster.urls());
    Fixture {
        clients: [
            connect().await.expect("connect"),
            connect().await.expect("connect"),
        ],
        _servers: Servers::Cluster(cluster),
    }
}

async fn redlock() -> Fixture {
    let masters = start_masters(3);
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    let connect = || LockClient::redlock(&urls);
    Fixture {
        clients: [
            connect().await.expect("connect"),
            connect().await.expect("connect"),
        ],
        _servers: Servers::Masters(masters),
    }
}

async fn sentinel() -> Fixture {
    let group = Replicated::start_named(1);
    Fixture {
        clients: [
            lock_tests::sentinel::client(&group).await,
            lock_tests::sentinel::client(&group).await,
        ],
        _servers: Servers::Sentinel(group),
    }
}

async fn mysql() -> Fixture {
    let server = MariaDb::start();
    let url = server.url();
    let connect = || LockClient::mysql(&url);
    Fixture {
        clients: [
            connect().await.expect("connect"),
            connect().await.expect("connect"),
        ],
        _servers: Servers::Mysql(server),
    }
}

async fn postgres() -> Fixture {
    let server = Postgres::start();
    let url = server.url();
    let connect = || LockClient::postgres(&url);
    Fixture {
        clients: [
            connect().await.expect("connect"),
            connect().await.expect("connect"),
        ],
        _servers: Servers::Postgres(server),
    }
}

async fn zookeeper() -> Fixture {
    let zk = ZooKeeper::start();
    Fixture {
        clients: [
            lock_tests::zookeeper::client(&zk).await,
            lock_tests::zookeeper::client(&zk).await,
        ],
        _servers: Servers::ZooKeeper(zk),
    }
}

async fn etcd() -> Fixture {
    let etcd = Etcd::start();
    Fixture {
        clients: [
            lock_tests::etcd::client(&etcd).await,
            lock_tests::etcd::client(&etcd).await,
        ],
        _servers: Servers::Etcd(etcd),
    }
}

macro_rules! on_every_backend {
    ($($behaviour:ident),+ $(,)?) => {
        mod in_memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    lock_tests::bounded(stringify!($behaviour), async move {
                    super::$behaviour(super::in_memory().await).await;
                    })
                    .await
                }
            )+
        }
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
        mod redlock {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    lock_tests::bounded(stringify!($behaviour), async move {
                    super::$behaviour(super::redlock().await).await;
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
        mod mysql {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    lock_tests::bounded(stringify!($behaviour), async move {
                    super::$behaviour(super::mysql().await).await;
                    })
                    .await
                }
            )+
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    lock_tests::bounded(stringify!($behaviour), async move {
                    super::$behaviour(super::postgres().await).await;
                    })
                    .await
                }
            )+
        }
        mod zookeeper {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    lock_tests::bounded(stringify!($behaviour), async move {
                    super::$behaviour(super::zookeeper().await).await;
                    })
                    .await
                }
            )+
        }
        mod etcd {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    lock_tests::bounded(stringify!($behaviour), async move {
                    super::$behaviour(super::etcd().await).await;
                    })
                    .await
                }
            )+
        }
    };
}

on_every_backend!(
    transfers_in_both_directions_never_deadlock_and_keep_the_sum,
    a_set_is_taken_whole_or_not_at_all,
    nested_calls_reenter_and_grow_the_set,
    duplicates_merge_and_one_key_is_a_plain_lock,
);

const ACCOUNTS: usize = 10;
const OPENING: i64 = 1_000;

fn account(i: usize) -> String {
    format!("account:{i}")
}

/// 1,000 transfers between 10 accounts, from 8 tasks over two clients, each
/// between a random pair in a random direction: every call finishes within
/// its wait (a deadlock would end in `Timeout`), and no money is made or
/// lost (a read-modify-write of both balances, with a yield in between).
/// Leases of 2 s, not the default 30 s: on a Redlock, a master that
/// answered a set's attempt after its 50 ms node timeout, on a loaded
/// machine, keeps that grant until its lease ends if the undo is late too,
/// and two such masters refuse a quorum to everyone for as long (a
/// `.ci/run` beside two chains of scenarios timed out all 30 s of a wait
/// that way). A held set is renewed, so a real deadlock outlasts any
/// lease.
async fn transfers_in_both_directions_never_deadlock_and_keep_the_sum(f: Fixture) {
    const TASKS: usize = 8;
    const TRANSFERS: usize = 1_000;
    const TTL: Duration = Duration::from_secs(2);
    // A set renewed through a server (or this process) starved of CPU for
    // a quarter of its lease can lose it (a CPU-hog run of the test
    // command lost one on etcd), and a holder told too late can overlap
    // the next: such a run proves nothing and is run again.
    for run in 1..=3 {
        let monitor = Monitor::start();
        let balances: Arc<Vec<AtomicI64>> =
            Arc::new((0..ACCOUNTS).map(|_| AtomicI64::new(OPENING)).collect());
        let tasks: Vec<_> = (0..TASKS)
            .map(|task| {
                let (locks, balances) = (f.clients[task % 2].clone(), Arc::clone(&balances));
                tokio::spawn(async move {
                    for _ in 0..TRANSFERS / TASKS {
                        let from = rand::random_range(0..ACCOUNTS);
                        let to = (from + rand::random_range(1..ACCOUNTS)) % ACCOUNTS;
                        let balances = &balances;
                        locks
                            .lock_all([account(from), account(to)])
                            .ttl(TTL)
                            .wait(Duration::from_secs(30))
                            .run(async move {
                                let (a, b) = (
                                    balances[from].load(Ordering::SeqCst),
                                    balances[to].load(Ordering::SeqCst),
                                );
                                tokio::task::yield_now().await;
                                balances[from].store(a - 7, Ordering::SeqCst);
                                balances[to].store(b + 7, Ordering::SeqCst);
                            })
                            .await?;
                    }
                    Ok::<(), LockError>(())
                })
            })
            .collect();
        let mut failed = None;
        for task in tasks {
            if let Err(e) = task.await.expect("transfer task") {
                failed.get_or_insert(e);
            }
        }
        let total: i64 = balances.iter().map(|b| b.load(Ordering::SeqCst)).sum();
        let kept = total == OPENING * ACCOUNTS as i64;
        let (late, server_late) = (monitor.worst(), monitor.children_worst());
        if failed.is_none() && kept {
            return;
        }
        let outcome = format!(
            "{} (sum {total}; starved at most {late:?}, the servers {server_late:?})",
            failed.map_or_else(|| "every transfer ran".to_owned(), |e| e.to_string())
        );
        assert!(
            monitor.starved_for(TTL),
            "a transfer failed or money was made or lost: {outcome}"
        );
        eprintln!("run {run} INVALID: {outcome}");
    }
    panic!("INVALID: every run was starved");
}

/// With one key of the set held by the other client, the set is refused
/// and none of its other keys is taken, as the other client sees.
async fn a_set_is_taken_whole_or_not_at_all(f: Fixture) {
    let [ours, theirs] = &f.clients;
    let keys: Vec<String> = (0..6).map(account).collect();
    let held = lock_tests::guard_from_another_task(theirs, &keys[4]).await;
    let refused = ours
        .lock_all(keys.clone())
        .wait(Duration::from_millis(300))
        .acquire()
        .await;
    match refused {
        Err(LockError::Timeout { key, .. }) => assert_eq!(key, keys[4], "the key in the way is named"),
        other => panic!("expected Timeout, got {other:?}"),
    }
    for key in keys.iter().filter(|k| **k != keys[4]) {
        assert!(
            !lock_tests::refused_elsewhere(theirs, key, |request| request).await,
            "`{key}` was left taken by a refused set"
        );
    }
    held.release().await.expect("release");
    // A wait: where waiters stand in line (ZooKeeper, etcd), the refused
    // set's place behind the holder is given back by a task of its own
    // (its wait was over), which may still be under way.
    let guard = ours
        .lock_all(keys.clone())
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("the whole set once free");
    assert_eq!(guard.keys().count(), keys.len());
    for key in &keys {
        assert!(lock_tests::refused_elsewhere(theirs, key, |request| request).await);
    }
    guard.release().await.expect("release the set");
    assert!(!lock_tests::refused_elsewhere(theirs, &keys[0], |request| request).await);
}

/// Inside a set's body, a single key of the set and a subset re-enter
/// without waiting; a superset takes only the missing key.
async fn nested_calls_reenter_and_grow_the_set(f: Fixture) {
    let [locks, other] = &f.clients;
    let grown = locks
        .lock_all([account(1), account(2)])
        .run(async {
            locks
                .lock(account(2))
                .run(async {})
                .await
                .expect("one key of the set re-enters");
            locks
                .lock_all([account(2), account(1)])
                .run(async {})
                .await
                .expect("the same set re-enters");
            locks
                .lock_all([account(3), account(1)])
                .run(async { lock_tests::refused_elsewhere(other, &account(3), |request| request).await })
                .await
                .expect("a superset takes the missing key")
        })
        .await
        .expect("the set");
    assert!(grown, "the missing key was held inside the nested call");
    assert!(!lock_tests::refused_elsewhere(other, &account(3), |request| request).await);
}

async fn duplicates_merge_and_one_key_is_a_plain_lock(f: Fixture) {
    let [locks, other] = &f.clients;
    let guard = locks
        .lock_all([account(5), account(5)])
        .acquire()
        .await
        .expect("a transfer to oneself locks one key");
    assert_eq!(guard.keys().collect::<Vec<_>>(), [account(5).as_str()]);
    assert!(lock_tests::refused_elsewhere(other, &account(5), |request| request).await);
    guard.release().await.expect("release");
    let empty: [&str; 0] = [];
    assert!(matches!(
        locks.lock_all(empty).acquire().await,
        Err(LockError::InvalidRequest { .. })
    ));
    let too_many = locks.lock_all((0..65).map(account)).acquire().await;
    assert!(
        matches!(too_many, Err(LockError::InvalidRequest { .. })),
        "{too_many:?}"
    );
    let fenced = locks
        .lock_all([account(1), account(2)])
        .fencing(true)
        .acquire()
        .await;
    assert!(
        matches!(fenced, Err(LockError::InvalidRequest { .. })),
        "{fenced:?}"
    );
}

/// 1,000 transfers between 10 accounts whose balances live in Redis, from
/// two OS processes of four tasks each: both processes finish (a deadlock
/// would end one in `Timeout`) and the balances still sum to what they
/// started with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_from_two_processes_keep_the_sum() {
    lock_tests::bounded("transfers_from_two_processes_keep_the_sum", async move {
        let server = RedisServer::start();
        for i in 0..ACCOUNTS {
            let _: () = server.query(::redis::cmd("SET").arg(format!("balance:{i}")).arg(OPENING));
        }
        let processes: Vec<_> = (0..2)
            .map(|_| {
                let mut command = std::process::Command::new(lock_tests::lab::worker_binary());
                command
                    .args(["transfers", &server.url(), &ACCOUNTS.to_string(), "4", "125"])
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped());
                lock_tests::server::spawn_owned(command).expect("spawn a transfer process")
            })
            .collect();
        for process in processes {
            let output =
                tokio::task::block_in_place(|| process.wait_with_output()).expect("transfer process");
            assert!(
                output.status.success(),
                "a transfer process failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let total: i64 = (0..ACCOUNTS)
            .map(|i| server.query::<i64>(::redis::cmd("GET").arg(format!("balance:{i}"))))
            .sum();
        assert_eq!(total, OPENING * ACCOUNTS as i64, "money was made or lost");
    })
    .await
}
