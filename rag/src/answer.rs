//! What a backend returns: the answer, the drafts it was chosen from, and where the time went.

use std::time::Duration;

use serde::Serialize;

/// Where an answer spent its time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct AnswerTimings {
    /// Reading the prompt(s): the verifier's in standard mode, the drafts' batch in speculative.
    pub prefill: Duration,
    /// Until the caller received the first text. Speculative mode emits the chosen answer only
    /// after verification, so there it is close to `total`, which is what a user waits.
    pub first_token: Duration,
    /// Token generation after the prefill (speculative: all drafts, one batch).
    pub decode: Duration,
    /// The verifier's scoring pass (zero in standard mode).
    pub verify: Duration,
    pub total: Duration,
    /// A KV worker's account of its prefill (KV workers only).
    pub kv: Option<KvStages>,
}

/// Where a KV worker's prefill went, and where the chunks' KV came from: what splits
/// `prefill` for answers built from stored chunk KV.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct KvStages {
    /// Waiting in the worker's queue behind earlier answers.
    pub queue: Duration,
    /// Resolving the chunks to their KV (memory, disk or computed).
    pub load: Duration,
    /// Joining the chunks' KV into one prompt.
    pub assemble: Duration,
    /// Choosing the tokens to recompute.
    pub select: Duration,
    /// Recomputing them (every context token in full prefill).
    pub recompute: Duration,
    /// Chunks found in the worker's memory, read from its disk, or computed for the request.
    pub memory_hits: u32,
    pub disk_hits: u32,
    pub computed_chunks: u32,
    pub recomputed_tokens: u32,
}

/// One draft of Speculative RAG and how the verifier judged it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DraftReport {
    /// Indices into the request's documents that the draft was written from.
    pub documents: Vec<usize>,
    pub rationale: String,
    pub answer: String,
    /// log P(rationale, answer | subset prompt) under the drafter (rho_draft).
    pub draft_logprob: f32,
    /// log P(rationale, answer | question) under the verifier (rho_self-contain).
    pub consistency_logprob: f32,
    /// log P("Yes" | question, draft, reflection statement) under the verifier (rho_self-reflect).
    pub reflection_logprob: f32,
    /// The sum of the three (a product of probabilities, in log space).
    pub score: f32,
}

/// Why the answer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Finish {
    /// The model ended its turn, or the answer reached a stop string.
    #[default]
    Stop,
    /// The answer itself reached `max_new_tokens`.
    Length,
}

/// What Speculative RAG's drafter read and wrote (zero in standard mode); reported apart
/// from the answer's own tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DraftingTokens {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Answer {
    pub text: String,
    /// The chosen draft's rationale (speculative mode only).
    pub rationale: Option<String>,
    /// Indices into the request's documents that the answer was written from.
    pub documents_used: Vec<usize>,
    /// Every draft, in subset order (empty in standard mode).
    pub drafts: Vec<DraftReport>,
    pub timings: AnswerTimings,
    /// Tokens the answering model read: the prompt in standard mode, the verifier's rows in
    /// speculative mode.
    pub prompt_tokens: usize,
    /// The answer's tokens (in speculative mode, the chosen draft's answer).
    pub generated_tokens: usize,
    pub finish: Finish,
    /// Speculative mode: the drafts' prompts and every draft's tokens.
    pub drafting: DraftingTokens,
    /// Earlier turns of the conversation left out of the prompt, oldest first, so that the
    /// rest fits the model's context.
    pub dropped_turns: usize,
}

impl Answer {
    /// Tokens generated per second of decoding (drafts included); `None` when nothing was
    /// decoded.
    pub fn decode_rate(&self) -> Option<f64> {
        let decode = self.timings.decode.as_secs_f64();
        let tokens = self.generated_tokens + self.drafting.generated_tokens;
        (decode > 0.0 && tokens > 0).then(|| tokens as f64 / decode)
    }
}

/// What a backend runs on, for logs and reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BackendInfo {
    /// The small model that writes drafts.
    pub drafter: String,
    /// The large model that verifies drafts and answers in standard mode.
    pub verifier: String,
    pub device: String,
}
