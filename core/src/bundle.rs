//! The corpus bundle: a corpus encoded once into a directory that cloud shards and edges load.
//!
//! ```text
//! <bundle>/manifest.json    model id, dimension, counts, corpus version, sources
//! <bundle>/documents.jsonl  one Document per line, in vector order
//! <bundle>/vectors.f32      documents x dimension little-endian f32, L2-normalised
//! <bundle>/questions.jsonl  questions with gold answers and entity, for workloads
//! ```
//!
//! A sharded corpus is S such bundles, one per partition (documents with `id % S == i`),
//! each with its own manifest naming its shard; all carry the corpus version of the whole
//! corpus, so a router can refuse shards cut from different corpora.
//!
//! A build writes into a sibling directory and renames it into place, so a crash never
//! leaves a half-written bundle under the final name.

use std::collections::HashMap;
use std::io::{BufRead, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::corpus::{Corpus, Document, Question};
use crate::encoder::{EncoderError, MODEL_ID, TextEncoder};

/// Version of the on-disk layout; bump when the files change incompatibly.
pub const FORMAT_VERSION: u32 = 1;

const MANIFEST: &str = "manifest.json";
const DOCUMENTS: &str = "documents.jsonl";
const VECTORS: &str = "vectors.f32";
const QUESTIONS: &str = "questions.jsonl";

/// Passages encoded between two progress reports; also bounds the memory held by
/// not-yet-written vectors to this many rows.
const ENCODE_CHUNK: usize = 512;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleManifest {
    pub format_version: u32,
    pub model_id: String,
    pub dimension: usize,
    pub documents: usize,
    pub questions: usize,
    /// Content hash of the documents (titles and texts, in order): two bundles with the same
    /// version hold the same corpus.
    pub corpus_version: String,
    pub sources: Vec<String>,
    /// Set on a shard bundle: which partition of the corpus it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<ShardOf>,
}

/// A shard bundle's place in its corpus.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardOf {
    /// 0-based partition number: the shard holds the documents with `id % count == index`.
    pub index: u32,
    /// Number of partitions of the corpus.
    pub count: u32,
    /// Documents in the whole corpus.
    pub corpus_documents: usize,
}

