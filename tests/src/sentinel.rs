//! A replicated Redis: a master, its replicas, and three sentinels
//! (`redis-server <config> --sentinel`) watching it, on free ports.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::proxy::Proxy;
use crate::server::{
    LOCK_USER, LOCK_USER_PASSWORD, LOCK_USER_SENTINEL_MASTER_RULES, LOCK_USER_SENTINEL_RULES, RedisServer,
    free_port, lock_user_arguments_with, percent_encode, redis_server_binary, spawn_owned,
};

/// The name the sentinels know the master by.
pub const MASTER_NAME: &str = "lockmaster";

/// A master with replicas and three sentinels; all stopped on drop.
#[derive(Debug)]
pub struct Replicated {
    /// The first master; after a failover, one of the replicas is master.
    pub master: RedisServer,
    /// Its replicas, synced when `start` returns.
    pub replicas: Vec<RedisServer>,
    sentinels: Vec<SentinelProcess>,
    /// The lock user's password, when the nodes have that user.
    lock_user_password: Option<String>,
}

#[derive(Debug)]
struct SentinelProcess {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Replicated {
    /// A master with `replicas` replicas, without sentinels.
    pub fn start_without_sentinels(replicas: usize) -> Replicated {
        Self::start_nodes(replicas, None)
    }

    /// Every node, audited, with the ACL user [`LOCK_USER`](crate::LOCK_USER)
    /// given [`LOCK_USER_RULES`](crate::LOCK_USER_RULES) and
    /// [`LOCK_USER_SENTINEL_MASTER_RULES`] and the password
    /// `lock_user_password`, when there is one.
    fn start_nodes(replicas: usize, lock_user_password: Option<&str>) -> Replicated {
        let lock_user = lock_user_password.is_some();
        let user = match lock_user_password {
            Some(password) => lock_user_arguments_with(password, LOCK_USER_SENTINEL_MASTER_RULES),
            None => Vec::new(),
        };
        let start = |extra: &[&str]| {
            let mut arguments: Vec<&str> = extra.to_vec();
            arguments.extend(user.iter().map(String::as_str));
            let node = RedisServer::start_with(&arguments);
            if lock_user { node.audited() } else { node }
        };
        // No 5 s pause before the first sync (the default waits for more
        // replicas to join it).
        let master = start(&["--repl-diskless-sync-delay", "0"]);
        let replicaof = master.port().to_string();
        let replicas = (0..replicas)
            .map(|_| start(&["--replicaof", "127.0.0.1", &replicaof]))
            .collect();
        let replicated = Replicated {
            master,
            replicas,
            sentinels: Vec::new(),
            lock_user_password: lock_user_password.map(str::to_owned),
        };
        replicated.wait_for_replicas(Duration::from_secs(20));
        replicated
    }

    /// A master with `replicas` replicas and three sentinels that agree on
    /// a failover once two of them see the master down for 2 s. A sentinel
    /// whose failover attempt was given up (its election split or timed
    /// out, as under a loaded machine) tries again only after twice the
    /// failover timeout (Sentinel's documentation). With 30 s, a `.ci/run`
    /// saw no failover within a test's 30 s once (its sentinels' logs were
    /// gone with the test; a given-up attempt is the cause Sentinel
    /// allows), so theirs is 5 s. Down-after is not less:
    /// a sentinel reconnects to an instance at most once a second, and with
    /// a shorter down-after it can judge a just-promoted master down before
    /// its link is up, and fail over again and again (seen with 500 ms).
    pub fn start(replicas: usize) -> Replicated {
        let mut replicated = Replicated::start_without_sentinels(replicas);
        replicated.sentinels = (0..3)
            .map(|_| start_sentinel(replicated.master.port(), ""))
            .collect();
        replicated.wait_for_sentinels(Duration::from_secs(30));
        replicated
    }

