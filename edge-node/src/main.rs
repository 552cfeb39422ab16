//! `edge-node`: serve HaS retrieval at the edge. This file is the command line; the
//! server is assembled in [`app`].

mod app;

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, CommandFactory, Parser, Subcommand};
use hasten_core::config::{
    ConfigSource, TlsConfig, help_with_defaults, parse_command, resolve_config,
};
use hasten_core::logging::LogArgs;
use hasten_edge_node::config::{EdgeConfig, moved_key};
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

// Flags only for what differs between processes that share one file; the rule is
// docs/configuration.md's "Flags". Each table of flags serialises as the configuration's
// table of the same name, its unset flags skipped.
#[derive(Args, Serialize)]
struct ServeArgs {
    #[command(flatten)]
    #[serde(skip)]
    source: ConfigSource,
    #[command(flatten)]
    #[serde(flatten)]
    log: LogArgs,
    /// Corpus bundle directory (the one the cloud serves).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    bundle: Option<PathBuf>,
    /// all-MiniLM-L6-v2 directory, shared by every binary through HASTEN_MODEL_DIR.
    #[arg(long, env = "HASTEN_MODEL_DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    model_dir: Option<PathBuf>,
    /// This edge's name in replicated entries.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    edge_id: Option<String>,
    /// Write the bound addresses as JSON to this file once serving.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    ready_file: Option<PathBuf>,
    #[command(flatten)]
    #[serde(flatten)]
    tls: TlsConfig,
    #[command(flatten)]
    server: ServerArgs,
    #[command(flatten)]
    cloud: CloudArgs,
    #[command(flatten)]
    retrieval: RetrievalArgs,
    #[command(flatten)]
    control_plane: ControlPlaneArgs,
    #[command(flatten)]
    answer: AnswerArgs,
    #[command(flatten)]
    kv: KvArgs,
    #[command(flatten)]
    engine: EngineArgs,
}

#[derive(Args, Serialize)]
struct ServerArgs {
    /// JSON API address.
    #[arg(long, id = "server.http_addr", value_name = "ADDR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    http_addr: Option<SocketAddr>,
    /// gRPC API address.
    #[arg(long, id = "server.grpc_addr", value_name = "ADDR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    grpc_addr: Option<SocketAddr>,
    /// Address of /v1/status, /metrics, /readyz, /healthz [default: the HTTP API's];
    /// required with --tenants-file.
    #[arg(long, id = "server.metrics_addr", value_name = "ADDR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    metrics_addr: Option<SocketAddr>,
    /// TOML file of tenants and their bearer tokens; without it the API is open.
    #[arg(long, id = "server.tenants_file", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    tenants_file: Option<PathBuf>,
}

#[derive(Args, Serialize)]
struct CloudArgs {
    /// Cloud index QUIC address, host:port.
    #[arg(long = "cloud-addr", id = "cloud.addr", value_name = "HOST:PORT")]
    #[serde(skip_serializing_if = "Option::is_none")]
    addr: Option<String>,
    /// TLS name of the cloud.
    #[arg(
        long = "cloud-server-name",
        id = "cloud.server_name",
        value_name = "NAME"
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    server_name: Option<String>,
    /// PEM certificate(s) to trust for the cloud.
    #[arg(long = "cloud-ca", id = "cloud.ca", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    ca: Option<PathBuf>,
}

#[derive(Args, Serialize)]
struct RetrievalArgs {
    /// Questions (one per line) fetched from the cloud and cached before serving.
    #[arg(long, id = "retrieval.warm_queries", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    warm_queries: Option<PathBuf>,
}

#[derive(Args, Serialize)]
struct ControlPlaneArgs {
    /// A control-plane node's gRPC address (repeat for each); replicates the cache.
    #[arg(
        long = "control-plane",
        id = "control_plane.nodes",
        value_name = "HOST:PORT"
    )]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    nodes: Vec<String>,
    /// File holding the control plane's shared token, for a control plane without mutual TLS.
    #[arg(
        long = "control-plane-token-file",
        id = "control_plane.token_file",
        value_name = "FILE"
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    token_file: Option<PathBuf>,
}

#[derive(Args, Serialize)]
struct AnswerArgs {
    /// GGUF model that answers /v1/answer (and verifies speculative drafts).
    #[arg(long = "lm-model", id = "answer.model", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<PathBuf>,
    /// Small GGUF model that writes Speculative RAG's drafts [default: --lm-model].
    #[arg(long = "lm-drafter", id = "answer.drafter", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    drafter: Option<PathBuf>,
    /// host:port of a generation worker (lm-worker) to answer with instead of --lm-model.
    #[arg(long = "lm-worker", id = "answer.worker", value_name = "HOST:PORT")]
    #[serde(skip_serializing_if = "Option::is_none")]
    worker: Option<String>,
}

#[derive(Args, Serialize)]
struct KvArgs {
    /// A FusionRAG KV worker's gRPC address (repeat for each) to answer with instead of
    /// --lm-model: retrieved documents go to it as chunk ids.
    #[arg(long = "kv-worker", id = "kv.workers", value_name = "HOST:PORT")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    workers: Vec<String>,
}

#[derive(Args, Serialize)]
struct EngineArgs {
    /// Base URL of an OpenAI-compatible engine to generate on (http://vllm:8000/v1).
    #[arg(long = "lm-engine-url", id = "engine.url", value_name = "URL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<String>,
    /// The model the engine serves, as its /v1/models names it.
    #[arg(long = "lm-engine-model", id = "engine.model", value_name = "MODEL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<String>,
    /// Engine that writes Speculative RAG's drafts (a smaller model) [default: --lm-engine-url].
    #[arg(
        long = "lm-engine-drafter-url",
        id = "engine.drafter_url",
        value_name = "URL"
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    drafter_url: Option<String>,
    /// The drafter engine's model [default: --lm-engine-model].
    #[arg(
        long = "lm-engine-drafter-model",
        id = "engine.drafter_model",
        value_name = "MODEL"
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    drafter_model: Option<String>,
    /// File holding the engine's API key (or set HASTEN_EDGE_ENGINE__API_KEY).
    #[arg(
        long = "lm-engine-api-key-file",
        id = "engine.api_key_file",
        value_name = "FILE"
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    api_key_file: Option<PathBuf>,
    /// PEM file of the CA that signed an https engine's certificate.
    #[arg(long = "lm-engine-ca", id = "engine.ca", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    ca: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> Result<()> {
    let command = Cli::command().mut_subcommand("serve", help_with_defaults::<EdgeConfig>);
    match parse_command::<Cli>(command).command {
        Command::Serve(args) => serve(args).await,
    }
}

async fn serve(args: ServeArgs) -> Result<()> {
    let config = match resolve_config::<EdgeConfig, _>(&args.source, "HASTEN_EDGE_", &args) {
        Ok(Some(config)) => config,
        Ok(None) => return Ok(()),
        Err(error) => {
            let moved = error
                .unknown_key()
                .and_then(|old| Some((old.to_string(), moved_key(old)?)));
            let error = anyhow::Error::from(error);
            return Err(match moved {
                Some((old, new)) => error.context(format!(
                    "configuration: `{old}` is `{new}` now: the edge's keys are grouped in \
                     tables (docs/configuration.md)"
                )),
                None => error,
            });
        }
    };
    let _traces = hasten_core::logging::init_with_traces(
        config.log_format,
        config.otlp_endpoint.as_deref(),
        "hasten-edge",
    )?;
    app::serve(config).await
}
