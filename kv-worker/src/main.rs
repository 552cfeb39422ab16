//! `kv-worker`: FusionRAG generation over stored chunk KV, its offline stage over a corpus
//! bundle, and the store's upkeep.
//!
//! `serve` answers `KvGeneration` requests over gRPC, `preprocess` computes every chunk's Full Reuse and similarity-guided KV into the store
//! (resumable: run it again after an interruption), `update` carries a corpus version's
//! still-valid entries over to a new bundle's version, `status` shows what a store holds.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use std::net::SocketAddr;

use anyhow::{Context, Result, bail};
use clap::{Args, CommandFactory, Parser, Subcommand};
use hasten_core::bundle::CorpusBundle;
use hasten_core::config::{
    ConfigSource, TlsConfig, help_with_defaults, parse_command, resolve_config,
};
use hasten_core::lifecycle::{shutdown_signal, write_atomically};
use hasten_core::logging::{LogArgs, LogFormat};
use hasten_core::metrics::ReadinessCheck;
use hasten_kv_worker::KvEngine;
use hasten_kv_worker::config::KvWorkerConfig;
use hasten_kv_worker::metrics::KvMetrics;
use hasten_kv_worker::preprocess::{Catalog, PlannedChunk, carry_over, run};
use hasten_kv_worker::progress::{PreprocessProgress, bar};
use hasten_kv_worker::prompt::chunk_tokens;
use hasten_kv_worker::service::KvGenerationService;
use hasten_kv_worker::store::{
    ChunkKvStore, KvDtype, MemoryTier, ModelId, ModelIdentity, StoreSettings, chunk_content,
    content_hash, sync_version,
};
use hasten_kv_worker::worker::KvWorker;
use hasten_lm::{DeviceKind, LanguageModel, WeightFormat};
use hasten_proto::grpc_tls;
use hasten_proto::health::readiness_health;
use hasten_proto::tls::MutualTls;
use hasten_proto::v1::kv_generation_server::KvGenerationServer;
use serde::Serialize;

#[derive(Parser)]
#[command(
    name = "kv-worker",
    version,
    about = "Hasten's FusionRAG KV worker: generation over reused chunk KV, preprocessing, store upkeep"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the `KvGeneration` gRPC service over a preprocessed store.
    Serve(ServeArgs),
    /// Compute the chunks' Full Reuse and similarity-guided KV of a corpus bundle into the
    /// store (skips what the store holds, so a rerun resumes).
    Preprocess(PreprocessArgs),
    /// Start a new bundle's corpus version from an old one's entries that stay valid (a
    /// changed chunk and every chunk whose similarity-guided KV read it are left out).
    Update(UpdateArgs),
    /// Show each corpus version's preprocessing progress in a store.
    Status(StatusArgs),
    /// Copy a corpus version from a shared origin store into this worker's store (resumable;
    /// what a pool's workers run before serving a newly preprocessed version).
    Sync(SyncArgs),
}

#[derive(Args)]
struct ModelArgs {
    /// The GGUF model whose KV is stored.
    #[arg(long, env = "HASTEN_KV_MODEL")]
    model: PathBuf,
    /// Weight layout: as-stored, q8_0, f32 or fast (entries of one layout are not
    /// another's) [default: fast on cpu, f32 on cuda].
    #[arg(long, env = "HASTEN_KV_WEIGHTS")]
    weights: Option<WeightFormat>,
    /// cpu, or cuda in a build with the `cuda` feature.
    #[arg(long, env = "HASTEN_KV_DEVICE", default_value = "cpu")]
    device: DeviceKind,
    /// Refuse a model file whose SHA-256 is not this (64 hex digits).
    #[arg(long, env = "HASTEN_KV_MODEL_SHA256")]
    model_sha256: Option<String>,
}

#[derive(Args)]
struct StoreArgs {
    /// The store's directory.
    #[arg(long, env = "HASTEN_KV_STORE", default_value = "kv-store")]
    store: PathBuf,
    /// How entries are written: f16 (half the bytes) or f32 (exact).
    #[arg(long, env = "HASTEN_KV_DTYPE", default_value = "f16")]
    dtype: KvDtype,
    /// Bytes of chunk KV kept in RAM (the rest is read from disk when needed).
    #[arg(long, env = "HASTEN_KV_RAM_BUDGET", default_value_t = 1 << 30)]
    ram_budget: u64,
    /// Bytes of chunk KV kept in GPU memory on a CUDA device (the hottest entries).
    #[arg(long, env = "HASTEN_KV_GPU_BUDGET", default_value_t = 2 << 30)]
    gpu_budget: u64,
}

