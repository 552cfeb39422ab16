//! `hasten-soak`: the full local topology under steady TopViews-shaped load while faults
//! are injected, with everything on mutual TLS and two tenants sharing the workload.
//!
//! Topology: 2 shards x 2 replicas behind a router, a 3-node control plane, 2 edges
//! replicating their hot caches through it (edge e tries the nodes from node e+1 on, so the
//! two start on different nodes). Open-loop Poisson load at a fixed rate; each query goes to
//! edge i mod 2 as tenant (i / 2) mod 2, so both tenants ask the same popular questions on
//! both edges. Phases, by the share of the run at which each starts:
//!
//! | share | phase | fault |
//! |---|---|---|
//! | 0 | steady | none |
//! | 0.12 | replica down | a replica of shard 0 is killed |
//! | 0.24 | replica back | it is restarted on the same port |
//! | 0.32 | cloud replica hung | a replica of shard 1 is frozen (SIGSTOP): it holds its sockets and answers nothing |
//! | 0.44 | cloud replica resumed | it runs again (SIGCONT) |
//! | 0.52 | follower hung | a control-plane node that is not the leader is frozen (SIGSTOP), the one most edges follow |
//! | 0.64 | follower resumed | it runs again (SIGCONT) and must catch up |
//! | 0.76 | leader down | the control-plane leader is killed |
//! | 0.88 | leader back | it is restarted from its data directory |
//!
//! The follower is frozen before any control-plane node has failed, while the edges are
//! still on the nodes they started on (different ones): whichever node leads, an edge then
//! follows a follower, and the freeze hits its stream and its proposals. (After the leader
//! kill both edges usually sit on the new leader, and freezing a follower would miss them.)
//! The resumed node then goes through the leader kill with the others.
//!
//! Reported: error rate by kind and latency percentiles per phase, with each edge's applied
//! control-plane index as sampled every second; whether any entry the control plane
//! committed is missing from a node at the end (every node must hold the same entries at the
//! same applied index, the restarted leader and the resumed follower included) and whether
//! every proposal an edge had acknowledged was committed; for the hung follower, the entries
//! committed while it was frozen and each edge's applied index at the start and end of the
//! phase (the edges must keep replicating through the other nodes); and any draft accepted
//! through a cached query the same tenant never asked.
//!
//! A frozen process is always resumed before it is ended: when a phase ends, and whenever
//! the soak ends early (an error, SIGINT, SIGTERM or SIGHUP). While one is frozen its pid
//! is in `<work>/stopped.pids`, so that a wrapper (`bench/soak.sh`) can resume it should the
//! soak itself be killed outright.

mod control;
mod edges;
mod load;
mod processes;
mod report;
mod schedule;
mod settle;
mod topology;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use anyhow::{Result, bail};
use clap::Parser;
use hasten_bench::write_report;
use hasten_loadtest::workload::read_jsonl;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::time::Instant;

use control::{CommittedEntries, follow_committed};
use edges::{EdgeSample, sample_edges};
use load::{Answer, Load, drive};
use processes::{STOPPED_PIDS, interrupted};
use report::phase_report;
use schedule::{Injected, run_schedule};
use settle::{NodeComparison, Settled, settle};
use topology::Topology;

#[derive(Parser)]
#[command(
    name = "hasten-soak",
    about = "Steady load on the full local topology while cloud replicas and control-plane nodes are killed and restarted, frozen and resumed"
)]
struct Cli {
    /// Corpus bundle cut into 2 shards (`cloud-index build --shards 2`).
    #[arg(long)]
    bundle: PathBuf,
    /// TopViews-shaped workload (`hasten-loadtest workload --save-workload`); replayed in a
    /// loop if the run outlasts it.
    #[arg(long)]
    workload: PathBuf,
    /// Length of the run in seconds.
    #[arg(long, default_value_t = 600)]
    duration_s: u64,
    /// Queries per second, Poisson arrivals.
    #[arg(long, default_value_t = 20.0)]
    rate: f64,
    /// all-MiniLM-L6-v2 directory.
    #[arg(
        long,
        env = "HASTEN_MODEL_DIR",
        default_value = "models/all-MiniLM-L6-v2"
    )]
    model_dir: PathBuf,
    /// Working directory: certificates, data directories, logs, report.json.
    #[arg(long, default_value = "run/soak")]
    work: PathBuf,
}

/// Each tenant's bearer token (the soak's own throwaway tenants file).
const TENANTS: [(&str, &str); 2] = [
    ("acme", "soak-acme-token-7f3a9c2e5b1d"),
    ("globex", "soak-globex-token-2c8e4a6f0d9b"),
];

