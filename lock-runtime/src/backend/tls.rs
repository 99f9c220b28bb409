//! `rediss://`, PostgreSQL's `sslmode=require` and MySQL's
//! `require_ssl=true`: TLS through rustls, with the `tls` feature; without
//! it, a clear error instead of a connection that cannot work.

#[cfg(feature = "tls")]
pub(crate) fn open(url: &str, tls_root: Option<&[u8]>) -> redis::RedisResult<redis::Client> {
    install_tls_provider();
    match tls_root {
        Some(pem) => redis::Client::build_with_tls(url, tls_certificates(pem)),
        None => redis::Client::open(url),
    }
}

#[cfg(not(feature = "tls"))]
pub(crate) fn open(_url: &str, _tls_root: Option<&[u8]>) -> redis::RedisResult<redis::Client> {
    Err(redis::RedisError::from((
        redis::ErrorKind::InvalidClientConfig,
        "`rediss://` needs TLS support",
        "enable lock-runtime's `tls` feature".to_owned(),
    )))
}

/// rustls needs a process-wide crypto provider and panics on first use
/// without one. Installing ours fails harmlessly when the application
/// installed its own first.
#[cfg(feature = "tls")]
pub(crate) fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(feature = "tls")]
pub(crate) fn tls_certificates(root_pem: &[u8]) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(root_pem.to_vec()),
    }
}

/// The TLS connector of a PostgreSQL client: its server is verified against
/// `root_pem` (a private CA) when given, else against the system's roots.
/// Hostname and chain are always checked: stricter than libpq's
/// `sslmode=require`, which encrypts without verifying.
#[cfg(all(feature = "tls", feature = "postgres"))]
pub(crate) fn postgres_connector(
    root_pem: Option<&[u8]>,
) -> Result<tokio_postgres_rustls::MakeRustlsConnect, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;

    install_tls_provider();
    let mut roots = rustls::RootCertStore::empty();
    match root_pem {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| format!("the root certificate is not PEM: {e}"))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("the root certificate cannot be used: {e}"))?;
            }
            if roots.is_empty() {
                return Err("the root certificate PEM holds no certificate".into());
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err(
                    "no system root certificates were found; give your CA with `tls_root_certificate`".into(),
                );
            }
        }
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

/// The TLS options of a MySQL client whose URL asked for TLS (`asked`):
/// its server verified against `root_pem` when given, else against the
/// system's roots (not the Mozilla roots the driver bundles: the same trust
/// as the PostgreSQL backend's). Chain and hostname are always checked; a
/// URL that turns either check off is refused rather than obeyed.
#[cfg(all(feature = "tls", feature = "mysql"))]
pub(crate) fn mysql_ssl_opts(
    asked: &mysql_async::SslOpts,
    root_pem: Option<&[u8]>,
) -> Result<mysql_async::SslOpts, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;

    if asked.accept_invalid_certs() || asked.skip_domain_validation() {
        return Err(
            "`verify_ca=false` and `verify_identity=false` are refused: a lock server that is not verified can be anyone; give a private CA with `tls_root_certificate`".into(),
        );
    }
    install_tls_provider();
    // PEM or DER, one certificate or several per buffer: the driver reads both.
    let roots: Vec<Vec<u8>> = match root_pem {
        Some(pem) => {
            let mut certs = 0;
            for cert in CertificateDer::pem_slice_iter(pem) {
                cert.map_err(|e| format!("the root certificate is not PEM: {e}"))?;
                certs += 1;
            }
            if certs == 0 {
                return Err("the root certificate PEM holds no certificate".into());
            }
            vec![pem.to_vec()]
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            if found.certs.is_empty() {
                return Err(
                    "no system root certificates were found; give your CA with `tls_root_certificate`".into(),
                );
            }
            found.certs.into_iter().map(|der| der.to_vec()).collect()
        }
    };
    Ok(asked
        .clone()
        .with_root_certs(roots.into_iter().map(Into::into).collect())
        .with_disable_built_in_roots(true))
}

#[cfg(all(not(feature = "tls"), feature = "mysql"))]
pub(crate) fn mysql_ssl_opts(
    _asked: &mysql_async::SslOpts,
    _root_pem: Option<&[u8]>,
) -> Result<mysql_async::SslOpts, String> {
    Err("`require_ssl=true` needs TLS support: enable lock-runtime's `tls` feature".into())
}
