//! The stale-holder contract (issue #37): a holder whose lease has ended and
//! whose lock another has taken never changes that other's lock. For every
//! backend the harness starts and every write a holder makes after its
//! acquisition (watchdog renewal, alone and in a batch; a nested call's
//! extension; release), each test
//!
//! 1. lets the holder take the lock (fenced, so the counter is watched too),
//! 2. hands the lock to another holder behind the first one's back (a foreign
//!    writer on the raw key or row, or an operator deleting the queue child
//!    and another client taking the lock),
//! 3. snapshots the other's lock (holder, expiry, fence counter),
//! 4. performs the stale holder's write, and asserts that the stale holder is
//!    told (`Lost` to a running body, `NotHeld` to a release) and that the
//!    snapshot is unchanged.
//!
//! Each test fails, by name, when the owner condition of the write it
//! covers is removed (`docs/contributing.md`, "Owner conditions"). A new backend joins the
//! contract by adding a `Rig` variant and a line to `contract!`. The handoff
//! of a released lock to a waiter of the same client (Redis, Redlock and
//! PostgreSQL) is tested beside the other handoffs (`handoff.rs`,
//! `redlock.rs`, `postgres.rs`).

use std::time::Duration;

use lock_runtime::{LockClient, LockError, LockGuard, LockMode, LockRequest, LostReason};
// `RIVAL`: the foreign writer of the Redis, MySQL and PostgreSQL rigs.
use lock_tests::{Etcd, MariaDb, Postgres, RIVAL, RedisServer, ZooKeeper, etcd, zookeeper};

/// No test here may hang: every wait on the library is bounded.
const BOUND: Duration = Duration::from_secs(20);

/// A backend the harness started, with raw access to its lock state.
enum Rig {
    Redis(RedisServer),
    Mysql(MariaDb),
    ZooKeeper(ZooKeeper),
    Postgres(Postgres),
    Etcd(Etcd),
}

/// What another holder's lock looks like from the server, compared whole
/// before and after the stale holder's write.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot(Vec<Option<String>>);

/// What keeps the other holder's lock alive while the test runs (the
/// ZooKeeper rival's guard; nothing for a raw write).
type Taken = Option<LockGuard>;

impl Rig {
    fn redis() -> Rig {
        Rig::Redis(RedisServer::start())
    }

    fn mysql() -> Rig {
        Rig::Mysql(MariaDb::start())
    }

    fn zookeeper() -> Rig {
        Rig::ZooKeeper(ZooKeeper::start())
    }

    fn postgres() -> Rig {
        Rig::Postgres(Postgres::start())
    }

    fn etcd() -> Rig {
        Rig::Etcd(Etcd::start())
    }

    /// Whether a nested call asking for a longer lease than the holder's
    /// writes to the server. A ZooKeeper lease is the session, capped at the
    /// session timeout whatever is asked, so the nested call is a re-entry
    /// served from the lease, with no write to check: only the snapshot is.
    /// Likewise an etcd lease is the client's lease.
    fn extends_leases(&self) -> bool {
        !matches!(self, Rig::ZooKeeper(_) | Rig::Etcd(_))
    }

    async fn client(&self) -> LockClient {
        match self {
            Rig::Redis(server) => LockClient::connect(&server.url()).await.expect("connect"),
            Rig::Mysql(server) => LockClient::mysql(&server.url()).await.expect("connect"),
            Rig::ZooKeeper(zk) => zookeeper::client(zk).await,
            Rig::Postgres(server) => LockClient::postgres(&server.url()).await.expect("connect"),
            Rig::Etcd(server) => etcd::client(server).await,
        }
    }

    /// Another holder takes `key` for `lease` while the stale holder still
    /// believes it holds it, as after an expiry the holder missed.
    async fn take_over(&self, key: &str, lease: Duration) -> Taken {
        self.take_over_name(&name(key), |l| l.lock(key), lease).await
    }

