//! `hasten-loadtest`: TopViews-shaped workloads and the HaS evaluation.

mod answers;
mod deployment;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use hasten_core::Question;
use hasten_core::bundle::CorpusBundle;
use hasten_core::corpus::CorpusFiles;
use hasten_core::encoder::DEFAULT_MODEL_DIR;
use hasten_eval::process::binary;
use hasten_loadtest::driver::{DriverSettings, LoadModel};
use hasten_loadtest::experiment::{
    AblationSettings, ClusterSettings, HasVariant, Sweeps, run_system, start_cloud, system_specs,
};
use hasten_loadtest::popularity::{DailyPopularity, ZipfModel, read_topviews, views_then_model};
use hasten_loadtest::relay::DelayModel;
use hasten_loadtest::report::Report;
use hasten_loadtest::scoring::WorkloadIndex;
use hasten_loadtest::workload::{self, WorkloadQuery};
use hasten_proto::tls::DevAuthority;
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Parser)]
#[command(
    name = "hasten-loadtest",
    version,
    about = "TopViews-shaped workloads and the HaS evaluation"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run every system on the same workload behind the emulated network and write
    /// report.json, report.md and plots.
    Eval(Box<EvalArgs>),
    /// Generate a workload, print how homologous it is, and save it as JSON lines.
    Workload(Box<WorkloadCommand>),
    /// Make a throwaway CA and a certificate for each component, for mutual TLS in local
    /// runs (production certificates come from files or Kubernetes Secrets).
    DevCerts(DevCertsArgs),
    /// Load a running deployment's edges with a saved workload (open loop at --rate, or
    /// closed loop with --concurrency) for --duration; print p50 to p99.99 and the maximum,
    /// write summary.json, latency.hgrm, timeseries.csv and percentiles.svg, and exit 99
    /// when a --threshold fails.
    Run(Box<deployment::RunArgs>),
    /// Answer the workload's questions through each answer system (standard,
    /// has+full-prefill, cloud+fusionrag, hasten: edges on KV workers behind the emulated
    /// network) as streamed chat completions, at each --rates; write report.json, report.md
    /// and plots (TTFT, goodput, quality against gold, where the time went).
    Answers(Box<answers::AnswersArgs>),
    /// Compare two runs' answers to the same workload question by question
    /// (`logs/answers-N.jsonl` of `answers`): each run's F1, the paired F1 difference with
    /// its 95% bootstrap interval, and how many answers differ.
    CompareAnswers(CompareAnswersArgs),
}

#[derive(Args)]
struct CompareAnswersArgs {
    /// The baseline run's answers log.
    base: PathBuf,
    /// The other run's answers log (its difference from the baseline is reported).
    other: PathBuf,
    /// Seed of the bootstrap's resampling.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn compare_answers(args: &CompareAnswersArgs) -> Result<()> {
    use hasten_loadtest::answer::compare::{compare, read_answers};
    let base = read_answers(&args.base)?;
    let other = read_answers(&args.other)?;
    let Some(c) = compare(&base, &other, args.seed) else {
        bail!("the two logs share no question answered without error");
    };
    println!(
        "pairs {}: F1 {:.3} (base) against {:.3}; difference {:+.3} (95% {:+.3}..{:+.3}); \
         {} answers differ",
        c.f1.pairs, c.base_f1, c.other_f1, c.f1.mean, c.f1.low, c.f1.high, c.differing
    );
    Ok(())
}

#[derive(Args)]
struct DevCertsArgs {
    /// Directory for ca.crt and each component's <component>.crt and <component>.key.
    #[arg(long, default_value = "run/tls")]
    out: PathBuf,
    /// DNS names and IP addresses the certificates are valid for (repeatable).
    #[arg(long = "name", default_values = ["localhost", "127.0.0.1"])]
    names: Vec<String>,
    /// Components to issue a certificate for (repeatable).
    #[arg(long = "component", default_values = ["cloud", "edge", "control-plane"])]
    components: Vec<String>,
}

fn dev_certs(args: &DevCertsArgs) -> Result<()> {
    let authority = DevAuthority::new("Hasten dev CA")?;
    let components: Vec<&str> = args.components.iter().map(String::as_str).collect();
    let written = authority
        .write_bundle(&args.out, &components, &args.names)
        .with_context(|| format!("writing certificates under {}", args.out.display()))?;
    for (component, paths) in args.components.iter().zip(&written) {
        println!(
            "{component}: --tls-ca {} --tls-cert {} --tls-key {}",
            paths.ca.display(),
            paths.cert.display(),
            paths.key.display()
        );
    }
    Ok(())
}