impl ShardOf {
    /// The shard of a document id among `count` partitions.
    pub fn of_document(id: u64, count: u32) -> u32 {
        (id % u64::from(count.max(1))) as u32
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}: invalid JSON: {source}")]
    Json {
        path: PathBuf,
        line: usize,
        source: serde_json::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("encoding failed: {0}")]
    Encoder(#[from] EncoderError),
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> BundleError + '_ {
    move |source| BundleError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A loaded bundle: documents, their vectors and the question set.
#[derive(Debug)]
pub struct CorpusBundle {
    pub manifest: BundleManifest,
    pub documents: Vec<Document>,
    pub questions: Vec<Question>,
    vectors: Vec<f32>,
}

impl CorpusBundle {
    /// Loads and checks a bundle directory.
    pub fn load(dir: &Path) -> Result<Self, BundleError> {
        let manifest = read_manifest(dir)?;
        if manifest.format_version != FORMAT_VERSION {
            return Err(BundleError::Invalid {
                path: dir.join(MANIFEST),
                message: format!(
                    "bundle format {} is not supported (this build reads format {FORMAT_VERSION}); rebuild the bundle",
                    manifest.format_version
                ),
            });
        }
        let documents: Vec<Document> = read_jsonl(&dir.join(DOCUMENTS))?;
        let questions: Vec<Question> = read_jsonl(&dir.join(QUESTIONS))?;
        let vectors_path = dir.join(VECTORS);
        let vectors = read_vectors(&vectors_path, manifest.documents * manifest.dimension)?;
        if documents.len() != manifest.documents {
            return Err(BundleError::Invalid {
                path: dir.join(DOCUMENTS),
                message: format!(
                    "{} documents, the manifest says {}",
                    documents.len(),
                    manifest.documents
                ),
            });
        }
        Ok(Self {
            manifest,
            documents,
            questions,
            vectors,
        })
    }

    pub fn dimension(&self) -> usize {
        self.manifest.dimension
    }

    pub fn len(&self) -> usize {
        self.documents.len()
    }

    pub fn is_empty(&self) -> bool {
        self.documents.is_empty()
    }

    /// All vectors, row-major, one row per document.
    pub fn vectors(&self) -> &[f32] {
        &self.vectors
    }

    /// The vector of the document at `row`.
    pub fn vector(&self, row: usize) -> &[f32] {
        let d = self.manifest.dimension;
        &self.vectors[row * d..(row + 1) * d]
    }
}

/// Reads only the manifest of a bundle.
pub fn read_manifest(dir: &Path) -> Result<BundleManifest, BundleError> {
    let path = dir.join(MANIFEST);
    let text = std::fs::read_to_string(&path).map_err(io_error(&path))?;
    serde_json::from_str(&text).map_err(|source| BundleError::Json {
        path,
        line: 0,
        source,
    })
}

fn read_jsonl<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Vec<T>, BundleError> {
    let file = std::fs::File::open(path).map_err(io_error(path))?;
    let mut out = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(io_error(path))?;
        if line.is_empty() {
            continue;
        }
        out.push(
            serde_json::from_str(&line).map_err(|source| BundleError::Json {
                path: path.to_path_buf(),
                line: i + 1,
                source,
            })?,
        );
    }
    Ok(out)
}

fn read_vectors(path: &Path, expected: usize) -> Result<Vec<f32>, BundleError> {
    let mut file = std::fs::File::open(path).map_err(io_error(path))?;
    let len = file.metadata().map_err(io_error(path))?.len();
    if len != (expected * 4) as u64 {
        return Err(BundleError::Invalid {
            path: path.to_path_buf(),
            message: format!(
                "{len} bytes, expected {} (documents x dimension x 4)",
                expected * 4
            ),
        });
    }
    let mut vectors = vec![0f32; expected];
    // The file is little-endian f32 and every supported target is little-endian.
    file.read_exact(bytemuck::cast_slice_mut(&mut vectors))
        .map_err(io_error(path))?;
    Ok(vectors)
}

/// Writes a bundle from documents and their vectors (already encoded), atomically.
pub fn write_bundle(
    out: &Path,
    manifest_sources: Vec<String>,
    documents: &[Document],
    vectors: &[f32],
    dimension: usize,
    questions: &[Question],
) -> Result<BundleManifest, BundleError> {
    if vectors.len() != documents.len() * dimension {
        return Err(BundleError::Invalid {
            path: out.to_path_buf(),
            message: format!(
                "{} vector values for {} documents of dimension {dimension}",
                vectors.len(),
                documents.len()
            ),
        });
    }
    let manifest = BundleManifest {
        format_version: FORMAT_VERSION,
        model_id: MODEL_ID.to_string(),
        dimension,
        documents: documents.len(),
        questions: questions.len(),
        corpus_version: corpus_version(documents),
        sources: manifest_sources,
        shard: None,
    };
    write_bundle_dir(out, &manifest, documents, vectors, questions)?;
    Ok(manifest)
}

/// Partitions a corpus into `shards` bundles `<out_dir>/shard-<i>` by document id
/// (`id % shards`), each holding its documents in corpus order with their vectors, and
/// every manifest carrying the whole corpus's version. Questions stay with the full bundle.
pub fn write_shards(
    out_dir: &Path,
    manifest_sources: Vec<String>,
    documents: &[Document],
    vectors: &[f32],
    dimension: usize,
    shards: u32,
) -> Result<Vec<BundleManifest>, BundleError> {
    if shards == 0 || vectors.len() != documents.len() * dimension {
        return Err(BundleError::Invalid {
            path: out_dir.to_path_buf(),
            message: format!(
                "cannot cut {} documents ({} vector values, dimension {dimension}) into {shards} shards",
                documents.len(),
                vectors.len()
            ),
        });
    }
    let version = corpus_version(documents);
    std::fs::create_dir_all(out_dir).map_err(io_error(out_dir))?;
    (0..shards)
        .map(|index| {
            let rows: Vec<usize> = (0..documents.len())
                .filter(|&row| ShardOf::of_document(documents[row].id, shards) == index)
                .collect();
            let shard_documents: Vec<Document> =
                rows.iter().map(|&row| documents[row].clone()).collect();
            let mut shard_vectors = Vec::with_capacity(rows.len() * dimension);
            for &row in &rows {
                shard_vectors.extend_from_slice(&vectors[row * dimension..(row + 1) * dimension]);
            }
            let manifest = BundleManifest {
                format_version: FORMAT_VERSION,
                model_id: MODEL_ID.to_string(),
                dimension,
                documents: shard_documents.len(),
                questions: 0,
                corpus_version: version.clone(),
                sources: manifest_sources.clone(),
                shard: Some(ShardOf {
                    index,
                    count: shards,
                    corpus_documents: documents.len(),
                }),
            };
            let out = out_dir.join(format!("shard-{index}"));
            write_bundle_dir(&out, &manifest, &shard_documents, &shard_vectors, &[])?;
            Ok(manifest)
        })
        .collect()
}

/// Writes a bundle's files into a staging sibling of `out` and renames it into place.
fn write_bundle_dir(
    out: &Path,
    manifest: &BundleManifest,
    documents: &[Document],
    vectors: &[f32],
    questions: &[Question],
) -> Result<(), BundleError> {
    let staging = sibling(out, "building");
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(io_error(&staging))?;
    }
    std::fs::create_dir_all(&staging).map_err(io_error(&staging))?;
    write_jsonl(&staging.join(DOCUMENTS), documents)?;
    write_jsonl(&staging.join(QUESTIONS), questions)?;
    let vectors_path = staging.join(VECTORS);
    std::fs::write(&vectors_path, bytemuck::cast_slice::<f32, u8>(vectors))
        .map_err(io_error(&vectors_path))?;
    let manifest_path = staging.join(MANIFEST);
    let manifest_json =
        serde_json::to_string_pretty(manifest).map_err(|source| BundleError::Json {
            path: manifest_path.clone(),
            line: 0,
            source,
        })?;
    std::fs::write(&manifest_path, manifest_json).map_err(io_error(&manifest_path))?;
    let retired = sibling(out, "old");
    if out.exists() {
        if retired.exists() {
            std::fs::remove_dir_all(&retired).map_err(io_error(&retired))?;
        }
        std::fs::rename(out, &retired).map_err(io_error(out))?;
    }
    std::fs::rename(&staging, out).map_err(io_error(out))?;
    if retired.exists() {
        std::fs::remove_dir_all(&retired).map_err(io_error(&retired))?;
    }
    Ok(())
}

fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{suffix}"));
    path.with_file_name(name)
}

fn write_jsonl<T: Serialize>(path: &Path, items: &[T]) -> Result<(), BundleError> {
    let file = std::fs::File::create(path).map_err(io_error(path))?;
    let mut writer = BufWriter::new(file);
    for item in items {
        serde_json::to_writer(&mut writer, item).map_err(|source| BundleError::Json {
            path: path.to_path_buf(),
            line: 0,
            source,
        })?;
        writer.write_all(b"\n").map_err(io_error(path))?;
    }
    writer.flush().map_err(io_error(path))
}

/// Content hash of the documents: 16 hex digits of SHA-256 over ids, titles and texts.
pub fn corpus_version(documents: &[Document]) -> String {
    let mut hasher = Sha256::new();
    for doc in documents {
        hasher.update(doc.id.to_le_bytes());
        hasher.update(doc.title.as_bytes());
        hasher.update([0]);
        hasher.update(doc.text.as_bytes());
        hasher.update([0]);
    }
    hex::encode(&hasher.finalize()[..8])
}

/// Key of an encoded text in the reuse cache: the model and the exact text it saw.
fn embedding_key(text: &str) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(MODEL_ID.as_bytes());
    hasher.update([0]);
    hasher.update(text.as_bytes());
    hasher.finalize().into()
}

/// What a build did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildStats {
    pub manifest: BundleManifest,
    /// Passages run through the encoder.
    pub encoded: usize,
    /// Passages whose vectors were taken from the bundle previously at the output path.
    pub reused: usize,
}

/// Vectors of the bundle already at `out`, keyed by embedding key, when it was made by
/// the same model. Anything unreadable is ignored: the build then simply encodes.
fn previous_vectors(out: &Path) -> HashMap<[u8; 32], Vec<f32>> {
    let bundle = match CorpusBundle::load(out) {
        Ok(bundle) if bundle.manifest.model_id == MODEL_ID => bundle,
        Ok(_) => return HashMap::new(),
        Err(err) => {
            if out.exists() {
                tracing::warn!(%err, "previous bundle unreadable; encoding every passage");
            }
            return HashMap::new();
        }
    };
    bundle
        .documents
        .iter()
        .enumerate()
        .map(|(row, doc)| {
            (
                embedding_key(&doc.embedding_text()),
                bundle.vector(row).to_vec(),
            )
        })
        .collect()
}

