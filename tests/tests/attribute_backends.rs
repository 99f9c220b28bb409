//! `#[distributed_lock]` with the process-wide client on the in-process
//! backend, one `redis-server`, a Redis Cluster, a Redlock, a master
//! found through Redis Sentinel, PostgreSQL and etcd: every kind
//! the backend offers, the shop's oversell check and its fenced audit. The
//! global client is installed once per process, so each backend runs in a
//! process of its own: this binary again, running `one_backend` alone.
//! (MariaDB and ZooKeeper have their own binaries, which also look at
//! what the lock left on the server.)

use std::time::Duration;

use lock_runtime::LockClient;
use lock_tests::{Cluster, Etcd, Postgres, RedisServer, Replicated, start_masters};

mod shop;

/// The variable that tells `one_backend` which backend to run on.
const BACKEND: &str = "LOCK_ATTRIBUTE_BACKEND";

/// Runs `one_backend` on `backend` in a child process.
fn in_own_process(backend: &str) {
    let exe = std::env::current_exe().expect("this test binary");
    let output = lock_tests::output_within_limit(
        std::process::Command::new(exe)
            .args([
                "--exact",
                "one_backend",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(BACKEND, backend),
        backend,
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "the attribute on {backend} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn on_the_in_process_backend() {
    in_own_process("in_memory");
}

#[test]
fn on_one_redis_server() {
    in_own_process("redis");
}

#[test]
fn on_a_redis_cluster() {
    in_own_process("cluster");
}

#[test]
fn on_a_redlock() {
    in_own_process("redlock");
}

#[test]
fn through_redis_sentinel() {
    in_own_process("sentinel");
}

#[test]
fn on_postgresql() {
    in_own_process("postgres");
}

#[test]
fn on_etcd() {
    in_own_process("etcd");
}

#[test]
#[ignore = "run by the tests above, each in a process of its own"]
fn one_backend() {
    let backend = std::env::var(BACKEND).unwrap_or_else(|_| panic!("{BACKEND} is not set"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    // Kept alive until the end of the test.
    let mut servers: Vec<Box<dyn std::any::Any>> = Vec::new();
    runtime.block_on(lock_tests::bounded("one_backend", async {
        let client = match backend.as_str() {
            "in_memory" => LockClient::in_memory(),
            "redis" => {
                let server = RedisServer::start();
                let client = LockClient::connect(&server.url()).await.expect("connect");
                servers.push(Box::new(server));
                client
            }
            "cluster" => {
                let cluster = Cluster::start(3, 0);
                let client = LockClient::cluster(cluster.urls()).await.expect("cluster client");
                servers.push(Box::new(cluster));
                client
            }
            "redlock" => {
                let masters = start_masters(3);
                let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
                servers.push(Box::new(masters));
                LockClient::redlock(&urls).await.expect("redlock client")
            }
            "sentinel" => {
                let group = Replicated::start_named(1);
                let client = lock_tests::sentinel::client(&group).await;
                servers.push(Box::new(group));
                client
            }
            "postgres" => {
                let server = Postgres::start();
                let client = LockClient::postgres(&server.url()).await.expect("postgres client");
                servers.push(Box::new(server));
                client
            }
            "etcd" => {
                let server = Etcd::start();
                let client = lock_tests::etcd::client(&server).await;
                servers.push(Box::new(server));
                client
            }
            other => panic!("unknown backend `{other}`"),
        };
        lock_runtime::init(client.clone()).expect("installed once");
        let offers = match backend.as_str() {
            // A Redlock offers no permits, segments or fair locks.
            "redlock" => shop::Offers {
                read_write: true,
                permits_and_fair: false,
                segments: false,
            },
            _ => shop::Offers::ALL,
        };
        shop::kinds_through_the_attribute(&client, offers).await;
        let sold = shop::sell_120_orders_of_100().await;
        assert_eq!(sold, 100, "120 orders for 100 items: exactly 100 sold");
        let audit = tokio::time::timeout(Duration::from_secs(10), shop::audit(8))
            .await
            .expect("in time");
        if backend == "redlock" {
            // A Redlock has no fencing tokens, and says so.
            assert!(
                matches!(&audit, Err(lock_runtime::LockError::Unsupported { feature, .. }) if feature.contains("fencing")),
                "{audit:?}"
            );
        } else {
            assert!(audit.expect("lock").is_some_and(|t| t > 0), "a fencing token");
        }
    }));
}
