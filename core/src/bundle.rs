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
//! corpus, so a router can refuse shards cut from different corpora, and each also the
//! content hash of its own documents.
//!
//! A write goes into a sibling directory renamed into place, so a crash never leaves a
//! half-written bundle under the final name; `build` encodes a corpus into one. Loading
//! checks the contents against the manifest (`verify`): a bundle edited or damaged since
//! its build is refused. An edge holding a fraction of the corpus loads only its share
//! (`share`), checked the same way.

mod build;
mod import;
mod share;
mod verify;

use std::io::{BufRead, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::corpus::{Document, Question};
use crate::encoder::{EncoderError, MODEL_ID};

pub use build::{BuildStats, build_bundle};
pub use import::{ImportError, ImportedVectors, MIN_IMPORT_COSINE};
pub use verify::VectorDefect;

/// Version of the on-disk layout; bump when the files change incompatibly. Format 2 added
/// a shard's own content hash (`ShardOf::shard_version`).
pub const FORMAT_VERSION: u32 = 2;

/// Oldest layout still loaded: a whole corpus of format 1 is checked as one of format 2
/// (its version is its documents' hash), while a format-1 shard, which records no hash of
/// its own documents, is refused with the command that rebuilds it.
const OLDEST_READABLE_FORMAT: u32 = 1;

const MANIFEST: &str = "manifest.json";
const DOCUMENTS: &str = "documents.jsonl";
const VECTORS: &str = "vectors.f32";
const QUESTIONS: &str = "questions.jsonl";

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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardOf {
    /// 0-based partition number: the shard holds the documents with `id % count == index`.
    pub index: u32,
    /// Number of partitions of the corpus.
    pub count: u32,
    /// Documents in the whole corpus.
    pub corpus_documents: usize,
    /// Content hash of this shard's own documents ([`corpus_version`] of them), which the
    /// shard checks at load: the corpus version covers documents it does not hold. Absent
    /// from format 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard_version: Option<String>,
}

impl ShardOf {
    /// The shard of a document id among `count` partitions.
    pub fn of_document(id: u64, count: u32) -> u32 {
        (id % u64::from(count.max(1))) as u32
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("{path}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}: invalid JSON")]
    Json {
        path: PathBuf,
        line: usize,
        source: serde_json::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error(
        "{path}: the documents hash to {computed}, the manifest records {recorded}: the bundle changed after it was built; rebuild it with `{rebuild}`"
    )]
    ContentMismatch {
        path: PathBuf,
        computed: String,
        recorded: String,
        rebuild: String,
    },
    #[error("{path}: row {row} (document {id}) {defect}; rebuild the bundle with `{rebuild}`")]
    BadVector {
        path: PathBuf,
        row: usize,
        id: u64,
        defect: VectorDefect,
        rebuild: String,
    },
    #[error(
        "{path}: this shard bundle records no hash of its own documents (format 1 did not), so they cannot be checked; rebuild it with `{rebuild}`"
    )]
    UnverifiableShard { path: PathBuf, rebuild: String },
    #[error("encoding failed")]
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
    /// The documents loaded: all of them, or the share [`CorpusBundle::load_share`] kept.
    pub documents: Vec<Document>,
    pub questions: Vec<Question>,
    vectors: Vec<f32>,
    /// The largest document id in the whole bundle, loaded or not.
    max_document_id: u64,
}

impl CorpusBundle {
    /// Loads a bundle directory and checks its contents against its manifest: the
    /// documents' content hash, and every vector finite and of unit length.
    pub fn load(dir: &Path) -> Result<Self, BundleError> {
        let manifest = readable_manifest(dir)?;
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
        let max_document_id = documents.iter().map(|d| d.id).max().unwrap_or(0);
        let bundle = Self {
            manifest,
            documents,
            questions,
            vectors,
            max_document_id,
        };
        bundle.check_contents(dir)?;
        Ok(bundle)
    }

    /// The largest document id in the whole bundle, loaded or not.
    pub fn max_document_id(&self) -> u64 {
        self.max_document_id
    }

