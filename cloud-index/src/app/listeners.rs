//! What a shard server and a router share: their TLS, their listeners, and serving a search
//! backend on QUIC and gRPC until a shutdown signal.

use std::net::SocketAddr;
use std::path::PathBuf;

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use hasten_cloud_index::SearchBackend;
use hasten_cloud_index::config::ServerConfig;
use hasten_cloud_index::dev_cert::{DevCertOrigin, DevCertificate, key_path};
use hasten_cloud_index::grpc::CloudIndexGrpc;
use hasten_core::lifecycle::{shutdown_signal, write_atomically};
use hasten_core::metrics::ReadinessCheck;
use hasten_proto::frame::DEFAULT_MAX_FRAME_BYTES;
use hasten_proto::grpc_tls;
use hasten_proto::health::readiness_health;
use hasten_proto::quic::{ServerCertificate, server_config};
use hasten_proto::reload::ReloadingCertificate;
use hasten_proto::tls::{Identity, MutualTls, TlsPaths};
use hasten_proto::v1::cloud_index_server::CloudIndexServer;

/// A server's TLS: mutual (its certificate from the deployment's CA, and clients must show
/// one too), server-only from certificate files, or a dev certificate kept at
/// `dev_cert_out` (its key beside it) for clients to trust.
pub(super) struct ServerTls {
    identity: Identity,
    pub(super) mutual: Option<MutualTls>,
    /// The certificate and key files the identity came from (none for a dev certificate).
    files: Option<(PathBuf, PathBuf)>,
}

impl ServerTls {
    /// When the served certificate (and, under mutual TLS, the CA's) expires.
    fn expiries(&self) -> Result<Vec<(&'static str, i64)>> {
        Ok(match &self.mutual {
            Some(mutual) => mutual.expiries()?,
            None => vec![("certificate", self.identity.expires_at()?)],
        })
    }

    pub(super) fn load(
        mutual: Option<TlsPaths>,
        files: (&Option<PathBuf>, &Option<PathBuf>),
        dev_cert_out: &Path,
        dev_cert_names: &[String],
    ) -> Result<Self> {
        if let Some(paths) = mutual {
            let mutual = MutualTls::load(&paths).context("loading the mutual-TLS files")?;
            return Ok(Self {
                identity: mutual.identity().clone(),
                mutual: Some(mutual),
                files: Some((paths.cert, paths.key)),
            });
        }
        tracing::warn!(
            "mutual TLS is off (no `tls_ca`): any client that trusts this server's certificate may search, and gRPC is plaintext"
        );
        if let (Some(cert), Some(key)) = files {
            let identity =
                Identity::from_pem_files(cert, key).context("loading the TLS certificate")?;
            return Ok(Self {
                identity,
                mutual: None,
                files: Some((cert.clone(), key.clone())),
            });
        }
        let dev = DevCertificate::load_or_generate(dev_cert_out, dev_cert_names)
            .context("setting up the dev certificate")?;
        let path = dev_cert_out.display();
        let key = key_path(dev_cert_out);
        let key = key.display();
        match &dev.origin {
            DevCertOrigin::Reused => tracing::warn!(
                %path, %key,
                "no TLS certificate configured: serving the self-signed dev certificate kept from an earlier start"
            ),
            DevCertOrigin::Created => tracing::warn!(
                %path, %key,
                "no TLS certificate configured: generated a self-signed dev certificate, kept for later starts; edges must trust it"
            ),
            DevCertOrigin::Replaced(why) => tracing::warn!(
                %path, %key, why = %why,
                "no TLS certificate configured: the kept dev certificate cannot serve, generated a new one; clients trusting the old one must be given this one"
            ),
        }
        Ok(Self {
            identity: dev.identity,
            mutual: None,
            files: None,
        })
    }

    /// What QUIC serves: the certificate files read again when they change (a renewed
    /// Secret is served from the next handshake; gRPC keeps the one read at start), with
    /// their expiry and reloads in `registry`.
    pub(super) fn quic_certificate(
        &self,
        registry: &hasten_core::metrics::prometheus::Registry,
    ) -> Result<ServerCertificate> {
        let expiry =
            hasten_core::metrics::register_certificate_expiry(registry, &self.expiries()?)?;
        let Some((cert, key)) = &self.files else {
            return Ok(ServerCertificate::Fixed(self.identity.clone()));
        };
        let report = hasten_core::metrics::tls_reload_reporter(
            registry,
            expiry,
            "certificate",
            cert.display().to_string(),
        )?;
        let certificate =
            ReloadingCertificate::load(cert, key, move |outcome| report(outcome.result()))
                .context("loading the TLS certificate")?;
        Ok(ServerCertificate::Reloading(Arc::new(certificate)))
    }
}

