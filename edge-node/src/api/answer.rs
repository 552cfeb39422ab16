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
    /// 0 (the default) is greedy.
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub seed: Option<u64>,
    /// The answer ends before the first of these (a string or up to 4).
    pub stop: Option<StopJson>,
}

/// `stop` as OpenAI takes it: one string or a list.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum StopJson {
    One(String),
    Many(Vec<String>),
}

impl StopJson {
    pub fn into_strings(self) -> Vec<String> {
        match self {
            Self::One(stop) => vec![stop],
            Self::Many(stops) => stops,
        }
    }
}

/// Speculative RAG's drafter: the drafts' prompts and every draft's tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DraftingJson {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
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
    /// KV workers: how their prefill split, and where the chunks' KV came from.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub kv: Option<KvStagesJson>,
}

/// A KV worker's prefill by stage (milliseconds) and its chunks by where their KV came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct KvStagesJson {
    pub queue_ms: f64,
    pub load_ms: f64,
    pub assemble_ms: f64,
    pub select_ms: f64,
    pub recompute_ms: f64,
    pub memory_hits: u32,
    pub disk_hits: u32,
    pub computed_chunks: u32,
    pub recomputed_tokens: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DraftJson {
    pub documents: Vec<usize>,
    pub rationale: String,
    pub answer: String,
    /// The draft under the drafter, from the documents (the paper's rho_draft).
    pub draft_logprob: f32,
    /// The draft under the verifier, from the question alone (rho_self-contain).
    pub consistency_logprob: f32,
    /// "Yes" to the reflection statement under the verifier (rho_self-reflect).
    pub reflection_logprob: f32,
    /// The sum of the three: the draft with the highest is the answer.
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
    /// The answering model's prompt (speculative: the verifier's rows).
    pub prompt_tokens: usize,
    /// The answer's tokens.
    pub generated_tokens: usize,
    /// `length` when the answer reached `max_tokens`, else `stop`.
    pub finish_reason: String,
    /// Speculative mode: what the drafter read and wrote.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub drafting: Option<DraftingJson>,
    /// What retrieval ran on (a chat's standalone question).
    pub query: String,
    /// Earlier turns of a chat left out of the prompt so that it fits the model's context.
    #[serde(skip_serializing_if = "is_zero", default)]
    pub dropped_turns: usize,
    /// What the edge changed to answer the request, in words.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub notes: Vec<String>,
    pub timings: AnswerTimingsJson,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}
