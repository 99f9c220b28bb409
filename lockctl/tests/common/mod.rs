//! What the `lockctl` tests share, whatever backend they run against.

use std::process::Output;
use std::time::Duration;

use lock_runtime::{LockClient, LockError, LockMode, LostReason};
use serde_json::Value;

/// Every test waits on something; none may hang the suite.
pub(crate) const BOUND: Duration = Duration::from_secs(20);

/// The output of a successful run, as text.
pub(crate) fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "lockctl failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).expect("utf-8 output")
}

/// The JSON lines of a successful `--json` run.
pub(crate) fn json_lines(output: &Output) -> Vec<Value> {
    stdout(output)
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect()
}

/// The listed lock `key`.
pub(crate) fn find<'a>(locks: &'a [Value], key: &str) -> &'a Value {
    locks
        .iter()
        .find(|l| l["key"] == key)
        .unwrap_or_else(|| panic!("{key} not listed in {locks:?}"))
}

/// A body holding `key` (fenced, renewed every 200 ms) that never ends by
/// itself: only a forced unlock lets anyone else in. Returns its task and
/// its fencing token, once the body runs.
pub(crate) async fn stuck_holder(
    holder: LockClient,
    key: &'static str,
) -> (tokio::task::JoinHandle<Result<(), LockError>>, u64) {
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let running = tokio::spawn(async move {
        holder
            .lock(key)
            .ttl(Duration::from_millis(600))
            .fencing(true)
            .run(async move {
                let _ = started_tx.send(lock_runtime::fencing_token());
                std::future::pending::<()>().await;
            })
            .await
    });
    let token = tokio::time::timeout(BOUND, started_rx)
        .await
        .expect("the body started")
        .expect("sender kept")
        .expect("a token was asked for");
    (running, token)
}

/// Waits for a waiting task (one that takes a lock and gives it back) to
/// have had its turn.
pub(crate) async fn got_the_lock(task: tokio::task::JoinHandle<Result<(), LockError>>, what: &str) {
    tokio::time::timeout(BOUND, task)
        .await
        .expect(what)
        .expect("join")
        .expect("acquired and released");
}

/// Waits for the stuck holder's body to be stopped, `Lost` to a takeover.
pub(crate) async fn expect_taken_over(running: tokio::task::JoinHandle<Result<(), LockError>>) {
    let lost = tokio::time::timeout(BOUND, running)
        .await
        .expect("the holder's body was stopped")
        .expect("join");
    assert!(
        matches!(
            lost,
            Err(LockError::Lost {
                reason: LostReason::TakenOver,
                ..
            })
        ),
        "{lost:?}"
    );
}

/// A task waiting (up to a minute) for the fair lock `key`, releasing it
/// once it has it.
pub(crate) fn fair_waiter(
    locks: &LockClient,
    key: &'static str,
) -> tokio::task::JoinHandle<Result<(), LockError>> {
    let locks = locks.clone();
    tokio::spawn(async move {
        let guard = locks
            .lock(key)
            .fair(true)
            .wait(Duration::from_secs(60))
            .acquire()
            .await?;
        guard.release().await
    })
}

