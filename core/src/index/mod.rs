//! Vector indexes over faiss, all by inner product on L2-normalised vectors (cosine):
//! - [`ExactIndex`]: exhaustive flat search, the cloud's exact top-k;
//! - [`IvfPqIndex`]: IVF with product quantisation, the edge's fuzzy channel;
//! - [`RemovableIvfIndex`]: IVF-PQ trained once, filled and emptied by id, the edge's
//!   cache channel (faiss's HNSW cannot remove vectors; IVF lists can);
//! - [`RemovableFlatIndex`]: exact search with add and remove by id, for small sets that
//!   churn (the semantic cache's query vectors).

mod ivf;
mod ivf_search;
#[cfg(test)]
mod test_vectors;

pub use ivf::{IvfPqIndex, IvfShape, RemovableIvfIndex};

use faiss::selector::IdSelector;
use faiss::{ConcurrentIndex, FlatIndex, IdMap, Idx, Index};

#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error("faiss")]
    Faiss(#[from] faiss::error::Error),
    #[error("{0}")]
    Invalid(String),
    #[error("faiss search failed (code {code}): {message}")]
    Search { code: i32, message: String },
}

/// A search hit: the id the vector was added with and its inner product with the query.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hit {
    pub id: u64,
    pub score: f32,
}

/// Splits faiss's flat result arrays into one hit list per query, dropping empty slots
/// (faiss pads with -1 when fewer than k vectors exist).
fn hits_per_query(labels: &[Idx], distances: &[f32], k: usize) -> Vec<Vec<Hit>> {
    labels
        .chunks(k.max(1))
        .zip(distances.chunks(k.max(1)))
        .map(|(labels, scores)| {
            labels
                .iter()
                .zip(scores)
                .filter_map(|(label, &score)| label.get().map(|id| Hit { id, score }))
                .collect()
        })
        .collect()
}

fn check_queries(queries: &[f32], dimension: usize) -> Result<usize, IndexError> {
    if dimension == 0 || !queries.len().is_multiple_of(dimension) {
        return Err(IndexError::Invalid(format!(
            "query buffer of {} values is not a whole number of {dimension}-d vectors",
            queries.len()
        )));
    }
    Ok(queries.len() / dimension)
}

fn check_ids(ids: &[u64], vectors: &[f32], dimension: usize) -> Result<Vec<Idx>, IndexError> {
    if vectors.len() != ids.len() * dimension {
        return Err(IndexError::Invalid(format!(
            "{} vector values for {} ids of dimension {dimension}",
            vectors.len(),
            ids.len()
        )));
    }
    to_faiss_ids(ids)
}

/// faiss ids are signed 64-bit; refuse the upper half instead of letting `Idx::new` panic.
fn to_faiss_ids(ids: &[u64]) -> Result<Vec<Idx>, IndexError> {
    ids.iter()
        .map(|&id| {
            i64::try_from(id)
                .map(|_| Idx::new(id))
                .map_err(|_| IndexError::Invalid(format!("id {id} is beyond faiss's range")))
        })
        .collect()
}

/// Exhaustive inner-product search. Searches take `&self` and may run concurrently.
pub struct ExactIndex {
    index: FlatIndex,
    dimension: usize,
}

impl std::fmt::Debug for ExactIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExactIndex")
            .field("dimension", &self.dimension)
            .field("len", &self.index.ntotal())
            .finish()
    }
}

impl ExactIndex {
    /// Builds an index over row-major `vectors`; hit ids are row numbers.
    pub fn build(dimension: usize, vectors: &[f32]) -> Result<Self, IndexError> {
        check_queries(vectors, dimension)?;
        let mut index = FlatIndex::new_ip(dimension as u32)?;
        index.add(vectors)?;
        Ok(Self { index, dimension })
    }

