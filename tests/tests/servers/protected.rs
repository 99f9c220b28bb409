//! Lock data only the lock's clients can touch (#58), on the servers that
//! keep it: another client of the same server, logged in as another user
//! with the grants docs/backends.md tells operators to give everyone else,
//! tries every way it has to free, change, read or stall a held lock; each
//! is refused by the server, and the holder keeps its lock, renews it and
//! still keeps a second client of its own identity out: on one Redis node,
//! each node of a Cluster, a Sentinel group's master and its sentinels,
//! each master of a Redlock, MariaDB, PostgreSQL and etcd. (ZooKeeper's
//! node ACLs are tested the same way in `zookeeper.rs`.)

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError, LockGuard, LockMode};
use lock_tests::secrets::capture_tracing;
use lock_tests::sentinel::{MASTER_NAME, Replicated};
use lock_tests::{Cluster, MariaDb, Postgres, RedisServer};

/// A lease short enough that the holder renews it several times while the
/// intruder tries.
const TTL: Duration = Duration::from_secs(1);

/// The holder, after the intruder's attempts: still held, renewed twice
/// more, and refused to a second client of the lock's own identity (asking
/// as a writer where the holder is a `reader`).
async fn kept(guard: &LockGuard, reader: bool, second: &LockClient, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut valid_until = guard.valid_until();
    let mut renewals = 0;
    while renewals < 2 {
        assert!(guard.is_held(), "{what}: lost after the intruder's attempts");
        assert!(Instant::now() < deadline, "{what}: not renewed twice in 20 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
        if guard.valid_until() > valid_until {
            renewals += 1;
            valid_until = guard.valid_until();
        }
    }
    let key = guard.key().to_owned();
    assert!(
        lock_tests::refused_elsewhere(second, &key, move |request| {
            let request = request.wait(Duration::ZERO);
            if reader {
                request.mode(LockMode::Write)
            } else {
                request
            }
        })
        .await,
        "{what}: a second client got `{key}` while it was held"
    );
}

/// An exclusive lock `k` and a read lock `r`: a row in each of the SQL
/// backends' two tables.
/// What a PostgreSQL connection hears on a channel it `LISTEN`s on.
struct Heard {
    heard: tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<String>>,
    /// Kept: the connection closes with its client.
    _client: tokio_postgres::Client,
}

impl Heard {
    /// The next payload heard, within `bound`.
    async fn recv_within(&self, bound: Duration) -> String {
        tokio::time::timeout(bound, self.heard.lock().await.recv())
            .await
            .expect("a notice within the bound")
            .expect("the listening connection is open")
    }
}

/// A connection of `url`'s role listening on `channel`, the payloads it
/// hears in order.
async fn listen_as(url: &str, channel: &str) -> Heard {
    use futures_util::StreamExt;
    let (client, mut connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect to listen");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    // The connection's messages: its notices, and the answers the
    // client's `LISTEN` waits for.
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notification(n) = message {
                let _ = tx.send(n.payload().to_owned());
            }
        }
    });
    client
        .batch_execute(&format!("LISTEN {channel}"))
        .await
        .expect("any role may listen");
    Heard {
        heard: tokio::sync::Mutex::new(rx),
        _client: client,
    }
}

async fn hold_both(locks: &LockClient) -> (LockGuard, LockGuard) {
    let guard = locks.lock("k").ttl(TTL).acquire().await.expect("acquire");
    let reader = locks
        .lock("r")
        .mode(LockMode::Read)
        .ttl(TTL)
        .acquire()
        .await
        .expect("a read lock: a row in the members table");
    (guard, reader)
}

/// The plain SQL ways to read, free or change every lock in `table`, or
/// to remove the table.
fn sql_writes(table: &str) -> [String; 6] {
    [
        format!("SELECT * FROM {table}"),
        format!("DELETE FROM {table}"),
        format!("UPDATE {table} SET name = name"),
        format!("INSERT INTO {table} SELECT * FROM {table}"),
        format!("TRUNCATE {table}"),
        format!("DROP TABLE {table}"),
    ]
}

