//! Batched generation and one-pass scoring on top of [`Decoder::forward`].

use display_full_error::DisplayFullErrorExt;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use candle_core::{D, IndexOp, Tensor};
use rand::SeedableRng;
use rand::distr::Distribution;
use rand::rngs::StdRng;

use crate::decoder::{Decoder, ForwardOutput, ForwardRequest, Logits, log_softmax};
use crate::error::{LmError, Result};
use crate::kv::KvCache;

/// How the next token is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// 0 picks the most likely token (greedy, deterministic).
    pub temperature: f32,
    /// Nucleus sampling: only the most likely tokens whose probabilities add up to `top_p`
    /// are drawn from (1 keeps every token). Ignored when greedy.
    pub top_p: f32,
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop token was generated (it is not part of the output).
    Stop,
    /// `max_new_tokens` was reached.
    Length,
}

#[derive(Debug, Clone)]
pub struct GenerationOptions {
    pub max_new_tokens: usize,
    pub stop_tokens: Vec<u32>,
    pub sampling: Sampling,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Generated {
    pub tokens: Vec<u32>,
    /// log P(token | everything before it) of each token, as the model gave it when the
    /// token was chosen (before temperature).
    pub logprobs: Vec<f32>,
    pub finish: FinishReason,
}

/// Where a generation spent its time.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GenerationTimings {
    pub prefill: Duration,
    /// From the start until every row had its first token.
    pub first_token: Duration,
    pub decode: Duration,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
}

/// Prompts of different lengths as rows of one length, padded on the left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaddedBatch {
    pub tokens: Vec<Vec<u32>>,
    /// Each row's real tokens start at position 0; padding sits at position 0 too.
    pub positions: Vec<Vec<u32>>,
    /// False for padding.
    pub valid: Vec<Vec<bool>>,
}

/// Left-pads `prompts` to one length.
pub fn left_pad(prompts: &[Vec<u32>], pad: u32) -> PaddedBatch {
    let width = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let mut tokens = Vec::with_capacity(prompts.len());
    let mut positions = Vec::with_capacity(prompts.len());
    let mut valid = Vec::with_capacity(prompts.len());
    for prompt in prompts {
        let padding = width - prompt.len();
        tokens.push(
            std::iter::repeat_n(pad, padding)
                .chain(prompt.iter().copied())
                .collect(),
        );
        positions.push(
            std::iter::repeat_n(0, padding)
                .chain(0..prompt.len() as u32)
                .collect(),
        );
        valid.push(
            std::iter::repeat_n(false, padding)
                .chain(std::iter::repeat_n(true, prompt.len()))
                .collect(),
        );
    }
    PaddedBatch {
        tokens,
        positions,
        valid,
    }
}

/// Generates a continuation of every prompt in one batch. `on_token(row, id)` sees each
/// token as it is chosen (stop tokens excluded) and may break to end that row early.
pub fn generate(
    decoder: &Decoder,
    prompts: &[Vec<u32>],
    options: &GenerationOptions,
    on_token: impl FnMut(usize, u32) -> ControlFlow<()>,
) -> Result<(Vec<Generated>, GenerationTimings)> {
    generate_interruptible(decoder, prompts, options, &|| false, on_token)
}

