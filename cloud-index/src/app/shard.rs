//! `cloud-index serve`: a shard server assembled from its configuration.

use std::time::Instant;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::listeners::{Listeners, ServerTls, serve_backend, serve_observability};
use anyhow::{Context, Result};
use hasten_cloud_index::backend::{Admission, Metered};
use hasten_cloud_index::config::ShardConfig;
use hasten_cloud_index::metrics::{CloudMetrics, Role};
use hasten_cloud_index::{ExactSearcher, ShardService};
use hasten_core::bundle::CorpusBundle;
use hasten_core::metrics::ReadinessCheck;
use hasten_core::threads::{available_cores, set_blas_min_batch, set_compute_threads};

/// Serves the shard's bundle until a shutdown signal.
pub(crate) async fn serve(config: ShardConfig) -> Result<()> {
    let _traces = hasten_core::logging::init_with_traces(
        config.log_format,
        config.otlp_endpoint.as_deref(),
        "hasten-shard",
    )?;
    let registry = hasten_core::metrics::registry()?;
    let metrics = CloudMetrics::register(&registry, Role::Shard)?;
    let loaded = Arc::new(AtomicBool::new(false));
    let ready: ReadinessCheck = {
        let loaded = Arc::clone(&loaded);
        Arc::new(move || {
            if loaded.load(Ordering::Acquire) {
                Ok(())
            } else {
                Err("loading the index".into())
            }
        })
    };
    let metrics_addr = serve_observability(
        config.server.metrics_addr,
        registry.clone(),
        Arc::new(|| {}),
        ready.clone(),
    )
    .await?;
    let all_cores = |n: usize| if n == 0 { available_cores() } else { n };
    let threads = set_compute_threads(
        all_cores(config.openmp_threads),
        all_cores(config.openblas_threads),
    );
    set_blas_min_batch(config.blas_min_batch);
    tracing::info!(
        openmp = ?threads.openmp,
        openblas = ?threads.openblas,
        blas_min_batch = config.blas_min_batch,
        "compute threads"
    );
    let bundle_dir = config.bundle.clone().unwrap_or_default();
    let started = Instant::now();
    let bundle = CorpusBundle::load(&bundle_dir)
        .with_context(|| format!("loading the bundle {}", bundle_dir.display()))?;
    let searcher = ExactSearcher::new(bundle).context("building the exact index")?;
    searcher
        .warm_up(config.blas_min_batch.max(2) * 4)
        .context("warming up the index")?;
    let info = searcher.info();
    tracing::info!(
        documents = info.documents,
        corpus_version = %info.corpus_version,
        shard = info.shard_index,
        shards = info.shard_count,
        batching = config.batching.enabled,
        seconds = format!("{:.1}", started.elapsed().as_secs_f64()),
        "index loaded"
    );
    let tls = ServerTls::load(
        config.mutual_tls(),
        (&config.tls.tls_cert, &config.tls.tls_key),
        &config.server.dev_cert_out,
        &config.server.dev_cert_names,
    )?;
    let certificate = tls.quic_certificate(&registry)?;
    let shard = info.shard_index.to_string();
    let service = ShardService::new(searcher, config.batching.settings(), metrics.clone());
    loaded.store(true, Ordering::Release);
    serve_backend(
        Metered::new(
            Admission::new(service, config.server.max_in_flight),
            metrics,
            shard,
        ),
        Listeners::new(&config.server, metrics_addr, tls, certificate, ready),
    )
    .await
}
