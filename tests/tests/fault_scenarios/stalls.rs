//! A stalled server: SIGSTOP (S6), `DEBUG SLEEP` (S7), `CLIENT PAUSE` (S8).

use super::*;

/// What one stall trial showed.
#[derive(Debug)]
struct StallOutcome {
    lost: bool,
    /// From the end of the stall to the rival holding the lock.
    rival_after_heal: Option<Duration>,
    errors: Vec<String>,
}

/// One holder (watchdog on, lease T, command timeout 100 ms) and one waiter,
/// while the server stalls for `length`. The stall runs on its own, as a
/// fault would: a holder that hears of its loss stops its body, not the
/// fault. The witness sees the bodies.
async fn stall_trial(
    server: &RedisServer,
    board: &Board,
    key: &str,
    stall: Stall,
    length: Duration,
) -> StallOutcome {
    let url = server.url();
    let client = || {
        LockClient::builder()
            .command_timeout(Duration::from_millis(100))
            .connect(&url)
    };
    let (holder, rival) = (client().await.expect("connect"), client().await.expect("connect"));
    let guard = holder.lock(key).ttl(T).acquire().await.expect("acquire");
    board.witness.enter(key, 1, 0);
    let rival_run = {
        let (witness, key) = (board.witness.clone(), key.to_owned());
        tokio::spawn(async move {
            rival
                .lock(key.as_str())
                .wait(Duration::from_secs(10))
                .run(async {
                    witness.enter(&key, 2, 0);
                    witness.exit(&key, 2, 0);
                    Instant::now()
                })
                .await
                .map_err(|e| e.to_string())
        })
    };
    let stalling = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        board.witness.fault(stall.fault());
        stall.apply(&[server], length).await;
        board.witness.heal(stall.fault());
        Instant::now()
    };
    // The body works through the stall and at least one renewal after it.
    let holding = async {
        tokio::select! {
            biased;
            _ = guard.lost() => {
                board.witness.lost(key, 1, 0, guard.valid_until().into_std());
                true
            }
            () = tokio::time::sleep(Duration::from_millis(200) + length + T / 2) => {
                board.witness.exit(key, 1, 0);
                false
            }
        }
    };
    let (healed, lost) = tokio::join!(stalling, holding);
    let mut errors = Vec::new();
    if let Err(e) = guard.release().await
        && !lost
    {
        errors.push(e.to_string());
    }
    let rival_after_heal = match rival_run.await.expect("join") {
        Ok(entered) => Some(entered.saturating_duration_since(healed)),
        Err(e) => {
            errors.push(e);
            None
        }
    };
    StallOutcome {
        lost,
        rival_after_heal,
        errors,
    }
}

/// S6 and S7: a 0.4 s stall (shorter than the lease less a renewal
/// interval) costs nothing; a 3 s one costs the lock, the holder hears of it
/// before D, and the rival gets in within 300 ms of the stall's end; nobody
/// overlaps. Returns the figures for the report.
async fn short_and_long_stall(server: &RedisServer, stall: Stall, id: &str) -> serde_json::Value {
    let board = Board::new();
    let short = stall_trial(
        server,
        &board,
        &format!("{id}:a"),
        stall,
        Duration::from_millis(400),
    )
    .await;
    assert!(!short.lost, "a 0.4 s stall cost the lock: {short:?}");
    assert!(short.errors.is_empty(), "{short:?}");
    let long = stall_trial(server, &board, &format!("{id}:b"), stall, Duration::from_secs(3)).await;
    assert!(long.lost, "a 3 s stall outlasts a 1.5 s lease: {long:?}");
    let rival_after_heal = long
        .rival_after_heal
        .expect("the rival got the lock after the stall");
    assert!(
        rival_after_heal <= Duration::from_millis(300),
        "the rival waited {rival_after_heal:?} after the stall ended"
    );
    let logged = analyze(board.path(), &[]).expect("analyze");
    assert!(logged.overlaps.is_empty(), "{logged:?}");
    assert!(logged.lost_slack_ns.iter().all(|&ns| ns >= 0), "{logged:?}");
    let slack_ms = logged
        .lost_slack_ns
        .first()
        .map(|&ns| (ns as f64 / 1e4).round() / 100.0);
    json!({
        "verdict": "PASS",
        "parameters": {"ttl_ms": T.as_millis(), "command_timeout_ms": 100},
        "acquisitions": logged.entries,
        "faults": logged.faults,
        "overlaps": 0,
        "lost_slack_ms": {"min": slack_ms, "p50": slack_ms},
        "rival_after_heal_ms": rival_after_heal.as_secs_f64() * 1e3,
    })
}