/// What docs/backends.md says to give every other user of the lock's
/// Redis: keys and channels of its own, and no dangerous command (FLUSHALL,
/// FLUSHDB and SWAPDB touch every key whatever the patterns say).
const OTHER_REDIS_USER_RULES: &str = "resetkeys ~cache:* resetchannels &cache:* +@all -@dangerous";

#[test]
fn the_documented_rules_for_other_users_are_the_ones_tested() {
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/backends.md"))
        .expect("read docs/backends.md");
    let docs = docs.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        docs.contains(OTHER_REDIS_USER_RULES),
        "docs/backends.md does not give the rules tested for other users: {OTHER_REDIS_USER_RULES}"
    );
}

/// The user the tests give [`OTHER_REDIS_USER_RULES`], and its password.
const OTHER: &str = "other";
const OTHER_PASSWORD: &str = "other-secret";

/// The ways another user of one Redis node has to free, change, read or
/// stall the lock `k` held there (the key `lock:{k}`), or the lock user.
const REDIS_INTRUSIONS: &[&[&str]] = &[
    &["DEL", "lock:{k}"],
    &["UNLINK", "lock:{k}"],
    &["SET", "lock:{k}", "mine"],
    &["HSET", "lock:{k}", "holder", "mine"],
    &["PEXPIRE", "lock:{k}", "1"],
    &["RENAME", "lock:{k}", "cache:stolen"],
    &["GET", "lock:{k}"],
    &["EVAL", "return redis.call('del', KEYS[1])", "1", "lock:{k}"],
    // A script's keys are checked when it calls, declared or not.
    &["EVAL", "return redis.call('del', 'lock:{k}')", "0"],
    &["PUBLISH", "lock:{k}", "released"],
    &["FLUSHALL"],
    &["FLUSHDB"],
    &["SWAPDB", "0", "1"],
    &["CLIENT", "KILL", "USER", "locks"],
    &["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"],
    &["ACL", "SETUSER", "locks", "off"],
    &["SHUTDOWN", "NOSAVE"],
];

/// What a Redis Cluster adds: moving, forgetting or failing over the
/// slot that holds the lock, migrating its key, or its sharded notices.
const CLUSTER_INTRUSIONS: &[&[&str]] = &[
    &["MIGRATE", "127.0.0.1", "1", "lock:{k}", "0", "1000"],
    &[
        "CLUSTER",
        "SETSLOT",
        "0",
        "MIGRATING",
        "0000000000000000000000000000000000000000",
    ],
    &["CLUSTER", "DELSLOTS", "0"],
    &["CLUSTER", "FLUSHSLOTS"],
    &["CLUSTER", "FAILOVER", "TAKEOVER"],
    &["CLUSTER", "RESET", "HARD"],
    &["CLUSTER", "FORGET", "0000000000000000000000000000000000000000"],
    &["CLUSTER", "MEET", "127.0.0.1", "1"],
    &["CLUSTER", "SET-CONFIG-EPOCH", "99"],
    &["CLUSTER", "BUMPEPOCH"],
    &["SPUBLISH", "lock:{k}:released", "released"],
];

/// What a sentinel adds: forgetting the master, pointing its name at
/// another server, failing it over or reconfiguring the sentinel.
const SENTINEL_INTRUSIONS: &[&[&str]] = &[
    &["SENTINEL", "REMOVE", MASTER_NAME],
    &["SENTINEL", "MONITOR", "elsewhere", "127.0.0.1", "1", "1"],
    &["SENTINEL", "SET", MASTER_NAME, "down-after-milliseconds", "1"],
    &["SENTINEL", "FAILOVER", MASTER_NAME],
    &["SENTINEL", "RESET", "*"],
    &["SENTINEL", "CONFIG", "SET", "resolve-hostnames", "yes"],
    &["SENTINEL", "FLUSHCONFIG"],
    &["SENTINEL", "SIMULATE-FAILURE", "crash-after-election"],
    &["CLIENT", "KILL", "USER", "locks"],
    &["ACL", "SETUSER", "locks", "off"],
    &["SHUTDOWN"],
];

