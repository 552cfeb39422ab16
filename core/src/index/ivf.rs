//! IVF-PQ indexes: the edge's fuzzy channel over a fixed corpus share and its cache channel
//! over the documents of cached queries. Both search through `&self` ([`SharedIvf`]), so
//! concurrent requests probe lists side by side.

use faiss::index::TryClone;
use faiss::selector::IdSelector;
use faiss::{Index, MetricType};

use super::ivf_search::SharedIvf;
use super::{Hit, IndexError, check_ids, check_queries, to_faiss_ids};

/// Shape of an IVF index for `n` training vectors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IvfShape {
    pub nlist: usize,
    pub nprobe: usize,
}

impl IvfShape {
    /// faiss's k-means wants at least 39 training points per centroid; fewer gives noisy,
    /// partly empty lists.
    const MIN_POINTS_PER_LIST: usize = 39;

    /// Fewest codes one probe set should cover. The edge's drafts are only as good as the
    /// lists probed: on the 104,603-passage EntityQuestions corpus (81 codes a list), edge
    /// search alone hit a document with the answer for 53.2% of new questions at 13 probes
    /// (~1,000 codes), 60.6% at 64 and 64.5% at 256, against the cloud's 66.3%; HaS at tau 0.4
    /// lost 1.74, 0.90 and 0.29 points to the cloud. The floor gives 103 probes there, every
    /// list of a 7,455-passage corpus, and leaves the reference's 64 probes in charge at its
    /// 21M passages (where it asks for 4).
    const MIN_SCANNED_CODES: usize = 8192;

    /// The HaS reference uses 8,192 lists probed 64 at a time on a 21M-passage corpus.
    /// Scale the lists with the usual 4·sqrt(n) rule (capped by the training bound above and
    /// by 8,192) and keep the reference's probe fraction 64/8192, but never scan fewer than
    /// [`Self::MIN_SCANNED_CODES`] codes, unless told otherwise.
    pub fn for_corpus(n: usize, nlist: Option<usize>, nprobe: Option<usize>) -> Self {
        let auto = ((4.0 * (n as f64).sqrt()) as usize)
            .min(n / Self::MIN_POINTS_PER_LIST)
            .clamp(1, 8192);
        let nlist = nlist.unwrap_or(auto).clamp(1, n.max(1));
        let nprobe = nprobe
            .unwrap_or_else(|| {
                let reference = (nlist * 64).div_ceil(8192);
                let per_list = (n / nlist).max(1);
                reference.max(Self::MIN_SCANNED_CODES.div_ceil(per_list))
            })
            .clamp(1, nlist);
        Self { nlist, nprobe }
    }
}

/// IVF-PQ over a fixed set of vectors: an approximate, compressed index (the fuzzy channel).
/// Searches take `&self` and run concurrently.
pub struct IvfPqIndex {
    index: SharedIvf,
    dimension: usize,
    shape: IvfShape,
    description: String,
}

impl std::fmt::Debug for IvfPqIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IvfPqIndex")
            .field("description", &self.description)
            .field("nprobe", &self.shape.nprobe)
            .finish()
    }
}

/// The faiss factory string of an IVF-PQ index over `rows` training vectors.
///
/// PQ uses one 8-bit code per 6 dimensions, the reference's ratio (128 codes at 768-d); a
/// small training set gets fewer bits per code so each codebook still sees ~39 points per
/// centroid. `np`: no polysemous training, which only serves Hamming-distance filtering
/// (unused here) and costs minutes of simulated annealing.
fn ivf_pq_description(dimension: usize, rows: usize, nlist: usize) -> String {
    let mut sub_quantizers = (dimension / 6).max(1);
    while !dimension.is_multiple_of(sub_quantizers) {
        sub_quantizers -= 1;
    }
    let bits = ((rows / IvfShape::MIN_POINTS_PER_LIST).max(2).ilog2()).clamp(1, 8);
    format!("IVF{nlist},PQ{sub_quantizers}x{bits}np")
}