#[derive(Args)]
struct CorpusArgs {
    /// Corpus bundle to use as is (made by `cloud-index build`).
    #[arg(long, conflicts_with_all = ["squad", "hotpot", "wiki18", "wiki_articles", "entity_questions"])]
    bundle: Option<PathBuf>,
    #[command(flatten)]
    files: CorpusFiles,
    /// Where to build the bundle from the files above (vectors are reused between runs).
    #[arg(long, default_value = "run/eval/bundle")]
    bundle_out: PathBuf,
    /// Questions from these sources only (squad, hotpotqa, entityquestions, synthetic)
    /// [default: squad when there are SQuAD questions, else entityquestions when there are
    /// some, else all].
    #[arg(long)]
    question_source: Vec<String>,
    /// all-MiniLM-L6-v2 directory.
    #[arg(long, env = "HASTEN_MODEL_DIR", default_value = DEFAULT_MODEL_DIR)]
    model_dir: PathBuf,
}

#[derive(Args)]
struct WorkloadArgs {
    /// Replay this workload (JSON lines) instead of generating one.
    #[arg(long)]
    workload: Option<PathBuf>,
    /// Entity popularity from a TopViews-style CSV (date,article,views) for the entities it
    /// lists, continued by the built-in model below its last listed rank for the rest
    /// (loadtest/README.md); the workload then spans the CSV's days.
    #[arg(long)]
    topviews: Option<PathBuf>,
    /// Queries to generate [default: 5000; `answers`: 200].
    #[arg(long)]
    queries: Option<usize>,
    /// Zipf exponent of the built-in popularity model.
    #[arg(long, default_value_t = ZipfModel::default().exponent)]
    zipf_s: f64,
    /// Days the built-in model spans.
    #[arg(long, default_value_t = ZipfModel::default().days)]
    days: usize,
    /// Standard deviation of the daily log-normal re-ranking jitter.
    #[arg(long, default_value_t = ZipfModel::default().daily_jitter)]
    daily_jitter: f64,
    /// Chance per day that an entity from outside the top ten trends to rank one.
    #[arg(long, default_value_t = ZipfModel::default().burst_probability)]
    burst_probability: f64,
    /// Seed of the popularity model and the draws.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Also save the workload (JSON lines) here.
    #[arg(long)]
    save_workload: Option<PathBuf>,
}

