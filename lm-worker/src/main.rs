//! `lm-worker`: answer over retrieved documents for edges that do not hold the models.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, CommandFactory, Parser, Subcommand};
use hasten_core::config::{
    ConfigSource, TlsConfig, help_with_defaults, parse_command, resolve_config,
};
use hasten_core::lifecycle::{shutdown_signal, write_atomically};
use hasten_core::logging::LogArgs;
use hasten_core::metrics::ReadinessCheck;
use hasten_lm_worker::GenerationService;
use hasten_lm_worker::config::WorkerConfig;
use hasten_lm_worker::metrics::WorkerMetrics;
use hasten_proto::grpc_tls;
use hasten_proto::health::readiness_health;
use hasten_proto::v1::generation_server::GenerationServer;
use hasten_rag::{LmBackend, LocalLm};
use serde::Serialize;

#[derive(Parser)]
#[command(
    name = "lm-worker",
    version,
    about = "Hasten generation worker: answers over documents the edge retrieved"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the `Generation` gRPC service.
    Serve(ServeArgs),
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
    /// GGUF model that writes standard answers and verifies speculative drafts (required).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    lm_model: Option<PathBuf>,
    /// Small GGUF model that writes Speculative RAG's drafts [default: lm_model].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    lm_drafter: Option<PathBuf>,
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
    let command = Cli::command().mut_subcommand("serve", help_with_defaults::<WorkerConfig>);
    match parse_command::<Cli>(command).command {
        Command::Serve(args) => serve(args).await,
    }
}

async fn serve(args: ServeArgs) -> Result<()> {
    let Some(config) = resolve_config::<WorkerConfig, _>(&args.source, "HASTEN_WORKER_", &args)?
    else {
        return Ok(());
    };
    let _traces = hasten_core::logging::init_with_traces(
        config.log_format,
        config.otlp_endpoint.as_deref(),
        "hasten-lm-worker",
    )?;
    let mutual = config.tls.load_mutual()?;
    let model = config
        .lm_model
        .clone()
        .context("configuration: `lm_model` is required")?;
    let drafter = config.lm_drafter.clone().unwrap_or_else(|| model.clone());
    let started = Instant::now();
    let backend = LocalLm::load_with(&drafter, &model, config.lm_device, config.lm_weights)
        .context("loading the language models (`lm_model`, `lm_drafter`)")?;
    let info = backend.info();
    tracing::info!(
        verifier = %info.verifier,
        drafter = %info.drafter,
        device = %info.device,
        weights = %config.lm_weights,
        took_ms = started.elapsed().as_millis() as u64,
        "language models loaded"
    );

    let registry = hasten_core::metrics::registry()?;
    let metrics = Arc::new(WorkerMetrics::register(&registry)?);
    let grpc_tls_config = hasten_core::metrics::reloading_grpc_tls(&registry, mutual.as_ref())?;
    // Ready once serving: the models are loaded before the listener opens.
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
    let service = GenerationService::new(Arc::new(backend), config.queue, metrics);
    if mutual.is_none() {
        tracing::warn!("mutual TLS is off (no `tls_ca`): any client may generate, in plaintext");
    }
    let router = tonic::transport::Server::builder()
        .add_service(
            // Ten documents with their vectors are ~30 KB; this leaves room for long passages.
            GenerationServer::new(service).max_decoding_message_size(16 * 1024 * 1024),
        )
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
