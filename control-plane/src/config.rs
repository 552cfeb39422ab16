//! The control-plane node's configuration (`HASTEN_CP_*`, a TOML file, flags).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use hasten_core::config::{ConfigError, TlsConfig, Validate};
use hasten_core::logging::LogFormat;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::node::NodeSettings;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ControlPlaneConfig {
    /// Log lines as `text` or `json` (one object per line).
    pub log_format: LogFormat,
    /// OTLP/gRPC collector that spans are exported to (`http://otel-collector:4317`), so
    /// that a request is one trace across the processes it crosses; unset: no export.
    pub otlp_endpoint: Option<String>,
    /// This node's Raft id (non-zero, unique in the group).
    #[schemars(range(min = 1))]
    pub id: u64,
    /// gRPC address for clients (edges, operators) and peers.
    pub listen: SocketAddr,
    /// TCP address of `/metrics`, `/readyz` (a voting member that knows its leader) and
    /// `/healthz`.
    pub metrics_addr: SocketAddr,
    /// The founding members as `id=host:port`, this node included; every founding node
    /// lists the same set. Ignored once the data directory holds Raft state.
    pub peers: Vec<String>,
    /// Start without founding a group and wait to be added (`AddNode` on the leader).
    pub join: bool,
    /// With `join`: ask the group to add this node (its address: its own entry in `peers`,
    /// which lists the members to ask) instead of waiting for an operator. The chart sets
    /// it for the ordinals a scale-up adds.
    pub auto_join: bool,
    /// Data directory: the Raft log (`raft-wal/`), the snapshot, and sled for members.
    pub data_dir: PathBuf,
    /// Raft tick. Elections fire after `election_ticks` ticks without a leader.
    #[schemars(range(min = 1))]
    pub tick_ms: u64,
    /// Ticks without hearing from a leader before an election (raft-rs's default, 10).
    #[schemars(range(min = 2))]
    pub election_ticks: usize,
    /// Ticks between leader heartbeats (raft-rs's default, 3).
    #[schemars(range(min = 1))]
    pub heartbeat_ticks: usize,
    /// Applied log entries kept before the state is snapshotted and the log truncated
    /// (etcd's `--snapshot-count` default, 100,000; `max_log_bytes` usually comes first).
    #[schemars(range(min = 1))]
    pub max_log_entries: u64,
    /// Payload bytes of applied log entries kept before the same (a log entry batches
    /// many cache entries of ~1.6 KB each).
    #[schemars(range(min = 1))]
    pub max_log_bytes: u64,
    /// Committed events kept behind a compaction point, so that a subscriber a little
    /// behind resumes from events rather than receiving the whole state.
    pub retained_events: u64,
    /// How long a proposal waits for its commit before the caller is told to retry.
    #[schemars(range(min = 1))]
    pub propose_timeout_ms: u64,
    /// File written (atomically) with the listening address once the node serves.
    pub ready_file: Option<PathBuf>,
    /// Mutual TLS: `tls_ca`, `tls_cert`, `tls_key` and `tls_extra_ca`, at the top level.
    #[serde(flatten)]
    pub tls: TlsConfig,
    /// File holding the shared token (`hasten_proto::auth`) every call must carry, peers'
    /// included; the node sends it to its peers. Without mutual TLS, required unless
    /// `listen` is a loopback address.
    pub auth_token_file: Option<PathBuf>,
}

impl Default for ControlPlaneConfig {
    fn default() -> Self {
        Self {
            log_format: LogFormat::default(),
            otlp_endpoint: None,
            id: 1,
            listen: SocketAddr::from(([127, 0, 0, 1], 7400)),
            metrics_addr: SocketAddr::from(([127, 0, 0, 1], 7402)),
            peers: vec!["1=127.0.0.1:7400".into()],
            join: false,
            auto_join: false,
            data_dir: PathBuf::from("run/control-plane"),
            tick_ms: 100,
            election_ticks: 10,
            heartbeat_ticks: 3,
            max_log_entries: 100_000,
            max_log_bytes: 256 * 1024 * 1024,
            retained_events: 2_048,
            propose_timeout_ms: 5_000,
            ready_file: None,
            tls: TlsConfig::default(),
            auth_token_file: None,
        }
    }
}

