//! FusionRAG against full prefill, full reuse and CacheBlend on HotpotQA-style questions,
//! each answered from its own paragraphs as chunks: time to first token, and quality against
//! full prefill (F1/EM, answer agreement, first-token KL, KV deviation per layer).
//!
//! Chunks' KV is computed before any question is timed (the offline stage): Full Reuse KV
//! (each chunk after the system prompt) and the similarity-guided KV (each chunk after its
//! top-n most similar chunks of the file by MiniLM cosine). Timed per question, in memory:
//! question tokenization, assembly, selection and recomputation, up to the first token.

mod corpus;
mod report;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use candle_core::D;
use clap::Parser;
use hasten_bench::kv_workload::model_path;
use hasten_bench::questions::read_questions;
use hasten_bench::retrieval::{PassageRetriever, holds_answer};
use hasten_core::encoder::{EncoderRuntime, TextEncoder};
use hasten_eval::metrics::{best_of, exact_match, f1, normalize};
use hasten_kv_worker::quality::{first_token_kl, kv_deviation_per_layer};
use hasten_kv_worker::{ExactPrefix, FusionMode, FusionSettings, KvEngine, SegmentKv};
use hasten_lm::{DeviceKind, LanguageModel, WeightFormat};

use hasten_kv_worker::store::Variant;

use crate::corpus::{Corpus, variant_name};
use crate::report::{Outcome, Summary, print_table};

#[derive(Parser, Debug)]
#[command(about = "FusionRAG KV reuse against full prefill: time to first token and quality")]
struct Args {
    /// Questions in the HotpotQA distractor JSONL format (`question`, `answer`, `context`;
    /// `context` may be left out with --retrieve-from).
    #[arg(default_value = "../shared/data/hotpotqa-distractor-100.jsonl")]
    file: PathBuf,
    /// Corpus bundle (`cloud-index build`) to retrieve each question's chunks from, by exact
    /// search (the cloud's); the file's own `context` is then not used.
    #[arg(long)]
    retrieve_from: Option<PathBuf>,
    /// Chunks retrieved per question with --retrieve-from.
    #[arg(long, default_value_t = 5)]
    passages: usize,
    /// The GGUF model (default: SmolLM2-135M-Instruct under $HASTEN_LM_DIR).
    #[arg(long)]
    model: Option<PathBuf>,
    /// MiniLM encoder directory for the similarity-guided neighbours.
    #[arg(long, env = "HASTEN_MODEL_DIR")]
    encoder: PathBuf,
    #[arg(long, default_value = "run/fusionrag-eval")]
    work: PathBuf,
    /// Questions to answer (the first ones of the file).
    #[arg(long, default_value_t = 20)]
    limit: usize,
    /// Recompute ratios of FusionRAG over similarity-guided KV.
    #[arg(long, value_delimiter = ',', default_value = "0.05,0.1,0.15,1")]
    ratios: Vec<f64>,
    /// The ratio at which CacheBlend and FusionRAG without preprocessing are compared.
    #[arg(long, default_value_t = 0.15)]
    compare_ratio: f64,
    /// Neighbours a chunk attends to in the similarity-guided preprocessing (the paper's n).
    #[arg(long, default_value_t = 10)]
    top_n: usize,
    /// Pad each question's chunks with later questions' paragraphs until the context holds
    /// at least this many tokens (0: the question's own paragraphs only).
    #[arg(long, default_value_t = 0)]
    min_context: usize,
    #[arg(long, default_value_t = 32)]
    max_new_tokens: usize,
    /// Where the model runs: cpu, or cuda in a build with `--features cuda`. On cpu the
    /// weights take the `Fast` layout, on cuda plain f32.
    #[arg(long, default_value = "cpu")]
    device: DeviceKind,
}

/// One system of the comparison.
struct System {
    name: String,
    settings: FusionSettings,
    variant: Variant,
    /// The first chunk reads its Full Reuse KV and selection leaves it out (the kv-worker's
    /// `exact_leading_chunk`).
    exact_lead: bool,
}

fn systems(args: &Args) -> Vec<System> {
    let system = |mode, ratio: f64, variant: Variant| {
        let name = match mode {
            FusionMode::FullPrefill => "full-prefill".to_string(),
            FusionMode::FullReuse => format!("full-reuse/{}", variant_name(variant)),
            FusionMode::CacheBlend => {
                format!("cacheblend-{:.0}%/{}", ratio * 100.0, variant_name(variant))
            }
            FusionMode::FusionRag => {
                format!("fusionrag-{:.0}%/{}", ratio * 100.0, variant_name(variant))
            }
        };
        System {
            name,
            settings: FusionSettings { mode, ratio },
            variant,
            exact_lead: false,
        }
    };
    let mut all = vec![
        system(FusionMode::FullPrefill, 0.0, Variant::FullReuse),
        system(FusionMode::FullReuse, 0.0, Variant::FullReuse),
        system(FusionMode::FullReuse, 0.0, Variant::Similarity),
        system(
            FusionMode::CacheBlend,
            args.compare_ratio,
            Variant::FullReuse,
        ),
        system(
            FusionMode::CacheBlend,
            args.compare_ratio,
            Variant::Similarity,
        ),
        system(
            FusionMode::FusionRag,
            args.compare_ratio,
            Variant::FullReuse,
        ),
    ];
    for &ratio in &args.ratios {
        all.push(system(FusionMode::FusionRag, ratio, Variant::Similarity));
    }
    let lead = system(
        FusionMode::FusionRag,
        args.compare_ratio,
        Variant::Similarity,
    );
    all.push(System {
        name: format!("{}+exact-lead", lead.name),
        exact_lead: true,
        ..lead
    });
    all
}

