//! The fault scenarios, tier 1 (run by `.ci/run`), one file per fault
//! family: worker
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

mod holders;
mod kinds;
mod links;
mod replication;
mod server_state;
mod stalls;

pub(crate) const T: Duration = Duration::from_millis(1500);

pub(crate) fn broken_or_library(target: &str, keys: &[&str], lock: &str, duration: Duration) -> Workload {
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
        replica_acks: None,
    }
}

/// Whether the checker flagged `key` on `board`, online or in the logs.
pub(crate) fn flagged(board: &Board, key: &str) -> bool {
    let seen = board.witness.seen(key);
    let logged = analyze(board.path(), &[key]).expect("analyze");
    seen.overlaps > 0 || seen.counter < seen.entries || !logged.overlaps.is_empty()
}

/// The negative controls on a server: each broken lock
/// must be flagged in every trial (the bar is ≥ 95%).
pub(crate) fn controls(server: &RedisServer) -> serde_json::Value {
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
