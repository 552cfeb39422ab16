//! `cloud-index route`: a router over shard replicas assembled from its configuration.

use std::sync::{Arc, OnceLock};

use super::listeners::{Listeners, ServerTls, serve_backend, serve_observability};
use anyhow::Result;
use hasten_cloud_index::SearchBackend;
use hasten_cloud_index::backend::{Admission, Metered};
use hasten_cloud_index::config::RouterConfig;
use hasten_cloud_index::metrics::{CloudMetrics, Role};
use hasten_cloud_index::router::Router;
use hasten_cloud_index::shard_map::follow_control_plane;
use hasten_core::lifecycle::shutdown_signal;
use hasten_core::metrics::ReadinessCheck;
use hasten_proto::auth::AccessToken;
use hasten_proto::control::ControlAccess;

/// Routes searches over the configured shards until a shutdown signal.
pub(crate) async fn serve(config: RouterConfig) -> Result<()> {
    let _traces = hasten_core::logging::init_with_traces(
        config.log_format,
        config.otlp_endpoint.as_deref(),
        "hasten-router",
    )?;
    let registry = hasten_core::metrics::registry()?;
    let metrics = CloudMetrics::register(&registry, Role::Router)?;
    let started: Arc<OnceLock<Router>> = Arc::new(OnceLock::new());
    let refresh = {
        let started = Arc::clone(&started);
        Arc::new(move || {
            if let Some(router) = started.get() {
                router.report_replicas();
            }
        })
    };
    let ready: ReadinessCheck = {
        let started = Arc::clone(&started);
        Arc::new(move || {
            let router = started
                .get()
                .ok_or("waiting for a live replica of every shard")?;
            match router.unavailable_shards().as_slice() {
                [] => Ok(()),
                lost => Err(format!("no live replica of shards {lost:?}")),
            }
        })
    };
    let metrics_addr = serve_observability(
        config.server.metrics_addr,
        registry.clone(),
        refresh,
        ready.clone(),
    )
    .await?;
    let tls = ServerTls::load(
        config.mutual_tls(),
        (&config.tls.tls_cert, &config.tls.tls_key),
        &config.server.dev_cert_out,
        &config.server.dev_cert_names,
    )?;
    let certificate = tls.quic_certificate(&registry)?;
    // Read now, so that a bad file fails the start rather than after the shards answered.
    let control_token = config
        .control_plane_token_file
        .as_deref()
        .map(AccessToken::load)
        .transpose()?;
    let (map_updates, map) = tokio::sync::watch::channel(Arc::new(config.shard_map()?));
    let router = Router::start(
        map,
        config.router_settings(),
        config.batching.settings(),
        metrics.clone(),
        tls.mutual.clone(),
    );
    let router = tokio::select! {
        router = router => router?,
        () = shutdown_signal() => return Ok(()),
    };
    let _ = started.set(router.clone());
    let info = router.info();
    tracing::info!(
        shards = config.shards.len(),
        documents = info.documents,
        corpus_version = %info.corpus_version,
        "every shard has a live replica"
    );
    // Without a control plane nothing sends on `map_updates`: the map stays as configured.
    if !config.control_plane.is_empty() {
        tracing::info!(control_plane = ?config.control_plane, "following the control plane's shard map");
        let access = ControlAccess {
            tls: tls.mutual.clone(),
            token: control_token,
        };
        tokio::spawn(follow_control_plane(
            config.control_plane.clone(),
            access,
            map_updates,
        ));
    }
    serve_backend(
        Metered::new(
            Admission::new(router, config.server.max_in_flight),
            metrics,
            "all".into(),
        ),
        Listeners::new(&config.server, metrics_addr, tls, certificate, ready),
    )
    .await
}
