//! hasten-specrag-eval: answer accuracy and latency of standard RAG against Speculative RAG
//! (Wang et al., 2024) and two of the paper's ablations, on HotpotQA-style questions with
//! their own passages, through hasten-rag's [`LmBackend`] on local GGUF models.
//!
//! Every question brings its documents: the 10 context paragraphs of the HotpotQA
//! distractor setting (2 gold, 8 distractors), each the title and its sentences joined with
//! spaces. Their vectors (all-MiniLM-L6-v2, the 10 encoded in one batch, the text the edge's
//! bundles encode) are computed before any system runs. Encoding is preprocessing, not part
//! of answering: an edge already holds the vectors of the documents it retrieves, so it is
//! **not counted in any latency** here (its total is reported separately as `encoding_s`).
//!
//! Questions without passages (TriviaQA, NQ, PopQA: `question` and `answers`) get theirs
//! from a corpus bundle (`--retrieve-from`, built by `cloud-index build`): the exact top k
//! (`--passages`, 10) that a cloud shard would return, with the bundle's vectors. Retrieval
//! is the same for every system and reported apart (`retrieval_s`), with whether the
//! passages hold a gold answer at all (`answer_in_passages`, the ceiling of any reader).
//!
//! Systems, all answering the same question from the same 10 documents:
//! - `standard-rag`: the verifier reads all 10 documents and writes the answer.
//! - `speculative-rag`: the paper's defaults: m = 5 drafts by the drafter, each from one
//!   document of each of k = 2 k-means clusters, scored by the verifier in one pass.
//! - `speculative-random-draft`: as above but a random draft is answered, unverified (the
//!   paper's "without verification" ablation: the verifier never runs).
//! - `speculative-no-clustering`: subsets of k documents drawn at random from all 10 (the
//!   paper's "random sampling without clustering" ablation).
//!
//! Prompt variants of standard RAG, to measure the prompt (issue 48):
//! - `standard-rag-answer-only`: a client system message adds [`ANSWER_ONLY_INSTRUCTION`]
//!   after the standard instruction.
//! - `standard-rag-titled`: each document's title goes above its text, the layout standard
//!   RAG's prompt had before this measurement dropped the titles.
//!
//! Generation runs in process on two GGUF files (`--drafter`, `--verifier`) or on engines a
//! team already runs (`--engine-url`, and `--drafter-engine-url` for the drafts): any
//! OpenAI-compatible server through `hasten_engine::EngineLm`, as an edge configured with
//! `engine.url` answers. Speculative RAG there needs an engine whose log-probabilities of
//! given text can be read (llama.cpp's server); the run says which it found.
//!
//! Latency is the wall clock of one `LmBackend::answer` call, end to end (request checks,
//! prompts, prefill, decoding, verification). Each question runs every system in turn, the
//! starting system rotating from question to question, so that machine noise and any warm-up
//! spread evenly over the systems. Accuracy is SQuAD's normalised exact match, token F1 and
//! answer containment (`hasten_eval::metrics`), each the best over the gold answer's aliases.

mod report;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};
use hasten_core::encoder::{DEFAULT_MODEL_DIR, TextEncoder};
use hasten_engine::{EngineLm, EngineSettings};
use hasten_rag::{
    AnswerMode, AnswerRequest, ChatTurn, Decoding, DeviceKind, DraftSelection, LmBackend, LocalLm,
    Role, SpeculativeSettings, WeightFormat,
};

