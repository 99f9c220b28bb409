//! `rediss://` with the `tls` feature, against a `redis-server` serving TLS
//! with a certificate from a CA the test makes (with the `openssl` command,
//! which the README's test command installs).

use std::time::Duration;

use lock_runtime::{LockClient, LockError};
use lock_tests::{RedisServer, free_port, make_certificates, make_client_certificate};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_over_tls_with_a_private_ca() {
    lock_tests::bounded("locks_over_tls_with_a_private_ca", async move {
        let certs = tempfile::tempdir().expect("cert dir");
        make_certificates(certs.path());
        let (server, tls_port) = RedisServer::start_serving_tls(certs.path());
        let url = format!("rediss://127.0.0.1:{tls_port}/");
        let ca = std::fs::read(certs.path().join("ca.crt")).expect("read ca.crt");

        // The server's certificate is not signed by any root the system trusts.
        let err = LockClient::builder()
            .command_timeout(Duration::from_secs(2))
            .connect(&url)
            .await
            .expect_err("an unknown issuer is refused");
        assert_certificate_refused("Redis", &err);
        // A plain client at the TLS port is closed on, as by a server going
        // down; only a TLS server answers a TLS hello, so it is told apart
        // and refused at once.
        let err = patient()
            .connect(&format!("redis://127.0.0.1:{tls_port}/"))
            .await
            .expect_err("plain to the TLS port");
        assert_plain_refused("Redis", &err);
        // A TLS client at a plain port (the server's own) cannot be told
        // from a server not answering yet: Redis waits for the rest of a
        // command line that never comes. It is waited for, then reported.
        let err = LockClient::builder()
            .tls_root_certificate(ca.clone())
            .command_timeout(Duration::from_millis(200))
            .startup_timeout(Duration::from_millis(500))
            .connect(&format!("rediss://127.0.0.1:{}/", server.port()))
            .await
            .expect_err("TLS to a plain port");
        assert!(err.to_string().contains("not ready within 500ms"), "{err}");

        let locks = LockClient::builder()
            .tls_root_certificate(ca)
            .connect(&url)
            .await
            .expect("trusting the private CA");
        let guard = locks.lock("tls:1").acquire().await.expect("lock over TLS");
        let exists: i64 = server.query(redis::cmd("EXISTS").arg("lock:{tls:1}"));
        assert_eq!(exists, 1, "the lock went to the TLS server");
        // A waiter's release notification arrives over a TLS subscription too.
        let waiter = locks.clone();
        let waiting = tokio::spawn(async move {
            waiter
                .lock("tls:1")
                .wait(Duration::from_secs(5))
                .run(async {})
                .await
        });
        lock_tests::until_waiting(&server, "tls:1").await;
        guard.release().await.expect("release over TLS");
        tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the waiter got in")
            .expect("join")
            .expect("lock after release");
    })
    .await
}

/// A Sentinel deployment behind TLS: the sentinel reached at `rediss://`
/// with the private CA, and the master it names reached over TLS too,
/// verified against the same CA (it was reached in clear text, its
/// password with it): the master's plain port sees no client of the lock
/// but the test's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_over_tls_reaches_its_master_over_tls() {
    lock_tests::bounded("sentinel_over_tls_reaches_its_master_over_tls", async move {
        let certs = tempfile::tempdir().expect("cert dir");
        make_certificates(certs.path());
        let ca = std::fs::read(certs.path().join("ca.crt")).expect("read ca.crt");
        let group = lock_tests::sentinel::TlsGroup::start(certs.path());
        // Refused at the first attempt, as on one node: waiting cannot mend
        // a certificate the system does not trust, nor a plain URL.
        let connect = async |builder: lock_runtime::LockClientBuilder, url: String| {
            let started = std::time::Instant::now();
            let refused = builder
                .sentinel(lock_tests::sentinel::MASTER_NAME, [url])
                .await
                .expect_err("refused");
            (refused, started.elapsed())
        };
        let (unverified, took) = connect(patient(), group.sentinel_url()).await;
        assert_certificate_refused("Sentinel", &unverified);
        assert!(
            took < Duration::from_secs(10),
            "waited {took:?} for a certificate"
        );
        let (plain, took) = connect(patient(), group.plain_url_to_tls_port()).await;
        assert_plain_refused("Sentinel", &plain);
        assert!(took < Duration::from_secs(10), "waited {took:?} for a plain URL");

        let locks = LockClient::builder()
            .tls_root_certificate(ca)
            .sentinel(lock_tests::sentinel::MASTER_NAME, [group.sentinel_url()])
            .await
            .expect("the sentinel and its master over TLS, with the private CA");
        let guard = locks.lock("tls:s").acquire().await.expect("lock over TLS");
        let exists: i64 = group.master.query(redis::cmd("EXISTS").arg("lock:{tls:s}"));
        assert_eq!(exists, 1, "the lock went to the master");
        let on_plain = clients_on_plain_port(&group.master);
        assert!(on_plain.is_empty(), "clients on the plain port: {on_plain:?}");
        let clients: String = group.master.query(redis::cmd("CLIENT").arg("LIST"));
        let tls = format!("laddr=127.0.0.1:{} ", group.master_tls_port);
        assert!(clients.contains(&tls), "no client on the TLS port: {clients}");
        guard.release().await.expect("release over TLS");
    })
    .await
}

