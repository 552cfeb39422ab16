//! `cloud-index`: build corpus bundles and serve exact search over them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use cloud_index::config::CloudConfig;
use cloud_index::grpc::CloudIndexGrpc;
use cloud_index::{CloudService, ExactSearcher};
use hasten_core::bundle::{CorpusBundle, build_bundle};
use hasten_core::config::load_config;
use hasten_core::corpus::{CorpusSources, SyntheticSpec};
use hasten_core::encoder::{DEFAULT_MODEL_DIR, TextEncoder};
use hasten_core::lifecycle::{shutdown_signal, write_atomically};
use hasten_proto::frame::DEFAULT_MAX_FRAME_BYTES;
use hasten_proto::quic::{ServerIdentity, server_config};
use hasten_proto::v1::cloud_index_server::CloudIndexServer;
use serde::Serialize;

#[derive(Parser)]
#[command(
    name = "cloud-index",
    version,
    about = "Hasten cloud tier: exact vector search over a corpus bundle"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Encode a corpus into a bundle (vectors, texts, manifest); reuses vectors of a bundle
    /// already at the output path.
    Build(BuildArgs),
    /// Serve exact search over a bundle on QUIC and gRPC.
    Serve(ServeArgs),
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
    /// Add the synthetic knowledge base with this many entities (the default corpus when no
    /// file is given has 300).
    #[arg(long)]
    synthetic_entities: Option<usize>,
    /// Seed of the synthetic knowledge base.
    #[arg(long, default_value_t = 7)]
    synthetic_seed: u64,
    /// Output bundle directory.
    #[arg(long)]
    out: PathBuf,
    /// Directory holding all-MiniLM-L6-v2 (config.json, tokenizer.json, model.safetensors).
    #[arg(long, env = "HASTEN_MODEL_DIR", default_value = DEFAULT_MODEL_DIR)]
    model_dir: PathBuf,
}

#[derive(Args, Serialize)]
struct ServeArgs {
    /// TOML configuration file; flags and HASTEN_CLOUD_* variables override it.
    #[arg(long)]
    #[serde(skip)]
    config: Option<PathBuf>,
    /// Print the effective configuration and exit.
    #[arg(long)]
    #[serde(skip)]
    print_config: bool,
    /// Corpus bundle directory.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    bundle: Option<PathBuf>,
    /// UDP address for QUIC [default: 127.0.0.1:7100].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    quic_addr: Option<SocketAddr>,
    /// TCP address for gRPC [default: 127.0.0.1:7101].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    grpc_addr: Option<SocketAddr>,
    /// PEM certificate chain for TLS (with --tls-key); a dev certificate is generated otherwise.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_cert: Option<PathBuf>,
    /// PEM private key for TLS.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_key: Option<PathBuf>,
    /// Where to write the generated dev certificate [default: run/cloud-dev-cert.pem].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    dev_cert_out: Option<PathBuf>,
    /// Write the bound addresses as JSON to this file once serving.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    ready_file: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> Result<()> {
    hasten_core::logging::init();
    match Cli::parse().command {
        Command::Build(args) => build(args),
        Command::Serve(args) => serve(args).await,
    }
}

fn build(args: BuildArgs) -> Result<()> {
    let sources = CorpusSources {
        squad: args.squad,
        hotpot: args.hotpot,
        wiki18: args.wiki18,
        synthetic: args.synthetic_entities.map(|entities| SyntheticSpec {
            entities,
            seed: args.synthetic_seed,
        }),
    };
    let corpus = sources.load().context("loading the corpus")?;
    let encoder = TextEncoder::load(&args.model_dir)
        .with_context(|| format!("loading the encoder from {}", args.model_dir.display()))?;
    let started = Instant::now();
    let stats = build_bundle(&corpus, &encoder, &args.out)
        .with_context(|| format!("building the bundle at {}", args.out.display()))?;
    tracing::info!(
        out = %args.out.display(),
        documents = stats.manifest.documents,
        questions = stats.manifest.questions,
        encoded = stats.encoded,
        reused = stats.reused,
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
            "corpus_version": stats.manifest.corpus_version,
        }))?
    );
    Ok(())
}

fn tls_identity(config: &CloudConfig) -> Result<ServerIdentity> {
    if let (Some(cert), Some(key)) = (&config.tls_cert, &config.tls_key) {
        return ServerIdentity::from_pem_files(cert, key).context("loading the TLS certificate");
    }
    let (identity, pem) = ServerIdentity::generate_dev(&config.dev_cert_names)?;
    write_atomically(&config.dev_cert_out, pem.as_bytes()).with_context(|| {
        format!(
            "writing the dev certificate to {}",
            config.dev_cert_out.display()
        )
    })?;
    tracing::warn!(
        path = %config.dev_cert_out.display(),
        "no TLS certificate configured: generated a self-signed dev certificate; edges must trust it"
    );
    Ok(identity)
}

async fn serve(args: ServeArgs) -> Result<()> {
    let config: CloudConfig = load_config(args.config.as_deref(), "HASTEN_CLOUD_", &args)?;
    if args.print_config {
        println!("{}", serde_json::to_string_pretty(&config)?);
        return Ok(());
    }
    config.validate()?;
    let bundle_dir = config.bundle.clone().unwrap_or_default();
    let started = Instant::now();
    let bundle = CorpusBundle::load(&bundle_dir)
        .with_context(|| format!("loading the bundle {}", bundle_dir.display()))?;
    let searcher = ExactSearcher::new(bundle).context("building the exact index")?;
    let info = searcher.info();
    tracing::info!(
        documents = info.documents,
        corpus_version = %info.corpus_version,
        seconds = format!("{:.1}", started.elapsed().as_secs_f64()),
        "index loaded"
    );
    let service = CloudService::new(searcher);

    let quic = cloud_index::quic::bind(config.quic_addr, server_config(tls_identity(&config)?)?)
        .with_context(|| format!("binding QUIC on {}", config.quic_addr))?;
    let quic_addr = quic.local_addr()?;
    let grpc_listener = tokio::net::TcpListener::bind(config.grpc_addr)
        .await
        .with_context(|| format!("binding gRPC on {}", config.grpc_addr))?;
    let grpc_addr = grpc_listener.local_addr()?;

    let quic_task = tokio::spawn(cloud_index::quic::serve(quic.clone(), service.clone()));
    let grpc_service = CloudIndexServer::new(CloudIndexGrpc::new(service))
        .max_decoding_message_size(DEFAULT_MAX_FRAME_BYTES)
        .max_encoding_message_size(DEFAULT_MAX_FRAME_BYTES);
    let grpc_task = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(grpc_service)
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(grpc_listener),
                shutdown_signal(),
            ),
    );
    tracing::info!(%quic_addr, %grpc_addr, "serving");
    if let Some(path) = &config.ready_file {
        let ready = serde_json::json!({
            "quic_addr": quic_addr.to_string(),
            "grpc_addr": grpc_addr.to_string(),
            "corpus_version": info.corpus_version,
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
