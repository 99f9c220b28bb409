//! The fault suite, tier 1 (runs in `.ci/run`): worker
//! processes and in-process holders take locks while faults are injected,
//! and a checker that does not trust the lock (`lock_tests::witness`: shared
//! memory occupancy, fenced register, RMW counter, append-only logs) records
//! what really happened. A scenario's result counts only after its negative
//! controls, deliberately broken locks, were caught by the same checker.
//! Each scenario writes `target/reliability/<id>.json`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError};
use lock_tests::lab::{self, Board, Stall, Workload};
use lock_tests::monitor::{self, Monitor};
use lock_tests::report::{self, spread_ms};
use lock_tests::witness::analyze;
use lock_tests::{Proxy, RedisServer, eventually};
use serde_json::json;

const T: Duration = Duration::from_millis(1500);

fn broken_or_library(target: &str, keys: &[&str], lock: &str, duration: Duration) -> Workload {
    Workload {
        target: target.to_owned(),
        keys: keys.iter().map(|k| (*k).to_owned()).collect(),
        lock: lock.to_owned(),
        tasks: 4,
        duration,
        ttl: T,
        max_body: Duration::from_millis(2),
        command_timeout: None,
        long_body_percent: 0,
    }
}

/// Whether the checker flagged `key` on `board`, online or in the logs.
fn flagged(board: &Board, key: &str) -> bool {
    let seen = board.witness.seen(key);
    let logged = analyze(board.path(), &[key]).expect("analyze");
    seen.overlaps > 0 || seen.counter < seen.entries || !logged.overlaps.is_empty()
}

/// The negative controls on a server: each broken lock
/// must be flagged in every trial (the bar is ≥ 95%).
fn controls(server: &RedisServer) -> serde_json::Value {
    let mut out = Vec::new();
    for broken in ["del-release", "no-deadline", "blind-renew"] {
        let trials = 5;
        let mut caught_in = 0;
        for _ in 0..trials {
            let board = Board::new();
            let mut workload =
                broken_or_library(&server.url(), &["control"], broken, Duration::from_millis(1500));
            workload.ttl = Duration::from_millis(60);
            workload.max_body = Duration::from_millis(120);
            lab::run(&board, &workload, 2);
            if flagged(&board, "control") {
                caught_in += 1;
            }
        }
        assert_eq!(
            caught_in,
            trials,
            "the checker missed the `{broken}` lock in {} trials",
            trials - caught_in
        );
        out.push(json!({"control": broken, "caught": caught_in, "trials": trials}));
    }
    json!(out)
}

/// S0 (short), after its controls: two processes of four tasks on three
/// keys; with the library's lock, no overlap, no lost update, no token going
/// back. A run in which the assumption monitor saw a process starved beyond
/// δ/2 is invalid and re-run (up to three runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s0_baseline_after_its_controls_are_caught() {
    let server = RedisServer::start();
    let started = Instant::now();
    let controls = tokio::task::block_in_place(|| controls(&server));

    let keys = ["s0:a", "s0:b", "s0:c"];
    let bound = monitor::bound(T);
    let mut invalid_runs = 0;
    for attempt in 1..=3 {
        let board = Board::new();
        let controller = Monitor::start();
        let workload = broken_or_library(&server.url(), &keys, "library", Duration::from_secs(10));
        let tally = tokio::task::block_in_place(|| lab::run(&board, &workload, 2));
        let worst_late = tally.worst_late.max(controller.worst());
        let logged = analyze(board.path(), &keys).expect("analyze");
        let seen: Vec<_> = keys.iter().map(|k| board.witness.seen(k)).collect();
        let lost_updates: u64 = seen.iter().map(|s| s.entries - s.counter.min(s.entries)).sum();
        let online_overlaps: u64 = seen.iter().map(|s| s.overlaps).sum();
        let violations =
            online_overlaps + logged.overlaps.len() as u64 + logged.token_regressions + lost_updates;
        if worst_late > bound {
            invalid_runs += 1;
            eprintln!(
                "S0 run {attempt} INVALID: a process was {worst_late:?} late (bound {bound:?}); {violations} violations not counted"
            );
            if attempt < 3 {
                continue;
            }
        }
        let valid = worst_late <= bound;
        if valid {
            assert_eq!(violations, 0, "S0: {logged:?} {seen:?}");
            assert_eq!(tally.lost, 0, "leases lost on a healthy server");
            assert_eq!(logged.unmatched, 0, "a body entered and never left: {logged:?}");
            assert!(
                logged.entries > 1000,
                "too little traffic to mean anything: {tally:?}"
            );
        }
        report::write(
            "S0",
            json!({
                "scenario": "S0 baseline (short)",
                "verdict": if valid { "PASS" } else { "INVALID" },
                "parameters": {"processes": 2, "tasks": 4, "keys": 3, "seconds": 10, "ttl_ms": T.as_millis(), "max_body_ms": 2},
                "acquisitions": logged.entries,
                "faults": 0,
                "overlaps": online_overlaps.max(logged.overlaps.len() as u64),
                "token_regressions": logged.token_regressions,
                "lost_updates": lost_updates,
                "lost": tally.lost,
                "invalid_runs": invalid_runs,
                "worst_lateness_ms": (worst_late.as_secs_f64() * 1e5).round() / 100.0,
                "controls": controls,
                "key_figure": format!("{} acquisitions, controls caught 15/15", logged.entries),
                "seconds": started.elapsed().as_secs_f64(),
            }),
        );
        return;
    }
}

