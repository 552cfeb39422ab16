//! Iterative RAG served sequentially ([`run_sequential`], `ralm-seq`) or with RaLMSpec
//! ([`run_speculative`]).
//!
//! A run retrieves the top-1 document for a query made of the question and the last
//! [`RalmSettings::query_tokens`] generated tokens, generates [`RalmSettings::interval`]
//! tokens with that document in the prompt, and repeats until the answer ends. RaLMSpec
//! answers those retrievals from a per-request [`LocalDocumentCache`], verifies a stride of
//! them in one exact batched call, and rolls generation back to the first mismatch, so under
//! greedy decoding its tokens are the sequential run's.

mod cache;
mod generator;
pub mod os3;
mod sequential;
mod speculative;
#[cfg(test)]
mod tests;

use std::time::Duration;

pub use cache::{LocalDocumentCache, Speculator};
pub use generator::{
    RALM_INSTRUCTION, RalmGenerator, RalmStepper, StepTokens, check_request, query_after,
    ralm_messages,
};
pub use os3::{Os3Settings, StrideScheduler};
pub use sequential::run_sequential;
pub use speculative::run_speculative;

/// Iterative retrieval's shape; defaults are the papers'.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RalmSettings {
    /// Generated tokens between two retrievals (In-Context RALM's and RaLMSpec's: 4).
    pub interval: usize,
    /// Most tokens generated in all (RaLMSpec's evaluation: 128).
    pub max_new_tokens: usize,
    /// Generated tokens that join the question in a retrieval query (In-Context RALM: 32).
    pub query_tokens: usize,
    /// Most tokens of the retrieved document in the prompt (RaLMSpec: 256).
    pub document_tokens: usize,
}

impl Default for RalmSettings {
    fn default() -> Self {
        Self {
            interval: 4,
            max_new_tokens: 128,
            query_tokens: 32,
            document_tokens: 256,
        }
    }
}

/// How many retrievals RaLMSpec speculates before verifying them.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stride {
    /// A constant stride (RaLMSpec without OS3 uses 3).
    Fixed(usize),
    /// Chosen before every verification by the optimal speculation stride scheduler.
    Os3(Os3Settings),
}

/// RaLMSpec's techniques, each switchable as in the paper's ablations.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SpeculationSettings {
    pub stride: Stride,
    /// Documents of each exact retrieval put into the local cache: 1 without prefetching,
    /// 20 with it (the paper's prefetch size).
    pub prefetch: usize,
    /// Run the next speculation step while the verification is in flight.
    pub asynchronous: bool,
}

impl Default for SpeculationSettings {
    fn default() -> Self {
        Self {
            stride: Stride::Fixed(3),
            prefetch: 1,
            asynchronous: false,
        }
    }
}

impl SpeculationSettings {
    /// The paper's RaLMSpec+PSA: prefetching 20, OS3, asynchronous verification.
    pub fn all_techniques() -> Self {
        Self {
            stride: Stride::Os3(Os3Settings::default()),
            prefetch: 20,
            asynchronous: true,
        }
    }
}

/// What RaLMSpec did on one request.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SpeculationStats {
    /// Speculative retrievals (each followed by a generation step).
    pub speculated: usize,
    /// Speculative retrievals the exact retriever confirmed.
    pub accepted: usize,
    /// Verifications that found a mismatch and rolled generation back.
    pub rollbacks: usize,
    /// Batched calls to the exact retriever (verifications and cold-cache retrievals).
    pub exact_calls: usize,
    /// The stride of every verification, in order.
    pub strides: Vec<usize>,
    /// Generation steps whose tokens were thrown away by a rollback.
    pub wasted_steps: usize,
}

/// Where a run spent its time.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct RalmTimings {
    pub total: Duration,
    /// Generation steps (prefill and decoding), including steps later rolled back.
    pub generation: Duration,
    /// Waiting for the exact retriever (the part of a verification no step overlapped).
    pub retrieval_wait: Duration,
    pub encoding: Duration,
}

/// A finished iterative-RAG run.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RalmOutput {
    pub tokens: Vec<u32>,
    pub text: String,
    /// The document each committed generation step read, in order.
    pub documents: Vec<u64>,
    pub timings: RalmTimings,
    /// `None` for the sequential run.
    pub speculation: Option<SpeculationStats>,
}
