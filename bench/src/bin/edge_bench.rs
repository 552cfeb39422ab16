//! `hasten-edge-bench`: an edge's accept-path latency under concurrent load, real processes
//! on loopback.
//!
//! One `cloud-index serve` and one `edge-node serve` (HaS, defaults) over a bundle. The
//! edge's cache is warmed with the bundle's first questions (each a fallback, cached). Then,
//! for a fixed time, `concurrency` closed-loop clients ask those warmed questions again,
//! in random order (drafts the edge accepts), while an open-loop stream of unseen questions
//! at `fallback_rate` keeps the cloud fallback and the cache insertions busy beside them.
//! Requests go either as text (the encoder runs) or as ready vectors (the accept path
//! alone: draft, exact re-rank, validation). Reported: latency percentiles by outcome and
//! the accepted answers' throughput.
//!
//! The binaries under test come from `--bin-dir`, so the same harness measures two builds.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};
use hasten_bench::{Latencies, write_report};
use hasten_core::bundle::CorpusBundle;
use hasten_core::encoder::TextEncoder;
use hasten_eval::process::{ManagedProcess, binary, cloud_index_serve_args, edge_serve_args};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Input {
    /// Question texts: the edge encodes each.
    Text,
    /// Ready query vectors: the accept path without the encoder.
    Vector,
}

#[derive(Parser)]
#[command(
    name = "hasten-edge-bench",
    about = "An edge's accept-path latency under concurrent load"
)]
struct Cli {
    /// Corpus bundle (whole corpus; its questions are the workload).
    #[arg(long)]
    bundle: PathBuf,
    /// Directory of the `cloud-index` and `edge-node` binaries under test [default: beside
    /// this executable].
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Questions cached before measuring; the closed-loop clients ask these again.
    #[arg(long, default_value_t = 200)]
    warm: usize,
    /// Closed-loop clients asking warmed questions.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Unseen questions per second beside them (fallbacks).
    #[arg(long, default_value_t = 20.0)]
    fallback_rate: f64,
    /// Seconds measured per input kind.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Input kinds measured, in order.
    #[arg(long, value_delimiter = ',', default_value = "vector,text")]
    inputs: Vec<Input>,
    /// all-MiniLM-L6-v2 directory.
    #[arg(
        long,
        env = "HASTEN_MODEL_DIR",
        default_value = "models/all-MiniLM-L6-v2"
    )]
    model_dir: PathBuf,
    /// Working directory: logs and report.json.
    #[arg(long, default_value = "run/edge-bench")]
    work: PathBuf,
}

const START_TIMEOUT: Duration = Duration::from_secs(300);
const K: usize = 10;

/// One question as the bench sends it.
struct Query {
    text: String,
    vector: Vec<f32>,
}

impl Query {
    fn body(&self, input: Input) -> Value {
        match input {
            Input::Text => json!({"query": self.text, "k": K}),
            Input::Vector => json!({"vector": self.vector, "k": K}),
        }
    }
}

#[derive(Default)]
struct Outcomes {
    accepted: Latencies,
    fallback: Latencies,
    errors: u64,
}

impl Outcomes {
    fn record(&mut self, outcome: Option<&str>, latency: Duration) {
        match outcome {
            Some("accepted") => self.accepted.record(latency),
            Some("fallback") => self.fallback.record(latency),
            _ => self.errors += 1,
        }
    }
}

/// Sends `body` and returns the reply's outcome (`None` on any failure).
async fn ask(http: &reqwest::Client, edge: &str, body: &Value) -> Option<String> {
    let response = http
        .post(format!("http://{edge}/v1/retrieve"))
        .json(body)
        .send()
        .await
        .ok()?;
    if !response.status().is_success() {
        return None;
    }
    let reply: Value = response.json().await.ok()?;
    reply["outcome"].as_str().map(str::to_string)
}

fn bin(dir: Option<&Path>, name: &str) -> Result<PathBuf> {
    match dir {
        Some(dir) => {
            let path = dir.join(name);
            if !path.exists() {
                bail!("{} does not exist", path.display());
            }
            Ok(path)
        }
        None => Ok(binary(name)?),
    }
}

