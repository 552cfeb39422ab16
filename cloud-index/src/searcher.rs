//! Exact search over one bundle: validation, the faiss call, and assembly of the hits.

use std::sync::Arc;

use hasten_core::bundle::CorpusBundle;
use hasten_core::index::{ExactIndex, IndexError};
use hasten_core::vector::normalized_query;
use hasten_proto::v1::{IndexInfo, QueryHits, ScoredDocument, SearchRequest, SearchResponse};

/// Largest k a caller may ask for: far beyond any RAG context (the HaS reference re-ranks 50
/// candidates) while keeping one response's size bounded.
pub const MAX_K: usize = 1000;

/// Largest batch accepted in one request; bigger batches gain nothing from the BLAS kernel
/// and only delay the first answer.
pub const MAX_BATCH: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("index failure: {0}")]
    Index(#[from] IndexError),
    #[error("search task failed: {0}")]
    Task(String),
}

/// A bundle and the exact index over its vectors.
#[derive(Debug)]
pub struct ExactSearcher {
    bundle: CorpusBundle,
    index: ExactIndex,
}

impl ExactSearcher {
    pub fn new(bundle: CorpusBundle) -> Result<Self, IndexError> {
        let index = ExactIndex::build(bundle.dimension(), bundle.vectors())?;
        Ok(Self { bundle, index })
    }

    pub fn bundle(&self) -> &CorpusBundle {
        &self.bundle
    }

    pub fn info(&self) -> IndexInfo {
        let manifest = &self.bundle.manifest;
        IndexInfo {
            corpus_version: manifest.corpus_version.clone(),
            model_id: manifest.model_id.clone(),
            dimension: manifest.dimension as u32,
            documents: manifest.documents as u64,
        }
    }

    /// Exact top-k for every query of the request, in one faiss call. Hits are ordered by
    /// descending score, ties by ascending document id.
    pub fn search(&self, request: &SearchRequest) -> Result<SearchResponse, SearchError> {
        let k = request.k as usize;
        if !(1..=MAX_K).contains(&k) {
            return Err(SearchError::InvalidArgument(format!(
                "k must be in 1..={MAX_K}, got {k}"
            )));
        }
        if request.queries.is_empty() || request.queries.len() > MAX_BATCH {
            return Err(SearchError::InvalidArgument(format!(
                "queries must hold 1..={MAX_BATCH} vectors, got {}",
                request.queries.len()
            )));
        }
        let dimension = self.bundle.dimension();
        let mut flat = Vec::with_capacity(request.queries.len() * dimension);
        for (i, query) in request.queries.iter().enumerate() {
            let v = normalized_query(&query.values, dimension)
                .map_err(|e| SearchError::InvalidArgument(format!("queries[{i}]: {e}")))?;
            flat.extend(v);
        }
        let results = self.index.search(&flat, k)?;
        let results = results
            .into_iter()
            .map(|mut hits| {
                hits.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.id.cmp(&b.id)));
                QueryHits {
                    hits: hits
                        .into_iter()
                        .map(|hit| self.scored_document(hit.id as usize, hit.score, request))
                        .collect(),
                }
            })
            .collect();
        Ok(SearchResponse { results })
    }

    fn scored_document(&self, row: usize, score: f32, request: &SearchRequest) -> ScoredDocument {
        let doc = &self.bundle.documents[row];
        ScoredDocument {
            id: doc.id,
            score,
            title: if request.include_texts {
                doc.title.clone()
            } else {
                String::new()
            },
            text: if request.include_texts {
                doc.text.clone()
            } else {
                String::new()
            },
            vector: if request.include_vectors {
                self.bundle.vector(row).to_vec()
            } else {
                Vec::new()
            },
        }
    }
}

/// The searcher as an async service: searches run on the blocking pool, since a scan of a
/// large shard takes tens of milliseconds of CPU.
#[derive(Clone, Debug)]
pub struct CloudService {
    searcher: Arc<ExactSearcher>,
}

impl CloudService {
    pub fn new(searcher: ExactSearcher) -> Self {
        Self {
            searcher: Arc::new(searcher),
        }
    }

    pub fn info(&self) -> IndexInfo {
        self.searcher.info()
    }

    pub async fn search(&self, request: SearchRequest) -> Result<SearchResponse, SearchError> {
        let searcher = Arc::clone(&self.searcher);
        tokio::task::spawn_blocking(move || searcher.search(&request))
            .await
            .map_err(|e| SearchError::Task(e.to_string()))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hasten_core::bundle::write_bundle;
    use hasten_core::corpus::Document;
    use hasten_proto::v1::QueryVector;

    fn searcher() -> (tempfile::TempDir, ExactSearcher) {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("b");
        let docs: Vec<Document> = (0..4)
            .map(|i| Document {
                id: i,
                title: format!("t{i}"),
                text: format!("text {i}"),
            })
            .collect();
        // Unit vectors along the axes of a 4-d space.
        let mut vectors = vec![0.0f32; 16];
        for i in 0..4 {
            vectors[i * 4 + i] = 1.0;
        }
        write_bundle(&out, vec![], &docs, &vectors, 4, &[]).unwrap();
        let bundle = CorpusBundle::load(&out).unwrap();
        (dir, ExactSearcher::new(bundle).unwrap())
    }

    fn request(queries: Vec<Vec<f32>>, k: u32) -> SearchRequest {
        SearchRequest {
            queries: queries
                .into_iter()
                .map(|values| QueryVector { values })
                .collect(),
            k,
            include_vectors: true,
            include_texts: true,
        }
    }

    #[test]
    fn batched_search_returns_one_ordered_hit_list_per_query() {
        let (_dir, s) = searcher();
        let resp = s
            .search(&request(
                vec![vec![0.1, 0.0, 0.9, 0.0], vec![0.0, 2.0, 0.0, 1.0]],
                2,
            ))
            .unwrap();
        let ids: Vec<Vec<u64>> = resp
            .results
            .iter()
            .map(|r| r.hits.iter().map(|h| h.id).collect())
            .collect();
        assert_eq!(ids, vec![vec![2, 0], vec![1, 3]]);
        let top = &resp.results[0].hits[0];
        assert_eq!(top.text, "text 2");
        assert_eq!(top.vector, vec![0.0, 0.0, 1.0, 0.0]);
    }

    #[test]
    fn bad_requests_are_invalid_arguments_naming_the_problem() {
        let (_dir, s) = searcher();
        let cases = [
            (request(vec![vec![1.0, 0.0, 0.0, 0.0]], 0), "k must be"),
            (request(vec![], 3), "queries must hold"),
            (
                request(vec![vec![1.0, 0.0]], 3),
                "queries[0]: expected 4 dimensions",
            ),
            (
                request(vec![vec![1.0, 0.0, f32::NAN, 0.0]], 3),
                "not finite",
            ),
        ];
        for (req, expected) in cases {
            let err = s.search(&req).unwrap_err();
            assert!(
                matches!(&err, SearchError::InvalidArgument(m) if m.contains(expected)),
                "{err} should mention {expected}"
            );
        }
    }
}