/// PostgreSQL with `sslmode=require` and the `tls` feature: the server is
/// verified (an unknown issuer refused), and every connection, the release
/// listener's too, goes over TLS; `pg_hba.conf` refuses the role anything
/// else, so a lock taken proves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_over_tls_with_a_private_ca() {
    lock_tests::bounded("postgres_over_tls_with_a_private_ca", async move {
        let certs = tempfile::tempdir().expect("cert dir");
        make_certificates(certs.path());
        let server = lock_tests::Postgres::start();
        server.sql("CREATE ROLE app LOGIN");
        server.sql("GRANT CREATE ON SCHEMA public TO app");
        server.serve_tls(
            &certs.path().join("server.crt"),
            &certs.path().join("server.key"),
            "hostssl all app 127.0.0.1/32 trust\nhostnossl all app 127.0.0.1/32 reject",
        );
        let url = |mode: &str| format!("postgres://app@127.0.0.1:{}/locks?sslmode={mode}", server.port());
        let ca = std::fs::read(certs.path().join("ca.crt")).expect("read ca.crt");

        let unverified = LockClient::builder()
            .command_timeout(Duration::from_secs(2))
            .postgres(&url("require"))
            .await
            .expect_err("an unknown issuer is refused");
        assert_certificate_refused("PostgreSQL", &unverified);
        let plain = LockClient::builder()
            .command_timeout(Duration::from_secs(2))
            .postgres(&url("disable"))
            .await
            .expect_err("the role may not connect without TLS");
        assert!(matches!(plain, LockError::InvalidConfig { .. }), "{plain}");
        assert!(plain.to_string().contains("no encryption"), "{plain}");
        assert!(!plain.to_string().contains("not ready"), "refused at once: {plain}");

        let locks = LockClient::builder()
            .tls_root_certificate(ca)
            .postgres(&url("require"))
            .await
            .expect("trusting the private CA");
        let guard = locks
            .lock("tls:1")
            .fencing(true)
            .acquire()
            .await
            .expect("lock over TLS");
        let other = LockClient::builder()
            .tls_root_certificate(std::fs::read(certs.path().join("ca.crt")).expect("read ca.crt"))
            .postgres(&url("require"))
            .await
            .expect("a second client");
        // The other client's waiter hears the release on its TLS listener.
        let waiting = tokio::spawn(async move {
            other
                .lock("tls:1")
                .wait(Duration::from_secs(10))
                .run(async {})
                .await
        });
        let encrypted = lock_tests::eventually(Duration::from_secs(10), || {
            server.sql("SELECT count(*) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) WHERE usename = 'app' AND NOT ssl")
                == ["0"]
                && server.sql("SELECT count(*) >= 2 FROM pg_stat_activity WHERE usename = 'app'") == ["t"]
        })
        .await;
        assert!(encrypted.is_some(), "the app's connections are all encrypted");
        guard.release().await.expect("release over TLS");
        tokio::time::timeout(Duration::from_secs(15), waiting)
            .await
            .expect("the waiter got in")
            .expect("join")
            .expect("lock after release");
    })
    .await
}

