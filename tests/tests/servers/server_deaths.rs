//! DESIGN §11 on Redis and MariaDB: a server SIGKILLed and started again on
//! its port and data under a locking load costs the load's calls time,
//! never an error, and no two bodies ever overlap. (ZooKeeper's members
//! die in turn in `zookeeper.rs`; Sentinel failover is scenario P2s of the
//! fault suite.) Also: a body whose release meets a dead server still
//! hands back its result.

use std::time::Duration;

use lock_runtime::LockClient;
use lock_tests::load::LockingLoad;
use lock_tests::secrets::capture_tracing;
use lock_tests::{MariaDb, RedisServer};

/// How many bodies must run after each fault: enough that every load task
/// went through the restart.
const BODIES_AFTER: usize = 20;

/// Two restarts, each followed by more bodies.
async fn restart_twice_under_load(load: &LockingLoad, mut restart: impl FnMut()) {
    assert!(
        load.more_bodies(BODIES_AFTER, Duration::from_secs(60)).await,
        "no bodies ran on a healthy server"
    );
    for round in 1..=2 {
        tokio::task::block_in_place(&mut restart);
        assert!(
            load.more_bodies(BODIES_AFTER, Duration::from_secs(60)).await,
            "no bodies ran after restart {round}"
        );
    }
}

/// Two clients' load on `server`, restarted twice under it: the bodies
/// run and the longest pause between two of a task's bodies.
async fn redis_restarted_twice_under_load(server: &mut RedisServer) -> (usize, Duration) {
    let clients = [
        LockClient::connect(&server.url()).await.expect("connect"),
        LockClient::connect(&server.url()).await.expect("connect"),
    ];
    let load = LockingLoad::start(&clients, 2, "busy");
    restart_twice_under_load(&load, || server.restart()).await;
    load.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_killed_and_restarted_under_load_costs_time_not_errors() {
    lock_tests::bounded(
        "a_redis_killed_and_restarted_under_load_costs_time_not_errors",
        async move {
            // Every write on disk before it is acknowledged (assumption A3):
            // a restart keeps the locks it had, so it cannot let a second
            // holder in.
            let mut server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
            let (runs, longest_gap) = redis_restarted_twice_under_load(&mut server).await;
            eprintln!("redis: {runs} bodies, longest pause {longest_gap:?} across two restarts");
        },
    )
    .await
}

/// A Redis restarted with a dataset to load answers `LOADING` to every
/// lock script until it is in memory: the load's calls meet that answer,
/// try again within their `wait` as after a transport error, and none
/// fails (issue 57, item 3). The retried attempts' errors are read from
/// the runtime's traces, so the test fails if no call met the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_loading_its_data_after_a_restart_costs_time_not_errors() {
    lock_tests::bounded(
        "a_redis_loading_its_data_after_a_restart_costs_time_not_errors",
        async move {
            let (captured, _tracing) = capture_tracing();
            let mut server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
            // A million and a half keys in the append-only file's base, which
            // a restart loads before it serves (about a second here).
            server.query::<String>(redis::cmd("DEBUG").arg("POPULATE").arg(1_500_000));
            server.query::<String>(&mut redis::cmd("BGREWRITEAOF"));
            let rewritten = lock_tests::eventually(Duration::from_secs(60), || {
                let info: String = server.query(redis::cmd("INFO").arg("persistence"));
                info.contains("aof_rewrite_in_progress:0") && info.contains("aof_rewrite_scheduled:0")
            })
            .await;
            assert!(rewritten.is_some(), "the append-only file was not rewritten in 60 s");
            let (runs, longest_gap) = redis_restarted_twice_under_load(&mut server).await;
            let traces = captured.text();
            let met_loading = traces
                .lines()
                .filter(|l| l.contains("trying again within the wait") && l.contains("is loading the dataset"))
                .count();
            eprintln!(
                "redis loading: {runs} bodies, longest pause {longest_gap:?}, {met_loading} attempts met LOADING"
            );
            assert!(met_loading > 0, "no call met the server loading its data");
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mariadb_killed_and_restarted_under_load_costs_time_not_errors() {
    lock_tests::bounded(
        "a_mariadb_killed_and_restarted_under_load_costs_time_not_errors",
        async move {
            let mut server = MariaDb::start();
            let clients = [
                LockClient::mysql(&server.url()).await.expect("connect"),
                LockClient::mysql(&server.url()).await.expect("connect"),
            ];
            let load = LockingLoad::start(&clients, 2, "busy");
            restart_twice_under_load(&load, || {
                server.kill();
                server.revive();
            })
            .await;
            let (runs, longest_gap) = load.finish().await;
            eprintln!("mariadb: {runs} bodies, longest pause {longest_gap:?} across two restarts");
        },
    )
    .await
}

/// The body ran; the server died before its release: the body's result is
/// the call's result (the lease ends by its ttl), on both backends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_the_dead_server_never_got_still_returns_the_bodys_result() {
    lock_tests::bounded(
        "a_release_the_dead_server_never_got_still_returns_the_bodys_result",
        async move {
            let mut redis = RedisServer::start();
            let mut mariadb = MariaDb::start();
            let clients = [
                LockClient::builder()
                    .command_timeout(Duration::from_millis(500))
                    .connect(&redis.url())
                    .await
                    .expect("connect"),
                LockClient::builder()
                    .command_timeout(Duration::from_millis(500))
                    .mysql(&mariadb.url())
                    .await
                    .expect("connect"),
            ];
            let mut kills: [&mut dyn FnMut(); 2] = [&mut || redis.kill(), &mut || mariadb.kill()];
            for (locks, kill) in clients.iter().zip(kills.iter_mut()) {
                let result = locks
                    .lock("dying")
                    .run(async {
                        tokio::task::block_in_place(&mut *kill);
                        42
                    })
                    .await;
                assert_eq!(result.expect("the body's result, not the release's error"), 42);
            }
        },
    )
    .await
}