#[derive(Args)]
struct PreprocessArgs {
    /// The corpus bundle (`cloud-index build --out`); its documents are the chunks.
    #[arg(long)]
    bundle: PathBuf,
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    store: StoreArgs,
    /// Neighbours each chunk's similarity-guided KV attends to (the paper's n).
    #[arg(long, default_value_t = 10)]
    top_n: usize,
    /// Only these chunk ids (one per line) and the Full Reuse KV of their neighbours.
    #[arg(long)]
    only: Option<PathBuf>,
    /// Only the bundle's first N chunks (and their neighbours' Full Reuse KV).
    #[arg(long)]
    limit: Option<usize>,
    /// Refuse a bundle of another corpus version.
    #[arg(long)]
    expect_version: Option<String>,
    /// Also write the outcome as one line of JSON (`done`, `total` chunks) to this file
    /// (a Job's termination message: /dev/termination-log).
    #[arg(long)]
    summary_file: Option<PathBuf>,
}

#[derive(Args)]
struct UpdateArgs {
    /// The new corpus bundle.
    #[arg(long)]
    bundle: PathBuf,
    /// The corpus version whose entries are carried over.
    #[arg(long)]
    from: String,
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    store: StoreArgs,
    /// Neighbours per chunk [default: the old version's].
    #[arg(long)]
    top_n: Option<usize>,
}

#[derive(Args, Serialize)]
struct ServeArgs {
    #[command(flatten)]
    #[serde(skip)]
    source: ConfigSource,
    #[command(flatten)]
    #[serde(flatten)]
    log: LogArgs,
    /// gRPC address.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    grpc_addr: Option<SocketAddr>,
    /// Address of /metrics, /readyz and /healthz.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    metrics_addr: Option<SocketAddr>,
    /// The GGUF model whose chunk KV the store holds (required).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<PathBuf>,
    /// cpu, or cuda in a build with the `cuda` feature.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    device: Option<DeviceKind>,
    /// as-stored, q8_0, f32 or fast [default: fast on cpu, f32 on cuda].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    weights: Option<WeightFormat>,
    /// The store's directory.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    store: Option<PathBuf>,
    /// f16 or f32, for text chunks' entries written while serving.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    dtype: Option<KvDtype>,
    /// Refuse a model file whose SHA-256 is not this.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    model_sha256: Option<String>,
    /// Bytes of chunk KV kept in RAM.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    ram_budget: Option<u64>,
    /// Bytes of chunk KV kept in GPU memory.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu_budget: Option<u64>,
    /// Answers waiting behind the one generating.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    queue: Option<usize>,
    /// New tokens when a request asks for 0.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    max_new_tokens: Option<usize>,
    #[command(flatten)]
    #[serde(flatten)]
    tls: TlsConfig,
    /// Write the bound addresses as JSON to this file once serving.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    ready_file: Option<PathBuf>,
}

#[derive(Args)]
struct SyncArgs {
    /// The shared origin store (written by `kv-worker preprocess`).
    #[arg(long)]
    from: PathBuf,
    /// This worker's store.
    #[arg(long, env = "HASTEN_KV_STORE", default_value = "kv-store")]
    store: PathBuf,
    /// The corpus version to copy.
    #[arg(long)]
    version: String,
}

#[derive(Args)]
struct StatusArgs {
    /// The store's directory.
    #[arg(long, env = "HASTEN_KV_STORE", default_value = "kv-store")]
    store: PathBuf,
}

/// A loaded model with its system prompt's KV and the id its entries are stored under.
struct Loaded {
    engine: KvEngine,
    model_id: ModelId,
}

fn load_model(args: &ModelArgs) -> Result<Loaded> {
    let weights = args.weights.unwrap_or(match args.device {
        DeviceKind::Cpu => WeightFormat::Fast,
        DeviceKind::Cuda => WeightFormat::F32,
    });
    load(
        &args.model,
        args.device,
        weights,
        args.model_sha256.as_deref(),
    )
}

fn load(
    path: &Path,
    device: DeviceKind,
    weights: WeightFormat,
    expected_sha256: Option<&str>,
) -> Result<Loaded> {
    let started = Instant::now();
    let model = LanguageModel::load_with(path, &device.open()?, weights)
        .with_context(|| format!("loading {}", path.display()))?;
    let engine = KvEngine::new(Arc::new(model))?;
    let identity = ModelIdentity::compute(path, &weights.to_string(), engine.system().tokens())?;
    if let Some(expected) = expected_sha256
        && !identity.file_sha256.eq_ignore_ascii_case(expected)
    {
        bail!(
            "model_sha256: {} has SHA-256 {}, the configuration pins {expected}",
            path.display(),
            identity.file_sha256
        );
    }
    let model_id = identity.id;
    tracing::info!(
        model = %path.display(),
        %model_id,
        %device,
        %weights,
        took_ms = started.elapsed().as_millis() as u64,
        "model loaded"
    );
    Ok(Loaded { engine, model_id })
}

