//! `cloud-index`: build corpus bundles and serve exact search over them.

mod app;
mod progress;

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Result;
use app::build::BuildArgs;
use clap::{Args, CommandFactory, Parser, Subcommand};
use hasten_cloud_index::config::{RouterConfig, ShardConfig};
use hasten_core::config::{
    ConfigSource, TlsConfig, help_with_defaults, parse_command, resolve_config,
};
use hasten_core::logging::LogArgs;
use serde::Serialize;

#[derive(Parser)]
#[command(
    name = "cloud-index",
    version,
    about = "Hasten cloud tier: exact vector search over a corpus, sharded behind a router"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Encode a corpus into a bundle (vectors, texts, manifest); reuses vectors of a bundle
    /// already at the output path. With --shards, also cut it into shard bundles.
    Build(BuildArgs),
    /// Serve exact search over a bundle (a shard, or a whole corpus) on QUIC and gRPC.
    Serve(ServeArgs),
    /// Route searches over shard servers: fan out to one live replica per shard, merge.
    Route(RouteArgs),
}

// Flags only for what differs between processes that share one file; the rule is
// docs/configuration.md's "Flags".
#[derive(Args, Serialize)]
struct ServeArgs {
    #[command(flatten)]
    #[serde(skip)]
    source: ConfigSource,
    #[command(flatten)]
    #[serde(flatten)]
    log: LogArgs,
    /// Corpus bundle directory.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    bundle: Option<PathBuf>,
    #[command(flatten)]
    server: ServerArgs,
    #[command(flatten)]
    #[serde(flatten)]
    tls: TlsConfig,
}

/// What shard servers and routers share, the `[server]` table: where they listen and how
/// they report themselves.
#[derive(Args, Serialize)]
struct ServerArgs {
    /// UDP address for QUIC.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    quic_addr: Option<SocketAddr>,
    /// TCP address for gRPC.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    grpc_addr: Option<SocketAddr>,
    /// TCP address for /metrics, /readyz and /healthz.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    metrics_addr: Option<SocketAddr>,
    /// Where to write the generated dev certificate.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    dev_cert_out: Option<PathBuf>,
    /// Write the bound addresses as JSON to this file once serving.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    ready_file: Option<PathBuf>,
}

#[derive(Args, Serialize)]
struct RouteArgs {
    #[command(flatten)]
    #[serde(skip)]
    source: ConfigSource,
    #[command(flatten)]
    #[serde(flatten)]
    log: LogArgs,
    /// One shard's replicas as comma-separated gRPC endpoints (host:port); repeat once per
    /// shard, in shard order.
    #[arg(long = "shard", value_name = "ENDPOINTS")]
    #[serde(skip)]
    shard: Vec<String>,
    /// The shard map assembled from --shard.
    #[arg(skip)]
    #[serde(skip_serializing_if = "Option::is_none")]
    shards: Option<Vec<Vec<String>>>,
    /// A control-plane node's gRPC address (repeat for each): the router then follows the
    /// shard map the control plane replicates, starting from the --shard map.
    #[arg(long = "control-plane", value_name = "HOST:PORT")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    control_plane: Vec<String>,
    /// File holding the control plane's shared token, for a control plane without mutual TLS.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    control_plane_token_file: Option<PathBuf>,
    #[command(flatten)]
    server: ServerArgs,
    #[command(flatten)]
    #[serde(flatten)]
    tls: TlsConfig,
}

impl RouteArgs {
    /// `--shard a:port,b:port` (once per shard) as the `shards` key.
    fn shards_from_flags(&mut self) {
        if !self.shard.is_empty() {
            self.shards = Some(
                self.shard
                    .iter()
                    .map(|replicas| {
                        replicas
                            .split(',')
                            .map(str::trim)
                            .filter(|e| !e.is_empty())
                            .map(String::from)
                            .collect()
                    })
                    .collect(),
            );
        }
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let command = Cli::command()
        .mut_subcommand("serve", help_with_defaults::<ShardConfig>)
        .mut_subcommand("route", help_with_defaults::<RouterConfig>);
    match parse_command::<Cli>(command).command {
        Command::Build(args) => app::build::build(args).await,
        Command::Serve(args) => {
            match resolve_config::<ShardConfig, _>(&args.source, "HASTEN_CLOUD_", &args)? {
                Some(config) => app::shard::serve(config).await,
                None => Ok(()),
            }
        }
        Command::Route(mut args) => {
            args.shards_from_flags();
            match resolve_config::<RouterConfig, _>(&args.source, "HASTEN_ROUTER_", &args)? {
                Some(config) => app::router::serve(config).await,
                None => Ok(()),
            }
        }
    }
}