    /// [`take_over`](Self::take_over) of the lock stored as `name` (a
    /// segment's `lock:{K}#0`); `rival` is how a client asks for it.
    async fn take_over_name<R>(&self, name: &str, rival: R, lease: Duration) -> Taken
    where
        R: for<'c> Fn(&'c LockClient) -> LockRequest<'c>,
    {
        let ms = lease.as_millis();
        match self {
            Rig::Redis(server) => {
                server.take_as_rival(name, lease);
                None
            }
            Rig::Mysql(server) => {
                server
                    .sql(&format!(
                        "UPDATE distributed_locks SET holder = '{RIVAL}', \
                         expires_at = NOW(6) + INTERVAL {ms} * 1000 MICROSECOND \
                         WHERE name = '{name}'"
                    ))
                    .await;
                None
            }
            Rig::Postgres(server) => {
                tokio::task::block_in_place(|| {
                    server.sql(&format!(
                        "UPDATE distributed_locks SET holder = '{RIVAL}', \
                         expires_at = clock_timestamp() + interval '{ms} milliseconds' \
                         WHERE name = '{name}'"
                    ))
                });
                None
            }
            Rig::ZooKeeper(zk) => {
                // The stale holder's child goes (its session ended, or an
                // operator deleted it) and a client of another session
                // queues and takes the lock.
                empty_queue(zk, name).await;
                let client = zookeeper::client(zk).await;
                let guard = rival(&client)
                    .fencing(true)
                    .wait(Duration::from_secs(10))
                    .acquire()
                    .await
                    .expect("the rival takes the freed lock");
                Some(guard)
            }
            Rig::Etcd(server) => {
                // The stale holder's key goes (its lease ended, or an
                // operator deleted it) and a client of another lease joins
                // the line and takes the lock.
                empty_line(server, name).await;
                let client = etcd::client(server).await;
                let guard = rival(&client)
                    .fencing(true)
                    .wait(Duration::from_secs(10))
                    .acquire()
                    .await
                    .expect("the rival takes the freed lock");
                Some(guard)
            }
        }
    }

    /// The lock's state on the server: its holder, its expiry (absolute, so
    /// that time passing changes nothing) and its fence counter; for
    /// ZooKeeper, the queue's children with their creation and
    /// modification zxids.
    async fn snapshot(&self, key: &str) -> Snapshot {
        self.snapshot_name(&name(key)).await
    }

    /// [`snapshot`](Self::snapshot) of the lock stored as `name`.
    async fn snapshot_name(&self, name: &str) -> Snapshot {
        match self {
            Rig::Redis(server) => {
                let mut conn = server.sync_connection().expect("connect");
                let kind: String = redis::cmd("TYPE").arg(name).query(&mut conn).expect("TYPE");
                // A shared lock is a sorted set of holders, scored by when
                // their leases end.
                let holders: Option<String> = if kind == "zset" {
                    let members: Vec<String> = redis::cmd("ZRANGE")
                        .arg(name)
                        .arg(0)
                        .arg(-1)
                        .arg("WITHSCORES")
                        .query(&mut conn)
                        .expect("ZRANGE");
                    Some(members.join(" "))
                } else {
                    redis::cmd("GET").arg(name).query(&mut conn).expect("GET")
                };
                let (expiry, fence): (i64, Option<String>) = redis::pipe()
                    .cmd("PEXPIRETIME")
                    .arg(name)
                    .cmd("GET")
                    .arg(format!("{name}:fence"))
                    .query(&mut conn)
                    .expect("snapshot");
                Snapshot(vec![Some(kind), holders, Some(expiry.to_string()), fence])
            }
            Rig::Mysql(server) => {
                let mut rows = server
                    .sql(&format!(
                        "SELECT holder, DATE_FORMAT(expires_at, '%Y-%m-%d %H:%i:%s.%f'), fence \
                         FROM distributed_locks WHERE name = '{name}'"
                    ))
                    .await;
                // A shared lock's holders: one row each, with its lease.
                rows.extend(
                    server
                        .sql(&format!(
                            "SELECT member, DATE_FORMAT(expires_at, '%Y-%m-%d %H:%i:%s.%f') \
                             FROM distributed_locks_members WHERE name = '{name}' ORDER BY member"
                        ))
                        .await,
                );
                Snapshot(rows.into_iter().flatten().collect())
            }
            Rig::Postgres(server) => {
                let rows = tokio::task::block_in_place(|| {
                    let mut rows = server.sql(&format!(
                        "SELECT holder, expires_at, fence FROM distributed_locks WHERE name = '{name}'"
                    ));
                    // A shared lock's holders: one row each, with its lease.
                    rows.extend(server.sql(&format!(
                        "SELECT member, expires_at FROM distributed_locks_members \
                         WHERE name = '{name}' ORDER BY member"
                    )));
                    rows
                });
                Snapshot(rows.into_iter().map(Some).collect())
            }
            Rig::ZooKeeper(zk) => {
                let operator = zookeeper_client::Client::connect(&zk.connect_string())
                    .await
                    .expect("operator session");
                let queue = format!("/distributed-locks/{name}");
                let mut children = operator.list_children(&queue).await.unwrap_or_default();
                children.sort();
                let mut state = Vec::new();
                for child in children {
                    let stat = operator
                        .check_stat(&format!("{queue}/{child}"))
                        .await
                        .expect("stat");
                    let zxids = stat.map(|s| format!("{} {}", s.czxid, s.mzxid));
                    state.push(Some(child));
                    state.push(zxids);
                }
                Snapshot(state)
            }
            Rig::Etcd(server) => {
                let mut operator = operator(server).await;
                let line = operator
                    .get(line_of(name), Some(etcd_client::GetOptions::new().with_prefix()))
                    .await
                    .expect("read the line");
                Snapshot(
                    line.kvs()
                        .iter()
                        .map(|kv| {
                            Some(format!(
                                "{} {} {} {}",
                                String::from_utf8_lossy(kv.key()),
                                kv.create_revision(),
                                kv.mod_revision(),
                                kv.lease()
                            ))
                        })
                        .collect(),
                )
            }
        }
    }
}

