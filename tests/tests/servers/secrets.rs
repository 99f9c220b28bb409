//! Passwords holding the characters that end a URL's userinfo (`@`, `/`,
//! `#`, `?`, `:`, `%`), on the SQL backends against real servers: written
//! raw or percent-encoded in a URL, or in a PostgreSQL key-value string,
//! the right one connects (and so does one of every printable character,
//! in a URL), and no piece of any of them shows in an error,
//! a `Debug`, a trace line or a metric label. (The Redis constructors are
//! tried with every printable character in `first_contact`.)
//!
//! Current-thread tests: the trace capture and the metrics recorder are
//! this thread's, and so are the client's tasks.

use std::time::Duration;

use lock_runtime::{LockClient, LockError};
use lock_tests::secrets::{
    assert_no_password, assert_nothing_shown, capture_tracing, hostile_passwords, url_passwords,
};
use lock_tests::{MariaDb, Postgres, free_port, percent_encode};
use metrics_util::debugging::DebuggingRecorder;

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

/// With `password` set on the server: each of `forms(password, port)`
/// connects; with a wrong password each is `InvalidConfig`; to a closed port
/// each fails (`unreachable`: a client with a short start-up wait, which a
/// closed port runs out); `bad_url` (which does not parse) is
/// `InvalidConfig` and says to percent-encode. None shows any piece of the
/// password.
async fn every_form_behaves(
    password: &str,
    port: u16,
    forms: impl Fn(&str, u16) -> Vec<String>,
    bad_url: &str,
    connect: impl AsyncFn(&str) -> Result<LockClient, LockError> + Copy,
    unreachable: impl AsyncFn(&str) -> Result<LockClient, LockError> + Copy,
) {
    for url in forms(password, port) {
        connects_and_keeps_it(&url, connect).await;
    }
    for url in forms(&format!("{password}-not"), port) {
        let e = fails_without_showing_it("a wrong password", &url, connect).await;
        assert!(matches!(e, LockError::InvalidConfig { .. }), "{e}");
    }
    for url in forms(password, free_port()) {
        fails_without_showing_it("no server", &url, unreachable).await;
    }
    let e = fails_without_showing_it("a bad URL", bad_url, connect).await;
    assert!(matches!(e, LockError::InvalidConfig { .. }), "{e}");
    assert!(e.to_string().contains("percent-encode"), "{e}");
}

/// A password of every printable ASCII character.
fn every_character() -> String {
    hostile_passwords()
        .pop()
        .expect("one password of every character")
}

/// `scheme://app:<password>@127.0.0.1:<port>/locks`, the password raw and
/// percent-encoded.
fn url_forms(scheme: &str, password: &str, port: u16) -> [String; 2] {
    [
        format!("{scheme}://app:{password}@127.0.0.1:{port}/locks"),
        format!(
            "{scheme}://app:{}@127.0.0.1:{port}/locks",
            percent_encode(password)
        ),
    ]
}

