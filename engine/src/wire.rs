//! The part of the OpenAI chat completions API an engine is called with, as the engines
//! serve it: requests written, streamed chunks and errors read.

use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize)]
pub struct ChatRequest<'a> {
    pub model: &'a str,
    pub messages: Vec<Message<'a>>,
    pub stream: bool,
    pub stream_options: StreamOptions,
    pub max_tokens: usize,
    pub temperature: f32,
    pub top_p: f32,
    pub seed: u64,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    pub stop: &'a [String],
    /// Asks for each generated token's log-probability (drafts are scored by them).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub logprobs: bool,
    /// Alternatives per token with `logprobs`: only the chosen token's is read, but 1, not
    /// 0: llama.cpp's server sends no log-probabilities at 0, and 20 when none is asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<u32>,
}

#[derive(Debug, Serialize)]
pub struct Message<'a> {
    pub role: &'static str,
    pub content: &'a str,
}

/// Chat messages in their wire form, borrowing their text.
pub fn messages(messages: &[hasten_rag::ChatMessage]) -> Vec<Message<'_>> {
    messages
        .iter()
        .map(|m| Message {
            role: m.role.name(),
            content: &m.content,
        })
        .collect()
}

#[derive(Debug, Serialize)]
pub struct StreamOptions {
    /// Asks for a last chunk with the request's token counts.
    pub include_usage: bool,
}

/// One `data:` event of a streamed chat completion.
#[derive(Debug, Deserialize)]
pub struct ChatChunk {
    #[serde(default)]
    pub choices: Vec<ChunkChoice>,
    #[serde(default)]
    pub usage: Option<Usage>,
}

#[derive(Debug, Deserialize)]
pub struct ChunkChoice {
    #[serde(default)]
    pub delta: Delta,
    #[serde(default)]
    pub finish_reason: Option<String>,
    #[serde(default)]
    pub logprobs: Option<ChunkLogprobs>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ChunkLogprobs {
    #[serde(default)]
    pub content: Vec<TokenLogprob>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
pub struct TokenLogprob {
    pub logprob: f32,
}

#[derive(Debug, Default, Deserialize)]
pub struct Delta {
    #[serde(default)]
    pub content: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}

/// `{"error": {"message": ...}}`, the shape every engine here refuses with.
#[derive(Debug, Deserialize)]
pub struct ErrorReply {
    pub error: ErrorBody,
}

#[derive(Debug, Deserialize)]
pub struct ErrorBody {
    pub message: String,
}

/// `GET /models`.
#[derive(Debug, Deserialize)]
pub struct ModelList {
    pub data: Vec<ModelEntry>,
}

#[derive(Debug, Deserialize)]
pub struct ModelEntry {
    pub id: String,
}

// llama.cpp's own routes, at the server's root.

/// `POST /apply-template`: messages rendered by the model's chat template, ending with the
/// assistant's turn opened.
#[derive(Debug, Serialize)]
pub struct ApplyTemplate<'a> {
    pub messages: Vec<Message<'a>>,
}

#[derive(Debug, Deserialize)]
pub struct Rendered {
    pub prompt: String,
}

/// `POST /tokenize`.
#[derive(Debug, Serialize)]
pub struct Tokenize<'a> {
    pub content: &'a str,
    /// No BOS: the pieces of a prompt are tokenised apart and joined.
    pub add_special: bool,
    /// Whether marker text (`<|im_end|>`) becomes the marker's token.
    pub parse_special: bool,
}

#[derive(Debug, Deserialize)]
pub struct Tokens {
    pub tokens: Vec<u32>,
}

/// `POST /detokenize`.
#[derive(Debug, Serialize)]
pub struct Detokenize<'a> {
    pub tokens: &'a [u32],
}

#[derive(Debug, Deserialize)]
pub struct Detokenized {
    pub content: String,
}

/// `POST /completion` continuing `prompt` with exactly the tokens a grammar of token ids
/// allows, reporting each one's log-probability under the model.
#[derive(Debug, Serialize)]
pub struct ForcedCompletion<'a> {
    pub prompt: &'a [u32],
    pub n_predict: usize,
    pub n_probs: u32,
    pub temperature: f32,
    pub grammar: String,
    pub cache_prompt: bool,
}

#[derive(Debug, Deserialize)]
pub struct Completion {
    #[serde(default)]
    pub completion_probabilities: Vec<CompletionProbability>,
}

#[derive(Debug, Deserialize)]
pub struct CompletionProbability {
    pub id: u32,
    pub logprob: f32,
}

/// `POST /completion` continuing `prompt` greedily for `n_predict` tokens, the tokens
/// returned as ids.
#[derive(Debug, Serialize)]
pub struct GreedyCompletion<'a> {
    pub prompt: &'a [u32],
    pub n_predict: usize,
    pub temperature: f32,
    pub cache_prompt: bool,
    pub return_tokens: bool,
}

#[derive(Debug, Deserialize)]
pub struct GreedyContinuation {
    #[serde(default)]
    pub tokens: Vec<u32>,
    /// `eos` when the model ended its turn, `limit` at `n_predict`.
    #[serde(default)]
    pub stop_type: String,
}
