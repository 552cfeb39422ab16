//! Configuration of the two serving modes, each resolved as defaults < TOML file < env <
//! flags: `cloud-index serve` (a shard server, `HASTEN_CLOUD_*`) and `cloud-index route`
//! (the router, `HASTEN_ROUTER_*`). Both share the `[server]` and `[batching]` tables
//! (`HASTEN_CLOUD_SERVER__QUIC_ADDR` in the environment); the TLS files are flat keys, as in
//! every Hasten binary.

use display_full_error::DisplayFullErrorExt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use hasten_core::config::{ConfigError, TlsConfig, Validate};
use hasten_core::logging::LogFormat;
use hasten_proto::tls::TlsPaths;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::batcher::BatchingSettings;
use crate::replica_set::RouterSettings;
use crate::searcher::MAX_BATCH;
use crate::shard_map::ShardMap;

/// Searches a cloud server answers at once. A 1M-vector shard answers ~200-250 searches a
/// second batched (docs/benchmarks/cloud-tier.md), so ~500 fit in the default 2 s deadline;
/// twice that absorbs a burst, and a search beyond it would only wait out its deadline in
/// the queue.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1024;

/// Where a cloud server listens and reports itself, and how much it takes on at once: the
/// `[server]` table of shards and routers alike.
///
/// No `#[serde(default)]` here: the defaults differ by role (`dev_cert_out`), and loading
/// fills a partial table from the role's own defaults.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// UDP address of the QUIC fast path used by edges.
    pub quic_addr: SocketAddr,
    /// TCP address of the gRPC API (routers reach shards here).
    pub grpc_addr: SocketAddr,
    /// TCP address of `/metrics`, `/readyz` and `/healthz`.
    pub metrics_addr: SocketAddr,
    /// When set, a JSON file with the bound addresses is written here once serving.
    pub ready_file: Option<PathBuf>,
    /// Searches answered at once; beyond it RESOURCE_EXHAUSTED at once. The default is twice
    /// what a 1M-vector shard answers within the default 2 s deadline: it absorbs a burst,
    /// and a search beyond it would only wait out its deadline in the queue.
    #[schemars(range(min = 1))]
    pub max_in_flight: usize,
    /// Where the generated dev certificate is written, for clients to trust (an edge's
    /// `cloud_ca`); used only without `tls_cert`.
    pub dev_cert_out: PathBuf,
    /// DNS names and IP addresses the dev certificate is valid for.
    pub dev_cert_names: Vec<String>,
}

impl ServerConfig {
    /// The defaults of a role whose generated dev certificate goes to `dev_cert_out`.
    fn with_dev_cert_out(dev_cert_out: &str) -> Self {
        Self {
            quic_addr: SocketAddr::from(([127, 0, 0, 1], 7100)),
            grpc_addr: SocketAddr::from(([127, 0, 0, 1], 7101)),
            metrics_addr: SocketAddr::from(([127, 0, 0, 1], 7102)),
            ready_file: None,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            dev_cert_out: PathBuf::from(dev_cert_out),
            dev_cert_names: vec!["localhost".into(), "127.0.0.1".into()],
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.max_in_flight == 0 {
            return Err(ConfigError::invalid(
                "server.max_in_flight",
                "must be at least 1: with 0 every search is refused",
            ));
        }
        Ok(())
    }
}

/// Micro-batching of concurrent searches: the `[batching]` table of shards (one faiss call
/// per batch) and routers (one request per shard per batch).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct BatchingConfig {
    /// Coalesce concurrent searches into one batch. A router's batching makes every shard
    /// search the same batches (docs/benchmarks/cloud-tier.md: shards batching on their own
    /// split into two interleaved groups under closed-loop load).
    pub enabled: bool,
    /// Most query vectors in one batch. 256 is where the matrix product's throughput stops
    /// growing on this hardware (DESIGN.md: ~113 queries/s over 1M vectors at batch 256); a
    /// router's batch is one request, so at most a request's limit (1024).
    pub max_queries: usize,
    /// Longest a search waits for others to join its batch, in microseconds; small against
    /// a scan of a shard (milliseconds), so a lone query barely notices.
    #[schemars(range(max = 100_000))]
    pub max_wait_us: u64,
    /// Searches that may queue for a batch before callers wait to enqueue.
    pub queue: usize,
}

impl Default for BatchingConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_queries: 256,
            max_wait_us: 1000,
            queue: 4096,
        }
    }
}

