//! Configuration of `cloud-index serve`: defaults < TOML file < `HASTEN_CLOUD_*` env < flags.

use std::net::SocketAddr;
use std::path::PathBuf;

use hasten_core::config::ConfigError;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CloudConfig {
    /// Corpus bundle to serve (made by `cloud-index build`). Required.
    pub bundle: Option<PathBuf>,
    /// UDP address of the QUIC fast path used by edges.
    pub quic_addr: SocketAddr,
    /// TCP address of the gRPC API.
    pub grpc_addr: SocketAddr,
    /// PEM certificate chain for QUIC TLS; with `tls_key`. When both are absent a
    /// self-signed dev certificate is generated.
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for QUIC TLS.
    pub tls_key: Option<PathBuf>,
    /// Where the generated dev certificate is written, for edges to trust (`--cloud-ca`).
    pub dev_cert_out: PathBuf,
    /// DNS names and IP addresses the dev certificate is valid for.
    pub dev_cert_names: Vec<String>,
    /// When set, a JSON file with the bound addresses is written here once serving.
    pub ready_file: Option<PathBuf>,
}

impl Default for CloudConfig {
    fn default() -> Self {
        Self {
            bundle: None,
            quic_addr: SocketAddr::from(([127, 0, 0, 1], 7100)),
            grpc_addr: SocketAddr::from(([127, 0, 0, 1], 7101)),
            tls_cert: None,
            tls_key: None,
            dev_cert_out: PathBuf::from("run/cloud-dev-cert.pem"),
            dev_cert_names: vec!["localhost".into(), "127.0.0.1".into()],
            ready_file: None,
        }
    }
}

impl CloudConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.bundle.is_none() {
            return Err(ConfigError::invalid(
                "bundle",
                "is required: the corpus bundle directory made by `cloud-index build`",
            ));
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(ConfigError::invalid(
                "tls_cert",
                "and `tls_key` must be given together",
            ));
        }
        if self.tls_cert.is_none() && self.dev_cert_names.is_empty() {
            return Err(ConfigError::invalid(
                "dev_cert_names",
                "must name at least one host for the generated dev certificate",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_need_a_bundle_and_paired_tls_files() {
        let mut config = CloudConfig::default();
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("`bundle`")
        );
        config.bundle = Some("b".into());
        config.validate().unwrap();
        config.tls_cert = Some("cert.pem".into());
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("tls_key")
        );
    }
}
