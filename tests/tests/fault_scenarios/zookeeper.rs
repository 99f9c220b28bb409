//! The ZooKeeper backend under the fault suite's checker: S0's workload on
//! a 3-node ensemble, a holder paused past its session with a fenced
//! register refusing its late write (S2's shape), and a holder whose link
//! is blackholed (S4's shape). The checker's controls are proven against
//! Redis in S0 of the same run.

use super::holders::run_s2;
use super::*;
use lock_tests::zookeeper::{self, SESSION_TIMEOUT, ZooKeeper};

/// S0zk: 2 processes × 4 tasks on 3 keys for 10 s on an ensemble, every
/// body reporting to the checker: no overlap, no lost update, no token
/// regression.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s0zk_baseline_on_a_zookeeper_ensemble() {
    scenario("s0zk_baseline_on_a_zookeeper_ensemble", async move {
        let zk = ZooKeeper::ensemble();
        run_s0(
            &zookeeper::target(&zk),
            Baseline {
                id: "S0zk",
                scenario: "S0 baseline on a 3-node ZooKeeper ensemble",
                min_entries: 500,
                controls: None,
                started: Instant::now(),
            },
        );
    })
    .await
}

/// S2zk: a holder stops itself past its session; the ensemble expires the
/// session, another holder takes the lock and writes; the late write is
/// refused by the fenced register (the creation zxid is the token).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s2zk_a_paused_holder_is_stopped_by_fencing() {
    scenario("s2zk_a_paused_holder_is_stopped_by_fencing", async move {
        let zk = ZooKeeper::start();
        let locks = zookeeper::client(&zk).await;
        run_s2(
            &zookeeper::target(&zk),
            &locks,
            "S2zk",
            "S2 holder paused past its ZooKeeper session (self-SIGSTOP failpoint)",
        )
        .await;
    })
    .await
}

/// S4zk: the holder's link is blackholed while it works: it stops before
/// its validity deadline (at most the session timeout past its last
/// answered request), and a rival on a healthy link enters only after the
/// ensemble expired the holder's session. The lock's ttl (3 s) is longer
/// than the session (1 s), as with the defaults (30 s and 10 s): the cap
/// of the session timeout, not the ttl, is what stops the holder in time.
/// With a ttl under the cap (S4's 600 ms), the cap never bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s4zk_a_holder_cut_off_stops_before_its_session_can_expire() {
    scenario(
        "s4zk_a_holder_cut_off_stops_before_its_session_can_expire",
        async move {
            let zk = ZooKeeper::start();
            let rival = zookeeper::client(&zk).await;
            let through = async |proxy: &Proxy| {
                LockClient::builder()
                    .command_timeout(Duration::from_millis(100))
                    .zookeeper_session_timeout(SESSION_TIMEOUT)
                    .zookeeper(&format!("127.0.0.1:{}", proxy.port()))
                    .await
                    .expect("connect")
            };
            run_s4_with(
                zk.port(0),
                &rival,
                through,
                "S4zk",
                "S4 holder link blackholed, on ZooKeeper, ttl above the session timeout",
                Duration::from_secs(3),
            )
            .await;
        },
    )
    .await
}
