//! Per-run records, the per-setting summary (the paper's Table 1 layout) and its table.

use std::collections::BTreeMap;
use std::path::Path;

use hasten_bench::mean;
use hasten_spec_retrieval::ralm::{RalmOutput, SpeculationStats};
use serde::Serialize;

use crate::Config;
use hasten_bench::latency::Latency;

/// One system's run on one question.
#[derive(Debug, Serialize)]
pub struct Run {
    pub setting: String,
    pub dataset: String,
    pub question: usize,
    pub system: String,
    pub seconds: f64,
    pub tokens: usize,
    pub steps: usize,
    pub identical_to_sequential: bool,
    pub generation_s: f64,
    pub retrieval_wait_s: f64,
    pub speculation: Option<SpeculationStats>,
}

impl Run {
    pub fn new(
        setting: &str,
        dataset: &str,
        question: usize,
        system: &str,
        seconds: f64,
        output: &RalmOutput,
        identical: bool,
    ) -> Self {
        Self {
            setting: setting.to_owned(),
            dataset: dataset.to_owned(),
            question,
            system: system.to_owned(),
            seconds,
            tokens: output.tokens.len(),
            steps: output.documents.len(),
            identical_to_sequential: identical,
            generation_s: output.timings.generation.as_secs_f64(),
            retrieval_wait_s: output.timings.retrieval_wait.as_secs_f64(),
            speculation: output.speculation.clone(),
        }
    }
}

/// One system under one latency setting.
#[derive(Debug, Serialize)]
pub struct SystemSummary {
    pub queries: usize,
    pub mean_s: f64,
    /// Mean `ralm-seq` latency over mean latency (1 for `ralm-seq` itself).
    pub speedup: f64,
    /// Whether every question's tokens equal the sequential run's.
    pub identical_to_sequential: bool,
    pub generation_s: f64,
    pub retrieval_wait_s: f64,
    /// Per dataset: mean `ralm-seq` latency over this system's.
    pub speedup_by_dataset: BTreeMap<String, f64>,
    /// Accepted over speculated retrievals (RaLMSpec only).
    pub acceptance: Option<f64>,
    pub exact_calls_per_query: f64,
    pub rollbacks_per_query: Option<f64>,
    pub mean_stride: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct SettingSummary {
    pub latency: String,
    pub systems: BTreeMap<String, SystemSummary>,
}

pub fn summarise(
    runs: &[Run],
    latencies: &[(String, Latency)],
    configs: &[Config],
) -> BTreeMap<String, SettingSummary> {
    let mut out = BTreeMap::new();
    for (setting, latency) in latencies {
        let of = |system: &str| -> Vec<&Run> {
            runs.iter()
                .filter(|r| &r.setting == setting && r.system == system)
                .collect()
        };
        let sequential = of("ralm-seq");
        let seq_mean = mean(sequential.iter().map(|r| r.seconds));
        let datasets: Vec<&str> = {
            let mut names: Vec<&str> = sequential.iter().map(|r| r.dataset.as_str()).collect();
            names.dedup();
            names
        };
        let mut systems = BTreeMap::new();
        let names = std::iter::once("ralm-seq").chain(configs.iter().map(|c| c.name()));
        for name in names {
            let own = of(name);
            let mean_s = mean(own.iter().map(|r| r.seconds));
            let speedup_by_dataset = datasets
                .iter()
                .map(|dataset| {
                    let seq = mean(
                        sequential
                            .iter()
                            .filter(|r| r.dataset == *dataset)
                            .map(|r| r.seconds),
                    );
                    let this = mean(
                        own.iter()
                            .filter(|r| r.dataset == *dataset)
                            .map(|r| r.seconds),
                    );
                    ((*dataset).to_owned(), seq / this.max(f64::MIN_POSITIVE))
                })
                .collect();
            let stats: Vec<&SpeculationStats> =
                own.iter().filter_map(|r| r.speculation.as_ref()).collect();
            let speculated: usize = stats.iter().map(|s| s.speculated).sum();
            let accepted: usize = stats.iter().map(|s| s.accepted).sum();
            let strides: Vec<usize> = stats.iter().flat_map(|s| s.strides.clone()).collect();
            let exact_calls = mean(own.iter().map(|r| {
                r.speculation
                    .as_ref()
                    .map_or(r.steps as f64, |s| s.exact_calls as f64)
            }));
            systems.insert(
                name.to_owned(),
                SystemSummary {
                    queries: own.len(),
                    mean_s,
                    speedup: seq_mean / mean_s.max(f64::MIN_POSITIVE),
                    identical_to_sequential: own.iter().all(|r| r.identical_to_sequential),
                    generation_s: mean(own.iter().map(|r| r.generation_s)),
                    retrieval_wait_s: mean(own.iter().map(|r| r.retrieval_wait_s)),
                    speedup_by_dataset,
                    acceptance: (speculated > 0).then(|| accepted as f64 / speculated as f64),
                    exact_calls_per_query: exact_calls,
                    rollbacks_per_query: (!stats.is_empty())
                        .then(|| mean(stats.iter().map(|s| s.rollbacks as f64))),
                    mean_stride: (!strides.is_empty())
                        .then(|| mean(strides.iter().map(|&s| s as f64))),
                },
            );
        }
        out.insert(
            setting.clone(),
            SettingSummary {
                latency: format!("{latency:?}"),
                systems,
            },
        );
    }
    out
}

pub fn print_table(summary: &BTreeMap<String, SettingSummary>) {
    for (setting, s) in summary {
        println!("\n{setting} ({})", s.latency);
        println!(
            "| system | queries | mean s | speed-up | identical | generation s | retrieval wait s | exact calls / q | acceptance | rollbacks / q | mean stride |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|---|");
        for (name, r) in &s.systems {
            let opt = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.2}"));
            println!(
                "| {name} | {} | {:.2} | {:.2}x | {} | {:.2} | {:.2} | {:.1} | {} | {} | {} |",
                r.queries,
                r.mean_s,
                r.speedup,
                r.identical_to_sequential,
                r.generation_s,
                r.retrieval_wait_s,
                r.exact_calls_per_query,
                opt(r.acceptance),
                opt(r.rollbacks_per_query),
                opt(r.mean_stride),
            );
        }
    }
}

/// A dataset's name from its file: `nq-open-dev.jsonl` -> `nq-open-dev`.
pub fn dataset_name(path: &Path) -> String {
    path.file_stem().map_or_else(
        || path.display().to_string(),
        |s| s.to_string_lossy().into_owned(),
    )
}
