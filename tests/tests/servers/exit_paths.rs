//! The lock is released on every way out of the body.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{LockClient, LockError, LostReason};
use lock_tests::monitor::{self, Monitor};
use lock_tests::{Proxy, RedisServer, eventually};

const REDIS_KEY: &str = "lock:{exit}";

async fn setup() -> (RedisServer, LockClient) {
    let server = RedisServer::start();
    let locks = LockClient::connect(&server.url()).await.expect("connect");
    (server, locks)
}

fn held(server: &RedisServer) -> bool {
    server.query::<i64>(redis::cmd("EXISTS").arg(REDIS_KEY)) == 1
}

/// For the paths where the release is spawned rather than awaited.
async fn released_within_100ms(server: &RedisServer) {
    let gone = eventually(Duration::from_millis(100), || !held(server)).await;
    assert!(gone.is_some(), "lock still held 100ms after the body was dropped");
}

#[derive(Debug, PartialEq)]
enum AppError {
    Lock(String),
    Rejected,
}

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError::Lock(e.to_string())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ok_err_and_early_return_release_before_returning() {
    lock_tests::bounded("ok_err_and_early_return_release_before_returning", async move {
        let (server, locks) = setup().await;

        let ok: Result<u32, AppError> = locks
            .lock("exit")
            .run(async {
                assert!(held(&server));
                Ok(7)
            })
            .await
            .expect("lock");
        assert_eq!(ok, Ok(7));
        assert!(!held(&server), "not released after Ok");

        async fn fails() -> Result<u32, AppError> {
            Err(AppError::Rejected)
        }
        let question_mark: Result<u32, AppError> = locks
            .lock("exit")
            .run(async {
                let n = fails().await?;
                Ok(n + 1)
            })
            .await
            .expect("lock");
        assert_eq!(question_mark, Err(AppError::Rejected));
        assert!(!held(&server), "not released after ?");

        let early: u32 = locks
            .lock("exit")
            .run(async {
                for i in 0.. {
                    if i == 3 {
                        return i;
                    }
                }
                unreachable!()
            })
            .await
            .expect("lock");
        assert_eq!(early, 3);
        assert!(!held(&server), "not released after early return");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panic_releases_then_resumes_with_its_payload() {
    lock_tests::bounded("panic_releases_then_resumes_with_its_payload", async move {
        let (server, locks) = setup().await;
        let task = tokio::spawn(async move {
            locks
                .lock("exit")
                .run(async {
                    panic!("inventory corrupted");
                })
                .await
        });
        let err = task.await.expect_err("the panic must propagate");
        let payload = err.into_panic();
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"inventory corrupted"));
        assert!(!held(&server), "not released before the panic resumed");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_dropping_the_future_releases() {
    lock_tests::bounded("timeout_dropping_the_future_releases", async move {
        let (server, locks) = setup().await;
        let (entered_tx, entered_rx) = tokio::sync::oneshot::channel();
        let run = locks.lock("exit").run(async {
            let _ = entered_tx.send(());
            std::future::pending::<()>().await
        });
        let timed_out = tokio::time::timeout(Duration::from_millis(100), run).await;
        assert!(timed_out.is_err());
        entered_rx.await.expect("the body ran");
        released_within_100ms(&server).await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_select_branch_releases() {
    lock_tests::bounded("losing_select_branch_releases", async move {
        let (server, locks) = setup().await;
        let (entered_tx, entered_rx) = tokio::sync::oneshot::channel::<()>();
        tokio::select! {
            _ = locks.lock("exit").run(async {
                let _ = entered_tx.send(());
                std::future::pending::<()>().await
            }) => unreachable!(),
            _ = entered_rx => {}
        }
        released_within_100ms(&server).await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborted_task_releases() {
    lock_tests::bounded("aborted_task_releases", async move {
        let (server, locks) = setup().await;
        let (entered_tx, entered_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            locks
                .lock("exit")
                .run(async {
                    let _ = entered_tx.send(());
                    std::future::pending::<()>().await
                })
                .await
        });
        entered_rx.await.expect("the body ran");
        assert!(held(&server));
        task.abort();
        assert!(task.await.expect_err("aborted").is_cancelled());
        released_within_100ms(&server).await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_guard_releases() {
    lock_tests::bounded("dropped_guard_releases", async move {
        let (server, locks) = setup().await;
        let guard = locks.lock("exit").acquire().await.expect("acquire");
        assert!(guard.is_held());
        drop(guard);
        released_within_100ms(&server).await;
    })
    .await
}

/// With a fixed lease the body must be cancelled before the key can expire
/// on the server, so no second holder can ever overlap it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_outlives_a_fixed_lease_is_cancelled_before_expiry() {
    lock_tests::bounded(
        "a_body_that_outlives_a_fixed_lease_is_cancelled_before_expiry",
        async move {
            let (server, locks) = setup().await;

            struct OnDrop<'a> {
                server: &'a RedisServer,
                pttl_at_drop: Arc<Mutex<Option<i64>>>,
            }
            impl Drop for OnDrop<'_> {
                fn drop(&mut self) {
                    let pttl = self.server.query::<i64>(redis::cmd("PTTL").arg(REDIS_KEY));
                    *self.pttl_at_drop.lock().expect("not poisoned") = Some(pttl);
                }
            }

            // The body is cancelled within the lease's drift allowance of
            // its end: a process starved past that cannot be on time, and
            // such a run says nothing and is run again.
            let ttl = Duration::from_millis(300);
            for run in 1..=3 {
                let monitor = Monitor::start();
                let pttl_at_drop = Arc::new(Mutex::new(None));
                let witness = OnDrop {
                    server: &server,
                    pttl_at_drop: Arc::clone(&pttl_at_drop),
                };
                let err = locks
                    .lock("exit")
                    .ttl(ttl)
                    .renew(false)
                    .run(async move {
                        let _witness = witness;
                        std::future::pending::<()>().await
                    })
                    .await
                    .expect_err("lease runs out");
                assert!(
                    matches!(err, LockError::Lost { ref key, reason: LostReason::LeaseEnded } if key == "exit"),
                    "{err}"
                );
                let pttl = pttl_at_drop.lock().expect("not poisoned").expect("body dropped");
                if pttl > 0 {
                    return;
                }
                assert!(
                    monitor.worst() > monitor::bound(ttl) && run < 3,
                    "body dropped only after the server expired the key (PTTL {pttl}; starved at most {:?})",
                    monitor.worst()
                );
                eprintln!("run {run} INVALID: starved {:?}", monitor.worst());
            }
        },
    )
    .await
}

/// A release that gets no answer (its request lost with its connection)
/// is sent again until the server answers: the lock is free within
/// moments, not held to its 30 s ttl, and the caller hears that its
/// release failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_lost_on_its_way_is_sent_again() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let locks = LockClient::builder()
        .command_timeout(Duration::from_millis(200))
        .connect(&proxy.url())
        .await
        .expect("connect");
    let guard = locks
        .lock("exit")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .expect("free");
    proxy.blackhole();
    let unanswered = guard.release().await;
    assert!(unanswered.is_err(), "no answer came, yet: {unanswered:?}");
    // The held-back request goes with its connection.
    proxy.reset();
    proxy.pass();
    assert!(held(&server), "the lost release landed after all");
    let freed = eventually(Duration::from_secs(5), || !held(&server)).await;
    assert!(
        freed.is_some(),
        "the release was not sent again: the lock stays until its 30 s ttl"
    );
}