/// Where a server listens and reports itself.
pub(super) struct Listeners {
    quic_addr: SocketAddr,
    grpc_addr: SocketAddr,
    /// Already serving (bound before the slow start-up, for liveness probes).
    metrics_addr: SocketAddr,
    tls: ServerTls,
    certificate: ServerCertificate,
    ready_file: Option<PathBuf>,
    /// What `/readyz` answers, answered on the gRPC port too (`grpc.health.v1`).
    ready: ReadinessCheck,
}

impl Listeners {
    /// The listeners of `server`, its metrics listener already bound at `metrics_addr`.
    pub(super) fn new(
        server: &ServerConfig,
        metrics_addr: SocketAddr,
        tls: ServerTls,
        certificate: ServerCertificate,
        ready: ReadinessCheck,
    ) -> Self {
        Self {
            quic_addr: server.quic_addr,
            grpc_addr: server.grpc_addr,
            metrics_addr,
            tls,
            certificate,
            ready_file: server.ready_file.clone(),
            ready,
        }
    }
}

/// Serves `/metrics`, `/readyz` and `/healthz` on `addr` from now on; returns the bound
/// address.
pub(super) async fn serve_observability(
    addr: SocketAddr,
    registry: hasten_core::metrics::prometheus::Registry,
    refresh: Arc<dyn Fn() + Send + Sync>,
    ready: ReadinessCheck,
) -> Result<SocketAddr> {
    hasten_core::metrics::serve(addr, registry, refresh, ready)
        .await
        .with_context(|| format!("binding the metrics listener on {addr}"))
}

/// Serves `backend` on QUIC and gRPC until a shutdown signal.
pub(super) async fn serve_backend<B: SearchBackend>(
    backend: B,
    listeners: Listeners,
) -> Result<()> {
    let info = backend.info();
    let mutual = listeners.tls.mutual;
    // gRPC is TLS only under mutual TLS, whose certificate comes from files: the QUIC
    // listener's reloading certificate serves both.
    let grpc_tls_config = match (&mutual, &listeners.certificate) {
        (Some(mutual), ServerCertificate::Reloading(certificate)) => Some(
            grpc_tls::server_config(Arc::clone(certificate), mutual.trust())
                .context("configuring gRPC TLS")?,
        ),
        (Some(_), ServerCertificate::Fixed(_)) => {
            anyhow::bail!("mutual TLS without certificate files")
        }
        (None, _) => None,
    };
    let quic = hasten_cloud_index::quic::bind(
        listeners.quic_addr,
        server_config(listeners.certificate, mutual.as_ref().map(MutualTls::trust))?,
    )
    .with_context(|| format!("binding QUIC on {}", listeners.quic_addr))?;
    let quic_addr = quic.local_addr()?;
    let grpc_listener = tokio::net::TcpListener::bind(listeners.grpc_addr)
        .await
        .with_context(|| format!("binding gRPC on {}", listeners.grpc_addr))?;
    let grpc_addr = grpc_listener.local_addr()?;

    let quic_task = tokio::spawn(hasten_cloud_index::quic::serve(
        quic.clone(),
        backend.clone(),
    ));
    let grpc_service = CloudIndexServer::new(CloudIndexGrpc::new(backend))
        .max_decoding_message_size(DEFAULT_MAX_FRAME_BYTES)
        .max_encoding_message_size(DEFAULT_MAX_FRAME_BYTES);
    let grpc_router = tonic::transport::Server::builder()
        .add_service(grpc_service)
        .add_service(readiness_health(listeners.ready));
    let grpc_task = tokio::spawn(grpc_tls::serve(
        grpc_router,
        grpc_listener,
        grpc_tls_config,
        shutdown_signal(),
    ));
    tracing::info!(%quic_addr, %grpc_addr, metrics_addr = %listeners.metrics_addr, "serving");
    if let Some(path) = &listeners.ready_file {
        let ready = serde_json::json!({
            "quic_addr": quic_addr.to_string(),
            "grpc_addr": grpc_addr.to_string(),
            "metrics_addr": listeners.metrics_addr.to_string(),
            "corpus_version": info.corpus_version,
            "documents": info.documents,
            "shard_index": info.shard_index,
            "shard_count": info.shard_count,
        });
        write_atomically(path, ready.to_string().as_bytes())
            .with_context(|| format!("writing the ready file {}", path.display()))?;
    }
    grpc_task.await?.context("gRPC server")?;
    quic.close(0u32.into(), b"shutting down");
    quic_task.abort();
    tracing::info!("stopped");
    Ok(())
}
