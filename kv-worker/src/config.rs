//! `kv-worker serve`'s configuration: defaults, then a TOML file, then `HASTEN_KV_*`
//! variables, then flags; validated at start with a message naming the key.

use std::net::SocketAddr;
use std::path::PathBuf;

use hasten_core::config::{ConfigError, TlsConfig, Validate};
use hasten_core::logging::LogFormat;
use hasten_lm::{DeviceKind, WeightFormat};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::fusion::{ExactPrefix, PrefillOptions, SelectionAttention};
use crate::store::KvDtype;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct KvWorkerConfig {
    /// Log lines as `text` or `json` (one object per line).
    pub log_format: LogFormat,
    /// OTLP/gRPC collector that spans are exported to (`http://otel-collector:4317`), so
    /// that a request is one trace across the processes it crosses; unset: no export.
    pub otlp_endpoint: Option<String>,
    /// gRPC address of the `KvGeneration` service.
    pub grpc_addr: SocketAddr,
    /// Address of `/metrics`, `/readyz` and `/healthz`.
    pub metrics_addr: SocketAddr,
    /// GGUF model (llama or qwen2); the store's entries are this model's. Required.
    pub model: Option<PathBuf>,
    /// The model file's SHA-256 (64 hex digits): the worker refuses to serve another file.
    pub model_sha256: Option<String>,
    /// `cpu`, or `cuda` in a build with the `cuda` feature.
    pub device: DeviceKind,
    /// Weight layout; entries computed under one layout are not another's [default: fast on
    /// cpu, f32 on cuda].
    pub weights: Option<WeightFormat>,
    /// The chunk KV store (`kv-worker preprocess --store`).
    pub store: PathBuf,
    /// How entries are written: `f16` or `f32`.
    pub dtype: KvDtype,
    /// Bytes of chunk KV kept in RAM.
    pub ram_budget: u64,
    /// Bytes of chunk KV kept in GPU memory (CUDA only).
    pub gpu_budget: u64,
    /// Answers waiting behind the one generating; beyond it RESOURCE_EXHAUSTED.
    pub queue: usize,
    /// New tokens when a request asks for 0.
    pub max_new_tokens: usize,
    /// A prompt's first chunk reads its Full Reuse KV whatever variant the request asks for,
    /// and FusionRAG and CacheBlend spend their recompute budget on the other chunks: that
    /// KV was computed right after the system prompt, where the first chunk stands, so it is
    /// exactly a full prefill's (false: every chunk reads the requested variant, as in the
    /// FusionRAG paper).
    pub exact_leading_chunk: bool,
    /// FusionRAG and CacheBlend recompute this many chunks whole, on top of their budget
    /// (which then goes to the chunks after them), right after the exact leading chunk (from
    /// the first when `exact_leading_chunk` is false): their KV then comes out exactly as a
    /// full prefill's, at the cost of their tokens' recomputation (0: none, as in the
    /// FusionRAG paper).
    pub recompute_whole_chunks: usize,
    /// FusionRAG and CacheBlend also recompute this many of the other chunks whole, on top
    /// of their budget: those whose tokens score highest in sum (for FusionRAG, the chunks the
    /// question attends to most), wherever they stand (0: none, as in the FusionRAG paper).
    pub recompute_attended_chunks: usize,
    /// The question's attention that FusionRAG picks tokens by: `last-layer` (the FusionRAG
    /// paper's) or `all-layers` (summed over every layer).
    pub selection_attention: SelectionAttention,
    /// Mutual TLS: `tls_ca`, `tls_cert`, `tls_key` and `tls_extra_ca`, at the top level.
    #[serde(flatten)]
    pub tls: TlsConfig,
    /// When set, a JSON file with the bound addresses is written here once serving.
    pub ready_file: Option<PathBuf>,
}

impl Default for KvWorkerConfig {
    fn default() -> Self {
        Self {
            log_format: LogFormat::default(),
            otlp_endpoint: None,
            grpc_addr: SocketAddr::from(([127, 0, 0, 1], 7510)),
            metrics_addr: SocketAddr::from(([127, 0, 0, 1], 7512)),
            model: None,
            model_sha256: None,
            device: DeviceKind::Cpu,
            weights: None,
            store: PathBuf::from("kv-store"),
            dtype: KvDtype::F16,
            ram_budget: 1 << 30,
            gpu_budget: 2 << 30,
            queue: 16,
            max_new_tokens: 64,
            exact_leading_chunk: true,
            recompute_whole_chunks: 0,
            recompute_attended_chunks: 0,
            selection_attention: SelectionAttention::LastLayer,
            tls: TlsConfig::default(),
            ready_file: None,
        }
    }
}

impl KvWorkerConfig {
    /// The weight layout in use.
    pub fn weights(&self) -> WeightFormat {
        self.weights.unwrap_or(match self.device {
            DeviceKind::Cpu => WeightFormat::Fast,
            DeviceKind::Cuda => WeightFormat::F32,
        })
    }

    /// How FusionRAG and CacheBlend prefill: which leading chunks come out exact, and the
    /// attention FusionRAG selects by.
    pub fn prefill_options(&self) -> PrefillOptions {
        PrefillOptions {
            exact: ExactPrefix {
                stored_leading: self.exact_leading_chunk,
                whole_chunks: self.recompute_whole_chunks,
            },
            selection: self.selection_attention,
            attended_chunks: self.recompute_attended_chunks,
        }
    }
}

impl Validate for KvWorkerConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        hasten_core::config::check_otlp_endpoint(self.otlp_endpoint.as_deref())?;
        if self.model.is_none() {
            return Err(ConfigError::invalid(
                "model",
                "is required: the GGUF model whose chunk KV the store holds",
            ));
        }
        if let Some(sha) = &self.model_sha256
            && !(sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err(ConfigError::invalid(
                "model_sha256",
                format!("{sha:?} is not 64 hex digits"),
            ));
        }
        if self.queue == 0 {
            return Err(ConfigError::invalid("queue", "must be at least 1"));
        }
        if self.max_new_tokens == 0 {
            return Err(ConfigError::invalid("max_new_tokens", "must be at least 1"));
        }
        if self.store.as_os_str().is_empty() {
            return Err(ConfigError::invalid("store", "must name a directory"));
        }
        self.tls.mutual_tls()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_model_is_required_and_bad_values_name_their_key() {
        let key = |config: KvWorkerConfig| match config.validate().unwrap_err() {
            ConfigError::Invalid { key, .. } => key,
            other => panic!("{other}"),
        };
        assert_eq!(key(KvWorkerConfig::default()), "model");
        let good = KvWorkerConfig {
            model: Some("m.gguf".into()),
            ..KvWorkerConfig::default()
        };
        good.validate().unwrap();
        for (bad, expected) in [
            (
                KvWorkerConfig {
                    queue: 0,
                    ..good.clone()
                },
                "queue",
            ),
            (
                KvWorkerConfig {
                    max_new_tokens: 0,
                    ..good.clone()
                },
                "max_new_tokens",
            ),
            (
                KvWorkerConfig {
                    model_sha256: Some("abc".into()),
                    ..good.clone()
                },
                "model_sha256",
            ),
            (
                KvWorkerConfig {
                    tls: TlsConfig {
                        tls_ca: Some("ca.pem".into()),
                        ..TlsConfig::default()
                    },
                    ..good.clone()
                },
                "tls_ca",
            ),
        ] {
            assert_eq!(key(bad), expected);
        }
        assert_eq!(good.weights(), WeightFormat::Fast);
    }
}