#[derive(Args)]
struct WorkloadCommand {
    #[command(flatten)]
    corpus: CorpusArgs,
    #[command(flatten)]
    workload: WorkloadArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
enum RunMode {
    Realtime,
    Replay,
}

/// The emulated network the relays put between clients, edges and the cloud.
#[derive(Args)]
struct NetworkArgs {
    /// One-way client-edge delay per packet: none, SECONDS or uniform:MIN,MAX (the paper's
    /// edge latency 0.01-0.05 s is a round trip).
    #[arg(long, default_value = "uniform:0.005,0.025", value_parser = DelayModel::parse)]
    client_delay: DelayModel,
    /// One-way edge-cloud delay per packet (the paper's cloud latency 0.1-0.2 s round trip).
    #[arg(long, default_value = "uniform:0.05,0.1", value_parser = DelayModel::parse)]
    cloud_delay: DelayModel,
}

impl NetworkArgs {
    /// The (client-edge, edge-cloud) delays a run in `mode` pays: none in replay.
    fn delays(&self, mode: RunMode) -> (DelayModel, DelayModel) {
        match mode {
            RunMode::Realtime => (self.client_delay, self.cloud_delay),
            RunMode::Replay => (DelayModel::None, DelayModel::None),
        }
    }
}

#[derive(Args)]
struct EvalArgs {
    #[command(flatten)]
    corpus: CorpusArgs,
    #[command(flatten)]
    workload: WorkloadArgs,
    /// Systems to compare, in report order (has-replicated: the edges share their hot cache
    /// through a fresh 3-node control plane; has-no-fuzzy, has-no-fuzzy-validation,
    /// has-no-fuzzy-draft: the paper's ablations, at --no-fuzzy-tau).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "cloud-only,edge-ivf,exact-cache,semantic-cache,has,has-no-fuzzy,has-no-fuzzy-validation,has-no-fuzzy-draft"
    )]
    systems: Vec<String>,
    /// HaS homology thresholds to sweep.
    #[arg(long, value_delimiter = ',', default_value = "0.1,0.2,0.3,0.4,0.5,0.6")]
    taus: Vec<f64>,
    /// Semantic-cache cosine thresholds to sweep.
    #[arg(long, value_delimiter = ',', default_value = "0.8,0.85,0.9,0.95")]
    thetas: Vec<f64>,
    /// Shares of the corpus HaS's edges hold (their `corpus_fraction`), each swept over
    /// --taus: the paper's experiment is 0.01,0.1,0.5,1.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    corpus_fractions: Vec<f64>,
    /// HaS with other rules, as NAME=FLAGS (edge flags separated by spaces), reported as
    /// has-NAME and swept over --taus wherever `has` is listed, e.g.
    /// `--has-variant 'rank=--set=retrieval.vote_weighting=rank'` (repeatable).
    #[arg(long)]
    has_variant: Vec<HasVariant>,
    /// tau of the fuzzy-channel ablations.
    #[arg(long, default_value_t = 0.2)]
    no_fuzzy_tau: f64,
    /// Random questions (from the bundle's, none the workload asks) that pre-fill the cache
    /// of has-no-fuzzy-validation, as the paper did for that ablation.
    #[arg(long, default_value_t = 1000)]
    random_prefill: usize,
    /// realtime: the emulated network and the load model (--rate or --concurrency), for
    /// latency. replay: no emulated delays, a closed loop of --concurrency clients at full
    /// speed, for quality figures (run both from one --workload file).
    #[arg(long, value_enum, default_value_t = RunMode::Realtime)]
    mode: RunMode,
    /// Extra flag for every edge, e.g. `--edge-arg=--set=retrieval.corpus_fraction=0.1`
    /// (repeatable).
    #[arg(long, allow_hyphen_values = true)]
    edge_arg: Vec<String>,
    /// Edges per system; client i talks to edge i mod N.
    #[arg(long, default_value_t = 1)]
    edges: usize,
    /// Serve the corpus from this many shard servers behind a router (the bundle must hold
    /// the shard bundles: `cloud-index build --shards N`); 1 is one index.
    #[arg(long, default_value_t = 1)]
    shards: usize,
    #[command(flatten)]
    network: NetworkArgs,
    /// Closed loop: this many concurrent clients (ignored with --rate).
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Open loop: Poisson arrivals at this many queries per second.
    #[arg(long)]
    rate: Option<f64>,
    /// Leading queries that warm the caches but are left out of the figures.
    #[arg(long, default_value_t = 0)]
    warmup: usize,
    /// Stop each system's run after this many seconds.
    #[arg(long)]
    duration_s: Option<f64>,
    /// Per-request timeout in milliseconds.
    #[arg(long, default_value_t = 60_000)]
    timeout_ms: u64,
    /// Documents per query.
    #[arg(long, default_value_t = 10)]
    k: usize,
    /// Output folder for report.json, report.md, plots, logs.
    #[arg(long, default_value = "run/eval/report")]
    out: PathBuf,
}

#[tokio::main]
async fn main() -> Result<()> {
    hasten_core::logging::init(hasten_core::logging::LogFormat::Text);
    match Cli::parse().command {
        Command::Eval(args) => eval(*args).await,
        Command::DevCerts(args) => dev_certs(&args),
        Command::Run(args) => deployment::run(*args).await,
        Command::Answers(args) => answers::run(*args).await,
        Command::CompareAnswers(args) => compare_answers(&args),
        Command::Workload(args) => {
            let (_, questions) = corpus(&args.corpus)?;
            let (workload, stats) = make_workload(&args.workload, &questions)?;
            println!("{}", serde_json::to_string_pretty(&stats)?);
            if args.workload.save_workload.is_none() {
                println!(
                    "{} queries (use --save-workload to keep them)",
                    workload.len()
                );
            }
            Ok(())
        }
    }
}

