//! Faults of the holder: the S0 baseline with its controls, a killed
//! holder (S1), a paused one (S2), every exit path (S15), re-entry and
//! identity (S16).

use super::*;

/// S0 (short), after its controls: two processes of four tasks on three
/// keys; with the library's lock, no overlap, no lost update, no token going
/// back. A run in which the assumption monitor saw a process starved beyond
/// δ/2 is invalid and re-run (up to three runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s0_baseline_after_its_controls_are_caught() {
    scenario("s0_baseline_after_its_controls_are_caught", async move {
        let server = RedisServer::start();
        let started = Instant::now();
        let controls = tokio::task::block_in_place(|| controls(&server));
        run_s0(
            &server.url(),
            Baseline {
                id: "S0",
                scenario: "S0 baseline (short)",
                min_entries: 1000,
                controls: Some(controls),
                started,
            },
        );
    })
    .await
}

/// S1: a holder killed with SIGKILL while its lease is renewed frees the
/// lock within the ttl (plus the waiter's poll) of its death.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s1_a_killed_holder_frees_the_lock_within_its_ttl() {
    scenario("s1_a_killed_holder_frees_the_lock_within_its_ttl", async move {
        let server = RedisServer::start();
        let locks = LockClient::connect(&server.url()).await.expect("connect");
        run_s1(&server.url(), &locks, "S1", "S1 holder crash (SIGKILL)").await;
    })
    .await
}

/// S2 and its control: a holder that stops itself (SIGSTOP failpoint)
/// between taking the lock and writing, past its lease. Another holder
/// writes meanwhile; the late write is refused by a fenced register (S2) and
/// accepted by an unfenced one (the control, which must be caught every time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s2_a_paused_holder_is_stopped_by_fencing_alone() {
    scenario("s2_a_paused_holder_is_stopped_by_fencing_alone", async move {
        let server = RedisServer::start();
        let locks = LockClient::connect(&server.url()).await.expect("connect");
        run_s2(
            &server.url(),
            &locks,
            "S2",
            "S2 holder paused past its lease (self-SIGSTOP failpoint)",
        )
        .await;
    })
    .await
}

/// S2's shape on `target`, with `locks` as the holder that takes over.
pub(crate) async fn run_s2(target: &str, locks: &LockClient, id: &str, scenario: &str) {
    use std::io::{BufRead, BufReader};
    let board = Board::new();
    let trials = 5;
    for trial in 0..trials {
        let key = format!("s2:{trial}");
        let mut sleeper = lab::worker_command()
            .args(["pause", target, &board.path().to_string_lossy(), &key, "200"])
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
            .wait(Duration::from_secs(10))
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
        id,
        json!({
            "scenario": scenario,
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

/// S15: every way out of the body releases the lock. Per path, 200
/// iterations: time from the exit to the key being gone on the server, no
/// key left, and no renewal after the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s15_every_exit_path_releases_promptly() {
    scenario("s15_every_exit_path_releases_promptly", async move {
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
    })
    .await
}

/// S16: re-entry and identity. Five nested levels count 1..5..0 with no
/// command; a nested shorter lease never shortens the key's PTTL; two tasks
/// on a current-thread runtime exclude each other; a child task is not the
/// parent's holder and times out naming the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s16_reentry_is_structural_and_identity_is_per_acquisition() {
    scenario(
        "s16_reentry_is_structural_and_identity_is_per_acquisition",
        async move {
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
            let round_trips =
                sent.get("set").copied().unwrap_or(0) + sent.get("evalsha").copied().unwrap_or(0);
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
        },
    )
    .await
}
