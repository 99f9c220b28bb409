//! `lockctl --tls-ca` against servers that speak TLS only, with
//! certificates from a private CA (made with `openssl`): a Redis server's
//! TLS port (`rediss://`), PostgreSQL refusing plain connections
//! (`sslmode=require`) and a MariaDB user that must use TLS
//! (`require_ssl=true`). With the CA, lockctl lists a lock the services
//! hold there; without it, the server's certificate is refused at once.

use std::path::Path;
use std::process::Output;

use lock_runtime::LockClient;

// Only the output readers of the shared helpers serve here.
#[allow(dead_code)]
mod common;
use common::{find, json_lines};

fn lockctl(args: &[&str]) -> Output {
    lock_tests::output_within_limit(
        std::process::Command::new(env!("CARGO_BIN_EXE_lockctl")).args(args),
        &format!("lockctl {}", args.join(" ")),
    )
}

/// `target` (the backend's flag and URL) lists `key` given the CA of
/// `certs`, and is refused without it, for the certificate's sake.
fn listed_with_the_ca_only(target: &[&str], certs: &Path, key: &str) {
    let ca = certs.join("ca.crt");
    let mut args = target.to_vec();
    args.extend(["--json", "list"]);
    let without = lockctl(&args);
    assert!(
        !without.status.success(),
        "a server no system root vouches for was taken"
    );
    let said = String::from_utf8_lossy(&without.stderr).to_lowercase();
    assert!(said.contains("certificate"), "{said}");
    assert!(!said.contains("not ready"), "refused at once: {said}");
    args.extend(["--tls-ca", ca.to_str().expect("utf-8 path")]);
    find(&json_lines(&lockctl(&args)), key);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_tls_port_is_read_with_the_ca() {
    lock_tests::bounded("a_redis_tls_port_is_read_with_the_ca", async move {
        let certs = tempfile::tempdir().expect("cert dir");
        lock_tests::make_certificates(certs.path());
        let (_server, tls_port) = lock_tests::RedisServer::start_serving_tls(certs.path());
        let url = format!("rediss://127.0.0.1:{tls_port}/");
        let ca = std::fs::read(certs.path().join("ca.crt")).expect("read ca.crt");
        let locks = LockClient::builder()
            .tls_root_certificate(ca)
            .connect(&url)
            .await
            .expect("a service's client");
        let guard = locks.lock("over-tls").acquire().await.expect("free");
        listed_with_the_ca_only(&["--url", &url], certs.path(), "over-tls");
        guard.release().await.expect("release");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_that_requires_tls_is_read_with_the_ca() {
    lock_tests::bounded("a_postgres_that_requires_tls_is_read_with_the_ca", async move {
        let certs = tempfile::tempdir().expect("cert dir");
        lock_tests::make_certificates(certs.path());
        let server = lock_tests::Postgres::start();
        server.sql("CREATE ROLE app LOGIN");
        server.sql("GRANT CREATE ON SCHEMA public TO app");
        server.serve_tls(
            &certs.path().join("server.crt"),
            &certs.path().join("server.key"),
            "hostssl all app 127.0.0.1/32 trust\nhostnossl all app 127.0.0.1/32 reject",
        );
        let url = format!("postgres://app@127.0.0.1:{}/locks?sslmode=require", server.port());
        let ca = std::fs::read(certs.path().join("ca.crt")).expect("read ca.crt");
        let locks = LockClient::builder()
            .tls_root_certificate(ca)
            .postgres(&url)
            .await
            .expect("a service's client");
        let guard = locks.lock("over-tls").acquire().await.expect("free");
        listed_with_the_ca_only(&["--postgres", &url], certs.path(), "over-tls");
        guard.release().await.expect("release");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mariadb_user_that_requires_tls_is_read_with_the_ca() {
    lock_tests::bounded(
        "a_mariadb_user_that_requires_tls_is_read_with_the_ca",
        async move {
            let certs = tempfile::tempdir().expect("cert dir");
            lock_tests::make_certificates(certs.path());
            let server = lock_tests::MariaDb::start_tls(
                &certs.path().join("server.crt"),
                &certs.path().join("server.key"),
            );
            server.sql("CREATE USER 'app'@'%' REQUIRE SSL").await;
            server
                .sql("GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON locks.* TO 'app'@'%'")
                .await;
            let url = format!("mysql://app@127.0.0.1:{}/locks?require_ssl=true", server.port());
            let ca = std::fs::read(certs.path().join("ca.crt")).expect("read ca.crt");
            let locks = LockClient::builder()
                .tls_root_certificate(ca)
                .mysql(&url)
                .await
                .expect("a service's client");
            let guard = locks.lock("over-tls").acquire().await.expect("free");
            listed_with_the_ca_only(&["--mysql", &url], certs.path(), "over-tls");
            guard.release().await.expect("release");
        },
    )
    .await
}
