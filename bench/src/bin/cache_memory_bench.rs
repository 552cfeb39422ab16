//! `hasten-cache-memory-bench`: what a cached query costs an edge, in accounted bytes and in
//! resident memory, filled from real fallbacks.
//!
//! The bundle's questions are encoded and searched exactly (the cloud's answer to each);
//! then one tenant's cache, built as `edge-node serve` builds it (cache channel trained on
//! the bundle, documents shared with the edge's store), takes them one fallback at a time
//! up to its capacity and on past it, so that FIFO eviction runs. The process's resident
//! set is read from `/proc/self/statm` at checkpoints; the slope of resident memory over
//! cached queries while the cache fills, per 1,000 queries, is the figure, beside the
//! cache's own accounting (`cache_bytes` in `/status`). Each policy is measured in a fresh
//! cache in the same run: HaS (documents only) and the semantic cache (query vectors too).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Parser;
use hasten_bench::write_report;
use hasten_core::bundle::CorpusBundle;
use hasten_core::encoder::TextEncoder;
use hasten_core::index::ExactIndex;
use hasten_edge_node::caches::{Eviction, TenantCaches};
use hasten_edge_node::fallback::CloudDocument;
use hasten_edge_node::has::{CacheChannel, DocumentStore};
use hasten_edge_node::lookup::LookupKind;
use hasten_edge_node::tenants::Tenant;
use indicatif::{ProgressBar, ProgressStyle};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde_json::{Value, json};

#[derive(Parser)]
#[command(
    name = "hasten-cache-memory-bench",
    about = "Memory per cached query at the edge: accounted bytes and resident-set slope"
)]
struct Cli {
    /// Corpus bundle; its questions are the fallbacks cached.
    #[arg(long)]
    bundle: PathBuf,
    /// Cached queries per tenant (the edge's `cache_capacity`).
    #[arg(long, default_value_t = 5_000)]
    capacity: usize,
    /// Fallbacks inserted in all; beyond the capacity they evict.
    #[arg(long, default_value_t = 10_000)]
    fallbacks: usize,
    /// Documents kept per cached query (the edge's `validation_depth`).
    #[arg(long, default_value_t = 10)]
    depth: usize,
    /// Insertions between two resident-set readings.
    #[arg(long, default_value_t = 250)]
    every: usize,
    /// all-MiniLM-L6-v2 directory.
    #[arg(
        long,
        env = "HASTEN_MODEL_DIR",
        default_value = "models/all-MiniLM-L6-v2"
    )]
    model_dir: PathBuf,
    /// Working directory: report.json.
    #[arg(long, default_value = "run/cache-memory-bench")]
    work: PathBuf,
}

/// Training rows for the cache channel, as `edge-node serve` takes them.
const CACHE_TRAINING_ROWS: usize = 100_000;

/// Hands the allocator's free pages back to the kernel, so that what a cache allocates next
/// shows in the resident set instead of reusing pages freed by the setup (the encoder, the
/// exact index).
#[allow(unsafe_code)]
fn release_free_memory() {
    // SAFETY: malloc_trim only walks glibc's own arenas; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn resident_bytes() -> Result<usize> {
    let statm = std::fs::read_to_string("/proc/self/statm").context("reading /proc/self/statm")?;
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .context("/proc/self/statm has no resident field")?;
    Ok(pages * 4096)
}

/// Least-squares slope of `y` over `x`.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let (mx, my) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x / n, b + y / n));
    let (num, den) = points.iter().fold((0.0, 0.0), |(num, den), (x, y)| {
        (num + (x - mx) * (y - my), den + (x - mx) * (x - mx))
    });
    if den == 0.0 { 0.0 } else { num / den }
}

fn progress(len: usize, what: &str) -> Result<ProgressBar> {
    Ok(ProgressBar::new(len as u64)
        .with_message(what.to_string())
        .with_style(ProgressStyle::with_template(
            "{msg} {bar:30} {pos}/{len} {per_sec} eta {eta}",
        )?))
}

/// Each question's exact top-`depth` rows of the bundle, as the cloud would answer, in a
/// seeded random order (a bundle lists an entity's questions together, which would make
/// neighbours share documents more than a workload does).
fn fallbacks(cli: &Cli, bundle: &CorpusBundle) -> Result<Vec<(Vec<f32>, Vec<usize>)>> {
    let encoder = TextEncoder::load(&cli.model_dir)
        .with_context(|| format!("loading the encoder from {}", cli.model_dir.display()))?;
    let index = ExactIndex::build(bundle.dimension(), bundle.vectors())?;
    let mut questions: Vec<&str> = bundle
        .questions
        .iter()
        .map(|q| q.question.as_str())
        .collect();
    questions.shuffle(&mut StdRng::seed_from_u64(7));
    questions.truncate(cli.fallbacks);
    let bar = progress(questions.len(), "cloud answers")?;
    let mut out = Vec::with_capacity(questions.len());
    for batch in questions.chunks(256) {
        let vectors = encoder.encode(batch)?;
        let flat: Vec<f32> = vectors.iter().flatten().copied().collect();
        for (vector, hits) in vectors.into_iter().zip(index.search(&flat, cli.depth)?) {
            out.push((vector, hits.iter().map(|h| h.id as usize).collect()));
        }
        bar.inc(batch.len() as u64);
    }
    bar.finish();
    Ok(out)
}

