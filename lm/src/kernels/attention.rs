//! Attention of a few new tokens over a long past (decoding), in one pass over the KV cache.
//!
//! Through candle, a decoding step's attention is a matmul of the queries by the past keys,
//! another by the new keys, a copy to join the scores, a softmax, two copies to split the
//! weights, two weighted sums and an add: the cache is read in separate passes and the
//! scores copied three times. Here the cache is split into chunks of tokens; each chunk is
//! read once for every query head that shares its KV head (scores, then the weighted sum of
//! its values, while its rows are in cache), and the chunks' partial softmaxes are merged
//! as flash-decoding does: `out = sum_c e^(m_c - m) acc_c / sum_c e^(m_c - m) l_c`.

use std::sync::OnceLock;

use super::Isa;
use crate::error::{LmError, Result};

/// Tokens per unit of work: its keys (16-32 KB at 64-128 values a row) stay in cache
/// between the query heads that read them.
const CHUNK: usize = 128;

/// Rows of `head_dim` values for each (batch row, KV head): rows of one pair are
/// consecutive, the pairs `batch_stride` and `head_stride` values apart from `offset`.
#[derive(Debug, Clone, Copy)]
pub struct KvRows<'a> {
    pub data: &'a [f32],
    pub offset: usize,
    pub batch_stride: usize,
    pub head_stride: usize,
    /// Rows per (batch row, KV head).
    pub len: usize,
}

impl KvRows<'static> {
    /// No rows: a pass without a past.
    pub const EMPTY: Self = Self {
        data: &[],
        offset: 0,
        batch_stride: 0,
        head_stride: 0,
        len: 0,
    };
}

impl<'a> KvRows<'a> {
    /// Rows `range` of batch row `b`, KV head `h`.
    fn rows(
        &self,
        b: usize,
        h: usize,
        range: std::ops::Range<usize>,
        head_dim: usize,
    ) -> Result<&'a [f32]> {
        let start = self.offset + b * self.batch_stride + h * self.head_stride;
        self.data
            .get(start + range.start * head_dim..start + range.end * head_dim)
            .ok_or_else(|| {
                LmError::InvalidInput(format!(
                    "KV rows {range:?} of batch row {b}, head {h} lie past the {} values given",
                    self.data.len()
                ))
            })
    }
}

/// One decoding step's attention: shapes, inputs and the softmax's scale.
#[derive(Debug, Clone, Copy)]
pub struct DecodeAttention<'a> {
    pub batch: usize,
    pub heads: usize,
    pub kv_heads: usize,
    /// New tokens per batch row.
    pub tokens: usize,
    pub head_dim: usize,
    /// (batch, heads, tokens, head_dim), contiguous.
    pub queries: &'a [f32],
    pub past_keys: KvRows<'a>,
    pub past_values: KvRows<'a>,
    pub new_keys: KvRows<'a>,
    pub new_values: KvRows<'a>,
    /// Added to the scores: (batch, tokens, past + tokens), `-inf` where a token may not
    /// attend. `None`: every token attends to every entry.
    pub bias: Option<&'a [f32]>,
    /// Multiplies the dot products (`1 / sqrt(head_dim)`).
    pub scale: f32,
}

/// One chunk's softmax, not yet normalised: per query its largest score `max`, the sum of
/// `e^(score - max)` and the values weighted by those terms.
struct Partial {
    max: Vec<f32>,
    sum: Vec<f32>,
    acc: Vec<f32>,
}

