//! `postgres` processes on free loopback ports, each with a fresh data
//! directory made by `initdb`, owned by the test and killed when it ends
//! (also when the test process is killed). From Debian's `postgresql`,
//! which the README's test command installs when it is missing.
//!
//! `initdb` and `postgres` refuse to run as root. As root, the harness runs
//! them as the `postgres` user the package creates, by setting the child's
//! uid and gid itself rather than through `runuser`: a `runuser` between
//! the test and the server would take the test's SIGKILL (and its
//! parent-death signal) in the server's place and leave the server running.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::server::{free_port, spawn_owned};

/// The database every test server has, which [`Postgres::url`] names.
pub const DATABASE: &str = "locks";
/// The superuser `initdb` makes, trusted from loopback without a password.
pub const USER: &str = "locks";

/// One `postgres` child process (the postmaster).
#[derive(Debug)]
pub struct Postgres {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

/// Where Debian puts PostgreSQL's programs: `/usr/lib/postgresql/<major>/bin`
/// (the newest major installed), else `PATH`.
fn program(name: &str) -> PathBuf {
    let newest = std::fs::read_dir("/usr/lib/postgresql").ok().and_then(|majors| {
        majors
            .filter_map(Result::ok)
            .filter_map(|major| Some((major.file_name().to_str()?.parse::<u32>().ok()?, major.path())))
            .map(|(version, dir)| (version, dir.join("bin").join(name)))
            .filter(|(_, candidate)| candidate.is_file())
            .max_by_key(|(version, _)| *version)
            .map(|(_, candidate)| candidate)
    });
    newest.unwrap_or_else(|| PathBuf::from(name))
}

/// The uid and gid to run the server as: the `postgres` user's when this
/// process is root (the servers refuse root), else none (run as we are).
fn run_as() -> Option<(u32, u32)> {
    if !nix::unistd::Uid::effective().is_root() {
        return None;
    }
    let user = nix::unistd::User::from_name("postgres")
        .ok()
        .flatten()
        .unwrap_or_else(|| {
            panic!("running as root, and there is no `postgres` user to run PostgreSQL as; install postgresql (apt-get install postgresql)")
        });
    Some((user.uid.as_raw(), user.gid.as_raw()))
}

fn command_as(program: PathBuf, user: Option<(u32, u32)>) -> Command {
    let mut command = Command::new(program);
    if let Some((uid, gid)) = user {
        command.uid(uid).gid(gid);
    }
    command.stdin(Stdio::null());
    command
}

/// Small buffers, few connections: a test database holds a few hundred
/// rows and a few clients.
const SIZING: [(&str, &str); 3] = [
    ("shared_buffers", "16MB"),
    ("max_connections", "60"),
    ("max_wal_size", "64MB"),
];

impl Postgres {
    /// Initialises a data directory and starts a server on a free port
    /// with an empty database [`DATABASE`], reachable as [`USER`] without
    /// a password from loopback.
    pub fn start() -> Postgres {
        let user = run_as();
        let dir = tempfile::tempdir().expect("temp dir for postgres");
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .expect("give the data directory to the postgres user");
        }
        let output = command_as(program("initdb"), user)
            .arg("--pgdata")
            .arg(dir.path().join("data"))
            .args([
                "--username",
                USER,
                "--auth=trust",
                "--encoding=UTF8",
                "--no-locale",
            ])
            // The server fsyncs its own writes; initdb's files need not be.
            .arg("--no-sync")
            .output()
            .unwrap_or_else(|e| {
                panic!("cannot run initdb: {e}; install postgresql (apt-get install postgresql)")
            });
        assert!(
            output.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let mut server = Postgres {
            child: None,
            port: 0,
            dir,
        };
        // A port found free can be taken before the server binds it: retry.
        for _ in 0..20 {
            server.port = free_port();
            if server.spawn() {
                let created = server.run_psql("postgres", &format!("CREATE DATABASE {DATABASE}"));
                assert!(
                    created.status.success(),
                    "CREATE DATABASE: {}",
                    String::from_utf8_lossy(&created.stderr)
                );
                return server;
            }
        }
        panic!("could not start postgres on any free port");
    }

