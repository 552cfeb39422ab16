//! Prefill over reused chunk KV: assemble the stored entries at the request's positions,
//! choose the chunk tokens to recompute, recompute them with the question, and hand back a
//! cache that decoding continues from.
//!
//! Modes, as the FusionRAG paper compares them:
//! - `FullPrefill`: every chunk token computed for this request (the baseline; the system
//!   prompt's entries are reused, as any server with a prefix cache does, which makes the
//!   baseline faster, not slower);
//! - `FullReuse`: the stored entries as they are, only the question computed;
//! - `CacheBlend`: recompute the tokens whose reused entries deviate most from a full
//!   prefill's at layer 1, which costs a two-layer pass over the chunks;
//! - `FusionRag`: recompute the tokens the question attends to most in the last layer (or,
//!   with [`SelectionAttention::AllLayers`], summed over every layer).

mod assemble;
mod mask;
mod segment;
pub mod select;

use std::ops::Range;
use std::time::{Duration, Instant};

use candle_core::Tensor;
use hasten_lm::{AttentionMask, Decoder, ForwardRequest, KvCache, Logits};
use serde::{Deserialize, Serialize};

pub use assemble::{Assembled, assemble};
pub use hasten_worker_api::kv::{FusionMode, FusionSettings};
pub use mask::recompute_mask;
pub use segment::SegmentKv;

use crate::error::{KvError, Result};

/// The layer whose deviation CacheBlend selects by (its paper's choice: the second layer).
pub const CACHEBLEND_LAYER: usize = 1;

/// Where a fused prefill spent its time.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PrefillTimings {
    pub assemble: Duration,
    /// FusionRAG's question pass or CacheBlend's two-layer pass.
    pub select: Duration,
    /// The pass over the recomputed tokens and the question (the whole prompt for full
    /// prefill).
    pub recompute: Duration,
}

#[derive(Debug, Clone)]
pub struct FusedPrefill {
    /// (1, vocab): the distribution of the first answer token.
    pub logits: Tensor,
    /// The prompt's entries; stale copies of recomputed tokens are hidden, not removed.
    pub cache: KvCache,
    /// Where decoding goes on.
    pub next_position: u32,
    pub context_tokens: usize,
    /// The context entries (equal to their positions) computed for this request.
    pub recomputed: Vec<usize>,
    pub timings: PrefillTimings,
}

/// Which leading chunks of a FusionRAG or CacheBlend prompt end up with a full prefill's KV.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExactPrefix {
    /// The first chunk's KV is its Full Reuse KV: computed right after the system prompt,
    /// where it stands in this prompt too, so its entries are already the ones a full
    /// prefill computes, and selection spends the recompute budget on the other chunks.
    pub stored_leading: bool,
    /// This many chunks after the stored one (from the first without it) are recomputed
    /// whole, on top of the budget (which then goes to the chunks after them): each attends
    /// to exact entries only, so it comes out exact too.
    pub whole_chunks: usize,
}

impl ExactPrefix {
    /// The paper's FusionRAG: every chunk reused, the budget spread over all of them.
    pub const NONE: Self = Self {
        stored_leading: false,
        whole_chunks: 0,
    };

    /// Of `chunks` chunks, how many lead with stored exact entries, and how many lead once
    /// the ones recomputed whole after them are counted.
    fn chunk_counts(self, chunks: usize) -> (usize, usize) {
        let stored = usize::from(self.stored_leading).min(chunks);
        (stored, (stored + self.whole_chunks).min(chunks))
    }

    /// The context columns whose stored entries are taken as exact, and the ones after them
    /// recomputed whole, of `assembled`.
    fn columns(self, assembled: &Assembled) -> (Range<usize>, Range<usize>) {
        let spans = &assembled.chunk_spans;
        let (stored, whole) = self.chunk_counts(spans.len());
        let start = assembled.system_len;
        let end_of = |chunks: usize| {
            spans
                .get(..chunks)
                .and_then(<[_]>::last)
                .map_or(start, |s| s.end)
        };
        (start..end_of(stored), end_of(stored)..end_of(whole))
    }
}

/// Which attention from the question FusionRAG selects its tokens by.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum SelectionAttention {
    /// The last layer's (the FusionRAG paper's).
    #[default]
    LastLayer,
    /// Every layer's, summed: each layer's weights count alike.
    AllLayers,
}

/// A worker's fixed choices for its FusionRAG and CacheBlend prefills (its config keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefillOptions {
    pub exact: ExactPrefix,
    pub selection: SelectionAttention,
    /// This many chunks after the exact ones are recomputed whole, on top of the budget:
    /// those whose tokens' selection scores sum highest (for FusionRAG, the chunks the
    /// question attends to most), so that an answer-bearing chunk gets back its attention
    /// to the chunks before it wherever it stands.
    pub attended_chunks: usize,
}

