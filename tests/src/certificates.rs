//! Certificates for the TLS tests, made with the `openssl` command (which
//! the README's test command installs).

use std::path::Path;
use std::process::Command;

fn openssl(dir: &Path, args: &[&str]) {
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
}

/// Writes into `dir` a CA (`ca.crt`, `ca.key`) and a server certificate it
/// signed for 127.0.0.1 and localhost (`server.crt`, `server.key`).
pub fn make_certificates(dir: &Path) {
    make(dir, "localhost", "IP:127.0.0.1,DNS:localhost");
}

/// [`make_certificates`] with the server certificate made for the names
/// `names` (a `subjectAltName` value, `DNS:elsewhere.invalid`) only: the
/// host name check's test.
pub fn make_certificates_for(dir: &Path, names: &str) {
    make(dir, "lock-tests server", names);
}

fn make(dir: &Path, common_name: &str, names: &str) {
    let openssl = |args: &[&str]| openssl(dir, args);
    let subject = format!("/CN={common_name}");
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
        &subject,
    ]);
    std::fs::write(dir.join("san.cnf"), format!("subjectAltName={names}\n")).expect("write san.cnf");
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

/// Writes into `dir`, where [`make_certificates`] made its CA, a client
/// certificate that CA signed for `name` (`<name>.crt`, `<name>.key`): what
/// a server that asks clients for certificates (etcd's
/// `--client-cert-auth`) lets in.
pub fn make_client_certificate(dir: &Path, name: &str) {
    let (key, csr, crt, ext) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
        format!("{name}.cnf"),
    );
    let subject = format!("/CN={name}");
    openssl(
        dir,
        &[
            "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj", &subject,
        ],
    );
    std::fs::write(dir.join(&ext), "extendedKeyUsage=clientAuth\n").expect("write the extension file");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "2",
            "-extfile",
            &ext,
        ],
    );
}