    fn spawn(&mut self) -> bool {
        let mut command = command_as(program("postgres"), run_as());
        command
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .arg("-p")
            .arg(self.port.to_string())
            // Its socket in its own directory, not /var/run/postgresql.
            .arg("-k")
            .arg(self.dir.path())
            .args(["-c", "listen_addresses=127.0.0.1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for (setting, value) in SIZING {
            command.arg("-c").arg(format!("{setting}={value}"));
        }
        let child = spawn_owned(command).unwrap_or_else(|e| {
            panic!("cannot run postgres: {e}; install postgresql (apt-get install postgresql)")
        });
        self.child = Some(child);
        self.wait_until_ready()
    }

    /// Waits until the server accepts connections; false if it exited first.
    /// Asked through its own socket directory, so that the answer is this
    /// server's: a port found free can be taken by another test's server
    /// before this one binds it, and that one answers on the port while
    /// this one is still failing to bind (it exits when it cannot).
    fn wait_until_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(_)) = child.try_wait()
            {
                return false;
            }
            let ready = Command::new(program("pg_isready"))
                .arg("-q")
                .arg("-h")
                .arg(self.dir.path())
                .args(["-U", USER, "-d", "postgres", "-p"])
                .arg(self.port.to_string())
                .stdin(Stdio::null())
                .status()
                .is_ok_and(|status| status.success());
            if ready {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://locks@127.0.0.1:PORT/locks`.
    pub fn url(&self) -> String {
        format!("postgres://{USER}@127.0.0.1:{}/{DATABASE}", self.port)
    }

    /// The server's data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Serves TLS with `cert` and `key` (PEM), copied into the data
    /// directory and given to its owner (the server reads a key only when
    /// no one else can), and puts `hba` in front of `pg_hba.conf`'s rules;
    /// both take effect at a reload, without a restart.
    pub fn serve_tls(&self, cert: &Path, key: &Path, hba: &str) {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let data = self.data_dir();
        let owner = std::fs::metadata(&data).expect("the data directory");
        for (from, to) in [(cert, "server.crt"), (key, "server.key")] {
            let copy = data.join(to);
            std::fs::copy(from, &copy).expect("copy a certificate into the data directory");
            std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o600))
                .expect("restrict the key");
            std::os::unix::fs::chown(&copy, Some(owner.uid()), Some(owner.gid()))
                .expect("give the certificate to the server's user");
        }
        let rules = data.join("pg_hba.conf");
        let before = std::fs::read_to_string(&rules).expect("pg_hba.conf");
        std::fs::write(&rules, format!("{hba}\n{before}")).expect("write pg_hba.conf");
        self.sql("ALTER SYSTEM SET ssl = on");
        assert_eq!(self.sql("SELECT pg_reload_conf()"), ["t"]);
    }

    /// A role `name` that logs in with `password` (`scram-sha-256` from
    /// loopback, in front of the trusted rules) and may create the lock
    /// table: a service's user rather than the superuser.
    pub fn add_password_role(&self, name: &str, password: &str) {
        self.sql(&format!("CREATE ROLE {name} LOGIN PASSWORD '{password}'"));
        self.sql(&format!("GRANT CREATE ON SCHEMA public TO {name}"));
        let rules = self.data_dir().join("pg_hba.conf");
        let before = std::fs::read_to_string(&rules).expect("pg_hba.conf");
        std::fs::write(
            &rules,
            format!("host all {name} 127.0.0.1/32 scram-sha-256\n{before}"),
        )
        .expect("write pg_hba.conf");
        assert_eq!(self.sql("SELECT pg_reload_conf()"), ["t"]);
    }

