//! Configuration of `edge-node serve`: defaults < TOML file < `HASTEN_EDGE_*` env < flags <
//! `--set`. The keys are grouped in tables by what they configure; HaS defaults are the
//! paper's (section IV-A).

mod validate;

use std::net::SocketAddr;
use std::path::PathBuf;

use hasten_core::config::TlsConfig;
use hasten_core::encoder::DEFAULT_MODEL_DIR;
use hasten_core::logging::LogFormat;
use hasten_engine::ApiKey;
use hasten_lm::{DeviceKind, WeightFormat};
use hasten_rag::SpeculativeSettings;
use hasten_worker_api::kv::{DEFAULT_RATIO, FusionMode, KvRouting, Variant};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::has::VoteWeighting;
use crate::retrieval::RetrievalPolicy;

/// Where each key of the flat layout (before the keys were grouped in tables) went, so
/// that a file, variable or `--set` naming an old key is refused with its new name.
/// (`control_plane`, a list of nodes then, is the table now: its old form fails as a type
/// error naming it.)
pub const MOVED_KEYS: &[(&str, &str)] = &[
    ("http_addr", "server.http_addr"),
    ("grpc_addr", "server.grpc_addr"),
    ("metrics_addr", "server.metrics_addr"),
    ("tenants_file", "server.tenants_file"),
    ("max_connections", "server.max_connections"),
    (
        "max_connections_per_client",
        "server.max_connections_per_client",
    ),
    ("header_timeout_ms", "server.header_timeout_ms"),
    ("body_timeout_ms", "server.body_timeout_ms"),
    ("shutdown_grace_ms", "server.shutdown_grace_ms"),
    ("max_query_chars", "server.max_query_chars"),
    ("max_body_bytes", "server.max_body_bytes"),
    ("max_in_flight", "server.max_in_flight"),
    ("cloud_addr", "cloud.addr"),
    ("cloud_server_name", "cloud.server_name"),
    ("cloud_ca", "cloud.ca"),
    ("cloud_timeout_ms", "cloud.timeout_ms"),
    ("policy", "retrieval.policy"),
    ("k", "retrieval.k"),
    ("max_k", "retrieval.max_k"),
    ("semantic_threshold", "retrieval.semantic_threshold"),
    ("tau", "retrieval.tau"),
    ("validation_depth", "retrieval.validation_depth"),
    ("cache_capacity", "retrieval.cache_capacity"),
    ("fuzzy_candidates", "retrieval.fuzzy_candidates"),
    ("cache_candidates", "retrieval.cache_candidates"),
    ("fuzzy_channel", "retrieval.fuzzy_channel"),
    ("fuzzy_in_validation", "retrieval.fuzzy_in_validation"),
    ("fuzzy_in_draft", "retrieval.fuzzy_in_draft"),
    ("vote_weighting", "retrieval.vote_weighting"),
    ("require_matched_top", "retrieval.require_matched_top"),
    ("draft_with_matched", "retrieval.draft_with_matched"),
    ("hybrid_similarity", "retrieval.hybrid_similarity"),
    ("warm_queries", "retrieval.warm_queries"),
    ("corpus_fraction", "retrieval.corpus_fraction"),
    ("fuzzy_nlist", "retrieval.fuzzy_nlist"),
    ("fuzzy_nprobe", "retrieval.fuzzy_nprobe"),
    ("cache_nlist", "retrieval.cache_nlist"),
    ("cache_nprobe", "retrieval.cache_nprobe"),
    (
        "expose_matched_query_text",
        "retrieval.expose_matched_query_text",
    ),
    ("expose_draft_trace", "retrieval.expose_draft_trace"),
    ("control_plane_token_file", "control_plane.token_file"),
    ("lm_model", "answer.model"),
    ("lm_drafter", "answer.drafter"),
    ("lm_worker", "answer.worker"),
    ("lm_device", "answer.device"),
    ("lm_weights", "answer.weights"),
    ("answer_default_tokens", "answer.default_tokens"),
    ("answer_max_tokens", "answer.max_tokens"),
    ("answer_queue", "answer.queue"),
    ("answer_queue_per_tenant", "answer.queue_per_tenant"),
    ("chat_query_rewrite", "answer.chat_query_rewrite"),
    ("speculative_drafts", "answer.speculative_drafts"),
    ("speculative_clusters", "answer.speculative_clusters"),
    ("kv_workers", "kv.workers"),
    ("kv_pool", "kv.pool"),
    ("kv_mode", "kv.mode"),
    ("kv_recompute_ratio", "kv.recompute_ratio"),
    ("kv_variant", "kv.variant"),
    ("kv_routing", "kv.routing"),
    ("lm_engine_url", "engine.url"),
    ("lm_engine_model", "engine.model"),
    ("lm_engine_drafter_url", "engine.drafter_url"),
    ("lm_engine_drafter_model", "engine.drafter_model"),
    ("lm_engine_api_key", "engine.api_key"),
    ("lm_engine_api_key_file", "engine.api_key_file"),
    ("lm_engine_ca", "engine.ca"),
    ("lm_engine_timeout_ms", "engine.timeout_ms"),
    ("lm_engine_concurrency", "engine.concurrency"),
];

