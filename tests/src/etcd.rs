//! etcd members on free loopback ports, each with a fresh data directory,
//! owned by the test and killed when it ends (also when the test process is
//! killed): one member alone, or a 3-member cluster, from Debian's
//! `etcd-server` package, which the README's test command installs when
//! missing.
//!
//! Members beat every 50 ms and call an election after 500 ms of silence,
//! so a killed leader is replaced within a second or so and a test sees it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::server::{free_ports, spawn_owned};

/// How often a leader beats, and how long a follower waits for a beat
/// before it calls an election (etcd's defaults are 100 ms and 1 s).
const HEARTBEAT: Duration = Duration::from_millis(50);
const ELECTION_TIMEOUT: Duration = Duration::from_millis(500);

/// One etcd process: its name and ports stay the same across restarts, so
/// that it rejoins its cluster from its data directory.
#[derive(Debug)]
struct Member {
    child: Option<Child>,
    name: String,
    client_port: u16,
    peer_port: u16,
    dir: PathBuf,
    /// `name=peer URL` of every member: the cluster it first forms.
    initial_cluster: String,
    token: String,
    /// `https` when the member serves clients over TLS, else `http`.
    client_scheme: &'static str,
    /// Where `/health` and `/metrics` are read: the client port, or a
    /// plain-HTTP metrics port when clients must speak TLS.
    health_port: u16,
    /// Security flags (`--cert-file`, `--client-cert-auth`, `--auth-token`…).
    extra: Vec<String>,
}

impl Member {
    fn spawn(&mut self) -> std::io::Result<()> {
        let client = format!("{}://127.0.0.1:{}", self.client_scheme, self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("etcd.log"))?;
        let mut command = Command::new("etcd");
        command
            .arg("--name")
            .arg(&self.name)
            .arg("--data-dir")
            .arg(self.dir.join("data"))
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &self.initial_cluster])
            // Ignored on a restart: the data directory knows its cluster.
            .args([
                "--initial-cluster-state",
                "new",
                "--initial-cluster-token",
                &self.token,
            ])
            .arg(format!("--heartbeat-interval={}", HEARTBEAT.as_millis()))
            .arg(format!("--election-timeout={}", ELECTION_TIMEOUT.as_millis()))
            .args(["--logger", "zap", "--log-level", "warn"])
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let child = spawn_owned(command).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("cannot run etcd: {e}; install Debian's etcd-server (apt-get install etcd-server), or run ./test.sh --install-only"),
            )
        })?;
        self.child = Some(child);
        Ok(())
    }

    fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // A stopped process dies of SIGKILL too, but only once resumed
            // does it let go of its ports at once.
            let _ = kill(self.pid_of(&child), Signal::SIGCONT);
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn pid_of(&self, child: &Child) -> Pid {
        Pid::from_raw(i32::try_from(child.id()).expect("pid fits i32"))
    }

    fn pid(&self) -> Pid {
        self.pid_of(self.child.as_ref().expect("member is running"))
    }

    /// What the member's log says, for a failure's message.
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }
}

/// The etcd lease the suite's clients ask for: a lock's lease is at most
/// two thirds of it (2.67 s), so the suite's leases (1.5 s) are what they
/// ask for, and a killed holder's keys go 4 s after its last keep-alive.
pub const LEASE_TTL: Duration = Duration::from_secs(4);

/// `etcd=<endpoint>,<endpoint>…`: how `lock-worker` is pointed at `etcd`.
pub fn target(etcd: &Etcd) -> String {
    format!("etcd={}", etcd.endpoints().join(","))
}

/// A client of `etcd`, every member an endpoint, asking for [`LEASE_TTL`].
pub async fn client(etcd: &Etcd) -> lock_runtime::LockClient {
    let endpoints = etcd.endpoints();
    let endpoints: Vec<&str> = endpoints.iter().map(String::as_str).collect();
    lock_runtime::LockClient::builder()
        .etcd_lease_ttl(LEASE_TTL)
        .etcd(&endpoints)
        .await
        .expect("connect to the test etcd")
}

