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
//! Systems, all answering the same question from the same 10 documents:
//! - `standard-rag`: the verifier reads all 10 documents and writes the answer.
//! - `speculative-rag`: the paper's defaults: m = 5 drafts by the drafter, each from one
//!   document of each of k = 2 k-means clusters, scored by the verifier in one pass.
//! - `speculative-random-draft`: as above but a random draft is answered, unverified (the
//!   paper's "without verification" ablation: the verifier never runs).
//! - `speculative-no-clustering`: subsets of k documents drawn at random from all 10 (the
//!   paper's "random sampling without clustering" ablation).
//!
//! Latency is the wall clock of one `LmBackend::answer` call, end to end (request checks,
//! prompts, prefill, decoding, verification). Each question runs every system in turn, the
//! starting system rotating from question to question, so that machine noise and any warm-up
//! spread evenly over the systems. Accuracy is SQuAD's normalised exact match, token F1 and
//! answer containment (`hasten_rag::eval`), each the best over the gold answer's aliases.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};
use hasten_core::encoder::{DEFAULT_MODEL_DIR, TextEncoder};
use hasten_rag::{
    Answer, AnswerMode, AnswerRequest, DeviceKind, Document, DraftSelection, LmBackend, LocalLm,
    SpeculativeSettings, WeightFormat, eval,
};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Accuracy and latency of standard RAG vs Speculative RAG (and its ablations) on \
             HotpotQA-style questions with their own passages",
    long_about = None
)]
struct Args {
    /// Questions, one JSON object a line in the HotpotQA distractor format: `question`,
    /// `answer` (a string or a list of aliases) and `context` [[title, [sentences]]].
    #[arg(long)]
    input: PathBuf,
    /// GGUF model that writes Speculative RAG's drafts (the small one).
    #[arg(long)]
    drafter: PathBuf,
    /// GGUF model that verifies drafts and answers in standard RAG (the large one).
    #[arg(long)]
    verifier: PathBuf,
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
    /// How weights are held: as_stored, q8_0, f32 or fast (Q8_0 decoding, f32 prefill).
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
}

impl System {
    fn name(self) -> &'static str {
        match self {
            Self::StandardRag => "standard-rag",
            Self::SpeculativeRag => "speculative-rag",
            Self::SpeculativeRandomDraft => "speculative-random-draft",
            Self::SpeculativeNoClustering => "speculative-no-clustering",
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
        }
        request
    }
}