use crate::report::{
    Outcome, QuestionReport, SystemReport, f1_against, file_name, print_paired, print_table,
    summarise,
};
use hasten_bench::questions::{encode_documents, read_questions};
use hasten_bench::retrieval::{PassageRetriever, holds_answer};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Accuracy and latency of standard RAG vs Speculative RAG (and its ablations) on \
             HotpotQA-style questions with their own passages",
    long_about = None
)]
struct Args {
    /// Questions, one JSON object a line in the HotpotQA distractor format: `question`,
    /// `answer` (a string or a list of aliases; `answers` also reads) and `context`
    /// [[title, [sentences]]]; `context` may be left out with --retrieve-from.
    #[arg(long)]
    input: PathBuf,
    /// Corpus bundle (`cloud-index build`) to retrieve every question's passages from, by
    /// exact search; the file's own `context` is then not used.
    #[arg(long)]
    retrieve_from: Option<PathBuf>,
    /// With --retrieve-from, keep only questions whose retrieved passages hold a gold
    /// answer (--limit then counts those): a reader's measure where the corpus answers few
    /// questions, as TriviaQA over article leads does.
    #[arg(long, requires = "retrieve_from")]
    answerable_only: bool,
    /// Passages retrieved per question with --retrieve-from (the paper's 10).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..=100))]
    passages: u16,
    /// GGUF model that writes Speculative RAG's drafts (the small one).
    #[arg(long, required_unless_present = "engine_url")]
    drafter: Option<PathBuf>,
    /// GGUF model that verifies drafts and answers in standard RAG (the large one).
    #[arg(long, required_unless_present = "engine_url")]
    verifier: Option<PathBuf>,
    /// Generate on an OpenAI-compatible engine instead of in process: its API's base URL,
    /// `/v1` included. It answers in standard RAG and verifies drafts.
    #[arg(long, conflicts_with_all = ["drafter", "verifier"])]
    engine_url: Option<String>,
    /// The model the engine serves, as its `/v1/models` names it.
    #[arg(long, requires = "engine_url")]
    engine_model: Option<String>,
    /// The engine that writes the drafts (a smaller model); --engine-url when absent.
    #[arg(long, requires = "engine_url")]
    drafter_engine_url: Option<String>,
    /// The drafter engine's model; --engine-model when absent.
    #[arg(long, requires = "engine_url")]
    drafter_engine_model: Option<String>,
    /// Longest wait, in seconds, for an engine's next bytes.
    #[arg(long, default_value_t = 300, requires = "engine_url")]
    engine_timeout_s: u64,
    /// all-MiniLM-L6-v2 directory that encodes the documents for clustering.
    #[arg(long, env = "HASTEN_MODEL_DIR", default_value = DEFAULT_MODEL_DIR)]
    model_dir: PathBuf,
    /// Questions to evaluate, from the start of the file (default: all).
    #[arg(long)]
    limit: Option<usize>,
    /// Systems to compare, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "standard-rag,speculative-rag,speculative-random-draft,speculative-no-clustering"
    )]
    systems: Vec<System>,
    /// Most tokens of a standard-RAG answer.
    #[arg(long, default_value_t = 32)]
    max_tokens: usize,
    /// Most tokens of a speculative draft (rationale and answer together; the paper's
    /// drafts carry a rationale, so they need more than an answer alone).
    #[arg(long, default_value_t = SpeculativeSettings::default().draft_tokens)]
    draft_tokens: usize,
    /// How weights are held: as_stored, q8_0, f32 or fast (the fastest on CPU: see WeightFormat).
    #[arg(long, default_value = "fast")]
    weights: WeightFormat,
    /// Where the models run: cpu, or cuda in a build with `--features hasten-rag/cuda`.
    #[arg(long, default_value = "cpu")]
    device: DeviceKind,
    /// Directory for report.json.
    #[arg(long, default_value = "run/specrag-eval")]
    out: PathBuf,
    /// Seeds k-means++, the subset sampling and the random draft; question i uses seed + i.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print every answer as it comes.
    #[arg(long)]
    verbose: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum System {
    StandardRag,
    SpeculativeRag,
    SpeculativeRandomDraft,
    SpeculativeNoClustering,
    StandardRagAnswerOnly,
    StandardRagTitled,
}

/// The instruction `standard-rag-answer-only` adds: the answer's form spelled out, since
/// small models otherwise restate the question in a sentence around it.
const ANSWER_ONLY_INSTRUCTION: &str = "Reply with the answer alone, in the documents' words: a \
name, number, date, short phrase, or yes or no. Do not write a sentence.";

