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
//! | 0.88 | leader back | it is restarted from its sled directory |
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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use clap::Parser;
use hasten_bench::{Latencies, write_report};
use hasten_proto::control::{MAX_MESSAGE_BYTES, endpoint};
use hasten_proto::tls::{DevAuthority, MutualTls, TlsPaths};
use hasten_proto::v1::control_plane_client::ControlPlaneClient;
use hasten_proto::v1::{
    NodeStatus, SnapshotRequest, StatusRequest, SubscribeRequest, applied_command,
};
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
/// What a client waits before giving up on an answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);
const START_TIMEOUT: Duration = Duration::from_secs(300);
/// Longest the soak waits on one control-plane call of its own (connect, status, subscribe):
/// a frozen node accepts TCP connections and then answers nothing.
const RPC_TIMEOUT: Duration = Duration::from_secs(3);
/// Longest the nodes may take, after the load, to agree on one applied index holding every
/// committed entry.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How often each edge's applied control-plane index is sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// Where the pids of frozen processes are kept while they are frozen.
const STOPPED_PIDS: &str = "stopped.pids";

/// Which replica each cloud fault hits: (shard, replica).
const KILLED_REPLICA: (usize, usize) = (0, 0);
const HUNG_REPLICA: (usize, usize) = (1, 0);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    Nothing,
    KillReplica,
    RestartReplica,
    HangReplica,
    ResumeReplica,
    KillLeader,
    RestartNodes,
    HangFollower,
    ResumeFollower,
}

struct Phase {
    name: &'static str,
    /// Share of the run at which the phase starts (and its fault is injected).
    starts_at: f64,
    fault: Fault,
}

/// The phases of the run; each lasts until the next starts.
const PHASES: [Phase; 9] = [
    Phase {
        name: "steady",
        starts_at: 0.0,
        fault: Fault::Nothing,
    },
    Phase {
        name: "replica down",
        starts_at: 0.12,
        fault: Fault::KillReplica,
    },
    Phase {
        name: "replica back",
        starts_at: 0.24,
        fault: Fault::RestartReplica,
    },
    Phase {
        name: "cloud replica hung",
        starts_at: 0.32,
        fault: Fault::HangReplica,
    },
    Phase {
        name: "cloud replica resumed",
        starts_at: 0.44,
        fault: Fault::ResumeReplica,
    },
    Phase {
        name: "follower hung",
        starts_at: 0.52,
        fault: Fault::HangFollower,
    },
    Phase {
        name: "follower resumed",
        starts_at: 0.64,
        fault: Fault::ResumeFollower,
    },
    Phase {
        name: "leader down",
        starts_at: 0.76,
        fault: Fault::KillLeader,
    },
    Phase {
        name: "leader back",
        starts_at: 0.88,
        fault: Fault::RestartNodes,
    },
];

/// One query's fate.
struct Answer {
    phase: usize,
    latency: Duration,
    /// `accepted`, `fallback`, or an error kind.
    kind: String,
}

/// A process that can be stopped and started again with the same arguments (and so the same
/// ports and data directory), or frozen and resumed. Dropping it resumes it if frozen, then
/// kills it.
struct Restartable {
    name: String,
    binary: PathBuf,
    args: Vec<String>,
    work: PathBuf,
    process: Option<ManagedProcess>,
    /// Frozen with SIGSTOP and not yet resumed.
    frozen: bool,
}

impl Restartable {
    fn start(name: &str, binary: PathBuf, args: Vec<String>, work: &Path) -> Result<Self> {
        let mut restartable = Self {
            name: name.to_string(),
            binary,
            args,
            work: work.to_path_buf(),
            process: None,
            frozen: false,
        };
        restartable.restart()?;
        Ok(restartable)
    }

    fn restart(&mut self) -> Result<()> {
        self.kill();
        // Start-up blocks until the process is ready; keep the load's worker threads free.
        let process = tokio::task::block_in_place(|| {
            ManagedProcess::start(
                &self.name,
                &self.binary,
                &self.args,
                &self.work,
                START_TIMEOUT,
            )
        })
        .with_context(|| format!("starting {}", self.name))?;
        self.process = Some(process);
        Ok(())
    }

