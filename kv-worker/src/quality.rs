//! How far a fused prefill is from a full one: the measures of the FusionRAG paper's
//! quality figures.

use candle_core::Tensor;
use hasten_lm::{KvCache, log_softmax};

use crate::error::{KvError, Result};

/// The entries a row attends to for positions `0..context`, in position order, layer by
/// layer as (keys, values): hidden stale copies left out, recomputed ones in their place.
pub fn effective_context(cache: &KvCache, context: usize) -> Result<Vec<(Tensor, Tensor)>> {
    let positions = cache
        .positions()
        .first()
        .ok_or_else(|| KvError::InvalidInput("an empty cache".into()))?;
    let valid = &cache.valid()[0];
    let mut at = vec![None; context];
    for (entry, (&position, &valid)) in positions.iter().zip(valid).enumerate() {
        if valid && (position as usize) < context {
            at[position as usize] = Some(entry as u32);
        }
    }
    let ids: Vec<u32> = at
        .into_iter()
        .enumerate()
        .map(|(position, entry)| {
            entry.ok_or_else(|| {
                KvError::InvalidInput(format!("no valid entry at position {position}"))
            })
        })
        .collect::<Result<_>>()?;
    let index = Tensor::new(ids.as_slice(), cache.device())?;
    cache
        .layers()
        .iter()
        .map(|layer| {
            Ok((
                layer.keys().contiguous()?.index_select(&index, 2)?,
                layer.values().contiguous()?.index_select(&index, 2)?,
            ))
        })
        .collect()
}

/// Per layer, the mean over context tokens of the squared distance (keys and values, summed
/// over heads and dimensions) between `cache` and the full prefill's `reference`.
pub fn kv_deviation_per_layer(
    cache: &KvCache,
    reference: &KvCache,
    context: usize,
) -> Result<Vec<f64>> {
    let mine = effective_context(cache, context)?;
    let theirs = effective_context(reference, context)?;
    mine.iter()
        .zip(&theirs)
        .map(|((k, v), (rk, rv))| {
            let squared = ((k - rk)?.sqr()?.sum_all()? + (v - rv)?.sqr()?.sum_all()?)?;
            Ok(f64::from(squared.to_scalar::<f32>()?) / context.max(1) as f64)
        })
        .collect()
}

/// KL(P_reference || P) of two (1, vocab) logit rows: what the first token's distribution
/// lost against full prefill.
pub fn first_token_kl(logits: &Tensor, reference: &Tensor) -> Result<f64> {
    let log_p = log_softmax(reference)?;
    let log_q = log_softmax(logits)?;
    let kl = (log_p.exp()? * (&log_p - &log_q)?)?.sum_all()?;
    Ok(f64::from(kl.to_scalar::<f32>()?))
}
