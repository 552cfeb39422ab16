//! Configuration of `edge-node serve`: defaults < TOML file < `HASTEN_EDGE_*` env < flags.
//! HaS defaults are the paper's (section IV-A).

use std::net::SocketAddr;
use std::path::PathBuf;

use hasten_core::config::{ConfigError, TlsConfig, Validate};
use hasten_core::encoder::DEFAULT_MODEL_DIR;
use hasten_core::logging::LogFormat;
use hasten_engine::ApiKey;
use hasten_lm::{DeviceKind, WeightFormat};
use hasten_worker_api::kv::{DEFAULT_RATIO, FusionMode, KvRouting, Variant};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::has::VoteWeighting;
use crate::retrieval::RetrievalPolicy;

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
    /// JSON API address.
    pub http_addr: SocketAddr,
    /// gRPC API address.
    pub grpc_addr: SocketAddr,
    /// Address of the admin routes (`/v1/status`, `/metrics`, `/readyz`, `/healthz`); when
    /// absent they are served on `http_addr` too. Required with `tenants_file`: the status
    /// and metrics name every tenant and its traffic, which tenants must not read.
    pub metrics_addr: Option<SocketAddr>,
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
    /// The cloud index's QUIC address, `HOST:PORT`: an IP address or a DNS name (resolved
    /// again whenever the edge reconnects).
    pub cloud_addr: String,
    /// TLS name on the cloud's certificate.
    pub cloud_server_name: String,
    /// PEM file of the certificate(s) to trust for the cloud (its CA, or its dev certificate)
    /// when mutual TLS is off; under mutual TLS the cloud is trusted through `tls_ca`.
    pub cloud_ca: PathBuf,
    /// Mutual TLS: `tls_ca`, `tls_cert`, `tls_key` and `tls_extra_ca`, at the top level.
    #[serde(flatten)]
    pub tls: TlsConfig,
    /// Deadline of one cloud request in milliseconds, connection set-up included.
    #[schemars(range(min = 1))]
    pub cloud_timeout_ms: u64,
    /// `has` (speculate, validate, fall back), or a baseline: `cloud-only`, `edge-ivf`,
    /// `exact-cache`, `semantic-cache`.
    pub policy: RetrievalPolicy,
    /// Cosine similarity at which `semantic-cache` reuses a cached result (RedisVL's default
    /// distance threshold 0.1).
    #[schemars(range(min = -1.0, max = 1.0))]
    pub semantic_threshold: f32,
    /// Documents returned when a request gives no k (paper: 10).
    #[schemars(range(min = 1))]
    pub k: usize,
    /// Largest k a request may ask for.
    #[schemars(range(min = 1))]
    pub max_k: usize,
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
    /// `tenants_file`).
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
    /// Longest query text accepted, in characters.
    #[schemars(range(min = 1))]
    pub max_query_chars: usize,
    /// Largest request body accepted, in bytes.
    #[schemars(range(min = 1))]
    pub max_body_bytes: usize,
    /// Requests answered at once; beyond it 429 / RESOURCE_EXHAUSTED at once instead of a
    /// growing queue. A fallback holds its slot for up to `cloud_timeout_ms`, so this bounds
    /// memory and tail latency while leaving far more concurrency than the encoder's cores
    /// can use.
    #[schemars(range(min = 1))]
    pub max_in_flight: usize,
    /// Control-plane nodes (gRPC host:port). When set, fallback results are replicated
    /// through the control plane and the edge follows its committed stream; when empty the
    /// edge caches only what it fetched itself.
    pub control_plane: Vec<String>,
    /// File holding the control plane's shared token (`hasten_proto::auth`), sent with
    /// every control-plane call; for control planes that require one (no mutual TLS).
    pub control_plane_token_file: Option<PathBuf>,
    /// This edge's name in replicated entries.
    pub edge_id: String,
    /// TOML file mapping tenants to their bearer tokens (`[tenants] name = ["token", ...]`).
    /// When set, every request needs a token and each tenant has its own cache; when
    /// absent, the API is open and all requests share one cache.
    pub tenants_file: Option<PathBuf>,
    /// Show, in replies, the text of the cached query an accepted draft was validated by.
    /// It is another user's question (of the same tenant), so it is off unless the operator
    /// wants it (evaluations use it to judge acceptances); the id and score always show.
    pub expose_matched_query_text: bool,
    /// Show, in `/v1/retrieve` replies, where each HaS draft came from: the document ids
    /// of the draft, of each channel's candidates and of the best cached query's result.
    /// They tell what other users' questions cached, so it is off unless the operator
    /// evaluates HaS's rules (`hasten-loadtest eval` turns it on).
    pub expose_draft_trace: bool,
    /// When set, a JSON file with the bound addresses is written here once serving.
    pub ready_file: Option<PathBuf>,
    /// GGUF model (llama or qwen2) that answers `/v1/answer`: it writes standard answers and
    /// verifies speculative drafts. Without it `/v1/answer` answers 503.
    pub lm_model: Option<PathBuf>,
    /// Small GGUF model that writes Speculative RAG's drafts; `lm_model` when absent.
    pub lm_drafter: Option<PathBuf>,
    /// `host:port` of a generation worker (`lm-worker`) to answer with instead of models in
    /// this process; dialled over mutual TLS when the edge has it (`tls_ca`).
    pub lm_worker: Option<String>,
    /// `host:port` of FusionRAG KV workers (`kv-worker serve`) to answer with, over the
    /// chunk KV they precomputed for this edge's corpus version; dialled over mutual TLS
    /// when the edge has it. Exclusive with `lm_model` and `lm_worker`.
    pub kv_workers: Vec<String>,
    /// `<namespace>/<name>` of the KvWorkerPool whose assignment the control plane publishes
    /// (its operator's): the KV workers follow it, `kv_workers` serving until the first one
    /// arrives. Needs `kv_workers` and `control_plane`.
    pub kv_pool: Option<String>,
    /// How KV workers prefill: `fusionrag`, `cacheblend`, `full-reuse` or `full-prefill`.
    pub kv_mode: FusionMode,
    /// Share of the chunk tokens a KV worker recomputes (`fusionrag`, `cacheblend`).
    #[schemars(range(min = 0.0, max = 1.0))]
    pub kv_recompute_ratio: f64,
    /// Which stored chunk KV the workers read: `similarity` or `full-reuse`.
    pub kv_variant: Variant,
    /// Which worker a request goes to: `kv-aware` (the one owning most of its chunks, by
    /// rendezvous hashing of chunk ids over `kv_workers`, so every edge given the same list
    /// agrees) or `round-robin`.
    pub kv_routing: KvRouting,
    /// Base URL of an OpenAI-compatible engine (vLLM, SGLang, TGI, Ollama, llama.cpp's
    /// server) to generate answers on, `/v1` included (`http://vllm:8000/v1`). Exclusive with
    /// `lm_model`, `lm_worker` and `kv_workers`.
    pub lm_engine_url: Option<String>,
    /// The model the engine serves, as its `/v1/models` names it. Required with
    /// `lm_engine_url`.
    pub lm_engine_model: Option<String>,
    /// An OpenAI-compatible engine that writes Speculative RAG's drafts (a smaller model
    /// than `lm_engine_model`); `lm_engine_url` when absent.
    pub lm_engine_drafter_url: Option<String>,
    /// The drafter engine's model; `lm_engine_model` when absent.
    pub lm_engine_drafter_model: Option<String>,
    /// The engine's API key, sent as a bearer token and never logged; better set through
    /// `HASTEN_EDGE_LM_ENGINE_API_KEY` or `lm_engine_api_key_file` than written in a file.
    pub lm_engine_api_key: Option<ApiKey>,
    /// File holding the engine's API key (a mounted Secret).
    pub lm_engine_api_key_file: Option<PathBuf>,
    /// PEM file of the CA that signed an `https` engine's certificate, beside the system's.
    pub lm_engine_ca: Option<PathBuf>,
    /// Longest wait for the engine's next bytes (connection, first token, each chunk);
    /// beyond it the answer fails as 503.
    #[schemars(range(min = 1))]
    pub lm_engine_timeout_ms: u64,
    /// Answers sent to the engine at once (it batches them); more wait in `answer_queue`.
    #[schemars(range(min = 1))]
    pub lm_engine_concurrency: usize,
    /// `cpu`, or `cuda` in a build with the `cuda` feature.
    pub lm_device: DeviceKind,
    /// How the models' weights are held: `fast` (Q8_0 for decoding, f32 for prompts; the
    /// fastest on CPU), `q8_0`, `f32` or `as_stored`.
    pub lm_weights: WeightFormat,
    /// Tokens an answer may have when the request names no `max_tokens`.
    #[schemars(range(min = 1))]
    pub answer_default_tokens: usize,
    /// Largest `max_tokens` a request may ask for.
    #[schemars(range(min = 1, max = hasten_rag::MAX_NEW_TOKENS))]
    pub answer_max_tokens: usize,
    /// Answers waiting for the language model behind the one generating; beyond it 429.
    pub answer_queue: usize,
    /// Answers one tenant may have waiting or generating at once; beyond it 429, so one
    /// client cannot fill the queue. Unset: the queue alone bounds a tenant.
    #[schemars(range(min = 1))]
    pub answer_queue_per_tenant: Option<usize>,
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
}

