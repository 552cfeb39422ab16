//! The retrieval engine: the bundle's documents, the fuzzy and cache channels, the tenants'
//! caches and the QUIC link to the cloud; warming the cache before serving.

use display_full_error::DisplayFullErrorExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hasten_core::bundle::CorpusBundle;
use hasten_core::encoder::TextEncoder;
use hasten_core::metrics::prometheus::{IntGaugeVec, Registry};
use hasten_core::metrics::tls_reload_reporter;
use hasten_core::retry::RetryDelays;
use hasten_edge_node::caches::{Eviction, TenantCaches};
use hasten_edge_node::config::EdgeConfig;
use hasten_edge_node::fallback::quic::{CloudEndpoint, CloudTls, QuicCloudClient};
use hasten_edge_node::has::{CacheChannel, DocumentStore, FuzzyChannel, ValidationRules};
use hasten_edge_node::retrieval::{EngineSettings, RetrievalEngine};
use hasten_edge_node::tenants::{Tenant, TenantDirectory};
use hasten_edge_node::warmup::{read_warm_queries, warm_cache};
use hasten_proto::quic::{ClientTlsFiles, reloading_client_config};
use hasten_proto::tls::MutualTls;

/// Training rows for the cache channel's centroids: the whole bundle up to this many rows
/// (k-means cost grows with it; 100k rows give every list of a 50k-document cache hundreds
/// of points).
const CACHE_TRAINING_ROWS: usize = 100_000;

/// The cache channel, trained on a sample of the whole corpus: cached results hold
/// documents from anywhere in it, also outside the edge's share.
fn cache_channel(bundle_dir: &Path, dimension: usize, config: &EdgeConfig) -> Result<CacheChannel> {
    let sample = CorpusBundle::vector_sample(bundle_dir, CACHE_TRAINING_ROWS)
        .with_context(|| format!("sampling the bundle {}", bundle_dir.display()))?;
    let channel = CacheChannel::train(
        dimension,
        &sample,
        config.retrieval.cache_nlist,
        config.retrieval.cache_nprobe,
    )?;
    let shape = channel.shape();
    tracing::info!(
        nlist = shape.nlist,
        nprobe = shape.nprobe,
        "cache channel trained"
    );
    Ok(channel)
}

/// The QUIC client's TLS toward the cloud, made again from its files when they change (a
/// renewed certificate, a rotated CA; reloads reported on `expiry` and in
/// `hasten_tls_reloads_total`): mutual TLS through the deployment's CA, or trust in
/// `cloud.ca` alone.
fn cloud_tls(
    config: &EdgeConfig,
    mutual: Option<&MutualTls>,
    registry: &Registry,
    expiry: IntGaugeVec,
) -> Result<CloudTls> {
    let (files, series, shown) = match mutual {
        Some(mutual) => {
            let paths = mutual.paths();
            let files = ClientTlsFiles {
                trust: std::iter::once(paths.ca.clone())
                    .chain(paths.extra_ca.clone())
                    .collect(),
                identity: Some((paths.cert.clone(), paths.key.clone())),
            };
            (files, "certificate", &paths.cert)
        }
        None => {
            tracing::warn!(
                "mutual TLS is off (no `tls_ca`): the edge shows no certificate, and control-plane gRPC is plaintext"
            );
            let files = ClientTlsFiles {
                trust: vec![config.cloud.ca.clone()],
                identity: None,
            };
            (files, "cloud_ca", &config.cloud.ca)
        }
    };
    let report = tls_reload_reporter(registry, expiry, series, shown.display().to_string())?;
    let reloading = reloading_client_config(files, move |outcome| report(outcome.result()))
        .context("loading the cloud link's TLS files")?;
    Ok(CloudTls::Reloading(Arc::new(reloading)))
}