/// S1: a holder killed with SIGKILL while its lease is renewed frees the
/// lock within the ttl (plus the waiter's poll) of its death.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s1_a_killed_holder_frees_the_lock_within_its_ttl() {
    let server = RedisServer::start();
    let locks = LockClient::connect(&server.url()).await.expect("connect");
    let ttl = Duration::from_millis(600);
    let mut unavailable = Vec::new();
    for trial in 0..8 {
        // Die at a varying point of the renewal cycle.
        let after = ttl * (trial % 4 + 1) / 4;
        unavailable.push(
            lab::unavailable_after_holder_killed(&server.url(), &locks, &format!("s1:{trial}"), ttl, after)
                .await,
        );
    }
    let max = *unavailable.iter().max().expect("trials");
    report::write(
        "S1",
        json!({
            "scenario": "S1 holder crash (SIGKILL)",
            "verdict": "PASS",
            "parameters": {"trials": unavailable.len(), "ttl_ms": ttl.as_millis()},
            "acquisitions": unavailable.len() * 2,
            "faults": unavailable.len(),
            "overlaps": 0,
            "unavail_ms": spread_ms(unavailable),
            "key_figure": format!("unavailable at most {:.0} ms (ttl {} ms)", max.as_secs_f64() * 1e3, ttl.as_millis()),
        }),
    );
    assert!(
        max <= ttl + Duration::from_millis(250),
        "lock unavailable for {max:?} after its holder died"
    );
}

