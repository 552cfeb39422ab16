//! hasten-spechop-eval: SpecHop against the sequential multi-hop agent on HotpotQA-style
//! questions, with hasten-spec-retrieval's agent on a local GGUF model.
//!
//! The corpus is every context paragraph of the question file (deduplicated), encoded with
//! all-MiniLM-L6-v2; the target tool is faiss exact search over it behind a latency model
//! (the paper's 1 s target by default); the speculator is the edge's fuzzy channel (IVF-PQ
//! over the whole corpus, its top 50 re-ranked exactly) or exact search over a share of the
//! corpus. The agent writes each hop's sub-query, reads the hop's top documents into a
//! sub-answer and answers after a fixed number of hops (greedy).
//!
//! Every question runs the sequential agent first, then SpecHop at each k with each
//! verifier. Reported per k and verifier: relative latency (mean SpecHop latency / mean
//! sequential latency), the speculation success rate, exact match of the final answers, and
//! whether every trajectory (hops and answer) equals the sequential one. Also the paper's
//! cost ratios: alpha = speculator / target call time, beta = agent time per hop / target.

mod retrievers;

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use hasten_bench::latency::Latency;
use hasten_bench::mean;
use hasten_bench::questions::{encode_documents, read_questions};
use hasten_core::encoder::{DEFAULT_MODEL_DIR, TextEncoder};
use hasten_core::index::IndexError;
use hasten_eval::metrics;
use hasten_lm::{DeviceKind, LanguageModel, WeightFormat};
use hasten_spec_retrieval::hop::{
    Action, Hop, HopAgent, HopOutcome, HopSettings, LmHopAgent, Verifier, run_sequential_agent,
    run_spechop,
};
use hasten_spec_retrieval::{ExactRetriever, RetrievedDocument};
use serde::Serialize;

use crate::retrievers::{Corpus, SlowExact, Speculator, SpeculatorKind};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "SpecHop (continuous speculation over multi-hop retrieval) against the sequential \
             agent: relative latency, success rate, exact match, identical trajectories",
    long_about = None
)]
struct Args {
    /// Questions in the HotpotQA distractor JSONL format (`question`, `answer`,
    /// `context` [[title, [sentences]]]); every context paragraph joins the corpus.
    #[arg(long)]
    input: PathBuf,
    /// Questions evaluated, from the start of the file.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    limit: u32,
    /// GGUF model of the agent (SmolLM2-135M-Instruct in the recorded runs).
    #[arg(long)]
    model: PathBuf,
    /// all-MiniLM-L6-v2 directory.
    #[arg(long, env = "HASTEN_MODEL_DIR", default_value = DEFAULT_MODEL_DIR)]
    model_dir: PathBuf,
    /// Hops before the agent answers (HotpotQA's questions are two-hop).
    #[arg(long, default_value_t = 2)]
    hops: usize,
    /// Documents retrieved per hop.
    #[arg(long, default_value_t = 3)]
    k_documents: usize,
    /// SpecHop thread counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,5")]
    ks: Vec<usize>,
    /// Verifiers, comma-separated: strict, or jaccard:THRESHOLD.
    #[arg(long, value_delimiter = ',', default_value = "strict,jaccard:0.5")]
    verifiers: Vec<String>,
    /// Latency of one target call: fixed:S or uniform:LO,HI (seconds).
    #[arg(long, default_value = "fixed:1")]
    target_latency: String,
    /// fuzzy (IVF-PQ over the corpus, top 50 re-ranked) or fraction:F.
    #[arg(long, default_value = "fuzzy")]
    speculator: String,
    #[arg(long, default_value = "fast")]
    weights: WeightFormat,
    #[arg(long, default_value = "run/spechop-eval")]
    out: PathBuf,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long)]
    verbose: bool,
}

fn parse_verifier(spec: &str) -> Result<Verifier> {
    match spec.split_once(':') {
        None if spec == "strict" => Ok(Verifier::Strict),
        Some(("jaccard", t)) => {
            let t: f64 = t
                .parse()
                .with_context(|| format!("{spec:?}: bad threshold"))?;
            anyhow::ensure!(
                (0.0..=1.0).contains(&t),
                "{spec:?}: threshold outside [0, 1]"
            );
            Ok(Verifier::Jaccard(t))
        }
        _ => bail!("{spec:?}: expected strict or jaccard:THRESHOLD"),
    }
}

/// The agent, timing its own work.
struct TimedAgent<'a> {
    inner: LmHopAgent<'a>,
    spent: Mutex<Duration>,
}