fn open_store(args: &StoreArgs, loaded: &Loaded) -> Result<ChunkKvStore> {
    let decoder = &loaded.engine.model().decoder;
    let device = loaded.engine.system().kv().device().clone();
    let mut tiers = Vec::new();
    if device.is_cuda() {
        // Entries read on a GPU stay there while they are the hottest of what fits.
        tiers.push(MemoryTier {
            name: "gpu",
            device: device.clone(),
            budget: args.gpu_budget,
        });
    }
    tiers.push(MemoryTier {
        name: "ram",
        device: candle_core::Device::Cpu,
        budget: args.ram_budget,
    });
    Ok(ChunkKvStore::open(
        StoreSettings {
            root: args.store.clone(),
            tiers,
            dtype: args.dtype,
            half_life: 1000.0,
        },
        device,
        decoder.rope().clone(),
    )?)
}

/// The bundle's documents as chunks (tokenized as prompts place them) and their vectors.
fn plan(loaded: &Loaded, bundle: &CorpusBundle) -> Result<Vec<PlannedChunk>> {
    let bar = bar("tokenizing", bundle.documents.len());
    let chunks = bundle
        .documents
        .iter()
        .map(|d| {
            bar.inc(1);
            Ok(PlannedChunk {
                id: d.id,
                hash: content_hash(&chunk_content(&d.title, &d.text)),
                tokens: chunk_tokens(loaded.engine.model(), &d.title, &d.text)?,
            })
        })
        .collect::<Result<Vec<_>>>();
    bar.finish_and_clear();
    chunks
}

fn load_bundle(dir: &Path) -> Result<CorpusBundle> {
    CorpusBundle::load(dir).with_context(|| format!("loading the bundle {}", dir.display()))
}

fn preprocess(args: PreprocessArgs) -> Result<()> {
    let bundle = load_bundle(&args.bundle)?;
    let corpus = bundle.manifest.corpus_version.clone();
    if let Some(expected) = &args.expect_version
        && *expected != corpus
    {
        bail!(
            "{} is corpus version {corpus}, not the expected {expected}",
            args.bundle.display()
        );
    }
    let loaded = load_model(&args.model)?;
    let store = open_store(&args.store, &loaded)?;
    let chunks = plan(&loaded, &bundle)?;
    let built = Catalog::build(
        loaded.model_id.clone(),
        &corpus,
        &chunks,
        bundle.vectors(),
        bundle.dimension(),
        args.top_n,
    )?;
    let path = Catalog::path(&args.store.store, &loaded.model_id, &corpus);
    match Catalog::load(&path)? {
        Some(existing) if existing != built => bail!(
            "{} was written for other settings (top_n {} here, {} there) or other texts; \
             use another --store, or remove that corpus version's directory",
            path.display(),
            args.top_n,
            existing.top_n
        ),
        Some(_) => {}
        None => built.save(&args.store.store)?,
    }
    let mut only: Option<BTreeSet<u64>> = match &args.only {
        Some(file) => Some(read_ids(file)?),
        None => None,
    };
    if let Some(limit) = args.limit {
        let first: BTreeSet<u64> = chunks.iter().take(limit).map(|c| c.id).collect();
        only = Some(match only {
            Some(ids) => ids.intersection(&first).copied().collect(),
            None => first,
        });
    }
    let texts: BTreeMap<u64, PlannedChunk> = chunks.into_iter().map(|c| (c.id, c)).collect();
    let started = Instant::now();
    let mut progress = PreprocessProgress::for_stderr();
    let report = run(
        &loaded.engine.model().decoder,
        loaded.engine.system(),
        &store,
        &built,
        &texts,
        only.as_ref(),
        |phase, done, total| {
            progress.update(phase, done, total);
            true
        },
    )?;
    progress.finish();
    let progress = built.progress(&args.store.store)?;
    if let Some(path) = &args.summary_file {
        let summary = serde_json::json!({
            "corpus_version": corpus,
            "done": progress.full_reuse.min(progress.similarity),
            "total": progress.chunks,
        });
        std::fs::write(path, format!("{summary}\n"))
            .with_context(|| format!("writing the summary to {}", path.display()))?;
    }
    println!(
        "{}",
        serde_json::to_string_pretty(&serde_json::json!({
            "store": args.store.store,
            "model_id": loaded.model_id,
            "corpus_version": corpus,
            "seconds": started.elapsed().as_secs_f64(),
            "full_reuse": {
                "computed": report.full_reuse.computed,
                "skipped": report.full_reuse.skipped,
                "seconds_per_chunk": report.full_reuse.seconds_per_chunk(),
            },
            "similarity": {
                "computed": report.similarity.computed,
                "skipped": report.similarity.skipped,
                "seconds_per_chunk": report.similarity.seconds_per_chunk(),
            },
            "progress": progress,
        }))?
    );
    Ok(())
}

