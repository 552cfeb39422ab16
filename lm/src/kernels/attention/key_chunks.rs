//! Decoding's split: a few queries over a long past. The scores' columns (past entries, then
//! new tokens) are cut into chunks; each chunk is read once for every query head that shares
//! its KV head (scores, then the weighted sum of its values, while its rows are in cache),
//! and the chunks' partial softmaxes are merged as flash-decoding does:
//! `out = sum_c e^(m_c - m) acc_c / sum_c e^(m_c - m) l_c`.

use super::{AttentionPass, Kernel, in_parallel};
use crate::error::Result;

/// Tokens per unit of work: its keys (16-32 KB at 64-128 values a row) stay in cache
/// between the query heads that read them.
pub(super) const CHUNK: usize = 128;

/// One chunk's softmax, not yet normalised: per query its largest score `max`, the sum of
/// `e^(score - max)` and the values weighted by those terms.
struct Partial {
    max: Vec<f32>,
    sum: Vec<f32>,
    acc: Vec<f32>,
}

impl AttentionPass<'_> {
    /// The pass split by chunks of columns, one unit per (batch row, KV head, chunk).
    pub(super) fn by_key_chunks(&self, kernel: Kernel) -> Result<Vec<f32>> {
        let width = self.width();
        let chunks = width.div_ceil(CHUNK);
        let partials = in_parallel(self.batch * self.kv_heads * chunks, |unit| {
            let (group, chunk) = (unit / chunks, unit % chunks);
            self.chunk(
                kernel,
                group,
                chunk * CHUNK..((chunk + 1) * CHUNK).min(width),
            )
        })?;
        Ok(self.merge(&partials, chunks))
    }

    /// Group `group`'s (batch row and KV head) partial softmax over columns `range`.
    fn chunk(
        &self,
        kernel: Kernel,
        group: usize,
        range: std::ops::Range<usize>,
    ) -> Result<Partial> {
        let (b, h) = (group / self.kv_heads, group % self.kv_heads);
        let hd = self.head_dim;
        let count = self.group_queries();
        let start = group * count * hd;
        let queries = &self.queries[start..start + count * hd];
        let columns = range.len();
        let mut scores = vec![0.0f32; count * columns];
        // The chunk's columns in the past and among the new tokens.
        let past_len = self.past_keys.len;
        let past = range.start.min(past_len)..range.end.min(past_len);
        let new = range.start.max(past_len) - past_len..range.end.max(past_len) - past_len;
        let segments = [
            (self.past_keys, self.past_values, past.clone(), 0),
            (self.new_keys, self.new_values, new, past.len()),
        ];
        for (keys, _, rows, column) in &segments {
            if !rows.is_empty() {
                let keys = keys.rows(b, h, rows.clone(), hd)?;
                kernel.scores(queries, keys, hd, self.scale, &mut scores, columns, *column);
            }
        }
        let mut max = vec![f32::NEG_INFINITY; count];
        let mut sum = vec![0.0f32; count];
        for (q, row) in scores.chunks_exact_mut(columns).enumerate() {
            if let Some(bias) = self.bias {
                let token = q % self.tokens;
                let at = (b * self.tokens + token) * self.width() + range.start;
                for (score, bias) in row.iter_mut().zip(&bias[at..at + columns]) {
                    *score += bias;
                }
            }
            max[q] = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            if max[q] == f32::NEG_INFINITY {
                // Nothing here may be attended to: weights of zero, not e^(-inf + inf).
                row.fill(0.0);
                continue;
            }
            sum[q] = kernel.softmax_terms(row, max[q]);
        }
        let mut acc = vec![0.0f32; count * hd];
        for (_, values, rows, column) in &segments {
            if !rows.is_empty() {
                let values = values.rows(b, h, rows.clone(), hd)?;
                kernel.mix(&scores, columns, *column, values, hd, &mut acc);
            }
        }
        Ok(Partial { max, sum, acc })
    }

    /// Each query's chunks merged and normalised, in (batch, heads, tokens, head_dim) order.
    fn merge(&self, partials: &[Partial], chunks: usize) -> Vec<f32> {
        let hd = self.head_dim;
        let count = self.group_queries();
        let mut out = vec![0.0f32; self.batch * self.heads * self.tokens * hd];
        // Groups are laid out as the queries are: group g's queries are rows g * count.. .
        for (group, parts) in partials.chunks_exact(chunks).enumerate() {
            for q in 0..count {
                let max = parts
                    .iter()
                    .map(|p| p.max[q])
                    .fold(f32::NEG_INFINITY, f32::max);
                let row = &mut out[(group * count + q) * hd..(group * count + q + 1) * hd];
                if max == f32::NEG_INFINITY {
                    continue;
                }
                let mut total = 0.0f32;
                for part in parts {
                    let weight = (part.max[q] - max).exp();
                    total += weight * part.sum[q];
                    for (o, a) in row.iter_mut().zip(&part.acc[q * hd..(q + 1) * hd]) {
                        *o += weight * a;
                    }
                }
                for o in row.iter_mut() {
                    *o /= total;
                }
            }
        }
        out
    }
}
