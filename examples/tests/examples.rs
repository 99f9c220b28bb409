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
    let output = lock_tests::output_within_limit(&mut command, "the oversell example");
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
    let output = lock_tests::output_within_limit(
        Command::new(env!("CARGO_BIN_EXE_oversell"))
            .arg("--processes")
            .env_remove("REDIS_URL"),
        "oversell --processes",
    );
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("set REDIS_URL"));
}

fn run_example(exe: &str) -> String {
    let output = lock_tests::output_within_limit(Command::new(exe).env_remove("REDIS_URL"), exe);
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

/// What the example `exe` printed, run in process (`REDIS_URL` unset), then
/// on a Redis server of its own; each run must succeed.
fn in_process_and_on_redis(exe: &str, what: &str) -> Vec<String> {
    let server = RedisServer::start();
    [None, Some(server.url())]
        .into_iter()
        .map(|url| {
            let mut command = Command::new(exe);
            command.env_remove("REDIS_URL");
            if let Some(url) = &url {
                command.env("REDIS_URL", url);
            }
            let output = lock_tests::output_within_limit(&mut command, what);
            let stdout = String::from_utf8(output.stdout).expect("utf-8");
            assert!(
                output.status.success(),
                "{what} failed ({}):\n{stdout}\n{}",
                url.as_deref().unwrap_or("in process"),
                String::from_utf8_lossy(&output.stderr)
            );
            stdout
        })
        .collect()
}

/// A leader's epoch refuses the write of a replica whose term ended, in
/// process and on Redis; a follower reads who leads.
#[test]
fn the_leader_example_refuses_the_former_leaders_late_write() {
    for out in in_process_and_on_redis(env!("CARGO_BIN_EXE_leader"), "the leader example") {
        let epoch = |who: &str| -> u64 {
            let line = out
                .lines()
                .find(|l| l.starts_with(&format!("{who}: leads with epoch ")))
                .unwrap_or_else(|| panic!("{who} never led:\n{out}"));
            line.split_whitespace()
                .nth(4)
                .and_then(|e| e.trim_end_matches(',').parse().ok())
                .unwrap_or_else(|| panic!("no epoch in {line:?}"))
        };
        let (a, b) = (epoch("replica-a"), epoch("replica-b"));
        assert!(b > a, "epochs {a} then {b}:\n{out}");
        assert!(
            out.contains(&format!("replica-b: write with epoch {b} accepted")),
            "{out}"
        );
        assert!(
            out.contains(&format!(
                "replica-a: refused write with epoch {a}: storage has seen epoch {b}"
            )),
            "{out}"
        );
        assert!(
            out.contains(&format!("a follower asks: replica-b leads, epoch {b}")),
            "{out}"
        );
    }
}

/// The segmented example sells exactly the stock at every segment count,
/// in-process and on Redis.
#[test]
fn segmented_never_oversells_at_any_segment_count() {
    for stdout in in_process_and_on_redis(env!("CARGO_BIN_EXE_segmented"), "the segmented example") {
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

/// The value of the Prometheus series `series` (name and labels exactly as
/// exposed) in `exposition`.
fn sample(exposition: &str, series: &str) -> Option<f64> {
    exposition.lines().find_map(|line| {
        let value = line.strip_prefix(series)?.strip_prefix(' ')?;
        value.trim().parse().ok()
    })
}

/// `GET /metrics` from the exporter at `addr`: the body.
fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to the exporter");
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("timeout");
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.") && head.contains(" 200 "), "{head}");
    body.to_owned()
}

#[test]
fn the_metrics_service_exposes_counters_that_match_its_orders() {
    use std::io::{BufRead, BufReader};
    let server = RedisServer::start();
    let addr = format!("127.0.0.1:{}", lock_tests::free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_metrics"))
        .args(["--rounds", "2"])
        .env("REDIS_URL", server.url())
        .env("METRICS_ADDR", &addr)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the metrics example");
    let _limit = lock_tests::kill_after_limit(child.id(), "the metrics example");
    let stdout = child.stdout.take().expect("piped");
    let mut orders = 0;
    let mut sold = 0;
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("read");
        if line.contains("\"done\"") {
            break;
        }
        if let Ok(round) = serde_json::from_str::<serde_json::Value>(&line) {
            orders += round["orders"].as_u64().expect("orders");
            sold += round["sold"].as_u64().expect("sold");
        }
    }
    let body = scrape(&addr);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!((orders, sold), (48, 30), "two rounds of 24 orders, 15 sold each");
    let acquired = r#"distributed_lock_acquire_total{lock="stock:<product_id>",outcome="acquired"}"#;
    assert_eq!(sample(&body, acquired), Some(48.0), "{body}");
    for outcome in ["timeout", "error", "reentered"] {
        let series =
            format!(r#"distributed_lock_acquire_total{{lock="stock:<product_id>",outcome="{outcome}"}}"#);
        assert_eq!(sample(&body, &series).unwrap_or(0.0), 0.0, "{outcome}: {body}");
    }
    let holds = r#"distributed_lock_hold_seconds_count{lock="stock:<product_id>"}"#;
    assert_eq!(sample(&body, holds), Some(48.0), "{body}");
    let waits = r#"distributed_lock_wait_seconds_count{lock="stock:<product_id>"}"#;
    assert_eq!(sample(&body, waits), Some(48.0), "{body}");
    assert_eq!(sample(&body, "distributed_lock_held"), Some(0.0), "{body}");
    assert!(body.contains("# HELP distributed_lock_acquire_total"), "{body}");
}

/// The scheduled-job demo: three replicas 300 ms apart, 30 ticks. Without a
/// lock the ticks run several times, and with `hold_at_least` each runs
/// exactly once; `on_busy = "skip"` alone is printed, not judged (how often
/// the late replicas find the 50 ms job done depends on the scheduler).
#[test]
fn the_scheduled_job_runs_once_per_tick_with_hold_at_least() {
    let server = RedisServer::start();
    let output = lock_tests::output_within_limit(
        Command::new(env!("CARGO_BIN_EXE_scheduled")).env("REDIS_URL", server.url()),
        "the scheduled example",
    );
    let out = String::from_utf8(output.stdout).expect("utf-8");
    assert!(
        output.status.success(),
        "scheduled failed:\n{out}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let summary = |label: &str| -> Vec<u64> {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("| {label}")))
            .unwrap_or_else(|| panic!("no `{label}` row in:\n{out}"));
        line.split('|')
            .filter_map(|cell| cell.trim().parse().ok())
            .collect()
    };
    let once = summary("ran exactly once");
    let more = summary("ran more than once");
    assert_eq!(once.len(), 3, "{out}");
    assert_eq!(
        (once[2], more[2]),
        (30, 0),
        "with hold_at_least, every tick once:\n{out}"
    );
    assert!(more[0] > 0, "without a lock, ticks ran more than once:\n{out}");
}

#[test]
fn the_scheduled_demo_without_redis_says_what_to_do() {
    let output = lock_tests::output_within_limit(
        Command::new(env!("CARGO_BIN_EXE_scheduled")).env_remove("REDIS_URL"),
        "scheduled without REDIS_URL",
    );
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("set REDIS_URL"));
}
