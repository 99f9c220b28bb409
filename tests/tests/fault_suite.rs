//! The fault suite, first slice (RELIABILITY §5–§6): worker processes hammer
//! locks while a witness that does not trust the lock records what really
//! happened. A scenario's result counts only after its negative controls,
//! deliberately broken locks, have been caught by the same checker.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lock_tests::RedisServer;
use lock_tests::witness::{Seen, Witness};

/// One run of `processes` worker processes with `tasks` tasks each.
struct Run<'a> {
    lock_url: &'a str,
    witness_url: &'a str,
    key: &'a str,
    lock: &'a str,
    processes: usize,
    tasks: usize,
    duration: Duration,
    ttl: Duration,
    max_body: Duration,
}

impl Run<'_> {
    /// Runs the workers to completion; returns (taken, lost) summed.
    fn go(&self) -> (u64, u64) {
        let workers: Vec<_> = (0..self.processes)
            .map(|_| {
                Command::new(env!("CARGO_BIN_EXE_lock-worker"))
                    .args([
                        "witness",
                        self.lock_url,
                        self.witness_url,
                        self.key,
                        &self.tasks.to_string(),
                        &self.duration.as_millis().to_string(),
                        self.lock,
                        &self.ttl.as_millis().to_string(),
                        &self.max_body.as_millis().to_string(),
                    ])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit())
                    .spawn()
                    .expect("spawn worker")
            })
            .collect();
        let (mut taken, mut lost) = (0, 0);
        for worker in workers {
            let output = worker.wait_with_output().expect("worker output");
            assert!(output.status.success(), "worker for `{}` failed", self.lock);
            let text = String::from_utf8_lossy(&output.stdout);
            let number = |field: &str| -> u64 {
                text.split(&format!("\"{field}\":"))
                    .nth(1)
                    .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0)
            };
            taken += number("taken");
            lost += number("lost");
        }
        (taken, lost)
    }
}

/// A server to take locks on, and the witness that checks them.
struct Lab {
    server: RedisServer,
    witness_server: RedisServer,
    witness: Witness,
}

impl Lab {
    async fn start() -> Lab {
        let server = RedisServer::start();
        let witness_server = RedisServer::start();
        let witness = Witness::connect(&witness_server.url()).await.expect("witness");
        Lab {
            server,
            witness_server,
            witness,
        }
    }
}

fn caught(seen: &Seen) -> bool {
    seen.overlaps > 0 || seen.counter < seen.entries
}

/// Writes `target/reliability/<id>.json`.
fn report(id: &str, json: &str) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/reliability");
    std::fs::create_dir_all(&dir).expect("report dir");
    std::fs::write(dir.join(format!("{id}.json")), json).expect("write report");
    println!("{json}");
}

/// S0 (short), after its controls: two processes of four tasks on three
/// keys; with the real lock, no overlap, no lost update, no stale token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s0_baseline_after_its_controls_are_caught() {
    let Lab {
        server: lock_server,
        witness_server,
        witness,
    } = Lab::start().await;
    let started = Instant::now();

    // Controls: each broken lock must be caught in every trial (≥ 95%).
    let mut controls = Vec::new();
    for broken in ["del-release", "no-deadline", "blind-renew"] {
        let trials = 5;
        let mut caught_in = 0;
        for trial in 0..trials {
            let key = format!("control:{broken}:{trial}");
            Run {
                lock_url: &lock_server.url(),
                witness_url: &witness_server.url(),
                key: &key,
                lock: broken,
                processes: 2,
                tasks: 4,
                duration: Duration::from_millis(1500),
                ttl: Duration::from_millis(60),
                max_body: Duration::from_millis(120),
            }
            .go();
            if caught(&witness.seen(&key).await.expect("seen")) {
                caught_in += 1;
            }
        }
        assert_eq!(
            caught_in,
            trials,
            "the checker missed the `{broken}` lock in {} trials",
            trials - caught_in
        );
        controls.push(format!(
            "{{\"control\":\"{broken}\",\"caught\":{caught_in},\"trials\":{trials}}}"
        ));
    }

    // The scenario itself, with the library's lock.
    let keys = ["s0:a", "s0:b", "s0:c"];
    let runs: Vec<_> = keys
        .iter()
        .map(|key| {
            let (lock_url, witness_url) = (lock_server.url(), witness_server.url());
            let key = (*key).to_owned();
            std::thread::spawn(move || {
                Run {
                    lock_url: &lock_url,
                    witness_url: &witness_url,
                    key: &key,
                    lock: "library",
                    processes: 2,
                    tasks: 4,
                    duration: Duration::from_secs(4),
                    ttl: Duration::from_millis(1500),
                    max_body: Duration::from_millis(2),
                }
                .go()
            })
        })
        .collect();
    let (mut taken, mut lost) = (0, 0);
    for run in runs {
        let (t, l) = run.join().expect("run");
        taken += t;
        lost += l;
    }
    let mut per_key = Vec::new();
    for key in keys {
        let seen = witness.seen(key).await.expect("seen");
        assert_eq!(seen.overlaps, 0, "{key}: two holders at once: {seen:?}");
        assert_eq!(seen.counter, seen.entries, "{key}: lost updates: {seen:?}");
        assert_eq!(seen.stale_rejected, 0, "{key}: a token went backwards: {seen:?}");
        assert!(
            seen.entries > 100,
            "{key}: too little traffic to mean anything: {seen:?}"
        );
        per_key.push(format!(
            "{{\"key\":\"{key}\",\"entries\":{},\"overlaps\":{},\"counter\":{},\"fence_regressions\":{}}}",
            seen.entries, seen.overlaps, seen.counter, seen.stale_rejected
        ));
    }
    assert_eq!(lost, 0, "leases lost on a healthy server");
    report(
        "S0",
        &format!(
            "{{\"scenario\":\"S0 baseline (short)\",\"workers\":\"2 processes x 4 tasks x 3 keys\",\"acquisitions\":{taken},\"lost\":{lost},\"keys\":[{}],\"controls\":[{}],\"seconds\":{:.1}}}",
            per_key.join(","),
            controls.join(","),
            started.elapsed().as_secs_f64()
        ),
    );
}

fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e3
}

/// S1: a holder killed with SIGKILL while its lease is renewed frees the
/// lock within the ttl (plus the waiter's poll) of its death.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s1_a_killed_holder_frees_the_lock_within_its_ttl() {
    use std::io::{BufRead, BufReader};
    let server = RedisServer::start();
    let locks = lock_runtime::LockClient::connect(&server.url())
        .await
        .expect("connect");
    let ttl = Duration::from_millis(600);
    let mut unavailable = Vec::new();
    for trial in 0..8 {
        let key = format!("s1:{trial}");
        let mut holder = Command::new(env!("CARGO_BIN_EXE_lock-worker"))
            .args(["hold-renewed", &server.url(), &key, &ttl.as_millis().to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn holder");
        let mut line = String::new();
        BufReader::new(holder.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("holder output");
        assert_eq!(line.trim(), "HELD");
        // Die at a varying point of the renewal cycle.
        tokio::time::sleep(ttl * (trial % 4 + 1) / 4).await;
        holder.kill().expect("SIGKILL");
        let killed = Instant::now();
        holder.wait().expect("reap");
        let guard = locks
            .lock(key.as_str())
            .wait(Duration::from_secs(5))
            .acquire()
            .await
            .expect("acquire");
        unavailable.push(killed.elapsed());
        guard.release().await.expect("release");
    }
    unavailable.sort();
    let max = *unavailable.last().expect("trials");
    report(
        "S1",
        &format!(
            "{{\"scenario\":\"S1 holder crash\",\"trials\":{},\"ttl_ms\":{},\"unavail_ms\":{{\"min\":{:.0},\"p50\":{:.0},\"max\":{:.0}}}}}",
            unavailable.len(),
            ttl.as_millis(),
            percentile_ms(&unavailable, 0.0),
            percentile_ms(&unavailable, 0.5),
            percentile_ms(&unavailable, 1.0)
        ),
    );
    assert!(
        max <= ttl + Duration::from_millis(250),
        "lock unavailable for {max:?} after its holder died"
    );
}

/// S2 and its control: a holder that stops (SIGSTOP) between taking the lock
/// and writing, past its lease. Another holder writes meanwhile; the late
/// write is refused by a fenced register (S2) and accepted by an unfenced
/// one (the control, which the checker must see every time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s2_a_paused_holder_is_stopped_by_fencing_alone() {
    use std::io::{BufRead, BufReader};
    let Lab {
        server,
        witness_server,
        witness,
    } = Lab::start().await;
    let locks = lock_runtime::LockClient::connect(&server.url())
        .await
        .expect("connect");
    let trials = 5;
    for trial in 0..trials {
        let key = format!("s2:{trial}");
        let mut sleeper = Command::new(env!("CARGO_BIN_EXE_lock-worker"))
            .args(["pause", &server.url(), &witness_server.url(), &key, "200"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn sleeper");
        let mut out = BufReader::new(sleeper.stdout.take().expect("stdout"));
        let mut line = String::new();
        out.read_line(&mut line).expect("sleeper output");
        let stale: u64 = line.trim().trim_start_matches("PAUSING ").parse().expect("token");
        let pid = nix::unistd::Pid::from_raw(i32::try_from(sleeper.id()).expect("pid"));
        let stopped = lock_tests::eventually(Duration::from_secs(2), || {
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
            witness
                .write(&format!("{key}:{register}"), fresh, fenced)
                .await
                .expect("write");
        }
        guard.release().await.expect("release");

        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).expect("SIGCONT");
        line.clear();
        out.read_line(&mut line).expect("sleeper output");
        assert_eq!(line.trim(), "WROTE");
        assert!(sleeper.wait().expect("reap").success());
        let fenced = witness.seen(&format!("{key}:fenced")).await.expect("seen");
        let unfenced = witness.seen(&format!("{key}:unfenced")).await.expect("seen");
        assert_eq!(
            fenced.stale_rejected, 1,
            "trial {trial}: the fenced register took a stale write"
        );
        assert_eq!(
            unfenced.stale_accepted, 1,
            "trial {trial}: the control was not caught"
        );
    }
    report(
        "S2",
        &format!(
            "{{\"scenario\":\"S2 holder paused past its lease\",\"trials\":{trials},\"stale_writes_accepted_fenced\":0,\"stale_writes_rejected_fenced\":{trials},\"control_unfenced_stale_accepted\":{trials}}}"
        ),
    );
}

/// S5: the acquire reaches the server but its reply is lost (half-open
/// link): the acquisition fails, and the compensating release frees the key
/// at once instead of leaving it until its ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s5_a_half_open_acquire_leaves_no_orphan() {
    let server = RedisServer::start();
    let proxy = lock_tests::Proxy::start(server.port()).await;
    let locks = lock_runtime::LockClient::builder()
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
    let freed = lock_tests::eventually(Duration::from_secs(2), || {
        server.query::<i64>(redis::cmd("EXISTS").arg("lock:{s5}")) == 0
    })
    .await
    .expect("the orphan was released");
    let orphan = gave_up.elapsed().min(freed + Duration::from_millis(2));
    report(
        "S5",
        &format!(
            "{{\"scenario\":\"S5 half-open acquire\",\"orphan_ms\":{:.1}}}",
            orphan.as_secs_f64() * 1e3
        ),
    );
    assert!(
        orphan <= Duration::from_millis(150),
        "orphan lock lived {orphan:?}"
    );
}

/// S9: the server is killed and restarted while a lock is held. Without
/// persistence the lock is gone and a second holder gets in (the control,
/// which the witness must catch); with `appendfsync always` it survives and
/// nobody overlaps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s9_restarts_lose_locks_unless_the_server_persists_them() {
    let witness_server = RedisServer::start();
    let witness = Witness::connect(&witness_server.url()).await.expect("witness");
    let mut outcomes = Vec::new();
    for (variant, extra) in [
        ("a-no-persistence", &[][..]),
        (
            "b-appendfsync-always",
            &["--appendonly", "yes", "--appendfsync", "always"][..],
        ),
    ] {
        let mut server = RedisServer::start_with(extra);
        let holder = lock_runtime::LockClient::connect(&server.url())
            .await
            .expect("connect");
        let rival = lock_runtime::LockClient::connect(&server.url())
            .await
            .expect("connect");
        let key = format!("s9:{variant}");
        let (entered_tx, entered_rx) = tokio::sync::oneshot::channel();
        let holding = {
            let (witness, key) = (witness.clone(), key.clone());
            tokio::spawn(async move {
                holder
                    .lock(key.as_str())
                    .ttl(Duration::from_millis(1000))
                    .run(async {
                        witness.enter(&key).await.expect("enter");
                        let _ = entered_tx.send(());
                        tokio::time::sleep(Duration::from_millis(1500)).await;
                        witness.exit(&key).await.expect("exit");
                    })
                    .await
            })
        };
        entered_rx.await.expect("the holder is inside");
        tokio::task::block_in_place(|| server.restart());
        let rival_run = rival
            .lock(key.as_str())
            .wait(Duration::from_secs(3))
            .run(async {
                witness.enter(&key).await.expect("enter");
                witness.exit(&key).await.expect("exit");
            })
            .await;
        let held_through = holding.await.expect("join");
        let seen = witness.seen(&key).await.expect("seen");
        outcomes.push(format!(
            "{{\"variant\":\"{variant}\",\"overlaps\":{},\"holder\":\"{}\",\"rival\":\"{}\"}}",
            seen.overlaps,
            if held_through.is_ok() { "finished" } else { "lost" },
            if rival_run.is_ok() { "got it" } else { "refused" }
        ));
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
    report(
        "S9",
        &format!(
            "{{\"scenario\":\"S9 server kill -9 and restart\",\"variants\":[{}]}}",
            outcomes.join(",")
        ),
    );
}

/// S10: `SCRIPT FLUSH` every 200 ms under load: no caller ever sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s10_script_flushes_under_load_are_invisible() {
    let Lab {
        server,
        witness_server: _witness_server,
        witness,
    } = Lab::start().await;
    let locks = lock_runtime::LockClient::connect(&server.url())
        .await
        .expect("connect");
    let stop = Instant::now() + Duration::from_secs(3);
    let tasks: Vec<_> = (0..8)
        .map(|task| {
            let (locks, witness) = (locks.clone(), witness.clone());
            tokio::spawn(async move {
                let key = format!("s10:{}", task % 2);
                let mut done = 0u64;
                while Instant::now() < stop {
                    locks
                        .lock(key.as_str())
                        .fencing(true)
                        .wait(Duration::from_secs(5))
                        .run(async {
                            witness.enter(&key).await?;
                            witness.bump(&key).await?;
                            witness.exit(&key).await
                        })
                        .await
                        .expect("no lock error may reach the caller")
                        .expect("witness");
                    done += 1;
                }
                done
            })
        })
        .collect();
    let mut flushes = 0;
    while Instant::now() < stop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        server.query::<()>(redis::cmd("SCRIPT").arg("FLUSH"));
        flushes += 1;
    }
    let mut acquisitions = 0;
    for t in tasks {
        acquisitions += t.await.expect("task");
    }
    for key in ["s10:0", "s10:1"] {
        let seen = witness.seen(key).await.expect("seen");
        assert_eq!(
            (seen.overlaps, seen.counter),
            (0, seen.entries),
            "{key}: {seen:?}"
        );
    }
    report(
        "S10",
        &format!(
            "{{\"scenario\":\"S10 SCRIPT FLUSH under load\",\"flushes\":{flushes},\"acquisitions\":{acquisitions},\"user_visible_errors\":0}}"
        ),
    );
}

