//! `hasten-admin`: the control plane's operator tool. A client of the nodes' gRPC API with
//! the deployment's mutual TLS (or token), so it runs wherever an operator can reach the
//! nodes (a laptop through a port-forward, a Job in the cluster) without the node's own
//! storage and Raft code: status, membership, cache invalidation, runtime settings, backup
//! and restore.

mod backup;
mod cluster;
mod config;
mod report;

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{CommandFactory, Parser, Subcommand};
use hasten_core::config::{
    ConfigSource, TlsConfig, help_with_defaults, parse_command, resolve_config,
};
use hasten_proto::v1::{
    ControlCommand, CorpusUpdate, FlushTenant, InvalidateDocuments, MemberRequest,
    RetireCorpusVersion, RuntimeConfig, control_command,
};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use serde_json::json;

use crate::cluster::ControlGroup;
use crate::config::{AdminConfig, OutputFormat};
use crate::report::GroupStatus;

/// Administers Hasten's control plane: status, membership, cache invalidation, runtime
/// settings, backup and restore.
#[derive(Parser, Serialize)]
#[command(version)]
struct Cli {
    #[command(flatten)]
    #[serde(skip)]
    source: ConfigSource,
    /// A control-plane node, host:port (repeat; list every member for `status`).
    #[arg(long = "control-plane", value_name = "ADDR", global = true)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    control_plane: Vec<String>,
    #[command(flatten)]
    #[serde(flatten)]
    tls: TlsConfig,
    /// File holding the control plane's shared token.
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    token_file: Option<PathBuf>,
    /// table or json.
    #[arg(long, value_enum, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    output: Option<OutputFormat>,
    /// Seconds one call to a node may take.
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    timeout_s: Option<u64>,
    #[command(subcommand)]
    #[serde(skip)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Every node's role, term, commit and applied indexes, lag behind the highest commit,
    /// first log index, cached entries and subscribed edges; the leader and the members.
    Status,
    /// Adds or removes a member (through the leader). A node to add starts with `join`.
    #[command(subcommand)]
    Members(MembersCommand),
    /// Drops the cached entries whose result holds any of these documents, or every entry
    /// of a corpus version, on every node and edge.
    Invalidate {
        /// Document ids, comma-separated.
        #[arg(
            long,
            value_delimiter = ',',
            required_unless_present = "corpus_version",
            conflicts_with = "corpus_version"
        )]
        documents: Vec<u64>,
        #[arg(long)]
        corpus_version: Option<String>,
    },
    /// After a new corpus version is deployed: carries the cached entries of `from` over to
    /// `to`, dropping those that hold a changed document (ids of `from` whose text or vector
    /// changed, or that `to` removed) or that do not fit `to`'s registration.
    CorpusUpdate {
        #[arg(long)]
        from: String,
        #[arg(long)]
        to: String,
        /// Changed or removed document ids, comma-separated (none: every document kept its
        /// meaning).
        #[arg(long, value_delimiter = ',')]
        changed_documents: Vec<u64>,
    },
    /// Drops every cached entry of one tenant.
    FlushTenant { tenant: String },
    /// Changes the homology threshold or the cache capacity (queries per tenant) on every
    /// edge.
    Config {
        #[arg(long)]
        tau: Option<f64>,
        #[arg(long)]
        capacity: Option<u64>,
    },
    /// Writes the replicated state (as the leader has applied it) to FILE.
    Export { file: PathBuf },
    /// Replays FILE into a group that caches nothing yet (after losing quorum: a new group).
    Import { file: PathBuf },
}

#[derive(Subcommand, Debug)]
enum MembersCommand {
    Add {
        #[arg(long)]
        id: u64,
        /// The new node's gRPC address, host:port.
        #[arg(long)]
        address: String,
    },
    Remove {
        #[arg(long)]
        id: u64,
    },
}

