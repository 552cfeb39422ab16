//! TLS of gRPC clients under mutual TLS, read again from its files when they change: the
//! certificate a client shows and the CAs it trusts are used from its next connection, so a
//! renewed Secret or a rotated CA needs no restart (tonic's own TLS reads them once, so the
//! channels here connect through this module's connector).

use display_full_error::DisplayFullErrorExt;
use std::sync::Arc;

use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::reload::{ReloadOutcome, Reloading};
use crate::tls::{Identity, TlsError, TlsPaths, TrustRoots, crypto_provider};

/// A gRPC client's TLS made from its mutual-TLS files, shared by every channel made with it.
#[derive(Clone, Debug)]
pub struct GrpcClientTls {
    config: Arc<Reloading<rustls::ClientConfig>>,
}

/// The rustls client configuration of `paths`: HTTP/2, TLS 1.3, the CAs trusted, the
/// certificate shown.
fn client_config(paths: &TlsPaths) -> Result<(rustls::ClientConfig, i64), TlsError> {
    let trust_files: Vec<_> = std::iter::once(paths.ca.clone())
        .chain(paths.extra_ca.clone())
        .collect();
    let trust = TrustRoots::from_pem_files(&trust_files)?;
    let identity = Identity::from_pem_files(&paths.cert, &paths.key)?;
    let expires_at = identity.expires_at()?;
    let mut config = rustls::ClientConfig::builder_with_provider(crypto_provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(trust.store())
        .with_client_auth_cert(identity.cert_chain, identity.key)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok((config, expires_at))
}

impl GrpcClientTls {
    /// Reads the files now (an error if they cannot be used); later changes are logged.
    pub fn load(paths: &TlsPaths) -> Result<Self, TlsError> {
        let mut files = vec![paths.ca.clone(), paths.cert.clone(), paths.key.clone()];
        files.extend(paths.extra_ca.clone());
        let owned = paths.clone();
        let config = Reloading::from_files(
            files,
            move || client_config(&owned),
            |outcome| match outcome {
                ReloadOutcome::Reloaded { .. } => {
                    tracing::info!(
                        "gRPC clients use the changed TLS files from their next connection"
                    )
                }
                ReloadOutcome::Failed(err) => tracing::warn!(
                    error = %err.display_full(),
                    "the changed TLS files cannot be used; gRPC clients keep the previous ones"
                ),
            },
        )?;
        Ok(Self {
            config: Arc::new(config),
        })
    }

    /// A channel to `endpoint` (an `https://` URI) over this TLS, connecting on first use;
    /// call within a tokio runtime.
    pub fn lazy_channel(&self, endpoint: Endpoint) -> Channel {
        endpoint.connect_with_connector_lazy(self.connector())
    }

    /// A channel to `endpoint` over this TLS, connected now.
    pub async fn channel(&self, endpoint: Endpoint) -> Result<Channel, tonic::transport::Error> {
        endpoint.connect_with_connector(self.connector()).await
    }

    /// Dials a URI's host and port and shakes hands with the configuration as it is now.
    fn connector(
        &self,
    ) -> impl tower::Service<
        Uri,
        Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>,
        Error = std::io::Error,
        Future = impl Future<
            Output = std::io::Result<TokioIo<tokio_rustls::client::TlsStream<TcpStream>>>,
        > + Send,
    > + Clone
    + Send
    + 'static {
        let config = Arc::clone(&self.config);
        tower::service_fn(move |uri: Uri| {
            let config = Arc::clone(&config);
            async move {
                let host = uri
                    .host()
                    .ok_or_else(|| std::io::Error::other(format!("{uri} names no host")))?
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_string();
                let port = uri.port_u16().unwrap_or(443);
                let server_name = ServerName::try_from(host.clone())
                    .map_err(|e| std::io::Error::other(format!("`{host}`: {e}")))?;
                let tcp = TcpStream::connect((host.as_str(), port)).await?;
                // HTTP/2 writes headers and data separately: without it the second write
                // waits for the peer's delayed ACK.
                tcp.set_nodelay(true)?;
                let tls = TlsConnector::from(config.current())
                    .connect(server_name, tcp)
                    .await?;
                Ok(TokioIo::new(tls))
            }
        })
    }
}
