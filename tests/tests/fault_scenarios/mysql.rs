//! The MySQL backend under the fault suite's checker: S0's workload on a
//! MariaDB table (the checker's controls are proven against Redis in S0 of
//! the same run: they are broken locks written with Redis commands), a
//! killed holder (S1's shape) and a holder whose connection is blackholed
//! (S4's shape).

use super::*;
use lock_tests::MariaDb;

/// S0my: 2 processes × 4 tasks on 3 keys for 10 s, every body reporting to
/// the checker: no overlap, no lost update, no token regression.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s0my_baseline_on_mariadb() {
    scenario("s0my_baseline_on_mariadb", async move {
        let server = MariaDb::start();
        run_s0(
            &server.url(),
            Baseline {
                id: "S0my",
                scenario: "S0 baseline on MariaDB (MySQL backend)",
                min_entries: 500,
                controls: None,
                started: Instant::now(),
            },
        );
    })
    .await
}

/// S1my: a renewed holder SIGKILLed at varying points of its renewal
/// cycle frees the lock within its ttl plus a waiter's poll (50 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s1my_a_killed_holder_frees_the_lock_within_its_ttl() {
    scenario("s1my_a_killed_holder_frees_the_lock_within_its_ttl", async move {
        let server = MariaDb::start();
        let locks = LockClient::mysql(&server.url()).await.expect("connect");
        run_s1(
            &server.url(),
            &locks,
            "S1my",
            "S1 holder crash (SIGKILL) on MariaDB",
        )
        .await;
    })
    .await
}

/// S4my: the holder's connection is blackholed while it works: it stops
/// before its validity deadline, and a rival on a healthy connection
/// enters only after that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s4my_a_holder_cut_off_stops_before_its_deadline() {
    scenario("s4my_a_holder_cut_off_stops_before_its_deadline", async move {
        let server = MariaDb::start();
        let rival = LockClient::mysql(&server.url()).await.expect("connect");
        let through = async |proxy: &Proxy| {
            let url = format!(
                "mysql://root@127.0.0.1:{}/{}",
                proxy.port(),
                lock_tests::mariadb::DATABASE
            );
            LockClient::builder()
                .command_timeout(Duration::from_millis(100))
                .mysql(&url)
                .await
                .expect("connect")
        };
        run_s4(
            server.port(),
            &rival,
            through,
            "S4my",
            "S4 holder link blackholed, on MariaDB",
        )
        .await;
    })
    .await
}
