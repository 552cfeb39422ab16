//! `hasten-replication-bench`: replication lag and throughput of the Raft control plane.
//!
//! Three real `control-plane` processes on loopback; E edges' proposers (the edge's own
//! `ControlPlaneLink`, batching whatever is queued into one proposal) offer cache entries
//! shaped like real ones (a 384-d query and the ids of its k = 10 documents) at a fixed
//! total rate; E subscribers follow the committed stream as edges do. Lag is the time from
//! handing an entry to the proposer to the moment the last subscriber has it. The offered
//! rate is then raised until the control plane no longer keeps up.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Parser;
use edge_node::replication::{ControlPlaneLink, CorpusIdentity};
use edge_node::retrieval::CacheReplication;
use edge_node::tenants::Tenant;
use hasten_bench::{Latencies, write_report};
use hasten_core::DocId;
use hasten_proto::control::{ControlAccess, MAX_MESSAGE_BYTES};
use hasten_proto::v1::control_plane_client::ControlPlaneClient;
use hasten_proto::v1::{CacheEntry, SubscribeRequest, applied_command};
use loadtest::control_plane;
use loadtest::process::ManagedProcess;
use parking_lot::Mutex;
use prost::Message;
use serde_json::{Value, json};

#[derive(Parser)]
#[command(version, about = "Replication lag and throughput of the control plane")]
struct Cli {
    /// Edges proposing and subscribing.
    #[arg(long, default_value_t = 4)]
    edges: usize,
    /// Offered rate of the lag measurement, entries per second over all edges.
    #[arg(long, default_value_t = 1000)]
    rate: u64,
    /// Higher rates tried for the sustained maximum.
    #[arg(long, value_delimiter = ',', default_value = "2000,4000,8000")]
    sweep: Vec<u64>,
    /// Seconds per rate.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Vector dimension of queries and documents.
    #[arg(long, default_value_t = 384)]
    dimension: usize,
    /// Documents per entry (k).
    #[arg(long, default_value_t = 10)]
    k: usize,
    /// Working directory (logs, sled directories, report).
    #[arg(long, default_value = "run/replication-bench")]
    work: PathBuf,
}

/// Documents of the corpus the entries name (ids 0..DOCUMENTS).
const DOCUMENTS: u64 = 100_000;

/// When each entry (keyed by its text) was handed to a proposer, and which subscribers
/// have applied it.
#[derive(Default)]
struct Tracker {
    sent: HashMap<String, (Instant, usize)>,
    lags: Latencies,
    applied: u64,
}

async fn subscribe(address: String, edges: usize, tracker: Arc<Mutex<Tracker>>) -> Result<()> {
    let channel = hasten_proto::control::endpoint(&address, None)?
        .connect()
        .await?;
    let mut client = ControlPlaneClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES);
    let mut stream = client
        .subscribe(SubscribeRequest {
            from_index: 1,
            subscriber: "bench".into(),
        })
        .await?
        .into_inner();
    while let Some(event) = stream.message().await? {
        let now = Instant::now();
        let mut tracker = tracker.lock();
        for command in event.applied {
            let Some(applied_command::Kind::Inserted(stored)) = command.kind else {
                continue;
            };
            let Some(text) = stored.entry.and_then(|e| e.text) else {
                continue;
            };
            let done = match tracker.sent.get_mut(&text) {
                Some((sent, seen)) => {
                    *seen += 1;
                    (*seen == edges).then_some(*sent)
                }
                None => None,
            };
            if let Some(sent) = done {
                tracker.sent.remove(&text);
                tracker.lags.record(now.duration_since(sent));
                tracker.applied += 1;
            }
        }
    }
    Ok(())
}

fn result_of(dimension: usize, k: usize, n: u64) -> (Vec<f32>, Vec<DocId>) {
    let vector: Vec<f32> = (0..dimension)
        .map(|i| ((n as usize + i) % 97) as f32 / 97.0)
        .collect();
    let documents = (0..k as u64).map(|d| (n * 7 + d) % DOCUMENTS).collect();
    (vector, documents)
}

