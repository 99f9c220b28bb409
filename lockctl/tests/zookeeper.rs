//! `lockctl --zookeeper`: the built binary against a ZooKeeper server the
//! harness starts (`ZooKeeperServerMain` from Debian's jars), while
//! services' locks of every kind are held (and waited for) in this
//! process.

use std::process::Output;
use std::time::Duration;

use lock_runtime::{LockClient, LockError, LockMode, LockRequest};
use lock_tests::ZooKeeper;
use serde_json::Value;
use zookeeper_client as zk;

mod common;
use common::{BOUND, PasswordFrom, find, json_lines, lockctl_with_password, stdout};

/// Where the services' locks live: not the default, so `--zookeeper-root`
/// is what finds them.
const ROOT: &str = "/shop-locks";

fn lockctl(zk: &ZooKeeper, args: &[&str]) -> Output {
    let connect = zk.connect_string();
    let mut all = vec!["--zookeeper", &connect, "--zookeeper-root", ROOT];
    all.extend_from_slice(args);
    lock_tests::output_within_limit(
        std::process::Command::new(env!("CARGO_BIN_EXE_lockctl")).args(&all),
        &format!("lockctl {}", args.join(" ")),
    )
}

/// A service's client, with a session a loaded machine cannot lapse.
async fn locks(zk: &ZooKeeper) -> LockClient {
    LockClient::builder()
        .zookeeper_root(ROOT)
        .zookeeper_session_timeout(Duration::from_secs(20))
        .zookeeper(&zk.connect_string())
        .await
        .expect("connect")
}

/// Until the queue of `key` has `n` children, holders and waiters.
async fn until_queue_is(operator: &zk::Client, key: &str, n: usize) {
    let queue = format!("{ROOT}/lock:{{{key}}}");
    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        let count = operator.list_children(&queue).await.map_or(0, |c| c.len());
        if count == n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{key}'s queue never had {n} children (last {count})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A task waiting for the lock `request` asks for, that releases it once
/// it has it.
fn waiter<R>(locks: &LockClient, request: R) -> tokio::task::JoinHandle<Result<(), LockError>>
where
    R: for<'c> FnOnce(&'c LockClient) -> LockRequest<'c> + Send + 'static,
{
    let locks = locks.clone();
    tokio::spawn(async move {
        request(&locks)
            .wait(Duration::from_secs(60))
            .acquire()
            .await?
            .release()
            .await
    })
}

