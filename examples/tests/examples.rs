//! The examples, run as users run them. The oversell demo (the README's first
//! command) must show the lock doing its job on every backend and in process
//! mode; the others must show what they claim.

use std::process::Command;

use lock_tests::RedisServer;

/// (sold, refused, stock left, oversold) for the run whose row starts with
/// `run`.
fn row(output: &str, run: &str) -> (i64, i64, i64, i64) {
    let line = output
        .lines()
        .find(|l| l.starts_with(&format!("| {run}")))
        .unwrap_or_else(|| panic!("no `{run}` row in:\n{output}"));
    let n: Vec<i64> = line
        .split('|')
        .filter_map(|cell| cell.trim().parse().ok())
        .collect();
    assert_eq!(n.len(), 4, "row {line:?}");
    (n[0], n[1], n[2], n[3])
}

fn oversell(redis_url: Option<&str>, args: &[&str]) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_oversell"));
    command.args(args).env_remove("REDIS_URL");
    if let Some(url) = redis_url {
        command.env("REDIS_URL", url);
    }
    let output = command.output().expect("run the oversell example");
    let stdout = String::from_utf8(output.stdout).expect("utf-8");
    assert!(
        output.status.success(),
        "oversell failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[test]
fn in_process_the_race_oversells_and_the_lock_does_not() {
    let out = oversell(None, &[]);
    assert!(out.contains("in-process backend"), "{out}");
    let (sold, refused, _, oversold) = row(&out, "without a lock");
    assert!(oversold > 0 && sold + refused == 9, "{out}");
    assert_eq!(row(&out, "with #[distributed_lock]"), (7, 2, 0, 0), "{out}");
}

#[test]
fn on_redis_in_one_process_and_in_three() {
    let server = RedisServer::start();
    for args in [&[][..], &["--processes"][..]] {
        let out = oversell(Some(&server.url()), args);
        assert!(out.contains("Redis at"), "{out}");
        let (sold, refused, _, _) = row(&out, "without a lock");
        assert_eq!(sold + refused, 9, "{out}");
        assert_eq!(row(&out, "with #[distributed_lock]"), (7, 2, 0, 0), "{out}");
    }
}

#[test]
fn process_mode_without_redis_says_what_to_do() {
    let output = Command::new(env!("CARGO_BIN_EXE_oversell"))
        .arg("--processes")
        .env_remove("REDIS_URL")
        .output()
        .expect("run");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("set REDIS_URL"));
}

fn run_example(exe: &str) -> String {
    let output = Command::new(exe)
        .env_remove("REDIS_URL")
        .output()
        .expect("run example");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("utf-8")
}

#[test]
fn the_reentrant_example_reenters_and_makes_other_tasks_wait() {
    let out = run_example(env!("CARGO_BIN_EXE_reentrant"));
    let position = |text: &str| out.find(text).unwrap_or_else(|| panic!("no {text:?} in:\n{out}"));
    assert!(
        position("re-entered the lock") < position("transfer done"),
        "{out}"
    );
    assert!(
        position("transfer done") < position("audit of 1: got the lock"),
        "{out}"
    );
}

#[test]
fn the_fencing_example_refuses_the_late_write() {
    let out = run_example(env!("CARGO_BIN_EXE_fencing"));
    assert!(out.contains("holder B: write with token 2 accepted"), "{out}");
    assert!(out.contains("holder A: refused write with token 1"), "{out}");
    assert!(out.contains("The document holds \"holder B\""), "{out}");
}

/// The segmented example sells exactly the stock at every segment count,
/// in-process and on Redis.
#[test]
fn segmented_never_oversells_at_any_segment_count() {
    let server = RedisServer::start();
    for url in [None, Some(server.url())] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_segmented"));
        command.env_remove("REDIS_URL");
        if let Some(url) = &url {
            command.env("REDIS_URL", url);
        }
        let output = command.output().expect("run the segmented example");
        let stdout = String::from_utf8(output.stdout).expect("utf-8");
        assert!(output.status.success(), "segmented failed:\n{stdout}");
        for segments in ["1", "2", "5", "10"] {
            let line = stdout
                .lines()
                .find(|l| l.split('|').nth(1).map(str::trim) == Some(segments))
                .unwrap_or_else(|| panic!("no row for {segments} segments:\n{stdout}"));
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            assert_eq!((cells[2], cells[3]), ("1000", "0"), "{line}");
        }
    }
}
