//! `cloud-index`: build corpus bundles and serve exact search over them.

mod progress;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Instant;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use anyhow::{Context, Result};
use clap::{Args, CommandFactory, Parser, Subcommand};
use hasten_cloud_index::backend::{Admission, Metered};
use hasten_cloud_index::config::{RouterConfig, ShardConfig};
use hasten_cloud_index::dev_cert::{DevCertOrigin, DevCertificate, key_path};
use hasten_cloud_index::grpc::CloudIndexGrpc;
use hasten_cloud_index::metrics::{CloudMetrics, Role};
use hasten_cloud_index::router::Router;
use hasten_cloud_index::shard_map::follow_control_plane;
use hasten_cloud_index::{ExactSearcher, SearchBackend, ShardService};
use hasten_core::bundle::{CorpusBundle, ImportedVectors, build_bundle, write_shards};
use hasten_core::config::{
    ConfigSource, TlsConfig, help_with_defaults, parse_command, resolve_config,
};
use hasten_core::corpus::{ArticleFilter, Corpus, CorpusSources, SyntheticSpec};
use hasten_core::encoder::{DEFAULT_MODEL_DIR, EncoderRuntime, TextEncoder};
use hasten_core::lifecycle::{shutdown_signal, write_atomically};
use hasten_core::logging::{LogArgs, LogFormat};
use hasten_core::metrics::ReadinessCheck;
use hasten_core::threads::{available_cores, set_blas_min_batch, set_compute_threads};
use hasten_proto::auth::AccessToken;
use hasten_proto::control::ControlAccess;
use hasten_proto::frame::DEFAULT_MAX_FRAME_BYTES;
use hasten_proto::grpc_tls;
use hasten_proto::health::readiness_health;
use hasten_proto::quic::{ServerCertificate, server_config};
use hasten_proto::reload::ReloadingCertificate;
use hasten_proto::tls::{Identity, MutualTls, TlsPaths};
use hasten_proto::v1::cloud_index_server::CloudIndexServer;
use progress::EncodeProgress;
use serde::Serialize;

#[derive(Parser)]
#[command(
    name = "cloud-index",
    version,
    about = "Hasten cloud tier: exact vector search over a corpus, sharded behind a router"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Encode a corpus into a bundle (vectors, texts, manifest); reuses vectors of a bundle
    /// already at the output path. With --shards, also cut it into shard bundles.
    Build(BuildArgs),
    /// Serve exact search over a bundle (a shard, or a whole corpus) on QUIC and gRPC.
    Serve(ServeArgs),
    /// Route searches over shard servers: fan out to one live replica per shard, merge.
    Route(RouteArgs),
}