/// `HOST:PORT`, the host an IP address (IPv6 in brackets) or a name, the port a number.
fn is_host_port(addr: &str) -> bool {
    addr.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty()
            && !host.contains("://")
            && !host.contains('/')
            && port.parse::<u16>().is_ok()
    })
}

impl Default for EdgeConfig {
    fn default() -> Self {
        Self {
            log_format: LogFormat::default(),
            otlp_endpoint: None,
            bundle: None,
            model_dir: PathBuf::from(DEFAULT_MODEL_DIR),
            http_addr: SocketAddr::from(([127, 0, 0, 1], 7200)),
            grpc_addr: SocketAddr::from(([127, 0, 0, 1], 7201)),
            metrics_addr: None,
            // Far above what 2 cores serve (a few thousand requests a second on a few dozen
            // connections), far below a process's file descriptor limit.
            max_connections: 4096,
            max_connections_per_client: None,
            header_timeout_ms: 10_000,
            body_timeout_ms: 10_000,
            // Within Kubernetes' default 30 s termination grace, with room to spare.
            shutdown_grace_ms: 10_000,
            cloud_addr: "127.0.0.1:7100".into(),
            cloud_server_name: "localhost".into(),
            cloud_ca: PathBuf::from("run/cloud-dev-cert.pem"),
            tls: TlsConfig::default(),
            cloud_timeout_ms: 2_000,
            policy: RetrievalPolicy::Has,
            semantic_threshold: 0.9,
            k: 10,
            max_k: 100,
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
            // MiniLM reads at most 256 tokens; 2,000 characters is well past that, and
            // anything longer is not a retrieval query.
            max_query_chars: 2_000,
            // A 384-d vector in JSON is ~8 KB; 64 KiB leaves room without inviting abuse.
            max_body_bytes: 64 * 1024,
            max_in_flight: 512,
            control_plane: Vec::new(),
            control_plane_token_file: None,
            edge_id: "edge".into(),
            tenants_file: None,
            expose_matched_query_text: false,
            expose_draft_trace: false,
            ready_file: None,
            lm_model: None,
            lm_drafter: None,
            lm_worker: None,
            kv_workers: Vec::new(),
            kv_pool: None,
            kv_mode: FusionMode::FusionRag,
            kv_recompute_ratio: DEFAULT_RATIO,
            kv_variant: Variant::Similarity,
            kv_routing: KvRouting::KvAware,
            lm_engine_url: None,
            lm_engine_model: None,
            lm_engine_drafter_url: None,
            lm_engine_drafter_model: None,
            lm_engine_api_key: None,
            lm_engine_api_key_file: None,
            lm_engine_ca: None,
            // A long prompt on a busy engine takes seconds before its first token.
            lm_engine_timeout_ms: 30_000,
            lm_engine_concurrency: 8,
            lm_device: DeviceKind::Cpu,
            lm_weights: WeightFormat::Fast,
            answer_default_tokens: 64,
            answer_max_tokens: 512,
            // A 135M model answers in about a second on 2 cores: 16 waiting is ~15 s.
            answer_queue: 16,
            answer_queue_per_tenant: None,
            chat_query_rewrite: false,
            speculative_drafts: 5,
            speculative_clusters: 2,
        }
    }
}

