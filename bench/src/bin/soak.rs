//! `hasten-soak`: the full local topology under steady TopViews-shaped load while faults
//! are injected, with everything on mutual TLS and two tenants sharing the workload.
//!
//! Topology: 2 shards x 2 replicas behind a router, a 3-node control plane, 2 edges
//! replicating their hot caches through it. Open-loop Poisson load at a fixed rate; each
//! query goes to edge i mod 2 as tenant (i / 2) mod 2, so both tenants ask the same popular
//! questions on both edges. Faults, as shares of the run: a replica of shard 0 is killed at
//! 20% and restarted at 40%; the control-plane leader is killed at 50% and restarted at 70%.
//!
//! Reported: error rate by kind and latency percentiles per phase; whether any entry the
//! control plane committed is missing from a node at the end (every node must hold the
//! same entries, the restarted leader included); and any draft accepted through a cached
//! query the same tenant never asked.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use hasten_bench::{Latencies, write_report};
use hasten_proto::control::{MAX_MESSAGE_BYTES, endpoint};
use hasten_proto::tls::{DevAuthority, MutualTls, TlsPaths};
use hasten_proto::v1::control_plane_client::ControlPlaneClient;
use hasten_proto::v1::{SnapshotRequest, StatusRequest, SubscribeRequest, applied_command};
use loadtest::control_plane::{free_loopback_port, node_args};
use loadtest::process::{
    ManagedProcess, binary, cloud_index_route_args, cloud_index_serve_args, edge_serve_args,
    tls_args,
};
use loadtest::scrape::Scrape;
use loadtest::workload::{WorkloadQuery, read_jsonl};
use parking_lot::Mutex;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Exp};
use serde_json::{Value, json};
use tokio::time::Instant;

#[derive(Parser)]
#[command(
    name = "hasten-soak",
    about = "Steady load on the full local topology while a cloud replica and the control-plane leader are killed and restarted"
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
/// What a client waits before giving up on an answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);
const START_TIMEOUT: Duration = Duration::from_secs(300);

/// The phases of the run and the share of the duration at which each starts.
const PHASES: [(&str, f64); 5] = [
    ("steady", 0.0),
    ("replica down", 0.2),
    ("replica back", 0.4),
    ("leader down", 0.5),
    ("leader back", 0.7),
];

/// One query's fate.
struct Answer {
    phase: usize,
    latency: Duration,
    /// `accepted`, `fallback`, or an error kind.
    kind: String,
}

/// A process that can be stopped and started again with the same arguments (and so the same
/// ports and data directory).
struct Restartable {
    name: String,
    binary: PathBuf,
    args: Vec<String>,
    process: Option<ManagedProcess>,
}

impl Restartable {
    fn start(name: &str, binary: PathBuf, args: Vec<String>, work: &Path) -> Result<Self> {
        let mut restartable = Self {
            name: name.to_string(),
            binary,
            args,
            process: None,
        };
        restartable.restart(work)?;
        Ok(restartable)
    }

    fn restart(&mut self, work: &Path) -> Result<()> {
        // Start-up blocks until the process is ready; keep the load's worker threads free.
        let process = tokio::task::block_in_place(|| {
            ManagedProcess::start(&self.name, &self.binary, &self.args, work, START_TIMEOUT)
        })
        .with_context(|| format!("starting {}", self.name))?;
        self.process = Some(process);
        Ok(())
    }

    fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.stop();
        }
    }

    fn addr(&self, key: &str) -> String {
        self.process
            .as_ref()
            .map(|p| p.addr(key))
            .unwrap_or_default()
    }
}

fn fixed_address() -> Result<String> {
    Ok(format!("127.0.0.1:{}", free_loopback_port()?))
}