/// The body of `GET path` from the member serving clients on `port`.
fn http_get(port: u16, path: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(1))?;
    stream.set_read_timeout(Some(Duration::from_secs(3)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply)?;
    Ok(reply)
}

/// Whether the member serving clients on `port` says it is healthy: it
/// has a leader and answers a read through the cluster (etcd's `/health`).
pub fn healthy(port: u16) -> bool {
    http_get(port, "/health").is_ok_and(|reply| reply.contains("\"health\":\"true\""))
}

/// A number the member on `port` exports at `/metrics` (Prometheus text):
/// `etcd_mvcc_txn_total`, `etcd_debugging_mvcc_watcher_total`, …
pub fn metric(port: u16, name: &str) -> Option<f64> {
    let text = http_get(port, "/metrics").ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// One member alone or a cluster of three, killed on drop.
#[derive(Debug)]
pub struct Etcd {
    members: Vec<Member>,
    _dir: tempfile::TempDir,
}

impl Etcd {
    /// One member alone on free ports, with a fresh data directory.
    pub fn start() -> Etcd {
        let dir = tempfile::tempdir().expect("temp dir for etcd");
        let mut etcd = Etcd {
            members: Vec::new(),
            _dir: dir,
        };
        // A port found free can be taken before the member binds it: retry.
        for attempt in 0..20 {
            let member_dir = etcd._dir.path().join(format!("alone-{attempt}"));
            let token = cluster_token(etcd._dir.path());
            let ports = free_ports(2);
            etcd.members = vec![member(member_dir, "alone", &token, (ports[0], ports[1]))];
            etcd.members[0].initial_cluster = etcd.initial_cluster();
            etcd.members[0].spawn().unwrap_or_else(|e| panic!("{e}"));
            if etcd.wait_until_healthy(&[0]) {
                return etcd;
            }
            etcd.members[0].kill();
        }
        panic!(
            "could not start etcd on any free ports: {}",
            etcd.members[0].log_tail()
        );
    }

    /// Three members forming one cluster, each with its own data directory;
    /// returns once every member is healthy.
    pub fn cluster() -> Etcd {
        let dir = tempfile::tempdir().expect("temp dir for etcd");
        let mut etcd = Etcd {
            members: Vec::new(),
            _dir: dir,
        };
        // Six ports found free can be taken before the members bind them
        // (a member that cannot bind exits): retry on fresh ones, in fresh
        // directories, as a cluster that never formed.
        for attempt in 0..5 {
            let token = format!("{}-{attempt}", cluster_token(etcd._dir.path()));
            // All six at once, so that no two members share one.
            let ports = free_ports(6);
            etcd.members = (0..3)
                .map(|i| {
                    let name = format!("member-{}", i + 1);
                    let dir = etcd._dir.path().join(format!("{name}-{attempt}"));
                    member(dir, &name, &token, (ports[2 * i], ports[2 * i + 1]))
                })
                .collect();
            let initial_cluster = etcd.initial_cluster();
            for member in &mut etcd.members {
                member.initial_cluster.clone_from(&initial_cluster);
                member.spawn().unwrap_or_else(|e| panic!("{e}"));
            }
            if etcd.wait_until_healthy(&[0, 1, 2]) {
                return etcd;
            }
            for member in &mut etcd.members {
                member.kill();
            }
        }
        panic!(
            "the 3-member etcd cluster did not form in 5 tries: {}",
            etcd.members
                .iter()
                .map(Member::log_tail)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Waits until each of `members` is healthy; false if one exited first.
    fn wait_until_healthy(&mut self, members: &[usize]) -> bool {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if members.iter().all(|&i| healthy(self.members[i].health_port)) {
                return true;
            }
            if members.iter().any(|&i| !self.members[i].running()) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// One member alone whose clients must speak TLS when `tls` holds
    /// (`https://` endpoints, the server's certificate and key as
    /// `--cert-file` and `--key-file`) and which is also started with
    /// `flags` (`--client-cert-auth`, `--trusted-ca-file`,
    /// `--auth-token-ttl`, …). Its health is read from a plain-HTTP
    /// metrics port, which needs neither a certificate nor a user.
    pub fn start_secured(tls: Option<(&Path, &Path)>, flags: &[&str]) -> Etcd {
        let dir = tempfile::tempdir().expect("temp dir for etcd");
        let mut etcd = Etcd {
            members: Vec::new(),
            _dir: dir,
        };
        for attempt in 0..20 {
            let member_dir = etcd._dir.path().join(format!("alone-{attempt}"));
            let token = cluster_token(etcd._dir.path());
            let ports = free_ports(3);
            let mut alone = member(member_dir, "alone", &token, (ports[0], ports[1]));
            alone.health_port = ports[2];
            alone.extra = vec![format!("--listen-metrics-urls=http://127.0.0.1:{}", ports[2])];
            if let Some((cert, key)) = tls {
                alone.client_scheme = "https";
                alone.extra.push(format!("--cert-file={}", cert.display()));
                alone.extra.push(format!("--key-file={}", key.display()));
            }
            alone.extra.extend(flags.iter().map(|f| (*f).to_owned()));
            etcd.members = vec![alone];
            etcd.members[0].initial_cluster = etcd.initial_cluster();
            etcd.members[0].spawn().unwrap_or_else(|e| panic!("{e}"));
            if etcd.wait_until_healthy(&[0]) {
                return etcd;
            }
            etcd.members[0].kill();
        }
        panic!(
            "could not start a secured etcd on any free ports: {}",
            etcd.members[0].log_tail()
        );
    }

    /// Every member's client URL, as a client is given them.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("{}://127.0.0.1:{}", m.client_scheme, m.client_port))
            .collect()
    }

    /// The client port of member `i`.
    pub fn port(&self, i: usize) -> u16 {
        self.members[i].client_port
    }

    /// The member that leads the cluster (or serves alone), by its own word.
    pub fn leader(&self) -> Option<usize> {
        (0..self.members.len())
            .find(|&i| metric(self.members[i].health_port, "etcd_server_is_leader") == Some(1.0))
    }

    /// How many members there are.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Always false: there is at least one member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// SIGKILLs member `i`; its data directory stays.
    pub fn kill(&mut self, i: usize) {
        self.members[i].kill();
    }

    /// Starts member `i` again on its ports and data, and waits until it is
    /// healthy (it has rejoined, and a leader serves).
    pub fn revive(&mut self, i: usize) {
        self.members[i].spawn().unwrap_or_else(|e| panic!("{e}"));
        assert!(
            self.wait_until_healthy(&[i]),
            "etcd member {i} was not healthy again within 60 s: {}",
            self.members[i].log_tail()
        );
    }

    /// Whether member `i`'s process is alive.
    pub fn is_running(&mut self, i: usize) -> bool {
        self.members[i].running()
    }

    /// SIGSTOPs member `i`: it keeps its connections and answers nothing.
    pub fn pause(&self, i: usize) {
        let pid = self.members[i].pid();
        kill(pid, Signal::SIGSTOP).expect("SIGSTOP etcd");
        crate::until_stopped(pid);
    }

    /// SIGCONTs member `i`.
    pub fn resume(&self, i: usize) {
        kill(self.members[i].pid(), Signal::SIGCONT).expect("SIGCONT etcd");
    }
}

/// A cluster's token is unique to it (its directory is), so that members
/// of two tests' clusters can never take each other for peers.
fn cluster_token(dir: &std::path::Path) -> String {
    let unique = dir
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    format!("lock-tests-{}-{unique}", std::process::id())
}

/// A member on `(client_port, peer_port)`.
fn member(dir: PathBuf, name: &str, token: &str, (client_port, peer_port): (u16, u16)) -> Member {
    std::fs::create_dir_all(&dir).expect("member dir");
    Member {
        child: None,
        name: name.to_owned(),
        client_port,
        peer_port,
        token: token.to_owned(),
        dir,
        initial_cluster: String::new(),
        client_scheme: "http",
        health_port: client_port,
        extra: Vec::new(),
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for member in &mut self.members {
            member.kill();
        }
    }
}