    /// A master with `replicas` replicas and three sentinels that name it,
    /// for tests that lock through Sentinel and fail nothing over: it does
    /// not wait the seconds the sentinels take to find each other.
    pub fn start_named(replicas: usize) -> Replicated {
        let mut replicated = Replicated::start_without_sentinels(replicas);
        replicated.sentinels = (0..3)
            .map(|_| start_sentinel(replicated.master.port(), ""))
            .collect();
        replicated
    }

    /// [`start_named`](Self::start_named), every node and sentinel with
    /// the least-privilege ACL user of docs/backends.md, which
    /// [`lock_user_sentinel_urls`](Self::lock_user_sentinel_urls) log in as.
    pub fn start_named_with_lock_user(replicas: usize) -> Replicated {
        Self::start_named_with_lock_user_password(replicas, LOCK_USER_PASSWORD)
    }

    /// [`start_named_with_lock_user`](Self::start_named_with_lock_user)
    /// with `password` (any printable characters) for the lock user, on
    /// every node and sentinel.
    pub fn start_named_with_lock_user_password(replicas: usize, password: &str) -> Replicated {
        let mut replicated = Replicated::start_nodes(replicas, Some(password));
        let user = format!(
            "user {LOCK_USER} on {} {LOCK_USER_SENTINEL_RULES}\n",
            configuration_quoted(&format!(">{password}"))
        );
        replicated.sentinels = (0..3)
            .map(|_| start_sentinel(replicated.master.port(), &user))
            .collect();
        replicated
    }

    /// The sentinels' URLs as the lock user of
    /// [`start_named_with_lock_user`](Self::start_named_with_lock_user).
    pub fn lock_user_sentinel_urls(&self) -> Vec<String> {
        let password = percent_encode(
            self.lock_user_password
                .as_deref()
                .expect("a group started with the lock user"),
        );
        self.sentinels
            .iter()
            .map(|s| format!("redis://{LOCK_USER}:{password}@127.0.0.1:{}/", s.port))
            .collect()
    }

    /// Every sentinel's port.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|s| s.port).collect()
    }

