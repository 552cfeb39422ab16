//! `hasten-admin`'s configuration (`HASTEN_ADMIN_*`, a TOML file, flags): which nodes to
//! talk to, how to prove who it is, and how to print.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use hasten_core::config::{ConfigError, TlsConfig, Validate};
use hasten_proto::auth::AccessToken;
use hasten_proto::control::ControlAccess;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How results are printed.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum OutputFormat {
    /// Human-readable tables.
    #[default]
    Table,
    /// One JSON document, for scripts.
    Json,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// gRPC addresses (host:port) of the control-plane nodes; `status` asks every one, the
    /// other commands the first that answers (membership goes to the leader).
    pub control_plane: Vec<String>,
    /// Mutual TLS: `tls_ca`, `tls_cert`, `tls_key` and `tls_extra_ca`, at the top level.
    #[serde(flatten)]
    pub tls: TlsConfig,
    /// File holding the control plane's shared token, when it requires one.
    pub token_file: Option<PathBuf>,
    pub output: OutputFormat,
    /// Seconds one call to a node may take.
    pub timeout_s: u64,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            control_plane: vec!["127.0.0.1:7400".into()],
            tls: TlsConfig::default(),
            token_file: None,
            output: OutputFormat::Table,
            timeout_s: 30,
        }
    }
}

impl AdminConfig {
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_s)
    }

    /// The certificate and token the tool shows the nodes, read from their files.
    pub fn access(&self) -> anyhow::Result<ControlAccess> {
        let tls = self.tls.load_mutual()?;
        let token = self
            .token_file
            .as_deref()
            .map(AccessToken::load)
            .transpose()
            .context("reading `token_file`")?;
        Ok(ControlAccess { tls, token })
    }
}

impl Validate for AdminConfig {
    /// Checks values the types allow but the tool cannot use; errors name the key.
    fn validate(&self) -> Result<(), ConfigError> {
        if self.control_plane.is_empty() {
            return Err(ConfigError::invalid(
                "control_plane",
                "names no node: give at least one host:port",
            ));
        }
        if let Some(bad) = self
            .control_plane
            .iter()
            .find(|a| a.is_empty() || a.contains(char::is_whitespace) || !a.contains(':'))
        {
            return Err(ConfigError::invalid(
                "control_plane",
                format!("{bad:?} is not host:port"),
            ));
        }
        if self.timeout_s == 0 {
            return Err(ConfigError::invalid("timeout_s", "must be at least 1"));
        }
        self.tls.mutual_tls()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use display_full_error::DisplayFullErrorExt;

    #[test]
    fn bad_values_are_refused_naming_the_key() {
        let refused = |config: AdminConfig| config.validate().unwrap_err().to_string_full();
        assert!(AdminConfig::default().validate().is_ok());
        let none = AdminConfig {
            control_plane: vec![],
            ..AdminConfig::default()
        };
        assert!(refused(none).contains("`control_plane`"));
        let no_port = AdminConfig {
            control_plane: vec!["node-0".into()],
            ..AdminConfig::default()
        };
        assert!(refused(no_port).contains("\"node-0\""));
        let zero = AdminConfig {
            timeout_s: 0,
            ..AdminConfig::default()
        };
        assert!(refused(zero).contains("`timeout_s`"));
        let half_tls = AdminConfig {
            tls: TlsConfig {
                tls_cert: Some("c.pem".into()),
                ..TlsConfig::default()
            },
            ..AdminConfig::default()
        };
        assert!(refused(half_tls).contains("`tls_ca`"));
    }
}
