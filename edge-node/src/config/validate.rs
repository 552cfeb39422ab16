//! The edge configuration's checks beyond its types: ranges, and keys that need (or
//! exclude) each other, within a table and across tables. Each error names the key by its
//! path from the top of the file (`retrieval.tau`).

use hasten_core::config::{ConfigError, Validate};

use super::{AnswerConfig, EdgeConfig, EngineConfig, KvConfig, RetrievalConfig, ServerConfig};
use crate::retrieval::RetrievalPolicy;

/// `HOST:PORT`, the host an IP address (IPv6 in brackets) or a name, the port a number.
fn is_host_port(addr: &str) -> bool {
    addr.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty()
            && !host.contains("://")
            && !host.contains('/')
            && port.parse::<u16>().is_ok()
    })
}

/// An error for each key of `keys` whose value is 0.
fn at_least_one(keys: &[(&'static str, u64)]) -> Result<(), ConfigError> {
    match keys.iter().find(|(_, value)| *value == 0) {
        Some((key, _)) => Err(ConfigError::invalid(key, "must be at least 1")),
        None => Ok(()),
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
        self.retrieval.validate()?;
        if self.retrieval.warm_queries.is_some() && self.server.tenants_file.is_some() {
            return Err(ConfigError::invalid(
                "retrieval.warm_queries",
                "warms the shared cache and cannot be used with `server.tenants_file`",
            ));
        }
        if !is_host_port(&self.cloud.addr) {
            return Err(ConfigError::invalid(
                "cloud.addr",
                format!(
                    "`{}` is not `host:port` (an IP address or a DNS name, then the port)",
                    self.cloud.addr
                ),
            ));
        }
        at_least_one(&[("cloud.timeout_ms", self.cloud.timeout_ms)])?;
        self.tls.mutual_tls()?;
        if self.control_plane.token_file.is_some() && self.control_plane.nodes.is_empty() {
            return Err(ConfigError::invalid(
                "control_plane.token_file",
                "is given but `control_plane.nodes` names no node",
            ));
        }
        self.server.validate()?;
        self.answer.validate(self.retrieval.max_k)?;
        self.kv
            .validate(&self.answer, !self.control_plane.nodes.is_empty())?;
        self.engine.validate(&self.answer, &self.kv)
    }
}

impl RetrievalConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if !(0.0..=1.0).contains(&self.tau) {
            return Err(ConfigError::invalid(
                "retrieval.tau",
                format!("must be in [0, 1], got {}", self.tau),
            ));
        }
        if self.max_k == 0 || !(1..=self.max_k).contains(&self.k) {
            return Err(ConfigError::invalid(
                "retrieval.k",
                format!("must be in 1..=max_k ({}), got {}", self.max_k, self.k),
            ));
        }
        if !(-1.0..=1.0).contains(&self.semantic_threshold) {
            return Err(ConfigError::invalid(
                "retrieval.semantic_threshold",
                format!(
                    "must be a cosine similarity in [-1, 1], got {}",
                    self.semantic_threshold
                ),
            ));
        }
        if let Some(sigma) = self.hybrid_similarity {
            if !(-1.0..=1.0).contains(&sigma) {
                return Err(ConfigError::invalid(
                    "retrieval.hybrid_similarity",
                    format!("must be a cosine similarity in [-1, 1], got {sigma}"),
                ));
            }
            if self.policy != RetrievalPolicy::Has {
                return Err(ConfigError::invalid(
                    "retrieval.hybrid_similarity",
                    "validates HaS drafts: set it only with `policy = \"has\"`",
                ));
            }
        }
        if self.require_matched_top > self.validation_depth {
            return Err(ConfigError::invalid(
                "retrieval.require_matched_top",
                format!(
                    "must be at most `validation_depth` ({}), got {}",
                    self.validation_depth, self.require_matched_top
                ),
            ));
        }
        if self.policy == RetrievalPolicy::EdgeIvf && !self.fuzzy_channel {
            return Err(ConfigError::invalid(
                "retrieval.fuzzy_channel",
                "must be on for the edge-ivf policy",
            ));
        }
        if self.policy == RetrievalPolicy::EdgeIvf && !self.fuzzy_in_draft {
            return Err(ConfigError::invalid(
                "retrieval.fuzzy_in_draft",
                "must be on for the edge-ivf policy: its drafts are the fuzzy channel's",
            ));
        }
        if self.fuzzy_channel && !self.fuzzy_in_validation && !self.fuzzy_in_draft {
            return Err(ConfigError::invalid(
                "retrieval.fuzzy_in_validation",
                "and `fuzzy_in_draft` are both off: the fuzzy channel would serve nothing; \
                 set `fuzzy_channel = false` instead",
            ));
        }
        if self.warm_queries.is_some() && !self.policy.caches() {
            return Err(ConfigError::invalid(
                "retrieval.warm_queries",
                "needs a policy that caches (has, exact-cache or semantic-cache)",
            ));
        }
        if self.validation_depth == 0 || self.validation_depth > self.max_k {
            return Err(ConfigError::invalid(
                "retrieval.validation_depth",
                format!(
                    "must be in 1..=max_k ({}), got {}",
                    self.max_k, self.validation_depth
                ),
            ));
        }
        at_least_one(&[
            ("retrieval.cache_capacity", self.cache_capacity as u64),
            ("retrieval.fuzzy_candidates", self.fuzzy_candidates as u64),
            ("retrieval.cache_candidates", self.cache_candidates as u64),
        ])?;
        if !(self.corpus_fraction > 0.0 && self.corpus_fraction <= 1.0) {
            return Err(ConfigError::invalid(
                "retrieval.corpus_fraction",
                format!("must be in (0, 1], got {}", self.corpus_fraction),
            ));
        }
        for (key, value) in [
            ("retrieval.fuzzy_nlist", self.fuzzy_nlist),
            ("retrieval.fuzzy_nprobe", self.fuzzy_nprobe),
            ("retrieval.cache_nlist", self.cache_nlist),
            ("retrieval.cache_nprobe", self.cache_nprobe),
        ] {
            if value == Some(0) {
                return Err(ConfigError::invalid(key, "must be at least 1 when set"));
            }
        }
        Ok(())
    }
}

