//! `rediss://`: TLS through rustls, with the `tls` feature; without it, a
//! clear error instead of a connection that cannot work.

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
