//! Test support: real `redis-server` processes on free loopback ports, owned
//! by the test and killed when it ends (also when it panics).

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub mod lab;
pub mod monitor;
pub mod report;
pub mod witness;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// One `redis-server` child process.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    extra: Vec<String>,
}

/// The `redis-server` binary: `$REDIS_SERVER`, else the first on `PATH`,
/// else Debian's location. `.ci/run` installs it when it is missing.
pub fn redis_server_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("REDIS_SERVER") {
        return PathBuf::from(path);
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("redis-server"))
            .find(|candidate| candidate.is_file())
    });
    on_path.unwrap_or_else(|| PathBuf::from("/usr/bin/redis-server"))
}

impl RedisServer {
    /// Starts a fresh server without persistence.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Starts a fresh server with extra `--name value` arguments.
    pub fn start_with(extra: &[&str]) -> RedisServer {
        Self::start_on(free_port, extra)
    }

    /// Starts a fresh server that requires `password` (`--requirepass`).
    /// The harness's own connections authenticate; [`url`](Self::url) does
    /// not carry it, [`url_with_password`](Self::url_with_password) does.
    pub fn start_with_password(password: &str) -> RedisServer {
        Self::start_with(&["--requirepass", password])
    }

    /// Starts a server whose port comes from `pick`, retried while taken.
    fn start_on(pick: fn() -> u16, extra: &[&str]) -> RedisServer {
        // A port found free can be taken before redis binds it: retry.
        for _ in 0..20 {
            let mut server = RedisServer {
                child: None,
                port: pick(),
                dir: tempfile::tempdir().expect("temp dir for redis-server"),
                extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            };
            if server.spawn() {
                return server;
            }
        }
        panic!("could not start redis-server on any free port");
    }

    fn spawn(&mut self) -> bool {
        let port = self.port.to_string();
        let mut args: Vec<&str> = vec![
            "--port",
            &port,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--enable-debug-command",
            "local",
            "--daemonize",
            "no",
            "--logfile",
            "redis.log",
        ];
        args.extend(self.extra.iter().map(String::as_str));
        let mut command = Command::new(redis_server_binary());
        command
            .args(&args)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = spawn_owned(command).unwrap_or_else(|e| {
            panic!(
                "cannot run {}: {e}; install redis-server (apt-get install redis-server)",
                redis_server_binary().display()
            )
        });
        self.child = Some(child);
        self.wait_until_ready()
    }

