//! Coalescing (README: "Throughput"): concurrent releases bound for one node
//! go out as one call while others are out; acquisitions are native `SET`s,
//! never coalesced; a lone caller's commands are sent at once; a release
//! abandoned while it queued still frees its lock. Against a real
//! `redis-server`, counted by the server (`INFO commandstats`, and its slow
//! log with a threshold of 0, which records every command with its
//! arguments).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures_util::future::join_all;
use futures_util::poll;
use lock_runtime::{LockClient, LockError, LockGuard};
use lock_tests::{RedisServer, commands_between};

async fn client(server: &RedisServer) -> LockClient {
    LockClient::connect(&server.url()).await.expect("connect")
}

/// Four pairs released at once, so that both release scripts are loaded
/// (two releases go alone, `release_one.lua`, and the others together,
/// `coalesced.lua`): no call after this meets NOSCRIPT, and every pair
/// after it costs the same.
async fn load_the_release_scripts(locks: &LockClient) {
    take_and_release_at_once(locks, "warm-up", 4, Duration::ZERO).await;
}

/// Takes `count` locks (`{prefix}:{i}`), each waiting up to `wait`, then
/// releases them all at once.
async fn take_and_release_at_once(locks: &LockClient, prefix: &str, count: usize, wait: Duration) {
    let leases: Vec<LockGuard> =
        join_all((0..count).map(|i| locks.lock(format!("{prefix}:{i}")).wait(wait).acquire()))
            .await
            .into_iter()
            .collect::<Result<_, _>>()
            .expect("acquired");
    for result in join_all(leases.into_iter().map(LockGuard::release)).await {
        result.expect("released");
    }
}

/// The guards of three locks, taken one after the other.
async fn three_locks(locks: &LockClient, keys: [&str; 3]) -> [LockGuard; 3] {
    let mut guards = Vec::new();
    for key in keys {
        guards.push(locks.lock(key).acquire().await.expect("acquired"));
    }
    <[LockGuard; 3]>::try_from(guards).expect("three guards")
}

/// A release started and not finished.
type Releasing = Pin<Box<dyn Future<Output = Result<(), LockError>> + Send>>;

/// Stops the server and starts the releases of `guards`: the first two are
/// sent and stay unanswered (every call slot of the connection is out),
/// and the third queues behind them for the next flush. The server stays
/// stopped: the caller resumes it.
async fn third_release_queued(server: &RedisServer, guards: [LockGuard; 3]) -> [Releasing; 3] {
    server.pause();
    let mut releases = guards.map(|guard| Box::pin(guard.release()) as Releasing);
    for release in &mut releases {
        assert!(poll!(release.as_mut()).is_pending());
    }
    releases
}

fn holder_of(server: &RedisServer, key: &str) -> Option<String> {
    server.query(redis::cmd("GET").arg(format!("lock:{{{key}}}")))
}

/// How many ops each logged coalesced call carried (a key and a channel
/// each; the log keeps a call's first 32 arguments, the count among them).
fn coalesced_calls(commands: &[Vec<String>]) -> Vec<usize> {
    commands
        .iter()
        .filter(|args| args.first().is_some_and(|c| c.eq_ignore_ascii_case("evalsha")))
        .filter(|args| args.iter().any(|a| a == "publish") || args.len() >= 32)
        .filter_map(|args| args.get(2)?.parse::<usize>().ok())
        .map(|keys| keys / 2)
        .collect()
}

#[tokio::test]
async fn concurrent_releases_go_out_as_one_call() {
    lock_tests::bounded("concurrent_releases_go_out_as_one_call", async {
        let server = RedisServer::start();
        let locks = client(&server).await;
        const TASKS: usize = 64;
        load_the_release_scripts(&locks).await;

        let before = server.command_calls();
        let leases: Vec<LockGuard> = join_all((0..TASKS).map(|i| locks.lock(format!("own:{i}")).acquire()))
            .await
            .into_iter()
            .collect::<Result<_, _>>()
            .expect("every uncontended lock is acquired");
        // Acquisitions stay native SETs, pipelined on the connection.
        let acquired = commands_between(&before, &server.command_calls());
        assert_eq!(acquired, [("set".to_owned(), TASKS as u64)].into());

        server.log_every_command();
        // All 64 start in one poll: the first two are sent alone, the other
        // 62 queue behind them and go out as one call.
        for result in join_all(leases.into_iter().map(LockGuard::release)).await {
            result.expect("released");
        }
        for i in 0..TASKS {
            assert_eq!(
                holder_of(&server, &format!("own:{i}")),
                None,
                "own:{i} is free again"
            );
        }
        let mut calls = coalesced_calls(&server.commands_logged());
        calls.sort_unstable();
        assert_eq!(
            calls,
            [1, 1, TASKS - 2],
            "three release calls of these many releases"
        );
    })
    .await;
}

#[tokio::test]
async fn a_lone_caller_sends_its_own_commands_at_once() {
    lock_tests::bounded("a_lone_caller_sends_its_own_commands_at_once", async {
        let server = RedisServer::start();
        let locks = client(&server).await;
        load_the_release_scripts(&locks).await;

        let before = server.command_calls();
        for _ in 0..20 {
            let lease = locks.lock("alone").acquire().await.expect("acquired");
            lease.release().await.expect("released");
        }
        let sent = commands_between(&before, &server.command_calls());
        // A native SET NX PX and the release script per pair: nothing waits
        // for company, nothing is wrapped in a coalesced call.
        // (The release script's own GET and DEL count too.)
        let expected = [("del", 20), ("evalsha", 20), ("get", 20), ("set", 20)];
        assert_eq!(sent, expected.map(|(c, n)| (c.to_owned(), n)).into());
    })
    .await;
}

