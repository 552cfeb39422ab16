//! `kv-operator run`'s configuration: defaults, then a TOML file, then
//! `HASTEN_KV_OPERATOR_*` variables, then flags; validated at start with a message naming the
//! key.

use std::net::SocketAddr;
use std::path::PathBuf;

use hasten_core::config::{ConfigError, TlsConfig, Validate};
use hasten_core::logging::LogFormat;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct OperatorConfig {
    /// Log lines as `text` or `json` (one object per line).
    pub log_format: LogFormat,
    /// OTLP/gRPC collector that spans are exported to (`http://otel-collector:4317`), so
    /// that a request is one trace across the processes it crosses; unset: no export.
    pub otlp_endpoint: Option<String>,
    /// Namespace whose pools are reconciled [default: the client's, i.e. the pod's own].
    pub namespace: Option<String>,
    /// Image holding `kv-worker`, for pools that name none.
    pub worker_image: String,
    /// Cluster DNS domain, for the workers' stable addresses.
    pub cluster_domain: String,
    /// Secret (`ca.crt`, `tls.crt`, `tls.key`, e.g. the deployment's mutual-TLS Secret) the
    /// workers serve mutual TLS with; its certificate must name `*.<pool>.<namespace>.svc.<domain>`.
    /// None: plaintext gRPC (edges under mutual TLS cannot reach such workers).
    pub worker_tls_secret: Option<String>,
    /// ConfigMap whose `ca.crt` holds CA certificates the workers trust besides the
    /// Secret's `ca.crt` (a CA rotation). Only with `worker_tls_secret`.
    pub worker_extra_ca_config_map: Option<String>,
    /// Address of `/metrics`, `/readyz` and `/healthz`.
    pub metrics_addr: SocketAddr,
    /// Take part in leader election (off only for a single replica run by hand).
    pub leader_election: bool,
    /// The Lease that elects the acting replica (in `namespace`).
    pub lease_name: String,
    /// This replica's identity in the lease [default: the host name, i.e. the pod's name].
    pub identity: Option<String>,
    /// Seconds a holder keeps the lease without renewing it.
    pub lease_duration_s: u64,
    /// Seconds between renewals.
    pub lease_renew_s: u64,
    /// Seconds without a renewal after which the holder stops acting (below
    /// `lease_duration_s`, so it stops before anyone may take over).
    pub lease_deadline_s: u64,
    /// Control-plane nodes (gRPC host:port) that receive each pool's chunk-to-worker
    /// assignment; none: assignments are not published.
    pub control_plane: Vec<String>,
    /// File holding the control plane's shared token.
    pub control_plane_token_file: Option<PathBuf>,
    /// Mutual TLS: `tls_ca`, `tls_cert`, `tls_key` and `tls_extra_ca`, at the top level.
    #[serde(flatten)]
    pub tls: TlsConfig,
}

impl Default for OperatorConfig {
    fn default() -> Self {
        Self {
            log_format: LogFormat::default(),
            otlp_endpoint: None,
            namespace: None,
            worker_image: "ghcr.io/hasten-rag/hasten:0.1.0".into(),
            cluster_domain: "cluster.local".into(),
            worker_tls_secret: None,
            worker_extra_ca_config_map: None,
            metrics_addr: SocketAddr::from(([127, 0, 0, 1], 7600)),
            leader_election: true,
            lease_name: "hasten-kv-operator".into(),
            identity: None,
            lease_duration_s: 15,
            lease_renew_s: 5,
            lease_deadline_s: 10,
            control_plane: Vec::new(),
            control_plane_token_file: None,
            tls: TlsConfig::default(),
        }
    }
}

impl Validate for OperatorConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        hasten_core::config::check_otlp_endpoint(self.otlp_endpoint.as_deref())?;
        if self.worker_image.trim().is_empty() {
            return Err(ConfigError::invalid("worker_image", "must name an image"));
        }
        if self.cluster_domain.trim().is_empty() {
            return Err(ConfigError::invalid("cluster_domain", "must not be empty"));
        }
        if self.lease_name.trim().is_empty() {
            return Err(ConfigError::invalid("lease_name", "must not be empty"));
        }
        if self.lease_renew_s == 0 {
            return Err(ConfigError::invalid("lease_renew_s", "must be at least 1"));
        }
        if !(self.lease_renew_s < self.lease_deadline_s
            && self.lease_deadline_s < self.lease_duration_s)
        {
            return Err(ConfigError::invalid(
                "lease_deadline_s",
                format!(
                    "{}: renewals ({} s) < deadline < duration ({} s) keeps a replica that \
                     cannot renew from acting after another may take over",
                    self.lease_deadline_s, self.lease_renew_s, self.lease_duration_s
                ),
            ));
        }
        if self.control_plane.is_empty()
            && (self.control_plane_token_file.is_some() || self.tls.tls_ca.is_some())
        {
            return Err(ConfigError::invalid(
                if self.tls.tls_ca.is_some() {
                    "tls_ca"
                } else {
                    "control_plane_token_file"
                },
                "is given but `control_plane` names no node",
            ));
        }
        if self.worker_extra_ca_config_map.is_some() && self.worker_tls_secret.is_none() {
            return Err(ConfigError::invalid(
                "worker_extra_ca_config_map",
                "adds to the workers' mutual TLS: it needs `worker_tls_secret`",
            ));
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
    fn defaults_validate_and_bad_values_name_their_key() {
        OperatorConfig::default().validate().unwrap();
        let key = |config: OperatorConfig| match config.validate().unwrap_err() {
            ConfigError::Invalid { key, .. } => key,
            other => panic!("{other}"),
        };
        let good = OperatorConfig::default();
        assert_eq!(
            key(OperatorConfig {
                worker_image: " ".into(),
                ..good.clone()
            }),
            "worker_image"
        );
        assert_eq!(
            key(OperatorConfig {
                lease_deadline_s: 20,
                ..good.clone()
            }),
            "lease_deadline_s"
        );
        assert_eq!(
            key(OperatorConfig {
                lease_renew_s: 0,
                ..good.clone()
            }),
            "lease_renew_s"
        );
        assert_eq!(
            key(OperatorConfig {
                control_plane_token_file: Some("token".into()),
                ..good.clone()
            }),
            "control_plane_token_file"
        );
        assert_eq!(
            key(OperatorConfig {
                control_plane: vec!["cp-0:7400".into()],
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
