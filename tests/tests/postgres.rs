//! The test PostgreSQL (`lock_tests::Postgres`): `initdb` and `postgres`
//! from Debian's `postgresql`, on a free loopback port in a fresh
//! directory (as the `postgres` user when the tests run as root). The
//! PostgreSQL backend's tests (issue #33) start their servers this way, and
//! its fault scenarios kill, restart and stop them: each of those is
//! checked here first.

use std::process::{Command, Stdio};
use std::time::Duration;

use lock_tests::Postgres;

/// Whether the server at `port` accepts a connection within a second.
fn answers(port: u16) -> bool {
    Command::new("timeout")
        .args(["3", "bash", "-c"])
        .arg(format!("exec 3<>/dev/tcp/127.0.0.1/{port} && echo ok"))
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn a_test_server_starts_and_keeps_committed_rows_across_a_kill_and_restart() {
    let mut server = Postgres::start();
    assert!(server.url().starts_with("postgres://locks@127.0.0.1:"));
    server.sql("CREATE TABLE kept (id int PRIMARY KEY)");
    server.sql("INSERT INTO kept VALUES (1), (2)");
    // The database's clock, which the backend will judge expiry by.
    let now = server.sql("SELECT clock_timestamp() < clock_timestamp() + interval '1 second'");
    assert_eq!(now, ["t"]);

    let port = server.port();
    server.kill();
    assert!(!answers(port), "the killed server still accepts connections");
    server.revive();
    assert_eq!(server.port(), port, "restarted on its port");
    assert_eq!(
        server.sql("SELECT count(*) FROM kept"),
        ["2"],
        "committed rows lost"
    );
}

#[test]
fn a_paused_server_answers_nothing_until_resumed() {
    let server = Postgres::start();
    server.pause();
    let psql = std::thread::scope(|scope| {
        let query = scope.spawn(|| server.sql("SELECT 41 + 1"));
        // The query cannot finish while every process of the server is
        // stopped: give it a moment to show it would, then resume.
        let stopped_for = Duration::from_millis(500);
        let began = std::time::Instant::now();
        while began.elapsed() < stopped_for {
            assert!(!query.is_finished(), "a stopped server answered");
            std::thread::sleep(Duration::from_millis(20));
        }
        server.resume();
        query.join().expect("the query's thread")
    });
    assert_eq!(psql, ["42"]);
}
