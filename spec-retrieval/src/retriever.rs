//! The seams to the retrievers: the exact one (the cloud's batched search) and the query
//! encoder both the exact and the speculative retrievals use.

use std::sync::Arc;

use crate::error::{EncodeError, RetrieverError, SpecError};

/// A retrieved document with what speculation needs: its text for the prompt and its vector,
/// so the per-request cache can rank it with the exact retriever's own metric.
#[derive(Clone, Debug, PartialEq)]
pub struct RetrievedDocument {
    pub id: u64,
    pub score: f32,
    pub title: Arc<str>,
    pub text: Arc<str>,
    pub vector: Arc<[f32]>,
}

/// The exact retriever: top-`k` by inner product for each query, best first, in one call.
/// Its `Error` reaches the run's caller whole ([`SpecError::Retrieval`]).
pub trait ExactRetriever: Send + Sync {
    type Error: RetrieverError;

    fn search_batch(
        &self,
        queries: &[Vec<f32>],
        k: usize,
    ) -> Result<Vec<Vec<RetrievedDocument>>, Self::Error>;
}

/// Text to a normalised query vector, the same for exact and speculative retrieval.
pub trait QueryEncoder: Send + Sync {
    fn encode(&self, text: &str) -> Result<Vec<f32>, EncodeError>;
}

/// all-MiniLM-L6-v2, the encoder the edge and the cloud index share.
impl QueryEncoder for hasten_core::encoder::TextEncoder {
    fn encode(&self, text: &str) -> Result<Vec<f32>, EncodeError> {
        self.encode_one(text).map_err(EncodeError::new)
    }
}

/// One batched exact search, refused when it answers fewer lists than it was asked.
pub(crate) fn exact_search<R: RetrieverError>(
    exact: &dyn ExactRetriever<Error = R>,
    queries: &[Vec<f32>],
    k: usize,
) -> Result<Vec<Vec<RetrievedDocument>>, SpecError<R>> {
    let results = exact
        .search_batch(queries, k)
        .map_err(SpecError::Retrieval)?;
    if results.len() != queries.len() {
        return Err(SpecError::ShortAnswer {
            asked: queries.len(),
            answered: results.len(),
        });
    }
    Ok(results)
}
