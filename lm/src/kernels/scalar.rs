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
    for (block, (&scale_w, &scale_a)) in weights.scales.iter().zip(activations.scales).enumerate() {
        let dot: i32 = (block * BLOCK..(block + 1) * BLOCK)
            .map(|e| weight_quant(&weights, e) * i32::from(activations.quants[e]))
            .sum();
        total += scale_w * scale_a * dot as f32;
    }
    let offsets: f32 = (weights.offsets.iter())
        .zip(activations.sums)
        .map(|(offset, sum)| offset * sum)
        .sum();
    total + offsets
}
