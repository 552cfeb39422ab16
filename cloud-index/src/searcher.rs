//! Exact search over one bundle (a shard, or a whole corpus): validation, the faiss call,
//! and assembly of the hits.

use display_full_error::DisplayFullErrorExt;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hasten_core::bundle::CorpusBundle;
use hasten_core::index::{ExactIndex, Hit, IndexError};
use hasten_core::ranking::best_first;
use hasten_core::vector::{dot, normalized_query};
use hasten_proto::response_size::texts_encoded_len;
use hasten_proto::v1::{
    DocumentsRequest, DocumentsResponse, IndexInfo, QueryHits, ScoredDocument, SearchRequest,
    SearchResponse,
};

use crate::backend::SearchBackend;
use crate::batcher::{BatchRunner, BatchingSettings, MicroBatcher};
use crate::documents::validated_ids;
use crate::error::SearchError;
use crate::metrics::CloudMetrics;
use crate::response_limit::{ResponseLimit, SearchShape};

/// Hits searched beyond the largest k asked: faiss's own scores rank the candidates, the
/// canonical ones rank the answer, and the two differ by rounding only, so a few spare
/// candidates keep every document of the canonical top-k among them.
const RESCORED_MARGIN: usize = 8;

/// Largest k a caller may ask for: far beyond any RAG context (the HaS reference re-ranks 50
/// candidates). What an answer may carry at this k is bounded by [`ResponseLimit`].
pub const MAX_K: usize = 1000;

/// Largest batch accepted in one request; bigger batches gain nothing from the BLAS kernel
/// and only delay the first answer.
pub const MAX_BATCH: usize = 1024;

/// A validated request: its queries normalised into one row-major buffer.
#[derive(Debug)]
pub struct PreparedSearch {
    queries: Vec<f32>,
    k: usize,
    include_vectors: bool,
    include_texts: bool,
}

/// What a returned document carries besides its id and score.
#[derive(Clone, Copy, Debug)]
struct Contents {
    include_vectors: bool,
    include_texts: bool,
}

impl PreparedSearch {
    fn contents(&self) -> Contents {
        Contents {
            include_vectors: self.include_vectors,
            include_texts: self.include_texts,
        }
    }

    /// Number of query vectors.
    pub fn len(&self, dimension: usize) -> usize {
        self.queries.len() / dimension.max(1)
    }
}

/// Checks k and the batch size of a request, shard or router alike.
pub fn check_request_shape(request: &SearchRequest) -> Result<(), SearchError> {
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
    Ok(())
}

/// Checks `request` before any work, shard or router alike: its shape, the size its answer
/// could take against `limit`, and every query vector against the dimension; returns the
/// queries normalised, in one row-major buffer.
pub fn validated_queries(
    request: &SearchRequest,
    limit: &ResponseLimit,
) -> Result<Vec<f32>, SearchError> {
    check_request_shape(request)?;
    limit.check(SearchShape::of(request))?;
    let dimension = limit.dimension();
    let mut queries = Vec::with_capacity(request.queries.len() * dimension);
    for (i, query) in request.queries.iter().enumerate() {
        let v = normalized_query(&query.values, dimension).map_err(|e| {
            SearchError::InvalidArgument(format!("queries[{i}]: {}", e.display_full()))
        })?;
        queries.extend(v);
    }
    Ok(queries)
}

/// A bundle, the exact index over its vectors, and the largest answer it sends.
#[derive(Debug)]
pub struct ExactSearcher {
    bundle: CorpusBundle,
    index: ExactIndex,
    limit: ResponseLimit,
    /// Each document's row, for documents by id.
    rows: HashMap<u64, usize>,
}

impl ExactSearcher {
    pub fn new(bundle: CorpusBundle) -> Result<Self, IndexError> {
        let index = ExactIndex::build(bundle.dimension(), bundle.vectors())?;
        let texts_bytes = bundle
            .documents
            .iter()
            .map(|doc| texts_encoded_len(&doc.title, &doc.text))
            .max()
            .unwrap_or(0);
        let limit = ResponseLimit::new(bundle.dimension(), bundle.len(), texts_bytes, 0);
        let rows = bundle
            .documents
            .iter()
            .enumerate()
            .map(|(row, doc)| (doc.id, row))
            .collect();
        Ok(Self {
            bundle,
            index,
            limit,
            rows,
        })
    }

