//! Lossless speculative retrieval for RAG that retrieves while it generates.
//!
//! [`ralm`]: iterative RAG (In-Context RALM: retrieve every few generated tokens, prompt =
//! the top-1 document and the text so far) served sequentially (`ralm-seq`) or with RaLMSpec
//! (Zhang et al., 2024): a per-request cache of documents answers retrievals speculatively,
//! the exact retriever checks several of them in one batched call, and generation rolls
//! back to the first mismatch, so the output is the sequential run's token for token.
//!
//! [`hop`]: SpecHop's continuous speculation for multi-hop agents: up to `k` hops continue
//! from speculated retrievals while the exact ones are in flight; the strict verifier
//! (identical documents) keeps the sequential agent's trajectory.
//!
//! The retrievers are seams ([`ExactRetriever`], [`QueryEncoder`]): the edge plugs in its
//! cloud link and encoder; tests plug in faiss over fixed vectors.

pub mod error;
pub mod hop;
pub mod ralm;
pub mod retriever;
#[cfg(test)]
mod test_corpus;

pub use error::{EncodeError, RetrieverError, SpecError, StepError, StepResult};
pub use retriever::{ExactRetriever, QueryEncoder, RetrievedDocument};