/// S4: the holder's link is blackholed while it works: it must stop before
/// its validity deadline (it cannot know whether its renewals land), and a
/// rival on a healthy link may enter only after that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s4_a_holder_cut_off_stops_before_its_deadline() {
    let Lab {
        server,
        witness_server: _witness_server,
        witness,
    } = Lab::start().await;
    let ttl = Duration::from_millis(600);
    let mut slacks = Vec::new();
    for trial in 0..5 {
        let key = format!("s4:{trial}");
        let proxy = lock_tests::Proxy::start(server.port()).await;
        let holder = lock_runtime::LockClient::builder()
            .command_timeout(Duration::from_millis(100))
            .connect(&proxy.url())
            .await
            .expect("connect");
        let rival = lock_runtime::LockClient::connect(&server.url())
            .await
            .expect("connect");
        let guard = holder
            .lock(key.as_str())
            .ttl(ttl)
            .acquire()
            .await
            .expect("acquire");
        witness.enter(&key).await.expect("enter");
        tokio::time::sleep(ttl / 2).await;
        proxy.blackhole();
        let rival_run = {
            let (witness, key) = (witness.clone(), key.clone());
            tokio::spawn(async move {
                rival
                    .lock(key.as_str())
                    .wait(Duration::from_secs(5))
                    .run(async {
                        witness.enter(&key).await.expect("enter");
                        witness.exit(&key).await.expect("exit");
                    })
                    .await
            })
        };
        // The holder works in 1 ms steps, checking its lease before each.
        while guard.is_held() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let stopped = Instant::now();
        witness.exit(&key).await.expect("exit");
        let deadline = guard.valid_until();
        assert!(
            stopped < deadline,
            "trial {trial}: stopped {:?} after D",
            stopped - deadline
        );
        slacks.push(deadline - stopped);
        rival_run.await.expect("join").expect("the rival gets the lock");
        let seen = witness.seen(&key).await.expect("seen");
        assert_eq!(seen.overlaps, 0, "trial {trial}: {seen:?}");
        proxy.pass();
        drop(guard);
    }
    slacks.sort();
    report(
        "S4",
        &format!(
            "{{\"scenario\":\"S4 holder link blackhole\",\"trials\":{},\"lost_slack_ms\":{{\"min\":{:.2},\"p50\":{:.2}}},\"overlaps\":0}}",
            slacks.len(),
            percentile_ms(&slacks, 0.0),
            percentile_ms(&slacks, 0.5)
        ),
    );
}