impl System {
    fn name(self) -> &'static str {
        match self {
            Self::StandardRag => "standard-rag",
            Self::SpeculativeRag => "speculative-rag",
            Self::SpeculativeRandomDraft => "speculative-random-draft",
            Self::SpeculativeNoClustering => "speculative-no-clustering",
            Self::StandardRagAnswerOnly => "standard-rag-answer-only",
            Self::StandardRagTitled => "standard-rag-titled",
        }
    }

    /// The request this system sends for one question.
    fn request(self, base: &AnswerRequest, seed: u64) -> AnswerRequest {
        let mut request = base.clone();
        request.speculative.seed = seed;
        match self {
            Self::StandardRag => request.mode = AnswerMode::Standard,
            Self::SpeculativeRag => request.mode = AnswerMode::Speculative,
            Self::SpeculativeRandomDraft => {
                request.mode = AnswerMode::Speculative;
                request.speculative.selection = DraftSelection::Random { seed };
            }
            Self::SpeculativeNoClustering => {
                request.mode = AnswerMode::Speculative;
                request.speculative.clustering = false;
            }
            Self::StandardRagAnswerOnly => {
                request.mode = AnswerMode::Standard;
                request
                    .conversation
                    .push(ChatTurn::new(Role::System, ANSWER_ONLY_INSTRUCTION));
            }
            Self::StandardRagTitled => {
                request.mode = AnswerMode::Standard;
                for document in &mut request.documents {
                    let title = std::mem::take(&mut document.title);
                    document.text = format!("{}\n{}", title.trim(), document.text.trim());
                }
            }
        }
        request
    }
}

