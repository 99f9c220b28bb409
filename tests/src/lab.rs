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

/// A run that fails (its controller panics with the board alive) keeps its
/// directory, witness logs included, and says where: a rare failure can
/// then be read record by record instead of from its summary alone.
impl Drop for Board {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.dir.disable_cleanup(true);
            eprintln!(
                "the failed run's board and witness logs are kept in {}",
                self.dir.path().display()
            );
        }
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
    /// A Redis URL; `redlock=` and comma-separated URLs; or `sentinel=`,
    /// the master's name, `@` and comma-separated sentinel URLs.
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
    /// The client's `replica_acks`, when any.
    pub replica_acks: Option<u32>,
    /// Each call's `wait`, when not the worker's 3 s.
    pub wait: Option<Duration>,
    /// The backend's own lease, when not the client's default: the
    /// ZooKeeper session timeout, or the etcd lease (whole seconds).
    pub lease: Option<Duration>,
}

/// What workers did: counted by each task, summed per process (printed as
/// one JSON line), and summed again over the processes of a run.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// Bodies that ran to their end.
    pub taken: u64,
    /// Bodies stopped because the lock was lost.
    pub lost: u64,
    /// Acquisitions that waited out their wait.
    pub timeouts: u64,
    /// Acquisitions (or `run()` calls) that failed otherwise (during faults).
    pub errors: u64,
    /// Releases that failed (the server was down: the lease ends by its ttl).
    pub release_errors: u64,
    /// The first such error's message.
    pub first_error: Option<String>,
    /// The worst lateness an assumption monitor saw.
    pub worst_late: Duration,
    /// The worst lateness a tick on a worker's tokio runtime saw
    /// ([`crate::monitor::RuntimeMonitor`]).
    pub worst_runtime_late: Duration,
}

impl Tally {
    /// Adds `other`'s counts; keeps the first error and the worst lateness.
    pub fn add(&mut self, other: Tally) {
        self.taken += other.taken;
        self.lost += other.lost;
        self.timeouts += other.timeouts;
        self.errors += other.errors;
        self.release_errors += other.release_errors;
        self.first_error = self.first_error.take().or(other.first_error);
        self.worst_late = self.worst_late.max(other.worst_late);
        self.worst_runtime_late = self.worst_runtime_late.max(other.worst_runtime_late);
    }

    /// The JSON line a worker prints.
    pub fn to_json(&self) -> String {
        serde_json::json!({
            "taken": self.taken,
            "lost": self.lost,
            "timeouts": self.timeouts,
            "errors": self.errors,
            "release_errors": self.release_errors,
            "first_error": self.first_error,
            "worst_late_us": u64::try_from(self.worst_late.as_micros()).unwrap_or(u64::MAX),
            "worst_runtime_late_us": u64::try_from(self.worst_runtime_late.as_micros()).unwrap_or(u64::MAX),
        })
        .to_string()
    }

    /// Reads a worker's line back.
    pub fn from_json(line: &str) -> Tally {
        let v: serde_json::Value = serde_json::from_str(line.trim()).expect("worker JSON line");
        let n = |field: &str| v[field].as_u64().unwrap_or(0);
        Tally {
            taken: n("taken"),
            lost: n("lost"),
            timeouts: n("timeouts"),
            errors: n("errors"),
            release_errors: n("release_errors"),
            first_error: v["first_error"].as_str().map(str::to_owned),
            worst_late: Duration::from_micros(n("worst_late_us")),
            worst_runtime_late: Duration::from_micros(n("worst_runtime_late_us")),
        }
    }
}

/// `lock-worker`, built next to the test binary (`target/<profile>/`; test
/// binaries live in its `deps/`).
pub fn worker_binary() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile = exe.parent().and_then(Path::parent).expect("target/<profile>");
    profile.join("lock-worker")
}

