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
}

#[derive(Debug, Serialize)]
pub struct Message<'a> {
    pub role: &'static str,
    pub content: &'a str,
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
