//! How an engine gives Speculative RAG's verifier its scores, found once per engine.

use crate::endpoint::Endpoint;
use crate::error::EngineError;
use crate::llama_cpp::LlamaCpp;
use crate::vllm::{PromptScores, Vllm};

/// Whether the engines can serve Speculative RAG: the verifier's scores are log-probabilities
/// of text it did not write, which an engine gives or not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scoring {
    /// llama.cpp's server: the text forced by a grammar of its token ids.
    LlamaCppForcedTokens,
    /// vLLM's server: `/v1/completions` with `prompt_logprobs`, the prompt as token ids
    /// from its `/tokenize`.
    PromptLogprobs,
    /// vLLM's routes without `prompt_logprobs`: `/v1/completions` with `echo` and
    /// `logprobs`, the prompt as token ids from its `/tokenize`.
    EchoLogprobs,
    /// No way found; the reason.
    Unavailable(String),
}

impl Scoring {
    /// How `engine` scores prompts: llama.cpp's server is asked first (it answers
    /// `/props`), then vLLM's routes. An engine that cannot be reached is an error (ask
    /// again later).
    pub async fn detect(engine: &Endpoint) -> Result<Self, EngineError> {
        if LlamaCpp::detect(engine).await? {
            return Ok(Self::LlamaCppForcedTokens);
        }
        Ok(match Vllm::detect(engine).await? {
            Some(PromptScores::PromptLogprobs) => Self::PromptLogprobs,
            Some(PromptScores::Echo) => Self::EchoLogprobs,
            None => Self::Unavailable(
                "the engine gives no log-probabilities of a prompt: neither llama.cpp's server \
                 nor one with vLLM's /tokenize and prompt_logprobs or echo + logprobs"
                    .into(),
            ),
        })
    }

    /// Whether Speculative RAG's verifier can run on the engine.
    pub fn scores_prompts(&self) -> bool {
        !matches!(self, Self::Unavailable(_))
    }
}

impl std::fmt::Display for Scoring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::LlamaCppForcedTokens => f.write_str("llama.cpp forced-token log-probabilities"),
            Self::PromptLogprobs => f.write_str("vLLM prompt_logprobs"),
            Self::EchoLogprobs => f.write_str("echo + logprobs on vLLM's /tokenize"),
            Self::Unavailable(reason) => write!(f, "unavailable: {reason}"),
        }
    }
}