pub(super) fn build_engine(
    config: &EdgeConfig,
    bundle_dir: &Path,
    bundle: &CorpusBundle,
    tenants: &TenantDirectory,
    mutual: Option<&MutualTls>,
    metrics: (&Registry, IntGaugeVec),
) -> Result<RetrievalEngine<QuicCloudClient>> {
    let tls = cloud_tls(config, mutual, metrics.0, metrics.1)?;
    let corpus_version = bundle.manifest.corpus_version.clone();
    let cloud = QuicCloudClient::new(
        tls,
        CloudEndpoint {
            addr: config.cloud.addr.clone(),
            server_name: config.cloud.server_name.clone(),
            timeout: Duration::from_millis(config.cloud.timeout_ms),
            corpus_version: corpus_version.clone(),
        },
    )
    .context("opening the QUIC client endpoint")?;
    let documents = Arc::new(DocumentStore::from_bundle(bundle));
    let fuzzy = if config.retrieval.policy.drafts() && config.retrieval.fuzzy_channel {
        let started = Instant::now();
        let fuzzy = FuzzyChannel::build(
            &documents,
            config.retrieval.corpus_fraction,
            config.retrieval.fuzzy_nlist,
            config.retrieval.fuzzy_nprobe,
        )
        .context("building the fuzzy channel")?;
        tracing::info!(
            documents = fuzzy.len(),
            index = fuzzy.index().description(),
            nprobe = fuzzy.index().shape().nprobe,
            seconds = format!("{:.1}", started.elapsed().as_secs_f64()),
            "fuzzy channel built"
        );
        Some(fuzzy)
    } else {
        None
    };
    // With a control plane, evictions come only from its log: one FIFO decider for the
    // one replicated cache.
    let eviction = if config.control_plane.nodes.is_empty() {
        Eviction::Fifo(config.retrieval.cache_capacity)
    } else {
        Eviction::FromLog
    };
    let caches = TenantCaches::new(
        config
            .retrieval
            .policy
            .lookup(config.retrieval.hybrid_similarity.is_some()),
        tenants.tenants(),
        eviction,
        &cache_channel(bundle_dir, bundle.dimension(), config)?,
        documents,
        corpus_version,
        config.retrieval.validation_depth,
    )?;
    Ok(RetrievalEngine::new(
        EngineSettings {
            policy: config.retrieval.policy,
            tau: config.retrieval.tau,
            fuzzy_candidates: config.retrieval.fuzzy_candidates,
            cache_candidates: config.retrieval.cache_candidates,
            semantic_threshold: config.retrieval.semantic_threshold,
            fuzzy_in_validation: config.retrieval.fuzzy_in_validation,
            fuzzy_in_draft: config.retrieval.fuzzy_in_draft,
            validation: ValidationRules {
                weighting: config.retrieval.vote_weighting,
                require_matched_top: config.retrieval.require_matched_top,
            },
            draft_with_matched: config.retrieval.draft_with_matched,
            hybrid_similarity: config.retrieval.hybrid_similarity,
        },
        Arc::new(caches),
        fuzzy,
        cloud,
    )?)
}

/// Connects to the cloud until its corpus version is verified once, so that readiness
/// follows the link before the first fallback.
pub(super) async fn verify_cloud_link(engine: Arc<RetrievalEngine<QuicCloudClient>>) {
    let mut waits = RetryDelays::new(Duration::from_millis(200), Duration::from_secs(5));
    loop {
        match engine.cloud().verify_link().await {
            Ok(()) => return,
            Err(err) => {
                tracing::debug!(error = %err.display_full(), "cloud index not verified yet; retrying")
            }
        }
        tokio::time::sleep(waits.next_delay()).await;
    }
}

/// Fills the shared cache from `retrieval.warm_queries` once the cloud answers; the edge serves only
/// after, so that its first requests meet the warmed cache.
pub(super) async fn warm_before_serving(
    engine: &Arc<RetrievalEngine<QuicCloudClient>>,
    encoder: &TextEncoder,
    path: &Path,
) -> Result<()> {
    let questions = read_warm_queries(path).context("configuration: `retrieval.warm_queries`")?;
    let started = Instant::now();
    let texts: Vec<&str> = questions.iter().map(String::as_str).collect();
    let vectors = encoder
        .encode(&texts)
        .context("encoding the warm queries")?;
    tracing::info!(
        questions = questions.len(),
        "waiting for the cloud to warm the cache"
    );
    verify_cloud_link(Arc::clone(engine)).await;
    let report = warm_cache(engine, &Tenant::default_tenant(), questions, vectors).await?;
    tracing::info!(
        cached = report.cached,
        failed = report.failed,
        seconds = format!("{:.1}", started.elapsed().as_secs_f64()),
        "cache warmed"
    );
    Ok(())
}
