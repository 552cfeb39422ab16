//! Which chunk tokens a request recomputes.

use std::ops::Range;

use candle_core::{D, Tensor};
use hasten_lm::LayerKv;

use crate::error::{KvError, Result};

/// `ceil(ratio * tokens)`: the paper's recompute budget. The product is taken in f64 and
/// nudged down by far less than one token, so that a decimal ratio such as 0.15 of 20
/// tokens gives 3 and not the 4 its binary rounding would.
pub fn recompute_count(ratio: f64, tokens: usize) -> Result<usize> {
    if !(0.0..=1.0).contains(&ratio) {
        return Err(KvError::Ratio(ratio));
    }
    let exact = ratio * tokens as f64;
    Ok(((exact - 1e-9).ceil().max(0.0) as usize).min(tokens))
}

/// The indices of the `k` highest scores, ties to the earlier index, in ascending order.
pub fn top_tokens(scores: &[f32], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    let mut chosen: Vec<usize> = order.into_iter().take(k).collect();
    chosen.sort_unstable();
    chosen
}

/// The `n` chunks (`spans` of `scores`) whose scores sum highest, ties to the earlier chunk,
/// in prompt order.
pub fn top_chunks(scores: &[f32], spans: &[Range<usize>], n: usize) -> Vec<Range<usize>> {
    let mass: Vec<f32> = spans
        .iter()
        .map(|span| scores.get(span.clone()).map_or(0.0, |s| s.iter().sum()))
        .collect();
    top_tokens(&mass, n)
        .into_iter()
        .map(|i| spans[i].clone())
        .collect()
}

/// FusionRAG's critical score of each context column in `columns`: the attention the
/// question's tokens pay it in the last layer, summed over heads and question tokens.
/// `weights` is that layer's (1, heads, question, context + question) softmax output.
pub fn query_guided_scores(weights: &Tensor, columns: Range<usize>) -> Result<Vec<f32>> {
    let on_columns = weights.narrow(D::Minus1, columns.start, columns.len())?;
    Ok(on_columns
        .sum(D::Minus2)?
        .sum(1)?
        .squeeze(0)?
        .to_vec1::<f32>()?)
}

/// CacheBlend's score of each chunk entry: how far the reused entry is from the one a full
/// prefill computes, as the squared distance of keys (both at the same positions) and values
/// summed over heads. `fresh` holds the chunk entries only; in `reused` they start at
/// `reused_from`. Both are (1, kv_heads, tokens, head_dim).
pub fn deviation_scores(reused: &LayerKv, reused_from: usize, fresh: &LayerKv) -> Result<Vec<f32>> {
    let tokens = fresh.values().dim(2)?;
    let distance = |a: &Tensor, b: &Tensor| -> Result<Tensor> {
        let a = a.narrow(2, reused_from, tokens)?;
        Ok((a - b)?.sqr()?.sum(D::Minus1)?.sum(1)?)
    };
    let keys = distance(reused.keys(), fresh.keys())?;
    let values = distance(reused.values(), fresh.values())?;
    Ok((keys + values)?.squeeze(0)?.to_vec1::<f32>()?)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_budget_is_the_ceiling_of_ratio_times_tokens() {
        for (ratio, tokens, expected) in [
            (0.15, 20, 3),
            (0.15, 7, 2),
            (0.15, 13, 2),
            (0.05, 50, 3),
            (0.1, 10, 1),
            (0.0, 50, 0),
            (1.0, 13, 13),
        ] {
            assert_eq!(
                recompute_count(ratio, tokens).unwrap(),
                expected,
                "{ratio} of {tokens}"
            );
        }
        assert!(recompute_count(1.5, 10).is_err());
        assert!(recompute_count(-0.1, 10).is_err());
    }

    #[test]
    fn top_chunks_are_those_of_the_largest_score_sums() {
        // Chunk 1 has the single highest score, chunk 2 the largest sum.
        let scores = [0.1, 0.1, 0.9, 0.0, 0.4, 0.4, 0.3];
        let spans = [0..2, 2..4, 4..7];
        assert_eq!(top_chunks(&scores, &spans, 1), vec![spans[2].clone()]);
        assert_eq!(top_chunks(&scores, &spans, 2), [2..4, 4..7]);
        assert_eq!(top_chunks(&scores, &spans, 0), Vec::<Range<usize>>::new());
        assert_eq!(top_chunks(&scores, &spans, 5).len(), 3);
    }

    #[test]
    fn top_tokens_prefer_high_scores_then_early_indices() {
        let scores = [0.1, 0.5, 0.5, 0.9, 0.0];
        assert_eq!(top_tokens(&scores, 2), [1, 3]);
        assert_eq!(top_tokens(&scores, 3), [1, 2, 3]);
        assert_eq!(top_tokens(&scores, 0), Vec::<usize>::new());
    }
}
