//! Building a bundle from a corpus: every passage encoded once, vectors of passages that a
//! bundle already at the output path holds reused (the text and the model decide), the
//! result written by [`write_bundle`].

use display_full_error::DisplayFullErrorExt;
use std::collections::HashMap;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::{BundleError, BundleManifest, CorpusBundle, write_bundle};
use crate::corpus::{Corpus, Document};
use crate::encoder::{MODEL_ID, TextEncoder};

/// Passages encoded between two progress reports (a few seconds on 2 cores).
const ENCODE_CHUNK: usize = 128;

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
    /// Passages whose vectors were imported (see [`super::ImportedVectors`]).
    pub imported: usize,
}

/// Vectors of the bundle already at `out`, keyed by embedding key, when it was made by
/// the same model. Anything unreadable is ignored: the build then simply encodes.
fn previous_vectors(out: &Path) -> HashMap<[u8; 32], Vec<f32>> {
    let bundle = match CorpusBundle::load(out) {
        Ok(bundle) if bundle.manifest.model_id == MODEL_ID => bundle,
        Ok(_) => return HashMap::new(),
        Err(err) => {
            if out.exists() {
                tracing::warn!(error = %err.display_full(), "previous bundle unreadable; encoding every passage");
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

/// Encodes `corpus` into a bundle at `out`, taking a passage's vector from `imported`
/// (embedding text and unit vector, checked by the caller) or from a bundle already at
/// `out` where they have one. Documents get ids 0..n in corpus order.
/// `progress(encoded, to_encode)` is called after every chunk of passages encoded.
pub fn build_bundle(
    corpus: &Corpus,
    encoder: &TextEncoder,
    out: &Path,
    imported: Vec<(String, Vec<f32>)>,
    mut progress: impl FnMut(usize, usize),
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
    let mut imported: HashMap<[u8; 32], Vec<f32>> = imported
        .into_iter()
        .map(|(text, vector)| (embedding_key(&text), vector))
        .collect();
    let mut vectors = vec![0f32; documents.len() * dimension];
    let mut missing = Vec::new();
    let mut imported_rows = 0;
    for (row, text) in texts.iter().enumerate() {
        let key = embedding_key(text);
        let from_import = imported.remove(&key).filter(|v| v.len() == dimension);
        imported_rows += usize::from(from_import.is_some());
        match from_import.or_else(|| previous.remove(&key)) {
            Some(v) if v.len() == dimension => {
                vectors[row * dimension..(row + 1) * dimension].copy_from_slice(&v)
            }
            _ => missing.push(row),
        }
    }
    let reused = documents.len() - missing.len() - imported_rows;
    tracing::info!(
        documents = documents.len(),
        reused,
        imported = imported_rows,
        to_encode = missing.len(),
        "building bundle"
    );
    progress(0, missing.len());
    for (done, chunk) in missing.chunks(ENCODE_CHUNK).enumerate() {
        let batch: Vec<&str> = chunk.iter().map(|&row| texts[row].as_str()).collect();
        for (&row, vector) in chunk.iter().zip(encoder.encode(&batch)?) {
            vectors[row * dimension..(row + 1) * dimension].copy_from_slice(&vector);
        }
        progress(done * ENCODE_CHUNK + chunk.len(), missing.len());
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
        imported: imported_rows,
    })
}
