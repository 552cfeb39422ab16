//! The offline commands: `preprocess` a bundle's chunk KV into the store, `update` it to
//! a new corpus version, `status` of a store, `sync` from a shared origin store.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::model::{Loaded, ModelArgs, StoreArgs, load_model, open_store};
use anyhow::{Context, Result, bail};
use clap::Args;
use hasten_core::bundle::CorpusBundle;
use hasten_kv_worker::preprocess::{Catalog, PlannedChunk, carry_over, run};
use hasten_kv_worker::progress::{PreprocessProgress, bar};
use hasten_kv_worker::prompt::chunk_tokens;
use hasten_kv_worker::store::{chunk_content, content_hash, sync_version};

#[derive(Args)]
pub(crate) struct PreprocessArgs {
    /// The corpus bundle (`cloud-index build --out`); its documents are the chunks.
    #[arg(long)]
    bundle: PathBuf,
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    store: StoreArgs,
    /// Neighbours each chunk's similarity-guided KV attends to (the paper's n).
    #[arg(long, default_value_t = 10)]
    top_n: usize,
    /// Only these chunk ids (one per line) and the Full Reuse KV of their neighbours.
    #[arg(long)]
    only: Option<PathBuf>,
    /// Only the bundle's first N chunks (and their neighbours' Full Reuse KV).
    #[arg(long)]
    limit: Option<usize>,
    /// Refuse a bundle of another corpus version.
    #[arg(long)]
    expect_version: Option<String>,
    /// Also write the outcome as one line of JSON (`done`, `total` chunks) to this file
    /// (a Job's termination message: /dev/termination-log).
    #[arg(long)]
    summary_file: Option<PathBuf>,
}

#[derive(Args)]
pub(crate) struct UpdateArgs {
    /// The new corpus bundle.
    #[arg(long)]
    bundle: PathBuf,
    /// The corpus version whose entries are carried over.
    #[arg(long)]
    from: String,
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    store: StoreArgs,
    /// Neighbours per chunk [default: the old version's].
    #[arg(long)]
    top_n: Option<usize>,
}

#[derive(Args)]
pub(crate) struct SyncArgs {
    /// The shared origin store (written by `kv-worker preprocess`).
    #[arg(long)]
    from: PathBuf,
    /// This worker's store.
    #[arg(long, env = "HASTEN_KV_STORE", default_value = "kv-store")]
    store: PathBuf,
    /// The corpus version to copy.
    #[arg(long)]
    version: String,
}

#[derive(Args)]
pub(crate) struct StatusArgs {
    /// The store's directory.
    #[arg(long, env = "HASTEN_KV_STORE", default_value = "kv-store")]
    store: PathBuf,
}

/// The bundle's documents as chunks (tokenized as prompts place them) and their vectors.
fn plan(loaded: &Loaded, bundle: &CorpusBundle) -> Result<Vec<PlannedChunk>> {
    let bar = bar("tokenizing", bundle.documents.len());
    let chunks = bundle
        .documents
        .iter()
        .map(|d| {
            bar.inc(1);
            Ok(PlannedChunk {
                id: d.id,
                hash: content_hash(&chunk_content(&d.title, &d.text)),
                tokens: chunk_tokens(loaded.engine.model(), &d.title, &d.text)?,
            })
        })
        .collect::<Result<Vec<_>>>();
    bar.finish_and_clear();
    chunks
}

fn load_bundle(dir: &Path) -> Result<CorpusBundle> {
    CorpusBundle::load(dir).with_context(|| format!("loading the bundle {}", dir.display()))
}

