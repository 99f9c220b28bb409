//! The PostgreSQL backend under the fault suite's checker: S0's workload on
//! a PostgreSQL table (the checker's controls are proven against Redis in
//! S0 of the same run: they are broken locks written with Redis
//! commands), a killed holder (S1's shape) and a holder whose connection
//! is blackholed (S4's shape). Its server deaths are S3pg, S3tpg and
//! S3spg (`deaths.rs`).

use super::*;
use lock_tests::Postgres;

/// S0pg: 2 processes × 4 tasks on 3 keys for 10 s, every body reporting to
/// the checker: no overlap, no lost update, no token regression.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s0pg_baseline_on_postgres() {
    scenario("s0pg_baseline_on_postgres", async move {
        let server = Postgres::start();
        run_s0(
            &server.url(),
            Baseline {
                id: "S0pg",
                scenario: "S0 baseline on PostgreSQL",
                min_entries: 500,
                controls: None,
                started: Instant::now(),
            },
        );
    })
    .await
}

/// S1pg: a renewed holder SIGKILLed at varying points of its renewal
/// cycle frees the lock within its ttl plus a waiter's poll (50 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s1pg_a_killed_holder_frees_the_lock_within_its_ttl() {
    scenario("s1pg_a_killed_holder_frees_the_lock_within_its_ttl", async move {
        let server = Postgres::start();
        let locks = LockClient::postgres(&server.url()).await.expect("connect");
        run_s1(
            &server.url(),
            &locks,
            "S1pg",
            "S1 holder crash (SIGKILL) on PostgreSQL",
        )
        .await;
    })
    .await
}

/// S4pg: the holder's connection is blackholed while it works: it stops
/// before its validity deadline, and a rival on a healthy connection
/// enters only after that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s4pg_a_holder_cut_off_stops_before_its_deadline() {
    scenario("s4pg_a_holder_cut_off_stops_before_its_deadline", async move {
        let server = Postgres::start();
        let rival = LockClient::postgres(&server.url()).await.expect("connect");
        let through = async |proxy: &Proxy| {
            let url = format!(
                "postgres://{}@127.0.0.1:{}/{}",
                lock_tests::postgres::USER,
                proxy.port(),
                lock_tests::postgres::DATABASE
            );
            LockClient::builder()
                .command_timeout(Duration::from_millis(100))
                .postgres(&url)
                .await
                .expect("connect")
        };
        run_s4(
            server.port(),
            &rival,
            through,
            "S4pg",
            "S4 holder link blackholed, on PostgreSQL",
        )
        .await;
    })
    .await
}
