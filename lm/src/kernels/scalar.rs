//! The reference kernel: the same integer dot products as the SIMD paths, one value at a
//! time. It runs where no SIMD path does, and the tests hold the others to it.

use super::{ActivationRow, BLOCK, Layout, PAIR, WeightRow};

/// The quantised weight `e` of a row: unsigned in the nibble layouts, signed in bytes.
pub(super) fn weight_quant(row: &WeightRow<'_>, e: usize) -> i32 {
    if row.layout == Layout::Bytes {
        return i32::from(row.quants[e] as i8);
    }
    let pair = e / PAIR;
    let j = e % BLOCK;
    let second = (e % PAIR) >= BLOCK;
    let byte = row.quants[pair * BLOCK + j];
    let low = i32::from(if second { byte >> 4 } else { byte & 0x0f });
    let bit = |word: u64| ((word >> (e % PAIR)) & 1) as i32;
    match row.layout {
        Layout::Nibbles | Layout::Bytes => low,
        Layout::NibblesAndFifthBits => low | (bit(row.high[pair]) << 4),
    }
}

/// `sum over blocks of scale_w * scale_a * (q_w . q_a) + offset_w * sum_a`, block by block.
pub(super) fn dot(weights: WeightRow<'_>, activations: ActivationRow<'_>) -> f32 {
    let mut total = 0.0f32;
    for (block, &scale_a) in activations.scales.iter().enumerate() {
        let dot: i32 = (block * BLOCK..(block + 1) * BLOCK)
            .map(|e| weight_quant(&weights, e) * i32::from(activations.quants[e]))
            .sum();
        total += weights.scale(block) * scale_a * dot as f32;
    }
    let offsets: f32 = (activations.sums.iter().enumerate())
        .map(|(block, sum)| weights.offset(block) * sum)
        .sum();
    total + offsets
}

/// The largest magnitude in a block of activations (its group's scale is that over 127).
pub(super) fn largest_magnitude(block: &[f32]) -> f32 {
    block.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// A block of 32 activations with scale `d`: the quants `round(x / d)` (halves away from
/// zero) into `out`, and the sum of the quants.
pub(super) fn quantize_block(block: &[f32], d: f32, out: &mut [i8]) -> i32 {
    let inverse = if d > 0.0 { 1.0 / d } else { 0.0 };
    let mut sum = 0i32;
    for (&v, q) in block.iter().zip(out) {
        // Within [-127, 127] by construction of d; `as` saturates regardless.
        *q = (v * inverse).round() as i8;
        sum += i32::from(*q);
    }
    sum
}
