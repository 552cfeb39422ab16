//! `edge-node`: serve HaS retrieval at the edge.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use backon::{ExponentialBuilder, Retryable};
use clap::{Args, Parser, Subcommand};
use edge_node::answer::metrics::AnswerMetrics;
use edge_node::answer::{AnswerLimits, AnswerService, IterativeModel};
use edge_node::api::ReplyOptions;
use edge_node::api::RequestLimits;
use edge_node::caches::{Eviction, TenantCaches};
use edge_node::config::EdgeConfig;
use edge_node::document_fetch::fetch_missing_documents;
use edge_node::fallback::quic::{CloudEndpoint, QuicCloudClient};
use edge_node::grpc::EdgeGrpc;
use edge_node::has::{CacheChannel, DocumentStore, FuzzyChannel, in_edge_share};
use edge_node::http::BodyLimits;
use edge_node::http_server::{self, HttpServerLimits};
use edge_node::metrics::EdgeMetrics;
use edge_node::pipeline::EdgeService;
use edge_node::replication::{ControlPlaneLink, CorpusIdentity};
use edge_node::retrieval::{EngineSettings, RetrievalEngine, RetrievalPolicy};
use edge_node::tenants::{Tenant, TenantDirectory};
use edge_node::warmup::{read_warm_queries, warm_cache};
use hasten_core::bundle::{CorpusBundle, read_manifest};
use hasten_core::config::{ConfigSource, TlsArgs, load_config};
use hasten_core::encoder::TextEncoder;
use hasten_core::lifecycle::{shutdown_signal, write_atomically};
use hasten_engine::{ApiKey, EngineLm};
use hasten_proto::auth::AccessToken;
use hasten_proto::control::ControlAccess;
use hasten_proto::quic::client_config;
use hasten_proto::tls::{MutualTls, TrustRoots};
use hasten_proto::v1::edge_server::EdgeServer;
use hasten_rag::{LmBackend, LocalLm, SpeculativeSettings};
use hasten_worker_api::RemoteLm;
use hasten_worker_api::kv::FusionMode;
use hasten_worker_api::kv::FusionSettings;
use hasten_worker_api::kv::KvPool;
use hasten_worker_api::kv::KvRouting;
use hasten_worker_api::kv::Variant;
use serde::Serialize;

#[derive(Parser)]
#[command(
    name = "edge-node",
    version,
    about = "Hasten edge: homology-aware speculative retrieval"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve retrieval over HTTP/JSON and gRPC.
    Serve(ServeArgs),
}