/// An etcd client of the operator's own, outside the library.
async fn operator(server: &Etcd) -> etcd_client::Client {
    etcd_client::Client::connect(server.endpoints(), None)
        .await
        .expect("operator client")
}

/// Where the etcd line of the lock stored as `name` lives.
fn line_of(name: &str) -> String {
    format!("/distributed-locks/{name}/")
}

/// Deletes every key of the etcd line of the lock stored as `name`, as an
/// operator.
async fn empty_line(server: &Etcd, name: &str) {
    operator(server)
        .await
        .delete(
            line_of(name),
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await
        .expect("delete the line");
}

/// Deletes every child of the ZooKeeper queue of the lock stored as `name`,
/// from an operator's session.
async fn empty_queue(zk: &ZooKeeper, name: &str) {
    let operator = zookeeper_client::Client::connect(&zk.connect_string())
        .await
        .expect("operator session");
    let queue = format!("/distributed-locks/{name}");
    for child in operator.list_children(&queue).await.expect("queue") {
        operator
            .delete(&format!("{queue}/{child}"), None)
            .await
            .expect("delete");
    }
}

/// Where the lock `key` is stored, under the default prefix.
fn name(key: &str) -> String {
    format!("lock:{{{key}}}")
}

fn is_taken_over(outcome: &Result<(), LockError>) -> bool {
    matches!(
        outcome,
        Err(LockError::Lost {
            reason: LostReason::TakenOver,
            ..
        })
    )
}

/// The watchdog's renewal: the stale holder's body is cancelled with
/// `TakenOver`, and the other's lease is neither extended nor cut. A
/// second lease of the same client, renewed in the same batches, is kept:
/// the batch tells each lease its own answer.
/// Runs `stale`'s lock with a body that only waits, and `take_over` once the
/// body runs; the body's outcome (within `BOUND`) and what `take_over` gave.
/// The take-over runs beside the body, not in it: the body is dropped as
/// soon as a renewal finds the lock gone, which can be before a take-over of
/// several steps has finished (ZooKeeper's deletes the holder's node first,
/// and the body was once dropped before the rival's node was made).
async fn taken_over_while_held<T>(
    stale: LockRequest<'_>,
    take_over: impl Future<Output = T>,
) -> (Result<(), LockError>, T) {
    let (inside_tx, inside_rx) = tokio::sync::oneshot::channel::<()>();
    let body = stale.run(async {
        let _ = inside_tx.send(());
        std::future::pending::<()>().await;
    });
    let beside = async {
        inside_rx.await.expect("the body ran");
        take_over.await
    };
    let (outcome, taken) = tokio::join!(tokio::time::timeout(BOUND, body), beside);
    let outcome = outcome.expect("the body was not cancelled: the renewal did not see the other holder");
    (outcome, taken)
}

async fn a_stale_watchdog_renewal_leaves_the_other_holders_lock(rig: Rig) {
    let locks = rig.client().await;
    let ttl = Duration::from_millis(1500);
    // Beside it, a lease of the same client that nobody takes, renewed by
    // the same watchdog (in the same batches when due together).
    let kept = locks.lock("kept").ttl(ttl).acquire().await.expect("acquire");
    let first_deadline = kept.valid_until().into_std();
    let (outcome, (_taken, before)) =
        taken_over_while_held(locks.lock("renewed").ttl(ttl).fencing(true), async {
            let taken = rig.take_over("renewed", Duration::from_secs(20)).await;
            (taken, rig.snapshot("renewed").await)
        })
        .await;
    assert!(is_taken_over(&outcome), "{outcome:?}");
    assert_eq!(
        rig.snapshot("renewed").await,
        before,
        "the stale holder's renewal changed the other holder's lock"
    );
    let renewed = lock_tests::eventually(BOUND, || kept.valid_until().into_std() > first_deadline).await;
    assert!(
        renewed.is_some(),
        "the lease beside the stale one was not renewed"
    );
    assert!(kept.is_held(), "the lease beside the stale one was lost with it");
    kept.release().await.expect("the kept lease is released");
}

/// A nested call asking for a longer lease than the holder's: the stale
/// holder's extension is refused with `TakenOver` and the other's lease is
/// not extended.
async fn a_stale_nested_extension_leaves_the_other_holders_lock(rig: Rig) {
    let locks = rig.client().await;
    // No watchdog: only the nested call's extension talks to the server.
    let outer = locks
        .lock("extended")
        .ttl(Duration::from_secs(5))
        .renew(false)
        .fencing(true)
        .run(async {
            let taken = rig.take_over("extended", Duration::from_secs(2)).await;
            let before = rig.snapshot("extended").await;
            let nested = locks
                .lock("extended")
                .ttl(Duration::from_secs(30))
                .run(async { "the nested body ran on a lock another holds" })
                .await;
            (taken, before, nested)
        });
    let (_taken, before, nested) = tokio::time::timeout(BOUND, outer)
        .await
        .expect("bounded")
        .expect("the outer lease is still trusted");
    if rig.extends_leases() {
        assert!(
            matches!(
                nested,
                Err(LockError::Lost {
                    reason: LostReason::TakenOver,
                    ..
                })
            ),
            "{nested:?}"
        );
    }
    assert_eq!(
        rig.snapshot("extended").await,
        before,
        "the stale holder's extension changed the other holder's lock"
    );
}

/// The stale holder's release of the lock it asked for with `request`,
/// after another holder took the lock stored as `taken` (`key` to a
/// client): the other's lock stays. `NotHeld` when the stale holder held
/// nothing else; a set's other locks, still its own, are released.
async fn stale_release<R, V>(rig: Rig, taken: &str, request: R, rival: V)
where
    R: for<'c> FnOnce(&'c LockClient) -> LockRequest<'c>,
    V: for<'c> Fn(&'c LockClient) -> LockRequest<'c>,
{
    let locks = rig.client().await;
    let guard = request(&locks)
        .ttl(Duration::from_secs(30))
        .renew(false)
        .acquire()
        .await
        .expect("acquire");
    let _taken = rig.take_over_name(taken, rival, Duration::from_secs(20)).await;
    let before = rig.snapshot_name(taken).await;
    let alone = guard.keys().count() == 1;
    let released = tokio::time::timeout(BOUND, guard.release())
        .await
        .expect("bounded");
    if alone {
        assert!(matches!(released, Err(LockError::NotHeld { .. })), "{released:?}");
    }
    assert_eq!(
        rig.snapshot_name(taken).await,
        before,
        "the stale holder's release changed the other holder's lock"
    );
}