impl From<ExactPrefix> for PrefillOptions {
    fn from(exact: ExactPrefix) -> Self {
        Self {
            exact,
            selection: SelectionAttention::default(),
            attended_chunks: 0,
        }
    }
}

/// Prefills `system + chunks + question` in `settings.mode`, leaving room in the model's
/// window for `max_new_tokens`; `options.exact` says which leading chunks come out exact
/// ([`ExactPrefix`]), `options.selection` which attention FusionRAG selects by.
pub fn prefill(
    decoder: &Decoder,
    system: &SegmentKv,
    chunks: &[&SegmentKv],
    question: &[u32],
    settings: FusionSettings,
    max_new_tokens: usize,
    options: PrefillOptions,
) -> Result<FusedPrefill> {
    check_window(decoder, system, chunks, question, max_new_tokens)?;
    if question.is_empty() {
        return Err(KvError::InvalidInput("the question has no tokens".into()));
    }
    let chunk_tokens: usize = chunks.iter().map(|c| c.len()).sum();
    if settings.mode == FusionMode::FullPrefill {
        let room = chunk_tokens + question.len() + max_new_tokens;
        return full_prefill(decoder, system, chunks, question, room);
    }
    let (budget, exact) = match settings.mode {
        FusionMode::FullReuse | FusionMode::FullPrefill => (0, ExactPrefix::NONE),
        FusionMode::CacheBlend | FusionMode::FusionRag => (
            select::recompute_count(settings.ratio, chunk_tokens)?,
            options.exact,
        ),
    };
    let started = Instant::now();
    let (stored, whole) = exact.chunk_counts(chunks.len());
    let whole_tokens: usize = chunks[stored..whole].iter().map(|c| c.len()).sum();
    let attended = if budget == 0 {
        0
    } else {
        options.attended_chunks
    };
    // Room for the longest chunks that may be chosen, whichever are.
    let mut candidates: Vec<usize> = chunks[whole..].iter().map(|c| c.len()).collect();
    candidates.sort_unstable_by(|a, b| b.cmp(a));
    let attended_room: usize = candidates.iter().take(attended).sum();
    let room = budget + whole_tokens + attended_room + question.len() + max_new_tokens;
    let assembled = assemble(decoder.rope(), system, chunks, room)?;
    let assembled_at = Instant::now();
    let (stored_exact, whole) = exact.columns(&assembled);
    // Scored from the first column that is not stored-exact: CacheBlend's fresh pass must
    // recompute the whole chunks too for the deviations after them to be a full prefill's.
    let scored = stored_exact.end..assembled.tokens.len();
    let scores = if budget == 0 {
        Vec::new()
    } else if settings.mode == FusionMode::FusionRag {
        question_attention(
            decoder,
            &assembled,
            question,
            scored.clone(),
            options.selection,
        )?
    } else {
        deviation(decoder, &assembled, scored.clone())?
    };
    let mut free = scores.get(whole.len()..).unwrap_or_default().to_vec();
    let later_chunks: Vec<Range<usize>> = assembled
        .chunk_spans
        .iter()
        .filter(|span| span.start >= whole.end)
        .map(|span| span.start - whole.end..span.end - whole.end)
        .collect();
    let chosen_chunks = select::top_chunks(&free, &later_chunks, attended);
    for span in &chosen_chunks {
        // Taken whole: the budget goes to the other chunks.
        free[span.clone()].fill(f32::NEG_INFINITY);
    }
    let mut recomputed: Vec<usize> = whole
        .clone()
        .chain(chosen_chunks.into_iter().flatten().map(|i| i + whole.end))
        .chain(
            select::top_tokens(&free, budget)
                .into_iter()
                .map(|i| i + whole.end),
        )
        .collect();
    recomputed.sort_unstable();
    recomputed.dedup();
    let selected_at = Instant::now();
    let Assembled {
        mut cache, tokens, ..
    } = assembled;
    let context = tokens.len();
    let mut new_tokens: Vec<u32> = recomputed.iter().map(|&i| tokens[i]).collect();
    new_tokens.extend_from_slice(question);
    let mut new_positions: Vec<u32> = recomputed.iter().map(|&i| i as u32).collect();
    new_positions.extend(context as u32..(context + question.len()) as u32);
    cache.hide(0, &recomputed)?;
    let mask = recompute_mask(
        &cache.positions()[0],
        &cache.valid()[0],
        &new_positions,
        decoder.device(),
    )?;
    let logits = extend(
        decoder,
        &mut cache,
        new_tokens,
        new_positions,
        AttentionMask::Custom(mask),
    )?;
    Ok(FusedPrefill {
        logits,
        cache,
        next_position: (context + question.len()) as u32,
        context_tokens: context,
        recomputed,
        timings: PrefillTimings {
            assemble: assembled_at - started,
            select: selected_at - assembled_at,
            recompute: selected_at.elapsed(),
        },
    })
}

