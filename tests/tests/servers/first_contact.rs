//! What a new user meets first (issue: a password in an error, a panic on a
//! large wait, waiting on itself, a connect that did not check the
//! password, messages that did not say what happened), against real
//! `redis-server` processes.

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError, LostReason};
use lock_tests::secrets::{assert_no_password, assert_nothing_shown, capture_tracing, hostile_passwords};
use lock_tests::sentinel::{MASTER_NAME, Replicated};
use lock_tests::{LOCK_USER, RedisServer, percent_encode};
use rand::{Rng, SeedableRng};

/// Every constructor, with every hostile password written raw (so that many
/// URLs do not parse) and percent-encoded (so that they parse and the server
/// refuses them): no error's Display or Debug, no client's Debug and no
/// trace line shows any part of the password.
#[tokio::test]
async fn no_constructor_shows_a_password_of_any_printable_character() {
    lock_tests::bounded(
        "no_constructor_shows_a_password_of_any_printable_character",
        async move {
            let server = RedisServer::start_with_password("the-right-one");
            let port = server.port();
            let (captured, _tracing) = capture_tracing();
            let fast = || LockClient::builder().command_timeout(Duration::from_millis(500));
            for password in hostile_passwords() {
                for written in [password.clone(), percent_encode(&password)] {
                    let url = format!("redis://app:{written}@127.0.0.1:{port}/0");
                    let outcomes = [
                        ("connect", LockClient::connect(&url).await),
                        ("builder", fast().connect(&url).await),
                        ("prefix", fast().key_prefix("{bad}:").connect(&url).await),
                        ("redlock", fast().redlock([url.as_str(); 3]).await),
                        ("cluster", fast().cluster([url.as_str()]).await),
                        ("sentinel", fast().sentinel("mymaster", [url.as_str()]).await),
                        ("lazy", fast().lazy().connect(&url).await),
                    ];
                    for (constructor, outcome) in outcomes {
                        let what = format!("{constructor} with {written:?}");
                        match outcome {
                            Err(e) => assert_no_password(&what, &format!("{e} {e:?}")),
                            Ok(client) => {
                                assert_eq!(
                                    constructor, "lazy",
                                    "{what}: the server should refuse this password"
                                );
                                assert_no_password(&what, &format!("{client:?}"));
                                let e = client.lock("k").acquire().await.expect_err("refused credentials");
                                assert_no_password(&what, &format!("{e} {e:?}"));
                            }
                        }
                    }
                }
            }
            // A URL that does not parse whatever its password (a host
            // left open) says to percent-encode it, and shows no piece of it.
            let password = hostile_passwords().pop().expect("one of every character");
            let unparsed = format!("redis://app:{password}@[::1/0");
            let outcomes = [
                ("connect", fast().connect(&unparsed).await),
                ("redlock", fast().redlock([unparsed.as_str(); 3]).await),
                ("cluster", fast().cluster([unparsed.as_str()]).await),
                ("sentinel", fast().sentinel("mymaster", [unparsed.as_str()]).await),
            ];
            for (constructor, outcome) in outcomes {
                let Err(e) = outcome else {
                    panic!("{constructor}: an unparsable URL was taken");
                };
                assert_no_password(constructor, &format!("{e} {e:?}"));
                assert!(matches!(e, LockError::InvalidConfig { .. }), "{constructor}: {e}");
                assert!(e.to_string().contains("percent-encode"), "{constructor}: {e}");
            }
            assert_no_password("tracing output", &captured.text());
            assert!(
                !captured.text().is_empty(),
                "nothing was traced: the check above saw nothing"
            );
        },
    )
    .await
}

