//! An experiment: a cloud tier, then each system under test as edge processes behind delay
//! relays, the same workload through every one, one report.

use display_full_error::DisplayFullErrorExt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::control_plane;
use crate::draft_loss::traced_queries;
use crate::driver::DriverSettings;
use crate::relay::{DelayModel, Relay};
use crate::report::{EdgeDocuments, SystemReport};
use crate::retrieve;
use crate::scoring::{WorkloadIndex, summarize_all_and_first};
use crate::workload::WorkloadQuery;
use hasten_eval::process::{
    ManagedProcess, ProcessError, binary, cloud_index_route_args, cloud_index_serve_args,
    edge_serve_args,
};

/// How long a service may take to load its bundle and build its indexes.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error("relay: {0}")]
    Relay(std::io::Error),
    #[error("{0}")]
    Invalid(String),
    #[error("writing {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Writes a run's records, one JSON object per line.
pub(crate) fn write_records(
    path: PathBuf,
    records: impl Iterator<Item = serde_json::Value>,
) -> Result<(), EvalError> {
    let lines: String = records.map(|r| format!("{r}\n")).collect();
    std::fs::write(&path, lines).map_err(|source| EvalError::Write { path, source })
}

/// One system under test: a name (`cloud-only`, `has`, ...), its swept parameters, and the
/// `edge-node serve` flags that make it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SystemSpec {
    pub name: String,
    pub params: serde_json::Value,
    #[serde(skip)]
    pub edge_args: Vec<String>,
    /// The system's edges share their hot cache through a fresh 3-node control plane.
    #[serde(skip)]
    pub replicated: bool,
}

impl SystemSpec {
    fn new(name: &str, params: serde_json::Value, args: &[&str]) -> Self {
        Self {
            name: name.into(),
            params,
            edge_args: args.iter().map(|a| a.to_string()).collect(),
            replicated: false,
        }
    }
}

/// How the paper's fuzzy-channel ablations run.
#[derive(Clone, Debug, PartialEq)]
pub struct AblationSettings {
    /// tau of every ablation.
    pub tau: f64,
    /// Random questions (one per line) that pre-fill the cache of `has-no-fuzzy-validation`.
    pub warm_queries: PathBuf,
    /// How many questions that file holds, for the report.
    pub warm_count: usize,
}

/// Every system name [`system_specs`] knows, in the order the help lists them.
pub const SYSTEM_NAMES: &str = "cloud-only, edge-ivf, exact-cache, semantic-cache, has, \
     has-replicated, has-no-fuzzy, has-no-fuzzy-validation, has-no-fuzzy-draft";

/// The sweeps of an evaluation: HaS's tau at each corpus fraction, the semantic cache's
/// theta.
#[derive(Clone, Debug, PartialEq)]
pub struct Sweeps {
    pub taus: Vec<f64>,
    pub thetas: Vec<f64>,
    /// Shares of the corpus HaS's edges hold (`corpus_fraction`); 1.0 alone by default.
    pub corpus_fractions: Vec<f64>,
    /// HaS with other rules, each swept like `has` wherever `has` is listed.
    pub has_variants: Vec<HasVariant>,
}

/// HaS with extra edge flags, reported as `has-<name>`: a rule measured against the
/// default on the same queries.
#[derive(Clone, Debug, PartialEq)]
pub struct HasVariant {
    pub name: String,
    pub edge_args: Vec<String>,
}

impl std::str::FromStr for HasVariant {
    type Err = String;

    /// `NAME=FLAGS`, the flags separated by spaces: `rank=--set=retrieval.vote_weighting=rank`.
    fn from_str(text: &str) -> Result<Self, String> {
        let (name, flags) = text
            .split_once('=')
            .ok_or_else(|| format!("expected NAME=FLAGS, got {text:?}"))?;
        let edge_args: Vec<String> = flags.split_whitespace().map(str::to_string).collect();
        if name.is_empty() || edge_args.is_empty() {
            return Err(format!("expected NAME=FLAGS with both, got {text:?}"));
        }
        Ok(Self {
            name: name.to_string(),
            edge_args,
        })
    }
}

