//! Both splits of a pass's attention against a plain reference (every score, one softmax in
//! f64), on random caches laid out as the KV cache's buffers are (room past the rows, batch
//! rows and heads apart), across the chunk, tile and block boundaries, with and without a
//! mask.

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::key_chunks::CHUNK;
use super::{AttentionPass, AttentionSplit, Kernel, KvRows};
use crate::kernels::Isa;

/// Outputs are weighted means of values in [-1, 1]: f32 rounding stays far below this.
const TOLERANCE: f32 = 2e-5;

#[derive(Debug, Clone, Copy)]
struct Shape {
    batch: usize,
    kv_heads: usize,
    repeat: usize,
    tokens: usize,
    past: usize,
    head_dim: usize,
}

/// Random inputs of `shape`: the past in buffers with room for `spare` more rows and
/// `lead` values before the first, the new entries contiguous, and (when `masked`) a
/// causal bias that closes a third of the other entries but never a token's own, and
/// every entry to a tenth of the tokens (padding).
struct Inputs {
    shape: Shape,
    spare: usize,
    lead: usize,
    queries: Vec<f32>,
    past_keys: Vec<f32>,
    past_values: Vec<f32>,
    new_keys: Vec<f32>,
    new_values: Vec<f32>,
    bias: Option<Vec<f32>>,
}

impl Inputs {
    fn random(shape: Shape, masked: bool, seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut values =
            |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect() };
        let Shape {
            batch,
            kv_heads,
            repeat,
            tokens,
            past,
            head_dim,
        } = shape;
        let (spare, lead) = (3, 5);
        let buffer = lead + batch * kv_heads * (past + spare) * head_dim;
        let queries = values(batch * kv_heads * repeat * tokens * head_dim);
        let past_keys = values(buffer);
        let past_values = values(buffer);
        let new_keys = values(batch * kv_heads * tokens * head_dim);
        let new_values = values(batch * kv_heads * tokens * head_dim);
        let width = past + tokens;
        let bias = masked.then(|| {
            let mut bias = vec![0.0f32; batch * tokens * width];
            for b in 0..batch {
                for i in 0..tokens {
                    // A padding token: nothing open to it.
                    if tokens > 1 && rng.random_bool(0.1) {
                        bias[(b * tokens + i) * width..(b * tokens + i + 1) * width]
                            .fill(f32::NEG_INFINITY);
                        continue;
                    }
                    for j in 0..width {
                        let own = j == past + i;
                        let closed = j > past + i || (!own && rng.random_bool(0.3));
                        if closed {
                            bias[(b * tokens + i) * width + j] = f32::NEG_INFINITY;
                        }
                    }
                }
            }
            bias
        });
        Self {
            shape,
            spare,
            lead,
            queries,
            past_keys,
            past_values,
            new_keys,
            new_values,
            bias,
        }
    }

    fn past_rows<'a>(&self, data: &'a [f32]) -> KvRows<'a> {
        let Shape {
            kv_heads,
            past,
            head_dim,
            ..
        } = self.shape;
        let head_stride = (past + self.spare) * head_dim;
        KvRows {
            data,
            offset: self.lead,
            batch_stride: kv_heads * head_stride,
            head_stride,
            len: past,
        }
    }

    fn new_rows<'a>(&self, data: &'a [f32]) -> KvRows<'a> {
        let Shape {
            kv_heads,
            tokens,
            head_dim,
            ..
        } = self.shape;
        KvRows {
            data,
            offset: 0,
            batch_stride: kv_heads * tokens * head_dim,
            head_stride: tokens * head_dim,
            len: tokens,
        }
    }

    fn attention(&self) -> AttentionPass<'_> {
        let s = self.shape;
        AttentionPass {
            batch: s.batch,
            heads: s.kv_heads * s.repeat,
            kv_heads: s.kv_heads,
            tokens: s.tokens,
            head_dim: s.head_dim,
            queries: &self.queries,
            past_keys: self.past_rows(&self.past_keys),
            past_values: self.past_rows(&self.past_values),
            new_keys: self.new_rows(&self.new_keys),
            new_values: self.new_rows(&self.new_values),
            bias: self.bias.as_deref(),
            scale: 1.0 / (s.head_dim as f32).sqrt(),
        }
    }

    /// Every score, one softmax and one weighted sum per query, in f64.
    fn reference(&self) -> Vec<f32> {
        let a = self.attention();
        let Shape {
            batch,
            kv_heads,
            repeat,
            tokens,
            past,
            head_dim,
        } = self.shape;
        let heads = kv_heads * repeat;
        let row = |rows: &KvRows<'_>, b: usize, g: usize, j: usize| -> Vec<f64> {
            let start = rows.offset + b * rows.batch_stride + g * rows.head_stride + j * head_dim;
            rows.data[start..start + head_dim]
                .iter()
                .map(|&v| f64::from(v))
                .collect()
        };
        let mut out = Vec::with_capacity(a.queries.len());
        for b in 0..batch {
            for h in 0..heads {
                let g = h / repeat;
                for i in 0..tokens {
                    let start = ((b * heads + h) * tokens + i) * head_dim;
                    let query = &a.queries[start..start + head_dim];
                    let entries: Vec<(Vec<f64>, Vec<f64>)> = (0..past)
                        .map(|j| (row(&a.past_keys, b, g, j), row(&a.past_values, b, g, j)))
                        .chain(
                            (0..tokens)
                                .map(|j| (row(&a.new_keys, b, g, j), row(&a.new_values, b, g, j))),
                        )
                        .collect();
                    let scores: Vec<f64> = entries
                        .iter()
                        .enumerate()
                        .map(|(j, (key, _))| {
                            let dot: f64 =
                                query.iter().zip(key).map(|(&q, k)| f64::from(q) * k).sum();
                            let bias = a.bias.map_or(0.0, |bias| {
                                f64::from(bias[(b * tokens + i) * (past + tokens) + j])
                            });
                            dot * f64::from(a.scale) + bias
                        })
                        .collect();
                    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    if max == f64::NEG_INFINITY {
                        // Nothing open: zeros, by the kernels' convention.
                        out.extend(std::iter::repeat_n(0.0, head_dim));
                        continue;
                    }
                    let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                    let total: f64 = weights.iter().sum();
                    for d in 0..head_dim {
                        let mixed: f64 = weights
                            .iter()
                            .zip(&entries)
                            .map(|(w, (_, v))| w * v[d])
                            .sum();
                        out.push((mixed / total) as f32);
                    }
                }
            }
        }
        out
    }
}

