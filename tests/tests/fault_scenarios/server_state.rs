//! What the server keeps or loses: restarts (S9), `SCRIPT FLUSH` (S10),
//! eviction and out-of-memory (S11), a foreign value at the key (S17).

use super::*;

/// S9: the server is killed and restarted while a lock is held. Without
/// persistence the lock is gone and a second holder gets in (the control,
/// which the checker must catch); with `appendfsync always` it survives and
/// nobody overlaps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s9_restarts_lose_locks_unless_the_server_persists_them() {
    scenario(
        "s9_restarts_lose_locks_unless_the_server_persists_them",
        async move {
            let board = Board::new();
            let mut outcomes = Vec::new();
            for (variant, extra) in [
                ("a-no-persistence", &[][..]),
                (
                    "b-appendfsync-always",
                    &["--appendonly", "yes", "--appendfsync", "always"][..],
                ),
            ] {
                let mut server = RedisServer::start_with(extra);
                let holder = LockClient::connect(&server.url()).await.expect("connect");
                let rival = LockClient::connect(&server.url()).await.expect("connect");
                let key = format!("s9:{variant}");
                let (entered_tx, entered_rx) = tokio::sync::oneshot::channel();
                let holding = {
                    let (witness, key) = (board.witness.clone(), key.clone());
                    tokio::spawn(async move {
                        holder
                            .lock(key.as_str())
                            .ttl(Duration::from_millis(1000))
                            .run(async {
                                witness.enter(&key, 1, 0);
                                let _ = entered_tx.send(());
                                tokio::time::sleep(Duration::from_millis(1500)).await;
                                witness.exit(&key, 1, 0);
                            })
                            .await
                    })
                };
                entered_rx.await.expect("the holder is inside");
                let fault = if variant.starts_with('a') {
                    "kill-restart-empty"
                } else {
                    "kill-restart-aof"
                };
                board.witness.fault(fault);
                tokio::task::block_in_place(|| server.restart());
                board.witness.heal(fault);
                let rival_run = rival
                    .lock(key.as_str())
                    .wait(Duration::from_secs(3))
                    .run(async {
                        board.witness.enter(&key, 2, 0);
                        board.witness.exit(&key, 2, 0);
                    })
                    .await;
                let held_through = holding.await.expect("join");
                let seen = board.witness.seen(&key);
                outcomes.push(json!({
                    "variant": variant,
                    "overlaps": seen.overlaps,
                    "holder": if held_through.is_ok() { "finished" } else { "lost" },
                    "rival": if rival_run.is_ok() { "got it" } else { "refused" },
                }));
                if variant.starts_with('a') {
                    assert!(seen.overlaps >= 1, "the control was not caught: {seen:?}");
                } else {
                    assert_eq!(seen.overlaps, 0, "a persisted lock was taken twice: {seen:?}");
                    assert!(
                        held_through.is_ok(),
                        "the holder lost a lock the server kept: {held_through:?}"
                    );
                }
            }
            report::write(
                "S9",
                json!({
                    "scenario": "S9 server kill -9 + restart (a: no persistence, NEG; b: appendfsync always)",
                    "verdict": "PASS; control caught",
                    "faults": 2,
                    "overlaps": 0,
                    "variants": outcomes,
                    "key_figure": "a: overlap caught; b: lock survived, 0 overlaps",
                }),
            );
        },
    )
    .await
}

/// S10: `SCRIPT FLUSH` every 200 ms under load: no caller ever sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s10_script_flushes_under_load_are_invisible() {
    scenario("s10_script_flushes_under_load_are_invisible", async move {
        let server = RedisServer::start();
        let board = Board::new();
        let locks = LockClient::connect(&server.url()).await.expect("connect");
        let stop = Instant::now() + Duration::from_secs(3);
        let tasks: Vec<_> = (0..8u64)
            .map(|task| {
                let (locks, witness) = (locks.clone(), board.witness.clone());
                tokio::spawn(async move {
                    let key = format!("s10:{}", task % 2);
                    let mut done = 0u64;
                    while Instant::now() < stop {
                        let holder = (task << 32) | done;
                        locks
                            .lock(key.as_str())
                            .fencing(true)
                            .wait(Duration::from_secs(5))
                            .run(async {
                                let token = lock_runtime::fencing_token().unwrap_or(0);
                                witness.enter(&key, holder, token);
                                witness.bump(&key).await;
                                witness.exit(&key, holder, token);
                            })
                            .await
                            .expect("no lock error may reach the caller");
                        done += 1;
                    }
                    done
                })
            })
            .collect();
        let mut flushes = 0;
        while Instant::now() < stop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            board.witness.fault("script-flush");
            server.query::<()>(redis::cmd("SCRIPT").arg("FLUSH"));
            flushes += 1;
        }
        let mut acquisitions = 0;
        for t in tasks {
            acquisitions += t.await.expect("task");
        }
        for key in ["s10:0", "s10:1"] {
            let seen = board.witness.seen(key);
            assert_eq!(
                (seen.overlaps, seen.counter),
                (0, seen.entries),
                "{key}: {seen:?}"
            );
        }
        let logged = analyze(board.path(), &[]).expect("analyze");
        assert_eq!(
            (logged.overlaps.len(), logged.token_regressions),
            (0, 0),
            "{logged:?}"
        );
        report::write(
            "S10",
            json!({
                "scenario": "S10 SCRIPT FLUSH every 200 ms under load",
                "verdict": "PASS",
                "acquisitions": acquisitions,
                "faults": flushes,
                "overlaps": 0,
                "token_regressions": 0,
                "user_visible_errors": 0,
                "key_figure": format!("{flushes} flushes, 0 errors"),
            }),
        );
    })
    .await
}

