//! `kv-worker serve`: the `KvGeneration` service assembled from its configuration.

use std::sync::Arc;

use super::model::{StoreArgs, load, open_store};
use anyhow::{Context, Result};
use hasten_core::lifecycle::{shutdown_signal, write_atomically};
use hasten_core::metrics::ReadinessCheck;
use hasten_kv_worker::config::KvWorkerConfig;
use hasten_kv_worker::metrics::KvMetrics;
use hasten_kv_worker::service::KvGenerationService;
use hasten_kv_worker::worker::KvWorker;
use hasten_proto::grpc_tls;
use hasten_proto::health::readiness_health;
use hasten_proto::v1::kv_generation_server::KvGenerationServer;

/// Serves `KvGeneration` over the configured store until a shutdown signal.
pub(crate) async fn serve(config: KvWorkerConfig) -> Result<()> {
    let _traces = hasten_core::logging::init_with_traces(
        config.log_format,
        config.otlp_endpoint.as_deref(),
        "hasten-kv-worker",
    )?;
    let mutual = config.tls.load_mutual()?;
    let model_path = config
        .model
        .clone()
        .context("configuration: `model` is required")?;
    let loaded = load(
        &model_path,
        config.device,
        config.weights(),
        config.model_sha256.as_deref(),
    )?;
    let store = open_store(
        &StoreArgs {
            store: config.store.clone(),
            dtype: config.dtype,
            ram_budget: config.ram_budget,
            gpu_budget: config.gpu_budget,
        },
        &loaded,
    )?;
    let worker = KvWorker::new(
        loaded.engine,
        Arc::new(store),
        loaded.model_id,
        model_path,
        config.prefill_options(),
    )?;
    let info = worker.info()?;
    if info.corpora.is_empty() {
        tracing::warn!(
            store = %config.store.display(),
            "the store holds no corpus version for this model: only text chunks can be answered \
             until `kv-worker preprocess` runs"
        );
    }
    for (version, progress) in &info.corpora {
        tracing::info!(corpus_version = %version, ?progress, "corpus version held");
    }

    let registry = hasten_core::metrics::registry()?;
    let metrics = Arc::new(KvMetrics::register(&registry)?);
    let grpc_tls_config = hasten_core::metrics::reloading_grpc_tls(&registry, mutual.as_ref())?;
    metrics.observe_info(&info);
    // Ready once serving: the model and the catalogs are loaded before the listener opens.
    let ready: ReadinessCheck = Arc::new(|| Ok(()));
    let metrics_addr = hasten_core::metrics::serve(
        config.metrics_addr,
        registry,
        Arc::new(|| {}),
        ready.clone(),
    )
    .await
    .with_context(|| format!("binding the metrics listener on {}", config.metrics_addr))?;

    let listener = tokio::net::TcpListener::bind(config.grpc_addr)
        .await
        .with_context(|| format!("binding gRPC on {}", config.grpc_addr))?;
    let grpc_addr = listener.local_addr()?;
    let service = KvGenerationService::new(
        Arc::new(worker),
        config.queue,
        config.max_new_tokens,
        metrics,
    );
    if mutual.is_none() {
        tracing::warn!("mutual TLS is off (no `tls_ca`): any client may generate, in plaintext");
    }
    let router = tonic::transport::Server::builder()
        .add_service(KvGenerationServer::new(service).max_decoding_message_size(16 * 1024 * 1024))
        .add_service(readiness_health(ready));
    let serving = grpc_tls::serve(router, listener, grpc_tls_config, shutdown_signal());
    tracing::info!(%grpc_addr, %metrics_addr, "serving");
    if let Some(path) = &config.ready_file {
        let ready = serde_json::json!({
            "grpc_addr": grpc_addr.to_string(),
            "metrics_addr": metrics_addr.to_string(),
        });
        write_atomically(path, ready.to_string().as_bytes())
            .with_context(|| format!("writing the ready file {}", path.display()))?;
    }
    serving.await.context("gRPC server failed")?;
    tracing::info!("stopped");
    Ok(())
}