impl TimedAgent<'_> {
    fn take(&self) -> Duration {
        self.spent
            .lock()
            .map(|mut spent| std::mem::take(&mut *spent))
            .unwrap_or_default()
    }

    fn add(&self, took: Duration) {
        if let Ok(mut spent) = self.spent.lock() {
            *spent += took;
        }
    }
}

impl HopAgent for TimedAgent<'_> {
    fn act(
        &self,
        question: &str,
        hops: &[Hop],
        must_answer: bool,
    ) -> hasten_spec_retrieval::StepResult<Action> {
        let started = Instant::now();
        let action = self.inner.act(question, hops, must_answer);
        self.add(started.elapsed());
        action
    }

    fn read(
        &self,
        question: &str,
        hops: &[Hop],
        query: &str,
        documents: &[RetrievedDocument],
    ) -> hasten_spec_retrieval::StepResult<String> {
        let started = Instant::now();
        let read = self.inner.read(question, hops, query, documents);
        self.add(started.elapsed());
        read
    }
}

#[derive(Debug, Serialize)]
struct RunRecord {
    question: usize,
    system: String,
    seconds: f64,
    answer: String,
    em: bool,
    identical_to_sequential: bool,
    speculated: usize,
    committed: usize,
}

#[derive(Debug, Serialize)]
struct Summary {
    queries: usize,
    mean_s: f64,
    relative_latency: f64,
    success_rate: Option<f64>,
    answer_em: f64,
    identical_to_sequential: bool,
    identical_share: f64,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let verifiers: Vec<(String, Verifier)> = args
        .verifiers
        .iter()
        .map(|v| Ok((v.clone(), parse_verifier(v)?)))
        .collect::<Result<_>>()?;
    if args.ks.contains(&0) || args.ks.is_empty() {
        bail!("--ks must list thread counts of at least 1");
    }
    let latency = Latency::parse(&args.target_latency).context("--target-latency")?;
    let kind = SpeculatorKind::parse(&args.speculator).context("--speculator")?;

    // The corpus: every question's paragraphs, once each.
    let all = read_questions(&args.input, None, true)?;
    let mut seen = HashSet::new();
    let mut paragraphs = Vec::new();
    for question in &all {
        for document in &question.documents {
            if seen.insert((document.title.clone(), document.text.clone())) {
                paragraphs.push(document.clone());
            }
        }
    }
    let encoder = TextEncoder::load(&args.model_dir)
        .with_context(|| format!("loading the encoder from {}", args.model_dir.display()))?;
    let bar = hasten_bench::progress_bar("encoding", paragraphs.len());
    for chunk in paragraphs.chunks_mut(64) {
        encode_documents(&encoder, chunk)?;
        bar.inc(chunk.len() as u64);
    }
    bar.finish_and_clear();
    let documents: Vec<RetrievedDocument> = paragraphs
        .into_iter()
        .enumerate()
        .map(|(id, d)| RetrievedDocument {
            id: id as u64,
            score: 0.0,
            title: d.title.into(),
            text: d.text.into(),
            vector: d.vector.unwrap_or_default().into(),
        })
        .collect();
    let corpus = Arc::new(Corpus {
        dimension: encoder.dimension(),
        documents,
    });
    let target = Arc::new(SlowExact::new(Arc::clone(&corpus), latency, args.seed)?);
    let exact: Arc<dyn ExactRetriever<Error = IndexError>> = target.clone();
    let mut speculator = Speculator::new(Arc::clone(&corpus), &kind, args.seed)?;
    let device = DeviceKind::Cpu.open()?;
    let model = LanguageModel::load_with(&args.model, &device, args.weights)
        .with_context(|| format!("loading {}", args.model.display()))?;
    let questions: Vec<_> = all.into_iter().take(args.limit as usize).collect();
    eprintln!(
        "{} questions, {} paragraphs, model {}, {} hops, {} documents a hop, target {}, \
         speculator {}",
        questions.len(),
        corpus.documents.len(),
        model.name(),
        args.hops,
        args.k_documents,
        args.target_latency,
        args.speculator
    );