    pub fn bundle(&self) -> &CorpusBundle {
        &self.bundle
    }

    pub fn info(&self) -> IndexInfo {
        let manifest = &self.bundle.manifest;
        let shard = manifest.shard.as_ref();
        IndexInfo {
            corpus_version: manifest.corpus_version.clone(),
            model_id: manifest.model_id.clone(),
            dimension: manifest.dimension as u32,
            documents: manifest.documents as u64,
            shard_index: shard.map_or(0, |s| s.index),
            shard_count: shard.map_or(1, |s| s.count),
            max_texts_bytes: self.limit.texts_bytes() as u64,
        }
    }

    /// Validates `request` and normalises its queries.
    pub fn prepare(&self, request: &SearchRequest) -> Result<PreparedSearch, SearchError> {
        Ok(PreparedSearch {
            queries: validated_queries(request, &self.limit)?,
            k: request.k as usize,
            include_vectors: request.include_vectors,
            include_texts: request.include_texts,
        })
    }

    /// Exact top-k for every query of every prepared search, in one faiss call over all of
    /// them (with the largest k asked; each answer is cut to its own k). Hits are ordered by
    /// [`best_first`].
    pub fn search_batch(
        &self,
        batch: &[&PreparedSearch],
    ) -> Result<Vec<SearchResponse>, SearchError> {
        hasten_core::threads::apply_openmp_threads();
        // Hits beyond the largest k: the canonical scores may reorder faiss's last few, and
        // one more shows whether the k-th score is tied past the cut.
        let probe = batch.iter().map(|p| p.k).max().unwrap_or(0) + RESCORED_MARGIN;
        let queries: Vec<f32> = if let [one] = batch {
            one.queries.clone()
        } else {
            batch
                .iter()
                .flat_map(|p| p.queries.iter().copied())
                .collect()
        };
        let dimension = self.bundle.dimension();
        let mut results = self.index.search(&queries, probe)?.into_iter();
        let mut responses = Vec::with_capacity(batch.len());
        for prepared in batch {
            let mut query_results = Vec::with_capacity(prepared.len(dimension));
            for (i, hits) in results.by_ref().take(prepared.len(dimension)).enumerate() {
                let query = &prepared.queries[i * dimension..(i + 1) * dimension];
                let hits = self.top_k_by_rank(query, hits, prepared.k, probe)?;
                query_results.push(QueryHits {
                    hits: hits
                        .into_iter()
                        .map(|hit| {
                            self.scored_document(hit.id as usize, hit.score, prepared.contents())
                        })
                        .collect(),
                });
            }
            responses.push(SearchResponse {
                results: query_results,
                partial: false,
                missing_shards: Vec::new(),
            });
        }
        Ok(responses)
    }

    /// The exact top-`k` of one query under [`best_first`] (score, then document id), from
    /// faiss's top-`probe` `hits` (whose ids are rows: a bundle need not hold its documents
    /// in id order), each re-scored canonically ([`canonical_scores`]). faiss keeps an
    /// arbitrary subset of the vectors tied at its cut, so when the k-th score is tied all
    /// the way to the last hit, the query is searched again deeper until a lower score ends
    /// the tie (or the whole index was seen). Real embeddings almost never tie; the extra
    /// hits decide it in the common case.
    fn top_k_by_rank(
        &self,
        query: &[f32],
        mut hits: Vec<Hit>,
        k: usize,
        mut probe: usize,
    ) -> Result<Vec<Hit>, SearchError> {
        let documents = &self.bundle.documents;
        let by_rank = |a: &Hit, b: &Hit| {
            best_first(
                (a.score, documents[a.id as usize].id),
                (b.score, documents[b.id as usize].id),
            )
        };
        loop {
            self.canonical_scores(query, &mut hits);
            hits.sort_by(by_rank);
            let settled = hits.len() < probe
                || hits.len() <= k
                || hits.last().map(|h| h.score) < hits.get(k - 1).map(|h| h.score);
            if settled {
                hits.truncate(k);
                return Ok(hits);
            }
            tracing::debug!(
                probe,
                hits = hits.len(),
                kth = ?hits.get(k - 1).map(|h| h.score),
                last = ?hits.last().map(|h| (h.id, h.score)),
                "k-th score tied past the cut; searching deeper"
            );
            probe = (probe * 2).min(self.index.len());
            hits = self.index.search(query, probe)?.pop().unwrap_or_default();
        }
    }

