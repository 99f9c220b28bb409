//! Server faults and bad input: each
//! gets its specific outcome, never a panic, and nothing is lost.

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError};
use lock_tests::monitor::Monitor;
use lock_tests::{Proxy, RedisServer, commands_between, eventually, free_port};

async fn client(server: &RedisServer) -> LockClient {
    LockClient::connect(&server.url()).await.expect("connect")
}

/// Whether this process or a server it started waited long enough for a
/// CPU, while `monitor` ran, to make a 1 s command timeout prove nothing
/// (a quarter of it).
fn starved(monitor: &Monitor) -> bool {
    monitor.worst().max(monitor.children_worst()) > Duration::from_millis(250)
}

/// Judges round `round`, whose call failed with `e`: a failure while this
/// process or the server was starved (see [`starved`]) proves nothing and
/// the round is INVALID, provided the lock `key` is free again within 5 s
/// (a call that timed out is sent again, or given back); any other
/// failure fails the test.
async fn invalid_if_starved(round: usize, e: &LockError, monitor: &Monitor, server: &RedisServer, key: &str) {
    let (worst, server_worst) = (monitor.worst(), monitor.children_worst());
    assert!(
        starved(monitor),
        "round {round}: {e} (starved at most {worst:?}, the server {server_worst:?})"
    );
    eprintln!("round {round} INVALID: starved {worst:?}, the server {server_worst:?}: {e}");
    assert!(
        eventually(Duration::from_secs(5), || !exists(server, key))
            .await
            .is_some(),
        "round {round}: still held 5 s after a call that timed out"
    );
}

fn exists(server: &RedisServer, key: &str) -> bool {
    server.query::<i64>(redis::cmd("EXISTS").arg(key)) == 1
}