impl ServerConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.tenants_file.is_some() && self.metrics_addr.is_none() {
            return Err(ConfigError::invalid(
                "server.metrics_addr",
                "is required with `server.tenants_file`: /v1/status and /metrics name every tenant and its traffic, so they are served on an address of their own, not to tenants",
            ));
        }
        at_least_one(&[
            ("server.header_timeout_ms", self.header_timeout_ms),
            ("server.body_timeout_ms", self.body_timeout_ms),
            ("server.shutdown_grace_ms", self.shutdown_grace_ms),
            ("server.max_query_chars", self.max_query_chars as u64),
            ("server.max_body_bytes", self.max_body_bytes as u64),
            ("server.max_in_flight", self.max_in_flight as u64),
            ("server.max_connections", self.max_connections as u64),
        ])?;
        if let Some(per_client) = self.max_connections_per_client
            && !(1..=self.max_connections).contains(&per_client)
        {
            return Err(ConfigError::invalid(
                "server.max_connections_per_client",
                format!(
                    "must be 1 to max_connections ({}), got {per_client}",
                    self.max_connections
                ),
            ));
        }
        Ok(())
    }
}

impl AnswerConfig {
    /// `max_k`: `retrieval.max_k`, which bounds the speculative clusters.
    fn validate(&self, max_k: usize) -> Result<(), ConfigError> {
        if let Some(worker) = &self.worker {
            if self.model.is_some() {
                return Err(ConfigError::invalid(
                    "answer.worker",
                    "and `answer.model` are both set: answer either with a worker or with \
                     models in this process",
                ));
            }
            if !is_host_port(worker) {
                return Err(ConfigError::invalid(
                    "answer.worker",
                    format!("`{worker}` is not `host:port`"),
                ));
            }
        }
        if self.drafter.is_some() && self.model.is_none() {
            return Err(ConfigError::invalid(
                "answer.drafter",
                "is given but `answer.model` is not: the drafter needs a model to verify its \
                 drafts",
            ));
        }
        if self.max_tokens == 0 || self.max_tokens > hasten_rag::MAX_NEW_TOKENS {
            return Err(ConfigError::invalid(
                "answer.max_tokens",
                format!(
                    "must be in 1..={}, got {}",
                    hasten_rag::MAX_NEW_TOKENS,
                    self.max_tokens
                ),
            ));
        }
        if self.queue_per_tenant == Some(0) {
            return Err(ConfigError::invalid(
                "answer.queue_per_tenant",
                "must be at least 1 (leave it unset for no per-tenant bound)",
            ));
        }
        // Token counts bounded by the answer's own limit.
        for (key, tokens) in [
            ("answer.default_tokens", self.default_tokens),
            (
                "answer.speculative_draft_tokens",
                self.speculative_draft_tokens,
            ),
        ] {
            if !(1..=self.max_tokens).contains(&tokens) {
                return Err(ConfigError::invalid(
                    key,
                    format!(
                        "must be in 1..=max_tokens ({}), got {tokens}",
                        self.max_tokens
                    ),
                ));
            }
        }
        if !(1..=hasten_rag::MAX_DRAFTS).contains(&self.speculative_drafts) {
            return Err(ConfigError::invalid(
                "answer.speculative_drafts",
                format!(
                    "must be in 1..={}, got {}",
                    hasten_rag::MAX_DRAFTS,
                    self.speculative_drafts
                ),
            ));
        }
        if self.speculative_clusters == 0 || self.speculative_clusters > max_k {
            return Err(ConfigError::invalid(
                "answer.speculative_clusters",
                format!(
                    "must be in 1..=retrieval.max_k ({max_k}), got {}",
                    self.speculative_clusters
                ),
            ));
        }
        Ok(())
    }
}