/// Gives the server on `port` the user [`OTHER`] with
/// [`OTHER_REDIS_USER_RULES`], as its default user.
fn add_other_redis_user(port: u16) {
    let mut admin = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .and_then(|client| client.get_connection())
        .expect("connect as the default user");
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg(OTHER)
        .arg("on")
        .arg(format!(">{OTHER_PASSWORD}"))
        .arg(OTHER_REDIS_USER_RULES.split_whitespace().collect::<Vec<_>>())
        .query::<()>(&mut admin)
        .expect("add another user");
}

/// Each of `attempts`, sent as [`OTHER`] to the server on `port`, is
/// refused by its ACL.
fn refused_to_another_user(port: u16, attempts: &[&[&str]]) {
    let mut intruder = redis::Client::open(format!("redis://{OTHER}:{OTHER_PASSWORD}@127.0.0.1:{port}/"))
        .and_then(|client| client.get_connection())
        .expect("connect as another user");
    for attempt in attempts {
        let answer = redis::cmd(attempt[0])
            .arg(&attempt[1..])
            .query::<redis::Value>(&mut intruder);
        match answer {
            Err(e) if e.code() == Some("NOPERM") || e.to_string().contains("can't access") => {}
            other => panic!(
                "another user's `{}` was not refused on port {port}: {other:?}",
                attempt.join(" ")
            ),
        }
    }
    // Within its grants: scripts are no one's, and the client loads its
    // own again when the server has forgotten them.
    if attempts.iter().any(|attempt| attempt[0] == "EVAL") {
        redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query::<()>(&mut intruder)
            .expect("SCRIPT FLUSH is not a dangerous command");
    }
}

/// `server`'s ACL refused only [`OTHER`] (the lock user nothing); its log
/// is then emptied for the audit on drop.
fn only_the_other_user_refused(server: &RedisServer) {
    let refused = server.acl_refusals().expect("the ACL log");
    assert!(
        refused.iter().all(|refusal| refusal.starts_with("other:")),
        "the lock user was refused something on port {}: {refused:?}",
        server.port()
    );
    server.query::<()>(redis::cmd("ACL").arg("LOG").arg("RESET"));
}

#[tokio::test]
async fn another_redis_user_cannot_free_change_or_stall_a_held_lock() {
    lock_tests::bounded(
        "another_redis_user_cannot_free_change_or_stall_a_held_lock",
        async {
            let server = RedisServer::start_with_lock_user("");
            add_other_redis_user(server.port());
            let locks = LockClient::connect(&server.lock_user_url())
                .await
                .expect("the lock user");
            let guard = locks.lock("k").ttl(TTL).acquire().await.expect("acquire");
            refused_to_another_user(server.port(), REDIS_INTRUSIONS);
            only_the_other_user_refused(&server);
            let second = LockClient::connect(&server.lock_user_url())
                .await
                .expect("a second client");
            kept(&guard, false, &second, "Redis").await;
            assert_eq!(server.query::<i64>(redis::cmd("EXISTS").arg("lock:{k}")), 1);
            guard.release().await.expect("release");
        },
    )
    .await
}

/// The same on every node of a Redis Cluster, each with the rules of
/// docs/backends.md for both users, and the cluster's own ways in.
#[tokio::test]
async fn another_cluster_user_cannot_free_change_or_stall_a_held_lock() {
    lock_tests::bounded(
        "another_cluster_user_cannot_free_change_or_stall_a_held_lock",
        async {
            let cluster = Cluster::start_with_lock_user(3, 0);
            for node in &cluster.nodes {
                add_other_redis_user(node.port());
            }
            let locks = LockClient::cluster(cluster.lock_user_urls())
                .await
                .expect("the lock user");
            let guard = locks.lock("k").ttl(TTL).acquire().await.expect("acquire");
            for node in &cluster.nodes {
                refused_to_another_user(node.port(), REDIS_INTRUSIONS);
                refused_to_another_user(node.port(), CLUSTER_INTRUSIONS);
                only_the_other_user_refused(node);
            }
            let second = LockClient::cluster(cluster.lock_user_urls())
                .await
                .expect("a second client");
            kept(&guard, false, &second, "Redis Cluster").await;
            let master = &cluster.nodes[cluster.master_of("lock:{k}")];
            assert_eq!(master.query::<i64>(redis::cmd("EXISTS").arg("lock:{k}")), 1);
            guard.release().await.expect("release");
        },
    )
    .await
}