/// A stuck holder of `stuck-job` freed by `unlock --force` (and refused
/// without `--force`): its body is stopped, `other` then takes the lock
/// with a larger token, and a second forced unlock finds nothing to free.
/// `lockctl` runs the binary against the backend under test.
// The Redis file checks the release's announcement between these steps,
// and has a test of its own.
#[allow(dead_code)]
pub(crate) async fn a_stuck_holder_is_freed_by_force(
    holder: LockClient,
    other: &LockClient,
    lockctl: impl Fn(&[&str]) -> Output,
) {
    let (running, stuck_token) = stuck_holder(holder, "stuck-job").await;
    let refused = lockctl(&["unlock", "stuck-job"]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--force"));

    let forced = json_lines(&lockctl(&["--json", "unlock", "stuck-job", "--force"]));
    assert_eq!(forced[0]["freed"], true);
    expect_taken_over(running).await;
    let next = other
        .lock("stuck-job")
        .fencing(true)
        .wait(BOUND)
        .acquire()
        .await
        .expect("free after the forced unlock");
    let next_token = next.fencing_token().expect("a token was asked for");
    assert!(next_token > stuck_token, "{next_token} after {stuck_token}");
    next.release().await.expect("release");
    let again = json_lines(&lockctl(&["--json", "unlock", "stuck-job", "--force"]));
    assert_eq!(again[0]["freed"], false, "nothing left to free");
}

/// `lockctl <target> --json watch` while `locks` takes and gives back
/// `watched`: it prints `started`, then the acquisition (whose holder
/// `check_holder` is given while the lock is held), then the release.
pub(crate) async fn watch_prints_the_lock_coming_and_going(
    target: &[&str],
    locks: &LockClient,
    check_holder: impl FnOnce(&str),
) {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .args(target)
        .args(["--json", "watch", "--interval", "20ms"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start lockctl watch");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("piped")).lines();
    let mut next_event = async || -> Value {
        let line = tokio::time::timeout(BOUND, lines.next_line())
            .await
            .expect("an event within the bound")
            .expect("read")
            .expect("watch still running");
        serde_json::from_str(&line).expect("a JSON line")
    };

    assert_eq!(next_event().await["event"], "started");
    let guard = locks.lock("watched").acquire().await.expect("free");
    let acquired = next_event().await;
    assert_eq!(acquired["event"], "acquired");
    assert_eq!(acquired["key"], "watched");
    check_holder(acquired["holder"].as_str().unwrap_or_default());
    guard.release().await.expect("release");
    let released = next_event().await;
    assert_eq!(released["event"], "released");
    assert_eq!(released["key"], "watched");
    child.kill().await.expect("stop watch");
}

/// An election's term as `lockctl list` shows it, on a backend it reads:
/// the key `<name> (election)`, kind `election`, the leader's id (role
/// `leader`), the value it proclaimed, its epoch as the fence; inspected
/// by that key; gone from the list once the leader resigns.
pub(crate) async fn an_election_is_listed_with_its_leader(
    locks: &LockClient,
    lockctl: impl Fn(&[&str]) -> Output,
) {
    let election = locks.election("scheduler");
    let term = election.campaign("10.0.0.7:8080").await.expect("elected");
    let leader = election.leader().await.expect("read").expect("somebody leads");
    let listed = json_lines(&lockctl(&["--json", "list"]));
    let found = find(&listed, "scheduler (election)");
    assert_eq!(found["kind"], "election", "{found}");
    assert_eq!(found["value"], "10.0.0.7:8080", "{found}");
    assert_eq!(found["fence"], term.epoch(), "{found}");
    assert_eq!(found["holders"][0]["id"], leader.id.as_str(), "{found}");
    assert_eq!(found["holders"][0]["role"], "leader", "{found}");
    let narrowed = json_lines(&lockctl(&["--json", "list", "sched*"]));
    assert_eq!(narrowed.len(), 1, "{narrowed:?}");
    // Inspected by the key the listing shows.
    let inspected = json_lines(&lockctl(&["--json", "inspect", "scheduler (election)"]));
    assert_eq!(inspected[0]["held"], true, "{inspected:?}");
    let shown = find(
        inspected[0]["locks"].as_array().expect("the term's locks"),
        "scheduler (election)",
    );
    assert_eq!(shown["kind"], "election", "{shown}");
    assert_eq!(shown["value"], "10.0.0.7:8080", "{shown}");
    let table = stdout(&lockctl(&["list"]));
    assert!(
        table.contains("scheduler (election)") && table.contains("(leader: 10.0.0.7:8080)"),
        "{table}"
    );
    term.resign().await.expect("resign");
    let listed = json_lines(&lockctl(&["--json", "list"]));
    assert!(
        listed.iter().all(|l| l["key"] != "scheduler (election)"),
        "a resigned term is still listed: {listed:?}"
    );
}

/// How a password reaches `lockctl` other than in its arguments.
#[derive(Debug, Clone, Copy)]
pub(crate) enum PasswordFrom {
    /// `LOCKCTL_PASSWORD`.
    Environment,
    /// `--password-file`.
    File,
}

/// Runs `lockctl` with `args`, given `password` the way `from` says (the
/// file is written in `dir`). Its output never shows the password, whether
/// the run succeeds or not.
pub(crate) fn lockctl_with_password(
    args: &[&str],
    password: &str,
    from: PasswordFrom,
    dir: &std::path::Path,
) -> Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_lockctl"));
    command.args(args).env_remove("LOCKCTL_PASSWORD");
    match from {
        PasswordFrom::Environment => {
            command.env("LOCKCTL_PASSWORD", password);
        }
        PasswordFrom::File => {
            let file = dir.join("password");
            std::fs::write(&file, format!("{password}\n")).expect("write the password file");
            command.arg("--password-file").arg(&file);
        }
    }
    let output = lock_tests::output_within_limit(&mut command, &format!("lockctl {}", args.join(" ")));
    let shown = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let what = format!("lockctl {args:?}, password from {from:?}");
    lock_tests::secrets::assert_no_password(&what, &shown);
    // Whatever the password, not only the ones made with the markers.
    assert!(!shown.contains(password), "{what}: the password shows: {shown}");
    output
}

/// `args` with `password`, from the environment and from a file: the run
/// succeeds and lists `key`; with a wrong password it fails, saying
/// `refusal`. No run shows the password.
pub(crate) fn takes_the_password_and_refuses_a_wrong_one(
    args: &[&str],
    password: &str,
    key: &str,
    refusal: &str,
) {
    let dir = tempfile::tempdir().expect("a directory for the password file");
    for from in [PasswordFrom::Environment, PasswordFrom::File] {
        let listed = json_lines(&lockctl_with_password(args, password, from, dir.path()));
        find(&listed, key);
        let refused = lockctl_with_password(args, &format!("{password}-not"), from, dir.path());
        assert!(!refused.status.success(), "a wrong password was taken");
        let said = String::from_utf8_lossy(&refused.stderr);
        assert!(said.contains(refusal), "{said}");
    }
}

/// Every kind held through `locks` (a fenced lock, two readers, a permit,
/// a segment, a fair lock with one waiter, whom `in_line(n)` waits for),
/// listed and inspected by `lockctl` (the binary against the SQL backend
/// under test), with a glob narrowing the list; released, none is listed.
#[allow(dead_code)]
pub(crate) async fn every_kind_is_listed_and_inspected(
    locks: &LockClient,
    lockctl: impl Fn(&[&str]) -> Output,
    in_line: impl AsyncFn(usize),
) {
    let fenced = locks
        .lock("stock:1")
        .ttl(Duration::from_secs(30))
        .fencing(true)
        .acquire()
        .await
        .expect("free");
    let token = fenced.fencing_token().expect("a token was asked for");
    let readers = [
        locks
            .lock("catalog")
            .mode(LockMode::Read)
            .acquire()
            .await
            .expect("read"),
        locks
            .lock("catalog")
            .mode(LockMode::Read)
            .acquire()
            .await
            .expect("read"),
    ];
    let permit = locks.lock("pool").permits(3).acquire().await.expect("permit");
    let segment = locks
        .lock("counter")
        .segments(4)
        .acquire()
        .await
        .expect("segment");
    let fair = locks.lock("queue").fair(true).acquire().await.expect("free");
    let waiter = fair_waiter(locks, "queue");
    in_line(1).await;

    let listed = json_lines(&lockctl(&["--json", "list"]));
    let stock = find(&listed, "stock:1");
    assert_eq!(stock["kind"], "exclusive");
    assert_eq!(stock["fence"], token);
    let left = stock["holders"][0]["time_left_ms"].as_u64().expect("an expiry");
    assert!(left > 0 && left <= 30_000, "time left {left} ms of a 30 s lease");
    let catalog = find(&listed, "catalog");
    assert_eq!(catalog["kind"], "read-write");
    let roles: Vec<&Value> = catalog["holders"].as_array().into_iter().flatten().collect();
    assert_eq!(roles.len(), 2, "{catalog}");
    assert!(roles.iter().all(|h| h["role"] == "reader"), "{catalog}");
    assert_eq!(find(&listed, "pool")["kind"], "permits");
    let seg = format!("counter#{}", segment.segment().expect("a segment"));
    assert_eq!(find(&listed, &seg)["kind"], "segment");
    let queue = find(&listed, "queue");
    assert_eq!(queue["kind"], "fair");
    assert_eq!(queue["in_line"], 1);
    assert_eq!(queue["waiters"], true);
    assert_eq!(listed.len(), 5, "{listed:?}");

    // A glob narrows the list, with its `?` and `[…]`.
    let narrowed = json_lines(&lockctl(&["--json", "list", "st?ck:[0-9]"]));
    assert_eq!(narrowed.len(), 1, "{narrowed:?}");
    assert_eq!(narrowed[0]["key"], "stock:1");
    assert!(json_lines(&lockctl(&["--json", "list", "stock:[2-9]"])).is_empty());
    let unclosed = lockctl(&["list", "stock:[1"]);
    assert_eq!(unclosed.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&unclosed.stderr).contains("`[`"));

    let inspected = json_lines(&lockctl(&["--json", "inspect", "catalog"]));
    assert_eq!(inspected[0]["held"], true);
    assert_eq!(
        inspected[0]["locks"][0]["holders"].as_array().map(Vec::len),
        Some(2)
    );
    let free = json_lines(&lockctl(&["--json", "inspect", "nothing:here"]));
    assert_eq!(free[0]["held"], false);

    // Released locks leave the list; a fenced row kept for its
    // counter is not a lock.
    fenced.release().await.expect("release");
    let [a, b] = readers;
    a.release().await.expect("release");
    b.release().await.expect("release");
    permit.release().await.expect("release");
    segment.release().await.expect("release");
    fair.release().await.expect("release");
    got_the_lock(waiter, "the waiter got the lock").await;
    let listed = json_lines(&lockctl(&["--json", "list"]));
    assert!(listed.is_empty(), "{listed:?}");
}

/// `unlock --force` on a read-write lock frees every reader at once, so a
/// writer gets in; on a fair lock the line stays and its first waiter gets
/// the lock. `other` holds them; `in_line(n)` waits for `n` in line.
#[allow(dead_code)]
pub(crate) async fn shared_and_fair_locks_are_freed_by_force(
    other: &LockClient,
    lockctl: impl Fn(&[&str]) -> Output,
    in_line: impl AsyncFn(usize),
) {
    // A read-write lock loses every reader at once: a writer gets in.
    let reader = other
        .lock("catalog")
        .mode(LockMode::Read)
        .acquire()
        .await
        .expect("read");
    let forced = json_lines(&lockctl(&["--json", "unlock", "catalog", "--force"]));
    assert_eq!(forced[0]["freed"], true);
    let writer = other
        .lock("catalog")
        .mode(LockMode::Write)
        .wait(Duration::ZERO)
        .acquire()
        .await
        .expect("no reader left");
    writer.release().await.expect("release");
    assert!(matches!(reader.release().await, Err(LockError::NotHeld { .. })));

    // A fair lock's line stays: its first waiter gets the lock.
    let fair = other.lock("queue").fair(true).acquire().await.expect("free");
    let waiter = fair_waiter(other, "queue");
    in_line(1).await;
    let forced = json_lines(&lockctl(&["--json", "unlock", "queue", "--force"]));
    assert_eq!(forced[0]["freed"], true);
    got_the_lock(waiter, "the first in line got the lock").await;
    assert!(matches!(fair.release().await, Err(LockError::NotHeld { .. })));
}