    /// Replaces faiss's scores with one fixed computation of the inner product. faiss
    /// scores a batch of `blas_min_batch` (shard configuration) queries or more with a matrix
    /// product and fewer with its own scan, and the two round differently in the last bits:
    /// without this a query's scores (and, on a near-tie, its order) would depend on what
    /// else the micro-batcher put in its batch, and a verification batch would not return
    /// what the single searches it stands for return.
    fn canonical_scores(&self, query: &[f32], hits: &mut [Hit]) {
        for hit in hits {
            hit.score = dot(query, self.bundle.vector(hit.id as usize));
        }
    }

    /// Runs one batched search of `queries` of the index's own vectors, so the first real
    /// batch does not pay the BLAS library's start-up (buffer allocation and first-touch:
    /// measured 1-4 s for the first batch of a 250k-vector shard).
    pub fn warm_up(&self, queries: usize) -> Result<(), SearchError> {
        let n = queries.min(self.bundle.len());
        let flat: Vec<f32> = (0..n)
            .flat_map(|row| self.bundle.vector(row).to_vec())
            .collect();
        self.index.search(&flat, 10)?;
        Ok(())
    }

    /// Exact top-k for every query of one request.
    pub fn search(&self, request: &SearchRequest) -> Result<SearchResponse, SearchError> {
        let prepared = self.prepare(request)?;
        let mut responses = self.search_batch(&[&prepared])?;
        responses.pop().ok_or(SearchError::NoAnswer("faiss"))
    }

    /// The documents of `request` this bundle holds, in the order of their first request;
    /// the others are named missing.
    pub fn documents(&self, request: &DocumentsRequest) -> Result<DocumentsResponse, SearchError> {
        let ids = validated_ids(request, &self.limit)?;
        let contents = Contents {
            include_vectors: request.include_vectors,
            include_texts: request.include_texts,
        };
        let mut response = DocumentsResponse::default();
        for id in ids {
            match self.rows.get(&id) {
                Some(&row) => response
                    .documents
                    .push(self.scored_document(row, 0.0, contents)),
                None => response.missing_ids.push(id),
            }
        }
        Ok(response)
    }

    fn scored_document(&self, row: usize, score: f32, contents: Contents) -> ScoredDocument {
        let doc = &self.bundle.documents[row];
        ScoredDocument {
            id: doc.id,
            score,
            title: if contents.include_texts {
                doc.title.clone()
            } else {
                String::new()
            },
            text: if contents.include_texts {
                doc.text.clone()
            } else {
                String::new()
            },
            vector: if contents.include_vectors {
                self.bundle.vector(row).to_vec()
            } else {
                Vec::new()
            },
        }
    }
}

/// A shard runs a batch as one faiss call on the blocking pool, one batch at a time: a
/// batch already uses every core it was given.
impl BatchRunner for ExactSearcher {
    type Search = PreparedSearch;

    fn queries(&self, search: &PreparedSearch) -> usize {
        search.len(self.bundle.dimension())
    }

    fn parallelism(&self) -> usize {
        1
    }

    async fn run(
        self: Arc<Self>,
        batch: Vec<PreparedSearch>,
    ) -> Vec<Result<SearchResponse, SearchError>> {
        let count = batch.len();
        let outcome = tokio::task::spawn_blocking(move || {
            let prepared: Vec<&PreparedSearch> = batch.iter().collect();
            self.search_batch(&prepared)
        })
        .await
        .map_err(SearchError::from);
        match outcome {
            Ok(Ok(responses)) => responses.into_iter().map(Ok).collect(),
            Ok(Err(err)) | Err(err) => vec![Err(err); count],
        }
    }
}