/// The gold answer: one string (HotpotQA) or a list of aliases.
fn main() -> Result<()> {
    let args = Args::parse();
    let mut systems: Vec<System> = Vec::new();
    for system in &args.systems {
        if !systems.contains(system) {
            systems.push(*system);
        }
    }
    if systems.is_empty() {
        bail!("--systems names no system");
    }
    if args.limit == Some(0) {
        bail!("--limit must be at least 1");
    }

    let read_limit = if args.answerable_only {
        None
    } else {
        args.limit
    };
    let mut questions = read_questions(&args.input, read_limit, args.retrieve_from.is_none())?;
    let encoder = TextEncoder::load(&args.model_dir)
        .with_context(|| format!("loading the encoder from {}", args.model_dir.display()))?;
    let retriever = match &args.retrieve_from {
        Some(dir) => {
            let retriever = PassageRetriever::load(dir)?;
            eprintln!(
                "retrieving {} passages per question from {} ({} passages)",
                args.passages,
                dir.display(),
                retriever.passages()
            );
            Some(retriever)
        }
        None => None,
    };
    // Seconds each question's retrieval took, where it was retrieved while screening: the
    // passages screened are the ones answered over, not retrieved a second time.
    let mut retrieval_times: Vec<Option<f64>> = vec![None; questions.len()];
    if let (true, Some(retriever)) = (args.answerable_only, &retriever) {
        let mut screened = 0;
        let mut answerable = Vec::new();
        for mut question in questions {
            if args.limit.is_some_and(|limit| answerable.len() >= limit) {
                break;
            }
            screened += 1;
            let started = Instant::now();
            let passages =
                retriever.retrieve(&encoder, &question.question, usize::from(args.passages))?;
            let seconds = started.elapsed().as_secs_f64();
            if holds_answer(&passages, &question.golds) {
                question.documents = passages;
                answerable.push((question, Some(seconds)));
            }
        }
        eprintln!(
            "{} questions whose passages hold a gold answer, of the first {screened}",
            answerable.len()
        );
        (questions, retrieval_times) = answerable.into_iter().unzip();
    }
    let Generators {
        backend,
        drafter: drafter_name,
        verifier: verifier_name,
        runtime: _engine_runtime,
    } = generators(&args)?;
    let threads = candle_core::utils::get_num_threads();
    eprintln!(
        "{} questions from {}; drafter {drafter_name}, verifier {verifier_name}, {} weights on \
         {}, {threads} threads; systems: {}",
        questions.len(),
        args.input.display(),
        args.weights,
        args.device,
        systems
            .iter()
            .map(|s| s.name())
            .collect::<Vec<_>>()
            .join(", ")
    );

    let bar = hasten_bench::progress_bar("questions", questions.len());
    let mut reports = Vec::with_capacity(questions.len());
    let mut encoding_total = 0.0;
    let mut retrieval_total = 0.0;
    let mut answerable = 0usize;
    for (index, question) in questions.iter_mut().enumerate() {
        let mut retrieval_s = None;
        let mut encoding_s = 0.0;
        if let Some(retriever) = &retriever {
            // The same passages for every system, so no system's latency counts this.
            let seconds = match retrieval_times[index] {
                Some(seconds) => seconds,
                None => {
                    let started = Instant::now();
                    question.documents = retriever
                        .retrieve(&encoder, &question.question, usize::from(args.passages))
                        .with_context(|| format!("question {index}: retrieving its passages"))?;
                    started.elapsed().as_secs_f64()
                }
            };
            retrieval_total += seconds;
            retrieval_s = Some(seconds);
        } else {
            // Preprocessing: the edge already holds these vectors, so no latency counts this.
            let encoding = Instant::now();
            encode_documents(&encoder, &mut question.documents)
                .with_context(|| format!("question {index}"))?;
            encoding_s = encoding.elapsed().as_secs_f64();
            encoding_total += encoding_s;
        }
        let answer_in_passages = holds_answer(&question.documents, &question.golds);
        answerable += usize::from(answer_in_passages);

        let base = AnswerRequest {
            question: question.question.clone(),
            documents: question.documents.clone(),
            mode: AnswerMode::Standard,
            max_new_tokens: args.max_tokens,
            speculative: SpeculativeSettings {
                draft_tokens: args.draft_tokens,
                ..SpeculativeSettings::default()
            },
            conversation: Vec::new(),
            decoding: Decoding::default(),
        };
        let seed = args.seed.wrapping_add(index as u64);
        let mut outcomes = Vec::with_capacity(systems.len());
        for turn in 0..systems.len() {
            let system = systems[(index + turn) % systems.len()];
            let request = system.request(&base, seed);
            bar.set_message(system.name());
            let started = Instant::now();
            let answer = backend
                .answer(&request, &mut |_: &str| {})
                .with_context(|| format!("question {index}, system {}", system.name()))?;
            let latency_s = started.elapsed().as_secs_f64();
            let outcome = Outcome::new(system.name(), &answer, latency_s, &question.golds);
            if args.verbose {
                let line = format!(
                    "[{index}] {:<26} {latency_s:>7.2} s  {:?} (gold {:?})",
                    system.name(),
                    outcome.answer,
                    question
                        .golds
                        .first()
                        .map(String::as_str)
                        .unwrap_or_default()
                );
                // A hidden bar (output not a terminal) prints nothing of its own.
                if bar.is_hidden() {
                    eprintln!("{line}");
                } else {
                    bar.println(line);
                }
            }
            outcomes.push(outcome);
        }
        outcomes.sort_by_key(|o| systems.iter().position(|s| s.name() == o.system));
        reports.push(QuestionReport {
            index,
            question: question.question.clone(),
            gold: question.golds.clone(),
            retrieval_s,
            passages: if retriever.is_some() {
                question.documents.iter().map(|d| d.title.clone()).collect()
            } else {
                Vec::new()
            },
            answer_in_passages,
            encoding_s,
            outcomes,
        });
        bar.inc(1);
    }
    bar.finish_and_clear();

    let summaries: Vec<SystemReport> = systems
        .iter()
        .map(|&system| {
            let outcomes: Vec<&Outcome> = reports
                .iter()
                .flat_map(|r| r.outcomes.iter())
                .filter(|o| o.system == system.name())
                .collect();
            summarise(system.name(), &outcomes)
        })
        .collect();
    let standard = summaries
        .iter()
        .find(|s| s.name == System::StandardRag.name())
        .map(|s| s.avg_latency_s)
        .filter(|avg| *avg > 0.0);
    let ratios: BTreeMap<&'static str, f64> = standard
        .map(|standard| {
            summaries
                .iter()
                .map(|s| (s.name, s.avg_latency_s / standard))
                .collect()
        })
        .unwrap_or_default();

    let f1_paired = f1_against(&reports, System::StandardRag.name());
    let report = serde_json::json!({
        "input": args.input,
        "questions": reports.len(),
        "drafter": drafter_name,
        "verifier": verifier_name,
        "engine": args.engine_url,
        "threads": threads,
        "device": args.device.to_string(),
        "weights": args.weights.to_string(),
        "max_tokens": args.max_tokens,
        "draft_tokens": args.draft_tokens,
        "seed": args.seed,
        "latency": "wall clock of one LmBackend::answer call per question and system; document \
                    encoding is preprocessing (the edge already holds the vectors) and is not \
                    counted: see encoding_s",
        "accuracy": "fractions of questions: normalised exact match, mean token F1, gold answer \
                     contained in the answer; each the best over the gold aliases",
        "encoding_s": encoding_total,
        "retrieved_from": args.retrieve_from,
        "passages_per_question": args.retrieve_from.as_ref().map(|_| args.passages),
        "retrieval_s": retrieval_total,
        "answer_in_passages": answerable as f64 / reports.len().max(1) as f64,
        "systems": summaries,
        "latency_ratio_vs_standard": ratios,
        "f1_vs_standard": f1_paired
            .iter()
            .map(|(system, d)| (*system, serde_json::json!({
                "mean": d.mean, "ci95_low": d.low, "ci95_high": d.high, "questions": d.pairs,
            })))
            .collect::<BTreeMap<_, _>>(),
        "per_question": reports,
    });
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let path = args.out.join("report.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", path.display()))?;

    println!(
        "{} questions, drafter {drafter_name}, verifier {verifier_name}, {threads} threads (document encoding, {encoding_total:.2} s in all, not counted)",
        reports.len(),
    );
    println!(
        "a gold answer is in the passages of {answerable} of {} questions",
        reports.len()
    );
    print_table(&summaries, &ratios);
    print_paired(&f1_paired, System::StandardRag.name());
    if standard.is_none() {
        println!("(no latency ratios: standard-rag was not among the systems)");
    }
    println!("report: {}", path.display());
    Ok(())
}