    /// Waits until the server answers PING; false if it exited first.
    fn wait_until_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(_)) = child.try_wait()
            {
                return false;
            }
            if let Ok(mut conn) = self.sync_connection()
                && redis::cmd("PING").query::<String>(&mut conn).is_ok()
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The server's working directory (its log is `redis.log` there).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `redis://:<password>@127.0.0.1:<port>/` with the password
    /// percent-encoded, for a server started with a password.
    pub fn url_with_password(&self) -> String {
        let password = self.password().unwrap_or_default();
        format!("redis://:{}@127.0.0.1:{}/", percent_encode(password), self.port)
    }

    fn password(&self) -> Option<&str> {
        let at = self.extra.iter().position(|a| a == "--requirepass")?;
        self.extra.get(at + 1).map(String::as_str)
    }

    /// A plain blocking connection for inspecting the server from a test
    /// (authenticated when the server has a password).
    pub fn sync_connection(&self) -> redis::RedisResult<redis::Connection> {
        let client = redis::Client::open(self.url())?;
        let mut conn = client.get_connection_with_timeout(Duration::from_secs(2))?;
        if let Some(password) = self.password() {
            redis::cmd("AUTH").arg(password).query::<()>(&mut conn)?;
        }
        Ok(conn)
    }

    /// Runs one command and returns its reply; panics on failure (tests only).
    pub fn query<T: redis::FromRedisValue>(&self, cmd: &mut redis::Cmd) -> T {
        let mut conn = self.sync_connection().expect("connect to test redis");
        cmd.query(&mut conn).expect("query test redis")
    }

    /// The server's process id.
    pub fn pid(&self) -> Pid {
        let id = self.child.as_ref().expect("server is running").id();
        Pid::from_raw(i32::try_from(id).expect("pid fits i32"))
    }

    /// Freezes the server process (SIGSTOP): connections stay open, nothing
    /// is answered.
    pub fn pause(&self) {
        kill(self.pid(), Signal::SIGSTOP).expect("SIGSTOP redis-server");
    }

    /// Resumes a paused server (SIGCONT).
    pub fn resume(&self) {
        kill(self.pid(), Signal::SIGCONT).expect("SIGCONT redis-server");
    }

    /// Kills the server (SIGKILL) and restarts it on the same port with the
    /// same arguments: an empty dataset, unless the arguments persist it.
    pub fn restart(&mut self) {
        self.kill();
        self.revive();
    }

    /// Deletes what the server persisted (AOF and RDB files), so that the
    /// next start is empty whatever its arguments; call while it is killed.
    pub fn wipe_data(&self) {
        let _ = std::fs::remove_dir_all(self.dir.path().join("appendonlydir"));
        let _ = std::fs::remove_file(self.dir.path().join("dump.rdb"));
    }

    /// Starts a killed server again on its port with its arguments.
    pub fn revive(&mut self) {
        for _ in 0..100 {
            if self.spawn() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server did not come back on port {}", self.port);
    }

    /// Kills the server (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Calls per command from `INFO commandstats` (`evalsha`, `get`, ...),
    /// without `info` itself and the connection handshake (`hello`,
    /// `client|setinfo`, `ping`, `select`) that inspecting the server costs.
    pub fn command_calls(&self) -> BTreeMap<String, u64> {
        let info: String = self.query(redis::cmd("INFO").arg("commandstats"));
        info.lines()
            .filter_map(|l| l.strip_prefix("cmdstat_"))
            .filter_map(|l| {
                let (name, rest) = l.split_once(':')?;
                let calls = rest.strip_prefix("calls=")?.split(',').next()?.parse().ok()?;
                Some((name.to_owned(), calls))
            })
            .filter(|(name, _)| {
                !matches!(name.as_str(), "info" | "hello" | "ping" | "select") && !name.starts_with("client|")
            })
            .collect()
    }
}

/// The commands sent between two [`RedisServer::command_calls`] snapshots.
pub fn commands_between(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(name, n)| {
            let sent = n - before.get(name).copied().unwrap_or(0);
            (sent > 0).then(|| (name.clone(), sent))
        })
        .collect()
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_ref() {
            // A paused server ignores SIGKILL's cleanup until resumed.
            let _ = kill(
                Pid::from_raw(i32::try_from(child.id()).unwrap_or(0)),
                Signal::SIGCONT,
            );
        }
        self.kill();
    }
}

/// Spawns `command` so that the child dies with this process, even when the
/// process is killed: PR_SET_PDEATHSIG fires when the spawning *thread* ends,
/// and tokio's blocking threads end when idle, so every child is spawned
/// from one thread that lives as long as the process.
pub(crate) fn spawn_owned(mut command: Command) -> std::io::Result<Child> {
    type Request = (Command, std::sync::mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<std::sync::Mutex<std::sync::mpsc::Sender<Request>>> = OnceLock::new();
    die_with_parent(&mut command);
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("child-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("spawn the child-spawner thread");
        std::sync::Mutex::new(tx)
    });
    let (reply, child) = std::sync::mpsc::channel();
    spawner
        .lock()
        .expect("spawner")
        .send((command, reply))
        .expect("the spawner thread lives as long as the process");
    child.recv().expect("the spawner answers")
}

#[allow(unsafe_code)]
fn die_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs between fork and exec, where only
    // async-signal-safe calls are allowed; prctl(PR_SET_PDEATHSIG) is a plain
    // system call and allocates nothing.
    unsafe {
        command.pre_exec(|| nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from));
    }
}

/// The `redis-server` behind the process-wide client that
/// `#[distributed_lock]` functions use in tests: started once, on a thread
/// that lives as long as the process (so the server dies with the process).
pub fn install_global_client() -> &'static RedisServer {
    static GLOBAL: OnceLock<&'static RedisServer> = OnceLock::new();
    GLOBAL.get_or_init(|| {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("global-lock-client".into())
            .spawn(move || {
                let server: &'static RedisServer = Box::leak(Box::new(RedisServer::start()));
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime for the global client");
                runtime.block_on(async move {
                    let client = lock_runtime::LockClient::connect(&server.url())
                        .await
                        .expect("connect");
                    lock_runtime::init(client).expect("the global client is installed once");
                    ready_tx.send(server).expect("installer waits");
                    // Drive the client's connection for the rest of the process.
                    std::future::pending::<()>().await;
                });
            })
            .expect("spawn the global client thread");
        ready_rx.recv().expect("global client installed")
    })
}