impl ControlPlaneConfig {
    /// The founding members by id.
    pub fn members(&self) -> Result<BTreeMap<u64, String>, ConfigError> {
        let mut members = BTreeMap::new();
        for peer in &self.peers {
            let (id, address) = peer.split_once('=').ok_or_else(|| {
                ConfigError::invalid("peers", format!("`{peer}` is not `id=host:port`"))
            })?;
            let id: u64 = id.trim().parse().map_err(|_| {
                ConfigError::invalid("peers", format!("`{peer}`: the id is not a number"))
            })?;
            let address = address.trim();
            if id == 0 || address.is_empty() {
                return Err(ConfigError::invalid(
                    "peers",
                    format!("`{peer}` needs a non-zero id and an address"),
                ));
            }
            if members.insert(id, address.to_string()).is_some() {
                return Err(ConfigError::invalid(
                    "peers",
                    format!("id {id} is listed twice"),
                ));
            }
        }
        Ok(members)
    }

    /// The node's tunables.
    pub fn node_settings(&self) -> NodeSettings {
        NodeSettings {
            id: self.id,
            tick: Duration::from_millis(self.tick_ms),
            election_ticks: self.election_ticks,
            heartbeat_ticks: self.heartbeat_ticks,
            max_log_entries: self.max_log_entries,
            max_log_bytes: self.max_log_bytes,
            retained_events: self.retained_events,
        }
    }

    pub fn propose_timeout(&self) -> Duration {
        Duration::from_millis(self.propose_timeout_ms)
    }
}

impl Validate for ControlPlaneConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        hasten_core::config::check_otlp_endpoint(self.otlp_endpoint.as_deref())?;
        if self.id == 0 {
            return Err(ConfigError::invalid(
                "id",
                "must be non-zero (Raft reserves 0)",
            ));
        }
        let members = self.members()?;
        if !self.join && !members.contains_key(&self.id) {
            return Err(ConfigError::invalid(
                "peers",
                format!(
                    "must list this node (id {}) among the founding members",
                    self.id
                ),
            ));
        }
        if self.auto_join && !(self.join && members.contains_key(&self.id)) {
            return Err(ConfigError::invalid(
                "auto_join",
                format!(
                    "needs `join = true` and this node's own address in `peers` (as {}=host:port)",
                    self.id
                ),
            ));
        }
        if self.tick_ms == 0 {
            return Err(ConfigError::invalid("tick_ms", "must be positive"));
        }
        if self.heartbeat_ticks == 0 || self.election_ticks <= self.heartbeat_ticks {
            return Err(ConfigError::invalid(
                "election_ticks",
                "must exceed heartbeat_ticks, which must be positive",
            ));
        }
        if self.max_log_entries == 0 || self.max_log_bytes == 0 {
            return Err(ConfigError::invalid(
                "max_log_entries",
                "and `max_log_bytes` must be positive",
            ));
        }
        if self.propose_timeout_ms == 0 {
            return Err(ConfigError::invalid(
                "propose_timeout_ms",
                "must be positive",
            ));
        }
        if self.tls.mutual_tls()?.is_none()
            && self.auth_token_file.is_none()
            && !self.listen.ip().is_loopback()
        {
            return Err(ConfigError::invalid(
                "auth_token_file",
                format!(
                    "is required when `listen` ({}) is not a loopback address and mutual TLS is off: otherwise anyone who reaches the port can read every cached query and write entries into users' replies",
                    self.listen
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
    fn defaults_are_valid_and_bad_peers_are_named() {
        ControlPlaneConfig::default().validate().unwrap();
        let mut config = ControlPlaneConfig {
            peers: vec!["1=127.0.0.1:1".into(), "x=127.0.0.1:2".into()],
            ..ControlPlaneConfig::default()
        };
        let err = config.validate().unwrap_err().to_string_full();
        assert!(err.contains("`x=127.0.0.1:2`"), "{err}");
        config.peers = vec!["2=127.0.0.1:2".into()];
        let err = config.validate().unwrap_err().to_string_full();
        assert!(err.contains("must list this node (id 1)"), "{err}");
        config.join = true;
        config.validate().unwrap();
        config.auto_join = true;
        let err = config.validate().unwrap_err().to_string_full();
        assert!(err.contains("`auto_join`"), "{err}");
        config.peers.push("1=127.0.0.1:1".into());
        config.validate().unwrap();
        config.peers = vec!["2=a:1".into(), "2=b:1".into()];
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string_full()
                .contains("twice")
        );
    }
}