async fn lock_once(locks: &LockClient, key: &str) -> Result<(), LockError> {
    locks.lock(key).run(async {}).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_keys_are_refused_before_any_io() {
    lock_tests::bounded("bad_keys_are_refused_before_any_io", async move {
        let server = RedisServer::start();
        let locks = client(&server).await;
        locks.lock("warm-up").run(async {}).await.expect("valid key");
        let before = server.command_calls();
        for (key, says) in [
            ("", "empty"),
            ("   ", "empty"),
            ("line\nbreak", "\\n"),
            ("nul\0byte", "\\u{0}"),
            ("carriage\rreturn", "\\r"),
            ("{tagged}", "`{`"),
            ("half}", "`}`"),
        ] {
            let err = lock_once(&locks, key).await.expect_err(key);
            assert!(
                matches!(&err, LockError::InvalidKey { reason, .. } if reason.contains(says)),
                "{key:?}: {err}"
            );
            assert!(
                !err.to_string().contains('\n'),
                "message must stay on one line: {err}"
            );
        }
        let long = "k".repeat(1025);
        let err = lock_once(&locks, &long).await.expect_err("too long");
        assert!(
            matches!(&err, LockError::InvalidKey { reason, .. } if reason.contains("1025 bytes")),
            "{err}"
        );

        let sent = commands_between(&before, &server.command_calls());
        assert!(sent.is_empty(), "invalid keys reached the server: {sent:?}");
        lock_once(&locks, &"k".repeat(1024))
            .await
            .expect("1 KiB is allowed");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_that_leaves_no_time_to_work_is_refused() {
    lock_tests::bounded("a_ttl_that_leaves_no_time_to_work_is_refused", async move {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let err = locks
        .lock("blink")
        .ttl(Duration::from_millis(7))
        .acquire()
        .await
        .expect_err("no validity left");
    assert!(
        matches!(&err, LockError::InvalidRequest { key, reason } if key == "blink" && reason.contains("at least 8ms")),
        "{err}"
    );
    let guard = locks.lock("blink").ttl(Duration::from_millis(8)).acquire().await;
    // 8ms leaves 1ms to work in: taken, or refused as granted too late.
    assert!(
        !matches!(guard, Err(LockError::InvalidRequest { .. })),
        "{guard:?}"
    );
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_sockets_and_key_prefixes_work() {
    lock_tests::bounded("unix_sockets_and_key_prefixes_work", async move {
        let socket = tempfile::tempdir().expect("socket dir");
        let path = socket.path().join("redis.sock");
        let path = path.to_str().expect("utf-8 path");
        let server = RedisServer::start_with(&["--unixsocket", path, "--unixsocketperm", "700"]);
        let locks = LockClient::builder()
            .key_prefix("shop:")
            .connect(&format!("redis+unix://{path}"))
            .await
            .expect("connect over the socket");
        locks
            .lock("stock:1")
            .run(async {
                assert!(exists(&server, "shop:{stock:1}"));
            })
            .await
            .expect("lock over the socket");
        assert!(!exists(&server, "shop:{stock:1}"));
    })
    .await
}

#[tokio::test]
async fn bad_urls_are_config_errors_without_the_password() {
    lock_tests::bounded("bad_urls_are_config_errors_without_the_password", async move {
        for url in [
            "redis//app:hunter2@127.0.0.1",
            "redis://app:hunter2@127.0.0.1:99999",
            "ftp://app:hunter2@127.0.0.1",
            "",
        ] {
            let err = LockClient::connect(url).await.expect_err(url);
            assert!(matches!(err, LockError::InvalidConfig { .. }), "{url}: {err}");
            for text in [err.to_string(), format!("{err:?}")] {
                assert!(!text.contains("hunter2"), "{url}: password leaked in {text}");
            }
        }
        let err = LockClient::builder()
            .key_prefix("{app}:")
            .connect("redis://127.0.0.1/")
            .await
            .expect_err("braces in the prefix");
        assert!(
            matches!(&err, LockError::InvalidConfig { reason, .. } if reason.contains("brace")),
            "{err}"
        );
    })
    .await
}

#[tokio::test]
async fn an_unreachable_server_is_a_fast_error_naming_the_node() {
    lock_tests::bounded(
        "an_unreachable_server_is_a_fast_error_naming_the_node",
        async move {
            let port = free_port();
            let url = format!("redis://:hunter2@127.0.0.1:{port}/");
            let start = Instant::now();
            // Without a start-up wait (the default waits 10 s for a server
            // that may be starting: `startup::`'s tests).
            let err = LockClient::builder()
                .startup_timeout(Duration::ZERO)
                .connect(&url)
                .await
                .expect_err("nothing listens there");
            assert!(
                start.elapsed() < Duration::from_millis(500),
                "took {:?}",
                start.elapsed()
            );
            match &err {
                LockError::Backend { node, .. } => assert_eq!(node, &format!("127.0.0.1:{port}")),
                other => panic!("expected Backend, got {other}"),
            }
            assert!(!format!("{err} {err:?}").contains("hunter2"));
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_values_are_conflicts_and_stay_untouched() {
    lock_tests::bounded("foreign_values_are_conflicts_and_stay_untouched", async move {
    let server = RedisServer::start();
    let locks = client(&server).await;
    server.query::<i64>(redis::cmd("RPUSH").arg("lock:{queue}").arg("job-1"));
    server.query::<()>(redis::cmd("SET").arg("lock:{greeting}").arg("hello"));

    for (key, redis_key, found) in [
        ("queue", "lock:{queue}", "list"),
        ("greeting", "lock:{greeting}", "string"),
    ] {
        let start = Instant::now();
        let err = locks
            .lock(key)
            .wait(Duration::from_secs(5))
            .acquire()
            .await
            .expect_err("foreign value");
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "KeyConflict must not wait out `wait`"
        );
        assert!(
            matches!(&err, LockError::KeyConflict { key: k, redis_key: r, found_type } if k == key && r == redis_key && found_type == found),
            "{err}"
        );
    }
    assert_eq!(
        server.query::<Vec<String>>(redis::cmd("LRANGE").arg("lock:{queue}").arg(0).arg(-1)),
        ["job-1"]
    );
    assert_eq!(
        server.query::<String>(redis::cmd("GET").arg("lock:{greeting}")),
        "hello"
    );
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_key_without_expiry_is_reported_not_deleted() {
    lock_tests::bounded("a_lock_key_without_expiry_is_reported_not_deleted", async move {
        let server = RedisServer::start();
        let locks = client(&server).await;
        let stale_holder = format!("{}:1", "ab".repeat(16));
        server.query::<()>(redis::cmd("SET").arg("lock:{legacy}").arg(&stale_holder));
        let err = locks
            .lock("legacy")
            .wait(Duration::from_millis(50))
            .acquire()
            .await
            .expect_err("held forever");
        assert!(matches!(err, LockError::Timeout { no_expiry: true, .. }), "{err}");
        assert!(err.to_string().contains("no expiry"), "{err}");
        // A skipping call is told too: skipped, it would skip every run
        // for ever without a word.
        let skipped = locks.lock("legacy").try_run(async {}).await;
        assert!(
            matches!(skipped, Err(LockError::Timeout { no_expiry: true, .. })),
            "{skipped:?}"
        );
        assert_eq!(
            server.query::<String>(redis::cmd("GET").arg("lock:{legacy}")),
            stale_holder
        );
    })
    .await
}

#[tokio::test]
async fn the_acquire_script_validates_before_writing() {
    lock_tests::bounded("the_acquire_script_validates_before_writing", async move {
        let server = RedisServer::start();
        let script = script("acquire.lua");
        let holder = format!("{}:1", "ab".repeat(16));
        let mut conn = server.sync_connection().expect("connect");
        for (holder, ttl, fence, waiting, says) in [
            (holder.as_str(), "-5", "0", "0", "bad ttl"),
            (holder.as_str(), "0", "0", "0", "bad ttl"),
            (holder.as_str(), "1.5", "0", "0", "bad ttl"),
            (holder.as_str(), "soon", "1", "0", "bad ttl"),
            ("not a holder", "1000", "0", "0", "bad holder"),
            (holder.as_str(), "1000", "yes", "0", "bad fencing"),
            (holder.as_str(), "1000", "0", "maybe", "bad waiting"),
        ] {
            let err = redis::cmd("EVAL")
                .arg(&script)
                .arg(2)
                .arg("lock:{k}")
                .arg("lock:{k}:fence")
                .arg(holder)
                .arg(ttl)
                .arg(fence)
                .arg(waiting)
                .query::<redis::Value>(&mut conn)
                .expect_err("must be refused");
            assert!(err.to_string().contains(says), "{ttl}/{fence}: {err}");
            assert_eq!(
                server.query::<i64>(redis::cmd("EXISTS").arg("lock:{k}").arg("lock:{k}:fence")),
                0
            );
        }
    })
    .await
}

/// A script as the client builds it: the shared prelude, then the script.
fn script(name: &str) -> String {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../lock-runtime/src/backend/redis/scripts");
    let read = |file: &str| std::fs::read_to_string(dir.join(file)).expect("read the script");
    read("prelude.lua") + &read(name)
}

/// The shared-lock and segment scripts refuse bad arguments before their
/// first write too.
#[tokio::test]
async fn the_kind_scripts_validate_before_writing() {
    lock_tests::bounded("the_kind_scripts_validate_before_writing", async move {
        let server = RedisServer::start();
        let mut conn = server.sync_connection().expect("connect");
        let id = format!("{}:1", "ab".repeat(16));
        let (reader, permit) = (format!("r:{id}"), format!("p:{id}"));
        let shared = script("acquire_shared.lua");
        for (member, ttl, permits, claim, says) in [
            (reader.as_str(), "1000", "2", "2000", "bad holder"),
            (permit.as_str(), "1000", "0", "2000", "bad holder"),
            (id.as_str(), "1000", "0", "2000", "bad holder"),
            (reader.as_str(), "1000", "-1", "2000", "bad permit count"),
            (reader.as_str(), "1000", "1.5", "2000", "bad permit count"),
            (reader.as_str(), "0", "0", "2000", "bad ttl"),
            (reader.as_str(), "1000", "0", "never", "bad claim ttl"),
        ] {
            let err = redis::cmd("EVAL")
                .arg(&shared)
                .arg(2)
                .arg("lock:{k}")
                .arg("lock:{k}:fence")
                .arg(member)
                .arg(ttl)
                .arg("0")
                .arg("0")
                .arg(permits)
                .arg(claim)
                .query::<redis::Value>(&mut conn)
                .expect_err("must be refused");
            assert!(err.to_string().contains(says), "{member}/{permits}: {err}");
        }
        let segments = script("acquire_segment.lua");
        for (count, says) in [
            ("0", "bad segment count"),
            ("3", "bad segment count"),
            ("x", "bad segment count"),
        ] {
            let err = redis::cmd("EVAL")
                .arg(&segments)
                .arg(2)
                .arg("lock:{k}#0")
                .arg("lock:{k}#1")
                .arg(&id)
                .arg("1000")
                .arg("0")
                .arg("0")
                .arg(count)
                .query::<redis::Value>(&mut conn)
                .expect_err("must be refused");
            assert!(err.to_string().contains(says), "{count}: {err}");
        }
        let keys: i64 = server.query(&mut redis::cmd("DBSIZE"));
        assert_eq!(keys, 0, "a refused script wrote something");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_is_invisible() {
    lock_tests::bounded("script_flush_is_invisible", async move {
        let server = RedisServer::start();
        let locks = client(&server).await;
        for _ in 0..3 {
            lock_once(&locks, "flushed").await.expect("lock before flush");
            server.query::<()>(redis::cmd("SCRIPT").arg("FLUSH"));
            let guard = locks
                .lock("flushed")
                .acquire()
                .await
                .expect("acquire after flush");
            server.query::<()>(redis::cmd("SCRIPT").arg("FLUSH"));
            guard.release().await.expect("release after flush");
        }
        assert!(!exists(&server, "lock:{flushed}"));
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_is_reconnected() {
    lock_tests::bounded("a_restarted_server_is_reconnected", async move {
        let mut server = RedisServer::start();
        let locks = client(&server).await;
        lock_once(&locks, "restart").await.expect("before restart");
        server.restart();
        lock_once(&locks, "restart")
            .await
            .expect("first lock after restart");
        lock_once(&locks, "restart")
            .await
            .expect("second lock after restart");
    })
    .await
}

/// A lock taken with no wait after its connection broke and the client's
/// first new connection was closed at once: two broken connections in a row
/// are not a failed attempt (a server restart can leave the client both).
/// A round whose reconnection outlasted the 1 s command timeout while this
/// process or the server waited for a CPU (`.ci/run` saw one, `timed
/// out`, beside JVMs starting) proves nothing and is INVALID; the lock
/// its unanswered attempt may have taken is given back before the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_broken_connections_in_a_row_are_reconnected() {
    lock_tests::bounded("two_broken_connections_in_a_row_are_reconnected", async move {
        let server = RedisServer::start();
        let proxy = Proxy::start(server.port()).await;
        let locks = LockClient::connect(&proxy.url()).await.expect("connect");
        lock_once(&locks, "relinked").await.expect("before the cut");
        let mut starved_rounds = 0;
        for round in 0..10 {
            let monitor = Monitor::start();
            proxy.close_next(1);
            proxy.reset();
            if let Err(e) = lock_once(&locks, "relinked").await {
                invalid_if_starved(round, &e, &monitor, &server, "lock:{relinked}").await;
                starved_rounds += 1;
            }
        }
        assert!(starved_rounds < 10, "INVALID: every round was starved");
        assert!(!exists(&server, "lock:{relinked}"));
    })
    .await
}

/// A release whose connection broke while the body ran, and whose
/// client's first new connection was closed at once, is sent again rather
/// than left to the lock's ttl: the full test command once found the next
/// round of the test above refused with `timed out after 0ms`, the previous
/// round's lock still held after its release met the broken connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_two_broken_connections_is_sent_again() {
    lock_tests::bounded(
        "a_release_after_two_broken_connections_is_sent_again",
        async move {
            let server = RedisServer::start();
            let proxy = Proxy::start(server.port()).await;
            let locks = LockClient::connect(&proxy.url()).await.expect("connect");
            let mut starved_rounds = 0;
            for round in 0..10 {
                let monitor = Monitor::start();
                let guard = locks.lock("released").acquire().await.expect("free");
                proxy.close_next(1);
                proxy.reset();
                match guard.release().await {
                    Ok(()) => assert!(!exists(&server, "lock:{released}"), "round {round}: still held"),
                    // A release whose reconnection outlasted the 1 s
                    // command timeout because this process or the server
                    // waited for a CPU (a CPU-hog run of the test command
                    // saw it) proves nothing about the reconnection; it
                    // is still sent again, so the lock is free well
                    // before its 30 s ttl.
                    Err(e) => {
                        invalid_if_starved(round, &e, &monitor, &server, "lock:{released}").await;
                        starved_rounds += 1;
                    }
                }
            }
            assert!(starved_rounds < 10, "INVALID: every round was starved");
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_still_works_when_the_server_is_out_of_memory() {
    lock_tests::bounded(
        "release_still_works_when_the_server_is_out_of_memory",
        async move {
            let server = RedisServer::start_with(&["--maxmemory", "4mb", "--maxmemory-policy", "noeviction"]);
            let locks = client(&server).await;
            let guard = locks.lock("oom").acquire().await.expect("acquire before OOM");

            // Fill with large values, then small ones: a refused large write frees
            // its own buffer and can leave the server just under the limit.
            let mut conn = server.sync_connection().expect("connect");
            let mut i = 0;
            for size in [64 * 1024, 100] {
                let filler = "x".repeat(size);
                while redis::cmd("SET")
                    .arg(format!("filler:{i}"))
                    .arg(&filler)
                    .query::<()>(&mut conn)
                    .is_ok()
                {
                    i += 1;
                    assert!(i < 100_000, "maxmemory never reached");
                }
            }

            let start = Instant::now();
            let err = locks
                .lock("oom-other")
                .wait(Duration::from_secs(2))
                .acquire()
                .await
                .expect_err("acquire must fail under OOM");
            assert!(
                start.elapsed() < Duration::from_secs(1),
                "OOM must fail fast, took {:?}",
                start.elapsed()
            );
            assert!(
                matches!(&err, LockError::Backend { key: Some(k), .. } if k == "oom-other"),
                "{err}"
            );
            assert!(err.to_string().contains("OOM"), "{err}");

            guard.release().await.expect("release under OOM");
            assert!(!exists(&server, "lock:{oom}"));
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_dropped_in_flight_leaves_no_orphan() {
    lock_tests::bounded("an_acquire_dropped_in_flight_leaves_no_orphan", async move {
        let server = RedisServer::start();
        let locks = client(&server).await;
        locks.lock("warm-up").run(async {}).await.expect("scripts loaded");

        server.pause();
        let dropped =
            tokio::time::timeout(Duration::from_millis(150), locks.lock("in-flight").acquire()).await;
        assert!(
            dropped.is_err(),
            "the server is paused; the acquire cannot finish"
        );
        server.resume();

        // The acquire reaches the server when it resumes; the compensating
        // release must follow it on the same connection.
        let gone = eventually(Duration::from_secs(2), || !exists(&server, "lock:{in-flight}")).await;
        assert!(gone.is_some(), "orphan lock left behind");
        locks
            .lock("in-flight")
            .acquire()
            .await
            .expect("free")
            .release()
            .await
            .expect("release");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_that_times_out_on_a_stalled_server_leaves_no_orphan() {
    lock_tests::bounded(
        "an_acquire_that_times_out_on_a_stalled_server_leaves_no_orphan",
        async move {
            let server = RedisServer::start();
            let locks = LockClient::builder()
                .command_timeout(Duration::from_millis(100))
                .connect(&server.url())
                .await
                .expect("connect");
            locks.lock("warm-up").run(async {}).await.expect("scripts loaded");

            server.pause();
            let start = Instant::now();
            let err = locks
                .lock("stalled")
                .wait(Duration::from_millis(200))
                .acquire()
                .await
                .expect_err("paused server");
            let took = start.elapsed();
            server.resume();
            assert!(
                matches!(&err, LockError::Backend { key: Some(k), .. } if k == "stalled"),
                "{err}"
            );
            // wait + one attempt's timeout, with room for a loaded machine.
            assert!(took < Duration::from_millis(450), "took {took:?}");
            let gone = eventually(Duration::from_secs(2), || !exists(&server, "lock:{stalled}")).await;
            assert!(gone.is_some(), "orphan lock left behind");
        },
    )
    .await
}

/// Every timeout the builder takes is checked at both ends: an hour is
/// taken, a millisecond more or nothing at all is refused, naming the option.
#[tokio::test]
async fn builder_timeouts_are_checked_at_both_ends() {
    lock_tests::bounded("builder_timeouts_are_checked_at_both_ends", async move {
        type Set = fn(lock_runtime::LockClientBuilder, Duration) -> lock_runtime::LockClientBuilder;
        let options: [(&str, Set); 5] = [
            (
                "command timeout",
                lock_runtime::LockClientBuilder::command_timeout,
            ),
            ("node timeout", lock_runtime::LockClientBuilder::node_timeout),
            (
                "replica acknowledgement timeout",
                lock_runtime::LockClientBuilder::replica_ack_timeout,
            ),
            (
                "fair waiter timeout",
                lock_runtime::LockClientBuilder::fair_waiter_timeout,
            ),
            ("poll interval", lock_runtime::LockClientBuilder::poll_interval),
        ];
        let hour = Duration::from_secs(3600);
        for (what, set) in options {
            if let Err(e) = set(LockClient::builder(), hour).in_memory() {
                panic!("a {what} of 1h was refused: {e}");
            }
            for bad in [hour + Duration::from_millis(1), Duration::ZERO] {
                match set(LockClient::builder(), bad).in_memory() {
                    Err(LockError::InvalidConfig { reason, .. }) => {
                        assert!(reason.contains(what), "{what}: {reason}");
                    }
                    Err(other) => panic!("a {what} of {bad:?}: {other}"),
                    Ok(_) => panic!("a {what} of {bad:?} was taken"),
                }
            }
        }
    })
    .await
}