/// Encodes `corpus` into a bundle at `out`, reusing vectors from a bundle already there.
/// Documents get ids 0..n in corpus order.
pub fn build_bundle(
    corpus: &Corpus,
    encoder: &TextEncoder,
    out: &Path,
) -> Result<BuildStats, BundleError> {
    let documents: Vec<Document> = corpus
        .passages
        .iter()
        .enumerate()
        .map(|(i, p)| Document {
            id: i as u64,
            title: p.title.clone(),
            text: p.text.clone(),
        })
        .collect();
    let dimension = encoder.dimension();
    let texts: Vec<String> = documents.iter().map(Document::embedding_text).collect();
    let mut previous = previous_vectors(out);
    let mut vectors = vec![0f32; documents.len() * dimension];
    let mut missing = Vec::new();
    for (row, text) in texts.iter().enumerate() {
        match previous.remove(&embedding_key(text)) {
            Some(v) if v.len() == dimension => {
                vectors[row * dimension..(row + 1) * dimension].copy_from_slice(&v)
            }
            _ => missing.push(row),
        }
    }
    let reused = documents.len() - missing.len();
    tracing::info!(
        documents = documents.len(),
        reused,
        to_encode = missing.len(),
        "building bundle"
    );
    let started = Instant::now();
    for (done, chunk) in missing.chunks(ENCODE_CHUNK).enumerate() {
        let batch: Vec<&str> = chunk.iter().map(|&row| texts[row].as_str()).collect();
        for (&row, vector) in chunk.iter().zip(encoder.encode(&batch)?) {
            vectors[row * dimension..(row + 1) * dimension].copy_from_slice(&vector);
        }
        let encoded = (done * ENCODE_CHUNK + chunk.len()).min(missing.len());
        let rate = encoded as f64 / started.elapsed().as_secs_f64().max(1e-9);
        tracing::info!(
            encoded,
            total = missing.len(),
            passages_per_s = format!("{rate:.1}"),
            "encoding"
        );
    }
    let manifest = write_bundle(
        out,
        corpus.sources.clone(),
        &documents,
        &vectors,
        dimension,
        &corpus.questions,
    )?;
    Ok(BuildStats {
        manifest,
        encoded: missing.len(),
        reused,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(id: u64, title: &str, text: &str) -> Document {
        Document {
            id,
            title: title.into(),
            text: text.into(),
        }
    }

    #[test]
    fn write_then_load_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("bundle");
        let docs = vec![doc(0, "A", "alpha"), doc(1, "B", "beta")];
        let vectors = vec![1.0, 0.0, 0.0, 1.0];
        let manifest = write_bundle(&out, vec!["test".into()], &docs, &vectors, 2, &[]).unwrap();
        let bundle = CorpusBundle::load(&out).unwrap();
        assert_eq!(bundle.manifest, manifest);
        assert_eq!(bundle.documents, docs);
        assert_eq!(bundle.vector(1), &[0.0, 1.0]);
        assert!(!sibling(&out, "building").exists());
    }

    #[test]
    fn corpus_version_changes_with_content() {
        let a = vec![doc(0, "A", "alpha")];
        let b = vec![doc(0, "A", "alphb")];
        assert_ne!(corpus_version(&a), corpus_version(&b));
        assert_eq!(corpus_version(&a), corpus_version(&a.clone()));
    }

    #[test]
    fn shards_partition_the_corpus_by_id_under_one_version() {
        let dir = tempfile::tempdir().unwrap();
        let docs: Vec<Document> = (0..7).map(|i| doc(i, "T", &format!("d{i}"))).collect();
        let vectors: Vec<f32> = (0..7).flat_map(|i| [i as f32, 1.0]).collect();
        let manifests = write_shards(dir.path(), vec![], &docs, &vectors, 2, 3).unwrap();
        assert_eq!(manifests.len(), 3);
        let mut seen = Vec::new();
        for (i, manifest) in manifests.iter().enumerate() {
            let bundle = CorpusBundle::load(&dir.path().join(format!("shard-{i}"))).unwrap();
            assert_eq!(&bundle.manifest, manifest);
            assert_eq!(manifest.corpus_version, corpus_version(&docs));
            let shard = manifest.shard.unwrap();
            assert_eq!(
                (shard.index, shard.count, shard.corpus_documents),
                (i as u32, 3, 7)
            );
            for (row, d) in bundle.documents.iter().enumerate() {
                assert_eq!(d.id % 3, i as u64);
                assert_eq!(bundle.vector(row), &[d.id as f32, 1.0]);
                seen.push(d.id);
            }
        }
        seen.sort();
        assert_eq!(seen, (0..7).collect::<Vec<u64>>());
        assert!(write_shards(dir.path(), vec![], &docs, &vectors, 2, 0).is_err());
    }

    #[test]
    fn truncated_vectors_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("bundle");
        write_bundle(&out, vec![], &[doc(0, "A", "a")], &[0.5, 0.5], 2, &[]).unwrap();
        std::fs::write(out.join(VECTORS), [0u8; 4]).unwrap();
        let err = CorpusBundle::load(&out).unwrap_err().to_string();
        assert!(
            err.contains("vectors.f32") && err.contains("expected 8"),
            "{err}"
        );
    }
}