#[derive(Args, Serialize)]
struct ServeArgs {
    #[command(flatten)]
    #[serde(skip)]
    source: ConfigSource,
    /// Corpus bundle directory (the one the cloud serves).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    bundle: Option<PathBuf>,
    /// all-MiniLM-L6-v2 directory, shared by every binary through HASTEN_MODEL_DIR
    /// [default: models/all-MiniLM-L6-v2].
    #[arg(long, env = "HASTEN_MODEL_DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    model_dir: Option<PathBuf>,
    /// JSON API address [default: 127.0.0.1:7200].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    http_addr: Option<SocketAddr>,
    /// gRPC API address [default: 127.0.0.1:7201].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    grpc_addr: Option<SocketAddr>,
    /// Address of /v1/status, /metrics, /readyz, /healthz [default: the HTTP API's];
    /// required with --tenants-file.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    metrics_addr: Option<SocketAddr>,
    /// HTTP connections open at once [default: 4096].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    max_connections: Option<usize>,
    /// Milliseconds to send a request's head, or to start the next one [default: 10000].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    header_timeout_ms: Option<u64>,
    /// Milliseconds for a request's body to arrive [default: 10000].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    body_timeout_ms: Option<u64>,
    /// Milliseconds requests may take to finish after SIGTERM [default: 10000].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    shutdown_grace_ms: Option<u64>,
    /// Cloud index QUIC address [default: 127.0.0.1:7100].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    cloud_addr: Option<SocketAddr>,
    /// TLS name of the cloud [default: localhost].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    cloud_server_name: Option<String>,
    /// PEM certificate(s) to trust for the cloud [default: run/cloud-dev-cert.pem].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    cloud_ca: Option<PathBuf>,
    #[command(flatten)]
    #[serde(flatten)]
    tls: TlsArgs,
    /// Cloud request deadline in milliseconds [default: 2000].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    cloud_timeout_ms: Option<u64>,
    /// has | cloud-only | edge-ivf | exact-cache | semantic-cache [default: has].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    policy: Option<RetrievalPolicy>,
    /// Cosine similarity at which semantic-cache reuses a result [default: 0.9].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    semantic_threshold: Option<f32>,
    /// Default k [default: 10].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    k: Option<usize>,
    /// Homology threshold tau [default: 0.2].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    tau: Option<f64>,
    /// Draft documents validated and fallback documents cached, whatever k [default: 10].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    validation_depth: Option<usize>,
    /// Cached queries per tenant, FIFO, without a control plane [default: 5000].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_capacity: Option<usize>,
    /// Fuzzy-channel candidates re-ranked exactly [default: 50].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    fuzzy_candidates: Option<usize>,
    /// Cache-channel candidates re-ranked exactly [default: 50].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_candidates: Option<usize>,
    /// Run the fuzzy channel [default: true].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    fuzzy_channel: Option<bool>,
    /// Fuzzy-channel documents take part in validation [default: true].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    fuzzy_in_validation: Option<bool>,
    /// Fuzzy-channel documents join served drafts [default: true].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    fuzzy_in_draft: Option<bool>,
    /// Questions (one per line) fetched from the cloud and cached before serving.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    warm_queries: Option<PathBuf>,
    /// Share of the corpus this edge holds (fuzzy channel and documents), (0, 1] [default: 1.0].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    corpus_fraction: Option<f64>,
    /// Fuzzy-channel IVF lists [default: 4 x sqrt(n)].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    fuzzy_nlist: Option<usize>,
    /// Fuzzy-channel probes [default: nlist x 64 / 8192, at least ~8,192 codes].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    fuzzy_nprobe: Option<usize>,
    /// Cache-channel IVF lists [default: 4 x sqrt(n)].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_nlist: Option<usize>,
    /// Cache-channel probes [default: nlist / 16].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_nprobe: Option<usize>,
    /// A control-plane node's gRPC address (repeat for each); replicates the cache.
    #[arg(long = "control-plane", value_name = "HOST:PORT")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    control_plane: Vec<String>,
    /// File holding the control plane's shared token, for a control plane without mutual TLS.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    control_plane_token_file: Option<PathBuf>,
    /// Requests answered at once; beyond it 429 / RESOURCE_EXHAUSTED [default: 512].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    max_in_flight: Option<usize>,
    /// TOML file of tenants and their bearer tokens; without it the API is open.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    tenants_file: Option<PathBuf>,
    /// Show the matched cached query's text in replies (another user's question)
    /// [default: false].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    expose_matched_query_text: Option<bool>,
    /// This edge's name in replicated entries [default: edge].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    edge_id: Option<String>,
    /// Write the bound addresses as JSON to this file once serving.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    ready_file: Option<PathBuf>,
    /// GGUF model that answers /v1/answer (and verifies speculative drafts).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    lm_model: Option<PathBuf>,
    /// Small GGUF model that writes Speculative RAG's drafts [default: lm_model].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    lm_drafter: Option<PathBuf>,
    /// host:port of a generation worker (lm-worker) to answer with instead of lm_model.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    lm_worker: Option<String>,
    /// A FusionRAG KV worker's gRPC address (repeat for each) to answer with instead of
    /// lm_model: retrieved documents go to it as chunk ids.
    #[arg(long = "kv-worker", value_name = "HOST:PORT")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    kv_workers: Vec<String>,
    /// namespace/name of the KvWorkerPool whose assignment (through the control plane) the
    /// KV workers follow.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    kv_pool: Option<String>,
    /// fusionrag, cacheblend, full-reuse or full-prefill [default: fusionrag].
    #[arg(long, value_parser = parse_fusion_mode)]
    #[serde(skip_serializing_if = "Option::is_none")]
    kv_mode: Option<FusionMode>,
    /// Share of chunk tokens the KV worker recomputes [default: 0.15].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    kv_recompute_ratio: Option<f64>,
    /// similarity or full-reuse: which stored chunk KV the workers read [default: similarity].
    #[arg(long, value_parser = parse_variant)]
    #[serde(skip_serializing_if = "Option::is_none")]
    kv_variant: Option<Variant>,
    /// kv-aware or round-robin: which KV worker a request goes to [default: kv-aware].
    #[arg(long, value_parser = parse_routing)]
    #[serde(skip_serializing_if = "Option::is_none")]
    kv_routing: Option<KvRouting>,
    /// Base URL of an OpenAI-compatible engine to generate on (http://vllm:8000/v1).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    lm_engine_url: Option<String>,
    /// The model the engine serves, as its /v1/models names it.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    lm_engine_model: Option<String>,
    /// Engine that writes Speculative RAG's drafts (a smaller model) [default: lm_engine_url].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    lm_engine_drafter_url: Option<String>,
    /// The drafter engine's model [default: lm_engine_model].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    lm_engine_drafter_model: Option<String>,
    /// File holding the engine's API key (or set HASTEN_EDGE_LM_ENGINE_API_KEY).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    lm_engine_api_key_file: Option<PathBuf>,
    /// PEM file of the CA that signed an https engine's certificate.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    lm_engine_ca: Option<PathBuf>,
    /// Longest wait for the engine's next bytes, in ms [default: 30000].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    lm_engine_timeout_ms: Option<u64>,
    /// Answers sent to the engine at once [default: 8].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    lm_engine_concurrency: Option<usize>,
    /// cpu, or cuda in a build with the `cuda` feature [default: cpu].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    lm_device: Option<hasten_lm::DeviceKind>,
    /// fast, q8_0, f32 or as_stored [default: fast].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    lm_weights: Option<hasten_lm::WeightFormat>,
}

