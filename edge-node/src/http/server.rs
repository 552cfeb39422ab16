//! Serving an HTTP router on a listener with bounds a public endpoint needs: at most
//! `max_connections` connections (beyond it a new one is closed at once, so idle sockets
//! cannot exhaust the file descriptors), at most `max_connections_per_client` of them from
//! one client address (so one client's idle sockets cannot refuse every other client), a
//! deadline for each request's head (which also closes a connection idle between
//! requests), and a bounded drain on shutdown.

use display_full_error::DisplayFullErrorExt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hasten_core::metrics::prometheus::IntCounter;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::keyed_limit::KeyedLimit;

/// Bounds of the HTTP server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpServerLimits {
    pub max_connections: usize,
    /// Connections one client address may hold open at once (at most `max_connections`).
    pub max_connections_per_client: usize,
    /// Longest a client may take to send a request's head, or to start the next one on an
    /// open connection.
    pub header_timeout: Duration,
    /// Longest connections may take to finish after shutdown starts.
    pub shutdown_grace: Duration,
}

/// Serves `router` on `listener` until `shutdown` resolves, then lets open connections
/// finish for at most the grace period. Counts in `refused` the connections closed for
/// being beyond the bound.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: HttpServerLimits,
    refused: IntCounter,
    shutdown: impl Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let clients = KeyedLimit::new(Some(limits.max_connections_per_client));
    let graceful = GracefulShutdown::new();
    // HTTP/1 only (gRPC has its own listener): sniffing for an HTTP/2 preface would wait
    // on an idle socket before any head timeout starts.
    let mut builder = auto::Builder::new(TokioExecutor::new()).http1_only();
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of file descriptors, or a connection reset before it was taken:
                    // pause instead of spinning, keep serving the open ones.
                    tracing::warn!(error = %err.display_full(), "accepting an HTTP connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(client_slot) = clients.take(&peer.ip()) else {
            refused.inc();
            tracing::debug!(%peer, max = limits.max_connections_per_client, "HTTP connection beyond the client's bound closed");
            continue;
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            refused.inc();
            tracing::debug!(%peer, max = limits.max_connections, "HTTP connection beyond the bound closed");
            continue;
        };
        if let Err(err) = stream.set_nodelay(true) {
            tracing::debug!(error = %err.display_full(), "could not set TCP_NODELAY");
        }
        let service = TowerToHyperService::new(router.clone());
        let connection = builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(%peer, error = %err.display_full(), "HTTP connection ended with an error");
            }
            drop((slot, client_slot));
        });
    }
    drop(listener);
    if tokio::time::timeout(limits.shutdown_grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            grace = ?limits.shutdown_grace,
            "HTTP connections still open after the shutdown grace; closing them"
        );
    }
}