/// Bytes of one PQ code in an index built from `description` (`...,PQ{m}x{bits}...`).
fn pq_code_bytes(description: &str) -> usize {
    description
        .split_once(",PQ")
        .and_then(|(_, pq)| {
            let (m, rest) = pq.split_once('x')?;
            let bits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            Some((m.parse::<usize>().ok()? * bits.parse::<usize>().ok()?).div_ceil(8))
        })
        .unwrap_or(0)
}

impl IvfPqIndex {
    /// Trains on and adds `vectors` with `ids` (see [`ivf_pq_description`] for the codes).
    pub fn build(
        dimension: usize,
        ids: &[u64],
        vectors: &[f32],
        shape: IvfShape,
    ) -> Result<Self, IndexError> {
        let xids = check_ids(ids, vectors, dimension)?;
        if ids.is_empty() {
            return Err(IndexError::Invalid(
                "cannot train an IVF-PQ index on no vectors".into(),
            ));
        }
        let description = ivf_pq_description(dimension, ids.len(), shape.nlist);
        let mut index =
            faiss::index_factory(dimension as u32, &description, MetricType::InnerProduct)?;
        index.train(vectors)?;
        index.add_with_ids(vectors, &xids)?;
        Ok(Self {
            index: SharedIvf::new(index, shape.nprobe)?,
            dimension,
            shape,
            description,
        })
    }

    pub fn shape(&self) -> IvfShape {
        self.shape
    }

    pub fn dimension(&self) -> usize {
        self.dimension
    }

    /// The faiss factory string the index was built from.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// Approximate top-`k` for one query; scores are PQ approximations.
    pub fn search(&self, query: &[f32], k: usize) -> Result<Vec<Hit>, IndexError> {
        check_queries(query, self.dimension)?;
        self.index.search_one(query, k)
    }
}

/// IVF-PQ that supports adding and removing vectors by id: the cache channel, whose contents
/// follow the hot cache's FIFO.
///
/// The coarse centroids and PQ codebooks are trained once on a sample of the corpus, so the
/// index works from an empty cache (cold start) and needs no rebuild as the cache turns
/// over. A code takes one byte per 6 dimensions (72 bytes with its id at 384-d, against 392
/// for 8-bit scalar codes): scores are approximate, so callers re-rank candidates exactly.
/// Searches take `&self` and run concurrently; adding and removing take `&mut self`.
pub struct RemovableIvfIndex {
    index: SharedIvf,
    dimension: usize,
    shape: IvfShape,
    description: String,
}

impl std::fmt::Debug for RemovableIvfIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemovableIvfIndex")
            .field("description", &self.description)
            .field("nprobe", &self.shape.nprobe)
            .field("len", &self.len())
            .finish()
    }
}

impl RemovableIvfIndex {
    /// Creates an empty index whose centroids and codebooks are trained on `sample`.
    pub fn train(dimension: usize, sample: &[f32], shape: IvfShape) -> Result<Self, IndexError> {
        let rows = check_queries(sample, dimension)?;
        if rows == 0 {
            return Err(IndexError::Invalid(
                "cannot train the cache channel on no vectors".into(),
            ));
        }
        let description = ivf_pq_description(dimension, rows, shape.nlist);
        let mut index =
            faiss::index_factory(dimension as u32, &description, MetricType::InnerProduct)?;
        index.train(sample)?;
        Ok(Self {
            index: SharedIvf::new(index, shape.nprobe)?,
            dimension,
            shape,
            description,
        })
    }

    /// An empty index with the same trained centroids and codebooks: one training serves
    /// many caches (one per tenant).
    pub fn empty_copy(&self) -> Result<Self, IndexError> {
        let mut index = self.index.index().try_clone()?;
        index.reset()?;
        Ok(Self {
            index: SharedIvf::new(index, self.shape.nprobe)?,
            dimension: self.dimension,
            shape: self.shape,
            description: self.description.clone(),
        })
    }

