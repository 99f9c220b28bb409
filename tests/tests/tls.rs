//! `rediss://` with the `tls` feature, against a `redis-server` serving TLS
//! with a certificate from a CA the test makes (with the `openssl` command,
//! which the README's test command installs).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use lock_runtime::{LockClient, LockError};
use lock_tests::{RedisServer, free_port};

/// A CA, and a certificate it signed for 127.0.0.1 and localhost.
fn make_certificates(dir: &Path) {
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("run openssl (apt-get install openssl)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=lock-tests CA",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    std::fs::write(dir.join("san.cnf"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        .expect("write san.cnf");
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "san.cnf",
    ]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_over_tls_with_a_private_ca() {
    lock_tests::bounded("locks_over_tls_with_a_private_ca", async move {
        let certs = tempfile::tempdir().expect("cert dir");
        make_certificates(certs.path());
        let file = |name: &str| certs.path().join(name).to_string_lossy().into_owned();
        let tls_port = free_port().to_string();
        let server = RedisServer::start_with(&[
            "--tls-port",
            &tls_port,
            "--tls-cert-file",
            &file("server.crt"),
            "--tls-key-file",
            &file("server.key"),
            "--tls-ca-cert-file",
            &file("ca.crt"),
            "--tls-auth-clients",
            "no",
        ]);
        let url = format!("rediss://127.0.0.1:{tls_port}/");
        let ca = std::fs::read(certs.path().join("ca.crt")).expect("read ca.crt");

        // The server's certificate is not signed by any root the system trusts.
        let err = LockClient::builder()
            .command_timeout(Duration::from_secs(2))
            .connect(&url)
            .await
            .expect_err("an unknown issuer is refused");
        assert!(
            matches!(&err, LockError::Backend { .. } | LockError::InvalidConfig { .. }),
            "{err}"
        );
        assert!(err.to_string().to_lowercase().contains("certificate"), "{err}");

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
