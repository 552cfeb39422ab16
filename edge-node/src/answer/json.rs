//! `POST /v1/answer` wire types.

use serde::{Deserialize, Serialize};

use crate::api::json::{DocumentJson, OutcomeJson};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ModeJson {
    #[default]
    Standard,
    Speculative,
}

/// `POST /v1/answer` body.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnswerBody {
    pub question: Option<String>,
    pub k: Option<i64>,
    #[serde(default)]
    pub mode: ModeJson,
    pub max_tokens: Option<i64>,
    /// Server-sent events: the documents, then the answer's text as it is generated.
    #[serde(default)]
    pub stream: bool,
}

/// Milliseconds per stage of an answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AnswerTimingsJson {
    pub retrieve_ms: f64,
    /// Waiting for the language model behind earlier answers.
    pub queue_ms: f64,
    pub prefill_ms: f64,
    pub first_token_ms: f64,
    pub decode_ms: f64,
    /// Speculative mode: scoring the drafts with the verifier.
    pub verify_ms: f64,
    pub total_ms: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DraftJson {
    pub documents: Vec<usize>,
    pub rationale: String,
    pub answer: String,
    pub score: f32,
}

/// `POST /v1/answer` reply (and the last server-sent event of a streamed one).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AnswerReply {
    pub answer: String,
    pub mode: ModeJson,
    pub retrieval: OutcomeJson,
    /// The retrieved documents; `used` lists those the answer was written from.
    pub documents: Vec<DocumentJson>,
    pub used: Vec<usize>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub rationale: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub drafts: Vec<DraftJson>,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub timings: AnswerTimingsJson,
}