/// The happy path with the hardest password: connected clients and their
/// locks never show it either.
#[tokio::test]
async fn a_client_with_a_password_of_every_character_keeps_it_to_itself() {
    lock_tests::bounded(
        "a_client_with_a_password_of_every_character_keeps_it_to_itself",
        async move {
            let password = hostile_passwords()
                .pop()
                .expect("one password of every character");
            let masters: Vec<RedisServer> = (0..3)
                .map(|_| RedisServer::start_with_password(&password))
                .collect();
            let (captured, _tracing) = capture_tracing();
            let recorder = metrics_util::debugging::DebuggingRecorder::new();
            let _metrics = metrics::set_default_local_recorder(&recorder);
            let url = masters[0].url_with_password();
            let one = LockClient::connect(&url).await.expect("the right password");
            let urls: Vec<String> = masters.iter().map(RedisServer::url_with_password).collect();
            let redlock = LockClient::redlock(&urls)
                .await
                .expect("the right password on every master");
            let cluster = lock_tests::Cluster::start_with_password(3, &password);
            let clustered = LockClient::cluster(cluster.urls_with_password())
                .await
                .expect("the right password on every node");
            // A real cluster refuses a wrong password at start-up, by name.
            let wrong: Vec<String> = cluster
                .nodes
                .iter()
                .map(|node| {
                    format!(
                        "redis://:{}@127.0.0.1:{}/",
                        percent_encode(&format!("{password}-not")),
                        node.port()
                    )
                })
                .collect();
            let Err(e) = LockClient::cluster(&wrong).await else {
                panic!("a cluster took a wrong password");
            };
            assert_no_password("a wrong cluster password", &format!("{e} {e:?}"));
            assert!(matches!(e, LockError::InvalidConfig { .. }), "{e}");
            assert!(e.to_string().contains("credentials"), "{e}");
            for client in [&one, &redlock, &clustered] {
                let guard = client.lock("k").acquire().await.expect("lock");
                assert_no_password("guard", &format!("{guard:?}"));
                assert_no_password("client", &format!("{client:?}"));
                guard.release().await.expect("release");
            }
            assert_nothing_shown(&captured, &recorder.snapshotter());
        },
    )
    .await
}

/// The same on Sentinel: the lock user's password of every character, on
/// the sentinels and on the master the client is sent to, percent-encoded
/// or raw. Neither the
/// connected client, its lock, its traces and metric labels, nor the
/// refusal of a wrong password shows any piece of it.
#[tokio::test]
async fn a_sentinel_client_with_a_password_of_every_character_keeps_it_to_itself() {
    lock_tests::bounded(
        "a_sentinel_client_with_a_password_of_every_character_keeps_it_to_itself",
        async move {
            let password = hostile_passwords()
                .pop()
                .expect("one password of every character");
            let group = Replicated::start_named_with_lock_user_password(0, &password);
            let (captured, _tracing) = capture_tracing();
            let recorder = metrics_util::debugging::DebuggingRecorder::new();
            let _metrics = metrics::set_default_local_recorder(&recorder);
            let locks = LockClient::sentinel(MASTER_NAME, group.lock_user_sentinel_urls())
                .await
                .expect("the right password on the sentinels and the master");
            let guard = locks.lock("k").acquire().await.expect("lock");
            assert_eq!(
                group.master.query::<i64>(redis::cmd("EXISTS").arg("lock:{k}")),
                1,
                "the lock is on the master"
            );
            assert_no_password("guard", &format!("{guard:?}"));
            assert_no_password("client", &format!("{locks:?}"));
            guard.release().await.expect("release");
            // Written raw, as a user would paste it.
            let raw: Vec<String> = group
                .sentinel_ports()
                .iter()
                .map(|port| format!("redis://{LOCK_USER}:{password}@127.0.0.1:{port}/"))
                .collect();
            let pasted = LockClient::sentinel(MASTER_NAME, &raw)
                .await
                .expect("the right password, written raw");
            let guard = pasted.lock("k").acquire().await.expect("lock");
            assert_no_password("client", &format!("{pasted:?} {guard:?}"));
            guard.release().await.expect("release");
            let wrong: Vec<String> = group
                .lock_user_sentinel_urls()
                .iter()
                .map(|url| url.replacen("Wv3@", "Wv3-not@", 1))
                .collect();
            let Err(e) = LockClient::sentinel(MASTER_NAME, &wrong).await else {
                panic!("the sentinels took a wrong password");
            };
            assert_no_password("a wrong Sentinel password", &format!("{e} {e:?}"));
            assert!(matches!(e, LockError::InvalidConfig { .. }), "{e}");
            assert_nothing_shown(&captured, &recorder.snapshotter());
        },
    )
    .await
}