/// The same on a Sentinel group's master, and at the sentinels, whose
/// other users could otherwise send the client to another server (forget
/// the master, then name another one after it).
#[tokio::test]
async fn another_sentinel_user_cannot_free_change_or_stall_a_held_lock() {
    lock_tests::bounded(
        "another_sentinel_user_cannot_free_change_or_stall_a_held_lock",
        async {
            let group = Replicated::start_named_with_lock_user(0);
            add_other_redis_user(group.master.port());
            for port in group.sentinel_ports() {
                add_other_redis_user(port);
            }
            let client = async || {
                LockClient::sentinel(MASTER_NAME, group.lock_user_sentinel_urls())
                    .await
                    .expect("the lock user")
            };
            let locks = client().await;
            let guard = locks.lock("k").ttl(TTL).acquire().await.expect("acquire");
            refused_to_another_user(group.master.port(), REDIS_INTRUSIONS);
            only_the_other_user_refused(&group.master);
            for port in group.sentinel_ports() {
                refused_to_another_user(port, SENTINEL_INTRUSIONS);
            }
            assert_eq!(
                group.master_port_by_sentinel(),
                Some(group.master.port()),
                "the sentinels still name the master"
            );
            let second = client().await;
            kept(&guard, false, &second, "Sentinel").await;
            assert_eq!(group.master.query::<i64>(redis::cmd("EXISTS").arg("lock:{k}")), 1);
            guard.release().await.expect("release");
        },
    )
    .await
}

/// The same on each master of a Redlock, as the lock user of one node
/// (without `+info`: the client's check that the masters are distinct
/// servers is skipped, with a warning, as docs/backends.md says).
#[tokio::test]
async fn another_redlock_user_cannot_free_change_or_stall_a_held_lock() {
    lock_tests::bounded(
        "another_redlock_user_cannot_free_change_or_stall_a_held_lock",
        async {
            let masters: Vec<RedisServer> = (0..3).map(|_| RedisServer::start_with_lock_user("")).collect();
            for master in &masters {
                add_other_redis_user(master.port());
            }
            let urls: Vec<String> = masters.iter().map(RedisServer::lock_user_url).collect();
            let (captured, tracing) = capture_tracing();
            let locks = LockClient::redlock(&urls).await.expect("the lock user");
            drop(tracing);
            let warned = captured.text();
            assert_eq!(
                warned.matches("INFO failed").count(),
                masters.len(),
                "a warning per master that may not run INFO: {warned}"
            );
            // Each start-up was refused `INFO`, and nothing else.
            let only_info_refused = || {
                for master in &masters {
                    let refused = master.acl_refusals().expect("the ACL log");
                    assert_eq!(refused, ["locks: info"], "on port {}", master.port());
                    master.query::<()>(redis::cmd("ACL").arg("LOG").arg("RESET"));
                }
            };
            only_info_refused();
            let guard = locks.lock("k").ttl(TTL).acquire().await.expect("acquire");
            for master in &masters {
                refused_to_another_user(master.port(), REDIS_INTRUSIONS);
                only_the_other_user_refused(master);
            }
            let second = LockClient::redlock(&urls).await.expect("a second client");
            only_info_refused();
            kept(&guard, false, &second, "Redlock").await;
            for master in &masters {
                assert_eq!(master.query::<i64>(redis::cmd("EXISTS").arg("lock:{k}")), 1);
            }
            guard.release().await.expect("release");
        },
    )
    .await
}

