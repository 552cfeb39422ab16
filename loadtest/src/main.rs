//! `hasten-loadtest`: drive popularity-skewed questions through Hasten edges and evaluate.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use hasten_core::Question;
use hasten_core::bundle::CorpusBundle;
use loadtest::evaluation::{EdgeReply, QueryRecord, Summary, summarize};
use loadtest::workload::zipf_workload;

#[derive(Parser)]
#[command(
    name = "hasten-loadtest",
    version,
    about = "Workloads and evaluation for Hasten"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Send the same popularity-skewed questions to several edges, one at a time, and
    /// compare outcomes, document hit rate and latency.
    Compare(CompareArgs),
}

#[derive(Args)]
struct CompareArgs {
    /// Bundle whose questions.jsonl supplies the questions.
    #[arg(long)]
    bundle: PathBuf,
    /// A system to measure, as NAME=URL of an edge's HTTP API (repeatable, in report order).
    #[arg(long = "system", value_parser = parse_system, required = true)]
    systems: Vec<(String, String)>,
    /// Questions to send to each system.
    #[arg(long, default_value_t = 300)]
    queries: usize,
    /// Zipf exponent of entity popularity.
    #[arg(long, default_value_t = 1.1)]
    zipf: f64,
    /// Seed of the popularity ranking and the draws.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Only questions from these sources (squad, hotpotqa, synthetic); all when absent.
    #[arg(long)]
    source: Vec<String>,
    /// Documents per query.
    #[arg(long, default_value_t = 10)]
    k: usize,
    /// Per-request timeout in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    timeout_ms: u64,
    /// Also write the summaries as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn parse_system(s: &str) -> Result<(String, String), String> {
    let (name, url) = s
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=URL, got {s:?}"))?;
    if name.is_empty() || !url.starts_with("http") {
        return Err(format!("expected NAME=http://host:port, got {s:?}"));
    }
    Ok((name.to_string(), url.trim_end_matches('/').to_string()))
}

#[tokio::main]
async fn main() -> Result<()> {
    hasten_core::logging::init();
    match Cli::parse().command {
        Command::Compare(args) => compare(args).await,
    }
}

async fn run_system(
    client: &reqwest::Client,
    url: &str,
    workload: &[Question],
    k: usize,
) -> Vec<QueryRecord> {
    let mut records = Vec::with_capacity(workload.len());
    for question in workload {
        let started = Instant::now();
        let result = async {
            let response = client
                .post(format!("{url}/v1/retrieve"))
                .json(&serde_json::json!({"query": question.question, "k": k}))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            let status = response.status();
            if !status.is_success() {
                let body = response.text().await.unwrap_or_default();
                return Err(format!("HTTP {status}: {body}"));
            }
            response
                .json::<EdgeReply>()
                .await
                .map_err(|e| e.to_string())
        }
        .await;
        records.push(QueryRecord {
            question: question.clone(),
            latency: started.elapsed(),
            result,
        });
    }
    records
}

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

fn opt_pct(x: Option<f64>) -> String {
    x.map_or_else(|| "-".into(), pct)
}

fn opt_ms(x: Option<f64>) -> String {
    x.map_or_else(|| "-".into(), |s| format!("{:.1}", s * 1e3))
}

fn print_table(rows: &[(String, Summary)]) {
    println!(
        "{:<12} {:>7} {:>8} {:>8} {:>6} {:>7} {:>7} {:>7} {:>7} {:>9} {:>9} {:>9}",
        "system",
        "queries",
        "accepted",
        "fallback",
        "errors",
        "DAR",
        "CAR",
        "DHR",
        "DHR@DA",
        "mean ms",
        "L@DA ms",
        "L@DR ms"
    );
    for (name, s) in rows {
        println!(
            "{:<12} {:>7} {:>8} {:>8} {:>6} {:>7} {:>7} {:>7} {:>7} {:>9.1} {:>9} {:>9}",
            name,
            s.queries,
            s.accepted,
            s.fallback,
            s.errors,
            pct(s.dar),
            opt_pct(s.car),
            pct(s.doc_hit_rate),
            opt_pct(s.doc_hit_rate_at_da),
            s.avg_latency_s * 1e3,
            opt_ms(s.latency_at_da_s),
            opt_ms(s.latency_at_dr_s),
        );
    }
}

async fn compare(args: CompareArgs) -> Result<()> {
    let bundle = CorpusBundle::load(&args.bundle)
        .with_context(|| format!("loading {}", args.bundle.display()))?;
    let questions: Vec<Question> = bundle
        .questions
        .into_iter()
        .filter(|q| args.source.is_empty() || args.source.contains(&q.source))
        .collect();
    if questions.is_empty() {
        bail!(
            "the bundle has no questions from the sources {:?}",
            args.source
        );
    }
    let entity_of_question: HashMap<String, String> = questions
        .iter()
        .map(|q| (q.question.clone(), q.entity.clone()))
        .collect();
    let workload = zipf_workload(&questions, args.queries, args.zipf, args.seed)?;
    let entities: std::collections::HashSet<&str> =
        workload.iter().map(|q| q.entity.as_str()).collect();
    println!(
        "{} queries, Zipf({}) over the entities of {} questions ({} distinct entities drawn), k = {}",
        workload.len(),
        args.zipf,
        questions.len(),
        entities.len(),
        args.k
    );
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(args.timeout_ms))
        .build()?;
    let mut rows = Vec::new();
    for (name, url) in &args.systems {
        let records = run_system(&client, url, &workload, args.k).await;
        if let Some(err) = records.iter().find_map(|r| r.result.as_ref().err()) {
            tracing::warn!(system = %name, %err, "some queries failed");
        }
        rows.push((name.clone(), summarize(&records, &entity_of_question)));
    }
    print_table(&rows);
    if let Some(path) = &args.json {
        let json: Vec<serde_json::Value> = rows
            .iter()
            .map(|(name, s)| serde_json::json!({"name": name, "summary": s}))
            .collect();
        std::fs::write(path, serde_json::to_string_pretty(&json)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
