//! Lock kinds (read-write locks, permits, segments), one body of code over
//! every backend that claims them: the in-process backend, one
//! `redis-server`, a Redis Cluster, a Redlock of three masters (read-write
//! only; it refuses permits and segments), a master found through Redis
//! Sentinel with a replica acknowledging, MariaDB, ZooKeeper, PostgreSQL
//! and etcd, through the public API. A backend joins a kind's suite by
//! being added to its list.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError, LockMode, LostReason, segment};
use lock_tests::monitor::Monitor;
use lock_tests::{
    Cluster, Etcd, LOCK_USER_REDLOCK_RULES, MariaDb, Postgres, RedisServer, Replicated, ZooKeeper,
};
use tokio::sync::Barrier;

/// A client and the servers it needs kept alive.
struct Fixture {
    locks: LockClient,
    servers: Servers,
}

impl Fixture {
    /// How many acquisitions a test that counts holders makes here:
    /// `fast` on Redis and in process, two fifths of it where every grant
    /// waits on a database's commit or a consensus round (and a waiter on
    /// MySQL polls), which took a minute of the test command on one key
    /// (#53). The overlap checks are the same; the fault suite's
    /// server-stop scenarios check each kind against a witness as well.
    fn rounds(&self, fast: usize) -> usize {
        match self.servers {
            Servers::Mysql(_) | Servers::Postgres(_) | Servers::Etcd(_) | Servers::ZooKeeper(_) => {
                fast * 2 / 5
            }
            _ => fast,
        }
    }
}

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
    Fixture {
        locks: LockClient::in_memory(),
        servers: Servers::None,
    }
}

/// One node and a cluster run every kind as the least-privilege ACL user
/// of docs/backends.md: each kind's scripts are a check of that ACL.
async fn redis() -> Fixture {
    let server = RedisServer::start_with_lock_user("");
    Fixture {
        locks: LockClient::connect(&server.lock_user_url())
            .await
            .expect("connect"),
        servers: Servers::One(server),
    }
}

async fn cluster() -> Fixture {
    let cluster = Cluster::start_with_lock_user(3, 0);
    Fixture {
        locks: LockClient::cluster(cluster.lock_user_urls())
            .await
            .expect("cluster client"),
        servers: Servers::Cluster(cluster),
    }
}

/// As the least-privilege ACL user on each master.
async fn redlock() -> Fixture {
    let masters: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_with_lock_user(LOCK_USER_REDLOCK_RULES))
        .collect();
    let urls: Vec<String> = masters.iter().map(RedisServer::lock_user_url).collect();
    Fixture {
        locks: LockClient::redlock(&urls).await.expect("redlock client"),
        servers: Servers::Masters(masters),
    }
}

/// As the least-privilege ACL user, on the nodes and the sentinels.
async fn sentinel() -> Fixture {
    let group = Replicated::start_named_with_lock_user(1);
    Fixture {
        locks: lock_tests::sentinel::lock_user_client(&group).await,
        servers: Servers::Sentinel(group),
    }
}

async fn postgres() -> Fixture {
    let server = Postgres::start();
    Fixture {
        locks: LockClient::postgres(&server.url())
            .await
            .expect("postgres client"),
        servers: Servers::Postgres(server),
    }
}

async fn mysql() -> Fixture {
    let server = MariaDb::start();
    Fixture {
        locks: LockClient::mysql(&server.url()).await.expect("mysql client"),
        servers: Servers::Mysql(server),
    }
}

impl Fixture {
    /// A second client of the same servers: another process, as far as
    /// the servers can tell (in process, the same store).
    async fn another(&self) -> LockClient {
        match &self.servers {
            Servers::None => self.locks.clone(),
            Servers::One(server) => LockClient::connect(&server.lock_user_url())
                .await
                .expect("connect"),
            Servers::Cluster(cluster) => LockClient::cluster(cluster.lock_user_urls())
                .await
                .expect("cluster client"),
            Servers::Masters(masters) => {
                let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
                LockClient::redlock(&urls).await.expect("redlock client")
            }
            Servers::Sentinel(group) => lock_tests::sentinel::lock_user_client(group).await,
            Servers::Mysql(server) => LockClient::mysql(&server.url()).await.expect("mysql client"),
            Servers::ZooKeeper(zk) => zookeeper_client(zk).await,
            Servers::Etcd(etcd) => lock_tests::etcd::client(etcd).await,
            Servers::Postgres(server) => LockClient::postgres(&server.url())
                .await
                .expect("postgres client"),
        }
    }
}

/// A ZooKeeper lease is capped at the session timeout: the client asks
/// for 4 s, so that the suite's leases (1.5 s) are what they ask for.
async fn zookeeper_client(zk: &ZooKeeper) -> LockClient {
    LockClient::builder()
        .zookeeper_session_timeout(Duration::from_secs(4))
        .zookeeper(&zk.connect_string())
        .await
        .expect("zookeeper client")
}