/// [`generate`], whose prompt pass stops between its chunks with
/// [`LmError::Interrupted`] once `interrupted` says so (a caller that went away), so that
/// a long prompt is not read to its end for nobody. After the prompt, `on_token` decides.
pub fn generate_interruptible(
    decoder: &Decoder,
    prompts: &[Vec<u32>],
    options: &GenerationOptions,
    interrupted: &dyn Fn() -> bool,
    on_token: impl FnMut(usize, u32) -> ControlFlow<()>,
) -> Result<(Vec<Generated>, GenerationTimings)> {
    if prompts.is_empty() || prompts.iter().any(Vec::is_empty) {
        return Err(LmError::InvalidInput(
            "every prompt needs at least one token".into(),
        ));
    }
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    if longest + options.max_new_tokens > decoder.rope().max_positions() {
        return Err(LmError::InvalidInput(format!(
            "prompt of {longest} tokens plus {} new tokens exceeds the model's context of {}",
            options.max_new_tokens,
            decoder.rope().max_positions()
        )));
    }
    let started = Instant::now();
    let pad = options.stop_tokens.first().copied().unwrap_or(0);
    let (cache, logits) = prefill_prompts(decoder, prompts, pad, interrupted)?;
    let prefill = started.elapsed();
    let next_positions = prompts.iter().map(|p| p.len() as u32).collect();
    let decoded = decode_from(decoder, cache, logits, next_positions, options, on_token)?;
    let total = started.elapsed();
    let timings = GenerationTimings {
        prefill,
        first_token: decoded
            .first_token_at
            .map_or(total, |at| at.duration_since(started)),
        decode: total.saturating_sub(prefill),
        prompt_tokens: prompts.iter().map(Vec::len).sum(),
        generated_tokens: decoded.results.iter().map(|r| r.tokens.len()).sum(),
    };
    Ok((decoded.results, timings))
}

/// Padding above this share of a padded batch's tokens makes prefilling row by row the
/// cheaper way: Speculative RAG's drafter prompts (two passages each, of any length) pad
/// about a quarter of a batch.
const MAX_PADDING_SHARE: f64 = 0.125;

/// The prompts' cache and last logits (batch, vocab): one left-padded batched pass, or,
/// where padding would be a large share of it, one pass per prompt with the caches stacked
/// as that batch (the padding is then never computed).
fn prefill_prompts(
    decoder: &Decoder,
    prompts: &[Vec<u32>],
    pad: u32,
    interrupted: &dyn Fn() -> bool,
) -> Result<(KvCache, Tensor)> {
    let real: usize = prompts.iter().map(Vec::len).sum();
    let padded = prompts.iter().map(Vec::len).max().unwrap_or(0) * prompts.len();
    let logits_of = |out: ForwardOutput| -> Result<(KvCache, Tensor)> {
        Ok((out.kv, asked_logits(out.logits)?))
    };
    if (padded - real) as f64 <= MAX_PADDING_SHARE * padded as f64 {
        let PaddedBatch {
            tokens,
            positions,
            valid,
        } = left_pad(prompts, pad);
        return logits_of(
            decoder.forward(
                &ForwardRequest::new(&tokens, &positions)
                    .valid(&valid)
                    .logits(Logits::Last)
                    .interruptible(interrupted),
            )?,
        );
    }
    let mut caches = Vec::with_capacity(prompts.len());
    let mut last = Vec::with_capacity(prompts.len());
    for (index, prompt) in prompts.iter().enumerate() {
        // Between rows as between a long prompt's chunks: a caller gone stops the rest.
        if index > 0 && interrupted() {
            return Err(LmError::Interrupted);
        }
        let positions = vec![(0..prompt.len() as u32).collect::<Vec<_>>()];
        let (cache, logits) = logits_of(
            decoder.forward(
                &ForwardRequest::new(std::slice::from_ref(prompt), &positions)
                    .logits(Logits::Last)
                    .interruptible(interrupted),
            )?,
        )?;
        caches.push(cache);
        last.push(logits);
    }
    Ok((KvCache::stack_left_padded(caches)?, Tensor::cat(&last, 0)?))
}

/// The logits a forward pass was asked for (`None` only where none were asked).
fn asked_logits<T>(logits: Option<T>) -> Result<T> {
    logits.ok_or_else(|| LmError::InvalidInput("no logits".into()))
}

/// What [`decode_from`] produced.
#[derive(Debug, Clone)]
pub struct Decoded {
    pub results: Vec<Generated>,
    /// When every row had its first token (`None` if no step ran).
    pub first_token_at: Option<Instant>,
}