/// One measured interval with `input`: closed-loop clients on warmed questions and an
/// open-loop stream of unseen ones.
async fn measure(
    cli: &Cli,
    edge: &str,
    warmed: Arc<Vec<Query>>,
    unseen: &mut std::vec::IntoIter<Query>,
    input: Input,
) -> Value {
    let http = reqwest::Client::new();
    let outcomes = Arc::new(Mutex::new(Outcomes::default()));
    let until = Instant::now() + Duration::from_secs(cli.seconds);
    let mut clients = Vec::new();
    for client in 0..cli.concurrency {
        let (http, edge, warmed, outcomes) = (
            http.clone(),
            edge.to_string(),
            Arc::clone(&warmed),
            Arc::clone(&outcomes),
        );
        clients.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(client as u64);
            while Instant::now() < until {
                let query = &warmed[rng.random_range(0..warmed.len())];
                let sent = Instant::now();
                let outcome = ask(&http, &edge, &query.body(input)).await;
                outcomes.lock().record(outcome.as_deref(), sent.elapsed());
            }
        }));
    }
    let mut fallbacks = Vec::new();
    if cli.fallback_rate > 0.0 {
        let period = Duration::from_secs_f64(1.0 / cli.fallback_rate);
        let mut next = Instant::now();
        while next < until {
            tokio::time::sleep_until(next).await;
            let Some(query) = unseen.next() else { break };
            let (http, edge, outcomes) = (http.clone(), edge.to_string(), Arc::clone(&outcomes));
            fallbacks.push(tokio::spawn(async move {
                let sent = Instant::now();
                let outcome = ask(&http, &edge, &query.body(input)).await;
                outcomes.lock().record(outcome.as_deref(), sent.elapsed());
            }));
            next += period;
        }
    }
    for task in clients.into_iter().chain(fallbacks) {
        let _ = task.await;
    }
    let outcomes = outcomes.lock();
    let side = |l: &Latencies| {
        json!({
            "n": l.len(),
            "p50_ms": l.quantile_ms(0.5),
            "p99_ms": l.quantile_ms(0.99),
            "max_ms": l.quantile_ms(1.0),
        })
    };
    json!({
        "input": format!("{input:?}").to_lowercase(),
        "concurrency": cli.concurrency,
        "fallback_rate": cli.fallback_rate,
        "seconds": cli.seconds,
        "accepted": side(&outcomes.accepted),
        "accepted_per_s": outcomes.accepted.len() as f64 / cli.seconds as f64,
        "fallback": side(&outcomes.fallback),
        "errors": outcomes.errors,
    })
}

#[tokio::main]
async fn main() -> Result<()> {
    hasten_core::logging::init(hasten_core::logging::LogFormat::Text);
    let cli = Cli::parse();
    std::fs::create_dir_all(&cli.work)?;
    let bundle = CorpusBundle::load(&cli.bundle)
        .with_context(|| format!("loading {}", cli.bundle.display()))?;
    let encoder = TextEncoder::load(&cli.model_dir)
        .with_context(|| format!("loading the encoder from {}", cli.model_dir.display()))?;
    let mut seen = std::collections::HashSet::new();
    let texts: Vec<String> = bundle
        .questions
        .iter()
        .map(|q| q.question.clone())
        .filter(|q| seen.insert(q.clone()))
        .collect();
    let unseen_needed =
        (cli.fallback_rate * (cli.seconds * cli.inputs.len() as u64) as f64).ceil() as usize + 1;
    if texts.len() < cli.warm + unseen_needed {
        bail!(
            "the bundle has {} distinct questions; the run needs {} warmed + {unseen_needed} unseen",
            texts.len(),
            cli.warm
        );
    }
    let texts = &texts[..cli.warm + unseen_needed];
    tracing::info!(questions = texts.len(), "encoding the workload");
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let vectors = encoder.encode(&refs)?;
    let mut queries: Vec<Query> = texts
        .iter()
        .zip(vectors)
        .map(|(text, vector)| Query {
            text: text.clone(),
            vector,
        })
        .collect();
    let unseen: Vec<Query> = queries.split_off(cli.warm);
    let mut unseen = unseen.into_iter();

    let cert = cli.work.join("cloud.pem");
    let bins = cli.bin_dir.as_deref();
    let _cloud_guard;
    let cloud = {
        let process = ManagedProcess::start(
            "cloud",
            &bin(bins, "cloud-index")?,
            cloud_index_serve_args(&cli.bundle, "127.0.0.1:0", &cert),
            &cli.work,
            START_TIMEOUT,
        )?;
        let addr = process.addr("quic_addr");
        _cloud_guard = process;
        addr
    };
    let edge = ManagedProcess::start(
        "edge",
        &bin(bins, "edge-node")?,
        edge_serve_args(&cli.bundle, &cli.model_dir, &cloud, &cert),
        &cli.work,
        START_TIMEOUT,
    )?;
    let edge_addr = edge.addr("http_addr");
    let http = reqwest::Client::new();
    let mut warm_outcomes = Outcomes::default();
    for query in &queries {
        let sent = Instant::now();
        let outcome = ask(&http, &edge_addr, &query.body(Input::Vector)).await;
        warm_outcomes.record(outcome.as_deref(), sent.elapsed());
    }
    if warm_outcomes.errors > 0 {
        bail!(
            "{} warm-up requests failed; see {}",
            warm_outcomes.errors,
            edge.log.display()
        );
    }
    let warmed = Arc::new(queries);
    let mut runs = Vec::new();
    for input in &cli.inputs {
        let run = measure(&cli, &edge_addr, Arc::clone(&warmed), &mut unseen, *input).await;
        tracing::info!(%run, "measured");
        runs.push(run);
    }
    let report = json!({
        "bundle": cli.bundle.display().to_string(),
        "documents": bundle.len(),
        "bin_dir": bins.map(|d| d.display().to_string()),
        "warmed": warmed.len(),
        "warm_up": {
            "accepted": warm_outcomes.accepted.len(),
            "fallback": warm_outcomes.fallback.len(),
        },
        "runs": runs,
        "cores": hasten_core::threads::available_cores(),
    });
    write_report(&cli.work, &report)
}