async fn zookeeper() -> Fixture {
    let zk = ZooKeeper::start();
    Fixture {
        locks: zookeeper_client(&zk).await,
        servers: Servers::ZooKeeper(zk),
    }
}

async fn etcd() -> Fixture {
    let etcd = Etcd::start();
    Fixture {
        locks: lock_tests::etcd::client(&etcd).await,
        servers: Servers::Etcd(etcd),
    }
}

/// One module per backend, one test per behaviour in each.
macro_rules! on_backends {
    ([$($backend:ident),+] => $behaviours:tt) => {
        $( on_backend!($backend, $behaviours); )+
    };
}

macro_rules! on_backend {
    ($backend:ident, [$($behaviour:ident),+ $(,)?]) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    lock_tests::bounded(stringify!($behaviour), async move {
                        super::$behaviour(super::$backend().await).await;
                    })
                    .await
                }
            )+
        }
    };
}

mod read_write {
    use super::*;
    on_backends!(
        [in_memory, redis, cluster, redlock, sentinel, mysql, zookeeper, postgres, etcd] => [
            readers_overlap,
            a_writer_never_overlaps_anyone,
            upgrade_is_refused_at_once,
            a_writer_reenters_as_a_reader,
            a_writer_is_not_starved_by_readers,
        ]
    );
}

mod permits {
    use super::*;
    on_backends!(
        [in_memory, redis, cluster, sentinel, mysql, zookeeper, postgres, etcd] => [
            never_more_than_n_holders,
            permits_are_counted_across_clients,
            a_vanished_holders_permit_frees_at_its_ttl_not_before,
            a_nested_call_reenters_its_permit,
        ]
    );
}

mod segments {
    use super::*;
    on_backends!(
        [in_memory, redis, cluster, sentinel, mysql, zookeeper, postgres, etcd] => [
            n_holders_on_distinct_segments_and_the_next_takes_the_first_freed,
            segments_exclude_like_locks,
        ]
    );
}

mod checks {
    use super::*;
    on_backends!(
        [in_memory, redis, mysql, zookeeper, postgres, etcd] => [
            bad_kinds_are_refused_before_any_io,
        ]
    );
}

// ZooKeeper keeps a name used as two kinds exclusive instead
// (`zookeeper_keeps_a_name_used_as_two_kinds_exclusive`).
mod one_kind_per_name {
    use super::*;
    on_backends!(
        [in_memory, redis, mysql, postgres] => [
            one_key_is_one_kind,
        ]
    );
}

mod fencing {
    use super::*;
    on_backends!(
        [in_memory, redis, cluster, sentinel, mysql, zookeeper, postgres, etcd] => [
            writers_and_segments_get_growing_fencing_tokens,
        ]
    );
}

/// The contract every kind keeps on every backend that offers it (DESIGN
/// §7): released on every way out of the body, the body cancelled when its
/// lease is lost, `Timeout` when the wait runs out. One test per backend
/// walks every kind it offers.
mod every_kind {
    use super::*;
    on_backends!(
        [in_memory, redis, cluster, redlock, sentinel, mysql, zookeeper, postgres, etcd] => [
            every_exit_path_releases_every_kind,
            a_lost_lease_cancels_the_body_of_every_kind,
            waiting_times_out_for_every_kind,
        ]
    );
}

/// A lock kind as a caller asks for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Exclusive,
    Read,
    Write,
    Permits(u32),
    Fair,
    Segments(u32),
    /// Two keys at once, `key` and `key+`.
    SeveralKeys,
}

impl Shape {
    /// The kinds `f`'s backend offers (a Redlock refuses permits,
    /// segments and fair locks: `redlock_refuses_permits_and_segments`,
    /// and `fair.rs`).
    fn offered(f: &Fixture) -> Vec<Shape> {
        let mut shapes = vec![Shape::Exclusive, Shape::Read, Shape::Write, Shape::SeveralKeys];
        if !matches!(f.servers, Servers::Masters(_)) {
            shapes.extend([Shape::Permits(2), Shape::Segments(2), Shape::Fair]);
        }
        shapes
    }

    fn request<'c>(self, locks: &'c LockClient, key: &str) -> lock_runtime::LockRequest<'c> {
        match self {
            Shape::Exclusive => locks.lock(key),
            Shape::Read => locks.lock(key).mode(LockMode::Read),
            Shape::Write => locks.lock(key).mode(LockMode::Write),
            Shape::Permits(n) => locks.lock(key).permits(n),
            Shape::Fair => locks.lock(key).fair(true),
            Shape::Segments(n) => locks.lock(key).segments(n),
            Shape::SeveralKeys => locks.lock_all([key.to_owned(), format!("{key}+")]),
        }
    }

    /// What fills the lock so that nobody else gets in: a writer for a
    /// read lock (readers share), N holders for N permits or segments.
    fn filler(self) -> (Shape, u32) {
        match self {
            Shape::Read => (Shape::Write, 1),
            Shape::Permits(n) | Shape::Segments(n) => (self, n),
            _ => (self, 1),
        }
    }
}

