//! The two draft channels and the documents behind them.
//!
//! - [`DocumentStore`]: the corpus documents the edge was given, by id; what it serves a
//!   cached result from, including results other edges fetched (replicated by id only).
//! - [`FuzzyChannel`]: IVF-PQ over the edge's share of the corpus, probed aggressively
//!   little; its candidates are re-ranked exactly with the full vectors it keeps.
//! - [`CacheChannel`]: an ANN index over exactly the documents the hot cache references,
//!   following the cache as queries are inserted and evicted, with those documents' vectors
//!   and texts (they may lie outside the edge's share of the corpus).

use std::collections::HashMap;
use std::sync::Arc;

use hasten_core::DocId;
use hasten_core::bundle::CorpusBundle;
use hasten_core::index::{Hit, IndexError, IvfPqIndex, IvfShape, RemovableIvfIndex};

/// A document as the edge holds it: enough to re-rank it exactly and to return it.
#[derive(Clone, Debug, PartialEq)]
pub struct EdgeDocument {
    pub id: DocId,
    pub title: String,
    pub text: String,
    pub vector: Vec<f32>,
}

/// Deterministic membership of a document in the edge's share of the corpus: a hash of the
/// id compared with the fraction, so every edge with the same fraction holds the same share.
pub fn in_edge_share(id: DocId, fraction: f64) -> bool {
    if fraction >= 1.0 {
        return true;
    }
    // SplitMix64 finaliser: consecutive ids map to well-spread values.
    let mut z = id.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z as f64 / u64::MAX as f64) < fraction
}

/// The corpus documents an edge holds, by id. Replicated cache entries name their documents
/// by id; every edge resolves them here, so they need not travel through the control plane.
#[derive(Debug, Default)]
pub struct DocumentStore {
    dimension: usize,
    documents: HashMap<DocId, Arc<EdgeDocument>>,
}

impl DocumentStore {
    /// Every document of `bundle`, with its vector.
    pub fn from_bundle(bundle: &CorpusBundle) -> Self {
        let documents = (0..bundle.len())
            .map(|row| {
                let doc = &bundle.documents[row];
                EdgeDocument {
                    id: doc.id,
                    title: doc.title.clone(),
                    text: doc.text.clone(),
                    vector: bundle.vector(row).to_vec(),
                }
            })
            .collect();
        Self::new(bundle.dimension(), documents)
    }

    pub fn new(dimension: usize, documents: Vec<EdgeDocument>) -> Self {
        Self {
            dimension,
            documents: documents.into_iter().map(|d| (d.id, Arc::new(d))).collect(),
        }
    }

    pub fn get(&self, id: DocId) -> Option<&Arc<EdgeDocument>> {
        self.documents.get(&id)
    }

    pub fn dimension(&self) -> usize {
        self.dimension
    }

    pub fn len(&self) -> usize {
        self.documents.len()
    }

    pub fn is_empty(&self) -> bool {
        self.documents.is_empty()
    }

    /// The documents of the edge's share of the corpus at `fraction`, in id order.
    pub fn share(&self, fraction: f64) -> Vec<Arc<EdgeDocument>> {
        let mut share: Vec<Arc<EdgeDocument>> = self
            .documents
            .values()
            .filter(|d| in_edge_share(d.id, fraction))
            .cloned()
            .collect();
        share.sort_by_key(|d| d.id);
        share
    }
}

/// IVF-PQ over the edge's share of the corpus.
#[derive(Debug)]
pub struct FuzzyChannel {
    index: IvfPqIndex,
    documents: HashMap<DocId, Arc<EdgeDocument>>,
}

impl FuzzyChannel {
    /// Takes the share of `store` selected by `fraction` and builds the index over it.
    pub fn build(
        store: &DocumentStore,
        fraction: f64,
        nlist: Option<usize>,
        nprobe: Option<usize>,
    ) -> Result<Self, IndexError> {
        Self::from_documents(store.dimension(), store.share(fraction), nlist, nprobe)
    }

    /// Builds the index over `documents`, sizing the IVF for their number.
    fn from_documents(
        dimension: usize,
        documents: Vec<Arc<EdgeDocument>>,
        nlist: Option<usize>,
        nprobe: Option<usize>,
    ) -> Result<Self, IndexError> {
        let ids: Vec<u64> = documents.iter().map(|d| d.id).collect();
        let vectors: Vec<f32> = documents
            .iter()
            .flat_map(|d| d.vector.iter().copied())
            .collect();
        let shape = IvfShape::for_corpus(documents.len(), nlist, nprobe);
        let index = IvfPqIndex::build(dimension, &ids, &vectors, shape)?;
        let documents = documents.into_iter().map(|d| (d.id, d)).collect();
        Ok(Self { index, documents })
    }

    pub fn len(&self) -> usize {
        self.documents.len()
    }

    pub fn is_empty(&self) -> bool {
        self.documents.is_empty()
    }

    pub fn index(&self) -> &IvfPqIndex {
        &self.index
    }

    pub fn search(&self, query: &[f32], candidates: usize) -> Result<Vec<Hit>, IndexError> {
        self.index.search(query, candidates)
    }