    /// `redis://127.0.0.1:<port>/` of every sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("redis://127.0.0.1:{}/", s.port))
            .collect()
    }

    /// The master's port as the first sentinel that answers names it.
    pub fn master_port_by_sentinel(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|s| {
            let client = redis::Client::open(format!("redis://127.0.0.1:{}/", s.port)).ok()?;
            let mut conn = client.get_connection_with_timeout(Duration::from_secs(1)).ok()?;
            let addr: Vec<String> = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(MASTER_NAME)
                .query(&mut conn)
                .ok()?;
            addr.get(1)?.parse().ok()
        })
    }

    /// Waits until the sentinels name a master other than `old_port` that
    /// says it is a master; returns its port.
    pub fn wait_for_failover(&self, old_port: u16, timeout: Duration) -> u16 {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(port) = self.master_port_by_sentinel().filter(|p| *p != old_port)
                && let Some(node) = self.node(port)
                && node_role(node).as_deref() == Some("master")
            {
                return port;
            }
            assert!(Instant::now() < deadline, "no failover after {timeout:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The server on `port`, master or replica.
    pub fn node(&self, port: u16) -> Option<&RedisServer> {
        std::iter::once(&self.master)
            .chain(&self.replicas)
            .find(|n| n.port() == port)
    }

    /// Kills (SIGKILL) the master the sentinels name and waits, up to
    /// `timeout`, until they name a promoted replica; returns the killed
    /// node's port (to [`revive`](RedisServer::revive) through
    /// [`node_mut`](Self::node_mut)).
    pub fn kill_master(&mut self, timeout: Duration) -> u16 {
        let master = self
            .master_port_by_sentinel()
            .expect("the sentinels name a master");
        self.node_mut(master).expect("the master").kill();
        self.wait_for_failover(master, timeout);
        master
    }

    /// The server on `port`, to kill or revive.
    pub fn node_mut(&mut self, port: u16) -> Option<&mut RedisServer> {
        std::iter::once(&mut self.master)
            .chain(&mut self.replicas)
            .find(|n| n.port() == port)
    }

    fn wait_for_replicas(&self, timeout: Duration) {
        wait_until_replicas_acknowledge(&self.master, self.replicas.len(), timeout);
    }

    /// Until every sentinel knows the replicas and the other two sentinels:
    /// before that, they cannot agree on a failover.
    fn wait_for_sentinels(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let ready = |port: u16| {
            let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{port}/")) else {
                return false;
            };
            let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_secs(1)) else {
                return false;
            };
            let mut count = |what: &str| {
                redis::cmd("SENTINEL")
                    .arg(what)
                    .arg(MASTER_NAME)
                    .query::<Vec<redis::Value>>(&mut conn)
                    .map_or(0, |v| v.len())
            };
            count("replicas") >= self.replicas.len() && count("sentinels") >= 2
        };
        while !self.sentinels.iter().all(|s| ready(s.port)) {
            assert!(Instant::now() < deadline, "sentinels not ready after {timeout:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A master that also serves TLS, and a sentinel that monitors it over
/// TLS (`tls-replication yes`, so the master it names is its TLS port) and
/// serves TLS itself: a Sentinel deployment behind TLS, with `certs`'
/// server certificate (from [`make_certificates`](crate::make_certificates))
/// and no client certificates asked for. Each keeps its plain port too,
/// for the harness's probes. Stopped on drop.
#[derive(Debug)]
pub struct TlsGroup {
    /// The master; its plain port is [`RedisServer::port`].
    pub master: RedisServer,
    /// The master's TLS port, which the sentinel names.
    pub master_tls_port: u16,
    _sentinel: SentinelProcess,
    sentinel_tls_port: u16,
}

impl TlsGroup {
    /// Starts the master and its sentinel, both answering.
    pub fn start(certs: &Path) -> TlsGroup {
        let file = |name: &str| certs.join(name).display().to_string();
        let (cert, key, ca) = (file("server.crt"), file("server.key"), file("ca.crt"));
        let (master, master_tls_port) = RedisServer::start_serving_tls(certs);
        let sentinel_tls_port = free_port();
        let sentinel = start_sentinel(
            master_tls_port,
            &format!(
                "tls-port {sentinel_tls_port}\ntls-cert-file {cert}\ntls-key-file {key}\n\
                 tls-ca-cert-file {ca}\ntls-auth-clients no\ntls-replication yes\n"
            ),
        );
        TlsGroup {
            master,
            master_tls_port,
            _sentinel: sentinel,
            sentinel_tls_port,
        }
    }

    /// `rediss://127.0.0.1:<port>/` of the sentinel's TLS port.
    pub fn sentinel_url(&self) -> String {
        format!("rediss://127.0.0.1:{}/", self.sentinel_tls_port)
    }

    /// `redis://127.0.0.1:<port>/` of the sentinel's TLS port: a plain
    /// client's mistake.
    pub fn plain_url_to_tls_port(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.sentinel_tls_port)
    }
}

/// A master and one replica that replicates through a proxy (so that a test
/// can cut replication with `blackhole`), acknowledging writes.
pub async fn replica_behind_proxy() -> (RedisServer, Proxy, RedisServer) {
    // No 5 s pause before the first sync (the default waits for more
    // replicas to join it).
    let master = RedisServer::start_with(&["--repl-diskless-sync-delay", "0"]);
    let link = Proxy::start(master.port()).await;
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &link.port().to_string()]);
    tokio::task::block_in_place(|| wait_until_replicas_acknowledge(&master, 1, Duration::from_secs(10)));
    (master, link, replica)
}

