//! Mutual exclusion, structural re-entry and waiting, against a real
//! `redis-server` started by the test, checked on the server itself (keys,
//! PTTLs, command counts). `behaviour.rs` runs the backend-neutral cases on
//! both backends.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError};
use lock_tests::{RedisServer, commands_between, eventually, increment_under_lock};

async fn client(server: &RedisServer) -> LockClient {
    LockClient::connect(&server.url()).await.expect("connect")
}

async fn data_conn(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("data connection")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_tasks_never_lose_an_update() {
    lock_tests::bounded("sixteen_tasks_never_lose_an_update", async move {
        let server = RedisServer::start();
        let locks = client(&server).await;
        assert_eq!(
            increment_under_lock(&locks, data_conn(&server).await, 16, 200).await,
            3200
        );
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_never_lose_an_update() {
    lock_tests::bounded("three_processes_never_lose_an_update", async move {
        let server = RedisServer::start();
        let workers: Vec<_> = (0..3)
            .map(|_| {
                Command::new(env!("CARGO_BIN_EXE_lock-worker"))
                    .args(["count", &server.url(), "shared", "counter", "200"])
                    .stderr(Stdio::inherit())
                    .spawn()
                    .expect("spawn worker")
            })
            .collect();
        for mut w in workers {
            assert!(w.wait().expect("worker exit").success(), "worker failed");
        }
        let total: u64 = server.query(redis::cmd("GET").arg("counter"));
        assert_eq!(total, 600);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentry_five_deep_costs_no_command_and_never_shortens() {
    lock_tests::bounded(
        "reentry_five_deep_costs_no_command_and_never_shortens",
        async move {
            let server = RedisServer::start();
            let locks = client(&server).await;
            let redis_key = "lock:{order:7}";

            async fn nest<'a>(
                locks: &'a LockClient,
                server: &'a RedisServer,
                depth: u32,
            ) -> Result<(), LockError> {
                if depth == 0 {
                    return Ok(());
                }
                // Each level asks for a shorter lease than the one it is nested in.
                let ttl = Duration::from_millis(1000 * u64::from(depth));
                Box::pin(locks.lock("order:7").ttl(ttl).run(async move {
                    assert_eq!(server.query::<i64>(redis::cmd("EXISTS").arg("lock:{order:7}")), 1);
                    nest(locks, server, depth - 1).await
                }))
                .await?
            }

            locks
                .lock("order:7")
                .ttl(Duration::from_secs(10))
                .run(async {
                    let pttl_before: i64 = server.query(redis::cmd("PTTL").arg(redis_key));
                    let before = server.command_calls();
                    nest(&locks, &server, 5).await.expect("nested");
                    let mut sent = commands_between(&before, &server.command_calls());
                    // The test's own probes, one per level:
                    assert_eq!(sent.remove("exists"), Some(5));
                    assert!(sent.is_empty(), "nested acquires sent {sent:?}");
                    let pttl_after: i64 = server.query(redis::cmd("PTTL").arg(redis_key));
                    assert!(
                        pttl_after > 9000 && pttl_after <= pttl_before,
                        "pttl {pttl_before} -> {pttl_after}"
                    );

                    // A nested call asking for a longer lease extends it.
                    locks
                        .lock("order:7")
                        .ttl(Duration::from_secs(60))
                        .run(async {})
                        .await
                        .expect("nested extend");
                    let pttl_extended: i64 = server.query(redis::cmd("PTTL").arg(redis_key));
                    assert!(pttl_extended > 50_000, "pttl after extension {pttl_extended}");
                    // ... and the outer lock is still held.
                    assert_eq!(server.query::<i64>(redis::cmd("EXISTS").arg(redis_key)), 1);
                })
                .await
                .expect("outer");
            assert_eq!(server.query::<i64>(redis::cmd("EXISTS").arg(redis_key)), 0);
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_gives_up_after_wait() {
    lock_tests::bounded("waiting_gives_up_after_wait", async move {
        let server = RedisServer::start();
        let locks = client(&server).await;
        let held = lock_tests::guard_from_another_task(&locks, "busy").await;
        let start = Instant::now();
        let err = locks
            .lock("busy")
            .wait(Duration::from_millis(200))
            .acquire()
            .await
            .expect_err("lock is held");
        let waited = start.elapsed();
        assert!(
            matches!(err, LockError::Timeout { ref key, no_expiry: false, .. } if key == "busy"),
            "{err}"
        );
        assert!(err.to_string().contains("`busy`"), "{err}");
        assert!(
            waited >= Duration::from_millis(200) && waited < Duration::from_millis(400),
            "waited {waited:?}"
        );
        // wait = 0 tries exactly once.
        let err = locks.lock("busy").acquire().await.expect_err("held");
        assert!(matches!(err, LockError::Timeout { .. }), "{err}");
        held.release().await.expect("release");
        locks
            .lock("busy")
            .acquire()
            .await
            .expect("free again")
            .release()
            .await
            .expect("release");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_frees_the_lock_at_its_ttl() {
    lock_tests::bounded("a_killed_holder_frees_the_lock_at_its_ttl", async move {
        let server = RedisServer::start();
        lock_tests::lab::Holder::spawn(&server.url(), "crashy", Duration::from_millis(700), false).kill();

        let locks = client(&server).await;
        let start = Instant::now();
        let guard = locks
            .lock("crashy")
            .wait(Duration::from_secs(5))
            .acquire()
            .await
            .expect("acquire after the dead holder's TTL");
        assert!(
            start.elapsed() < Duration::from_millis(1500),
            "took {:?}",
            start.elapsed()
        );
        guard.release().await.expect("release");
        assert!(
            eventually(Duration::from_millis(100), || server
                .query::<i64>(redis::cmd("EXISTS").arg("lock:{crashy}"))
                == 0)
            .await
            .is_some()
        );
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_follow_the_innermost_lock_through_reentry() {
    lock_tests::bounded(
        "fencing_tokens_follow_the_innermost_lock_through_reentry",
        async move {
            let server = RedisServer::start();
            let locks = client(&server).await;
            assert_eq!(lock_runtime::fencing_token(), None, "no lock held");
            let first = locks.lock("ledger").fencing(true).acquire().await.expect("first");
            let first_token = first.fencing_token().expect("token");
            first.release().await.expect("release");

            locks
                .lock("ledger")
                .fencing(true)
                .run(async {
                    let ledger = lock_runtime::fencing_token().expect("ledger token");
                    assert!(
                        ledger > first_token,
                        "tokens increase: {first_token} then {ledger}"
                    );
                    locks
                        .lock("audit")
                        .fencing(true)
                        .run(async {
                            let audit = lock_runtime::fencing_token().expect("audit token");
                            // Re-entering `ledger` makes it the innermost lock again.
                            let reentered = locks
                                .lock("ledger")
                                .run(async { lock_runtime::fencing_token() })
                                .await;
                            assert_eq!(reentered.expect("re-entry"), Some(ledger));
                            assert_eq!(lock_runtime::fencing_token(), Some(audit));
                        })
                        .await
                        .expect("audit");
                    assert_eq!(lock_runtime::fencing_token(), Some(ledger));
                })
                .await
                .expect("ledger");
        },
    )
    .await
}

/// A worker never outlives its test: one holding a lock forever gives up on
/// its own at its limit (here 300 ms instead of the suite's five minutes),
/// says so, and exits with code 70, so a test blocked on it fails instead
/// of hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_never_finishes_gives_up_at_its_limit() {
    lock_tests::bounded("a_worker_that_never_finishes_gives_up_at_its_limit", async move {
        let server = RedisServer::start();
        let mut command = Command::new(env!("CARGO_BIN_EXE_lock-worker"));
        command
            .args(["hold", &server.url(), "forever", "30000"])
            .env("LOCK_WORKER_LIMIT_MS", "300");
        let output =
            tokio::task::block_in_place(|| lock_tests::output_within_limit(&mut command, "lock-worker hold"));
        assert_eq!(output.status.code(), Some(70), "{output:?}");
        assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "HELD");
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("giving up"),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    })
    .await
}