impl KvConfig {
    /// `answer`: the other generation backends, exclusive with KV workers;
    /// `control_plane`: whether the edge has a control plane to follow a pool through.
    fn validate(&self, answer: &AnswerConfig, control_plane: bool) -> Result<(), ConfigError> {
        if !self.workers.is_empty() {
            if answer.model.is_some() || answer.worker.is_some() {
                return Err(ConfigError::invalid(
                    "kv.workers",
                    "and `answer.model` or `answer.worker` are both set: answer with one of them",
                ));
            }
            if let Some(bad) = self.workers.iter().find(|w| !is_host_port(w)) {
                return Err(ConfigError::invalid(
                    "kv.workers",
                    format!("`{bad}` is not `host:port`"),
                ));
            }
        }
        if let Some(pool) = &self.pool
            && (self.workers.is_empty()
                || !control_plane
                || pool
                    .split_once('/')
                    .is_none_or(|(ns, name)| ns.is_empty() || name.is_empty()))
        {
            return Err(ConfigError::invalid(
                "kv.pool",
                format!(
                    "`{pool}` needs the form namespace/name, `kv.workers` to start with and \
                     `control_plane.nodes` to follow"
                ),
            ));
        }
        if !(0.0..=1.0).contains(&self.recompute_ratio) {
            return Err(ConfigError::invalid(
                "kv.recompute_ratio",
                format!("{} is outside [0, 1]", self.recompute_ratio),
            ));
        }
        Ok(())
    }
}

impl EngineConfig {
    /// The engine keys: a URL that can be called, a model, and no other generation backend
    /// (`answer`'s models or worker, `kv`'s workers).
    fn validate(&self, answer: &AnswerConfig, kv: &KvConfig) -> Result<(), ConfigError> {
        at_least_one(&[
            ("engine.timeout_ms", self.timeout_ms),
            ("engine.concurrency", self.concurrency as u64),
        ])?;
        let Some(url) = &self.url else {
            for (key, set) in [
                ("engine.model", self.model.is_some()),
                ("engine.drafter_url", self.drafter_url.is_some()),
                ("engine.drafter_model", self.drafter_model.is_some()),
                ("engine.api_key", self.api_key.is_some()),
                ("engine.api_key_file", self.api_key_file.is_some()),
                ("engine.ca", self.ca.is_some()),
            ] {
                if set {
                    return Err(ConfigError::invalid(key, "is set but `engine.url` is not"));
                }
            }
            return Ok(());
        };
        for (key, set) in [
            ("answer.model", answer.model.is_some()),
            ("answer.worker", answer.worker.is_some()),
            ("kv.workers", !kv.workers.is_empty()),
        ] {
            if set {
                return Err(ConfigError::invalid(
                    "engine.url",
                    format!("and `{key}` are both set: answer with one of them"),
                ));
            }
        }
        for (key, url) in [
            ("engine.url", Some(url)),
            ("engine.drafter_url", self.drafter_url.as_ref()),
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
        if self.model.as_deref().is_none_or(|m| m.trim().is_empty()) {
            return Err(ConfigError::invalid(
                "engine.model",
                "is required with `engine.url`: the model the engine serves",
            ));
        }
        if self.api_key.is_some() && self.api_key_file.is_some() {
            return Err(ConfigError::invalid(
                "engine.api_key_file",
                "and `engine.api_key` are both set: give the key once",
            ));
        }
        Ok(())
    }
}