fn check_window(
    decoder: &Decoder,
    system: &SegmentKv,
    chunks: &[&SegmentKv],
    question: &[u32],
    max_new_tokens: usize,
) -> Result<()> {
    let chunk_tokens: usize = chunks.iter().map(|c| c.len()).sum();
    let context = system.len() + chunk_tokens;
    let window = decoder.rope().max_positions();
    if context + question.len() + max_new_tokens > window {
        return Err(KvError::ContextTooLong {
            context,
            system: system.len(),
            chunks: chunk_tokens,
            question: question.len(),
            new_tokens: max_new_tokens,
            window,
        });
    }
    Ok(())
}

/// The baseline: every chunk token and the question prefilled causally after the system
/// prompt's entries (placed with `room` to append them and the answer).
fn full_prefill(
    decoder: &Decoder,
    system: &SegmentKv,
    chunks: &[&SegmentKv],
    question: &[u32],
    room: usize,
) -> Result<FusedPrefill> {
    let started = Instant::now();
    let mut cache = assemble(decoder.rope(), system, &[], room)?.cache;
    let mut tokens: Vec<u32> = chunks.iter().flat_map(|c| c.tokens()).copied().collect();
    let context = system.len() + tokens.len();
    tokens.extend_from_slice(question);
    let positions = (system.len() as u32..(context + question.len()) as u32).collect();
    let logits = extend(
        decoder,
        &mut cache,
        tokens,
        positions,
        AttentionMask::Causal,
    )?;
    Ok(FusedPrefill {
        logits,
        cache,
        next_position: (context + question.len()) as u32,
        context_tokens: context,
        recomputed: (system.len()..context).collect(),
        timings: PrefillTimings {
            recompute: started.elapsed(),
            ..PrefillTimings::default()
        },
    })
}

/// Runs `tokens` at `positions` after `cache` under `mask`, appends their entries to it and
/// returns the last token's logits.
fn extend(
    decoder: &Decoder,
    cache: &mut KvCache,
    tokens: Vec<u32>,
    positions: Vec<u32>,
    mask: AttentionMask,
) -> Result<Tensor> {
    let rows = [tokens];
    let positions = [positions];
    let out = decoder.forward(
        &ForwardRequest::new(&rows, &positions)
            .past(cache)
            .mask(mask)
            .logits(Logits::Last),
    )?;
    cache.append(out.kv)?;
    out.logits
        .ok_or_else(|| KvError::InvalidInput("the model returned no logits".into()))
}

/// FusionRAG's selection pass: the question over the assembled context, and the attention
/// its tokens pay each context column of `candidates` in the last layer (or every layer,
/// summed, as `selection` says).
fn question_attention(
    decoder: &Decoder,
    assembled: &Assembled,
    question: &[u32],
    candidates: Range<usize>,
    selection: SelectionAttention,
) -> Result<Vec<f32>> {
    let context = assembled.tokens.len() as u32;
    let rows = [question.to_vec()];
    let positions = [(context..context + question.len() as u32).collect()];
    let request = ForwardRequest::new(&rows, &positions)
        .past(&assembled.cache)
        .logits(Logits::None);
    let out = decoder.forward(&match selection {
        SelectionAttention::LastLayer => request.with_attention(),
        SelectionAttention::AllLayers => request.with_attention_summed_over_layers(),
    })?;
    let attention = out
        .attention
        .ok_or_else(|| KvError::InvalidInput("the model returned no attention".into()))?;
    select::query_guided_scores(&attention.weights, candidates)
}

/// CacheBlend's selection pass: the chunk tokens prefilled through the first layers after
/// the system prompt, and the distance from that at [`CACHEBLEND_LAYER`] of each reused
/// entry of `candidates`.
fn deviation(
    decoder: &Decoder,
    assembled: &Assembled,
    candidates: Range<usize>,
) -> Result<Vec<f32>> {
    // The entries before the candidates (the system prompt's, and an exact leading chunk's)
    // are a full prefill's already; a truncated copy shares them.
    let mut past = assembled.cache.clone();
    past.truncate(candidates.start)?;
    let rows = [assembled.tokens[candidates.clone()].to_vec()];
    let positions = [(candidates.start as u32..candidates.end as u32).collect()];
    let fresh = decoder
        .forward(
            &ForwardRequest::new(&rows, &positions)
                .past(&past)
                .logits(Logits::None)
                .first_layers(CACHEBLEND_LAYER + 1),
        )?
        .kv;
    let layer = |cache: &KvCache| {
        cache
            .layers()
            .get(CACHEBLEND_LAYER)
            .cloned()
            .ok_or_else(|| {
                KvError::InvalidInput(format!("the model has no layer {CACHEBLEND_LAYER}"))
            })
    };
    select::deviation_scores(&layer(&assembled.cache)?, candidates.start, &layer(&fresh)?)
}