impl EdgeConfig {
    /// `max_connections_per_client`, or a quarter of `max_connections` when unset: one
    /// client cannot hold them all, and a proxy in front of many still gets a good share.
    pub fn connections_per_client(&self) -> usize {
        self.max_connections_per_client
            .unwrap_or((self.max_connections / 4).max(1))
    }

    /// The engine keys: a URL that can be called, a model, and no other generation backend.
    fn validate_engine(&self) -> Result<(), ConfigError> {
        for (key, value) in [
            ("lm_engine_timeout_ms", self.lm_engine_timeout_ms),
            ("lm_engine_concurrency", self.lm_engine_concurrency as u64),
        ] {
            if value == 0 {
                return Err(ConfigError::invalid(key, "must be at least 1"));
            }
        }
        let Some(url) = &self.lm_engine_url else {
            for (key, set) in [
                ("lm_engine_model", self.lm_engine_model.is_some()),
                (
                    "lm_engine_drafter_url",
                    self.lm_engine_drafter_url.is_some(),
                ),
                (
                    "lm_engine_drafter_model",
                    self.lm_engine_drafter_model.is_some(),
                ),
                ("lm_engine_api_key", self.lm_engine_api_key.is_some()),
                (
                    "lm_engine_api_key_file",
                    self.lm_engine_api_key_file.is_some(),
                ),
                ("lm_engine_ca", self.lm_engine_ca.is_some()),
            ] {
                if set {
                    return Err(ConfigError::invalid(
                        key,
                        "is set but `lm_engine_url` is not",
                    ));
                }
            }
            return Ok(());
        };
        for (key, set) in [
            ("lm_model", self.lm_model.is_some()),
            ("lm_worker", self.lm_worker.is_some()),
            ("kv_workers", !self.kv_workers.is_empty()),
        ] {
            if set {
                return Err(ConfigError::invalid(
                    "lm_engine_url",
                    format!("and `{key}` are both set: answer with one of them"),
                ));
            }
        }
        for (key, url) in [
            ("lm_engine_url", Some(url)),
            ("lm_engine_drafter_url", self.lm_engine_drafter_url.as_ref()),
        ] {
            if let Some(url) = url
                && !(url.starts_with("http://") || url.starts_with("https://"))
            {
                return Err(ConfigError::invalid(
                    key,
                    format!("`{url}` is not an http:// or https:// URL"),
                ));
            }
        }
        if self
            .lm_engine_model
            .as_deref()
            .is_none_or(|m| m.trim().is_empty())
        {
            return Err(ConfigError::invalid(
                "lm_engine_model",
                "is required with `lm_engine_url`: the model the engine serves",
            ));
        }
        if self.lm_engine_api_key.is_some() && self.lm_engine_api_key_file.is_some() {
            return Err(ConfigError::invalid(
                "lm_engine_api_key_file",
                "and `lm_engine_api_key` are both set: give the key once",
            ));
        }
        Ok(())
    }
}

