//! `lockctl --postgres`: the built binary against a PostgreSQL lock table
//! the harness starts (`initdb` + `postgres`), while services' locks of
//! every kind are held in this process.

use std::process::Output;

use lock_runtime::LockClient;
use lock_tests::Postgres;

mod common;
use common::{BOUND, takes_the_password_and_refuses_a_wrong_one};

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
            common::every_kind_is_listed_and_inspected(
                &locks,
                |args| lockctl(&url, args),
                async |n| until_in_line(&server, "queue", n).await,
            )
            .await;
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

            common::shared_and_fair_locks_are_freed_by_force(
                &other,
                |args| lockctl(&url, args),
                async |n| until_in_line(&server, "queue", n).await,
            )
            .await;
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
