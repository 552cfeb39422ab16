//! `kv-worker`: FusionRAG generation over stored chunk KV, its offline stage over a corpus
//! bundle, and the store's upkeep.
//!
//! `serve` answers `KvGeneration` requests over gRPC, `preprocess` computes every chunk's Full Reuse and similarity-guided KV into the store
//! (resumable: run it again after an interruption), `update` carries a corpus version's
//! still-valid entries over to a new bundle's version, `status` shows what a store holds.

mod app;

use std::path::PathBuf;

use std::net::SocketAddr;

use anyhow::Result;
use app::store::{PreprocessArgs, StatusArgs, SyncArgs, UpdateArgs};
use clap::{Args, CommandFactory, Parser, Subcommand};
use hasten_core::config::{
    ConfigSource, TlsConfig, help_with_defaults, parse_command, resolve_config,
};
use hasten_core::logging::{LogArgs, LogFormat};
use hasten_kv_worker::config::KvWorkerConfig;
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

// Flags only for what differs between processes that share one file; the rule is
// docs/configuration.md's "Flags".
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
    /// The store's directory.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    store: Option<PathBuf>,
    /// Refuse a model file whose SHA-256 is not this.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    model_sha256: Option<String>,
    #[command(flatten)]
    #[serde(flatten)]
    tls: TlsConfig,
    /// Write the bound addresses as JSON to this file once serving.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    ready_file: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::command().mut_subcommand("serve", help_with_defaults::<KvWorkerConfig>);
    let command = parse_command::<Cli>(cli).command;
    if !matches!(command, Command::Serve(_)) {
        hasten_core::logging::init(LogFormat::Text);
    }
    match command {
        Command::Serve(args) => {
            match resolve_config::<KvWorkerConfig, _>(&args.source, "HASTEN_KV_", &args)? {
                Some(config) => app::serve::serve(config).await,
                None => Ok(()),
            }
        }
        Command::Preprocess(args) => app::store::preprocess(args),
        Command::Update(args) => app::store::update(args),
        Command::Status(args) => app::store::status(args),
        Command::Sync(args) => app::store::sync(args),
    }
}
