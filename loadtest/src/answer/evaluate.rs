//! An answer evaluation: the cloud tier once, then for each offered load and each system
//! fresh KV workers and edges behind the emulated network, the same questions at the same
//! arrival times through every one, streamed as chat completions.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use super::exchange::ChatAnswer;
use super::report::{AnswerSystemReport, load_label};
use super::summary::{AnswerRecord, paired_difference, summarize};
use super::systems::{AnswerSystem, BASELINE};
use crate::driver::{self, DriverSettings, LoadModel};
use crate::experiment::{
    CloudTier, ClusterSettings, EdgeSpec, EvalError, START_TIMEOUT, start_edges, write_records,
};
use crate::workload::{WorkloadQuery, first_occurrences};
use hasten_eval::process::{ManagedProcess, binary, kv_worker_serve_args};

/// The KV workers every system answers on.
#[derive(Clone, Debug)]
pub struct WorkerSettings {
    pub count: usize,
    /// The GGUF model whose chunk KV the store holds (the answering model).
    pub model: PathBuf,
    /// The store `kv-worker preprocess` filled for the bundle (shared by the workers).
    pub store: PathBuf,
    /// Each worker's RAM for chunk KV, bytes (the worker's default when absent).
    pub ram_budget: Option<u64>,
    /// The share of chunk tokens FusionRAG recomputes on systems that use it.
    pub fusion_ratio: f64,
    /// The workers' `exact_leading_chunk` (their default when absent).
    pub exact_leading_chunk: Option<bool>,
    /// The workers' `recompute_whole_chunks` (their default when absent).
    pub recompute_whole_chunks: Option<usize>,
    /// Flags given to every worker after the ones above (`--worker-arg`).
    pub extra_args: Vec<String>,
}

/// How each question is asked and judged.
#[derive(Clone, Debug)]
pub struct AskSettings {
    pub k: usize,
    pub max_tokens: usize,
    /// An answer is good when its first text comes within this (goodput).
    pub ttft_slo: Duration,
}

/// Starts the workers one system answers on; their gRPC addresses.
fn start_workers(
    settings: &WorkerSettings,
    run: usize,
    work: &std::path::Path,
) -> Result<(Vec<ManagedProcess>, Vec<String>), EvalError> {
    let mut workers = Vec::new();
    let mut addrs = Vec::new();
    for w in 0..settings.count.max(1) {
        let mut args = kv_worker_serve_args(&settings.model, &settings.store);
        if let Some(bytes) = settings.ram_budget {
            args.extend(["--set".into(), format!("ram_budget={bytes}")]);
        }
        if let Some(exact) = settings.exact_leading_chunk {
            args.extend(["--set".into(), format!("exact_leading_chunk={exact}")]);
        }
        if let Some(chunks) = settings.recompute_whole_chunks {
            args.extend(["--set".into(), format!("recompute_whole_chunks={chunks}")]);
        }
        args.extend(settings.extra_args.iter().cloned());
        let worker = tokio::task::block_in_place(|| {
            ManagedProcess::start(
                &format!("kv-worker-{run:02}-{w}"),
                &binary("kv-worker")?,
                &args,
                work,
                START_TIMEOUT,
            )
        })?;
        addrs.push(worker.addr("grpc_addr"));
        workers.push(worker);
    }
    Ok((workers, addrs))
}

fn record_json(record: &AnswerRecord) -> serde_json::Value {
    let (text, ttft, retrieval, error) = match &record.result {
        Ok(reply) => (
            Some(reply.text.as_str()),
            reply.first_text.map(|t| t.as_secs_f64()),
            reply.retrieval.as_deref(),
            None,
        ),
        Err(error) => (None, None, None, Some(error.as_str())),
    };
    serde_json::json!({
        "seq": record.question.seq,
        "edge": record.edge,
        "question": record.question.question,
        "gold": record.question.answers,
        "answer": text,
        "ttft_s": ttft,
        "latency_s": record.latency.as_secs_f64(),
        "retrieval": retrieval,
        "error": error,
    })
}

