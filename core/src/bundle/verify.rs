//! What loading checks of a bundle's contents: its documents hash to the version its
//! manifest records (the corpus version of a whole corpus, a shard's own hash for a shard),
//! and every vector is finite and of unit length, as the encoder writes them. A bundle
//! edited or damaged after its build would otherwise be served under its old version, and
//! its answers cached by edges as that version's.

use std::path::Path;

use super::{BundleError, BundleManifest, MANIFEST, corpus_version};
use crate::corpus::Document;
use crate::vector::dot;

/// How far a stored vector's norm may be from 1. The encoder's f32 normalisation is good
/// to ~1e-6; a vector off by more was not written by it.
const UNIT_NORM_TOLERANCE: f32 = 1e-3;

/// What is wrong with a stored vector.
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
pub enum VectorDefect {
    #[error("holds a value that is not finite at position {position}")]
    NotFinite { position: usize },
    #[error(
        "has norm {norm:.3e}, not 1 (the encoder writes unit vectors; |norm - 1| must be below {UNIT_NORM_TOLERANCE})"
    )]
    NotUnit { norm: f64 },
}

/// The command that rebuilds the bundle `manifest` describes.
pub(super) fn rebuild_command(manifest: &BundleManifest) -> String {
    match &manifest.shard {
        Some(shard) => format!("cloud-index build --shards {}", shard.count),
        None => "cloud-index build".into(),
    }
}

/// The content hash the documents of the bundle in `dir` must have: the corpus version of
/// a whole corpus, a shard's own hash for a shard (refused when it has none, as in format
/// 1), checked before the documents are read.
pub(super) fn recorded_content_hash<'a>(
    dir: &Path,
    manifest: &'a BundleManifest,
) -> Result<&'a str, BundleError> {
    match &manifest.shard {
        None => Ok(&manifest.corpus_version),
        Some(shard) => {
            shard
                .shard_version
                .as_deref()
                .ok_or_else(|| BundleError::UnverifiableShard {
                    path: dir.join(MANIFEST),
                    rebuild: rebuild_command(manifest),
                })
        }
    }
}

/// Refuses documents (read from `path`) whose content hash is not `recorded`.
pub(super) fn check_documents(
    path: &Path,
    documents: &[Document],
    recorded: &str,
    rebuild: impl FnOnce() -> String,
) -> Result<(), BundleError> {
    check_content_hash(path, corpus_version(documents), recorded, rebuild)
}

/// Refuses documents (read from `path`) that hash to `computed` when `recorded` is expected.
pub(super) fn check_content_hash(
    path: &Path,
    computed: String,
    recorded: &str,
    rebuild: impl FnOnce() -> String,
) -> Result<(), BundleError> {
    if computed == recorded {
        return Ok(());
    }
    Err(BundleError::ContentMismatch {
        path: path.to_path_buf(),
        computed,
        recorded: recorded.to_string(),
        rebuild: rebuild(),
    })
}

/// Refuses the first vector (row-major in `vectors`, read from `path`; row r belongs to
/// `documents[r]`) that is not finite or not of unit length.
pub(super) fn check_vectors(
    path: &Path,
    vectors: &[f32],
    dimension: usize,
    documents: &[Document],
    rebuild: impl FnOnce() -> String,
) -> Result<(), BundleError> {
    if dimension == 0 {
        return Err(BundleError::Invalid {
            path: path.to_path_buf(),
            message: "vectors of dimension 0".into(),
        });
    }
    let rows = vectors.chunks_exact(dimension).zip(documents).enumerate();
    for (row, (vector, document)) in rows {
        if let Some(defect) = defect(vector) {
            return Err(BundleError::BadVector {
                path: path.to_path_buf(),
                row,
                id: document.id,
                defect,
                rebuild: rebuild(),
            });
        }
    }
    Ok(())
}

/// One pass over a good vector: a non-finite value makes the norm NaN or infinite, so the
/// rare bad row is diagnosed only once it fails.
pub(super) fn defect(vector: &[f32]) -> Option<VectorDefect> {
    let norm = dot(vector, vector).sqrt();
    if (norm - 1.0).abs() < UNIT_NORM_TOLERANCE {
        return None;
    }
    if let Some(position) = vector.iter().position(|x| !x.is_finite()) {
        return Some(VectorDefect::NotFinite { position });
    }
    // In f64, so that a huge row's norm is reported rather than an overflow.
    let norm = vector
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    Some(VectorDefect::NotUnit { norm })
}

#[cfg(test)]
mod tests {
    use display_full_error::DisplayFullErrorExt;
    use std::path::PathBuf;

    use super::super::{
        CorpusBundle, DOCUMENTS, VECTORS, read_jsonl, write_bundle, write_jsonl, write_shards,
    };
    use super::*;

    fn doc(id: u64, title: &str, text: &str) -> Document {
        Document {
            id,
            title: title.into(),
            text: text.into(),
        }
    }

