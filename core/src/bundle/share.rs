//! Loading part of a bundle: the share of the documents an edge holds, streamed from the
//! files and checked as a whole load is, and a sample of every vector for training indexes
//! over documents from anywhere in the corpus.

use std::io::{BufRead, Read};
use std::path::Path;

use super::{
    BundleError, ContentHasher, CorpusBundle, DOCUMENTS, QUESTIONS, VECTORS, io_error, read_jsonl,
    read_vectors, readable_manifest, verify,
};
use crate::corpus::{Document, Question};

impl CorpusBundle {
    /// Loads only the documents whose id `keep` accepts, with their vectors, streaming the
    /// files: what an edge holding a fraction of the corpus keeps in memory. The checks are
    /// [`CorpusBundle::load`]'s: the content hash over every document, loaded or not, and
    /// every kept vector finite and of unit length.
    pub fn load_share(dir: &Path, keep: impl Fn(u64) -> bool) -> Result<Self, BundleError> {
        let manifest = readable_manifest(dir)?;
        let recorded = verify::recorded_content_hash(dir, &manifest)?.to_string();
        let dimension = manifest.dimension;
        let vectors_path = dir.join(VECTORS);
        let vectors_file = std::fs::File::open(&vectors_path).map_err(io_error(&vectors_path))?;
        let expected = (manifest.documents * dimension * 4) as u64;
        let len = vectors_file
            .metadata()
            .map_err(io_error(&vectors_path))?
            .len();
        if len != expected {
            return Err(BundleError::Invalid {
                path: vectors_path,
                message: format!("{len} bytes, expected {expected} (documents x dimension x 4)"),
            });
        }
        let mut vectors_in = std::io::BufReader::new(vectors_file);
        let documents_path = dir.join(DOCUMENTS);
        let documents_file =
            std::fs::File::open(&documents_path).map_err(io_error(&documents_path))?;
        let mut hasher = ContentHasher::default();
        let mut row_vector = vec![0f32; dimension];
        let (mut documents, mut vectors) = (Vec::new(), Vec::new());
        let (mut rows, mut max_document_id) = (0usize, 0u64);
        for (i, line) in std::io::BufReader::new(documents_file).lines().enumerate() {
            let line = line.map_err(io_error(&documents_path))?;
            if line.is_empty() {
                continue;
            }
            let document: Document =
                serde_json::from_str(&line).map_err(|source| BundleError::Json {
                    path: documents_path.clone(),
                    line: i + 1,
                    source,
                })?;
            if rows == manifest.documents {
                return Err(BundleError::Invalid {
                    path: documents_path,
                    message: format!("more documents than the manifest's {}", manifest.documents),
                });
            }
            hasher.update(&document);
            vectors_in
                .read_exact(bytemuck::cast_slice_mut(&mut row_vector))
                .map_err(io_error(&vectors_path))?;
            max_document_id = max_document_id.max(document.id);
            if keep(document.id) {
                if let Some(defect) = verify::defect(&row_vector) {
                    return Err(BundleError::BadVector {
                        path: vectors_path,
                        row: rows,
                        id: document.id,
                        defect,
                        rebuild: verify::rebuild_command(&manifest),
                    });
                }
                vectors.extend_from_slice(&row_vector);
                documents.push(document);
            }
            rows += 1;
        }
        if rows != manifest.documents {
            return Err(BundleError::Invalid {
                path: documents_path,
                message: format!("{rows} documents, the manifest says {}", manifest.documents),
            });
        }
        verify::check_content_hash(&documents_path, hasher.finish(), &recorded, || {
            verify::rebuild_command(&manifest)
        })?;
        let questions: Vec<Question> = read_jsonl(&dir.join(QUESTIONS))?;
        Ok(Self {
            manifest,
            documents,
            questions,
            vectors,
            max_document_id,
        })
    }

    /// Vectors evenly spaced through the whole bundle, at most `max_rows` of them, loaded or not,
    /// skipping any that is not finite and of unit length: a sample of the corpus's
    /// distribution for training an index over documents from anywhere in it (an edge's
    /// cache channel), when only a share is loaded.
    pub fn vector_sample(dir: &Path, max_rows: usize) -> Result<Vec<f32>, BundleError> {
        let manifest = readable_manifest(dir)?;
        let dimension = manifest.dimension;
        let path = dir.join(VECTORS);
        let vectors = read_vectors(&path, manifest.documents * dimension)?;
        let step = manifest.documents.div_ceil(max_rows.max(1)).max(1);
        Ok(vectors
            .chunks_exact(dimension.max(1))
            .step_by(step)
            .filter(|row| verify::defect(row).is_none())
            .flatten()
            .copied()
            .collect())
    }
}