/// The bundle (given, or built from the corpus files) and the questions to draw from.
fn corpus(args: &CorpusArgs) -> Result<(PathBuf, Vec<Question>)> {
    let bundle_dir = match &args.bundle {
        Some(dir) => dir.clone(),
        None => {
            if args.files.squad.is_empty() && args.files.entity_questions.is_empty() {
                bail!(
                    "give --bundle, or questions to build one from: --squad, or \
                     --entity-questions with --wiki-articles (optionally --hotpot, --wiki18)"
                );
            }
            // One way to build a bundle: the cloud tier's own `build` command.
            let mut build = std::process::Command::new(binary("cloud-index")?);
            build
                .arg("build")
                .arg("--out")
                .arg(&args.bundle_out)
                .arg("--model-dir")
                .arg(&args.model_dir)
                .stdout(std::io::stderr());
            build.args(args.files.to_flags());
            let status = build.status().context("running cloud-index build")?;
            if !status.success() {
                bail!("cloud-index build failed ({status})");
            }
            args.bundle_out.clone()
        }
    };
    let bundle = CorpusBundle::load(&bundle_dir)
        .with_context(|| format!("loading {}", bundle_dir.display()))?;
    let sources: Vec<String> = if args.question_source.is_empty() {
        ["squad", "entityquestions"]
            .into_iter()
            .find(|source| bundle.questions.iter().any(|q| q.source == *source))
            .map(|source| vec![source.to_string()])
            .unwrap_or_default()
    } else {
        args.question_source.clone()
    };
    let questions: Vec<Question> = bundle
        .questions
        .into_iter()
        .filter(|q| sources.is_empty() || sources.contains(&q.source))
        .collect();
    if questions.is_empty() {
        bail!("the bundle has no questions from the sources {sources:?}");
    }
    Ok((bundle_dir, questions))
}

/// Queries a workload has when `--queries` is not given (the HaS paper's cache size).
const DEFAULT_QUERIES: usize = 5000;

fn make_workload(
    args: &WorkloadArgs,
    questions: &[Question],
) -> Result<(Vec<WorkloadQuery>, serde_json::Value)> {
    let (queries, popularity_description) = if let Some(path) = &args.workload {
        let replayed = workload::read_jsonl(path)?;
        (replayed, serde_json::json!({"replayed": path}))
    } else {
        let (questions, ambiguous) = workload::drop_ambiguous_subjects(questions.to_vec());
        if questions.is_empty() {
            bail!("every subject was dropped as ambiguous; no questions left");
        }
        let names = workload::entities(&questions);
        let model = ZipfModel {
            exponent: args.zipf_s,
            days: args.days,
            daily_jitter: args.daily_jitter,
            burst_probability: args.burst_probability,
            seed: args.seed,
        };
        let (popularity, description): (DailyPopularity, serde_json::Value) = match &args.topviews {
            Some(csv) => {
                let views = read_topviews(csv, &names)?;
                let listed: std::collections::HashSet<usize> = views
                    .iter()
                    .flat_map(|day| day.matched.iter().map(|(e, _)| *e))
                    .collect();
                let model = ZipfModel {
                    days: views.len(),
                    ..model
                };
                (
                    views_then_model(&views, &model, names.len())?,
                    serde_json::json!({
                        "topviews_csv": csv,
                        "then_zipf": model,
                        "entities": names.len(),
                        "entities_in_page_views": listed.len(),
                        "ambiguous_subjects_dropped": ambiguous,
                    }),
                )
            }
            None => (
                model.daily(names.len())?,
                serde_json::json!({"zipf": model, "entities": names.len(), "ambiguous_subjects_dropped": ambiguous}),
            ),
        };
        let generated = workload::generate(
            &questions,
            &names,
            &popularity,
            args.queries.unwrap_or(DEFAULT_QUERIES),
            args.seed,
        )?;
        (generated, description)
    };
    if let Some(path) = &args.save_workload {
        workload::write_jsonl(path, &queries)?;
    }
    let stats = workload::stats(&queries);
    Ok((
        queries,
        serde_json::json!({"popularity": popularity_description, "stats": stats, "seed": args.seed}),
    ))
}

fn progress_bar(len: usize, label: &str) -> ProgressBar {
    let bar = ProgressBar::new(len as u64);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>28} [{bar:30}] {pos}/{len} {per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_prefix(label.to_string());
    bar
}

