//! The `answers` command (the binary's, not the library's): flags, the KV store made ready,
//! then `hasten_loadtest::answer::evaluate` and the report.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use hasten_core::bundle::read_manifest;
use hasten_eval::process::binary;
use hasten_loadtest::answer::evaluate::{AskSettings, WorkerSettings, evaluate};
use hasten_loadtest::answer::report::AnswerReport;
use hasten_loadtest::answer::systems::{ANSWER_SYSTEMS, AnswerSystem, FUSION_RATIO};
use hasten_loadtest::driver::{DriverSettings, LoadModel};
use hasten_loadtest::experiment::{ClusterSettings, start_cloud};

use super::{
    CorpusArgs, NetworkArgs, RunMode, WorkloadArgs, absolute, corpus, make_workload, progress_bar,
};

/// Questions an answer run asks when `--queries` is not given: 200 paired questions are
/// what a quality difference of a point needs to be told from noise.
const DEFAULT_ANSWER_QUERIES: usize = 200;

#[derive(Args)]
pub struct AnswersArgs {
    #[command(flatten)]
    corpus: CorpusArgs,
    #[command(flatten)]
    workload: WorkloadArgs,
    /// Systems to compare, in report order (standard is the baseline quality is paired
    /// against).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "standard,has+full-prefill,cloud+fusionrag,hasten"
    )]
    systems: Vec<String>,
    /// Offered loads to sweep (open loop, questions/s); each system's goodput knee is its
    /// best over them. Required in realtime mode.
    #[arg(long, value_delimiter = ',')]
    rates: Vec<f64>,
    /// An answer counts toward goodput when its first text arrives within this (e.g. 2s).
    #[arg(long, default_value = "2s", value_parser = hasten_loadtest::remote::parse_duration)]
    ttft_slo: Duration,
    /// The answering model (GGUF), the same for every system: the KV workers' model.
    #[arg(long, env = "HASTEN_ANSWER_MODEL_PATH")]
    lm_model: PathBuf,
    /// Where the chunk KV of the bundle is preprocessed once (resumed and reused by later
    /// runs, like the bundle).
    #[arg(long, default_value = "run/answer-eval/kv-store")]
    kv_store: PathBuf,
    /// Neighbours each chunk's similarity-guided KV attends to when the store is prepared
    /// (FusionRAG's n).
    #[arg(long, default_value_t = 10)]
    kv_top_n: usize,
    /// KV workers per system.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Each KV worker's RAM for chunk KV, MiB [default: the worker's, 1 GiB].
    #[arg(long)]
    worker_ram_mib: Option<u64>,
    /// Share of chunk tokens FusionRAG recomputes (cloud+fusionrag, hasten): sweep it to
    /// find where a model keeps its answers.
    #[arg(long, default_value_t = FUSION_RATIO)]
    fusion_ratio: f64,
    /// Whether the workers read a prompt's first chunk from its Full Reuse KV and recompute
    /// only the other chunks (the kv-worker's `exact_leading_chunk`) [default: the worker's].
    #[arg(long)]
    exact_leading_chunk: Option<bool>,
    /// Chunks after the first that the workers recompute whole on top of FusionRAG's budget,
    /// so that their KV is a full prefill's (the kv-worker's `recompute_whole_chunks`)
    /// [default: the worker's].
    #[arg(long)]
    recompute_whole_chunks: Option<usize>,
    /// Edges per system; client i talks to edge i mod N.
    #[arg(long, default_value_t = 2)]
    edges: usize,
    /// Documents per question.
    #[arg(long, default_value_t = 5)]
    k: usize,
    /// Longest answer, tokens.
    #[arg(long, default_value_t = 32)]
    max_tokens: usize,
    /// realtime: the emulated network and open-loop load at each --rates. replay: no
    /// emulated delays, a closed loop of --concurrency clients, for quality at full speed.
    #[arg(long, value_enum, default_value_t = RunMode::Realtime)]
    mode: RunMode,
    /// Replay mode's concurrent clients.
    #[arg(long, default_value_t = 2)]
    concurrency: usize,
    #[command(flatten)]
    network: NetworkArgs,
    /// Extra flag for every edge, e.g. `--edge-arg=--set=retrieval.tau=0.3` (repeatable).
    #[arg(long, allow_hyphen_values = true)]
    edge_arg: Vec<String>,
    /// Extra flag for every KV worker, e.g.
    /// `--worker-arg=--set=selection_attention=all-layers` (repeatable).
    #[arg(long, allow_hyphen_values = true)]
    worker_arg: Vec<String>,
    /// Leading questions that warm caches but are left out of the figures.
    #[arg(long, default_value_t = 0)]
    warmup: usize,
    /// Per-request timeout in milliseconds.
    #[arg(long, default_value_t = 120_000)]
    timeout_ms: u64,
    /// Output folder for report.json, report.md, plots and logs.
    #[arg(long, default_value = "run/answer-eval/report")]
    out: PathBuf,
}

/// Preprocesses the bundle's chunk KV into the store (`kv-worker preprocess` skips what the
/// store holds, so a finished store costs a second).
fn prepare_store(
    bundle: &std::path::Path,
    model: &std::path::Path,
    store: &std::path::Path,
    top_n: usize,
) -> Result<()> {
    eprintln!(
        "preparing the chunk KV of {} in {} (once per bundle and model)",
        bundle.display(),
        store.display()
    );
    let status = std::process::Command::new(binary("kv-worker")?)
        .arg("preprocess")
        .arg("--bundle")
        .arg(bundle)
        .arg("--model")
        .arg(model)
        .arg("--store")
        .arg(store)
        .arg("--top-n")
        .arg(top_n.to_string())
        // It runs before any system starts, alone on the machine: every core, whatever
        // share the answering processes are given.
        .env_remove("RAYON_NUM_THREADS")
        .stdout(std::io::stderr())
        .status()
        .context("running kv-worker preprocess")?;
    if !status.success() {
        bail!("kv-worker preprocess failed ({status})");
    }
    Ok(())
}