#[derive(Args)]
struct BuildArgs {
    /// SQuAD v1.1 JSON file (repeatable).
    #[arg(long)]
    squad: Vec<PathBuf>,
    /// HotpotQA JSON-lines file; every context paragraph becomes a passage (repeatable).
    #[arg(long)]
    hotpot: Vec<PathBuf>,
    /// wiki18 passage JSON-lines file (repeatable).
    #[arg(long)]
    wiki18: Vec<PathBuf>,
    /// Full-article JSON-lines file (`title`, `text`; e.g. wiki-entity-articles.jsonl.gz),
    /// split into passages of at most 100 words under their title, as DPR did (repeatable).
    #[arg(long)]
    wiki_articles: Vec<PathBuf>,
    /// Keep only each article's first N passages of --wiki-articles.
    #[arg(long)]
    max_passages_per_article: Option<usize>,
    /// EntityQuestions JSON-lines file: its questions go into the bundle (repeatable).
    #[arg(long)]
    entity_questions: Vec<PathBuf>,
    /// Keep only the EntityQuestions whose subject's article the corpus holds.
    #[arg(long)]
    entity_questions_with_article: bool,
    /// Add the synthetic knowledge base with this many entities (the default corpus when no
    /// file is given has 300).
    #[arg(long)]
    synthetic_entities: Option<usize>,
    /// Seed of the synthetic knowledge base.
    #[arg(long, default_value_t = 7)]
    synthetic_seed: u64,
    /// Passages with vectors computed elsewhere (by all-MiniLM-L6-v2): JSON lines of
    /// {"title", "text", "vector"} (gzipped or not), or a float32 .npy of shape (n, d)
    /// paired with --import-passages; they join the corpus without being encoded
    /// (repeatable).
    #[arg(long)]
    import_vectors: Vec<PathBuf>,
    /// For each .npy of --import-vectors, in order: its n passages as JSON lines
    /// ({"title", "text"}) in row order.
    #[arg(long)]
    import_passages: Vec<PathBuf>,
    /// Passages of each imported file re-encoded to check that its vectors come from the
    /// encoder's model (a file that disagrees is refused).
    #[arg(long, default_value_t = 16)]
    import_check_sample: usize,
    /// Output bundle directory.
    #[arg(long)]
    out: PathBuf,
    /// Where sources given as http(s):// URLs (any file flag above takes one) are
    /// downloaded, resuming an interrupted download; `<out>.downloads` when absent.
    #[arg(long)]
    download_dir: Option<PathBuf>,
    /// Keep a bundle `--out` already holds and build nothing (a bootstrap run again after it
    /// finished; delete the bundle to rebuild).
    #[arg(long)]
    skip_existing: bool,
    /// Also partition the corpus by document id into this many shard bundles, written to
    /// <out>/shards/shard-<i>.
    #[arg(long)]
    shards: Option<u32>,
    /// Directory holding all-MiniLM-L6-v2 (config.json, tokenizer.json, model.safetensors).
    #[arg(long, env = "HASTEN_MODEL_DIR", default_value = DEFAULT_MODEL_DIR)]
    model_dir: PathBuf,
    /// Where passages are encoded: `cpu` (ONNX Runtime when the model directory has it,
    /// else candle) or `cuda` (candle on the first GPU; needs a build with the `cuda` feature).
    #[arg(long, value_enum, default_value_t = EncodeDevice::Cpu)]
    device: EncodeDevice,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum EncodeDevice {
    Cpu,
    Cuda,
}

impl EncodeDevice {
    fn runtime(self) -> EncoderRuntime {
        match self {
            Self::Cpu => EncoderRuntime::Auto,
            Self::Cuda => EncoderRuntime::Cuda,
        }
    }
}

#[derive(Args, Serialize)]
struct ServeArgs {
    #[command(flatten)]
    #[serde(skip)]
    source: ConfigSource,
    #[command(flatten)]
    #[serde(flatten)]
    log: LogArgs,
    /// Corpus bundle directory.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    bundle: Option<PathBuf>,
    #[command(flatten)]
    server: ServerArgs,
    #[command(flatten)]
    #[serde(flatten)]
    tls: TlsConfig,
    #[command(flatten)]
    batching: BatchingArgs,
    /// OpenMP threads for faiss; 0 for every core.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    openmp_threads: Option<usize>,
    /// OpenBLAS threads; 0 for every core.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    openblas_threads: Option<usize>,
    /// Smallest batch searched as one matrix product.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    blas_min_batch: Option<usize>,
}

/// Micro-batching, the `[batching]` table; shared by `serve` (one faiss call per batch) and
/// `route` (one request per shard per batch).
#[derive(Args, Serialize)]
struct BatchingArgs {
    /// Coalesce concurrent searches into one batch.
    #[arg(long = "batching", value_name = "BATCHING")]
    #[serde(skip_serializing_if = "Option::is_none")]
    enabled: Option<bool>,
    /// Most query vectors in one batch.
    #[arg(long = "batch-max-queries", value_name = "BATCH_MAX_QUERIES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    max_queries: Option<usize>,
    /// Longest a search waits for company, in microseconds.
    #[arg(long = "batch-max-wait-us", value_name = "BATCH_MAX_WAIT_US")]
    #[serde(skip_serializing_if = "Option::is_none")]
    max_wait_us: Option<u64>,
}

/// What shard servers and routers share, the `[server]` table: where they listen, how they
/// report themselves, and how much they take on at once.
#[derive(Args, Serialize)]
struct ServerArgs {
    /// UDP address for QUIC.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    quic_addr: Option<SocketAddr>,
    /// TCP address for gRPC.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    grpc_addr: Option<SocketAddr>,
    /// TCP address for /metrics, /readyz and /healthz.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    metrics_addr: Option<SocketAddr>,
    /// Searches answered at once; beyond it RESOURCE_EXHAUSTED.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    max_in_flight: Option<usize>,
    /// Where to write the generated dev certificate.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    dev_cert_out: Option<PathBuf>,
    /// Write the bound addresses as JSON to this file once serving.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    ready_file: Option<PathBuf>,
}

#[derive(Args, Serialize)]
struct RouteArgs {
    #[command(flatten)]
    #[serde(skip)]
    source: ConfigSource,
    #[command(flatten)]
    #[serde(flatten)]
    log: LogArgs,
    /// One shard's replicas as comma-separated gRPC endpoints (host:port); repeat once per
    /// shard, in shard order.
    #[arg(long = "shard", value_name = "ENDPOINTS")]
    #[serde(skip)]
    shard: Vec<String>,
    /// The shard map assembled from --shard.
    #[arg(skip)]
    #[serde(skip_serializing_if = "Option::is_none")]
    shards: Option<Vec<Vec<String>>>,
    /// A control-plane node's gRPC address (repeat for each): the router then follows the
    /// shard map the control plane replicates, starting from the --shard map.
    #[arg(long = "control-plane", value_name = "HOST:PORT")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    control_plane: Vec<String>,
    /// File holding the control plane's shared token, for a control plane without mutual TLS.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    control_plane_token_file: Option<PathBuf>,
    #[command(flatten)]
    server: ServerArgs,
    #[command(flatten)]
    #[serde(flatten)]
    tls: TlsConfig,
    /// Deadline of a request that names none, in milliseconds.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    request_timeout_ms: Option<u64>,
    /// Longest one attempt on one replica, in milliseconds.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    attempt_timeout_ms: Option<u64>,
    /// Period of replica health checks, in milliseconds.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    health_interval_ms: Option<u64>,
    /// How long start-up waits for a replica of every shard, in seconds.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    startup_timeout_s: Option<u64>,
    #[command(flatten)]
    batching: BatchingArgs,
}

#[tokio::main]
async fn main() -> Result<()> {
    let command = Cli::command()
        .mut_subcommand("serve", help_with_defaults::<ShardConfig>)
        .mut_subcommand("route", help_with_defaults::<RouterConfig>);
    match parse_command::<Cli>(command).command {
        Command::Build(args) => build(args).await,
        Command::Serve(args) => serve(args).await,
        Command::Route(args) => route(args).await,
    }
}

/// Reads and checks every imported vector file; `.npy` files take their passages from
/// `passages` in order.
fn read_imports(
    files: &[PathBuf],
    passages: &[PathBuf],
    encoder: &TextEncoder,
    sample: usize,
) -> Result<Vec<ImportedVectors>> {
    let is_npy = |p: &PathBuf| p.extension().is_some_and(|e| e.eq_ignore_ascii_case("npy"));
    let npy_count = files.iter().filter(|p| is_npy(p)).count();
    if npy_count != passages.len() {
        anyhow::bail!(
            "--import-passages: {} given for {npy_count} .npy file(s) in --import-vectors; \
             each .npy needs the JSON-lines file of its passages",
            passages.len()
        );
    }
    let mut passages = passages.iter();
    let mut imports = Vec::with_capacity(files.len());
    for file in files {
        let imported = match (is_npy(file), passages.next()) {
            (true, Some(texts)) => ImportedVectors::read_npy(file, texts)?,
            _ => ImportedVectors::read_jsonl(file)?,
        };
        let least = imported.check_against(encoder, sample)?;
        tracing::info!(
            file = %file.display(),
            passages = imported.len(),
            sampled = sample.min(imported.len()),
            least_cosine = format!("{least:.5}"),
            "imported vectors agree with the encoder"
        );
        imports.push(imported);
    }
    Ok(imports)
}

async fn build(mut args: BuildArgs) -> Result<()> {
    hasten_core::logging::init(LogFormat::Text);
    if args.skip_existing
        && let Ok(manifest) = hasten_core::bundle::read_manifest(&args.out)
    {
        tracing::info!(
            out = %args.out.display(),
            corpus_version = %manifest.corpus_version,
            documents = manifest.documents,
            "the bundle exists; nothing to build"
        );
        return Ok(());
    }
    let downloads = match &args.download_dir {
        Some(dir) => dir.clone(),
        None => args.out.with_extension("downloads"),
    };
    for sources in [
        &mut args.squad,
        &mut args.hotpot,
        &mut args.wiki18,
        &mut args.wiki_articles,
        &mut args.entity_questions,
        &mut args.import_vectors,
        &mut args.import_passages,
    ] {
        hasten_cloud_index::download::localize(sources, &downloads).await?;
    }
    let sources = CorpusSources {
        squad: args.squad,
        hotpot: args.hotpot,
        wiki18: args.wiki18,
        wiki_articles: args.wiki_articles,
        max_passages_per_article: args.max_passages_per_article,
        entity_questions: args.entity_questions,
        entity_question_filter: if args.entity_questions_with_article {
            ArticleFilter::WithArticle
        } else {
            ArticleFilter::All
        },
        synthetic: args.synthetic_entities.map(|entities| SyntheticSpec {
            entities,
            seed: args.synthetic_seed,
        }),
    };
    let encoder = TextEncoder::load_with(&args.model_dir, args.device.runtime())
        .with_context(|| format!("loading the encoder from {}", args.model_dir.display()))?;
    tracing::info!(runtime = encoder.runtime().name(), "encoder loaded");
    let imports = read_imports(
        &args.import_vectors,
        &args.import_passages,
        &encoder,
        args.import_check_sample,
    )?;
    // Imported passages alone make a corpus: no synthetic default then.
    let mut corpus = if sources.is_empty() && !imports.is_empty() {
        Corpus::default()
    } else {
        sources.load().context("loading the corpus")?
    };
    let mut known = Vec::new();
    for imported in imports {
        let (passages, vectors) = imported.into_parts();
        corpus.extend(passages);
        known.extend(vectors);
    }
    let started = Instant::now();
    let progress = EncodeProgress::new();
    let stats = build_bundle(&corpus, &encoder, &args.out, known, |encoded, total| {
        progress.update(encoded, total)
    })
    .with_context(|| format!("building the bundle at {}", args.out.display()))?;
    progress.finish();
    let shards = match args.shards {
        Some(count) => {
            let bundle = CorpusBundle::load(&args.out)
                .with_context(|| format!("reading back {}", args.out.display()))?;
            let dir = args.out.join("shards");
            write_shards(
                &dir,
                bundle.manifest.sources.clone(),
                &bundle.documents,
                bundle.vectors(),
                bundle.dimension(),
                count,
            )
            .with_context(|| format!("writing {count} shard bundles under {}", dir.display()))?;
            Some(dir)
        }
        None => None,
    };
    tracing::info!(
        out = %args.out.display(),
        documents = stats.manifest.documents,
        questions = stats.manifest.questions,
        encoded = stats.encoded,
        reused = stats.reused,
        imported = stats.imported,
        corpus_version = %stats.manifest.corpus_version,
        seconds = format!("{:.1}", started.elapsed().as_secs_f64()),
        "bundle ready"
    );
    println!(
        "{}",
        serde_json::to_string(&serde_json::json!({
            "out": args.out,
            "documents": stats.manifest.documents,
            "questions": stats.manifest.questions,
            "encoded": stats.encoded,
            "reused": stats.reused,
            "imported": stats.imported,
            "corpus_version": stats.manifest.corpus_version,
            "shards": shards,
        }))?
    );
    Ok(())
}

/// A server's TLS: mutual (its certificate from the deployment's CA, and clients must show
/// one too), server-only from certificate files, or a dev certificate kept at
/// `dev_cert_out` (its key beside it) for clients to trust.
struct ServerTls {
    identity: Identity,
    mutual: Option<MutualTls>,
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