    let settings = HopSettings {
        k_documents: args.k_documents,
        max_hops: args.hops,
    };
    let agent = TimedAgent {
        inner: LmHopAgent::new(&model, args.hops),
        spent: Mutex::new(Duration::ZERO),
    };
    let mut records = Vec::new();
    let mut agent_seconds_per_hop = Vec::new();
    let bar = hasten_bench::progress_bar("questions", questions.len());
    for (index, question) in questions.iter().enumerate() {
        let em = |outcome: &HopOutcome| {
            question
                .golds
                .iter()
                .any(|gold| metrics::exact_match(&outcome.answer, gold))
        };
        agent.take();
        let started = Instant::now();
        let sequential = run_sequential_agent(
            &agent,
            &question.question,
            &encoder,
            exact.as_ref(),
            &settings,
        )
        .with_context(|| format!("question {index}: sequential"))?;
        let seq_seconds = started.elapsed().as_secs_f64();
        let agent_time = agent.take().as_secs_f64();
        agent_seconds_per_hop.push(agent_time / (sequential.hops.len() + 1) as f64);
        if args.verbose {
            bar.suspend(|| {
                eprintln!(
                    "q{index} sequential {seq_seconds:.2} s: {:?} -> {}",
                    sequential
                        .hops
                        .iter()
                        .map(|h| (&h.query, &h.sub_answer))
                        .collect::<Vec<_>>(),
                    sequential.answer
                )
            });
        }
        records.push(RunRecord {
            question: index,
            system: "sequential".into(),
            seconds: seq_seconds,
            em: em(&sequential),
            answer: sequential.answer.clone(),
            identical_to_sequential: true,
            speculated: 0,
            committed: 0,
        });
        for &k in &args.ks {
            for (name, verifier) in &verifiers {
                let started = Instant::now();
                let outcome = run_spechop(
                    &agent,
                    &question.question,
                    &encoder,
                    &exact,
                    &mut speculator,
                    &settings,
                    k,
                    *verifier,
                )
                .with_context(|| format!("question {index}: k {k}, {name}"))?;
                let seconds = started.elapsed().as_secs_f64();
                let stats = outcome.speculation.clone().unwrap_or_default();
                records.push(RunRecord {
                    question: index,
                    system: format!("k={k} {name}"),
                    seconds,
                    em: em(&outcome),
                    identical_to_sequential: outcome.hops == sequential.hops
                        && outcome.answer == sequential.answer,
                    answer: outcome.answer,
                    speculated: stats.speculated,
                    committed: stats.committed,
                });
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();

    let seq_mean = mean(
        records
            .iter()
            .filter(|r| r.system == "sequential")
            .map(|r| r.seconds),
    );
    let mut systems: Vec<String> = vec!["sequential".into()];
    for &k in &args.ks {
        for (name, _) in &verifiers {
            systems.push(format!("k={k} {name}"));
        }
    }
    let mut summary = BTreeMap::new();
    println!(
        "| system | queries | mean s | relative latency | success rate | answer EM | identical |"
    );
    println!("|---|---|---|---|---|---|---|");
    for system in &systems {
        let own: Vec<&RunRecord> = records.iter().filter(|r| &r.system == system).collect();
        let speculated: usize = own.iter().map(|r| r.speculated).sum();
        let committed: usize = own.iter().map(|r| r.committed).sum();
        let mean_s = mean(own.iter().map(|r| r.seconds));
        let identical = own.iter().filter(|r| r.identical_to_sequential).count();
        let s = Summary {
            queries: own.len(),
            mean_s,
            relative_latency: mean_s / seq_mean.max(f64::MIN_POSITIVE),
            success_rate: (speculated > 0).then(|| committed as f64 / speculated as f64),
            answer_em: mean(own.iter().map(|r| f64::from(u8::from(r.em)))),
            identical_to_sequential: identical == own.len(),
            identical_share: identical as f64 / own.len().max(1) as f64,
        };
        println!(
            "| {system} | {} | {:.2} | {:.3} | {} | {:.3} | {}/{} |",
            s.queries,
            s.mean_s,
            s.relative_latency,
            s.success_rate.map_or("-".into(), |p| format!("{p:.3}")),
            s.answer_em,
            identical,
            own.len()
        );
        summary.insert(system.clone(), s);
    }
    let target_s = target.mean_call_seconds();
    let speculator_s = speculator.spent.as_secs_f64() / speculator.calls.max(1) as f64;
    let alpha = speculator_s / target_s;
    let beta = mean(agent_seconds_per_hop.iter().copied()) / target_s;
    println!(
        "target call {target_s:.3} s, speculator call {speculator_s:.5} s: alpha {alpha:.4}, beta {beta:.3}"
    );
    let report = serde_json::json!({
        "input": args.input.display().to_string(),
        "model": model.name(),
        "paragraphs": corpus.documents.len(),
        "hops": args.hops,
        "k_documents": args.k_documents,
        "target_latency": args.target_latency,
        "speculator": args.speculator,
        "alpha": alpha,
        "beta": beta,
        "target_call_s": target_s,
        "speculator_call_s": speculator_s,
        "systems": summary,
        "runs": records,
    });
    let path = hasten_bench::save_report(&args.out, &report)?;
    eprintln!("report written to {}", path.display());
    Ok(())
}
