//! `lockctl --postgres`: the built binary against a PostgreSQL lock table
//! the harness starts (`initdb` + `postgres`), while services' locks of
//! every kind are held in this process.

use std::process::Output;
use std::time::Duration;

use lock_runtime::{LockClient, LockError, LockMode};
use lock_tests::Postgres;
use serde_json::Value;

mod common;
use common::{BOUND, find, json_lines, takes_the_password_and_refuses_a_wrong_one};

/// The table the services use: not the default, so `--postgres-table` is
/// what finds it.
const TABLE: &str = "shop_locks";

fn lockctl(url: &str, args: &[&str]) -> Output {
    let mut all = vec!["--postgres", url, "--postgres-table", TABLE];
    all.extend_from_slice(args);
    lock_tests::output_within_limit(
        std::process::Command::new(env!("CARGO_BIN_EXE_lockctl")).args(&all),
        &format!("lockctl {}", args.join(" ")),
    )
}

async fn client(server: &Postgres) -> LockClient {
    LockClient::builder()
        .postgres_table(TABLE)
        .postgres(&server.url())
        .await
        .expect("connect")
}

/// Until `n` waiters stand in the fair lock `key`'s line.
async fn until_in_line(server: &Postgres, key: &str, n: usize) {
    let query = format!("SELECT count(*) FROM {TABLE}_members WHERE name = 'lock:{{{key}}}'");
    let stood = lock_tests::eventually(BOUND, || server.sql(&query) == [n.to_string()]).await;
    assert!(stood.is_some(), "{n} waiters never stood in {key}'s line");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_inspect_show_every_kind_with_holders_time_left_fence_and_line() {
    lock_tests::bounded(
        "list_and_inspect_show_every_kind_with_holders_time_left_fence_and_line",
        async move {
            let server = Postgres::start();
            let url = server.url();
            let locks = client(&server).await;
            let fenced = locks
                .lock("stock:1")
                .ttl(Duration::from_secs(30))
                .fencing(true)
                .acquire()
                .await
                .expect("free");
            let token = fenced.fencing_token().expect("a token was asked for");
            let readers = [
                locks
                    .lock("catalog")
                    .mode(LockMode::Read)
                    .acquire()
                    .await
                    .expect("read"),
                locks
                    .lock("catalog")
                    .mode(LockMode::Read)
                    .acquire()
                    .await
                    .expect("read"),
            ];
            let permit = locks.lock("pool").permits(3).acquire().await.expect("permit");
            let segment = locks
                .lock("counter")
                .segments(4)
                .acquire()
                .await
                .expect("segment");
            let fair = locks.lock("queue").fair(true).acquire().await.expect("free");
            let waiter = common::fair_waiter(&locks, "queue");
            until_in_line(&server, "queue", 1).await;

            let listed = json_lines(&lockctl(&url, &["--json", "list"]));
            let stock = find(&listed, "stock:1");
            assert_eq!(stock["kind"], "exclusive");
            assert_eq!(stock["fence"], token);
            let left = stock["holders"][0]["time_left_ms"].as_u64().expect("an expiry");
            assert!(left > 0 && left <= 30_000, "time left {left} ms of a 30 s lease");
            let catalog = find(&listed, "catalog");
            assert_eq!(catalog["kind"], "read-write");
            let roles: Vec<&Value> = catalog["holders"].as_array().into_iter().flatten().collect();
            assert_eq!(roles.len(), 2, "{catalog}");
            assert!(roles.iter().all(|h| h["role"] == "reader"), "{catalog}");
            assert_eq!(find(&listed, "pool")["kind"], "permits");
            let seg = format!("counter#{}", segment.segment().expect("a segment"));
            assert_eq!(find(&listed, &seg)["kind"], "segment");
            let queue = find(&listed, "queue");
            assert_eq!(queue["kind"], "fair");
            assert_eq!(queue["in_line"], 1);
            assert_eq!(queue["waiters"], true);
            assert_eq!(listed.len(), 5, "{listed:?}");

            // A glob narrows the list on the server, with its `?` and `[…]`.
            let narrowed = json_lines(&lockctl(&url, &["--json", "list", "st?ck:[0-9]"]));
            assert_eq!(narrowed.len(), 1, "{narrowed:?}");
            assert_eq!(narrowed[0]["key"], "stock:1");
            assert!(json_lines(&lockctl(&url, &["--json", "list", "stock:[2-9]"])).is_empty());
            let unclosed = lockctl(&url, &["list", "stock:[1"]);
            assert_eq!(unclosed.status.code(), Some(1));
            assert!(String::from_utf8_lossy(&unclosed.stderr).contains("`[`"));

            let inspected = json_lines(&lockctl(&url, &["--json", "inspect", "catalog"]));
            assert_eq!(inspected[0]["held"], true);
            assert_eq!(
                inspected[0]["locks"][0]["holders"].as_array().map(Vec::len),
                Some(2)
            );
            let free = json_lines(&lockctl(&url, &["--json", "inspect", "nothing:here"]));
            assert_eq!(free[0]["held"], false);

            // Released locks leave the list; a fenced row kept for its
            // counter is not a lock.
            fenced.release().await.expect("release");
            let [a, b] = readers;
            a.release().await.expect("release");
            b.release().await.expect("release");
            permit.release().await.expect("release");
            segment.release().await.expect("release");
            fair.release().await.expect("release");
            common::got_the_lock(waiter, "the waiter got the lock").await;
            let listed = json_lines(&lockctl(&url, &["--json", "list"]));
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
            let server = Postgres::start();
            let url = server.url();
            let holder = client(&server).await;
            let other = client(&server).await;
            common::a_stuck_holder_is_freed_by_force(holder, &other, |args| lockctl(&url, args)).await;

            // A read-write lock loses every reader at once: a writer gets in.
            let reader = other
                .lock("catalog")
                .mode(LockMode::Read)
                .acquire()
                .await
                .expect("read");
            let forced = json_lines(&lockctl(&url, &["--json", "unlock", "catalog", "--force"]));
            assert_eq!(forced[0]["freed"], true);
            let writer = other
                .lock("catalog")
                .mode(LockMode::Write)
                .wait(Duration::ZERO)
                .acquire()
                .await
                .expect("no reader left");
            writer.release().await.expect("release");
            assert!(matches!(reader.release().await, Err(LockError::NotHeld { .. })));

            // A fair lock's line stays: its first waiter gets the lock.
            let fair = other.lock("queue").fair(true).acquire().await.expect("free");
            let waiter = common::fair_waiter(&other, "queue");
            until_in_line(&server, "queue", 1).await;
            let forced = json_lines(&lockctl(&url, &["--json", "unlock", "queue", "--force"]));
            assert_eq!(forced[0]["freed"], true);
            common::got_the_lock(waiter, "the first in line got the lock").await;
            assert!(matches!(fair.release().await, Err(LockError::NotHeld { .. })));
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_acquisitions_and_releases() {
    lock_tests::bounded("watch_prints_acquisitions_and_releases", async move {
        let server = Postgres::start();
        let url = server.url();
        let locks = client(&server).await;
        let target = ["--postgres", &url, "--postgres-table", TABLE];
        common::watch_prints_the_lock_coming_and_going(&target, &locks, |holder| {
            let query = format!("SELECT holder FROM {TABLE} WHERE name = 'lock:{{watched}}'");
            assert_eq!([holder.to_owned()], *server.sql(&query));
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
            let server = Postgres::start();
            let url = server.url();
            let locks = client(&server).await;
            common::an_election_is_listed_with_its_leader(&locks, |args| lockctl(&url, args)).await;
        },
    )
    .await
}

/// The password from `LOCKCTL_PASSWORD` or `--password-file`, into a URL or
/// a key-value string, whatever URL characters it holds; never shown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_come_from_the_environment_or_a_file_and_never_show() {
    lock_tests::bounded(
        "passwords_come_from_the_environment_or_a_file_and_never_show",
        async move {
            let server = Postgres::start();
            let locks = client(&server).await;
            let held = locks.lock("stock:1").acquire().await.expect("free");
            let port = server.port();
            for (i, password) in lock_tests::secrets::url_passwords().into_iter().enumerate() {
                let role = format!("ops{i}");
                tokio::task::block_in_place(|| {
                    server.add_password_role(&role, &password);
                    server.sql(&format!(
                        "GRANT SELECT, INSERT, UPDATE, DELETE ON {TABLE}, {TABLE}_members TO {role}"
                    ));
                });
                for target in [
                    format!("postgres://{role}@127.0.0.1:{port}/locks"),
                    format!("host=127.0.0.1 port={port} user={role} dbname=locks"),
                ] {
                    let args = [
                        "--postgres",
                        target.as_str(),
                        "--postgres-table",
                        TABLE,
                        "--json",
                        "list",
                    ];
                    takes_the_password_and_refuses_a_wrong_one(
                        &args,
                        &password,
                        "stock:1",
                        "password authentication failed",
                    );
                }
            }
            held.release().await.expect("release");
        },
    )
    .await
}