    /// The documents of the `candidates` nearest codes, best first (approximate order).
    pub fn candidates(
        &self,
        query: &[f32],
        candidates: usize,
    ) -> Result<Vec<Arc<EdgeDocument>>, IndexError> {
        Ok(self
            .search(query, candidates)?
            .iter()
            .filter_map(|hit| self.document(hit.id).cloned())
            .collect())
    }

    pub fn document(&self, id: DocId) -> Option<&Arc<EdgeDocument>> {
        self.documents.get(&id)
    }
}

/// ANN over the documents the hot cache references, with their vectors and texts: PQ codes
/// find candidates, which the draft re-ranks exactly with the documents' vectors.
#[derive(Debug)]
pub struct CacheChannel {
    index: RemovableIvfIndex,
    documents: HashMap<DocId, Arc<EdgeDocument>>,
}

impl CacheChannel {
    /// An empty channel whose index is trained on `sample` (row-major vectors of the corpus
    /// the cached documents come from). Lists scale with the sample like the fuzzy
    /// channel's. Probes default to a sixteenth of the lists: wider than the fuzzy channel,
    /// since the cache channel feeds the validator, yet a full 50,000-document cache costs
    /// ~0.3 ms to probe (an eighth cost ~0.5 ms; on the SQuAD demo neither changed DAR or
    /// DHR with the whole corpus at the edge).
    pub fn train(
        dimension: usize,
        sample: &[f32],
        nlist: Option<usize>,
        nprobe: Option<usize>,
    ) -> Result<Self, IndexError> {
        let rows = sample.len() / dimension.max(1);
        let nlist = IvfShape::for_corpus(rows, nlist, None).nlist;
        let shape = IvfShape::for_corpus(
            rows,
            Some(nlist),
            Some(nprobe.unwrap_or((nlist / 16).max(1))),
        );
        Ok(Self {
            index: RemovableIvfIndex::train(dimension, sample, shape)?,
            documents: HashMap::new(),
        })
    }

    /// An empty channel trained like this one, for another tenant's cache.
    pub fn empty_copy(&self) -> Result<Self, IndexError> {
        Ok(Self {
            index: self.index.empty_copy()?,
            documents: HashMap::new(),
        })
    }

    /// The IVF shape the channel was trained with.
    pub fn shape(&self) -> IvfShape {
        self.index.shape()
    }

    pub fn len(&self) -> usize {
        self.documents.len()
    }

    pub fn is_empty(&self) -> bool {
        self.documents.is_empty()
    }

    pub fn dimension(&self) -> usize {
        self.index.dimension()
    }

    /// Bytes held: one PQ code and id per indexed document, plus the documents the
    /// channel alone keeps alive (a fallback's documents missing from the edge's store);
    /// documents shared with the store cost a pointer.
    pub fn bytes(&self) -> usize {
        let codes = self.index.len() * self.index.bytes_per_vector();
        let documents: usize = self
            .documents
            .values()
            .map(|d| {
                if Arc::strong_count(d) == 1 {
                    d.vector.len() * 4 + d.title.len() + d.text.len() + 96
                } else {
                    48
                }
            })
            .sum();
        codes + documents
    }

    /// Indexed vectors; equals `len()` unless an index update failed.
    pub fn indexed(&self) -> usize {
        self.index.len()
    }

    /// Adds documents not yet present.
    pub fn add(&mut self, documents: Vec<Arc<EdgeDocument>>) -> Result<(), IndexError> {
        let fresh: Vec<Arc<EdgeDocument>> = documents
            .into_iter()
            .filter(|d| !self.documents.contains_key(&d.id))
            .collect();
        let ids: Vec<u64> = fresh.iter().map(|d| d.id).collect();
        let vectors: Vec<f32> = fresh
            .iter()
            .flat_map(|d| d.vector.iter().copied())
            .collect();
        self.index.add(&ids, &vectors)?;
        self.documents.extend(fresh.into_iter().map(|d| (d.id, d)));
        Ok(())
    }

    /// Removes documents the cache no longer references.
    pub fn remove(&mut self, ids: &[DocId]) -> Result<(), IndexError> {
        self.index.remove(ids)?;
        for id in ids {
            self.documents.remove(id);
        }
        Ok(())
    }

    pub fn search(&self, query: &[f32], candidates: usize) -> Result<Vec<Hit>, IndexError> {
        self.index.search(query, candidates)
    }

    /// The documents of the `candidates` nearest codes (approximate order).
    pub fn candidates(
        &self,
        query: &[f32],
        candidates: usize,
    ) -> Result<Vec<Arc<EdgeDocument>>, IndexError> {
        Ok(self
            .search(query, candidates)?
            .iter()
            .filter_map(|hit| self.document(hit.id).cloned())
            .collect())
    }

    pub fn document(&self, id: DocId) -> Option<&Arc<EdgeDocument>> {
        self.documents.get(&id)
    }

    pub fn contains(&self, id: DocId) -> bool {
        self.documents.contains_key(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edge_share_is_deterministic_and_close_to_the_fraction() {
        let held = (0..10_000u64).filter(|&id| in_edge_share(id, 0.25)).count();
        assert!((2_300..2_700).contains(&held), "{held}");
        assert!((0..1000u64).all(|id| in_edge_share(id, 1.0)));
        assert!((0..1000u64).all(|id| !in_edge_share(id, 0.0)));
        assert_eq!(in_edge_share(42, 0.5), in_edge_share(42, 0.5));
    }
}