    /// A `psql` session in [`DATABASE`] that runs what is sent to it, in
    /// order, until dropped: for a transaction the test keeps open while
    /// clients run into it.
    pub fn session(&self) -> Session {
        let child = self
            .psql(DATABASE)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run psql: {e}; install postgresql (apt-get install postgresql)")
            });
        Session { child }
    }

    fn psql(&self, database: &str) -> Command {
        let mut command = Command::new(program("psql"));
        command
            .args([
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-U",
                USER,
                "-p",
            ])
            .arg(self.port.to_string())
            .args(["-d", database]);
        command
    }

    fn run_psql(&self, database: &str, sql: &str) -> Output {
        self.psql(database)
            .args(["-c", sql])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| {
                panic!("cannot run psql: {e}; install postgresql (apt-get install postgresql)")
            })
    }

    /// Runs `sql` in [`DATABASE`] with `psql` and returns its rows, each a
    /// line of `|`-separated columns.
    pub fn sql(&self, sql: &str) -> Vec<String> {
        let output = self.run_psql(DATABASE, sql);
        assert!(
            output.status.success(),
            "`{sql}` on the test PostgreSQL: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn pid(&self) -> Pid {
        let child = self.child.as_ref().expect("postgres is running");
        Pid::from_raw(i32::try_from(child.id()).expect("a pid"))
    }

    /// SIGKILLs the postmaster; its backends see it gone and exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // The backends hold the shared memory until they have noticed;
        // a restart before then is refused, and `revive` retries.
    }

    /// Starts the server again on its port and data directory (it replays
    /// its write-ahead log: what was committed survives).
    pub fn revive(&mut self) {
        for _ in 0..100 {
            if self.spawn() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("could not restart postgres on port {}", self.port);
    }

    /// SIGSTOPs the postmaster and every backend: the server keeps its
    /// connections and answers nothing.
    pub fn pause(&self) {
        self.signal_all(Signal::SIGSTOP);
    }

    /// SIGCONTs a paused server.
    pub fn resume(&self) {
        self.signal_all(Signal::SIGCONT);
    }

    /// Each backend is a process of its own, a child of the postmaster:
    /// `signal` goes to the postmaster and to each of them.
    fn signal_all(&self, signal: Signal) {
        let postmaster = self.pid();
        let _ = kill(postmaster, signal);
        for child in children_of(postmaster) {
            let _ = kill(child, signal);
        }
    }
}

/// The processes whose parent is `parent` (from `/proc`).
fn children_of(parent: Pid) -> Vec<Pid> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| parent_of(Path::new(&format!("/proc/{pid}/stat"))) == Some(parent.as_raw()))
        .map(Pid::from_raw)
        .collect()
}

/// The parent pid in a `/proc/<pid>/stat` file: the field after the
/// command name, which is in parentheses and may itself hold spaces.
fn parent_of(stat: &Path) -> Option<i32> {
    let text = std::fs::read_to_string(stat).ok()?;
    let after_name = &text[text.rfind(')')? + 1..];
    after_name.split_whitespace().nth(1)?.parse().ok()
}

/// An open `psql` session (see [`Postgres::session`]).
#[derive(Debug)]
pub struct Session {
    child: Child,
}

impl Session {
    /// Sends `sql` to the session; it runs once the server gets to it.
    pub fn send(&mut self, sql: &str) {
        use std::io::Write;
        let stdin = self.child.stdin.as_mut().expect("the session's input");
        writeln!(stdin, "{sql}").expect("write to psql");
        stdin.flush().expect("flush to psql");
    }

    /// Ends the input and waits for what was sent to have run.
    pub fn finish(mut self) {
        drop(self.child.stdin.take());
        let status = self.child.wait().expect("psql exits");
        assert!(status.success(), "the psql session failed: {status}");
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.resume();
        }
        self.kill();
    }
}
