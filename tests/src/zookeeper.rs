//! ZooKeeper servers on free loopback ports, each with a fresh data
//! directory, owned by the test and killed when it ends (also when the test
//! process is killed): standalone (`ZooKeeperServerMain`) or a 3-node
//! ensemble (`QuorumPeerMain`), from the jars of Debian's `zookeeper`
//! package, which the README's test command installs when missing.
//!
//! Servers tick every 100 ms, so sessions of 200 ms to 20 s can be granted
//! and a test sees a dead holder's session expire in a second or two.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::server::{free_ports, spawn_owned};

/// The server's tick: sessions are granted between 2 and 200 ticks.
pub const TICK: Duration = Duration::from_millis(100);

/// The session timeout the suite's clients and workers ask for: a killed
/// or stopped holder is let go about this long after its last word.
pub const SESSION_TIMEOUT: Duration = Duration::from_millis(1000);

/// `zookeeper=<connect string>`: how `lock-worker` is pointed at `zk`.
pub fn target(zk: &ZooKeeper) -> String {
    format!("zookeeper={}", zk.connect_string())
}

/// A client with a 20 s session, far longer than a test that kills
/// nothing: a loaded machine cannot lapse it (a 1 s session's holder can
/// lose its node to a starved moment).
pub async fn long_session_client(zk: &ZooKeeper) -> lock_runtime::LockClient {
    lock_runtime::LockClient::builder()
        .zookeeper_session_timeout(std::time::Duration::from_secs(20))
        .zookeeper(&zk.connect_string())
        .await
        .expect("connect")
}

/// A client of `zk` asking for [`SESSION_TIMEOUT`].
pub async fn client(zk: &ZooKeeper) -> lock_runtime::LockClient {
    lock_runtime::LockClient::builder()
        .zookeeper_session_timeout(SESSION_TIMEOUT)
        .zookeeper(&zk.connect_string())
        .await
        .expect("connect to the test ZooKeeper")
}

/// Where Debian's `zookeeper` package puts its jars and their dependencies.
/// Netty (for the TLS port, whose server needs `NettyServerCnxnFactory`)
/// jar by jar: Debian's `netty-all.jar` holds no classes.
const JARS: [&str; 14] = [
    "zookeeper.jar",
    "zookeeper-jute.jar",
    "slf4j-api.jar",
    "slf4j-nop.jar",
    "netty-buffer.jar",
    "netty-codec.jar",
    "netty-common.jar",
    "netty-handler.jar",
    "netty-resolver.jar",
    "netty-transport.jar",
    "netty-transport-native-unix-common.jar",
    "commons-cli.jar",
    "metrics-core.jar",
    "snappy-java.jar",
];

fn classpath() -> String {
    let dir =
        std::env::var_os("ZOOKEEPER_JARS").map_or_else(|| PathBuf::from("/usr/share/java"), PathBuf::from);
    let missing: Vec<&str> = JARS.iter().copied().filter(|j| !dir.join(j).is_file()).collect();
    assert!(
        missing.is_empty(),
        "ZooKeeper's jars {missing:?} are not in {}; install Debian's zookeeper package (apt-get install zookeeper), or run ./test.sh --install-only",
        dir.display()
    );
    JARS.iter()
        .map(|j| dir.join(j).display().to_string())
        .collect::<Vec<_>>()
        .join(":")
}

/// One ZooKeeper server process.
#[derive(Debug)]
struct Member {
    child: Option<Child>,
    port: u16,
    /// The TLS port, when the server serves one.
    secure_port: u16,
    dir: PathBuf,
    /// `QuorumPeerMain` for an ensemble member, else `ZooKeeperServerMain`.
    quorum: bool,
}

