//! QUIC endpoint configuration shared by the cloud (server) and the edge (client):
//! TLS 1.3 always on, with certificates from PEM files or a generated dev certificate.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// ALPN protocol of Hasten's search fast path; a peer speaking anything else is refused.
pub const ALPN: &[u8] = b"hasten-search/1";

/// Edges keep one connection per cloud endpoint open between bursts of fallbacks; a
/// keep-alive well inside the idle timeout stops middleboxes and quinn from dropping it.
const KEEP_ALIVE: Duration = Duration::from_secs(5);

/// A connection with no traffic (keep-alives included) for this long is dead.
const MAX_IDLE: Duration = Duration::from_secs(30);

/// Concurrent requests per connection: each request is one bidirectional stream, and an
/// edge under load has at most its admission limit of fallbacks in flight.
const MAX_CONCURRENT_STREAMS: u32 = 1024;

/// Congestion window a connection starts with. One fallback answer (10 documents with texts
/// and 384-d vectors) is ~25 KB, twice QUIC's default initial window of ~12 KB, which costs a
/// second round trip on every reply of an otherwise idle connection: measured through a
/// 100-200 ms emulated path, a search took ~0.29 s instead of ~0.15 s. Edge-cloud links are
/// provisioned, so start with room for a few dozen replies.
const INITIAL_WINDOW_BYTES: u64 = 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: rustls_pki_types::pem::Error,
    },
    #[error("{path} holds no {what}")]
    Empty { path: String, what: &'static str },
    #[error("dev certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("TLS configuration refused: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("QUIC crypto configuration refused: {0}")]
    Quic(String),
}

/// A server's certificate chain and private key.
#[derive(Debug)]
pub struct ServerIdentity {
    pub cert_chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

impl ServerIdentity {
    /// Loads a PEM certificate chain and PEM private key.
    pub fn from_pem_files(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let cert_chain = load_certificates(cert)?;
        let key = PrivateKeyDer::from_pem_file(key).map_err(|source| TlsError::Read {
            path: key.display().to_string(),
            source,
        })?;
        Ok(Self { cert_chain, key })
    }

    /// Generates a self-signed certificate for `names` (DNS names or IP addresses).
    /// Returns the identity and the certificate's PEM, which clients must trust.
    pub fn generate_dev(names: &[String]) -> Result<(Self, String), TlsError> {
        let certified = rcgen::generate_simple_self_signed(names.to_vec())?;
        let pem = certified.cert.pem();
        let key = PrivateKeyDer::try_from(certified.signing_key.serialize_der())
            .map_err(|e| TlsError::Quic(e.to_string()))?;
        Ok((
            Self {
                cert_chain: vec![certified.cert.der().clone()],
                key,
            },
            pem,
        ))
    }
}

fn load_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|source| TlsError::Read {
            path: path.display().to_string(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            path: path.display().to_string(),
            what: "certificate",
        });
    }
    Ok(certs)
}

fn crypto_provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn transport_config() -> Arc<quinn::TransportConfig> {
    let mut transport = quinn::TransportConfig::default();
    transport.keep_alive_interval(Some(KEEP_ALIVE));
    // MAX_IDLE is far below the protocol's limit of 2^62 ms, so the conversion cannot fail.
    transport.max_idle_timeout(quinn::IdleTimeout::try_from(MAX_IDLE).ok());
    transport.max_concurrent_bidi_streams(MAX_CONCURRENT_STREAMS.into());
    transport.max_concurrent_uni_streams(0u32.into());
    let mut congestion = quinn::congestion::CubicConfig::default();
    congestion.initial_window(INITIAL_WINDOW_BYTES);
    transport.congestion_controller_factory(Arc::new(congestion));
    Arc::new(transport)
}

/// QUIC server configuration: TLS 1.3 with `identity`, Hasten's ALPN.
pub fn server_config(identity: ServerIdentity) -> Result<quinn::ServerConfig, TlsError> {
    let mut tls = rustls::ServerConfig::builder_with_provider(crypto_provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(identity.cert_chain, identity.key)?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let crypto = QuicServerConfig::try_from(tls).map_err(|e| TlsError::Quic(e.to_string()))?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    config.transport_config(transport_config());
    Ok(config)
}

/// QUIC client configuration trusting the certificates in the PEM file `ca`.
pub fn client_config(ca: &Path) -> Result<quinn::ClientConfig, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certificates(ca)? {
        roots.add(cert)?;
    }
    let mut tls = rustls::ClientConfig::builder_with_provider(crypto_provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let crypto = QuicClientConfig::try_from(tls).map_err(|e| TlsError::Quic(e.to_string()))?;
    let mut config = quinn::ClientConfig::new(Arc::new(crypto));
    config.transport_config(transport_config());
    Ok(config)
}
