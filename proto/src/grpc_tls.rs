//! TLS on gRPC servers with the certificate read again when its files change, as on QUIC:
//! a renewed Secret is served from the next handshake, without a restart. tonic's own TLS
//! reads the pair once at start, so the servers here take TLS streams made by this module.

use display_full_error::DisplayFullErrorExt;
use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Router, TcpIncoming};

use crate::client_auth::server_builder;
use crate::reload::{ReloadOutcome, ReloadingCertificate};
use crate::tls::{MutualTls, TlsError, TrustRoots};

/// Longest a client may take over its handshake before its connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshaken connections waiting for the server to take them.
const ACCEPTED_BACKLOG: usize = 64;

/// A gRPC server's TLS: `certificate` (read again when its files change), TLS 1.3 (as on
/// QUIC), HTTP/2, and a client certificate leading to `clients` required of every caller.
pub fn server_config(
    certificate: Arc<ReloadingCertificate>,
    clients: &TrustRoots,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let mut tls =
        server_builder(&[&rustls::version::TLS13], Some(clients))?.with_cert_resolver(certificate);
    tls.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(tls))
}

/// [`server_config`] of a component under mutual TLS: its certificate files read again when
/// they change (`on_reload` hears of each change), its CAs required of clients.
pub fn reloading_server_config(
    mutual: &MutualTls,
    on_reload: impl Fn(ReloadOutcome<'_>) + Send + Sync + 'static,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let paths = mutual.paths();
    let certificate = ReloadingCertificate::load(&paths.cert, &paths.key, on_reload)?;
    server_config(Arc::new(certificate), mutual.trust())
}

/// Serves `router` on `listener` until `shutdown` resolves: over TLS with `tls`, else in
/// plaintext. Connections get TCP_NODELAY (HTTP/2 writes headers and data separately, and
/// without it the second write waits for the peer's delayed ACK, ~40 ms).
pub async fn serve(
    router: Router,
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    match tls {
        Some(config) => {
            router
                .serve_with_incoming_shutdown(tls_incoming(listener, config), shutdown)
                .await
        }
        None => {
            router
                .serve_with_incoming_shutdown(
                    TcpIncoming::from(listener).with_nodelay(Some(true)),
                    shutdown,
                )
                .await
        }
    }
}

/// Connections accepted on `listener` once their TLS handshake succeeds, each handshake in
/// a task of its own (a slow client holds up nobody). A failed handshake is logged and the
/// connection dropped; the server never sees it.
fn tls_incoming(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
) -> ReceiverStream<Result<TlsStream<TcpStream>, io::Error>> {
    let (sender, accepted) = mpsc::channel(ACCEPTED_BACKLOG);
    let acceptor = TlsAcceptor::from(config);
    tokio::spawn(async move {
        loop {
            let (stream, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(err) => {
                        // Out of file descriptors, or a connection reset before it was
                        // taken: pause instead of spinning.
                        tracing::warn!(error = %err.display_full(), "accepting a gRPC connection failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                // The server stopped taking connections.
                () = sender.closed() => return,
            };
            if let Err(err) = stream.set_nodelay(true) {
                tracing::debug!(error = %err.display_full(), "could not set TCP_NODELAY");
            }
            let (acceptor, sender) = (acceptor.clone(), sender.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => {
                        let _ = sender.send(Ok(tls)).await;
                    }
                    Ok(Err(err)) => {
                        tracing::debug!(%peer, error = %err.display_full(), "gRPC TLS handshake failed")
                    }
                    Err(_) => tracing::debug!(%peer, "gRPC TLS handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(accepted)
}