/// A `lock-worker` command. Its ZooKeeper sessions (on a `zookeeper=`
/// target) ask for [`crate::zookeeper::SESSION_TIMEOUT`], and its etcd
/// leases (on an `etcd=` target) for [`crate::etcd::LEASE_TTL`], so that a
/// stopped or killed worker's locks are let go within a test's patience.
pub fn worker_command() -> Command {
    let mut command = Command::new(worker_binary());
    command.env(
        "LOCK_WORKER_SESSION_TIMEOUT_MS",
        crate::zookeeper::SESSION_TIMEOUT.as_millis().to_string(),
    );
    command.env(
        "LOCK_WORKER_ETCD_LEASE_TTL_S",
        crate::etcd::LEASE_TTL.as_secs().to_string(),
    );
    command
}

/// Worker processes of one run; killed on drop if still running.
#[derive(Debug)]
pub struct Workers {
    children: Vec<Child>,
}

impl Workers {
    /// Starts `processes` workers on `board`.
    pub fn spawn(board: &Board, workload: &Workload, processes: usize) -> Workers {
        Self::spawn_each(board, &vec![workload.clone(); processes])
    }

    /// Starts one worker per workload on `board`.
    pub fn spawn_each(board: &Board, workloads: &[Workload]) -> Workers {
        let children = workloads.iter().map(|w| spawn_worker(board, w)).collect();
        Workers { children }
    }

    /// Starts one more worker on `board` (a replacement for one killed).
    pub fn add(&mut self, board: &Board, workload: &Workload) -> nix::unistd::Pid {
        let child = spawn_worker(board, workload);
        let pid = pid_of(&child);
        self.children.push(child);
        pid
    }

    /// SIGKILLs the worker `pid` and reaps it: what it did is lost with it,
    /// and [`Workers::finish`] no longer waits for it.
    pub fn kill(&mut self, pid: nix::unistd::Pid) {
        let at = self
            .children
            .iter()
            .position(|c| pid_of(c) == pid)
            .expect("a worker of this run");
        let mut child = self.children.swap_remove(at);
        child.kill().expect("SIGKILL the worker");
        child.wait().expect("reap the worker");
    }

    /// The workers' process ids.
    pub fn pids(&self) -> Vec<nix::unistd::Pid> {
        self.children.iter().map(pid_of).collect()
    }

    /// Ends the workers' runs before their time: each takes no new lock,
    /// ends the body it is in as usual, and reports ([`Workers::finish`]).
    pub fn stop(&mut self) {
        for child in &mut self.children {
            drop(child.stdin.take());
        }
    }

    /// Waits for every worker (to the end of its run's time, unless
    /// [`Workers::stop`] ended it) and sums what they said.
    pub fn finish(self) -> Tally {
        self.try_finish().unwrap_or_else(|failed| panic!("{failed}"))
    }