#[tokio::main]
async fn main() -> Result<()> {
    hasten_core::logging::init();
    let cli = Cli::parse();
    let workload = read_jsonl(&cli.workload)?;
    if workload.is_empty() {
        bail!("the workload {} is empty", cli.workload.display());
    }
    std::fs::create_dir_all(&cli.work)?;
    let work = cli.work.canonicalize()?;

    let authority = DevAuthority::new("hasten soak CA")?;
    let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    let issued = authority.write_bundle(
        &work.join("tls"),
        &["cloud", "control-plane", "edge", "soak"],
        &names,
    )?;
    let [cloud_tls, cp_tls, edge_tls, soak_tls]: [TlsPaths; 4] = issued
        .try_into()
        .map_err(|_| anyhow::anyhow!("expected four certificates"))?;
    let soak_client = MutualTls::load(&soak_tls)?;

    // Cloud tier: 2 shards x 2 replicas on fixed gRPC ports, so a restarted replica comes
    // back where the router looks for it.
    let cloud_bin = binary("cloud-index")?;
    let mut replicas: Vec<Vec<Restartable>> = Vec::new();
    let mut shard_endpoints = Vec::new();
    for shard in 0..2 {
        let bundle = cli.bundle.join("shards").join(format!("shard-{shard}"));
        let mut row = Vec::new();
        let mut endpoints = Vec::new();
        for replica in 0..2 {
            let grpc = fixed_address()?;
            let mut args = cloud_index_serve_args(&bundle, &grpc, &work.join("unused.pem"));
            args.extend(tls_args(&cloud_tls));
            let name = format!("shard-{shard}-{replica}");
            row.push(Restartable::start(&name, cloud_bin.clone(), args, &work)?);
            endpoints.push(grpc);
        }
        replicas.push(row);
        shard_endpoints.push(endpoints);
    }
    let mut router_args = cloud_index_route_args(&shard_endpoints, &work.join("unused.pem"));
    router_args.extend(tls_args(&cloud_tls));
    let router = Restartable::start("router", cloud_bin, router_args, &work)?;

    // Control plane: 3 nodes with their own sled directories.
    let cp_addresses: Vec<String> = (0..3).map(|_| fixed_address()).collect::<Result<_>>()?;
    let mut nodes = Vec::new();
    for id in 1..=3u64 {
        let dir = work.join(format!("node-{id}"));
        let _ = std::fs::remove_dir_all(&dir);
        let mut args = node_args(id, &cp_addresses, &dir);
        args.extend(tls_args(&cp_tls));
        nodes.push(Restartable::start(
            &format!("node-{id}"),
            binary("control-plane")?,
            args,
            &work,
        )?);
    }

    // Two edges with the two tenants.
    let tenants_file = work.join("tenants.toml");
    let mut tenants_toml = String::from("[tenants]\n");
    for (tenant, token) in TENANTS {
        tenants_toml.push_str(&format!("{tenant} = [\"{token}\"]\n"));
    }
    std::fs::write(&tenants_file, tenants_toml)?;
    let mut edges = Vec::new();
    for e in 0..2 {
        let name = format!("edge-{e}");
        let mut args = edge_serve_args(
            &cli.bundle,
            &cli.model_dir,
            &router.addr("quic_addr"),
            &cloud_tls.ca,
        );
        args.extend(tls_args(&edge_tls));
        args.extend([
            "--edge-id".into(),
            name.clone(),
            "--tenants-file".into(),
            tenants_file.display().to_string(),
            // The cross-tenant check reads which cached query an acceptance went through.
            "--expose-matched-query-text".into(),
            "true".into(),
        ]);
        for address in &cp_addresses {
            args.extend(["--control-plane".to_string(), address.clone()]);
        }
        edges.push(Restartable::start(
            &name,
            binary("edge-node")?,
            args,
            &work,
        )?);
    }
    let edge_urls: Vec<String> = edges
        .iter()
        .map(|e| format!("http://{}", e.addr("http_addr")))
        .collect();
    tracing::info!(?edge_urls, "topology up");

    let committed = Arc::new(Mutex::new(CommittedEntries::default()));
    tokio::spawn(follow_committed(
        cp_addresses.clone(),
        soak_client.clone(),
        Arc::clone(&committed),
    ));

    let answers = Arc::new(Mutex::new(Vec::<Answer>::new()));
    let asked: Arc<Mutex<HashMap<usize, HashSet<String>>>> = Arc::default();
    let cross_tenant = Arc::new(Mutex::new(Vec::<Value>::new()));
    let phase = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let duration = Duration::from_secs(cli.duration_s);
    let load = tokio::spawn(drive(
        Load {
            workload,
            edges: edge_urls,
            rate: cli.rate,
            duration,
        },
        Arc::clone(&phase),
        Arc::clone(&answers),
        Arc::clone(&asked),
        Arc::clone(&cross_tenant),
    ));

    // The fault schedule.
    let started = Instant::now();
    let mut faults = Vec::new();
    for (index, (name, share)) in PHASES.iter().enumerate().skip(1) {
        tokio::time::sleep_until(started + duration.mul_f64(*share)).await;
        phase.store(index, std::sync::atomic::Ordering::Relaxed);
        let at = started.elapsed().as_secs_f64();
        match *name {
            "replica down" => replicas[0][0].kill(),
            "replica back" => replicas[0][0].restart(&work)?,
            "leader down" => {
                let leader = leader_of(&cp_addresses, &soak_client).await?;
                nodes[leader].kill();
                faults.push(json!({"at_s": at, "fault": format!("control-plane leader node-{} killed", leader + 1)}));
                continue;
            }
            "leader back" => {
                for node in &mut nodes {
                    if node.process.is_none() {
                        node.restart(&work)?;
                    }
                }
            }
            _ => {}
        }
        faults.push(json!({"at_s": at, "fault": name}));
        tracing::info!(phase = name, at_s = at, "fault schedule");
    }
    load.await?;

    // Settle: every node caught up, then compare what was committed with what each holds.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let expected = committed.lock().clone();
    let mut node_reports = Vec::new();
    let mut lost_total = 0;
    for address in &cp_addresses {
        let state = snapshot_of(address, &soak_client).await?;
        let held: HashSet<u64> = state.entries.iter().map(|e| e.id).collect();
        let lost: Vec<u64> = expected.live.difference(&held).copied().collect();
        lost_total += lost.len();
        node_reports.push(json!({
            "node": address,
            "applied_index": state.applied_index,
            "entries": held.len(),
            "missing_committed_entries": lost.len(),
        }));
    }

    // Every proposal an edge had acknowledged must be among the committed entries.
    let mut acknowledged = 0.0;
    let mut dropped = 0.0;
    for edge in &edges {
        let metrics = Scrape::of(&edge.addr("http_addr")).await?;
        acknowledged += metrics.value("hasten_edge_proposals_total", &[("result", "sent")]);
        dropped += metrics.value("hasten_edge_proposals_total", &[("result", "dropped")]);
    }
    let unaccounted = (acknowledged as usize).saturating_sub(expected.inserted);
    lost_total += unaccounted;

    let answers = answers.lock();
    let report = json!({
        "duration_s": cli.duration_s,
        "rate_qps": cli.rate,
        "queries": answers.len(),
        "faults": faults,
        "phases": phase_report(&answers),
        "control_plane": {
            "committed_inserts_seen": expected.inserted,
            "removed_seen": expected.removed,
            "whole_state_resyncs": expected.resyncs,
            "nodes": node_reports,
            "proposals_acknowledged_to_edges": acknowledged,
            "proposals_dropped_by_edges": dropped,
            "acknowledged_but_not_committed": unaccounted,
            "lost_acknowledged_entries": lost_total,
        },
        "cross_tenant_acceptances": cross_tenant.lock().len(),
        "cross_tenant_examples": cross_tenant.lock().iter().take(5).cloned().collect::<Vec<_>>(),
    });
    write_report(&work, &report)?;
    drop(edges);
    drop(router);
    drop(replicas);
    drop(nodes);
    if lost_total > 0 || !cross_tenant.lock().is_empty() {
        bail!(
            "the soak found lost entries or a cross-tenant acceptance; see {}",
            work.join("report.json").display()
        );
    }
    Ok(())
}

