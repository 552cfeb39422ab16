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
use hasten_edge_node::config::EdgeConfig;
use hasten_edge_node::has::VoteWeighting;
use hasten_edge_node::retrieval::RetrievalPolicy;
use hasten_worker_api::kv::FusionMode;
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
    /// JSON API address.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    http_addr: Option<SocketAddr>,
    /// gRPC API address.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    grpc_addr: Option<SocketAddr>,
    /// Address of /v1/status, /metrics, /readyz, /healthz [default: the HTTP API's];
    /// required with --tenants-file.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    metrics_addr: Option<SocketAddr>,
    /// HTTP connections open at once.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    max_connections: Option<usize>,
    /// HTTP connections one client address may hold open [default: max_connections / 4].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    max_connections_per_client: Option<usize>,
    /// Milliseconds to send a request's head, or to start the next one.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    header_timeout_ms: Option<u64>,
    /// Milliseconds for a request's body to arrive.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    body_timeout_ms: Option<u64>,
    /// Milliseconds requests may take to finish after SIGTERM.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    shutdown_grace_ms: Option<u64>,
    /// Cloud index QUIC address.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    cloud_addr: Option<String>,
    /// TLS name of the cloud.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    cloud_server_name: Option<String>,
    /// PEM certificate(s) to trust for the cloud.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    cloud_ca: Option<PathBuf>,
    #[command(flatten)]
    #[serde(flatten)]
    tls: TlsConfig,
    /// Cloud request deadline in milliseconds.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    cloud_timeout_ms: Option<u64>,
    /// has | cloud-only | edge-ivf | exact-cache | semantic-cache.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    policy: Option<RetrievalPolicy>,
    /// Cosine similarity at which semantic-cache reuses a result.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    semantic_threshold: Option<f32>,
    /// Default k.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    k: Option<usize>,
    /// Homology threshold tau.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    tau: Option<f64>,
    /// Draft documents validated and fallback documents cached, whatever k.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    validation_depth: Option<usize>,
    /// Cached queries per tenant, FIFO, without a control plane.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_capacity: Option<usize>,
    /// Fuzzy-channel candidates re-ranked exactly.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    fuzzy_candidates: Option<usize>,
    /// Cache-channel candidates re-ranked exactly.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_candidates: Option<usize>,
    /// Run the fuzzy channel.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    fuzzy_channel: Option<bool>,
    /// Fuzzy-channel documents take part in validation.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    fuzzy_in_validation: Option<bool>,
    /// Fuzzy-channel documents join served drafts.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    fuzzy_in_draft: Option<bool>,
    /// How shared documents' votes weigh: count or rank.
    #[arg(long, value_enum)]
    #[serde(skip_serializing_if = "Option::is_none")]
    vote_weighting: Option<VoteWeighting>,
    /// The validating query's best N cached documents must be in the draft.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    require_matched_top: Option<usize>,
    /// Re-rank accepted drafts with the validating query's documents.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    draft_with_matched: Option<bool>,
    /// Hybrid validation: only cached queries this similar vote [default: none].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    hybrid_similarity: Option<f32>,
    /// Questions (one per line) fetched from the cloud and cached before serving.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    warm_queries: Option<PathBuf>,
    /// Share of the corpus this edge holds (fuzzy channel and documents), (0, 1].
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
    /// Requests answered at once; beyond it 429 / RESOURCE_EXHAUSTED.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    max_in_flight: Option<usize>,
    /// TOML file of tenants and their bearer tokens; without it the API is open.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    tenants_file: Option<PathBuf>,
    /// Show the matched cached query's text in replies (another user's question).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    expose_matched_query_text: Option<bool>,
    /// Show where each HaS draft came from in replies (document ids of the channels and
    /// the best cached query).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    expose_draft_trace: Option<bool>,
    /// This edge's name in replicated entries.
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
    /// fusionrag, cacheblend, full-reuse or full-prefill.
    #[arg(long, value_parser = parse_fusion_mode)]
    #[serde(skip_serializing_if = "Option::is_none")]
    kv_mode: Option<FusionMode>,
    /// Share of chunk tokens the KV worker recomputes.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    kv_recompute_ratio: Option<f64>,
    /// similarity or full-reuse: which stored chunk KV the workers read.
    #[arg(long, value_parser = parse_variant)]
    #[serde(skip_serializing_if = "Option::is_none")]
    kv_variant: Option<Variant>,
    /// kv-aware or round-robin: which KV worker a request goes to.
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
    /// Longest wait for the engine's next bytes, in ms.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    lm_engine_timeout_ms: Option<u64>,
    /// Answers sent to the engine at once.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    lm_engine_concurrency: Option<usize>,
    /// cpu, or cuda in a build with the `cuda` feature.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    lm_device: Option<hasten_lm::DeviceKind>,
    /// fast, q8_0, f32 or as_stored.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    lm_weights: Option<hasten_lm::WeightFormat>,
}

#[tokio::main]
async fn main() -> Result<()> {
    let command = Cli::command().mut_subcommand("serve", help_with_defaults::<EdgeConfig>);
    match parse_command::<Cli>(command).command {
        Command::Serve(args) => serve(args).await,
    }
}

async fn serve(args: ServeArgs) -> Result<()> {
    let Some(config) = resolve_config::<EdgeConfig, _>(&args.source, "HASTEN_EDGE_", &args)? else {
        return Ok(());
    };
    let _traces = hasten_core::logging::init_with_traces(
        config.log_format,
        config.otlp_endpoint.as_deref(),
        "hasten-edge",
    )?;
    app::serve(config).await
}

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