/// Captures what the library logs while `future` runs.
async fn with_captured_logs<F: Future>(future: F) -> (F::Output, String) {
    use std::sync::{Arc, Mutex};
    use tracing::instrument::WithSubscriber;
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("sink").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let sink = Sink::default();
    let writer = sink.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let output = future.with_subscriber(subscriber).await;
    let text = String::from_utf8_lossy(&sink.0.lock().expect("sink")).into_owned();
    (output, text)
}

/// S11: memory pressure. (a) NEG: with an eviction policy the held lock is
/// evicted and a second holder gets in (the checker must catch it); the
/// client warned about the policy at connect, and the holder hears of the
/// loss at its next renewal. (b) `noeviction` at OOM: acquiring fails at
/// once, while renewing and releasing a held lock keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s11_eviction_is_caught_and_oom_fails_closed() {
    scenario("s11_eviction_is_caught_and_oom_fails_closed", async move {
    let board = Board::new();
    // (a) volatile-lru.
    let server = RedisServer::start_with(&["--maxmemory", "3mb", "--maxmemory-policy", "volatile-lru"]);
    let (holder, warnings) = with_captured_logs(LockClient::connect(&server.url())).await;
    let holder = holder.expect("connect");
    assert!(
        warnings.contains("maxmemory-policy `volatile-lru` can evict held locks"),
        "no startup warning: {warnings:?}"
    );
    let rival = LockClient::connect(&server.url()).await.expect("connect");
    let guard = holder.lock("s11:a").ttl(T).acquire().await.expect("acquire");
    board.witness.enter("s11:a", 1, 0);
    board.witness.fault("eviction");
    let mut admin = server.sync_connection().expect("admin");
    let value = "x".repeat(1024);
    let mut filled = 0u64;
    let evicted_at = loop {
        let mut pipe = redis::pipe();
        for _ in 0..64 {
            pipe.cmd("SET")
                .arg(format!("filler:{filled}"))
                .arg(&value)
                .arg("EX")
                .arg(600)
                .ignore();
            filled += 1;
        }
        pipe.query::<()>(&mut admin).expect("fill");
        if redis::cmd("EXISTS")
            .arg("lock:{s11:a}")
            .query::<i64>(&mut admin)
            .expect("exists")
            == 0
        {
            break Instant::now();
        }
        assert!(filled < 100_000, "the lock was never evicted");
    };
    let rival_in = rival
        .lock("s11:a")
        .wait(Duration::from_secs(2))
        .run(async {
            board.witness.enter("s11:a", 2, 0);
            board.witness.exit("s11:a", 2, 0);
        })
        .await;
    assert!(rival_in.is_ok(), "the evicted lock was free: {rival_in:?}");
    let told = tokio::time::timeout(Duration::from_secs(2), guard.lost()).await;
    let lost_latency = evicted_at.elapsed();
    assert!(told.is_ok(), "the holder was never told its lock was evicted");
    board.witness.lost("s11:a", 1, 0, guard.valid_until().into_std());
    drop(guard);
    assert!(
        board.witness.seen("s11:a").overlaps >= 1,
        "the checker missed the eviction overlap"
    );
    drop(server);

    // (b) noeviction, filled to OOM with a lock already held.
    let server = RedisServer::start_with(&["--maxmemory", "3mb", "--maxmemory-policy", "noeviction"]);
    let locks = LockClient::connect(&server.url()).await.expect("connect");
    let held = locks
        .lock("s11:b:held")
        .ttl(Duration::from_millis(600))
        .acquire()
        .await
        .expect("acquire");
    let mut admin = server.sync_connection().expect("admin");
    let mut filled = 0u64;
    for size in [16 * 1024, 1024, 64] {
        let value = "y".repeat(size);
        while redis::cmd("SET")
            .arg(format!("filler:{filled}"))
            .arg(&value)
            .query::<()>(&mut admin)
            .is_ok()
        {
            filled += 1;
        }
    }
    let start = Instant::now();
    let refused = locks
        .lock("s11:b:new")
        .wait(Duration::from_secs(3))
        .acquire()
        .await
        .expect_err("OOM refuses new locks");
    let refused_in = start.elapsed();
    assert!(refused.to_string().contains("OOM"), "{refused}");
    assert!(
        refused_in < Duration::from_millis(100),
        "retried into the wait: {refused_in:?}"
    );
    // Renewals at ttl/3 keep the held lock through twice its ttl.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(held.is_held(), "renewal failed under OOM");
    held.release().await.expect("release under OOM");
    let leaked: i64 = server.query(
        redis::cmd("EXISTS")
            .arg("lock:{s11:b:held}")
            .arg("lock:{s11:b:new}"),
    );
    assert_eq!(leaked, 0);
    report::write(
        "S11",
        json!({
            "scenario": "S11 eviction (a: volatile-lru, NEG) / OOM with noeviction (b)",
            "verdict": "PASS; control caught",
            "faults": 2,
            "overlaps_a_negative_control": board.witness.seen("s11:a").overlaps,
            "startup_warning": true,
            "lost_latency_ms_a": lost_latency.as_secs_f64() * 1e3,
            "oom_refused_in_ms_b": refused_in.as_secs_f64() * 1e3,
            "oom_error_b": refused.to_string(),
            "renew_and_release_under_oom_b": "ok",
            "leaked_locks": leaked,
            "key_figure": format!("evicted lock caught; OOM refused in {:.1} ms", refused_in.as_secs_f64() * 1e3),
        }),
    );
    })
    .await
}