#[tokio::main]
async fn main() -> Result<()> {
    hasten_core::logging::init();
    match Cli::parse().command {
        Command::Serve(args) => serve(args).await,
    }
}

/// Training rows for the cache channel's centroids: the whole bundle up to this many rows
/// (k-means cost grows with it; 100k rows give every list of a 50k-document cache hundreds
/// of points).
const CACHE_TRAINING_ROWS: usize = 100_000;

/// The cache channel, trained on a sample of the whole corpus: cached results hold
/// documents from anywhere in it, also outside the edge's share.
fn cache_channel(
    bundle_dir: &std::path::Path,
    dimension: usize,
    config: &EdgeConfig,
) -> Result<CacheChannel> {
    let sample = CorpusBundle::vector_sample(bundle_dir, CACHE_TRAINING_ROWS)
        .with_context(|| format!("sampling the bundle {}", bundle_dir.display()))?;
    let channel = CacheChannel::train(dimension, &sample, config.cache_nlist, config.cache_nprobe)?;
    let shape = channel.shape();
    tracing::info!(
        nlist = shape.nlist,
        nprobe = shape.nprobe,
        "cache channel trained"
    );
    Ok(channel)
}

/// The QUIC client configuration toward the cloud: mutual TLS through the deployment's CA,
/// or trust in `cloud_ca` alone.
fn cloud_tls(config: &EdgeConfig, mutual: Option<&MutualTls>) -> Result<quinn::ClientConfig> {
    if let Some(mutual) = mutual {
        return Ok(client_config(
            mutual.trust(),
            Some(mutual.identity().clone()),
        )?);
    }
    tracing::warn!(
        "mutual TLS is off (no `tls_ca`): the edge shows no certificate, and control-plane gRPC is plaintext"
    );
    let trust = TrustRoots::from_pem_file(&config.cloud_ca).with_context(|| {
        format!(
            "loading the cloud CA {} (a dev cloud writes its certificate to run/cloud-dev-cert.pem)",
            config.cloud_ca.display()
        )
    })?;
    Ok(client_config(&trust, None)?)
}

