//! A fault-suite run: a checker board in a fresh directory, and worker
//! processes (`lock-worker witness`) that hammer locks and report to it.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::witness::Witness;

/// A checker board in a temporary directory of its own.
#[derive(Debug)]
pub struct Board {
    dir: tempfile::TempDir,
    /// The controller's view of the board.
    pub witness: Witness,
}

impl Board {
    /// A fresh board.
    pub fn new() -> Board {
        let dir = tempfile::tempdir().expect("board dir");
        let witness = Witness::create(dir.path()).expect("create board");
        Board { dir, witness }
    }

    /// The run's directory (board and logs).
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Default for Board {
    fn default() -> Self {
        Self::new()
    }
}

/// What to run in each worker process.
#[derive(Debug, Clone)]
pub struct Workload {
    /// A Redis URL, or `redlock=` and comma-separated URLs.
    pub target: String,
    /// Keys the tasks pick from at random.
    pub keys: Vec<String>,
    /// `library` or a broken lock (see `lock-worker`).
    pub lock: String,
    /// Tasks per process.
    pub tasks: usize,
    /// How long each process runs.
    pub duration: Duration,
    /// Lease of each acquisition.
    pub ttl: Duration,
    /// Longest body.
    pub max_body: Duration,
    /// The client's command timeout, when not the default.
    pub command_timeout: Option<Duration>,
    /// Percent of bodies that last 0.5–2.5 s instead (renewed while they run).
    pub long_body_percent: u32,
}

/// What the workers of a run said about themselves.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// Bodies that ran to their end.
    pub taken: u64,
    /// Bodies stopped because the lock was lost.
    pub lost: u64,
    /// Acquisitions that waited out their wait.
    pub timeouts: u64,
    /// Acquisitions or releases that failed otherwise (during faults).
    pub errors: u64,
    /// The first such error's message.
    pub first_error: Option<String>,
    /// The worst lateness any worker's assumption monitor saw.
    pub worst_late: Duration,
}

/// `lock-worker`, built next to the test binary (`target/<profile>/`; test
/// binaries live in its `deps/`).
pub fn worker_binary() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile = exe.parent().and_then(Path::parent).expect("target/<profile>");
    profile.join("lock-worker")
}

/// Worker processes of one run; killed on drop if still running.
#[derive(Debug)]
pub struct Workers {
    children: Vec<Child>,
}

impl Workers {
    /// Starts `processes` workers on `board`.
    pub fn spawn(board: &Board, workload: &Workload, processes: usize) -> Workers {
        let children = (0..processes)
            .map(|_| {
                let mut command = Command::new(worker_binary());
                command
                    .args([
                        "witness",
                        &workload.target,
                        &board.path().to_string_lossy(),
                        &workload.keys.join(","),
                        &workload.tasks.to_string(),
                        &workload.duration.as_millis().to_string(),
                        &workload.lock,
                        &workload.ttl.as_millis().to_string(),
                        &workload.max_body.as_millis().to_string(),
                    ])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit());
                command.env(
                    "LOCK_WORKER_LONG_BODY_PERCENT",
                    workload.long_body_percent.to_string(),
                );
                if let Some(timeout) = workload.command_timeout {
                    command.env("LOCK_WORKER_COMMAND_TIMEOUT_MS", timeout.as_millis().to_string());
                }
                crate::spawn_owned(command).expect("spawn worker")
            })
            .collect();
        Workers { children }
    }

    /// The workers' process ids.
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }

    /// Waits for every worker and sums what they said.
    pub fn finish(mut self) -> Tally {
        let mut total = Tally::default();
        for child in std::mem::take(&mut self.children) {
            let output = child.wait_with_output().expect("worker output");
            assert!(output.status.success(), "a worker failed: {:?}", output.status);
            let text = String::from_utf8_lossy(&output.stdout);
            let line: serde_json::Value = serde_json::from_str(text.trim()).expect("worker JSON line");
            let n = |field: &str| line[field].as_u64().unwrap_or(0);
            total.taken += n("taken");
            total.lost += n("lost");
            total.timeouts += n("timeouts");
            total.errors += n("errors");
            if total.first_error.is_none() {
                total.first_error = line["first_error"]
                    .as_str()
                    .filter(|e| !e.is_empty())
                    .map(str::to_owned);
            }
            total.worst_late = total.worst_late.max(Duration::from_micros(n("worst_late_us")));
        }
        total
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs `processes` workers to completion on `board`.
pub fn run(board: &Board, workload: &Workload, processes: usize) -> Tally {
    Workers::spawn(board, workload, processes).finish()
}