struct Load {
    workload: Vec<WorkloadQuery>,
    edges: Vec<String>,
    rate: f64,
    duration: Duration,
}

/// Open-loop Poisson load for the run's duration; latency runs from each query's intended
/// send time.
async fn drive(
    load: Load,
    phase: Arc<std::sync::atomic::AtomicUsize>,
    answers: Arc<Mutex<Vec<Answer>>>,
    asked: Arc<Mutex<HashMap<usize, HashSet<String>>>>,
    cross_tenant: Arc<Mutex<Vec<Value>>>,
) {
    let client = reqwest::Client::builder()
        .timeout(CLIENT_TIMEOUT)
        .build()
        .unwrap_or_default();
    let mut rng = StdRng::seed_from_u64(11);
    let gaps = Exp::new(load.rate.max(0.001)).ok();
    let started = Instant::now();
    let mut next = started;
    let mut tasks = Vec::new();
    for i in 0.. {
        if next.duration_since(started) >= load.duration {
            break;
        }
        tokio::time::sleep_until(next).await;
        let query = load.workload[i % load.workload.len()].question.clone();
        let tenant = (i / 2) % TENANTS.len();
        let edge = load.edges[i % load.edges.len()].clone();
        let intended = next;
        let phase_now = phase.load(std::sync::atomic::Ordering::Relaxed);
        let (client, answers, asked, cross_tenant) = (
            client.clone(),
            Arc::clone(&answers),
            Arc::clone(&asked),
            Arc::clone(&cross_tenant),
        );
        tasks.push(tokio::spawn(async move {
            asked
                .lock()
                .entry(tenant)
                .or_default()
                .insert(query.clone());
            let kind = match ask(&client, &edge, TENANTS[tenant].1, &query).await {
                Ok(reply) => {
                    let outcome = reply["outcome"].as_str().unwrap_or("unknown").to_string();
                    if outcome == "accepted"
                        && let Some(matched) = reply["matched_query"]["text"].as_str()
                        && !asked
                            .lock()
                            .get(&tenant)
                            .is_some_and(|own| own.contains(matched))
                    {
                        cross_tenant.lock().push(json!({
                            "tenant": TENANTS[tenant].0,
                            "question": query,
                            "matched": matched,
                        }));
                    }
                    outcome
                }
                Err(kind) => kind,
            };
            answers.lock().push(Answer {
                phase: phase_now,
                latency: intended.elapsed(),
                kind,
            });
        }));
        if let Some(gaps) = &gaps {
            next += Duration::from_secs_f64(gaps.sample(&mut rng));
        }
    }
    for task in tasks {
        let _ = task.await;
    }
}