impl BatchingConfig {
    /// Checks a batch of at least one query and at most `max_queries_limit`, and a wait no
    /// lone query would notice.
    fn validate(&self, max_queries_limit: usize) -> Result<(), ConfigError> {
        if self.enabled && !(1..=max_queries_limit).contains(&self.max_queries) {
            return Err(ConfigError::invalid(
                "batching.max_queries",
                format!(
                    "must be in 1..={max_queries_limit} when batching is on, got {}",
                    self.max_queries
                ),
            ));
        }
        if self.max_wait_us > 100_000 {
            return Err(ConfigError::invalid(
                "batching.max_wait_us",
                format!(
                    "is {} µs: a batch wait above 100 ms costs every lone query more than it saves",
                    self.max_wait_us
                ),
            ));
        }
        Ok(())
    }

    /// The micro-batching settings, or `None` when batching is off.
    pub fn settings(&self) -> Option<BatchingSettings> {
        self.enabled.then(|| BatchingSettings {
            max_queries: self.max_queries,
            max_wait: Duration::from_micros(self.max_wait_us),
            queue: self.queue,
        })
    }
}

/// TLS of a server: mutual (a CA and this server's certificate files), server-only
/// (certificate files), or a generated dev certificate.
fn validate_tls(tls: &TlsConfig, server: &ServerConfig) -> Result<(), ConfigError> {
    let TlsConfig {
        tls_ca,
        tls_cert,
        tls_key,
        tls_extra_ca,
    } = tls;
    if tls_extra_ca.is_some() && tls_ca.is_none() {
        return Err(ConfigError::invalid(
            "tls_extra_ca",
            "adds to the trust of mutual TLS: it needs `tls_ca`, `tls_cert` and `tls_key`",
        ));
    }
    if tls_ca.is_some() && tls_cert.is_none() {
        return Err(ConfigError::invalid(
            "tls_ca",
            "needs `tls_cert` and `tls_key`: under mutual TLS this server shows its own certificate",
        ));
    }
    if tls_cert.is_some() != tls_key.is_some() {
        return Err(ConfigError::invalid(
            "tls_cert",
            "and `tls_key` must be given together",
        ));
    }
    if tls_cert.is_none() && server.dev_cert_names.is_empty() {
        return Err(ConfigError::invalid(
            "server.dev_cert_names",
            "must name at least one host for the generated dev certificate",
        ));
    }
    Ok(())
}