/// `connect` authenticates and pings: a wrong or missing password fails at
/// construction with a message about credentials, not at the first lock
/// with `NOAUTH`; a Redlock checks every master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn construction_fails_on_refused_credentials() {
    lock_tests::bounded("construction_fails_on_refused_credentials", async move {
    let masters: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_with_password("s3cret"))
        .collect();
    let plain = masters[0].url();
    let wrong = format!("redis://:wrong@127.0.0.1:{}/", masters[0].port());
    for url in [&plain, &wrong] {
        let err = LockClient::connect(url).await.expect_err(url);
        assert!(
            matches!(&err, LockError::InvalidConfig { reason, .. } if reason.contains("refused the credentials")),
            "{url}: {err}"
        );
    }
    // One master of three without its password is a configuration error,
    // not a master that happens to be down.
    let mut urls: Vec<String> = masters.iter().map(RedisServer::url_with_password).collect();
    urls[1] = masters[1].url();
    let err = LockClient::redlock(&urls).await.expect_err("one master refuses");
    assert!(
        matches!(&err, LockError::InvalidConfig { reason, .. } if reason.contains("refused the credentials")),
        "{err}"
    );
    // A cluster client's seeds are checked the same way.
    let err = LockClient::cluster([plain.as_str()]).await.expect_err("refused");
    assert!(matches!(&err, LockError::InvalidConfig { .. }), "{err}");

    let locks = LockClient::connect(&masters[0].url_with_password())
        .await
        .expect("right password");
    locks
        .lock("k")
        .run(async {})
        .await
        .expect("lock with the right password");
    })
    .await
}

/// `lazy()` starts while Redis is down; the first call that finds the server
/// up connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_client_starts_while_redis_is_down() {
    lock_tests::bounded("a_lazy_client_starts_while_redis_is_down", async move {
        let mut server = RedisServer::start();
        let masters: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
        let mut down: Vec<RedisServer> = masters;
        server.kill();
        for m in &mut down {
            m.kill();
        }
        let fast = || {
            LockClient::builder()
                .command_timeout(Duration::from_millis(300))
                .startup_timeout(Duration::from_millis(300))
        };
        let err = fast()
            .connect(&server.url())
            .await
            .expect_err("eager connect to a dead server");
        assert!(matches!(err, LockError::Backend { .. }), "{err}");
        assert!(
            err.to_string().contains("not ready within 300ms"),
            "waited for: {err}"
        );

        let one = fast()
            .lazy()
            .connect(&server.url())
            .await
            .expect("lazy: nothing sent");
        let urls: Vec<String> = down.iter().map(RedisServer::url).collect();
        let redlock = fast().lazy().redlock(&urls).await.expect("lazy: nothing sent");
        let err = one.lock("k").run(async {}).await.expect_err("still down");
        assert!(matches!(err, LockError::Backend { .. }), "{err}");
        let err = redlock.lock("k").run(async {}).await.expect_err("still down");
        assert!(matches!(err, LockError::QuorumNotReached { .. }), "{err}");
        // A cluster client's seeds too: nothing is sent until the first call.
        let cluster = fast()
            .lazy()
            .cluster([server.url()])
            .await
            .expect("lazy: nothing sent");
        let err = cluster
            .lock("k")
            .run(async {})
            .await
            .expect_err("no cluster there");
        assert!(matches!(err, LockError::Backend { .. }), "{err}");
        let err = fast()
            .cluster([server.url()])
            .await
            .expect_err("eager: the seed is down");
        assert!(matches!(err, LockError::Backend { .. }), "{err}");

        server.revive();
        for m in &mut down {
            m.revive();
        }
        one.lock("k")
            .wait(Duration::from_secs(2))
            .run(async {})
            .await
            .expect("connects on use once the server is up");
        redlock
            .lock("k")
            .wait(Duration::from_secs(2))
            .run(async {})
            .await
            .expect("connects to the masters on use");
    })
    .await
}