fn main() -> Result<()> {
    let args = Args::parse();
    for &ratio in args.ratios.iter().chain([&args.compare_ratio]) {
        if !(0.0..=1.0).contains(&ratio) {
            bail!("--ratios and --compare-ratio take shares in [0, 1], not {ratio}");
        }
    }
    std::fs::create_dir_all(&args.work)
        .with_context(|| format!("creating {}", args.work.display()))?;
    let model_path = model_path(args.model.as_deref())?;
    let weights = match args.device {
        DeviceKind::Cpu => WeightFormat::Fast,
        DeviceKind::Cuda => WeightFormat::F32,
    };
    let model = LanguageModel::load_with(&model_path, &args.device.open()?, weights)
        .with_context(|| format!("loading {}", model_path.display()))?;
    let engine = KvEngine::new(Arc::new(model))?;
    let mut questions = read_questions(&args.file, Some(args.limit), args.retrieve_from.is_none())?;
    // The encoder runs where the model does (neighbours and retrieval are preprocessing).
    let runtime = match args.device {
        DeviceKind::Cpu => EncoderRuntime::Auto,
        DeviceKind::Cuda => EncoderRuntime::Cuda,
    };
    let encoder = TextEncoder::load_with(&args.encoder, runtime)
        .with_context(|| format!("loading the encoder from {}", args.encoder.display()))?;
    if let Some(dir) = &args.retrieve_from {
        let retriever = PassageRetriever::load(dir)?;
        let mut answerable = 0;
        for (index, question) in questions.iter_mut().enumerate() {
            question.documents = retriever
                .retrieve(&encoder, &question.question, args.passages)
                .with_context(|| format!("question {index}: retrieving its chunks"))?;
            answerable += usize::from(holds_answer(&question.documents, &question.golds));
        }
        eprintln!(
            "{} chunks per question retrieved from {} ({} passages); {answerable} of {} questions have a gold answer in them",
            args.passages,
            dir.display(),
            retriever.passages(),
            questions.len()
        );
    }
    let corpus = Corpus::build(&engine, &questions, &encoder, args.top_n, args.min_context)?;
    let stores = corpus.preprocess(&engine)?;
    let systems = systems(&args);

    // One untimed answer first, so that no system pays for a cold start.
    let warm: Vec<&SegmentKv> = corpus.chunks_of(0, Variant::FullReuse, false, &stores);
    engine.answer(
        &questions[0].question,
        &warm,
        FusionSettings::default(),
        4,
        ExactPrefix::NONE.into(),
        &mut |_: &str| {},
    )?;

    let mut outcomes: Vec<Vec<Outcome>> = systems.iter().map(|_| Vec::new()).collect();
    let bar = hasten_bench::progress_bar("questions", questions.len());
    for (q, question) in questions.iter().enumerate() {
        // Full prefill first (every other system is compared with it), the rest in an order
        // that rotates from question to question.
        let mut order: Vec<usize> = (1..systems.len()).collect();
        let turn = q % order.len().max(1);
        order.rotate_left(turn);
        let mut reference = None;
        for s in std::iter::once(0).chain(order) {
            let system = &systems[s];
            let chunks = corpus.chunks_of(q, system.variant, system.exact_lead, &stores);
            let started = Instant::now();
            let fused = engine.prefill(
                &question.question,
                &chunks,
                system.settings,
                args.max_new_tokens,
                ExactPrefix {
                    stored_leading: system.exact_lead,
                    whole_chunks: 0,
                }
                .into(),
            )?;
            fused.logits.argmax(D::Minus1)?.to_vec1::<u32>()?;
            let ttft = started.elapsed().as_secs_f64();
            let (kl, deviation) = match &reference {
                Some((logits, cache)) => (
                    first_token_kl(&fused.logits, logits)?,
                    kv_deviation_per_layer(&fused.cache, cache, fused.context_tokens)?,
                ),
                None => {
                    reference = Some((fused.logits.clone(), fused.cache.clone()));
                    (0.0, Vec::new())
                }
            };
            let (context, recomputed) = (fused.context_tokens, fused.recomputed.len());
            let stages = [
                fused.timings.assemble.as_secs_f64(),
                fused.timings.select.as_secs_f64(),
                fused.timings.recompute.as_secs_f64(),
            ];
            let mut text = String::new();
            engine.decode(fused, args.max_new_tokens, &mut |delta: &str| {
                text.push_str(delta)
            })?;
            outcomes[s].push(Outcome {
                ttft_s: ttft,
                stages,
                f1: best_of(&text, &question.golds, f1).unwrap_or(0.0),
                em: best_of(&text, &question.golds, exact_match).unwrap_or(false),
                normalized: normalize(&text),
                kl,
                deviation,
                context_tokens: context,
                recomputed_tokens: recomputed,
            });
        }
        bar.inc(1);
    }
    bar.finish_and_clear();

    let full = &outcomes[0];
    let summaries: Vec<Summary> = systems
        .iter()
        .zip(&outcomes)
        .map(|(system, outcomes)| Summary::of(&system.name, system.settings, outcomes, full))
        .collect();
    print_table(&summaries);
    let report = serde_json::json!({
        "file": args.file.display().to_string(),
        "retrieved_from": args.retrieve_from,
        "passages_per_question": args.retrieve_from.as_ref().map(|_| args.passages),
        "model": model_path.display().to_string(),
        "questions": questions.len(),
        "min_context": args.min_context,
        "top_n": args.top_n,
        "max_new_tokens": args.max_new_tokens,
        "chunks": corpus.len(),
        "preprocess": stores.report(),
        "threads": std::env::var("RAYON_NUM_THREADS").ok(),
        "device": args.device.to_string(),
        "systems": summaries,
    });
    hasten_bench::write_report(&args.work, &report)
}