/// MySQL (MariaDB) with `require_ssl=true` and the `tls` feature: the
/// server is verified (an unknown issuer refused at once, a URL that turns
/// verification off refused), and the lock user may only connect over TLS
/// (`REQUIRE SSL`), so a lock taken proves every connection is encrypted.
/// Once the server requires TLS of everyone, a plain URL is refused at once
/// with a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_over_tls_with_a_private_ca() {
    lock_tests::bounded("mysql_over_tls_with_a_private_ca", async move {
        let certs = tempfile::tempdir().expect("cert dir");
        make_certificates(certs.path());
        let server = lock_tests::MariaDb::start_tls(
            &certs.path().join("server.crt"),
            &certs.path().join("server.key"),
        );
        server.sql("CREATE USER 'app'@'%' REQUIRE SSL").await;
        server
            .sql("GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON locks.* TO 'app'@'%'")
            .await;
        let port = server.port();
        let tls_url = format!("mysql://app@127.0.0.1:{port}/locks?require_ssl=true");
        let ca = std::fs::read(certs.path().join("ca.crt")).expect("read ca.crt");
        let quick = || LockClient::builder().command_timeout(Duration::from_secs(2));

        let unverified = quick()
            .mysql(&tls_url)
            .await
            .expect_err("an unknown issuer is refused");
        assert_certificate_refused("MariaDB", &unverified);
        for off in ["verify_ca=false", "verify_identity=false"] {
            let err = quick()
                .tls_root_certificate(ca.clone())
                .mysql(&format!("{tls_url}&{off}"))
                .await
                .expect_err("verification cannot be turned off");
            assert!(matches!(err, LockError::InvalidConfig { .. }), "{err}");
            assert!(err.to_string().contains(off), "{err}");
        }

        let locks = quick()
            .tls_root_certificate(ca.clone())
            .mysql(&tls_url)
            .await
            .expect("trusting the private CA");
        let guard = locks
            .lock("tls:1")
            .fencing(true)
            .acquire()
            .await
            .expect("lock over TLS");
        let other = quick()
            .tls_root_certificate(ca.clone())
            .mysql(&tls_url)
            .await
            .expect("a second client");
        let waiting = tokio::spawn(async move {
            other
                .lock("tls:1")
                .wait(Duration::from_secs(10))
                .run(async {})
                .await
        });
        guard.release().await.expect("release over TLS");
        tokio::time::timeout(Duration::from_secs(15), waiting)
            .await
            .expect("the waiter got in")
            .expect("join")
            .expect("lock after release");

        // Refused credentials over TLS: said as such, with no word of TLS.
        let wrong = quick()
            .tls_root_certificate(ca.clone())
            .mysql(&format!(
                "mysql://app:not-this@127.0.0.1:{port}/locks?require_ssl=true"
            ))
            .await
            .expect_err("a wrong password");
        assert!(matches!(wrong, LockError::InvalidConfig { .. }), "{wrong}");
        assert!(wrong.to_string().contains("Access denied"), "{wrong}");
        assert!(!wrong.to_string().contains("requires TLS"), "{wrong}");

        server.require_tls().await;
        let plain = quick()
            .mysql(&format!("mysql://root@127.0.0.1:{port}/locks"))
            .await
            .expect_err("the server takes no plain connection");
        assert!(matches!(plain, LockError::InvalidConfig { .. }), "{plain}");
        assert!(
            plain
                .to_string()
                .contains("if the server or the user requires TLS, add `require_ssl=true`"),
            "{plain}"
        );
        assert!(
            !plain.to_string().contains("not ready"),
            "refused at once: {plain}"
        );
    })
    .await
}