/// One query; the reply, or the kind of failure.
async fn ask(
    client: &reqwest::Client,
    edge: &str,
    token: &str,
    question: &str,
) -> Result<Value, String> {
    let response = client
        .post(format!("{edge}/v1/retrieve"))
        .bearer_auth(token)
        .json(&json!({"query": question, "k": 10}))
        .send()
        .await
        .map_err(|e| {
            if e.is_timeout() {
                "client_timeout".to_string()
            } else {
                "transport".to_string()
            }
        })?;
    let status = response.status().as_u16();
    let body: Value = response.json().await.map_err(|_| "bad_reply".to_string())?;
    if status == 200 {
        Ok(body)
    } else {
        Err(format!(
            "http_{status}_{}",
            body["error"]["code"].as_str().unwrap_or("unknown")
        ))
    }
}

fn phase_report(answers: &[Answer]) -> Vec<Value> {
    PHASES
        .iter()
        .enumerate()
        .map(|(index, (name, _))| {
            let mut latencies = Latencies::default();
            let mut fallbacks = Latencies::default();
            let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
            let mut count = 0;
            for answer in answers.iter().filter(|a| a.phase == index) {
                count += 1;
                latencies.record(answer.latency);
                if answer.kind == "fallback" {
                    fallbacks.record(answer.latency);
                }
                *kinds.entry(answer.kind.as_str()).or_default() += 1;
            }
            let errors: usize = kinds
                .iter()
                .filter(|(kind, _)| !matches!(**kind, "accepted" | "fallback"))
                .map(|(_, n)| n)
                .sum();
            json!({
                "phase": name,
                "queries": count,
                "error_rate": if count == 0 { 0.0 } else { errors as f64 / count as f64 },
                "by_kind": kinds,
                "p50_ms": latencies.quantile_ms(0.5),
                "p95_ms": latencies.quantile_ms(0.95),
                "p99_ms": latencies.quantile_ms(0.99),
                // The answers that went through the cloud tier and, replicated, the control
                // plane: the path the faults hit.
                "fallback_p50_ms": fallbacks.quantile_ms(0.5),
                "fallback_p99_ms": fallbacks.quantile_ms(0.99),
            })
        })
        .collect()
}

/// What the control plane committed, as one subscriber saw it.
#[derive(Clone, Debug, Default)]
struct CommittedEntries {
    /// Inserted and not removed since.
    live: HashSet<u64>,
    inserted: usize,
    removed: usize,
    /// Times the stream restarted from a whole state (events compacted away).
    resyncs: usize,
}

async fn client_of(
    address: &str,
    tls: &MutualTls,
) -> Result<ControlPlaneClient<tonic::transport::Channel>> {
    let channel = endpoint(address, Some(tls))?.connect().await?;
    Ok(ControlPlaneClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES))
}

/// Follows the committed stream across node failures, resuming after the last index seen.
async fn follow_committed(
    addresses: Vec<String>,
    tls: MutualTls,
    committed: Arc<Mutex<CommittedEntries>>,
) {
    let mut next_index = 1;
    for address in addresses.iter().cycle() {
        let Ok(mut client) = client_of(address, &tls).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let request = SubscribeRequest {
            from_index: next_index,
            subscriber: "hasten-soak".into(),
        };
        let Ok(stream) = client.subscribe(request).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let mut stream = stream.into_inner();
        while let Ok(Some(event)) = stream.message().await {
            let mut seen = committed.lock();
            if let Some(state) = event.state {
                seen.resyncs += 1;
                seen.live = state.entries.iter().map(|e| e.id).collect();
            }
            for applied in event.applied {
                for id in applied.removed {
                    seen.removed += usize::from(seen.live.remove(&id));
                }
                if let Some(applied_command::Kind::Inserted(stored)) = applied.kind {
                    seen.inserted += 1;
                    seen.live.insert(stored.id);
                }
            }
            next_index = event.index + 1;
        }
    }
}

/// The index (0-based) of the node that leads now.
async fn leader_of(addresses: &[String], tls: &MutualTls) -> Result<usize> {
    for _ in 0..50 {
        for (index, address) in addresses.iter().enumerate() {
            if let Ok(mut client) = client_of(address, tls).await
                && let Ok(status) = client.status(StatusRequest {}).await
                && status.get_ref().role == "leader"
            {
                return Ok(index);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!("no control-plane leader")
}

async fn snapshot_of(address: &str, tls: &MutualTls) -> Result<hasten_proto::v1::ControlState> {
    let mut client = client_of(address, tls).await?;
    Ok(client.snapshot(SnapshotRequest {}).await?.into_inner())
}