/// A shard server's search: one faiss call per request on the blocking pool, or, with
/// micro-batching, concurrent requests coalesced into one faiss call.
#[derive(Clone, Debug)]
pub struct ShardService {
    searcher: Arc<ExactSearcher>,
    batcher: Option<MicroBatcher<ExactSearcher>>,
}

impl ShardService {
    pub fn new(
        searcher: ExactSearcher,
        batching: Option<BatchingSettings>,
        metrics: CloudMetrics,
    ) -> Self {
        let searcher = Arc::new(searcher);
        let batcher =
            batching.map(|settings| MicroBatcher::start(Arc::clone(&searcher), settings, metrics));
        Self { searcher, batcher }
    }
}

impl SearchBackend for ShardService {
    fn info(&self) -> IndexInfo {
        self.searcher.info()
    }

    async fn search(&self, request: SearchRequest) -> Result<SearchResponse, SearchError> {
        if let Some(batcher) = &self.batcher {
            let deadline = request_deadline(&request);
            let prepared = self.searcher.prepare(&request)?;
            return batcher.search(prepared, deadline).await;
        }
        let searcher = Arc::clone(&self.searcher);
        tokio::task::spawn_blocking(move || searcher.search(&request)).await?
    }

    async fn documents(&self, request: DocumentsRequest) -> Result<DocumentsResponse, SearchError> {
        self.searcher.documents(&request)
    }
}

/// When the caller stops waiting: now plus the request's `timeout_ms`, if it gave one.
pub fn request_deadline(request: &SearchRequest) -> Option<Instant> {
    (request.timeout_ms > 0)
        .then(|| Instant::now() + Duration::from_millis(u64::from(request.timeout_ms)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hasten_core::bundle::write_bundle;
    use hasten_core::corpus::Document;
    use hasten_proto::v1::QueryVector;

    fn searcher() -> (tempfile::TempDir, ExactSearcher) {
        searcher_with_texts(|i| format!("text {i}"))
    }

    /// A searcher over 4 documents `t0`..`t3` with `text(i)`, on unit vectors along the
    /// axes of a 4-d space.
    fn searcher_with_texts(text: impl Fn(u64) -> String) -> (tempfile::TempDir, ExactSearcher) {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("b");
        let docs: Vec<Document> = (0..4)
            .map(|i| Document {
                id: i,
                title: format!("t{i}"),
                text: text(i),
            })
            .collect();
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
            ..Default::default()
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
    fn tied_scores_rank_by_document_id_not_by_row() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("b");
        // Rows hold ids 30, 20, 10, 5; the first three share one vector.
        let docs: Vec<Document> = [30, 20, 10, 5]
            .into_iter()
            .map(|id| Document {
                id,
                title: String::new(),
                text: String::new(),
            })
            .collect();
        let vectors = [[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]].concat();
        write_bundle(&out, vec![], &docs, &vectors, 2, &[]).unwrap();
        let s = ExactSearcher::new(CorpusBundle::load(&out).unwrap()).unwrap();
        let resp = s.search(&request(vec![vec![1.0, 0.0]], 2)).unwrap();
        let ids: Vec<u64> = resp.results[0].hits.iter().map(|h| h.id).collect();
        assert_eq!(ids, vec![10, 20]);
    }

    #[test]
    fn an_answer_that_could_exceed_the_message_limit_is_refused_by_the_longest_text_held() {
        // One passage of 20 KB among short ones: 1,024 queries x k = 4 with texts could take
        // 80 MB, whichever documents they hit.
        let (_dir, s) = searcher_with_texts(|i| {
            if i == 3 {
                "x".repeat(20_000)
            } else {
                format!("text {i}")
            }
        });
        // Each field's key, length and bytes: "t3", then the long text.
        assert_eq!(s.info().max_texts_bytes, (1 + 1 + 2) + (1 + 3 + 20_000));
        let mut oversized = request(vec![vec![1.0, 0.0, 0.0, 0.0]; 1024], 4);
        let err = s.search(&oversized).unwrap_err();
        assert!(
            matches!(&err, SearchError::InvalidArgument(m) if m.contains("include_texts = false")),
            "{err}"
        );
        oversized.include_texts = false;
        assert_eq!(s.search(&oversized).unwrap().results.len(), 1024);
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