/// HaS at every (corpus fraction, tau) of `sweeps`: the fraction named in the parameters
/// and flags only when below 1.
fn has_specs(name: &str, sweeps: &Sweeps, replicated: bool, extra: &[String]) -> Vec<SystemSpec> {
    let mut specs = Vec::new();
    for &fraction in &sweeps.corpus_fractions {
        for &tau in &sweeps.taus {
            let t = format!("retrieval.tau={tau}");
            let f = format!("retrieval.corpus_fraction={fraction}");
            let mut args = vec!["--set", "retrieval.policy=has", "--set", &t];
            let mut params = serde_json::json!({ "tau": tau });
            if fraction < 1.0 {
                args.extend(["--set", &f]);
                params["corpus_fraction"] = serde_json::json!(fraction);
            }
            args.extend(extra.iter().map(String::as_str));
            specs.push(SystemSpec {
                replicated,
                ..SystemSpec::new(name, params, &args)
            });
        }
    }
    specs
}

/// The systems to compare, in report order: each name in `names`, the sweeps expanded.
pub fn system_specs(
    names: &[String],
    sweeps: &Sweeps,
    ablation: &AblationSettings,
) -> Result<Vec<SystemSpec>, EvalError> {
    if let Some(bad) = sweeps
        .corpus_fractions
        .iter()
        .find(|f| !(**f > 0.0 && **f <= 1.0))
    {
        return Err(EvalError::Invalid(format!(
            "corpus fractions must be in (0, 1], got {bad}"
        )));
    }
    let no_fuzzy_tau = ablation.tau;
    let no_fuzzy_tau_key = format!("retrieval.tau={no_fuzzy_tau}");
    let mut specs = Vec::new();
    for name in names {
        match name.as_str() {
            "cloud-only" => specs.push(SystemSpec::new(
                "cloud-only",
                serde_json::json!({}),
                &["--set", "retrieval.policy=cloud-only"],
            )),
            "edge-ivf" => specs.push(SystemSpec::new(
                "edge-ivf",
                serde_json::json!({}),
                &["--set", "retrieval.policy=edge-ivf"],
            )),
            "exact-cache" => specs.push(SystemSpec::new(
                "exact-cache",
                serde_json::json!({}),
                &["--set", "retrieval.policy=exact-cache"],
            )),
            "semantic-cache" => {
                for theta in &sweeps.thetas {
                    let t = format!("retrieval.semantic_threshold={theta}");
                    specs.push(SystemSpec::new(
                        "semantic-cache",
                        serde_json::json!({"theta": theta}),
                        &["--set", "retrieval.policy=semantic-cache", "--set", &t],
                    ));
                }
            }
            "has" => {
                specs.extend(has_specs("has", sweeps, false, &[]));
                for variant in &sweeps.has_variants {
                    let name = format!("has-{}", variant.name);
                    specs.extend(has_specs(&name, sweeps, false, &variant.edge_args));
                }
            }
            "has-replicated" => specs.extend(has_specs("has-replicated", sweeps, true, &[])),
            "has-no-fuzzy" => {
                specs.push(SystemSpec::new(
                    "has-no-fuzzy",
                    serde_json::json!({"tau": no_fuzzy_tau}),
                    &[
                        "--set",
                        "retrieval.policy=has",
                        "--set",
                        &no_fuzzy_tau_key,
                        "--set",
                        "retrieval.fuzzy_channel=false",
                    ],
                ));
            }
            // The paper's Table VI: the fuzzy channel kept out of validation, the cache
            // pre-filled with random questions (its footnote 7), then kept out of drafts.
            "has-no-fuzzy-validation" => {
                let warm = ablation.warm_queries.display().to_string();
                specs.push(SystemSpec::new(
                    "has-no-fuzzy-validation",
                    serde_json::json!({"tau": no_fuzzy_tau, "warm_queries": ablation.warm_count}),
                    &[
                        "--set",
                        "retrieval.policy=has",
                        "--set",
                        &no_fuzzy_tau_key,
                        "--set",
                        "retrieval.fuzzy_in_validation=false",
                        "--warm-queries",
                        &warm,
                    ],
                ));
            }
            "has-no-fuzzy-draft" => {
                specs.push(SystemSpec::new(
                    "has-no-fuzzy-draft",
                    serde_json::json!({"tau": no_fuzzy_tau}),
                    &[
                        "--set",
                        "retrieval.policy=has",
                        "--set",
                        &no_fuzzy_tau_key,
                        "--set",
                        "retrieval.fuzzy_in_draft=false",
                    ],
                ));
            }
            other => {
                return Err(EvalError::Invalid(format!(
                    "unknown system {other:?}: expected one of {SYSTEM_NAMES}"
                )));
            }
        }
    }
    Ok(specs)
}

