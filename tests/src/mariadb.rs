//! `mariadbd` processes on free loopback ports, each with a fresh data
//! directory, owned by the test and killed when it ends (also when the test
//! process is killed). From Debian's `mariadb-server`, which the README's
//! test command installs when it is missing.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::server::{free_port, spawn_owned};

/// The database every test server has, which [`MariaDb::url`] names.
pub const DATABASE: &str = "locks";

/// One `mariadbd` child process.
#[derive(Debug)]
pub struct MariaDb {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    /// Options of the server's own beyond the harness's (TLS).
    options: Vec<String>,
}

/// A program of Debian's `mariadb-server`: on `PATH`, else in `/usr/sbin` or
/// `/usr/bin`, where Debian puts them.
fn program(name: &str) -> PathBuf {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    });
    on_path
        .or_else(|| {
            ["/usr/sbin", "/usr/bin"]
                .iter()
                .map(|dir| PathBuf::from(dir).join(name))
                .find(|candidate| candidate.is_file())
        })
        .unwrap_or_else(|| PathBuf::from(name))
}

/// Small buffers and logs: a test database holds a few hundred rows.
const SIZING: [&str; 3] = [
    "--innodb-buffer-pool-size=16M",
    "--innodb-log-file-size=4M",
    "--skip-log-bin",
];

impl MariaDb {
    /// Initialises a data directory and starts a server on a free port
    /// with an empty database [`DATABASE`], reachable as `root` without a
    /// password from loopback.
    pub fn start() -> MariaDb {
        Self::start_with(Vec::new())
    }

    /// A server that also serves TLS with `cert` and `key` (PEM), signed
    /// by a CA the client must be given. Plain connections are still
    /// taken until [`require_tls`](Self::require_tls).
    pub fn start_tls(cert: &std::path::Path, key: &std::path::Path) -> MariaDb {
        Self::start_with(vec![
            format!("--ssl-cert={}", cert.display()),
            format!("--ssl-key={}", key.display()),
        ])
    }

    /// From now on the server refuses connections without TLS, the
    /// harness's own too (`require_secure_transport`).
    pub async fn require_tls(&self) {
        self.sql("SET GLOBAL require_secure_transport = ON").await;
    }

