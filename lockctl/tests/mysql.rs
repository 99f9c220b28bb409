//! `lockctl --mysql`: the built binary against a MariaDB lock table the
//! harness starts (`mariadbd` in a fresh datadir), while services' locks
//! of every kind are held in this process.

use std::process::Output;

use lock_runtime::LockClient;
use lock_tests::MariaDb;

mod common;
use common::{BOUND, takes_the_password_and_refuses_a_wrong_one};

/// The table the services use: not the default, so `--mysql-table` is
/// what finds it.
const TABLE: &str = "shop_locks";

fn lockctl(url: &str, args: &[&str]) -> Output {
    let mut all = vec!["--mysql", url, "--mysql-table", TABLE];
    all.extend_from_slice(args);
    lock_tests::output_within_limit(
        std::process::Command::new(env!("CARGO_BIN_EXE_lockctl")).args(&all),
        &format!("lockctl {}", args.join(" ")),
    )
}

async fn client(server: &MariaDb) -> LockClient {
    LockClient::builder()
        .mysql_table(TABLE)
        .mysql(&server.url())
        .await
        .expect("connect")
}

/// Until `n` waiters stand in the fair lock `key`'s line.
async fn until_in_line(server: &MariaDb, key: &str, n: usize) {
    let query = format!("SELECT count(*) FROM {TABLE}_members WHERE name = 'lock:{{{key}}}'");
    let deadline = tokio::time::Instant::now() + BOUND;
    while server.sql(&query).await != [[Some(n.to_string())]] {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{n} waiters never stood in {key}'s line"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_inspect_show_every_kind_with_holders_time_left_fence_and_line() {
    lock_tests::bounded(
        "list_and_inspect_show_every_kind_with_holders_time_left_fence_and_line",
        async move {
            let server = MariaDb::start();
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
            let server = MariaDb::start();
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
        let server = MariaDb::start();
        let url = server.url();
        let locks = client(&server).await;
        let target = ["--mysql", &url, "--mysql-table", TABLE];
        common::watch_prints_the_lock_coming_and_going(&target, &locks, |holder| {
            let query = format!("SELECT holder FROM {TABLE} WHERE name = 'lock:{{watched}}'");
            let rows = tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current().block_on(server.sql(&query))
            });
            assert_eq!(rows, [[Some(holder.to_owned())]]);
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
            let server = MariaDb::start();
            let url = server.url();
            let locks = client(&server).await;
            common::an_election_is_listed_with_its_leader(&locks, |args| lockctl(&url, args)).await;
        },
    )
    .await
}

/// The password from `LOCKCTL_PASSWORD` or `--password-file`, put into the
/// URL whatever URL characters it holds (a user each); never shown, and a
/// wrong one refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_come_from_the_environment_or_a_file_and_never_show() {
    lock_tests::bounded(
        "passwords_come_from_the_environment_or_a_file_and_never_show",
        async move {
            let server = MariaDb::start();
            let locks = client(&server).await;
            let held = locks.lock("stock:1").acquire().await.expect("free");
            for (i, password) in lock_tests::secrets::url_passwords().into_iter().enumerate() {
                let user = format!("ops{i}");
                server
                    .sql(&format!("CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'"))
                    .await;
                server
                    .sql(&format!(
                        "GRANT SELECT, INSERT, UPDATE, DELETE ON locks.* TO '{user}'@'%'"
                    ))
                    .await;
                let target = format!("mysql://{user}@127.0.0.1:{}/locks", server.port());
                let args = [
                    "--mysql",
                    target.as_str(),
                    "--mysql-table",
                    TABLE,
                    "--json",
                    "list",
                ];
                tokio::task::block_in_place(|| {
                    takes_the_password_and_refuses_a_wrong_one(&args, &password, "stock:1", "Access denied");
                });
            }
            held.release().await.expect("release");
        },
    )
    .await
}
