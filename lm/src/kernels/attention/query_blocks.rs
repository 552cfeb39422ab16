//! Prompts' split: many queries. Each unit takes a block of query tokens of one (batch row,
//! KV head), every query head of that KV head, and walks the key tiles they reach, keeping
//! each query's running softmax (its largest score, the sum of its terms and its weighted
//! values, rescaled when a larger score comes), as flash attention does. A tile the mask
//! closes to every query of the block is never read: under a causal mask that is half the
//! work of a prompt.

use std::ops::Range;

use super::{AttentionPass, Kernel, in_parallel};
use crate::error::Result;

/// Query tokens per unit: with 3-7 query heads per KV head, 48-112 queries share each key
/// tile while it is in cache.
const QUERY_BLOCK: usize = 16;
/// Keys per tile: one row of scores fills eight 8-lane registers.
pub(in crate::kernels) const KEY_TILE: usize = 64;

/// A tile's keys, transposed for the scores, and its values, as rows.
struct Tile {
    keys_t: Vec<f32>,
    values: Vec<f32>,
}

impl AttentionPass<'_> {
    /// The pass split by blocks of query tokens, one unit per (block, batch row, KV head).
    pub(super) fn by_query_blocks(&self, kernel: Kernel) -> Result<Vec<f32>> {
        let blocks = self.tokens.div_ceil(QUERY_BLOCK);
        let groups = self.batch * self.kv_heads;
        let reach = self.reach();
        // The last blocks first: under a causal mask they reach the most keys, and a pool
        // that starts them early ends evenly.
        let unit_at = |unit: usize| (blocks - 1 - unit / groups, unit % groups);
        let units = in_parallel(blocks * groups, |unit| {
            let (block, group) = unit_at(unit);
            self.query_block(kernel, group, block, &reach)
        })?;
        let hd = self.head_dim;
        let repeat = self.heads / self.kv_heads;
        let mut out = vec![0.0f32; self.batch * self.heads * self.tokens * hd];
        for (unit, rows) in units.iter().enumerate() {
            let (block, group) = unit_at(unit);
            let (b, h) = (group / self.kv_heads, group % self.kv_heads);
            let tokens = self.block_tokens(block);
            // A unit's rows are its heads' consecutive tokens, as the output holds them.
            for (r, rows) in rows.chunks_exact(tokens.len() * hd).enumerate() {
                let start = ((b * self.heads + h * repeat + r) * self.tokens + tokens.start) * hd;
                out[start..start + rows.len()].copy_from_slice(rows);
            }
        }
        Ok(out)
    }

    fn block_tokens(&self, block: usize) -> Range<usize> {
        block * QUERY_BLOCK..((block + 1) * QUERY_BLOCK).min(self.tokens)
    }

    /// Per (batch row, token): the columns from the first its bias leaves open to the last
    /// (every column without a bias; none where all are closed).
    fn reach(&self) -> Vec<Range<usize>> {
        let width = self.width();
        let Some(bias) = self.bias else {
            return vec![0..width; self.batch * self.tokens];
        };
        bias.chunks_exact(width)
            .map(|row| {
                let open = |b: &f32| *b != f32::NEG_INFINITY;
                match (row.iter().position(open), row.iter().rposition(open)) {
                    (Some(first), Some(last)) => first..last + 1,
                    _ => 0..0,
                }
            })
            .collect()
    }

    /// Block `block`'s queries of group `group` (batch row and KV head): (repeat, tokens,
    /// head_dim), each query's softmax-weighted values.
    fn query_block(
        &self,
        kernel: Kernel,
        group: usize,
        block: usize,
        reach: &[Range<usize>],
    ) -> Result<Vec<f32>> {
        let (b, h) = (group / self.kv_heads, group % self.kv_heads);
        let hd = self.head_dim;
        let repeat = self.heads / self.kv_heads;
        let tokens = self.block_tokens(block);
        let n = tokens.len();
        let reach = &reach[b * self.tokens + tokens.start..b * self.tokens + tokens.end];
        // The columns any of the block's queries reach.
        let open = || reach.iter().filter(|open| !open.is_empty());
        let columns =
            open().map(|r| r.start).min().unwrap_or(0)..open().map(|r| r.end).max().unwrap_or(0);
        let rows = repeat * n;
        let mut max = vec![f32::NEG_INFINITY; rows];
        let mut sum = vec![0.0f32; rows];
        let mut acc = vec![0.0f32; rows * hd];
        let mut tile = Tile {
            keys_t: vec![0.0; hd * KEY_TILE],
            values: vec![0.0; KEY_TILE * hd],
        };
        let mut scores = [0.0f32; KEY_TILE];
        let width = self.width();
        for start in columns.clone().step_by(KEY_TILE) {
            let cols = start..(start + KEY_TILE).min(columns.end);
            self.load_tile(b, h, cols.clone(), &mut tile)?;
            for (i, open) in reach.iter().enumerate() {
                if open.end <= cols.start || open.start >= cols.end {
                    continue;
                }
                let token = tokens.start + i;
                let at = (b * self.tokens + token) * width + cols.start;
                let bias = self.bias.map(|bias| &bias[at..at + cols.len()]);
                for r in 0..repeat {
                    let row = r * n + i;
                    let q = ((b * self.heads + h * repeat + r) * self.tokens + token) * hd;
                    kernel.tile_scores(
                        &self.queries[q..q + hd],
                        &tile.keys_t,
                        self.scale,
                        &mut scores,
                    );
                    let scores = &mut scores[..cols.len()];
                    if let Some(bias) = bias {
                        scores.iter_mut().zip(bias).for_each(|(s, b)| *s += b);
                    }
                    let tile_max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    if tile_max == f32::NEG_INFINITY {
                        continue;
                    }
                    let new_max = max[row].max(tile_max);
                    // e^(-inf) = 0 on a query's first open tile, whose sums are still 0.
                    let rescale = (max[row] - new_max).exp();
                    max[row] = new_max;
                    let terms = kernel.softmax_terms(scores, new_max);
                    sum[row] = sum[row] * rescale + terms;
                    let acc = &mut acc[row * hd..(row + 1) * hd];
                    if rescale != 1.0 {
                        acc.iter_mut().for_each(|a| *a *= rescale);
                    }
                    kernel.tile_mix(scores, &tile.values[..cols.len() * hd], hd, acc);
                }
            }
        }
        for (acc, &sum) in acc.chunks_exact_mut(hd).zip(&sum) {
            // A query with nothing open keeps zeros, as in the key-chunk split.
            if sum > 0.0 {
                acc.iter_mut().for_each(|a| *a /= sum);
            }
        }
        Ok(acc)
    }

    /// Columns `cols` (at most [`KEY_TILE`]) of batch row `b`, KV head `h` into `tile`:
    /// keys transposed and zero past the last column, values as rows.
    fn load_tile(&self, b: usize, h: usize, cols: Range<usize>, tile: &mut Tile) -> Result<()> {
        let hd = self.head_dim;
        let past_len = self.past_keys.len;
        let past = cols.start.min(past_len)..cols.end.min(past_len);
        let new = cols.start.max(past_len) - past_len..cols.end.max(past_len) - past_len;
        tile.keys_t.fill(0.0);
        let mut column = 0;
        for (keys, values, rows) in [
            (self.past_keys, self.past_values, past),
            (self.new_keys, self.new_values, new),
        ] {
            if rows.is_empty() {
                continue;
            }
            let count = rows.len();
            let keys = keys.rows(b, h, rows.clone(), hd)?;
            for (j, key) in keys.chunks_exact(hd).enumerate() {
                for (d, &k) in key.iter().enumerate() {
                    tile.keys_t[d * KEY_TILE + column + j] = k;
                }
            }
            tile.values[column * hd..(column + count) * hd]
                .copy_from_slice(values.rows(b, h, rows, hd)?);
            column += count;
        }
        Ok(())
    }
}