/// Where and how the systems run.
#[derive(Clone, Debug)]
pub struct ClusterSettings {
    pub bundle: PathBuf,
    /// Shard servers behind a router (0 or 1: one index over the whole corpus).
    pub shards: usize,
    /// Logs, ready files and the dev certificate.
    pub work: PathBuf,
    /// Edges per system; client i talks to edge i mod `edges`.
    pub edges: usize,
    /// One-way delay between clients and edges.
    pub client_delay: DelayModel,
    /// One-way delay between edges and the cloud.
    pub cloud_delay: DelayModel,
    pub seed: u64,
    /// Extra `edge-node serve` flags for every edge.
    pub extra_edge_args: Vec<String>,
    pub model_dir: PathBuf,
}

/// The cloud tier, started once for all systems: one index over the whole corpus, or
/// shard servers behind a router.
pub struct CloudTier {
    /// Shard servers first; the process edges talk to (the index or the router) last.
    processes: Vec<ManagedProcess>,
    /// The certificate edges trust for QUIC.
    pub cert: PathBuf,
}

impl CloudTier {
    /// The process edges talk to.
    pub fn front(&self) -> Result<&ManagedProcess, EvalError> {
        self.processes
            .last()
            .ok_or_else(|| EvalError::Invalid("the cloud tier has no process".into()))
    }
}

fn serve_index(
    settings: &ClusterSettings,
    name: &str,
    bundle: &Path,
) -> Result<ManagedProcess, EvalError> {
    let cert = settings.work.join(format!("{name}-cert.pem"));
    let args = cloud_index_serve_args(bundle, "127.0.0.1:0", &cert);
    Ok(tokio::task::block_in_place(|| {
        ManagedProcess::start(
            name,
            &binary("cloud-index")?,
            args,
            &settings.work,
            START_TIMEOUT,
        )
    })?)
}

/// Starts the cloud tier `settings` describe: with `shards` > 1, one server per shard
/// bundle (`<bundle>/shards/shard-<i>`, made by `cloud-index build --shards`) and a router.
pub fn start_cloud(settings: &ClusterSettings) -> Result<CloudTier, EvalError> {
    if settings.shards <= 1 {
        let cloud = serve_index(settings, "cloud", &settings.bundle)?;
        return Ok(CloudTier {
            processes: vec![cloud],
            cert: settings.work.join("cloud-cert.pem"),
        });
    }
    let mut processes = Vec::new();
    let mut shards = Vec::new();
    for shard in 0..settings.shards {
        let dir = settings
            .bundle
            .join("shards")
            .join(format!("shard-{shard}"));
        if !dir.is_dir() {
            return Err(EvalError::Invalid(format!(
                "{} is missing: build the bundle with `cloud-index build --shards {}`",
                dir.display(),
                settings.shards
            )));
        }
        let server = serve_index(settings, &format!("shard-{shard}"), &dir)?;
        shards.push(vec![server.addr("grpc_addr")]);
        processes.push(server);
    }
    let cert = settings.work.join("router-cert.pem");
    let args = cloud_index_route_args(&shards, &cert);
    let router = tokio::task::block_in_place(|| {
        ManagedProcess::start(
            "router",
            &binary("cloud-index")?,
            args,
            &settings.work,
            START_TIMEOUT,
        )
    })?;
    processes.push(router);
    Ok(CloudTier { processes, cert })
}

/// Control-plane nodes founded as one group, for a replicated system: the smallest group
/// that survives the loss of a node.
const CONTROL_PLANE_NODES: u64 = 3;