/// A guard on `key` taken by another task, so that the calling task waits
/// for it like any other holder (in the task that took a guard, a second
/// call for the key fails at once with `WouldDeadlock`).
pub async fn guard_from_another_task(locks: &lock_runtime::LockClient, key: &str) -> lock_runtime::LockGuard {
    let (locks, key) = (locks.clone(), key.to_owned());
    tokio::spawn(async move { locks.lock(key).acquire().await })
        .await
        .expect("join the holder's task")
        .expect("the holder takes the lock")
}

/// Every byte but ASCII letters and digits as `%XX`: any password fits in a
/// URL's userinfo this way.
pub fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind an ephemeral port")
}

/// Polls `check` until it returns true or `timeout` passes; returns how long
/// it took, or `None` on timeout. For waiting on a state the test cannot be
/// signalled about (a key expiring on the server).
pub async fn eventually(timeout: Duration, mut check: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if check() {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    check().then(|| start.elapsed())
}

/// A TCP proxy in front of a server, for link faults without root:
/// `blackhole` keeps every socket open and forwards nothing (the client
/// sees a stalled server, not a reset); `half_open` delivers requests and drops
/// replies; `delay` holds every chunk back; `throttle` caps the byte rate;
/// `reset` closes every connection at once.
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    link: std::sync::Arc<Link>,
    task: tokio::task::JoinHandle<()>,
}

/// The proxy's mode, shared with its pumps.
#[derive(Debug, Default)]
struct Link {
    mode: std::sync::atomic::AtomicU8,
    /// Delay in µs (`DELAY`) or bytes per second (`THROTTLE`).
    parameter: std::sync::atomic::AtomicU64,
    pumps: std::sync::Mutex<Vec<tokio::task::AbortHandle>>,
}

const PASS: u8 = 0;
const BLACKHOLE: u8 = 1;
const HALF_OPEN: u8 = 2;
const DELAY: u8 = 3;
const THROTTLE: u8 = 4;

