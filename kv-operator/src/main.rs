//! `kv-operator`: runs the `KvWorkerPool` controller (`run`), or prints the CRD (`crd`).
//!
//! Its own binary rather than a subcommand of `kv-worker`: it runs under its own service
//! account with RBAC for the objects it manages, as a small Deployment that holds a leader
//! lease, and needs neither the model runtime nor a GPU.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use clap::{Args, CommandFactory, Parser, Subcommand};
use hasten_core::config::{
    ConfigSource, TlsConfig, help_with_defaults, parse_command, resolve_config,
};
use hasten_core::logging::LogArgs;
use hasten_kv_operator::config::OperatorConfig;
use hasten_kv_operator::controller;
use hasten_kv_operator::crd::KvWorkerPool;
use hasten_kv_operator::lease::{LeaderLease, LeaseSettings};
use hasten_kv_operator::metrics::OperatorMetrics;
use hasten_kv_operator::publish::ControlPlanePublisher;
use hasten_kv_operator::reconcile::Context;
use hasten_kv_operator::resources::RenderSettings;
use hasten_proto::auth::AccessToken;
use hasten_proto::control::ControlAccess;
use kube::CustomResourceExt;
use kube::runtime::events::{Recorder, Reporter};
use serde::Serialize;

#[derive(Parser)]
#[command(
    name = "kv-operator",
    version,
    about = "Kubernetes operator for Hasten's FusionRAG KV workers (KvWorkerPool, hasten.dev/v1alpha1)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Reconcile the KvWorkerPools of a namespace (holding the leader lease first).
    Run(Box<RunArgs>),
    /// Print the CustomResourceDefinition, as YAML (the chart's crds/ holds the same).
    Crd,
}

#[derive(Args, Serialize)]
struct RunArgs {
    #[command(flatten)]
    #[serde(skip)]
    source: ConfigSource,
    #[command(flatten)]
    #[serde(flatten)]
    log: LogArgs,
    /// Namespace whose pools are reconciled [default: the pod's own].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    namespace: Option<String>,
    /// Image holding kv-worker, for pools that name none.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    worker_image: Option<String>,
    /// Cluster DNS domain.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    cluster_domain: Option<String>,
    /// Secret the workers serve mutual TLS with [default: none, plaintext].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    worker_tls_secret: Option<String>,
    /// ConfigMap (key `ca.crt`) of CAs the workers trust besides the Secret's [default: none].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    worker_extra_ca_config_map: Option<String>,
    /// Address of /metrics, /readyz and /healthz.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    metrics_addr: Option<SocketAddr>,
    /// Take part in leader election.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    leader_election: Option<bool>,
    /// The Lease electing the acting replica.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_name: Option<String>,
    /// This replica's identity in the lease [default: the host name].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    identity: Option<String>,
    /// Control-plane node (gRPC host:port) to publish assignments to; repeatable.
    #[arg(long = "control-plane")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    control_plane: Vec<String>,
    /// File holding the control plane's shared token.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    control_plane_token_file: Option<std::path::PathBuf>,
    #[command(flatten)]
    #[serde(flatten)]
    tls: TlsConfig,
}

fn print_crd() -> Result<()> {
    let yaml = serde_saphyr::to_string(&KvWorkerPool::crd()).context("rendering the CRD")?;
    print!("{yaml}");
    Ok(())
}

async fn run(args: RunArgs) -> Result<()> {
    let Some(config) =
        resolve_config::<OperatorConfig, _>(&args.source, "HASTEN_KV_OPERATOR_", &args)?
    else {
        return Ok(());
    };
    let _traces = hasten_core::logging::init_with_traces(
        config.log_format,
        config.otlp_endpoint.as_deref(),
        "hasten-kv-operator",
    )?;
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API (in-cluster or kubeconfig)")?;
    let namespace = config
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let identity = config
        .identity
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("kv-operator-{}", std::process::id()));

    let registry = hasten_core::metrics::registry()?;
    let metrics = OperatorMetrics::register(&registry)?;
    let bound = hasten_core::metrics::serve(
        config.metrics_addr,
        registry.clone(),
        Arc::new(|| {}),
        Arc::new(|| Ok(())),
    )
    .await
    .with_context(|| format!("binding metrics_addr {}", config.metrics_addr))?;
    tracing::info!(%bound, %namespace, %identity, "kv-operator metrics");

    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "hasten-kv-operator".into(),
            instance: Some(identity.clone()),
        },
    );
    let mut context = Context::new(
        client.clone(),
        RenderSettings {
            worker_image: config.worker_image.clone(),
            cluster_domain: config.cluster_domain.clone(),
            worker_tls_secret: config.worker_tls_secret.clone(),
            worker_extra_ca_config_map: config.worker_extra_ca_config_map.clone(),
            worker_log_format: config.log_format,
        },
        metrics.clone(),
        recorder,
    );
    if !config.control_plane.is_empty() {
        let tls = config.tls.load_mutual()?;
        hasten_core::metrics::register_certificate_expiry(
            &registry,
            &hasten_proto::tls::expiries(tls.as_ref())?,
        )?;
        let token = config
            .control_plane_token_file
            .as_deref()
            .map(AccessToken::load)
            .transpose()
            .context("reading control_plane_token_file")?;
        tracing::info!(nodes = ?config.control_plane, "publishing assignments to the control plane");
        context = context.with_publisher(Arc::new(ControlPlanePublisher::new(
            config.control_plane.clone(),
            ControlAccess { tls, token },
        )));
    }
    let ctx = Arc::new(context);
    if !config.leader_election {
        metrics.leader.set(1);
        controller::run(client, &namespace, ctx).await;
        return Ok(());
    }
    let lease = LeaderLease::new(
        client.clone(),
        LeaseSettings {
            name: config.lease_name.clone(),
            namespace: namespace.clone(),
            identity,
            duration: Duration::from_secs(config.lease_duration_s),
            renew_every: Duration::from_secs(config.lease_renew_s),
            renew_deadline: Duration::from_secs(config.lease_deadline_s),
        },
    );
    tracing::info!(lease = %config.lease_name, "waiting for the leader lease");
    lease.acquire().await?;
    metrics.leader.set(1);
    tracing::info!(lease = %config.lease_name, "leading");
    tokio::select! {
        () = controller::run(client, &namespace, ctx) => Ok(()),
        lost = lease.keep() => {
            metrics.leader.set(0);
            // Exiting hands the work to whichever replica takes the lease next; a restart
            // makes this one a candidate again.
            bail!(lost)
        }
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let command = Cli::command().mut_subcommand("run", help_with_defaults::<OperatorConfig>);
    match parse_command::<Cli>(command).command {
        Command::Run(args) => run(*args).await,
        Command::Crd => print_crd(),
    }
}
