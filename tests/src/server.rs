//! `redis-server` processes on free loopback ports, owned by the test and
//! killed when it ends (also when it panics, and when the test process is
//! killed).

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// One `redis-server` child process.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    extra: Vec<String>,
    /// Whether dropping the server checks that its ACL refused nothing.
    audited: bool,
}

/// The ACL user that [`RedisServer::start_with_lock_user`] adds.
pub const LOCK_USER: &str = "locks";

/// The least a lock client needs on one Redis node (or a Sentinel's
/// master), with the default prefix `lock:`: the rules docs/backends.md
/// gives operators, word for word (a test checks that it does).
pub const LOCK_USER_RULES: &str = "resetkeys ~lock:* resetchannels &lock:* -@all +ping +evalsha +script|load \
+set +get +mget +exists +type +pttl +pexpire +append +incr +del +time +zadd +zcard +zrange \
+zrangebyscore +zscore +zrem +zremrangebyscore +publish +subscribe +unsubscribe";

/// What a Redis Cluster adds to [`LOCK_USER_RULES`], also as
/// docs/backends.md gives it.
pub const LOCK_USER_CLUSTER_RULES: &str = "+spublish +ssubscribe +sunsubscribe +cluster|slots +asking";

/// What each master of a Redlock adds to [`LOCK_USER_RULES`], as
/// docs/backends.md gives it: `INFO`, for the check that the masters are
/// distinct servers.
pub const LOCK_USER_REDLOCK_RULES: &str = "+info";

/// What a Sentinel's master adds to [`LOCK_USER_RULES`] (with
/// `replica_acks`, as the tests' Sentinel clients have), as
/// docs/backends.md gives it.
pub const LOCK_USER_SENTINEL_MASTER_RULES: &str = "+role +wait";

/// The same user on each sentinel, which the client asks for the master
/// with the credentials of the first sentinel URL, as docs/backends.md
/// gives it.
pub const LOCK_USER_SENTINEL_RULES: &str = "-@all +role +sentinel|masters";