    pub fn shape(&self) -> IvfShape {
        self.shape
    }

    pub fn dimension(&self) -> usize {
        self.dimension
    }

    /// Bytes one indexed vector takes in the lists: its PQ code and its id.
    pub fn bytes_per_vector(&self) -> usize {
        pq_code_bytes(&self.description) + 8
    }

    pub fn len(&self) -> usize {
        self.index.index().ntotal() as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds `vectors` (row-major) under `ids`. Ids must not already be present.
    pub fn add(&mut self, ids: &[u64], vectors: &[f32]) -> Result<(), IndexError> {
        let xids = check_ids(ids, vectors, self.dimension)?;
        if !xids.is_empty() {
            self.index.index_mut().add_with_ids(vectors, &xids)?;
        }
        Ok(())
    }

    /// Removes every vector whose id is in `ids`; returns how many were removed.
    pub fn remove(&mut self, ids: &[u64]) -> Result<usize, IndexError> {
        if ids.is_empty() {
            return Ok(0);
        }
        let selector = IdSelector::batch(&to_faiss_ids(ids)?)?;
        Ok(self.index.index_mut().remove_ids(&selector)?)
    }

    /// Approximate top-`k` for one query; scores are PQ approximations.
    pub fn search(&self, query: &[f32], k: usize) -> Result<Vec<Hit>, IndexError> {
        check_queries(query, self.dimension)?;
        self.index.search_one(query, k)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_vectors::{brute_force, clustered_vectors, unit_vectors};
    use super::*;
    use crate::vector::dot;

    #[test]
    fn ivf_shape_scales_with_the_corpus() {
        assert_eq!(IvfShape::for_corpus(20_000, None, None).nlist, 512);
        assert_eq!(IvfShape::for_corpus(20_000, None, None).nprobe, 211);
        assert_eq!(IvfShape::for_corpus(104_603, None, None).nprobe, 103);
        assert_eq!(IvfShape::for_corpus(7_455, None, None).nprobe, 191);
        assert_eq!(IvfShape::for_corpus(21_000_000, None, None).nlist, 8192);
        assert_eq!(IvfShape::for_corpus(21_000_000, None, None).nprobe, 64);
        assert_eq!(IvfShape::for_corpus(10, None, None).nlist, 1);
        assert_eq!(IvfShape::for_corpus(1000, Some(4), Some(99)).nprobe, 4);
    }

    #[test]
    fn ivf_pq_finds_the_query_vector_itself() {
        let d = 32;
        let n = 2000;
        let vectors = unit_vectors(n, d, 5);
        let ids: Vec<u64> = (0..n as u64).map(|i| i * 3 + 1).collect();
        let shape = IvfShape::for_corpus(n, None, Some(8));
        let index = IvfPqIndex::build(d, &ids, &vectors, shape).unwrap();
        let found = (0..50)
            .filter(|&row| {
                let hits = index.search(&vectors[row * d..(row + 1) * d], 20).unwrap();
                hits.iter().any(|h| h.id == ids[row])
            })
            .count();
        assert!(found >= 40, "only {found}/50 self-matches in the top 20");
    }

    /// Searches through `&self` from several threads at once return what the same searches
    /// return one at a time: faiss's const search shares the lists without a lock.
    #[test]
    fn concurrent_searches_equal_serial_ones() {
        let d = 32;
        let n = 3000;
        let vectors = unit_vectors(n, d, 11);
        let ids: Vec<u64> = (0..n as u64).collect();
        let fuzzy =
            IvfPqIndex::build(d, &ids, &vectors, IvfShape::for_corpus(n, None, None)).unwrap();
        let mut cache = RemovableIvfIndex::train(d, &vectors, fuzzy.shape()).unwrap();
        cache.add(&ids[..1500], &vectors[..1500 * d]).unwrap();
        let queries = unit_vectors(400, d, 12);
        let serial: Vec<(Vec<Hit>, Vec<Hit>)> = queries
            .chunks(d)
            .map(|q| (fuzzy.search(q, 10).unwrap(), cache.search(q, 10).unwrap()))
            .collect();
        let concurrent: Vec<Vec<(Vec<Hit>, Vec<Hit>)>> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..4)
                .map(|_| {
                    scope.spawn(|| {
                        queries
                            .chunks(d)
                            .map(|q| (fuzzy.search(q, 10).unwrap(), cache.search(q, 10).unwrap()))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        assert!(serial.iter().all(|(f, c)| f.len() == 10 && c.len() == 10));
        for run in concurrent {
            assert_eq!(run, serial);
        }
    }

    #[test]
    fn removable_ivf_adds_searches_and_removes_by_id() {
        let d = 16;
        let sample = unit_vectors(400, d, 6);
        let mut index = RemovableIvfIndex::train(
            d,
            &sample,
            IvfShape {
                nlist: 4,
                nprobe: 4,
            },
        )
        .unwrap();
        assert!(index.search(&sample[..d], 3).unwrap().is_empty());
        let ids = [10u64, 20, 30];
        index.add(&ids, &sample[..3 * d]).unwrap();
        assert_eq!(index.len(), 3);
        let ids_found = |index: &RemovableIvfIndex| -> Vec<u64> {
            let mut found: Vec<u64> = index
                .search(&sample[d..2 * d], 3)
                .unwrap()
                .iter()
                .map(|h| h.id)
                .collect();
            found.sort_unstable();
            found
        };
        assert_eq!(ids_found(&index), vec![10, 20, 30]);
        assert_eq!(index.remove(&[20, 99]).unwrap(), 1);
        assert_eq!(ids_found(&index), vec![10, 30]);
        assert!(index.add(&[u64::MAX], &sample[..d]).is_err());
        let copy = index.empty_copy().unwrap();
        assert!(copy.is_empty() && index.len() == 2);
    }

    /// The cache channel's contract: PQ candidates re-ranked exactly find the exact top 10
    /// of what is indexed, after churn, with codes far smaller than the vectors.
    #[test]
    fn removable_ivf_candidates_reranked_match_the_exact_top_k() {
        let d = 48;
        let sample = clustered_vectors(4000, d, 40, 9);
        let shape = IvfShape::for_corpus(4000, None, None);
        let shape = IvfShape {
            nprobe: shape.nlist,
            ..shape
        };
        let mut index = RemovableIvfIndex::train(d, &sample, shape).unwrap();
        assert!(index.bytes_per_vector() < d, "{}", index.bytes_per_vector());
        let ids: Vec<u64> = (0..2000).collect();
        index.add(&ids, &sample[..2000 * d]).unwrap();
        let gone: Vec<u64> = (0..2000).step_by(2).collect();
        index.remove(&gone).unwrap();
        let kept: Vec<f32> = sample[..2000 * d]
            .chunks(d)
            .enumerate()
            .filter(|(i, _)| i % 2 == 1)
            .flat_map(|(_, v)| v.to_vec())
            .collect();
        // Rows never indexed, from the same topics.
        let queries = &sample[2000 * d..2020 * d];
        let mut recalled = 0;
        for query in queries.chunks(d) {
            let exact: Vec<u64> = brute_force(&kept, d, query, 10)
                .iter()
                .map(|row| row * 2 + 1)
                .collect();
            let mut candidates: Vec<(f32, u64)> = index
                .search(query, 50)
                .unwrap()
                .iter()
                .map(|h| (dot(query, &sample[h.id as usize * d..][..d]), h.id))
                .collect();
            assert!(
                candidates.iter().all(|(_, id)| id % 2 == 1),
                "a removed id came back"
            );
            candidates.sort_by(|a, b| b.0.total_cmp(&a.0));
            recalled += candidates
                .iter()
                .take(10)
                .filter(|(_, id)| exact.contains(id))
                .count();
        }
        assert!(recalled >= 190, "recall@10 {recalled}/200");
    }
}
