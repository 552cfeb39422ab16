//! Hasten's FusionRAG generation worker.
//!
//! A RAG prompt is a system prompt, retrieved chunks and a question. Prefilling the chunks
//! dominates time to first token, and the same chunks come back request after request, so
//! their KV cache is computed once and reused ([`fusion`]): placed at the request's
//! positions by re-rotating the stored keys, with the few tokens the question attends to
//! most recomputed so that the chunks see each other again (FusionRAG's query-guided
//! selection; CacheBlend's deviation-based selection as the baseline). The [`store`] keeps
//! each chunk's KV once, on disk and in memory tiers by heat.

pub mod config;
pub mod conversions;
pub mod engine;
pub mod error;
pub mod fusion;
pub mod metrics;
pub mod preprocess;
pub mod progress;
pub mod prompt;
pub mod quality;
pub mod service;
pub mod store;
pub mod worker;

pub use engine::{AnswerTimings, KvAnswer, KvEngine};
pub use error::{KvError, Result};
pub use fusion::{
    Assembled, ExactPrefix, FusedPrefill, FusionMode, FusionSettings, PrefillOptions,
    PrefillTimings, SegmentKv, SelectionAttention, assemble, prefill,
};