/// A fenced lock's release (a MySQL row keeps its counter: an update).
async fn a_stale_release_leaves_the_other_holders_lock(rig: Rig) {
    stale_release(
        rig,
        &name("released"),
        |l| l.lock("released").fencing(true),
        |l| l.lock("released"),
    )
    .await;
}

/// An unfenced lock's release (a MySQL row is deleted).
async fn a_stale_unfenced_release_leaves_the_other_holders_lock(rig: Rig) {
    stale_release(rig, &name("plain"), |l| l.lock("plain"), |l| l.lock("plain")).await;
}

/// Several keys: the one another took stays its.
async fn a_stale_release_of_several_keys_leaves_the_other_holders_lock(rig: Rig) {
    stale_release(
        rig,
        &name("set-a"),
        |l| l.lock_all(["set-a", "set-b"]),
        |l| l.lock("set-a"),
    )
    .await;
}

/// Segments: the first segment, the one a lone caller gets, is taken.
async fn a_stale_release_of_a_segment_leaves_the_other_holders_lock(rig: Rig) {
    let segment = format!("{}#0", name("seg"));
    stale_release(
        rig,
        &segment,
        |l| l.lock("seg").segments(2),
        |l| l.lock("seg").segments(2),
    )
    .await;
}

/// Fenced segments (a row that keeps its counter, released with the
/// others of its set: an update).
async fn a_stale_fenced_release_of_a_segment_leaves_the_other_holders_lock(rig: Rig) {
    let segment = format!("{}#0", name("fseg"));
    stale_release(
        rig,
        &segment,
        |l| l.lock("fseg").segments(2).fencing(true),
        |l| l.lock("fseg").segments(2),
    )
    .await;
}

