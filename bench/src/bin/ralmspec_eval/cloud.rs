//! The exact retriever RaLM waits on: faiss exact search over a corpus bundle (a cloud
//! shard's search) behind a latency model for the wide-area round trip or a slow retriever,
//! paid once per call whatever the batch (batched exact search costs nearly the same for
//! the few queries a verification sends: RaLMSpec, appendix A.1).

use hasten_bench::latency::{Latency, LatencySampler};
use hasten_bench::retrieval::PassageRetriever;
use hasten_core::vector::dot;
use hasten_spec_retrieval::{ExactRetriever, RetrievedDocument};

/// The emulated cloud's failure: its corpus search's, chain and all.
#[derive(Debug, thiserror::Error)]
#[error("searching the emulated cloud: {0:#}")]
pub struct SearchFailed(anyhow::Error);

/// A cloud shard reached over an emulated link.
pub struct EmulatedCloud<'a> {
    pub passages: &'a PassageRetriever,
    pub latency: LatencySampler,
}

impl<'a> EmulatedCloud<'a> {
    pub fn new(passages: &'a PassageRetriever, latency: Latency, seed: u64) -> Self {
        Self {
            passages,
            latency: LatencySampler::new(latency, seed),
        }
    }
}

impl ExactRetriever for EmulatedCloud<'_> {
    type Error = SearchFailed;

    fn search_batch(
        &self,
        queries: &[Vec<f32>],
        k: usize,
    ) -> std::result::Result<Vec<Vec<RetrievedDocument>>, SearchFailed> {
        let delay = self.latency.next();
        let found = self.passages.search(queries, k).map_err(SearchFailed)?;
        let results = queries
            .iter()
            .zip(found)
            .map(|(query, documents)| {
                documents
                    .into_iter()
                    .map(|document| {
                        let vector = document.vector.unwrap_or_default();
                        RetrievedDocument {
                            id: document.id.unwrap_or_default(),
                            score: dot(query, &vector),
                            title: document.title.into(),
                            text: document.text.into(),
                            vector: vector.into(),
                        }
                    })
                    .collect()
            })
            .collect();
        // The link's time is on top of the search, as a remote call's would be.
        std::thread::sleep(delay);
        Ok(results)
    }
}