/// The mutual-TLS files, when a CA is configured (checked by [`validate_tls`]).
fn mutual_tls_paths(tls: &TlsConfig) -> Option<TlsPaths> {
    Some(TlsPaths {
        ca: tls.tls_ca.clone()?,
        extra_ca: tls.tls_extra_ca.clone(),
        cert: tls.tls_cert.clone()?,
        key: tls.tls_key.clone()?,
    })
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ShardConfig {
    /// Log lines as `text` or `json` (one object per line).
    pub log_format: LogFormat,
    /// OTLP/gRPC collector that spans are exported to (`http://otel-collector:4317`), so
    /// that a request is one trace across the processes it crosses; unset: no export.
    pub otlp_endpoint: Option<String>,
    /// Corpus bundle to serve: a shard bundle (`cloud-index build --shards`) or a whole
    /// corpus. Required.
    pub bundle: Option<PathBuf>,
    /// Mutual TLS: `tls_ca`, `tls_cert`, `tls_key` and `tls_extra_ca`, at the top level.
    #[serde(flatten)]
    pub tls: TlsConfig,
    /// OpenMP threads for faiss's per-query scans and result merging. 1, because batches go
    /// through OpenBLAS (see `blas_min_batch`), and OpenMP threads running beside OpenBLAS's
    /// oversubscribe the cores (docs/benchmarks/cloud-tier.md: OpenMP 2 + OpenBLAS 2 ran a
    /// batch at a third of the speed of OpenMP 1 + OpenBLAS 2 on 2 cores). 0: every core.
    pub openmp_threads: usize,
    /// OpenBLAS threads for the matrix product that searches a batch (0: every core).
    pub openblas_threads: usize,
    /// Smallest batch searched as one matrix product; faiss's default is 20. Measured on 1M
    /// vectors with one thread: one scan per query costs 46 ms each, the matrix product
    /// ~100 ms plus 7 ms per query, so from 3-4 queries on the product wins (docs/benchmarks/cloud-tier.md).
    pub blas_min_batch: usize,
    /// Listeners, dev certificate and admission bound.
    pub server: ServerConfig,
    /// Coalescing of concurrent searches into one faiss call.
    pub batching: BatchingConfig,
}

impl Default for ShardConfig {
    fn default() -> Self {
        Self {
            log_format: LogFormat::default(),
            otlp_endpoint: None,
            bundle: None,
            tls: TlsConfig::default(),
            openmp_threads: 1,
            openblas_threads: 0,
            blas_min_batch: 4,
            server: ServerConfig::with_dev_cert_out("run/cloud-dev-cert.pem"),
            batching: BatchingConfig::default(),
        }
    }
}

impl ShardConfig {
    /// The mutual-TLS files, when a CA is configured.
    pub fn mutual_tls(&self) -> Option<TlsPaths> {
        mutual_tls_paths(&self.tls)
    }
}

impl Validate for ShardConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        hasten_core::config::check_otlp_endpoint(self.otlp_endpoint.as_deref())?;
        if self.bundle.is_none() {
            return Err(ConfigError::invalid(
                "bundle",
                "is required: the corpus or shard bundle directory made by `cloud-index build`",
            ));
        }
        validate_tls(&self.tls, &self.server)?;
        self.server.validate()?;
        self.batching.validate(usize::MAX)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RouterConfig {
    /// Log lines as `text` or `json` (one object per line).
    pub log_format: LogFormat,
    /// OTLP/gRPC collector that spans are exported to (`http://otel-collector:4317`), so
    /// that a request is one trace across the processes it crosses; unset: no export.
    pub otlp_endpoint: Option<String>,
    /// The starting shard map: `shards[i]` lists the gRPC endpoints (`host:port` or a URI)
    /// of shard i's replicas. Required.
    pub shards: Vec<Vec<String>>,
    /// Control-plane nodes (gRPC `host:port`): when given, the router follows the shard map
    /// the control plane replicates, from `shards` on. Empty: `shards` is the map for good.
    pub control_plane: Vec<String>,
    /// File holding the control plane's shared token (`hasten_proto::auth`), for a control
    /// plane without mutual TLS.
    pub control_plane_token_file: Option<PathBuf>,
    /// Mutual TLS: `tls_ca`, `tls_cert`, `tls_key` and `tls_extra_ca`, at the top level.
    #[serde(flatten)]
    pub tls: TlsConfig,
    /// Deadline of a request that names none, in milliseconds; equal to the edge's default
    /// cloud timeout, the longest anyone waits for a fallback.
    #[schemars(range(min = 1))]
    pub request_timeout_ms: u64,
    /// Longest one attempt on one replica may take before the next is tried, in
    /// milliseconds: a scan of a large shard under load takes a few hundred milliseconds,
    /// and half the request deadline leaves room for one retry.
    #[schemars(range(min = 1))]
    pub attempt_timeout_ms: u64,
    /// Period of the replica health checks, in milliseconds: a dead replica is noticed by
    /// the first request that tries it, a recovered one within this period.
    #[schemars(range(min = 1))]
    pub health_interval_ms: u64,
    /// How long start-up waits for every shard to have a replica that answers, in seconds.
    pub startup_timeout_s: u64,
    /// Listeners (`/readyz`: every shard has a live replica), dev certificate and admission
    /// bound.
    pub server: ServerConfig,
    /// Coalescing of concurrent searches into one request per shard.
    pub batching: BatchingConfig,
}

impl Default for RouterConfig {
    fn default() -> Self {
        Self {
            log_format: LogFormat::default(),
            otlp_endpoint: None,
            shards: Vec::new(),
            control_plane: Vec::new(),
            control_plane_token_file: None,
            tls: TlsConfig::default(),
            request_timeout_ms: 2_000,
            attempt_timeout_ms: 1_000,
            health_interval_ms: 1_000,
            startup_timeout_s: 60,
            server: ServerConfig::with_dev_cert_out("run/router-dev-cert.pem"),
            batching: BatchingConfig::default(),
        }
    }
}

impl RouterConfig {
    /// The mutual-TLS files, when a CA is configured.
    pub fn mutual_tls(&self) -> Option<TlsPaths> {
        mutual_tls_paths(&self.tls)
    }

    /// The configured shard map.
    pub fn shard_map(&self) -> Result<ShardMap, ConfigError> {
        if self.shards.is_empty() {
            return Err(ConfigError::invalid(
                "shards",
                "is required: one list of replica endpoints per shard (flag: --shard a:port,b:port, once per shard)",
            ));
        }
        ShardMap::new(self.shards.clone())
            .map_err(|e| ConfigError::invalid("shards", e.to_string_full()))
    }

    pub fn router_settings(&self) -> RouterSettings {
        RouterSettings {
            request_timeout: Duration::from_millis(self.request_timeout_ms),
            attempt_timeout: Duration::from_millis(self.attempt_timeout_ms),
            health_interval: Duration::from_millis(self.health_interval_ms),
            startup_timeout: Duration::from_secs(self.startup_timeout_s),
        }
    }
}

impl Validate for RouterConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        hasten_core::config::check_otlp_endpoint(self.otlp_endpoint.as_deref())?;
        self.shard_map()?;
        for address in &self.control_plane {
            if let Err(err) = hasten_proto::control::endpoint(address, None) {
                return Err(ConfigError::invalid(
                    "control_plane",
                    format!(
                        "lists `{address}`, which is not a host:port: {}",
                        err.display_full()
                    ),
                ));
            }
        }
        if self.control_plane_token_file.is_some() && self.control_plane.is_empty() {
            return Err(ConfigError::invalid(
                "control_plane_token_file",
                "is given but `control_plane` names no node",
            ));
        }
        validate_tls(&self.tls, &self.server)?;
        for (key, value) in [
            ("request_timeout_ms", self.request_timeout_ms),
            ("attempt_timeout_ms", self.attempt_timeout_ms),
            ("health_interval_ms", self.health_interval_ms),
        ] {
            if value == 0 {
                return Err(ConfigError::invalid(key, "must be above 0"));
            }
        }
        self.server.validate()?;
        self.batching.validate(MAX_BATCH)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hasten_core::config::load_config;

    fn message(err: ConfigError) -> String {
        err.to_string_full()
    }

    #[derive(Serialize)]
    struct NoFlags {}

    /// `T` loaded from `toml` alone, as `--config` would.
    fn from_toml<T: Default + Serialize + serde::de::DeserializeOwned>(
        toml: &str,
    ) -> Result<T, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, toml).unwrap();
        load_config(Some(&file), "HASTEN_CONFIG_TEST_UNUSED_", &NoFlags {}, &[])
    }

    #[test]
    fn shard_defaults_need_a_bundle_and_paired_tls_files() {
        let mut config = ShardConfig::default();
        assert!(message(config.validate().unwrap_err()).contains("`bundle`"));
        config.bundle = Some("b".into());
        config.validate().unwrap();
        config.tls.tls_cert = Some("cert.pem".into());
        assert!(message(config.validate().unwrap_err()).contains("tls_key"));
        config.tls.tls_cert = None;
        config.server.max_in_flight = 0;
        assert!(message(config.validate().unwrap_err()).contains("`server.max_in_flight`"));
        config.server.max_in_flight = 1;
        config.server.dev_cert_names.clear();
        assert!(message(config.validate().unwrap_err()).contains("`server.dev_cert_names`"));
    }

    #[test]
    fn batching_is_on_by_default_and_can_be_turned_off() {
        let mut config = ShardConfig::default();
        let settings = config.batching.settings().unwrap();
        assert_eq!(settings.max_wait, Duration::from_millis(1));
        config.batching.enabled = false;
        assert!(config.batching.settings().is_none());
        config.bundle = Some("b".into());
        config.batching.max_wait_us = 200_000;
        assert!(message(config.validate().unwrap_err()).contains("`batching.max_wait_us`"));
    }

    #[test]
    fn router_needs_a_valid_shard_map() {
        let mut config = RouterConfig::default();
        assert!(message(config.validate().unwrap_err()).contains("`shards`"));
        config.shards = vec![vec!["127.0.0.1:1".into()], vec!["127.0.0.1:1".into()]];
        assert!(message(config.validate().unwrap_err()).contains("listed for shard 0"));
        config.shards = vec![vec!["127.0.0.1:1".into()], vec!["127.0.0.1:2".into()]];
        config.validate().unwrap();
        config.batching.max_queries = 2000;
        let err = message(config.validate().unwrap_err());
        assert!(
            err.contains("`batching.max_queries`") && err.contains("1..=1024"),
            "{err}"
        );
        config.batching.max_queries = 256;
        config.attempt_timeout_ms = 0;
        assert!(message(config.validate().unwrap_err()).contains("attempt_timeout_ms"));
        config.attempt_timeout_ms = 1;
        config.control_plane = vec!["not an address".into()];
        assert!(message(config.validate().unwrap_err()).contains("`control_plane`"));
    }

    #[test]
    fn a_partial_server_table_keeps_the_roles_own_defaults() {
        let router: RouterConfig =
            from_toml("[server]\ngrpc_addr = \"127.0.0.1:9101\"\n\n[batching]\nenabled = false\n")
                .unwrap();
        assert_eq!(
            router.server.grpc_addr,
            SocketAddr::from(([127, 0, 0, 1], 9101))
        );
        assert_eq!(
            router.server.dev_cert_out,
            PathBuf::from("run/router-dev-cert.pem")
        );
        assert!(!router.batching.enabled);
        assert_eq!(router.batching.max_queries, 256);
        let shard: ShardConfig = from_toml("[server]\nmax_in_flight = 7\n").unwrap();
        assert_eq!(
            shard.server.dev_cert_out,
            PathBuf::from("run/cloud-dev-cert.pem")
        );
        assert_eq!(shard.server.max_in_flight, 7);
    }

    #[test]
    fn unknown_keys_are_refused_in_nested_tables_and_old_flat_keys_too() {
        let nested = from_toml::<ShardConfig>("[server]\nquic_adr = \"127.0.0.1:1\"\n");
        assert!(message(nested.unwrap_err()).contains("quic_adr"));
        let flat = from_toml::<RouterConfig>("batch_max_queries = 8\n");
        assert!(message(flat.unwrap_err()).contains("batch_max_queries"));
    }
}