/// A fair lock's release.
async fn a_stale_release_of_a_fair_lock_leaves_the_other_holders_lock(rig: Rig) {
    stale_release(
        rig,
        &name("fair"),
        |l| l.lock("fair").fair(true),
        |l| l.lock("fair").fair(true),
    )
    .await;
}

/// A foreign writer replaces the shared lock stored as `name` (a sorted
/// set of holders scored by when their leases end, by the server's clock)
/// with one holder, `member`, for `lease_ms`.
fn shared_lock_of(server: &RedisServer, name: &str, member: &str, lease_ms: i64) {
    let (seconds, micros): (i64, i64) = server.query(&mut redis::cmd("TIME"));
    let mut conn = server.sync_connection().expect("connect");
    redis::pipe()
        .atomic()
        .cmd("DEL")
        .arg(name)
        .ignore()
        .cmd("ZADD")
        .arg(name)
        .arg(seconds * 1000 + micros / 1000 + lease_ms)
        .arg(member)
        .ignore()
        .cmd("PEXPIRE")
        .arg(name)
        .arg(lease_ms)
        .ignore()
        .query::<()>(&mut conn)
        .expect("the foreign writer takes the lock");
}

impl Rig {
    /// A foreign holder `member` replaces every holder of the shared lock
    /// `key`, stored as `name`, for `lease_ms` (Redis: the sorted set;
    /// MySQL: the lock's rows in the members table; ZooKeeper: the queue's
    /// children are deleted and a client of another session takes the
    /// lock as `member`'s kind).
    async fn take_over_shared(&self, key: &str, name: &str, member: &str, lease_ms: i64) -> Taken {
        match self {
            Rig::Redis(server) => {
                shared_lock_of(server, name, member, lease_ms);
                None
            }
            Rig::Mysql(server) => {
                server
                    .sql(&format!(
                        "DELETE FROM distributed_locks_members WHERE name = '{name}'"
                    ))
                    .await;
                server
                    .sql(&format!(
                        "INSERT INTO distributed_locks_members (name, member, expires_at) \
                         VALUES ('{name}', '{member}', NOW(6) + INTERVAL {lease_ms} * 1000 MICROSECOND)"
                    ))
                    .await;
                None
            }
            Rig::ZooKeeper(zk) => {
                empty_queue(zk, name).await;
                let rival = zookeeper::client(zk).await;
                let request = rival.lock(key).wait(Duration::from_secs(10));
                let request = if member.starts_with("p:") {
                    request.permits(1)
                } else {
                    request.mode(LockMode::Write)
                };
                Some(request.acquire().await.expect("the rival takes the freed lock"))
            }
            Rig::Etcd(server) => {
                empty_line(server, name).await;
                let rival = etcd::client(server).await;
                let request = rival.lock(key).wait(Duration::from_secs(10));
                let request = if member.starts_with("p:") {
                    request.permits(1)
                } else {
                    request.mode(LockMode::Write)
                };
                Some(request.acquire().await.expect("the rival takes the freed lock"))
            }
            Rig::Postgres(server) => {
                tokio::task::block_in_place(|| {
                    server.sql(&format!(
                        "DELETE FROM distributed_locks_members WHERE name = '{name}'; \
                         INSERT INTO distributed_locks_members (name, member, expires_at) \
                         VALUES ('{name}', '{member}', clock_timestamp() + interval '{lease_ms} milliseconds')"
                    ))
                });
                None
            }
        }
    }
}

