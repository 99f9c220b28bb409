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

/// Built only without the feature: `cargo test -p lock-runtime --lib`
/// (`.ci/run` runs it; the workspace build turns `tls` on for the tests).
#[cfg(all(test, not(feature = "tls")))]
mod without_the_feature {
    use crate::backend::redis::open_url;
    use crate::error::LockError;

    #[test]
    fn a_rediss_url_says_to_enable_the_feature_without_its_password() {
        match open_url("rediss://app:Zq7secretWv3@127.0.0.1:6380/", None) {
            Err(LockError::InvalidConfig { node, reason }) => {
                assert!(reason.contains("`tls` feature"), "{reason}");
                assert!(
                    !format!("{node} {reason}").contains("Zq7secretWv3"),
                    "{node} {reason}"
                );
            }
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }
}