#[tokio::test]
async fn postgres_passwords_of_url_characters_connect_and_never_show() {
    lock_tests::bounded(
        "postgres_passwords_of_url_characters_connect_and_never_show",
        async move {
            let server = Postgres::start();
            server.add_password_role("app", "unset");
            let (captured, _tracing) = capture_tracing();
            let recorder = DebuggingRecorder::new();
            let _metrics = metrics::set_default_local_recorder(&recorder);
            // A loaded machine can take more than 300 ms to answer a
            // first connection (with its authentication); only a closed
            // port is given that little.
            let connect = async |url: &str| {
                LockClient::builder()
                    .startup_timeout(Duration::from_secs(10))
                    .postgres(url)
                    .await
            };
            let unreachable = async |url: &str| {
                LockClient::builder()
                    .startup_timeout(Duration::from_millis(300))
                    .postgres(url)
                    .await
            };
            for password in url_passwords() {
                server.sql(&format!("ALTER ROLE app PASSWORD '{password}'"));
                let forms = |password: &str, port: u16| {
                    vec![
                        format!("postgres://app:{password}@127.0.0.1:{port}/locks"),
                        format!(
                            "postgres://app:{}@127.0.0.1:{port}/locks",
                            percent_encode(password)
                        ),
                        format!("host=127.0.0.1 port={port} user=app password={password} dbname=locks"),
                        format!("host=127.0.0.1 port={port} user=app password = '{password}' dbname=locks"),
                    ]
                };
                let bad_url = format!("postgres://app:{password}@[::1/locks");
                every_form_behaves(&password, server.port(), forms, &bad_url, connect, unreachable).await;
                for url in [
                    format!("host=127.0.0.1 user=app password='{password} dbname=locks"),
                    format!("host=127.0.0.1 user=app password={password} sslmode=sometimes"),
                ] {
                    let e = fails_without_showing_it("a bad connection string", &url, connect).await;
                    assert!(matches!(e, LockError::InvalidConfig { .. }), "{e}");
                }
            }
            // And one of every printable character, in a URL, raw or
            // percent-encoded.
            let password = every_character();
            server.sql(&format!(
                "ALTER ROLE app PASSWORD '{}'",
                password.replace('\'', "''")
            ));
            for url in url_forms("postgres", &password, server.port()) {
                connects_and_keeps_it(&url, connect).await;
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
            let (captured, _tracing) = capture_tracing();
            let recorder = DebuggingRecorder::new();
            let _metrics = metrics::set_default_local_recorder(&recorder);
            // A loaded machine can take more than 300 ms to answer a
            // first connection (with its authentication); only a closed
            // port is given that little.
            let connect = async |url: &str| {
                LockClient::builder()
                    .startup_timeout(Duration::from_secs(10))
                    .mysql(url)
                    .await
            };
            let unreachable = async |url: &str| {
                LockClient::builder()
                    .startup_timeout(Duration::from_millis(300))
                    .mysql(url)
                    .await
            };
            for password in url_passwords() {
                server
                    .sql(&format!("ALTER USER 'app'@'%' IDENTIFIED BY '{password}'"))
                    .await;
                let forms = |password: &str, port: u16| {
                    vec![
                        format!("mysql://app:{password}@127.0.0.1:{port}/locks"),
                        format!("mysql://app:{}@127.0.0.1:{port}/locks", percent_encode(password)),
                    ]
                };
                let bad_url = format!("mysql://app:{password}@[::1/locks");
                every_form_behaves(&password, server.port(), forms, &bad_url, connect, unreachable).await;
            }
            let password = every_character();
            let quoted = password.replace('\\', "\\\\").replace('\'', "''");
            server
                .sql(&format!("ALTER USER 'app'@'%' IDENTIFIED BY '{quoted}'"))
                .await;
            for url in url_forms("mysql", &password, server.port()) {
                connects_and_keeps_it(&url, connect).await;
            }
            assert_nothing_shown(&captured, &recorder.snapshotter());
        },
    )
    .await
}

/// The lock's line in etcd's keys, for the grants below: `<root>/`.
const ETCD_LOCK_PREFIX: &str = "/distributed-locks/";

/// etcd with authentication on and tokens that expire after a second idle
/// (`--auth-token-ttl=1`): a user given before authentication is on is
/// refused; then a client without a user, with a wrong password,
/// or as a user without `readwrite` on the lock prefix is refused at
/// start-up with `InvalidConfig`; the lock user, whose password holds
/// `@ / # ? : %`, takes a lock and keeps it through renewals spaced wider
/// than the token's life (each finds its token expired and authenticates
/// again), and a second client gets it after the release. No piece of the
/// password, and no token, shows in an error, a `Debug`, a trace or a
/// metric label.
#[tokio::test]
async fn etcd_users_authenticate_again_past_the_token_ttl_and_never_show() {
    lock_tests::bounded(
        "etcd_users_authenticate_again_past_the_token_ttl_and_never_show",
        async move {
            let etcd = lock_tests::Etcd::start_secured(None, &["--auth-token=simple", "--auth-token-ttl=1"]);
            let endpoints = etcd.endpoints();
            let password = url_passwords().pop().expect("a password of every URL character");
            let mut admin = etcd_client::Client::connect(&endpoints, None)
                .await
                .expect("connect as the administrator");
            admin
                .user_add("root", "root-secret", None)
                .await
                .expect("add root");
            admin.user_grant_role("root", "root").await.expect("root is root");
            admin.role_add("locks").await.expect("add the locks role");
            let grant = etcd_client::Permission::read_write(ETCD_LOCK_PREFIX).with_prefix();
            admin
                .role_grant_permission("locks", grant)
                .await
                .expect("grant the prefix");
            admin
                .user_add("app", password.as_str(), None)
                .await
                .expect("add app");
            admin.user_grant_role("app", "locks").await.expect("app locks");
            admin
                .user_add("stranger", password.as_str(), None)
                .await
                .expect("add stranger");
            let endpoint_list: Vec<&str> = endpoints.iter().map(String::as_str).collect();
            let Err(e) = LockClient::builder()
                .etcd_user("app", password.as_str())
                .etcd(&endpoint_list)
                .await
            else {
                panic!("a user was taken by a cluster without authentication");
            };
            assert!(matches!(e, LockError::InvalidConfig { .. }), "{e}");
            assert!(e.to_string().contains("does not authenticate"), "{e}");
            admin.auth_enable().await.expect("auth enable");

            let (captured, _tracing) = capture_tracing();
            let recorder = DebuggingRecorder::new();
            let _metrics = metrics::set_default_local_recorder(&recorder);
            let endpoints: Vec<&str> = endpoints.iter().map(String::as_str).collect();
            // A lock's lease is two thirds of the 12 s etcd lease, renewed
            // every third of that (2.7 s): each renewal comes after the
            // token has expired (1 s idle) and etcd, which sweeps expired
            // tokens once a second, has removed it.
            let builder = || {
                LockClient::builder()
                    .startup_timeout(Duration::from_secs(2))
                    .etcd_lease_ttl(Duration::from_secs(12))
            };
            let refused = async |what: &str, builder: lock_runtime::LockClientBuilder, says: &str| {
                let shown = format!("{builder:?}");
                assert_no_password(what, &shown);
                let Err(e) = builder.etcd(&endpoints).await else {
                    panic!("{what}: a client started");
                };
                assert_no_password(what, &format!("{e} {e:?}"));
                assert!(matches!(e, LockError::InvalidConfig { .. }), "{what}: {e}");
                assert!(e.to_string().contains(says), "{what}: {e}");
            };
            refused("no user", builder(), "etcd_user").await;
            let wrong = format!("{password}-not");
            refused(
                "a wrong password",
                builder().etcd_user("app", wrong),
                "refused user `app`",
            )
            .await;
            refused(
                "a user without the grant",
                builder().etcd_user("stranger", password.as_str()),
                "readwrite on the prefix `/distributed-locks/`",
            )
            .await;

            let locks = builder()
                .etcd_user("app", password.as_str())
                .etcd(&endpoints)
                .await
                .expect("the lock user");
            let guard = locks.lock("k").acquire().await.expect("acquire as app");
            assert_no_password("a client and its guard", &format!("{locks:?} {guard:?}"));
            let mut renewed = 0;
            let mut valid_until = guard.valid_until();
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            while renewed < 3 {
                assert!(guard.is_held(), "the lock was lost after {renewed} renewals");
                assert!(tokio::time::Instant::now() < deadline, "3 renewals within 30 s");
                tokio::time::sleep(Duration::from_millis(100)).await;
                if guard.valid_until() > valid_until {
                    renewed += 1;
                    valid_until = guard.valid_until();
                }
            }
            assert!(guard.is_held(), "held through renewals past the token's life");
            let other = builder()
                .etcd_user("app", password.as_str())
                .etcd(&endpoints)
                .await
                .expect("a second client");
            let waiting = other.lock("k").wait(Duration::from_secs(10)).run(async {});
            let (released, got) = tokio::join!(guard.release(), waiting);
            released.expect("release as app");
            got.expect("the second client got the lock after the release");
            // No token shows either: the pattern is checked against a real
            // one, then against everything the clients showed.
            let token = admin
                .auth_client()
                .authenticate("app".to_owned(), password.clone())
                .await
                .expect("authenticate as app")
                .token()
                .to_owned();
            assert!(holds_a_simple_token(&token), "not a simple token: {token}");
            // The renewals, and the logins again they needed, ran on the
            // library's renewal thread: its traces are in the capture too.
            assert!(
                captured.text().contains("leases renewed"),
                "the renewal thread's traces were not captured"
            );
            let shown = format!("{} {locks:?} {other:?}", captured.text());
            assert!(!holds_a_simple_token(&shown), "a token shows: {shown}");
            assert_nothing_shown(&captured, &recorder.snapshotter());
        },
    )
    .await
}

/// Whether `text` holds an etcd simple token: 16 ASCII letters, a dot and
/// the auth store's index, cut off by anything else on both sides.
fn holds_a_simple_token(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.iter().enumerate().any(|(dot, &b)| {
        let Some(start) = dot.checked_sub(16) else {
            return false;
        };
        let digits = bytes[dot + 1..].iter().take_while(|b| b.is_ascii_digit()).count();
        b == b'.'
            && bytes[start..dot].iter().all(u8::is_ascii_alphabetic)
            && (start == 0 || !bytes[start - 1].is_ascii_alphanumeric())
            && digits > 0
            && bytes
                .get(dot + 1 + digits)
                .is_none_or(|b| !b.is_ascii_alphanumeric())
    })
}

/// ZooKeeper's digest identity with a password of each URL character: it
/// takes and gives back a lock under a root of its own; the same user with
/// a wrong password (another identity, to ZooKeeper) is refused at
/// start-up with `InvalidConfig`. No piece of the password shows in an
/// error, a `Debug`, a trace or a metric label.
#[tokio::test]
async fn zookeeper_digest_passwords_never_show() {
    lock_tests::bounded("zookeeper_digest_passwords_never_show", async move {
        let zk = lock_tests::ZooKeeper::start();
        let connect_string = zk.connect_string();
        let (captured, _tracing) = capture_tracing();
        let recorder = DebuggingRecorder::new();
        let _metrics = metrics::set_default_local_recorder(&recorder);
        for (i, password) in url_passwords().into_iter().enumerate() {
            let root = format!("/digest-{i}");
            let builder = |password: &str| {
                LockClient::builder()
                    .startup_timeout(Duration::from_secs(5))
                    .zookeeper_root(&root)
                    .zookeeper_digest("locks", password)
            };
            assert_no_password("a builder", &format!("{:?}", builder(&password)));
            let locks = builder(&password)
                .zookeeper(&connect_string)
                .await
                .unwrap_or_else(|e| panic!("the right password was refused: {e}"));
            let guard = locks.lock("k").acquire().await.expect("acquire");
            assert_no_password("a client and its guard", &format!("{locks:?} {guard:?}"));
            guard.release().await.expect("release");
            let Err(e) = builder(&format!("{password}-not"))
                .zookeeper(&connect_string)
                .await
            else {
                panic!("a wrong password was let in");
            };
            assert_no_password("a wrong password", &format!("{e} {e:?}"));
            assert!(matches!(e, LockError::InvalidConfig { .. }), "{e}");
        }
        assert_nothing_shown(&captured, &recorder.snapshotter());
    })
    .await
}
