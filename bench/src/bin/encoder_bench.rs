//! hasten-encoder-bench: the text encoder's runtimes (ONNX Runtime, candle on the CPU, candle
//! on a CUDA GPU) side by side on the same real text in one process: corpus encoding rate
//! (passages/s, DPR passages of Wikipedia articles or HotpotQA paragraphs, as `cloud-index
//! build` encodes them), query encoding latency (one EntityQuestions question at a time, as an
//! edge encodes them), and how closely each runtime's vectors agree with the first's (cosine
//! per passage).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Parser;
use hasten_core::corpus::{ArticleFilter, load_entity_questions, load_hotpot, load_wiki_articles};
use hasten_core::encoder::{DEFAULT_MODEL_DIR, EncoderRuntime, TextEncoder};
use hasten_core::vector::dot;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Encoding rate, query latency and agreement of the encoder's runtimes"
)]
struct Args {
    /// Wikipedia articles (JSON lines, gzip or not), split into DPR passages.
    #[arg(long, default_value = "../shared/data/wiki-entity-articles.jsonl.gz")]
    articles: PathBuf,
    /// Take the passages from this HotpotQA JSON-lines file's paragraphs instead of --articles.
    #[arg(long)]
    hotpot: Option<PathBuf>,
    /// Questions to encode one at a time (EntityQuestions JSON lines).
    #[arg(
        long,
        default_value = "../shared/data/entityquestions-train-dev.jsonl.gz"
    )]
    questions: PathBuf,
    /// Passages to encode, taken at an even stride through the corpus.
    #[arg(long, default_value_t = 1024)]
    passages: usize,
    /// Passages kept per article (its first ones), as `cloud-index build` is told.
    #[arg(long, default_value_t = 3)]
    max_passages_per_article: usize,
    /// Questions encoded one at a time per runtime.
    #[arg(long, default_value_t = 200)]
    queries: usize,
    /// Runtimes to run, in order; each one's vectors are compared with the first's.
    #[arg(long, value_delimiter = ',', default_value = "onnx,candle", value_parser = parse_runtime)]
    runtimes: Vec<EncoderRuntime>,
    #[arg(long, env = "HASTEN_MODEL_DIR", default_value = DEFAULT_MODEL_DIR)]
    model_dir: PathBuf,
    /// Where to write the JSON report.
    #[arg(long)]
    out: Option<PathBuf>,
}

struct RuntimeRun {
    runtime: EncoderRuntime,
    vectors: Vec<Vec<f32>>,
    passages_per_s: f64,
    query_ms: Vec<f64>,
}

