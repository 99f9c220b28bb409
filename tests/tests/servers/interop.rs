//! Another library's lock on the same Redis key: redis-py's `Lock` (a
//! string with an expiry, `SET NX PX`, released by an owner-checked delete
//! that sends no notification). It is a holder like any other: waited for,
//! never written to; and the library's own locks keep redis-py out.
//!
//! redis-py comes from PyPI; the README's test command installs it.

use std::process::Stdio;
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError};
use lock_tests::RedisServer;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// Holds or tries a redis-py `Lock`, told what to do on stdin, and says
/// what happened on stdout, one word a line.
const PY_LOCK: &str = r#"
import sys, redis
url, name, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
lock = redis.Redis.from_url(url).lock(name, timeout=timeout)
for command in sys.stdin:
    command = command.strip()
    if command == "try":
        print("got" if lock.acquire(blocking=False) else "refused", flush=True)
    elif command == "release":
        lock.release()
        print("released", flush=True)
"#;

struct PyLock {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl PyLock {
    fn start(server: &RedisServer, redis_key: &str, timeout: Duration) -> PyLock {
        let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        let mut child = Command::new(&python)
            .args(["-c", PY_LOCK, &server.url(), redis_key])
            .arg(timeout.as_secs_f64().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {python}: {e}; the README's test command installs it"));
        let stdout = child.stdout.take().expect("piped stdout");
        PyLock {
            child,
            lines: BufReader::new(stdout).lines(),
        }
    }

    /// Sends `command` and returns redis-py's answer.
    async fn ask(&mut self, command: &str) -> String {
        let stdin = self.child.stdin.as_mut().expect("piped stdin");
        stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .expect("write to python");
        let answer = tokio::time::timeout(Duration::from_secs(20), self.lines.next_line()).await;
        match answer {
            Ok(Ok(Some(line))) => line,
            other => panic!("redis-py said nothing to `{command}` (is redis-py installed?): {other:?}"),
        }
    }
}

/// redis-py holds the key (10 s lease): the library waits instead of
/// failing with `KeyConflict`, leaves redis-py's value alone, and gets in
/// within one re-poll of redis-py's release, long before the lease ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_library_waits_for_a_redis_py_lock() {
    lock_tests::bounded("the_library_waits_for_a_redis_py_lock", async move {
        let server = RedisServer::start();
        let locks = LockClient::connect(&server.url()).await.expect("connect");
        let mut py = PyLock::start(&server, "lock:{stock:42}", Duration::from_secs(10));
        assert_eq!(py.ask("try").await, "got");
        let py_value: String = server.query(redis::cmd("GET").arg("lock:{stock:42}"));

        let waiter = locks.clone();
        let waiting = tokio::spawn(async move {
            waiter
                .lock("stock:42")
                .wait(Duration::from_secs(8))
                .run(async { Instant::now() })
                .await
        });
        // Long enough for several attempts and the subscription: a `KeyConflict`
        // would have ended the call by now.
        let waited_for = lock_tests::eventually(Duration::from_millis(600), || waiting.is_finished()).await;
        assert!(
            waited_for.is_none(),
            "the call ended while redis-py held the key: {:?}",
            waiting.await
        );
        let value_now: String = server.query(redis::cmd("GET").arg("lock:{stock:42}"));
        assert_eq!(value_now, py_value, "the waiter wrote to redis-py's lock");

        assert_eq!(py.ask("release").await, "released");
        let released_at = Instant::now();
        let entered_at = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the library got in after redis-py's release")
            .expect("join")
            .expect("waited, then got the lock");
        let after = entered_at.saturating_duration_since(released_at);
        // The waiter re-polls at least every 200 ms (no notification comes from
        // redis-py); far below the 10 s lease the waiter would otherwise sit out.
        assert!(
            after < Duration::from_secs(2),
            "got in {after:?} after the release"
        );
    })
    .await
}

/// A call that cannot wait (the default `wait = 0`) reports the key held:
/// a timeout, not a conflict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_py_lock_is_held_not_a_conflict() {
    lock_tests::bounded("a_redis_py_lock_is_held_not_a_conflict", async move {
        let server = RedisServer::start();
        let locks = LockClient::connect(&server.url()).await.expect("connect");
        let mut py = PyLock::start(&server, "lock:{report}", Duration::from_secs(10));
        assert_eq!(py.ask("try").await, "got");
        let err = locks
            .lock("report")
            .run(async {})
            .await
            .expect_err("held by redis-py");
        assert!(
            matches!(&err, LockError::Timeout { no_expiry: false, .. }),
            "{err}"
        );
        assert_eq!(py.ask("release").await, "released");
        locks.lock("report").run(async {}).await.expect("free");
    })
    .await
}

/// The reverse: while the library holds the key, redis-py cannot take it;
/// after the release it can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_cannot_take_a_key_the_library_holds() {
    lock_tests::bounded("redis_py_cannot_take_a_key_the_library_holds", async move {
        let server = RedisServer::start();
        let locks = LockClient::connect(&server.url()).await.expect("connect");
        let mut py = PyLock::start(&server, "lock:{stock:7}", Duration::from_secs(10));
        let guard = locks.lock("stock:7").acquire().await.expect("library holds");
        assert_eq!(py.ask("try").await, "refused");
        guard.release().await.expect("release");
        assert_eq!(py.ask("try").await, "got");
        assert_eq!(py.ask("release").await, "released");
    })
    .await
}