/// Decodes after a prefill that the caller ran however it wanted (a plain pass, or a cache
/// assembled from reused chunks): `cache` holds the prompt's entries, `logits` (batch,
/// vocab) are the last prompt token's, and `next_positions` where each row goes on.
pub fn decode_from(
    decoder: &Decoder,
    mut cache: KvCache,
    mut logits: Tensor,
    mut next_positions: Vec<u32>,
    options: &GenerationOptions,
    mut on_token: impl FnMut(usize, u32) -> ControlFlow<()>,
) -> Result<Decoded> {
    let rows = next_positions.len();
    if rows == 0 || logits.dim(0)? != rows || cache.batch() != rows {
        return Err(LmError::InvalidInput(format!(
            "decoding needs one cache row and one logits row per sequence ({rows} positions, \
             {} logits rows, {} cache rows)",
            logits.dim(0)?,
            cache.batch()
        )));
    }
    let mut rng = StdRng::seed_from_u64(options.sampling.seed);
    let mut results: Vec<Generated> = (0..rows)
        .map(|_| Generated {
            tokens: Vec::new(),
            logprobs: Vec::new(),
            finish: FinishReason::Length,
        })
        .collect();
    let mut done = vec![false; rows];
    // The sequences still being decoded, by batch row: a finished sequence leaves the batch,
    // so the steps after it cost only what the unfinished ones need.
    let mut active: Vec<usize> = (0..rows).collect();
    let mut first_token_at = None;
    for step in 0..options.max_new_tokens {
        let chosen = choose(&logits, options.sampling, &mut rng)?;
        let chosen_logprobs = logprobs_of(&logits, &chosen)?;
        for (batch_row, &id) in chosen.iter().enumerate() {
            let row = active[batch_row];
            if options.stop_tokens.contains(&id) {
                done[row] = true;
                results[row].finish = FinishReason::Stop;
                continue;
            }
            results[row].tokens.push(id);
            results[row].logprobs.push(chosen_logprobs[batch_row]);
            if on_token(row, id).is_break() {
                done[row] = true;
                results[row].finish = FinishReason::Stop;
            }
        }
        if step == 0 {
            first_token_at = Some(Instant::now());
        }
        if done.iter().all(|d| *d) || step + 1 == options.max_new_tokens {
            break;
        }
        let (tokens, kept): (Vec<u32>, Vec<usize>) = chosen
            .iter()
            .enumerate()
            .filter(|&(batch_row, _)| !done[active[batch_row]])
            .map(|(batch_row, &id)| (id, batch_row))
            .unzip();
        if kept.len() < active.len() {
            cache = cache.select_rows(&kept)?;
            active = kept.iter().map(|&b| active[b]).collect();
            next_positions = kept.iter().map(|&b| next_positions[b]).collect();
        }
        let step_tokens: Vec<Vec<u32>> = tokens.iter().map(|&id| vec![id]).collect();
        let step_positions: Vec<Vec<u32>> = next_positions.iter().map(|&p| vec![p]).collect();
        let out = decoder.forward(
            &ForwardRequest::new(&step_tokens, &step_positions)
                .past(&cache)
                .logits(Logits::Last),
        )?;
        cache.append(out.kv)?;
        logits = asked_logits(out.logits)?;
        for p in &mut next_positions {
            *p += 1;
        }
    }
    Ok(Decoded {
        results,
        first_token_at,
    })
}

/// log P(chosen[row]) under each row of (batch, vocab) logits.
fn logprobs_of(logits: &Tensor, chosen: &[u32]) -> Result<Vec<f32>> {
    let ids = Tensor::new(chosen, logits.device())?.unsqueeze(1)?;
    Ok(log_softmax(logits)?
        .gather(&ids, 1)?
        .squeeze(1)?
        .to_vec1::<f32>()?)
}