/// One system at one offered load: its records and its report (unpaired).
#[allow(clippy::too_many_arguments)]
async fn run_one(
    system: &AnswerSystem,
    run: usize,
    cloud: &CloudTier,
    cluster: &ClusterSettings,
    workers: &WorkerSettings,
    ask: &AskSettings,
    workload: &[WorkloadQuery],
    driver_settings: &DriverSettings,
    progress: impl Fn(usize) + Send + Sync + 'static,
) -> Result<(Vec<AnswerRecord>, AnswerSystemReport), EvalError> {
    let (_workers, worker_addrs) = start_workers(workers, run, &cluster.work)?;
    let mut args = system.edge_args(workers.fusion_ratio);
    for addr in &worker_addrs {
        args.extend(["--kv-worker".into(), addr.clone()]);
    }
    let spec = EdgeSpec {
        name: system.name,
        args: &args,
        replicated: system.replicated(),
    };
    let edges = start_edges(&spec, run, cloud, cluster).await?;
    let exchange = ChatAnswer {
        k: ask.k,
        max_tokens: ask.max_tokens,
    };
    let outcome =
        driver::run_exchange(workload, &edges.urls, exchange, driver_settings, progress).await;
    drop(edges);
    write_records(
        cluster.work.join(format!("answers-{run}.jsonl")),
        outcome.records.iter().map(record_json),
    )?;
    let first = first_occurrences_of(&outcome.records, &first_occurrences(workload));
    let report = AnswerSystemReport {
        name: system.name.to_string(),
        system: *system,
        load: driver_settings.load,
        all: summarize(&outcome.records, outcome.wall, ask.ttft_slo),
        first_occurrence: summarize(&first, outcome.wall, ask.ttft_slo),
        paired_vs_baseline: None,
        paired_first_occurrence: None,
        ttfts_s: sorted_ttfts(&outcome.records),
    };
    Ok((outcome.records, report))
}

/// The records of questions no earlier question asked word for word.
fn first_occurrences_of(records: &[AnswerRecord], firsts: &HashSet<usize>) -> Vec<AnswerRecord> {
    records
        .iter()
        .filter(|r| firsts.contains(&r.question.seq))
        .cloned()
        .collect()
}

fn sorted_ttfts(records: &[AnswerRecord]) -> Vec<f64> {
    let mut ttfts: Vec<f64> = records
        .iter()
        .filter_map(|r| {
            let reply = r.result.as_ref().ok()?;
            Some(reply.first_text.unwrap_or(r.latency).as_secs_f64())
        })
        .collect();
    ttfts.sort_by(f64::total_cmp);
    ttfts
}

/// Runs every system at every load over `workload`; `progress(label, total)` gives each
/// run's progress callback.
#[allow(clippy::too_many_arguments)]
pub async fn evaluate<P, F>(
    systems: &[AnswerSystem],
    loads: &[LoadModel],
    cloud: &CloudTier,
    cluster: &ClusterSettings,
    workers: &WorkerSettings,
    ask: &AskSettings,
    workload: &[WorkloadQuery],
    driver_settings: &DriverSettings,
    progress: P,
) -> Result<Vec<AnswerSystemReport>, EvalError>
where
    P: Fn(&str) -> F,
    F: Fn(usize) + Send + Sync + 'static,
{
    let firsts: HashSet<usize> = first_occurrences(workload);
    let mut reports = Vec::new();
    for (l, load) in loads.iter().enumerate() {
        let settings = DriverSettings {
            load: *load,
            ..driver_settings.clone()
        };
        let mut at_load: Vec<(Vec<AnswerRecord>, AnswerSystemReport)> = Vec::new();
        for (s, system) in systems.iter().enumerate() {
            let label = format!("{} {}", system.name, load_label(load));
            let run = l * systems.len() + s;
            let done = run_one(
                system,
                run,
                cloud,
                cluster,
                workers,
                ask,
                workload,
                &settings,
                progress(&label),
            )
            .await?;
            tracing::info!(system = system.name, load = %load_label(load), summary = ?done.1.all.ttft_s, "answer run done");
            at_load.push(done);
        }
        let baseline = at_load
            .iter()
            .find(|(_, r)| r.name == BASELINE)
            .map(|(records, _)| records.clone());
        for (records, mut report) in at_load {
            if let Some(baseline) = &baseline {
                report.paired_vs_baseline = Some(paired_difference(&records, baseline));
                let first = first_occurrences_of(&records, &firsts);
                report.paired_first_occurrence = Some(paired_difference(&first, baseline));
            }
            reports.push(report);
        }
    }
    Ok(reports)
}