/// etcd at `https://` endpoints with the `tls` feature, started with
/// `--client-cert-auth`: the member is verified (an unknown issuer refused
/// at once), it lets in only a client showing a certificate its CA signed,
/// a plain `http://` client is refused, and with the CA and the client's
/// certificate a lock is taken and handed to a waiter (the watch goes over
/// TLS too). Bad settings are refused before any connection, and no error
/// or `Debug` shows the private key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_over_mutual_tls_with_a_private_ca() {
    lock_tests::bounded("etcd_over_mutual_tls_with_a_private_ca", async move {
        let (captured, _tracing) = lock_tests::secrets::capture_tracing();
        let certs = tempfile::tempdir().expect("cert dir");
        make_certificates(certs.path());
        make_client_certificate(certs.path(), "locks");
        make_client_certificate(certs.path(), "stranger");
        let path = |name: &str| certs.path().join(name);
        let read = |name: &str| std::fs::read(path(name)).expect("read a certificate file");
        let ca_flag = format!("--trusted-ca-file={}", path("ca.crt").display());
        let etcd = lock_tests::Etcd::start_secured(
            Some((&path("server.crt"), &path("server.key"))),
            &["--client-cert-auth", &ca_flag],
        );
        let endpoints = etcd.endpoints();
        let endpoints: Vec<&str> = endpoints.iter().map(String::as_str).collect();
        assert!(endpoints[0].starts_with("https://"), "{endpoints:?}");
        let (ca, cert, key) = (read("ca.crt"), read("locks.crt"), read("locks.key"));
        let key_text = String::from_utf8(key.clone()).expect("PEM is text");
        let key_body = key_text.lines().nth(1).expect("a key line").to_owned();
        let quick = || {
            LockClient::builder()
                .command_timeout(Duration::from_secs(2))
                .startup_timeout(Duration::from_secs(5))
                .etcd_lease_ttl(Duration::from_secs(4))
        };
        let refused_at_once = |what: &str, err: &LockError| {
            assert!(matches!(err, LockError::InvalidConfig { .. }), "{what}: {err}");
            assert!(
                !err.to_string().contains("not ready"),
                "{what}: refused at once: {err}"
            );
            let shown = format!("{err} {err:?}");
            assert!(
                !shown.contains(&key_body),
                "{what}: the private key shows: {shown}"
            );
        };

        let unverified = quick()
            .etcd_client_certificate(cert.clone(), key.clone())
            .etcd(&endpoints)
            .await
            .expect_err("an unknown issuer is refused");
        refused_at_once("no CA", &unverified);
        assert_certificate_refused("etcd", &unverified);

        let anonymous = quick()
            .tls_root_certificate(ca.clone())
            .etcd(&endpoints)
            .await
            .expect_err("a client without a certificate is refused");
        refused_at_once("no client certificate", &anonymous);

        let plain = endpoints[0].replacen("https://", "http://", 1);
        let err = quick().etcd(&[&plain]).await.expect_err("plain to a TLS member");
        refused_at_once("plain http", &err);
        assert_plain_refused("etcd", &err);

        // Refused before any connection.
        let mixed = [endpoints[0], "http://127.0.0.1:1"];
        let err = quick()
            .tls_root_certificate(ca.clone())
            .etcd(&mixed)
            .await
            .expect_err("mixed schemes");
        refused_at_once("mixed schemes", &err);
        let err = quick()
            .etcd_client_certificate(cert.clone(), key.clone())
            .etcd(&[&plain])
            .await
            .expect_err("a certificate without TLS");
        refused_at_once("a certificate over http", &err);
        let mut broken_key = key.clone();
        broken_key.truncate(key.len() / 2);
        let err = quick()
            .tls_root_certificate(ca.clone())
            .etcd_client_certificate(cert.clone(), broken_key)
            .etcd(&endpoints)
            .await
            .expect_err("half a key");
        refused_at_once("half a key", &err);
        assert!(err.to_string().contains("key"), "{err}");
        let err = quick()
            .tls_root_certificate(ca.clone())
            .etcd_client_certificate(cert.clone(), read("stranger.key"))
            .etcd(&endpoints)
            .await
            .expect_err("another certificate's key");
        refused_at_once("another certificate's key", &err);
        assert!(
            err.to_string().contains("not the key of that certificate"),
            "{err}"
        );
        assert_key_not_shown(&err, &read("stranger.key"));

        let secured = || {
            quick()
                .tls_root_certificate(ca.clone())
                .etcd_client_certificate(cert.clone(), key.clone())
        };
        let builder = secured();
        assert!(
            !format!("{builder:?}").contains(&key_body),
            "the builder's Debug shows the key"
        );
        let locks = builder.etcd(&endpoints).await.expect("CA and client certificate");
        assert!(
            !format!("{locks:?}").contains(&key_body),
            "the client's Debug shows the key"
        );
        let other = secured().etcd(&endpoints).await.expect("a second client");
        fenced_lock_handed_over(&locks, other).await;
        assert_key_not_traced(&captured, &key);
    })
    .await
}

/// A builder that gives up on an answer after 2 s and on a start after
/// 10 s: what is refused at once ends well before.
fn patient() -> lock_runtime::LockClientBuilder {
    LockClient::builder()
        .command_timeout(Duration::from_secs(2))
        .startup_timeout(Duration::from_secs(10))
}

/// `err` refuses a plain URL to a port that speaks TLS only, at once.
fn assert_plain_refused(what: &str, err: &LockError) {
    assert!(matches!(err, LockError::InvalidConfig { .. }), "{what}: {err}");
    assert!(err.to_string().contains("speaks TLS only"), "{what}: {err}");
}

/// The clients of `server` on its plain port, but the one asking.
fn clients_on_plain_port(server: &RedisServer) -> Vec<String> {
    let clients: String = server.query(redis::cmd("CLIENT").arg("LIST"));
    let plain = format!("laddr=127.0.0.1:{} ", server.port());
    clients
        .lines()
        .filter(|line| line.contains(&plain) && !line.contains("cmd=client|list"))
        .map(str::to_owned)
        .collect()
}

/// `err` refuses a server certificate the client does not trust as the
/// configuration's fault, at the first attempt: waiting cannot mend it.
fn assert_certificate_refused(what: &str, err: &LockError) {
    assert!(matches!(err, LockError::InvalidConfig { .. }), "{what}: {err}");
    let text = err.to_string();
    assert!(text.to_lowercase().contains("certificate"), "{what}: {text}");
    assert!(!text.contains("not ready"), "{what}: refused at once: {text}");
}

/// Asserts that traces were written (at every level, on every thread:
/// connections, handshakes, refusals) and that no line of the PEM `key`
/// shows in them.
fn assert_key_not_traced(captured: &lock_tests::secrets::Captured, key: &[u8]) {
    let traced = captured.text();
    assert!(!traced.is_empty(), "nothing was traced");
    let key = String::from_utf8_lossy(key);
    for line in key.lines().filter(|line| !line.starts_with("-----")) {
        assert!(!traced.contains(line), "a line of the private key was traced");
    }
}

