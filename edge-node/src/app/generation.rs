//! What answers are generated with: KV workers, an engine the team already runs, a
//! generation worker, or models loaded here.

use display_full_error::DisplayFullErrorExt;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use backon::{ExponentialBuilder, Retryable};
use hasten_core::bundle::read_manifest;
use hasten_edge_node::config::EdgeConfig;
use hasten_edge_node::service::answer::IterativeModel;
use hasten_engine::{ApiKey, EngineLm};
use hasten_proto::grpc_client_tls::GrpcClientTls;
use hasten_proto::tls::MutualTls;
use hasten_rag::{LmBackend, LocalLm};
use hasten_worker_api::RemoteLm;
use hasten_worker_api::kv::{FusionSettings, KvPool};

/// Reaches the engine, retrying with jittered backoff until it answers (it may come up after
/// the edge): says whether it serves `model`, and finds how it scores drafts, which decides
/// whether speculative mode is served. Standard answers do not wait for this.
async fn reach_engine(engine: Arc<EngineLm>, model: String) {
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(500))
        .with_max_delay(Duration::from_secs(30))
        .with_jitter()
        .without_max_times();
    let reached = (|| async { Ok::<_, hasten_engine::EngineError>((engine.probe().await?, engine.detect_scoring().await?)) })
        .retry(backoff)
        .notify(|error, after| {
            tracing::warn!(engine = engine.url(), error = %error.display_full(), retry_in = ?after, "generation engine not reachable yet")
        })
        .await;
    if let Ok((models, scoring)) = reached {
        if !models.contains(&model) {
            tracing::warn!(
                engine = engine.url(),
                %model,
                ?models,
                "the generation engine does not list `engine.model` (some engines answer for \
                 any name)"
            );
        }
        tracing::info!(engine = engine.url(), %model, speculative_scoring = %scoring, "generation engine reached");
    }
}

/// The engine's API key: given in the configuration, or read from `engine.api_key_file`.
fn engine_api_key(config: &EdgeConfig) -> Result<Option<ApiKey>> {
    if let Some(path) = &config.engine.api_key_file {
        let key = std::fs::read_to_string(path).with_context(|| {
            format!(
                "configuration: `engine.api_key_file`: reading {}",
                path.display()
            )
        })?;
        return Ok(Some(ApiKey::new(key.trim())));
    }
    Ok(config.engine.api_key.clone())
}

/// The `/v1/answer` backend; the KV workers' pool when that is the backend (it follows the
/// pool's assignment with `kv.pool`); what `/v1/ralm` and `/v1/spechop` step (the model
/// loaded here, or the engine).
pub(super) struct Backends {
    pub answers: Option<Arc<dyn LmBackend>>,
    pub kv_pool: Option<Arc<KvPool>>,
    pub iterative: Option<IterativeModel>,
}

pub(super) fn language_backend(
    config: &EdgeConfig,
    mutual: Option<&MutualTls>,
) -> Result<Backends> {
    // The workers' TLS, read again when its files change.
    let grpc_tls = || {
        mutual
            .map(|mutual| GrpcClientTls::load(mutual.paths()))
            .transpose()
            .context("loading the mutual-TLS files for the generation workers")
    };
    if !config.kv.workers.is_empty() {
        let bundle_dir = config.bundle.clone().unwrap_or_default();
        let corpus_version = read_manifest(&bundle_dir)
            .with_context(|| format!("reading the bundle manifest in {}", bundle_dir.display()))?
            .corpus_version;
        let pool = KvPool::connect_lazy(
            &config.kv.workers,
            grpc_tls()?,
            corpus_version,
            FusionSettings {
                mode: config.kv.mode,
                ratio: config.kv.recompute_ratio,
            },
            config.kv.variant,
            config.kv.routing,
        )
        .context("configuration: `kv.workers`")?;
        tracing::info!(backend = ?pool, "answering with KV workers");
        let pool = Arc::new(pool);
        return Ok(Backends {
            answers: Some(Arc::clone(&pool) as Arc<dyn LmBackend>),
            kv_pool: Some(pool),
            iterative: None,
        });
    }
    if let Some(url) = &config.engine.url {
        let engine = EngineLm::new(hasten_engine::EngineSettings {
            url: url.clone(),
            model: config.engine.model.clone().unwrap_or_default(),
            drafter_url: config.engine.drafter_url.clone(),
            drafter_model: config.engine.drafter_model.clone(),
            api_key: engine_api_key(config)?,
            timeout: Duration::from_millis(config.engine.timeout_ms),
            ca_file: config.engine.ca.clone(),
        })
        .context("configuration: `engine.url`")?;
        let engine = Arc::new(engine);
        tokio::spawn(reach_engine(
            Arc::clone(&engine),
            config.engine.model.clone().unwrap_or_default(),
        ));
        return Ok(Backends {
            answers: Some(Arc::clone(&engine) as Arc<dyn LmBackend>),
            kv_pool: None,
            iterative: Some(IterativeModel::Engine(engine)),
        });
    }
    if let Some(worker) = &config.answer.worker {
        let remote = RemoteLm::connect_lazy(worker, grpc_tls()?)
            .context("configuration: `answer.worker`")?;
        let remote = Arc::new(remote);
        // The worker may start after the edge: it is found on first use; this only logs.
        let probe = Arc::clone(&remote);
        tokio::spawn(async move {
            match probe.probe().await {
                Ok(info) => tracing::info!(
                    endpoint = probe.endpoint(),
                    verifier = %info.verifier,
                    drafter = %info.drafter,
                    device = %info.device,
                    "generation worker reached"
                ),
                Err(error) => {
                    tracing::warn!(error = %error.display_full(), "generation worker not reachable yet")
                }
            }
        });
        return Ok(Backends {
            answers: Some(remote),
            kv_pool: None,
            iterative: None,
        });
    }
    let Some(model) = &config.answer.model else {
        tracing::info!(
            "no `answer.model`, `answer.worker`, `kv.workers` nor `engine.url`: /v1/answer answers 503"
        );
        return Ok(Backends {
            answers: None,
            kv_pool: None,
            iterative: None,
        });
    };
    let drafter = config.answer.drafter.as_ref().unwrap_or(model);
    let started = std::time::Instant::now();
    let backend = LocalLm::load_with(drafter, model, config.answer.device, config.answer.weights)
        .context("loading the language models (`answer.model`, `answer.drafter`)")?;
    tracing::info!(
        model = %model.display(),
        drafter = %drafter.display(),
        device = %config.answer.device,
        weights = %config.answer.weights,
        took_ms = started.elapsed().as_millis() as u64,
        "language models loaded"
    );
    let iterative = Some(IterativeModel::Local(Arc::clone(backend.verifier())));
    Ok(Backends {
        answers: Some(Arc::new(backend)),
        kv_pool: None,
        iterative,
    })
}