/// The new name of `key` when it is a key of the flat layout.
pub fn moved_key(key: &str) -> Option<&'static str> {
    MOVED_KEYS
        .iter()
        .find(|(old, _)| *old == key)
        .map(|(_, new)| *new)
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct EdgeConfig {
    /// Log lines as `text` or `json` (one object per line, with the request's id).
    pub log_format: LogFormat,
    /// OTLP/gRPC collector that spans are exported to (`http://otel-collector:4317`), so
    /// that a request is one trace across the processes it crosses; unset: no export.
    pub otlp_endpoint: Option<String>,
    /// Corpus bundle (the same one the cloud serves). Required.
    pub bundle: Option<PathBuf>,
    /// all-MiniLM-L6-v2 directory.
    pub model_dir: PathBuf,
    /// This edge's name in replicated entries.
    pub edge_id: String,
    /// When set, a JSON file with the bound addresses is written here once serving.
    pub ready_file: Option<PathBuf>,
    /// Mutual TLS: `tls_ca`, `tls_cert`, `tls_key` and `tls_extra_ca`, at the top level.
    #[serde(flatten)]
    pub tls: TlsConfig,
    /// The HTTP and gRPC listeners: addresses, tenants, and the limits that keep one client
    /// from starving the others.
    pub server: ServerConfig,
    /// The cloud index that answers fallbacks, over QUIC.
    pub cloud: CloudConfig,
    /// How queries are answered: HaS or a baseline, and HaS's channels and validation.
    pub retrieval: RetrievalConfig,
    /// The control plane that replicates the hot cache across edges.
    pub control_plane: ControlPlaneConfig,
    /// `/v1/answer` and chat: the generation backend in this process or on an `lm-worker`,
    /// and the limits of an answer.
    pub answer: AnswerConfig,
    /// Generation on FusionRAG KV workers (`kv-worker serve`). Exclusive with
    /// `answer.model`, `answer.worker` and `engine.url`.
    pub kv: KvConfig,
    /// Generation on an OpenAI-compatible engine the team runs. Exclusive with
    /// `answer.model`, `answer.worker` and `kv.workers`.
    pub engine: EngineConfig,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// JSON API address.
    pub http_addr: SocketAddr,
    /// gRPC API address.
    pub grpc_addr: SocketAddr,
    /// Address of the admin routes (`/v1/status`, `/metrics`, `/readyz`, `/healthz`); when
    /// absent they are served on `http_addr` too. Required with `tenants_file`: the status
    /// and metrics name every tenant and its traffic, which tenants must not read.
    pub metrics_addr: Option<SocketAddr>,
    /// TOML file mapping tenants to their bearer tokens (`[tenants] name = ["token", ...]`).
    /// When set, every request needs a token and each tenant has its own cache; when
    /// absent, the API is open and all requests share one cache.
    pub tenants_file: Option<PathBuf>,
    /// HTTP connections open at once; beyond it a new one is closed at once (idle sockets
    /// cannot exhaust the file descriptors).
    #[schemars(range(min = 1))]
    pub max_connections: usize,
    /// HTTP connections one client address may hold open at once (at most
    /// `max_connections`; unset, a quarter of it), so that one client's idle sockets cannot
    /// refuse every other client. Clients behind a proxy or load balancer that does not
    /// keep their address share the proxy's: raise it there.
    #[schemars(range(min = 1))]
    pub max_connections_per_client: Option<usize>,
    /// Longest a client may take to send a request's head, or to start the next request
    /// on an open connection, in milliseconds.
    #[schemars(range(min = 1))]
    pub header_timeout_ms: u64,
    /// Longest a request's body may take to arrive, in milliseconds.
    #[schemars(range(min = 1))]
    pub body_timeout_ms: u64,
    /// Longest requests and connections may take to finish after SIGTERM, in milliseconds.
    #[schemars(range(min = 1))]
    pub shutdown_grace_ms: u64,
    /// Longest query text accepted, in characters.
    #[schemars(range(min = 1))]
    pub max_query_chars: usize,
    /// Largest request body accepted, in bytes.
    #[schemars(range(min = 1))]
    pub max_body_bytes: usize,
    /// Requests answered at once; beyond it 429 / RESOURCE_EXHAUSTED at once instead of a
    /// growing queue. A fallback holds its slot for up to `cloud.timeout_ms`, so this
    /// bounds memory and tail latency while leaving far more concurrency than the encoder's
    /// cores can use.
    #[schemars(range(min = 1))]
    pub max_in_flight: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct CloudConfig {
    /// The cloud index's QUIC address, `HOST:PORT`: an IP address or a DNS name (resolved
    /// again whenever the edge reconnects).
    pub addr: String,
    /// TLS name on the cloud's certificate.
    pub server_name: String,
    /// PEM file of the certificate(s) to trust for the cloud (its CA, or its dev certificate)
    /// when mutual TLS is off; under mutual TLS the cloud is trusted through `tls_ca`.
    pub ca: PathBuf,
    /// Deadline of one cloud request in milliseconds, connection set-up included.
    #[schemars(range(min = 1))]
    pub timeout_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RetrievalConfig {
    /// `has` (speculate, validate, fall back), or a baseline: `cloud-only`, `edge-ivf`,
    /// `exact-cache`, `semantic-cache`.
    pub policy: RetrievalPolicy,
    /// Documents returned when a request gives no k (paper: 10).
    #[schemars(range(min = 1))]
    pub k: usize,
    /// Largest k a request may ask for.
    #[schemars(range(min = 1))]
    pub max_k: usize,
    /// Cosine similarity at which `semantic-cache` reuses a cached result (RedisVL's default
    /// distance threshold 0.1).
    #[schemars(range(min = -1.0, max = 1.0))]
    pub semantic_threshold: f32,
    /// Homology threshold: share of the validated draft documents one cached query must
    /// hold. Chosen on the tuning side of the subject split with `validation_depth` 20
    /// (docs/benchmarks/retrieval.md): the paper's 0.2 lost 1.9 points of DHR there.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub tau: f64,
    /// Documents of a draft that are validated, and of a fallback that are cached, whatever
    /// k a request asks for (paper: k = 10; below ~5 one shared document would accept a
    /// draft). 20 on the tuning split cut HaS's DHR loss at tau 0.4 from 0.49 to 0.20
    /// points for 0.7 points of acceptance: cached results hold the answers a paraphrase
    /// misses at 10, and tau moves in steps of 0.05.
    #[schemars(range(min = 1))]
    pub validation_depth: usize,
    /// Cached queries per tenant, FIFO (paper: 5,000), for an edge without a control plane.
    /// With one, the control plane's replicated capacity decides every eviction and this
    /// key is not used.
    #[schemars(range(min = 1))]
    pub cache_capacity: usize,
    /// Candidates from the fuzzy channel before the exact re-rank (reference: 5 x k = 50).
    #[schemars(range(min = 1))]
    pub fuzzy_candidates: usize,
    /// Candidates from the cache channel before the exact re-rank: its PQ scores are
    /// approximate (the reference re-ranks 50 PQ candidates exactly in its service).
    #[schemars(range(min = 1))]
    pub cache_candidates: usize,
    /// Whether the fuzzy channel runs (off for the paper's ablation).
    pub fuzzy_channel: bool,
    /// Whether the fuzzy channel's documents take part in homology validation. Off is the
    /// paper's ablation "fuzzy channel removed from validation" (run it with a cache warmed
    /// by `warm_queries`: from an empty cache, validation on cache-channel documents alone
    /// matches every query to the first cached one).
    pub fuzzy_in_validation: bool,
    /// Whether the fuzzy channel's documents join served drafts. Off is the paper's
    /// ablation "fuzzy channel removed from draft enhancement".
    pub fuzzy_in_draft: bool,
    /// How a shared document's vote weighs: `count` (one each, the paper) or `rank` (by its
    /// rank in the draft, 1 / log2(rank + 2)); tau then bounds the weighted share.
    pub vote_weighting: VoteWeighting,
    /// A draft is accepted only if the validating query's best this many cached documents
    /// are all among its validated documents; 0 requires none.
    pub require_matched_top: usize,
    /// Re-rank an accepted draft together with the validating query's cached documents
    /// before serving it: the cache channel's approximate search misses some of them, and
    /// they were most of what accepted drafts lost (on the tuning split: DHR drop 1.35 to
    /// 0.49 points at tau 0.4, acceptance unchanged). Off is the paper's draft.
    pub draft_with_matched: bool,
    /// Hybrid validation (HaS only): only cached queries at least this cosine-similar to
    /// the query vote, and a query whose nearest cached query reaches
    /// `semantic_threshold` is accepted whatever the votes. Keeps each cached query's
    /// vector (1.5 KB). Absent: homology alone (the paper).
    #[schemars(range(min = -1.0, max = 1.0))]
    pub hybrid_similarity: Option<f32>,
    /// A file of questions, one per line, that the edge fetches from the cloud and caches
    /// before it serves (blank lines skipped): a fresh edge starts with yesterday's
    /// questions, or an evaluation with a pre-filled cache. Only with a shared cache (no
    /// `server.tenants_file`).
    pub warm_queries: Option<PathBuf>,
    /// Share of the corpus the edge holds, in (0, 1]: its fuzzy channel and document store
    /// keep only that share (the same for every edge with the same fraction); documents of
    /// cached entries outside it come from the cloud by id.
    #[schemars(range(max = 1.0), extend("exclusiveMinimum" = 0.0))]
    pub corpus_fraction: f64,
    /// IVF lists of the fuzzy channel; scaled to the corpus when absent (4 x sqrt(n)).
    #[schemars(range(min = 1))]
    pub fuzzy_nlist: Option<usize>,
    /// Lists probed by the fuzzy channel; when absent the reference's fraction 64/8192,
    /// but at least ~8,192 codes scanned.
    #[schemars(range(min = 1))]
    pub fuzzy_nprobe: Option<usize>,
    /// IVF lists of the cache channel; scaled to the corpus when absent.
    #[schemars(range(min = 1))]
    pub cache_nlist: Option<usize>,
    /// Lists probed by the cache channel; a sixteenth of the lists when absent.
    #[schemars(range(min = 1))]
    pub cache_nprobe: Option<usize>,
    /// Show, in replies, the text of the cached query an accepted draft was validated by.
    /// It is another user's question (of the same tenant), so it is off unless the operator
    /// wants it (evaluations use it to judge acceptances); the id and score always show.
    pub expose_matched_query_text: bool,
    /// Show, in `/v1/retrieve` replies, where each HaS draft came from: the document ids
    /// of the draft, of each channel's candidates and of the best cached query's result.
    /// They tell what other users' questions cached, so it is off unless the operator
    /// evaluates HaS's rules (`hasten-loadtest eval` turns it on).
    pub expose_draft_trace: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ControlPlaneConfig {
    /// Control-plane nodes (gRPC host:port). When set, fallback results are replicated
    /// through the control plane and the edge follows its committed stream; when empty the
    /// edge caches only what it fetched itself.
    pub nodes: Vec<String>,
    /// File holding the control plane's shared token (`hasten_proto::auth`), sent with
    /// every control-plane call; for control planes that require one (no mutual TLS).
    pub token_file: Option<PathBuf>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct AnswerConfig {
    /// GGUF model (llama or qwen2) that answers `/v1/answer`: it writes standard answers and
    /// verifies speculative drafts. Without it (nor `worker`, `kv.workers` or `engine.url`)
    /// `/v1/answer` answers 503.
    pub model: Option<PathBuf>,
    /// Small GGUF model that writes Speculative RAG's drafts; `model` when absent.
    pub drafter: Option<PathBuf>,
    /// `host:port` of a generation worker (`lm-worker`) to answer with instead of models in
    /// this process; dialled over mutual TLS when the edge has it (`tls_ca`).
    pub worker: Option<String>,
    /// `cpu`, or `cuda` in a build with the `cuda` feature.
    pub device: DeviceKind,
    /// How the models' weights are held: `fast` (the file's blocks through Hasten's CPU
    /// kernels for decoding; prompts through candle's K-quant kernel or an f32 copy; the
    /// fastest on CPU), `q8_0`, `f32` or `as_stored`.
    pub weights: WeightFormat,
    /// Tokens an answer may have when the request names no `max_tokens`.
    #[schemars(range(min = 1))]
    pub default_tokens: usize,
    /// Largest `max_tokens` a request may ask for.
    #[schemars(range(min = 1, max = hasten_rag::MAX_NEW_TOKENS))]
    pub max_tokens: usize,
    /// Answers waiting for the language model behind the one generating; beyond it 429.
    pub queue: usize,
    /// Answers one tenant may have waiting or generating at once; beyond it 429, so one
    /// client cannot fill the queue. Unset: the queue alone bounds a tenant.
    #[schemars(range(min = 1))]
    pub queue_per_tenant: Option<usize>,
    /// Whether the model rewrites a chat's follow-up question into a standalone one for
    /// retrieval (one short generation per follow-up); off: the last user message, with
    /// the previous user turn when it is short or refers back.
    pub chat_query_rewrite: bool,
    /// Speculative RAG: drafts per answer (paper: m = 5).
    #[schemars(range(min = 1, max = hasten_rag::MAX_DRAFTS))]
    pub speculative_drafts: usize,
    /// Speculative RAG: document clusters, one document of each per draft (paper: k = 2).
    #[schemars(range(min = 1))]
    pub speculative_clusters: usize,
    /// Speculative RAG: most tokens a draft (answer and rationale) may take. Drafting and
    /// verifying cost grows with it; a draft also ends where its rationale's line ends. 32
    /// measured faster than 96 at no lower F1 (HotpotQA-100, 1.5B verifier).
    #[schemars(range(min = 1))]
    pub speculative_draft_tokens: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct KvConfig {
    /// `host:port` of FusionRAG KV workers to answer with, over the chunk KV they
    /// precomputed for this edge's corpus version; dialled over mutual TLS when the edge
    /// has it.
    pub workers: Vec<String>,
    /// `<namespace>/<name>` of the KvWorkerPool whose assignment the control plane publishes
    /// (its operator's): the KV workers follow it, `workers` serving until the first one
    /// arrives. Needs `workers` and `control_plane.nodes`.
    pub pool: Option<String>,
    /// How KV workers prefill: `fusionrag`, `cacheblend`, `full-reuse` or `full-prefill`.
    pub mode: FusionMode,
    /// Share of the chunk tokens a KV worker recomputes (`fusionrag`, `cacheblend`).
    #[schemars(range(min = 0.0, max = 1.0))]
    pub recompute_ratio: f64,
    /// Which stored chunk KV the workers read: `similarity` or `full-reuse`.
    pub variant: Variant,
    /// Which worker a request goes to: `kv-aware` (the one owning most of its chunks, by
    /// rendezvous hashing of chunk ids over `workers`, so every edge given the same list
    /// agrees) or `round-robin`.
    pub routing: KvRouting,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct EngineConfig {
    /// Base URL of an OpenAI-compatible engine (vLLM, SGLang, TGI, Ollama, llama.cpp's
    /// server) to generate answers on, `/v1` included (`http://vllm:8000/v1`).
    pub url: Option<String>,
    /// The model the engine serves, as its `/v1/models` names it. Required with `url`.
    pub model: Option<String>,
    /// An OpenAI-compatible engine that writes Speculative RAG's drafts (a smaller model
    /// than `model`); `url` when absent.
    pub drafter_url: Option<String>,
    /// The drafter engine's model; `model` when absent.
    pub drafter_model: Option<String>,
    /// The engine's API key, sent as a bearer token and never logged; better set through
    /// `HASTEN_EDGE_ENGINE__API_KEY` or `api_key_file` than written in a file.
    pub api_key: Option<ApiKey>,
    /// File holding the engine's API key (a mounted Secret).
    pub api_key_file: Option<PathBuf>,
    /// PEM file of the CA that signed an `https` engine's certificate, beside the system's.
    pub ca: Option<PathBuf>,
    /// Longest wait for the engine's next bytes (connection, first token, each chunk);
    /// beyond it the answer fails as 503.
    #[schemars(range(min = 1))]
    pub timeout_ms: u64,
    /// Answers sent to the engine at once (it batches them); more wait in `answer.queue`.
    #[schemars(range(min = 1))]
    pub concurrency: usize,
}

impl Default for EdgeConfig {
    fn default() -> Self {
        Self {
            log_format: LogFormat::default(),
            otlp_endpoint: None,
            bundle: None,
            model_dir: PathBuf::from(DEFAULT_MODEL_DIR),
            edge_id: "edge".into(),
            ready_file: None,
            tls: TlsConfig::default(),
            server: ServerConfig::default(),
            cloud: CloudConfig::default(),
            retrieval: RetrievalConfig::default(),
            control_plane: ControlPlaneConfig::default(),
            answer: AnswerConfig::default(),
            kv: KvConfig::default(),
            engine: EngineConfig::default(),
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            http_addr: SocketAddr::from(([127, 0, 0, 1], 7200)),
            grpc_addr: SocketAddr::from(([127, 0, 0, 1], 7201)),
            metrics_addr: None,
            tenants_file: None,
            // Far above what 2 cores serve (a few thousand requests a second on a few dozen
            // connections), far below a process's file descriptor limit.
            max_connections: 4096,
            max_connections_per_client: None,
            header_timeout_ms: 10_000,
            body_timeout_ms: 10_000,
            // Within Kubernetes' default 30 s termination grace, with room to spare.
            shutdown_grace_ms: 10_000,
            // MiniLM reads at most 256 tokens; 2,000 characters is well past that, and
            // anything longer is not a retrieval query.
            max_query_chars: 2_000,
            // A 384-d vector in JSON is ~8 KB; 64 KiB leaves room without inviting abuse.
            max_body_bytes: 64 * 1024,
            max_in_flight: 512,
        }
    }
}

impl ServerConfig {
    /// `max_connections_per_client`, or a quarter of `max_connections` when unset: one
    /// client cannot hold them all, and a proxy in front of many still gets a good share.
    pub fn connections_per_client(&self) -> usize {
        self.max_connections_per_client
            .unwrap_or((self.max_connections / 4).max(1))
    }
}

impl Default for CloudConfig {
    fn default() -> Self {
        Self {
            addr: "127.0.0.1:7100".into(),
            server_name: "localhost".into(),
            ca: PathBuf::from("run/cloud-dev-cert.pem"),
            timeout_ms: 2_000,
        }
    }
}

impl Default for RetrievalConfig {
    fn default() -> Self {
        Self {
            policy: RetrievalPolicy::Has,
            k: 10,
            max_k: 100,
            semantic_threshold: 0.9,
            tau: 0.4,
            validation_depth: 20,
            cache_capacity: 5_000,
            fuzzy_candidates: 50,
            cache_candidates: 50,
            fuzzy_channel: true,
            fuzzy_in_validation: true,
            fuzzy_in_draft: true,
            vote_weighting: VoteWeighting::Count,
            require_matched_top: 0,
            draft_with_matched: true,
            hybrid_similarity: None,
            warm_queries: None,
            corpus_fraction: 1.0,
            fuzzy_nlist: None,
            fuzzy_nprobe: None,
            cache_nlist: None,
            cache_nprobe: None,
            expose_matched_query_text: false,
            expose_draft_trace: false,
        }
    }
}

impl Default for AnswerConfig {
    fn default() -> Self {
        Self {
            model: None,
            drafter: None,
            worker: None,
            device: DeviceKind::Cpu,
            weights: WeightFormat::Fast,
            default_tokens: 64,
            max_tokens: 512,
            // A 135M model answers in about a second on 2 cores: 16 waiting is ~15 s.
            queue: 16,
            queue_per_tenant: None,
            chat_query_rewrite: false,
            speculative_drafts: 5,
            speculative_clusters: 2,
            speculative_draft_tokens: SpeculativeSettings::default().draft_tokens,
        }
    }
}

impl Default for KvConfig {
    fn default() -> Self {
        Self {
            workers: Vec::new(),
            pool: None,
            mode: FusionMode::FusionRag,
            recompute_ratio: DEFAULT_RATIO,
            variant: Variant::Similarity,
            routing: KvRouting::KvAware,
        }
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            url: None,
            model: None,
            drafter_url: None,
            drafter_model: None,
            api_key: None,
            api_key_file: None,
            ca: None,
            // A long prompt on a busy engine takes seconds before its first token.
            timeout_ms: 30_000,
            concurrency: 8,
        }
    }
}

#[cfg(test)]
mod tests;