pub(crate) fn preprocess(args: PreprocessArgs) -> Result<()> {
    let bundle = load_bundle(&args.bundle)?;
    let corpus = bundle.manifest.corpus_version.clone();
    if let Some(expected) = &args.expect_version
        && *expected != corpus
    {
        bail!(
            "{} is corpus version {corpus}, not the expected {expected}",
            args.bundle.display()
        );
    }
    let loaded = load_model(&args.model)?;
    let store = open_store(&args.store, &loaded)?;
    let chunks = plan(&loaded, &bundle)?;
    let built = Catalog::build(
        loaded.model_id.clone(),
        &corpus,
        &chunks,
        bundle.vectors(),
        bundle.dimension(),
        args.top_n,
    )?;
    let path = Catalog::path(&args.store.store, &loaded.model_id, &corpus);
    match Catalog::load(&path)? {
        Some(existing) if existing != built => bail!(
            "{} was written for other settings (top_n {} here, {} there) or other texts; \
             use another --store, or remove that corpus version's directory",
            path.display(),
            args.top_n,
            existing.top_n
        ),
        Some(_) => {}
        None => built.save(&args.store.store)?,
    }
    let mut only: Option<BTreeSet<u64>> = match &args.only {
        Some(file) => Some(read_ids(file)?),
        None => None,
    };
    if let Some(limit) = args.limit {
        let first: BTreeSet<u64> = chunks.iter().take(limit).map(|c| c.id).collect();
        only = Some(match only {
            Some(ids) => ids.intersection(&first).copied().collect(),
            None => first,
        });
    }
    let texts: BTreeMap<u64, PlannedChunk> = chunks.into_iter().map(|c| (c.id, c)).collect();
    let started = Instant::now();
    let mut progress = PreprocessProgress::for_stderr();
    let report = run(
        &loaded.engine.model().decoder,
        loaded.engine.system(),
        &store,
        &built,
        &texts,
        only.as_ref(),
        |phase, done, total| {
            progress.update(phase, done, total);
            true
        },
    )?;
    progress.finish();
    let progress = built.progress(&args.store.store)?;
    if let Some(path) = &args.summary_file {
        let summary = serde_json::json!({
            "corpus_version": corpus,
            "done": progress.full_reuse.min(progress.similarity),
            "total": progress.chunks,
        });
        std::fs::write(path, format!("{summary}\n"))
            .with_context(|| format!("writing the summary to {}", path.display()))?;
    }
    println!(
        "{}",
        serde_json::to_string_pretty(&serde_json::json!({
            "store": args.store.store,
            "model_id": loaded.model_id,
            "corpus_version": corpus,
            "seconds": started.elapsed().as_secs_f64(),
            "full_reuse": {
                "computed": report.full_reuse.computed,
                "skipped": report.full_reuse.skipped,
                "seconds_per_chunk": report.full_reuse.seconds_per_chunk(),
            },
            "similarity": {
                "computed": report.similarity.computed,
                "skipped": report.similarity.skipped,
                "seconds_per_chunk": report.similarity.seconds_per_chunk(),
            },
            "progress": progress,
        }))?
    );
    Ok(())
}

fn read_ids(file: &Path) -> Result<BTreeSet<u64>> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("reading chunk ids from {}", file.display()))?;
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .enumerate()
        .map(|(n, line)| {
            line.parse::<u64>().with_context(|| {
                format!(
                    "{} line {}: `{line}` is not a chunk id",
                    file.display(),
                    n + 1
                )
            })
        })
        .collect()
}

pub(crate) fn update(args: UpdateArgs) -> Result<()> {
    let bundle = load_bundle(&args.bundle)?;
    let loaded = load_model(&args.model)?;
    let store = open_store(&args.store, &loaded)?;
    let old_path = Catalog::path(&args.store.store, &loaded.model_id, &args.from);
    let old = Catalog::load(&old_path)?.with_context(|| {
        format!(
            "no catalog of corpus version {} for this model at {}",
            args.from,
            old_path.display()
        )
    })?;
    let corpus = bundle.manifest.corpus_version.clone();
    if corpus == old.corpus {
        bail!("the bundle is corpus version {corpus} already");
    }
    let chunks = plan(&loaded, &bundle)?;
    let new = Catalog::build(
        loaded.model_id.clone(),
        &corpus,
        &chunks,
        bundle.vectors(),
        bundle.dimension(),
        args.top_n.unwrap_or(old.top_n),
    )?;
    new.save(&args.store.store)?;
    let invalidation = carry_over(&store, &old, &new)?;
    println!(
        "{}",
        serde_json::to_string_pretty(&serde_json::json!({
            "from": old.corpus,
            "to": corpus,
            "changed": invalidation.changed.len(),
            "removed": invalidation.removed.len(),
            "dependents": invalidation.dependents.len(),
            "carried": invalidation.carried,
            "progress": new.progress(&args.store.store)?,
        }))?
    );
    eprintln!(
        "run `kv-worker preprocess --bundle {}` to compute the rest",
        args.bundle.display()
    );
    Ok(())
}

pub(crate) fn status(args: StatusArgs) -> Result<()> {
    let mut rows = Vec::new();
    let models = std::fs::read_dir(&args.store)
        .with_context(|| format!("reading the store {}", args.store.display()))?;
    for model in models {
        let model = model?.path();
        if !model.is_dir() {
            continue;
        }
        for version in std::fs::read_dir(&model)? {
            let catalog = version?.path().join("catalog.json");
            if let Some(catalog) = Catalog::load(&catalog)? {
                rows.push(serde_json::json!({
                    "model_id": catalog.model,
                    "corpus_version": catalog.corpus,
                    "top_n": catalog.top_n,
                    "progress": catalog.progress(&args.store)?,
                }));
            }
        }
    }
    println!("{}", serde_json::to_string_pretty(&rows)?);
    Ok(())
}

pub(crate) fn sync(args: SyncArgs) -> Result<()> {
    let bar = bar("syncing", 0);
    let report = sync_version(&args.from, &args.store, &args.version, |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })
    .with_context(|| {
        format!(
            "copying corpus version {} from {} into {}",
            args.version,
            args.from.display(),
            args.store.display()
        )
    })?;
    bar.finish_and_clear();
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
