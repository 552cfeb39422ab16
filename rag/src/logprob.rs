//! Log-probabilities of continuations after long contexts, reading logits only where they
//! are needed.
//!
//! `hasten_lm::score` asks for logits at every position of every row: (rows, context +
//! continuation, vocab) floats. After document prompts that is mostly waste, and a lot of
//! memory: 5 drafts after 1,000-token prompts over SmolLM2's 49,152-token vocabulary are
//! 1 GB of logits, several times that inside the log-softmax. Here the contexts are read
//! with last-position logits only and the continuations after them through the cache, so the
//! logits are (rows, longest continuation, vocab).

use candle_core::{IndexOp, Tensor};
use hasten_lm::{Decoder, ForwardRequest, LmError, Logits, left_pad, log_softmax};

use crate::error::Result;

/// Per-token log P(continuation | context) for every pair: the values of `hasten_lm::score`
/// in two batched passes (the contexts, then the continuations through their cache).
pub fn continuation_logprobs(
    decoder: &Decoder,
    pairs: &[(Vec<u32>, Vec<u32>)],
) -> Result<Vec<Vec<f32>>> {
    if pairs.is_empty() {
        return Ok(Vec::new());
    }
    if pairs.iter().any(|(c, r)| c.is_empty() || r.is_empty()) {
        return Err(LmError::InvalidInput(
            "scoring needs a non-empty context and continuation".into(),
        )
        .into());
    }
    let _span = tracing::debug_span!("rag_continuation_logprobs", rows = pairs.len()).entered();
    let contexts: Vec<Vec<u32>> = pairs.iter().map(|(c, _)| c.clone()).collect();
    let batch = left_pad(&contexts, 0);
    let out = decoder.forward(
        &ForwardRequest::new(&batch.tokens, &batch.positions)
            .valid(&batch.valid)
            .logits(Logits::Last),
    )?;
    let no_logits = || LmError::InvalidInput("the forward pass returned no logits".into());
    // The context's last logits predict each continuation's first token.
    let first = log_softmax(&out.logits.ok_or_else(no_logits)?)?;
    let mut scores: Vec<Vec<f32>> = pairs
        .iter()
        .enumerate()
        .map(|(row, (_, continuation))| {
            Ok(vec![at(
                &first.i(row).map_err(LmError::from)?,
                continuation[0],
            )?])
        })
        .collect::<Result<_>>()?;

    // Every continuation token but the last is fed to predict the next; rows are padded on
    // the right, where padding is masked out of every real token's view.
    let width = pairs.iter().map(|(_, r)| r.len() - 1).max().unwrap_or(0);
    if width == 0 {
        return Ok(scores);
    }
    let mut tokens = Vec::with_capacity(pairs.len());
    let mut positions = Vec::with_capacity(pairs.len());
    let mut valid = Vec::with_capacity(pairs.len());
    for (context, continuation) in pairs {
        let fed = &continuation[..continuation.len() - 1];
        let padding = width - fed.len();
        tokens.push(
            fed.iter()
                .copied()
                .chain(std::iter::repeat_n(0, padding))
                .collect::<Vec<u32>>(),
        );
        let start = context.len() as u32;
        positions.push(
            (start..start + fed.len() as u32)
                .chain(std::iter::repeat_n(0, padding))
                .collect::<Vec<u32>>(),
        );
        valid.push(
            std::iter::repeat_n(true, fed.len())
                .chain(std::iter::repeat_n(false, padding))
                .collect::<Vec<bool>>(),
        );
    }
    let out = decoder.forward(
        &ForwardRequest::new(&tokens, &positions)
            .valid(&valid)
            .past(&out.kv)
            .logits(Logits::All),
    )?;
    let rest = log_softmax(&out.logits.ok_or_else(no_logits)?)?;
    for (row, (_, continuation)) in pairs.iter().enumerate() {
        for (i, &id) in continuation.iter().enumerate().skip(1) {
            scores[row].push(at(&rest.i((row, i - 1)).map_err(LmError::from)?, id)?);
        }
    }
    Ok(scores)
}

/// The log-probability of token `id` in a (vocab,) row.
fn at(log_probs: &Tensor, id: u32) -> Result<f32> {
    let value = log_probs
        .i(id as usize)
        .and_then(|t| t.to_scalar::<f32>())
        .map_err(LmError::from)?;
    Ok(value)
}