/// A shared holder (a reader, a permit holder) whose lease ended and whose
/// place another took: its renewal must not put it back beside the other
/// (Redis: a member of the lock's sorted set). The foreign writer replaces
/// the set with one member of its own, `rival`, for 20 s.
async fn stale_shared_renewal<R>(rig: Rig, key: &str, rival: &str, request: R)
where
    R: for<'c> FnOnce(&'c LockClient) -> LockRequest<'c>,
{
    let locks = rig.client().await;
    let taken_name = name(key);
    let (outcome, (before, _taken)) =
        taken_over_while_held(request(&locks).ttl(Duration::from_millis(1500)), async {
            let taken = rig.take_over_shared(key, &taken_name, rival, 20_000).await;
            (rig.snapshot_name(&taken_name).await, taken)
        })
        .await;
    assert!(matches!(outcome, Err(LockError::Lost { .. })), "{outcome:?}");
    assert_eq!(
        rig.snapshot_name(&taken_name).await,
        before,
        "the stale holder's renewal changed the other holder's lock"
    );
}

/// A reader whose lease ended, while a writer took the lock, asks in a
/// nested call for a longer lease: the extension (`renew_many.lua`) must not put
/// it back beside the writer.
async fn a_stale_reader_extension_leaves_the_writers_lock(rig: Rig) {
    let locks = rig.client().await;
    let taken_name = name("rw-ext");
    let writer = format!("w:{RIVAL}");
    let outer = locks
        .lock("rw-ext")
        .mode(LockMode::Read)
        .ttl(Duration::from_secs(5))
        .renew(false)
        .run(async {
            let _taken = rig.take_over_shared("rw-ext", &taken_name, &writer, 2_000).await;
            let before = rig.snapshot_name(&taken_name).await;
            let nested = locks
                .lock("rw-ext")
                .mode(LockMode::Read)
                .ttl(Duration::from_secs(30))
                .run(async {})
                .await;
            (before, nested)
        });
    let (before, nested) = tokio::time::timeout(BOUND, outer)
        .await
        .expect("bounded")
        .expect("the outer lease is still trusted");
    assert!(matches!(nested, Err(LockError::Lost { .. })), "{nested:?}");
    assert_eq!(
        rig.snapshot_name(&taken_name).await,
        before,
        "the stale reader's extension changed the writer's lock"
    );
}

/// A reader whose lease ended, while a writer took the lock.
async fn a_stale_reader_renewal_leaves_the_writers_lock(rig: Rig) {
    let writer = format!("w:{RIVAL}");
    stale_shared_renewal(rig, "rw", &writer, |l| l.lock("rw").mode(LockMode::Read)).await;
}

/// A permit holder whose lease ended, while another took the one permit.
async fn a_stale_permit_renewal_leaves_the_other_permit_holder(rig: Rig) {
    let other = format!("p:{RIVAL}");
    stale_shared_renewal(rig, "permit", &other, |l| l.lock("permit").permits(1)).await;
}

