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

/// The certificates in `pem`, at least one, or why not: `what` names the
/// PEM in the message.
#[cfg(all(
    feature = "tls",
    any(
        feature = "mysql",
        feature = "postgres",
        feature = "etcd",
        feature = "zookeeper-tls"
    )
))]
fn certificates_of(
    pem: &[u8],
    what: &str,
) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;

    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{what} is not PEM: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{what} PEM holds no certificate"));
    }
    Ok(certs)
}

/// The TLS connector of a PostgreSQL client: its server is verified against
/// `root_pem` (a private CA) when given, else against the system's roots.
/// Hostname and chain are always checked: stricter than libpq's
/// `sslmode=require`, which encrypts without verifying.
#[cfg(all(feature = "tls", feature = "postgres"))]
pub(crate) fn postgres_connector(
    root_pem: Option<&[u8]>,
) -> Result<tokio_postgres_rustls::MakeRustlsConnect, String> {
    install_tls_provider();
    let mut roots = rustls::RootCertStore::empty();
    match root_pem {
        Some(pem) => {
            for cert in certificates_of(pem, "the root certificate")? {
                roots
                    .add(cert)
                    .map_err(|e| format!("the root certificate cannot be used: {e}"))?;
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
    if asked.accept_invalid_certs() || asked.skip_domain_validation() {
        return Err(
            "`verify_ca=false` and `verify_identity=false` are refused: a lock server that is not verified can be anyone; give a private CA with `tls_root_certificate`".into(),
        );
    }
    install_tls_provider();
    // PEM or DER, one certificate or several per buffer: the driver reads both.
    let roots: Vec<Vec<u8>> = match root_pem {
        Some(pem) => {
            certificates_of(pem, "the root certificate")?;
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

/// Without the `tls` feature, `https://` endpoints cannot be served: a
/// clear error at start-up rather than a build that fails.
#[cfg(all(not(feature = "tls"), feature = "etcd"))]
pub(crate) fn etcd_with_tls(
    _options: etcd_client::ConnectOptions,
    _root_pem: Option<&[u8]>,
    _certificate: Option<&crate::config::ClientCertificate>,
) -> Result<etcd_client::ConnectOptions, String> {
    Err("`https://` etcd endpoints need lock-runtime's `tls` feature".into())
}

/// `options` with the TLS settings of an etcd client with `https://` endpoints: the
/// cluster verified against `root_pem` when given, else the system's
/// roots, and `certificate` shown to a cluster that asks for one. The PEM
/// is parsed here so that a bad one is refused before any connection;
/// a parse error names what failed, never the key's bytes.
#[cfg(all(feature = "tls", feature = "etcd"))]
pub(crate) fn etcd_with_tls(
    options: etcd_client::ConnectOptions,
    root_pem: Option<&[u8]>,
    certificate: Option<&crate::config::ClientCertificate>,
) -> Result<etcd_client::ConnectOptions, String> {
    install_tls_provider();
    let mut tls = etcd_client::TlsOptions::new();
    match root_pem {
        Some(pem) => {
            certificates_of(pem, "the root certificate")?;
            tls = tls.ca_certificate(etcd_client::Certificate::from_pem(pem));
        }
        None => tls = tls.with_native_roots(),
    }
    if let Some(certificate) = certificate {
        client_certificate_of(certificate)?;
        tls = tls.identity(etcd_client::Identity::from_pem(
            &certificate.certificate,
            &certificate.key,
        ));
    }
    Ok(options.with_tls(tls))
}

/// A client certificate's chain and key, or why they cannot be used: a
/// PEM that does not parse, or a key that is not the certificate's (which
/// a server would otherwise report only as a failed handshake).
#[cfg(all(feature = "tls", any(feature = "etcd", feature = "zookeeper-tls")))]
fn client_certificate_of(
    certificate: &crate::config::ClientCertificate,
) -> Result<
    (
        Vec<rustls::pki_types::CertificateDer<'static>>,
        rustls::pki_types::PrivateKeyDer<'static>,
    ),
    String,
> {
    use rustls::pki_types::PrivateKeyDer;
    use rustls::pki_types::pem::PemObject;

    let chain = certificates_of(&certificate.certificate, "the client certificate")?;
    // The key's own error could quote it: say only what kind it was.
    let key = PrivateKeyDer::from_pem_slice(&certificate.key).map_err(|e| {
        let kind = match e {
            rustls::pki_types::pem::Error::NoItemsFound => "holds no private key",
            _ => "is not a PEM private key",
        };
        format!("the client certificate's key {kind}")
    })?;
    let provider = rustls::crypto::ring::default_provider();
    rustls::sign::CertifiedKey::from_der(chain.clone(), key.clone_key(), &provider).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => {
            "the client certificate's key is not the key of that certificate".to_owned()
        }
        _ => "the client certificate's key is of a kind TLS cannot sign with here (RSA, ECDSA P-256/P-384 and Ed25519 can)".to_owned(),
    })?;
    Ok((chain, key))
}

/// What a ZooKeeper client with `tcp+tls://` members is given: the
/// ZooKeeper client's own TLS options, and the same trust and certificate
/// as a rustls configuration, with which a member that gives no session
/// is asked why (`certificate_refusal`).
#[cfg(feature = "zookeeper-tls")]
#[derive(Clone)]
pub(crate) struct ZooKeeperTls {
    pub(crate) options: zookeeper_client::TlsOptions,
    pub(crate) probe: std::sync::Arc<rustls::ClientConfig>,
}

/// The TLS settings of a ZooKeeper client with `tcp+tls://` members: the
/// ensemble verified against `root_pem`, which is required (the
/// ZooKeeper client reads no system roots, and ZooKeeper's TLS is served
/// with a private CA), and `certificate` shown to an ensemble that asks
/// for one. Parsed here, so that a bad PEM is refused before any
/// connection, by a message that never quotes the key.
#[cfg(feature = "zookeeper-tls")]
pub(crate) fn zookeeper_tls(
    root_pem: Option<&[u8]>,
    certificate: Option<&crate::config::ClientCertificate>,
) -> Result<ZooKeeperTls, String> {
    // The ZooKeeper client builds its rustls configuration with the
    // process's provider; two are built in, so one must be installed.
    install_tls_provider();
    let Some(root_pem) = root_pem else {
        return Err(
            "ZooKeeper over TLS needs the certificate of the CA that signed the servers' (`tls_root_certificate`): the ZooKeeper client reads no system roots"
                .into(),
        );
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates_of(root_pem, "the root certificate")? {
        roots
            .add(cert)
            .map_err(|e| format!("the root certificate cannot be used: {e}"))?;
    }
    let text = |pem: &[u8], what: &str| {
        std::str::from_utf8(pem)
            .map(str::to_owned)
            .map_err(|_| format!("{what} is not PEM text"))
    };
    let mut options = zookeeper_client::TlsOptions::new()
        .with_pem_ca(&text(root_pem, "the root certificate")?)
        .map_err(|e| format!("the root certificate: {e}"))?;
    let probe = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| format!("TLS cannot be set up: {e}"))?
    .with_root_certificates(roots);
    let probe = match certificate {
        Some(certificate) => {
            let (chain, key) = client_certificate_of(certificate)?;
            options = options
                .with_pem_identity(
                    &text(&certificate.certificate, "the client certificate")?,
                    &text(&certificate.key, "the client certificate's key")?,
                )
                .map_err(|_| "the client certificate or its key was refused".to_owned())?;
            probe
                .with_client_auth_cert(chain, key)
                .map_err(|_| "the client certificate or its key was refused".to_owned())?
        }
        None => probe.with_no_client_auth(),
    };
    Ok(ZooKeeperTls {
        options,
        probe: std::sync::Arc::new(probe),
    })
}

/// What a member made of a TLS handshake.
#[cfg(feature = "zookeeper-tls")]
pub(crate) enum Handshake {
    /// Refused for a certificate, which waiting cannot mend: why.
    Refused(String),
    /// The session opened, and nothing refused it.
    Accepted,
    /// No answer, or a failure that says nothing of the certificates (a
    /// member down or still starting).
    Unknown,
}

/// A TLS handshake with the member at `host:port`, made with `config`,
/// and how it ended: the member's certificate not one `config` verifies,
/// or the member refusing the client's (an alert, which a TLS 1.3 server
/// sends after its handshake), are [`Handshake::Refused`]. Asked because
/// the ZooKeeper client reports every failed handshake as "no available
/// hosts"; rustls does the TLS, so nothing of the protocol is by hand.
/// Done within about twice `within`, however slowly the member answers.
#[cfg(feature = "zookeeper-tls")]
pub(crate) async fn handshake(
    host: &str,
    port: u16,
    config: std::sync::Arc<rustls::ClientConfig>,
    within: std::time::Duration,
) -> Handshake {
    use std::io::Read;

    let Ok(name) = rustls::pki_types::ServerName::try_from(host.to_owned()) else {
        return Handshake::Unknown;
    };
    let address = socket_address(host, port);
    let probe = move || -> Handshake {
        let deadline = std::time::Instant::now() + within;
        let said = |e: std::io::Error| -> Handshake {
            let Some(e) = e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) else {
                return Handshake::Unknown;
            };
            match e {
                rustls::Error::InvalidCertificate(_) => Handshake::Refused(format!(
                    "shows a certificate that `tls_root_certificate` does not verify ({e})"
                )),
                rustls::Error::AlertReceived(
                    rustls::AlertDescription::BadCertificate
                    | rustls::AlertDescription::CertificateRequired
                    | rustls::AlertDescription::UnknownCA
                    | rustls::AlertDescription::UnsupportedCertificate
                    | rustls::AlertDescription::CertificateExpired
                    | rustls::AlertDescription::CertificateRevoked
                    | rustls::AlertDescription::CertificateUnknown
                    | rustls::AlertDescription::AccessDenied,
                ) => Handshake::Refused(format!(
                    "refused the client's certificate ({e}): it asks for one signed by a CA it trusts (`zookeeper_client_certificate`), which names this client's host where it checks host names (`ssl.hostnameVerification`)"
                )),
                _ => Handshake::Unknown,
            }
        };
        let Ok(mut tcp) = connect_with_timeouts(&address, within) else {
            return Handshake::Unknown;
        };
        let Ok(mut tls) = rustls::ClientConnection::new(config, name) else {
            return Handshake::Unknown;
        };
        while tls.is_handshaking() {
            // Each read has its timeout; a member that trickles bytes
            // is cut off here.
            if std::time::Instant::now() > deadline {
                return Handshake::Unknown;
            }
            if let Err(e) = tls.complete_io(&mut tcp) {
                return said(e);
            }
        }
        // A TLS 1.3 server judges the client's certificate after the
        // handshake: its refusal is the first record read. A server that
        // took it says nothing until asked, and the read times out.
        let mut first = [0u8; 1];
        match rustls::Stream::new(&mut tls, &mut tcp).read_exact(&mut first) {
            Err(e) => match said(e) {
                Handshake::Unknown => Handshake::Accepted,
                refused => refused,
            },
            Ok(()) => Handshake::Accepted,
        }
    };
    tokio::task::spawn_blocking(probe)
        .await
        .unwrap_or(Handshake::Unknown)
}

/// `host:port`, with an IPv6 address in brackets.
#[cfg(feature = "tls")]
fn socket_address(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// A blocking connection to `address`, whose connect, reads and writes
/// each give up after `within`.
#[cfg(feature = "tls")]
pub(crate) fn connect_with_timeouts(
    address: &str,
    within: std::time::Duration,
) -> std::io::Result<std::net::TcpStream> {
    use std::net::ToSocketAddrs;

    let to = address
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::other("no address"))?;
    let stream = std::net::TcpStream::connect_timeout(&to, within)?;
    stream.set_read_timeout(Some(within))?;
    stream.set_write_timeout(Some(within))?;
    Ok(stream)
}

/// Whether the server at `host:port` answers a TLS ClientHello as a TLS
/// server does (a handshake or an alert record), within `within`: how a
/// plain client that a server closed on tells a TLS-only server from one
/// still starting. Written here because no kept crate offers the probe;
/// rustls makes the hello, so nothing of the protocol is by hand.
#[cfg(feature = "tls")]
pub(crate) async fn answers_tls(host: &str, port: u16, within: std::time::Duration) -> bool {
    install_tls_provider();
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let Ok(name) = rustls::pki_types::ServerName::try_from(host.to_owned()) else {
        return false;
    };
    let Ok(mut hello_maker) = rustls::ClientConnection::new(std::sync::Arc::new(config), name) else {
        return false;
    };
    let mut hello = Vec::new();
    if hello_maker.write_tls(&mut hello).is_err() {
        return false;
    }
    // A TLS record of type handshake (22) or alert (21).
    matches!(
        first_byte_answered(host, port, hello, within).await,
        Some(21 | 22)
    )
}

/// The first byte the server at `host:port` answers `bytes` with, within
/// `within`, or `None` (no connection, closed, or silent): the probes
/// that tell what a server speaks.
#[cfg(feature = "tls")]
pub(crate) async fn first_byte_answered(
    host: &str,
    port: u16,
    bytes: Vec<u8>,
    within: std::time::Duration,
) -> Option<u8> {
    use std::io::{Read, Write};

    let address = socket_address(host, port);
    let probe = move || -> std::io::Result<u8> {
        let mut stream = connect_with_timeouts(&address, within)?;
        stream.write_all(&bytes)?;
        let mut first = [0u8; 1];
        stream.read_exact(&mut first)?;
        Ok(first[0])
    };
    tokio::task::spawn_blocking(probe).await.ok()?.ok()
}

#[cfg(not(feature = "tls"))]
pub(crate) async fn answers_tls(_host: &str, _port: u16, _within: std::time::Duration) -> bool {
    false
}