/// Offers `rate` entries per second for `seconds`, spread over the links.
async fn offer(
    links: &[Arc<ControlPlaneLink>],
    tracker: &Arc<Mutex<Tracker>>,
    cli: &Cli,
    rate: u64,
    run: usize,
) -> Value {
    {
        let mut t = tracker.lock();
        t.lags = Latencies::default();
        t.applied = 0;
    }
    let total = rate * cli.seconds;
    let started = Instant::now();
    let mut ticker = tokio::time::interval(Duration::from_millis(1));
    let mut sent = 0u64;
    while sent < total {
        ticker.tick().await;
        let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
        while sent < due.min(total) {
            let link = &links[sent as usize % links.len()];
            let (vector, documents) = result_of(cli.dimension, cli.k, sent);
            let text = format!("run {run} entry {sent}");
            tracker
                .lock()
                .sent
                .insert(text.clone(), (Instant::now(), 0));
            link.propose(&Tenant::default_tenant(), Some(text), &vector, documents);
            sent += 1;
        }
    }
    let offered_for = started.elapsed();
    // Let what was offered drain (at most a few seconds).
    let drain = Instant::now();
    while drain.elapsed() < Duration::from_secs(5) && tracker.lock().applied < total {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let t = tracker.lock();
    let applied_for = started.elapsed().as_secs_f64();
    let dropped: u64 = links.iter().map(|l| l.status().report().dropped).sum();
    json!({
        "offered_per_s": rate,
        "offered": total,
        "applied_everywhere": t.applied,
        "applied_per_s": t.applied as f64 / applied_for.max(offered_for.as_secs_f64()),
        "lag_p50_ms": t.lags.quantile_ms(0.5),
        "lag_p99_ms": t.lags.quantile_ms(0.99),
        "lag_max_ms": t.lags.quantile_ms(1.0),
        "dropped_by_proposers_total": dropped,
    })
}

#[tokio::main]
async fn main() -> Result<()> {
    hasten_core::logging::init();
    let cli = Cli::parse();
    std::fs::create_dir_all(&cli.work)?;
    let (nodes, addresses) = control_plane::start_group(&cli.work, "node", 3)?;
    let tracker = Arc::new(Mutex::new(Tracker::default()));
    let links: Vec<Arc<ControlPlaneLink>> = (0..cli.edges)
        .map(|e| {
            let endpoints = (0..addresses.len())
                .map(|n| addresses[(e + n) % addresses.len()].clone())
                .collect();
            let corpus = CorpusIdentity {
                version: "bench".into(),
                dimension: cli.dimension,
                max_document_id: DOCUMENTS - 1,
            };
            ControlPlaneLink::start(
                &format!("bench-edge-{e}"),
                corpus,
                endpoints,
                ControlAccess::default(),
            )
        })
        .collect();
    for e in 0..cli.edges {
        let address = addresses[e % addresses.len()].clone();
        let tracker = Arc::clone(&tracker);
        let edges = cli.edges;
        tokio::spawn(async move {
            if let Err(err) = subscribe(address, edges, tracker).await {
                tracing::error!(%err, "subscriber failed");
            }
        });
    }
    // Warm-up: a leader elected and every path connected.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let entry_bytes = {
        let (vector, document_ids) = result_of(cli.dimension, cli.k, 0);
        CacheEntry {
            origin: "edge-0/1700000000000".into(),
            origin_seq: 1,
            text: Some("run 0 entry 0".into()),
            vector,
            document_ids,
            tenant: "default".into(),
            corpus_version: "bench".into(),
        }
        .encoded_len()
    };
    let mut runs = Vec::new();
    for (run, rate) in std::iter::once(cli.rate)
        .chain(cli.sweep.iter().copied())
        .enumerate()
    {
        let report = offer(&links, &tracker, &cli, rate, run).await;
        tracing::info!(%report, "rate done");
        runs.push(report);
    }
    let rss: Vec<u64> = nodes
        .iter()
        .filter_map(ManagedProcess::resident_bytes)
        .collect();
    let report = json!({
        "edges": cli.edges,
        "entry_bytes": entry_bytes,
        "seconds_per_rate": cli.seconds,
        "runs": runs,
        "node_rss_bytes": rss,
        "cores": hasten_core::threads::available_cores(),
    });
    write_report(&cli.work, &report)
}