impl Validate for EdgeConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        hasten_core::config::check_otlp_endpoint(self.otlp_endpoint.as_deref())?;
        if self.bundle.is_none() {
            return Err(ConfigError::invalid(
                "bundle",
                "is required: the corpus bundle directory the cloud serves",
            ));
        }
        if !(0.0..=1.0).contains(&self.tau) {
            return Err(ConfigError::invalid(
                "tau",
                format!("must be in [0, 1], got {}", self.tau),
            ));
        }
        if self.max_k == 0 || !(1..=self.max_k).contains(&self.k) {
            return Err(ConfigError::invalid(
                "k",
                format!("must be in 1..=max_k ({}), got {}", self.max_k, self.k),
            ));
        }
        if !(-1.0..=1.0).contains(&self.semantic_threshold) {
            return Err(ConfigError::invalid(
                "semantic_threshold",
                format!(
                    "must be a cosine similarity in [-1, 1], got {}",
                    self.semantic_threshold
                ),
            ));
        }
        if let Some(sigma) = self.hybrid_similarity {
            if !(-1.0..=1.0).contains(&sigma) {
                return Err(ConfigError::invalid(
                    "hybrid_similarity",
                    format!("must be a cosine similarity in [-1, 1], got {sigma}"),
                ));
            }
            if self.policy != RetrievalPolicy::Has {
                return Err(ConfigError::invalid(
                    "hybrid_similarity",
                    "validates HaS drafts: set it only with `policy = \"has\"`",
                ));
            }
        }
        if self.require_matched_top > self.validation_depth {
            return Err(ConfigError::invalid(
                "require_matched_top",
                format!(
                    "must be at most `validation_depth` ({}), got {}",
                    self.validation_depth, self.require_matched_top
                ),
            ));
        }
        if self.policy == RetrievalPolicy::EdgeIvf && !self.fuzzy_channel {
            return Err(ConfigError::invalid(
                "fuzzy_channel",
                "must be on for the edge-ivf policy",
            ));
        }
        if self.policy == RetrievalPolicy::EdgeIvf && !self.fuzzy_in_draft {
            return Err(ConfigError::invalid(
                "fuzzy_in_draft",
                "must be on for the edge-ivf policy: its drafts are the fuzzy channel's",
            ));
        }
        if self.fuzzy_channel && !self.fuzzy_in_validation && !self.fuzzy_in_draft {
            return Err(ConfigError::invalid(
                "fuzzy_in_validation",
                "and `fuzzy_in_draft` are both off: the fuzzy channel would serve nothing; \
                 set `fuzzy_channel = false` instead",
            ));
        }
        if self.warm_queries.is_some() && !self.policy.caches() {
            return Err(ConfigError::invalid(
                "warm_queries",
                "needs a policy that caches (has, exact-cache or semantic-cache)",
            ));
        }
        if self.warm_queries.is_some() && self.tenants_file.is_some() {
            return Err(ConfigError::invalid(
                "warm_queries",
                "warms the shared cache and cannot be used with `tenants_file`",
            ));
        }
        if self.cache_capacity == 0 {
            return Err(ConfigError::invalid("cache_capacity", "must be at least 1"));
        }
        if self.validation_depth == 0 || self.validation_depth > self.max_k {
            return Err(ConfigError::invalid(
                "validation_depth",
                format!(
                    "must be in 1..=max_k ({}), got {}",
                    self.max_k, self.validation_depth
                ),
            ));
        }
        if self.fuzzy_candidates == 0 {
            return Err(ConfigError::invalid(
                "fuzzy_candidates",
                "must be at least 1",
            ));
        }
        if self.cache_candidates == 0 {
            return Err(ConfigError::invalid(
                "cache_candidates",
                "must be at least 1",
            ));
        }
        if !(self.corpus_fraction > 0.0 && self.corpus_fraction <= 1.0) {
            return Err(ConfigError::invalid(
                "corpus_fraction",
                format!("must be in (0, 1], got {}", self.corpus_fraction),
            ));
        }
        for (key, value) in [
            ("fuzzy_nlist", self.fuzzy_nlist),
            ("fuzzy_nprobe", self.fuzzy_nprobe),
            ("cache_nlist", self.cache_nlist),
            ("cache_nprobe", self.cache_nprobe),
        ] {
            if value == Some(0) {
                return Err(ConfigError::invalid(key, "must be at least 1 when set"));
            }
        }
        if !is_host_port(&self.cloud_addr) {
            return Err(ConfigError::invalid(
                "cloud_addr",
                format!(
                    "`{}` is not `host:port` (an IP address or a DNS name, then the port)",
                    self.cloud_addr
                ),
            ));
        }
        if self.cloud_timeout_ms == 0 {
            return Err(ConfigError::invalid(
                "cloud_timeout_ms",
                "must be at least 1",
            ));
        }
        self.tls.mutual_tls()?;
        if self.control_plane_token_file.is_some() && self.control_plane.is_empty() {
            return Err(ConfigError::invalid(
                "control_plane_token_file",
                "is given but `control_plane` names no node",
            ));
        }
        if self.tenants_file.is_some() && self.metrics_addr.is_none() {
            return Err(ConfigError::invalid(
                "metrics_addr",
                "is required with `tenants_file`: /v1/status and /metrics name every tenant and its traffic, so they are served on an address of their own, not to tenants",
            ));
        }
        for (key, value) in [
            ("header_timeout_ms", self.header_timeout_ms),
            ("body_timeout_ms", self.body_timeout_ms),
            ("shutdown_grace_ms", self.shutdown_grace_ms),
        ] {
            if value == 0 {
                return Err(ConfigError::invalid(key, "must be at least 1"));
            }
        }
        for (key, value) in [
            ("max_query_chars", self.max_query_chars),
            ("max_body_bytes", self.max_body_bytes),
            ("max_in_flight", self.max_in_flight),
            ("max_connections", self.max_connections),
        ] {
            if value == 0 {
                return Err(ConfigError::invalid(key, "must be at least 1"));
            }
        }
        if let Some(per_client) = self.max_connections_per_client
            && !(1..=self.max_connections).contains(&per_client)
        {
            return Err(ConfigError::invalid(
                "max_connections_per_client",
                format!(
                    "must be 1 to max_connections ({}), got {per_client}",
                    self.max_connections
                ),
            ));
        }
        if let Some(worker) = &self.lm_worker {
            if self.lm_model.is_some() {
                return Err(ConfigError::invalid(
                    "lm_worker",
                    "and `lm_model` are both set: answer either with a worker or with models in \
                     this process",
                ));
            }
            if !is_host_port(worker) {
                return Err(ConfigError::invalid(
                    "lm_worker",
                    format!("`{worker}` is not `host:port`"),
                ));
            }
        }
        if !self.kv_workers.is_empty() {
            if self.lm_model.is_some() || self.lm_worker.is_some() {
                return Err(ConfigError::invalid(
                    "kv_workers",
                    "and `lm_model` or `lm_worker` are both set: answer with one of them",
                ));
            }
            if let Some(bad) = self.kv_workers.iter().find(|w| !is_host_port(w)) {
                return Err(ConfigError::invalid(
                    "kv_workers",
                    format!("`{bad}` is not `host:port`"),
                ));
            }
        }
        self.validate_engine()?;
        if let Some(pool) = &self.kv_pool
            && (self.kv_workers.is_empty()
                || self.control_plane.is_empty()
                || pool
                    .split_once('/')
                    .is_none_or(|(ns, name)| ns.is_empty() || name.is_empty()))
        {
            return Err(ConfigError::invalid(
                "kv_pool",
                format!(
                    "`{pool}` needs the form namespace/name, `kv_workers` to start with and \
                     `control_plane` to follow"
                ),
            ));
        }
        if !(0.0..=1.0).contains(&self.kv_recompute_ratio) {
            return Err(ConfigError::invalid(
                "kv_recompute_ratio",
                format!("{} is outside [0, 1]", self.kv_recompute_ratio),
            ));
        }
        if self.lm_drafter.is_some() && self.lm_model.is_none() {
            return Err(ConfigError::invalid(
                "lm_drafter",
                "is given but `lm_model` is not: the drafter needs a model to verify its drafts",
            ));
        }
        if self.answer_max_tokens == 0 || self.answer_max_tokens > hasten_rag::MAX_NEW_TOKENS {
            return Err(ConfigError::invalid(
                "answer_max_tokens",
                format!(
                    "must be in 1..={}, got {}",
                    hasten_rag::MAX_NEW_TOKENS,
                    self.answer_max_tokens
                ),
            ));
        }
        if self.answer_queue_per_tenant == Some(0) {
            return Err(ConfigError::invalid(
                "answer_queue_per_tenant",
                "must be at least 1 (leave it unset for no per-tenant bound)",
            ));
        }
        if !(1..=self.answer_max_tokens).contains(&self.answer_default_tokens) {
            return Err(ConfigError::invalid(
                "answer_default_tokens",
                format!(
                    "must be in 1..=answer_max_tokens ({}), got {}",
                    self.answer_max_tokens, self.answer_default_tokens
                ),
            ));
        }
        if !(1..=hasten_rag::MAX_DRAFTS).contains(&self.speculative_drafts) {
            return Err(ConfigError::invalid(
                "speculative_drafts",
                format!(
                    "must be in 1..={}, got {}",
                    hasten_rag::MAX_DRAFTS,
                    self.speculative_drafts
                ),
            ));
        }
        if self.speculative_clusters == 0 || self.speculative_clusters > self.max_k {
            return Err(ConfigError::invalid(
                "speculative_clusters",
                format!(
                    "must be in 1..=max_k ({}), got {}",
                    self.max_k, self.speculative_clusters
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use display_full_error::DisplayFullErrorExt;

    #[test]
    fn defaults_and_bad_values_name_their_key() {
        let mut config = EdgeConfig {
            bundle: Some("b".into()),
            ..EdgeConfig::default()
        };
        assert_eq!(
            (
                config.k,
                config.validation_depth,
                config.tau,
                config.cache_capacity,
                config.fuzzy_candidates
            ),
            (10, 20, 0.4, 5000, 50)
        );
        assert!(!config.expose_matched_query_text);
        assert!(!config.expose_draft_trace);
        config.validate().unwrap();
        config.validation_depth = 0;
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string_full()
                .contains("`validation_depth`")
        );
        config.validation_depth = 10;
        config.tau = 1.5;
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string_full()
                .contains("`tau`")
        );
        config.tau = 0.2;
        let error = |config: &EdgeConfig| config.validate().unwrap_err().to_string_full();
        config.require_matched_top = 11;
        assert!(error(&config).contains("`require_matched_top`"));
        config.require_matched_top = 10;
        config.hybrid_similarity = Some(1.5);
        assert!(error(&config).contains("`hybrid_similarity`"));
        config.hybrid_similarity = Some(0.7);
        config.validate().unwrap();
        config.policy = RetrievalPolicy::SemanticCache;
        assert!(error(&config).contains("policy = \"has\""));
        config.policy = RetrievalPolicy::Has;
        config.hybrid_similarity = None;
        config.corpus_fraction = 0.0;
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string_full()
                .contains("`corpus_fraction`")
        );
        config.corpus_fraction = 0.5;
        config.k = 101;
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string_full()
                .contains("`k`")
        );
    }

    #[test]
    fn the_cloud_address_is_an_ip_or_a_name_with_a_port() {
        let mut config = EdgeConfig {
            bundle: Some("b".into()),
            ..EdgeConfig::default()
        };
        for good in [
            "10.96.0.10:7100",
            "[fd00::1]:7100",
            "hasten-router.hasten.svc.cluster.local:7100",
        ] {
            config.cloud_addr = good.into();
            config.validate().unwrap();
        }
        for bad in [
            "hasten-router",
            "router:",
            ":7100",
            "router:99999",
            "quic://router:7100",
        ] {
            config.cloud_addr = bad.into();
            let error = config.validate().unwrap_err().to_string_full();
            assert!(
                error.contains("`cloud_addr`") && error.contains(bad),
                "{bad}: {error}"
            );
        }
    }

    #[test]
    fn kv_workers_are_exclusive_with_other_generation_and_checked() {
        let error = |config: &EdgeConfig| config.validate().unwrap_err().to_string_full();
        let mut config = EdgeConfig {
            bundle: Some("b".into()),
            kv_workers: vec!["127.0.0.1:7510".into(), "worker-1:7510".into()],
            ..EdgeConfig::default()
        };
        assert_eq!(
            (
                config.kv_mode,
                config.kv_recompute_ratio,
                config.kv_variant,
                config.kv_routing
            ),
            (
                FusionMode::FusionRag,
                0.15,
                Variant::Similarity,
                KvRouting::KvAware
            ),
            "FusionRAG's defaults, KV-aware routing"
        );
        config.validate().unwrap();
        config.lm_worker = Some("127.0.0.1:7500".into());
        assert!(error(&config).contains("`kv_workers`"));
        config.lm_worker = None;
        config.kv_workers.push("http://w:1".into());
        assert!(error(&config).contains("http://w:1"));
        config.kv_workers.pop();
        config.kv_recompute_ratio = 1.5;
        assert!(error(&config).contains("`kv_recompute_ratio`"));
        config.kv_recompute_ratio = 0.15;
        config.kv_pool = Some("rag/wiki".into());
        assert!(
            error(&config).contains("`kv_pool`"),
            "no control plane to follow"
        );
        config.control_plane = vec!["127.0.0.1:7400".into()];
        config.validate().unwrap();
        config.kv_pool = Some("wiki".into());
        assert!(error(&config).contains("`kv_pool`"), "no namespace");
    }

    #[test]
    fn an_engine_needs_a_url_and_a_model_and_no_other_backend() {
        let error = |config: &EdgeConfig| config.validate().unwrap_err().to_string_full();
        let mut config = EdgeConfig {
            bundle: Some("b".into()),
            lm_engine_url: Some("http://vllm:8000/v1".into()),
            ..EdgeConfig::default()
        };
        assert!(error(&config).contains("`lm_engine_model`"));
        config.lm_engine_model = Some("Qwen/Qwen2.5-1.5B-Instruct".into());
        config.validate().unwrap();
        config.lm_model = Some("m.gguf".into());
        let both = error(&config);
        assert!(
            both.contains("`lm_engine_url`") && both.contains("`lm_model`"),
            "{both}"
        );
        config.lm_model = None;
        config.kv_workers = vec!["w:7510".into()];
        assert!(error(&config).contains("`kv_workers`"));
        config.kv_workers.clear();
        config.lm_engine_url = Some("vllm:8000".into());
        assert!(error(&config).contains("not an http"));
        config.lm_engine_url = Some("https://vllm:8000/v1".into());
        config.lm_engine_api_key = Some(ApiKey::new("sk-secret"));
        config.lm_engine_api_key_file = Some("key".into());
        assert!(error(&config).contains("`lm_engine_api_key_file`"));
        assert!(
            !format!("{config:?}").contains("sk-secret"),
            "the key is never printed"
        );
        config.lm_engine_api_key_file = None;
        config.lm_engine_concurrency = 0;
        assert!(error(&config).contains("`lm_engine_concurrency`"));
        config.lm_engine_concurrency = 8;
        config.lm_engine_url = None;
        assert!(
            error(&config).contains("`lm_engine_model`"),
            "engine keys without the engine are a mistake"
        );
    }

    #[test]
    fn the_fuzzy_ablations_and_warm_queries_refuse_what_cannot_work() {
        let error = |config: &EdgeConfig| config.validate().unwrap_err().to_string_full();
        let mut config = EdgeConfig {
            bundle: Some("b".into()),
            fuzzy_in_validation: false,
            warm_queries: Some("warm.txt".into()),
            ..EdgeConfig::default()
        };
        config.validate().unwrap();
        config.fuzzy_in_draft = false;
        assert!(error(&config).contains("`fuzzy_in_validation`"));
        config.fuzzy_channel = false;
        config.validate().unwrap();
        config.fuzzy_channel = true;
        config.fuzzy_in_validation = true;
        config.policy = RetrievalPolicy::EdgeIvf;
        assert!(error(&config).contains("`fuzzy_in_draft`"));
        config.fuzzy_in_draft = true;
        assert!(error(&config).contains("`warm_queries`"));
        config.policy = RetrievalPolicy::Has;
        config.tenants_file = Some("tenants.toml".into());
        assert!(error(&config).contains("`warm_queries`"));
    }
}