    pub fn len(&self) -> usize {
        self.index.ntotal() as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Exact top-`k` for each row-major query in `queries`, in one faiss call.
    pub fn search(&self, queries: &[f32], k: usize) -> Result<Vec<Vec<Hit>>, IndexError> {
        let nq = check_queries(queries, self.dimension)?;
        if nq == 0 || k == 0 {
            return Ok(vec![Vec::new(); nq]);
        }
        let result = ConcurrentIndex::search(&self.index, queries, k)?;
        Ok(hits_per_query(&result.labels, &result.distances, k))
    }
}

/// Exhaustive inner-product search over vectors added and removed by id, for small sets
/// that churn (the semantic cache's query vectors).
pub struct RemovableIndex<I> {
    index: I,
    dimension: usize,
}

/// Exhaustive inner-product search over vectors added and removed by id.
pub type RemovableFlatIndex = RemovableIndex<IdMap<FlatIndex>>;

impl<I: Index> std::fmt::Debug for RemovableIndex<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemovableIndex")
            .field("dimension", &self.dimension)
            .field("len", &self.index.ntotal())
            .finish()
    }
}

impl RemovableFlatIndex {
    pub fn new(dimension: usize) -> Result<Self, IndexError> {
        Ok(Self {
            index: IdMap::new(FlatIndex::new_ip(dimension as u32)?)?,
            dimension,
        })
    }
}

impl<I: Index + ConcurrentIndex> RemovableIndex<I> {
    pub fn dimension(&self) -> usize {
        self.dimension
    }

    pub fn len(&self) -> usize {
        self.index.ntotal() as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds `vectors` (row-major) under `ids`. Ids must not already be present.
    pub fn add(&mut self, ids: &[u64], vectors: &[f32]) -> Result<(), IndexError> {
        let xids = check_ids(ids, vectors, self.dimension)?;
        if !xids.is_empty() {
            self.index.add_with_ids(vectors, &xids)?;
        }
        Ok(())
    }

    /// Removes every vector whose id is in `ids`; returns how many were removed.
    pub fn remove(&mut self, ids: &[u64]) -> Result<usize, IndexError> {
        if ids.is_empty() {
            return Ok(0);
        }
        let selector = IdSelector::batch(&to_faiss_ids(ids)?)?;
        Ok(self.index.remove_ids(&selector)?)
    }

    /// Top-`k` for one query (approximate for the IVF kind, exact for the flat one).
    pub fn search(&self, query: &[f32], k: usize) -> Result<Vec<Hit>, IndexError> {
        check_queries(query, self.dimension)?;
        if k == 0 || self.is_empty() {
            return Ok(Vec::new());
        }
        let result = ConcurrentIndex::search(&self.index, query, k)?;
        Ok(hits_per_query(&result.labels, &result.distances, k)
            .pop()
            .unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::test_vectors::{brute_force, unit_vectors};
    use super::*;
    use crate::vector::dot;

    #[test]
    fn exact_index_equals_brute_force_for_a_batch() {
        let d = 16;
        let vectors = unit_vectors(500, d, 1);
        let queries = unit_vectors(7, d, 2);
        let index = ExactIndex::build(d, &vectors).unwrap();
        let results = index.search(&queries, 5).unwrap();
        assert_eq!(results.len(), 7);
        for (q, hits) in queries.chunks(d).zip(&results) {
            let ids: Vec<u64> = hits.iter().map(|h| h.id).collect();
            assert_eq!(ids, brute_force(&vectors, d, q, 5));
            assert!((hits[0].score - dot(q, &vectors[ids[0] as usize * d..][..d])).abs() < 1e-5);
        }
    }

    #[test]
    fn exact_index_pads_nothing_when_k_exceeds_the_corpus() {
        let index = ExactIndex::build(4, &unit_vectors(3, 4, 3)).unwrap();
        let hits = index.search(&unit_vectors(1, 4, 4), 10).unwrap();
        assert_eq!(hits[0].len(), 3);
    }

    #[test]
    fn removable_flat_is_exact_and_forgets_removed_ids() {
        let d = 8;
        let vectors = unit_vectors(50, d, 8);
        let mut index = RemovableFlatIndex::new(d).unwrap();
        let ids: Vec<u64> = (100..150).collect();
        index.add(&ids, &vectors).unwrap();
        let query = &vectors[7 * d..8 * d];
        let top = index.search(query, 3).unwrap();
        let expected: Vec<u64> = brute_force(&vectors, d, query, 3)
            .iter()
            .map(|r| r + 100)
            .collect();
        assert_eq!(top.iter().map(|h| h.id).collect::<Vec<_>>(), expected);
        assert_eq!(index.remove(&[107]).unwrap(), 1);
        assert!(index.search(query, 3).unwrap().iter().all(|h| h.id != 107));
        assert_eq!(index.len(), 49);
    }
}
