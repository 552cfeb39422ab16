//! Lossless speculative retrieval for RAG that retrieves while it generates.
//!
//! [`ralm`]: iterative RAG (In-Context RALM: retrieve every few generated tokens, prompt =
//! the top-1 document and the text so far) served sequentially (`ralm-seq`) or with RaLMSpec
//! (Zhang et al., 2024): a per-request cache of documents answers retrievals speculatively,
//! the exact retriever checks several of them in one batched call, and generation rolls
//! back to the first mismatch, so the output is the sequential run's token for token.
//!
//! The retrievers are seams ([`ExactRetriever`], [`QueryEncoder`]): the edge plugs in its
//! cloud link and encoder; tests plug in faiss over fixed vectors.

pub mod error;
pub mod ralm;
pub mod retriever;

pub use error::{Result, SpecError};
pub use retriever::{ExactRetriever, QueryEncoder, RetrievalError, RetrievedDocument};