    /// Checks what was read from `dir` against the manifest: the documents' content hash,
    /// and every vector finite and of unit length. [`CorpusBundle::load`] runs it; on its
    /// own it measures what the check costs.
    pub fn check_contents(&self, dir: &Path) -> Result<(), BundleError> {
        let recorded = verify::recorded_content_hash(dir, &self.manifest)?;
        let rebuild = || verify::rebuild_command(&self.manifest);
        verify::check_documents(&dir.join(DOCUMENTS), &self.documents, recorded, rebuild)?;
        verify::check_vectors(
            &dir.join(VECTORS),
            &self.vectors,
            self.manifest.dimension,
            &self.documents,
            rebuild,
        )
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

/// The manifest of a bundle this build reads, whose documents can be checked: a format in
/// range, and a shard with a hash of its own (refused before its files are read).
fn readable_manifest(dir: &Path) -> Result<BundleManifest, BundleError> {
    let manifest = read_manifest(dir)?;
    if !(OLDEST_READABLE_FORMAT..=FORMAT_VERSION).contains(&manifest.format_version) {
        return Err(BundleError::Invalid {
            path: dir.join(MANIFEST),
            message: format!(
                "bundle format {} is not supported (this build reads formats {OLDEST_READABLE_FORMAT} to {FORMAT_VERSION}); rebuild the bundle with `{}`",
                manifest.format_version,
                verify::rebuild_command(&manifest)
            ),
        });
    }
    verify::recorded_content_hash(dir, &manifest)?;
    Ok(manifest)
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
                    shard_version: Some(corpus_version(&shard_documents)),
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
    let mut hasher = ContentHasher::default();
    for doc in documents {
        hasher.update(doc);
    }
    hasher.finish()
}

/// [`corpus_version`] one document at a time, for a bundle read as a stream.
#[derive(Default)]
struct ContentHasher(Sha256);

impl ContentHasher {
    fn update(&mut self, doc: &Document) {
        self.0.update(doc.id.to_le_bytes());
        self.0.update(doc.title.as_bytes());
        self.0.update([0]);
        self.0.update(doc.text.as_bytes());
        self.0.update([0]);
    }

    fn finish(self) -> String {
        hex::encode(&self.0.finalize()[..8])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use display_full_error::DisplayFullErrorExt;

    fn doc(id: u64, title: &str, text: &str) -> Document {
        Document {
            id,
            title: title.into(),
            text: text.into(),
        }
    }

    /// A 2-d unit vector at `angle` radians, distinct for each document.
    fn unit_at(angle: f32) -> [f32; 2] {
        [angle.cos(), angle.sin()]
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
    fn a_share_keeps_the_selected_documents_and_still_checks_every_one() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("bundle");
        let docs = vec![
            doc(0, "A", "alpha"),
            doc(1, "B", "beta"),
            doc(2, "C", "gamma"),
        ];
        let vectors: Vec<f32> = (0..3).flat_map(|i| unit_at(i as f32)).collect();
        write_bundle(&out, vec!["test".into()], &docs, &vectors, 2, &[]).unwrap();
        let share = CorpusBundle::load_share(&out, |id| id != 1).unwrap();
        assert_eq!(share.documents, vec![docs[0].clone(), docs[2].clone()]);
        assert_eq!(share.vector(1), &unit_at(2.0));
        assert_eq!(share.max_document_id(), 2);
        assert_eq!(
            share.manifest.corpus_version,
            CorpusBundle::load(&out).unwrap().manifest.corpus_version
        );
        // An edit to a document the share leaves out still fails the load.
        let path = out.join(DOCUMENTS);
        let edited = std::fs::read_to_string(&path)
            .unwrap()
            .replace("beta", "bet4");
        std::fs::write(&path, edited).unwrap();
        assert!(matches!(
            CorpusBundle::load_share(&out, |id| id != 1),
            Err(BundleError::ContentMismatch { .. })
        ));
    }

    #[test]
    fn a_vector_sample_spans_the_whole_bundle() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("bundle");
        let docs: Vec<Document> = (0..10).map(|i| doc(i, "T", &format!("text {i}"))).collect();
        let vectors: Vec<f32> = (0..10).flat_map(|i| unit_at(i as f32)).collect();
        write_bundle(&out, vec!["test".into()], &docs, &vectors, 2, &[]).unwrap();
        let sample = CorpusBundle::vector_sample(&out, 4).unwrap();
        let expected: Vec<f32> = [0, 3, 6, 9]
            .iter()
            .flat_map(|&i| unit_at(i as f32))
            .collect();
        assert_eq!(sample, expected);
        assert_eq!(CorpusBundle::vector_sample(&out, 100).unwrap(), vectors);
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
        let vectors: Vec<f32> = (0..7).flat_map(|i| unit_at(i as f32)).collect();
        let manifests = write_shards(dir.path(), vec![], &docs, &vectors, 2, 3).unwrap();
        assert_eq!(manifests.len(), 3);
        let mut seen = Vec::new();
        for (i, manifest) in manifests.iter().enumerate() {
            let bundle = CorpusBundle::load(&dir.path().join(format!("shard-{i}"))).unwrap();
            assert_eq!(&bundle.manifest, manifest);
            assert_eq!(manifest.corpus_version, corpus_version(&docs));
            let shard = manifest.shard.clone().unwrap();
            assert_eq!(
                (shard.index, shard.count, shard.corpus_documents),
                (i as u32, 3, 7)
            );
            assert_eq!(shard.shard_version, Some(corpus_version(&bundle.documents)));
            for (row, d) in bundle.documents.iter().enumerate() {
                assert_eq!(d.id % 3, i as u64);
                assert_eq!(bundle.vector(row), &unit_at(d.id as f32));
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
        write_bundle(&out, vec![], &[doc(0, "A", "a")], &[0.6, 0.8], 2, &[]).unwrap();
        std::fs::write(out.join(VECTORS), [0u8; 4]).unwrap();
        let err = CorpusBundle::load(&out).unwrap_err().to_string_full();
        assert!(
            err.contains("vectors.f32") && err.contains("expected 8"),
            "{err}"
        );
    }
}