async fn clients() -> (Vec<(&'static str, LockClient)>, RedisServer) {
    let server = RedisServer::start();
    let redis = LockClient::connect(&server.url()).await.expect("connect");
    (
        vec![("in-memory", LockClient::in_memory()), ("redis", redis)],
        server,
    )
}

/// A guard held by this task, then a second call for the same key in the
/// same task: it fails at once instead of waiting out its `wait`; released,
/// the key can be taken again; another task still waits as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_never_waits_on_itself() {
    lock_tests::bounded("a_guard_never_waits_on_itself", async move {
        let (clients, _server) = clients().await;
        for (backend, locks) in clients {
            let guard = locks.lock("self").acquire().await.expect("first guard");
            let started = Instant::now();
            let again = locks.lock("self").wait(Duration::from_secs(5)).acquire().await;
            assert!(
                matches!(&again, Err(LockError::WouldDeadlock { key }) if key == "self"),
                "{backend}: {again:?}"
            );
            let run = locks
                .lock("self")
                .wait(Duration::from_secs(5))
                .run(async {})
                .await;
            assert!(
                matches!(run, Err(LockError::WouldDeadlock { .. })),
                "{backend}: {run:?}"
            );
            assert!(
                started.elapsed() < Duration::from_secs(1),
                "{backend}: refused only after {:?}",
                started.elapsed()
            );
            // Another task is another holder: it waits, and gets in after the
            // release.
            let other = locks.clone();
            let rival = tokio::spawn(async move {
                other
                    .lock("self")
                    .wait(Duration::from_secs(5))
                    .run(async {})
                    .await
            });
            tokio::task::yield_now().await;
            guard.release().await.expect("release");
            tokio::time::timeout(Duration::from_secs(10), rival)
                .await
                .expect("the other task got in")
                .expect("join")
                .expect("the other task waits, it is not refused");
            let again = locks.lock("self").acquire().await.expect("free again");
            // Inside a body, a guard on a held key re-enters as before.
            let nested = locks
                .lock("outer")
                .run(async { locks.lock("outer").acquire().await.map(drop) })
                .await;
            assert!(matches!(nested, Ok(Ok(()))), "{backend}: {nested:?}");
            drop(again);
        }
    })
    .await
}

/// A dropped guard releases in the background, and from the drop on its
/// task no longer holds it: a call for the same key right after, in the same
/// task, waits for that release and gets the lock, rather than fail with
/// `WouldDeadlock` as if the guard were still held. On one thread, so that
/// the release task cannot run before the call looks.
#[tokio::test]
async fn a_dropped_guard_is_no_longer_held_by_its_task() {
    lock_tests::bounded("a_dropped_guard_is_no_longer_held_by_its_task", async move {
        let (clients, _server) = clients().await;
        for (backend, locks) in clients {
            for round in 0..3 {
                // The last round's guard was dropped too: waited for.
                let guard = locks
                    .lock("dropped")
                    .wait(Duration::from_secs(5))
                    .acquire()
                    .await
                    .expect("guard");
                drop(guard);
                let again = locks.lock("dropped").wait(Duration::from_secs(5)).acquire().await;
                assert!(again.is_ok(), "{backend}, round {round}: {again:?}");
            }
        }
    })
    .await
}

