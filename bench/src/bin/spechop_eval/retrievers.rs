//! The target tool and the speculators of the SpecHop evaluation, over every paragraph of
//! the question file encoded with all-MiniLM-L6-v2.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hasten_bench::latency::{Latency, LatencySampler};
use hasten_core::index::{ExactIndex, IndexError, IvfPqIndex, IvfShape};
use hasten_core::vector::dot;
use hasten_spec_retrieval::hop::HopSpeculator;
use hasten_spec_retrieval::{ExactRetriever, RetrievedDocument};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The corpus: documents with their vectors, in row order.
pub struct Corpus {
    pub documents: Vec<RetrievedDocument>,
    pub dimension: usize,
}

impl Corpus {
    fn vectors(&self, rows: &[usize]) -> Vec<f32> {
        rows.iter()
            .flat_map(|&r| self.documents[r].vector.iter().copied())
            .collect()
    }

    /// The top `k` of `rows` for `query` by exact inner product, best first.
    fn exact_top(
        &self,
        query: &[f32],
        rows: impl Iterator<Item = usize>,
        k: usize,
    ) -> Vec<RetrievedDocument> {
        let mut scored: Vec<(f32, usize)> = rows
            .map(|r| (dot(query, &self.documents[r].vector), r))
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        scored
            .into_iter()
            .take(k)
            .map(|(score, r)| RetrievedDocument {
                score,
                ..self.documents[r].clone()
            })
            .collect()
    }
}

/// The target: faiss exact search behind a latency model (the paper's 1 s target).
pub struct SlowExact {
    pub corpus: std::sync::Arc<Corpus>,
    index: ExactIndex,
    latency: LatencySampler,
    /// Nanoseconds spent in calls, and calls, for the cost ratios.
    pub spent_nanos: AtomicU64,
    pub calls: AtomicU64,
}

impl SlowExact {
    pub fn new(corpus: std::sync::Arc<Corpus>, latency: Latency, seed: u64) -> Result<Self> {
        let rows: Vec<usize> = (0..corpus.documents.len()).collect();
        let index = ExactIndex::build(corpus.dimension, &corpus.vectors(&rows))
            .context("indexing the corpus")?;
        Ok(Self {
            corpus,
            index,
            latency: LatencySampler::new(latency, seed),
            spent_nanos: AtomicU64::new(0),
            calls: AtomicU64::new(0),
        })
    }

    /// Mean seconds of a call so far.
    pub fn mean_call_seconds(&self) -> f64 {
        let calls = self.calls.load(Ordering::Relaxed).max(1);
        self.spent_nanos.load(Ordering::Relaxed) as f64 / calls as f64 / 1e9
    }
}

impl ExactRetriever for SlowExact {
    type Error = IndexError;

    fn search_batch(
        &self,
        queries: &[Vec<f32>],
        k: usize,
    ) -> std::result::Result<Vec<Vec<RetrievedDocument>>, IndexError> {
        let started = Instant::now();
        let delay = self.latency.next();
        let flat = queries.concat();
        // faiss finds the candidates; the canonical inner product ranks them, as the cloud
        // does, so ties and rounding cannot depend on the batch.
        let hits = self.index.search(&flat, k + 8)?;
        let results = queries
            .iter()
            .zip(hits)
            .map(|(query, hits)| {
                self.corpus
                    .exact_top(query, hits.iter().map(|h| h.id as usize), k)
            })
            .collect();
        std::thread::sleep(delay);
        self.spent_nanos
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.calls.fetch_add(1, Ordering::Relaxed);
        Ok(results)
    }
}

/// What a speculator is built from.
#[derive(Clone, Debug, PartialEq)]
pub enum SpeculatorKind {
    /// The edge's fuzzy channel: IVF-PQ over the whole corpus, its top 50 re-ranked exactly
    /// (the HaS draft's re-rank).
    Fuzzy,
    /// Exact search over a random share of the corpus (the paper's cache of top passages).
    Fraction(f64),
}

impl SpeculatorKind {
    pub fn parse(spec: &str) -> Result<Self> {
        match spec.split_once(':') {
            None if spec == "fuzzy" => Ok(Self::Fuzzy),
            Some(("fraction", f)) => {
                let f: f64 = f
                    .parse()
                    .with_context(|| format!("{spec:?}: bad fraction"))?;
                anyhow::ensure!(
                    f > 0.0 && f <= 1.0,
                    "{spec:?}: the fraction must be in (0, 1]"
                );
                Ok(Self::Fraction(f))
            }
            _ => anyhow::bail!("{spec:?}: expected fuzzy or fraction:F"),
        }
    }
}

/// A speculator over the corpus, timing itself.
pub struct Speculator {
    corpus: std::sync::Arc<Corpus>,
    fuzzy: Option<IvfPqIndex>,
    share: Vec<usize>,
    pub spent: Duration,
    pub calls: usize,
}

/// Candidates the fuzzy channel re-ranks (the HaS reference's 50).
const FUZZY_CANDIDATES: usize = 50;

impl Speculator {
    pub fn new(corpus: std::sync::Arc<Corpus>, kind: &SpeculatorKind, seed: u64) -> Result<Self> {
        let n = corpus.documents.len();
        let (fuzzy, share) = match kind {
            SpeculatorKind::Fuzzy => {
                let rows: Vec<usize> = (0..n).collect();
                let ids: Vec<u64> = (0..n as u64).collect();
                let index = IvfPqIndex::build(
                    corpus.dimension,
                    &ids,
                    &corpus.vectors(&rows),
                    IvfShape::for_corpus(n, None, None),
                )
                .context("building the fuzzy channel")?;
                (Some(index), Vec::new())
            }
            SpeculatorKind::Fraction(f) => {
                let mut rng = StdRng::seed_from_u64(seed);
                let share = (0..n).filter(|_| rng.random_bool(*f)).collect();
                (None, share)
            }
        };
        Ok(Self {
            corpus,
            fuzzy,
            share,
            spent: Duration::ZERO,
            calls: 0,
        })
    }
}

impl HopSpeculator for Speculator {
    type Error = IndexError;

    fn speculate(
        &mut self,
        query: &[f32],
        k: usize,
    ) -> std::result::Result<Vec<RetrievedDocument>, IndexError> {
        let started = Instant::now();
        let found = match &self.fuzzy {
            Some(index) => {
                let hits = index.search(query, FUZZY_CANDIDATES)?;
                self.corpus
                    .exact_top(query, hits.iter().map(|h| h.id as usize), k)
            }
            None => self.corpus.exact_top(query, self.share.iter().copied(), k),
        };
        self.spent += started.elapsed();
        self.calls += 1;
        Ok(found)
    }
}
