//! The etcd backend under the fault suite's checker: S0's workload on a
//! 3-member cluster, a holder paused past its lease with a fenced register
//! refusing its late write (S2's shape), and a holder whose link is
//! blackholed (S4's shape). Its member deaths are S3etcd and its kinds
//! (`deaths.rs`). The checker's controls are proven against Redis in S0 of
//! the same run.

use super::holders::run_s2;
use super::*;
use lock_tests::Etcd;
use lock_tests::etcd;

/// S0etcd: 2 processes × 4 tasks on 3 keys for 10 s on a 3-member cluster,
/// every body reporting to the checker: no overlap, no lost update, no
/// token regression.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s0etcd_baseline_on_an_etcd_cluster() {
    scenario("s0etcd_baseline_on_an_etcd_cluster", async move {
        let cluster = tokio::task::block_in_place(Etcd::cluster);
        run_s0(
            &etcd::target(&cluster),
            Baseline {
                id: "S0etcd",
                scenario: "S0 baseline on a 3-member etcd cluster",
                min_entries: 500,
                controls: None,
                started: Instant::now(),
            },
        );
    })
    .await
}

/// S2etcd: a holder stops itself past its lease; the cluster expires the
/// lease and deletes its key, another holder takes the lock and writes;
/// the late write is refused by the fenced register (the create revision
/// is the token).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s2etcd_a_paused_holder_is_stopped_by_fencing() {
    scenario("s2etcd_a_paused_holder_is_stopped_by_fencing", async move {
        let server = Etcd::start();
        let locks = etcd::client(&server).await;
        run_s2(
            &etcd::target(&server),
            &locks,
            "S2etcd",
            "S2 holder paused past its etcd lease (self-SIGSTOP failpoint)",
        )
        .await;
    })
    .await
}

/// S4etcd: the holder's link is blackholed while it works: it stops before
/// its validity deadline (at most two thirds of its etcd lease past its
/// last confirmation), and a rival on a healthy link enters only after the
/// cluster expired the holder's lease. The lock's ttl (3 s) is longer than
/// the etcd lease (2 s), as with the defaults (30 s and 10 s): the cap of
/// two thirds of the etcd lease, not the ttl, is what stops the holder in
/// time. With a ttl under the cap (S4's 600 ms), the cap never bound and
/// the scenario passed with it removed by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s4etcd_a_holder_cut_off_stops_before_its_lease_can_expire() {
    scenario(
        "s4etcd_a_holder_cut_off_stops_before_its_lease_can_expire",
        async move {
            let server = Etcd::start();
            let rival = etcd::client(&server).await;
            // The shortest lease etcd grants here, so that the rival's
            // 5 s wait outlasts it with room to spare.
            let through = async |proxy: &Proxy| {
                LockClient::builder()
                    .command_timeout(Duration::from_millis(100))
                    .etcd_lease_ttl(Duration::from_secs(2))
                    .etcd(&[format!("http://127.0.0.1:{}", proxy.port()).as_str()])
                    .await
                    .expect("connect")
            };
            run_s4_with(
                server.port(0),
                &rival,
                through,
                "S4etcd",
                "S4 holder link blackholed, on etcd, ttl above the etcd lease",
                Duration::from_secs(3),
            )
            .await;
        },
    )
    .await
}