    /// [`Workers::finish`], for a run that judges a failed worker itself
    /// (one that could not connect to a server starved of CPU says nothing
    /// about the lock): the first worker that failed, as an error.
    pub fn try_finish(mut self) -> Result<Tally, String> {
        let mut total = Tally::default();
        let mut failed = None;
        for mut child in std::mem::take(&mut self.children) {
            // `wait_with_output` closes the standard input first, which
            // would end the run: keep it open until the worker is done.
            let _running = child.stdin.take();
            let output = child.wait_with_output().expect("worker output");
            if output.status.success() {
                total.add(Tally::from_json(&String::from_utf8_lossy(&output.stdout)));
            } else {
                failed.get_or_insert_with(|| format!("a worker failed: {:?}", output.status));
            }
        }
        failed.map_or(Ok(total), Err)
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

fn pid_of(child: &Child) -> nix::unistd::Pid {
    nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid fits i32"))
}

fn spawn_worker(board: &Board, workload: &Workload) -> Child {
    let mut command = worker_command();
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
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    // Closing the worker's standard input ends its run (`stop`).
    command.env("LOCK_WORKER_STOP_ON_EOF", "1");
    command.env(
        "LOCK_WORKER_LONG_BODY_PERCENT",
        workload.long_body_percent.to_string(),
    );
    if let Some(timeout) = workload.command_timeout {
        command.env("LOCK_WORKER_COMMAND_TIMEOUT_MS", timeout.as_millis().to_string());
    }
    if let Some(acks) = workload.replica_acks {
        command.env("LOCK_WORKER_REPLICA_ACKS", acks.to_string());
    }
    if let Some(wait) = workload.wait {
        command.env("LOCK_WORKER_WAIT_MS", wait.as_millis().to_string());
    }
    ask_for_lease(&mut command, workload.lease);
    crate::server::spawn_owned(command).expect("spawn worker")
}

/// Has a `lock-worker` ask for `lease` as its ZooKeeper session or etcd
/// lease (it reads the one its target's backend has).
fn ask_for_lease(command: &mut Command, lease: Option<Duration>) {
    if let Some(lease) = lease {
        command.env("LOCK_WORKER_SESSION_TIMEOUT_MS", lease.as_millis().to_string());
        command.env("LOCK_WORKER_ETCD_LEASE_TTL_S", lease.as_secs().max(1).to_string());
    }
}

/// What the controller asks of the leader among a worker's candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TermRequest {
    /// Stop the whole process (SIGSTOP) inside the term, and write the
    /// term's epoch once continued. A stopped process is told nothing, so
    /// what it writes after its deadline is fenced by its epoch alone.
    Pause,
    /// Work on until the term is lost (a term cut off from its store must
    /// be, and be told so before its deadline).
    Hold,
}

/// The file whose presence asks the leader among worker `pid`'s
/// candidates for `request`: the controller creates it, the term that
/// takes the request removes it.
pub fn term_request(board: &Path, pid: u32, request: TermRequest) -> std::path::PathBuf {
    let name = match request {
        TermRequest::Pause => "pause",
        TermRequest::Hold => "hold",
    };
    board.join(format!("{name}-{pid}"))
}

/// The register each term of an election writes its epoch to without a
/// fence, beside the fenced one of the election's own name: the control
/// that must take a paused leader's late write.
pub fn unfenced_register(election: &str) -> String {
    format!("{election}:unfenced")
}

/// The port of a loopback target (`127.0.0.1:<port>`, its first).
pub fn port_of(target: &str) -> u16 {
    let after = target.split("127.0.0.1:").nth(1).expect("a loopback target");
    let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().expect("a port")
}

/// `target` reached through `port` (a proxy's) instead of its own.
pub fn through(target: &str, port: u16) -> String {
    target.replacen(
        &format!("127.0.0.1:{}", port_of(target)),
        &format!("127.0.0.1:{port}"),
        1,
    )
}

/// A client of `target`, in `lock-worker`'s notation: a Redis URL;
/// `redlock=` and comma-separated URLs; `cluster=` and comma-separated
/// node URLs; `sentinel=`, the master's name, `@`
/// and comma-separated sentinel URLs; a `mysql://` or `postgres://` URL;
/// `zookeeper=` and a connect string; `etcd=` and comma-separated
/// endpoints.
pub async fn connect(
    target: &str,
    builder: lock_runtime::LockClientBuilder,
) -> Result<lock_runtime::LockClient, lock_runtime::LockError> {
    if let Some(urls) = target.strip_prefix("redlock=") {
        return builder.redlock(urls.split(',')).await;
    }
    if let Some(urls) = target.strip_prefix("cluster=") {
        return builder.cluster(urls.split(',')).await;
    }
    if let Some((name, urls)) = target.strip_prefix("sentinel=").and_then(|t| t.split_once('@')) {
        return builder.sentinel(name, urls.split(',')).await;
    }
    if target.starts_with("mysql://") {
        return builder.mysql(target).await;
    }
    if target.starts_with("postgres://") {
        return builder.postgres(target).await;
    }
    if let Some(connect) = target.strip_prefix("zookeeper=") {
        return builder.zookeeper(connect).await;
    }
    if let Some(endpoints) = target.strip_prefix("etcd=") {
        let endpoints: Vec<&str> = endpoints.split(',').collect();
        return builder.etcd(&endpoints).await;
    }
    builder.connect(target).await
}

/// Runs `processes` workers to completion on `board`.
pub fn run(board: &Board, workload: &Workload, processes: usize) -> Tally {
    Workers::spawn(board, workload, processes).finish()
}

/// A `lock-worker hold` process that holds one lock until it is killed: a
/// holder the controller can stop, continue or kill like any process.
#[derive(Debug)]
pub struct Holder {
    child: Child,
}

impl Holder {
    /// Starts a holder of `key` on `url` with lease `ttl` (renewed by its
    /// watchdog when `renew`), and returns once it holds the lock.
    pub fn spawn(url: &str, key: &str, ttl: Duration, renew: bool) -> Holder {
        use std::io::{BufRead, BufReader};
        let mut command = worker_command();
        command
            .args([
                if renew { "hold-renewed" } else { "hold" },
                url,
                key,
                &ttl.as_millis().to_string(),
            ])
            .stdout(Stdio::piped());
        let mut child = crate::server::spawn_owned(command).expect("spawn holder");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("holder stdout"))
            .read_line(&mut line)
            .expect("holder output");
        assert_eq!(line.trim(), "HELD", "the holder did not get `{key}`");
        Holder { child }
    }