/// Picks one token per row of (batch, vocab) logits.
fn choose(logits: &Tensor, sampling: Sampling, rng: &mut StdRng) -> Result<Vec<u32>> {
    if sampling.temperature <= 0.0 {
        return Ok(logits.argmax(D::Minus1)?.to_vec1::<u32>()?);
    }
    let probabilities = candle_nn::ops::softmax_last_dim(&(logits / sampling.temperature as f64)?)?
        .to_vec2::<f32>()?;
    probabilities
        .into_iter()
        .map(|mut row| {
            keep_nucleus(&mut row, sampling.top_p);
            let weights = rand::distr::weighted::WeightedIndex::new(&row)
                .map_err(|e| LmError::InvalidInput(format!("sampling: {}", e.display_full())))?;
            Ok(weights.sample(rng) as u32)
        })
        .collect()
}

/// Zeroes every probability outside the nucleus: the smallest set of most likely tokens
/// whose probabilities reach `top_p` (the most likely token is always kept).
fn keep_nucleus(probabilities: &mut [f32], top_p: f32) {
    if top_p >= 1.0 {
        return;
    }
    let mut order: Vec<usize> = (0..probabilities.len()).collect();
    order.sort_unstable_by(|&a, &b| probabilities[b].total_cmp(&probabilities[a]));
    let mut mass = 0.0;
    let mut kept = order.len();
    for (rank, &i) in order.iter().enumerate() {
        mass += probabilities[i];
        if mass >= top_p {
            kept = rank + 1;
            break;
        }
    }
    for &i in &order[kept..] {
        probabilities[i] = 0.0;
    }
}

/// Log-probabilities of each continuation given its context, all rows in one forward pass:
/// `log P(continuation | context)` token by token.
pub fn score(decoder: &Decoder, pairs: &[(Vec<u32>, Vec<u32>)]) -> Result<Vec<Vec<f32>>> {
    if pairs
        .iter()
        .any(|(context, continuation)| context.is_empty() || continuation.is_empty())
    {
        return Err(LmError::InvalidInput(
            "scoring needs a non-empty context and continuation".into(),
        ));
    }
    let rows: Vec<Vec<u32>> = pairs
        .iter()
        .map(|(context, continuation)| [context.as_slice(), continuation.as_slice()].concat())
        .collect();
    let PaddedBatch {
        tokens,
        positions,
        valid,
    } = left_pad(&rows, 0);
    // Continuations sit at the right end of the padded rows; the token at column c is
    // predicted by the logits at column c - 1, so the longest continuation and one column
    // before it are all that is read.
    let longest = pairs.iter().map(|(_, c)| c.len()).max().unwrap_or(0);
    let trailing = longest + 1;
    let out = decoder.forward(
        &ForwardRequest::new(&tokens, &positions)
            .valid(&valid)
            .logits(Logits::Trailing(trailing)),
    )?;
    let logits = asked_logits(out.logits)?;
    let log_probs = log_softmax(&logits)?;
    pairs
        .iter()
        .enumerate()
        .map(|(row, (_, continuation))| {
            // The logits hold the last `trailing` columns: the continuation starts at
            // their column `trailing - len`, predicted by the one before it.
            let first = trailing - continuation.len();
            continuation
                .iter()
                .enumerate()
                .map(|(i, &id)| {
                    Ok(log_probs
                        .i((row, first + i - 1, id as usize))?
                        .to_scalar::<f32>()?)
                })
                .collect()
        })
        .collect()
}

