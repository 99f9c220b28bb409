//! #57: a client started before its server, or while the server is still
//! starting, waits for it (`startup_timeout`) and starts cleanly; a lock
//! call made meanwhile by a client that was already running waits within
//! its `wait`; a server that never becomes ready fails the start with an
//! error that says so and what it last answered.
//!
//! Each backend's server is killed and started again on its port and data
//! ten times. On even runs the new client starts right after the kill,
//! before the server is started again; on odd runs as soon as the port
//! accepts a connection (the test probes only the port, as a deployment's
//! health check would), while the server is still loading, recovering or
//! electing.

use std::future::Future;
use std::time::Duration;

use lock_runtime::{LockClient, LockClientBuilder, LockError};
use lock_tests::{Etcd, MariaDb, Postgres, RedisServer, ZooKeeper};

/// Restarts per backend.
const RUNS: usize = 10;

/// Long enough for any server here to restart on a loaded machine: the
/// start-up wait under test, not a bound the test measures.
const STARTUP: Duration = Duration::from_secs(60);

/// A server the test can kill and start again on its port and data.
trait Restartable: Send + 'static {
    fn kill(&mut self);
    /// Starts it again, returning once it serves.
    fn revive(&mut self);
    /// The port a client connects to.
    fn port(&self) -> u16;
}

/// `Restartable` for a server type with `kill`, `revive` and `port`, or
/// (`member 0`) for the first member of an ensemble or cluster type.
macro_rules! restartable {
    ($server:ty) => {
        impl Restartable for $server {
            fn kill(&mut self) {
                <$server>::kill(self);
            }
            fn revive(&mut self) {
                <$server>::revive(self);
            }
            fn port(&self) -> u16 {
                <$server>::port(self)
            }
        }
    };
    ($server:ty, member 0) => {
        impl Restartable for $server {
            fn kill(&mut self) {
                <$server>::kill(self, 0);
            }
            fn revive(&mut self) {
                <$server>::revive(self, 0);
            }
            fn port(&self) -> u16 {
                <$server>::port(self, 0)
            }
        }
    };
}
restartable!(RedisServer);
restartable!(MariaDb);
restartable!(Postgres);
restartable!(ZooKeeper, member 0);
restartable!(Etcd, member 0);

/// Whether something accepts connections on `port` now.
fn accepts(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(200),
    )
    .is_ok()
}

/// Kills and restarts `server` [`RUNS`] times. Each time a new client
/// (`start`) starts before the server or while it starts, and a client
/// that was running before the kill (`steady`) takes a lock with a `wait`
/// that spans the restart; both must succeed, and each new client must
/// take a lock. `at_port_open` runs when the port first accepts on odd
/// runs, before the new client starts (the Redis test looks for `LOADING`
/// there).
async fn starts_beside_its_server<S, F, Fut>(mut server: S, start: F, mut at_port_open: impl FnMut(u16))
where
    S: Restartable,
    F: Fn() -> Fut,
    Fut: Future<Output = Result<LockClient, LockError>> + Send + 'static,
{
    let steady = start().await.expect("the first client, with the server up");
    let port = server.port();
    for run in 0..RUNS {
        tokio::task::block_in_place(|| server.kill());
        let before = run % 2 == 0;
        let starting = if before {
            // The client starts before its server. (The port may accept a
            // moment longer: a killed postmaster's children hold its
            // listening socket until they notice and exit.)
            Some(tokio::spawn(start()))
        } else {
            None
        };
        let reviving = std::thread::spawn(move || {
            server.revive();
            server
        });
        let starting = match starting {
            Some(task) => task,
            None => {
                // A probe of the port, as a health check would do; then the
                // client, while the server may still be loading.
                tokio::task::block_in_place(|| {
                    let deadline = std::time::Instant::now() + STARTUP;
                    while !accepts(port) {
                        assert!(
                            std::time::Instant::now() < deadline,
                            "run {run}: the port never opened"
                        );
                        std::thread::sleep(Duration::from_millis(2));
                    }
                });
                at_port_open(port);
                tokio::spawn(start())
            }
        };
        // Meanwhile, a running client's call waits within its `wait`.
        steady
            .lock(format!("steady:{run}"))
            .wait(STARTUP)
            .run(async {})
            .await
            .unwrap_or_else(|e| panic!("run {run}: a call across the restart failed: {e}"));
        let locks = starting.await.expect("the starting task").unwrap_or_else(|e| {
            panic!(
                "run {run} (client started {}): {e}",
                if before {
                    "before the server"
                } else {
                    "as the port opened"
                }
            )
        });
        locks
            .lock(format!("new:{run}"))
            .run(async {})
            .await
            .unwrap_or_else(|e| panic!("run {run}: the new client's first lock: {e}"));
        server = tokio::task::block_in_place(|| reviving.join().expect("the server restarted"));
    }
}