impl Member {
    fn spawn(&mut self) -> std::io::Result<()> {
        let main = if self.quorum {
            "org.apache.zookeeper.server.quorum.QuorumPeerMain"
        } else {
            "org.apache.zookeeper.server.ZooKeeperServerMain"
        };
        let mut command = Command::new("java");
        command
            // A small heap and the quick JIT: a test server holds a few
            // hundred nodes and must start fast.
            .args([
                "-Xmx96m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-Xshare:auto",
            ])
            // A restarted member catches up from a full snapshot, never by
            // DIFF: ZooKeeper up to 3.8.x and 3.9.x (Debian ships 3.8.0) can
            // leave a follower synced by DIFF holding an ephemeral node the
            // rest of the ensemble deleted (ZOOKEEPER-4785, fixed in 3.8.5 and 3.9.2;
            // ZOOKEEPER-5010, "purge orphaned ephemerals after DIFF sync",
            // not yet released). A lock client on that member then waits
            // behind a holder that no longer exists, for as long as the
            // member runs: the stalls S3rwzk and the ensemble test met one
            // run in a few. docs/backends.md gives operators the same flag.
            .arg("-Dzookeeper.forceSnapshotSync=true")
            .arg("-cp")
            .arg(classpath())
            .arg(main)
            .arg(self.dir.join("zoo.cfg"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = spawn_owned(command).map_err(|e| {
            std::io::Error::new(e.kind(), format!("cannot run java for ZooKeeper: {e}; install a JRE (apt-get install default-jre-headless zookeeper)"))
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
            let _ = kill(
                Pid::from_raw(i32::try_from(child.id()).unwrap_or(0)),
                Signal::SIGCONT,
            );
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn pid(&self) -> Pid {
        let id = self.child.as_ref().expect("server is running").id();
        Pid::from_raw(i32::try_from(id).expect("pid fits i32"))
    }
}

/// A standalone server or an ensemble, killed on drop.
#[derive(Debug)]
pub struct ZooKeeper {
    members: Vec<Member>,
    /// Whether it serves TLS too ([`ZooKeeper::start_with_tls`]).
    tls: bool,
    _dir: tempfile::TempDir,
}

/// Sends a four-letter command to the server on `port`; its reply, or
/// `None` if it did not answer.
pub fn four_letters(port: u16, command: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream.write_all(command.as_bytes()).ok()?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).ok()?;
    Some(reply)
}

/// The `key\tvalue` lines of `mntr` as a map.
fn monitor_values(port: u16) -> Option<std::collections::HashMap<String, String>> {
    let reply = four_letters(port, "mntr")?;
    Some(
        reply
            .lines()
            .filter_map(|l| l.split_once('\t'))
            .map(|(k, v)| (k.to_owned(), v.trim().to_owned()))
            .collect(),
    )
}

/// `extra`: further lines of `zoo.cfg`.
fn write_config(dir: &Path, port: u16, peers: &[(u16, u16)], extra: &str) {
    std::fs::create_dir_all(dir.join("data")).expect("data dir");
    let mut cfg = format!(
        "tickTime={}\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\n\
         minSessionTimeout={}\nmaxSessionTimeout=20000\n\
         admin.enableServer=false\n4lw.commands.whitelist=*\n\
         initLimit=50\nsyncLimit=20\n\
         znode.container.checkIntervalMs=1000\n",
        TICK.as_millis(),
        dir.join("data").display(),
        2 * TICK.as_millis(),
    );
    for (i, (quorum, election)) in peers.iter().enumerate() {
        cfg.push_str(&format!("server.{}=127.0.0.1:{quorum}:{election}\n", i + 1));
    }
    cfg.push_str(extra);
    std::fs::write(dir.join("zoo.cfg"), cfg).expect("zoo.cfg");
}

impl ZooKeeper {
    /// One standalone server on a free port, with a fresh data directory.
    pub fn start() -> ZooKeeper {
        Self::start_standalone(|_| String::new())
    }

    /// One standalone server that also serves TLS, on a second port
    /// ([`tls_connect_string`](Self::tls_connect_string)): its certificate
    /// is `certs`' `server.crt` (from [`make_certificates`](crate::make_certificates)),
    /// and with `client_auth` it lets in only clients showing a
    /// certificate from that CA (ZooKeeper's default on a secure port).
    /// The plain port stays, for the harness's probes.
    pub fn start_with_tls(certs: &Path, client_auth: bool) -> ZooKeeper {
        // ZooKeeper's PEM key store takes the key and its certificate in
        // one file.
        let key = std::fs::read_to_string(certs.join("server.key")).expect("read server.key");
        let certificate = std::fs::read_to_string(certs.join("server.crt")).expect("read server.crt");
        let key_store = certs.join("server-key-store.pem");
        std::fs::write(&key_store, format!("{key}{certificate}")).expect("write the key store");
        let trust_store = certs.join("ca.crt");
        let mut zk = Self::start_standalone(|secure_port| {
            format!(
                "secureClientPort={secure_port}\n\
                 serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
                 ssl.keyStore.location={}\nssl.keyStore.type=PEM\n\
                 ssl.trustStore.location={}\nssl.trustStore.type=PEM\n\
                 ssl.clientAuth={}\nssl.hostnameVerification=false\n",
                key_store.display(),
                trust_store.display(),
                if client_auth { "need" } else { "none" },
            )
        });
        zk.tls = true;
        zk
    }

    /// `config(secure_port)` gives `zoo.cfg`'s further lines.
    fn start_standalone(config: impl Fn(u16) -> String) -> ZooKeeper {
        let dir = tempfile::tempdir().expect("temp dir for ZooKeeper");
        let mut zk = ZooKeeper {
            members: Vec::new(),
            tls: false,
            _dir: dir,
        };
        // A port found free can be taken before the server binds it: retry.
        for attempt in 0..20 {
            let ports = free_ports(2);
            let (port, secure_port) = (ports[0], ports[1]);
            let member_dir = zk._dir.path().join(format!("standalone-{attempt}"));
            write_config(&member_dir, port, &[], &config(secure_port));
            let mut member = Member {
                child: None,
                port,
                secure_port,
                dir: member_dir,
                quorum: false,
            };
            member.spawn().unwrap_or_else(|e| panic!("{e}"));
            zk.members = vec![member];
            if zk.wait_until_serving(&[0]) {
                return zk;
            }
            zk.members[0].kill();
        }
        panic!("could not start ZooKeeper on any free port");
    }

    /// Three servers forming one ensemble, each with its own data
    /// directory; returns once a leader serves and every member answers.
    pub fn ensemble() -> ZooKeeper {
        let dir = tempfile::tempdir().expect("temp dir for ZooKeeper");
        let all = free_ports(9);
        let ports: Vec<u16> = all[..3].to_vec();
        let peers: Vec<(u16, u16)> = all[3..].chunks(2).map(|pair| (pair[0], pair[1])).collect();
        let mut members = Vec::new();
        for (i, port) in ports.iter().enumerate() {
            let member_dir = dir.path().join(format!("member-{}", i + 1));
            write_config(&member_dir, *port, &peers, "");
            std::fs::write(member_dir.join("data").join("myid"), format!("{}\n", i + 1)).expect("myid");
            let mut member = Member {
                child: None,
                port: *port,
                secure_port: 0,
                dir: member_dir,
                quorum: true,
            };
            member.spawn().unwrap_or_else(|e| panic!("{e}"));
            members.push(member);
        }
        let mut zk = ZooKeeper {
            members,
            tls: false,
            _dir: dir,
        };
        assert!(
            zk.wait_until_serving(&[0, 1, 2]),
            "the 3-node ZooKeeper ensemble did not form within 60 s (ports {ports:?}, peers {peers:?})"
        );
        zk
    }

    /// Waits until each of `members` answers `srvr` as a serving member
    /// (standalone, leader or follower); false if one exited first.
    fn wait_until_serving(&mut self, members: &[usize]) -> bool {
        let deadline = Instant::now() + Duration::from_secs(60);
        let serving = |port: u16| {
            four_letters(port, "srvr").is_some_and(|r| {
                r.lines()
                    .any(|l| l.starts_with("Mode: ") && !l.contains("read-only"))
            })
        };
        while Instant::now() < deadline {
            if members.iter().all(|&i| serving(self.members[i].port)) {
                return true;
            }
            if members.iter().any(|&i| !self.members[i].running()) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// The connect string of every member: `127.0.0.1:p1,127.0.0.1:p2,…`.
    pub fn connect_string(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The connect string of the TLS port of a server started with
    /// [`start_with_tls`](Self::start_with_tls): `tcp+tls://127.0.0.1:p`.
    pub fn tls_connect_string(&self) -> String {
        assert!(self.tls, "this ZooKeeper serves no TLS");
        format!("tcp+tls://127.0.0.1:{}", self.members[0].secure_port)
    }

    /// The client port of member `i`.
    pub fn port(&self, i: usize) -> u16 {
        self.members[i].port
    }

    /// How many members the ensemble has.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Always false: an ensemble has at least one member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The member that leads (an ensemble) or serves alone.
    pub fn leader(&self) -> Option<usize> {
        (0..self.members.len()).find(|&i| {
            four_letters(self.members[i].port, "srvr")
                .is_some_and(|r| r.contains("Mode: leader") || r.contains("Mode: standalone"))
        })
    }

    /// A number of `mntr` on member `i` (`zk_packets_received`,
    /// `zk_watch_count`, …).
    pub fn monitor(&self, i: usize, name: &str) -> Option<u64> {
        monitor_values(self.members[i].port)?.get(name)?.parse().ok()
    }

    /// SIGKILLs member `i`; its data directory stays.
    pub fn kill(&mut self, i: usize) {
        self.members[i].kill();
    }

    /// Starts member `i` again on its port and data.
    pub fn revive(&mut self, i: usize) {
        self.members[i].spawn().unwrap_or_else(|e| panic!("{e}"));
        assert!(
            self.wait_until_serving(&[i]),
            "member {i} did not serve again within 60 s"
        );
    }

    /// Whether member `i`'s process is alive.
    pub fn is_running(&mut self, i: usize) -> bool {
        self.members[i].running()
    }

    /// SIGSTOPs member `i`.
    pub fn pause(&self, i: usize) {
        kill(self.members[i].pid(), Signal::SIGSTOP).expect("SIGSTOP ZooKeeper");
    }

    /// SIGCONTs member `i`.
    pub fn resume(&self, i: usize) {
        kill(self.members[i].pid(), Signal::SIGCONT).expect("SIGCONT ZooKeeper");
    }
}

impl Drop for ZooKeeper {
    fn drop(&mut self) {
        for member in &mut self.members {
            member.kill();
        }
    }
}
