//! `cloud-index build`: its flags, and a corpus encoded into a bundle (cut into shard
//! bundles with `--shards`).

use std::path::PathBuf;
use std::time::Instant;

use crate::progress::EncodeProgress;
use anyhow::{Context, Result};
use clap::Args;
use hasten_core::bundle::{CorpusBundle, ImportedVectors, build_bundle, write_shards};
use hasten_core::corpus::{Corpus, CorpusFiles, SyntheticSpec};
use hasten_core::encoder::{DEFAULT_MODEL_DIR, EncoderRuntime, TextEncoder};
use hasten_core::logging::LogFormat;

#[derive(Args)]
pub(crate) struct BuildArgs {
    #[command(flatten)]
    corpus: CorpusFiles,
    /// Add the synthetic knowledge base with this many entities (the default corpus when no
    /// file is given has 300).
    #[arg(long)]
    synthetic_entities: Option<usize>,
    /// Seed of the synthetic knowledge base.
    #[arg(long, default_value_t = 7)]
    synthetic_seed: u64,
    /// Passages with vectors computed elsewhere (by all-MiniLM-L6-v2): JSON lines of
    /// {"title", "text", "vector"} (gzipped or not), or a float32 .npy of shape (n, d)
    /// paired with --import-passages; they join the corpus without being encoded
    /// (repeatable).
    #[arg(long)]
    import_vectors: Vec<PathBuf>,
    /// For each .npy of --import-vectors, in order: its n passages as JSON lines
    /// ({"title", "text"}) in row order.
    #[arg(long)]
    import_passages: Vec<PathBuf>,
    /// Passages of each imported file re-encoded to check that its vectors come from the
    /// encoder's model (a file that disagrees is refused).
    #[arg(long, default_value_t = 16)]
    import_check_sample: usize,
    /// Output bundle directory.
    #[arg(long)]
    out: PathBuf,
    /// Where sources given as http(s):// URLs (any file flag above takes one) are
    /// downloaded, resuming an interrupted download; `<out>.downloads` when absent.
    #[arg(long)]
    download_dir: Option<PathBuf>,
    /// Keep a bundle `--out` already holds and build nothing (a bootstrap run again after it
    /// finished; delete the bundle to rebuild).
    #[arg(long)]
    skip_existing: bool,
    /// Also partition the corpus by document id into this many shard bundles, written to
    /// <out>/shards/shard-<i>.
    #[arg(long)]
    shards: Option<u32>,
    /// Directory holding all-MiniLM-L6-v2 (config.json, tokenizer.json, model.safetensors).
    #[arg(long, env = "HASTEN_MODEL_DIR", default_value = DEFAULT_MODEL_DIR)]
    model_dir: PathBuf,
    /// Where passages are encoded: `cpu` (ONNX Runtime when the model directory has it,
    /// else candle) or `cuda` (candle on the first GPU; needs a build with the `cuda` feature).
    #[arg(long, value_enum, default_value_t = EncodeDevice::Cpu)]
    device: EncodeDevice,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum EncodeDevice {
    Cpu,
    Cuda,
}

impl EncodeDevice {
    fn runtime(self) -> EncoderRuntime {
        match self {
            Self::Cpu => EncoderRuntime::Auto,
            Self::Cuda => EncoderRuntime::Cuda,
        }
    }
}

/// Reads and checks every imported vector file; `.npy` files take their passages from
/// `passages` in order.
fn read_imports(
    files: &[PathBuf],
    passages: &[PathBuf],
    encoder: &TextEncoder,
    sample: usize,
) -> Result<Vec<ImportedVectors>> {
    let is_npy = |p: &PathBuf| p.extension().is_some_and(|e| e.eq_ignore_ascii_case("npy"));
    let npy_count = files.iter().filter(|p| is_npy(p)).count();
    if npy_count != passages.len() {
        anyhow::bail!(
            "--import-passages: {} given for {npy_count} .npy file(s) in --import-vectors; \
             each .npy needs the JSON-lines file of its passages",
            passages.len()
        );
    }
    let mut passages = passages.iter();
    let mut imports = Vec::with_capacity(files.len());
    for file in files {
        let imported = match (is_npy(file), passages.next()) {
            (true, Some(texts)) => ImportedVectors::read_npy(file, texts)?,
            _ => ImportedVectors::read_jsonl(file)?,
        };
        let least = imported.check_against(encoder, sample)?;
        tracing::info!(
            file = %file.display(),
            passages = imported.len(),
            sampled = sample.min(imported.len()),
            least_cosine = format!("{least:.5}"),
            "imported vectors agree with the encoder"
        );
        imports.push(imported);
    }
    Ok(imports)
}

pub(crate) async fn build(mut args: BuildArgs) -> Result<()> {
    hasten_core::logging::init(LogFormat::Text);
    if args.skip_existing
        && let Ok(manifest) = hasten_core::bundle::read_manifest(&args.out)
    {
        tracing::info!(
            out = %args.out.display(),
            corpus_version = %manifest.corpus_version,
            documents = manifest.documents,
            "the bundle exists; nothing to build"
        );
        return Ok(());
    }
    let downloads = match &args.download_dir {
        Some(dir) => dir.clone(),
        None => args.out.with_extension("downloads"),
    };
    for sources in [
        &mut args.corpus.squad,
        &mut args.corpus.hotpot,
        &mut args.corpus.wiki18,
        &mut args.corpus.wiki_articles,
        &mut args.corpus.entity_questions,
        &mut args.import_vectors,
        &mut args.import_passages,
    ] {
        hasten_cloud_index::download::localize(sources, &downloads).await?;
    }
    let sources = args
        .corpus
        .into_sources(args.synthetic_entities.map(|entities| SyntheticSpec {
            entities,
            seed: args.synthetic_seed,
        }));
    let encoder = TextEncoder::load_with(&args.model_dir, args.device.runtime())
        .with_context(|| format!("loading the encoder from {}", args.model_dir.display()))?;
    tracing::info!(runtime = encoder.runtime().name(), "encoder loaded");
    let imports = read_imports(
        &args.import_vectors,
        &args.import_passages,
        &encoder,
        args.import_check_sample,
    )?;
    // Imported passages alone make a corpus: no synthetic default then.
    let mut corpus = if sources.is_empty() && !imports.is_empty() {
        Corpus::default()
    } else {
        sources.load().context("loading the corpus")?
    };
    let mut known = Vec::new();
    for imported in imports {
        let (passages, vectors) = imported.into_parts();
        corpus.extend(passages);
        known.extend(vectors);
    }
    let started = Instant::now();
    let progress = EncodeProgress::new();
    let stats = build_bundle(&corpus, &encoder, &args.out, known, |encoded, total| {
        progress.update(encoded, total)
    })
    .with_context(|| format!("building the bundle at {}", args.out.display()))?;
    progress.finish();
    let shards = match args.shards {
        Some(count) => {
            let bundle = CorpusBundle::load(&args.out)
                .with_context(|| format!("reading back {}", args.out.display()))?;
            let dir = args.out.join("shards");
            write_shards(
                &dir,
                bundle.manifest.sources.clone(),
                &bundle.documents,
                bundle.vectors(),
                bundle.dimension(),
                count,
            )
            .with_context(|| format!("writing {count} shard bundles under {}", dir.display()))?;
            Some(dir)
        }
        None => None,
    };
    tracing::info!(
        out = %args.out.display(),
        documents = stats.manifest.documents,
        questions = stats.manifest.questions,
        encoded = stats.encoded,
        reused = stats.reused,
        imported = stats.imported,
        corpus_version = %stats.manifest.corpus_version,
        seconds = format!("{:.1}", started.elapsed().as_secs_f64()),
        "bundle ready"
    );
    println!(
        "{}",
        serde_json::to_string(&serde_json::json!({
            "out": args.out,
            "documents": stats.manifest.documents,
            "questions": stats.manifest.questions,
            "encoded": stats.encoded,
            "reused": stats.reused,
            "imported": stats.imported,
            "corpus_version": stats.manifest.corpus_version,
            "shards": shards,
        }))?
    );
    Ok(())
}