    fn kill(&mut self) {
        self.resume_quietly();
        if let Some(mut process) = self.process.take() {
            process.stop();
        }
    }

    /// Freezes the process (SIGSTOP): it keeps its sockets open and answers nothing, as a
    /// hung process does.
    fn freeze(&mut self) -> Result<()> {
        let process = self
            .process
            .as_ref()
            .with_context(|| format!("{} is not running; it cannot be frozen", self.name))?;
        // Recorded first, so that a wrapper can resume it whatever happens next.
        note_stopped(&self.work, process.pid(), &self.name, true);
        if let Err(err) = process.signal("STOP") {
            note_stopped(&self.work, process.pid(), &self.name, false);
            return Err(err).with_context(|| format!("freezing {}", self.name));
        }
        self.frozen = true;
        Ok(())
    }

    /// Lets a frozen process run again (SIGCONT).
    fn resume(&mut self) -> Result<()> {
        if !self.frozen {
            return Ok(());
        }
        if let Some(process) = &self.process {
            process
                .signal("CONT")
                .with_context(|| format!("resuming {}", self.name))?;
            note_stopped(&self.work, process.pid(), &self.name, false);
        }
        self.frozen = false;
        Ok(())
    }

    fn resume_quietly(&mut self) {
        if let Err(err) = self.resume() {
            tracing::warn!(%err, "a frozen process could not be resumed; it is killed");
            self.frozen = false;
        }
    }

    fn addr(&self, key: &str) -> String {
        self.process
            .as_ref()
            .map(|p| p.addr(key))
            .unwrap_or_default()
    }

    fn log(&self) -> Option<PathBuf> {
        self.process.as_ref().map(|p| p.log.clone())
    }
}

impl Drop for Restartable {
    fn drop(&mut self) {
        // Resumed before it is killed (dropping the `ManagedProcess`), so that no stopped
        // process outlives the soak.
        self.resume_quietly();
    }
}

/// Adds (`stopped`) or removes the line of `pid` in `<work>/stopped.pids`.
fn note_stopped(work: &Path, pid: u32, name: &str, stopped: bool) {
    let path = work.join(STOPPED_PIDS);
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let mut lines: Vec<String> = text
        .lines()
        .filter(|line| line.split_whitespace().next() != Some(pid.to_string().as_str()))
        .map(str::to_string)
        .collect();
    if stopped {
        lines.push(format!("{pid} {name}"));
    }
    let result = if lines.is_empty() {
        std::fs::remove_file(&path).or_else(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Ok(()),
            _ => Err(e),
        })
    } else {
        std::fs::write(&path, lines.join("\n") + "\n")
    };
    if let Err(err) = result {
        tracing::warn!(%err, path = %path.display(), "cannot record a frozen process");
    }
}

fn fixed_address() -> Result<String> {
    Ok(format!("127.0.0.1:{}", free_loopback_port()?))
}

#[tokio::main]
async fn main() -> Result<()> {
    hasten_core::logging::init();
    let cli = Cli::parse();
    // Dropping the soak (on a signal) drops every process it started: frozen ones are
    // resumed first, then all are killed.
    tokio::select! {
        result = soak(cli) => result,
        signal = interrupted() => bail!("the soak was interrupted ({signal}); its processes were resumed and ended"),
    }
}

/// Resolves on the first SIGINT, SIGTERM or SIGHUP.
async fn interrupted() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => "SIGINT",
        _ = term.recv() => "SIGTERM",
        _ = hup.recv() => "SIGHUP",
    }
}

/// The control-plane node the edge whose log is `log` follows now, by the last stream it
/// started (`following the control plane`).
fn followed_node(log: &Path, addresses: &[String]) -> Option<usize> {
    let text = std::fs::read_to_string(log).ok()?;
    let line = text
        .lines()
        .rev()
        .find(|line| line.contains("following the control plane"))?;
    addresses.iter().position(|address| {
        line.match_indices(address.as_str())
            .any(|(at, _)| !line[at + address.len()..].starts_with(|c: char| c.is_ascii_digit()))
    })
}

