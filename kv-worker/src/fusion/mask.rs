//! The attention pattern of a recomputation pass.

use candle_core::{Device, Tensor};

use crate::error::Result;

/// The (1, t, p + t) mask under which `new_positions` are recomputed after `past`: a new
/// token sees the valid past entries and the new tokens at positions up to its own, exactly
/// what it would see in a causal prefill of the whole prompt (hidden entries, the stale
/// copies of the recomputed tokens, are never seen).
pub fn recompute_mask(
    past_positions: &[u32],
    past_valid: &[bool],
    new_positions: &[u32],
    device: &Device,
) -> Result<Tensor> {
    let p = past_positions.len();
    let t = new_positions.len();
    let width = p + t;
    let mut allowed = vec![0u8; t * width];
    for (i, &at) in new_positions.iter().enumerate() {
        let row = &mut allowed[i * width..(i + 1) * width];
        for (j, cell) in row[..p].iter_mut().enumerate() {
            *cell = u8::from(past_valid[j] && past_positions[j] <= at);
        }
        for (j, cell) in row[p..].iter_mut().enumerate() {
            *cell = u8::from(new_positions[j] <= at);
        }
    }
    Ok(Tensor::from_vec(allowed, (1, t, width), device)?)
}