/// The eviction check of S11 also covers Redlock masters, and says so when
/// it cannot look (`CONFIG` renamed away, as managed services do).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_eviction_check_names_the_master_and_warns_when_it_cannot_look() {
    scenario(
        "the_eviction_check_names_the_master_and_warns_when_it_cannot_look",
        async move {
            let evicting = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]);
            let safe: Vec<RedisServer> = (0..2).map(|_| RedisServer::start()).collect();
            let urls = [evicting.url(), safe[0].url(), safe[1].url()];
            let (client, logs) = with_captured_logs(LockClient::redlock(&urls)).await;
            client.expect("redlock");
            let evicting_node = format!("127.0.0.1:{}", evicting.port());
            let warnings: Vec<&str> = logs
                .lines()
                .filter(|l| l.contains("can evict held locks"))
                .collect();
            assert_eq!(warnings.len(), 1, "{logs}");
            assert!(warnings[0].contains(&evicting_node), "{logs}");

            let hidden = RedisServer::start_with(&["--rename-command", "CONFIG", ""]);
            let (client, logs) = with_captured_logs(LockClient::connect(&hidden.url())).await;
            client.expect("connect");
            assert!(logs.contains("could not verify the eviction policy"), "{logs}");
        },
    )
    .await
}

/// S17: a foreign value at the lock key fails fast and stays untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s17_a_foreign_value_is_a_conflict_not_a_wait() {
    scenario("s17_a_foreign_value_is_a_conflict_not_a_wait", async move {
    let server = RedisServer::start();
    let locks = LockClient::connect(&server.url()).await.expect("connect");
    server.query::<()>(redis::cmd("SET").arg("lock:{s17}").arg("not a lock"));
    let start = Instant::now();
    let err = locks
        .lock("s17")
        .wait(Duration::from_secs(3))
        .acquire()
        .await
        .expect_err("foreign value");
    let took = start.elapsed();
    assert!(
        matches!(&err, LockError::KeyConflict { key, found_type, .. } if key == "s17" && found_type == "string"),
        "{err}"
    );
    assert!(took < Duration::from_millis(100), "took {took:?}");
    assert_eq!(
        server.query::<String>(redis::cmd("GET").arg("lock:{s17}")),
        "not a lock"
    );
    report::write(
        "S17",
        json!({
            "scenario": "S17 foreign value at the lock key",
            "verdict": "PASS",
            "error_ms": took.as_secs_f64() * 1e3,
            "error": err.to_string(),
            "key_figure": format!("KeyConflict in {:.2} ms, value untouched", took.as_secs_f64() * 1e3),
        }),
    );
    })
    .await
}
