//! hasten-ralmspec-eval: RaLMSpec's speed-up over `ralm-seq`, the paper's Table 1, on
//! questions from the visible data, with hasten-spec-retrieval on a local GGUF model.
//!
//! Iterative RAG retrieves the top-1 passage every 4 generated tokens (the question and the
//! last 32 generated tokens as the query, all-MiniLM-L6-v2), from a corpus bundle by faiss
//! exact search behind an emulated link: each call to the exact retriever waits a latency
//! drawn from a model (`--latency NAME=SPEC`; defaults: the paper's edge-cloud round trip,
//! uniform 100-200 ms, and a slow retriever, 1 s), once per call whatever its batch.
//!
//! Every question runs `ralm-seq` first, then each RaLMSpec configuration (the order rotates
//! from question to question), each with a fresh request state (no prompt or document cache
//! carries over). A configuration's output must be the sequential run's token for token;
//! `identical_to_sequential` says whether it was for every question. Speed-up is the ratio of
//! mean latencies, as the paper reports it.

mod cloud;
mod report;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};
use hasten_bench::questions::read_questions;
use hasten_bench::retrieval::PassageRetriever;
use hasten_core::encoder::{DEFAULT_MODEL_DIR, TextEncoder};
use hasten_lm::{DeviceKind, LanguageModel, WeightFormat};
use hasten_spec_retrieval::ralm::{
    LocalDocumentCache, Os3Settings, RalmGenerator, RalmOutput, RalmSettings, SpeculationSettings,
    Stride, run_sequential, run_speculative,
};

use hasten_bench::latency::Latency;

use crate::cloud::EmulatedCloud;
use crate::report::{Run, print_table, summarise};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "RaLMSpec (speculative retrieval, batched verification) against sequential \
             iterative RAG: speed-up per technique, outputs checked identical",
    long_about = None
)]
struct Args {
    /// Questions, one JSON object a line with `question` (NQ-open, TriviaQA, SQuAD as
    /// `bench/squad-questions.py` writes them); repeat for several datasets.
    #[arg(long = "input", required = true)]
    inputs: Vec<PathBuf>,
    /// Questions per input file, from its start.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    limit: u32,
    /// Corpus bundle (`cloud-index build`) the exact retriever searches.
    #[arg(long)]
    bundle: PathBuf,
    /// GGUF model that generates (SmolLM2-135M-Instruct in the recorded runs).
    #[arg(long)]
    model: PathBuf,
    /// all-MiniLM-L6-v2 directory that encodes the retrieval queries.
    #[arg(long, env = "HASTEN_MODEL_DIR", default_value = DEFAULT_MODEL_DIR)]
    model_dir: PathBuf,
    /// Latency settings of the exact retriever, NAME=fixed:S or NAME=uniform:LO,HI
    /// (seconds per call); repeat for several.
    #[arg(
        long = "latency",
        default_values = ["network=uniform:0.1,0.2", "slow=fixed:1"]
    )]
    latencies: Vec<String>,
    /// RaLMSpec configurations to compare with ralm-seq, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "ralmspec,ralmspec-p,ralmspec-s,ralmspec-a,ralmspec-psa"
    )]
    configs: Vec<Config>,
    /// Most generated tokens (the paper's 128).
    #[arg(long, default_value_t = RalmSettings::default().max_new_tokens)]
    max_new_tokens: usize,
    /// Generated tokens between retrievals (the paper's 4).
    #[arg(long, default_value_t = RalmSettings::default().interval)]
    interval: usize,
    /// How weights are held: as_stored, q8_0, f32 or fast (the fastest on CPU: see WeightFormat).
    #[arg(long, default_value = "fast")]
    weights: WeightFormat,
    /// Directory for report.json.
    #[arg(long, default_value = "run/ralmspec-eval")]
    out: PathBuf,
    /// Seeds the latency draws.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print every run as it finishes.
    #[arg(long)]
    verbose: bool,
}

/// The paper's Table 1 rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Config {
    /// Constant stride 3, no prefetching, synchronous verification.
    Ralmspec,
    /// + prefetching (top 20 of each exact retrieval into the cache).
    RalmspecP,
    /// + OS3 (stride chosen from measured latencies and acceptance).
    RalmspecS,
    /// + asynchronous verification.
    RalmspecA,
    /// All three.
    RalmspecPsa,
}

