//! The reference kernel: the same integer dot products as the SIMD paths, one value at a
//! time. It runs where no SIMD path does, and the tests hold the others to it.

use super::{ActivationRow, BLOCK, Layout, WeightRow};

/// The quantised weight `e` of a row: unsigned in the nibble layouts, signed in bytes.
pub(super) fn weight_quant(row: &WeightRow<'_>, e: usize) -> i32 {
    let block = e / BLOCK;
    let j = e % BLOCK;
    match row.layout {
        Layout::Bytes => i32::from(row.quants[e] as i8),
        Layout::Nibbles | Layout::NibblesAndFifthBits => {
            let pair = block / 2;
            let second = block % 2 == 1;
            let byte = row.quants[pair * BLOCK + j];
            let low = i32::from(if second { byte >> 4 } else { byte & 0x0f });
            if row.layout == Layout::NibblesAndFifthBits {
                let bit = (row.high[pair] >> (j + if second { BLOCK } else { 0 })) & 1;
                low | ((bit as i32) << 4)
            } else {
                low
            }
        }
    }
}

/// `sum over blocks of scale_w * scale_a * (q_w . q_a)`, block by block.
pub(super) fn scaled_dot(weights: WeightRow<'_>, activations: ActivationRow<'_>) -> f32 {
    let mut total = 0.0f32;
    for (block, (&scale_w, &scale_a)) in weights.scales.iter().zip(activations.scales).enumerate() {
        let dot: i32 = (0..BLOCK)
            .map(|j| {
                let e = block * BLOCK + j;
                weight_quant(&weights, e) * i32::from(activations.quants[e])
            })
            .sum();
        total += scale_w * scale_a * dot as f32;
    }
    total
}