#[tokio::main]
async fn main() -> Result<()> {
    hasten_core::logging::init(hasten_core::logging::LogFormat::Text);
    let cli = Cli::parse();
    // Dropping the soak (on a signal) drops every process it started: frozen ones are
    // resumed first, then all are killed.
    tokio::select! {
        result = soak(cli) => result,
        signal = interrupted() => bail!("the soak was interrupted ({signal}); its processes were resumed and ended"),
    }
}

async fn soak(cli: Cli) -> Result<()> {
    let workload = read_jsonl(&cli.workload)?;
    if workload.is_empty() {
        bail!("the workload {} is empty", cli.workload.display());
    }
    std::fs::create_dir_all(&cli.work)?;
    let work = cli.work.canonicalize()?;
    let _ = std::fs::remove_file(work.join(STOPPED_PIDS));

    let mut topology = Topology::start(&cli, &work)?;

    let committed = Arc::new(Mutex::new(CommittedEntries::default()));
    let follower = tokio::spawn(follow_committed(
        topology.cp_addresses.clone(),
        topology.soak_client.clone(),
        Arc::clone(&committed),
    ));

    let answers = Arc::new(Mutex::new(Vec::<Answer>::new()));
    let asked: Arc<Mutex<HashMap<usize, HashSet<String>>>> = Arc::default();
    let cross_tenant = Arc::new(Mutex::new(Vec::<Value>::new()));
    let phase = Arc::new(AtomicUsize::new(0));
    let duration = Duration::from_secs(cli.duration_s);
    let started = Instant::now();
    let load = tokio::spawn(drive(
        Load {
            workload,
            edges: topology.edge_urls.clone(),
            rate: cli.rate,
            duration,
        },
        Arc::clone(&phase),
        Arc::clone(&answers),
        Arc::clone(&asked),
        Arc::clone(&cross_tenant),
    ));
    let samples = Arc::new(Mutex::new(Vec::<EdgeSample>::new()));
    let sampler = tokio::spawn(sample_edges(
        topology.admin_urls.clone(),
        Arc::clone(&phase),
        started,
        Arc::clone(&samples),
    ));

    let Injected {
        faults,
        mut follower_report,
        caught_up,
    } = run_schedule(
        &mut topology,
        &phase,
        started,
        duration,
        &committed,
        &samples,
    )
    .await?;
    load.await?;
    sampler.abort();
    // Nothing stays frozen past the load, whatever the schedule.
    for process in topology
        .replicas
        .iter_mut()
        .flatten()
        .chain(topology.nodes.iter_mut())
    {
        process.resume()?;
    }
    let caught_up_s = match caught_up {
        Some(task) => task.await?,
        None => None,
    };
    if let Some(report) = follower_report.as_object_mut() {
        report.insert("resumed_node_caught_up_s".into(), json!(caught_up_s));
    }

    let (settled, settle_s) = settle(
        &topology.cp_addresses,
        &topology.soak_client,
        &topology.edges,
        &committed,
    )
    .await?;
    follower.abort();
    let Settled {
        expected,
        nodes:
            NodeComparison {
                reports: node_reports,
                missing: missing_total,
                unseen: _,
                same_applied_index,
            },
        acknowledged,
        dropped,
    } = settled;
    let unaccounted = (acknowledged as usize).saturating_sub(expected.inserted);
    let lost_total = missing_total + unaccounted;

    let answers = answers.lock();
    let report = json!({
        "duration_s": cli.duration_s,
        "rate_qps": cli.rate,
        "queries": answers.len(),
        "faults": faults,
        "phases": phase_report(&answers, &samples.lock(), duration),
        "follower_hung": follower_report,
        "control_plane": {
            "committed_inserts_seen": expected.inserted,
            "removed_seen": expected.removed,
            "whole_state_resyncs": expected.resyncs,
            "last_index_seen": expected.last_index,
            "nodes": node_reports,
            "same_applied_index": same_applied_index,
            "settle_s": settle_s,
            "missing_committed_entries": missing_total,
            "proposals_acknowledged_to_edges": acknowledged,
            "proposals_dropped_by_edges": dropped,
            "acknowledged_but_not_committed": unaccounted,
            "lost_acknowledged_entries": lost_total,
        },
        "cross_tenant_acceptances": cross_tenant.lock().len(),
        "cross_tenant_examples": cross_tenant.lock().iter().take(5).cloned().collect::<Vec<_>>(),
    });
    write_report(&work, &report)?;
    drop(topology.edges);
    drop(topology.router);
    drop(topology.replicas);
    drop(topology.nodes);
    if lost_total > 0 || !same_applied_index || !cross_tenant.lock().is_empty() {
        bail!(
            "the soak found lost entries, nodes at different applied indexes or a cross-tenant acceptance; see {}",
            work.join("report.json").display()
        );
    }
    Ok(())
}