/// An attempt whose reply was lost leaves the lock "in doubt", and the
/// client gives back whatever the attempt may have taken under the holder
/// id it used. If the give-back arrives after that lease ran out and
/// another took the lock, it leaves the other's lock. A proxy loses the
/// attempt's reply (the request is applied) and holds the give-back until
/// the other holder has the lock. Redis only: elsewhere the give-back is
/// the release already covered above.
async fn stale_give_back<R>(rig: Rig, taken: &str, script: &str, request: R)
where
    R: for<'c> Fn(&'c LockClient) -> LockRequest<'c>,
{
    let Rig::Redis(server) = &rig else {
        unreachable!("the give-back tests run on Redis");
    };
    let proxy = lock_tests::Proxy::start(server.port()).await;
    let locks = LockClient::builder()
        .command_timeout(Duration::from_millis(300))
        .connect(&proxy.url())
        .await
        .expect("connect through the proxy");
    // The same shape once through a healthy link, so that its script is
    // loaded and the attempt below is applied at its first send.
    request(&locks)
        .acquire()
        .await
        .expect("acquire")
        .release()
        .await
        .expect("release");
    // The give-back's script, loaded as the runtime sends it (the shared
    // prelude in front), so that the held call runs when it arrives instead
    // of meeting NOSCRIPT with nobody left to load it.
    let scripts =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../lock-runtime/src/backend/redis/scripts");
    let source = |file: &str| std::fs::read_to_string(scripts.join(file)).expect("the runtime's script");
    let _: String = server.query(
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(source("prelude.lua") + &source(script)),
    );
    let holder_at = |name: &str| server.query::<Option<String>>(redis::cmd("GET").arg(name));
    proxy.half_open();
    let attempt = {
        let locks = locks.clone();
        let request = &request;
        let attempt = request(&locks)
            .ttl(Duration::from_millis(400))
            .wait(Duration::ZERO)
            .acquire();
        tokio::time::timeout(BOUND, async {
            let applied = async {
                lock_tests::eventually(BOUND, || holder_at(taken).is_some()).await;
                // From now on the give-back waits in the proxy.
                proxy.blackhole();
            };
            let (outcome, ()) = tokio::join!(attempt, applied);
            outcome.map(drop)
        })
        .await
        .expect("bounded")
    };
    assert!(attempt.is_err(), "the attempt's reply was lost, so it failed");
    // Its lease runs out; another holder takes the lock.
    let expired = lock_tests::eventually(BOUND, || holder_at(taken).is_none()).await;
    assert!(expired.is_some(), "the attempt's lease never ran out");
    let _taken = rig.take_over_name(taken, &request, Duration::from_secs(20)).await;
    let before = rig.snapshot_name(taken).await;
    // From here only the held give-back reads the keys (a GET each, or one
    // MGET for a segmented lock's).
    let reads = || {
        let calls = server.command_calls();
        ["get", "mget"]
            .iter()
            .map(|c| calls.get(*c).copied().unwrap_or(0))
            .sum::<u64>()
    };
    let reads_before = reads();
    proxy.pass();
    let given_back = lock_tests::eventually(BOUND, || reads() > reads_before).await;
    assert!(given_back.is_some(), "the held give-back never ran on the server");
    assert_eq!(
        rig.snapshot_name(taken).await,
        before,
        "the stale give-back changed the other holder's lock"
    );
}

/// Several keys' give-back (`release_many.lua`).
async fn a_stale_give_back_of_several_keys_leaves_the_other_holders_lock(rig: Rig) {
    stale_give_back(rig, &name("back-a"), "release_many.lua", |l| {
        l.lock_all(["back-a", "back-b"])
    })
    .await;
}

/// A segmented lock's give-back (`release_segments.lua`): any segment the
/// attempt may hold, so the segment another took too.
async fn a_stale_give_back_of_segments_leaves_the_other_holders_lock(rig: Rig) {
    let segment = format!("{}#0", name("back-seg"));
    stale_give_back(rig, &segment, "release_segments.lua", |l| {
        l.lock("back-seg").segments(2)
    })
    .await;
}

macro_rules! contract {
    ($($module:ident => $rig:ident: [$($test:ident),* $(,)?]),* $(,)?) => {
        $(
            mod $module {
                use super::Rig;
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $test() {
                        lock_tests::bounded(
                            concat!(stringify!($module), "::", stringify!($test)),
                            super::$test(Rig::$rig()),
                        )
                        .await
                    }
                )*
            }
        )*
    };
}