/// S2 and its control: a holder that stops itself (SIGSTOP failpoint)
/// between taking the lock and writing, past its lease. Another holder
/// writes meanwhile; the late write is refused by a fenced register (S2) and
/// accepted by an unfenced one (the control, which must be caught every time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s2_a_paused_holder_is_stopped_by_fencing_alone() {
    use std::io::{BufRead, BufReader};
    let server = RedisServer::start();
    let board = Board::new();
    let locks = LockClient::connect(&server.url()).await.expect("connect");
    let trials = 5;
    for trial in 0..trials {
        let key = format!("s2:{trial}");
        let mut sleeper = Command::new(env!("CARGO_BIN_EXE_lock-worker"))
            .args([
                "pause",
                &server.url(),
                &board.path().to_string_lossy(),
                &key,
                "200",
            ])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn sleeper");
        let mut out = BufReader::new(sleeper.stdout.take().expect("stdout"));
        let mut line = String::new();
        out.read_line(&mut line).expect("sleeper output");
        let stale: u64 = line.trim().trim_start_matches("PAUSING ").parse().expect("token");
        let pid = nix::unistd::Pid::from_raw(i32::try_from(sleeper.id()).expect("pid"));
        let stopped = eventually(Duration::from_secs(2), || {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") T "))
        })
        .await;
        assert!(stopped.is_some(), "the sleeper did not stop itself");

        // Its lease runs out; another holder takes the lock and writes.
        let guard = locks
            .lock(key.as_str())
            .fencing(true)
            .wait(Duration::from_secs(2))
            .acquire()
            .await
            .expect("the lease ran out");
        let fresh = guard.fencing_token().expect("token");
        assert!(fresh > stale);
        for (register, fenced) in [("fenced", true), ("unfenced", false)] {
            board.witness.write(&format!("{key}:{register}"), fresh, fenced);
        }
        guard.release().await.expect("release");

        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).expect("SIGCONT");
        line.clear();
        out.read_line(&mut line).expect("sleeper output");
        assert_eq!(line.trim(), "WROTE");
        assert!(sleeper.wait().expect("reap").success());
        let fenced = board.witness.seen(&format!("{key}:fenced"));
        let unfenced = board.witness.seen(&format!("{key}:unfenced"));
        assert_eq!(
            fenced.stale_rejected, 1,
            "trial {trial}: the fenced register took a stale write"
        );
        assert_eq!(
            unfenced.stale_accepted, 1,
            "trial {trial}: the control was not caught"
        );
    }
    report::write(
        "S2",
        json!({
            "scenario": "S2 holder paused past its lease (self-SIGSTOP failpoint)",
            "verdict": "PASS; control caught",
            "parameters": {"trials": trials, "ttl_ms": 200},
            "acquisitions": trials * 2,
            "faults": trials,
            "stale_writes_accepted": 0,
            "stale_writes_rejected": trials,
            "control_unfenced_stale_accepted": trials,
            "key_figure": format!("fenced register refused {trials}/{trials}; unfenced accepted {trials}/{trials}"),
        }),
    );
}

/// S4: the holder's link is blackholed while it works: it must stop before
/// its validity deadline (it cannot know whether its renewals land), and a
/// rival on a healthy link may enter only after that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s4_a_holder_cut_off_stops_before_its_deadline() {
    let server = RedisServer::start();
    let board = Board::new();
    let ttl = Duration::from_millis(600);
    let trials = 5;
    let mut gaps = Vec::new();
    for trial in 0..trials {
        let key = format!("s4:{trial}");
        let proxy = Proxy::start(server.port()).await;
        let holder = LockClient::builder()
            .command_timeout(Duration::from_millis(100))
            .connect(&proxy.url())
            .await
            .expect("connect");
        let rival = LockClient::connect(&server.url()).await.expect("connect");
        let guard = holder
            .lock(key.as_str())
            .ttl(ttl)
            .acquire()
            .await
            .expect("acquire");
        board.witness.enter(&key, 1, 0);
        tokio::time::sleep(ttl / 2).await;
        board.witness.fault("proxy-blackhole");
        proxy.blackhole();
        let rival_run = {
            let (witness, key) = (board.witness.clone(), key.clone());
            tokio::spawn(async move {
                rival
                    .lock(key.as_str())
                    .wait(Duration::from_secs(5))
                    .run(async {
                        witness.enter(&key, 2, 0);
                        let entered = Instant::now();
                        witness.exit(&key, 2, 0);
                        entered
                    })
                    .await
            })
        };
        // The holder works in 1 ms steps, checking its lease before each.
        while guard.is_held() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let stopped = Instant::now();
        board.witness.lost(&key, 1, 0, guard.valid_until());
        let entered = rival_run.await.expect("join").expect("the rival gets the lock");
        gaps.push(entered.saturating_duration_since(stopped));
        assert_eq!(board.witness.seen(&key).overlaps, 0, "trial {trial}");
        proxy.pass();
        board.witness.heal("proxy-blackhole");
        drop(guard);
    }
    let logged = analyze(board.path(), &[]).expect("analyze");
    let slack: Vec<Duration> = logged
        .lost_slack_ns
        .iter()
        .map(|&ns| Duration::from_nanos(u64::try_from(ns).unwrap_or(0)))
        .collect();
    assert!(
        logged.lost_slack_ns.iter().all(|&ns| ns >= 0),
        "a holder stopped after its deadline: {:?}",
        logged.lost_slack_ns
    );
    assert!(logged.overlaps.is_empty(), "{logged:?}");
    let slack = spread_ms(slack);
    report::write(
        "S4",
        json!({
            "scenario": "S4 holder link blackholed",
            "verdict": "PASS",
            "parameters": {"trials": trials, "ttl_ms": ttl.as_millis(), "command_timeout_ms": 100},
            "acquisitions": logged.entries,
            "faults": trials,
            "overlaps": 0,
            "lost_slack_ms": slack,
            "gap_rival_after_stop_ms": spread_ms(gaps),
            "key_figure": format!("stopped before D in {trials}/{trials}"),
        }),
    );
}

