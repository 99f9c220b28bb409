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
    let lock_server = RedisServer::start();
    let witness_server = RedisServer::start();
    let witness = Witness::connect(&witness_server.url()).await.expect("witness");
    let started = Instant::now();

    // Controls: each broken lock must be caught in every trial (≥ 95%).
    let mut controls = Vec::new();
    for broken in ["del-release", "no-deadline"] {
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
                duration: Duration::from_millis(800),
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
