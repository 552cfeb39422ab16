//! The worker's configuration: defaults, then a TOML file, then `HASTEN_WORKER_*`
//! variables, then flags; validated at start with a message naming the key.

use std::net::SocketAddr;
use std::path::PathBuf;

use hasten_core::config::{ConfigError, TlsConfig, Validate};
use hasten_core::logging::LogFormat;
use hasten_rag::{DeviceKind, WeightFormat};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerConfig {
    /// Log lines as `text` or `json` (one object per line).
    pub log_format: LogFormat,
    /// OTLP/gRPC collector that spans are exported to (`http://otel-collector:4317`), so
    /// that a request is one trace across the processes it crosses; unset: no export.
    pub otlp_endpoint: Option<String>,
    /// gRPC address of the `Generation` service.
    pub grpc_addr: SocketAddr,
    /// Address of `/metrics`, `/readyz` and `/healthz`.
    pub metrics_addr: SocketAddr,
    /// GGUF model (llama or qwen2) that writes standard answers and verifies speculative
    /// drafts. Required.
    pub lm_model: Option<PathBuf>,
    /// Small GGUF model that writes Speculative RAG's drafts; `lm_model` when absent.
    pub lm_drafter: Option<PathBuf>,
    /// `cpu`, or `cuda` in a build with the `cuda` feature.
    pub lm_device: DeviceKind,
    /// How the weights are held: `fast` (the fastest on CPU), `q8_0`, `f32` or `as_stored`.
    pub lm_weights: WeightFormat,
    /// Answers waiting behind the one generating; beyond it RESOURCE_EXHAUSTED.
    pub queue: usize,
    /// Mutual TLS: `tls_ca`, `tls_cert`, `tls_key` and `tls_extra_ca`, at the top level.
    #[serde(flatten)]
    pub tls: TlsConfig,
    /// When set, a JSON file with the bound addresses is written here once serving.
    pub ready_file: Option<PathBuf>,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            log_format: LogFormat::default(),
            otlp_endpoint: None,
            grpc_addr: SocketAddr::from(([127, 0, 0, 1], 7500)),
            metrics_addr: SocketAddr::from(([127, 0, 0, 1], 7502)),
            lm_model: None,
            lm_drafter: None,
            lm_device: DeviceKind::Cpu,
            lm_weights: WeightFormat::Fast,
            // As the edge's: a 135M model answers in about a second on 2 cores.
            queue: 16,
            tls: TlsConfig::default(),
            ready_file: None,
        }
    }
}

impl Validate for WorkerConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        hasten_core::config::check_otlp_endpoint(self.otlp_endpoint.as_deref())?;
        if self.lm_model.is_none() {
            return Err(ConfigError::invalid(
                "lm_model",
                "is required: the GGUF model this worker answers with",
            ));
        }
        if self.queue == 0 {
            return Err(ConfigError::invalid("queue", "must be at least 1"));
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
        let key = |config: WorkerConfig| match config.validate().unwrap_err() {
            ConfigError::Invalid { key, .. } => key,
            other => panic!("{other}"),
        };
        assert_eq!(key(WorkerConfig::default()), "lm_model");
        let good = WorkerConfig {
            lm_model: Some("m.gguf".into()),
            ..WorkerConfig::default()
        };
        good.validate().unwrap();
        assert_eq!(
            key(WorkerConfig {
                queue: 0,
                ..good.clone()
            }),
            "queue"
        );
        assert_eq!(
            key(WorkerConfig {
                tls: TlsConfig {
                    tls_ca: Some("ca.pem".into()),
                    ..TlsConfig::default()
                },
                ..good
            }),
            "tls_ca"
        );
    }
}
