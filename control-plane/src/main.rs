//! `control-plane`: one node of Hasten's Raft control plane.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{CommandFactory, Parser};
use hasten_control_plane::config::ControlPlaneConfig;
use hasten_control_plane::metrics::NodeMetrics;
use hasten_control_plane::node;
use hasten_control_plane::service::ControlPlaneService;
use hasten_control_plane::storage::RaftStorage;
use hasten_control_plane::transport::grpc::{GrpcTransport, RaftPeerService};
use hasten_core::config::{
    ConfigSource, TlsConfig, help_with_defaults, parse_command, resolve_config,
};
use hasten_core::lifecycle::{shutdown_signal, write_atomically};
use hasten_core::logging::LogArgs;
use hasten_core::metrics::ReadinessCheck;
use hasten_proto::auth::{AccessToken, RequireToken};
use hasten_proto::control::ControlAccess;
use hasten_proto::control::MAX_MESSAGE_BYTES;
use hasten_proto::encoded_events::control_plane_server::ControlPlaneServer;
use hasten_proto::grpc_tls;
use hasten_proto::health::readiness_health;
use hasten_proto::v1::raft_peer_server::RaftPeerServer;
use serde::Serialize;
use tonic::service::interceptor::InterceptedService;

/// One node of Hasten's control plane: replicates the hot cache, the shard map and runtime
/// configuration with Raft, persisted in its own write-ahead log, and streams committed
/// events to edges.
// Flags only for what differs between processes that share one file; the rule is
// docs/configuration.md's "Flags".
#[derive(Parser, Serialize)]
#[command(version)]
struct Cli {
    #[command(flatten)]
    #[serde(skip)]
    source: ConfigSource,
    #[command(flatten)]
    #[serde(flatten)]
    log: LogArgs,
    /// This node's Raft id.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<u64>,
    /// gRPC address for clients and peers.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    listen: Option<std::net::SocketAddr>,
    /// TCP address for /metrics, /readyz and /healthz.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// A founding member as id=host:port (repeat; include this node).
    #[arg(long = "peer", value_name = "ID=ADDR")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    peers: Vec<String>,
    /// Join an existing group instead of founding one.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    join: Option<bool>,
    /// With --join: ask the group to add this node (at its own --peer address).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    auto_join: Option<bool>,
    /// Data directory (Raft log, snapshot, events).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    data_dir: Option<PathBuf>,
    /// Write the listening address here once serving.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    ready_file: Option<PathBuf>,
    #[command(flatten)]
    #[serde(flatten)]
    tls: TlsConfig,
    /// File holding the shared token every call must carry (for a deployment without
    /// mutual TLS).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    auth_token_file: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli: Cli = parse_command(help_with_defaults::<ControlPlaneConfig>(Cli::command()));
    let Some(config) = resolve_config::<ControlPlaneConfig, _>(&cli.source, "HASTEN_CP_", &cli)?
    else {
        return Ok(());
    };
    let _traces = hasten_core::logging::init_with_traces(
        config.log_format,
        config.otlp_endpoint.as_deref(),
        "hasten-control-plane",
    )?;
    let tls = config.tls.load_mutual()?;
    let token = config
        .auth_token_file
        .as_deref()
        .map(AccessToken::load)
        .transpose()?;
    match (&tls, &token) {
        (None, None) => tracing::warn!(
            "neither mutual TLS nor a token: any client that reaches this loopback port is trusted"
        ),
        (None, Some(_)) => {
            tracing::warn!("mutual TLS is off: calls carry the shared token, but in plaintext gRPC")
        }
        (Some(_), _) => {}
    }
    let access = ControlAccess {
        tls: tls.clone(),
        token: token.clone(),
    };
    let storage = RaftStorage::open(&config.data_dir, config.id)
        .with_context(|| format!("opening {}", config.data_dir.display()))?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    let address = listener.local_addr()?;
    let registry = hasten_core::metrics::registry()?;
    let metrics = NodeMetrics::register(&registry)?;
    let grpc_tls_config = hasten_core::metrics::reloading_grpc_tls(&registry, tls.as_ref())?;
    let ready: ReadinessCheck = {
        let metrics = metrics.clone();
        Arc::new(move || metrics.readiness())
    };
    let metrics_addr = hasten_core::metrics::serve(
        config.metrics_addr,
        registry,
        Arc::new(|| {}),
        ready.clone(),
    )
    .await
    .with_context(|| format!("binding the metrics listener on {}", config.metrics_addr))?;
    let runtime = tokio::runtime::Handle::current();
    let node = node::start(
        config.node_settings(),
        storage,
        &config.members()?,
        config.join,
        metrics,
        |members, requests| GrpcTransport::new(config.id, members, requests, access, runtime),
    )?;
    tracing::info!(id = config.id, %address, %metrics_addr, data_dir = %config.data_dir.display(), "control-plane node serving");
    if let Some(path) = &config.ready_file {
        let ready = serde_json::json!({
            "id": config.id,
            "address": address.to_string(),
            "metrics_addr": metrics_addr.to_string(),
        });
        write_atomically(path, ready.to_string().as_bytes())?;
    }
    if config.auto_join {
        let members = config.members()?;
        let own = members.get(&config.id).cloned().unwrap_or_default();
        let others: Vec<String> = members
            .iter()
            .filter(|(id, _)| **id != config.id)
            .map(|(_, address)| address.clone())
            .collect();
        tokio::spawn(hasten_control_plane::join::join_group(
            config.id,
            own,
            others,
            ControlAccess {
                tls: tls.clone(),
                token: token.clone(),
            },
        ));
    }
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let require_token = RequireToken::new(token);
    let client_api = InterceptedService::new(
        ControlPlaneServer::new(ControlPlaneService::new(
            node.clone(),
            config.propose_timeout(),
            stopping.clone(),
        ))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES),
        require_token.clone(),
    );
    let peer_api = InterceptedService::new(
        RaftPeerServer::new(RaftPeerService::new(node.requests()))
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
        require_token,
    );
    let mut stopped = stopping;
    let router = tonic::transport::Server::builder()
        .add_service(client_api)
        .add_service(peer_api)
        // Outside the token check, like /readyz: it tells only whether the node is ready.
        .add_service(readiness_health(ready));
    let serving = grpc_tls::serve(router, listener, grpc_tls_config, async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    });
    tokio::pin!(serving);
    tokio::select! {
        served = &mut serving => served?,
        () = shutdown_signal() => {
            // Subscriber streams end, the listener closes, and calls in flight get a
            // bounded time to finish: the process exits (and frees its store's lock) even
            // when a client holds a connection open.
            let _ = stop.send(true);
            match tokio::time::timeout(SHUTDOWN_GRACE, serving).await {
                Ok(served) => served?,
                Err(_) => tracing::warn!(
                    grace = ?SHUTDOWN_GRACE,
                    "connections still open after the shutdown grace period; exiting anyway"
                ),
            }
        }
        () = node.stopped() => {
            anyhow::bail!(
                "the Raft node of control-plane node {} stopped (see the error above); exiting \
                 rather than serving without consensus",
                config.id
            );
        }
    }
    tracing::info!("stopped");
    Ok(())
}

/// How long calls in flight may take to finish after a shutdown signal.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);