/// Until `replicas` replicas acknowledge writes to `master` as they come.
/// A replica that reports its link up, or that the master lists as online,
/// may not have acknowledged anything yet: after a diskless full sync the
/// master streams writes to it only after its first `REPLCONF ACK`, which
/// can take a second. And a write made before the sync has offset 0, which
/// `WAIT` counts as acknowledged at once. So: every replica has acknowledged
/// a non-zero offset, and `WAIT` counts them for a write made now.
pub fn wait_until_replicas_acknowledge(master: &RedisServer, replicas: usize, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let wanted = i64::try_from(replicas).unwrap_or(i64::MAX);
    loop {
        let ready = master.sync_connection().ok().and_then(|mut conn| {
            redis::cmd("SET")
                .arg("replication-probe")
                .arg(1)
                .query::<()>(&mut conn)
                .ok()?;
            let acked: i64 = redis::cmd("WAIT").arg(replicas).arg(200).query(&mut conn).ok()?;
            let info: String = redis::cmd("INFO").arg("replication").query(&mut conn).ok()?;
            let streaming = info
                .lines()
                .filter(|l| l.starts_with("slave"))
                .filter_map(|l| l.split(",offset=").nth(1)?.split(',').next()?.parse::<u64>().ok())
                .filter(|offset| *offset > 0)
                .count();
            Some(acked >= wanted && streaming >= replicas)
        });
        if ready == Some(true) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "replicas not acknowledging after {timeout:?}"
        );
    }
}

fn node_role(node: &RedisServer) -> Option<String> {
    let mut conn = node.sync_connection().ok()?;
    let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut conn).ok()?;
    redis::from_redis_value_ref::<String>(role.first()?).ok()
}

/// `text` as one argument of a line of a Redis configuration file,
/// whatever it holds: in double quotes, each byte written `\xHH`.
fn configuration_quoted(text: &str) -> String {
    let escaped: String = text.bytes().map(|b| format!("\\x{b:02x}")).collect();
    format!("\"{escaped}\"")
}

/// `more`: further lines of its configuration.
fn start_sentinel(master_port: u16, more: &str) -> SentinelProcess {
    let dir = tempfile::tempdir().expect("sentinel dir");
    for _ in 0..20 {
        let port = free_port();
        let config: PathBuf = dir.path().join("sentinel.conf");
        std::fs::write(
            &config,
            format!(
                "port {port}\nbind 127.0.0.1\ndaemonize no\nlogfile sentinel.log\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} 2000\n\
                 sentinel failover-timeout {MASTER_NAME} 5000\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n{more}"
            ),
        )
        .expect("write sentinel.conf");
        let mut command = Command::new(redis_server_binary());
        command
            .arg(&config)
            .arg("--sentinel")
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = spawn_owned(command).expect("run redis-server --sentinel");
        let deadline = Instant::now() + Duration::from_secs(10);
        let answers = loop {
            if let Ok(Some(_)) = child.try_wait() {
                break false;
            }
            let ping = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
                .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
            if ping.is_ok() {
                break true;
            }
            if Instant::now() > deadline {
                break false;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        if answers {
            return SentinelProcess {
                child,
                port,
                _dir: dir,
            };
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("could not start a sentinel on any free port");
}

/// [`client`] as the lock user of
/// [`Replicated::start_named_with_lock_user`].
pub async fn lock_user_client(group: &Replicated) -> lock_runtime::LockClient {
    lock_runtime::LockClient::builder()
        .replica_acks(1)
        .sentinel(MASTER_NAME, group.lock_user_sentinel_urls())
        .await
        .expect("connect through the test sentinels as the lock user")
}

/// A client that finds `group`'s master through its sentinels and has
/// each write acknowledged by one replica (`replica_acks(1)`), as a
/// Sentinel deployment that cares about its locks would be set up.
pub async fn client(group: &Replicated) -> lock_runtime::LockClient {
    lock_runtime::LockClient::builder()
        .replica_acks(1)
        .sentinel(MASTER_NAME, group.sentinel_urls())
        .await
        .expect("connect through the test sentinels")
}