fn parse_runtime(name: &str) -> Result<EncoderRuntime, String> {
    match name {
        "onnx" => Ok(EncoderRuntime::Onnx),
        "candle" => Ok(EncoderRuntime::Candle),
        "cuda" => Ok(EncoderRuntime::Cuda),
        other => Err(format!(
            "unknown runtime `{other}`: expected onnx, candle or cuda"
        )),
    }
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn run(
    runtime: EncoderRuntime,
    args: &Args,
    passages: &[String],
    questions: &[String],
) -> Result<RuntimeRun> {
    let encoder = TextEncoder::load_with(&args.model_dir, runtime)
        .with_context(|| format!("loading the {} runtime", runtime.name()))?;
    // One untimed pass warms caches and ONNX Runtime's first-run allocations.
    encoder.encode(&[passages[0].as_str(), questions[0].as_str()])?;
    let bar = ProgressBar::new(passages.len() as u64).with_style(ProgressStyle::with_template(
        "{prefix:>7} {bar:30} {pos}/{len} passages {per_sec} eta {eta}",
    )?);
    bar.set_prefix(runtime.name());
    let started = Instant::now();
    let mut vectors = Vec::with_capacity(passages.len());
    // Chunks of 64 let the bar move; the encoder sorts and batches within each.
    for chunk in passages.chunks(64) {
        let texts: Vec<&str> = chunk.iter().map(String::as_str).collect();
        vectors.extend(encoder.encode(&texts)?);
        bar.inc(chunk.len() as u64);
    }
    let passages_per_s = passages.len() as f64 / started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let mut query_ms = Vec::with_capacity(questions.len());
    for question in questions {
        let started = Instant::now();
        encoder.encode_one(question)?;
        query_ms.push(started.elapsed().as_secs_f64() * 1e3);
    }
    query_ms.sort_by(f64::total_cmp);
    Ok(RuntimeRun {
        runtime,
        vectors,
        passages_per_s,
        query_ms,
    })
}

fn print_table(runs: &[RuntimeRun]) {
    println!("| runtime | passages/s | query p50 | query p99 |");
    println!("|---|---|---|---|");
    for r in runs {
        println!(
            "| {} | {:.1} | {:.2} ms | {:.2} ms |",
            r.runtime.name(),
            r.passages_per_s,
            percentile(&r.query_ms, 0.5),
            percentile(&r.query_ms, 0.99)
        );
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.passages == 0 || args.queries == 0 {
        bail!("--passages and --queries must be at least 1");
    }
    let (source, corpus) = match &args.hotpot {
        Some(path) => (
            path,
            load_hotpot(path).with_context(|| format!("reading {}", path.display()))?,
        ),
        None => (
            &args.articles,
            load_wiki_articles(&args.articles, Some(args.max_passages_per_article))
                .with_context(|| format!("reading {}", args.articles.display()))?,
        ),
    };
    let stride = (corpus.passages.len() / args.passages).max(1);
    let passages: Vec<String> = corpus
        .passages
        .iter()
        .step_by(stride)
        .take(args.passages)
        .map(|p| p.embedding_text())
        .collect();
    let questions: Vec<String> = load_entity_questions(&args.questions, ArticleFilter::All)
        .with_context(|| format!("reading {}", args.questions.display()))?
        .questions
        .into_iter()
        .take(args.queries)
        .map(|q| q.question)
        .collect();
    if questions.is_empty() {
        bail!("{} holds no questions", args.questions.display());
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    eprintln!(
        "{} passages (of {} from {}), {} questions, {threads} cores",
        passages.len(),
        corpus.passages.len(),
        source.display(),
        questions.len()
    );
    if args.runtimes.is_empty() {
        bail!("--runtimes names no runtime");
    }
    let runs = args
        .runtimes
        .iter()
        .map(|&runtime| run(runtime, &args, &passages, &questions))
        .collect::<Result<Vec<_>>>()?;
    print_table(&runs);
    let reference = &runs[0];
    let comparisons: Vec<_> = runs[1..]
        .iter()
        .map(|other| {
            let mut cosines: Vec<f64> = reference
                .vectors
                .iter()
                .zip(&other.vectors)
                .map(|(a, b)| f64::from(dot(a, b)))
                .collect();
            cosines.sort_by(f64::total_cmp);
            let cosine_mean = cosines.iter().sum::<f64>() / cosines.len() as f64;
            let speedup = reference.passages_per_s / other.passages_per_s;
            println!(
                "{} / {}: {speedup:.2}x passages/s; cosine between the runtimes: min {:.6}, mean {:.6}",
                reference.runtime.name(),
                other.runtime.name(),
                cosines[0],
                cosine_mean
            );
            json!({
                "reference": reference.runtime.name(),
                "runtime": other.runtime.name(),
                "reference_over_runtime": speedup,
                "cosine_min": cosines[0],
                "cosine_mean": cosine_mean,
            })
        })
        .collect();
    let report = json!({
        "passages": passages.len(),
        "queries": questions.len(),
        "cores": threads,
        "runtimes": runs.iter().map(|r| json!({
            "runtime": r.runtime.name(),
            "passages_per_s": r.passages_per_s,
            "query_p50_ms": percentile(&r.query_ms, 0.5),
            "query_p99_ms": percentile(&r.query_ms, 0.99),
        })).collect::<Vec<_>>(),
        "comparisons": comparisons,
    });
    if let Some(out) = &args.out {
        std::fs::write(out, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(())
}