#[tokio::main]
async fn main() -> Result<()> {
    hasten_core::logging::init(hasten_core::logging::LogFormat::Text);
    let cli: Cli = parse_command(help_with_defaults::<AdminConfig>(Cli::command()));
    let Some(config) = resolve_config::<AdminConfig, _>(&cli.source, "HASTEN_ADMIN_", &cli)? else {
        return Ok(());
    };
    let Some(command) = cli.command else {
        bail!("no command: see `hasten-admin --help`");
    };
    let group = ControlGroup::new(
        config.control_plane.clone(),
        config.access()?,
        config.timeout(),
    );
    let output = config.output;
    match command {
        Command::Status => {
            let status = GroupStatus::from_reports(group.reports().await);
            match output {
                OutputFormat::Table => print!("{}", status.table()),
                OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&status)?),
            }
            if status.nodes.iter().all(|n| n.error.is_some()) {
                bail!("no control-plane node answered");
            }
        }
        Command::Members(members) => {
            let (add, request) = match members {
                MembersCommand::Add { id, address } => {
                    if id == 0 || !address.contains(':') {
                        bail!("a new member needs a non-zero --id and its host:port --address");
                    }
                    (true, MemberRequest { id, address })
                }
                MembersCommand::Remove { id } => (
                    false,
                    MemberRequest {
                        id,
                        address: String::new(),
                    },
                ),
            };
            let status = group.change_member(add, request).await?;
            let members: Vec<_> = status
                .members
                .iter()
                .map(|m| json!({"id": m.id, "address": m.address}))
                .collect();
            let verb = if add { "added" } else { "removed" };
            announce(
                output,
                &format!("member {verb}"),
                json!({"members": members}),
            );
        }
        Command::Invalidate {
            documents,
            corpus_version,
        } => {
            let kind = match corpus_version {
                Some(corpus_version) => {
                    control_command::Kind::RetireCorpusVersion(RetireCorpusVersion {
                        corpus_version,
                    })
                }
                None => control_command::Kind::Invalidate(InvalidateDocuments {
                    document_ids: documents,
                }),
            };
            commit(&group, output, "invalidation", kind).await?;
        }
        Command::CorpusUpdate {
            from,
            to,
            changed_documents,
        } => {
            if from.trim().is_empty() || to.trim().is_empty() || from == to {
                bail!("--from and --to name two different corpus versions");
            }
            let kind = control_command::Kind::CorpusUpdate(CorpusUpdate {
                from_version: from,
                to_version: to,
                changed_document_ids: changed_documents,
            });
            commit(&group, output, "corpus update", kind).await?;
        }
        Command::FlushTenant { tenant } => {
            if tenant.trim().is_empty() {
                bail!("name the tenant to flush");
            }
            commit(
                &group,
                output,
                "tenant flush",
                control_command::Kind::FlushTenant(FlushTenant { tenant }),
            )
            .await?;
        }
        Command::Config { tau, capacity } => {
            if tau.is_none() && capacity.is_none() {
                bail!("give --tau, --capacity or both");
            }
            let kind = control_command::Kind::Config(RuntimeConfig {
                tau,
                cache_capacity: capacity,
            });
            commit(&group, output, "configuration", kind).await?;
        }
        Command::Export { file } => {
            let state = group.snapshot().await?;
            let bytes = backup::encode(&state)?;
            backup::write_atomically(&file, &bytes)?;
            announce(
                output,
                &format!("exported to {}", file.display()),
                json!({
                    "file": file,
                    "applied_index": state.applied_index,
                    "entries": state.entries.len(),
                    "corpora": state.corpora.len(),
                    "bytes": bytes.len(),
                }),
            );
        }
        Command::Import { file } => {
            let bytes =
                std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            let (header, state) = backup::decode(&bytes)
                .with_context(|| format!("reading the backup {}", file.display()))?;
            let target = group.snapshot().await?;
            let plan = backup::restore_plan(&state, &target, backup::MAX_PROPOSAL_BYTES)?;
            let progress = ProgressBar::new(plan.iter().map(Vec::len).sum::<usize>() as u64)
                .with_style(
                    ProgressStyle::with_template(
                        "{msg} [{bar:40}] {pos}/{len} commands, {per_sec}, {eta} left",
                    )
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
                )
                .with_message("importing");
            let mut last_index = 0;
            for proposal in plan {
                let commands = proposal.len() as u64;
                last_index = group.propose(proposal).await?;
                progress.inc(commands);
            }
            progress.finish_and_clear();
            let restored = group.snapshot().await?;
            announce(
                output,
                &format!("imported {}", file.display()),
                json!({
                    "file": file,
                    "backup_applied_index": header.applied_index,
                    "entries_in_backup": state.entries.len(),
                    "entries_now": restored.entries.len(),
                    "committed_through": last_index,
                }),
            );
            if restored.entries.len() != state.entries.len() {
                bail!(
                    "the group holds {} entries after the import, the backup {}",
                    restored.entries.len(),
                    state.entries.len()
                );
            }
        }
    }
    Ok(())
}

/// Proposes one command and reports the index it committed at.
async fn commit(
    group: &ControlGroup,
    output: OutputFormat,
    what: &str,
    kind: control_command::Kind,
) -> Result<()> {
    let index = group
        .propose(vec![ControlCommand { kind: Some(kind) }])
        .await?;
    announce(
        output,
        &format!("{what} committed"),
        json!({"index": index}),
    );
    Ok(())
}

/// Prints a result: `summary` and the fields as `key: value` lines, or the fields as JSON.
fn announce(output: OutputFormat, summary: &str, fields: serde_json::Value) {
    match output {
        OutputFormat::Json => println!("{fields}"),
        OutputFormat::Table => {
            println!("{summary}");
            if let Some(map) = fields.as_object() {
                for (key, value) in map {
                    println!("  {key}: {value}");
                }
            }
        }
    }
}