    /// A bundle of three documents with unit vectors along the axes of a 3-d space.
    fn good_bundle(dir: &Path) -> PathBuf {
        let out = dir.join("bundle");
        let docs = vec![
            doc(10, "A", "alpha"),
            doc(11, "B", "beta"),
            doc(12, "C", "gamma"),
        ];
        let vectors = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]].concat();
        write_bundle(&out, vec![], &docs, &vectors, 3, &[]).unwrap();
        out
    }

    fn overwrite_row(bundle: &Path, row: usize, values: [f32; 3]) {
        let path = bundle.join(VECTORS);
        let mut bytes = std::fs::read(&path).unwrap();
        let at = row * 3 * 4;
        bytes[at..at + 12].copy_from_slice(bytemuck::cast_slice(&values));
        std::fs::write(&path, bytes).unwrap();
    }

    fn edit_text(bundle: &Path, line: usize) {
        let path = bundle.join(DOCUMENTS);
        let mut docs: Vec<Document> = read_jsonl(&path).unwrap();
        docs[line].text.push_str(" (edited)");
        write_jsonl(&path, &docs).unwrap();
    }

    /// Rewrites the manifest of `bundle` as format 1 wrote it: no shard hash.
    fn downgrade_to_format_1(bundle: &Path) {
        let path = bundle.join(MANIFEST);
        let mut manifest: BundleManifest =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        manifest.format_version = 1;
        if let Some(shard) = &mut manifest.shard {
            shard.shard_version = None;
        }
        std::fs::write(&path, serde_json::to_string(&manifest).unwrap()).unwrap();
    }

    fn load_error(bundle: &Path) -> String {
        CorpusBundle::load(bundle).unwrap_err().to_string_full()
    }

    #[test]
    fn a_text_edited_after_the_build_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = good_bundle(dir.path());
        edit_text(&bundle, 1);
        let err = load_error(&bundle);
        assert!(
            err.contains("documents.jsonl") && err.contains("rebuild it with `cloud-index build`"),
            "{err}"
        );
    }

    #[test]
    fn vectors_that_are_not_finite_or_not_unit_length_are_refused_by_row_and_id() {
        let cases = [
            ([f32::NAN, 0.0, 0.0], "not finite at position 0"),
            ([0.0, f32::INFINITY, 0.0], "not finite at position 1"),
            ([1e30, 0.0, 0.0], "norm 1.000e30"),
            ([1.01, 0.0, 0.0], "norm 1.010e0"),
            ([0.0, 0.0, 0.0], "norm 0.000e0"),
        ];
        for (values, problem) in cases {
            let dir = tempfile::tempdir().unwrap();
            let bundle = good_bundle(dir.path());
            overwrite_row(&bundle, 1, values);
            let err = load_error(&bundle);
            for expected in ["vectors.f32", "row 1", "document 11", problem, "rebuild"] {
                assert!(err.contains(expected), "{values:?}: {err} lacks {expected}");
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let bundle = good_bundle(dir.path());
        overwrite_row(&bundle, 2, [0.0, 0.6, 0.8005]);
        assert!(
            CorpusBundle::load(&bundle).is_ok(),
            "a unit vector off the axes, within the tolerance, is fine"
        );
    }

    #[test]
    fn a_shard_whose_documents_were_edited_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let docs: Vec<Document> = (0..6).map(|i| doc(i, "T", &format!("d{i}"))).collect();
        let vectors: Vec<f32> = (0..6).flat_map(|_| [0.6, 0.8]).collect();
        write_shards(dir.path(), vec![], &docs, &vectors, 2, 2).unwrap();
        let shard = dir.path().join("shard-1");
        assert!(CorpusBundle::load(&shard).is_ok());
        edit_text(&shard, 0);
        let err = load_error(&shard);
        assert!(
            err.contains("shard-1")
                && err.contains("documents.jsonl")
                && err.contains("`cloud-index build --shards 2`"),
            "{err}"
        );
    }

    #[test]
    fn a_format_1_corpus_still_loads_and_a_format_1_shard_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = good_bundle(dir.path());
        downgrade_to_format_1(&bundle);
        assert!(CorpusBundle::load(&bundle).is_ok());

        let docs: Vec<Document> = (0..4).map(|i| doc(i, "T", &format!("d{i}"))).collect();
        let vectors: Vec<f32> = (0..4).flat_map(|_| [0.6, 0.8]).collect();
        write_shards(&dir.path().join("shards"), vec![], &docs, &vectors, 2, 2).unwrap();
        let shard = dir.path().join("shards").join("shard-0");
        downgrade_to_format_1(&shard);
        let err = load_error(&shard);
        assert!(
            err.contains("manifest.json")
                && err.contains("format 1")
                && err.contains("`cloud-index build --shards 2`"),
            "{err}"
        );
    }
}