impl Config {
    pub fn name(self) -> &'static str {
        match self {
            Self::Ralmspec => "ralmspec",
            Self::RalmspecP => "ralmspec+p",
            Self::RalmspecS => "ralmspec+s",
            Self::RalmspecA => "ralmspec+a",
            Self::RalmspecPsa => "ralmspec+psa",
        }
    }

    fn settings(self) -> SpeculationSettings {
        let base = SpeculationSettings::default();
        match self {
            Self::Ralmspec => base,
            Self::RalmspecP => SpeculationSettings {
                prefetch: 20,
                ..base
            },
            Self::RalmspecS => SpeculationSettings {
                stride: Stride::Os3(Os3Settings::default()),
                ..base
            },
            Self::RalmspecA => SpeculationSettings {
                asynchronous: true,
                ..base
            },
            Self::RalmspecPsa => SpeculationSettings::all_techniques(),
        }
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let mut configs: Vec<Config> = Vec::new();
    for config in &args.configs {
        if !configs.contains(config) {
            configs.push(*config);
        }
    }
    if configs.is_empty() {
        bail!("--configs names no configuration");
    }
    let latencies: Vec<(String, Latency)> = args
        .latencies
        .iter()
        .map(|spec| {
            let (name, model) = spec
                .split_once('=')
                .with_context(|| format!("--latency {spec:?}: expected NAME=SPEC"))?;
            Ok((
                name.to_owned(),
                Latency::parse(model).with_context(|| format!("--latency {spec:?}"))?,
            ))
        })
        .collect::<Result<_>>()?;
    let settings = RalmSettings {
        interval: args.interval,
        max_new_tokens: args.max_new_tokens,
        ..RalmSettings::default()
    };

    let mut questions = Vec::new();
    for input in &args.inputs {
        let dataset = report::dataset_name(input);
        for question in read_questions(input, Some(args.limit as usize), false)? {
            questions.push((dataset.clone(), question.question));
        }
    }
    let encoder = TextEncoder::load(&args.model_dir)
        .with_context(|| format!("loading the encoder from {}", args.model_dir.display()))?;
    let passages = PassageRetriever::load(&args.bundle)?;
    let device = DeviceKind::Cpu.open()?;
    let model = LanguageModel::load_with(&args.model, &device, args.weights)
        .with_context(|| format!("loading {}", args.model.display()))?;
    eprintln!(
        "{} questions, {} passages in {}, model {}, {} weights, {} threads; latencies: {}",
        questions.len(),
        passages.passages(),
        args.bundle.display(),
        model.name(),
        args.weights,
        candle_core::utils::get_num_threads(),
        args.latencies.join(", ")
    );

    let query_encoder = &encoder;
    let mut runs = Vec::new();
    for (setting_index, (setting, latency)) in latencies.iter().enumerate() {
        let cloud = EmulatedCloud::new(
            &passages,
            latency.clone(),
            args.seed.wrapping_add(setting_index as u64),
        );
        let bar = hasten_bench::progress_bar(setting, questions.len());
        for (index, (dataset, question)) in questions.iter().enumerate() {
            bar.set_message("ralm-seq");
            let generator = RalmGenerator::new(&model, question, settings.clone())?;
            let started = Instant::now();
            let sequential = run_sequential(&generator, query_encoder, &cloud)
                .with_context(|| format!("{setting}: question {index}: ralm-seq"))?;
            let seq_seconds = started.elapsed().as_secs_f64();
            runs.push(Run::new(
                setting,
                dataset,
                index,
                "ralm-seq",
                seq_seconds,
                &sequential,
                true,
            ));
            for turn in 0..configs.len() {
                let config = configs[(index + turn) % configs.len()];
                bar.set_message(config.name());
                let generator = RalmGenerator::new(&model, question, settings.clone())?;
                let started = Instant::now();
                let output: RalmOutput = run_speculative(
                    &generator,
                    query_encoder,
                    &cloud,
                    &mut LocalDocumentCache::new(),
                    &config.settings(),
                )
                .with_context(|| format!("{setting}: question {index}: {}", config.name()))?;
                let seconds = started.elapsed().as_secs_f64();
                let identical = output.tokens == sequential.tokens;
                if args.verbose || !identical {
                    bar.suspend(|| {
                        eprintln!(
                            "{setting} q{index} {}: {seconds:.2} s vs {seq_seconds:.2} s, \
                         identical {identical}, {:?}",
                            config.name(),
                            output.speculation
                        )
                    });
                }
                runs.push(Run::new(
                    setting,
                    dataset,
                    index,
                    config.name(),
                    seconds,
                    &output,
                    identical,
                ));
            }
            if args.verbose {
                bar.suspend(|| {
                    eprintln!(
                        "{setting} q{index} ralm-seq {seq_seconds:.2} s, {} steps: {}",
                        sequential.documents.len(),
                        sequential.text.replace('\n', " ")
                    )
                });
            }
            bar.inc(1);
        }
        bar.finish_and_clear();
    }

    let summary = summarise(&runs, &latencies, &configs);
    print_table(&summary);
    let report = serde_json::json!({
        "model": model.name(),
        "weights": args.weights.to_string(),
        "bundle": args.bundle.display().to_string(),
        "passages": passages.passages(),
        "inputs": args.inputs.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        "ralm": settings,
        "threads": candle_core::utils::get_num_threads(),
        "settings": summary,
        "runs": runs,
    });
    let path = hasten_bench::save_report(&args.out, &report)?;
    eprintln!("report written to {}", path.display());
    Ok(())
}