fn merged(mut base: serde_json::Value, extra: serde_json::Value) -> serde_json::Value {
    if let (Some(base), serde_json::Value::Object(extra)) = (base.as_object_mut(), extra) {
        base.extend(extra);
    }
    base
}

/// S6: the server is SIGSTOPped for 0.4 s, then for 3 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s6_a_stopped_server_costs_a_lock_only_when_it_outlasts_the_lease() {
    scenario(
        "s6_a_stopped_server_costs_a_lock_only_when_it_outlasts_the_lease",
        async move {
            let server = RedisServer::start();
            let figures = short_and_long_stall(&server, Stall::Stop, "s6").await;
            let key_figure = format!(
                "0.4 s: kept; 3 s: lost before D, rival in {:.0} ms after SIGCONT",
                figures["rival_after_heal_ms"].as_f64().unwrap_or(f64::NAN)
            );
            report::write(
                "S6",
                merged(
                    figures,
                    json!({"scenario": "S6 server SIGSTOP 0.4 s / 3 s", "key_figure": key_figure}),
                ),
            );
        },
    )
    .await
}

/// S7: `DEBUG SLEEP` stalls the server with connections accepted: as S6,
/// and no call outlives its wait by more than 50 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s7_a_sleeping_server_is_a_stall_with_bounded_calls() {
    scenario("s7_a_sleeping_server_is_a_stall_with_bounded_calls", async move {
        let server = RedisServer::start();
        let figures = short_and_long_stall(&server, Stall::DebugSleep, "s7").await;
        // A call made during a long sleep ends by its wait, not by the server.
        let locks = LockClient::builder()
            .command_timeout(Duration::from_millis(100))
            .connect(&server.url())
            .await
            .expect("connect");
        let servers = [&server];
        let sleeping = Stall::DebugSleep.apply(&servers, Duration::from_secs(2));
        let calling = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let wait = Duration::from_millis(500);
            let start = Instant::now();
            let outcome = locks.lock("s7:c").wait(wait).acquire().await;
            (outcome.is_err(), start.elapsed().saturating_sub(wait))
        };
        let ((), (refused, overrun)) = tokio::join!(sleeping, calling);
        assert!(refused, "nothing answered, so nothing was acquired");
        assert!(
            overrun <= Duration::from_millis(50),
            "the call overran its wait by {overrun:?}"
        );
        let key_figure = format!(
            "3 s: lost before D; a call overran its wait by {:.1} ms",
            overrun.as_secs_f64() * 1e3
        );
        report::write(
            "S7",
            merged(
                figures,
                json!({
                    "scenario": "S7 DEBUG SLEEP 0.4 s / 3 s",
                    "call_overrun_ms": overrun.as_secs_f64() * 1e3,
                    "key_figure": key_figure,
                }),
            ),
        );
    })
    .await
}

/// S8: `CLIENT PAUSE` for 1 s (WRITE, then ALL) is shorter than the lease
/// less a renewal interval: nothing is lost and nobody sees an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s8_a_client_pause_is_a_stall_not_a_loss() {
    scenario("s8_a_client_pause_is_a_stall_not_a_loss", async move {
        let server = RedisServer::start();
        let board = Board::new();
        let mut outcomes = Vec::new();
        for (key, stall) in [("s8:write", Stall::PauseWrite), ("s8:all", Stall::PauseAll)] {
            let outcome = stall_trial(&server, &board, key, stall, Duration::from_secs(1)).await;
            assert!(!outcome.lost, "{key}: {outcome:?}");
            assert!(outcome.errors.is_empty(), "{key}: {outcome:?}");
            outcomes.push(json!({"mode": key, "lost": outcome.lost, "errors": outcome.errors.len()}));
        }
        let logged = analyze(board.path(), &[]).expect("analyze");
        assert!(logged.overlaps.is_empty(), "{logged:?}");
        report::write(
            "S8",
            json!({
                "scenario": "S8 CLIENT PAUSE 1 s WRITE / ALL",
                "verdict": "PASS",
                "acquisitions": logged.entries,
                "faults": logged.faults,
                "overlaps": 0,
                "variants": outcomes,
                "key_figure": "0 lost, 0 user-visible errors",
            }),
        );
    })
    .await
}