fn roles(lock: &Value) -> Vec<String> {
    lock["holders"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|h| h["role"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_inspect_tell_holders_from_waiters_in_every_kind_of_queue() {
    lock_tests::bounded(
        "list_and_inspect_tell_holders_from_waiters_in_every_kind_of_queue",
        async move {
            let server = ZooKeeper::start();
            let operator = zk::Client::connect(&server.connect_string())
                .await
                .expect("an operator's session");
            let locks = locks(&server).await;
            let fenced = locks
                .lock("stock:1")
                .ttl(Duration::from_secs(30))
                .fencing(true)
                .acquire()
                .await
                .expect("free");
            let token = fenced.fencing_token().expect("a token was asked for");
            let stock_waiter = waiter(&locks, |l| l.lock("stock:1"));
            let read = || locks.lock("catalog").mode(LockMode::Read).acquire();
            let readers = [read().await.expect("read"), read().await.expect("read")];
            let writer = waiter(&locks, |l| l.lock("catalog").mode(LockMode::Write));
            // Three permits: the count the nodes keep, not the holders
            // seen, tells the third holder from a waiter.
            let permit = || locks.lock("pool").permits(3).acquire();
            let permits = [
                permit().await.expect("permit"),
                permit().await.expect("permit"),
                permit().await.expect("permit"),
            ];
            let fourth = waiter(&locks, |l| l.lock("pool").permits(3));
            let segment = locks
                .lock("counter")
                .segments(4)
                .acquire()
                .await
                .expect("segment");
            let fair = locks.lock("queue").fair(true).acquire().await.expect("free");
            let fair_waiter = common::fair_waiter(&locks, "queue");
            for (key, n) in [("stock:1", 2), ("catalog", 3), ("pool", 4), ("queue", 2)] {
                until_queue_is(&operator, key, n).await;
            }

            let listed = json_lines(&lockctl(&server, &["--json", "list"]));
            let stock = find(&listed, "stock:1");
            assert_eq!(stock["kind"], "exclusive");
            assert_eq!(
                stock["fence"], token,
                "the holder's token: its node's creation zxid"
            );
            assert_eq!(
                (stock["waiters"].clone(), stock["in_line"].clone()),
                (true.into(), 1.into())
            );
            assert!(
                stock["holders"][0]["time_left_ms"].is_null(),
                "a node lives as long as its session, not a time: {stock}"
            );
            let catalog = find(&listed, "catalog");
            assert_eq!(catalog["kind"], "read-write");
            assert_eq!(
                roles(catalog),
                ["reader", "reader"],
                "the waiting writer is no holder"
            );
            assert_eq!(catalog["waiters"], true);
            let pool = find(&listed, "pool");
            assert_eq!(pool["kind"], "permits");
            assert_eq!(
                roles(pool),
                ["permit", "permit", "permit"],
                "the fourth in line waits: {pool}"
            );
            assert_eq!(pool["in_line"], 1);
            let seg = format!("counter#{}", segment.segment().expect("a segment"));
            assert_eq!(find(&listed, &seg)["kind"], "segment");
            let queue = find(&listed, "queue");
            assert_eq!(queue["kind"], "fair");
            assert_eq!(queue["in_line"], 1);
            assert_eq!(listed.len(), 5, "{listed:?}");
            let table = stdout(&lockctl(&server, &["list"]));
            assert!(table.contains("session"), "{table}");

            // A Redis glob, with its `?` and `[…]`.
            let narrowed = json_lines(&lockctl(&server, &["--json", "list", "st?ck:[0-9]"]));
            assert_eq!(narrowed.len(), 1, "{narrowed:?}");
            assert_eq!(narrowed[0]["key"], "stock:1");
            assert!(json_lines(&lockctl(&server, &["--json", "list", "stock:[2-9]"])).is_empty());
            let unclosed = lockctl(&server, &["list", "stock:[1"]);
            assert_eq!(unclosed.status.code(), Some(1));
            assert!(String::from_utf8_lossy(&unclosed.stderr).contains("`[`"));

            let inspected = json_lines(&lockctl(&server, &["--json", "inspect", &seg]));
            assert_eq!(inspected[0]["held"], true);
            let free = json_lines(&lockctl(&server, &["--json", "inspect", "nothing:here"]));
            assert_eq!(free[0]["held"], false);
            let text = stdout(&lockctl(&server, &["inspect", "catalog"]));
            assert!(text.contains("held while its session lives"), "{text}");

            // Every release hands over; once the waiters are through,
            // nothing is listed (an empty queue the server has not reaped
            // yet is no lock).
            fenced.release().await.expect("release");
            let [a, b] = readers;
            a.release().await.expect("release");
            b.release().await.expect("release");
            for p in permits {
                p.release().await.expect("release");
            }
            segment.release().await.expect("release");
            fair.release().await.expect("release");
            for waiting in [stock_waiter, writer, fourth, fair_waiter] {
                common::got_the_lock(waiting, "the waiter got the lock").await;
            }
            let listed = json_lines(&lockctl(&server, &["--json", "list"]));
            assert!(listed.is_empty(), "{listed:?}");
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_force_stops_the_holder_hands_over_and_keeps_tokens_growing() {
    lock_tests::bounded(
        "unlock_force_stops_the_holder_hands_over_and_keeps_tokens_growing",
        async move {
            let server = ZooKeeper::start();
            let operator = zk::Client::connect(&server.connect_string())
                .await
                .expect("an operator's session");
            let other = locks(&server).await;
            common::a_stuck_holder_is_freed_by_force(locks(&server).await, &other, |args| {
                lockctl(&server, args)
            })
            .await;

            // A read-write lock loses every reader at once; a waiting
            // writer keeps its place and gets the lock.
            let readers = [
                other
                    .lock("catalog")
                    .mode(LockMode::Read)
                    .acquire()
                    .await
                    .expect("read"),
                other
                    .lock("catalog")
                    .mode(LockMode::Read)
                    .acquire()
                    .await
                    .expect("read"),
            ];
            let writer = waiter(&other, |l| l.lock("catalog").mode(LockMode::Write));
            until_queue_is(&operator, "catalog", 3).await;
            let forced = json_lines(&lockctl(&server, &["--json", "unlock", "catalog", "--force"]));
            assert_eq!(forced[0]["freed"], true);
            common::got_the_lock(writer, "the writer got the lock").await;
            for reader in readers {
                assert!(matches!(reader.release().await, Err(LockError::NotHeld { .. })));
            }

            // A fair lock's line stays: its first waiter gets the lock.
            let fair = other.lock("queue").fair(true).acquire().await.expect("free");
            let next = common::fair_waiter(&other, "queue");
            until_queue_is(&operator, "queue", 2).await;
            let forced = json_lines(&lockctl(&server, &["--json", "unlock", "queue", "--force"]));
            assert_eq!(forced[0]["freed"], true);
            common::got_the_lock(next, "the first in line got the lock").await;
            assert!(matches!(fair.release().await, Err(LockError::NotHeld { .. })));
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_acquisitions_and_releases() {
    lock_tests::bounded("watch_prints_acquisitions_and_releases", async move {
        let server = ZooKeeper::start();
        let locks = locks(&server).await;
        let connect = server.connect_string();
        let target = ["--zookeeper", &connect, "--zookeeper-root", ROOT];
        common::watch_prints_the_lock_coming_and_going(&target, &locks, |holder| {
            assert!(!holder.is_empty(), "the acquisition names its holder");
        })
        .await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_is_listed_with_its_leader_value_and_epoch() {
    lock_tests::bounded(
        "an_election_is_listed_with_its_leader_value_and_epoch",
        async move {
            let server = ZooKeeper::start();
            let locks = locks(&server).await;
            common::an_election_is_listed_with_its_leader(&locks, |args| lockctl(&server, args)).await;
        },
    )
    .await
}

/// A ZooKeeper TLS port that asks for client certificates, and lock nodes
/// that only the services' digest identity may touch: `lockctl` lists a
/// held lock and frees it given the CA (`--tls-ca`), its certificate and
/// key (`--zookeeper-cert`, `--zookeeper-key`) and the identity
/// (`--zookeeper-user`), whose password (of every URL character) comes
/// from `LOCKCTL_PASSWORD` or `--password-file` and never shows. A wrong
/// password is refused; without the identity the nodes' ACL refuses the
/// listing, saying what is missing; so are a user without a password and
/// a password file without a user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secured_ensemble_is_read_with_a_certificate_and_the_identity() {
    lock_tests::bounded(
        "a_secured_ensemble_is_read_with_a_certificate_and_the_identity",
        async move {
            let certs = tempfile::tempdir().expect("cert dir");
            lock_tests::make_certificates(certs.path());
            lock_tests::make_client_certificate(certs.path(), "lockctl");
            let path = |name: &str| certs.path().join(name);
            let read = |name: &str| std::fs::read(path(name)).expect("read a certificate file");
            let server = ZooKeeper::start_with_tls(certs.path(), true);
            let connect = server.tls_connect_string();
            let password = "Zq7@/#?:%Wv3";
            let locks = LockClient::builder()
                .zookeeper_root(ROOT)
                .zookeeper_session_timeout(Duration::from_secs(20))
                // The JVM's first handshakes are slow on two busy cores.
                .startup_timeout(Duration::from_secs(20))
                .tls_root_certificate(read("ca.crt"))
                .zookeeper_client_certificate(read("lockctl.crt"), read("lockctl.key"))
                .zookeeper_digest("locks", password)
                .zookeeper(&connect)
                .await
                .expect("a service's client");
            let guard = locks.lock("secured").acquire().await.expect("free");

            let (ca, cert, key) = (path("ca.crt"), path("lockctl.crt"), path("lockctl.key"));
            let mut args = vec![
                "--json",
                "list",
                "--zookeeper",
                &connect,
                "--zookeeper-root",
                ROOT,
            ];
            args.extend(["--tls-ca", ca.to_str().expect("utf-8 path")]);
            args.extend(["--zookeeper-cert", cert.to_str().expect("utf-8 path")]);
            args.extend(["--zookeeper-key", key.to_str().expect("utf-8 path")]);
            let without_user = args.clone();
            args.extend(["--zookeeper-user", "locks"]);
            common::takes_the_password_and_refuses_a_wrong_one(
                &args,
                password,
                "secured",
                "may not create nodes",
            );

            let dir = tempfile::tempdir().expect("a directory for the password file");
            let no_identity = lock_tests::output_within_limit(
                std::process::Command::new(env!("CARGO_BIN_EXE_lockctl"))
                    .args(&without_user)
                    .env_remove("LOCKCTL_PASSWORD"),
                "lockctl without the identity",
            );
            assert!(!no_identity.status.success());
            let said = String::from_utf8_lossy(&no_identity.stderr);
            assert!(said.contains("the services' ZooKeeper identity"), "{said}");
            let no_password = lock_tests::output_within_limit(
                std::process::Command::new(env!("CARGO_BIN_EXE_lockctl"))
                    .args(&args)
                    .env_remove("LOCKCTL_PASSWORD"),
                "lockctl without a password",
            );
            assert!(!no_password.status.success());
            assert!(String::from_utf8_lossy(&no_password.stderr).contains("--password-file"));
            let no_user = lockctl_with_password(&without_user, password, PasswordFrom::File, dir.path());
            assert!(!no_user.status.success());
            assert!(String::from_utf8_lossy(&no_user.stderr).contains("--zookeeper-user"));

            // The identity frees the lock: its holder learns it lost it.
            let mut unlock = args.clone();
            unlock.retain(|a| *a != "list");
            unlock.extend(["unlock", "secured", "--force"]);
            let freed = json_lines(&lockctl_with_password(
                &unlock,
                password,
                PasswordFrom::Environment,
                dir.path(),
            ));
            assert_eq!(freed[0]["freed"], true);
            assert!(matches!(guard.release().await, Err(LockError::NotHeld { .. })));
        },
    )
    .await
}