#[tokio::test]
async fn a_release_abandoned_while_it_queued_still_frees_its_lock() {
    lock_tests::bounded(
        "a_release_abandoned_while_it_queued_still_frees_its_lock",
        async {
            let server = RedisServer::start();
            let locks = client(&server).await;
            // Loaded first, so that each release below is one call on the
            // wire (a script's first call is sent again after NOSCRIPT).
            load_the_release_scripts(&locks).await;
            let [first, second, abandoned] = three_locks(&locks, ["first", "second", "abandoned"]).await;

            server.log_every_command();
            // The third release queues behind two out, and its caller
            // stops waiting.
            let [first, second, abandoned] = third_release_queued(&server, [first, second, abandoned]).await;
            drop(abandoned);
            server.resume();

            let (first, second) = tokio::join!(first, second);
            first.expect("first released");
            second.expect("second released");
            // Its release was taken off the queue unsent; the lease's drop
            // guard sends it again.
            lock_tests::eventually(Duration::from_secs(5), || {
                holder_of(&server, "abandoned").is_none()
            })
            .await
            .expect("the abandoned release freed its lock");
            assert_eq!(holder_of(&server, "first"), None);
            assert_eq!(holder_of(&server, "second"), None);
            // Sent once, by the drop guard: the abandoned release left the
            // queue with its caller and was never put on the wire.
            let abandoned_key = "lock:{abandoned}";
            let sent = server
                .commands_logged()
                .iter()
                .filter(|args| args.first().is_some_and(|c| c.eq_ignore_ascii_case("evalsha")))
                .map(|args| args.iter().filter(|a| *a == abandoned_key).count())
                .sum::<usize>();
            assert_eq!(sent, 1, "releases of the abandoned lock on the wire");
        },
    )
    .await;
}

/// The stale-holder contract (`stale_holder.rs`) for a release that goes
/// out in a coalesced call: a holder whose lock another client has taken
/// meanwhile is told `NotHeld`, and the other's lock (holder and expiry)
/// is untouched. Fails with `coalesced.lua`'s owner check removed
/// (`tests/owner-conditions.py`, R11); a release sent alone is covered by
/// `stale_holder.rs` (R4).
#[tokio::test]
async fn a_stale_release_in_a_coalesced_call_leaves_the_other_holders_lock() {
    lock_tests::bounded(
        "a_stale_release_in_a_coalesced_call_leaves_the_other_holders_lock",
        async {
            let server = RedisServer::start();
            let locks = client(&server).await;
            load_the_release_scripts(&locks).await;
            let [first, second, stale] = three_locks(&locks, ["first", "second", "stale"]).await;
            let taken = server.take_as_rival("lock:{stale}", Duration::from_secs(20));

            server.log_every_command();
            // The stale release queues behind two out and goes in the flush
            // after them, as `coalesced.lua`.
            let [first, second, stale] = third_release_queued(&server, [first, second, stale]).await;
            server.resume();
            let (first, second, stale) = tokio::join!(first, second, stale);
            first.expect("first released");
            second.expect("second released");
            assert!(matches!(stale, Err(LockError::NotHeld { .. })), "{stale:?}");

            assert_eq!(
                server.rival_lock("lock:{stale}"),
                taken,
                "the other client's lock was changed"
            );
            let coalesced = redis::Script::new(include_str!(
                "../../../lock-runtime/src/backend/redis/scripts/coalesced.lua"
            ));
            let in_a_coalesced_call = server.commands_logged().iter().any(|args| {
                args.get(1).is_some_and(|sha| sha == coalesced.get_hash())
                    && args.iter().any(|a| a == "lock:{stale}")
            });
            assert!(
                in_a_coalesced_call,
                "the stale release was not sent in a coalesced call"
            );
        },
    )
    .await;
}

/// A client outlives the runtime that started its releases (a global
/// client, or one shared by tests that each build a runtime): releases
/// left mid-way when that runtime shut down must not keep the
/// connection's slots, or every later release would queue for good.
#[test]
fn releases_cut_off_by_a_runtime_shutdown_leave_the_client_usable() {
    let server = RedisServer::start();
    let first = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let locks = first.block_on(client(&server));
    let leases: Vec<LockGuard> = first.block_on(async {
        join_all((0..8).map(|i| locks.lock(format!("cut:{i}")).acquire()))
            .await
            .into_iter()
            .collect::<Result<_, _>>()
            .expect("acquired")
    });
    // With the server stopped, two releases are out and the rest queue;
    // then the runtime goes away with all of them.
    server.pause();
    first.block_on(async {
        for lease in leases {
            tokio::spawn(lease.release());
        }
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
    });
    drop(first);
    server.resume();

    let second = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    second.block_on(async {
        // A wait: the connection died with the first runtime, and the
        // client's reconnection (started by the first call that meets it
        // dead) can take longer than one immediate retry on a loaded
        // machine; what is tested is that releases go out again.
        let released = tokio::time::timeout(
            Duration::from_secs(10),
            take_and_release_at_once(&locks, "after", 8, Duration::from_secs(5)),
        )
        .await;
        assert!(
            released.is_ok(),
            "releases after the first runtime's shutdown never completed"
        );
    });
}
