//! What the `lockctl` tests share, whatever backend they run against.

use std::process::Output;
use std::time::Duration;

use lock_runtime::{LockClient, LockError, LostReason};
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