/// Asserts that no line of the PEM `key` shows in `err` or its `Debug`.
fn assert_key_not_shown(err: &LockError, key: &[u8]) {
    let shown = format!("{err} {err:?}");
    let key = String::from_utf8_lossy(key);
    for line in key.lines().filter(|line| !line.starts_with("-----")) {
        assert!(!shown.contains(line), "a line of the private key shows: {shown}");
    }
}

/// `locks` takes a fenced lock over TLS, `other` waits for it, refused
/// while it is held, and gets it once it is released.
async fn fenced_lock_handed_over(locks: &LockClient, other: LockClient) {
    let guard = locks
        .lock("tls:1")
        .fencing(true)
        .acquire()
        .await
        .expect("lock over TLS");
    assert!(guard.fencing_token().is_some());
    let busy = other
        .lock("tls:1")
        .wait(Duration::from_millis(300))
        .run(async {})
        .await;
    assert!(matches!(busy, Err(LockError::Timeout { .. })), "{busy:?}");
    let waiting = tokio::spawn(async move {
        other
            .lock("tls:1")
            .wait(Duration::from_secs(10))
            .run(async {})
            .await
    });
    guard.release().await.expect("release over TLS");
    tokio::time::timeout(Duration::from_secs(15), waiting)
        .await
        .expect("the waiter got in")
        .expect("join")
        .expect("lock after release");
}

/// ZooKeeper's `secureClientPort` (Netty, PEM key and trust stores), asking
/// clients for a certificate, as ZooKeeper does by default there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_over_mutual_tls_with_a_private_ca() {
    lock_tests::bounded("zookeeper_over_mutual_tls_with_a_private_ca", async move {
        let (captured, _tracing) = lock_tests::secrets::capture_tracing();
        let certs = tempfile::tempdir().expect("cert dir");
        make_certificates(certs.path());
        make_client_certificate(certs.path(), "locks");
        make_client_certificate(certs.path(), "stranger");
        let read = |name: &str| std::fs::read(certs.path().join(name)).expect("read a certificate file");
        let zk = lock_tests::ZooKeeper::start_with_tls(certs.path(), true);
        let connect = zk.tls_connect_string();
        let (ca, cert, key) = (read("ca.crt"), read("locks.crt"), read("locks.key"));
        let key_text = String::from_utf8(key.clone()).expect("PEM is text");
        let key_body = key_text.lines().nth(1).expect("a key line").to_owned();
        let quick = || {
            LockClient::builder()
                .command_timeout(Duration::from_secs(2))
                // The JVM's first handshakes are slow on two busy cores.
                .startup_timeout(Duration::from_secs(10))
        };
        let refused_at_once = |what: &str, err: &LockError| {
            assert!(matches!(err, LockError::InvalidConfig { .. }), "{what}: {err}");
            let shown = format!("{err} {err:?}");
            assert!(
                !shown.contains(&key_body),
                "{what}: the private key shows: {shown}"
            );
        };

        // First the way in, which also shows the TLS port is up, so that
        // the refusals below are the certificates', not a port not yet bound.
        let secured = || {
            quick()
                .tls_root_certificate(ca.clone())
                .zookeeper_client_certificate(cert.clone(), key.clone())
        };
        let builder = secured();
        assert!(
            !format!("{builder:?}").contains(&key_body),
            "the builder's Debug shows the key"
        );
        let locks = builder
            .zookeeper(&connect)
            .await
            .expect("CA and client certificate");
        let other = secured().zookeeper(&connect).await.expect("a second client");
        fenced_lock_handed_over(&locks, other).await;

        // Refused before any connection.
        let err = quick()
            .zookeeper_client_certificate(cert.clone(), key.clone())
            .zookeeper(&connect)
            .await
            .expect_err("TLS without the CA");
        refused_at_once("no CA", &err);
        assert!(err.to_string().contains("tls_root_certificate"), "{err}");
        let mixed = format!("{connect},127.0.0.1:{}", zk.port(0));
        let err = quick()
            .tls_root_certificate(ca.clone())
            .zookeeper(&mixed)
            .await
            .expect_err("mixed members");
        refused_at_once("mixed members", &err);
        let err = quick()
            .tls_root_certificate(ca.clone())
            .zookeeper_client_certificate(cert.clone(), key.clone())
            .zookeeper(&zk.connect_string())
            .await
            .expect_err("a certificate without TLS");
        refused_at_once("a certificate to a plain member", &err);
        let mut broken_key = key.clone();
        broken_key.truncate(key.len() / 2);
        let err = quick()
            .tls_root_certificate(ca.clone())
            .zookeeper_client_certificate(cert.clone(), broken_key)
            .zookeeper(&connect)
            .await
            .expect_err("half a key");
        refused_at_once("half a key", &err);
        assert!(err.to_string().contains("key"), "{err}");
        let err = quick()
            .tls_root_certificate(ca.clone())
            .zookeeper("tcp+tls://bad_host!:2281")
            .await
            .expect_err("a host no certificate can name");
        refused_at_once("a bad host", &err);
        assert!(err.to_string().contains("bad_host!"), "{err}");

        let err = quick()
            .tls_root_certificate(ca.clone())
            .zookeeper_client_certificate(cert.clone(), read("stranger.key"))
            .zookeeper(&connect)
            .await
            .expect_err("another certificate's key");
        refused_at_once("another certificate's key", &err);
        assert!(
            err.to_string().contains("not the key of that certificate"),
            "{err}"
        );
        assert_key_not_shown(&err, &read("stranger.key"));
        // A TLS member that is down is waited for, not refused.
        let err = quick()
            .startup_timeout(Duration::from_millis(500))
            .tls_root_certificate(ca.clone())
            .zookeeper(&format!("tcp+tls://127.0.0.1:{}", free_port()))
            .await
            .expect_err("a TLS member that is down");
        assert!(err.to_string().contains("not ready within 500ms"), "{err}");

        // Refused by the server, and told at once (the ZooKeeper client
        // says only "no available hosts"): the server's certificate from
        // another CA, no certificate of our own, and a plain client at
        // the TLS port.
        let refused_by_server = |what: &str, err: &LockError, said: &str| {
            refused_at_once(what, err);
            let shown = err.to_string();
            assert!(!shown.contains("not ready"), "{what}: refused at once: {shown}");
            assert!(shown.contains(said), "{what}: {shown}");
        };
        let other = tempfile::tempdir().expect("cert dir");
        make_certificates(other.path());
        let other_ca = std::fs::read(other.path().join("ca.crt")).expect("read the other CA");
        let err = quick()
            .tls_root_certificate(other_ca)
            .zookeeper_client_certificate(cert.clone(), key.clone())
            .zookeeper(&connect)
            .await
            .expect_err("a server certificate from another CA");
        refused_by_server("a server certificate from another CA", &err, "does not verify");
        let err = quick()
            .tls_root_certificate(ca.clone())
            .zookeeper(&connect)
            .await
            .expect_err("a client without a certificate");
        refused_by_server("no client certificate", &err, "refused the client's certificate");
        let plain = connect.replacen("tcp+tls://", "", 1);
        let err = quick()
            .zookeeper(&plain)
            .await
            .expect_err("a plain client at the TLS port");
        refused_by_server("a plain client at the TLS port", &err, "speaks TLS only");
        assert_key_not_traced(&captured, &key);
        assert_key_not_traced(&captured, &read("stranger.key"));
    })
    .await
}