/// The gold answer: one string (HotpotQA) or a list of aliases.
#[derive(Deserialize)]
#[serde(untagged)]
enum Gold {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
struct Record {
    question: String,
    #[serde(alias = "answers")]
    answer: Gold,
    context: Vec<(String, Vec<String>)>,
}

struct Question {
    question: String,
    golds: Vec<String>,
    documents: Vec<Document>,
}

/// Reads up to `limit` questions; a line that is not a question with passages is an error
/// naming its number.
fn read_questions(path: &Path, limit: Option<usize>) -> Result<Vec<Question>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut questions = Vec::new();
    for (number, line) in BufReader::new(file).lines().enumerate() {
        if limit.is_some_and(|limit| questions.len() >= limit) {
            break;
        }
        let line = line.with_context(|| format!("reading {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{} line {}", path.display(), number + 1);
        let record: Record = serde_json::from_str(&line).with_context(|| {
            format!(
                "{}: expected question, answer and context [[title, [sentences]]]",
                at()
            )
        })?;
        let golds: Vec<String> = match record.answer {
            Gold::One(answer) => vec![answer],
            Gold::Many(answers) => answers,
        }
        .into_iter()
        .filter(|a| !a.trim().is_empty())
        .collect();
        if golds.is_empty() {
            bail!("{}: the question has no gold answer", at());
        }
        let documents: Vec<Document> = record
            .context
            .into_iter()
            .map(|(title, sentences)| {
                let text = sentences
                    .iter()
                    .map(|s| s.trim())
                    .filter(|s| !s.is_empty())
                    .collect::<Vec<_>>()
                    .join(" ");
                Document::new(title.trim(), text)
            })
            .collect();
        if documents.is_empty() {
            bail!("{}: the question has no context paragraphs", at());
        }
        questions.push(Question {
            question: record.question.trim().to_string(),
            golds,
            documents,
        });
    }
    if questions.is_empty() {
        bail!("{} holds no questions", path.display());
    }
    Ok(questions)
}

/// Gives every document its vector, encoding one question's documents in one batch, with
/// the text the edge's bundles encode (`title. text`).
fn encode_documents(encoder: &TextEncoder, documents: &mut [Document]) -> Result<()> {
    let texts: Vec<String> = documents
        .iter()
        .map(|d| {
            hasten_core::Document {
                id: 0,
                title: d.title.clone(),
                text: d.text.clone(),
            }
            .embedding_text()
        })
        .collect();
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    let vectors = encoder.encode(&texts).context("encoding the documents")?;
    if vectors.len() != documents.len() {
        bail!(
            "the encoder returned {} vectors for {} documents",
            vectors.len(),
            documents.len()
        );
    }
    for (document, vector) in documents.iter_mut().zip(vectors) {
        document.vector = Some(vector);
    }
    Ok(())
}

/// One system's answer to one question.
#[derive(Serialize)]
struct Outcome {
    system: &'static str,
    answer: String,
    latency_s: f64,
    exact_match: bool,
    f1: f32,
    contains: bool,
    prefill_s: f64,
    decode_s: f64,
    verify_s: f64,
    generated_tokens: usize,
    documents_used: Vec<usize>,
}

impl Outcome {
    fn new(system: System, answer: &Answer, latency_s: f64, golds: &[String]) -> Self {
        let text = answer.text.trim();
        Self {
            system: system.name(),
            answer: text.to_string(),
            latency_s,
            exact_match: eval::best_of(text, golds, eval::exact_match).unwrap_or(false),
            f1: eval::best_of(text, golds, eval::f1).unwrap_or(0.0),
            contains: eval::best_of(text, golds, eval::contains).unwrap_or(false),
            prefill_s: answer.timings.prefill.as_secs_f64(),
            decode_s: answer.timings.decode.as_secs_f64(),
            verify_s: answer.timings.verify.as_secs_f64(),
            generated_tokens: answer.generated_tokens,
            documents_used: answer.documents_used.clone(),
        }
    }
}

#[derive(Serialize)]
struct QuestionReport {
    index: usize,
    question: String,
    gold: Vec<String>,
    encoding_s: f64,
    outcomes: Vec<Outcome>,
}

/// A system's figures over every question: exactly the per-system keys of the report.
#[derive(Serialize)]
struct SystemReport {
    name: &'static str,
    accuracy_em: f64,
    accuracy_f1: f64,
    accuracy_contains: f64,
    avg_latency_s: f64,
    p50_s: f64,
    p99_s: f64,
    queries: usize,
}

/// The nearest-rank percentile `p` (0-100) of `sorted`.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn summarise(system: System, outcomes: &[&Outcome]) -> SystemReport {
    let n = outcomes.len().max(1) as f64;
    let mut latencies: Vec<f64> = outcomes.iter().map(|o| o.latency_s).collect();
    latencies.sort_by(f64::total_cmp);
    SystemReport {
        name: system.name(),
        accuracy_em: outcomes.iter().filter(|o| o.exact_match).count() as f64 / n,
        accuracy_f1: outcomes.iter().map(|o| f64::from(o.f1)).sum::<f64>() / n,
        accuracy_contains: outcomes.iter().filter(|o| o.contains).count() as f64 / n,
        avg_latency_s: latencies.iter().sum::<f64>() / n,
        p50_s: percentile(&latencies, 50.0),
        p99_s: percentile(&latencies, 99.0),
        queries: outcomes.len(),
    }
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

fn progress_bar(len: usize) -> ProgressBar {
    let bar = ProgressBar::new(len as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "questions [{bar:30}] {pos}/{len} {elapsed_precise} eta {eta} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar
}

fn print_table(systems: &[SystemReport], ratios: &BTreeMap<&'static str, f64>) {
    println!(
        "{:<26} {:>6} {:>6} {:>8} {:>9} {:>8} {:>8} {:>11} {:>7}",
        "system", "EM", "F1", "contains", "avg s", "p50 s", "p99 s", "x standard", "queries"
    );
    for s in systems {
        let ratio = ratios
            .get(s.name)
            .map_or_else(|| "-".to_string(), |r| format!("{r:.2}"));
        println!(
            "{:<26} {:>6.3} {:>6.3} {:>8.3} {:>9.2} {:>8.2} {:>8.2} {:>11} {:>7}",
            s.name,
            s.accuracy_em,
            s.accuracy_f1,
            s.accuracy_contains,
            s.avg_latency_s,
            s.p50_s,
            s.p99_s,
            ratio,
            s.queries
        );
    }
}

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

    let mut questions = read_questions(&args.input, args.limit)?;
    let encoder = TextEncoder::load(&args.model_dir)
        .with_context(|| format!("loading the encoder from {}", args.model_dir.display()))?;
    let backend = LocalLm::load_with(&args.drafter, &args.verifier, args.device, args.weights)
        .with_context(|| {
            format!(
                "loading the drafter {} and the verifier {}",
                args.drafter.display(),
                args.verifier.display()
            )
        })?;
    let threads = candle_core::utils::get_num_threads();
    eprintln!(
        "{} questions from {}; drafter {}, verifier {}, {} weights on {}, {threads} threads; \
         systems: {}",
        questions.len(),
        args.input.display(),
        file_name(&args.drafter),
        file_name(&args.verifier),
        args.weights,
        args.device,
        systems
            .iter()
            .map(|s| s.name())
            .collect::<Vec<_>>()
            .join(", ")
    );

    let bar = progress_bar(questions.len());
    let mut reports = Vec::with_capacity(questions.len());
    let mut encoding_total = 0.0;
    for (index, question) in questions.iter_mut().enumerate() {
        // Preprocessing: the edge already holds these vectors, so no latency counts this.
        let encoding = Instant::now();
        encode_documents(&encoder, &mut question.documents)
            .with_context(|| format!("question {index}"))?;
        let encoding_s = encoding.elapsed().as_secs_f64();
        encoding_total += encoding_s;

        let base = AnswerRequest {
            question: question.question.clone(),
            documents: question.documents.clone(),
            mode: AnswerMode::Standard,
            max_new_tokens: args.max_tokens,
            speculative: SpeculativeSettings {
                draft_tokens: args.draft_tokens,
                ..SpeculativeSettings::default()
            },
        };
        let seed = args.seed.wrapping_add(index as u64);
        let mut outcomes = Vec::with_capacity(systems.len());
        for turn in 0..systems.len() {
            let system = systems[(index + turn) % systems.len()];
            let request = system.request(&base, seed);
            bar.set_message(system.name());
            let started = Instant::now();
            let answer = backend
                .answer(&request, &mut |_| {})
                .with_context(|| format!("question {index}, system {}", system.name()))?;
            let latency_s = started.elapsed().as_secs_f64();
            let outcome = Outcome::new(system, &answer, latency_s, &question.golds);
            if args.verbose {
                bar.println(format!(
                    "[{index}] {:<26} {latency_s:>7.2} s  {:?} (gold {:?})",
                    system.name(),
                    outcome.answer,
                    question
                        .golds
                        .first()
                        .map(String::as_str)
                        .unwrap_or_default()
                ));
            }
            outcomes.push(outcome);
        }
        outcomes.sort_by_key(|o| systems.iter().position(|s| s.name() == o.system));
        reports.push(QuestionReport {
            index,
            question: question.question.clone(),
            gold: question.golds.clone(),
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
            summarise(system, &outcomes)
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

    let report = serde_json::json!({
        "input": args.input,
        "questions": reports.len(),
        "drafter": file_name(&args.drafter),
        "verifier": file_name(&args.verifier),
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
        "systems": summaries,
        "latency_ratio_vs_standard": ratios,
        "per_question": reports,
    });
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let path = args.out.join("report.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", path.display()))?;

    println!(
        "{} questions, drafter {}, verifier {}, {threads} threads (document encoding, {encoding_total:.2} s in all, not counted)",
        reports.len(),
        file_name(&args.drafter),
        file_name(&args.verifier),
    );
    print_table(&summaries, &ratios);
    if standard.is_none() {
        println!("(no latency ratios: standard-rag was not among the systems)");
    }
    println!("report: {}", path.display());
    Ok(())
}
