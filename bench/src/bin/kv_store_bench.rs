//! hasten-kv-store-bench: the chunk KV store under TopViews-shaped traffic. HotpotQA
//! questions are the entities (each asks over its own 10 paragraphs, the chunks), drawn day by
//! day with popularity from the real page views where a question's first title appears in
//! them and the built-in Zipf model otherwise (`hasten_loadtest::popularity::views_then_model`). For
//! each RAM budget the same request stream runs against a fresh store over the same
//! preprocessed entries: every request resolves its chunks' similarity-guided KV (memory hit
//! or a read from disk: the page cache is warm, so "disk" is reading, checking and decoding a
//! file, not the device), and every `--ttft-every`-th request is answered by the worker
//! (FusionRAG, 15%) for its time to first token.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use hasten_bench::kv_workload::{chunk_ids, draw_stream, model_path, percentile};
use hasten_bench::questions::read_questions;
use hasten_core::bundle::CorpusBundle;
use hasten_kv_worker::config::KvWorkerConfig;
use hasten_kv_worker::store::{
    ChunkKvStore, Found, KvDtype, KvKey, MemoryTier, ModelId, StoreSettings, Variant,
};
use hasten_kv_worker::worker::{ChunkInput, GenerateRequest, KvWorker};
use hasten_kv_worker::{FusionSettings, KvEngine};
use hasten_lm::{LanguageModel, WeightFormat};
use hasten_loadtest::popularity::{ZipfModel, read_topviews, views_then_model};
use serde_json::json;

#[derive(Parser, Debug)]
#[command(about = "Chunk KV store hit rate, load latency and TTFT against RAM budget")]
struct Args {
    /// HotpotQA distractor JSONL: each question's paragraphs are its chunks.
    #[arg(default_value = "../shared/data/hotpotqa-distractor-100.jsonl")]
    questions: PathBuf,
    /// The bundle of those paragraphs (`cloud-index build --hotpot`).
    #[arg(long)]
    bundle: PathBuf,
    /// The store `kv-worker preprocess` filled for that bundle.
    #[arg(long)]
    store: PathBuf,
    /// The GGUF model (default: SmolLM2-135M-Instruct under $HASTEN_LM_DIR).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Daily page views (`date,article,views`).
    #[arg(long, default_value = "../shared/data/pageviews-2012-daily-top.csv.gz")]
    pageviews: PathBuf,
    /// Questions (the first ones of the file): the entities.
    #[arg(long, default_value_t = 20)]
    limit: usize,
    /// Requests in the stream.
    #[arg(long, default_value_t = 600)]
    requests: usize,
    /// RAM budgets to run, in MiB.
    #[arg(long, value_delimiter = ',', default_value = "0,256,512,1024,4096")]
    budgets_mib: Vec<u64>,
    /// Every n-th request is answered for its time to first token.
    #[arg(long, default_value_t = 30)]
    ttft_every: usize,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    #[arg(long)]
    out: Option<PathBuf>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.requests == 0 || args.ttft_every == 0 {
        bail!("--requests and --ttft-every must be at least 1");
    }
    let questions = read_questions(&args.questions, Some(args.limit), true)?;
    let bundle = CorpusBundle::load(&args.bundle)
        .with_context(|| format!("loading {}", args.bundle.display()))?;
    let chunks = chunk_ids(&questions, &bundle)?;
    let entities: Vec<String> = questions
        .iter()
        .map(|q| {
            q.documents
                .first()
                .map(|d| d.title.clone())
                .unwrap_or_default()
        })
        .collect();
    let model = ZipfModel::default();
    let popularity = match read_topviews(&args.pageviews, &entities) {
        Ok(views) => views_then_model(&views, &model, entities.len())?,
        Err(error) => {
            eprintln!("page views unused ({error}): the Zipf model alone");
            model.daily(entities.len())?
        }
    };
    let observed = popularity.observed.iter().filter(|d| !d.is_empty()).count();
    let stream = draw_stream(&popularity, args.requests, args.seed)?;
    let distinct = {
        let mut seen: Vec<usize> = stream.clone();
        seen.sort_unstable();
        seen.dedup();
        seen.len()
    };
    eprintln!(
        "{} requests over {} days ({} with page views matching a question), {distinct} distinct questions",
        stream.len(),
        popularity.days.len(),
        observed
    );