/// S5: the acquire reaches the server but its reply is lost (half-open
/// link): the acquisition fails, and the compensating release frees the key
/// at once instead of leaving it until its ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s5_a_half_open_acquire_leaves_no_orphan() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let locks = LockClient::builder()
        .command_timeout(Duration::from_millis(100))
        .connect(&proxy.url())
        .await
        .expect("connect");
    locks.lock("warm-up").run(async {}).await.expect("scripts loaded");
    proxy.half_open();
    let outcome = locks.lock("s5").acquire().await;
    let gave_up = Instant::now();
    assert!(
        outcome.is_err(),
        "no reply came back, so the lock cannot be known as held"
    );
    let freed = eventually(Duration::from_secs(2), || {
        server.query::<i64>(redis::cmd("EXISTS").arg("lock:{s5}")) == 0
    })
    .await
    .expect("the orphan was released");
    let orphan = gave_up.elapsed().min(freed + Duration::from_millis(2));
    report::write(
        "S5",
        json!({
            "scenario": "S5 half-open acquire (reply lost)",
            "verdict": "PASS",
            "faults": 1,
            "orphan_ms": orphan.as_secs_f64() * 1e3,
            "caller_saw": outcome.err().map(|e| e.to_string()),
            "key_figure": format!("orphan {:.1} ms (bound 150)", orphan.as_secs_f64() * 1e3),
        }),
    );
    assert!(
        orphan <= Duration::from_millis(150),
        "orphan lock lived {orphan:?}"
    );
}

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
                board.witness.lost(key, 1, 0, guard.valid_until());
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
}

/// S7: `DEBUG SLEEP` stalls the server with connections accepted: as S6,
/// and no call outlives its wait by more than 50 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s7_a_sleeping_server_is_a_stall_with_bounded_calls() {
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
}

/// S8: `CLIENT PAUSE` for 1 s (WRITE, then ALL) is shorter than the lease
/// less a renewal interval: nothing is lost and nobody sees an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s8_a_client_pause_is_a_stall_not_a_loss() {
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
}

/// S9: the server is killed and restarted while a lock is held. Without
/// persistence the lock is gone and a second holder gets in (the control,
/// which the checker must catch); with `appendfsync always` it survives and
/// nobody overlaps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s9_restarts_lose_locks_unless_the_server_persists_them() {
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
}

/// S10: `SCRIPT FLUSH` every 200 ms under load: no caller ever sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s10_script_flushes_under_load_are_invisible() {
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
    board.witness.lost("s11:a", 1, 0, guard.valid_until());
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
}

/// The eviction check of S11 also covers Redlock masters, and says so when
/// it cannot look (`CONFIG` renamed away, as managed services do).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_eviction_check_names_the_master_and_warns_when_it_cannot_look() {
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
}