/// Any `Duration` for any option, from zero to `Duration::MAX`: never a
/// panic; a call's ttl outside 8ms..=24h is refused before any I/O with an
/// error that names the call; a `wait` of `Duration::MAX` waits until free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durations_of_any_size_never_panic() {
    lock_tests::bounded("durations_of_any_size_never_panic", async move {
        let (clients, server) = clients().await;
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x1e55);
        let mut any_duration = move || match rng.random_range(0..6) {
            0 => Duration::ZERO,
            1 => Duration::MAX,
            2 => Duration::from_nanos(rng.random()),
            3 => Duration::from_millis(rng.random_range(0..100_000_000)),
            4 => Duration::new(rng.random(), rng.random_range(0..1_000_000_000)),
            _ => Duration::from_millis(rng.random_range(0..100)),
        };
        let min = Duration::from_millis(8);
        let max = Duration::from_secs(24 * 3600);
        for (backend, locks) in &clients {
            for _ in 0..300 {
                let (ttl, wait) = (any_duration(), any_duration());
                let outcome = locks
                    .lock("any")
                    .ttl(ttl)
                    .wait(wait)
                    .renew(false)
                    .run(async {})
                    .await;
                match outcome {
                    Ok(()) => assert!(ttl >= min && ttl <= max, "{backend}: ttl {ttl:?} accepted"),
                    Err(LockError::InvalidRequest { key, reason }) => {
                        assert!(ttl < min || ttl > max, "{backend}: ttl {ttl:?} refused: {reason}");
                        assert_eq!(key, "any");
                        assert!(reason.contains("8ms") || reason.contains("24h"), "{reason}");
                    }
                    // A ttl of a few ms can be granted too late to be used.
                    Err(LockError::Backend { .. }) if ttl < Duration::from_millis(20) => {}
                    // So can a longer one on a busy machine (the tests run
                    // side by side): refusing it is right.
                    Err(LockError::Backend { source, .. })
                        if ttl < Duration::from_secs(1) && source.to_string().contains("past the") => {}
                    Err(other) => panic!("{backend}: ttl {ttl:?} wait {wait:?}: {other}"),
                }
            }
        }
        // Builder options: refused with a clear error or accepted, never a panic.
        let mut rng = rand::rngs::StdRng::seed_from_u64(0xb11d);
        for _ in 0..200 {
            let mut pick = || {
                [
                    Duration::ZERO,
                    Duration::MAX,
                    Duration::from_millis(rng.random_range(1..5_000)),
                ][rng.random_range(0..3)]
            };
            let builder = LockClient::builder()
                .default_ttl(pick())
                .default_wait(pick())
                .command_timeout(pick())
                .node_timeout(pick())
                .retry_backoff(pick(), pick());
            match builder.clone().in_memory() {
                Ok(locks) => {
                    let _ = locks.lock("b").run(async {}).await;
                }
                Err(e) => assert!(matches!(e, LockError::InvalidConfig { .. }), "{e}"),
            }
            if let Err(e) = builder.lazy().connect(&server.url()).await {
                assert!(matches!(e, LockError::InvalidConfig { .. }), "{e}");
            }
        }
        // `Duration::MAX` as the wait: the call waits for the holder's release.
        let locks = &clients[1].1;
        let guard = locks.lock("forever").acquire().await.expect("holder");
        let waiter = locks.clone();
        let waiting =
            tokio::spawn(async move { waiter.lock("forever").wait(Duration::MAX).run(async {}).await });
        lock_tests::until_waiting(&server, "forever").await;
        assert!(!waiting.is_finished(), "a wait of Duration::MAX gave up");
        guard.release().await.expect("release");
        tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the waiter got in after the release")
            .expect("join")
            .expect("waited until free");
    })
    .await
}

/// Messages say what happened: the configured wait, not the measured one;
/// a fixed lease that ran out is not a failed renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_say_what_happened() {
    lock_tests::bounded("messages_say_what_happened", async move {
        let (clients, _server) = clients().await;
        for (backend, locks) in clients {
            let guard = lock_tests::guard_from_another_task(&locks, "busy").await;
            let err = locks
                .lock("busy")
                .wait(Duration::from_millis(150))
                .run(async {})
                .await
                .expect_err("held");
            assert_eq!(
                err.to_string(),
                "timed out after 150ms waiting for lock `busy`",
                "{backend}"
            );
            guard.release().await.expect("release");

            let err = locks
                .lock("fixed")
                .ttl(Duration::from_millis(300))
                .wait(Duration::from_secs(5))
                .renew(false)
                .run(std::future::pending::<()>())
                .await
                .expect_err("the fixed lease ends");
            assert!(
                matches!(
                    err,
                    LockError::Lost {
                        reason: LostReason::LeaseEnded,
                        ..
                    }
                ),
                "{backend}: {err}"
            );
            assert!(err.to_string().contains("fixed lease"), "{backend}: {err}");
            assert!(!err.to_string().contains("renewal"), "{backend}: {err}");
        }
    })
    .await
}
