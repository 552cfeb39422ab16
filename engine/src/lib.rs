//! Generation on engines a team already runs: [`EngineLm`], an [`hasten_rag::LmBackend`]
//! that answers through any OpenAI-compatible server (vLLM, SGLang, TGI, Ollama, llama.cpp's
//! server). The edge keeps retrieval and the prompt; the engine keeps the model, its GPUs and
//! its batching.
//!
//! Standard RAG streams through the engine's `/chat/completions`: the engine applies its own
//! chat template and counts its own tokens, so the prompt goes as messages
//! ([`hasten_rag::prompt::standard_messages`]). Sampling, stop strings and `max_tokens` carry
//! through; a client that leaves closes the upstream request, which a streaming engine reads
//! as a cancellation. Speculative RAG drafts on a drafter engine and verifies on the main one
//! (`speculative`), where that engine gives log-probabilities of text it did not write
//! ([`Scoring`]).

mod backend;
mod endpoint;
mod error;
pub mod hop;
mod llama_cpp;
pub mod ralm;
mod routes;
mod scoring;
mod speculative;
mod vllm;
mod wire;

pub use backend::{ApiKey, EngineLm, EngineSettings};
pub use error::EngineError;
pub use scoring::Scoring;