contract! {
    on_redis => redis: [
        a_stale_watchdog_renewal_leaves_the_other_holders_lock,
        a_stale_nested_extension_leaves_the_other_holders_lock,
        a_stale_release_leaves_the_other_holders_lock,
        a_stale_unfenced_release_leaves_the_other_holders_lock,
        a_stale_release_of_several_keys_leaves_the_other_holders_lock,
        a_stale_release_of_a_segment_leaves_the_other_holders_lock,
        a_stale_release_of_a_fair_lock_leaves_the_other_holders_lock,
        a_stale_give_back_of_several_keys_leaves_the_other_holders_lock,
        a_stale_give_back_of_segments_leaves_the_other_holders_lock,
        a_stale_reader_renewal_leaves_the_writers_lock,
        a_stale_reader_extension_leaves_the_writers_lock,
        a_stale_permit_renewal_leaves_the_other_permit_holder,
    ],
    on_mysql => mysql: [
        a_stale_watchdog_renewal_leaves_the_other_holders_lock,
        a_stale_nested_extension_leaves_the_other_holders_lock,
        a_stale_release_leaves_the_other_holders_lock,
        a_stale_unfenced_release_leaves_the_other_holders_lock,
        a_stale_release_of_several_keys_leaves_the_other_holders_lock,
        a_stale_release_of_a_segment_leaves_the_other_holders_lock,
        a_stale_reader_renewal_leaves_the_writers_lock,
        a_stale_reader_extension_leaves_the_writers_lock,
        a_stale_permit_renewal_leaves_the_other_permit_holder,
        a_stale_release_of_a_fair_lock_leaves_the_other_holders_lock,
    ],
    on_postgres => postgres: [
        a_stale_watchdog_renewal_leaves_the_other_holders_lock,
        a_stale_nested_extension_leaves_the_other_holders_lock,
        a_stale_release_leaves_the_other_holders_lock,
        a_stale_unfenced_release_leaves_the_other_holders_lock,
        a_stale_release_of_several_keys_leaves_the_other_holders_lock,
        a_stale_release_of_a_segment_leaves_the_other_holders_lock,
        a_stale_fenced_release_of_a_segment_leaves_the_other_holders_lock,
        a_stale_release_of_a_fair_lock_leaves_the_other_holders_lock,
        a_stale_reader_renewal_leaves_the_writers_lock,
        a_stale_reader_extension_leaves_the_writers_lock,
        a_stale_permit_renewal_leaves_the_other_permit_holder,
    ],
    on_zookeeper => zookeeper: [
        a_stale_watchdog_renewal_leaves_the_other_holders_lock,
        a_stale_nested_extension_leaves_the_other_holders_lock,
        a_stale_release_leaves_the_other_holders_lock,
        a_stale_unfenced_release_leaves_the_other_holders_lock,
        a_stale_release_of_several_keys_leaves_the_other_holders_lock,
        a_stale_release_of_a_segment_leaves_the_other_holders_lock,
        a_stale_release_of_a_fair_lock_leaves_the_other_holders_lock,
        a_stale_reader_renewal_leaves_the_writers_lock,
        a_stale_permit_renewal_leaves_the_other_permit_holder,
    ],
    on_etcd => etcd: [
        a_stale_watchdog_renewal_leaves_the_other_holders_lock,
        a_stale_nested_extension_leaves_the_other_holders_lock,
        a_stale_release_leaves_the_other_holders_lock,
        a_stale_unfenced_release_leaves_the_other_holders_lock,
        a_stale_release_of_several_keys_leaves_the_other_holders_lock,
        a_stale_release_of_a_segment_leaves_the_other_holders_lock,
        a_stale_release_of_a_fair_lock_leaves_the_other_holders_lock,
        a_stale_reader_renewal_leaves_the_writers_lock,
        a_stale_permit_renewal_leaves_the_other_permit_holder,
    ],
}

/// The in-process backend has no foreign writer and no way to stop its
/// holder's clock, so its stale holder is one whose fixed lease ran out
/// while it kept its guard; another task then took the lock.
mod on_memory {
    use std::time::Duration;

    use lock_runtime::{LockClient, LockError};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stale_release_leaves_the_other_holders_lock() {
        lock_tests::bounded(
            "on_memory::a_stale_release_leaves_the_other_holders_lock",
            async {
                let locks = LockClient::in_memory();
                let stale = lock_tests::guard_with(&locks, "released", |l| {
                    l.ttl(Duration::from_millis(100)).renew(false)
                })
                .await;
                let ran_out = lock_tests::eventually(super::BOUND, || !stale.is_held()).await;
                assert!(ran_out.is_some(), "the fixed lease never ran out");
                let other = lock_tests::guard_with(&locks, "released", |l| {
                    l.ttl(Duration::from_secs(30)).wait(Duration::from_secs(5))
                })
                .await;
                let released = stale.release().await;
                assert!(matches!(released, Err(LockError::NotHeld { .. })), "{released:?}");
                assert!(
                    lock_tests::refused_elsewhere(&locks, "released", |l| l).await,
                    "the stale holder's release freed the other holder's lock"
                );
                other
                    .release()
                    .await
                    .expect("the other holder still held its lock");
            },
        )
        .await
    }
}
