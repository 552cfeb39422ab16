//! Test fixtures shared by the RaLMSpec and SpecHop tests: a trigram-hashing query
//! encoder, short documents encoded with it, and faiss exact search over them.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hasten_core::index::{ExactIndex, IndexError};
use hasten_core::vector::dot;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::EncodeError;
use crate::retriever::{ExactRetriever, QueryEncoder, RetrievedDocument};

pub const DIMENSION: usize = 32;

/// Character-trigram counts hashed into a small normalised vector: texts that share
/// trigrams are near, so the query (question + generated text) moves between documents as
/// the tiny model writes.
pub struct TrigramEncoder;

impl QueryEncoder for TrigramEncoder {
    fn encode(&self, text: &str) -> std::result::Result<Vec<f32>, EncodeError> {
        let chars: Vec<char> = text.to_lowercase().chars().collect();
        let mut vector = vec![0f32; DIMENSION];
        for window in chars.windows(3) {
            let hash = window
                .iter()
                .fold(2166136261u32, |h, c| (h ^ *c as u32).wrapping_mul(16777619));
            vector[hash as usize % DIMENSION] += 1.0;
        }
        let norm = dot(&vector, &vector).sqrt().max(f32::MIN_POSITIVE);
        Ok(vector.iter().map(|v| v / norm).collect())
    }
}

/// faiss exact search over fixed documents, counting its calls.
pub struct FaissRetriever {
    index: ExactIndex,
    documents: Vec<RetrievedDocument>,
    pub calls: AtomicUsize,
    /// Added to every call, as a remote retriever's round trip.
    pub latency: Duration,
}

impl FaissRetriever {
    pub fn new(documents: Vec<RetrievedDocument>) -> Self {
        let vectors: Vec<f32> = documents.iter().flat_map(|d| d.vector.to_vec()).collect();
        Self {
            index: ExactIndex::build(DIMENSION, &vectors).unwrap(),
            documents,
            calls: AtomicUsize::new(0),
            latency: Duration::ZERO,
        }
    }
}

impl ExactRetriever for FaissRetriever {
    type Error = IndexError;

    fn search_batch(
        &self,
        queries: &[Vec<f32>],
        k: usize,
    ) -> std::result::Result<Vec<Vec<RetrievedDocument>>, IndexError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(self.latency);
        self.search_now(queries, k)
    }
}

impl FaissRetriever {
    /// The exact answer without the latency: what an always-right speculator returns.
    pub fn search_now(
        &self,
        queries: &[Vec<f32>],
        k: usize,
    ) -> std::result::Result<Vec<Vec<RetrievedDocument>>, IndexError> {
        let flat: Vec<f32> = queries.concat();
        let hits = self.index.search(&flat, k)?;
        Ok(hits
            .into_iter()
            .map(|hits| {
                hits.into_iter()
                    .map(|hit| RetrievedDocument {
                        score: hit.score,
                        ..self.documents[hit.id as usize].clone()
                    })
                    .collect()
            })
            .collect())
    }
}

pub fn corpus() -> Vec<RetrievedDocument> {
    let words = [
        "river", "north", "stone", "alps", "blue", "delta", "ridge", "lake", "glacier", "valley",
        "flows", "high", "wide", "long", "salt", "sea",
    ];
    let mut rng = StdRng::seed_from_u64(5);
    (0..48u64)
        .map(|id| {
            let text: Vec<&str> = (0..12)
                .map(|_| words[rng.random_range(0..words.len())])
                .collect();
            let text = text.join(" ");
            RetrievedDocument {
                id,
                score: 0.0,
                title: format!("Doc{id}").into(),
                vector: TrigramEncoder.encode(&text).unwrap().into(),
                text: text.into(),
            }
        })
        .collect()
}
