//! A pass's attention over the KV cache and its new entries, on the CPU, without the
//! scores ever held whole.
//!
//! Through candle, attention is a matmul of the queries by the keys, a softmax and a matmul
//! by the values: the scores of every query against every entry are written, then read
//! back, several times (scaled, masked, exponentiated, normalised). Here the work is split
//! two ways, by the shape of the pass:
//! - decoding (a few queries over a long past) by chunks of keys, the chunks' partial
//!   softmaxes merged at the end (`key_chunks.rs`);
//! - prompts (many queries) by blocks of query tokens, each walking the key tiles its
//!   queries reach with a running softmax, as flash attention does (`query_blocks.rs`).

mod key_chunks;
mod query_blocks;

use std::sync::OnceLock;

use super::Isa;
use crate::error::{LmError, Result};
pub(super) use query_blocks::KEY_TILE;

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

/// One pass's attention: shapes, inputs and the softmax's scale.
#[derive(Debug, Clone, Copy)]
pub struct AttentionPass<'a> {
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

/// How a pass's work is split between threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionSplit {
    /// One unit per chunk of keys (decoding: few queries, many keys).
    KeyChunks,
    /// One unit per block of query tokens (prompts).
    QueryBlocks,
}

impl AttentionPass<'_> {
    /// (batch, heads, tokens, head_dim): each query's softmax-weighted values.
    pub fn run(&self) -> Result<Vec<f32>> {
        self.run_with(Isa::selected(), self.split())
    }

    /// The split for this pass's shape: by keys when it [`decodes`], else by
    /// queries.
    pub fn split(&self) -> AttentionSplit {
        if decodes(
            self.heads / self.kv_heads.max(1),
            self.tokens,
            self.head_dim,
        ) {
            AttentionSplit::KeyChunks
        } else {
            AttentionSplit::QueryBlocks
        }
    }

    /// [`run`](Self::run) on the named kernels and split.
    pub fn run_with(&self, isa: Isa, split: AttentionSplit) -> Result<Vec<f32>> {
        self.check()?;
        let kernel = Kernel::for_isa(isa, self.head_dim);
        match split {
            AttentionSplit::KeyChunks => self.by_key_chunks(kernel),
            AttentionSplit::QueryBlocks => self.by_query_blocks(kernel),
        }
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
        let fail = |what: String| Err(LmError::InvalidInput(format!("attention: {what}")));
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
}

/// Whether a pass of `tokens` new tokens, `repeat` query heads per KV head, is shaped as
/// decoding: a KV head's queries fewer than twice a head's width, so that their scores are
/// smaller than the keys they are computed from.
pub fn decodes(repeat: usize, tokens: usize, head_dim: usize) -> bool {
    repeat * tokens < 2 * head_dim
}

/// `unit(0..count)` on candle's worker pool, the results in unit order.
fn in_parallel<T: Send + Sync>(
    count: usize,
    unit: impl Fn(usize) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    let cells: Vec<OnceLock<Result<T>>> = (0..count).map(|_| OnceLock::new()).collect();
    candle_core::utils::barrier_pool().execute_chunked(count, |taken| {
        for index in taken {
            let _ = cells[index].set(unit(index));
        }
    });
    cells
        .into_iter()
        .map(|cell| {
            cell.into_inner().unwrap_or_else(|| {
                Err(LmError::InvalidInput(
                    "a unit of attention was not computed".into(),
                ))
            })
        })
        .collect()
}

/// The inner loops, on the best instructions the CPU has.
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

    /// `out[j] = scale * (query . key j)` for the [`KEY_TILE`] keys of a tile stored
    /// transposed (`keys_t[d * KEY_TILE + j]` is value `d` of key `j`).
    fn tile_scores(self, query: &[f32], keys_t: &[f32], scale: f32, out: &mut [f32; KEY_TILE]) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Self::Avx2(avx2) => avx2.tile_scores(query, keys_t, scale, out),
            Self::Scalar => {
                out.fill(0.0);
                for (&x, keys) in query.iter().zip(keys_t.chunks_exact(KEY_TILE)) {
                    for (o, k) in out.iter_mut().zip(keys) {
                        *o += x * k;
                    }
                }
                out.iter_mut().for_each(|o| *o *= scale);
            }
        }
    }

    /// `acc += sum_j weights[j] * value row j`, for one query.
    fn tile_mix(self, weights: &[f32], values: &[f32], head_dim: usize, acc: &mut [f32]) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Self::Avx2(avx2) => avx2.tile_mix(weights, values, head_dim, acc),
            Self::Scalar => self.mix(weights, weights.len(), 0, values, head_dim, acc),
        }
    }
}

#[cfg(test)]
mod tests;