fn builder() -> LockClientBuilder {
    LockClient::builder().startup_timeout(STARTUP)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_client_starts_beside_its_server_even_while_it_loads() {
    lock_tests::bounded(
        "a_redis_client_starts_beside_its_server_even_while_it_loads",
        async move {
            let server = RedisServer::start();
            // A dataset that takes a moment to load: a restart answers
            // `LOADING` to `PING` and to lock scripts until it is in memory.
            server.query::<String>(redis::cmd("DEBUG").arg("POPULATE").arg(1_500_000));
            server.query::<String>(&mut redis::cmd("SAVE"));
            let url = server.url();
            let mut loading_seen = 0;
            starts_beside_its_server(
                server,
                move || {
                    let url = url.clone();
                    async move { builder().connect(&url).await }
                },
                |port| {
                    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("url");
                    if let Ok(mut conn) = client.get_connection()
                        && let Err(e) = redis::cmd("PING").query::<String>(&mut conn)
                        && e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::BusyLoading)
                    {
                        loading_seen += 1;
                    }
                },
            )
            .await;
            // The runs met the window this test is about, not only a refused port.
            assert!(
                loading_seen > 0,
                "no run found the server loading as its port opened"
            );
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mariadb_client_starts_beside_its_server() {
    lock_tests::bounded("a_mariadb_client_starts_beside_its_server", async move {
        let server = MariaDb::start();
        let url = server.url();
        starts_beside_its_server(
            server,
            move || {
                let url = url.clone();
                async move { builder().mysql(&url).await }
            },
            |_| {},
        )
        .await;
    })
    .await
}

/// A PostgreSQL server killed with SIGKILL replays its write-ahead log on
/// restart (answering "the database system is starting up" meanwhile;
/// with this test's little data that window is short, and the test does
/// not ask to meet it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_client_starts_beside_its_server() {
    lock_tests::bounded("a_postgres_client_starts_beside_its_server", async move {
        let server = Postgres::start();
        let url = server.url();
        starts_beside_its_server(
            server,
            move || {
                let url = url.clone();
                async move { builder().postgres(&url).await }
            },
            |_| {},
        )
        .await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zookeeper_client_starts_beside_its_server() {
    lock_tests::bounded("a_zookeeper_client_starts_beside_its_server", async move {
        let server = ZooKeeper::start();
        let connect = server.connect_string();
        starts_beside_its_server(
            server,
            move || {
                let connect = connect.clone();
                async move {
                    builder()
                        .zookeeper_session_timeout(Duration::from_secs(20))
                        .zookeeper(&connect)
                        .await
                }
            },
            |_| {},
        )
        .await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_client_starts_beside_its_member() {
    lock_tests::bounded("an_etcd_client_starts_beside_its_member", async move {
        let server = Etcd::start();
        let endpoints = server.endpoints();
        starts_beside_its_server(
            server,
            move || {
                let endpoints = endpoints.clone();
                async move {
                    let endpoints: Vec<&str> = endpoints.iter().map(String::as_str).collect();
                    builder().etcd(&endpoints).await
                }
            },
            |_| {},
        )
        .await;
    })
    .await
}

/// A server that accepts connections and never answers: reachable, never
/// ready. Returns its port; it serves until the test ends.
fn silent_server() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    std::thread::spawn(move || {
        // Keeps every connection open, unanswered.
        let mut held = Vec::new();
        for stream in listener.incoming() {
            held.push(stream);
        }
    });
    port
}

/// What every backend says when its server never becomes ready: the node,
/// that it was not ready within the start-up timeout, and what the last
/// attempt saw.
fn assert_not_ready(backend: &str, result: Result<LockClient, LockError>, node: &str) {
    assert_not_ready_within(backend, result, node, "1500ms");
}

/// [`assert_not_ready`] with another start-up timeout, as the error writes it.
fn assert_not_ready_within(backend: &str, result: Result<LockClient, LockError>, node: &str, limit: &str) {
    let err = result
        .err()
        .unwrap_or_else(|| panic!("{backend}: started against a silent server"));
    let text = err.to_string();
    assert!(matches!(err, LockError::Backend { .. }), "{backend}: {err:?}");
    assert!(text.contains(node), "{backend}: names the server: {text}");
    assert!(
        text.contains(&format!("not ready within {limit}")),
        "{backend}: says it waited: {text}"
    );
    assert!(
        text.contains("last: "),
        "{backend}: says what it last saw: {text}"
    );
}

/// A server that accepts connections but never answers fails every
/// backend's start after `startup_timeout` (Sentinel's, Cluster's and
/// Redlock's too), with an error that says so.
/// The names carry each backend's, so that `./test.sh mysql` (and the
/// others) run it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_never_ready_fails_the_start_on_redis_mariadb_postgres_zookeeper_and_etcd() {
    lock_tests::bounded(
        "a_server_never_ready_fails_the_start_on_redis_mariadb_postgres_zookeeper_and_etcd",
        async move {
            let port = silent_server();
            let quick = || {
                LockClient::builder()
                    .command_timeout(Duration::from_millis(300))
                    .startup_timeout(Duration::from_millis(1500))
            };
            let node = format!("127.0.0.1:{port}");
            assert_not_ready("redis", quick().connect(&format!("redis://{node}/")).await, &node);
            assert_not_ready(
                "mariadb",
                quick().mysql(&format!("mysql://root@{node}/locks")).await,
                &node,
            );
            assert_not_ready(
                "postgres",
                quick()
                    .postgres(&format!("postgres://postgres@{node}/locks"))
                    .await,
                &node,
            );
            assert_not_ready(
                "zookeeper",
                quick()
                    .zookeeper_session_timeout(Duration::from_millis(500))
                    .zookeeper(&node)
                    .await,
                &node,
            );
            assert_not_ready("etcd", quick().etcd(&[&format!("http://{node}")]).await, &node);
            let url = format!("redis://{node}/");
            assert_not_ready(
                "sentinel",
                quick().sentinel("mymaster", [url.as_str()]).await,
                &node,
            );
            assert_not_ready("cluster", quick().cluster([url.as_str()]).await, &node);
            let others: Vec<String> = (0..2)
                .map(|_| format!("redis://127.0.0.1:{}/", silent_server()))
                .collect();
            let masters = [url.as_str(), others[0].as_str(), others[1].as_str()];
            // Each attempt tries the three masters one after another: room
            // for more than one attempt.
            let redlock = quick()
                .startup_timeout(Duration::from_secs(4))
                .redlock(masters)
                .await;
            assert!(
                redlock
                    .as_ref()
                    .err()
                    .is_some_and(|e| e.to_string().contains("only 0 of 3 masters answer")),
                "redlock: says why: {:?}",
                redlock.as_ref().err()
            );
            assert_not_ready_within("redlock", redlock, &node, "4s");
        },
    )
    .await
}