impl Proxy {
    /// Starts forwarding `127.0.0.1:<new port>` to `127.0.0.1:<target>`.
    pub async fn start(target: u16) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let link = std::sync::Arc::new(Link::default());
        let shared = std::sync::Arc::clone(&link);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                let requests = tokio::spawn(pump(
                    client_read,
                    server_write,
                    std::sync::Arc::clone(&shared),
                    Direction::Request,
                ));
                let replies = tokio::spawn(pump(
                    server_read,
                    client_write,
                    std::sync::Arc::clone(&shared),
                    Direction::Reply,
                ));
                let mut pumps = shared.pumps.lock().expect("pumps");
                pumps.retain(|p| !p.is_finished());
                pumps.extend([requests.abort_handle(), replies.abort_handle()]);
            }
        });
        Proxy { port, link, task }
    }

    /// `redis://127.0.0.1:<proxy port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn set(&self, mode: u8, parameter: u64) {
        use std::sync::atomic::Ordering;
        self.link.parameter.store(parameter, Ordering::SeqCst);
        self.link.mode.store(mode, Ordering::SeqCst);
    }

    /// Stops forwarding, both ways, on every connection.
    pub fn blackhole(&self) {
        self.set(BLACKHOLE, 0);
    }

    /// Requests go through; replies are dropped.
    pub fn half_open(&self) {
        self.set(HALF_OPEN, 0);
    }

    /// Every chunk, both ways, is forwarded `by` late.
    pub fn delay(&self, by: Duration) {
        self.set(DELAY, u64::try_from(by.as_micros()).unwrap_or(u64::MAX));
    }

    /// At most `bytes_per_second`, both ways.
    pub fn throttle(&self, bytes_per_second: u64) {
        self.set(THROTTLE, bytes_per_second.max(1));
    }

    /// Closes every open connection (both sides see the socket close); new
    /// connections are forwarded as before.
    pub fn reset(&self) {
        for pump in self.link.pumps.lock().expect("pumps").drain(..) {
            pump.abort();
        }
    }

    /// Forwards again; what a blackhole held back is delivered.
    pub fn pass(&self) {
        self.set(PASS, 0);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.reset();
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Direction {
    Request,
    Reply,
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    link: std::sync::Arc<Link>,
    direction: Direction,
) {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        while link.mode.load(Ordering::SeqCst) == BLACKHOLE {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let parameter = link.parameter.load(Ordering::SeqCst);
        match link.mode.load(Ordering::SeqCst) {
            HALF_OPEN if direction == Direction::Reply => continue,
            DELAY => tokio::time::sleep(Duration::from_micros(parameter)).await,
            THROTTLE => {
                let nanos = n as u64 * 1_000_000_000 / parameter.max(1);
                tokio::time::sleep(Duration::from_nanos(nanos)).await;
            }
            _ => {}
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// `n` independent redis-server masters.
pub fn start_masters(n: usize) -> Vec<RedisServer> {
    (0..n).map(|_| RedisServer::start()).collect()
}

/// A port that is free, and whose cluster bus port (+10000) is free too.
fn free_cluster_port() -> u16 {
    loop {
        let port = rand_port();
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 10_000) {
            return port;
        }
    }
}

fn rand_port() -> u16 {
    use std::hash::{BuildHasher, RandomState};
    // 20000..50000 keeps the bus port below 65535 and away from the
    // ephemeral range the kernel hands out.
    20_000 + (RandomState::new().hash_one(Instant::now()) % 30_000) as u16
}

/// A Redis Cluster of masters with replicas, started on free ports and
/// stopped on drop.
#[derive(Debug)]
pub struct Cluster {
    /// Every node, masters first as `redis-cli --cluster create` assigned them.
    pub nodes: Vec<RedisServer>,
}

impl Cluster {
    /// `masters` masters with `replicas` replicas each, node timeout 1 s.
    pub fn start(masters: usize, replicas: usize) -> Cluster {
        let extra = [
            "--cluster-enabled",
            "yes",
            "--cluster-node-timeout",
            "1000",
            "--cluster-config-file",
            "nodes.conf",
        ];
        let nodes: Vec<RedisServer> = (0..masters * (1 + replicas))
            .map(|_| RedisServer::start_on(free_cluster_port, &extra))
            .collect();
        let addresses: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())).collect();
        let output = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("run redis-cli (apt-get install redis-tools)");
        assert!(
            output.status.success(),
            "cluster create: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        let cluster = Cluster { nodes };
        cluster.wait_until_healthy(Duration::from_secs(30));
        cluster
    }

    /// Waits until every live node reports the cluster ok and knows every
    /// other node, and every replica has synced with its master: a replica
    /// that never synced refuses to take over when its master dies.
    pub fn wait_until_healthy(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let total = self.nodes.len();
        loop {
            let healthy = self.nodes.iter().filter(|n| n.child.is_some()).all(|node| {
                let Ok(mut conn) = node.sync_connection() else {
                    return false;
                };
                let Ok(info) = redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut conn) else {
                    return false;
                };
                let Ok(replication) = redis::cmd("INFO").arg("replication").query::<String>(&mut conn) else {
                    return false;
                };
                let synced =
                    replication.contains("role:master") || replication.contains("master_link_status:up");
                info.contains("cluster_state:ok")
                    && info.contains("cluster_slots_ok:16384")
                    && info.contains(&format!("cluster_known_nodes:{total}"))
                    && synced
            });
            if healthy {
                return;
            }
            assert!(Instant::now() < deadline, "cluster not healthy after {timeout:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Seed URLs: every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The index in `nodes` of the master that owns `key`'s slot, waiting up
    /// to 10 s for one (during a failover, none does).
    pub fn master_of(&self, key: &str) -> usize {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(master) = self.current_master_of(key) {
                return master;
            }
            assert!(Instant::now() < deadline, "no master owns the slot of {key}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn current_master_of(&self, key: &str) -> Option<usize> {
        let probe = self
            .nodes
            .iter()
            .find(|n| n.child.is_some())
            .expect("a live node");
        let slot: i64 = probe.query(redis::cmd("CLUSTER").arg("KEYSLOT").arg(key));
        let nodes: String = probe.query(redis::cmd("CLUSTER").arg("NODES"));
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 9 || !fields[2].contains("master") || fields[2].contains("fail") {
                continue;
            }
            let owns = fields[8..].iter().any(|range| {
                let mut bounds = range.split('-').filter_map(|b| b.parse::<i64>().ok());
                match (bounds.next(), bounds.next()) {
                    (Some(lo), Some(hi)) => (lo..=hi).contains(&slot),
                    (Some(only), None) => only == slot,
                    _ => false,
                }
            });
            if owns {
                let port: u16 = fields[1]
                    .split(['@', ':'])
                    .nth(1)
                    .and_then(|p| p.parse().ok())
                    .expect("node address");
                return self.nodes.iter().position(|n| n.port() == port);
            }
        }
        None
    }

    /// The cluster node id of node `index`.
    pub fn node_id(&self, index: usize) -> String {
        self.nodes[index].query(redis::cmd("CLUSTER").arg("MYID"))
    }
}

/// The mutual-exclusion workload: `tasks` tasks each increment the Redis
/// counter `counter` `per_task` times under the lock `counter`, by GET, a
/// yield, then SET, which loses updates unless the holders exclude each
/// other; an in-process witness also checks that no two bodies overlap.
/// Returns the counter's final value.
pub async fn increment_under_lock<C>(
    locks: &lock_runtime::LockClient,
    data: C,
    tasks: usize,
    per_task: usize,
) -> u64
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    use redis::AsyncCommands;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    let inside = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..tasks)
        .map(|_| {
            let (locks, mut data, inside) = (locks.clone(), data.clone(), Arc::clone(&inside));
            tokio::spawn(async move {
                for _ in 0..per_task {
                    let data = &mut data;
                    let inside = &inside;
                    locks
                        .lock("counter")
                        .wait(Duration::from_secs(30))
                        .run(async move {
                            assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders at once");
                            let value: Option<u64> = data.get("counter").await?;
                            tokio::task::yield_now().await;
                            let result = data.set::<_, _, ()>("counter", value.unwrap_or(0) + 1).await;
                            inside.fetch_sub(1, Ordering::SeqCst);
                            result
                        })
                        .await
                        .expect("lock")
                        .expect("increment");
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("worker task");
    }
    let mut data = data;
    data.get("counter").await.expect("read the counter")
}

/// A waiter in a task of its own (a separate holder): waits up to 5 s for
/// `key`, releases it, and returns the instant it got it, so that handoff
/// latency can be taken from the release that let it in.
pub fn spawn_waiter(locks: &lock_runtime::LockClient, key: &str) -> tokio::task::JoinHandle<Instant> {
    let (locks, key) = (locks.clone(), key.to_owned());
    tokio::spawn(async move {
        let guard = locks
            .lock(key)
            .wait(Duration::from_secs(5))
            .acquire()
            .await
            .expect("waiter");
        let acquired = Instant::now();
        guard.release().await.expect("release");
        acquired
    })
}

#[cfg(test)]
mod proxy_tests {
    use super::*;

    async fn ping(conn: &mut redis::aio::MultiplexedConnection) -> redis::RedisResult<String> {
        redis::cmd("PING").query_async(conn).await
    }

    #[tokio::test]
    async fn delay_throttle_and_reset_do_what_they_say() {
        let server = RedisServer::start();
        let proxy = Proxy::start(server.port()).await;
        let client = redis::Client::open(proxy.url()).expect("url");
        let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
        ping(&mut conn).await.expect("pass");

        proxy.delay(Duration::from_millis(30));
        let start = Instant::now();
        ping(&mut conn).await.expect("delayed");
        // Held back once each way.
        assert!(
            start.elapsed() >= Duration::from_millis(60),
            "{:?}",
            start.elapsed()
        );

        proxy.throttle(1000);
        let start = Instant::now();
        let value = "v".repeat(200);
        redis::cmd("SET")
            .arg("k")
            .arg(&value)
            .query_async::<()>(&mut conn)
            .await
            .expect("throttled");
        assert!(
            start.elapsed() >= Duration::from_millis(200),
            "{:?}",
            start.elapsed()
        );

        proxy.pass();
        proxy.reset();
        assert!(ping(&mut conn).await.is_err(), "the connection survived a reset");
        let mut fresh = client
            .get_multiplexed_async_connection()
            .await
            .expect("reconnect");
        ping(&mut fresh)
            .await
            .expect("new connections pass after a reset");
    }
}
