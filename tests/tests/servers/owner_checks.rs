//! A holder only ever touches its own lock, and re-entry only ever happens
//! on the lock this client took: each test here fails, by name, if one of
//! those checks is removed from the runtime or its scripts (issue #21's
//! surviving mutants).

use std::time::Duration;

use lock_runtime::{LockClient, LockError, LostReason};
use lock_tests::{RIVAL, RedisServer};

/// No test here may hang: every wait on the library is bounded.
const BOUND: Duration = Duration::from_secs(20);

fn pttl(server: &RedisServer, key: &str) -> i64 {
    server.query(redis::cmd("PTTL").arg(format!("lock:{{{key}}}")))
}

fn value(server: &RedisServer, key: &str) -> Option<String> {
    server.query(redis::cmd("GET").arg(format!("lock:{{{key}}}")))
}

/// Another holder takes the key, as after an expiry the holder missed.
fn take_over(server: &RedisServer, key: &str, lease_ms: u64) {
    server.take_as_rival(&format!("lock:{{{key}}}"), Duration::from_millis(lease_ms));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_never_renews_a_rivals_lock_and_reports_the_loss() {
    lock_tests::bounded(
        "the_watchdog_never_renews_a_rivals_lock_and_reports_the_loss",
        async move {
            let server = RedisServer::start();
            let locks = LockClient::connect(&server.url()).await.expect("connect");
            let body = async {
                take_over(&server, "taken", 20_000);
                std::future::pending::<()>().await;
            };
            // The next renewal is due within 500 ms (ttl/3); the lease itself
            // would only expire (`Expired`, not `TakenOver`) after 1.5 s.
            let run = locks.lock("taken").ttl(Duration::from_millis(1500)).run(body);
            let outcome = tokio::time::timeout(BOUND, run)
                .await
                .expect("the body was not cancelled: the renewal did not see the rival");
            assert!(
                matches!(
                    outcome,
                    Err(LockError::Lost {
                        reason: LostReason::TakenOver,
                        ..
                    })
                ),
                "{outcome:?}"
            );
            assert_eq!(value(&server, "taken").as_deref(), Some(RIVAL));
            let left = pttl(&server, "taken");
            assert!(
                left > 10_000,
                "the rival's 20 s lease was cut to {left} ms: the old holder's renewal touched it"
            );
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_call_asking_for_a_longer_lease_never_extends_a_rivals_lock() {
    lock_tests::bounded(
        "a_nested_call_asking_for_a_longer_lease_never_extends_a_rivals_lock",
        async move {
            let server = RedisServer::start();
            let locks = LockClient::connect(&server.url()).await.expect("connect");
            // No watchdog: only the nested call's extension talks to the server.
            let outer = locks
                .lock("nested-takeover")
                .ttl(Duration::from_secs(5))
                .renew(false)
                .run(async {
                    take_over(&server, "nested-takeover", 2_000);
                    locks
                        .lock("nested-takeover")
                        .ttl(Duration::from_secs(30))
                        .run(async { "the nested body ran on a lock the rival holds" })
                        .await
                });
            let nested = tokio::time::timeout(BOUND, outer)
                .await
                .expect("bounded")
                .expect("the outer lease is still trusted");
            assert!(
                matches!(
                    nested,
                    Err(LockError::Lost {
                        reason: LostReason::TakenOver,
                        ..
                    })
                ),
                "{nested:?}"
            );
            assert_eq!(value(&server, "nested-takeover").as_deref(), Some(RIVAL));
            let left = pttl(&server, "nested-takeover");
            assert!(
                left <= 2_000,
                "the rival's 2 s lease was extended to {left} ms by the old holder"
            );
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_on_another_client_inside_a_body_is_a_new_acquisition_not_a_reentry() {
    lock_tests::bounded(
        "a_call_on_another_client_inside_a_body_is_a_new_acquisition_not_a_reentry",
        async move {
            let server = RedisServer::start();
            let other_server = RedisServer::start();
            let first = LockClient::connect(&server.url()).await.expect("connect");
            let second_same = LockClient::connect(&server.url()).await.expect("connect");
            let second_elsewhere = LockClient::connect(&other_server.url()).await.expect("connect");
            let body = async {
                // The same key on the same Redis through another client: held by
                // the first client, so a try-once call times out.
                let same = second_same.lock("shared-name").run(async {}).await;
                // The same key on another Redis: a lock of its own, really taken.
                let elsewhere = second_elsewhere
                    .lock("shared-name")
                    .run(async { value(&other_server, "shared-name") })
                    .await;
                (same, elsewhere)
            };
            let (same, elsewhere) = tokio::time::timeout(BOUND, first.lock("shared-name").run(body))
                .await
                .expect("bounded")
                .expect("the first client holds its lock");
            assert!(
                matches!(same, Err(LockError::Timeout { .. })),
                "another client on the same server re-entered the first client's lock: {same:?}"
            );
            assert!(
                elsewhere.expect("free on the other server").is_some(),
                "the call on the other server held no lock there"
            );
        },
    )
    .await
}

/// `tests/owner-conditions.py` removes each owner condition and lease cap
/// and runs the test that must fail without it (on demand: each entry
/// rebuilds the runtime). Its `--check`, which builds nothing, runs here:
/// an entry whose condition was rewritten, or whose test was renamed, is
/// caught by the change that did it, not by the next person who runs the
/// list (nine entries had gone stale when #57 looked).
#[test]
fn the_mutant_list_names_code_and_tests_that_exist() {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("owner-conditions.py");
    let output = std::process::Command::new(&python)
        .arg(&script)
        .arg("--check")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {python}: {e}; the README's test command installs it"));
    assert!(
        output.status.success(),
        "{} --check:\n{}{}",
        script.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
