//! QUIC endpoint configuration shared by the cloud (server) and its clients (edges, the
//! benchmark): TLS 1.3 always on, mutual when the server names the CA its clients' certificates
//! must come from.

use display_full_error::DisplayFullErrorExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};

use crate::client_auth::server_builder;
use crate::reload::{ReloadOutcome, Reloading, ReloadingCertificate};
use crate::tls::{Identity, TlsError, TrustRoots, crypto_provider};

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

/// What a QUIC server shows its clients.
#[derive(Debug)]
pub enum ServerCertificate {
    /// Read once (a development certificate generated at start).
    Fixed(Identity),
    /// Read again from its files when they change.
    Reloading(Arc<ReloadingCertificate>),
}

/// QUIC server configuration: TLS 1.3 with `certificate`, Hasten's ALPN. With `clients`,
/// every client must show a certificate leading to those roots or its handshake fails.
pub fn server_config(
    certificate: ServerCertificate,
    clients: Option<&TrustRoots>,
) -> Result<quinn::ServerConfig, TlsError> {
    let builder = server_builder(&[&rustls::version::TLS13], clients)?;
    let mut tls = match certificate {
        ServerCertificate::Fixed(identity) => {
            builder.with_single_cert(identity.cert_chain, identity.key)?
        }
        ServerCertificate::Reloading(resolver) => builder.with_cert_resolver(resolver),
    };
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let crypto = QuicServerConfig::try_from(tls).map_err(|e| TlsError::Quic(e.to_string_full()))?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    config.transport_config(transport_config());
    Ok(config)
}

/// QUIC client configuration trusting `servers`; with `identity`, shown to servers that
/// require a client certificate.
pub fn client_config(
    servers: &TrustRoots,
    identity: Option<Identity>,
) -> Result<quinn::ClientConfig, TlsError> {
    let builder = rustls::ClientConfig::builder_with_provider(crypto_provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(servers.store());
    let mut tls = match identity {
        Some(identity) => builder.with_client_auth_cert(identity.cert_chain, identity.key)?,
        None => builder.with_no_client_auth(),
    };
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let crypto = QuicClientConfig::try_from(tls).map_err(|e| TlsError::Quic(e.to_string_full()))?;
    let mut config = quinn::ClientConfig::new(Arc::new(crypto));
    config.transport_config(transport_config());
    Ok(config)
}

/// The files a QUIC client's TLS is made from.
#[derive(Clone, Debug)]
pub struct ClientTlsFiles {
    /// PEM files of the certificates trusted for servers (a CA and, during a rotation, the
    /// other CA); at least one.
    pub trust: Vec<PathBuf>,
    /// The certificate and key shown to servers that require one (mutual TLS).
    pub identity: Option<(PathBuf, PathBuf)>,
}

/// [`client_config`] made from `files`, and made again when they change, so that a new
/// connection shows a renewed certificate and trusts a rotated CA (connections already open
/// keep theirs). `on_reload` hears of every change, with the certificate's expiry (the
/// trusted certificates' first, without one).
pub fn reloading_client_config(
    files: ClientTlsFiles,
    on_reload: impl Fn(ReloadOutcome<'_>) + Send + Sync + 'static,
) -> Result<Reloading<quinn::ClientConfig>, TlsError> {
    let mut paths = files.trust.clone();
    if let Some((cert, key)) = &files.identity {
        paths.extend([cert.clone(), key.clone()]);
    }
    Reloading::from_files(
        paths,
        move || {
            let trust = TrustRoots::from_pem_files(&files.trust)?;
            let identity = files
                .identity
                .as_ref()
                .map(|(cert, key)| Identity::from_pem_files(cert, key))
                .transpose()?;
            let expires_at = match &identity {
                Some(identity) => identity.expires_at()?,
                None => trust.expires_at(),
            };
            Ok((client_config(&trust, identity)?, expires_at))
        },
        on_reload,
    )
}