#[tokio::test]
async fn another_postgres_role_cannot_free_change_or_stall_a_held_lock() {
    lock_tests::bounded(
        "another_postgres_role_cannot_free_change_or_stall_a_held_lock",
        async {
            let server = Postgres::start();
            // Both may create tables in `public`: another service sharing the
            // database, not a role shut out of it.
            server.add_password_role("app", "app-secret");
            server.add_password_role("other", "other-secret");
            let url = |user: &str| {
                format!(
                    "host=127.0.0.1 port={} user={user} password={user}-secret dbname=locks",
                    server.port()
                )
            };
            let locks = LockClient::postgres(&url("app")).await.expect("the lock role");
            let (guard, reader) = hold_both(&locks).await;
            let (intruder, connection) = tokio_postgres::connect(&url("other"), tokio_postgres::NoTls)
                .await
                .expect("connect as another role");
            tokio::spawn(connection);
            let sessions: i64 = intruder
                .query_one("SELECT count(*) FROM pg_stat_activity WHERE usename = 'app'", &[])
                .await
                .expect("another role sees the lock role's sessions")
                .get(0);
            assert!(sessions > 0, "the lock role has no session to end");
            let mut attempts = vec![
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'app'".to_owned(),
                "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE usename = 'app'".to_owned(),
                "ALTER ROLE app NOLOGIN".to_owned(),
            ];
            for table in ["distributed_locks", "distributed_locks_members"] {
                attempts.extend(sql_writes(table));
                attempts.extend([
                    format!("ALTER TABLE {table} RENAME TO stolen"),
                    // Would stall every renewal until the transaction ended.
                    format!("BEGIN; LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"),
                ]);
            }
            for attempt in &attempts {
                let answer = intruder.batch_execute(attempt).await;
                let _ = intruder.batch_execute("ROLLBACK").await;
                match answer {
                    Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) => {}
                    other => panic!("another role's `{attempt}` was not refused: {other:?}"),
                }
            }
            let second = LockClient::postgres(&url("app")).await.expect("a second client");
            // Any role may LISTEN and NOTIFY on any channel (PostgreSQL has
            // no grant for either): another role learns what a real
            // release announces, and announces the held lock's release in
            // those very words, naming its holder and its channel. A waiter
            // so woken tries, finds the lock held, and waits on until its
            // own deadline.
            let heard = listen_as(&url("other"), "distributed_locks").await;
            let holder_of = async |key: &str| -> String {
                let found = locks.admin().inspect(key).await.expect("inspect");
                found[0].holders[0].id.clone()
            };
            let probe = locks.lock("probe").acquire().await.expect("free");
            let probe_holder = holder_of("probe").await;
            let probe_waiter = tokio::spawn({
                let second = second.clone();
                async move {
                    second
                        .lock("probe")
                        .wait(Duration::from_secs(20))
                        .acquire()
                        .await?
                        .release()
                        .await
                }
            });
            // A release is announced once someone waits for it.
            let deadline = Instant::now() + Duration::from_secs(20);
            while server.sql("SELECT waiting FROM distributed_locks WHERE name = 'lock:{probe}'") != ["t"] {
                assert!(
                    Instant::now() < deadline,
                    "the probe's waiter never marked the lock"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            probe.release().await.expect("release");
            let real = heard.recv_within(Duration::from_secs(20)).await;
            assert_eq!(real, format!("{probe_holder} lock:{{probe}}:released"));
            probe_waiter
                .await
                .expect("join")
                .expect("the real release let the waiter in");
            let forged = format!("{} lock:{{k}}:released", holder_of("k").await);
            let waiting = second.lock("k").wait(Duration::from_millis(1500)).acquire();
            let forging = async {
                for _ in 0..30 {
                    intruder
                        .execute("SELECT pg_notify('distributed_locks', $1)", &[&forged])
                        .await
                        .expect("any role may notify");
                    tokio::time::sleep(Duration::from_millis(40)).await;
                }
            };
            let (waited, ()) = tokio::join!(waiting, forging);
            assert!(
                matches!(waited, Err(LockError::Timeout { .. })),
                "a waiter woken by forged notices: {waited:?}"
            );
            assert_eq!(
                heard.recv_within(Duration::from_secs(20)).await,
                forged,
                "the forged notice went out as a real one"
            );
            kept(&guard, false, &second, "PostgreSQL").await;
            kept(&reader, true, &second, "PostgreSQL, a read lock").await;
        },
    )
    .await
}

#[tokio::test]
async fn another_mariadb_user_cannot_free_change_or_stall_a_held_lock() {
    lock_tests::bounded(
        "another_mariadb_user_cannot_free_change_or_stall_a_held_lock",
        async {
            let server = MariaDb::start();
            for statement in [
                "CREATE USER 'app'@'%' IDENTIFIED BY 'app-secret'",
                "GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON locks.* TO 'app'@'%'",
                // Another service of the same server, with a database of its own.
                "CREATE DATABASE other",
                "CREATE USER 'other'@'%' IDENTIFIED BY 'other-secret'",
                "GRANT ALL ON other.* TO 'other'@'%'",
            ] {
                server.sql(statement).await;
            }
            let url = server.url_as("app", "app-secret");
            let locks = LockClient::mysql(&url).await.expect("the lock user");
            let (guard, reader) = hold_both(&locks).await;
            let mut intruder = mysql_async::Conn::from_url(format!(
                "mysql://other:other-secret@127.0.0.1:{}/other",
                server.port()
            ))
            .await
            .expect("connect as another user");
            let sessions = server
                .sql("SELECT id FROM information_schema.processlist WHERE user = 'app'")
                .await;
            assert!(!sessions.is_empty(), "the lock user has no session to end");
            let mut attempts: Vec<String> = sessions
                .iter()
                .filter_map(|row| row[0].as_ref())
                .map(|id| format!("KILL {id}"))
                .collect();
            attempts.extend([
                "SET GLOBAL max_connections = 1".to_owned(),
                "ALTER USER 'app'@'%' ACCOUNT LOCK".to_owned(),
            ]);
            for table in ["locks.distributed_locks", "locks.distributed_locks_members"] {
                attempts.extend(sql_writes(table));
                attempts.extend([
                    format!("RENAME TABLE {table} TO other.stolen"),
                    format!("LOCK TABLES {table} WRITE"),
                    format!("CREATE TRIGGER other.stall BEFORE UPDATE ON {table} FOR EACH ROW SET @x = 1"),
                ]);
            }
            use mysql_async::prelude::Queryable;
            for attempt in &attempts {
                match intruder.query_drop(attempt).await {
                    Err(mysql_async::Error::Server(e)) if REFUSALS.contains(&e.code) => {}
                    other => panic!("another user's `{attempt}` was not refused: {other:?}"),
                }
            }
            let second = LockClient::mysql(&url).await.expect("a second client");
            kept(&guard, false, &second, "MariaDB").await;
            kept(&reader, true, &second, "MariaDB, a read lock").await;
        },
    )
    .await
}

/// MariaDB's refusals: no privilege on a database (1044), on a table
/// (1142), of a kind (1227, 1370), and not the thread's owner (1095).
const REFUSALS: [u16; 5] = [1044, 1095, 1142, 1227, 1370];

/// On etcd, also: a user added while the client runs does not stop it
/// (its token, refused as old, is renewed).
#[tokio::test]
async fn another_etcd_user_cannot_free_change_or_stall_a_held_lock() {
    use etcd_client::{Client, ConnectOptions, DeleteOptions, GetOptions, Permission, Txn, TxnOp};
    lock_tests::bounded(
        "another_etcd_user_cannot_free_change_or_stall_a_held_lock",
        async {
            // JWT tokens, which carry the auth store's revision they were
            // signed at (a simple token is checked against the current one).
            let keys = tempfile::tempdir().expect("a directory for the signing key");
            lock_tests::make_certificates(keys.path());
            let jwt = format!(
                "--auth-token=jwt,pub-key={},priv-key={},sign-method=RS256,ttl=10m",
                keys.path().join("server.crt").display(),
                keys.path().join("server.key").display()
            );
            let etcd = lock_tests::Etcd::start_secured(None, &[&jwt]);
            let (captured, _tracing) = capture_tracing();
            let endpoints = etcd.endpoints();
            let mut admin = Client::connect(&endpoints, None).await.expect("connect");
            admin
                .user_add("root", "root-secret", None)
                .await
                .expect("add root");
            admin.user_grant_role("root", "root").await.expect("root is root");
            // The lock's role, as docs/backends.md gives it, and another
            // service's, on a prefix of its own.
            for (user, role, prefix) in [
                ("app", "locks", "/distributed-locks/"),
                ("other", "others", "/others/"),
            ] {
                admin.role_add(role).await.expect("add a role");
                admin
                    .role_grant_permission(role, Permission::read_write(prefix).with_prefix())
                    .await
                    .expect("grant the prefix");
                admin
                    .user_add(user, format!("{user}-secret"), None)
                    .await
                    .expect("add a user");
                admin.user_grant_role(user, role).await.expect("grant the role");
            }
            admin.auth_enable().await.expect("auth enable");
            let endpoint_list: Vec<&str> = endpoints.iter().map(String::as_str).collect();
            let client = async || {
                LockClient::builder()
                    .etcd_user("app", "app-secret")
                    .etcd(&endpoint_list)
                    .await
                    .expect("the lock user")
            };
            let locks = client().await;
            let guard = locks.lock("k").ttl(TTL).acquire().await.expect("acquire");
            let as_user = |user: &str| ConnectOptions::new().with_user(user, format!("{user}-secret"));
            let mut root = Client::connect(&endpoints, Some(as_user("root")))
                .await
                .expect("connect as root");
            let held = root
                .get("/distributed-locks/", Some(GetOptions::new().with_prefix()))
                .await
                .expect("list the lock keys");
            let held: Vec<(Vec<u8>, i64)> = held
                .kvs()
                .iter()
                .map(|kv| (kv.key().to_vec(), kv.lease()))
                .collect();
            assert!(!held.is_empty(), "no lock key under the prefix");
            let mut intruder = Client::connect(&endpoints, Some(as_user("other")))
                .await
                .expect("connect as another user");
            let mut answers = Vec::new();
            for (key, lease) in &held {
                answers.push((
                    "delete the key",
                    intruder.delete(key.clone(), None).await.map(drop),
                ));
                answers.push((
                    "overwrite the key",
                    intruder.put(key.clone(), "mine", None).await.map(drop),
                ));
                answers.push(("read the key", intruder.get(key.clone(), None).await.map(drop)));
                answers.push((
                    "revoke the holder's lease",
                    intruder.lease_revoke(*lease).await.map(drop),
                ));
                let txn = Txn::new().and_then([TxnOp::delete(key.clone(), None)]);
                answers.push((
                    "delete the key in a transaction",
                    intruder.txn(txn).await.map(drop),
                ));
            }
            answers.push((
                "delete the prefix",
                intruder
                    .delete("/distributed-locks/", Some(DeleteOptions::new().with_prefix()))
                    .await
                    .map(drop),
            ));
            answers.push((
                "grant itself the prefix",
                intruder
                    .role_grant_permission(
                        "others",
                        Permission::read_write("/distributed-locks/").with_prefix(),
                    )
                    .await
                    .map(drop),
            ));
            answers.push((
                "take away the lock user's role",
                intruder.user_revoke_role("app", "locks").await.map(drop),
            ));
            for (what, answer) in answers {
                match answer {
                    Err(etcd_client::Error::GRpcStatus(status))
                        if status.message() == "etcdserver: permission denied" => {}
                    other => panic!("another user could {what}: {other:?}"),
                }
            }
            // An operator adding a user moves the auth store's revision on:
            // the cluster refuses the running client's token as old ("revision
            // of auth store is old") until it authenticates again, which it
            // does, so that it keeps locking (the driver alone would fail
            // every request until the token's 10 minutes were up).
            root.user_add("late", "late-secret", None)
                .await
                .expect("add a user while the client runs");
            let another = locks
                .lock("k2")
                .ttl(TTL)
                .acquire()
                .await
                .expect("a lock after the auth store changed");
            let second = client().await;
            kept(&guard, false, &second, "etcd").await;
            kept(&another, false, &second, "etcd, after the auth store changed").await;
            // A JWT starts with its base64 header, `{"` as `eyJ`: none of
            // the tokens the clients were given shows, nor a password.
            let shown = format!("{} {locks:?} {guard:?} {second:?}", captured.text());
            assert!(
                !captured.text().is_empty(),
                "nothing was traced: the check saw nothing"
            );
            assert!(!shown.contains("eyJ"), "a token shows: {shown}");
            assert!(!shown.contains("app-secret"), "a password shows: {shown}");
        },
    )
    .await
}
