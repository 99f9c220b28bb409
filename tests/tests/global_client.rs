//! The process-wide client and `run_locked`, the attribute's one entry point.
//! One test, because the global client can be set only once per process.

use std::time::Duration;

use lock_runtime::__private::{LockSpec, run_locked};
use lock_runtime::{LockClient, LockError};
use lock_tests::RedisServer;

#[derive(Debug)]
enum ShopError {
    Lock(LockError),
}

impl From<LockError> for ShopError {
    fn from(e: LockError) -> Self {
        ShopError::Lock(e)
    }
}

static SPEC: LockSpec = LockSpec::DEFAULT
    .ttl(Duration::from_secs(5))
    .wait(Duration::from_millis(100));

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_locked_uses_the_global_client() {
    lock_tests::bounded("run_locked_uses_the_global_client", async move {
        let before_init: Result<u32, ShopError> = run_locked(&SPEC, "stock:1".into(), async { Ok(1) }).await;
        match before_init {
            Err(ShopError::Lock(e @ LockError::NotInitialized)) => {
                assert!(
                    e.to_string().contains("lock_runtime::init("),
                    "message must say how to fix it: {e}"
                );
            }
            other => panic!("expected NotInitialized, got {other:?}"),
        }

        let server = RedisServer::start();
        lock_runtime::init(LockClient::connect(&server.url()).await.expect("connect")).expect("first init");
        let again = lock_runtime::init(LockClient::connect(&server.url()).await.expect("connect"));
        assert!(matches!(again, Err(LockError::AlreadyInitialized)), "{again:?}");

        let out: Result<u32, ShopError> = run_locked(&SPEC, "stock:1".into(), async {
            let pttl: i64 = server.query(redis::cmd("PTTL").arg("lock:{stock:1}"));
            assert!(pttl > 4000 && pttl <= 5000, "spec ttl not applied: {pttl}");
            // Nested on the same key: re-entry, not a timeout.
            run_locked(&SPEC, "stock:1".into(), async { Ok::<_, ShopError>(41) })
                .await
                .map(|n| n + 1)
        })
        .await;
        assert_eq!(out.expect("locked run"), 42);
        assert_eq!(server.query::<i64>(redis::cmd("EXISTS").arg("lock:{stock:1}")), 0);

        let bad: Result<(), ShopError> = run_locked(&SPEC, "a\nb".into(), async { Ok(()) }).await;
        assert!(
            matches!(bad, Err(ShopError::Lock(LockError::InvalidKey { .. }))),
            "{bad:?}"
        );
    })
    .await
}