    /// Starts a candidate in `election` on `target` (in `lock-worker`'s
    /// notation) with lease `ttl`, asking for `lease` as its ZooKeeper
    /// session or etcd lease when given, and returns once it leads, with
    /// its term's epoch.
    pub fn lead(
        target: &str,
        election: &str,
        ttl: Duration,
        lease: Option<Duration>,
        value: &str,
    ) -> (Holder, u64) {
        use std::io::{BufRead, BufReader};
        let mut command = worker_command();
        command
            .args(["lead", target, election, &ttl.as_millis().to_string(), value])
            .stdout(Stdio::piped());
        ask_for_lease(&mut command, lease);
        let mut child = crate::server::spawn_owned(command).expect("spawn a leader");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("leader stdout"))
            .read_line(&mut line)
            .expect("leader output");
        let epoch = line
            .trim()
            .strip_prefix("ELECTED ")
            .and_then(|e| e.parse().ok())
            .unwrap_or_else(|| panic!("the candidate was not elected in `{election}`: {line:?}"));
        (Holder { child }, epoch)
    }

    /// The holder's process id.
    pub fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).expect("pid fits i32"))
    }

    /// SIGKILLs the holder and reaps it.
    pub fn kill(mut self) {
        self.reap();
    }

    fn reap(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(self.pid(), nix::sys::signal::Signal::SIGCONT);
        self.reap();
    }
}

/// Starts a renewed holder of `key`, SIGKILLs it `after` it got the lock,
/// and returns how long `locks` then waits for the lock (S1, S13).
pub async fn unavailable_after_holder_killed(
    url: &str,
    locks: &lock_runtime::LockClient,
    key: &str,
    ttl: Duration,
    after: Duration,
) -> Duration {
    let holder = Holder::spawn(url, key, ttl, true);
    tokio::time::sleep(after).await;
    holder.kill();
    let killed = std::time::Instant::now();
    let acquired = crate::spawn_waiter(locks, key)
        .await
        .expect("the dead holder's lock frees");
    acquired - killed
}

/// How a server stalls (scenarios S6–S8, and the campaigns' stalls).
#[derive(Debug, Clone, Copy)]
pub enum Stall {
    /// SIGSTOP of the redis-server process.
    Stop,
    /// `DEBUG SLEEP`: connections accepted, nothing answered.
    DebugSleep,
    /// `CLIENT PAUSE <ms> WRITE`.
    PauseWrite,
    /// `CLIENT PAUSE <ms> ALL`.
    PauseAll,
}