/// The lock user's password; not a secret, the servers are the tests' own.
pub const LOCK_USER_PASSWORD: &str = "lock-user-password";

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

    /// Starts a fresh server that also serves TLS, with the server
    /// certificate of `certs` (from [`make_certificates`](crate::make_certificates))
    /// and no client certificate asked for; returns it and its TLS port.
    /// [`port`](Self::port) stays plain, for the harness's probes.
    pub fn start_serving_tls(certs: &Path) -> (RedisServer, u16) {
        let tls_port = free_port();
        let arguments = tls_arguments(certs, tls_port);
        let server = Self::start_with(&arguments.iter().map(String::as_str).collect::<Vec<_>>());
        (server, tls_port)
    }

    /// Starts a fresh server that requires `password` (`--requirepass`).
    /// The harness's own connections authenticate; [`url`](Self::url) does
    /// not carry it, [`url_with_password`](Self::url_with_password) does.
    pub fn start_with_password(password: &str) -> RedisServer {
        Self::start_with(&["--requirepass", password])
    }

    /// Starts a fresh server with, beside the default user the harness
    /// inspects it as, the ACL user [`LOCK_USER`] granted only
    /// [`LOCK_USER_RULES`] (and `more` rules): what a lock client is given
    /// in production. [`lock_user_url`](Self::lock_user_url) logs in as it.
    /// Dropping the server fails the test if its ACL refused the client
    /// anything: a refusal the client swallowed would otherwise go unseen.
    pub fn start_with_lock_user(more: &str) -> RedisServer {
        let arguments = lock_user_arguments(more);
        Self::start_with(&arguments.iter().map(String::as_str).collect::<Vec<_>>()).audited()
    }

    /// Checks on drop that the server's ACL refused nothing (see
    /// [`start_with_lock_user`](Self::start_with_lock_user)).
    pub(crate) fn audited(mut self) -> Self {
        self.audited = true;
        self
    }

    /// Starts a server whose port comes from `pick`, retried while taken.
    pub(crate) fn start_on(pick: fn() -> u16, extra: &[&str]) -> RedisServer {
        // A port found free can be taken before redis binds it: retry.
        for _ in 0..20 {
            let mut server = RedisServer {
                child: None,
                port: pick(),
                dir: tempfile::tempdir().expect("temp dir for redis-server"),
                extra: extra.iter().map(|s| (*s).to_owned()).collect(),
                audited: false,
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

    /// Waits until this server answers on its port; false if it exited
    /// first. The answer must come from this process: a port found free
    /// can be taken by another test's server before this one binds it, and
    /// that server answers while this one is still failing to bind (a
    /// Redlock test once found a master it had killed still answering: the
    /// port was another test's server all along).
    fn wait_until_ready(&mut self) -> bool {
        let Some(ours) = self.child.as_ref().map(Child::id) else {
            return false;
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(_)) = child.try_wait()
            {
                return false;
            }
            if let Ok(mut conn) = self.sync_connection()
                && let Ok(info) = redis::cmd("INFO").arg("server").query::<String>(&mut conn)
            {
                let answering = info
                    .lines()
                    .find_map(|l| l.strip_prefix("process_id:"))
                    .and_then(|pid| pid.trim().parse::<u32>().ok());
                if answering == Some(ours) {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    /// Whether the process runs (it was not killed, or was revived).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
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

    /// `redis://locks:<password>@127.0.0.1:<port>/`: the URL of the ACL
    /// user of [`start_with_lock_user`](Self::start_with_lock_user).
    pub fn lock_user_url(&self) -> String {
        format!(
            "redis://{LOCK_USER}:{LOCK_USER_PASSWORD}@127.0.0.1:{}/",
            self.port
        )
    }

    /// What the server's ACL refused since it started or the log was
    /// reset (`ACL LOG`): each entry's user and command, key or channel,
    /// as `user: object`.
    pub fn acl_refusals(&self) -> redis::RedisResult<Vec<String>> {
        let mut conn = self.sync_connection()?;
        // A paused server must not hang a dropping test.
        conn.set_read_timeout(Some(Duration::from_secs(2)))?;
        let entries: Vec<std::collections::HashMap<String, redis::Value>> =
            redis::cmd("ACL").arg("LOG").query(&mut conn)?;
        let text = |entry: &std::collections::HashMap<String, redis::Value>, field: &str| {
            entry
                .get(field)
                .and_then(|v| redis::from_redis_value_ref::<String>(v).ok())
                .unwrap_or_default()
        };
        Ok(entries
            .iter()
            .map(|entry| format!("{}: {}", text(entry, "username"), text(entry, "object")))
            .collect())
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

    /// Another client takes the lock at `redis_key` behind its holder's
    /// back, as [`RIVAL`] for `lease`: what a holder whose lease ended
    /// unseen finds.
    pub fn take_as_rival(&self, redis_key: &str, lease: Duration) -> RivalLock {
        let ms = u64::try_from(lease.as_millis()).expect("lease fits");
        self.query::<()>(redis::cmd("SET").arg(redis_key).arg(RIVAL).arg("PX").arg(ms));
        self.rival_lock(redis_key)
    }

    /// The lock at `redis_key` as it stands: compared with what
    /// [`take_as_rival`](Self::take_as_rival) returned, it shows whether a
    /// stale holder changed the rival's lock. A waiter's mark (`+w`) is
    /// not a change: a waiter refused by the rival may add it.
    pub fn rival_lock(&self, redis_key: &str) -> RivalLock {
        let value: Option<String> = self.query(redis::cmd("GET").arg(redis_key));
        RivalLock {
            holder: value.map(|v| v.trim_end_matches("+w").to_owned()),
            expiry_ms: self.query(redis::cmd("PEXPIRETIME").arg(redis_key)),
        }
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

    /// Logs every command the server runs from now on, with its arguments
    /// (a slow log with a threshold of 0), starting from an empty log.
    pub fn log_every_command(&self) {
        let _: () = self.query(
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("slowlog-log-slower-than")
                .arg(0),
        );
        let _: () = self.query(redis::cmd("CONFIG").arg("SET").arg("slowlog-max-len").arg(10_000));
        let _: () = self.query(redis::cmd("SLOWLOG").arg("RESET"));
    }

    /// Every command logged since [`log_every_command`](Self::log_every_command),
    /// with its arguments (a call's first 32), oldest first.
    pub fn commands_logged(&self) -> Vec<Vec<String>> {
        self.commands_logged_by_connection()
            .into_iter()
            .map(|(_, args)| args)
            .collect()
    }

    /// [`commands_logged`](Self::commands_logged), each with the address
    /// of the connection that sent it (`ip:port`, the client's side).
    pub fn commands_logged_by_connection(&self) -> Vec<(String, Vec<String>)> {
        let entries: Vec<redis::Value> = self.query(redis::cmd("SLOWLOG").arg("GET").arg(-1));
        let mut commands: Vec<(String, Vec<String>)> = entries
            .into_iter()
            .filter_map(|entry| match entry {
                redis::Value::Array(fields) => {
                    let mut fields = fields.into_iter().skip(3);
                    let args = fields.next()?;
                    let address = fields.next()?;
                    Some((address, args))
                }
                _ => None,
            })
            .map(|(address, args)| {
                (
                    redis::from_redis_value(address).expect("a logged command's client address"),
                    redis::from_redis_value(args).expect("a logged command's arguments"),
                )
            })
            .collect();
        commands.reverse();
        commands
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

/// A holder id of this library's shape that no client in a test process
/// uses: the other client of the stale-holder tests.
pub const RIVAL: &str = "0123456789abcdef0123456789abcdef:424242";

/// A lock's holder (without a waiter's mark) and its expiry
/// (`PEXPIRETIME`, ms).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RivalLock {
    /// Who holds it, `None` if nobody.
    pub holder: Option<String>,
    /// When it expires, in Unix milliseconds (-2: no key, -1: no expiry).
    pub expiry_ms: i64,
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
        let refused = if self.audited && self.child.is_some() && !std::thread::panicking() {
            match self.acl_refusals() {
                // Redis 7.2 and later: the redis crate names itself with
                // CLIENT SETINFO and ignores a refusal (docs/backends.md);
                // Redis 7.0 does not know the subcommand.
                Ok(refusals) => refusals
                    .into_iter()
                    .filter(|refusal| !refusal.ends_with(": client|setinfo"))
                    .collect(),
                // A server the test left paused or unreachable.
                Err(e) => {
                    eprintln!(
                        "the ACL log of redis-server on port {} could not be read: {e}",
                        self.port
                    );
                    Vec::new()
                }
            }
        } else {
            Vec::new()
        };
        self.kill();
        assert!(
            refused.is_empty(),
            "the server's ACL refused the lock user: {refused:?}; grant it in LOCK_USER_RULES and docs/backends.md, or stop sending it"
        );
    }
}

/// `--user locks on ><password> <rules> <more>`: redis-server reads the
/// words after `--user` up to the next `--` as one `user` directive.
pub(crate) fn lock_user_arguments(more: &str) -> Vec<String> {
    lock_user_arguments_with(LOCK_USER_PASSWORD, more)
}

/// [`lock_user_arguments`] with `password` (any printable characters: the
/// server quotes each argument it reads as a configuration line).
pub(crate) fn lock_user_arguments_with(password: &str, more: &str) -> Vec<String> {
    let mut arguments = vec!["--user".to_owned(), LOCK_USER.to_owned(), "on".to_owned()];
    arguments.push(format!(">{password}"));
    arguments.extend(LOCK_USER_RULES.split_whitespace().map(str::to_owned));
    arguments.extend(more.split_whitespace().map(str::to_owned));
    arguments
}

/// Spawns `command` so that the child dies with this process, even when the
/// process is killed: PR_SET_PDEATHSIG fires when the spawning *thread* ends,
/// and tokio's blocking threads end when idle, so every child is spawned
/// from one thread that lives as long as the process.
pub fn spawn_owned(mut command: Command) -> std::io::Result<Child> {
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
    let child = child.recv().expect("the spawner answers")?;
    crate::monitor::watch_process(child.id());
    Ok(child)
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

/// The arguments that make a `redis-server` serve TLS on `tls_port` too,
/// with the server certificate and CA of `certs` (from
/// [`make_certificates`](crate::make_certificates)), asking clients for no
/// certificate.
pub fn tls_arguments(certs: &Path, tls_port: u16) -> Vec<String> {
    let file = |name: &str| certs.join(name).display().to_string();
    vec![
        "--tls-port".into(),
        tls_port.to_string(),
        "--tls-cert-file".into(),
        file("server.crt"),
        "--tls-key-file".into(),
        file("server.key"),
        "--tls-ca-cert-file".into(),
        file("ca.crt"),
        "--tls-auth-clients".into(),
        "no".into(),
    ]
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind an ephemeral port")
}

/// `n` different free loopback ports. Each [`free_port`] is free when it
/// returns and is released at once, so two calls can return the same port
/// (a 3-member ZooKeeper ensemble once got one port as a member's client
/// port and another's election port, and never formed); these are bound
/// all at once, so the system gives `n` different ones.
pub fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("a bound port").port())
        .collect()
}

/// `n` independent redis-server masters.
pub fn start_masters(n: usize) -> Vec<RedisServer> {
    (0..n).map(|_| RedisServer::start()).collect()
}
