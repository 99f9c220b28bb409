//! A failover that promotes a replica: what `replica_acks` changes (P1m,
//! the mitigation of tier 2's P1 negative control).

use super::*;

/// P1m: the master dies right after a grant and its replica is promoted;
/// the holder uses `replica_acks(1)`. Trials alternate: (a) replication is
/// cut before the grant (P1's fault), so the grant is never acknowledged:
/// the acquisition fails with `NotReplicated` and its caller never enters;
/// (b) replication works, the grant is acknowledged, and the promoted
/// replica has the lock, so a rival cannot take it. The witness sees no
/// overlap in any trial (P1 without acknowledgement overlaps in every one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p1m_acknowledged_grants_survive_the_promotion_of_their_replica() {
    let board = Board::new();
    let trials = 10u32;
    let (mut refused, mut survived, mut overlapped) = (0, 0, 0);
    let started = Instant::now();
    for trial in 0..trials {
        let key = format!("p1m:{trial}");
        let cut = trial % 2 == 0;
        let (mut master, link, replica) = lock_tests::sentinel::replica_behind_proxy().await;
        if cut {
            link.blackhole();
        }
        // A generous acknowledgement timeout: on a loaded machine an ack
        // can take over the 100 ms default, and this scenario is about what
        // a failover does, not about ack latency.
        let a = LockClient::builder()
            .replica_acks(1)
            .replica_ack_timeout(Duration::from_millis(500))
            .connect(&master.url())
            .await
            .expect("connect");
        let granted = a.lock(key.as_str()).ttl(T).acquire().await;
        match &granted {
            Ok(_) => board.witness.enter(&key, 1, 0),
            Err(LockError::NotReplicated {
                acked: 0, wanted: 1, ..
            }) if cut => refused += 1,
            Err(other) => panic!("trial {trial} (cut: {cut}): {other}"),
        }
        tokio::task::block_in_place(|| master.kill());
        replica.query::<()>(redis::cmd("REPLICAOF").arg("NO").arg("ONE"));
        let b = LockClient::connect(&replica.url()).await.expect("connect");
        let rival = b
            .lock(key.as_str())
            .wait(Duration::from_millis(300))
            .run(async {
                board.witness.enter(&key, 2, 0);
                board.witness.exit(&key, 2, 0);
            })
            .await;
        if let Ok(guard) = granted {
            assert!(!cut, "trial {trial}: a grant that no replica saw was trusted");
            assert!(
                matches!(rival, Err(LockError::Timeout { .. })),
                "trial {trial}: the promoted replica lost an acknowledged lock: {rival:?}"
            );
            survived += 1;
            board.witness.exit(&key, 1, 0);
            drop(guard);
        }
        overlapped += u32::from(board.witness.seen(&key).overlaps > 0);
    }
    assert_eq!(overlapped, 0, "overlaps with replica_acks(1)");
    assert_eq!(refused + survived, trials);
    report::write(
        "P1m",
        json!({
            "scenario": "P1m promoted replica, with replica_acks(1)",
            "verdict": "PASS",
            "trials": trials,
            "overlaps": overlapped,
            "unacknowledged_grants_refused": refused,
            "acknowledged_locks_surviving_promotion": survived,
            "seconds": started.elapsed().as_secs_f64(),
            "key_figure": format!("0 overlaps in {trials}; {refused} unacknowledged grants refused, {survived} acknowledged locks kept"),
        }),
    );
}