pub async fn run(mut args: AnswersArgs) -> Result<()> {
    let systems = AnswerSystem::parse_list(&args.systems)?;
    if systems.is_empty() {
        let known: Vec<&str> = ANSWER_SYSTEMS.iter().map(|s| s.name).collect();
        bail!("--systems: name at least one of {}", known.join(", "));
    }
    let loads: Vec<LoadModel> = match args.mode {
        RunMode::Realtime => {
            if args.rates.is_empty() {
                bail!("--rates: give the offered loads to sweep, e.g. --rates 0.5,1,2");
            }
            if let Some(bad) = args.rates.iter().find(|r| !(**r > 0.0 && r.is_finite())) {
                bail!("--rates: {bad} is not a positive rate");
            }
            args.rates
                .iter()
                .map(|&rate_qps| LoadModel::Open {
                    rate_qps,
                    seed: args.workload.seed,
                })
                .collect()
        }
        RunMode::Replay => vec![LoadModel::Closed {
            clients: args.concurrency.max(1),
        }],
    };
    if !args.lm_model.is_file() {
        bail!("--lm-model: no model file at {}", args.lm_model.display());
    }
    args.workload.queries = Some(args.workload.queries.unwrap_or(DEFAULT_ANSWER_QUERIES));
    let (bundle, questions) = corpus(&args.corpus)?;
    let (workload, mut workload_report) = make_workload(&args.workload, &questions)?;
    if workload.iter().all(|q| q.answers.is_empty()) {
        bail!("the workload's questions carry no gold answers to score against");
    }
    let bundle = absolute(&bundle)?;
    let model = absolute(&args.lm_model)?;
    let store = absolute(&args.kv_store)?;
    prepare_store(&bundle, &model, &store, args.kv_top_n)?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let work = absolute(&args.out.join("logs"))?;
    std::fs::create_dir_all(&work)?;
    let (client_delay, cloud_delay) = args.network.delays(args.mode);
    let cluster = ClusterSettings {
        bundle: bundle.clone(),
        shards: 1,
        work,
        edges: args.edges,
        client_delay,
        cloud_delay,
        seed: args.workload.seed,
        extra_edge_args: args.edge_arg.clone(),
        model_dir: absolute(&args.corpus.model_dir)?,
    };
    if !(0.0..=1.0).contains(&args.fusion_ratio) {
        bail!(
            "--fusion-ratio must be in [0, 1], got {}",
            args.fusion_ratio
        );
    }
    let workers = WorkerSettings {
        count: args.workers,
        model: model.clone(),
        store,
        ram_budget: args.worker_ram_mib.map(|mib| mib << 20),
        fusion_ratio: args.fusion_ratio,
        exact_leading_chunk: args.exact_leading_chunk,
        recompute_whole_chunks: args.recompute_whole_chunks,
        extra_args: args.worker_arg.clone(),
    };
    let ask = AskSettings {
        k: args.k,
        max_tokens: args.max_tokens,
        ttft_slo: args.ttft_slo,
    };
    let driver_settings = DriverSettings {
        load: loads[0],
        k: args.k,
        warmup: args.warmup,
        max_duration: None,
        request_timeout: Duration::from_millis(args.timeout_ms),
        cycle: false,
        client: None,
    };
    let corpus_version = read_manifest(&bundle)
        .with_context(|| format!("reading the manifest of {}", bundle.display()))?
        .corpus_version;
    if let Some(obj) = workload_report.as_object_mut() {
        obj.insert("bundle".into(), serde_json::json!(bundle));
        obj.insert("corpus_version".into(), serde_json::json!(corpus_version));
        obj.insert("network".into(), serde_json::json!({"mode": args.mode, "client_one_way": client_delay, "cloud_one_way": cloud_delay}));
        obj.insert(
            "answering".into(),
            serde_json::json!({
                "model": model, "k": args.k, "max_tokens": args.max_tokens,
                "ttft_slo_s": args.ttft_slo.as_secs_f64(), "edges_per_system": args.edges,
                "kv_workers_per_system": args.workers, "warmup": args.warmup,
                "fusion_ratio": args.fusion_ratio,
                "exact_leading_chunk": args.exact_leading_chunk.map_or_else(
                    || serde_json::json!("worker default"),
                    |exact| serde_json::json!(exact),
                ),
                "recompute_whole_chunks": args.recompute_whole_chunks.map_or_else(
                    || serde_json::json!("worker default"),
                    |chunks| serde_json::json!(chunks),
                ),
                "edge_args": args.edge_arg, "worker_args": args.worker_arg,
            }),
        );
    }
    eprintln!("workload: {}", serde_json::to_string(&workload_report)?);
    let cloud = start_cloud(&cluster)?;
    let total = workload.len();
    let runs = evaluate(
        &systems,
        &loads,
        &cloud,
        &cluster,
        &workers,
        &ask,
        &workload,
        &driver_settings,
        |label| {
            let bar = progress_bar(total, label);
            move |done| bar.set_position(done as u64)
        },
    )
    .await?;
    drop(cloud);
    let report = AnswerReport::new(workload_report, runs);
    report
        .write(&args.out)
        .map_err(|e| anyhow::anyhow!("writing the report: {e}"))?;
    println!("{}", report.markdown());
    println!("report written to {}", args.out.display());
    Ok(())
}
