//! A failover that promotes a replica: what `replica_acks` changes (P1m,
//! the mitigation of tier 2's P1 negative control), and a Sentinel failover
//! under load (P2s), and a stopped replica (P3r).

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
    scenario("p1m_acknowledged_grants_survive_the_promotion_of_their_replica", async move {
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
    })
    .await
}

/// P2s: Sentinel failover under load. A master with two replicas and three
/// sentinels; two worker processes of four tasks on three keys, through a
/// `LockClient::sentinel` with `replica_acks(1)`, for 16 s, and one holder
/// of this process that holds a lock across the kill; 4 s in, the
/// master is SIGKILLed and the sentinels promote a replica. The witness
/// sees no overlap (every grant the workers trusted was on a replica
/// before it was used), every lease the failover took was reported lost
/// before its deadline, and the first body after the promotion entered
/// within a second of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p2s_sentinel_failover_under_load() {
    scenario("p2s_sentinel_failover_under_load", async move {
    let started = Instant::now();
    let mut group = tokio::task::block_in_place(|| lock_tests::Replicated::start(2));
    let keys = ["p2s:a", "p2s:b", "p2s:c"];
    let board = Board::new();
    let target = format!(
        "sentinel={}@{}",
        lock_tests::sentinel::MASTER_NAME,
        group.sentinel_urls().join(",")
    );
    let mut workload = broken_or_library(&target, &keys, "library", Duration::from_secs(16));
    workload.replica_acks = Some(1);
    let controller = Monitor::start();
    let workers = lab::Workers::spawn(&board, &workload, 2);
    // A holder of this process spans the kill: the failover takes longer
    // than its lease, so it must hear of the loss before its deadline.
    let spanning = LockClient::builder()
        .replica_acks(1)
        .sentinel(lock_tests::sentinel::MASTER_NAME, group.sentinel_urls())
        .await
        .expect("sentinel client");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let held = spanning
        .lock("p2s:held")
        .ttl(T)
        .fencing(true)
        .acquire()
        .await
        .expect("the spanning holder");
    let token = held.fencing_token().unwrap_or(0);
    board.witness.enter("p2s:held", 1, token);
    let watch = {
        let witness = board.witness.clone();
        tokio::spawn(async move {
            let reason = held.lost().await;
            witness.lost("p2s:held", 1, token, held.valid_until().into_std());
            reason
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let old_port = group.master.port();
    board.witness.fault("master-sigkill");
    let killed = Instant::now();
    tokio::task::block_in_place(|| group.master.kill());
    let new_port = tokio::task::block_in_place(|| group.wait_for_failover(old_port, Duration::from_secs(30)));
    let promoted = killed.elapsed();
    board.witness.heal("master-sigkill");
    let spanning_lost = tokio::time::timeout(Duration::from_secs(10), watch)
        .await
        .map(|reason| reason.expect("watch task"));
    let tally = tokio::task::block_in_place(|| workers.finish());
    let worst_late = tally.worst_late.max(controller.worst());
    let logged = analyze(board.path(), &keys).expect("analyze");
    assert!(
        spanning_lost.is_ok(),
        "the holder spanning the failover never heard of its loss"
    );
    let online: u64 = keys.iter().map(|k| board.witness.seen(k).overlaps).sum();
    let late_losses = logged.lost_slack_ns.iter().filter(|slack| **slack < 0).count();
    let promotion_to_entry_ms = logged.heal_to_entry_ns.first().map(|ns| *ns as f64 / 1e6);
    assert_ne!(new_port, old_port);
    // A violation while a process was starved past δ/2 proves nothing
    // (the setup is too slow to run again): the record says INVALID.
    let overlaps = online + logged.overlaps.len() as u64;
    let starved = worst_late > monitor::bound(T);
    let slow_entry = promotion_to_entry_ms.is_none_or(|after| after > 1000.0);
    let violated = overlaps > 0 || logged.token_regressions > 0 || late_losses > 0 || slow_entry;
    let verdict = Verdict::judge(violated, starved);
    match verdict {
        Verdict::Fail => panic!(
            "P2s: {overlaps} overlaps, {} token regressions, {late_losses} losses noticed after their deadline, first body after the promotion {promotion_to_entry_ms:?} ms (at most 1000): {logged:?}",
            logged.token_regressions
        ),
        Verdict::Invalid => eprintln!(
            "P2s INVALID: a process was {worst_late:?} late; {overlaps} overlaps, {late_losses} late losses, first body {promotion_to_entry_ms:?} ms after the promotion not counted"
        ),
        Verdict::Pass => {}
    }
    let promotion_to_entry_ms = promotion_to_entry_ms.unwrap_or(f64::NAN);
    report::write(
        "P2s",
        json!({
            "scenario": "P2s Sentinel failover under load, replica_acks(1)",
            "verdict": verdict.as_str(),
            "starved": starved,
            "parameters": {"processes": 2, "tasks": 4, "keys": 3, "seconds": 16, "ttl_ms": T.as_millis(),
                "replicas": 2, "sentinels": 3, "replica_acks": 1},
            "acquisitions": logged.entries,
            "faults": 1,
            "overlaps": overlaps,
            "token_regressions": logged.token_regressions,
            "lost": tally.lost + 1,
            "lost_after_deadline": late_losses,
            "spanning_holder_slack_ms": logged.lost_slack_ns.iter().min().map(|ns| *ns as f64 / 1e6),
            "errors": tally.errors,
            "first_error": tally.first_error,
            "kill_to_promotion_ms": promoted.as_millis(),
            "promotion_to_first_entry_ms": promotion_to_entry_ms,
            "worst_lateness_ms": (worst_late.as_secs_f64() * 1e5).round() / 100.0,
            "key_figure": format!(
                "{} acquisitions, master killed: promoted after {} ms, first body {:.0} ms later, 0 overlaps",
                logged.entries,
                promoted.as_millis(),
                promotion_to_entry_ms
            ),
            "seconds": started.elapsed().as_secs_f64(),
        }),
    );
    })
    .await
}

/// P3r: a replica stopped (SIGSTOP) under `replica_acks(1)` (ack timeout
/// 100 ms): each of 10 acquisitions fails with `NotReplicated` within the
/// acknowledgement timeout plus a round trip or two, and leaves nothing at
/// its key; once the replica resumes, acquisitions are acknowledged again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p3r_a_stopped_replica_refuses_acquisitions_and_leaves_nothing() {
    scenario("p3r_a_stopped_replica_refuses_acquisitions_and_leaves_nothing", async move {
    const ACK_TIMEOUT: Duration = Duration::from_millis(100);
    let started = Instant::now();
    let group = tokio::task::block_in_place(|| lock_tests::Replicated::start_without_sentinels(1));
    let locks = LockClient::builder()
        .replica_acks(1)
        .replica_ack_timeout(ACK_TIMEOUT)
        .connect(&group.master.url())
        .await
        .expect("connect");
    let board = Board::new();
    let controller = Monitor::start();
    board.witness.fault(Stall::Stop.fault());
    group.replicas[0].pause();
    let trials = 10;
    let mut refusals = Vec::new();
    let mut left = 0;
    for trial in 0..trials {
        let key = format!("p3r:{trial}");
        let sent = Instant::now();
        let attempt = locks.lock(key.as_str()).run(async {}).await;
        refusals.push(sent.elapsed());
        assert!(
            matches!(
                &attempt,
                Err(LockError::NotReplicated {
                    acked: 0,
                    wanted: 1,
                    ..
                })
            ),
            "trial {trial}: {attempt:?}"
        );
        left += group
            .master
            .query::<i64>(redis::cmd("EXISTS").arg(format!("lock:{{{key}}}")));
    }
    group.replicas[0].resume();
    board.witness.heal(Stall::Stop.fault());
    locks
        .lock("p3r:after")
        .wait(Duration::from_secs(5))
        .run(async {})
        .await
        .expect("acknowledged again once the replica resumes");
    assert_eq!(left, 0, "unacknowledged locks were left at their keys");
    refusals.sort();
    let slowest = refusals[refusals.len() - 1];
    let starved = controller.worst() > monitor::bound(T);
    let verdict = Verdict::judge(slowest >= ACK_TIMEOUT * 5, starved);
    assert_ne!(
        verdict,
        Verdict::Fail,
        "a refusal took {slowest:?} with a {ACK_TIMEOUT:?} acknowledgement timeout"
    );
    report::write(
        "P3r",
        json!({
            "scenario": "P3r replica stopped, replica_acks(1)",
            "verdict": verdict.as_str(),
            "starved": starved,
            "worst_lateness_ms": (controller.worst().as_secs_f64() * 1e5).round() / 100.0,
            "trials": trials,
            "not_replicated": trials,
            "left_at_key": left,
            "ack_timeout_ms": ACK_TIMEOUT.as_millis(),
            "refusal_p50_ms": report::quantile_ms(&refusals, 0.5),
            "refusal_max_ms": slowest.as_secs_f64() * 1e3,
            "seconds": started.elapsed().as_secs_f64(),
            "key_figure": format!(
                "{trials}/{trials} refused with NotReplicated, p50 {:.0} ms, max {:.0} ms (ack timeout {} ms), nothing left",
                report::quantile_ms(&refusals, 0.5),
                slowest.as_secs_f64() * 1e3,
                ACK_TIMEOUT.as_millis()
            ),
        }),
    );
    })
    .await
}
