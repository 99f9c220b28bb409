//! Passwords holding the characters that end a URL's userinfo (`@`, `/`,
//! `#`, `?`, `:`, `%`), on the SQL backends against real servers: written
//! raw or percent-encoded in a URL, or in a PostgreSQL key-value string,
//! the right one connects, and no piece of any of them shows in an error,
//! a `Debug`, a trace line or a metric label. (The Redis constructors are
//! tried with every printable character in `first_contact`.)
//!
//! Current-thread tests: the trace capture and the metrics recorder are
//! this thread's, and so are the client's tasks.

use std::time::Duration;

use lock_runtime::{LockClient, LockError};
use lock_tests::secrets::{Captured, assert_no_password, capture_tracing, url_passwords};
use lock_tests::{MariaDb, Postgres, free_port, percent_encode};
use metrics_util::debugging::{DebuggingRecorder, Snapshotter};
use tracing::subscriber::DefaultGuard;

/// Everything this thread traces and every metric label it records, from
/// `watch` on; `assert_nothing_shown` checks them.
fn watch() -> (Captured, DefaultGuard, DebuggingRecorder) {
    let (captured, tracing) = capture_tracing();
    (captured, tracing, DebuggingRecorder::new())
}

/// No trace line and no metric label holds a piece of a password, and
/// something was traced and labelled (else the check saw nothing).
fn assert_nothing_shown(captured: &Captured, snapshotter: &Snapshotter) {
    let traced = captured.text();
    assert_no_password("tracing output", &traced);
    assert!(!traced.is_empty(), "nothing was traced: the check saw nothing");
    let labels = labels(snapshotter);
    assert_no_password("metric labels", &labels);
    assert!(
        !labels.is_empty(),
        "no metric was labelled: the check saw nothing"
    );
}

/// Every metric label recorded, as `name=value` lines.
fn labels(recorder: &Snapshotter) -> String {
    recorder
        .snapshot()
        .into_vec()
        .into_iter()
        .flat_map(|(key, ..)| {
            key.key()
                .labels()
                .map(|l| format!("{}={}\n", l.key(), l.value()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// A client on `url` takes and gives back a lock, and shows no password.
async fn connects_and_keeps_it(url: &str, connect: impl AsyncFn(&str) -> Result<LockClient, LockError>) {
    let locks = match connect(url).await {
        Ok(locks) => locks,
        Err(e) => panic!("the right password, written as {url:?}, was refused: {e}"),
    };
    let guard = locks.lock("k").acquire().await.expect("acquire");
    assert_no_password(url, &format!("{locks:?} {guard:?}"));
    guard.release().await.expect("release");
}

/// `url` fails to start a client, with an error that shows no password.
async fn fails_without_showing_it(
    what: &str,
    url: &str,
    connect: impl AsyncFn(&str) -> Result<LockClient, LockError>,
) -> LockError {
    let Err(e) = connect(url).await else {
        panic!("{what}: {url:?} started a client");
    };
    assert_no_password(&format!("{what}: {url:?}"), &format!("{e} {e:?}"));
    e
}

#[tokio::test]
async fn postgres_passwords_of_url_characters_connect_and_never_show() {
    lock_tests::bounded(
        "postgres_passwords_of_url_characters_connect_and_never_show",
        async move {
            let server = Postgres::start();
            server.add_password_role("app", "unset");
            let (captured, _tracing, recorder) = watch();
            let _metrics = metrics::set_default_local_recorder(&recorder);
            let connect = async |url: &str| {
                LockClient::builder()
                    .startup_timeout(Duration::from_millis(300))
                    .postgres(url)
                    .await
            };
            let closed = free_port();
            for password in url_passwords() {
                server.sql(&format!("ALTER ROLE app PASSWORD '{password}'"));
                let forms = |password: &str, port: u16| {
                    [
                        format!("postgres://app:{password}@127.0.0.1:{port}/locks"),
                        format!(
                            "postgres://app:{}@127.0.0.1:{port}/locks",
                            percent_encode(password)
                        ),
                        format!("host=127.0.0.1 port={port} user=app password={password} dbname=locks"),
                        format!("host=127.0.0.1 port={port} user=app password = '{password}' dbname=locks"),
                    ]
                };
                for url in forms(&password, server.port()) {
                    connects_and_keeps_it(&url, connect).await;
                }
                for url in forms(&format!("{password}-not"), server.port()) {
                    let e = fails_without_showing_it("a wrong password", &url, connect).await;
                    assert!(matches!(e, LockError::InvalidConfig { .. }), "{e}");
                }
                for url in forms(&password, closed) {
                    fails_without_showing_it("no server", &url, connect).await;
                }
                for url in [
                    format!("postgres://app:{password}@[::1/locks"),
                    format!("host=127.0.0.1 user=app password='{password} dbname=locks"),
                    format!("host=127.0.0.1 user=app password={password} sslmode=sometimes"),
                ] {
                    let e = fails_without_showing_it("a bad URL", &url, connect).await;
                    assert!(matches!(e, LockError::InvalidConfig { .. }), "{e}");
                }
            }
            assert_nothing_shown(&captured, &recorder.snapshotter());
        },
    )
    .await
}

#[tokio::test]
async fn mysql_passwords_of_url_characters_connect_and_never_show() {
    lock_tests::bounded(
        "mysql_passwords_of_url_characters_connect_and_never_show",
        async move {
            let server = MariaDb::start();
            server.sql("CREATE USER 'app'@'%' IDENTIFIED BY 'unset'").await;
            server
                .sql("GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON locks.* TO 'app'@'%'")
                .await;
            let (captured, _tracing, recorder) = watch();
            let _metrics = metrics::set_default_local_recorder(&recorder);
            let connect = async |url: &str| {
                LockClient::builder()
                    .startup_timeout(Duration::from_millis(300))
                    .mysql(url)
                    .await
            };
            let closed = free_port();
            for password in url_passwords() {
                server
                    .sql(&format!("ALTER USER 'app'@'%' IDENTIFIED BY '{password}'"))
                    .await;
                let forms = |password: &str, port: u16| {
                    [
                        format!("mysql://app:{password}@127.0.0.1:{port}/locks"),
                        format!("mysql://app:{}@127.0.0.1:{port}/locks", percent_encode(password)),
                    ]
                };
                for url in forms(&password, server.port()) {
                    connects_and_keeps_it(&url, connect).await;
                }
                for url in forms(&format!("{password}-not"), server.port()) {
                    let e = fails_without_showing_it("a wrong password", &url, connect).await;
                    assert!(matches!(e, LockError::InvalidConfig { .. }), "{e}");
                }
                for url in forms(&password, closed) {
                    fails_without_showing_it("no server", &url, connect).await;
                }
                let url = format!("mysql://app:{password}@[::1/locks");
                let e = fails_without_showing_it("a bad URL", &url, connect).await;
                assert!(matches!(e, LockError::InvalidConfig { .. }), "{e}");
            }
            assert_nothing_shown(&captured, &recorder.snapshotter());
        },
    )
    .await
}