impl DecodeAttention<'_> {
    /// (batch, heads, tokens, head_dim): each query's softmax-weighted values.
    pub fn run(&self) -> Result<Vec<f32>> {
        self.run_with(Isa::selected())
    }

    /// [`run`](Self::run) on the named kernels.
    pub fn run_with(&self, isa: Isa) -> Result<Vec<f32>> {
        self.check()?;
        let kernel = Kernel::for_isa(isa, self.head_dim);
        let width = self.width();
        let chunks = width.div_ceil(CHUNK);
        let groups = self.batch * self.kv_heads;
        let partials: Vec<OnceLock<Result<Partial>>> =
            (0..groups * chunks).map(|_| OnceLock::new()).collect();
        candle_core::utils::barrier_pool().execute_chunked(partials.len(), |taken| {
            for unit in taken {
                let (group, chunk) = (unit / chunks, unit % chunks);
                let range = chunk * CHUNK..((chunk + 1) * CHUNK).min(width);
                let _ = partials[unit].set(self.chunk(kernel, group, range));
            }
        });
        let partials = partials
            .into_iter()
            .map(|cell| {
                cell.into_inner().unwrap_or_else(|| {
                    Err(LmError::InvalidInput(
                        "an attention chunk was not computed".into(),
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(self.merge(&partials, chunks))
    }

    /// Past entries plus new tokens: the scores' width.
    fn width(&self) -> usize {
        self.past_keys.len + self.tokens
    }

    /// Queries sharing one KV head, per batch row: its query heads times the new tokens.
    fn group_queries(&self) -> usize {
        self.heads / self.kv_heads * self.tokens
    }

    fn check(&self) -> Result<()> {
        let fail = |what: String| Err(LmError::InvalidInput(format!("decode attention: {what}")));
        if self.kv_heads == 0 || !self.heads.is_multiple_of(self.kv_heads) || self.head_dim == 0 {
            return fail(format!(
                "{} query heads cannot share {} KV heads of {} values",
                self.heads, self.kv_heads, self.head_dim
            ));
        }
        let queries = self.batch * self.heads * self.tokens * self.head_dim;
        if self.queries.len() != queries {
            return fail(format!(
                "{} query values, expected {queries}",
                self.queries.len()
            ));
        }
        if self.past_values.len != self.past_keys.len
            || self.new_keys.len != self.tokens
            || self.new_values.len != self.tokens
        {
            return fail(format!(
                "{} past keys and {} values; {} new keys and {} values for {} tokens",
                self.past_keys.len,
                self.past_values.len,
                self.new_keys.len,
                self.new_values.len,
                self.tokens
            ));
        }
        if let Some(bias) = self.bias
            && bias.len() != self.batch * self.tokens * self.width()
        {
            return fail(format!(
                "a bias of {} values, expected {} x {} x {}",
                bias.len(),
                self.batch,
                self.tokens,
                self.width()
            ));
        }
        Ok(())
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

/// The two inner loops, on the best instructions the CPU has.
#[derive(Debug, Clone, Copy)]
enum Kernel {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2(super::x86::Avx2),
}

impl Kernel {
    /// AVX2 and FMA unless `isa` is the scalar reference (AVX-512 CPUs have both) or rows
    /// are not whole 8-value vectors.
    fn for_isa(isa: Isa, head_dim: usize) -> Self {
        #[cfg(target_arch = "x86_64")]
        if isa != Isa::Scalar
            && head_dim.is_multiple_of(8)
            && let Some(avx2) = super::x86::Avx2::detect()
        {
            return Self::Avx2(avx2);
        }
        let _ = (isa, head_dim);
        Self::Scalar
    }

    /// `out[q * columns + column + j] = scale * (query q . key row j)`.
    #[allow(clippy::too_many_arguments)] // the loop's operands, each used
    fn scores(
        self,
        queries: &[f32],
        keys: &[f32],
        head_dim: usize,
        scale: f32,
        out: &mut [f32],
        columns: usize,
        column: usize,
    ) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Self::Avx2(avx2) => {
                avx2.attention_scores(queries, keys, head_dim, scale, out, columns, column)
            }
            Self::Scalar => {
                for (j, key) in keys.chunks_exact(head_dim).enumerate() {
                    for (q, query) in queries.chunks_exact(head_dim).enumerate() {
                        let dot: f32 = query.iter().zip(key).map(|(a, b)| a * b).sum();
                        out[q * columns + column + j] = scale * dot;
                    }
                }
            }
        }
    }

    /// Replaces each score `s` by `e^(s - max)` and returns their sum.
    fn softmax_terms(self, scores: &mut [f32], max: f32) -> f32 {
        match self {
            #[cfg(target_arch = "x86_64")]
            Self::Avx2(avx2) => avx2.softmax_terms(scores, max),
            Self::Scalar => {
                for score in scores.iter_mut() {
                    *score = (*score - max).exp();
                }
                scores.iter().sum()
            }
        }
    }

    /// `acc[q] += weights[q * columns + column + j] * value row j`, for every query `q`.
    fn mix(
        self,
        weights: &[f32],
        columns: usize,
        column: usize,
        values: &[f32],
        head_dim: usize,
        acc: &mut [f32],
    ) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Self::Avx2(avx2) => avx2.attention_mix(weights, columns, column, values, head_dim, acc),
            Self::Scalar => {
                for (j, value) in values.chunks_exact(head_dim).enumerate() {
                    for (q, acc) in acc.chunks_exact_mut(head_dim).enumerate() {
                        let weight = weights[q * columns + column + j];
                        for (a, v) in acc.iter_mut().zip(value) {
                            *a += weight * v;
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