/// What answers, and the names the report gives its two models.
struct Generators {
    backend: Box<dyn LmBackend>,
    drafter: String,
    verifier: String,
    /// Where an engine client's HTTP calls run (`answer` blocks on them from the calling
    /// thread); kept as long as the backend, and dropped after it.
    runtime: Option<tokio::runtime::Runtime>,
}

/// The in-process models, or the engines (the verifier's scoring found before any question,
/// as an edge finds it at start).
fn generators(args: &Args) -> Result<Generators> {
    let Some(url) = &args.engine_url else {
        let (Some(drafter), Some(verifier)) = (&args.drafter, &args.verifier) else {
            bail!("--drafter and --verifier name the models, unless --engine-url is given");
        };
        let backend = LocalLm::load_with(drafter, verifier, args.device, args.weights)
            .with_context(|| {
                format!(
                    "loading the drafter {} and the verifier {}",
                    drafter.display(),
                    verifier.display()
                )
            })?;
        return Ok(Generators {
            backend: Box::new(backend),
            drafter: file_name(drafter),
            verifier: file_name(verifier),
            runtime: None,
        });
    };
    let model = args.engine_model.clone().unwrap_or_default();
    let drafter_url = args
        .drafter_engine_url
        .clone()
        .unwrap_or_else(|| url.clone());
    let drafter_model = args
        .drafter_engine_model
        .clone()
        .unwrap_or_else(|| model.clone());
    let settings = EngineSettings {
        url: url.clone(),
        model: model.clone(),
        drafter_url: Some(drafter_url.clone()),
        drafter_model: Some(drafter_model.clone()),
        api_key: None,
        timeout: Duration::from_secs(args.engine_timeout_s),
        ca_file: None,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting the engine client's runtime")?;
    let engine = runtime.block_on(async { EngineLm::new(settings) })?;
    let scoring = runtime
        .block_on(engine.detect_scoring())
        .with_context(|| format!("reaching the engine at {url}"))?;
    eprintln!("engine {url}: verification scores by {scoring}");
    Ok(Generators {
        backend: Box::new(engine),
        drafter: format!("{drafter_model} at {drafter_url}"),
        verifier: format!("{model} at {url}"),
        runtime: Some(runtime),
    })
}