fn build_engine(
    config: &EdgeConfig,
    bundle_dir: &std::path::Path,
    bundle: &CorpusBundle,
    tenants: &TenantDirectory,
    mutual: Option<&MutualTls>,
) -> Result<RetrievalEngine<QuicCloudClient>> {
    let client_config = cloud_tls(config, mutual)?;
    let corpus_version = bundle.manifest.corpus_version.clone();
    let cloud = QuicCloudClient::new(
        client_config,
        CloudEndpoint {
            addr: config.cloud_addr,
            server_name: config.cloud_server_name.clone(),
            timeout: Duration::from_millis(config.cloud_timeout_ms),
            corpus_version: corpus_version.clone(),
        },
    )
    .context("opening the QUIC client endpoint")?;
    let documents = Arc::new(DocumentStore::from_bundle(bundle));
    let fuzzy = if config.policy.drafts() && config.fuzzy_channel {
        let started = Instant::now();
        let fuzzy = FuzzyChannel::build(
            &documents,
            config.corpus_fraction,
            config.fuzzy_nlist,
            config.fuzzy_nprobe,
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
    let eviction = if config.control_plane.is_empty() {
        Eviction::Fifo(config.cache_capacity)
    } else {
        Eviction::FromLog
    };
    let caches = TenantCaches::new(
        config.policy.lookup(),
        tenants.tenants(),
        eviction,
        &cache_channel(bundle_dir, bundle.dimension(), config)?,
        documents,
        corpus_version,
        config.validation_depth,
    )?;
    Ok(RetrievalEngine::new(
        EngineSettings {
            policy: config.policy,
            tau: config.tau,
            fuzzy_candidates: config.fuzzy_candidates,
            cache_candidates: config.cache_candidates,
            semantic_threshold: config.semantic_threshold,
            fuzzy_in_validation: config.fuzzy_in_validation,
            fuzzy_in_draft: config.fuzzy_in_draft,
        },
        Arc::new(caches),
        fuzzy,
        cloud,
    )?)
}

/// Connects to the cloud until its corpus version is verified once, so that readiness
/// follows the link before the first fallback.
async fn verify_cloud_link(engine: Arc<RetrievalEngine<QuicCloudClient>>) {
    let mut wait = Duration::from_millis(200);
    loop {
        match engine.cloud().verify_link().await {
            Ok(()) => return,
            Err(err) => tracing::debug!(%err, "cloud index not verified yet; retrying"),
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(5));
    }
}

/// Fills the shared cache from `warm_queries` once the cloud answers; the edge serves only
/// after, so that its first requests meet the warmed cache.
async fn warm_before_serving(
    engine: &Arc<RetrievalEngine<QuicCloudClient>>,
    encoder: &TextEncoder,
    path: &std::path::Path,
) -> Result<()> {
    let questions = read_warm_queries(path).context("configuration: `warm_queries`")?;
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

/// The `/v1/answer` backend, when configured: a generation worker, or models loaded here.
fn parse_fusion_mode(value: &str) -> Result<FusionMode, String> {
    serde_json::from_value(serde_json::Value::String(value.into())).map_err(|_| {
        format!("`{value}`: expected fusionrag, cacheblend, full-reuse or full-prefill")
    })
}

fn parse_routing(value: &str) -> Result<KvRouting, String> {
    serde_json::from_value(serde_json::Value::String(value.into()))
        .map_err(|_| format!("`{value}`: expected kv-aware or round-robin"))
}

fn parse_variant(value: &str) -> Result<Variant, String> {
    serde_json::from_value(serde_json::Value::String(value.into()))
        .map_err(|_| format!("`{value}`: expected similarity or full-reuse"))
}

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
            tracing::warn!(engine = engine.url(), %error, retry_in = ?after, "generation engine not reachable yet")
        })
        .await;
    if let Ok((models, scoring)) = reached {
        if !models.contains(&model) {
            tracing::warn!(
                engine = engine.url(),
                %model,
                ?models,
                "the generation engine does not list `lm_engine_model` (some engines answer for \
                 any name)"
            );
        }
        tracing::info!(engine = engine.url(), %model, speculative_scoring = %scoring, "generation engine reached");
    }
}