impl Stall {
    /// Its name in [`crate::witness::FAULTS`].
    pub fn fault(self) -> &'static str {
        match self {
            Stall::Stop => "server-sigstop",
            Stall::DebugSleep => "debug-sleep",
            Stall::PauseWrite | Stall::PauseAll => "client-pause",
        }
    }

    /// Stalls every server of `servers` at once for `length`; returns when
    /// the stall is over.
    pub async fn apply(self, servers: &[&crate::RedisServer], length: Duration) {
        match self {
            Stall::Stop => {
                servers.iter().for_each(|s| s.pause());
                tokio::time::sleep(length).await;
                servers.iter().for_each(|s| s.resume());
            }
            Stall::DebugSleep => {
                // On blocking threads: the caller's other tasks must keep
                // running while the admin connections wait.
                let sleepers: Vec<_> = servers
                    .iter()
                    .map(|s| {
                        let mut conn = s.sync_connection().expect("admin connection");
                        tokio::task::spawn_blocking(move || {
                            redis::cmd("DEBUG")
                                .arg("SLEEP")
                                .arg(length.as_secs_f64())
                                .query::<()>(&mut conn)
                        })
                    })
                    .collect();
                for sleeper in sleepers {
                    sleeper.await.expect("DEBUG SLEEP thread").expect("DEBUG SLEEP");
                }
            }
            Stall::PauseWrite | Stall::PauseAll => {
                let mode = if matches!(self, Stall::PauseWrite) {
                    "WRITE"
                } else {
                    "ALL"
                };
                for s in servers {
                    s.query::<()>(
                        redis::cmd("CLIENT")
                            .arg("PAUSE")
                            .arg(u64::try_from(length.as_millis()).unwrap_or(u64::MAX))
                            .arg(mode),
                    );
                }
                tokio::time::sleep(length).await;
            }
        }
    }
}

/// Three `lock-worker fence` processes take `key` on `url` 1,000 times in
/// all, each appending its token to the server's fence log under the lock;
/// returns once all three succeeded.
pub fn fence_from_three_processes(url: &str, key: &str) {
    let workers: Vec<_> = ["334", "333", "333"]
        .iter()
        .map(|n| {
            Command::new(worker_binary())
                .args(["fence", url, key, n])
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spawn worker")
        })
        .collect();
    for mut w in workers {
        assert!(w.wait().expect("worker exit").success(), "worker failed");
    }
}

/// The fence log, appended under the lock, is in the order the lock was
/// held: each token must be greater than the one before.
pub fn assert_strictly_increasing(log: &[u64]) {
    assert_eq!(log.len(), 1000);
    for pair in log.windows(2) {
        assert!(pair[0] < pair[1], "token {} followed by {}", pair[0], pair[1]);
    }
}

/// Starts `lock-worker act-until-lost` on `target` (a body that acts once
/// with its fencing token and stops itself), waits for it to stop, lets
/// `locks` take the lock over (the stopped holder's lease or session runs
/// out) and act, then continues the stopped process. Returns how many of
/// the stopped holder's acts landed after the takeover (the checker's
/// stale writes): a body must be dropped before it acts again, so 0.
pub async fn acts_after_a_takeover(
    target: &str,
    locks: &lock_runtime::LockClient,
    board: &Board,
    key: &str,
    ttl: Duration,
) -> u64 {
    use nix::sys::signal::{Signal, kill};
    use std::io::{BufRead, BufReader};
    let mut worker = worker_command()
        .args([
            "act-until-lost",
            target,
            &board.path().to_string_lossy(),
            key,
            &ttl.as_millis().to_string(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn worker");
    let mut out = BufReader::new(worker.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("worker output");
    let stale: u64 = line.trim().trim_start_matches("HELD ").parse().expect("token");
    let pid = nix::unistd::Pid::from_raw(i32::try_from(worker.id()).expect("pid"));
    let stopped = crate::eventually(Duration::from_secs(10), || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") T "))
    })
    .await;
    assert!(stopped.is_some(), "the holder did not stop itself");

    let guard = locks
        .lock(key)
        .fencing(true)
        .wait(Duration::from_secs(20))
        .acquire()
        .await
        .expect("the stopped holder's lease runs out");
    let fresh = guard.fencing_token().expect("token");
    assert!(fresh > stale, "token {fresh} after {stale}");
    let register = format!("{key}:acts");
    board.witness.write(&register, fresh, false);

    kill(pid, Signal::SIGCONT).expect("SIGCONT");
    line.clear();
    out.read_line(&mut line).expect("worker output");
    assert_eq!(
        line.trim(),
        "LOST",
        "the continued holder was not told its lease was lost"
    );
    assert!(worker.wait().expect("reap").success());
    assert!(guard.is_held());
    guard.release().await.expect("release");
    board.witness.seen(&register).stale_accepted
}