async fn eval(args: EvalArgs) -> Result<()> {
    let (bundle, questions) = corpus(&args.corpus)?;
    let (workload, mut workload_report) = make_workload(&args.workload, &questions)?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let warm_queries = absolute(&args.out.join("random-prefill.txt"))?;
    // Only the ablation that starts from a pre-filled cache needs the random questions.
    let prefilled = args.systems.iter().any(|s| s == "has-no-fuzzy-validation");
    let prefill = if prefilled {
        workload::random_questions(
            &questions,
            &workload,
            args.random_prefill,
            args.workload.seed,
        )
    } else {
        Vec::new()
    };
    if prefilled {
        let prefill_texts: Vec<&str> = prefill.iter().map(|q| q.question.trim()).collect();
        std::fs::write(&warm_queries, prefill_texts.join("\n"))
            .with_context(|| format!("writing {}", warm_queries.display()))?;
    }
    let ablation = AblationSettings {
        tau: args.no_fuzzy_tau,
        warm_queries,
        warm_count: prefill.len(),
    };
    let sweeps = Sweeps {
        taus: args.taus.clone(),
        thetas: args.thetas.clone(),
        corpus_fractions: args.corpus_fractions.clone(),
        has_variants: args.has_variant.clone(),
    };
    let specs = system_specs(&args.systems, &sweeps, &ablation)?;
    let work = args.out.join("logs");
    std::fs::create_dir_all(&work)?;
    let (client_delay, cloud_delay) = args.network.delays(args.mode);
    let settings = ClusterSettings {
        bundle: absolute(&bundle)?,
        shards: args.shards,
        work: absolute(&work)?,
        edges: args.edges,
        client_delay,
        cloud_delay,
        seed: args.workload.seed,
        extra_edge_args: args.edge_arg.clone(),
        model_dir: absolute(&args.corpus.model_dir)?,
    };
    let load = match args.rate.filter(|_| args.mode == RunMode::Realtime) {
        Some(rate_qps) => LoadModel::Open {
            rate_qps,
            seed: args.workload.seed,
        },
        None => LoadModel::Closed {
            clients: args.concurrency,
        },
    };
    let driver_settings = DriverSettings {
        load,
        k: args.k,
        warmup: args.warmup,
        max_duration: args.duration_s.map(Duration::from_secs_f64),
        request_timeout: Duration::from_millis(args.timeout_ms),
        cycle: false,
        client: None,
    };
    if let Some(obj) = workload_report.as_object_mut() {
        obj.insert("network".into(), serde_json::json!({"mode": args.mode, "client_one_way": client_delay, "cloud_one_way": cloud_delay}));
        obj.insert("driver".into(), serde_json::json!({"load": load, "warmup": args.warmup, "k": args.k, "edges_per_system": args.edges, "cloud_shards": args.shards}));
        obj.insert("bundle".into(), serde_json::json!(bundle));
    }
    eprintln!("workload: {}", serde_json::to_string(&workload_report)?);
    let mut workload_index = WorkloadIndex::new(&workload);
    // Drafts validated by a pre-filled question are judged by its entity too (CAR).
    for question in &prefill {
        workload_index
            .entity_of_question
            .entry(question.question.trim().to_string())
            .or_insert_with(|| question.entity.clone());
    }
    let cloud = start_cloud(&settings)?;
    let mut systems = Vec::new();
    for (index, spec) in specs.iter().enumerate() {
        let label = format!("{} {}", spec.name, spec.params);
        let bar = progress_bar(workload.len(), &label);
        let tick = bar.clone();
        let report = run_system(
            spec,
            index,
            &cloud,
            &settings,
            &workload,
            &driver_settings,
            &workload_index,
            move |done| tick.set_position(done as u64),
        )
        .await?;
        bar.finish_and_clear();
        eprintln!(
            "{:<28} accepted {:>5}  fallback {:>5}  errors {:>3}  DAR {:.4}  DHR {:.4}  AvgL {:.4}s",
            report.label(),
            report.accepted,
            report.fallback,
            report.errors,
            report.dar,
            report.doc_hit_rate,
            report.avg_latency_s,
        );
        systems.push(report);
    }
    drop(cloud);
    let mut report = Report {
        workload: workload_report,
        systems,
    };
    report.pair_with_baseline();
    report
        .write(&args.out)
        .map_err(|e| anyhow::anyhow!("writing the report: {e}"))?;
    println!("{}", report.markdown());
    println!("report written to {}", args.out.display());
    Ok(())
}

fn absolute(path: &Path) -> Result<PathBuf> {
    std::path::absolute(path).with_context(|| format!("resolving {}", path.display()))
}