/// [`score`] of continuations that share one context, the context read once: one pass
/// over it, its cache copied to every row, then one batched pass over the continuations.
/// What Speculative RAG's verifier does with its drafts, which all follow the same question
/// prompt (the paper's verifier reads that prompt once, not once per draft).
pub fn score_shared(
    decoder: &Decoder,
    context: &[u32],
    continuations: &[Vec<u32>],
) -> Result<Vec<Vec<f32>>> {
    if context.is_empty() || continuations.iter().any(Vec::is_empty) {
        return Err(LmError::InvalidInput(
            "scoring needs a non-empty context and continuation".into(),
        ));
    }
    if continuations.is_empty() {
        return Ok(Vec::new());
    }
    let prefix = decoder.forward(&ForwardRequest::new(
        &[context.to_vec()],
        &[(0..context.len() as u32).collect()],
    ))?;
    // The context's last position predicts every continuation's first token.
    let first = log_softmax(&asked_logits(prefix.logits)?)?;
    let past = prefix.kv.select_rows(&vec![0; continuations.len()])?;
    let PaddedBatch {
        tokens,
        positions,
        valid,
    } = left_pad(continuations, 0);
    let offset = context.len() as u32;
    let positions: Vec<Vec<u32>> = positions
        .into_iter()
        .map(|row| row.into_iter().map(|p| p + offset).collect())
        .collect();
    // Each row's last token predicts nothing that is read.
    let longest = continuations.iter().map(Vec::len).max().unwrap_or(0);
    let rest = if longest > 1 {
        let out = decoder.forward(
            &ForwardRequest::new(&tokens, &positions)
                .past(&past)
                .valid(&valid)
                .logits(Logits::All),
        )?;
        let logits = asked_logits(out.logits)?;
        Some(log_softmax(&logits.narrow(1, 0, longest - 1)?)?)
    } else {
        None
    };
    continuations
        .iter()
        .enumerate()
        .map(|(row, continuation)| {
            let start = longest - continuation.len();
            continuation
                .iter()
                .enumerate()
                .map(|(i, &id)| {
                    let value = if i == 0 {
                        first.i((0, id as usize))?
                    } else {
                        asked_logits(rest.as_ref())?.i((row, start + i - 1, id as usize))?
                    };
                    Ok(value.to_scalar::<f32>()?)
                })
                .collect()
        })
        .collect()
}

/// The same scores computed token by token through the cache (the reference `score` is
/// tested against, and what a caller without one-pass scoring would do).
pub fn score_incrementally(
    decoder: &Decoder,
    context: &[u32],
    continuation: &[u32],
) -> Result<Vec<f32>> {
    let positions: Vec<Vec<u32>> = vec![(0..context.len() as u32).collect()];
    let out = decoder.forward(&ForwardRequest::new(&[context.to_vec()], &positions))?;
    let mut cache: KvCache = out.kv;
    let mut logits = asked_logits(out.logits)?;
    let mut scores = Vec::with_capacity(continuation.len());
    for (i, &id) in continuation.iter().enumerate() {
        let log_probs = log_softmax(&logits)?;
        scores.push(log_probs.i((0, id as usize))?.to_scalar::<f32>()?);
        if i + 1 == continuation.len() {
            break;
        }
        let position = (context.len() + i) as u32;
        let out =
            decoder.forward(&ForwardRequest::new(&[vec![id]], &[vec![position]]).past(&cache))?;
        cache.append(out.kv)?;
        logits = asked_logits(out.logits)?;
    }
    Ok(scores)
}

#[cfg(test)]
mod tests {
    use super::keep_nucleus;

    #[test]
    fn the_nucleus_keeps_the_most_likely_tokens_up_to_top_p() {
        let mut row = [0.1, 0.5, 0.15, 0.25];
        keep_nucleus(&mut row, 0.7);
        assert_eq!(row, [0.0, 0.5, 0.0, 0.25]);
        let mut row = [0.1, 0.5, 0.15, 0.25];
        keep_nucleus(&mut row, 0.01);
        assert_eq!(
            row,
            [0.0, 0.5, 0.0, 0.0],
            "the most likely token always stays"
        );
        let mut row = [0.1, 0.5, 0.15, 0.25];
        keep_nucleus(&mut row, 1.0);
        assert_eq!(row, [0.1, 0.5, 0.15, 0.25]);
    }
}