/// S15: every way out of the body releases the lock. Per path, 200
/// iterations: time from the exit to the key being gone on the server, no
/// key left, and no renewal after the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s15_every_exit_path_releases_promptly() {
    let server = RedisServer::start();
    let locks = LockClient::connect(&server.url()).await.expect("connect");
    let mut observer = server.sync_connection().expect("observer");
    let mut gone = |key: &str| -> Instant {
        loop {
            let exists: i64 = redis::cmd("EXISTS")
                .arg(key)
                .query(&mut observer)
                .expect("exists");
            if exists == 0 {
                return Instant::now();
            }
        }
    };
    let iterations = 200;
    let mut paths = serde_json::Map::new();
    for path in ["ok", "err", "panic", "timeout", "select", "abort"] {
        let mut latencies = Vec::new();
        for i in 0..iterations {
            let key = format!("s15:{path}:{i}");
            let redis_key = format!("lock:{{{key}}}");
            // A short lease so that the watchdog is busy during the body.
            let request = || locks.lock(key.as_str()).ttl(Duration::from_millis(300));
            let exited = match path {
                "ok" => {
                    let out = request().run(async { Ok::<_, ()>(1) }).await.expect("lock");
                    assert_eq!(out, Ok(1));
                    Instant::now()
                }
                "err" => {
                    let out = request()
                        .run(async { Err::<u8, _>("refused") })
                        .await
                        .expect("lock");
                    assert_eq!(out, Err("refused"));
                    Instant::now()
                }
                "panic" => {
                    let locks = locks.clone();
                    let k = key.clone();
                    let out = tokio::spawn(async move {
                        locks
                            .lock(k.as_str())
                            .run(async { std::panic::panic_any(7u32) })
                            .await
                    })
                    .await;
                    let payload = out.expect_err("panicked").into_panic();
                    assert_eq!(payload.downcast_ref::<u32>(), Some(&7), "payload lost");
                    Instant::now()
                }
                "timeout" => {
                    let body = request().run(std::future::pending::<()>());
                    let out = tokio::time::timeout(Duration::from_millis(5), body).await;
                    assert!(out.is_err());
                    Instant::now()
                }
                "select" => {
                    tokio::select! {
                        biased;
                        () = tokio::time::sleep(Duration::from_millis(5)) => {}
                        _ = request().run(std::future::pending::<()>()) => unreachable!(),
                    }
                    Instant::now()
                }
                _ => {
                    let (inside_tx, inside_rx) = tokio::sync::oneshot::channel();
                    let locks = locks.clone();
                    let k = key.clone();
                    let task = tokio::spawn(async move {
                        locks
                            .lock(k.as_str())
                            .run(async {
                                let _ = inside_tx.send(());
                                std::future::pending::<()>().await;
                            })
                            .await
                    });
                    inside_rx.await.expect("inside");
                    task.abort();
                    let _ = task.await;
                    Instant::now()
                }
            };
            latencies
                .push(tokio::task::block_in_place(|| gone(&redis_key)).saturating_duration_since(exited));
        }
        let spread = spread_ms(latencies);
        let p99 = spread["p99"].as_f64().unwrap_or(f64::MAX);
        let max = spread["max"].as_f64().unwrap_or(f64::MAX);
        assert!(p99 < 20.0 && max < 100.0, "{path}: release latency {spread}");
        paths.insert(path.to_owned(), spread);
    }
    // Nothing renews once everything is released: watch two renewal intervals.
    let before = server.command_calls();
    tokio::time::sleep(Duration::from_millis(250)).await;
    let sent = lock_tests::commands_between(&before, &server.command_calls());
    assert!(
        sent.is_empty(),
        "commands after every lock was released: {sent:?}"
    );
    let leaked: Vec<String> = server.query(redis::cmd("KEYS").arg("lock:*"));
    assert!(leaked.is_empty(), "leaked: {leaked:?}");
    report::write(
        "S15",
        json!({
            "scenario": "S15 exit paths (ok, err, panic, timeout, select, abort)",
            "verdict": "PASS",
            "parameters": {"iterations_per_path": iterations, "ttl_ms": 300},
            "acquisitions": iterations * 6,
            "release_latency_ms": paths,
            "leaked_locks": 0,
            "renewals_after_release": 0,
            "key_figure": "p99 < 20 ms on every path, 0 leaks",
        }),
    );
}