/// A digest identity over mutual TLS: the lock nodes are that identity's
/// alone. The session also holds its certificate's identity (`x509`), and
/// ZooKeeper's "creator" ACL would give the nodes to both: any client
/// showing the same certificate, which a fleet of services often shares,
/// could then delete a held lock's node. Named by its digest, a node is
/// refused to a session with the certificate and no digest, or a wrong
/// one; the lock stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_nodes_belong_to_the_digest_identity_not_the_certificate() {
    use zookeeper_client as zk;
    lock_tests::bounded(
        "zookeeper_nodes_belong_to_the_digest_identity_not_the_certificate",
        async move {
            let certs = tempfile::tempdir().expect("cert dir");
            make_certificates(certs.path());
            make_client_certificate(certs.path(), "locks");
            let text =
                |name: &str| std::fs::read_to_string(certs.path().join(name)).expect("read a PEM file");
            let zk = lock_tests::ZooKeeper::start_with_tls(certs.path(), true);
            let connect = zk.tls_connect_string();
            let locks = patient()
                .zookeeper_root("/certified")
                .tls_root_certificate(text("ca.crt"))
                .zookeeper_client_certificate(text("locks.crt"), text("locks.key"))
                .zookeeper_digest("locks", "Pa55-w0rd")
                .zookeeper(&connect)
                .await
                .expect("certificate and identity");
            let held = locks.lock("k").acquire().await.expect("free");

            let owner = zk::Client::connector()
                .with_auth("digest", b"locks:Pa55-w0rd")
                .connect(&zk.connect_string())
                .await
                .expect("the identity's session, on the plain port");
            let queue = "/certified/lock:{k}";
            let children = owner.list_children(queue).await.expect("the owner lists");
            let node = format!("{queue}/{}", children.first().expect("the holder's node"));
            for path in ["/certified", queue, node.as_str()] {
                let (acls, _) = owner.get_acl(path).await.expect("read an ACL");
                let ids: Vec<(&str, &str)> = acls.iter().map(|acl| (acl.scheme(), acl.id())).collect();
                assert!(
                    ids.iter()
                        .all(|(scheme, id)| *scheme == "digest" && id.starts_with("locks:")),
                    "`{path}` is not the digest identity's alone: {ids:?}"
                );
            }
            let tls = || {
                zk::TlsOptions::new()
                    .with_pem_ca(&text("ca.crt"))
                    .and_then(|o| o.with_pem_identity(&text("locks.crt"), &text("locks.key")))
                    .expect("TLS options")
            };
            let same_certificate = zk::Client::connector()
                .with_tls(tls())
                .connect(&connect)
                .await
                .expect("a session showing the same certificate");
            let wrong_digest = zk::Client::connector()
                .with_tls(tls())
                .with_auth("digest", b"locks:not-the-password")
                .connect(&connect)
                .await
                .expect("the same certificate and a wrong password");
            for (who, intruder) in [
                ("the certificate alone", &same_certificate),
                ("a wrong password", &wrong_digest),
            ] {
                let r = intruder.delete(&node, None).await;
                assert!(
                    matches!(r, Err(zk::Error::NoAuth)),
                    "{who} deleted the holder's node: {r:?}"
                );
                let r = intruder.set_data(&node, b"mine", None).await.map(drop);
                assert!(
                    matches!(r, Err(zk::Error::NoAuth)),
                    "{who} changed the holder's node: {r:?}"
                );
            }
            assert!(held.is_held());
            held.release().await.expect("release");
        },
    )
    .await
}