/// The edge's applied control-plane index and whether it is subscribed, from its status.
async fn edge_link(client: &reqwest::Client, url: &str) -> Option<(u64, bool)> {
    let status: Value = client
        .get(format!("{url}/v1/status"))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    let link = &status["control_plane"];
    Some((
        link["applied_index"].as_u64()?,
        link["subscribed"].as_bool()?,
    ))
}

async fn edge_links(client: &reqwest::Client, urls: &[String]) -> Vec<Option<(u64, bool)>> {
    let mut links = Vec::new();
    for url in urls {
        links.push(edge_link(client, url).await);
    }
    links
}

fn status_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(RPC_TIMEOUT)
        .build()
        .unwrap_or_default()
}

/// Each edge's applied index, sampled every [`SAMPLE_EVERY`] through the run.
struct EdgeSample {
    at_s: f64,
    phase: usize,
    applied: Vec<Option<u64>>,
}

async fn sample_edges(
    urls: Vec<String>,
    phase: Arc<AtomicUsize>,
    started: Instant,
    samples: Arc<Mutex<Vec<EdgeSample>>>,
) {
    let client = status_client();
    let mut ticks = tokio::time::interval(SAMPLE_EVERY);
    loop {
        ticks.tick().await;
        let phase_now = phase.load(Ordering::Relaxed);
        let applied = edge_links(&client, &urls)
            .await
            .into_iter()
            .map(|link| link.map(|(index, _)| index))
            .collect();
        samples.lock().push(EdgeSample {
            at_s: started.elapsed().as_secs_f64(),
            phase: phase_now,
            applied,
        });
    }
}

/// What the hung-follower phase saw at one of its ends.
struct FollowerMark {
    at_s: f64,
    leader_commit_index: Option<u64>,
    committed_inserts: usize,
    edges: Vec<Option<(u64, bool)>>,
}

async fn follower_mark(
    started: Instant,
    leader: &str,
    tls: &MutualTls,
    committed: &Mutex<CommittedEntries>,
    admin_urls: &[String],
) -> FollowerMark {
    let at_s = started.elapsed().as_secs_f64();
    let leader_commit_index = status_of(leader, tls).await.ok().map(|s| s.commit_index);
    let committed_inserts = committed.lock().inserted;
    let edges = edge_links(&status_client(), admin_urls).await;
    FollowerMark {
        at_s,
        leader_commit_index,
        committed_inserts,
        edges,
    }
}