fn read_ids(file: &Path) -> Result<BTreeSet<u64>> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("reading chunk ids from {}", file.display()))?;
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .enumerate()
        .map(|(n, line)| {
            line.parse::<u64>().with_context(|| {
                format!(
                    "{} line {}: `{line}` is not a chunk id",
                    file.display(),
                    n + 1
                )
            })
        })
        .collect()
}

fn update(args: UpdateArgs) -> Result<()> {
    let bundle = load_bundle(&args.bundle)?;
    let loaded = load_model(&args.model)?;
    let store = open_store(&args.store, &loaded)?;
    let old_path = Catalog::path(&args.store.store, &loaded.model_id, &args.from);
    let old = Catalog::load(&old_path)?.with_context(|| {
        format!(
            "no catalog of corpus version {} for this model at {}",
            args.from,
            old_path.display()
        )
    })?;
    let corpus = bundle.manifest.corpus_version.clone();
    if corpus == old.corpus {
        bail!("the bundle is corpus version {corpus} already");
    }
    let chunks = plan(&loaded, &bundle)?;
    let new = Catalog::build(
        loaded.model_id.clone(),
        &corpus,
        &chunks,
        bundle.vectors(),
        bundle.dimension(),
        args.top_n.unwrap_or(old.top_n),
    )?;
    new.save(&args.store.store)?;
    let invalidation = carry_over(&store, &old, &new)?;
    println!(
        "{}",
        serde_json::to_string_pretty(&serde_json::json!({
            "from": old.corpus,
            "to": corpus,
            "changed": invalidation.changed.len(),
            "removed": invalidation.removed.len(),
            "dependents": invalidation.dependents.len(),
            "carried": invalidation.carried,
            "progress": new.progress(&args.store.store)?,
        }))?
    );
    eprintln!(
        "run `kv-worker preprocess --bundle {}` to compute the rest",
        args.bundle.display()
    );
    Ok(())
}

fn status(args: StatusArgs) -> Result<()> {
    let mut rows = Vec::new();
    let models = std::fs::read_dir(&args.store)
        .with_context(|| format!("reading the store {}", args.store.display()))?;
    for model in models {
        let model = model?.path();
        if !model.is_dir() {
            continue;
        }
        for version in std::fs::read_dir(&model)? {
            let catalog = version?.path().join("catalog.json");
            if let Some(catalog) = Catalog::load(&catalog)? {
                rows.push(serde_json::json!({
                    "model_id": catalog.model,
                    "corpus_version": catalog.corpus,
                    "top_n": catalog.top_n,
                    "progress": catalog.progress(&args.store)?,
                }));
            }
        }
    }
    println!("{}", serde_json::to_string_pretty(&rows)?);
    Ok(())
}

fn sync(args: SyncArgs) -> Result<()> {
    let bar = bar("syncing", 0);
    let report = sync_version(&args.from, &args.store, &args.version, |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })
    .with_context(|| {
        format!(
            "copying corpus version {} from {} into {}",
            args.version,
            args.from.display(),
            args.store.display()
        )
    })?;
    bar.finish_and_clear();
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

async fn serve(args: ServeArgs) -> Result<()> {
    let Some(config) = resolve_config::<KvWorkerConfig, _>(&args.source, "HASTEN_KV_", &args)?
    else {
        return Ok(());
    };
    let _traces = hasten_core::logging::init_with_traces(
        config.log_format,
        config.otlp_endpoint.as_deref(),
        "hasten-kv-worker",
    )?;
    let mutual = config
        .tls
        .mutual_tls()?
        .map(|paths| MutualTls::load(&paths))
        .transpose()
        .context("loading the mutual-TLS files")?;
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
    let worker = KvWorker::new(loaded.engine, Arc::new(store), loaded.model_id, model_path)?;
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
    let expiry = hasten_core::metrics::register_certificate_expiry(
        &registry,
        &hasten_proto::tls::expiries(mutual.as_ref())?,
    )?;
    let grpc_tls_config = mutual
        .as_ref()
        .map(|mutual| {
            let report = hasten_core::metrics::tls_reload_reporter(
                &registry,
                expiry,
                "certificate",
                mutual.paths().cert.display().to_string(),
            )?;
            grpc_tls::reloading_server_config(mutual, move |outcome| report(outcome.result()))
                .context("configuring gRPC TLS")
        })
        .transpose()?;
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

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::command().mut_subcommand("serve", help_with_defaults::<KvWorkerConfig>);
    let command = parse_command::<Cli>(cli).command;
    if !matches!(command, Command::Serve(_)) {
        hasten_core::logging::init(LogFormat::Text);
    }
    match command {
        Command::Serve(args) => serve(args).await,
        Command::Preprocess(args) => preprocess(args),
        Command::Update(args) => update(args),
        Command::Status(args) => status(args),
        Command::Sync(args) => sync(args),
    }
}