    fn load(
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
    fn quic_certificate(
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
struct Listeners {
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

/// Serves `/metrics`, `/readyz` and `/healthz` on `addr` from now on; returns the bound
/// address.
async fn serve_observability(
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
async fn serve_backend<B: SearchBackend>(backend: B, listeners: Listeners) -> Result<()> {
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

async fn serve(args: ServeArgs) -> Result<()> {
    let Some(config) = resolve_config::<ShardConfig, _>(&args.source, "HASTEN_CLOUD_", &args)?
    else {
        return Ok(());
    };
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
        Listeners {
            quic_addr: config.server.quic_addr,
            grpc_addr: config.server.grpc_addr,
            metrics_addr,
            tls,
            certificate,
            ready_file: config.server.ready_file.clone(),
            ready,
        },
    )
    .await
}

async fn route(mut args: RouteArgs) -> Result<()> {
    if !args.shard.is_empty() {
        args.shards = Some(
            args.shard
                .iter()
                .map(|replicas| {
                    replicas
                        .split(',')
                        .map(str::trim)
                        .filter(|e| !e.is_empty())
                        .map(String::from)
                        .collect()
                })
                .collect(),
        );
    }
    let Some(config) = resolve_config::<RouterConfig, _>(&args.source, "HASTEN_ROUTER_", &args)?
    else {
        return Ok(());
    };
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
        Listeners {
            quic_addr: config.server.quic_addr,
            grpc_addr: config.server.grpc_addr,
            metrics_addr,
            tls,
            certificate,
            ready_file: config.server.ready_file.clone(),
            ready,
        },
    )
    .await
}