fn measure(
    cli: &Cli,
    bundle: &CorpusBundle,
    documents: &Arc<DocumentStore>,
    channel: &CacheChannel,
    lookup: LookupKind,
    answers: &[(Vec<f32>, Vec<usize>)],
) -> Result<Value> {
    let tenant = Tenant::default_tenant();
    let caches = TenantCaches::new(
        lookup,
        std::slice::from_ref(&tenant),
        Eviction::Fifo(cli.capacity),
        channel,
        Arc::clone(documents),
        bundle.manifest.corpus_version.clone(),
        cli.depth,
    )?;
    release_free_memory();
    let start = resident_bytes()?;
    let mut checkpoints = Vec::new();
    let bar = progress(answers.len(), &format!("{lookup:?} fallbacks"))?;
    for (i, (vector, rows)) in answers.iter().enumerate() {
        let result: Vec<CloudDocument> = rows
            .iter()
            .map(|&row| {
                let doc = &bundle.documents[row];
                CloudDocument {
                    id: doc.id,
                    score: 0.0,
                    title: doc.title.clone(),
                    text: doc.text.clone(),
                    vector: bundle.vector(row).to_vec(),
                }
            })
            .collect();
        caches.insert_fallback(&tenant, Some(format!("q{i}")), vector.clone(), &result)?;
        if (i + 1) % cli.every == 0 || i + 1 == answers.len() {
            let stats = caches.total();
            checkpoints.push(json!({
                "inserted": i + 1,
                "queries": stats.queries,
                "documents": stats.documents,
                "accounted_bytes": stats.bytes,
                "resident_delta_bytes": resident_bytes()? as i64 - start as i64,
            }));
        }
        bar.inc(1);
    }
    bar.finish();
    let filling: Vec<&Value> = checkpoints
        .iter()
        .filter(|c| c["inserted"].as_u64() <= Some(cli.capacity as u64))
        .collect();
    let per_1k = |key: &str| {
        let points: Vec<(f64, f64)> = filling
            .iter()
            .map(|c| {
                (
                    c["queries"].as_f64().unwrap_or(0.0),
                    c[key].as_f64().unwrap_or(0.0),
                )
            })
            .collect();
        slope(&points) * 1000.0 / 1e6
    };
    let full = checkpoints.last().cloned().unwrap_or(Value::Null);
    let at_capacity = filling.last().map(|c| (*c).clone()).unwrap_or(Value::Null);
    let grown_after_full = full["resident_delta_bytes"].as_f64().unwrap_or(0.0)
        - at_capacity["resident_delta_bytes"].as_f64().unwrap_or(0.0);
    Ok(json!({
        "lookup": format!("{lookup:?}"),
        "accounted_mb_per_1k_queries": per_1k("accounted_bytes"),
        "resident_mb_per_1k_queries": per_1k("resident_delta_bytes"),
        "documents_per_query_at_capacity": at_capacity["documents"].as_f64().unwrap_or(0.0)
            / at_capacity["queries"].as_f64().unwrap_or(1.0).max(1.0),
        "resident_growth_mb_after_full": grown_after_full / 1e6,
        "at_capacity": at_capacity,
        "end": full,
        "checkpoints": checkpoints,
    }))
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    if cli.every == 0 || cli.capacity == 0 {
        bail!("--every and --capacity must be at least 1");
    }
    std::fs::create_dir_all(&cli.work)
        .with_context(|| format!("creating {}", cli.work.display()))?;
    let bundle = CorpusBundle::load(&cli.bundle)
        .with_context(|| format!("loading the bundle {}", cli.bundle.display()))?;
    if bundle.questions.len() < cli.fallbacks {
        eprintln!(
            "the bundle holds {} questions; inserting that many",
            bundle.questions.len()
        );
    }
    let answers = fallbacks(&cli, &bundle)?;
    let documents = Arc::new(DocumentStore::from_bundle(&bundle));
    let step = bundle.len().div_ceil(CACHE_TRAINING_ROWS).max(1);
    let sample: Vec<f32> = (0..bundle.len())
        .step_by(step)
        .flat_map(|row| bundle.vector(row).iter().copied())
        .collect();
    let channel = CacheChannel::train(bundle.dimension(), &sample, None, None)?;
    drop(sample);
    let mut runs = Vec::new();
    for lookup in [LookupKind::None, LookupKind::Semantic] {
        runs.push(measure(
            &cli, &bundle, &documents, &channel, lookup, &answers,
        )?);
    }
    write_report(
        &cli.work,
        &json!({
            "bundle": cli.bundle,
            "passages": bundle.len(),
            "capacity": cli.capacity,
            "fallbacks": answers.len(),
            "depth": cli.depth,
            "cache_channel": format!("{:?}", channel.shape()),
            "runs": runs,
        }),
    )
}