/// S16: re-entry and identity. Five nested levels count 1..5..0 with no
/// command; a nested shorter lease never shortens the key's PTTL; two tasks
/// on a current-thread runtime exclude each other; a child task is not the
/// parent's holder and times out naming the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s16_reentry_is_structural_and_identity_is_per_acquisition() {
    let server = RedisServer::start();
    let board = Board::new();
    let locks = LockClient::connect(&server.url()).await.expect("connect");
    let pttl = || server.query::<i64>(redis::cmd("PTTL").arg("lock:{s16}"));

    // Nested five deep, inner leases shorter than the outer one.
    let before = server.command_calls();
    let mut pttls = Vec::new();
    locks
        .lock("s16")
        .ttl(Duration::from_secs(10))
        .run(async {
            let outer = pttl();
            for depth in 1..5u64 {
                locks
                    .lock("s16")
                    .ttl(Duration::from_millis(200 * depth))
                    .run(async { pttls.push(pttl()) })
                    .await
                    .expect("re-entry");
            }
            pttls.insert(0, outer);
        })
        .await
        .expect("outer");
    assert!(
        pttls.windows(2).all(|w| w[1] >= w[0] - 50),
        "a re-entry shortened the lease: {pttls:?}"
    );
    let mut sent = lock_tests::commands_between(&before, &server.command_calls());
    sent.remove("pttl");
    // The outermost acquire (SET) and release (the script, with the GET and
    // DEL inside it, loaded on first use); the nested levels send nothing.
    let round_trips = sent.get("set").copied().unwrap_or(0) + sent.get("evalsha").copied().unwrap_or(0);
    assert!(round_trips <= 3, "nested levels sent commands: {sent:?}");

    // Two tasks on one thread: mutually exclusive.
    let rounds = 2000u64;
    let single = std::thread::spawn({
        let url = server.url();
        let witness = board.witness.clone();
        move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let locks = LockClient::connect(&url).await.expect("connect");
                let tasks: Vec<_> = (0..2u64)
                    .map(|task| {
                        let (locks, witness) = (locks.clone(), witness.clone());
                        tokio::spawn(async move {
                            for n in 0..rounds / 2 {
                                locks
                                    .lock("s16:same-thread")
                                    .wait(Duration::from_secs(5))
                                    .run(async {
                                        witness.enter("s16:same-thread", (task << 32) | n, 0);
                                        witness.bump("s16:same-thread").await;
                                        witness.exit("s16:same-thread", (task << 32) | n, 0);
                                    })
                                    .await
                                    .expect("lock");
                            }
                        })
                    })
                    .collect();
                for t in tasks {
                    t.await.expect("task");
                }
            });
        }
    });
    tokio::task::block_in_place(|| single.join()).expect("same-thread run");
    let seen = board.witness.seen("s16:same-thread");
    assert_eq!(
        (seen.entries, seen.overlaps, seen.counter),
        (rounds, 0, rounds),
        "{seen:?}"
    );

    // A spawned child is another holder.
    let child = locks
        .lock("s16:parent")
        .run(async {
            let locks = locks.clone();
            tokio::spawn(async move {
                locks
                    .lock("s16:parent")
                    .wait(Duration::from_millis(200))
                    .acquire()
                    .await
                    .map(|_| ())
            })
            .await
            .expect("child")
        })
        .await
        .expect("parent");
    let err = child.expect_err("a child task does not inherit its parent's lock");
    assert!(
        matches!(&err, LockError::Timeout { key, .. } if key == "s16:parent"),
        "{err}"
    );
    report::write(
        "S16",
        json!({
            "scenario": "S16 re-entry and identity",
            "verdict": "PASS",
            "acquisitions": rounds + 2,
            "overlaps": 0,
            "nested_pttl_ms": pttls,
            "commands_for_five_levels": sent,
            "same_thread_tasks": {"rounds": rounds, "overlaps": 0, "lost_updates": 0},
            "child_task": err.to_string(),
            "key_figure": "5 nested levels: commands only at the outermost; child refused",
        }),
    );
}

/// S17: a foreign value at the lock key fails fast and stays untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s17_a_foreign_value_is_a_conflict_not_a_wait() {
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
}