    let model_path = model_path(args.model.as_deref())?;
    let weights = WeightFormat::Fast;
    let language_model = Arc::new(
        LanguageModel::load_with(&model_path, &candle_core::Device::Cpu, weights)
            .with_context(|| format!("loading {}", model_path.display()))?,
    );
    let corpus = bundle.manifest.corpus_version.clone();
    let system = KvEngine::new(Arc::clone(&language_model))?
        .system()
        .tokens()
        .to_vec();
    let model_id = ModelId::compute(&model_path, &weights.to_string(), &system)?;
    let mut rows = Vec::new();
    println!("| RAM budget | memory hits | load p50 | load p99 | TTFT p50 | TTFT p90 | held |");
    println!("|---|---|---|---|---|---|---|");
    for &mib in &args.budgets_mib {
        let engine = KvEngine::new(Arc::clone(&language_model))?;
        let store = Arc::new(ChunkKvStore::open(
            StoreSettings {
                root: args.store.clone(),
                tiers: vec![MemoryTier {
                    name: "ram",
                    device: candle_core::Device::Cpu,
                    budget: mib << 20,
                }],
                dtype: KvDtype::F16,
                half_life: 1000.0,
            },
            candle_core::Device::Cpu,
            engine.model().decoder.rope().clone(),
        )?);
        let worker = KvWorker::new(
            engine,
            Arc::clone(&store),
            model_id.clone(),
            model_path.clone(),
            KvWorkerConfig::default().prefill_options(),
        )?;
        let (mut memory, mut disk) = (0usize, 0usize);
        let mut loads = Vec::with_capacity(stream.len());
        let mut ttfts = Vec::new();
        for (i, &q) in stream.iter().enumerate() {
            if i % args.ttft_every == 0 {
                let generated = worker.generate(
                    &GenerateRequest {
                        question: questions[q].question.clone(),
                        chunks: chunks[q].iter().map(|&id| ChunkInput::Id(id)).collect(),
                        corpus_version: Some(corpus.clone()),
                        settings: FusionSettings::default(),
                        variant: Variant::Similarity,
                        max_new_tokens: 1,
                    },
                    &mut |_: &str| {},
                )?;
                memory += generated.memory_hits;
                disk += generated.disk_hits;
                loads.push(generated.load.as_secs_f64());
                ttfts.push(generated.answer.timings.first_token.as_secs_f64());
                continue;
            }
            let started = Instant::now();
            for &id in &chunks[q] {
                let key = KvKey::corpus_chunk(model_id.clone(), &corpus, id, Variant::Similarity)?;
                match store.get(&key)?.1 {
                    Found::Memory(_) => memory += 1,
                    Found::Disk => disk += 1,
                }
            }
            loads.push(started.elapsed().as_secs_f64());
        }
        loads.sort_by(f64::total_cmp);
        ttfts.sort_by(f64::total_cmp);
        let stats = store.stats();
        let hit_rate = memory as f64 / (memory + disk).max(1) as f64;
        let held = stats.memory_bytes.first().copied().unwrap_or(0);
        println!(
            "| {mib} MiB | {:.1}% | {:.1} ms | {:.1} ms | {:.3} s | {:.3} s | {:.0} MiB |",
            hit_rate * 100.0,
            percentile(&loads, 0.5) * 1e3,
            percentile(&loads, 0.99) * 1e3,
            percentile(&ttfts, 0.5),
            percentile(&ttfts, 0.9),
            held as f64 / (1 << 20) as f64
        );
        rows.push(json!({
            "ram_budget_mib": mib,
            "memory_hit_rate": hit_rate,
            "memory_hits": memory,
            "disk_hits": disk,
            "load_p50_s": percentile(&loads, 0.5),
            "load_p99_s": percentile(&loads, 0.99),
            "ttft_p50_s": percentile(&ttfts, 0.5),
            "ttft_p90_s": percentile(&ttfts, 0.9),
            "ttft_samples": ttfts.len(),
            "held_bytes": held,
            "file_loads": stats.loads,
            "load_time_s": Duration::as_secs_f64(&stats.load_time),
        }));
    }
    let report = json!({
        "questions": questions.len(),
        "requests": stream.len(),
        "distinct_questions": distinct,
        "days": popularity.days.len(),
        "days_with_page_views": observed,
        "budgets": rows,
    });
    if let Some(out) = &args.out {
        std::fs::write(out, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(())
}