/// Fills `key` as `shape`'s filler from other tasks, without waiting:
/// the guards if every one got in, `None` (having released them) if any
/// was refused.
async fn fill(locks: &LockClient, key: &str, shape: Shape) -> Option<Vec<lock_runtime::LockGuard>> {
    let (filler, count) = shape.filler();
    let mut guards = Vec::new();
    for _ in 0..count {
        let (locks, key) = (locks.clone(), key.to_owned());
        // A task of its own: a holder of its own, never a re-entry.
        let taken = tokio::spawn(async move { filler.request(&locks, &key).acquire().await })
            .await
            .expect("the filler's task");
        match taken {
            Ok(guard) => guards.push(guard),
            Err(LockError::Timeout { .. }) => {
                for guard in guards {
                    guard.release().await.expect("release a filler");
                }
                return None;
            }
            Err(e) => panic!("{shape:?}: the filler failed: {e}"),
        }
    }
    Some(guards)
}

/// Whether `key` is free for `shape` within 2 s (a dropped body's release
/// runs in a spawned task).
async fn frees(locks: &LockClient, key: &str, shape: Shape) -> bool {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        if let Some(guards) = fill(locks, key, shape).await {
            for guard in guards {
                guard.release().await.expect("release a filler");
            }
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn every_exit_path_releases_every_kind(f: Fixture) {
    let locks = &f.locks;
    for shape in Shape::offered(&f) {
        let key = format!("exit-{shape:?}");
        let key = key.as_str();
        // Held inside the body: the checks below could fail.
        let held_inside = shape
            .request(locks, key)
            .run(async { fill(locks, key, shape).await.is_none() })
            .await
            .expect("lock");
        assert!(held_inside, "{shape:?}: others got in beside the body");
        assert!(frees(locks, key, shape).await, "{shape:?}: held after a return");

        let failed: Result<(), &str> = shape
            .request(locks, key)
            .run(async { Err("rejected") })
            .await
            .expect("lock");
        assert_eq!(failed, Err("rejected"));
        assert!(frees(locks, key, shape).await, "{shape:?}: held after an error");

        let (panicking, owned) = (locks.clone(), key.to_owned());
        let panicked = tokio::spawn(async move {
            shape
                .request(&panicking, &owned)
                .run(async { panic!("boom") })
                .await
        });
        assert!(panicked.await.expect_err("panics").is_panic());
        assert!(frees(locks, key, shape).await, "{shape:?}: held after a panic");

        // Dropped once inside its body.
        let entered = Arc::new(Barrier::new(2));
        let dropped = {
            let entered = Arc::clone(&entered);
            shape.request(locks, key).run(async move {
                entered.wait().await;
                std::future::pending::<()>().await;
            })
        };
        tokio::select! {
            _ = dropped => panic!("{shape:?}: the pending body ended"),
            _ = entered.wait() => {}
        }
        assert!(
            frees(locks, key, shape).await,
            "{shape:?}: held after the future was dropped"
        );

        let (aborted, owned, entered) = (locks.clone(), key.to_owned(), Arc::new(Barrier::new(2)));
        let task = {
            let entered = Arc::clone(&entered);
            tokio::spawn(async move {
                shape
                    .request(&aborted, &owned)
                    .run(async move {
                        entered.wait().await;
                        std::future::pending::<()>().await;
                    })
                    .await
            })
        };
        entered.wait().await;
        task.abort();
        assert!(task.await.expect_err("aborted").is_cancelled());
        assert!(
            frees(locks, key, shape).await,
            "{shape:?}: held after the task was aborted"
        );
    }
}

async fn a_lost_lease_cancels_the_body_of_every_kind(f: Fixture) {
    let locks = &f.locks;
    for shape in Shape::offered(&f) {
        let key = format!("lost-{shape:?}");
        let dropped = Arc::new(AtomicBool::new(false));
        // Set when the body is dropped: the lost lease cancelled it.
        struct OnDrop(Arc<AtomicBool>);
        impl Drop for OnDrop {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let body = {
            let on_drop = OnDrop(Arc::clone(&dropped));
            async move {
                let _on_drop = on_drop;
                std::future::pending::<()>().await;
            }
        };
        let outcome = shape
            .request(locks, &key)
            .ttl(Duration::from_millis(300))
            .wait(Duration::from_secs(5))
            .renew(false)
            .run(body)
            .await;
        assert!(
            matches!(
                outcome,
                Err(LockError::Lost {
                    reason: LostReason::LeaseEnded,
                    ..
                })
            ),
            "{shape:?}: {outcome:?}"
        );
        assert!(
            dropped.load(Ordering::SeqCst),
            "{shape:?}: the body was not dropped"
        );
        assert!(
            frees(locks, &key, shape).await,
            "{shape:?}: held after its lease ended"
        );
    }
}

async fn waiting_times_out_for_every_kind(f: Fixture) {
    let locks = &f.locks;
    for shape in Shape::offered(&f) {
        let key = format!("busy-{shape:?}");
        let guards = fill(locks, &key, shape).await.expect("free at first");
        let start = Instant::now();
        let outcome = shape
            .request(locks, &key)
            .wait(Duration::from_millis(200))
            .acquire()
            .await;
        assert!(
            matches!(&outcome, Err(LockError::Timeout { key: named, .. }) if named.starts_with(&key)),
            "{shape:?}: {outcome:?}"
        );
        assert!(
            start.elapsed() >= Duration::from_millis(200),
            "{shape:?}: gave up early"
        );
        for guard in guards {
            guard.release().await.expect("release");
        }
        // The waiter that gave up leaves (a fair line) from a spawned task.
        assert!(frees(locks, &key, shape).await, "{shape:?}: not free again");
    }
}

/// Whether a holder in another task would be refused `key` as `mode` now.
async fn refused_elsewhere(locks: &LockClient, key: &str, mode: LockMode) -> bool {
    lock_tests::refused_elsewhere(locks, key, move |request| request.mode(mode)).await
}

async fn readers_overlap(f: Fixture) {
    const READERS: usize = 4;
    let inside = Arc::new(Barrier::new(READERS + 1));
    let readers: Vec<_> = (0..READERS)
        .map(|_| {
            let (locks, inside) = (f.locks.clone(), Arc::clone(&inside));
            tokio::spawn(async move {
                locks
                    .lock("doc")
                    .mode(LockMode::Read)
                    .wait(Duration::from_secs(10))
                    .run(async {
                        // Leaves only once every reader is inside at once.
                        inside.wait().await;
                        inside.wait().await;
                    })
                    .await
            })
        })
        .collect();
    tokio::time::timeout(Duration::from_secs(20), inside.wait())
        .await
        .expect("all readers inside at once");
    assert!(
        refused_elsewhere(&f.locks, "doc", LockMode::Write).await,
        "a writer got in beside readers"
    );
    assert!(
        !refused_elsewhere(&f.locks, "doc", LockMode::Read).await,
        "a fifth reader was refused"
    );
    inside.wait().await;
    for reader in readers {
        reader.await.expect("reader task").expect("reader");
    }
    assert!(
        !refused_elsewhere(&f.locks, "doc", LockMode::Write).await,
        "readers' release left the lock held"
    );
}

/// Rounds over 8 tasks, one in four a writer: an occupancy counter sees no
/// writer beside anyone, and no reader beside a writer.
async fn a_writer_never_overlaps_anyone(f: Fixture) {
    const TASKS: usize = 8;
    // 4,000 acquisitions, 1,000 of them writes, on one key (1,600 on the
    // slower stores: `Fixture::rounds`). 10,000 took up to four minutes on
    // a database or an etcd cluster, the longest test of the command; the
    // fault suite's S0rw runs the same check for 10 s against a witness
    // that does not trust the lock.
    let rounds = f.rounds(4_000);
    let readers = Arc::new(AtomicUsize::new(0));
    let writers = Arc::new(AtomicUsize::new(0));
    let writes = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (locks, readers, writers, writes) = (
                f.locks.clone(),
                Arc::clone(&readers),
                Arc::clone(&writers),
                Arc::clone(&writes),
            );
            tokio::spawn(async move {
                for round in 0..rounds / TASKS {
                    let write = (task + round) % 4 == 0;
                    let mode = if write { LockMode::Write } else { LockMode::Read };
                    let (readers, writers, writes) = (&readers, &writers, &writes);
                    // A release the store does not answer within the
                    // command timeout (a loaded machine) leaves its lease to
                    // its ttl: 5 s here, not the default 30, so that a few
                    // of them cannot outlast a waiter's `wait`.
                    locks
                        .lock("ledger")
                        .mode(mode)
                        .ttl(Duration::from_secs(5))
                        .wait(Duration::from_secs(120))
                        .run(async move {
                            if write {
                                assert_eq!(writers.fetch_add(1, Ordering::SeqCst), 0, "two writers at once");
                                assert_eq!(readers.load(Ordering::SeqCst), 0, "a writer beside readers");
                                writes.fetch_add(1, Ordering::SeqCst);
                                tokio::task::yield_now().await;
                                assert_eq!(readers.load(Ordering::SeqCst), 0, "a reader came in on a writer");
                                writers.fetch_sub(1, Ordering::SeqCst);
                            } else {
                                readers.fetch_add(1, Ordering::SeqCst);
                                assert_eq!(writers.load(Ordering::SeqCst), 0, "a reader beside a writer");
                                tokio::task::yield_now().await;
                                assert_eq!(writers.load(Ordering::SeqCst), 0, "a writer came in on a reader");
                                readers.fetch_sub(1, Ordering::SeqCst);
                            }
                        })
                        .await
                        .expect("lock");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    assert_eq!(writes.load(Ordering::SeqCst), rounds / 4);
}

async fn upgrade_is_refused_at_once(f: Fixture) {
    let locks = &f.locks;
    let inner = locks
        .lock("doc")
        .mode(LockMode::Read)
        .run(async {
            // With a minute to wait, a deadlock would show as a minute's hang
            // and then a Timeout; the refusal comes first.
            locks
                .lock("doc")
                .mode(LockMode::Write)
                .wait(Duration::from_secs(60))
                .run(async {})
                .await
        })
        .await
        .expect("read lock");
    assert!(
        matches!(inner, Err(LockError::UpgradeRefused { ref key }) if key == "doc"),
        "{inner:?}"
    );
}

async fn a_writer_reenters_as_a_reader(f: Fixture) {
    let locks = &f.locks;
    let read = locks
        .lock("doc")
        .mode(LockMode::Write)
        .run(async {
            let inner = locks
                .lock("doc")
                .mode(LockMode::Read)
                .run(async { 7 })
                .await
                .expect("the writer reads its own key");
            // Still the writer's after the nested read lock ended.
            assert!(refused_elsewhere(locks, "doc", LockMode::Read).await);
            inner
        })
        .await
        .expect("write lock");
    assert_eq!(read, 7);
    assert!(!refused_elsewhere(locks, "doc", LockMode::Write).await);
}

/// Four readers hold in turns that overlap, so there is always one inside:
/// without the writer's claim holding new readers back, the writer would
/// wait for the whole stream. With it, each reader enters at most once more
/// after the writer starts waiting (in the moment before its first attempt
/// lands), and the writer gets in. A trial in which the process was starved
/// for longer than a reader's hold proves nothing and is run again.
async fn a_writer_is_not_starved_by_readers(f: Fixture) {
    const READERS: usize = 4;
    const HOLD: Duration = Duration::from_millis(300);
    for trial in 1..=3 {
        let monitor = Monitor::start();
        let stop = Arc::new(AtomicBool::new(false));
        let writer_waiting = Arc::new(AtomicBool::new(false));
        let entries_while_waiting = Arc::new(AtomicUsize::new(0));
        let inside = Arc::new(AtomicUsize::new(0));
        let readers: Vec<_> = (0..READERS)
            .map(|i| {
                let (locks, stop, waiting, entries, inside) = (
                    f.locks.clone(),
                    Arc::clone(&stop),
                    Arc::clone(&writer_waiting),
                    Arc::clone(&entries_while_waiting),
                    Arc::clone(&inside),
                );
                tokio::spawn(async move {
                    // Staggered, so that the holds overlap.
                    tokio::time::sleep(HOLD * u32::try_from(i).expect("few") / 4).await;
                    while !stop.load(Ordering::SeqCst) {
                        let (waiting, entries, inside) = (&waiting, &entries, &inside);
                        let result = locks
                            .lock("report")
                            .mode(LockMode::Read)
                            .wait(Duration::from_secs(30))
                            .run(async move {
                                inside.fetch_add(1, Ordering::SeqCst);
                                if waiting.load(Ordering::SeqCst) {
                                    entries.fetch_add(1, Ordering::SeqCst);
                                }
                                tokio::time::sleep(HOLD).await;
                                inside.fetch_sub(1, Ordering::SeqCst);
                            })
                            .await;
                        result.expect("reader");
                    }
                })
            })
            .collect();
        // The stream is flowing once two readers are inside together.
        lock_tests::eventually(Duration::from_secs(10), || inside.load(Ordering::SeqCst) >= 2)
            .await
            .expect("readers overlap");
        writer_waiting.store(true, Ordering::SeqCst);
        let wrote = f
            .locks
            .lock("report")
            .mode(LockMode::Write)
            .wait(Duration::from_secs(20))
            .run(async {
                // In: readers that enter from now on came after the wait.
                writer_waiting.store(false, Ordering::SeqCst);
                inside.load(Ordering::SeqCst)
            })
            .await;
        stop.store(true, Ordering::SeqCst);
        for reader in readers {
            reader.await.expect("reader task");
        }
        let entered = entries_while_waiting.load(Ordering::SeqCst);
        let starved = monitor.worst() > HOLD / 2;
        match wrote {
            Ok(readers_inside) if entered <= READERS => {
                assert_eq!(readers_inside, 0, "the writer ran beside a reader");
                return;
            }
            _ if starved => {
                eprintln!(
                    "trial {trial} INVALID: the process was {:?} late",
                    monitor.worst()
                );
            }
            other => panic!("writer starved: {other:?}, {entered} reader entries while it waited"),
        }
    }
    panic!("every trial was starved");
}

async fn never_more_than_n_holders(f: Fixture) {
    const PERMITS: usize = 3;
    let inside = Arc::new(AtomicUsize::new(0));
    let rounds = f.rounds(150);
    let tasks: Vec<_> = (0..12)
        .map(|_| {
            let (locks, inside) = (f.locks.clone(), Arc::clone(&inside));
            tokio::spawn(async move {
                for _ in 0..rounds {
                    let inside = &inside;
                    // 5 s leases, as in `a_writer_never_overlaps_anyone`: a
                    // release a loaded store does not answer in time ends
                    // with its lease, and must not hold a permit for 30 s.
                    locks
                        .lock("pool")
                        .permits(u32::try_from(PERMITS).expect("few"))
                        .ttl(Duration::from_secs(5))
                        .wait(Duration::from_secs(60))
                        .run(async move {
                            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                            assert!(now <= PERMITS, "{now} holders of {PERMITS} permits");
                            tokio::task::yield_now().await;
                            inside.fetch_sub(1, Ordering::SeqCst);
                        })
                        .await
                        .expect("permit");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    // Taken side by side: a semaphore that let one holder in at a time would
    // pass the bound too.
    let side_by_side = Arc::new(Barrier::new(PERMITS));
    let holders: Vec<_> = (0..PERMITS)
        .map(|_| {
            let (locks, side_by_side) = (f.locks.clone(), Arc::clone(&side_by_side));
            tokio::spawn(async move {
                locks
                    .lock("pool")
                    .permits(3)
                    .wait(Duration::from_secs(30))
                    .run(async move { side_by_side.wait().await })
                    .await
            })
        })
        .collect();
    for holder in holders {
        tokio::time::timeout(Duration::from_secs(40), holder)
            .await
            .expect("three permits held at once")
            .expect("task")
            .expect("permit");
    }
}

/// A try (no wait) for one of 2 permits.
fn try_permit(request: lock_runtime::LockRequest<'_>) -> lock_runtime::LockRequest<'_> {
    request.permits(2).wait(Duration::ZERO)
}

/// The count is the server's: permits held through one client are refused
/// to another, which cannot see the first one's holders, until one is
/// released.
async fn permits_are_counted_across_clients(f: Fixture) {
    let other = f.another().await;
    let first = lock_tests::guard_with(&f.locks, "pool2", |l| l.permits(2)).await;
    let second = lock_tests::guard_with(&other, "pool2", |l| l.permits(2)).await;
    assert!(
        lock_tests::refused_elsewhere(&other, "pool2", try_permit).await,
        "a third holder of 2 permits, through the second client"
    );
    assert!(
        lock_tests::refused_elsewhere(&f.locks, "pool2", try_permit).await,
        "a third holder of 2 permits, through the first client"
    );
    first.release().await.expect("release");
    assert!(
        !lock_tests::refused_elsewhere(&other, "pool2", try_permit).await,
        "the released permit is free for the other client"
    );
    second.release().await.expect("release");
}

/// A holder that vanishes (no release, no renewal: what a killed process
/// leaves) keeps its permit until its lease ends, and not a moment less.
async fn a_vanished_holders_permit_frees_at_its_ttl_not_before(f: Fixture) {
    const TTL: Duration = Duration::from_millis(1500);
    let taken = Instant::now();
    for _ in 0..2 {
        let guard = lock_tests::guard_with(&f.locks, "pool", |l| l.permits(2).ttl(TTL).renew(false)).await;
        std::mem::forget(guard);
    }
    let refused = f.locks.lock("pool").permits(2).acquire().await;
    assert!(matches!(refused, Err(LockError::Timeout { .. })), "{refused:?}");
    let guard = f
        .locks
        .lock("pool")
        .permits(2)
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("a permit frees when its lease ends");
    // A lower bound only: a slow machine makes it later, never earlier.
    assert!(
        taken.elapsed() >= TTL,
        "freed after {:?}, before the {TTL:?} lease ended",
        taken.elapsed()
    );
    guard.release().await.expect("release");
}

async fn a_nested_call_reenters_its_permit(f: Fixture) {
    let locks = &f.locks;
    let depth = locks
        .lock("pool")
        .permits(1)
        .run(async {
            locks
                .lock("pool")
                .permits(1)
                .run(async { 2 })
                .await
                .expect("the permit re-enters (a second permit would wait for the first)")
        })
        .await
        .expect("permit");
    assert_eq!(depth, 2);
}

async fn n_holders_on_distinct_segments_and_the_next_takes_the_first_freed(f: Fixture) {
    const SEGMENTS: u32 = 3;
    assert_eq!(segment(), None);
    let mut guards = Vec::new();
    for _ in 0..SEGMENTS {
        guards.push(lock_tests::guard_with(&f.locks, "stock", |l| l.segments(SEGMENTS)).await);
    }
    let held: BTreeSet<u32> = guards
        .iter()
        .filter_map(lock_runtime::LockGuard::segment)
        .collect();
    assert_eq!(
        held,
        (0..SEGMENTS).collect(),
        "three holders on three distinct segments"
    );
    assert_eq!(
        guards[1].key(),
        format!("stock#{}", guards[1].segment().expect("segment"))
    );

    let next = {
        let locks = f.locks.clone();
        tokio::spawn(async move {
            locks
                .lock("stock")
                .segments(SEGMENTS)
                .wait(Duration::from_secs(10))
                .run(async { segment() })
                .await
        })
    };
    let refused = f.locks.lock("stock").segments(SEGMENTS).acquire().await;
    assert!(matches!(refused, Err(LockError::Timeout { .. })), "{refused:?}");
    let freed = guards.remove(1);
    let freed_segment = freed.segment();
    freed.release().await.expect("release");
    let took = next.await.expect("waiter task").expect("waiter");
    assert_eq!(took, freed_segment, "the waiter took the segment that freed");
    for guard in guards {
        guard.release().await.expect("release");
    }
}

/// Sixteen tasks on two segments: never two holders on one segment, and
/// the body sees its segment.
async fn segments_exclude_like_locks(f: Fixture) {
    let inside: Arc<[AtomicUsize; 2]> = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (locks, inside) = (f.locks.clone(), Arc::clone(&inside));
            tokio::spawn(async move {
                for _ in 0..60 {
                    let inside = &inside;
                    locks
                        .lock("stock")
                        .segments(2)
                        .wait(Duration::from_secs(60))
                        .run(async move {
                            let i =
                                usize::try_from(segment().expect("inside a segmented body")).expect("small");
                            assert_eq!(
                                inside[i].fetch_add(1, Ordering::SeqCst),
                                0,
                                "two holders of segment {i}"
                            );
                            tokio::task::yield_now().await;
                            inside[i].fetch_sub(1, Ordering::SeqCst);
                        })
                        .await
                        .expect("segment");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
}

/// A writer's token grows with every write acquisition of the key (a
/// reader's re-entry keeps it); a segment's with every acquisition of that
/// segment.
async fn writers_and_segments_get_growing_fencing_tokens(f: Fixture) {
    let locks = &f.locks;
    let mut last = 0;
    for _ in 0..3 {
        let token = locks
            .lock("ledger")
            .mode(LockMode::Write)
            .fencing(true)
            .run(async {
                let outer = lock_runtime::fencing_token().expect("a writer's token");
                let inner = locks
                    .lock("ledger")
                    .mode(LockMode::Read)
                    .run(async { lock_runtime::fencing_token() })
                    .await
                    .expect("read re-entry");
                assert_eq!(inner, Some(outer), "the re-entry keeps the writer's token");
                outer
            })
            .await
            .expect("write lock");
        assert!(token > last, "{token} after {last}");
        last = token;
    }
    let mut by_segment = std::collections::BTreeMap::new();
    for _ in 0..4 {
        let guard = locks
            .lock("stock")
            .segments(2)
            .fencing(true)
            .acquire()
            .await
            .expect("segment");
        let (segment, token) = (
            guard.segment().expect("segment"),
            guard.fencing_token().expect("token"),
        );
        let previous = by_segment.insert(segment, token).unwrap_or(0);
        assert!(token > previous, "segment {segment}: {token} after {previous}");
        guard.release().await.expect("release");
    }
}

async fn bad_kinds_are_refused_before_any_io(f: Fixture) {
    let locks = &f.locks;
    let cases = [
        locks.lock("k").permits(0).acquire().await,
        locks.lock("k").segments(0).acquire().await,
        locks.lock("k").segments(1025).acquire().await,
        locks.lock("k").permits(2).mode(LockMode::Read).acquire().await,
        locks.lock("k").segments(2).permits(2).acquire().await,
        locks.lock("k").segments(2).mode(LockMode::Write).acquire().await,
        locks.lock("k").mode(LockMode::Read).fencing(true).acquire().await,
        locks.lock("k").permits(2).fencing(true).acquire().await,
    ];
    for case in cases {
        match case {
            Err(LockError::InvalidRequest { key, reason }) => assert!(key == "k" && !reason.is_empty()),
            other => panic!("expected InvalidRequest, got {other:?}"),
        }
    }
}

async fn one_key_is_one_kind(f: Fixture) {
    let locks = &f.locks;
    // Nested: a different kind of the same key is refused, not waited for.
    let nested = locks
        .lock("k")
        .run(async { locks.lock("k").permits(2).run(async {}).await })
        .await
        .expect("exclusive");
    assert!(
        matches!(nested, Err(LockError::InvalidRequest { .. })),
        "{nested:?}"
    );
    // Side by side: the other kind's state is a conflict, left untouched.
    let exclusive = lock_tests::guard_with(locks, "k", |l| l).await;
    let permit = locks.lock("k").permits(2).acquire().await;
    assert!(matches!(permit, Err(LockError::KeyConflict { .. })), "{permit:?}");
    exclusive.release().await.expect("release");
    let reader = lock_tests::guard_with(locks, "k", |l| l.mode(LockMode::Read)).await;
    let permit = locks.lock("k").permits(2).acquire().await;
    assert!(
        matches!(&permit, Err(LockError::KeyConflict { found_type, .. }) if found_type == "read-write lock"),
        "{permit:?}"
    );
    let writer = locks.lock("k").acquire().await;
    assert!(matches!(writer, Err(LockError::KeyConflict { .. })), "{writer:?}");
    reader.release().await.expect("release");
}

mod redis_only {
    use super::*;

    /// Two readers; one's member is deleted on the server: that reader's
    /// body is cancelled, the other's runs on.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_readers_loss_cancels_only_that_reader() {
        lock_tests::bounded("a_readers_loss_cancels_only_that_reader", async move {
            let server = RedisServer::start();
            let locks = LockClient::connect(&server.url()).await.expect("connect");
            let ttl = Duration::from_millis(400);
            let first = lock_tests::guard_with(&locks, "k", move |l| l.mode(LockMode::Read).ttl(ttl)).await;
            let members: Vec<String> = server.query(redis::cmd("ZRANGE").arg("lock:{k}").arg(0).arg(-1));
            assert_eq!(members.len(), 1, "{members:?}");
            let second = lock_tests::guard_with(&locks, "k", move |l| l.mode(LockMode::Read).ttl(ttl)).await;
            let _: i64 = server.query(redis::cmd("ZREM").arg("lock:{k}").arg(&members[0]));
            let reason = tokio::time::timeout(Duration::from_secs(10), first.lost())
                .await
                .expect("the first reader learns of its loss");
            assert_eq!(reason, LostReason::TakenOver);
            // Several renewals later, the second still holds.
            let later = Instant::now() + ttl * 3;
            tokio::select! {
                reason = second.lost() => panic!("the second reader was lost too: {reason}"),
                () = tokio::time::sleep_until(later.into()) => {}
            }
            assert!(second.is_held());
            second.release().await.expect("release the second reader");
            assert!(matches!(first.release().await, Err(LockError::NotHeld { .. })));
        })
        .await
    }

    /// ZooKeeper keeps one queue per name whatever the kind, and each kind
    /// counts another kind's child as a writer: a name used as two kinds
    /// stays exclusive (docs/backends.md), in both directions.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn zookeeper_keeps_a_name_used_as_two_kinds_exclusive() {
        lock_tests::bounded("zookeeper_keeps_a_name_used_as_two_kinds_exclusive", async move {
            let f = zookeeper().await;
            let now = Duration::ZERO;
            let exclusive = lock_tests::guard_with(&f.locks, "mixed", |l| l).await;
            assert!(
                refused_elsewhere(&f.locks, "mixed", LockMode::Read).await,
                "a reader beside an exclusive holder"
            );
            assert!(
                lock_tests::refused_elsewhere(&f.locks, "mixed", move |l| l.permits(3).wait(now)).await,
                "a permit holder beside an exclusive holder"
            );
            exclusive.release().await.expect("release");
            let reader = lock_tests::guard_with(&f.locks, "mixed", |l| l.mode(LockMode::Read)).await;
            assert!(
                lock_tests::refused_elsewhere(&f.locks, "mixed", move |l| l.wait(now)).await,
                "an exclusive holder beside a reader"
            );
            assert!(
                lock_tests::refused_elsewhere(&f.locks, "mixed", move |l| l.permits(3).wait(now)).await,
                "a permit holder beside a reader"
            );
            reader.release().await.expect("release");
        })
        .await
    }

    /// Redlock refuses what it cannot do soundly, naming it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redlock_refuses_permits_and_segments() {
        lock_tests::bounded("redlock_refuses_permits_and_segments", async move {
            let f = redlock().await;
            for attempt in [
                f.locks.lock("k").permits(2).acquire().await,
                f.locks.lock("k").segments(2).acquire().await,
            ] {
                match attempt {
                    Err(LockError::Unsupported { feature, .. }) => {
                        assert!(
                            feature.contains("permits") || feature.contains("segments"),
                            "{feature}"
                        );
                    }
                    other => panic!("expected Unsupported, got {other:?}"),
                }
            }
        })
        .await
    }
}