fn largest_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Every instruction set the CPU has, with each split.
fn kernels() -> Vec<(Isa, AttentionSplit)> {
    Isa::available()
        .into_iter()
        .flat_map(|isa| {
            [
                (isa, AttentionSplit::KeyChunks),
                (isa, AttentionSplit::QueryBlocks),
            ]
        })
        .collect()
}

fn shapes() -> impl Strategy<Value = (Shape, bool, u64)> {
    (
        1usize..=2,
        1usize..=3,
        1usize..=4,
        prop_oneof![1usize..=3, 15usize..=40],
        prop_oneof![
            0usize..=3,
            CHUNK - 3..=CHUNK + 2,
            2 * CHUNK - 1..=2 * CHUNK + 40
        ],
        prop_oneof![Just(8usize), Just(16), Just(64), Just(128), Just(12)],
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(
            |(batch, kv_heads, repeat, tokens, past, head_dim, masked, seed)| {
                let shape = Shape {
                    batch,
                    kv_heads,
                    repeat,
                    tokens,
                    past,
                    head_dim,
                };
                (shape, masked, seed)
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn every_kernel_equals_the_reference((shape, masked, seed) in shapes()) {
        let inputs = Inputs::random(shape, masked, seed);
        let expected = inputs.reference();
        for (isa, split) in kernels() {
            let got = inputs.attention().run_with(isa, split).expect("attention");
            let difference = largest_difference(&got, &expected);
            prop_assert!(
                difference < TOLERANCE,
                "{isa} {split:?} on {shape:?}, masked {masked}: {difference}"
            );
        }
    }
}

/// The comparison above catches what a broken kernel would get wrong: a mask left out, the
/// softmax's scale, or keys of the last chunk read from the wrong place; in either split.
#[test]
fn the_reference_comparison_catches_a_lost_mask_a_changed_key_and_a_wrong_scale() {
    let shape = Shape {
        batch: 2,
        kv_heads: 2,
        repeat: 3,
        tokens: 20,
        past: 2 * CHUNK + 7,
        head_dim: 64,
    };
    let inputs = Inputs::random(shape, true, 3);
    let expected = inputs.reference();
    for (isa, split) in kernels() {
        let got = inputs.attention().run_with(isa, split).expect("attention");
        assert!(
            largest_difference(&got, &expected) < TOLERANCE,
            "{isa} {split:?}: the inputs as given"
        );

        let unmasked = AttentionPass {
            bias: None,
            ..inputs.attention()
        }
        .run_with(isa, split)
        .expect("attention");
        assert!(
            largest_difference(&unmasked, &expected) > TOLERANCE,
            "{isa} {split:?}: mask left out"
        );

        let scaled = AttentionPass {
            scale: inputs.attention().scale * 1.01,
            ..inputs.attention()
        }
        .run_with(isa, split)
        .expect("attention");
        assert!(
            largest_difference(&scaled, &expected) > TOLERANCE,
            "{isa} {split:?}: scale off by 1%"
        );

        // The last seven past keys (in the last chunk) of the second batch row, second head.
        let mut keys = inputs.past_keys.clone();
        let at = inputs.attention().past_keys;
        let row = at.offset + at.batch_stride + at.head_stride + (shape.past - 7) * shape.head_dim;
        keys[row..row + 7 * shape.head_dim]
            .iter_mut()
            .for_each(|k| *k += 0.5);
        let changed = AttentionPass {
            past_keys: inputs.past_rows(&keys),
            ..inputs.attention()
        }
        .run_with(isa, split)
        .expect("attention");
        assert!(
            largest_difference(&changed, &expected) > TOLERANCE,
            "{isa} {split:?}: keys changed"
        );
    }
}

#[test]
fn inputs_of_the_wrong_size_are_refused_not_read_past() {
    let inputs = Inputs::random(
        Shape {
            batch: 1,
            kv_heads: 2,
            repeat: 2,
            tokens: 1,
            past: 9,
            head_dim: 8,
        },
        true,
        1,
    );
    let short = &inputs.queries[1..];
    assert!(
        AttentionPass {
            queries: short,
            ..inputs.attention()
        }
        .run()
        .is_err()
    );
    let bias = inputs.bias.as_deref().map(|b| &b[1..]);
    assert!(
        AttentionPass {
            bias,
            ..inputs.attention()
        }
        .run()
        .is_err()
    );
    let past = KvRows {
        len: 100,
        ..inputs.past_rows(&inputs.past_keys)
    };
    let past_values = KvRows {
        len: 100,
        ..inputs.past_rows(&inputs.past_values)
    };
    let beyond = AttentionPass {
        past_keys: past,
        past_values,
        bias: None,
        ..inputs.attention()
    };
    assert!(beyond.run().is_err());
}

#[test]
fn softmax_terms_are_exponentials_to_a_few_ulp_and_closed_entries_are_zero() {
    let mut rng = StdRng::seed_from_u64(5);
    let mut scores: Vec<f32> = (0..1_000)
        .map(|_| rng.random_range(-100.0f32..20.0))
        .collect();
    scores.extend([f32::NEG_INFINITY, 20.0, -87.0, -88.0, 0.0, -1e-3, 1e-3]);
    let max = 20.0f32;
    let expected: Vec<f64> = scores.iter().map(|&s| f64::from(s - max).exp()).collect();
    for isa in Isa::available() {
        let kernel = Kernel::for_isa(isa, 8);
        let mut terms = scores.clone();
        let sum = kernel.softmax_terms(&mut terms, max);
        for (score, (&got, &want)) in scores.iter().zip(terms.iter().zip(&expected)) {
            let tiny = want < f64::from(f32::MIN_POSITIVE);
            let close = if tiny {
                got.abs() <= f32::MIN_POSITIVE
            } else {
                ((f64::from(got) - want) / want).abs() < 1e-6
            };
            assert!(close, "{isa}: e^({score} - {max}) = {got}, expected {want}");
        }
        assert_eq!(terms[1_000], 0.0, "{isa}: a closed entry");
        let total: f64 = expected.iter().sum();
        assert!(
            ((f64::from(sum) - total) / total).abs() < 1e-5,
            "{isa}: sum {sum} against {total}"
        );
    }
}