    fn start_with(options: Vec<String>) -> MariaDb {
        let dir = tempfile::tempdir().expect("temp dir for mariadbd");
        let data = dir.path().join("data");
        let tmp = dir.path().join("tmp");
        std::fs::create_dir_all(&tmp).expect("the server's tmpdir");
        let output = Command::new(program("mariadb-install-db"))
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            // Its own tmpdir: bootstraps running side by side in `/tmp`
            // were seen to trip over each other's temporary tables.
            .arg(format!("--tmpdir={}", tmp.display()))
            .args(["--user=root", "--auth-root-authentication-method=normal", "--skip-test-db"])
            .args(SIZING)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| {
                panic!("cannot run mariadb-install-db: {e}; install mariadb-server (apt-get install mariadb-server)")
            });
        assert!(
            output.status.success(),
            "mariadb-install-db failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let mut server = MariaDb {
            child: None,
            port: 0,
            dir,
            options,
        };
        // A port found free can be taken before the server binds it: retry.
        for _ in 0..20 {
            server.port = free_port();
            if server.spawn() {
                let no_database = format!("mysql://root@127.0.0.1:{}/", server.port);
                block_on(server.sql_at(&no_database, &format!("CREATE DATABASE {DATABASE}")));
                return server;
            }
        }
        panic!("could not start mariadbd on any free port");
    }

    fn spawn(&mut self) -> bool {
        let data = self.dir.path().join("data");
        let mut command = Command::new(program("mariadbd"));
        command
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--port={}", self.port))
            .arg(format!("--socket={}", self.dir.path().join("sock").display()))
            .arg(format!("--pid-file={}", self.dir.path().join("pid").display()))
            .arg(format!(
                "--log-error={}",
                self.dir.path().join("error.log").display()
            ))
            .arg(format!("--tmpdir={}", self.dir.path().join("tmp").display()))
            .args(["--bind-address=127.0.0.1", "--user=root", "--skip-name-resolve"])
            .args(SIZING)
            .args(&self.options)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = spawn_owned(command).unwrap_or_else(|e| {
            panic!("cannot run mariadbd: {e}; install mariadb-server (apt-get install mariadb-server)")
        });
        self.child = Some(child);
        self.wait_until_ready()
    }

    /// Waits until this server answers a query on its port; false if it
    /// exited first. The answer must come from this server (its data
    /// directory): a port found free can be taken by another test's server
    /// before this one binds it, and that one answers while this one is
    /// still failing to bind.
    fn wait_until_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(30);
        let opts = mysql_async::OptsBuilder::default()
            .ip_or_hostname("127.0.0.1")
            .tcp_port(self.port)
            .user(Some("root"));
        let ours = self.dir.path().join("data");
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(_)) = child.try_wait()
            {
                return false;
            }
            let opts = opts.clone();
            let answered = block_on(async {
                let Ok(mut conn) = mysql_async::Conn::new(opts).await else {
                    return false;
                };
                let datadir: Option<String> = conn.query_first("SELECT @@datadir").await.ok().flatten();
                let _ = conn.disconnect().await;
                datadir.is_some_and(|d| std::path::Path::new(d.trim_end_matches('/')) == ours)
            });
            if answered {
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

    /// `mysql://root@127.0.0.1:PORT/locks`.
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/{DATABASE}", self.port)
    }

    /// The URL of database [`DATABASE`] as `user` with `password`.
    pub fn url_as(&self, user: &str, password: &str) -> String {
        format!(
            "mysql://{user}:{}@127.0.0.1:{}/{DATABASE}",
            crate::percent_encode(password),
            self.port
        )
    }

    /// Runs `sql` as root in [`DATABASE`] and returns the rows, each column
    /// as text (`None` for NULL).
    pub async fn sql(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        self.sql_at(&self.url(), sql).await
    }

    async fn sql_at(&self, url: &str, sql: &str) -> Vec<Vec<Option<String>>> {
        let mut conn = mysql_async::Conn::from_url(url)
            .await
            .expect("connect to the test MariaDB");
        conn.query_drop("SET time_zone = '+00:00'")
            .await
            .expect("time zone");
        let rows: Vec<mysql_async::Row> = conn
            .query(sql)
            .await
            .unwrap_or_else(|e| panic!("`{sql}` on the test MariaDB: {e}"));
        let _ = conn.disconnect().await;
        rows.into_iter()
            .map(|row| {
                (0..row.len())
                    .map(|i| {
                        row.as_ref(i).and_then(|v| match v {
                            mysql_async::Value::NULL => None,
                            mysql_async::Value::Bytes(b) => Some(String::from_utf8_lossy(b).into_owned()),
                            other => Some(other.as_sql(true).trim_matches('\'').to_owned()),
                        })
                    })
                    .collect()
            })
            .collect()
    }

    /// [`sql`](Self::sql) from synchronous code.
    pub fn block_on_sql(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        block_on(self.sql(sql))
    }

    /// The one value `sql` returns, as text.
    pub async fn value(&self, sql: &str) -> Option<String> {
        self.sql(sql)
            .await
            .into_iter()
            .next()
            .and_then(|row| row.into_iter().next().flatten())
    }

    /// The server's process id.
    pub fn pid(&self) -> Pid {
        let id = self.child.as_ref().expect("server is running").id();
        Pid::from_raw(i32::try_from(id).expect("pid fits i32"))
    }

    /// SIGKILLs the server; its data directory stays.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on its port and data directory (InnoDB
    /// recovers what was committed).
    pub fn revive(&mut self) {
        for _ in 0..100 {
            if self.spawn() {
                return;
            }
            // The old process's port may take a moment to be free.
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("could not restart mariadbd on port {}", self.port);
    }

    /// SIGSTOPs the server: it keeps its connections and answers nothing.
    pub fn pause(&self) {
        kill(self.pid(), Signal::SIGSTOP).expect("SIGSTOP mariadbd");
    }

    /// SIGCONTs a paused server.
    pub fn resume(&self) {
        kill(self.pid(), Signal::SIGCONT).expect("SIGCONT mariadbd");
    }
}

impl Drop for MariaDb {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_ref() {
            let _ = kill(
                Pid::from_raw(i32::try_from(child.id()).unwrap_or(0)),
                Signal::SIGCONT,
            );
        }
        self.kill();
    }
}

/// Runs the harness's own queries from synchronous code, on a thread of
/// its own: the caller may be a test's runtime thread, where a runtime
/// cannot be started.
fn block_on<F>(work: F) -> F::Output
where
    F: std::future::Future + Send,
    F::Output: Send,
{
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime for the MariaDB harness")
                    .block_on(work)
            })
            .join()
            .expect("the MariaDB harness thread")
    })
}