fn parse_addr(s: &str, what: &str) -> Result<SocketAddr, EvalError> {
    s.parse()
        .map_err(|_| EvalError::Invalid(format!("{what} reported an unusable address {s:?}")))
}

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// Polls `GET /readyz` at `http` until it answers 200; the last answer on timeout.
async fn wait_until_ready(http: SocketAddr, timeout: Duration) -> Result<(), String> {
    let client = reqwest::Client::new();
    let give_up = tokio::time::Instant::now() + timeout;
    loop {
        let last = match client.get(format!("http://{http}/readyz")).send().await {
            Ok(response) if response.status().is_success() => return Ok(()),
            Ok(response) => format!(
                "HTTP {}: {}",
                response.status().as_u16(),
                response.text().await.unwrap_or_default()
            ),
            Err(error) => error.to_string_full(),
        };
        if tokio::time::Instant::now() >= give_up {
            return Err(format!("not ready after {timeout:?}; /readyz said {last}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A system's edges, running and ready: each behind its client relay, dialling the cloud
/// through its own relay; with the control plane they replicate through, if any.
pub struct SystemEdges {
    /// Each edge's process and direct HTTP address (for status reads outside the relays).
    pub edges: Vec<(ManagedProcess, SocketAddr)>,
    /// The edges' URLs through the client relays, in order.
    pub urls: Vec<String>,
    _relays: Vec<Relay>,
    _control_plane: Vec<ManagedProcess>,
}

/// What makes one system's edges: its name, `edge-node serve` flags, and whether its edges
/// share their hot cache through a fresh control plane.
pub struct EdgeSpec<'a> {
    pub name: &'a str,
    pub args: &'a [String],
    pub replicated: bool,
}

/// Starts `settings.edges` edges for system number `index` and waits until each is ready.
pub async fn start_edges(
    spec: &EdgeSpec<'_>,
    index: usize,
    cloud: &CloudTier,
    settings: &ClusterSettings,
) -> Result<SystemEdges, EvalError> {
    let cloud_addr = parse_addr(&cloud.front()?.addr("quic_addr"), "the cloud")?;
    let (control_plane_processes, control_plane) = if spec.replicated {
        tokio::task::block_in_place(|| {
            control_plane::start_group(
                &settings.work,
                &format!("control-plane-{index:02}"),
                CONTROL_PLANE_NODES,
            )
        })?
    } else {
        (Vec::new(), Vec::new())
    };
    let mut edges = Vec::new();
    let mut relays = Vec::new();
    let mut urls = Vec::new();
    for e in 0..settings.edges.max(1) {
        let seed = settings.seed ^ ((index as u64) << 16) ^ e as u64;
        let cloud_relay = Relay::udp(loopback(), cloud_addr, settings.cloud_delay, seed)
            .await
            .map_err(EvalError::Relay)?;
        let mut args = edge_serve_args(
            &settings.bundle,
            &settings.model_dir,
            &cloud_relay.local_addr.to_string(),
            &cloud.cert,
        );
        // Leave room for the emulated WAN on top of the cloud's own time; the matched
        // query's text is what CAR is judged by.
        args.extend([
            "--set".into(),
            "cloud.timeout_ms=30000".into(),
            "--set".into(),
            "retrieval.expose_matched_query_text=true".into(),
        ]);
        args.extend(spec.args.iter().cloned());
        args.extend(settings.extra_edge_args.iter().cloned());
        // Each edge follows its own control-plane node first, the others on failure.
        for n in 0..control_plane.len() {
            args.push("--control-plane".into());
            args.push(control_plane[(e + n) % control_plane.len()].clone());
        }
        if spec.replicated {
            args.push("--edge-id".into());
            args.push(format!("edge-{e}"));
        }
        let name = format!("edge-{index:02}-{}-{e}", spec.name.replace('+', "-"));
        let edge = tokio::task::block_in_place(|| {
            ManagedProcess::start(
                &name,
                &binary("edge-node")?,
                &args,
                &settings.work,
                START_TIMEOUT,
            )
        })?;
        let http = parse_addr(&edge.addr("http_addr"), &name)?;
        let client_relay = Relay::tcp(loopback(), http, settings.client_delay, seed ^ 0xC11E)
            .await
            .map_err(EvalError::Relay)?;
        urls.push(format!("http://{}", client_relay.local_addr));
        relays.push(cloud_relay);
        relays.push(client_relay);
        edges.push((edge, http));
    }
    // Load starts when every edge is ready as Kubernetes would route to it: its cloud link
    // verified. Before, the first fallbacks queued behind the QUIC handshake through the
    // emulated WAN (300-500 ms instead of ~155 ms), and that start-up cost weighed on L@DR
    // in inverse proportion to a system's fallbacks.
    for (edge, http) in &edges {
        wait_until_ready(*http, START_TIMEOUT)
            .await
            .map_err(|message| EvalError::Invalid(format!("{}: {message}", edge.name)))?;
    }
    Ok(SystemEdges {
        edges,
        urls,
        _relays: relays,
        _control_plane: control_plane_processes,
    })
}

/// Runs `workload` through one system and measures it.
#[allow(clippy::too_many_arguments)]
pub async fn run_system(
    spec: &SystemSpec,
    index: usize,
    cloud: &CloudTier,
    settings: &ClusterSettings,
    workload: &[WorkloadQuery],
    driver_settings: &DriverSettings,
    workload_index: &WorkloadIndex,
    progress: impl Fn(usize) + Send + Sync + 'static,
) -> Result<SystemReport, EvalError> {
    // Only retrieval runs read draft traces (where an accepted draft lost its gold
    // passage); answer runs leave them off.
    let mut args = spec.edge_args.clone();
    args.extend(["--set".into(), "retrieval.expose_draft_trace=true".into()]);
    let edge_spec = EdgeSpec {
        name: &spec.name,
        args: &args,
        replicated: spec.replicated,
    };
    let system = start_edges(&edge_spec, index, cloud, settings).await?;
    let edges = &system.edges;
    let outcome = retrieve::run(workload, &system.urls, driver_settings, progress).await;
    write_records(
        settings.work.join(format!("records-{index}.jsonl")),
        outcome.records.iter().map(|r| r.to_json()),
    )?;
    let (summary, first_occurrence) = summarize_all_and_first(&outcome.records, workload_index);
    let throughput = outcome.records.len() as f64 / outcome.wall.as_secs_f64().max(1e-9);
    let mut report = SystemReport::new(
        &spec.name,
        spec.params.clone(),
        summary,
        first_occurrence,
        throughput,
    );
    let status_client = reqwest::Client::new();
    let mut rss = 0u64;
    for (edge, http) in edges {
        let status = match status_client
            .get(format!("http://{http}/v1/status"))
            .send()
            .await
        {
            Ok(response) => response.json::<serde_json::Value>().await.ok(),
            Err(_) => None,
        };
        if let Some(status) = status {
            report.cached_queries += status["cached_queries"].as_u64().unwrap_or(0) as usize;
            report.cache_bytes += status["cache_bytes"].as_u64().unwrap_or(0) as usize;
            if let Some(documents) = EdgeDocuments::from_status(&status) {
                report.edge_documents = Some(report.edge_documents.unwrap_or_default() + documents);
            }
        }
        rss += edge.resident_bytes().unwrap_or(0);
    }
    report.edge_rss_bytes = (rss > 0).then_some(rss / edges.len().max(1) as u64);
    report.cache_bytes_per_1000_entries = (report.cached_queries > 0)
        .then(|| report.cache_bytes as f64 * 1000.0 / report.cached_queries as f64);
    let mut latencies: Vec<f64> = outcome
        .records
        .iter()
        .map(|r| r.latency.as_secs_f64())
        .collect();
    latencies.sort_by(f64::total_cmp);
    report.latencies_s = latencies;
    report.traced = traced_queries(&outcome.records, workload_index);
    if let Some(err) = outcome.records.iter().find_map(|r| r.result.as_ref().err()) {
        tracing::warn!(system = %report.label(), errors = report.errors, first = %err, "queries failed");
    }
    drop(system);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweeps_expand_into_one_spec_per_threshold() {
        let names: Vec<String> = [
            "cloud-only",
            "semantic-cache",
            "has",
            "has-no-fuzzy",
            "has-no-fuzzy-validation",
            "has-no-fuzzy-draft",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let ablation = AblationSettings {
            tau: 0.3,
            warm_queries: "out/warm.txt".into(),
            warm_count: 7,
        };
        let sweeps = Sweeps {
            taus: vec![0.1, 0.2],
            thetas: vec![0.9],
            corpus_fractions: vec![1.0],
            has_variants: Vec::new(),
        };
        let specs = system_specs(&names, &sweeps, &ablation).unwrap();
        let labels: Vec<(String, String)> = specs
            .iter()
            .map(|s| (s.name.clone(), s.params.to_string()))
            .collect();
        assert_eq!(labels.len(), 7);
        assert_eq!(
            labels[1],
            ("semantic-cache".into(), r#"{"theta":0.9}"#.into())
        );
        assert_eq!(labels[3], ("has".into(), r#"{"tau":0.2}"#.into()));
        assert!(
            specs[4]
                .edge_args
                .windows(2)
                .any(|w| w == ["--set", "retrieval.fuzzy_channel=false"])
        );
        let flags = |i: usize| specs[i].edge_args.join(" ");
        assert!(flags(5).contains(
            "--set retrieval.tau=0.3 --set retrieval.fuzzy_in_validation=false \
                 --warm-queries out/warm.txt"
        ));
        assert_eq!(labels[5].1, r#"{"tau":0.3,"warm_queries":7}"#);
        assert!(
            flags(6).contains("--set retrieval.fuzzy_in_draft=false")
                && !flags(6).contains("--warm-queries")
        );
        let unknown = system_specs(&["hnsw".into()], &sweeps, &ablation).unwrap_err();
        assert!(
            unknown.to_string().contains("has-no-fuzzy-draft"),
            "{unknown}"
        );
    }

    #[test]
    fn has_is_swept_over_tau_at_each_corpus_fraction() {
        let ablation = AblationSettings {
            tau: 0.2,
            warm_queries: "w.txt".into(),
            warm_count: 0,
        };
        let sweeps = Sweeps {
            taus: vec![0.3, 0.6],
            thetas: vec![],
            corpus_fractions: vec![0.01, 1.0],
            has_variants: vec![
                "rank=--set=retrieval.vote_weighting=rank --set=retrieval.draft_with_matched=true"
                    .parse()
                    .unwrap(),
            ],
        };
        let specs =
            system_specs(&["has".into(), "has-replicated".into()], &sweeps, &ablation).unwrap();
        let params: Vec<String> = specs.iter().map(|s| s.params.to_string()).collect();
        assert_eq!(
            params[..4],
            [
                r#"{"corpus_fraction":0.01,"tau":0.3}"#,
                r#"{"corpus_fraction":0.01,"tau":0.6}"#,
                r#"{"tau":0.3}"#,
                r#"{"tau":0.6}"#,
            ]
        );
        assert!(
            specs[1]
                .edge_args
                .join(" ")
                .ends_with("--set retrieval.tau=0.6 --set retrieval.corpus_fraction=0.01")
        );
        assert!(
            !specs[2]
                .edge_args
                .iter()
                .any(|arg| arg.starts_with("retrieval.corpus_fraction"))
        );
        // The variant follows `has`, swept alike, with its flags last.
        assert!(
            specs[4..8]
                .iter()
                .all(|s| s.name == "has-rank" && !s.replicated)
        );
        assert!(specs[7].edge_args.join(" ").ends_with(
            "--set retrieval.tau=0.6 --set=retrieval.vote_weighting=rank \
                     --set=retrieval.draft_with_matched=true"
        ));
        assert!(specs[8..].iter().all(|s| s.replicated) && specs.len() == 12);
        assert!("rank".parse::<HasVariant>().is_err() && "x=".parse::<HasVariant>().is_err());
        let out_of_range = Sweeps {
            corpus_fractions: vec![0.0],
            ..sweeps
        };
        assert!(system_specs(&["has".into()], &out_of_range, &ablation).is_err());
    }
}