/// ZooKeeper's `secureClientPort` without client certificates
/// (`ssl.clientAuth=none`): the CA alone is enough, a connect string with
/// a chroot is read as the ZooKeeper client reads it, and a lock is
/// handed over as with mutual TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_over_one_way_tls_with_a_chroot() {
    lock_tests::bounded("zookeeper_over_one_way_tls_with_a_chroot", async move {
        let certs = tempfile::tempdir().expect("cert dir");
        make_certificates(certs.path());
        let ca = std::fs::read(certs.path().join("ca.crt")).expect("read the CA");
        let zk = lock_tests::ZooKeeper::start_with_tls(certs.path(), false);
        let connect = format!("{}/one-way", zk.tls_connect_string());
        let client = || {
            LockClient::builder()
                .command_timeout(Duration::from_secs(2))
                .startup_timeout(Duration::from_secs(10))
                .tls_root_certificate(ca.clone())
                .zookeeper(&connect)
        };
        let locks = client().await.expect("the CA alone, one-way TLS");
        let other = client().await.expect("a second client");
        fenced_lock_handed_over(&locks, other).await;
    })
    .await
}

/// A Redis Cluster whose nodes serve TLS (the cluster bus too): a seed
/// whose certificate the client does not trust and a plain URL to a TLS
/// port are refused at once; with the CA, the client learns the nodes'
/// TLS ports from `CLUSTER SLOTS` over TLS and locks there, on the slot's
/// master, with no client of its own on a plain port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_over_tls_with_a_private_ca() {
    lock_tests::bounded("cluster_over_tls_with_a_private_ca", async move {
        let certs = tempfile::tempdir().expect("cert dir");
        make_certificates(certs.path());
        let ca = std::fs::read(certs.path().join("ca.crt")).expect("read ca.crt");
        let cluster = lock_tests::Cluster::start_tls(3, certs.path());
        let unverified = patient()
            .cluster(cluster.tls_urls())
            .await
            .expect_err("an unknown issuer is refused");
        assert_certificate_refused("Cluster", &unverified);
        let plain_to_tls: Vec<String> = cluster
            .tls_ports
            .iter()
            .map(|port| format!("redis://127.0.0.1:{port}/"))
            .collect();
        let plain = patient()
            .cluster(plain_to_tls)
            .await
            .expect_err("plain URLs to TLS ports");
        assert_plain_refused("Cluster", &plain);

        let locks = patient()
            .tls_root_certificate(ca)
            .cluster(cluster.tls_urls())
            .await
            .expect("the cluster over TLS, with the private CA");
        let guard = locks.lock("tls:c").acquire().await.expect("lock over TLS");
        let master = &cluster.nodes[cluster.master_of("lock:{tls:c}")];
        let exists: i64 = master.query(redis::cmd("EXISTS").arg("lock:{tls:c}"));
        assert_eq!(exists, 1, "the lock went to the slot's master");
        for node in &cluster.nodes {
            let on_plain = clients_on_plain_port(node);
            assert!(on_plain.is_empty(), "clients on a plain port: {on_plain:?}");
        }
        guard.release().await.expect("release over TLS");
    })
    .await
}