/// The engine's API key: given in the configuration, or read from `lm_engine_api_key_file`.
fn engine_api_key(config: &EdgeConfig) -> Result<Option<ApiKey>> {
    if let Some(path) = &config.lm_engine_api_key_file {
        let key = std::fs::read_to_string(path).with_context(|| {
            format!(
                "configuration: `lm_engine_api_key_file`: reading {}",
                path.display()
            )
        })?;
        return Ok(Some(ApiKey::new(key.trim())));
    }
    Ok(config.lm_engine_api_key.clone())
}

/// The `/v1/answer` backend; the KV workers' pool when that is the backend (it follows the
/// pool's assignment with `kv_pool`); what `/v1/ralm` and `/v1/spechop` step (the model
/// loaded here, or the engine).
struct Backends {
    answers: Option<Arc<dyn LmBackend>>,
    kv_pool: Option<Arc<KvPool>>,
    iterative: Option<IterativeModel>,
}

fn language_backend(config: &EdgeConfig, mutual: Option<&MutualTls>) -> Result<Backends> {
    if !config.kv_workers.is_empty() {
        let bundle_dir = config.bundle.clone().unwrap_or_default();
        let corpus_version = read_manifest(&bundle_dir)
            .with_context(|| format!("reading the bundle manifest in {}", bundle_dir.display()))?
            .corpus_version;
        let pool = KvPool::connect_lazy(
            &config.kv_workers,
            mutual.map(MutualTls::grpc_client),
            corpus_version,
            FusionSettings {
                mode: config.kv_mode,
                ratio: config.kv_recompute_ratio,
            },
            config.kv_variant,
            config.kv_routing,
        )
        .context("configuration: `kv_workers`")?;
        tracing::info!(backend = ?pool, "answering with KV workers");
        let pool = Arc::new(pool);
        return Ok(Backends {
            answers: Some(Arc::clone(&pool) as Arc<dyn LmBackend>),
            kv_pool: Some(pool),
            iterative: None,
        });
    }
    if let Some(url) = &config.lm_engine_url {
        let engine = EngineLm::new(hasten_engine::EngineSettings {
            url: url.clone(),
            model: config.lm_engine_model.clone().unwrap_or_default(),
            drafter_url: config.lm_engine_drafter_url.clone(),
            drafter_model: config.lm_engine_drafter_model.clone(),
            api_key: engine_api_key(config)?,
            timeout: Duration::from_millis(config.lm_engine_timeout_ms),
            ca_file: config.lm_engine_ca.clone(),
        })
        .context("configuration: `lm_engine_url`")?;
        let engine = Arc::new(engine);
        tokio::spawn(reach_engine(
            Arc::clone(&engine),
            config.lm_engine_model.clone().unwrap_or_default(),
        ));
        return Ok(Backends {
            answers: Some(Arc::clone(&engine) as Arc<dyn LmBackend>),
            kv_pool: None,
            iterative: Some(IterativeModel::Engine(engine)),
        });
    }
    if let Some(worker) = &config.lm_worker {
        let remote = RemoteLm::connect_lazy(worker, mutual.map(MutualTls::grpc_client))
            .context("configuration: `lm_worker`")?;
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
                Err(error) => tracing::warn!(%error, "generation worker not reachable yet"),
            }
        });
        return Ok(Backends {
            answers: Some(remote),
            kv_pool: None,
            iterative: None,
        });
    }
    let Some(model) = &config.lm_model else {
        tracing::info!(
            "no `lm_model`, `lm_worker`, `kv_workers` nor `lm_engine_url`: /v1/answer answers 503"
        );
        return Ok(Backends {
            answers: None,
            kv_pool: None,
            iterative: None,
        });
    };
    let drafter = config.lm_drafter.as_ref().unwrap_or(model);
    let started = std::time::Instant::now();
    let backend = LocalLm::load_with(drafter, model, config.lm_device, config.lm_weights)
        .context("loading the language models (`lm_model`, `lm_drafter`)")?;
    tracing::info!(
        model = %model.display(),
        drafter = %drafter.display(),
        device = %config.lm_device,
        weights = %config.lm_weights,
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

async fn serve(args: ServeArgs) -> Result<()> {
    let config: EdgeConfig = load_config(args.source.config.as_deref(), "HASTEN_EDGE_", &args)?;
    // Validated before printing: `--print-config` answers whether a configuration works.
    config.validate()?;
    if args.source.print_config {
        println!("{}", serde_json::to_string_pretty(&config)?);
        return Ok(());
    }
    // Secrets first: a bad file fails the start before the bundle and encoder load.
    let control_token = config
        .control_plane_token_file
        .as_deref()
        .map(AccessToken::load)
        .transpose()?;
    let tenants = match &config.tenants_file {
        Some(path) => TenantDirectory::load(path)?,
        None => {
            tracing::warn!("no tenants file: the API is open and every request shares one cache");
            TenantDirectory::open()
        }
    };
    tracing::info!(tenants = tenants.tenants().len(), "tenants loaded");
    let mutual = config
        .mutual_tls()?
        .map(|paths| MutualTls::load(&paths))
        .transpose()
        .context("loading the mutual-TLS files")?;
    // The language models load before the bundle: a bad file stops the start at once, naming
    // the file and why.
    let Backends {
        answers: backend,
        kv_pool,
        iterative,
    } = language_backend(&config, mutual.as_ref())?;
    let bundle_dir = config.bundle.clone().unwrap_or_default();
    // With a fraction, only the edge's share stays in memory; the rest comes from the cloud.
    let fraction = config.corpus_fraction;
    let bundle = CorpusBundle::load_share(&bundle_dir, |id| in_edge_share(id, fraction))
        .with_context(|| format!("loading the bundle {}", bundle_dir.display()))?;
    tracing::info!(
        documents = bundle.len(),
        corpus_documents = bundle.manifest.documents,
        corpus_fraction = fraction,
        "bundle loaded"
    );
    let encoder = TextEncoder::load(&config.model_dir)
        .with_context(|| format!("loading the encoder from {}", config.model_dir.display()))?;
    if encoder.dimension() != bundle.dimension() {
        anyhow::bail!(
            "the encoder makes {}-d vectors but the bundle holds {}-d vectors",
            encoder.dimension(),
            bundle.dimension()
        );
    }
    let mut engine = build_engine(&config, &bundle_dir, &bundle, &tenants, mutual.as_ref())?;
    let link = (!config.control_plane.is_empty()).then(|| {
        let corpus = CorpusIdentity {
            version: bundle.manifest.corpus_version.clone(),
            dimension: bundle.dimension(),
            max_document_id: bundle.max_document_id(),
        };
        ControlPlaneLink::start(
            &config.edge_id,
            corpus,
            config.control_plane.clone(),
            ControlAccess {
                tls: mutual.clone(),
                token: control_token,
            },
        )
    });
    if let Some(link) = &link {
        engine = engine.with_replication(link.clone());
    }
    let limits = RequestLimits {
        default_k: config.k,
        max_k: config.max_k,
        max_query_chars: config.max_query_chars,
        dimension: bundle.dimension(),
    };
    drop(bundle);
    let engine = Arc::new(engine);
    match &config.warm_queries {
        // Warming verifies the link before it asks the cloud.
        Some(path) => warm_before_serving(&engine, &encoder, path).await?,
        None => {
            tokio::spawn(verify_cloud_link(Arc::clone(&engine)));
        }
    }
    // Only an edge holding a share meets cached documents it lacks.
    if fraction < 1.0 {
        let fetcher = Arc::clone(&engine);
        tokio::spawn(
            async move { fetch_missing_documents(fetcher.caches(), fetcher.cloud()).await },
        );
    }
    let registry = hasten_core::metrics::registry()?;
    let metrics = Arc::new(EdgeMetrics::register(&registry)?);
    let certificates = match &mutual {
        Some(mutual) => mutual.expiries()?,
        // Without mutual TLS the edge trusts the cloud through `cloud_ca` alone.
        None => vec![(
            "cloud_ca",
            TrustRoots::from_pem_file(&config.cloud_ca)?.expires_at(),
        )],
    };
    hasten_core::metrics::register_certificate_expiry(&registry, &certificates)?;
    let service = EdgeService::new(
        Arc::new(encoder),
        Arc::clone(&engine),
        limits,
        ReplyOptions {
            matched_query_text: config.expose_matched_query_text,
        },
        Arc::clone(&metrics),
        config.max_in_flight,
        Arc::new(tenants),
        link.as_ref().map(|link| link.status()),
    );
    if let Some(link) = &link {
        let kv_follow = config.kv_pool.clone().zip(kv_pool);
        if let Some((name, _)) = &kv_follow {
            tracing::info!(pool = %name, "KV workers follow the pool's assignment");
        }
        link.follow(engine, kv_follow);
        tracing::info!(control_plane = ?config.control_plane, "hot cache replicated through the control plane; evictions follow its log");
    }

    let bind = |addr: SocketAddr, what: &'static str| async move {
        tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {what} on {addr}"))
    };
    let http_listener = bind(config.http_addr, "HTTP").await?;
    let http_addr = http_listener.local_addr()?;
    let grpc_listener = bind(config.grpc_addr, "gRPC").await?;
    let grpc_addr = grpc_listener.local_addr()?;
    let admin_listener = match config.metrics_addr {
        Some(addr) => Some(bind(addr, "the admin routes").await?),
        None => None,
    };
    let metrics_addr = admin_listener
        .as_ref()
        .map(tokio::net::TcpListener::local_addr)
        .transpose()?;

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let limits = HttpServerLimits {
        max_connections: config.max_connections,
        header_timeout: Duration::from_millis(config.header_timeout_ms),
        shutdown_grace: Duration::from_millis(config.shutdown_grace_ms),
    };
    let api = edge_node::http::api_routes(
        service.clone(),
        BodyLimits {
            max_bytes: config.max_body_bytes,
            timeout: Duration::from_millis(config.body_timeout_ms),
        },
    );
    let answers = AnswerService::new(
        service.clone(),
        backend,
        iterative,
        AnswerLimits {
            default_max_tokens: config.answer_default_tokens,
            max_tokens: config.answer_max_tokens,
            max_question_chars: config.max_query_chars,
            max_queued: config.answer_queue,
            per_tenant: config.answer_queue_per_tenant,
            // An engine batches the answers it is sent; this process's cores do not.
            concurrency: if config.lm_engine_url.is_some() {
                config.lm_engine_concurrency
            } else {
                1
            },
            speculative: SpeculativeSettings {
                drafts: config.speculative_drafts,
                clusters: config.speculative_clusters,
                ..SpeculativeSettings::default()
            },
        },
        Arc::new(AnswerMetrics::register(&registry)?),
    );
    let body_limits = BodyLimits {
        max_bytes: config.max_body_bytes,
        timeout: Duration::from_millis(config.body_timeout_ms),
    };
    let api = api
        .merge(edge_node::answer::http::answer_routes(
            answers.clone(),
            body_limits,
        ))
        .merge(edge_node::answer::openai::chat_routes(
            answers.clone(),
            body_limits,
        ))
        .merge(edge_node::answer::ralm::ralm_routes(
            answers.clone(),
            body_limits,
        ))
        .merge(edge_node::answer::spechop::spechop_routes(
            answers.clone(),
            body_limits,
        ))
        .merge(edge_node::embeddings::embedding_routes(
            service.clone(),
            body_limits,
        ));
    let generation = {
        let answers = answers.clone();
        Arc::new(move || answers.generation())
    };
    let admin = edge_node::http::admin_routes(service.clone(), generation, registry);
    // Without an admin address of their own, the admin routes share the API's.
    let (api, admin) = match admin_listener {
        Some(listener) => (api, Some((listener, admin))),
        None => (api.merge(admin), None),
    };
    let mut servers = tokio::task::JoinSet::new();
    servers.spawn(http_server::serve(
        http_listener,
        api,
        limits,
        metrics.connections_refused("api"),
        stopped(stop_rx.clone()),
    ));
    if let Some((listener, admin)) = admin {
        // Operators and probes: few connections, never crowded out by clients.
        let admin_limits = HttpServerLimits {
            max_connections: ADMIN_CONNECTIONS,
            ..limits
        };
        servers.spawn(http_server::serve(
            listener,
            admin,
            admin_limits,
            metrics.connections_refused("admin"),
            stopped(stop_rx.clone()),
        ));
    }
    let grpc = tonic::transport::Server::builder()
        // The same bound as the JSON API's body: a 384-d vector is ~1.5 KB in protobuf.
        .add_service(
            EdgeServer::new(EdgeGrpc::new(service, answers))
                .max_decoding_message_size(config.max_body_bytes),
        )
        .serve_with_incoming_shutdown(
            // HTTP/2 writes headers and data separately; without TCP_NODELAY the second
            // write waits for the client's delayed ACK (~40 ms).
            tonic::transport::server::TcpIncoming::from(grpc_listener).with_nodelay(Some(true)),
            stopped(stop_rx),
        );
    let grace = limits.shutdown_grace;
    servers.spawn(async move {
        if let Err(err) = grpc.await {
            tracing::error!(%err, "gRPC server failed");
        }
    });
    tracing::info!(%http_addr, %grpc_addr, ?metrics_addr, policy = ?config.policy, "serving");
    if let Some(path) = &config.ready_file {
        let mut ready = serde_json::json!({
            "http_addr": http_addr.to_string(),
            "grpc_addr": grpc_addr.to_string(),
        });
        if let Some(addr) = metrics_addr {
            ready["metrics_addr"] = addr.to_string().into();
        }
        write_atomically(path, ready.to_string().as_bytes())
            .with_context(|| format!("writing the ready file {}", path.display()))?;
    }
    shutdown_signal().await;
    let _ = stop_tx.send(true);
    // Each server drains within the grace; gRPC streams get the same bound here.
    if tokio::time::timeout(grace + Duration::from_secs(1), async {
        while servers.join_next().await.is_some() {}
    })
    .await
    .is_err()
    {
        tracing::warn!(
            ?grace,
            "servers still draining after the shutdown grace; exiting"
        );
    }
    tracing::info!("stopped");
    Ok(())
}

/// HTTP connections the admin routes accept at once.
const ADMIN_CONNECTIONS: usize = 64;

async fn stopped(mut rx: tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}