/// Polls `address` until it has applied `index`; the seconds that took, or `None` after
/// [`SETTLE_TIMEOUT`].
async fn catch_up(address: String, tls: MutualTls, index: u64) -> Option<f64> {
    let started = Instant::now();
    while started.elapsed() < SETTLE_TIMEOUT {
        if let Ok(status) = status_of(&address, &tls).await
            && status.applied_index >= index
        {
            return Some(started.elapsed().as_secs_f64());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

async fn soak(cli: Cli) -> Result<()> {
    let workload = read_jsonl(&cli.workload)?;
    if workload.is_empty() {
        bail!("the workload {} is empty", cli.workload.display());
    }
    std::fs::create_dir_all(&cli.work)?;
    let work = cli.work.canonicalize()?;
    let _ = std::fs::remove_file(work.join(STOPPED_PIDS));

    let authority = DevAuthority::new("hasten soak CA")?;
    let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    let issued = authority.write_bundle(
        &work.join("tls"),
        &["cloud", "control-plane", "edge", "soak"],
        &names,
    )?;
    let [cloud_tls, cp_tls, edge_tls, soak_tls]: [TlsPaths; 4] = issued
        .try_into()
        .map_err(|_| anyhow!("expected four certificates"))?;
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
            // Status and metrics name every tenant: with a tenants file they are served on
            // an admin address of their own.
            "--metrics-addr".into(),
            "127.0.0.1:0".into(),
        ]);
        // Edge e lists the nodes from node e+1 on: edges start on different nodes (as they
        // would spread over a real deployment), so whichever node leads when a follower is
        // frozen, an edge most likely follows a follower and the freeze hits its stream.
        for address in cp_addresses.iter().cycle().skip(e).take(cp_addresses.len()) {
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
    // Where each edge serves /v1/status and /metrics.
    let admin_urls: Vec<String> = edges
        .iter()
        .map(|e| format!("http://{}", e.addr("metrics_addr")))
        .collect();
    tracing::info!(?edge_urls, ?admin_urls, "topology up");

    let committed = Arc::new(Mutex::new(CommittedEntries::default()));
    let follower = tokio::spawn(follow_committed(
        cp_addresses.clone(),
        soak_client.clone(),
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
            edges: edge_urls.clone(),
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
        admin_urls.clone(),
        Arc::clone(&phase),
        started,
        Arc::clone(&samples),
    ));

    // The fault schedule.
    let mut faults = Vec::new();
    let mut hung_follower: Option<HungFollower> = None;
    let mut follower_report = Value::Null;
    let mut caught_up = None;
    for (index, phase_plan) in PHASES.iter().enumerate().skip(1) {
        tokio::time::sleep_until(started + duration.mul_f64(phase_plan.starts_at)).await;
        phase.store(index, Ordering::Relaxed);
        let at = started.elapsed().as_secs_f64();
        let fault = match phase_plan.fault {
            Fault::Nothing => phase_plan.name.to_string(),
            Fault::KillReplica => {
                let replica = &mut replicas[KILLED_REPLICA.0][KILLED_REPLICA.1];
                replica.kill();
                format!("cloud replica {} killed", replica.name)
            }
            Fault::RestartReplica => {
                let replica = &mut replicas[KILLED_REPLICA.0][KILLED_REPLICA.1];
                replica.restart()?;
                format!("cloud replica {} restarted", replica.name)
            }
            Fault::HangReplica => {
                let replica = &mut replicas[HUNG_REPLICA.0][HUNG_REPLICA.1];
                replica.freeze()?;
                format!("cloud replica {} frozen (SIGSTOP)", replica.name)
            }
            Fault::ResumeReplica => {
                let replica = &mut replicas[HUNG_REPLICA.0][HUNG_REPLICA.1];
                replica.resume()?;
                format!("cloud replica {} resumed (SIGCONT)", replica.name)
            }
            Fault::KillLeader => {
                let leader = leader_of(&cp_addresses, &soak_client).await?;
                nodes[leader].kill();
                format!("control-plane leader node-{} killed", leader + 1)
            }
            Fault::RestartNodes => {
                let mut restarted = Vec::new();
                for node in &mut nodes {
                    if node.process.is_none() {
                        node.restart()?;
                        restarted.push(node.name.clone());
                    }
                }
                format!("control-plane {} restarted", restarted.join(", "))
            }
            Fault::HangFollower => {
                let leader = leader_of(&cp_addresses, &soak_client).await?;
                // Prefer the follower the edges follow: the hang then hits their streams.
                let following: Vec<Option<usize>> = edges
                    .iter()
                    .map(|edge| {
                        edge.log()
                            .and_then(|log| followed_node(&log, &cp_addresses))
                    })
                    .collect();
                let candidates: Vec<usize> = (0..nodes.len())
                    .filter(|&n| n != leader && nodes[n].process.is_some())
                    .collect();
                let target = candidates
                    .iter()
                    .copied()
                    .max_by_key(|&n| {
                        (
                            following.iter().filter(|f| **f == Some(n)).count(),
                            std::cmp::Reverse(n),
                        )
                    })
                    .context("no running control-plane follower to freeze")?;
                let mark = follower_mark(
                    started,
                    &cp_addresses[leader],
                    &soak_client,
                    &committed,
                    &admin_urls,
                )
                .await;
                nodes[target].freeze()?;
                hung_follower = Some(HungFollower {
                    phase: index,
                    node: target,
                    leader,
                    following,
                    start: mark,
                });
                format!(
                    "control-plane follower node-{} frozen (SIGSTOP); node-{} leads",
                    target + 1,
                    leader + 1
                )
            }
            Fault::ResumeFollower => match hung_follower.take() {
                Some(hung) => {
                    // Measured before the node runs again: what happened while it was frozen.
                    let end = follower_mark(
                        started,
                        &cp_addresses[hung.leader],
                        &soak_client,
                        &committed,
                        &admin_urls,
                    )
                    .await;
                    nodes[hung.node].resume()?;
                    if let Some(index) = end.leader_commit_index {
                        caught_up = Some(tokio::spawn(catch_up(
                            cp_addresses[hung.node].clone(),
                            soak_client.clone(),
                            index,
                        )));
                    }
                    follower_report = follower_phase_report(&hung, &end, &samples.lock());
                    format!(
                        "control-plane follower node-{} resumed (SIGCONT)",
                        hung.node + 1
                    )
                }
                None => "no follower was frozen".to_string(),
            },
        };
        tracing::info!(phase = phase_plan.name, at_s = at, %fault, "fault schedule");
        faults.push(json!({"at_s": at, "phase": phase_plan.name, "fault": fault}));
    }
    load.await?;
    sampler.abort();
    // Nothing stays frozen past the load, whatever the schedule.
    for process in replicas.iter_mut().flatten().chain(nodes.iter_mut()) {
        process.resume()?;
    }
    let caught_up_s = match caught_up {
        Some(task) => task.await?,
        None => None,
    };
    if let Some(report) = follower_report.as_object_mut() {
        report.insert("resumed_node_caught_up_s".into(), json!(caught_up_s));
    }

    // Settle: every node caught up, then compare what was committed with what each holds,
    // until all hold every entry the soak saw committed at one applied index, the soak's
    // subscriber has seen every entry they hold, and every proposal an edge had
    // acknowledged is among the committed entries.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let settle_started = Instant::now();
    let settled = loop {
        let expected = committed.lock().clone();
        let attempt = async {
            let nodes = compare_nodes(&cp_addresses, &soak_client, &expected).await?;
            let mut acknowledged = 0.0;
            let mut dropped = 0.0;
            for edge in &edges {
                let metrics = Scrape::of(&edge.addr("metrics_addr")).await?;
                acknowledged += metrics.value("hasten_edge_proposals_total", &[("result", "sent")]);
                dropped += metrics.value("hasten_edge_proposals_total", &[("result", "dropped")]);
            }
            anyhow::Ok(Settled {
                expected: expected.clone(),
                nodes,
                acknowledged,
                dropped,
            })
        }
        .await;
        let done = attempt.as_ref().is_ok_and(Settled::is_settled);
        if done || settle_started.elapsed() >= SETTLE_TIMEOUT {
            break attempt?;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let settle_s = settle_started.elapsed().as_secs_f64();
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
    drop(edges);
    drop(router);
    drop(replicas);
    drop(nodes);
    if lost_total > 0 || !same_applied_index || !cross_tenant.lock().is_empty() {
        bail!(
            "the soak found lost entries, nodes at different applied indexes or a cross-tenant acceptance; see {}",
            work.join("report.json").display()
        );
    }
    Ok(())
}

/// The end-of-run comparison.
struct Settled {
    expected: CommittedEntries,
    nodes: NodeComparison,
    acknowledged: f64,
    dropped: f64,
}

impl Settled {
    /// Nothing more is expected to arrive: the nodes agree and hold everything the soak saw
    /// committed, the soak saw everything they hold, and every acknowledged proposal is in.
    fn is_settled(&self) -> bool {
        self.nodes.same_applied_index
            && self.nodes.missing == 0
            && self.nodes.unseen == 0
            && self.acknowledged as usize <= self.expected.inserted
    }
}

struct NodeComparison {
    reports: Vec<Value>,
    /// Committed entries missing from a node, summed over the nodes.
    missing: usize,
    /// Entries a node holds that the soak's subscriber has not seen (yet), summed.
    unseen: usize,
    same_applied_index: bool,
}

/// Each node's entries against the ones the soak saw committed.
async fn compare_nodes(
    addresses: &[String],
    tls: &MutualTls,
    expected: &CommittedEntries,
) -> Result<NodeComparison> {
    let mut reports = Vec::new();
    let (mut missing_total, mut unseen_total) = (0, 0);
    let mut applied = HashSet::new();
    for (index, address) in addresses.iter().enumerate() {
        let state = snapshot_of(address, tls).await?;
        let held: HashSet<u64> = state.entries.iter().map(|e| e.id).collect();
        let missing = expected.live.difference(&held).count();
        let unseen = held.difference(&expected.live).count();
        missing_total += missing;
        unseen_total += unseen;
        applied.insert(state.applied_index);
        reports.push(json!({
            "node": format!("node-{}", index + 1),
            "address": address,
            "applied_index": state.applied_index,
            "entries": held.len(),
            "missing_committed_entries": missing,
            "entries_not_seen_committed_by_the_soak": unseen,
        }));
    }
    Ok(NodeComparison {
        reports,
        missing: missing_total,
        unseen: unseen_total,
        same_applied_index: applied.len() == 1,
    })
}

/// The frozen control-plane follower, while it is frozen.
struct HungFollower {
    /// The phase it was frozen in.
    phase: usize,
    node: usize,
    /// The node that led when it was frozen.
    leader: usize,
    /// The node each edge followed then, by its log.
    following: Vec<Option<usize>>,
    start: FollowerMark,
}

/// What the hung-follower phase showed: entries committed while the node was frozen and
/// each edge's applied index at the start and end of the phase.
fn follower_phase_report(hung: &HungFollower, end: &FollowerMark, samples: &[EdgeSample]) -> Value {
    let start = &hung.start;
    let edges: Vec<Value> = (0..start.edges.len().max(end.edges.len()))
        .map(|e| {
            let at = |mark: &FollowerMark| mark.edges.get(e).copied().flatten();
            let (first, last) = (at(start), at(end));
            json!({
                "edge": format!("edge-{e}"),
                "following_at_start": hung.following.get(e).copied().flatten().map(|n| format!("node-{}", n + 1)),
                "applied_index_start": first.map(|(index, _)| index),
                "applied_index_end": last.map(|(index, _)| index),
                "advanced": matches!((first, last), (Some((a, _)), Some((b, _))) if b > a),
                "subscribed_at_end": last.map(|(_, subscribed)| subscribed),
                "behind_leader_at_end": match (end.leader_commit_index, last) {
                    (Some(commit), Some((index, _))) => Some(commit.saturating_sub(index)),
                    _ => None,
                },
                "longest_unchanged_s": longest_unchanged_s(samples, hung.phase, e),
            })
        })
        .collect();
    json!({
        "node": format!("node-{}", hung.node + 1),
        "leader": format!("node-{}", hung.leader + 1),
        "from_s": start.at_s,
        "to_s": end.at_s,
        // As the soak's own subscriber saw them.
        "committed_inserts_during": end.committed_inserts.saturating_sub(start.committed_inserts),
        "leader_commit_index_start": start.leader_commit_index,
        "leader_commit_index_end": end.leader_commit_index,
        "log_entries_committed_during": match (start.leader_commit_index, end.leader_commit_index) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a)),
            _ => None,
        },
        "edges": edges,
    })
}

/// The longest stretch of `phase` over which edge `edge`'s sampled applied index did not
/// move (or stayed unreadable).
fn longest_unchanged_s(samples: &[EdgeSample], phase: usize, edge: usize) -> f64 {
    let mut longest = 0.0_f64;
    let mut since: Option<(f64, Option<u64>)> = None;
    for sample in samples.iter().filter(|s| s.phase == phase) {
        let value = sample.applied.get(edge).copied().flatten();
        match since {
            Some((from, seen)) if seen == value => {
                longest = longest.max(sample.at_s - from);
            }
            _ => since = Some((sample.at_s, value)),
        }
    }
    longest
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
    phase: Arc<AtomicUsize>,
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
        let phase_now = phase.load(Ordering::Relaxed);
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

fn phase_report(answers: &[Answer], samples: &[EdgeSample], duration: Duration) -> Vec<Value> {
    PHASES
        .iter()
        .enumerate()
        .map(|(index, plan)| {
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
            let ends_at = PHASES.get(index + 1).map_or(1.0, |next| next.starts_at);
            let in_phase: Vec<&EdgeSample> = samples.iter().filter(|s| s.phase == index).collect();
            let edges_applied: Vec<Value> = (0..in_phase.first().map_or(0, |s| s.applied.len()))
                .map(|e| {
                    json!({
                        "edge": format!("edge-{e}"),
                        "first": in_phase.first().and_then(|s| s.applied[e]),
                        "last": in_phase.last().and_then(|s| s.applied[e]),
                        "longest_unchanged_s": longest_unchanged_s(samples, index, e),
                    })
                })
                .collect();
            json!({
                "phase": plan.name,
                "from_s": duration.mul_f64(plan.starts_at).as_secs_f64(),
                "to_s": duration.mul_f64(ends_at).as_secs_f64(),
                "queries": count,
                "errors": errors,
                "error_rate": if count == 0 { 0.0 } else { errors as f64 / count as f64 },
                "by_kind": kinds,
                "p50_ms": latencies.quantile_ms(0.5),
                "p95_ms": latencies.quantile_ms(0.95),
                "p99_ms": latencies.quantile_ms(0.99),
                // The answers that went through the cloud tier and, replicated, the control
                // plane: the path the faults hit.
                "fallback_p50_ms": fallbacks.quantile_ms(0.5),
                "fallback_p99_ms": fallbacks.quantile_ms(0.99),
                // Each edge's applied control-plane index, sampled every second.
                "edge_applied_index": edges_applied,
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
    /// Index of the last event seen.
    last_index: u64,
}

async fn client_of(
    address: &str,
    tls: &MutualTls,
) -> Result<ControlPlaneClient<tonic::transport::Channel>> {
    let endpoint = endpoint(address, Some(tls))?;
    let channel = tokio::time::timeout(RPC_TIMEOUT, endpoint.connect())
        .await
        .map_err(|_| anyhow!("{address} did not answer within {RPC_TIMEOUT:?}"))??;
    Ok(ControlPlaneClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES))
}

async fn status_of(address: &str, tls: &MutualTls) -> Result<NodeStatus> {
    let mut client = client_of(address, tls).await?;
    let status = tokio::time::timeout(RPC_TIMEOUT, client.status(StatusRequest {}))
        .await
        .map_err(|_| anyhow!("{address} did not answer within {RPC_TIMEOUT:?}"))??;
    Ok(status.into_inner())
}

/// Follows the committed stream across node failures and hangs, resuming after the last
/// index seen (HTTP/2 keepalive ends a stream from a frozen node).
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
        let Ok(Ok(stream)) = tokio::time::timeout(RPC_TIMEOUT, client.subscribe(request)).await
        else {
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
            seen.last_index = event.index;
            next_index = event.index + 1;
        }
    }
}

/// The index (0-based) of the node that leads now.
async fn leader_of(addresses: &[String], tls: &MutualTls) -> Result<usize> {
    for _ in 0..50 {
        for (index, address) in addresses.iter().enumerate() {
            if let Ok(status) = status_of(address, tls).await
                && status.role == "leader"
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
    let snapshot = tokio::time::timeout(SETTLE_TIMEOUT, client.snapshot(SnapshotRequest {}))
        .await
        .map_err(|_| anyhow!("{address} sent no snapshot within {SETTLE_TIMEOUT:?}"))??;
    Ok(snapshot.into_inner())
}