/// A Redlock of three masters serving TLS: an untrusted certificate and
/// plain URLs to the TLS ports are refused at once; with the CA, a lock is
/// granted by a majority of the masters, over TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_over_tls_with_a_private_ca() {
    lock_tests::bounded("redlock_over_tls_with_a_private_ca", async move {
        let certs = tempfile::tempdir().expect("cert dir");
        make_certificates(certs.path());
        let ca = std::fs::read(certs.path().join("ca.crt")).expect("read ca.crt");
        let masters: Vec<(RedisServer, u16)> = (0..3)
            .map(|_| RedisServer::start_serving_tls(certs.path()))
            .collect();
        let urls = |scheme: &str| -> Vec<String> {
            masters
                .iter()
                .map(|(_, port)| format!("{scheme}://127.0.0.1:{port}/"))
                .collect()
        };
        let unverified = patient()
            .redlock(urls("rediss"))
            .await
            .expect_err("an unknown issuer is refused");
        assert_certificate_refused("Redlock", &unverified);
        let plain = patient()
            .redlock(urls("redis"))
            .await
            .expect_err("plain URLs to TLS ports");
        assert_plain_refused("Redlock", &plain);

        let locks = patient()
            .tls_root_certificate(ca)
            .redlock(urls("rediss"))
            .await
            .expect("the masters over TLS, with the private CA");
        let guard = locks.lock("tls:r").acquire().await.expect("lock over TLS");
        // Granted once a majority answered; the last may still be applying it.
        let granted: i64 = masters
            .iter()
            .map(|(master, _)| master.query::<i64>(redis::cmd("EXISTS").arg("lock:{tls:r}")))
            .sum();
        assert!(granted >= 2, "granted by {granted} of 3 masters");
        guard.release().await.expect("release over TLS");
    })
    .await
}

/// The server's certificate must name the host the URL gives, as libpq's
/// `verify-full` checks, not only come from the CA: a certificate the CA
/// signed for another name (`elsewhere.invalid`, never 127.0.0.1) is
/// refused at once on Redis, PostgreSQL (`sslmode=require`), MariaDB
/// (`require_ssl=true`), ZooKeeper (`tcp+tls://`) and etcd (`https://`),
/// with the CA given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_for_another_host_is_refused() {
    lock_tests::bounded("a_certificate_for_another_host_is_refused", async move {
        let certs = tempfile::tempdir().expect("cert dir");
        lock_tests::make_certificates_for(certs.path(), "DNS:elsewhere.invalid");
        let ca = std::fs::read(certs.path().join("ca.crt")).expect("read ca.crt");
        let (cert, key) = (certs.path().join("server.crt"), certs.path().join("server.key"));
        let verified = || patient().tls_root_certificate(ca.clone());

        let (_redis, tls_port) = RedisServer::start_serving_tls(certs.path());
        let err = verified()
            .connect(&format!("rediss://127.0.0.1:{tls_port}/"))
            .await
            .expect_err("Redis: a certificate for another host");
        assert_certificate_refused("Redis", &err);

        let postgres = lock_tests::Postgres::start();
        postgres.sql("CREATE ROLE app LOGIN");
        postgres.serve_tls(&cert, &key, "hostssl all app 127.0.0.1/32 trust");
        let url = format!(
            "postgres://app@127.0.0.1:{}/locks?sslmode=require",
            postgres.port()
        );
        let err = verified()
            .postgres(&url)
            .await
            .expect_err("PostgreSQL: a certificate for another host");
        assert_certificate_refused("PostgreSQL", &err);

        let mariadb = lock_tests::MariaDb::start_tls(&cert, &key);
        mariadb.sql("CREATE USER 'app'@'%'").await;
        let url = format!("mysql://app@127.0.0.1:{}/locks?require_ssl=true", mariadb.port());
        let err = verified()
            .mysql(&url)
            .await
            .expect_err("MariaDB: a certificate for another host");
        assert_certificate_refused("MariaDB", &err);

        let zookeeper = lock_tests::ZooKeeper::start_with_tls(certs.path(), false);
        let err = verified()
            .zookeeper(&zookeeper.tls_connect_string())
            .await
            .expect_err("ZooKeeper: a certificate for another host");
        assert_certificate_refused("ZooKeeper", &err);

        let etcd = lock_tests::Etcd::start_secured(Some((&cert, &key)), &[]);
        let endpoints = etcd.endpoints();
        let endpoints: Vec<&str> = endpoints.iter().map(String::as_str).collect();
        let err = verified()
            .etcd(&endpoints)
            .await
            .expect_err("etcd: a certificate for another host");
        assert_certificate_refused("etcd", &err);
    })
    .await
}
